//! Pass 3 of the int8 kernel (`avx512_int8`): `out_g = sum_t w_gt * v_t` with
//! `w_gt = p_gt * value_scale_t`, as integer dot products.
//!
//! - Weights (`quantize_weights`, after the softmax): each query head's
//!   weights are scaled by one power of two, `2^(14 - e)` for the largest
//!   weight's exponent `e` (exact), and rounded to int16 `u_t` in `[0,
//!   32767]`: an error of at most 2^-15 of the head's largest weight each.
//! - Values: each block's value rows are sign-extended to int16 once, two
//!   rows interleaved per int32 lane (`interleave_values`), for every query
//!   of the tile; `vpdpwssd` then sums `u_t * v_t` exactly, two rows per
//!   instruction (at most 2 * 32767 * 127 a pair and lane; sums are flushed
//!   every `FLUSH_PAIRS` pairs and at each block's end), and each flush adds
//!   `float(sum) * 2^(e - 14)` to the float output with one multiply-add.
//!
//! A token's weights and sums depend only on its query, so its output has
//! the same bits alone, in any batch, and in a prefill tile.
//!
//! Two interleaved rows put dimensions `8k..8k + 3` (low) and `8k + 4..8k + 7`
//! (high) of each 32 in one 128-bit lane; the outputs are kept in that order
//! while they accumulate and put back in order at the end (`unpermute`).

use std::arch::x86_64::{
    __m256i, __m512i, _mm256_loadu_si256, _mm512_cvt_roundps_epi32, _mm512_cvtepi32_ps,
    _mm512_cvtepi8_epi16, _mm512_dpwssd_epi32, _mm512_fmadd_ps, _mm512_loadu_ps,
    _mm512_loadu_si512, _mm512_mask_cvtepi32_storeu_epi16, _mm512_mask_loadu_ps, _mm512_min_epi32,
    _mm512_mul_ps, _mm512_set1_epi32, _mm512_set1_ps, _mm512_setzero_ps, _mm512_setzero_si512,
    _mm512_shuffle_f32x4, _mm512_storeu_ps, _mm512_storeu_si512, _mm512_unpackhi_epi16,
    _mm512_unpacklo_epi16,
};

use super::avx512_ops::ROUND;
use super::cache::HeadQuery;
use super::format::{KvElem, Q8};
use super::tile::{block_range, longest, Tile};

/// Pairs of rows summed in int32 before a flush to the float output:
/// 128 * 2 * 32767 * 127 < 2^31.
const FLUSH_PAIRS: usize = 128;

/// int16 slots of one query head's quantized weights for `query`: the
/// head's float step `2^(e - 14)` (two slots), then one weight per position
/// from `query.start` rounded down to even (an even count).
#[inline(always)]
pub(crate) fn weight_slots(query: &HeadQuery) -> usize {
    2 + (query.seq_len - (query.start & !1)).next_multiple_of(2)
}

/// One query head's weights `w` (`[span]`, all >= 0) quantized into `out`
/// (`weight_slots` int16): the step, then `u_t = min(round(w_t * 2^(14 -
/// e)), 32767)` from slot `2 + (start & 1)`, zeros before and after. A NaN
/// or infinite weight gives a NaN step (the output is then NaN, as a float
/// sum would make it); weights whose largest is below 2^-113 (or 0) give a
/// zero step and weights (they add nothing).
///
/// # Safety
/// The CPU must support AVX-512F and AVX-512BW (the caller is compiled with
/// them); `out.len() == 2 + (span + (start & 1)).next_multiple_of(2)`.
#[inline(always)]
pub(crate) unsafe fn quantize_weights(w: &[f32], start: usize, out: &mut [i16]) {
    out.fill(0);
    // Non-negative floats order as their bits; NaN, infinity and negative
    // values sort above every finite weight.
    let top = w.iter().fold(0u32, |m, x| m.max(x.to_bits()));
    let e = (top >> 23) as i32 - 127;
    let (step, scale) = if top >= 0x7f80_0000 {
        (f32::NAN, 0.0)
    } else if top == 0 || e < -113 {
        (0.0, 0.0)
    } else {
        (pow2(e - 14), pow2(14 - e))
    };
    let bits = step.to_bits();
    (out[0], out[1]) = (bits as u16 as i16, (bits >> 16) as u16 as i16);
    let dst = out[2 + (start & 1)..].as_mut_ptr();
    let (scale, max) = (_mm512_set1_ps(scale), _mm512_set1_epi32(32767));
    for (k, chunk) in w.chunks(16).enumerate() {
        let mask = ((1u32 << chunk.len()) - 1) as u16;
        // SAFETY: the masks read `chunk` and write its slots of `out`.
        unsafe {
            let x = _mm512_mask_loadu_ps(_mm512_setzero_ps(), mask, chunk.as_ptr());
            let u = _mm512_cvt_roundps_epi32::<ROUND>(_mm512_mul_ps(x, scale));
            // Non-negative and at most 32767: the narrowing store is exact.
            _mm512_mask_cvtepi32_storeu_epi16(dst.add(16 * k), mask, _mm512_min_epi32(u, max));
        }
    }
}

/// `2^k` for `-126 <= k <= 127`.
#[inline(always)]
fn pow2(k: i32) -> f32 {
    f32::from_bits(((127 + k) as u32) << 23)
}

/// Pass 3 for a tile of queries with quantized weights `weights` (query
/// `i`'s `group` rows of `weight_slots` at `woff[i]`), adding into `out`
/// (zeroed by the caller).
///
/// # Safety
/// The CPU must support AVX-512F, AVX-512BW and AVX-512 VNNI (the caller is
/// compiled with them), `caches.shape.head_dim == 32 * D32`, `out` as
/// `TileFn` requires, `weights` 4-byte aligned with every row even-sized,
/// and `rows` holds `bs.div_ceil(2) * d` floats.
#[inline(always)]
pub(crate) unsafe fn value_pass<const D32: usize>(
    t: Tile<Q8>,
    weights: &[i16],
    woff: &[usize],
    rows: &mut [f32],
) {
    let (d, queries, caches, out) = (32 * D32, t.queries, &t.caches, t.out);
    let bs = caches.shape.block_size;
    let last = longest(queries);
    let pairs = rows.as_mut_ptr() as *mut __m512i;
    for b in block_range(queries, bs) {
        let entries = last.block(caches, caches.value, b);
        // SAFETY: `pairs` has room for `bs.div_ceil(2) * d` floats; the
        // features are enabled by the caller.
        unsafe { interleave_values::<D32>(entries, last.block_len(b, bs), pairs) };
        for (i, query) in queries.iter().enumerate() {
            let Some((skip, n, _)) = query.visible(b, bs) else {
                continue;
            };
            let slots = weight_slots(query);
            // SAFETY: query `i`'s output (caller).
            let og = unsafe { out.row(i) };
            for (g, o) in og.chunks_exact_mut(d).enumerate() {
                let u = &weights[woff[i] + g * slots..][..slots];
                // Position `b * bs + r` of block row `r` as a slot of `u`
                // (negative for rows before a window's first position).
                let base = 2 + (b * bs) as isize - (query.start & !1) as isize;
                // SAFETY: forwarded; rows `skip..skip + n` are visible.
                unsafe { accumulate::<D32>(o, u, base, pairs, skip, skip + n) };
            }
        }
    }
    for i in 0..queries.len() {
        // SAFETY: query `i`'s output (caller).
        for o in unsafe { out.row(i) }.chunks_exact_mut(32) {
            // SAFETY: AVX-512F (caller); `o` holds 32 floats.
            unsafe { unpermute(o) };
        }
    }
}

/// The block's first `n` value rows (`[n, d + 2]`) as int16 pairs: pair `p`
/// holds rows `2p` and `2p + 1` (zeros past `n`), `2 * D32` vectors, each
/// int32 lane one dimension of both rows.
///
/// # Safety
/// The CPU must support AVX-512F and AVX-512BW; `pairs` has room for
/// `n.div_ceil(2) * 2 * D32` vectors.
#[inline(always)]
unsafe fn interleave_values<const D32: usize>(entries: &[Q8], n: usize, pairs: *mut __m512i) {
    let d = 32 * D32;
    let e = Q8::entry_size(d);
    let row = |j: usize, c: usize| {
        if j < n {
            // SAFETY: entry `j < n` holds `d` values.
            unsafe {
                _mm512_cvtepi8_epi16(_mm256_loadu_si256(
                    entries.as_ptr().add(j * e + 32 * c) as *const __m256i
                ))
            }
        } else {
            _mm512_setzero_si512()
        }
    };
    for p in 0..n.div_ceil(2) {
        for c in 0..D32 {
            let (a, b) = (row(2 * p, c), row(2 * p + 1, c));
            // SAFETY: vectors `2 * (p * D32 + c)` and the next are in `pairs`.
            unsafe {
                let at = pairs.add(2 * (p * D32 + c));
                _mm512_storeu_si512(at, _mm512_unpacklo_epi16(a, b));
                _mm512_storeu_si512(at.add(1), _mm512_unpackhi_epi16(a, b));
            }
        }
    }
}

/// `o += step * sum_r u_r * v_r` over block rows `lo..hi` (row `r`'s weight
/// in slot `base + r` of `u`, `step` in its first two slots), flushed from
/// int32 every `FLUSH_PAIRS` pairs; `o` in interleaved order.
///
/// # Safety
/// The CPU must support AVX-512F, AVX-512BW and AVX-512 VNNI; `u` is
/// 4-byte aligned, `base` even and slots `base + lo..base + hi` rounded
/// out to pairs lie in `u` (`base` itself may be negative); `pairs` holds the block's interleaved rows
/// (`interleave_values`), and `o` holds `32 * D32` floats.
#[inline(always)]
unsafe fn accumulate<const D32: usize>(
    o: &mut [f32],
    u: &[i16],
    base: isize,
    pairs: *const __m512i,
    lo: usize,
    hi: usize,
) {
    debug_assert_eq!(o.len(), 32 * D32);
    debug_assert!(base % 2 == 0 && base + 2 * (lo / 2) as isize >= 0);
    debug_assert!(base + hi.next_multiple_of(2) as isize <= u.len() as isize);
    let step = f32::from_bits(u[0] as u16 as u32 | ((u[1] as u16 as u32) << 16));
    if step == 0.0 {
        return;
    }
    let slots = u.as_ptr() as *const i32;
    let (first, end) = (lo / 2, hi.div_ceil(2));
    let mut p0 = first;
    while p0 < end {
        let p1 = end.min(p0 + FLUSH_PAIRS);
        let mut acc = [[_mm512_setzero_si512(); 2]; D32];
        for p in p0..p1 {
            // SAFETY: slots `base + 2p` and `base + 2p + 1` of `u`, 4-byte
            // aligned (caller).
            let uw = _mm512_set1_epi32(unsafe { *slots.offset(base / 2 + p as isize) });
            for (c, ac) in acc.iter_mut().enumerate() {
                for (h, a) in ac.iter_mut().enumerate() {
                    // SAFETY: pair `p` of the block (rows below `hi`).
                    let v = unsafe { _mm512_loadu_si512(pairs.add(2 * (p * D32 + c) + h)) };
                    *a = _mm512_dpwssd_epi32(*a, uw, v);
                }
            }
        }
        let sv = _mm512_set1_ps(step);
        for (c, ac) in acc.iter().enumerate() {
            for (h, a) in ac.iter().enumerate() {
                // SAFETY: `o` holds `32 * D32` floats.
                unsafe {
                    let at = o.as_mut_ptr().add(32 * c + 16 * h);
                    _mm512_storeu_ps(
                        at,
                        _mm512_fmadd_ps(_mm512_cvtepi32_ps(*a), sv, _mm512_loadu_ps(at)),
                    );
                }
            }
        }
        p0 = p1;
    }
}

/// 32 outputs from interleaved order (low vector: 128-bit lane `k` holds
/// dimensions `8k..8k + 3`; high: `8k + 4..8k + 7`) into dimension order.
///
/// # Safety
/// The CPU must support AVX-512F; `o` holds 32 floats.
#[inline(always)]
unsafe fn unpermute(o: &mut [f32]) {
    debug_assert_eq!(o.len(), 32);
    // SAFETY: `o` holds 32 floats.
    unsafe {
        let (lo, hi) = (
            _mm512_loadu_ps(o.as_ptr()),
            _mm512_loadu_ps(o.as_ptr().add(16)),
        );
        let a = _mm512_shuffle_f32x4::<0b01_00_01_00>(lo, hi);
        let b = _mm512_shuffle_f32x4::<0b11_10_11_10>(lo, hi);
        _mm512_storeu_ps(o.as_mut_ptr(), _mm512_shuffle_f32x4::<0b11_01_10_00>(a, a));
        _mm512_storeu_ps(
            o.as_mut_ptr().add(16),
            _mm512_shuffle_f32x4::<0b11_01_10_00>(b, b),
        );
    }
}
