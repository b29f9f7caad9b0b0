//! PyO3 bindings: `pagedrs._core.Scheduler`, one call per engine step phase.

use numpy::{IntoPyArray, PyArray2, PyArrayMethods, PyReadonlyArray1};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyDict;
use pyo3::IntoPyObjectExt;

use crate::kv_cache::BlockCopy;
use crate::scheduler::{
    AllocationPolicyKind, ConfigError, Finished, PreemptionMode, Request, SamplingConfig,
    Scheduler, SchedulerConfig, StepBatch, StopConfig,
};

/// Continuous-batching scheduler over a paged KV cache (Rust core).
///
/// Each engine step calls `schedule()` once (returns the step's flat numpy
/// arrays) and `update()` once (applies the sampled tokens).
#[pyclass(name = "Scheduler", module = "pagedrs._core")]
pub struct PyScheduler {
    inner: Scheduler,
}

fn finished_to_py<'py>(py: Python<'py>, f: Finished) -> PyResult<Bound<'py, PyAny>> {
    let ids = f.output_token_ids.into_pyarray(py);
    (f.id, f.reason.as_str(), f.stop_token, ids).into_bound_py_any(py)
}

/// `[M, 2]` int64 array of block pairs.
fn pairs_to_py<'py>(py: Python<'py>, pairs: &[BlockCopy]) -> PyResult<Bound<'py, PyArray2<i64>>> {
    let flat: Vec<i64> = pairs
        .iter()
        .flat_map(|&(a, b)| [a as i64, b as i64])
        .collect();
    flat.into_pyarray(py).reshape([pairs.len(), 2])
}

#[pymethods]
impl PyScheduler {
    /// Args:
    ///     num_blocks: physical KV blocks in the device pool.
    ///     block_size: tokens per block.
    ///     max_num_seqs: most sequences per step.
    ///     max_num_batched_tokens: token budget per step.
    ///     max_model_len: longest sequence (prompt + output), tokens.
    ///     enable_chunked_prefill: split prompts longer than the budget.
    ///     enable_prefix_caching: reuse cached blocks of equal prefixes.
    ///     num_cpu_blocks: blocks in the CPU swap pool.
    ///     preemption_mode: "recompute" or "swap".
    ///     allocation_policy: "paged" (blocks on demand, the default), or a
    ///         contiguous-reservation baseline of the paper's Figure 2, each
    ///         request taking one first-fit run of blocks at admission:
    ///         "reserve-max" (Orca (Max): max_model_len tokens),
    ///         "reserve-pow2" (Orca (Pow2): prompt + next power of two of the
    ///         expected output length), "reserve-oracle" (Orca (Oracle):
    ///         prompt + the expected output length), "static" (reserves like
    ///         reserve-max; a new batch starts only when the previous one has
    ///         finished). Use block_size 1 with them so a block is a token
    ///         slot. They turn prefix caching off, never preempt, stop a
    ///         request when it reaches its reservation, and reject forks and
    ///         child_ids.
    /// Raises:
    ///     ValueError: on a zero size, a KV cache too small for one
    ///         sequence of max_model_len tokens, or an unknown policy name.
    #[new]
    #[pyo3(signature = (num_blocks, block_size, max_num_seqs, max_num_batched_tokens, max_model_len, enable_chunked_prefill = true, enable_prefix_caching = true, num_cpu_blocks = 0, preemption_mode = "recompute", allocation_policy = "paged"))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        num_blocks: usize,
        block_size: usize,
        max_num_seqs: usize,
        max_num_batched_tokens: usize,
        max_model_len: usize,
        enable_chunked_prefill: bool,
        enable_prefix_caching: bool,
        num_cpu_blocks: usize,
        preemption_mode: &str,
        allocation_policy: &str,
    ) -> PyResult<Self> {
        let to_py = |e: ConfigError| PyValueError::new_err(e.to_string());
        let allocation_policy = AllocationPolicyKind::parse(allocation_policy).map_err(to_py)?;
        let preemption_mode = PreemptionMode::parse(preemption_mode).map_err(to_py)?;
        let config = SchedulerConfig {
            num_blocks,
            num_cpu_blocks,
            block_size,
            max_num_seqs,
            max_num_batched_tokens,
            max_model_len,
            enable_chunked_prefill,
            enable_prefix_caching,
            preemption_mode,
            allocation_policy,
        };
        Ok(Self {
            inner: Scheduler::new(config).map_err(to_py)?,
        })
    }

    /// Queue a request.
    ///
    /// Args:
    ///     request_id: unique integer id.
    ///     prompt_token_ids: int64 array `[P]`.
    ///     max_tokens: most generated tokens.
    ///     stop_token_ids: token ids that end the request (include EOS here).
    ///     cache_salt: extra key of the request's block hashes; requests with
    ///         different salts never share cached blocks.
    ///     child_ids: ids of the other sequences of a parallel-sampling group
    ///         (n / best_of > 1), forked at the first sample, sharing the
    ///         prompt's blocks; their first tokens come with the parent's.
    ///     expected_output_len: output length a reserving allocation policy
    ///         plans for ("reserve-oracle" reserves exactly this many output
    ///         tokens, "reserve-pow2" its next power of two); None means
    ///         max_tokens, and it never exceeds max_tokens. Ignored by
    ///         "paged", "reserve-max" and "static".
    /// Raises:
    ///     ValueError: duplicate id, empty prompt, prompt >= max_model_len,
    ///         or child_ids under a reserving allocation policy.
    #[pyo3(signature = (request_id, prompt_token_ids, max_tokens, stop_token_ids, min_tokens = 0, temperature = 0.0, top_p = 1.0, top_k = -1, seed = -1, cache_salt = None, child_ids = Vec::new(), expected_output_len = None))]
    #[allow(clippy::too_many_arguments)]
    fn add_request(
        &mut self,
        request_id: u64,
        prompt_token_ids: PyReadonlyArray1<'_, i64>,
        max_tokens: usize,
        stop_token_ids: Vec<u32>,
        min_tokens: usize,
        temperature: f32,
        top_p: f32,
        top_k: i32,
        seed: i64,
        cache_salt: Option<String>,
        child_ids: Vec<u64>,
        expected_output_len: Option<usize>,
    ) -> PyResult<()> {
        let ids = prompt_token_ids.as_slice()?;
        let token_ids = ids
            .iter()
            .map(|&t| u32::try_from(t))
            .collect::<Result<Vec<u32>, _>>()
            .map_err(|_| PyValueError::new_err("prompt token ids must be in [0, 2^32)"))?;
        let mut req = Request::new(
            request_id,
            token_ids,
            SamplingConfig {
                temperature,
                top_p,
                top_k,
                seed,
            },
            StopConfig {
                max_tokens,
                min_tokens,
                stop_token_ids,
            },
        );
        req.cache_salt = cache_salt.map(String::into_bytes).unwrap_or_default();
        req.pending_children = child_ids;
        req.expected_output_len = expected_output_len;
        self.inner
            .add(req)
            .map_err(|e| PyValueError::new_err(e.to_string()))
    }

    /// Schedule one step. Returns None when nothing can run, else a dict of
    /// numpy arrays: input_ids/positions/slot_mapping int64 `[T]`,
    /// query_start_loc int32 `[S+1]`, seq_lens int32 `[S]`, seq_request_ids
    /// uint64 `[S]`, block_tables int32
    /// `[S, B]`, logits_indices int64 `[R]`, request_ids uint64 `[R]`,
    /// temperature/top_p float32 `[R]`, top_k int32 `[R]`, seed int64 `[R]`,
    /// num_output_tokens int64 `[R]`, num_samples int32 `[R]` (tokens to
    /// sample from each row: >1 at a parallel-sampling group's first sample),
    /// and the block moves to apply before the
    /// forward pass, in order: swap_out (device, cpu), swap_in (cpu, device),
    /// block_copies (src, dst), each int64 `[M, 2]`. T may be 0 when the step
    /// only moves blocks.
    fn schedule<'py>(&mut self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyDict>>> {
        if self.inner.schedule().is_empty() && self.inner.moves().is_empty() {
            return Ok(None);
        }
        let b = StepBatch::build(&self.inner);
        let d = PyDict::new(py);
        let num_seqs = b.seq_lens.len();
        d.set_item("input_ids", b.input_ids.into_pyarray(py))?;
        d.set_item("positions", b.positions.into_pyarray(py))?;
        d.set_item("slot_mapping", b.slot_mapping.into_pyarray(py))?;
        d.set_item("query_start_loc", b.query_start_loc.into_pyarray(py))?;
        d.set_item("seq_lens", b.seq_lens.into_pyarray(py))?;
        d.set_item("seq_request_ids", b.seq_request_ids.into_pyarray(py))?;
        let bt = b.block_tables.into_pyarray(py);
        let bt: Bound<'py, PyArray2<i32>> = bt.reshape([num_seqs, b.max_blocks])?;
        d.set_item("block_tables", bt)?;
        d.set_item("logits_indices", b.logits_indices.into_pyarray(py))?;
        d.set_item("request_ids", b.sample_request_ids.into_pyarray(py))?;
        d.set_item("temperature", b.temperature.into_pyarray(py))?;
        d.set_item("top_p", b.top_p.into_pyarray(py))?;
        d.set_item("top_k", b.top_k.into_pyarray(py))?;
        d.set_item("seed", b.seed.into_pyarray(py))?;
        d.set_item("num_output_tokens", b.num_output_tokens.into_pyarray(py))?;
        d.set_item("num_samples", b.num_samples.into_pyarray(py))?;
        let moves = self.inner.moves();
        d.set_item("swap_out", pairs_to_py(py, &moves.swap_out)?)?;
        d.set_item("swap_in", pairs_to_py(py, &moves.swap_in)?)?;
        d.set_item("block_copies", pairs_to_py(py, &moves.copies)?)?;
        Ok(Some(d))
    }

    /// Apply the sampled tokens: int64 `[sum(num_samples)]`, row by row in the
    /// order of the step's request_ids; a row with num_samples k gives its
    /// request's token, then one token for each of its child_ids in order.
    /// A row's token may be HOLD_TOKEN (2**32 - 1): nothing is appended and
    /// its last token runs again next step.
    /// Returns the finished sequences as tuples
    /// `(request_id, finish_reason, stop_token_or_None, output_token_ids)`.
    ///
    /// Raises:
    ///     ValueError: when the length does not match the step's sampled rows.
    fn update<'py>(
        &mut self,
        py: Python<'py>,
        sampled: PyReadonlyArray1<'_, i64>,
    ) -> PyResult<Vec<Bound<'py, PyAny>>> {
        let sampled: Vec<u32> = sampled
            .as_slice()?
            .iter()
            .map(|&t| u32::try_from(t))
            .collect::<Result<_, _>>()
            .map_err(|_| PyValueError::new_err("sampled token ids must be in [0, 2^32)"))?;
        if sampled.len() != self.inner.num_sampled_tokens() {
            return Err(PyValueError::new_err(format!(
                "update() got {} sampled tokens, the step expects {}",
                sampled.len(),
                self.inner.num_sampled_tokens()
            )));
        }
        self.inner
            .update(&sampled)
            .into_iter()
            .map(|f| finished_to_py(py, f))
            .collect()
    }

    /// Abort a request; its blocks return to the pool at once. Returns the
    /// finished tuple, or None if the id is not live.
    fn abort<'py>(
        &mut self,
        py: Python<'py>,
        request_id: u64,
    ) -> PyResult<Option<Bound<'py, PyAny>>> {
        self.inner
            .abort(request_id)
            .map(|f| finished_to_py(py, f))
            .transpose()
    }

    /// Drop the scheduled step without applying it (its forward pass failed);
    /// requests in it can then be aborted. No-op between steps.
    fn cancel_step(&mut self) {
        self.inner.cancel_step();
    }

    /// End a request because a stop string matched; frees its blocks at once.
    /// Returns its finished tuple (reason "stop"), or None if not live.
    fn stop_request<'py>(
        &mut self,
        py: Python<'py>,
        request_id: u64,
    ) -> PyResult<Option<Bound<'py, PyAny>>> {
        self.inner
            .finish(request_id, crate::scheduler::FinishReason::Stop)
            .map(|f| finished_to_py(py, f))
            .transpose()
    }

    /// Fork running request `parent` into `child`, sharing every block
    /// (copy-on-write on the first write into a shared partial block). With
    /// `last_token`, the child's newest (not yet computed) token is replaced
    /// by it (beam search).
    ///
    /// Raises:
    ///     ValueError: unknown or non-running parent, id in use, a step in
    ///         flight, or a reserving allocation policy.
    #[pyo3(signature = (parent, child, last_token = None))]
    fn fork(&mut self, parent: u64, child: u64, last_token: Option<u32>) -> PyResult<()> {
        self.inner
            .fork_with_last_token(parent, child, last_token)
            .map_err(|e| PyValueError::new_err(e.to_string()))
    }

    /// True while any request is waiting or running.
    fn has_unfinished_requests(&self) -> bool {
        !self.inner.is_idle()
    }

    /// Pool and queue counters: num_total_blocks, num_free_blocks,
    /// num_used_blocks, num_cached_blocks, num_cpu_blocks, num_free_cpu_blocks,
    /// num_preemptions, num_swapped_out / num_swapped_in (blocks),
    /// prefix_cache_queries / prefix_cache_hits (tokens), num_evicted_blocks,
    /// num_waiting, num_running, num_swapped, num_steps, block_size,
    /// num_token_states, num_table_blocks (blocks the device-resident
    /// sequences would hold without sharing), num_allocated_slots and
    /// kv_cache_utilization
    /// (token states / allocated slots, 1.0 when nothing is allocated).
    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let d = PyDict::new(py);
        let pool = self.inner.kv().pool();
        d.set_item("num_total_blocks", pool.num_total())?;
        d.set_item("num_free_blocks", pool.num_free())?;
        d.set_item("num_used_blocks", pool.num_total() - pool.num_free())?;
        d.set_item("num_cached_blocks", pool.num_cached())?;
        d.set_item("num_evicted_blocks", pool.num_evictions())?;
        let cpu = self.inner.kv().cpu_pool();
        d.set_item("num_cpu_blocks", cpu.num_total())?;
        d.set_item("num_free_cpu_blocks", cpu.num_free())?;
        let st = self.inner.stats();
        d.set_item("num_preemptions", st.num_preemptions)?;
        d.set_item("num_swapped_out", st.num_swapped_out)?;
        d.set_item("num_swapped_in", st.num_swapped_in)?;
        d.set_item("prefix_cache_queries", st.prefix_cache_queries)?;
        d.set_item("prefix_cache_hits", st.prefix_cache_hits)?;
        d.set_item("num_waiting", self.inner.num_waiting())?;
        d.set_item("num_running", self.inner.num_running())?;
        d.set_item("num_swapped", self.inner.num_swapped())?;
        d.set_item("num_steps", st.num_steps)?;
        d.set_item("block_size", self.inner.config().block_size)?;
        let (stored, allocated) = self.inner.kv_token_usage();
        d.set_item("num_token_states", stored)?;
        d.set_item("num_table_blocks", self.inner.num_table_blocks())?;
        d.set_item("num_allocated_slots", allocated)?;
        let util = if allocated == 0 {
            1.0
        } else {
            stored as f64 / allocated as f64
        };
        d.set_item("kv_cache_utilization", util)?;
        d.set_item(
            "allocation_policy",
            self.inner.config().allocation_policy.as_str(),
        )?;
        Ok(d)
    }

    /// Where the device pool's token slots are right after `schedule()` (the
    /// memory the step's forward pass runs with), as a dict of ints:
    /// total_slots (blocks x block size), and five parts summing to it:
    ///
    /// - token_states: slots holding KV of tokens in the cache once this
    ///   step's tokens are written;
    /// - reservation: allocated slots a later token of the same request will
    ///   fill;
    /// - internal: allocated slots that will never hold a token (past the
    ///   request's final KV length: prompt + max_tokens, capped at
    ///   max_model_len, minus one, since the last sampled token is never fed
    ///   back; exact when nothing stops a request before max_tokens);
    /// - external: free slots no request can use at this step: the policy
    ///   reserves (running requests never take more slots) and the head of
    ///   the waiting queue was not admitted for lack of a fitting contiguous
    ///   run, or (static) because its batch is still running;
    /// - free: the other free slots (paged: any free block serves any
    ///   request's next block, so it is never external).
    ///
    /// Also num_running, num_waiting, and admission_block: why the waiting
    /// queue's head was not admitted ("none", "memory", "batch" or "limit":
    /// max_num_seqs or token budget; always "none" under "paged").
    /// Sequences sharing a block count it once each.
    fn memory_breakdown<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let m = self.inner.memory_breakdown();
        let d = PyDict::new(py);
        d.set_item("total_slots", m.total)?;
        d.set_item("token_states", m.token_states)?;
        d.set_item("reservation", m.reservation)?;
        d.set_item("internal", m.internal)?;
        d.set_item("external", m.external)?;
        d.set_item("free", m.free)?;
        d.set_item("num_running", m.num_running)?;
        d.set_item("num_waiting", m.num_waiting)?;
        d.set_item("admission_block", m.admission_block.as_str())?;
        Ok(d)
    }
}
