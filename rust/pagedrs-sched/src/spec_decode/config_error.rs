//! The error of a bad `speculative_config`: the configuration's checks and the
//! draft policy's step-cost points report it, naming the field.

/// A bad `speculative_config` value: the field and what is wrong with it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SpecConfigError {
    /// The field's name (vLLM's).
    pub field: &'static str,
    /// What the value must be, and the value.
    pub message: String,
}

impl std::fmt::Display for SpecConfigError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "speculative_config.{} {}", self.field, self.message)
    }
}

impl std::error::Error for SpecConfigError {}
