//! The per-head decode kernel for bfloat16 caches and bfloat16 queries on
//! CPUs with AVX-512 BF16: the score pass takes 32 bfloat16 products per
//! instruction (`vdpbf16ps`: pairs of exact bf16 x bf16 products added into
//! float32 lanes) over the cached bits in place, the value pass is the
//! AVX-512 one (`avx512::value_pass`: each block widened once, weights stay
//! float32). Chosen only for bfloat16 queries, whose values the
//! instruction takes exactly (`kernel::variants`); the query's softmax scale
//! multiplies each score after the dot product.

use std::arch::x86_64::{
    __m512bh, __m512i, _mm512_cvtne2ps_pbh, _mm512_dpbf16_ps, _mm512_loadu_ps, _mm512_loadu_si512,
    _mm512_set1_ps, _mm512_setzero_ps,
};

use super::avx512::{self, store_sums, value_pass};
use super::cache::{Caches, HeadQuery};
use super::format::Bf16;
use super::kernel::{normalize_scores, split_scratch, AttendFn};

/// The AVX-512 BF16 variant for `head_dim`, when this CPU has AVX-512 BF16
/// (and what `avx512` needs) and the dimension is 64 or 128.
pub(crate) fn for_head_dim(head_dim: usize) -> Option<AttendFn<Bf16>> {
    if !(avx512::detected() && is_x86_feature_detected!("avx512bf16")) {
        return None;
    }
    match head_dim {
        64 => Some(attend_head_checked::<2>),
        128 => Some(attend_head_checked::<4>),
        _ => None,
    }
}

fn attend_head_checked<const D32: usize>(
    query: HeadQuery,
    caches: Caches<Bf16>,
    out: &mut [f32],
    scores: &mut Vec<f32>,
) {
    assert_eq!(
        caches.shape.head_dim,
        D32 * 32,
        "head_dim of the AVX-512 BF16 variant"
    );
    // SAFETY: `for_head_dim` hands this out only after detecting the features.
    unsafe { attend_head::<D32>(query, caches, out, scores) }
}

/// # Safety
/// The CPU must support AVX-512F, AVX-512 BF16, AVX2 and F16C, and
/// `caches.shape.head_dim == 32 * D32`.
#[target_feature(enable = "avx512f,avx512bf16,avx2,f16c")]
unsafe fn attend_head<const D32: usize>(
    query: HeadQuery,
    caches: Caches<Bf16>,
    out: &mut [f32],
    scratch: &mut Vec<f32>,
) {
    let d = 32 * D32;
    let bs = caches.shape.block_size;
    let seq_len = query.seq_len;
    let group = out.len() / d;
    out.fill(0.0);
    if seq_len == 0 {
        return;
    }
    let span = query.span();
    let (scores, rows) = split_scratch::<Bf16>(scratch, group * span, bs * d);
    let (first, num_blocks) = (query.start / bs, seq_len.div_ceil(bs));
    let scale = _mm512_set1_ps(query.scale);

    // Pass 1: scores[g * span + t - start] = scale * (q_g . k_t), the dot
    // products of up to 16 keys summed together (`avx512::hsum16`).
    for b in first..num_blocks {
        let skip = query.skip(b, bs);
        let (n, at) = (query.block_len(b, bs) - skip, b * bs + skip - query.start);
        let keys = &query.block(&caches, caches.key, b)[skip * d..];
        for (g, qg) in query.q.chunks_exact(d).enumerate() {
            let mut qv: [__m512bh; D32] =
                [_mm512_cvtne2ps_pbh(_mm512_setzero_ps(), _mm512_setzero_ps()); D32];
            for (c, v) in qv.iter_mut().enumerate() {
                // SAFETY: `qg` holds `d = 32 * D32` floats; they are bfloat16
                // values, so the conversion is exact.
                *v = unsafe {
                    let lo = _mm512_loadu_ps(qg.as_ptr().add(32 * c));
                    let hi = _mm512_loadu_ps(qg.as_ptr().add(32 * c + 16));
                    _mm512_cvtne2ps_pbh(hi, lo)
                };
            }
            let row = &mut scores[g * span + at..][..n];
            for (out16, keys16) in row.chunks_mut(16).zip(keys[..n * d].chunks(16 * d)) {
                let mut acc = [_mm512_setzero_ps(); 16];
                for (a, k) in acc.iter_mut().zip(keys16.chunks_exact(d)) {
                    for (c, qc) in qv.iter().enumerate() {
                        // SAFETY: `k` holds `d` bfloat16 elements; a vector of
                        // 32 of them is a `__m512bh`.
                        let kc: __m512bh = unsafe {
                            let raw = _mm512_loadu_si512(k.as_ptr().add(32 * c) as *const __m512i);
                            std::mem::transmute::<__m512i, __m512bh>(raw)
                        };
                        *a = _mm512_dpbf16_ps(*a, *qc, kc);
                    }
                }
                // SAFETY: AVX-512F is enabled here; `out16` holds at most 16 floats.
                unsafe { store_sums(out16, &acc, Some(scale)) };
            }
        }
    }
    // Pass 2: soft cap, softmax (with sink) per query head.
    normalize_scores(&query, scores, span);
    // SAFETY: AVX-512F, AVX2 and F16C are enabled here; `d = 16 * (2 * D32)`.
    match D32 {
        2 => unsafe { value_pass::<4, Bf16>(&query, &caches, out, scores, span, rows) },
        _ => unsafe { value_pass::<8, Bf16>(&query, &caches, out, scores, span, rows) },
    }
}
