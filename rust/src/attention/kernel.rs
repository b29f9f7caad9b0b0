//! The per-head decode kernel: the portable three-pass body, its AVX2 + FMA
//! compilation, and the choice among the variants this CPU runs (the AVX-512
//! one lives in `avx512`).

#[cfg(target_arch = "x86_64")]
use super::avx512;
use super::cache::{Caches, HeadQuery};
use super::math::{axpy, dot, softmax, softmax_with_sink};

/// Attention of one `HeadQuery` over its visible cached tokens
/// (`query.start..seq_len`) into `out` (`[group, head_dim]`) in three passes:
/// scores, softmax, weighted values; `scores` is scratch space. Plain loops
/// that LLVM vectorizes. Blocks before the window's first block are skipped,
/// and so are the rows of that block before its first visible token.
#[inline(always)]
fn attend_head_body(query: HeadQuery, caches: Caches, out: &mut [f32], scores: &mut Vec<f32>) {
    let d = caches.shape.head_dim;
    let bs = caches.shape.block_size;
    let seq_len = query.seq_len;
    out.fill(0.0);
    if seq_len == 0 {
        return;
    }
    let span = query.span();
    scores.clear();
    scores.resize(out.len() / d * span, 0.0);
    let (first, num_blocks) = (query.start / bs, seq_len.div_ceil(bs));
    // Pass 1: scores[g * span + t - start] = scale * q_g . k_t
    for b in first..num_blocks {
        let skip = query.skip(b, bs);
        let at = b * bs + skip - query.start;
        let keys = &query.block(&caches, caches.key, b)[skip * d..];
        for (j, k) in keys.chunks_exact(d).enumerate() {
            for (g, qg) in query.q.chunks_exact(d).enumerate() {
                scores[g * span + at + j] = query.scale * dot(qg, k);
            }
        }
    }
    // Pass 2: soft cap, softmax (with sink) per query head.
    normalize_scores(&query, scores, span);
    // Pass 3: out_g = sum_t p_gt * v_t
    for b in first..num_blocks {
        let skip = query.skip(b, bs);
        let at = b * bs + skip - query.start;
        let values = &query.block(&caches, caches.value, b)[skip * d..];
        for (j, v) in values.chunks_exact(d).enumerate() {
            for (g, og) in out.chunks_exact_mut(d).enumerate() {
                axpy(og, scores[g * span + at + j], v);
            }
        }
    }
}

/// Scores `[group, span]` into attention weights, in place: the logit soft
/// cap when set (`c * tanh(s / c)`, after scaling), then a softmax per query
/// head, over the head's sink logit as one more column (its weight dropped)
/// when sinks are set.
#[inline(always)]
pub(crate) fn normalize_scores(query: &HeadQuery, scores: &mut [f32], span: usize) {
    if query.softcap > 0.0 {
        let c = query.softcap;
        scores.iter_mut().for_each(|s| *s = (*s / c).tanh() * c);
    }
    if query.sinks.is_empty() {
        for row in scores.chunks_exact_mut(span) {
            softmax(row);
        }
    } else {
        for (row, &sink) in scores.chunks_exact_mut(span).zip(query.sinks) {
            softmax_with_sink(row, sink);
        }
    }
}

/// A compiled variant of the per-head kernel.
pub(crate) type AttendFn = fn(HeadQuery, Caches, &mut [f32], &mut Vec<f32>);

fn attend_head_portable(query: HeadQuery, caches: Caches, out: &mut [f32], scores: &mut Vec<f32>) {
    attend_head_body(query, caches, out, scores)
}

/// The same body compiled for AVX2 + FMA (8-wide vectors).
///
/// # Safety
/// The CPU must support AVX2 and FMA (checked by `variants`).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn attend_head_avx2(
    query: HeadQuery,
    caches: Caches,
    out: &mut [f32],
    scores: &mut Vec<f32>,
) {
    attend_head_body(query, caches, out, scores)
}

#[cfg(target_arch = "x86_64")]
fn attend_head_avx2_checked(
    query: HeadQuery,
    caches: Caches,
    out: &mut [f32],
    scores: &mut Vec<f32>,
) {
    // SAFETY: only listed by `variants` after detecting AVX2 and FMA.
    unsafe { attend_head_avx2(query, caches, out, scores) }
}

/// The kernel variants this CPU runs for `head_dim`, fastest first, by name.
pub(crate) fn variants(head_dim: usize) -> Vec<(&'static str, AttendFn)> {
    let mut found: Vec<(&'static str, AttendFn)> = Vec::new();
    #[cfg(target_arch = "x86_64")]
    {
        if let Some(f) = avx512::for_head_dim(head_dim) {
            found.push(("avx512", f));
        }
        if is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") {
            found.push(("avx2", attend_head_avx2_checked));
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = head_dim;
    found.push(("portable", attend_head_portable));
    found
}
