//! The per-head decode kernel: the portable three-pass body over caches of any
//! `KvElem` format, its AVX2 + FMA compilation, and the choice among the
//! variants this CPU runs (the AVX-512 ones live in `avx512` and
//! `avx512_bf16`).
//!
//! Every variant reduces in an order fixed by the query alone (its context's
//! tokens in order, each head dimension in a fixed lane), never by the batch
//! it came in or the thread that ran it: a sequence's output is the same bits
//! alone or in any batch.

#[cfg(target_arch = "x86_64")]
use super::avx512;
#[cfg(target_arch = "x86_64")]
use super::avx512_bf16;
#[cfg(target_arch = "x86_64")]
use super::avx512_int8;
use super::cache::{Caches, HeadQuery};
use super::format::{widen_rows, KvElem};
use super::math::{axpy, dot, softmax, softmax_with_sink};
use super::tile::TileFn;

/// Attention of one `HeadQuery` over its visible cached tokens
/// (`query.start..seq_len`) into `out` (`[group, head_dim]`) in three passes:
/// scores, softmax, weighted values; `scratch` holds the scores and one
/// block's widened entries. Plain loops that LLVM vectorizes. Blocks before the
/// window's first block are skipped, and so are the rows of that block before
/// its first visible token. Each block's entries are widened to floats once
/// (`widen_rows`: in place for `f32`), then every query head of the group
/// reads them from L1.
#[inline(always)]
fn attend_head_body<E: KvElem>(
    query: HeadQuery,
    caches: Caches<E>,
    out: &mut [f32],
    scratch: &mut Vec<f32>,
) {
    let d = caches.shape.head_dim;
    let e = caches.entry;
    let bs = caches.shape.block_size;
    let seq_len = query.seq_len;
    out.fill(0.0);
    if seq_len == 0 {
        return;
    }
    let span = query.span();
    let (scores, rows) = split_scratch::<E>(scratch, out.len() / d * span, bs * d);
    let (first, num_blocks) = (query.start / bs, seq_len.div_ceil(bs));
    // Pass 1: scores[g * span + t - start] = scale * q_g . k_t
    for b in first..num_blocks {
        let skip = query.skip(b, bs);
        let at = b * bs + skip - query.start;
        let keys = widen_rows(&query.block(&caches, caches.key, b)[skip * e..], d, rows);
        for (j, k) in keys.chunks_exact(d).enumerate() {
            for (g, qg) in query.q.chunks_exact(d).enumerate() {
                scores[g * span + at + j] = query.scale * dot(qg, k);
            }
        }
    }
    // Pass 2: soft cap, softmax (with sink) per query head.
    normalize_scores::<false>(&query, scores, span);
    // Pass 3: out_g = sum_t p_gt * v_t
    for b in first..num_blocks {
        let skip = query.skip(b, bs);
        let at = b * bs + skip - query.start;
        let values = widen_rows(&query.block(&caches, caches.value, b)[skip * e..], d, rows);
        for (j, v) in values.chunks_exact(d).enumerate() {
            for (g, og) in out.chunks_exact_mut(d).enumerate() {
                axpy(og, scores[g * span + at + j], v);
            }
        }
    }
}

/// `scratch` as zeroed scores (`[scores]`) and room for a block's widened
/// rows (`[rows]`, 64-byte aligned; none for `f32` entries, which are read
/// in place).
#[inline(always)]
pub(crate) fn split_scratch<E: KvElem>(
    scratch: &mut Vec<f32>,
    scores: usize,
    rows: usize,
) -> (&mut [f32], &mut [f32]) {
    let rows = if E::as_f32(&[]).is_some() { 0 } else { rows };
    scratch.clear();
    scratch.resize(scores + rows + ALIGN_FLOATS, 0.0);
    let (scores_part, rest) = scratch.split_at_mut(scores);
    let pad = rest.as_ptr().align_offset(64).min(ALIGN_FLOATS);
    (scores_part, &mut rest[pad..pad + rows])
}

/// Floats of padding that put the widened rows at a 64-byte boundary: a
/// 64-byte vector stored there and loaded back stays in one cache line.
const ALIGN_FLOATS: usize = 16;

/// Scores `[group, span]` into attention weights, in place: the logit soft
/// cap when set (`c * tanh(s / c)`, after scaling), then a softmax per query
/// head, over the head's sink logit as one more column (its weight dropped)
/// when sinks are set. `FMA`: the exponential in fused multiply-adds
/// (`math::exp_nonpositive_fma`), for kernels compiled with FMA; a kernel's
/// single-query and tile paths take the same one, so a token's bits do not
/// depend on the path.
#[inline(always)]
pub(crate) fn normalize_scores<const FMA: bool>(
    query: &HeadQuery,
    scores: &mut [f32],
    span: usize,
) {
    if query.softcap > 0.0 {
        let c = query.softcap;
        scores.iter_mut().for_each(|s| *s = (*s / c).tanh() * c);
    }
    if query.sinks.is_empty() {
        for row in scores.chunks_exact_mut(span) {
            softmax::<FMA>(row);
        }
    } else {
        for (row, &sink) in scores.chunks_exact_mut(span).zip(query.sinks) {
            softmax_with_sink::<FMA>(row, sink);
        }
    }
}

/// A compiled variant of the per-head kernel for caches of `E` entries.
pub(crate) type AttendFn<E> = fn(HeadQuery, Caches<E>, &mut [f32], &mut Vec<f32>);

fn attend_head_portable<E: KvElem>(
    query: HeadQuery,
    caches: Caches<E>,
    out: &mut [f32],
    scores: &mut Vec<f32>,
) {
    attend_head_body(query, caches, out, scores)
}

/// The same body compiled for AVX2 + FMA (8-wide vectors).
///
/// # Safety
/// The CPU must support AVX2 and FMA (checked by `variants`).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn attend_head_avx2<E: KvElem>(
    query: HeadQuery,
    caches: Caches<E>,
    out: &mut [f32],
    scores: &mut Vec<f32>,
) {
    attend_head_body(query, caches, out, scores)
}

#[cfg(target_arch = "x86_64")]
fn attend_head_avx2_checked<E: KvElem>(
    query: HeadQuery,
    caches: Caches<E>,
    out: &mut [f32],
    scores: &mut Vec<f32>,
) {
    // SAFETY: only listed by `variants` after detecting AVX2 and FMA.
    unsafe { attend_head_avx2(query, caches, out, scores) }
}

/// The kernel variants this CPU runs for caches of `E` entries with
/// `head_dim` values, fastest first, by name. `bf16_query`: the queries are
/// bfloat16 values (widened to `f32`), which lets bfloat16 caches use the
/// AVX-512 BF16 dot products (`avx512_bf16`) on a CPU that has them.
pub(crate) fn variants<E: KvElem>(
    head_dim: usize,
    bf16_query: bool,
) -> Vec<(&'static str, AttendFn<E>)> {
    let mut found: Vec<(&'static str, AttendFn<E>)> = Vec::new();
    #[cfg(target_arch = "x86_64")]
    {
        if let Some(f) = cast(avx512_int8::for_head_dim(head_dim)) {
            found.push(("avx512_vnni", f));
        }
        if bf16_query {
            if let Some(f) = bf16_variant::<E>(head_dim) {
                found.push(("avx512_bf16", f));
            }
        }
        if let Some(f) = avx512::for_head_dim::<E>(head_dim) {
            found.push(("avx512", f));
        }
        if is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") {
            found.push(("avx2", attend_head_avx2_checked::<E>));
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (head_dim, bf16_query);
    found.push(("portable", attend_head_portable::<E>));
    found
}

/// `f` as a `U`: Some exactly when `T` is `U` (a kernel of one format
/// handed out as the kernel of the format the caller asks for).
#[cfg(target_arch = "x86_64")]
fn cast<T: Copy + 'static, U: Copy + 'static>(f: Option<T>) -> Option<U> {
    let any: &dyn std::any::Any = &f?;
    any.downcast_ref::<U>().copied()
}

/// The AVX-512 BF16 variant when `E` is `Bf16` (and the CPU and `head_dim`
/// allow it).
#[cfg(target_arch = "x86_64")]
fn bf16_variant<E: KvElem>(head_dim: usize) -> Option<AttendFn<E>> {
    cast(avx512_bf16::for_head_dim(head_dim))
}

/// The tile version (`tile::TileFn`) of the fastest variant `variants`
/// lists, when it has one (the AVX-512 and AVX-512 BF16 variants): it runs
/// each query of a tile in that variant's exact operations.
pub(crate) fn tile_variant<E: KvElem>(head_dim: usize, bf16_query: bool) -> Option<TileFn<E>> {
    #[cfg(target_arch = "x86_64")]
    {
        let int8: Option<TileFn<E>> = cast(avx512_int8::tile_for_head_dim(head_dim));
        if int8.is_some() {
            return int8;
        }
        if bf16_query {
            let bf16: Option<TileFn<E>> = cast(avx512_bf16::tile_for_head_dim(head_dim));
            if bf16.is_some() {
                return bf16;
            }
        }
        avx512::tile_for_head_dim::<E>(head_dim)
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (head_dim, bf16_query);
        None
    }
}
