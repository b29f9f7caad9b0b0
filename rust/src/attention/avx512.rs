//! The per-head decode kernel written with AVX-512 intrinsics, for head
//! dimensions that are a multiple of 16 (`D16` vectors of 16 floats per row),
//! over caches of any `KvElem` format: each 16 stored elements are widened to
//! floats in registers (`KvElem::load16`: bfloat16 by a shift, int8 by a sign
//! extension, fp8 through the half-precision converter), and an entry's scale
//! multiplies its dot product (keys) or its weight (values).
//!
//! Same three passes as the portable body (`kernel::attend_head_body`), over
//! the same visible tokens and with the same score normalization,
//! arranged so the vector registers do the work: in the score pass the scaled
//! query head stays in registers and each key row costs `D16` fused
//! multiply-adds and one horizontal sum; in the value pass each query head's
//! output accumulates in registers over a whole block (its `group` heads
//! re-read the block's value rows from L1). Each block's rows are prefetched
//! one block ahead, since the next block sits at an unrelated address.

use std::arch::x86_64::{
    __m512, _mm512_fmadd_ps, _mm512_loadu_ps, _mm512_mul_ps, _mm512_reduce_add_ps, _mm512_set1_ps,
    _mm512_setzero_ps, _mm512_storeu_ps,
};

use super::cache::{Caches, HeadQuery};
use super::format::KvElem;
use super::kernel::{normalize_scores, AttendFn};

/// Whether this CPU runs the AVX-512 variants (AVX-512F, with AVX2 and F16C
/// for the fp8 widening).
pub(crate) fn detected() -> bool {
    is_x86_feature_detected!("avx512f")
        && is_x86_feature_detected!("avx2")
        && is_x86_feature_detected!("f16c")
}

/// The AVX-512 variant for `head_dim`, when this CPU has it (`detected`) and
/// the dimension is one this module is compiled for (64 or 128).
pub(crate) fn for_head_dim<E: KvElem>(head_dim: usize) -> Option<AttendFn<E>> {
    if !detected() {
        return None;
    }
    match head_dim {
        64 => Some(attend_head_checked::<4, E>),
        128 => Some(attend_head_checked::<8, E>),
        _ => None,
    }
}

fn attend_head_checked<const D16: usize, E: KvElem>(
    query: HeadQuery,
    caches: Caches<E>,
    out: &mut [f32],
    scores: &mut Vec<f32>,
) {
    assert_eq!(
        caches.shape.head_dim,
        D16 * 16,
        "head_dim of the AVX-512 variant"
    );
    // SAFETY: `for_head_dim` hands this out only after `detected()`.
    unsafe { attend_head::<D16, E>(query, caches, out, scores) }
}

/// # Safety
/// The CPU must support AVX-512F, AVX2 and F16C, and
/// `caches.shape.head_dim == 16 * D16`.
#[target_feature(enable = "avx512f,avx2,f16c")]
unsafe fn attend_head<const D16: usize, E: KvElem>(
    query: HeadQuery,
    caches: Caches<E>,
    out: &mut [f32],
    scores: &mut Vec<f32>,
) {
    let d = 16 * D16;
    let e = caches.entry;
    let bs = caches.shape.block_size;
    let seq_len = query.seq_len;
    let group = out.len() / d;
    out.fill(0.0);
    if seq_len == 0 {
        return;
    }
    let span = query.span();
    scores.clear();
    scores.resize(group * span, 0.0);
    let (first, num_blocks) = (query.start / bs, seq_len.div_ceil(bs));
    let scale = _mm512_set1_ps(query.scale);

    // Pass 1: scores[g * span + t - start] = k_scale_t * ((scale * q_g) . k_t)
    for b in first..num_blocks {
        let skip = query.skip(b, bs);
        let (n, at) = (query.block_len(b, bs) - skip, b * bs + skip - query.start);
        let keys = &query.block(&caches, caches.key, b)[skip * e..];
        for (g, qg) in query.q.chunks_exact(d).enumerate() {
            let mut qv = [_mm512_setzero_ps(); D16];
            for (c, v) in qv.iter_mut().enumerate() {
                // SAFETY: `qg` holds `d = 16 * D16` floats.
                *v = _mm512_mul_ps(scale, unsafe { _mm512_loadu_ps(qg.as_ptr().add(16 * c)) });
            }
            let row = &mut scores[g * span + at..][..n];
            for (s, k) in row.iter_mut().zip(keys.chunks_exact(e)) {
                let mut acc = _mm512_setzero_ps();
                for (c, qc) in qv.iter().enumerate() {
                    // SAFETY: `k` holds an entry of `d` values (and its
                    // scale); AVX-512F, AVX2 and F16C are enabled here.
                    acc = _mm512_fmadd_ps(*qc, unsafe { E::load16(k.as_ptr().add(16 * c)) }, acc);
                }
                *s = _mm512_reduce_add_ps(acc) * E::scale(k, d);
            }
        }
    }
    // Pass 2: soft cap, softmax (with sink) per query head.
    normalize_scores(&query, scores, span);
    // SAFETY: the features `value_pass` needs are enabled here; `d = 16 * D16`.
    unsafe { value_pass::<D16, E>(&query, &caches, out, scores, span) };
}

/// Pass 3 of the kernels: `out_g = sum_t (p_gt * v_scale_t) * v_t` for the
/// weights `scores` (`[group, span]`), accumulated in registers per block.
///
/// # Safety
/// The CPU must support AVX-512F, AVX2 and F16C (the caller is compiled
/// with them), and `caches.shape.head_dim == 16 * D16`.
#[inline(always)]
pub(crate) unsafe fn value_pass<const D16: usize, E: KvElem>(
    query: &HeadQuery,
    caches: &Caches<E>,
    out: &mut [f32],
    scores: &[f32],
    span: usize,
) {
    let d = 16 * D16;
    let e = caches.entry;
    let bs = caches.shape.block_size;
    let (first, num_blocks) = (query.start / bs, query.seq_len.div_ceil(bs));
    for b in first..num_blocks {
        let skip = query.skip(b, bs);
        let (n, at) = (query.block_len(b, bs) - skip, b * bs + skip - query.start);
        let values = &query.block(caches, caches.value, b)[skip * e..];
        for (g, og) in out.chunks_exact_mut(d).enumerate() {
            let mut acc: [__m512; D16] = [_mm512_setzero_ps(); D16];
            for (c, a) in acc.iter_mut().enumerate() {
                // SAFETY: `og` holds `d` floats.
                *a = unsafe { _mm512_loadu_ps(og.as_ptr().add(16 * c)) };
            }
            let weights = &scores[g * span + at..][..n];
            for (&w, v) in weights.iter().zip(values.chunks_exact(e)) {
                let w = _mm512_set1_ps(w * E::scale(v, d));
                for (c, a) in acc.iter_mut().enumerate() {
                    // SAFETY: `v` holds an entry of `d` values; the caller
                    // runs with the features `load16` needs.
                    *a = _mm512_fmadd_ps(w, unsafe { E::load16(v.as_ptr().add(16 * c)) }, *a);
                }
            }
            for (c, a) in acc.iter().enumerate() {
                // SAFETY: `og` holds `d` floats.
                unsafe { _mm512_storeu_ps(og.as_mut_ptr().add(16 * c), *a) };
            }
        }
    }
}
