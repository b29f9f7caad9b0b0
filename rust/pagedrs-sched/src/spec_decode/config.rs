//! `speculative_config`: the proposer and its settings, with vLLM's field
//! names, and the checks they must pass (each error names its field).

use super::config_error::SpecConfigError;
use super::draft_policy::StepCostModel;

/// Which proposer drafts the tokens.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SpecMethod {
    /// Prompt lookup: the tokens that followed the latest earlier occurrence
    /// of the sequence's last n-gram (`prompt_lookup_min..=prompt_lookup_max`).
    Ngram,
    /// SuffixDecoding (Oliaro et al., 2024): frequency-weighted continuations
    /// of the longest matching suffix, over the request's tokens and over
    /// earlier outputs of the engine.
    Suffix,
    /// A draft model (`speculative_config.model`) run by the engine: the
    /// scheduler reserves the drafts' slots with placeholder tokens, and
    /// the engine writes the draft model's tokens in
    /// (`Scheduler::set_draft_tokens`) before the verify forward.
    DraftModel,
}

impl SpecMethod {
    /// Every method, in the order of [`SpecMethod::as_str`]'s names.
    pub const ALL: [SpecMethod; 3] = [
        SpecMethod::Ngram,
        SpecMethod::Suffix,
        SpecMethod::DraftModel,
    ];

    /// vLLM's spelling: "ngram", "suffix" or "draft_model".
    pub fn as_str(self) -> &'static str {
        match self {
            SpecMethod::Ngram => "ngram",
            SpecMethod::Suffix => "suffix",
            SpecMethod::DraftModel => "draft_model",
        }
    }

    /// Parse a name of [`SpecMethod::as_str`] ("[ngram]" too, as vLLM).
    pub fn parse(name: &str) -> Result<Self, SpecConfigError> {
        let name = if name == "[ngram]" { "ngram" } else { name };
        Self::ALL
            .into_iter()
            .find(|m| m.as_str() == name)
            .ok_or_else(|| SpecConfigError {
                field: "method",
                message: format!("must be 'ngram', 'suffix' or 'draft_model', got {name:?}"),
            })
    }
}

/// How long each sequence's drafts are (pagedrs' `draft_length_policy`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DraftLengthPolicy {
    /// Each sequence drafts what raises the step's expected tokens per
    /// second under the step cost model (`draft_step_costs`; until one is
    /// set, every proposal in full).
    Goodput,
    /// Every proposal in full, up to `num_speculative_tokens` (vLLM's).
    Fixed,
}

impl DraftLengthPolicy {
    /// "goodput" or "fixed".
    pub fn as_str(self) -> &'static str {
        match self {
            DraftLengthPolicy::Goodput => "goodput",
            DraftLengthPolicy::Fixed => "fixed",
        }
    }

    /// Parse a name of [`DraftLengthPolicy::as_str`].
    pub fn parse(name: &str) -> Result<Self, SpecConfigError> {
        [DraftLengthPolicy::Goodput, DraftLengthPolicy::Fixed]
            .into_iter()
            .find(|p| p.as_str() == name)
            .ok_or_else(|| SpecConfigError {
                field: "draft_length_policy",
                message: format!("must be 'goodput' or 'fixed', got {name:?}"),
            })
    }
}

/// Speculative decoding settings (vLLM's `SpeculativeConfig` fields, and
/// pagedrs' `draft_step_costs`).
#[derive(Debug, Clone, PartialEq)]
pub struct SpeculativeConfig {
    /// The proposer.
    pub method: SpecMethod,
    /// Most draft tokens per sequence and step (`K`).
    pub num_speculative_tokens: usize,
    /// Shortest n-gram matched (ngram).
    pub prompt_lookup_min: usize,
    /// Longest n-gram matched (ngram); the longest match wins.
    pub prompt_lookup_max: usize,
    /// Longest suffix a suffix tree stores, in tokens: a match of `m` tokens
    /// drafts at most `depth - m` (suffix).
    pub suffix_decoding_max_tree_depth: usize,
    /// A match of `m` tokens drafts at most `factor * m` tokens (suffix).
    pub suffix_decoding_max_spec_factor: f64,
    /// A draft stops where the product of its tokens' frequencies falls
    /// below this (suffix).
    pub suffix_decoding_min_token_prob: f64,
    /// Finished requests whose outputs the global suffix tree keeps, oldest
    /// evicted first; 0 turns the global tree off (suffix).
    pub suffix_decoding_max_cached_requests: usize,
    /// How long each sequence's drafts are (pagedrs' field).
    pub draft_length_policy: DraftLengthPolicy,
    /// The step cost model of the goodput policy (pagedrs' field):
    /// each sequence drafts what raises the step's expected tokens per
    /// second (`draft_policy.rs`); `None` drafts every proposal in full.
    pub draft_step_costs: Option<StepCostModel>,
}

impl SpeculativeConfig {
    /// `method` with vLLM's defaults: `num_speculative_tokens` 5 for
    /// ngram and draft_model (which the Python side requires explicitly,
    /// as vLLM), 24 (the tree depth, as vLLM) for suffix; n-grams of 5 tokens;
    /// suffix trees of depth 24, spec factor 1, token probability 0.1,
    /// 10000 cached requests; the goodput policy without a cost model yet
    /// (full drafts until one is set).
    pub fn new(method: SpecMethod) -> Self {
        Self {
            method,
            num_speculative_tokens: match method {
                SpecMethod::Ngram | SpecMethod::DraftModel => 5,
                SpecMethod::Suffix => 24,
            },
            prompt_lookup_min: 5,
            prompt_lookup_max: 5,
            suffix_decoding_max_tree_depth: 24,
            suffix_decoding_max_spec_factor: 1.0,
            suffix_decoding_min_token_prob: 0.1,
            suffix_decoding_max_cached_requests: 10000,
            draft_length_policy: DraftLengthPolicy::Goodput,
            draft_step_costs: None,
        }
    }

    /// Check every field; the error names the first bad one.
    pub fn validate(&self) -> Result<(), SpecConfigError> {
        let bad = |field: &'static str, message: String| Err(SpecConfigError { field, message });
        if self.draft_length_policy == DraftLengthPolicy::Fixed && self.draft_step_costs.is_some() {
            return bad(
                "draft_step_costs",
                "is used by draft_length_policy 'goodput' only, got it with 'fixed'".to_string(),
            );
        }
        if self.num_speculative_tokens < 1 {
            return bad(
                "num_speculative_tokens",
                format!("must be >= 1, got {}", self.num_speculative_tokens),
            );
        }
        match self.method {
            SpecMethod::DraftModel => {}
            SpecMethod::Ngram => {
                for (field, v) in [
                    ("prompt_lookup_min", self.prompt_lookup_min),
                    ("prompt_lookup_max", self.prompt_lookup_max),
                ] {
                    if v < 1 {
                        return bad(field, format!("must be >= 1, got {v}"));
                    }
                }
                if self.prompt_lookup_min > self.prompt_lookup_max {
                    return bad(
                        "prompt_lookup_min",
                        format!(
                            "must be <= prompt_lookup_max ({}), got {}",
                            self.prompt_lookup_max, self.prompt_lookup_min
                        ),
                    );
                }
            }
            SpecMethod::Suffix => {
                if self.suffix_decoding_max_tree_depth < 2 {
                    return bad(
                        "suffix_decoding_max_tree_depth",
                        format!(
                            "must be >= 2 (a match and a drafted token), got {}",
                            self.suffix_decoding_max_tree_depth
                        ),
                    );
                }
                let f = self.suffix_decoding_max_spec_factor;
                if !(f.is_finite() && f > 0.0) {
                    return bad(
                        "suffix_decoding_max_spec_factor",
                        format!("must be a positive number, got {f}"),
                    );
                }
                let p = self.suffix_decoding_min_token_prob;
                if !(0.0..=1.0).contains(&p) {
                    return bad(
                        "suffix_decoding_min_token_prob",
                        format!("must be in [0, 1], got {p}"),
                    );
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_name_the_field() {
        assert_eq!(SpeculativeConfig::new(SpecMethod::Ngram).validate(), Ok(()));
        assert_eq!(
            SpeculativeConfig::new(SpecMethod::Suffix).validate(),
            Ok(())
        );
        let err = |c: SpeculativeConfig| c.validate().unwrap_err().to_string();
        let ngram = SpeculativeConfig::new(SpecMethod::Ngram);
        assert_eq!(
            err(SpeculativeConfig {
                num_speculative_tokens: 0,
                ..ngram.clone()
            }),
            "speculative_config.num_speculative_tokens must be >= 1, got 0"
        );
        assert_eq!(
            err(SpeculativeConfig {
                prompt_lookup_min: 4,
                prompt_lookup_max: 3,
                ..ngram.clone()
            }),
            "speculative_config.prompt_lookup_min must be <= prompt_lookup_max (3), got 4"
        );
        assert_eq!(
            err(SpeculativeConfig {
                prompt_lookup_max: 0,
                prompt_lookup_min: 0,
                ..ngram
            }),
            "speculative_config.prompt_lookup_min must be >= 1, got 0"
        );
        let suffix = SpeculativeConfig::new(SpecMethod::Suffix);
        assert_eq!(
            err(SpeculativeConfig {
                suffix_decoding_min_token_prob: 1.5,
                ..suffix.clone()
            }),
            "speculative_config.suffix_decoding_min_token_prob must be in [0, 1], got 1.5"
        );
        assert!(err(SpeculativeConfig {
            suffix_decoding_max_spec_factor: f64::NAN,
            ..suffix
        })
        .starts_with("speculative_config.suffix_decoding_max_spec_factor"));
        assert_eq!(
            SpecMethod::parse("eagle").unwrap_err().to_string(),
            "speculative_config.method must be 'ngram', 'suffix' or 'draft_model', got \"eagle\""
        );
        assert_eq!(SpecMethod::parse("draft_model"), Ok(SpecMethod::DraftModel));
        assert_eq!(SpecMethod::parse("[ngram]"), Ok(SpecMethod::Ngram));
    }
}
