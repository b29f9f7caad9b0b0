//! Speculative decoding proposers (ARCHITECTURE.md, step contract): drafts
//! of the next tokens of a sequence, verified by the target model in one
//! step of K+1 tokens.
//!
//! * `config.rs`: [`SpeculativeConfig`] with vLLM's field names and its checks.
//! * `draft_policy.rs`: when to speculate: each sequence's draft length in a
//!   step from its acceptance so far and the step's cost model.
//! * `ngram.rs`: prompt lookup over the sequence's own tokens.
//! * `suffix_tree.rs`: the depth-bounded suffix tree of SuffixDecoding.
//! * `proposer.rs`: [`Proposers`], the per-group, per-sequence and global
//!   state the scheduler feeds in `update()` and drafts from in `schedule()`;
//!   a draft model (`draft_model`, run by the Python engine) gets placeholder
//!   slots whose tokens `Scheduler::set_draft_tokens` writes in.

pub mod config;
pub mod config_error;
pub mod draft_policy;
pub mod ngram;
pub mod proposer;
pub mod suffix_tree;

pub use config::{DraftLengthPolicy, SpecMethod, SpeculativeConfig};
pub use config_error::SpecConfigError;
pub use draft_policy::{Acceptance, Candidate, DraftPolicy, StepCost, StepCostModel};
pub use proposer::{Proposers, SeqProposer, DRAFT_PLACEHOLDER};
