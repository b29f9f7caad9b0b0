//! `pagedrs._core`: the PyO3 bindings of the Rust core (see
//! `python/pagedrs/_core.pyi`): the `Scheduler` class of `pagedrs-sched` and
//! the typed step contract it returns (`scheduler`, `step`, `stats`,
//! `events`), the CPU kernels of `pagedrs-kernels` on numpy views of
//! torch tensors (`attention`, `quant`, `dense`, `lora`, `elementwise`).

mod args;
mod attention;
mod attention_arrays;
mod block_moves;
mod dense;
mod dequant;
mod elementwise;
mod events;
mod finished;
mod lora;
mod quant;
mod scheduler;
mod spec_config;
mod spm;
mod stats;
mod step;
mod variant;

use pyo3::prelude::*;

use pyo3::exceptions::PyValueError;

use pagedrs_sched::scheduler::{
    check_positive, child_seed, AllocationPolicyKind, ConfigError, PreemptionMode,
    SchedulingPolicy, HOLD_TOKEN,
};

/// Seed of the `index`-th sequence of a parallel-sampling group whose first
/// sequence has `seed` (-1, no seed, stays -1).
#[pyfunction(name = "child_seed")]
fn py_child_seed(seed: i64, index: usize) -> i64 {
    child_seed(seed, index)
}

/// Validate the scheduler settings known before the model is loaded (the
/// rest, which depend on the KV cache size and the model's context, are
/// checked when the `Scheduler` is built).
///
/// Raises:
///     ValueError: naming the argument.
#[pyfunction]
#[pyo3(signature = (block_size, max_num_seqs, max_num_batched_tokens = None, preemption_mode = "recompute", allocation_policy = "paged"))]
fn check_scheduler_args(
    block_size: i64,
    max_num_seqs: i64,
    max_num_batched_tokens: Option<i64>,
    preemption_mode: &str,
    allocation_policy: &str,
) -> PyResult<()> {
    let check = || -> Result<(), ConfigError> {
        check_positive("block_size", block_size)?;
        check_positive("max_num_seqs", max_num_seqs)?;
        if let Some(budget) = max_num_batched_tokens {
            check_positive("max_num_batched_tokens", budget)?;
        }
        PreemptionMode::parse(preemption_mode)?;
        AllocationPolicyKind::parse(allocation_policy)?;
        Ok(())
    };
    check().map_err(|e| PyValueError::new_err(e.to_string()))
}

#[pymodule]
fn _core(m: &Bound<'_, PyModule>) -> PyResult<()> {
    register(m)?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}

/// Add the scheduler classes, the attention kernels, functions and
/// constants to `m`.
fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(attention::paged_decode_attention, m)?)?;
    m.add_function(wrap_pyfunction!(attention::write_kv, m)?)?;
    m.add_class::<scheduler::PyScheduler>()?;
    m.add_class::<step::PySchedulerOutput>()?;
    m.add_class::<step::PyStepBatch>()?;
    m.add_class::<step::PyKVCacheGroupBatch>()?;
    m.add_class::<block_moves::PyBlockMoves>()?;
    m.add_class::<finished::PyFinished>()?;
    m.add_class::<events::PyKVCacheEvent>()?;
    m.add_class::<quant::PyQuantWeights>()?;
    m.add_class::<quant::PyQuantExperts>()?;
    m.add_function(wrap_pyfunction!(quant::quant_isas, m)?)?;
    m.add_function(wrap_pyfunction!(dequant::dequantize, m)?)?;
    m.add_function(wrap_pyfunction!(quant::quant_silu_mul, m)?)?;
    m.add_function(wrap_pyfunction!(quant::quant_repack, m)?)?;
    m.add_function(wrap_pyfunction!(quant::quant_unpack_rows, m)?)?;
    m.add_function(wrap_pyfunction!(dense::dense_linear, m)?)?;
    m.add_function(wrap_pyfunction!(elementwise::rotate_half, m)?)?;
    m.add_function(wrap_pyfunction!(dense::dense_isas, m)?)?;
    m.add_function(wrap_pyfunction!(lora::lora_add, m)?)?;
    m.add_function(wrap_pyfunction!(lora::lora_isas, m)?)?;
    m.add_function(wrap_pyfunction!(events::block_hashes, m)?)?;
    m.add_class::<stats::PyKVCacheStats>()?;
    m.add_class::<stats::PyKVCacheGroupStats>()?;
    m.add_class::<stats::PyMemoryBreakdown>()?;
    m.add_function(wrap_pyfunction!(py_child_seed, m)?)?;
    m.add_function(wrap_pyfunction!(check_scheduler_args, m)?)?;
    m.add_function(wrap_pyfunction!(spec_config::check_speculative_config, m)?)?;
    m.add_function(wrap_pyfunction!(spm::spm_merges_json, m)?)?;
    let modes: Vec<&str> = PreemptionMode::ALL.iter().map(|p| p.as_str()).collect();
    m.add("PREEMPTION_MODES", modes)?;
    let scheduling: Vec<&str> = SchedulingPolicy::ALL.iter().map(|p| p.as_str()).collect();
    m.add("SCHEDULING_POLICIES", scheduling)?;
    m.add("HOLD_TOKEN", HOLD_TOKEN)?;
    let policies: Vec<&str> = AllocationPolicyKind::ALL
        .iter()
        .map(|p| p.as_str())
        .collect();
    m.add("ALLOCATION_POLICIES", policies)?;
    Ok(())
}
