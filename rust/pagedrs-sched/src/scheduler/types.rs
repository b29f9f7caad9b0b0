//! Values the scheduler hands out: request errors, finished requests,
//! counters, the step's block moves, and the hold token.

use super::request::FinishReason;
use crate::kv_cache::BlockCopy;

/// A "sampled" token that appends nothing: the row's last token is computed
/// again at the next step (a beam group waits until all its beams run together).
pub const HOLD_TOKEN: u32 = u32::MAX;

/// Error for a request that can never be served.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AddError {
    /// The id is already in use.
    DuplicateId(u64),
    /// Empty prompt.
    EmptyPrompt,
    /// Prompt of `len` tokens with `max_model_len` limit.
    PromptTooLong {
        /// Prompt tokens.
        len: usize,
        /// Longest sequence.
        max_model_len: usize,
    },
    /// Fork of a request that is not running between steps.
    NotForkable(u64),
    /// A non-zero priority under first-come-first-served scheduling.
    PriorityNeedsPolicy(i64),
    /// A feature (forks, parallel sampling) the reserving allocation
    /// `policy` does not support.
    NeedsPaged {
        /// The feature.
        what: &'static str,
        /// The policy's name.
        policy: &'static str,
    },
}

impl std::fmt::Display for AddError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            AddError::DuplicateId(id) => write!(f, "request id {id} is already in use"),
            AddError::EmptyPrompt => {
                write!(f, "prompt is empty: it must contain at least one token")
            }
            AddError::PromptTooLong { len, max_model_len } => write!(
                f,
                "prompt has {len} tokens, but max_model_len is {max_model_len} \
                 (the prompt plus at least one generated token must fit)"
            ),
            AddError::NotForkable(id) => {
                write!(f, "request {id} is not running, or a step is in flight")
            }
            AddError::PriorityNeedsPolicy(p) => write!(
                f,
                "got priority {p}, but priority scheduling is not enabled \
                 (use scheduling_policy='priority')"
            ),
            AddError::NeedsPaged { what, policy } => write!(
                f,
                "{what} needs allocation_policy='paged' (this scheduler uses {policy:?}, \
                 which reserves one contiguous run per request)"
            ),
        }
    }
}

impl std::error::Error for AddError {}

/// Check a prompt of `len` tokens against `max_model_len`: not empty, and
/// shorter than `max_model_len` so that one generated token fits.
pub fn check_prompt_len(len: usize, max_model_len: usize) -> Result<(), AddError> {
    if len == 0 {
        return Err(AddError::EmptyPrompt);
    }
    if len >= max_model_len {
        return Err(AddError::PromptTooLong { len, max_model_len });
    }
    Ok(())
}

/// A finished request, reported once by `Scheduler::update` or
/// `Scheduler::abort`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Finished {
    /// Request id.
    pub id: u64,
    /// Why it stopped.
    pub reason: FinishReason,
    /// The stop token that ended it, if any.
    pub stop_token: Option<u32>,
    /// Every generated token id.
    pub output_token_ids: Vec<u32>,
}

/// Counters for `kv_cache_stats()`.
#[derive(Debug, Clone, Default)]
pub struct SchedulerStats {
    /// Requests preempted so far.
    pub num_preemptions: u64,
    /// Steps scheduled so far.
    pub num_steps: u64,
    /// Blocks copied device -> CPU.
    pub num_swapped_out: u64,
    /// Blocks copied CPU -> device.
    pub num_swapped_in: u64,
    /// Prompt tokens looked up in the prefix cache.
    pub prefix_cache_queries: u64,
    /// Of those, tokens found cached (prefill skipped).
    pub prefix_cache_hits: u64,
    /// Sequence steps that carried draft tokens (speculative decoding).
    pub spec_num_drafts: u64,
    /// Draft tokens scheduled.
    pub spec_num_draft_tokens: u64,
    /// Draft tokens accepted.
    pub spec_num_accepted_tokens: u64,
    /// `[i]`: drafts accepted at draft position `i` (0-based).
    pub spec_num_accepted_tokens_per_pos: Vec<u64>,
}

/// Block moves the executor applies before the step's forward pass, in this
/// order: swap out, swap in, copy-on-write copies.
#[derive(Debug, Clone, Default)]
pub struct BlockMoves {
    /// (device block, CPU block) pairs to copy out.
    pub swap_out: Vec<BlockCopy>,
    /// (CPU block, device block) pairs to copy in.
    pub swap_in: Vec<BlockCopy>,
    /// (source, destination) device block pairs (copy-on-write).
    pub copies: Vec<BlockCopy>,
}

impl BlockMoves {
    /// Forget every move (a new step starts).
    pub(super) fn clear(&mut self) {
        self.swap_out.clear();
        self.swap_in.clear();
        self.copies.clear();
    }

    /// True when there is nothing to move.
    pub fn is_empty(&self) -> bool {
        self.swap_out.is_empty() && self.swap_in.is_empty() && self.copies.is_empty()
    }
}
