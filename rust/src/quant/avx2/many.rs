//! The many-rows path (prefill chunks, big batches): K in steps of `KC`
//! sub-blocks; per step each output's sub-blocks are decoded once into the
//! thread's panel (the next step's weight bytes asked for meanwhile), the
//! products `scale * d` formed for a tile's rows at once, and every `MR` x
//! `MC` register tile accumulates the step into its lanes, kept in the
//! scratch between steps (AVX-512 VNNI: `wide`'s tiles, two rows per
//! vector). Each output gets the operations of the few-rows tile in the
//! same order, so the same bits as at one row.

use std::arch::x86_64::*;
use std::cell::RefCell;
use std::ops::Range;

use super::super::act::QuantActs;
use super::super::format::QuantWeight;
use super::decode::{decode_step, has_min, Dec, KC};
use super::few::{dot, hsum8};
use super::wide;

/// Rows by outputs of a many-rows tile: 8 float32 accumulators in
/// registers, each weight sub-block (2 vectors) loaded once per 4 rows and
/// each activation sub-block once per 2 outputs.
const MR: usize = 4;
const MC: usize = 2;

/// A thread's scratch for the many-rows path, kept between calls.
#[derive(Default)]
struct Scratch {
    /// `[output][j][2]`: sub-block `kb + j`'s int16 values (low, high half).
    q: Vec<__m256i>,
    /// `[output][KC]`: the sub-blocks' scales (0 past the step).
    s: Vec<f32>,
    /// `[output][KC]`: the sub-blocks' minimums.
    mins: Vec<f32>,
    /// `[row of the tile][output][KC]`: `scale * d` of the step.
    sd: Vec<f32>,
    /// `[row][output]`: the lane accumulators across steps.
    acc: Vec<__m256>,
    /// `[row pair][output]`: the same in the wide tile (`wide`).
    acc2: Vec<__m512>,
    /// `[output][row]`: the minimum terms across steps.
    macc: Vec<f32>,
    /// `[j][row]`: the step's `d * sum(q)` per row.
    dsum: Vec<f32>,
}

thread_local! {
    static SCRATCH: RefCell<Scratch> = RefCell::new(Scratch::default());
}

/// Resize `v` to `n` copies of `x`.
fn reset<X: Copy>(v: &mut Vec<X>, n: usize, x: X) {
    v.clear();
    v.resize(n, x);
}

/// The accumulators of an `R` x `C` tile (rows `r0..`, outputs `c0..` of the
/// item) over the step's `kn` sub-blocks from `kb`, in the operations of
/// the few-rows tile (each lane's sequence of fused multiply-adds over the
/// sub-blocks is the same, only split across steps).
#[inline(always)]
#[allow(clippy::too_many_arguments, clippy::needless_range_loop)]
unsafe fn many_tile<const R: usize, const C: usize, const VNNI: bool, const FULL: bool>(
    sc: &mut Scratch,
    nc: usize,
    acts: &QuantActs,
    row0: usize,
    r0: usize,
    c0: usize,
    kb: usize,
    kn: usize,
) {
    let k = acts.k;
    let mut aq = [std::ptr::null::<i16>(); R];
    for r in 0..R {
        aq[r] = acts.q.as_ptr().add((row0 + r0 + r) * k + 32 * kb);
    }
    let accp = sc.acc.as_mut_ptr();
    let mut acc = [[_mm256_setzero_ps(); C]; R];
    for r in 0..R {
        for c in 0..C {
            acc[r][c] = *accp.add((r0 + r) * nc + c0 + c);
        }
    }
    let q = sc.q.as_ptr();
    let sd = sc.sd.as_ptr();
    // A whole step: the loop's bound known, unrolled.
    let kn = if FULL { KC } else { kn };
    for j in 0..kn {
        let mut wlo = [_mm256_setzero_si256(); C];
        let mut whi = [_mm256_setzero_si256(); C];
        for c in 0..C {
            wlo[c] = *q.add(((c0 + c) * KC + j) * 2);
            whi[c] = *q.add(((c0 + c) * KC + j) * 2 + 1);
        }
        for r in 0..R {
            let alo = _mm256_loadu_si256(aq[r].add(32 * j) as *const __m256i);
            let ahi = _mm256_loadu_si256(aq[r].add(32 * j + 16) as *const __m256i);
            for c in 0..C {
                let at = sd.add((r * nc + c0 + c) * KC + j);
                let isum = _mm256_cvtepi32_ps(dot::<VNNI>(wlo[c], whi[c], alo, ahi));
                acc[r][c] = _mm256_fmadd_ps(isum, _mm256_broadcast_ss(&*at), acc[r][c]);
            }
        }
    }
    for r in 0..R {
        for c in 0..C {
            *accp.add((r0 + r) * nc + c0 + c) = acc[r][c];
        }
    }
}

/// `many_tile` for `nr` x `nc` (`nr <= MR`, `nc <= MC`).
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn many_tile_any<const VNNI: bool>(
    sc: &mut Scratch,
    nc_all: usize,
    acts: &QuantActs,
    row0: usize,
    r0: usize,
    nr: usize,
    c0: usize,
    nc: usize,
    kb: usize,
    kn: usize,
) {
    let a = (sc, nc_all, acts, row0, r0, c0, kb, kn);
    macro_rules! go {
        ($r:literal, $c:literal) => {
            if kn == KC {
                many_tile::<$r, $c, VNNI, true>(a.0, a.1, a.2, a.3, a.4, a.5, a.6, a.7)
            } else {
                many_tile::<$r, $c, VNNI, false>(a.0, a.1, a.2, a.3, a.4, a.5, a.6, a.7)
            }
        };
    }
    match (nr, nc) {
        (4, 2) => go!(4, 2),
        (4, 1) => go!(4, 1),
        (3, 2) => go!(3, 2),
        (3, 1) => go!(3, 1),
        (2, 2) => go!(2, 2),
        (2, 1) => go!(2, 1),
        (1, 2) => go!(1, 2),
        (1, 1) => go!(1, 1),
        _ => unreachable!("many-rows tile {nr} x {nc}"),
    }
}

/// Outputs `outputs` by rows `rows` when the rows span more than one tile
/// (module docs). The minimum terms run over 8 rows per vector, each lane
/// its own row's sequence of fused multiply-adds.
#[inline(always)]
pub(super) unsafe fn item_many<const T: u8, const VNNI: bool>(
    w: &QuantWeight,
    outputs: Range<usize>,
    acts: &QuantActs,
    rows: Range<usize>,
    write: &mut dyn FnMut(usize, usize, f32),
) {
    let nsub = w.k / 32;
    let (nr, nc) = (rows.len(), outputs.len());
    let row0 = rows.start;
    let rb = w.qtype.row_bytes(w.k);
    let mut sc = SCRATCH.take();
    reset(&mut sc.q, nc * KC * 2, _mm256_setzero_si256());
    reset(&mut sc.s, nc * KC, 0.0);
    reset(&mut sc.mins, nc * KC, 0.0);
    reset(&mut sc.sd, MR * nc * KC, 0.0);
    if VNNI {
        reset(&mut sc.acc2, nr.div_ceil(2) * nc, _mm512_setzero_ps());
    } else {
        reset(&mut sc.acc, nr * nc, _mm256_setzero_ps());
    }
    reset(&mut sc.macc, nc * nr, 0.0);
    reset(&mut sc.dsum, KC * nr, 0.0);
    let zero = Dec {
        lo: _mm256_setzero_si256(),
        hi: _mm256_setzero_si256(),
        scale: 0.0,
        min: 0.0,
    };
    for kb in (0..nsub).step_by(KC) {
        let kn = KC.min(nsub - kb);
        for c in 0..nc {
            let n = outputs.start + c;
            let mut dec = [zero; KC];
            decode_step::<T>(
                w.data.as_ptr().add(n * rb),
                kb,
                kn,
                nsub,
                w.row_scale(n),
                &mut dec,
            );
            for (j, d) in dec.iter().enumerate() {
                sc.q[(c * KC + j) * 2] = d.lo;
                sc.q[(c * KC + j) * 2 + 1] = d.hi;
                sc.s[c * KC + j] = d.scale;
                sc.mins[c * KC + j] = d.min;
            }
        }
        if has_min(T) {
            for j in 0..kn {
                for r in 0..nr {
                    sc.dsum[j * nr + r] = *acts.dsum.as_ptr().add((row0 + r) * nsub + kb + j);
                }
            }
            // Per output and 8 rows, the step's terms in sub-block order
            // in one register.
            for c in 0..nc {
                let m = sc.macc.as_mut_ptr().add(c * nr);
                let mins = sc.mins.as_ptr().add(c * KC);
                let ds = sc.dsum.as_ptr();
                let mut r = 0;
                while r + 8 <= nr {
                    let mut v = _mm256_loadu_ps(m.add(r));
                    for j in 0..kn {
                        let mv = _mm256_set1_ps(*mins.add(j));
                        v = _mm256_fmadd_ps(mv, _mm256_loadu_ps(ds.add(j * nr + r)), v);
                    }
                    _mm256_storeu_ps(m.add(r), v);
                    r += 8;
                }
                while r < nr {
                    let mut v = *m.add(r);
                    for j in 0..kn {
                        v = (*mins.add(j)).mul_add(*ds.add(j * nr + r), v);
                    }
                    *m.add(r) = v;
                    r += 1;
                }
            }
        }
        if VNNI {
            let (q, s) = (sc.q.as_ptr(), sc.s.as_ptr());
            wide::step(q, s, &mut sc.acc2, acts, row0, nr, nc, kb, kn);
            continue;
        }
        for r0 in (0..nr).step_by(MR) {
            let tr = MR.min(nr - r0);
            // `scale * d` for the tile's rows and every output.
            let mut d = [[0.0f32; KC]; MR];
            for (r, dr) in d.iter_mut().enumerate().take(tr) {
                let src = acts.d.as_ptr().add((row0 + r0 + r) * nsub + kb);
                for (j, v) in dr.iter_mut().enumerate().take(kn) {
                    *v = *src.add(j);
                }
            }
            let sdp = sc.sd.as_mut_ptr();
            for (r, dr) in d.iter().enumerate().take(tr) {
                let dv = _mm256_loadu_ps(dr.as_ptr());
                for c in 0..nc {
                    let sv = _mm256_loadu_ps(sc.s.as_ptr().add(c * KC));
                    _mm256_storeu_ps(sdp.add((r * nc + c) * KC), _mm256_mul_ps(sv, dv));
                }
            }
            for c0 in (0..nc).step_by(MC) {
                let tc = MC.min(nc - c0);
                many_tile_any::<VNNI>(&mut sc, nc, acts, row0, r0, tr, c0, tc, kb, kn);
            }
        }
    }
    for r in 0..nr {
        for c in 0..nc {
            let mut v = if VNNI {
                wide::sum(&sc.acc2, nc, r, c)
            } else {
                hsum8(sc.acc[r * nc + c])
            };
            if has_min(T) {
                v += sc.macc[c * nr + r];
            }
            write(row0 + r, outputs.start + c, v);
        }
    }
    SCRATCH.set(sc);
}
