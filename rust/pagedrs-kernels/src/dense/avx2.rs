//! The AVX2 + FMA tile kernel: per output one 8-lane accumulator
//! (`vfmadd231ps`), an `R` x `C` tile of them in registers, so that each
//! weight vector loaded serves `R` rows and each activation vector `C`
//! outputs.

use std::arch::x86_64::*;

use super::tile_math::{tail, TileOut, MAX_C, MAX_R};

/// `tile_math::hsum8` of the lanes of `v`.
#[inline(always)]
unsafe fn hsum8(v: __m256) -> f32 {
    // (l0 + l4, l1 + l5, l2 + l6, l3 + l7)
    let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
    // (s0 + s2, s1 + s3, ..)
    let t = _mm_add_ps(s, _mm_movehl_ps(s, s));
    _mm_cvtss_f32(_mm_add_ss(t, _mm_shuffle_ps::<1>(t, t)))
}

#[inline(always)]
unsafe fn tile_body<const R: usize, const C: usize>(
    x: *const f32,
    w: *const f32,
    k: usize,
) -> TileOut {
    let k8 = k - k % 8;
    let mut acc = [[_mm256_setzero_ps(); C]; R];
    let mut i = 0;
    while i < k8 {
        let mut wv = [_mm256_setzero_ps(); C];
        for (c, v) in wv.iter_mut().enumerate() {
            *v = _mm256_loadu_ps(w.add(c * k + i));
        }
        for (r, row) in acc.iter_mut().enumerate() {
            let xv = _mm256_loadu_ps(x.add(r * k + i));
            for (a, wc) in row.iter_mut().zip(&wv) {
                *a = _mm256_fmadd_ps(xv, *wc, *a);
            }
        }
        i += 8;
    }
    let mut out = [[0.0f32; MAX_C]; MAX_R];
    for r in 0..R {
        for c in 0..C {
            out[r][c] = tail(x.add(r * k), w.add(c * k), k8, k, hsum8(acc[r][c]));
        }
    }
    out
}

#[target_feature(enable = "avx2,fma")]
unsafe fn tile_avx2(x: *const f32, w: *const f32, k: usize, nr: usize, nc: usize) -> TileOut {
    match (nr, nc) {
        (4, 3) => tile_body::<4, 3>(x, w, k),
        (4, 2) => tile_body::<4, 2>(x, w, k),
        (4, 1) => tile_body::<4, 1>(x, w, k),
        (3, 3) => tile_body::<3, 3>(x, w, k),
        (3, 2) => tile_body::<3, 2>(x, w, k),
        (3, 1) => tile_body::<3, 1>(x, w, k),
        (2, 3) => tile_body::<2, 3>(x, w, k),
        (2, 2) => tile_body::<2, 2>(x, w, k),
        (2, 1) => tile_body::<2, 1>(x, w, k),
        (1, 3) => tile_body::<1, 3>(x, w, k),
        (1, 2) => tile_body::<1, 2>(x, w, k),
        (1, 1) => tile_body::<1, 1>(x, w, k),
        _ => [[0.0; MAX_C]; MAX_R],
    }
}

/// `tile_math::TileFn` in AVX2 + FMA. Only for a CPU that runs it (`cpu_features::avx2_fma`).
///
/// # Safety
/// `x` holds `nr * k` and `w` `nc * k` readable floats, and the CPU runs
/// AVX2 + FMA (`kernel::tile` hands this out only then).
pub(crate) unsafe fn tile(x: *const f32, w: *const f32, k: usize, nr: usize, nc: usize) -> TileOut {
    assert!(nr <= MAX_R && nc <= MAX_C);
    tile_avx2(x, w, k, nr, nc)
}
