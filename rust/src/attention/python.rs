//! PyO3 bindings of the CPU attention kernels (`pagedrs._core.paged_decode_attention`,
//! `pagedrs._core.write_kv`), taking numpy views of torch CPU tensors.

use std::sync::{Arc, Mutex};

use numpy::{
    PyReadonlyArray1, PyReadonlyArray2, PyReadonlyArray3, PyReadonlyArray4, PyReadwriteArray3,
    PyReadwriteArray4, PyUntypedArrayMethods,
};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use rayon::{ThreadPool, ThreadPoolBuilder};

use super::cache::{self, CacheShape};
use super::paged_decode::{DecodeJob, DecodeOptions};

static POOL: Mutex<Option<(usize, Arc<ThreadPool>)>> = Mutex::new(None);

/// A rayon pool of `num_threads` workers, kept until another size is asked for.
fn pool(num_threads: usize) -> PyResult<Arc<ThreadPool>> {
    let mut slot = POOL.lock().unwrap_or_else(|e| e.into_inner());
    if let Some((n, p)) = slot.as_ref() {
        if *n == num_threads {
            return Ok(p.clone());
        }
    }
    let p = Arc::new(
        ThreadPoolBuilder::new()
            .num_threads(num_threads)
            .thread_name(|i| format!("pagedrs-attn-{i}"))
            .build()
            .map_err(|e| PyValueError::new_err(e.to_string()))?,
    );
    *slot = Some((num_threads, p.clone()));
    Ok(p)
}

fn cache_shape(dims: &[usize]) -> CacheShape {
    CacheShape {
        num_blocks: dims[0],
        num_kv_heads: dims[1],
        block_size: dims[2],
        head_dim: dims[3],
    }
}

fn invalid(msg: String) -> PyErr {
    PyValueError::new_err(msg)
}

/// Decode attention of one query token per sequence over its paged context
/// (PagedAttention §4.1), reading K/V in place through the block tables, with
/// HF transformers' eager semantics for the optional features.
///
/// Args:
///     query: float32 `[S, Hq, D]`, C-contiguous (Hq a multiple of Hkv).
///     key_cache, value_cache: float32 `[N, Hkv, bs, D]`, C-contiguous.
///     block_tables: int32 `[S, B]`.
///     seq_lens: int32 `[S]`, context tokens per sequence (>= 1, <= B * bs).
///     scale: softmax scale.
///     out: float32 `[S, Hq, D]`, written in place.
///     num_threads: threads of torch's OpenMP team (the caller among them) that
///         share the (sequence, KV head) work items; a rayon pool of this size
///         when the process has no OpenMP runtime.
///     sliding_window: attend to the last `sliding_window` tokens of each
///         context only (the query at position `p` sees `p - W < k <= p`);
///         blocks before the window are not read. None: the whole context.
///     softcap: logit soft cap `c > 0`: scores `c * tanh(s / c)` after scaling.
///     sinks: float32 `[Hq]`, a sink logit per query head taking part in the
///         softmax with its weight dropped (gpt-oss).
/// Raises:
///     ValueError: on inconsistent shapes, a length over the table, a block
///         id outside the cache (in the visible blocks), a window < 1, a soft
///         cap <= 0, or sinks not of length Hq.
#[pyfunction]
#[pyo3(signature = (
    query, key_cache, value_cache, block_tables, seq_lens, scale, out, num_threads = 1,
    *, sliding_window = None, softcap = None, sinks = None
))]
#[allow(clippy::too_many_arguments)]
pub fn paged_decode_attention(
    py: Python<'_>,
    query: PyReadonlyArray3<'_, f32>,
    key_cache: PyReadonlyArray4<'_, f32>,
    value_cache: PyReadonlyArray4<'_, f32>,
    block_tables: PyReadonlyArray2<'_, i32>,
    seq_lens: PyReadonlyArray1<'_, i32>,
    scale: f32,
    mut out: PyReadwriteArray3<'_, f32>,
    num_threads: usize,
    sliding_window: Option<usize>,
    softcap: Option<f32>,
    sinks: Option<PyReadonlyArray1<'_, f32>>,
) -> PyResult<()> {
    let shape = cache_shape(key_cache.shape());
    let (qs, bts) = (query.shape(), block_tables.shape());
    let (s, hq, d) = (qs[0], qs[1], qs[2]);
    if value_cache.shape() != key_cache.shape()
        || out.shape() != qs
        || d != shape.head_dim
        || shape.num_kv_heads == 0
        || hq % shape.num_kv_heads != 0
        || bts[0] != s
        || seq_lens.len() != s
    {
        return Err(invalid(format!(
            "inconsistent shapes: query {qs:?}, caches {:?}/{:?}, block_tables {bts:?}, \
             seq_lens {:?}, out {:?}",
            key_cache.shape(),
            value_cache.shape(),
            seq_lens.shape(),
            out.shape()
        )));
    }
    if sliding_window == Some(0) {
        return Err(invalid("sliding_window must be >= 1".to_string()));
    }
    if softcap.is_some_and(|c| c.is_nan() || c <= 0.0) {
        return Err(invalid(format!("softcap must be > 0, got {softcap:?}")));
    }
    if let Some(sk) = &sinks {
        if sk.len() != hq {
            return Err(invalid(format!(
                "sinks {:?} must hold one logit per query head ({hq})",
                sk.shape()
            )));
        }
    }
    let width = bts[1];
    let lens = seq_lens.as_slice()?;
    let tables = block_tables.as_slice()?;
    for (i, &len) in lens.iter().enumerate() {
        if len < 0 || len as usize > width * shape.block_size {
            return Err(invalid(format!(
                "seq_lens[{i}]={len} outside its block table"
            )));
        }
        let len = len as usize;
        let first = sliding_window.map_or(0, |w| len.saturating_sub(w)) / shape.block_size;
        let used = len.div_ceil(shape.block_size);
        let row = &tables[i * width + first.min(used)..i * width + used];
        if row.iter().any(|&b| b < 0 || b as usize >= shape.num_blocks) {
            return Err(invalid(format!(
                "block_tables[{i}] holds a block outside the cache"
            )));
        }
    }
    let (q, kc, vc) = (
        query.as_slice()?,
        key_cache.as_slice()?,
        value_cache.as_slice()?,
    );
    let o = out.as_slice_mut()?;
    let threads = num_threads.max(1);
    let sinks = sinks.as_ref().map(|a| a.as_slice()).transpose()?;
    let options = DecodeOptions {
        sliding_window,
        softcap,
        sinks,
    };
    let job = DecodeJob::new(q, kc, vc, shape, tables, width, lens, scale).with_options(options);
    if !py.detach(|| job.run_on_team(threads, o)) {
        // No OpenMP runtime in this process: our own rayon pool.
        let pool = pool(threads)?;
        py.detach(|| pool.install(|| job.run_on_rayon(o)));
    }
    Ok(())
}

/// Store the step's new keys and values into their cache slots, in place.
///
/// Args:
///     key, value: float32 `[T, Hkv, D]`, C-contiguous.
///     key_cache, value_cache: float32 `[N, Hkv, bs, D]`.
///     slot_mapping: int64 `[T]`, `block * bs + offset`; negative slots are skipped.
/// Raises:
///     ValueError: on inconsistent shapes or a slot outside the cache.
#[pyfunction]
pub fn write_kv(
    key: PyReadonlyArray3<'_, f32>,
    value: PyReadonlyArray3<'_, f32>,
    mut key_cache: PyReadwriteArray4<'_, f32>,
    mut value_cache: PyReadwriteArray4<'_, f32>,
    slot_mapping: PyReadonlyArray1<'_, i64>,
) -> PyResult<()> {
    let shape = cache_shape(key_cache.shape());
    let ks = key.shape();
    if value.shape() != ks
        || value_cache.shape() != key_cache.shape()
        || ks[0] != slot_mapping.len()
        || ks[1] != shape.num_kv_heads
        || ks[2] != shape.head_dim
    {
        return Err(invalid(format!(
            "inconsistent shapes: key {ks:?}, value {:?}, caches {:?}/{:?}, slot_mapping {:?}",
            value.shape(),
            key_cache.shape(),
            value_cache.shape(),
            slot_mapping.shape()
        )));
    }
    let slots = slot_mapping.as_slice()?;
    let capacity = (shape.num_blocks * shape.block_size) as i64;
    if let Some(bad) = slots.iter().find(|&&s| s >= capacity) {
        return Err(invalid(format!(
            "slot {bad} outside the cache of {capacity} slots"
        )));
    }
    cache::write_kv(
        key.as_slice()?,
        value.as_slice()?,
        key_cache.as_slice_mut()?,
        value_cache.as_slice_mut()?,
        shape,
        slots,
    );
    Ok(())
}
