//! The per-head decode kernel written with AVX-512 intrinsics, for head
//! dimensions that are a multiple of 16 (`D16` vectors of 16 floats per row),
//! over caches of any `KvElem` format: each block's entries are widened to
//! floats once, 16 at a time (`KvElem::load16`: bfloat16 by a shift, int8 by
//! a sign extension and its entry's scale, fp8 through the half-precision
//! converter), into a scratch block that every query head of the group then
//! reads from L1; float32 entries are read in place.
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
use super::kernel::{normalize_scores, split_scratch, AttendFn};

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
    scratch: &mut Vec<f32>,
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
    let (scores, rows) = split_scratch::<E>(scratch, group * span, bs * d);
    let (first, num_blocks) = (query.start / bs, seq_len.div_ceil(bs));
    let scale = _mm512_set1_ps(query.scale);

    // Pass 1: scores[g * span + t - start] = (scale * q_g) . k_t
    for b in first..num_blocks {
        let skip = query.skip(b, bs);
        let (n, at) = (query.block_len(b, bs) - skip, b * bs + skip - query.start);
        // SAFETY: the features `widen_rows16` needs are enabled here.
        let keys = unsafe {
            widen_rows16::<D16, E>(&query.block(&caches, caches.key, b)[skip * e..], rows)
        };
        for (g, qg) in query.q.chunks_exact(d).enumerate() {
            let mut qv = [_mm512_setzero_ps(); D16];
            for (c, v) in qv.iter_mut().enumerate() {
                // SAFETY: `qg` holds `d = 16 * D16` floats.
                *v = _mm512_mul_ps(scale, unsafe { _mm512_loadu_ps(qg.as_ptr().add(16 * c)) });
            }
            let row = &mut scores[g * span + at..][..n];
            for (s, k) in row.iter_mut().zip(keys.chunks_exact(d)) {
                let mut acc = _mm512_setzero_ps();
                for (c, qc) in qv.iter().enumerate() {
                    // SAFETY: `k` holds `d` floats.
                    acc = _mm512_fmadd_ps(
                        *qc,
                        unsafe { _mm512_loadu_ps(k.as_ptr().add(16 * c)) },
                        acc,
                    );
                }
                *s = _mm512_reduce_add_ps(acc);
            }
        }
    }
    // Pass 2: soft cap, softmax (with sink) per query head.
    normalize_scores(&query, scores, span);
    // SAFETY: the features `value_pass` needs are enabled here; `d = 16 * D16`.
    unsafe { value_pass::<D16, E>(&query, &caches, out, scores, span, rows) };
}

/// The values of a block's `entries` as floats (`[rows, 16 * D16]`, each
/// times its entry's scale): `entries` itself for `f32`, else widened 16
/// at a time into `scratch` (`KvElem::load16`).
///
/// # Safety
/// The CPU must support AVX-512F, AVX2 and F16C (the caller is compiled
/// with them).
#[inline(always)]
unsafe fn widen_rows16<'a, const D16: usize, E: KvElem>(
    entries: &'a [E],
    scratch: &'a mut [f32],
) -> &'a [f32] {
    if let Some(f) = E::as_f32(entries) {
        return f;
    }
    let d = 16 * D16;
    let e = E::entry_size(d);
    let rows = entries.len() / e;
    for (entry, out) in entries.chunks_exact(e).zip(scratch.chunks_exact_mut(d)) {
        let scale = _mm512_set1_ps(E::scale(entry, d));
        for c in 0..D16 {
            // SAFETY: `entry` holds `d` values, `out` `d` floats; the caller
            // runs with the features `load16` needs.
            unsafe {
                let x = E::load16(entry.as_ptr().add(16 * c));
                let x = if E::SCALE_ELEMS == 0 {
                    x
                } else {
                    _mm512_mul_ps(x, scale)
                };
                _mm512_storeu_ps(out.as_mut_ptr().add(16 * c), x);
            }
        }
    }
    &scratch[..rows * d]
}

/// Pass 3 of the kernels: `out_g = sum_t p_gt * v_t` for the weights
/// `scores` (`[group, span]`), accumulated in registers per block; each
/// block's value entries widened once into `rows` (`widen_rows16`).
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
    rows: &mut [f32],
) {
    let d = 16 * D16;
    let e = caches.entry;
    let bs = caches.shape.block_size;
    let (first, num_blocks) = (query.start / bs, query.seq_len.div_ceil(bs));
    for b in first..num_blocks {
        let skip = query.skip(b, bs);
        let (n, at) = (query.block_len(b, bs) - skip, b * bs + skip - query.start);
        // SAFETY: the caller runs with the features `widen_rows16` needs.
        let values = unsafe {
            widen_rows16::<D16, E>(&query.block(caches, caches.value, b)[skip * e..], rows)
        };
        for (g, og) in out.chunks_exact_mut(d).enumerate() {
            let mut acc: [__m512; D16] = [_mm512_setzero_ps(); D16];
            for (c, a) in acc.iter_mut().enumerate() {
                // SAFETY: `og` holds `d` floats.
                *a = unsafe { _mm512_loadu_ps(og.as_ptr().add(16 * c)) };
            }
            let weights = &scores[g * span + at..][..n];
            for (&w, v) in weights.iter().zip(values.chunks_exact(d)) {
                let w = _mm512_set1_ps(w);
                for (c, a) in acc.iter_mut().enumerate() {
                    // SAFETY: `v` holds `d` floats.
                    *a = _mm512_fmadd_ps(w, unsafe { _mm512_loadu_ps(v.as_ptr().add(16 * c)) }, *a);
                }
            }
            for (c, a) in acc.iter().enumerate() {
                // SAFETY: `og` holds `d` floats.
                unsafe { _mm512_storeu_ps(og.as_mut_ptr().add(16 * c), *a) };
            }
        }
    }
}
