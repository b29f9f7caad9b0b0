//! `pagedrs._core.Scheduler`: one call per engine step phase, results as the
//! typed classes of [`crate::step`] and [`crate::stats`].

use numpy::PyReadonlyArray1;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyDict;

use crate::args;
use crate::events::PyKVCacheEvent;
use crate::finished::PyFinished;
use crate::stats::{PyKVCacheStats, PyMemoryBreakdown};
use crate::step::PySchedulerOutput;
use pagedrs_sched::scheduler::{
    AllocationPolicyKind, ConfigError, PreemptionMode, Request, SamplingConfig, Scheduler,
    SchedulerConfig, SchedulingPolicy, StepBatch, StopConfig,
};

/// Continuous-batching scheduler over a paged KV cache (Rust core).
///
/// Each engine step calls `schedule()` once (returns the step's flat numpy
/// arrays) and `update()` once (applies the sampled tokens).
#[pyclass(name = "Scheduler", module = "pagedrs._core")]
pub struct PyScheduler {
    inner: Scheduler,
    /// A `schedule()` returned a step that `update()` / `cancel_step()` has
    /// not yet ended.
    step_in_flight: bool,
}

impl PyScheduler {
    /// `ValueError` while a step is in flight: "... call update() or
    /// cancel_step() {then}".
    fn check_no_step(&self, then: &str) -> PyResult<()> {
        if self.step_in_flight {
            return Err(PyValueError::new_err(format!(
                "a step is in flight: call update() or cancel_step() {then}"
            )));
        }
        Ok(())
    }
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
    ///     kv_cache_groups: one entry per KV cache group sharing the pool:
    ///         its sliding window in tokens (the query at position p sees
    ///         keys p - w < k <= p), or None for full attention. Each
    ///         sequence holds one block table per group; a sliding-window
    ///         group holds only the blocks some later query can see.
    ///         Default: one full-attention group.
    ///     scheduling_policy: "fcfs" (first come, first served) or
    ///         "priority": queues ordered by (priority, arrival), lower
    ///         priority values first (vLLM's semantics); a waiting request
    ///         preempts (by recompute) worse running groups when the KV cache
    ///         or max_num_seqs is the limit; preempted requests keep their
    ///         place in the queue.
    ///     enable_kv_cache_events: record the device pool's prefix-cache
    ///         changes for `take_kv_events()` (off: nothing is recorded).
    ///     speculative_config: speculative decoding (None: off), a dict of
    ///         vLLM's field names: method "ngram" (prompt lookup over the
    ///         request's tokens: prompt_lookup_min, prompt_lookup_max) or
    ///         "suffix" (SuffixDecoding over the request's tokens and the
    ///         outputs of earlier requests: suffix_decoding_max_tree_depth,
    ///         suffix_decoding_max_spec_factor,
    ///         suffix_decoding_min_token_prob,
    ///         suffix_decoding_max_cached_requests), and
    ///         num_speculative_tokens (most drafts per sequence and step).
    ///         Decoding sequences then get draft tokens in their step (see
    ///         `StepBatch.num_draft_tokens`), and `update()` takes the
    ///         accepted counts.
    /// Raises:
    ///     ValueError: on a zero size or window, a KV cache too small for
    ///         one sequence of max_model_len tokens, an empty
    ///         kv_cache_groups, a reserving policy with a hybrid KV cache,
    ///         an unknown policy name, or a bad speculative_config field
    ///         (named).
    #[new]
    #[pyo3(signature = (num_blocks, block_size, max_num_seqs, max_num_batched_tokens, max_model_len, enable_chunked_prefill = true, enable_prefix_caching = true, num_cpu_blocks = 0, preemption_mode = "recompute", allocation_policy = "paged", kv_cache_groups = None, scheduling_policy = "fcfs", enable_kv_cache_events = false, speculative_config = None))]
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
        kv_cache_groups: Option<Vec<Option<i64>>>,
        scheduling_policy: &str,
        enable_kv_cache_events: bool,
        speculative_config: Option<&Bound<'_, PyDict>>,
    ) -> PyResult<Self> {
        // The names parsed and the KV cache groups and speculative config
        // converted here; the checks that need every field are
        // `Scheduler::new`'s.
        let to_py = |e: ConfigError| args::value_error(e);
        let kv_cache_groups = args::kv_cache_groups(kv_cache_groups)?;
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
            kv_cache_groups,
            scheduling_policy: SchedulingPolicy::parse(scheduling_policy).map_err(to_py)?,
            speculative_config: speculative_config
                .map(crate::spec_config::parse)
                .transpose()?,
        };
        let mut inner = Scheduler::new(config).map_err(args::value_error)?;
        inner.enable_kv_events(enable_kv_cache_events);
        Ok(Self {
            inner,
            step_in_flight: false,
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
    ///     priority: lower values run first under scheduling_policy
    ///         "priority"; must be 0 under "fcfs".
    ///     num_speculative_tokens: most draft tokens per step for this
    ///         request under speculative decoding (at most the
    ///         configuration's; 0 turns speculation off for it, as beam
    ///         search needs); None: the configuration's.
    ///     lora_id: the request's LoRA adapter (`LoRARequest.lora_int_id`;
    ///         0: the base model): an extra key of its block hashes (two
    ///         adapters never share a cached block) and what `max_loras`
    ///         admission counts; its forks keep it.
    /// Raises:
    ///     ValueError: duplicate id, empty prompt, prompt >= max_model_len,
    ///         child_ids under a reserving allocation policy, or a non-zero
    ///         priority under "fcfs".
    #[pyo3(signature = (request_id, prompt_token_ids, max_tokens, stop_token_ids, min_tokens = 0, temperature = 0.0, top_p = 1.0, top_k = -1, seed = -1, cache_salt = None, child_ids = Vec::new(), expected_output_len = None, priority = 0, num_speculative_tokens = None, lora_id = 0))]
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
        priority: i64,
        num_speculative_tokens: Option<usize>,
        lora_id: u64,
    ) -> PyResult<()> {
        let token_ids = args::token_ids(&prompt_token_ids, "prompt token ids")?;
        let sampling = SamplingConfig {
            temperature,
            top_p,
            top_k,
            seed,
        };
        let stop = StopConfig {
            max_tokens,
            min_tokens,
            stop_token_ids,
        };
        let mut req = Request::new(request_id, token_ids, sampling, stop);
        req.cache_salt = cache_salt.map(String::into_bytes).unwrap_or_default();
        req.pending_children = child_ids;
        req.expected_output_len = expected_output_len;
        req.priority = priority;
        req.num_speculative_tokens = num_speculative_tokens;
        req.lora_id = lora_id;
        self.inner.add(req).map_err(args::value_error)
    }

    /// Schedule one step: pick the running, swapped and waiting requests and
    /// their token counts within the token budget, allocating blocks on demand
    /// and preempting when the pool runs dry (paper §4.2, §4.5).
    ///
    /// Returns:
    ///     None when nothing can run, else a `SchedulerOutput` (its batch may
    ///     have 0 tokens when the step only moves blocks).
    /// Raises:
    ///     ValueError: the previous step was neither updated nor cancelled.
    fn schedule(&mut self, py: Python<'_>) -> PyResult<Option<PySchedulerOutput>> {
        self.check_no_step("before schedule()")?;
        if self.inner.schedule().is_empty() && self.inner.moves().is_empty() {
            return Ok(None);
        }
        let batch = StepBatch::build(&self.inner);
        let out = PySchedulerOutput::new(py, batch, self.inner.moves())?;
        self.step_in_flight = true;
        Ok(Some(out))
    }

    /// Apply the sampled tokens: int64 `[sum(num_samples) +
    /// sum(num_accepted)]`, row by row in the order of the step's sampled
    /// rows. A row gives its accepted draft tokens (`num_accepted[r]` of
    /// them, equal to the row's first drafts), then `num_samples[r]` tokens:
    /// the target model's token after the accepted drafts (the bonus token
    /// when all were accepted), or at a parallel-sampling group's first
    /// sample its request's token and one for each of its child_ids in
    /// order. The tokens are appended one by one; a stop token, max_tokens
    /// or max_model_len inside the run ends the request there. Slots of
    /// rejected drafts return to the pool; only verified tokens are hashed
    /// for the prefix cache. A row's token may be HOLD_TOKEN (2**32 - 1,
    /// with no drafts accepted): nothing is appended and its last token runs
    /// again next step.
    ///
    /// Args:
    ///     sampled: int64 tokens as above.
    ///     num_accepted: int64 `[R]` accepted drafts per sampled row (each at
    ///         most `StepBatch.num_draft_tokens[r]`); None means 0 for
    ///         every row (speculation off, or every draft rejected).
    /// Returns the sequences that finished, as `FinishedRequest`s.
    ///
    /// Raises:
    ///     ValueError: when the lengths do not match the step's sampled
    ///         rows, a row accepts more drafts than it has, or an accepted
    ///         token is not the draft (nothing is applied).
    #[pyo3(signature = (sampled, num_accepted = None))]
    fn update(
        &mut self,
        py: Python<'_>,
        sampled: PyReadonlyArray1<'_, i64>,
        num_accepted: Option<PyReadonlyArray1<'_, i64>>,
    ) -> PyResult<Vec<PyFinished>> {
        let sampled = args::token_ids(&sampled, "sampled token ids")?;
        let num_accepted = num_accepted
            .map(|a| args::counts(&a, "num_accepted"))
            .transpose()?;
        if num_accepted.is_none() && sampled.len() != self.inner.num_sampled_tokens() {
            return Err(PyValueError::new_err(format!(
                "update() got {} sampled tokens, the step expects {}",
                sampled.len(),
                self.inner.num_sampled_tokens()
            )));
        }
        let finished = self
            .inner
            .update_accepted(&sampled, num_accepted.as_deref())
            .map_err(args::value_error)?;
        self.step_in_flight = false;
        Ok(finished
            .into_iter()
            .map(|f| PyFinished::new(py, f))
            .collect())
    }

    /// Write a draft model's tokens into the step in flight
    /// (`speculative_config.method = "draft_model"`: `schedule()` reserves
    /// the drafts' slots with placeholder tokens), before `update()`.
    ///
    /// Args:
    ///     draft_token_ids: int64 `[D]`, row by row as
    ///         `StepBatch.draft_token_ids`.
    ///
    /// Raises:
    ///     ValueError: no step in flight, a length other than the step's
    ///         draft slots, or an id outside [0, 2^32) (nothing changes).
    fn set_draft_tokens(&mut self, draft_token_ids: PyReadonlyArray1<'_, i64>) -> PyResult<()> {
        if !self.step_in_flight {
            return Err(PyValueError::new_err(
                "set_draft_tokens() needs a step in flight (call schedule() first)",
            ));
        }
        let tokens = args::token_ids(&draft_token_ids, "draft token ids")?;
        self.inner
            .set_draft_tokens(&tokens)
            .map_err(args::value_error)
    }

    /// Abort a request; its blocks return to the pool at once. Returns the
    /// `FinishedRequest` (reason "abort"), or None if the id is not live.
    ///
    /// Raises:
    ///     ValueError: the request is in the step in flight.
    fn abort(&mut self, py: Python<'_>, request_id: u64) -> PyResult<Option<PyFinished>> {
        args::check_not_scheduled(&self.inner, request_id)?;
        Ok(self.inner.abort(request_id).map(|f| PyFinished::new(py, f)))
    }

    /// Drop the scheduled step without applying it (its forward pass failed);
    /// requests in it can then be aborted. No-op between steps.
    fn cancel_step(&mut self) {
        self.inner.cancel_step();
        self.step_in_flight = false;
    }

    /// End a request because a stop string matched; frees its blocks at once.
    /// Returns its `FinishedRequest` (reason "stop"), or None if not live.
    ///
    /// Raises:
    ///     ValueError: the request is in the step in flight.
    fn stop_request(&mut self, py: Python<'_>, request_id: u64) -> PyResult<Option<PyFinished>> {
        args::check_not_scheduled(&self.inner, request_id)?;
        Ok(self
            .inner
            .finish(request_id, pagedrs_sched::scheduler::FinishReason::Stop)
            .map(|f| PyFinished::new(py, f)))
    }

    /// Replace running request `request_id`'s pending output token (the
    /// one `update()` appended last, not computed yet) by `token_ids`
    /// (jump-forward decoding: text a grammar forces, as the tokenizer's
    /// tokens). They are appended as sampled tokens are: a stop token,
    /// max_tokens or max_model_len ends the request there and it leaves at
    /// once. The next step computes them all.
    ///
    /// Returns (tokens appended, the `FinishedRequest` or None).
    ///
    /// Raises:
    ///     ValueError: no tokens, an unknown request, a step in flight, or
    ///         a request whose last token is computed (nothing changes).
    fn replace_pending(
        &mut self,
        py: Python<'_>,
        request_id: u64,
        token_ids: PyReadonlyArray1<'_, i64>,
    ) -> PyResult<(usize, Option<PyFinished>)> {
        let tokens = args::token_ids(&token_ids, "token ids")?;
        let (n, finished) = self
            .inner
            .replace_pending(request_id, &tokens)
            .map_err(args::value_error)?;
        Ok((n, finished.map(|f| PyFinished::new(py, f))))
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
            .map_err(args::value_error)
    }

    /// Most blocks one sequence of `num_tokens` tokens holds at once over
    /// every KV cache group (a sliding-window group holds its window plus
    /// the step's chunk; a full group every block).
    fn max_blocks_per_seq(&self, num_tokens: usize) -> usize {
        let chunk = self.inner.config().max_num_batched_tokens;
        self.inner.kv().peak_blocks(num_tokens, chunk)
    }

    /// Bound the distinct LoRA adapters among the running sequences (None:
    /// no bound): a waiting group of an adapter new to the running batch
    /// waits at the queue's head while `max_loras` others run.
    ///
    /// Raises:
    ///     ValueError: max_loras is 0.
    #[pyo3(signature = (max_loras))]
    fn set_max_loras(&mut self, max_loras: Option<usize>) -> PyResult<()> {
        self.inner
            .set_max_loras(max_loras)
            .map_err(args::value_error)
    }

    /// The distinct LoRA adapter ids (non-zero) of the running sequences.
    fn running_loras(&self) -> Vec<u64> {
        let mut ids: Vec<u64> = self.inner.running_loras().into_iter().collect();
        ids.sort_unstable();
        ids
    }

    /// True while any request is waiting or running.
    fn has_unfinished_requests(&self) -> bool {
        !self.inner.is_idle()
    }

    /// The prefix-cache changes (`KVCacheEvent`) since the last call, oldest
    /// first; empty unless built with enable_kv_cache_events. A step's
    /// evictions happen in `schedule()`, its new cached blocks in
    /// `update()`.
    fn take_kv_events(&mut self) -> Vec<PyKVCacheEvent> {
        let bs = self.inner.config().block_size;
        self.inner
            .take_kv_events()
            .into_iter()
            .map(|e| PyKVCacheEvent::new(e, bs))
            .collect()
    }

    /// Forget every cached prefix (records an "all_cleared" event) when no
    /// device block is in use. Returns whether it did.
    ///
    /// Raises:
    ///     ValueError: a step is in flight.
    fn reset_prefix_cache(&mut self) -> PyResult<bool> {
        self.check_no_step("first")?;
        Ok(self.inner.reset_prefix_cache())
    }

    /// Replace the step cost model of the draft-length policy, from the
    /// next ``schedule()`` on (``speculative_config.draft_step_costs``):
    /// ``[batch, decode_s, draft_s]`` points, or None to draft every
    /// proposal in full. Ignored without speculative decoding.
    ///
    /// Raises:
    ///     ValueError: bad points, or points under draft_length_policy
    ///         "fixed", naming ``draft_step_costs``.
    #[pyo3(signature = (costs))]
    fn set_draft_step_costs(&mut self, costs: Option<&Bound<'_, PyAny>>) -> PyResult<()> {
        let model = costs
            .filter(|c| !c.is_none())
            .map(crate::spec_config::step_costs)
            .transpose()?;
        self.inner
            .set_draft_step_costs(model)
            .map_err(args::value_error)
    }

    /// The speculative decoding settings in force (every field, vLLM's
    /// names), or None when off.
    fn speculative_config<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyDict>>> {
        self.inner
            .config()
            .speculative_config
            .as_ref()
            .map(|c| crate::spec_config::to_dict(py, c))
            .transpose()
    }

    /// Pool and queue counters (`KVCacheStats`).
    fn stats(&self) -> PyKVCacheStats {
        PyKVCacheStats::of(&self.inner)
    }

    /// Where the device pool's token slots are right after `schedule()`
    /// (`MemoryBreakdown`: token states, reservation, internal and external
    /// fragmentation, free).
    fn memory_breakdown(&self) -> PyMemoryBreakdown {
        self.inner.memory_breakdown().into()
    }
}
