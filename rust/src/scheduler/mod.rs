//! Scheduler layer (DESIGN.md): requests, continuous batching, step arrays.

pub mod batch;
pub mod request;
#[allow(clippy::module_inception)]
pub mod scheduler;

pub use batch::StepBatch;
pub use request::{FinishReason, Request, SamplingConfig, StopConfig};
pub use scheduler::{AddError, Finished, Scheduler, SchedulerConfig, SchedulerStats};
