//! The many-rows register tile in AVX-512 (the VNNI variant): `MR` rows by
//! up to `MO` groups of 16 outputs (the lanes). Per row, scale group and
//! 16 outputs: one `vpdpwssd` per int16 pair of the row, the pair
//! broadcast from memory, into exact int32 sums; then one conversion,
//! product `scale * d` and fused multiply-add, as in every path (module
//! docs of `quant`).

use std::arch::x86_64::*;
use std::ops::Range;

use super::super::act::QuantActs;
use super::decode::{groups, KC};
use super::panel::{Panel, PAIRS};

/// Rows by 16-output groups of a tile: 24 int32 sums in registers, 4
/// weight vectors and 6 row broadcasts a pair; the float32 accumulators
/// are read and written once per scale group, in L1.
const MR: usize = 6;
const MO: usize = 4;

/// `acc + ` the int32 sums per lane of the products of the int16 pairs of
/// `w` and the pair at `a` broadcast (`vpdpwssd` with an embedded
/// broadcast, which the intrinsics do not promise).
#[inline]
#[target_feature(enable = "avx512f,avx512vnni")]
unsafe fn dpwssd_bcast(acc: __m512i, w: __m512i, a: *const i16) -> __m512i {
    let mut acc = acc;
    // SAFETY: AVX-512 VNNI, which the caller's variant has; `a` points at
    // two readable int16 values.
    std::arch::asm!(
        "vpdpwssd {acc}, {w}, dword ptr [{a}]{{1to16}}",
        acc = inout(zmm_reg) acc,
        w = in(zmm_reg) w,
        a = in(reg) a,
        options(pure, readonly, nostack, preserves_flags)
    );
    acc
}

/// The step's sub-blocks `0..kn` of a tile of `R` rows (`aq`, `ad` from
/// the step's first sub-block) by the `O` output groups from `og0`, into
/// `acc` (`[row of the tile][og][16]`, row stride `stride`).
#[inline(always)]
#[allow(clippy::too_many_arguments, clippy::needless_range_loop)]
unsafe fn tile<const T: u8, const R: usize, const O: usize>(
    p: &Panel,
    og0: usize,
    aq: &[*const i16; MR],
    ad: &[*const f32; MR],
    acc: *mut f32,
    stride: usize,
    kn: usize,
) {
    let g = groups(T);
    let per = PAIRS / g;
    let q = p.q.as_ptr();
    for j in 0..kn {
        for gi in 0..g {
            let mut isum = [[_mm512_setzero_si512(); O]; R];
            for pr in per * gi..per * (gi + 1) {
                let mut wv = [_mm512_setzero_si512(); O];
                for o in 0..O {
                    let at = (((og0 + o) * KC + j) * PAIRS + pr) * 2;
                    wv[o] = _mm512_loadu_si512(q.add(at) as *const __m512i);
                }
                for r in 0..R {
                    let x = aq[r].add(32 * j + 2 * pr);
                    for o in 0..O {
                        isum[r][o] = dpwssd_bcast(isum[r][o], wv[o], x);
                    }
                }
            }
            let mut s = [_mm512_setzero_ps(); O];
            for o in 0..O {
                s[o] = _mm512_loadu_ps(p.s.as_ptr().add((((og0 + o) * KC + j) * g + gi) * 16));
            }
            for r in 0..R {
                let d = _mm512_set1_ps(*ad[r].add(j));
                for o in 0..O {
                    let sd = _mm512_mul_ps(s[o], d);
                    let at = acc.add(r * stride + 16 * o);
                    let v =
                        _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum[r][o]), sd, _mm512_loadu_ps(at));
                    _mm512_storeu_ps(at, v);
                }
            }
        }
    }
}

/// One step (sub-blocks `kb..kb + kn`) of every row of `rows` and every
/// output group of the panel, into `acc` (`[row][og][16]`).
#[inline(always)]
pub(super) unsafe fn step<const T: u8>(
    p: &Panel,
    acc: &mut [f32],
    acts: &QuantActs,
    rows: &Range<usize>,
    nog: usize,
    kb: usize,
    kn: usize,
) {
    let (k, nsub) = (acts.k, acts.k / 32);
    let nr = rows.len();
    let stride = nog * 16;
    for r0 in (0..nr).step_by(MR) {
        let tr = MR.min(nr - r0);
        let mut aq = [std::ptr::null::<i16>(); MR];
        let mut ad = [std::ptr::null::<f32>(); MR];
        for r in 0..tr {
            let row = rows.start + r0 + r;
            aq[r] = acts.q.as_ptr().add(row * k + 32 * kb);
            ad[r] = acts.d.as_ptr().add(row * nsub + kb);
        }
        for og0 in (0..nog).step_by(MO) {
            let to = MO.min(nog - og0);
            let at = acc.as_mut_ptr().add(r0 * stride + og0 * 16);
            macro_rules! go {
                ($($r:literal),*) => {
                    match (tr, to) {
                        $(($r, 4) => tile::<T, $r, 4>(p, og0, &aq, &ad, at, stride, kn),
                          ($r, 3) => tile::<T, $r, 3>(p, og0, &aq, &ad, at, stride, kn),
                          ($r, 2) => tile::<T, $r, 2>(p, og0, &aq, &ad, at, stride, kn),
                          ($r, _) => tile::<T, $r, 1>(p, og0, &aq, &ad, at, stride, kn),)*
                        _ => unreachable!("wide tile of {tr} rows"),
                    }
                };
            }
            go!(6, 5, 4, 3, 2, 1);
        }
    }
}
