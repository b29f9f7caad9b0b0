//! The many-rows register tile on int8 activations (AVX-512 VNNI): `MR`
//! rows by up to `MO` groups of 16 outputs (the lanes). Per row, scale
//! group and 16 outputs: one `vpdpbusd` per 4 int8 values of the row (the
//! quad broadcast from memory) over the panel's unsigned weight bytes
//! (`q + offset`, `panel::fill8`), into int32 sums that start at `-offset *
//! sum(x)` of the group, so that they end at the exact `sum(q * x)`; then
//! one conversion, product `scale * d` and fused multiply-add, as in every
//! path (module docs of `quant`).

use std::arch::x86_64::*;
use std::ops::Range;

use super::super::act::QuantActs;
use super::decode::{groups, unsigned_offset, KC};
use super::panel::{Panel, QUADS};

/// Rows by 16-output groups of a tile: 24 int32 sums in registers, 4
/// weight vectors and 6 row broadcasts a quad; the float32 accumulators
/// are read and written once per scale group, in L1.
const MR: usize = 6;
const MO: usize = 4;

/// `acc + ` the int32 sums per lane of the products of the unsigned bytes
/// of `w` and the 4 signed bytes at `a` broadcast (`vpdpbusd` with an
/// embedded broadcast, which the intrinsics do not promise).
#[inline]
#[target_feature(enable = "avx512f,avx512vnni")]
unsafe fn dpbusd_bcast(acc: __m512i, w: __m512i, a: *const i8) -> __m512i {
    let mut acc = acc;
    // SAFETY: AVX-512 VNNI, which the caller's variant has; `a` points at
    // four readable bytes.
    std::arch::asm!(
        "vpdpbusd {acc}, {w}, dword ptr [{a}]{{1to16}}",
        acc = inout(zmm_reg) acc,
        w = in(zmm_reg) w,
        a = in(reg) a,
        options(pure, readonly, nostack, preserves_flags)
    );
    acc
}

/// The step's sub-blocks `0..kn` of a tile of `R` rows (`aq`, `ad`, `asum`
/// from the step's first sub-block) by the `O` output groups from `og0`,
/// into `acc` (`[row of the tile][og][16]`, row stride `stride`).
#[inline(always)]
#[allow(clippy::too_many_arguments, clippy::needless_range_loop)]
unsafe fn tile<const T: u8, const R: usize, const O: usize>(
    p: &Panel,
    og0: usize,
    aq: &[*const i8; MR],
    ad: &[*const f32; MR],
    asum: &[*const i32; MR],
    acc: *mut f32,
    stride: usize,
    kn: usize,
) {
    let g = groups(T);
    let per = QUADS / g;
    let off = unsigned_offset(T);
    let q = p.q8.as_ptr();
    for j in 0..kn {
        for gi in 0..g {
            let mut isum = [[_mm512_setzero_si512(); O]; R];
            if off != 0 {
                for r in 0..R {
                    let s = if g == 2 {
                        *asum[r].add(2 * j + gi)
                    } else {
                        *asum[r].add(2 * j) + *asum[r].add(2 * j + 1)
                    };
                    isum[r] = [_mm512_set1_epi32(-off * s); O];
                }
            }
            for qd in per * gi..per * (gi + 1) {
                let mut wv = [_mm512_setzero_si512(); O];
                for o in 0..O {
                    let at = (((og0 + o) * KC + j) * QUADS + qd) * 2;
                    wv[o] = _mm512_loadu_si512(q.add(at) as *const __m512i);
                }
                for r in 0..R {
                    let x = aq[r].add(32 * j + 4 * qd);
                    if O == 1 {
                        isum[r][0] = dpbusd_bcast(isum[r][0], wv[0], x);
                        continue;
                    }
                    let xb = _mm512_set1_epi32((x as *const i32).read_unaligned());
                    for o in 0..O {
                        isum[r][o] = _mm512_dpbusd_epi32(isum[r][o], wv[o], xb);
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
/// output group of the panel (`fill8`), into `acc` (`[row][og][16]`).
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
        let mut aq = [std::ptr::null::<i8>(); MR];
        let mut ad = [std::ptr::null::<f32>(); MR];
        let mut asum = [std::ptr::null::<i32>(); MR];
        for r in 0..tr {
            let row = rows.start + r0 + r;
            aq[r] = acts.q8.as_ptr().add(row * k + 32 * kb);
            ad[r] = acts.d.as_ptr().add(row * nsub + kb);
            asum[r] = acts.sum16.as_ptr().add(row * 2 * nsub + 2 * kb);
        }
        for og0 in (0..nog).step_by(MO) {
            let to = MO.min(nog - og0);
            let at = acc.as_mut_ptr().add(r0 * stride + og0 * 16);
            macro_rules! go {
                ($($r:literal),*) => {
                    match (tr, to) {
                        $(($r, 4) => tile::<T, $r, 4>(p, og0, &aq, &ad, &asum, at, stride, kn),
                          ($r, 3) => tile::<T, $r, 3>(p, og0, &aq, &ad, &asum, at, stride, kn),
                          ($r, 2) => tile::<T, $r, 2>(p, og0, &aq, &ad, &asum, at, stride, kn),
                          ($r, _) => tile::<T, $r, 1>(p, og0, &aq, &ad, &asum, at, stride, kn),)*
                        _ => unreachable!("wide tile of {tr} rows"),
                    }
                };
            }
            go!(6, 5, 4, 3, 2, 1);
        }
    }
}
