//! The few-rows tile (decode steps): up to `MAX_R` rows by `MAX_C`
//! outputs, each weight sub-block decoded where it is used, and the
//! arithmetic every path shares (`dot`, `hsum8`).

use std::arch::x86_64::*;

use super::super::act::QuantActs;
use super::super::format::QuantWeight;
use super::super::kernel::{TileOut, MAX_C, MAX_R};
use super::decode::{decode, has_min, Dec};

/// The exact int32 sums per lane `j` of the products of values `2j, 2j + 1`
/// of both halves.
#[inline(always)]
pub(super) unsafe fn dot<const VNNI: bool>(
    wlo: __m256i,
    whi: __m256i,
    alo: __m256i,
    ahi: __m256i,
) -> __m256i {
    if VNNI {
        let lo = _mm256_dpwssd_epi32(_mm256_setzero_si256(), wlo, alo);
        _mm256_dpwssd_epi32(lo, whi, ahi)
    } else {
        _mm256_add_epi32(_mm256_madd_epi16(wlo, alo), _mm256_madd_epi16(whi, ahi))
    }
}

/// `kernel::hsum8` of the lanes of `v`.
#[inline(always)]
pub(super) unsafe fn hsum8(v: __m256) -> f32 {
    let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
    let t = _mm_add_ps(s, _mm_movehl_ps(s, s));
    _mm_cvtss_f32(_mm_add_ss(t, _mm_shuffle_ps::<1>(t, t)))
}

/// An `R` x `C` tile of format `T`: rows `r0..r0 + R`, outputs `n0..n0 + C`,
/// each sub-block decoded where it is used.
#[inline(always)]
unsafe fn tile_body<const T: u8, const R: usize, const C: usize, const VNNI: bool>(
    w: &QuantWeight,
    n0: usize,
    acts: &QuantActs,
    r0: usize,
) -> TileOut {
    let nsub = w.k / 32;
    let rb = w.qtype.row_bytes(w.k);
    let mut wrow = [std::ptr::null::<u8>(); C];
    let mut wscale = [0.0f32; C];
    for c in 0..C {
        wrow[c] = w.data.as_ptr().add((n0 + c) * rb);
        wscale[c] = w.row_scale(n0 + c);
    }
    let mut aq = [std::ptr::null::<i16>(); R];
    let mut ad = [std::ptr::null::<f32>(); R];
    let mut ads = [std::ptr::null::<f32>(); R];
    for r in 0..R {
        aq[r] = acts.q.as_ptr().add((r0 + r) * w.k);
        ad[r] = acts.d.as_ptr().add((r0 + r) * nsub);
        ads[r] = acts.dsum.as_ptr().add((r0 + r) * nsub);
    }
    let mut acc = [[_mm256_setzero_ps(); C]; R];
    let mut macc = [[0.0f32; C]; R];
    let zero = Dec {
        lo: _mm256_setzero_si256(),
        hi: _mm256_setzero_si256(),
        scale: 0.0,
        min: 0.0,
    };
    for b in 0..nsub {
        // The next tile's rows (the `C` rows after these), at the same
        // place: weight rows stream from memory once per call, too short
        // for the hardware prefetcher to follow on its own.
        let ahead = C * rb + b * rb / nsub;
        for row in wrow {
            _mm_prefetch::<_MM_HINT_T0>(row.wrapping_add(ahead) as *const i8);
        }
        let mut dec = [zero; C];
        for c in 0..C {
            dec[c] = decode::<T>(wrow[c], b, wscale[c]);
        }
        for r in 0..R {
            let alo = _mm256_loadu_si256(aq[r].add(32 * b) as *const __m256i);
            let ahi = _mm256_loadu_si256(aq[r].add(32 * b + 16) as *const __m256i);
            let d = *ad[r].add(b);
            for c in 0..C {
                let w = &dec[c];
                let isum = _mm256_cvtepi32_ps(dot::<VNNI>(w.lo, w.hi, alo, ahi));
                acc[r][c] = _mm256_fmadd_ps(isum, _mm256_set1_ps(w.scale * d), acc[r][c]);
                if has_min(T) {
                    macc[r][c] = w.min.mul_add(*ads[r].add(b), macc[r][c]);
                }
            }
        }
    }
    let mut out = [[0.0f32; MAX_C]; MAX_R];
    for r in 0..R {
        for c in 0..C {
            out[r][c] = hsum8(acc[r][c]) + macc[r][c];
        }
    }
    out
}

/// `tile_body` for `nr` x `nc` (the shapes as const parameters).
#[inline(always)]
pub(super) unsafe fn tile_any<const T: u8, const VNNI: bool>(
    w: &QuantWeight,
    n0: usize,
    nc: usize,
    acts: &QuantActs,
    r0: usize,
    nr: usize,
) -> TileOut {
    match (nr, nc) {
        (4, 2) => tile_body::<T, 4, 2, VNNI>(w, n0, acts, r0),
        (4, 1) => tile_body::<T, 4, 1, VNNI>(w, n0, acts, r0),
        (3, 2) => tile_body::<T, 3, 2, VNNI>(w, n0, acts, r0),
        (3, 1) => tile_body::<T, 3, 1, VNNI>(w, n0, acts, r0),
        (2, 2) => tile_body::<T, 2, 2, VNNI>(w, n0, acts, r0),
        (2, 1) => tile_body::<T, 2, 1, VNNI>(w, n0, acts, r0),
        (1, 2) => tile_body::<T, 1, 2, VNNI>(w, n0, acts, r0),
        (1, 1) => tile_body::<T, 1, 1, VNNI>(w, n0, acts, r0),
        _ => [[0.0; MAX_C]; MAX_R],
    }
}
