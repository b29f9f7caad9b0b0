//! Scheduler layer (ARCHITECTURE.md): requests, continuous batching, step arrays.
//!
//! [`Scheduler`] (`scheduler.rs`) holds the queues and runs the step loop;
//! each concern of a step has its own file: admission of the waiting and
//! swapped queues, preemption, draft tokens of speculative decoding
//! (`speculation.rs`; a draft model's tokens written in, `draft_tokens.rs`),
//! applying sampled tokens (`update.rs`), forced tokens replacing a
//! pending one (`forced.rs`), forks, the LoRA adapter bound of admission
//! (`lora.rs`), and
//! memory accounting. Its configuration and the checks it must pass are
//! in `config.rs`; the KV allocation policies (paged, and the reserving
//! baselines of the paper) sit behind the [`AllocationPolicy`] trait.

mod accounting;
mod admission;
pub mod batch;
pub mod config;
mod draft_tokens;
mod forced;
mod fork;
pub mod lora;
pub mod policy;
mod preemption;
pub mod request;
#[allow(clippy::module_inception)]
pub mod scheduler;
mod speculation;
pub mod types;
pub mod update;

pub use accounting::{GroupUsage, MemoryBreakdown};
pub use batch::{GroupBatch, StepBatch};
pub use config::{
    check_positive, AllocationPolicyKind, ConfigError, PreemptionMode, SchedulerConfig,
    SchedulingPolicy,
};
pub use draft_tokens::DraftTokensError;
pub use forced::ReplacePendingError;
pub use lora::MaxLorasError;
pub use policy::{AdmissionBlock, AllocationPolicy, Paged, Reserving};
pub use request::{child_seed, FinishReason, Request, SamplingConfig, Status, StopConfig};
pub use scheduler::Scheduler;
pub use types::{AddError, BlockMoves, Finished, SchedulerStats, HOLD_TOKEN};
pub use update::UpdateError;
