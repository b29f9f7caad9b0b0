//! PyO3 bindings of the CPU attention kernels (`pagedrs._core.paged_decode_attention`,
//! `pagedrs._core.write_kv`), taking numpy views of torch CPU tensors: float32
//! or bfloat16 (as `int16` bits) queries and new K/V, caches of any KV cache
//! format in the numpy dtype `attention_arrays::Format::numpy_dtype` names.

use std::sync::{Arc, Mutex};

use numpy::{
    PyReadonlyArray1, PyReadonlyArray2, PyReadonlyArray4, PyReadwriteArray4, PyUntypedArray,
    PyUntypedArrayMethods,
};
use pyo3::conversion::FromPyObjectOwned;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use rayon::{ThreadPool, ThreadPoolBuilder};

use crate::attention_arrays::{cast, cast_mut, Floats3, FloatsOut3, Format};
use pagedrs_kernels::attention::{
    self, query_tiles, Bf16, CacheShape, DecodeJob, DecodeOptions, Fp8E4m3, Fp8E5m2, KvElem,
    KvInput, Q8,
};

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

fn invalid(msg: String) -> PyErr {
    PyValueError::new_err(msg)
}

/// Elements an entry holds past its values in `format` (int8: the scale).
fn scale_elems(format: Format) -> usize {
    match format {
        Format::Int8 => Q8::SCALE_ELEMS,
        _ => 0,
    }
}

fn shape_of(obj: &Bound<'_, PyAny>, what: &str) -> PyResult<Vec<usize>> {
    let a = obj
        .cast::<PyUntypedArray>()
        .map_err(|_| invalid(format!("{what} must be a numpy array")))?;
    Ok(a.shape().to_vec())
}

/// The cache shape of `[N, Hkv, bs, E]` caches with `E = head_dim + scale`
/// elements per entry, or None when the two caches or `E` disagree.
fn cache_shape(
    key: &[usize],
    value: &[usize],
    head_dim: usize,
    format: Format,
) -> Option<CacheShape> {
    (key.len() == 4 && key == value && key[3] == head_dim + scale_elems(format)).then(|| {
        CacheShape {
            num_blocks: key[0],
            num_kv_heads: key[1],
            block_size: key[2],
            head_dim,
        }
    })
}

/// `obj` as a 4-d array view `A` (`PyReadonlyArray4` or, `writable`,
/// `PyReadwriteArray4`), or a ValueError naming the format's dtype.
fn cache_view<'py, A: FromPyObjectOwned<'py>>(
    obj: &Bound<'py, PyAny>,
    what: &str,
    writable: bool,
    format: Format,
) -> PyResult<A> {
    obj.extract().map_err(|_| {
        invalid(format!(
            "{what} must be a {}4-d {} array for kv_cache_dtype {format:?}",
            if writable { "writable " } else { "" },
            format.numpy_dtype()
        ))
    })
}

/// Run `$body` with `$k`, `$v` bound to the caches' elements as the format's
/// `KvElem` type (`&[E]`, or `&mut [E]` with `mut`).
macro_rules! with_caches {
    ($format:expr, $key:expr, $value:expr, |$k:ident, $v:ident| $body:expr) => {
        with_caches!(@each ro $format, $key, $value, $k, $v, $body)
    };
    (mut $format:expr, $key:expr, $value:expr, |$k:ident, $v:ident| $body:expr) => {
        with_caches!(@each rw $format, $key, $value, $k, $v, $body)
    };
    // One arm per format: its numpy element and `KvElem` types.
    (@each $access:ident $format:expr, $key:expr, $value:expr, $k:ident, $v:ident, $body:expr) => {
        match $format {
            Format::F32 => with_caches!(@$access $format, $key, $value, f32, f32, $k, $v, $body),
            Format::Bf16 => with_caches!(@$access $format, $key, $value, i16, Bf16, $k, $v, $body),
            Format::Int8 => with_caches!(@$access $format, $key, $value, i8, Q8, $k, $v, $body),
            Format::Fp8E4m3 => {
                with_caches!(@$access $format, $key, $value, u8, Fp8E4m3, $k, $v, $body)
            }
            Format::Fp8E5m2 => {
                with_caches!(@$access $format, $key, $value, u8, Fp8E5m2, $k, $v, $body)
            }
        }
    };
    (@ro $format:expr, $key:expr, $value:expr, $np:ty, $elem:ty, $k:ident, $v:ident, $body:expr) => {{
        let kr: PyReadonlyArray4<$np> = cache_view($key, "key_cache", false, $format)?;
        let vr: PyReadonlyArray4<$np> = cache_view($value, "value_cache", false, $format)?;
        let $k: &[$elem] = cast(kr.as_slice()?);
        let $v: &[$elem] = cast(vr.as_slice()?);
        $body
    }};
    (@rw $format:expr, $key:expr, $value:expr, $np:ty, $elem:ty, $k:ident, $v:ident, $body:expr) => {{
        let mut kr: PyReadwriteArray4<$np> = cache_view($key, "key_cache", true, $format)?;
        let mut vr: PyReadwriteArray4<$np> = cache_view($value, "value_cache", true, $format)?;
        let $k: &mut [$elem] = cast_mut(kr.as_slice_mut()?);
        let $v: &mut [$elem] = cast_mut(vr.as_slice_mut()?);
        $body
    }};
}

/// Decode attention of one query token per sequence over its paged context
/// (PagedAttention §4.1), reading K/V in place through the block tables, with
/// HF transformers' eager semantics for the optional features. Each
/// (sequence, KV head) reduces in one fixed order: a sequence's output is the
/// same bits alone or in any batch.
///
/// Args:
///     query: float32, or int16 holding bfloat16 bits, `[S, Hq, D]`,
///         C-contiguous (Hq a multiple of Hkv); with `query_rows`, `[Q, Hq, D]`
///         (Q query tokens, each with its own row of `seq_lens`).
///     key_cache, value_cache: `[N, Hkv, bs, E]`, C-contiguous, in the numpy
///         dtype of `kv_cache_dtype` (float32; bfloat16 as int16 bits; int8
///         with `E = D + 2`, the entry's bfloat16 scale in its last two
///         bytes; fp8 as uint8 bits); `E = D` otherwise.
///     block_tables: int32 `[S, B]`.
///     seq_lens: int32 `[S]` (`[Q]` with `query_rows`), context tokens per
///         query (>= 1, <= B * bs): the query token's position + 1.
///     scale: softmax scale.
///     out: `[S, Hq, D]` of the query's dtype, written in place (bfloat16:
///         rounded to nearest even from the float32 result).
///     num_threads: threads of torch's OpenMP team (the caller among them) that
///         share the (sequence, KV head) work items; a rayon pool of this size
///         when the process has no OpenMP runtime.
///     sliding_window: attend to the last `sliding_window` tokens of each
///         context only (the query at position `p` sees `p - W < k <= p`);
///         blocks before the window are not read. None: the whole context.
///     softcap: logit soft cap `c > 0`: scores `c * tanh(s / c)` after scaling.
///     sinks: float32 `[Hq]`, a sink logit per query head taking part in the
///         softmax with its weight dropped (gpt-oss).
///     kv_cache_dtype: the caches' format: "float32", "bfloat16", "int8",
///         "fp8_e4m3" or "fp8_e5m2".
///     query_rows: int32 `[Q]`, the block-table row each query reads (a
///         prefill chunk: several tokens of one sequence, each attending to
///         the cached tokens up to its own position, exactly as a decode of
///         that token). None: query `i` reads row `i` (one query per sequence).
/// Raises:
///     ValueError: on an unknown format, arrays of the wrong dtype,
///         inconsistent shapes, a query row outside the block tables, a
///         length over the table, a block id outside
///         the cache (in the visible blocks), a window < 1, a soft cap <= 0,
///         or sinks not of length Hq.
#[pyfunction]
#[pyo3(signature = (
    query, key_cache, value_cache, block_tables, seq_lens, scale, out, num_threads = 1,
    *, sliding_window = None, softcap = None, sinks = None, kv_cache_dtype = "float32",
    query_rows = None
))]
#[allow(clippy::too_many_arguments)]
pub fn paged_decode_attention(
    py: Python<'_>,
    query: &Bound<'_, PyAny>,
    key_cache: &Bound<'_, PyAny>,
    value_cache: &Bound<'_, PyAny>,
    block_tables: PyReadonlyArray2<'_, i32>,
    seq_lens: PyReadonlyArray1<'_, i32>,
    scale: f32,
    out: &Bound<'_, PyAny>,
    num_threads: usize,
    sliding_window: Option<usize>,
    softcap: Option<f32>,
    sinks: Option<PyReadonlyArray1<'_, f32>>,
    kv_cache_dtype: &str,
    query_rows: Option<PyReadonlyArray1<'_, i32>>,
) -> PyResult<()> {
    let format = Format::parse(kv_cache_dtype)?;
    let query = Floats3::extract(query, "query")?;
    let rows = query_rows.as_ref().map(|a| a.as_slice()).transpose()?;
    let mut out = FloatsOut3::extract(out, "out")?;
    let (ks, vs) = (
        shape_of(key_cache, "key_cache")?,
        shape_of(value_cache, "value_cache")?,
    );
    let (qs, bts) = (query.shape().to_vec(), block_tables.shape());
    let (s, hq, d) = (qs[0], qs[1], qs[2]);
    let shape = cache_shape(&ks, &vs, d, format);
    let consistent = shape.is_some_and(|sh| {
        out.shape() == qs
            && out.is_bf16() == query.is_bf16()
            && sh.num_kv_heads != 0
            && hq % sh.num_kv_heads == 0
            && seq_lens.len() == s
            && rows.map_or(bts[0] == s, |r| r.len() == s)
    });
    let Some(shape) = shape.filter(|_| consistent) else {
        return Err(invalid(format!(
            "inconsistent shapes: query {qs:?}, caches {ks:?}/{vs:?} ({format:?} entries of \
             D + {} elements), block_tables {bts:?}, seq_lens {:?}, out {:?} (the query's dtype)",
            scale_elems(format),
            seq_lens.shape(),
            out.shape()
        )));
    };
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
        let t = rows.map_or(i as i64, |r| r[i] as i64);
        if t < 0 || t as usize >= bts[0] {
            return Err(invalid(format!(
                "query_rows[{i}]={t} outside the {} block table rows",
                bts[0]
            )));
        }
        let t = t as usize;
        if len < 0 || len as usize > width * shape.block_size {
            return Err(invalid(format!(
                "seq_lens[{i}]={len} outside its block table"
            )));
        }
        let len = len as usize;
        let first = sliding_window.map_or(0, |w| len.saturating_sub(w)) / shape.block_size;
        let used = len.div_ceil(shape.block_size);
        let row = &tables[t * width + first.min(used)..t * width + used];
        if row.iter().any(|&b| b < 0 || b as usize >= shape.num_blocks) {
            return Err(invalid(format!(
                "block_tables[{t}] holds a block outside the cache"
            )));
        }
    }
    let q = query.to_f32()?;
    let sinks = sinks.as_ref().map(|a| a.as_slice()).transpose()?;
    let options = DecodeOptions {
        sliding_window,
        softcap,
        sinks,
    };
    let tiles = rows.map(|r| query_tiles(r, lens));
    let call = Call {
        shape,
        tables,
        width,
        lens,
        rows,
        tiles: tiles.as_deref(),
        scale,
        options,
        bf16_query: query.is_bf16(),
        threads: num_threads.max(1),
    };
    with_caches!(format, key_cache, value_cache, |kc, vc| {
        out.fill(|o| call.run(py, &q, kc, vc, o))
    })
}

/// A validated decode call, apart from its caches.
struct Call<'a> {
    shape: CacheShape,
    tables: &'a [i32],
    width: usize,
    lens: &'a [i32],
    rows: Option<&'a [i32]>,
    /// Tiles of the query rows (`query_tiles`) when `rows` is set.
    tiles: Option<&'a [(u32, u32)]>,
    scale: f32,
    options: DecodeOptions<'a>,
    bf16_query: bool,
    threads: usize,
}

impl Call<'_> {
    /// Run on torch's OpenMP team, or on our own rayon pool without one.
    fn run<E: KvElem>(
        &self,
        py: Python<'_>,
        q: &[f32],
        kc: &[E],
        vc: &[E],
        out: &mut [f32],
    ) -> PyResult<()> {
        let mut job = DecodeJob::new(
            q,
            kc,
            vc,
            self.shape,
            self.tables,
            self.width,
            self.lens,
            self.scale,
        )
        .with_options(self.options);
        if let Some(rows) = self.rows {
            job = job.with_query_rows(rows);
        }
        if let Some(tiles) = self.tiles {
            job = job.with_tiles(tiles);
        }
        if self.bf16_query {
            job = job.with_bf16_query();
        }
        if !py.detach(|| job.run_on_team(self.threads, out)) {
            let pool = pool(self.threads)?;
            py.detach(|| pool.install(|| job.run_on_rayon(out)));
        }
        Ok(())
    }
}

/// Store the step's new keys and values into their cache slots, in place, in
/// the caches' format (int8: each entry's scale computed and stored with it).
///
/// Args:
///     key, value: `[T, Hkv, D]`, C-contiguous, both float32 or both int16
///         holding bfloat16 bits.
///     key_cache, value_cache: `[N, Hkv, bs, E]` in the numpy dtype of
///         `kv_cache_dtype` (as `paged_decode_attention`).
///     slot_mapping: int64 `[T]`, `block * bs + offset`; negative slots are skipped.
///     kv_cache_dtype: the caches' format.
/// Raises:
///     ValueError: on an unknown format, arrays of the wrong dtype,
///         inconsistent shapes or a slot outside the cache.
#[pyfunction]
#[pyo3(signature = (key, value, key_cache, value_cache, slot_mapping, *, kv_cache_dtype = "float32"))]
pub fn write_kv(
    key: &Bound<'_, PyAny>,
    value: &Bound<'_, PyAny>,
    key_cache: &Bound<'_, PyAny>,
    value_cache: &Bound<'_, PyAny>,
    slot_mapping: PyReadonlyArray1<'_, i64>,
    kv_cache_dtype: &str,
) -> PyResult<()> {
    let format = Format::parse(kv_cache_dtype)?;
    let (key, value) = (
        Floats3::extract(key, "key")?,
        Floats3::extract(value, "value")?,
    );
    let (ks, vs) = (
        shape_of(key_cache, "key_cache")?,
        shape_of(value_cache, "value_cache")?,
    );
    let kshape = key.shape().to_vec();
    let shape = cache_shape(&ks, &vs, kshape[2], format).filter(|sh| {
        value.shape() == kshape
            && value.is_bf16() == key.is_bf16()
            && kshape[0] == slot_mapping.len()
            && kshape[1] == sh.num_kv_heads
    });
    let Some(shape) = shape else {
        return Err(invalid(format!(
            "inconsistent shapes: key {kshape:?}, value {:?}, caches {ks:?}/{vs:?} ({format:?} \
             entries of D + {} elements), slot_mapping {:?}",
            value.shape(),
            scale_elems(format),
            slot_mapping.shape()
        )));
    };
    let slots = slot_mapping.as_slice()?;
    let capacity = (shape.num_blocks * shape.block_size) as i64;
    if let Some(bad) = slots.iter().find(|&&s| s >= capacity) {
        return Err(invalid(format!(
            "slot {bad} outside the cache of {capacity} slots"
        )));
    }
    with_caches!(mut format, key_cache, value_cache, |kc, vc| {
        match (&key, &value) {
            (Floats3::F32(k), Floats3::F32(v)) => {
                store::<f32, _>(k.as_slice()?, v.as_slice()?, kc, vc, shape, slots)
            }
            (Floats3::Bf16(k), Floats3::Bf16(v)) => store::<Bf16, _>(
                cast(k.as_slice()?),
                cast(v.as_slice()?),
                kc,
                vc,
                shape,
                slots,
            ),
            _ => unreachable!("key and value dtypes checked above"),
        }
    });
    Ok(())
}

fn store<I: KvInput, E: KvElem>(
    k: &[I],
    v: &[I],
    kc: &mut [E],
    vc: &mut [E],
    shape: CacheShape,
    slots: &[i64],
) {
    attention::write_kv(k, v, kc, vc, shape, slots)
}
