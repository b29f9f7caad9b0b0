//! PyO3 bindings of the scheduler layer: the `Scheduler` class and the typed
//! step contract it returns (see `python/pagedrs/_core.pyi`).

mod scheduler;
mod stats;
mod step;

use pyo3::prelude::*;

use crate::scheduler::{child_seed, AllocationPolicy, HOLD_TOKEN};

/// Seed of the `index`-th sequence of a parallel-sampling group whose first
/// sequence has `seed` (-1, no seed, stays -1).
#[pyfunction(name = "child_seed")]
fn py_child_seed(seed: i64, index: usize) -> i64 {
    child_seed(seed, index)
}

/// Add the scheduler classes, functions and constants to `m`.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<scheduler::PyScheduler>()?;
    m.add_class::<step::PySchedulerOutput>()?;
    m.add_class::<step::PyStepBatch>()?;
    m.add_class::<step::PyKVCacheGroupBatch>()?;
    m.add_class::<step::PyBlockMoves>()?;
    m.add_class::<step::PyFinished>()?;
    m.add_class::<stats::PyKVCacheStats>()?;
    m.add_class::<stats::PyMemoryBreakdown>()?;
    m.add_function(wrap_pyfunction!(py_child_seed, m)?)?;
    m.add("HOLD_TOKEN", HOLD_TOKEN)?;
    let policies: Vec<&str> = AllocationPolicy::ALL.iter().map(|p| p.as_str()).collect();
    m.add("ALLOCATION_POLICIES", policies)?;
    Ok(())
}
