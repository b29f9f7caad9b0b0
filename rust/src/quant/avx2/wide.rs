//! The many-rows tile in AVX-512 (the VNNI variant): two activation rows
//! per 512-bit vector, so that each `vpdpwssd`, conversion and fused
//! multiply-add serves both (row `2p` in the low 8 lanes, `2p + 1` in the
//! high 8). Each lane holds what it holds in `many`'s 256-bit tile (the
//! same exact int32 sums, the same conversion, the same float32 product
//! `scale * d`, here formed in the tile, and fused multiply-add, in the
//! same order over the sub-blocks), so the same bits.

use std::arch::x86_64::*;

use super::super::act::QuantActs;
use super::decode::KC;
use super::few::hsum8;

/// Row pairs by outputs of a wide tile: 8 accumulators in registers.
const MP: usize = 4;
const MC: usize = 2;
/// Rows of a wide row tile.
pub(super) const ROWS: usize = 2 * MP;

/// `acc + ` the int32 sums per lane `j` of the products of values `2j, 2j +
/// 1` of `w` and `a` (`vpdpwssd` itself: the compiler would otherwise split
/// it into `vpmaddwd` and `vpaddd`).
#[inline]
#[target_feature(enable = "avx512f,avx512vnni")]
unsafe fn dpwssd(acc: __m512i, w: __m512i, a: __m512i) -> __m512i {
    let mut acc = acc;
    // SAFETY: AVX-512 VNNI, which the caller's variant has; registers only.
    std::arch::asm!(
        "vpdpwssd {acc}, {w}, {a}",
        acc = inout(zmm_reg) acc,
        w = in(zmm_reg) w,
        a = in(zmm_reg) a,
        options(pure, nomem, nostack, preserves_flags)
    );
    acc
}

/// The step's accumulators of a tile of `P` row pairs by `C` outputs: row
/// `2p + h` reads `aq[2p + h]` (sub-block `kb` of its int16 values) and
/// `ad[2p + h]` (its scales from sub-block `kb`), the outputs `c0..c0 + C`
/// their panel sub-blocks from `q` (`[output][KC][2]`) and scales from `s`
/// (`[output][KC]`), the accumulators `acc[(pair0 + p) * nc + c0 + c]`.
#[inline(always)]
#[allow(clippy::too_many_arguments, clippy::needless_range_loop)]
unsafe fn tile<const P: usize, const C: usize, const FULL: bool>(
    q: *const __m256i,
    s: *const f32,
    acc: *mut __m512,
    aq: &[*const i16; ROWS],
    ad: &[*const f32; ROWS],
    nc: usize,
    pair0: usize,
    c0: usize,
    kn: usize,
) {
    let mut a = [[_mm512_setzero_ps(); C]; P];
    for p in 0..P {
        for c in 0..C {
            a[p][c] = *acc.add((pair0 + p) * nc + c0 + c);
        }
    }
    let kn = if FULL { KC } else { kn };
    for j in 0..kn {
        let mut wlo = [_mm512_setzero_si512(); C];
        let mut whi = [_mm512_setzero_si512(); C];
        let mut sc = [_mm512_setzero_ps(); C];
        for c in 0..C {
            wlo[c] = _mm512_broadcast_i64x4(*q.add(((c0 + c) * KC + j) * 2));
            whi[c] = _mm512_broadcast_i64x4(*q.add(((c0 + c) * KC + j) * 2 + 1));
            sc[c] = _mm512_set1_ps(*s.add((c0 + c) * KC + j));
        }
        for p in 0..P {
            let (r0, r1) = (aq[2 * p], aq[2 * p + 1]);
            let pair = |off: usize| {
                let lo = _mm256_loadu_si256(r0.add(32 * j + off) as *const __m256i);
                let hi = _mm256_loadu_si256(r1.add(32 * j + off) as *const __m256i);
                _mm512_inserti64x4::<1>(_mm512_castsi256_si512(lo), hi)
            };
            let (alo, ahi) = (pair(0), pair(16));
            // The two rows' scales `d`, each in its 8 lanes.
            let d0 = _mm256_broadcast_ss(&*ad[2 * p].add(j));
            let d1 = _mm256_broadcast_ss(&*ad[2 * p + 1].add(j));
            let d = _mm512_castpd_ps(_mm512_insertf64x4::<1>(
                _mm512_castpd256_pd512(_mm256_castps_pd(d0)),
                _mm256_castps_pd(d1),
            ));
            for c in 0..C {
                let isum = _mm512_madd_epi16(wlo[c], alo);
                let isum = _mm512_cvtepi32_ps(dpwssd(isum, whi[c], ahi));
                a[p][c] = _mm512_fmadd_ps(isum, _mm512_mul_ps(sc[c], d), a[p][c]);
            }
        }
    }
    for p in 0..P {
        for c in 0..C {
            *acc.add((pair0 + p) * nc + c0 + c) = a[p][c];
        }
    }
}

/// `tile` for `np` pairs by `nc` outputs (`np <= MP`, `nc <= MC`).
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn tile_any(
    q: *const __m256i,
    s: *const f32,
    acc: *mut __m512,
    aq: &[*const i16; ROWS],
    ad: &[*const f32; ROWS],
    nc_all: usize,
    pair0: usize,
    np: usize,
    c0: usize,
    nc: usize,
    kn: usize,
) {
    macro_rules! go {
        ($p:literal, $c:literal) => {
            if kn == KC {
                tile::<$p, $c, true>(q, s, acc, aq, ad, nc_all, pair0, c0, kn)
            } else {
                tile::<$p, $c, false>(q, s, acc, aq, ad, nc_all, pair0, c0, kn)
            }
        };
    }
    match (np, nc) {
        (4, 2) => go!(4, 2),
        (4, 1) => go!(4, 1),
        (3, 2) => go!(3, 2),
        (3, 1) => go!(3, 1),
        (2, 2) => go!(2, 2),
        (2, 1) => go!(2, 1),
        (1, 2) => go!(1, 2),
        (1, 1) => go!(1, 1),
        _ => unreachable!("wide tile {np} x {nc}"),
    }
}

/// One step (sub-blocks `kb..kb + kn`) of every row and output: the panel
/// `q` and scales `s` (`[output][KC]`) of `nc` outputs against rows `row0..
/// row0 + nr`, into `acc` (`[pair][output]`, rows `2p, 2p + 1` of the item).
#[inline(always)]
#[allow(clippy::too_many_arguments)]
pub(super) unsafe fn step(
    q: *const __m256i,
    s: *const f32,
    acc: &mut [__m512],
    acts: &QuantActs,
    row0: usize,
    nr: usize,
    nc: usize,
    kb: usize,
    kn: usize,
) {
    let (k, nsub) = (acts.k, acts.k / 32);
    for r0 in (0..nr).step_by(ROWS) {
        let tr = ROWS.min(nr - r0);
        // A missing row of the last pair: the tile's last row again, its
        // lanes never read.
        let mut aq = [std::ptr::null::<i16>(); ROWS];
        let mut ad = [std::ptr::null::<f32>(); ROWS];
        for r in 0..ROWS {
            let row = row0 + r0 + r.min(tr - 1);
            aq[r] = acts.q.as_ptr().add(row * k + 32 * kb);
            ad[r] = acts.d.as_ptr().add(row * nsub + kb);
        }
        let np = tr.div_ceil(2);
        for c0 in (0..nc).step_by(MC) {
            let tc = MC.min(nc - c0);
            tile_any(q, s, acc.as_mut_ptr(), &aq, &ad, nc, r0 / 2, np, c0, tc, kn);
        }
    }
}

/// Row `r`'s sum of output `c` from the accumulators (`kernel::hsum8` of
/// its 8 lanes).
#[inline(always)]
pub(super) unsafe fn sum(acc: &[__m512], nc: usize, r: usize, c: usize) -> f32 {
    let v = acc[(r / 2) * nc + c];
    let half = if r.is_multiple_of(2) {
        _mm512_castps512_ps256(v)
    } else {
        _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(v)))
    };
    hsum8(half)
}
