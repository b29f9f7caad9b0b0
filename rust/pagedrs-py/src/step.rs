//! The step contract: what one `Scheduler.schedule()` hands to Python, as
//! frozen classes whose numpy arrays are attributes (no copy, no string
//! keys): the model inputs (`StepBatch`, field names the Rust ones of
//! [`StepBatch`]) and the block moves before them (`crate::block_moves`),
//! together a `SchedulerOutput`; what `update()` hands back is in
//! `crate::finished`.
//!
//! Shapes: `T` scheduled tokens, `S` scheduled sequences, `R` sampled rows,
//! `B` widest block table of the step.

use numpy::{IntoPyArray, PyArray1, PyArray2, PyArrayMethods, PyUntypedArrayMethods};
use pyo3::prelude::*;
use pyo3::types::PyTuple;

use crate::block_moves::PyBlockMoves;
use pagedrs_sched::scheduler::{BlockMoves, StepBatch};

/// Block tables and slot mapping of one KV cache group (layers with one
/// attention type and page size). A model with one layer type has one group;
/// in a sliding-window group, blocks released behind the window are 0.
#[pyclass(frozen, module = "pagedrs._core", name = "KVCacheGroupBatch")]
pub struct PyKVCacheGroupBatch {
    /// int64 `[T]`: cache slot (`block * block_size + offset`) of each token.
    #[pyo3(get)]
    slot_mapping: Py<PyArray1<i64>>,
    /// int32 `[S, B]`: physical block ids of each sequence, padded with 0.
    #[pyo3(get)]
    block_tables: Py<PyArray2<i32>>,
}

#[pymethods]
impl PyKVCacheGroupBatch {
    #[new]
    fn py_new(slot_mapping: Py<PyArray1<i64>>, block_tables: Py<PyArray2<i32>>) -> Self {
        Self {
            slot_mapping,
            block_tables,
        }
    }

    fn __reduce__<'py>(slf: &Bound<'py, Self>) -> PyResult<Bound<'py, PyTuple>> {
        let py = slf.py();
        let me = slf.get();
        let args = (me.slot_mapping.clone_ref(py), me.block_tables.clone_ref(py));
        (slf.get_type(), args).into_pyobject(py)
    }
}

/// The flat model inputs of one step.
#[pyclass(frozen, module = "pagedrs._core", name = "StepBatch")]
pub struct PyStepBatch {
    /// int64 `[T]`: token ids to run.
    #[pyo3(get)]
    input_ids: Py<PyArray1<i64>>,
    /// int64 `[T]`: absolute position of each token.
    #[pyo3(get)]
    positions: Py<PyArray1<i64>>,
    /// int32 `[S + 1]`: offset of each sequence's first token in `input_ids`.
    #[pyo3(get)]
    query_start_loc: Py<PyArray1<i32>>,
    /// int32 `[S]`: context length (cached + new tokens) after the step.
    #[pyo3(get)]
    seq_lens: Py<PyArray1<i32>>,
    /// uint64 `[S]`: request id of each scheduled sequence.
    #[pyo3(get)]
    seq_request_ids: Py<PyArray1<u64>>,
    /// uint64 `[S]`: LoRA adapter id of each scheduled sequence
    /// (`LoRARequest.lora_int_id`; 0: the base model).
    #[pyo3(get)]
    seq_lora_ids: Py<PyArray1<u64>>,
    /// Tuple of `KVCacheGroupBatch`, one per KV cache group.
    #[pyo3(get)]
    kv_groups: Py<PyTuple>,
    /// int64 `[R]`: row in the `T` tokens whose logits are sampled (the
    /// row's last scheduled token: its last draft when it has drafts).
    #[pyo3(get)]
    logits_indices: Py<PyArray1<i64>>,
    /// uint64 `[R]`: request id of each sampled row.
    #[pyo3(get)]
    sample_request_ids: Py<PyArray1<u64>>,
    /// float32 `[R]`: temperature (0 = greedy).
    #[pyo3(get)]
    temperature: Py<PyArray1<f32>>,
    /// float32 `[R]`: top-p.
    #[pyo3(get)]
    top_p: Py<PyArray1<f32>>,
    /// int32 `[R]`: top-k (-1 = off).
    #[pyo3(get)]
    top_k: Py<PyArray1<i32>>,
    /// int64 `[R]`: per-request seed (-1 = none).
    #[pyo3(get)]
    seed: Py<PyArray1<i64>>,
    /// int64 `[R]`: tokens generated so far by each sampled request.
    #[pyo3(get)]
    num_output_tokens: Py<PyArray1<i64>>,
    /// int32 `[R]`: tokens to sample from each row (> 1 at a parallel
    /// sampling group's first sample).
    #[pyo3(get)]
    num_samples: Py<PyArray1<i32>>,
    /// int32 `[R]`: draft tokens of each row (speculative decoding; 0
    /// without): the last `num_draft_tokens[r]` tokens of its sequence.
    #[pyo3(get)]
    num_draft_tokens: Py<PyArray1<i32>>,
    /// int64 `[D]`: the draft tokens, row by row (`D = sum(num_draft_tokens)`).
    #[pyo3(get)]
    draft_token_ids: Py<PyArray1<i64>>,
    /// int64 `[R + D]`: per row, the token rows of its pending token and of
    /// each draft (`num_draft_tokens[r] + 1` consecutive rows ending at
    /// `logits_indices[r]`); equal to `logits_indices` without drafts.
    #[pyo3(get)]
    spec_logits_indices: Py<PyArray1<i64>>,
    /// `T`, the scheduled tokens (0 on a step that only moves blocks).
    #[pyo3(get)]
    num_tokens: usize,
    /// `S`, the scheduled sequences.
    #[pyo3(get)]
    num_seqs: usize,
    /// `K = sum(num_samples)`: tokens `update()` expects (plus each row's
    /// accepted drafts under speculative decoding).
    #[pyo3(get)]
    num_sampled_tokens: usize,
    /// `D`, the step's draft tokens.
    #[pyo3(get)]
    num_drafts: usize,
}

impl PyStepBatch {
    pub(crate) fn new(py: Python<'_>, b: StepBatch) -> PyResult<Self> {
        let num_tokens = b.input_ids.len();
        let num_seqs = b.seq_lens.len();
        let num_sampled_tokens = b.num_samples.iter().map(|&n| n as usize).sum();
        let num_drafts = b.draft_token_ids.len();
        let groups = b
            .groups
            .into_iter()
            .map(|g| {
                let group = PyKVCacheGroupBatch {
                    slot_mapping: g.slot_mapping.into_pyarray(py).unbind(),
                    block_tables: g
                        .block_tables
                        .into_pyarray(py)
                        .reshape([num_seqs, g.max_blocks])?
                        .unbind(),
                };
                Py::new(py, group)
            })
            .collect::<PyResult<Vec<_>>>()?;
        let kv_groups = PyTuple::new(py, groups)?.unbind();
        Ok(Self {
            input_ids: b.input_ids.into_pyarray(py).unbind(),
            positions: b.positions.into_pyarray(py).unbind(),
            query_start_loc: b.query_start_loc.into_pyarray(py).unbind(),
            seq_lens: b.seq_lens.into_pyarray(py).unbind(),
            seq_request_ids: b.seq_request_ids.into_pyarray(py).unbind(),
            seq_lora_ids: b.seq_lora_ids.into_pyarray(py).unbind(),
            kv_groups,
            logits_indices: b.logits_indices.into_pyarray(py).unbind(),
            sample_request_ids: b.sample_request_ids.into_pyarray(py).unbind(),
            temperature: b.temperature.into_pyarray(py).unbind(),
            top_p: b.top_p.into_pyarray(py).unbind(),
            top_k: b.top_k.into_pyarray(py).unbind(),
            seed: b.seed.into_pyarray(py).unbind(),
            num_output_tokens: b.num_output_tokens.into_pyarray(py).unbind(),
            num_samples: b.num_samples.into_pyarray(py).unbind(),
            num_draft_tokens: b.num_draft_tokens.into_pyarray(py).unbind(),
            draft_token_ids: b.draft_token_ids.into_pyarray(py).unbind(),
            spec_logits_indices: b.spec_logits_indices.into_pyarray(py).unbind(),
            num_tokens,
            num_seqs,
            num_sampled_tokens,
            num_drafts,
        })
    }
}

#[pymethods]
impl PyStepBatch {
    /// Build a batch from its arrays (dtypes as the attributes); the
    /// scheduler builds these itself, this serves tests, benchmarks and
    /// pickling. Without the speculative decoding arrays the batch has no
    /// drafts (`num_draft_tokens` zeros, `spec_logits_indices` equal to
    /// `logits_indices`); without `seq_lora_ids` every sequence runs the
    /// base model.
    #[new]
    #[pyo3(signature = (input_ids, positions, query_start_loc, seq_lens, seq_request_ids, kv_groups, logits_indices, sample_request_ids, temperature, top_p, top_k, seed, num_output_tokens, num_samples, num_draft_tokens = None, draft_token_ids = None, spec_logits_indices = None, seq_lora_ids = None))]
    #[allow(clippy::too_many_arguments)]
    fn py_new(
        py: Python<'_>,
        input_ids: Py<PyArray1<i64>>,
        positions: Py<PyArray1<i64>>,
        query_start_loc: Py<PyArray1<i32>>,
        seq_lens: Py<PyArray1<i32>>,
        seq_request_ids: Py<PyArray1<u64>>,
        kv_groups: Vec<Py<PyKVCacheGroupBatch>>,
        logits_indices: Py<PyArray1<i64>>,
        sample_request_ids: Py<PyArray1<u64>>,
        temperature: Py<PyArray1<f32>>,
        top_p: Py<PyArray1<f32>>,
        top_k: Py<PyArray1<i32>>,
        seed: Py<PyArray1<i64>>,
        num_output_tokens: Py<PyArray1<i64>>,
        num_samples: Py<PyArray1<i32>>,
        num_draft_tokens: Option<Py<PyArray1<i32>>>,
        draft_token_ids: Option<Py<PyArray1<i64>>>,
        spec_logits_indices: Option<Py<PyArray1<i64>>>,
        seq_lora_ids: Option<Py<PyArray1<u64>>>,
    ) -> PyResult<Self> {
        let seqs = PyUntypedArrayMethods::len(seq_lens.bind(py));
        let seq_lora_ids =
            seq_lora_ids.unwrap_or_else(|| vec![0u64; seqs].into_pyarray(py).unbind());
        let rows = PyUntypedArrayMethods::len(logits_indices.bind(py));
        let num_draft_tokens =
            num_draft_tokens.unwrap_or_else(|| vec![0i32; rows].into_pyarray(py).unbind());
        let draft_token_ids =
            draft_token_ids.unwrap_or_else(|| Vec::<i64>::new().into_pyarray(py).unbind());
        let spec_logits_indices = match spec_logits_indices {
            Some(a) => a,
            None => logits_indices
                .bind(py)
                .readonly()
                .as_slice()?
                .to_vec()
                .into_pyarray(py)
                .unbind(),
        };
        let num_sampled_tokens = num_samples
            .bind(py)
            .readonly()
            .as_slice()?
            .iter()
            .map(|&n| n.max(0) as usize)
            .sum();
        Ok(Self {
            num_tokens: PyUntypedArrayMethods::len(input_ids.bind(py)),
            num_seqs: PyUntypedArrayMethods::len(seq_lens.bind(py)),
            num_sampled_tokens,
            input_ids,
            positions,
            query_start_loc,
            seq_lens,
            seq_request_ids,
            seq_lora_ids,
            kv_groups: PyTuple::new(py, kv_groups)?.unbind(),
            logits_indices,
            sample_request_ids,
            temperature,
            top_p,
            top_k,
            seed,
            num_output_tokens,
            num_samples,
            num_drafts: PyUntypedArrayMethods::len(draft_token_ids.bind(py)),
            num_draft_tokens,
            draft_token_ids,
            spec_logits_indices,
        })
    }

    fn __reduce__<'py>(slf: &Bound<'py, Self>) -> PyResult<Bound<'py, PyTuple>> {
        let py = slf.py();
        let b = slf.get();
        let args = PyTuple::new(
            py,
            [
                b.input_ids.clone_ref(py).into_any(),
                b.positions.clone_ref(py).into_any(),
                b.query_start_loc.clone_ref(py).into_any(),
                b.seq_lens.clone_ref(py).into_any(),
                b.seq_request_ids.clone_ref(py).into_any(),
                b.kv_groups.clone_ref(py).into_any(),
                b.logits_indices.clone_ref(py).into_any(),
                b.sample_request_ids.clone_ref(py).into_any(),
                b.temperature.clone_ref(py).into_any(),
                b.top_p.clone_ref(py).into_any(),
                b.top_k.clone_ref(py).into_any(),
                b.seed.clone_ref(py).into_any(),
                b.num_output_tokens.clone_ref(py).into_any(),
                b.num_samples.clone_ref(py).into_any(),
                b.num_draft_tokens.clone_ref(py).into_any(),
                b.draft_token_ids.clone_ref(py).into_any(),
                b.spec_logits_indices.clone_ref(py).into_any(),
                b.seq_lora_ids.clone_ref(py).into_any(),
            ],
        )?;
        (slf.get_type(), args).into_pyobject(py)
    }

    fn __repr__(&self) -> String {
        format!(
            "StepBatch(num_tokens={}, num_seqs={}, num_sampled_tokens={}, num_drafts={})",
            self.num_tokens, self.num_seqs, self.num_sampled_tokens, self.num_drafts
        )
    }
}

/// What one `Scheduler.schedule()` decided: the step's model inputs and the
/// block moves to apply before them.
#[pyclass(frozen, module = "pagedrs._core", name = "SchedulerOutput")]
pub struct PySchedulerOutput {
    /// The model inputs (`num_tokens` may be 0: the step only moves blocks).
    #[pyo3(get)]
    batch: Py<PyStepBatch>,
    /// Swaps and copy-on-write copies, applied before the forward pass.
    #[pyo3(get)]
    block_moves: Py<PyBlockMoves>,
}

impl PySchedulerOutput {
    pub(crate) fn new(py: Python<'_>, b: StepBatch, m: &BlockMoves) -> PyResult<Self> {
        Ok(Self {
            batch: Py::new(py, PyStepBatch::new(py, b)?)?,
            block_moves: Py::new(py, PyBlockMoves::new(py, m)?)?,
        })
    }
}

#[pymethods]
impl PySchedulerOutput {
    #[new]
    fn py_new(batch: Py<PyStepBatch>, block_moves: Py<PyBlockMoves>) -> Self {
        Self { batch, block_moves }
    }

    fn __reduce__<'py>(slf: &Bound<'py, Self>) -> PyResult<Bound<'py, PyTuple>> {
        let py = slf.py();
        let o = slf.get();
        let args = (o.batch.clone_ref(py), o.block_moves.clone_ref(py));
        (slf.get_type(), args).into_pyobject(py)
    }

    fn __repr__(&self, py: Python<'_>) -> String {
        format!(
            "SchedulerOutput({}, {})",
            self.batch.get().__repr__(),
            self.block_moves.get().__repr__(py)
        )
    }
}
