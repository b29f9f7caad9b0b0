//! Scheduler configuration: the limits that shape each step, the preemption
//! mode, the scheduling and allocation policies by name, and the checks a configuration must pass before a scheduler runs it.

use crate::kv_cache::KvCacheGroupSpec;
use crate::spec_decode::{SpecConfigError, SpeculativeConfig};

/// How a preempted request gives back its blocks (paper §4.5).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum PreemptionMode {
    /// Free the blocks; recompute the KV cache from the tokens later.
    #[default]
    Recompute,
    /// Copy the blocks to the CPU pool and back (recompute if the pool is full).
    Swap,
}

impl PreemptionMode {
    /// Every mode, in the order of [`PreemptionMode::as_str`]'s names.
    pub const ALL: [PreemptionMode; 2] = [PreemptionMode::Recompute, PreemptionMode::Swap];

    /// The Python spelling: "recompute" or "swap".
    pub fn as_str(self) -> &'static str {
        match self {
            PreemptionMode::Recompute => "recompute",
            PreemptionMode::Swap => "swap",
        }
    }

    /// Parse a name of [`PreemptionMode::as_str`].
    pub fn parse(name: &str) -> Result<Self, ConfigError> {
        Self::ALL
            .into_iter()
            .find(|m| m.as_str() == name)
            .ok_or_else(|| ConfigError::UnknownPreemptionMode(name.to_string()))
    }
}

/// The order of the waiting queue and who is preempted first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SchedulingPolicy {
    /// First come, first served: queues in arrival order; the most recently
    /// arrived running group is preempted first.
    #[default]
    Fcfs,
    /// Lower `priority` value first, then arrival (vLLM's semantics): queues
    /// ordered by (priority, arrival), preempted requests keep that place;
    /// the worst running group is preempted first, also to admit a better
    /// waiting request when the KV cache or `max_num_seqs` is the limit.
    Priority,
}

impl SchedulingPolicy {
    /// Every policy, in the order of [`SchedulingPolicy::as_str`]'s names.
    pub const ALL: [SchedulingPolicy; 2] = [SchedulingPolicy::Fcfs, SchedulingPolicy::Priority];

    /// The Python spelling: "fcfs" or "priority".
    pub fn as_str(self) -> &'static str {
        match self {
            SchedulingPolicy::Fcfs => "fcfs",
            SchedulingPolicy::Priority => "priority",
        }
    }

    /// Parse a name of [`SchedulingPolicy::as_str`].
    pub fn parse(name: &str) -> Result<Self, ConfigError> {
        Self::ALL
            .into_iter()
            .find(|p| p.as_str() == name)
            .ok_or_else(|| ConfigError::UnknownSchedulingPolicy(name.to_string()))
    }
}

/// The name of an allocation policy, as the configuration spells it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum AllocationPolicyKind {
    /// Blocks on demand (PagedAttention).
    #[default]
    Paged,
    /// Orca (Max): reserve `max_model_len` tokens.
    ReserveMax,
    /// Orca (Pow2): reserve prompt + next power of two of the output length.
    ReservePow2,
    /// Orca (Oracle): reserve prompt + the output length.
    ReserveOracle,
    /// Static batching: reserve like `ReserveMax`; no joins mid-batch.
    Static,
}

impl AllocationPolicyKind {
    /// Every policy, in the order of [`AllocationPolicyKind::as_str`]'s names.
    pub const ALL: [AllocationPolicyKind; 5] = [
        AllocationPolicyKind::Paged,
        AllocationPolicyKind::ReserveMax,
        AllocationPolicyKind::ReservePow2,
        AllocationPolicyKind::ReserveOracle,
        AllocationPolicyKind::Static,
    ];

    /// The Python spelling: "paged", "reserve-max", "reserve-pow2",
    /// "reserve-oracle" or "static".
    pub fn as_str(self) -> &'static str {
        match self {
            AllocationPolicyKind::Paged => "paged",
            AllocationPolicyKind::ReserveMax => "reserve-max",
            AllocationPolicyKind::ReservePow2 => "reserve-pow2",
            AllocationPolicyKind::ReserveOracle => "reserve-oracle",
            AllocationPolicyKind::Static => "static",
        }
    }

    /// Parse a name of [`AllocationPolicyKind::as_str`].
    pub fn parse(name: &str) -> Result<Self, ConfigError> {
        Self::ALL
            .into_iter()
            .find(|p| p.as_str() == name)
            .ok_or_else(|| ConfigError::UnknownAllocationPolicy(name.to_string()))
    }
}

/// Limits that shape each step.
#[derive(Debug, Clone)]
pub struct SchedulerConfig {
    /// Physical blocks in the device pool.
    pub num_blocks: usize,
    /// Blocks in the CPU swap pool.
    pub num_cpu_blocks: usize,
    /// Tokens per block.
    pub block_size: usize,
    /// Most sequences in one step.
    pub max_num_seqs: usize,
    /// Token budget per step (prefill + decode tokens).
    pub max_num_batched_tokens: usize,
    /// Longest sequence (prompt + output) in tokens.
    pub max_model_len: usize,
    /// Split long prompts across steps when the budget is short.
    pub enable_chunked_prefill: bool,
    /// Reuse cached blocks of equal prefixes.
    pub enable_prefix_caching: bool,
    /// Recompute or swap.
    pub preemption_mode: PreemptionMode,
    /// Paged (blocks on demand) or a contiguous-reservation baseline (see
    /// [`AllocationPolicyKind`]); a reserving policy turns prefix caching off.
    pub allocation_policy: AllocationPolicyKind,
    /// The KV cache groups sharing the pool: each sequence holds one block
    /// table per group (`[KvCacheGroupSpec::FULL]` for a model whose layers
    /// all use full attention).
    pub kv_cache_groups: Vec<KvCacheGroupSpec>,
    /// First come, first served, or by request priority.
    pub scheduling_policy: SchedulingPolicy,
    /// Speculative decoding (`None`: off): the proposer drafting up to
    /// `num_speculative_tokens` tokens per sequence and step.
    pub speculative_config: Option<SpeculativeConfig>,
}

impl SchedulerConfig {
    /// Check that a scheduler can serve this configuration: positive sizes,
    /// a device pool that holds one sequence of `max_model_len` tokens, and
    /// (without chunked prefill) a token budget that fits a whole prompt.
    pub fn validate(&self) -> Result<(), ConfigError> {
        for (arg, value) in [
            ("block_size", self.block_size),
            ("max_num_seqs", self.max_num_seqs),
            ("max_num_batched_tokens", self.max_num_batched_tokens),
        ] {
            check_positive(arg, i64::try_from(value).unwrap_or(i64::MAX))?;
        }
        // Block ids are u32 and u32::MAX marks "no block" in the free queue.
        for (arg, value) in [
            ("num_blocks", self.num_blocks),
            ("num_cpu_blocks", self.num_cpu_blocks),
        ] {
            if value >= u32::MAX as usize {
                return Err(ConfigError::TooManyBlocks { arg, value });
            }
        }
        if self.kv_cache_groups.is_empty() {
            return Err(ConfigError::NoKvCacheGroups);
        }
        for g in &self.kv_cache_groups {
            if let Some(w) = g.sliding_window {
                check_positive("sliding_window", i64::try_from(w).unwrap_or(i64::MAX))?;
            }
        }
        let hybrid = self.kv_cache_groups != [KvCacheGroupSpec::FULL];
        if hybrid && self.allocation_policy != AllocationPolicyKind::Paged {
            return Err(ConfigError::ReservingNeedsOneGroup(
                self.allocation_policy.as_str(),
            ));
        }
        if !hybrid && self.num_blocks.saturating_mul(self.block_size) < self.max_model_len {
            return Err(ConfigError::KvCacheTooSmall {
                num_blocks: self.num_blocks,
                block_size: self.block_size,
                max_model_len: self.max_model_len,
            });
        }
        let needed = self.max_blocks_per_seq();
        if hybrid && self.num_blocks < needed {
            return Err(ConfigError::KvCacheTooSmallForGroups {
                num_blocks: self.num_blocks,
                needed,
                max_model_len: self.max_model_len,
            });
        }
        if !self.enable_chunked_prefill && self.max_num_batched_tokens < self.max_model_len {
            return Err(ConfigError::BudgetBelowModelLen {
                max_num_batched_tokens: self.max_num_batched_tokens,
                max_model_len: self.max_model_len,
            });
        }
        if let Some(spec) = &self.speculative_config {
            spec.validate().map_err(ConfigError::Speculative)?;
        }
        Ok(())
    }
}

impl SchedulerConfig {
    /// Most blocks one sequence of `max_model_len` tokens holds at once over
    /// all KV cache groups, with steps of at most `max_num_batched_tokens`.
    pub fn max_blocks_per_seq(&self) -> usize {
        let chunk = self.max_num_batched_tokens.min(self.max_model_len);
        self.kv_cache_groups
            .iter()
            .map(|g| g.max_blocks_per_seq(self.max_model_len, chunk, self.block_size))
            .sum()
    }
}

/// `Err(NotPositive)` naming `arg` unless `value >= 1` (a size or a count).
pub fn check_positive(arg: &'static str, value: i64) -> Result<(), ConfigError> {
    if value < 1 {
        return Err(ConfigError::NotPositive { arg, value });
    }
    Ok(())
}

/// A configuration no scheduler can run; its message names the argument.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ConfigError {
    /// `block_size`, `max_num_seqs` or `max_num_batched_tokens` (the named
    /// argument) is below 1.
    NotPositive {
        /// The argument's name.
        arg: &'static str,
        /// Its value.
        value: i64,
    },
    /// `num_blocks * block_size` tokens are fewer than `max_model_len`.
    KvCacheTooSmall {
        /// Device blocks.
        num_blocks: usize,
        /// Tokens per block.
        block_size: usize,
        /// Longest sequence.
        max_model_len: usize,
    },
    /// A pool of more blocks than block ids can name (`u32::MAX - 1`).
    TooManyBlocks {
        /// `num_blocks` or `num_cpu_blocks`.
        arg: &'static str,
        /// Its value.
        value: usize,
    },
    /// Without chunked prefill, the token budget is below `max_model_len`.
    BudgetBelowModelLen {
        /// Token budget per step.
        max_num_batched_tokens: usize,
        /// Longest sequence.
        max_model_len: usize,
    },
    /// The pool cannot hold the blocks one sequence of `max_model_len`
    /// tokens needs at once over its KV cache groups.
    KvCacheTooSmallForGroups {
        /// Device blocks.
        num_blocks: usize,
        /// Blocks one sequence needs at most.
        needed: usize,
        /// Longest sequence.
        max_model_len: usize,
    },
    /// No KV cache group was given.
    NoKvCacheGroups,
    /// A reserving allocation policy (named) with a hybrid KV cache: they
    /// reserve one contiguous run in one full-attention group.
    ReservingNeedsOneGroup(&'static str),
    /// A `preemption_mode` name other than "recompute" or "swap".
    UnknownPreemptionMode(String),
    /// A `scheduling_policy` name other than "fcfs" or "priority".
    UnknownSchedulingPolicy(String),
    /// An `allocation_policy` name not in [`AllocationPolicyKind::ALL`].
    UnknownAllocationPolicy(String),
    /// A bad `speculative_config` field (named in the error).
    Speculative(SpecConfigError),
}

impl std::fmt::Display for ConfigError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ConfigError::NotPositive { arg, value } => {
                write!(f, "{arg} must be >= 1, got {value}")
            }
            ConfigError::KvCacheTooSmall {
                num_blocks,
                block_size,
                max_model_len,
            } => write!(
                f,
                "the KV cache holds {num_blocks} blocks x {block_size} tokens = {} tokens, \
                 fewer than max_model_len={max_model_len}; raise the KV budget or lower \
                 max_model_len",
                num_blocks.saturating_mul(*block_size)
            ),
            ConfigError::TooManyBlocks { arg, value } => write!(
                f,
                "{arg}={value} is more blocks than block ids can name (at most {})",
                u32::MAX - 1
            ),
            ConfigError::BudgetBelowModelLen {
                max_num_batched_tokens,
                max_model_len,
            } => write!(
                f,
                "without chunked prefill, max_num_batched_tokens ({max_num_batched_tokens}) \
                 must be >= max_model_len ({max_model_len})"
            ),
            ConfigError::KvCacheTooSmallForGroups {
                num_blocks,
                needed,
                max_model_len,
            } => write!(
                f,
                "the KV cache holds {num_blocks} blocks, fewer than the {needed} blocks one \
                 sequence of max_model_len={max_model_len} tokens needs at once over its KV \
                 cache groups; raise the KV budget or lower max_model_len"
            ),
            ConfigError::NoKvCacheGroups => write!(f, "kv_cache_groups must not be empty"),
            ConfigError::ReservingNeedsOneGroup(policy) => write!(
                f,
                "allocation_policy {policy:?} reserves one contiguous run per request and \
                 needs one full-attention KV cache group; use 'paged' for models with \
                 sliding-window layers, or disable_hybrid_kv_cache_manager=True to give \
                 every layer a block for every token"
            ),
            ConfigError::UnknownSchedulingPolicy(name) => write!(
                f,
                "scheduling_policy must be 'fcfs' or 'priority', got {name:?}"
            ),
            ConfigError::UnknownPreemptionMode(name) => write!(
                f,
                "preemption_mode must be 'recompute' or 'swap', got {name:?}"
            ),
            ConfigError::Speculative(e) => write!(f, "{e}"),
            ConfigError::UnknownAllocationPolicy(name) => {
                let names: Vec<_> = AllocationPolicyKind::ALL
                    .iter()
                    .map(|p| p.as_str())
                    .collect();
                write!(
                    f,
                    "allocation_policy must be one of {names:?}, got {name:?}"
                )
            }
        }
    }
}

impl std::error::Error for ConfigError {}

#[cfg(test)]
mod tests {
    use super::*;

    fn config() -> SchedulerConfig {
        SchedulerConfig {
            num_blocks: 16,
            num_cpu_blocks: 0,
            block_size: 4,
            max_num_seqs: 8,
            max_num_batched_tokens: 64,
            max_model_len: 64,
            enable_chunked_prefill: true,
            enable_prefix_caching: false,
            preemption_mode: PreemptionMode::Recompute,
            allocation_policy: AllocationPolicyKind::Paged,
            kv_cache_groups: vec![KvCacheGroupSpec::FULL],
            scheduling_policy: SchedulingPolicy::Fcfs,
            speculative_config: None,
        }
    }

    #[test]
    fn preemption_names_round_trip() {
        for m in PreemptionMode::ALL {
            assert_eq!(PreemptionMode::parse(m.as_str()), Ok(m));
        }
        let e = PreemptionMode::parse("drop").unwrap_err();
        assert_eq!(
            e.to_string(),
            "preemption_mode must be 'recompute' or 'swap', got \"drop\""
        );
    }

    #[test]
    fn validate_names_the_offending_argument() {
        assert_eq!(config().validate(), Ok(()));
        for arg in ["block_size", "max_num_seqs", "max_num_batched_tokens"] {
            let mut c = config();
            match arg {
                "block_size" => c.block_size = 0,
                "max_num_seqs" => c.max_num_seqs = 0,
                _ => c.max_num_batched_tokens = 0,
            }
            let msg = c.validate().unwrap_err().to_string();
            assert_eq!(msg, format!("{arg} must be >= 1, got 0"));
        }
        let c = SchedulerConfig {
            max_model_len: 65,
            ..config()
        };
        assert_eq!(
            c.validate().unwrap_err().to_string(),
            "the KV cache holds 16 blocks x 4 tokens = 64 tokens, fewer than \
             max_model_len=65; raise the KV budget or lower max_model_len"
        );
        let c = SchedulerConfig {
            enable_chunked_prefill: false,
            max_num_batched_tokens: 32,
            ..config()
        };
        assert_eq!(
            c.validate().unwrap_err().to_string(),
            "without chunked prefill, max_num_batched_tokens (32) must be >= \
             max_model_len (64)"
        );
    }

    #[test]
    fn hybrid_groups_are_checked() {
        let sliding = |w| SchedulerConfig {
            kv_cache_groups: vec![KvCacheGroupSpec::sliding(w)],
            ..config()
        };
        assert_eq!(
            sliding(0).validate().unwrap_err().to_string(),
            "sliding_window must be >= 1, got 0"
        );
        // Sliding only: a window of 8 with 16-token steps needs 7 blocks of 4
        // whatever max_model_len is.
        let long = SchedulerConfig {
            max_model_len: 1 << 20,
            max_num_batched_tokens: 16,
            num_blocks: 7,
            ..sliding(8)
        };
        assert_eq!(long.validate(), Ok(()));
        let short = SchedulerConfig {
            num_blocks: 6,
            ..long.clone()
        };
        assert!(short
            .validate()
            .unwrap_err()
            .to_string()
            .starts_with("the KV cache holds 6 blocks, fewer than the 7 blocks"));
        let reserving = SchedulerConfig {
            allocation_policy: AllocationPolicyKind::ReserveMax,
            ..sliding(8)
        };
        assert!(reserving.validate().is_err());
        let none = SchedulerConfig {
            kv_cache_groups: vec![],
            ..config()
        };
        assert_eq!(none.validate(), Err(ConfigError::NoKvCacheGroups));
    }
}
