//! The kernel over panel weights (`repack`: Q4_0, Q4_1, Q5_0, Q5_1, Q8_0
//! repacked at load into groups of 16 interleaved outputs) on int8
//! activations, in AVX-512 VNNI, at every row count. The weights are
//! already in the lanes: a panel block's 64-byte vector is one quad of the
//! 16 outputs, so each weight vector is one load (Q4_0, Q4_1: and a mask,
//! or a shift and a mask, for the low or high nibbles; Q5_0, Q5_1: those
//! and the high bits from the bit plane, `packed5`; Q8_0: the stored bytes
//! are `q + 128`) and there is neither a per-call fill nor a horizontal
//! reduction.
//!
//! Register tiles of `MR` rows by `MO` groups of 16 outputs step through K
//! in steps of `KC` sub-blocks (so that a step's panel blocks stay in L1
//! for every row tile). Per row, sub-block and 16 outputs: one `vpdpbusd`
//! per 4 int8 values of the row (the quad broadcast) into int32 sums, and
//! `-offset * sum(x)` of the sub-block (Q4_0: 8, Q5_0: 16, Q8_0: 128), so
//! that they are the exact `sum(q * x)`: where the tile decodes the quads
//! (Q4_0, Q5_0) the sums start at the correction; where it loads them as
//! they are (Q8_0) they start at zero (a zeroing idiom, no copy of a
//! broadcast per sum) and take the correction at the end (on Zen 5, one
//! thread, 1.03-1.07x for Q8_0 at 64 and 256 rows; 0.9x for Q4_0 at 4 rows,
//! hence the split); then one conversion, product `scale * d` and fused
//! multiply-add into the float32 accumulator, and (Q4_1, Q5_1) `fma(min, d
//! * sum(x), macc)` into the minimum terms, in sub-block order: the
//! portable kernel's operations (module docs of `quant`).
//!
//! Over more than `decode_from` rows Q5_0, Q5_1 and Q8_0 steps are decoded
//! (Q8_0: copied) once into the file layout's panel (`panel::Panel`,
//! `fill8`'s layout) and run in its tiles (`wide8`, the minimum terms
//! beside them), the same operations in the same order.
//!
//! On Zen 5 the `vpdpbusd`s share their two pipes with the product and the
//! fused multiply-add (`vcvtdq2ps` and the integer masks, shifts and adds
//! run beside them), so a sub-block's 8 `vpdpbusd` and 2 float operations
//! per row and 16 outputs bound the tile at 8 / 10 of the `vpdpbusd` peak.

use std::arch::x86_64::*;
use std::cell::RefCell;
use std::ops::Range;

use super::super::act::QuantActs;
use super::super::format::QuantWeight;
use super::super::repack::GROUP;
use super::decode::{has_min, unsigned_offset, KC, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0};
use super::packed5::{quad5, PLANE_AT};
use super::panel::{reset, Panel, QUADS};
use super::wide8;

/// Rows by 16-output groups of a tile: 24 int32 sums in registers.
const MR: usize = 6;
const MO: usize = 4;

/// Bytes of a panel block (16 outputs' blocks).
const fn panel_block(t: u8) -> usize {
    GROUP
        * match t {
            Q4_0 => 18,
            Q4_1 => 20,
            Q5_0 => 22,
            Q5_1 => 24,
            _ => 34,
        }
}

/// Offset of a panel block's float16 scales (after the quants and the
/// bit plane).
const fn scales_at(t: u8) -> usize {
    match t {
        Q8_0 => 512,
        Q5_0 | Q5_1 => PLANE_AT + 64,
        _ => 256,
    }
}

/// A thread's float32 accumulators, kept between calls.
#[derive(Default)]
struct Scratch {
    /// `[row][og][16]`.
    acc: Vec<f32>,
    /// `[row][og][16]`: the minimum terms (Q4_1, Q5_1).
    macc: Vec<f32>,
    /// A step's panel over more than `decode_from` rows (`fill_panel`).
    panel: Panel,
}

thread_local! {
    static SCRATCH: RefCell<Scratch> = RefCell::new(Scratch::default());
}

/// Quad `qd` (values `4 qd .. 4 qd + 4`) of the 16 outputs of the panel
/// block at `blk`, as unsigned bytes.
#[inline(always)]
unsafe fn quad<const T: u8>(blk: *const u8, qd: usize) -> __m512i {
    if T == Q8_0 {
        return _mm512_loadu_si512(blk.add(64 * qd) as *const __m512i);
    }
    if T == Q5_0 || T == Q5_1 {
        return quad5(blk, qd);
    }
    let low4 = _mm512_set1_epi8(0x0f);
    if qd < 4 {
        _mm512_and_si512(_mm512_loadu_si512(blk.add(64 * qd) as *const __m512i), low4)
    } else {
        let v = _mm512_loadu_si512(blk.add(64 * (qd - 4)) as *const __m512i);
        _mm512_and_si512(_mm512_srli_epi32::<4>(v), low4)
    }
}

/// The 16 float16 values at `p` as float32 (exact).
#[inline(always)]
unsafe fn f16x16(p: *const u8) -> __m512 {
    _mm512_cvtph_ps(_mm256_loadu_si256(p as *const __m256i))
}

/// The activation rows of a tile, from the step's first sub-block.
struct Rows {
    q: [*const i8; MR],
    d: [*const f32; MR],
    sum16: [*const i32; MR],
    dsum: [*const f32; MR],
}

/// Sub-blocks `0..kn` of a tile of `R` rows by the `O` groups whose panel
/// blocks start at `w` (group stride `gs` bytes), into `acc` and `macc`
/// (`[row of the tile][og][16]`, row stride `stride`); with `ahead`, each
/// group's panel block `KC` sub-blocks on asked for into L2 meanwhile (the
/// first row tile of a step asks for the next step: at one row, 131072 x
/// 2048 Q4_0 streamed from memory at 24 GB/s with it, 20 GB/s without, 22
/// GB/s asking two steps ahead; AMD EPYC Zen 5, one thread).
#[inline(always)]
#[allow(clippy::too_many_arguments, clippy::needless_range_loop)]
unsafe fn tile<const T: u8, const R: usize, const O: usize>(
    w: *const u8,
    gs: usize,
    a: &Rows,
    acc: *mut f32,
    macc: *mut f32,
    stride: usize,
    kn: usize,
    ahead: bool,
) {
    let pb = panel_block(T);
    let off = unsigned_offset(T);
    for j in 0..kn {
        let blk: [*const u8; O] = std::array::from_fn(|o| w.add(o * gs + j * pb));
        if ahead {
            for b in blk {
                let next = b.wrapping_add(KC * pb);
                for line in (0..pb).step_by(64) {
                    _mm_prefetch::<_MM_HINT_T1>(next.wrapping_add(line) as *const i8);
                }
            }
        }
        // Q8_0: sums from zero, the correction added at the end; the quads
        // decoded here: sums from the correction.
        let late = T == Q8_0;
        let mut isum = [[_mm512_setzero_si512(); O]; R];
        if !late && off != 0 {
            for r in 0..R {
                let s = *a.sum16[r].add(2 * j) + *a.sum16[r].add(2 * j + 1);
                isum[r] = [_mm512_set1_epi32(-off * s); O];
            }
        }
        for qd in 0..8 {
            let mut wv = [_mm512_setzero_si512(); O];
            for o in 0..O {
                wv[o] = quad::<T>(blk[o], qd);
            }
            for r in 0..R {
                let x = a.q[r].add(32 * j + 4 * qd);
                let xb = _mm512_set1_epi32((x as *const i32).read_unaligned());
                for o in 0..O {
                    isum[r][o] = _mm512_dpbusd_epi32(isum[r][o], wv[o], xb);
                }
            }
        }
        let mut s = [_mm512_setzero_ps(); O];
        for o in 0..O {
            s[o] = f16x16(blk[o].add(scales_at(T)));
        }
        for r in 0..R {
            let d = _mm512_set1_ps(*a.d[r].add(j));
            let corr = if late && off != 0 {
                _mm512_set1_epi32(-off * (*a.sum16[r].add(2 * j) + *a.sum16[r].add(2 * j + 1)))
            } else {
                _mm512_setzero_si512()
            };
            for o in 0..O {
                let sd = _mm512_mul_ps(s[o], d);
                let at = acc.add(r * stride + 16 * o);
                let exact = if late && off != 0 {
                    _mm512_add_epi32(isum[r][o], corr)
                } else {
                    isum[r][o]
                };
                let v = _mm512_fmadd_ps(_mm512_cvtepi32_ps(exact), sd, _mm512_loadu_ps(at));
                _mm512_storeu_ps(at, v);
            }
        }
        if has_min(T) {
            let mut m = [_mm512_setzero_ps(); O];
            for o in 0..O {
                m[o] = f16x16(blk[o].add(scales_at(T) + 32));
            }
            for r in 0..R {
                let ds = _mm512_set1_ps(*a.dsum[r].add(j));
                for o in 0..O {
                    let at = macc.add(r * stride + 16 * o);
                    _mm512_storeu_ps(at, _mm512_fmadd_ps(m[o], ds, _mm512_loadu_ps(at)));
                }
            }
        }
    }
}

/// More rows than this run a Q5_0, Q5_1 or Q8_0 step in the file layout's
/// many-rows tiles (`fill_panel`, `wide8`) instead of the panel tile: the
/// Q5 formats from 2 row tiles, Q8_0, whose panel tile keeps its lead over
/// the file's rows to 64 rows (1.50x at 16, 1.02-1.10x at 64 on Zen 5) and
/// loses it at 256 (0.90x), from 128 rows.
const fn decode_from(t: u8) -> usize {
    if t == Q8_0 {
        128
    } else {
        2 * MR
    }
}

/// Whether format `T`'s steps run in `wide8`'s tiles over more than
/// `decode_from(T)` rows: the Q5 formats, whose quads take a mask, a shift and
/// a merge of the bit plane's bits each (`packed5`), decoded once per step
/// instead of once per row tile; Q8_0, whose panel blocks are copied (its
/// panel tile ran at 0.94x the file's rows at 256 rows on Zen 5).
const fn decodes(t: u8) -> bool {
    matches!(t, Q5_0 | Q5_1 | Q8_0)
}

/// The step's panel (`panel::Panel`'s `fill8` layout: quads as unsigned
/// bytes, float32 scales and minimums) of sub-blocks `0..kn` of the `nog`
/// groups whose panel blocks start at `w` (group stride `gs` bytes), for
/// `wide8`'s tiles.
#[inline(always)]
unsafe fn fill_panel<const T: u8>(p: &mut Panel, w: *const u8, gs: usize, nog: usize, kn: usize) {
    let pb = panel_block(T);
    if p.q8.len() < nog * KC * QUADS * 2 {
        p.q8.resize(nog * KC * QUADS * 2, _mm256_setzero_si256());
    }
    for v in [&mut p.s, &mut p.m] {
        if v.len() < nog * KC * GROUP {
            v.resize(nog * KC * GROUP, 0.0);
        }
    }
    for og in 0..nog {
        for j in 0..kn {
            let blk = w.add(og * gs + j * pb);
            let at = og * KC + j;
            let q = p.q8.as_mut_ptr().add(at * QUADS * 2) as *mut __m512i;
            for qd in 0..QUADS {
                _mm512_storeu_si512(q.add(qd), quad::<T>(blk, qd));
            }
            _mm512_storeu_ps(
                p.s.as_mut_ptr().add(at * GROUP),
                f16x16(blk.add(scales_at(T))),
            );
            if has_min(T) {
                let m = f16x16(blk.add(scales_at(T) + 32));
                _mm512_storeu_ps(p.m.as_mut_ptr().add(at * GROUP), m);
            }
        }
    }
}

/// The minimum terms of sub-blocks `kb..kb + kn` (`fma(min, d * sum(x),
/// macc)` in sub-block order) of every row of `rows` and every group of
/// the step's panel `p` (`fill_panel`) into `macc` (`[row][og][16]`).
#[inline(always)]
unsafe fn min_terms(
    p: &Panel,
    macc: &mut [f32],
    acts: &QuantActs,
    rows: &Range<usize>,
    nog: usize,
    kb: usize,
    kn: usize,
) {
    let nsub = acts.k / 32;
    for (i, row) in rows.clone().enumerate() {
        let ds = &acts.dsum[row * nsub + kb..row * nsub + kb + kn];
        for og in 0..nog {
            let at = macc.as_mut_ptr().add((i * nog + og) * GROUP);
            let mut v = _mm512_loadu_ps(at);
            for (j, d) in ds.iter().enumerate() {
                let m = _mm512_loadu_ps(p.m.as_ptr().add((og * KC + j) * GROUP));
                v = _mm512_fmadd_ps(m, _mm512_set1_ps(*d), v);
            }
            _mm512_storeu_ps(at, v);
        }
    }
}

/// Checks a panel kernel's call (`item::ItemFn`'s arguments: outputs from a
/// group start, int8 activations of the weight's features, in range) and
/// tells whether it has work.
pub(super) fn panel_call(
    w: &QuantWeight,
    outputs: &Range<usize>,
    acts: &QuantActs,
    rows: &Range<usize>,
) -> bool {
    assert!(outputs.end <= w.n && rows.end <= acts.rows);
    assert_eq!(w.k, acts.k, "weight and activations of different features");
    assert!(
        outputs.start.is_multiple_of(GROUP),
        "panel outputs from {}: not a group start",
        outputs.start
    );
    assert!(!acts.q8.is_empty() || acts.rows == 0, "int8 activations");
    !(rows.is_empty() || outputs.is_empty())
}

/// Outputs `outputs` (starting at a multiple of 16) by rows `rows` of the
/// panel weight `w` on int8 activations (`item::ItemFn`). Only for a CPU
/// with AVX-512F and AVX-512 VNNI.
#[inline(always)]
pub(super) unsafe fn item_packed<const T: u8>(
    w: &QuantWeight,
    outputs: Range<usize>,
    acts: &QuantActs,
    rows: Range<usize>,
    write: &mut dyn FnMut(usize, usize, &[f32]),
) {
    if !panel_call(w, &outputs, acts, &rows) {
        return;
    }
    let (k, nsub) = (w.k, w.k / 32);
    let pb = panel_block(T);
    let gs = nsub * pb;
    let (nr, nc) = (rows.len(), outputs.len());
    let nog = nc.div_ceil(GROUP);
    let stride = nog * GROUP;
    let g0 = outputs.start / GROUP;
    let mut sc = SCRATCH.take();
    reset(&mut sc.acc, nr * stride, 0.0);
    if has_min(T) {
        reset(&mut sc.macc, nr * stride, 0.0);
    }
    let dec = decodes(T) && nr > decode_from(T);
    for kb in (0..nsub).step_by(KC) {
        let kn = KC.min(nsub - kb);
        if dec {
            let wp = w.data.as_ptr().add(g0 * gs + kb * pb);
            fill_panel::<T>(&mut sc.panel, wp, gs, nog, kn);
            wide8::step::<T>(&sc.panel, &mut sc.acc, acts, &rows, nog, kb, kn);
            if has_min(T) {
                min_terms(&sc.panel, &mut sc.macc, acts, &rows, nog, kb, kn);
            }
            continue;
        }
        for r0 in (0..nr).step_by(MR) {
            let tr = MR.min(nr - r0);
            let mut a = Rows {
                q: [std::ptr::null(); MR],
                d: [std::ptr::null(); MR],
                sum16: [std::ptr::null(); MR],
                dsum: [std::ptr::null(); MR],
            };
            for r in 0..tr {
                let row = rows.start + r0 + r;
                a.q[r] = acts.q8.as_ptr().add(row * k + 32 * kb);
                a.d[r] = acts.d.as_ptr().add(row * nsub + kb);
                a.sum16[r] = acts.sum16.as_ptr().add(row * 2 * nsub + 2 * kb);
                a.dsum[r] = acts.dsum.as_ptr().add(row * nsub + kb);
            }
            for og0 in (0..nog).step_by(MO) {
                let to = MO.min(nog - og0);
                let wp = w.data.as_ptr().add((g0 + og0) * gs + kb * pb);
                let at = r0 * stride + og0 * GROUP;
                let ahead = r0 == 0;
                let acc = sc.acc.as_mut_ptr().add(at);
                let macc = if has_min(T) {
                    sc.macc.as_mut_ptr().add(at)
                } else {
                    std::ptr::null_mut()
                };
                macro_rules! go {
                    ($($r:literal),*) => {
                        match (tr, to) {
                            $(($r, 4) => tile::<T, $r, 4>(wp, gs, &a, acc, macc, stride, kn, ahead),
                              ($r, 3) => tile::<T, $r, 3>(wp, gs, &a, acc, macc, stride, kn, ahead),
                              ($r, 2) => tile::<T, $r, 2>(wp, gs, &a, acc, macc, stride, kn, ahead),
                              ($r, _) => tile::<T, $r, 1>(wp, gs, &a, acc, macc, stride, kn, ahead),)*
                            _ => unreachable!("panel tile of {tr} rows"),
                        }
                    };
                }
                go!(6, 5, 4, 3, 2, 1);
            }
        }
    }
    for r in 0..nr {
        let at = r * stride;
        if has_min(T) {
            for (a, m) in sc.acc[at..at + nc].iter_mut().zip(&sc.macc[at..at + nc]) {
                *a += *m;
            }
        }
        write(rows.start + r, outputs.start, &sc.acc[at..at + nc]);
    }
    SCRATCH.set(sc);
}
