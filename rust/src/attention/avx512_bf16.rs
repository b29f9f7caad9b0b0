//! The per-head decode kernel for bfloat16 caches and bfloat16 queries on
//! CPUs with AVX-512 BF16: the score pass takes 32 bfloat16 products per
//! instruction (`vdpbf16ps`: pairs of exact bf16 x bf16 products added into
//! float32 lanes) over the cache's key bits in place, the value pass is the
//! AVX-512 one (`avx512_values`: value rows converted in registers, weights
//! stay float32). Chosen only for bfloat16 queries, whose values the
//! instruction takes exactly (`kernel::variants`); the query's softmax scale
//! multiplies each score after the dot product. (int8 caches take the
//! integer kernel, `avx512_int8`.)

use std::arch::x86_64::{
    __m512, __m512bh, __m512i, _mm512_cvtne2ps_pbh, _mm512_dpbf16_ps, _mm512_loadu_ps,
    _mm512_loadu_si512, _mm512_set1_ps, _mm512_setzero_ps,
};

use super::avx512::{self, store_sums};
use super::avx512_values::value_pass_tile;
use super::cache::{Caches, HeadQuery};
use super::format::Bf16;
use super::kernel::{normalize_scores, split_scratch, AttendFn};
use super::tile::{block_range, longest, score_offsets, TileFn, TileOut};

/// The lane partial sums of `q . k_j` for the `n` (<= 16) bfloat16 key
/// rows at `keys` (row stride `32 * D32`), as `avx512::dots16` does for
/// floats: each `acc[j]` takes the row's `D32` products in order, a full
/// chunk of 16 rows with constant trip counts (accumulators in registers,
/// rows interleaved), fewer in a plain loop. Rows past `n` stay zero.
///
/// # Safety
/// The CPU must support AVX-512F and AVX-512 BF16 (the caller is compiled
/// with them), and `keys` must point at `n` rows of `32 * D32` values.
#[inline(always)]
unsafe fn dots16<const D32: usize>(
    qv: &[__m512bh; D32],
    keys: *const u16,
    n: usize,
) -> [__m512; 16] {
    let d = 32 * D32;
    let load = |j: usize, c: usize| {
        // SAFETY: row `j < n` holds `d` values (caller); 32 bfloat16 values
        // are one `__m512bh`.
        unsafe {
            std::mem::transmute::<__m512i, __m512bh>(_mm512_loadu_si512(
                keys.add(j * d + 32 * c) as *const __m512i
            ))
        }
    };
    let mut acc = [_mm512_setzero_ps(); 16];
    if n == 16 {
        for (c, qc) in qv.iter().enumerate() {
            for (j, a) in acc.iter_mut().enumerate() {
                *a = _mm512_dpbf16_ps(*a, *qc, load(j, c));
            }
        }
    } else {
        for (j, a) in acc.iter_mut().enumerate().take(n) {
            for (c, qc) in qv.iter().enumerate() {
                *a = _mm512_dpbf16_ps(*a, *qc, load(j, c));
            }
        }
    }
    acc
}

/// The AVX-512 BF16 variant for bfloat16 caches and `head_dim`, when this
/// CPU has AVX-512 BF16 (and what `avx512` needs) and the dimension is 64 or
/// 128.
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
    // SAFETY: a tile of one query writes `out` only.
    unsafe { attend_tile_checked::<D32>(&[query], caches, TileOut::single(out), scores) }
}

/// The tile variant of `for_head_dim`'s kernel (`tile::TileFn`).
pub(crate) fn tile_for_head_dim(head_dim: usize) -> Option<TileFn<Bf16>> {
    if !(avx512::detected() && is_x86_feature_detected!("avx512bf16")) {
        return None;
    }
    match head_dim {
        64 => Some(attend_tile_checked::<2>),
        128 => Some(attend_tile_checked::<4>),
        _ => None,
    }
}

/// # Safety
/// As `TileFn`.
unsafe fn attend_tile_checked<const D32: usize>(
    queries: &[HeadQuery],
    caches: Caches<Bf16>,
    out: TileOut,
    scores: &mut Vec<f32>,
) {
    assert_eq!(
        caches.shape.head_dim,
        D32 * 32,
        "head_dim of the AVX-512 BF16 variant"
    );
    // SAFETY: handed out only after detecting the features; `out` as the
    // caller guarantees.
    unsafe { attend_tile::<D32>(queries, caches, out, scores) }
}

/// The three passes for a tile of queries (`tile`), as `avx512`'s, the
/// scores by `vdpbf16ps` over each block's key bits in place.
///
/// # Safety
/// The CPU must support AVX-512F, AVX-512 BF16, AVX2 and F16C,
/// `caches.shape.head_dim == 32 * D32`, and `out` as `TileFn` requires.
#[target_feature(enable = "avx512f,avx512bf16,avx2,f16c")]
unsafe fn attend_tile<const D32: usize>(
    queries: &[HeadQuery],
    caches: Caches<Bf16>,
    out: TileOut,
    scratch: &mut Vec<f32>,
) {
    let d = 32 * D32;
    let bs = caches.shape.block_size;
    let group = out.len / d;
    for i in 0..queries.len() {
        // SAFETY: query `i`'s output (caller).
        unsafe { out.row(i) }.fill(0.0);
    }
    let last = longest(queries);
    if last.seq_len == 0 {
        return;
    }
    let off = score_offsets(queries, group);
    let (scores, rows) = split_scratch::<Bf16>(scratch, off[queries.len()], bs * d);

    // Pass 1: scores[g * span + t - start] = scale * (q_g . k_t), the dot
    // products of up to 16 keys summed together (`avx512::hsum16`).
    for b in block_range(queries, bs) {
        let keys = last.block(&caches, caches.key, b).as_ptr() as *const u16;
        for (i, query) in queries.iter().enumerate() {
            let Some((skip, n, at)) = query.visible(b, bs) else {
                continue;
            };
            let (span, scale) = (query.span(), _mm512_set1_ps(query.scale));
            // SAFETY: row `skip` of the block's rows.
            let keys = unsafe { keys.add(skip * d) };
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
                let row = &mut scores[off[i] + g * span + at..][..n];
                for (chunk, out16) in row.chunks_mut(16).enumerate() {
                    let m = out16.len();
                    // SAFETY: the chunk's `m` key rows hold `d` bfloat16 values each.
                    let acc = unsafe { dots16::<D32>(&qv, keys.add(16 * chunk * d), m) };
                    // SAFETY: AVX-512F is enabled here; `out16` holds at most 16 floats.
                    unsafe { store_sums(out16, &acc, Some(scale)) };
                }
            }
        }
    }
    // Pass 2: soft cap, softmax (with sink) per query head.
    for (i, query) in queries.iter().enumerate() {
        normalize_scores::<true>(query, &mut scores[off[i]..off[i + 1]], query.span());
    }
    // SAFETY: AVX-512F, AVX2 and F16C are enabled here; `d = 16 * (2 * D32)`;
    // `out` as the caller guarantees.
    match D32 {
        2 => unsafe { value_pass_tile::<4, Bf16>(queries, &caches, out, scores, &off, rows) },
        _ => unsafe { value_pass_tile::<8, Bf16>(queries, &caches, out, scores, &off, rows) },
    }
}
