//! Scheduler layer (DESIGN.md): requests, continuous batching, step arrays.

pub mod batch;
pub mod policy;
pub mod request;
#[allow(clippy::module_inception)]
pub mod scheduler;

pub use batch::StepBatch;
pub use policy::{AdmissionBlock, AllocationPolicy, MemoryBreakdown};
pub use request::{child_seed, FinishReason, Request, SamplingConfig, Status, StopConfig};
pub use scheduler::{
    AddError, BlockMoves, Finished, PreemptionMode, Scheduler, SchedulerConfig, SchedulerStats,
    HOLD_TOKEN,
};
