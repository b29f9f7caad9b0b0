//! Counters and the memory breakdown as frozen classes (`Scheduler.stats()`,
//! `Scheduler.memory_breakdown()`), each with `as_dict()` for reports.

use pyo3::prelude::*;
use pyo3::types::{PyDict, PyTuple};

use pagedrs_sched::scheduler::{GroupUsage, MemoryBreakdown, Scheduler};

/// Declares a frozen pyclass of plain fields with getters and `as_dict()`,
/// optionally with one field holding a tuple of nested report classes
/// (a list of their dicts in `as_dict()`).
macro_rules! report_class {
    ($(#[$meta:meta])* $name:ident, $py_name:literal { $($(#[$fmeta:meta])* $field:ident: $ty:ty,)* }
     $(nested { $(#[$nmeta:meta])* $nfield:ident: $nty:ty })?) => {
        $(#[$meta])*
        #[pyclass(frozen, module = "pagedrs._core", name = $py_name)]
        #[derive(Debug, Clone)]
        pub struct $name {
            $($(#[$fmeta])* #[pyo3(get)] pub $field: $ty,)*
            $($(#[$nmeta])* pub $nfield: Vec<$nty>,)?
        }

        #[pymethods]
        impl $name {
            /// Every field by name.
            fn as_dict<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
                let d = PyDict::new(py);
                $(d.set_item(stringify!($field), self.$field.clone())?;)*
                $(
                    let items = self
                        .$nfield
                        .iter()
                        .map(|x| x.as_dict(py))
                        .collect::<PyResult<Vec<_>>>()?;
                    d.set_item(stringify!($nfield), items)?;
                )?
                Ok(d)
            }

            $(
                $(#[$nmeta])*
                #[getter]
                fn $nfield<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyTuple>> {
                    let items = self
                        .$nfield
                        .iter()
                        .map(|x| Py::new(py, x.clone()))
                        .collect::<PyResult<Vec<_>>>()?;
                    PyTuple::new(py, items)
                }
            )?

            fn __repr__(&self) -> String {
                format!("{:?}", self).replacen(stringify!($name), $py_name, 1)
            }
        }
    };
}

report_class! {
    /// What one KV cache group holds (`KVCacheStats.groups`); a shared block
    /// counts once.
    PyKVCacheGroupStats, "KVCacheGroupStats" {
        /// The group's sliding window in tokens, or None for full attention.
        sliding_window: Option<usize>,
        /// Device blocks held by the group's block tables.
        num_used_blocks: usize,
        /// Token states stored in them.
        num_token_states: usize,
        /// Their slots (num_used_blocks x block size).
        num_allocated_slots: usize,
        /// num_token_states / num_allocated_slots (1.0 when nothing is allocated).
        kv_cache_utilization: f64,
    }
}

fn utilization(stored: usize, allocated: usize) -> f64 {
    if allocated == 0 {
        1.0
    } else {
        stored as f64 / allocated as f64
    }
}

report_class! {
    /// Block pool and scheduler counters (`Scheduler.stats()`).
    PyKVCacheStats, "KVCacheStats" {
        /// Blocks in the device pool.
        num_total_blocks: usize,
        /// Device blocks on the free queue (cached ones included).
        num_free_blocks: usize,
        /// Device blocks held by some sequence.
        num_used_blocks: usize,
        /// Device blocks named by a prefix-cache hash.
        num_cached_blocks: usize,
        /// Cached blocks evicted (LRU) to serve an allocation.
        num_evicted_blocks: u64,
        /// Blocks in the CPU swap pool.
        num_cpu_blocks: usize,
        /// Free blocks of the CPU swap pool.
        num_free_cpu_blocks: usize,
        /// Sequences preempted so far.
        num_preemptions: u64,
        /// Blocks copied device -> CPU.
        num_swapped_out: u64,
        /// Blocks copied CPU -> device.
        num_swapped_in: u64,
        /// Prompt tokens looked up in the prefix cache.
        prefix_cache_queries: u64,
        /// Of those, tokens found cached (prefill skipped).
        prefix_cache_hits: u64,
        /// Sequences waiting (new, or preempted by recompute).
        num_waiting: usize,
        /// Running sequences.
        num_running: usize,
        /// Sequences swapped out to the CPU pool.
        num_swapped: usize,
        /// Steps scheduled so far.
        num_steps: u64,
        /// Tokens per block.
        block_size: usize,
        /// Token states held in device blocks (a shared block counts once).
        num_token_states: usize,
        /// Blocks the device-resident sequences would hold without sharing.
        num_table_blocks: usize,
        /// Allocated device slots (used blocks x block size).
        num_allocated_slots: usize,
        /// num_token_states / num_allocated_slots (1.0 when nothing is allocated).
        kv_cache_utilization: f64,
        /// The allocation policy's name.
        allocation_policy: &'static str,
        /// Sequence steps that carried draft tokens (speculative decoding).
        spec_decode_num_drafts: u64,
        /// Draft tokens scheduled.
        spec_decode_num_draft_tokens: u64,
        /// Draft tokens accepted.
        spec_decode_num_accepted_tokens: u64,
        /// `[i]`: drafts accepted at draft position i (0-based).
        spec_decode_num_accepted_tokens_per_pos: Vec<u64>,
    }
    nested {
        /// Tuple of `KVCacheGroupStats`, one per KV cache group.
        groups: PyKVCacheGroupStats
    }
}

impl PyKVCacheStats {
    pub(crate) fn of(s: &Scheduler) -> Self {
        let pool = s.kv().pool();
        let cpu = s.kv().cpu_pool();
        let st = s.stats();
        let bs = s.config().block_size;
        let usage = s.kv_group_usage();
        let stored = usage.iter().map(|u| u.num_token_states).sum();
        let allocated = (pool.num_total() - pool.num_free()) * bs;
        let groups = s
            .kv()
            .groups()
            .iter()
            .zip(&usage)
            .map(
                |(
                    g,
                    &GroupUsage {
                        num_used_blocks,
                        num_token_states,
                    },
                )| {
                    PyKVCacheGroupStats {
                        sliding_window: g.sliding_window,
                        num_used_blocks,
                        num_token_states,
                        num_allocated_slots: num_used_blocks * bs,
                        kv_cache_utilization: utilization(num_token_states, num_used_blocks * bs),
                    }
                },
            )
            .collect();
        Self {
            num_total_blocks: pool.num_total(),
            num_free_blocks: pool.num_free(),
            num_used_blocks: pool.num_total() - pool.num_free(),
            num_cached_blocks: pool.num_cached(),
            num_evicted_blocks: pool.num_evictions(),
            num_cpu_blocks: cpu.num_total(),
            num_free_cpu_blocks: cpu.num_free(),
            num_preemptions: st.num_preemptions,
            num_swapped_out: st.num_swapped_out,
            num_swapped_in: st.num_swapped_in,
            prefix_cache_queries: st.prefix_cache_queries,
            prefix_cache_hits: st.prefix_cache_hits,
            num_waiting: s.num_waiting(),
            num_running: s.num_running(),
            num_swapped: s.num_swapped(),
            num_steps: st.num_steps,
            block_size: s.config().block_size,
            num_token_states: stored,
            num_table_blocks: s.num_table_blocks(),
            num_allocated_slots: allocated,
            kv_cache_utilization: utilization(stored, allocated),
            allocation_policy: s.config().allocation_policy.as_str(),
            spec_decode_num_drafts: st.spec_num_drafts,
            spec_decode_num_draft_tokens: st.spec_num_draft_tokens,
            spec_decode_num_accepted_tokens: st.spec_num_accepted_tokens,
            spec_decode_num_accepted_tokens_per_pos: st.spec_num_accepted_tokens_per_pos.clone(),
            groups,
        }
    }
}

report_class! {
    /// Where the device pool's token slots are right after `schedule()` (the
    /// memory the step's forward pass runs with): `total_slots` (blocks x
    /// block size) and five parts summing to it. Sequences sharing a block
    /// count it once each.
    PyMemoryBreakdown, "MemoryBreakdown" {
        /// Blocks x block size.
        total_slots: usize,
        /// Slots holding KV of tokens in the cache once this step's tokens are written.
        token_states: usize,
        /// Allocated slots a later token of the same request will fill.
        reservation: usize,
        /// Allocated slots that will never hold a token (past the request's
        /// final KV length: prompt + max_tokens, capped at max_model_len, minus
        /// one, since the last sampled token is never fed back).
        internal: usize,
        /// Free slots no request can use at this step: the policy reserves and
        /// the head of the waiting queue was not admitted for lack of a fitting
        /// contiguous run, or (static) because its batch is still running.
        external: usize,
        /// The other free slots.
        free: usize,
        /// Running sequences.
        num_running: usize,
        /// Waiting sequences.
        num_waiting: usize,
        /// Why the waiting queue's head was not admitted: "none", "memory",
        /// "batch" or "limit" (max_num_seqs or token budget); always "none"
        /// under "paged".
        admission_block: &'static str,
    }
}

impl From<MemoryBreakdown> for PyMemoryBreakdown {
    fn from(m: MemoryBreakdown) -> Self {
        Self {
            total_slots: m.total,
            token_states: m.token_states,
            reservation: m.reservation,
            internal: m.internal,
            external: m.external,
            free: m.free,
            num_running: m.num_running,
            num_waiting: m.num_waiting,
            admission_block: m.admission_block.as_str(),
        }
    }
}
