//! The many-rows path (prefill chunks, big batches): K in steps of `KC`
//! sub-blocks; per step the item's outputs are decoded once into the
//! thread's panel (`panel`: outputs in the lanes) and every register tile
//! of rows by lane groups runs over it: per row, scale group and `L`
//! outputs, one pair product instruction per int16 pair of the row
//! (broadcast), then one conversion, product `scale * d` and fused
//! multiply-add. The float32 accumulators stay in the scratch between steps,
//! so each output gets the operations of the few-rows path in the same
//! order. AVX2 here (tiles of `MR` rows by 8 outputs); AVX-512 in `wide`.

use std::arch::x86_64::*;
use std::cell::RefCell;
use std::ops::Range;

use super::super::act::{ActQuant, QuantActs};
use super::super::format::QuantWeight;
use super::decode::{groups, has_min, KC};
use super::panel::{reset, Panel, PAIRS};
use super::{amx, fill512, wide, wide8};

/// Rows of an AVX2 register tile (8 outputs wide).
const MR: usize = 4;

/// A thread's scratch for the many-rows path, kept between calls.
#[derive(Default)]
struct Scratch {
    panel: Panel,
    /// `[row][og][L]`: the float32 accumulators across steps.
    acc: Vec<f32>,
    /// `[row][og][L]`: the minimum terms across steps.
    macc: Vec<f32>,
    /// The AMX step's zero-padded copies of partial row tiles.
    pads: [Vec<i8>; 2],
}

thread_local! {
    static SCRATCH: RefCell<Scratch> = RefCell::new(Scratch::default());
}

/// The step's sub-blocks `0..kn` of an AVX2 tile of `R` rows (`aq`, `ad`
/// from sub-block `kb`) by the 8 outputs of group `og`, into `acc` (`[row
/// of the tile][8]`, stride `nog * 8`).
#[inline(always)]
#[allow(clippy::too_many_arguments, clippy::needless_range_loop)]
unsafe fn tile<const T: u8, const R: usize>(
    p: &Panel,
    og: usize,
    aq: &[*const i16; MR],
    ad: &[*const f32; MR],
    acc: *mut f32,
    stride: usize,
    kn: usize,
) {
    let g = groups(T);
    let per = PAIRS / g;
    let mut a = [_mm256_setzero_ps(); R];
    for r in 0..R {
        a[r] = _mm256_loadu_ps(acc.add(r * stride));
    }
    for j in 0..kn {
        for gi in 0..g {
            let mut isum = [_mm256_setzero_si256(); R];
            for pr in per * gi..per * (gi + 1) {
                let wv = *p.q.as_ptr().add((og * KC + j) * PAIRS + pr);
                for r in 0..R {
                    let x = _mm256_set1_epi32(
                        (aq[r].add(32 * j + 2 * pr) as *const i32).read_unaligned(),
                    );
                    isum[r] = _mm256_add_epi32(isum[r], _mm256_madd_epi16(wv, x));
                }
            }
            let s = _mm256_loadu_ps(p.s.as_ptr().add(((og * KC + j) * g + gi) * 8));
            for r in 0..R {
                let sd = _mm256_mul_ps(s, _mm256_set1_ps(*ad[r].add(j)));
                a[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[r]), sd, a[r]);
            }
        }
    }
    for r in 0..R {
        _mm256_storeu_ps(acc.add(r * stride), a[r]);
    }
}

/// The minimum terms of sub-blocks `kb..kb + kn` for every row: per 8
/// lanes, in sub-block order.
#[inline(always)]
unsafe fn min_terms<const W: usize>(
    p: &Panel,
    macc: &mut [f32],
    acts: &QuantActs,
    rows: &Range<usize>,
    nog: usize,
    kb: usize,
    kn: usize,
) {
    let (l, nsub) = (8 * W, acts.k / 32);
    for (i, r) in rows.clone().enumerate() {
        let ds = acts.dsum.as_ptr().add(r * nsub + kb);
        for og in 0..nog {
            for h in 0..W {
                let at = macc.as_mut_ptr().add((i * nog + og) * l + 8 * h);
                let mut v = _mm256_loadu_ps(at);
                for j in 0..kn {
                    let m = _mm256_loadu_ps(p.m.as_ptr().add((og * KC + j) * l + 8 * h));
                    v = _mm256_fmadd_ps(m, _mm256_set1_ps(*ds.add(j)), v);
                }
                _mm256_storeu_ps(at, v);
            }
        }
    }
}

/// The bytes of the next item's outputs (the rows after `outputs`, as many),
/// asked for into L2 a share a step: an item's rows are one contiguous run
/// of the weight, which its steps read in strides of a row (a stream per
/// output that the hardware prefetchers do not follow far enough when few
/// rows make a step short).
struct Ahead {
    from: *const u8,
    share: usize,
    len: usize,
}

impl Ahead {
    fn new(w: &QuantWeight, outputs: &Range<usize>, steps: usize) -> Self {
        let rb = w.qtype.row_bytes(w.k);
        let next = outputs.end..(outputs.end + outputs.len()).min(w.n);
        let len = next.len() * rb;
        Ahead {
            // SAFETY: `next.start <= w.n`, one past the end at most.
            from: unsafe { w.data.as_ptr().add(next.start * rb) },
            share: len.div_ceil(steps.max(1)).next_multiple_of(64),
            len,
        }
    }

    /// Ask for step `step`'s share.
    #[inline(always)]
    unsafe fn ask(&self, step: usize) {
        let end = ((step + 1) * self.share).min(self.len);
        for off in (step * self.share..end).step_by(64) {
            _mm_prefetch::<_MM_HINT_T1>(self.from.add(off) as *const i8);
        }
    }
}

/// Rows from which the AMX variant runs its tiles (16 a tile) rather than
/// the AVX-512 VNNI ones; both give the same bits. Formats with one scale
/// group a sub-block only: Q6_K's groups of 16 halve a tile's K, and its
/// AMX step ran at 0.86x the VNNI tiles' rate (Xeon with AMX, 2048 x 2048,
/// 256 rows; `benches/quant_kernel.rs`).
const AMX_ROWS: usize = 8;

/// Outputs `outputs` by rows `rows` when the rows are more than a few-rows
/// tile (module docs); in AMX tiles with `AMX` on int8 activations.
#[inline(always)]
pub(super) unsafe fn item_many<const T: u8, const VNNI: bool, const AMX: bool>(
    w: &QuantWeight,
    outputs: Range<usize>,
    acts: &QuantActs,
    rows: Range<usize>,
    write: &mut dyn FnMut(usize, usize, &[f32]),
) {
    let nsub = w.k / 32;
    let (nr, nc) = (rows.len(), outputs.len());
    let l = if VNNI { 16 } else { 8 };
    let nog = nc.div_ceil(l);
    // int8 activations run `vpdpbusd` (AVX-512 VNNI); in AVX2 the int16
    // tiles run their values with the same integer sums.
    let int8 = VNNI && acts.scheme == ActQuant::Int8;
    let amx = AMX && int8 && nr >= AMX_ROWS && groups(T) == 1;
    // SAFETY: the AMX variant runs only where `cpu_features::amx_int8`.
    let _tiles = amx.then(|| amx::Tiles::configure::<T>());
    let mut sc = SCRATCH.take();
    if VNNI {
        sc.panel.reset::<T, 2>(nog, int8);
    } else {
        sc.panel.reset::<T, 1>(nog, false);
    }
    reset(&mut sc.acc, nr * nog * l, 0.0);
    reset(&mut sc.macc, nr * nog * l, 0.0);
    let ahead = Ahead::new(w, &outputs, nsub.div_ceil(KC));
    for (step, kb) in (0..nsub).step_by(KC).enumerate() {
        let kn = KC.min(nsub - kb);
        ahead.ask(step);
        if int8 && fill512::supported(T) && fill512::fits(w) {
            sc.panel.fill8_512::<T>(w, &outputs, kb, kn, nsub);
        } else if int8 {
            sc.panel.fill8::<T, 2>(w, &outputs, kb, kn, nsub);
        } else if VNNI {
            sc.panel.fill::<T, 2>(w, &outputs, kb, kn, nsub);
        } else {
            sc.panel.fill::<T, 1>(w, &outputs, kb, kn, nsub);
        }
        if has_min(T) {
            let w2 = if VNNI { 2 } else { 1 };
            if w2 == 2 {
                min_terms::<2>(&sc.panel, &mut sc.macc, acts, &rows, nog, kb, kn);
            } else {
                min_terms::<1>(&sc.panel, &mut sc.macc, acts, &rows, nog, kb, kn);
            }
        }
        if amx {
            amx::step::<T>(
                &sc.panel,
                &mut sc.acc,
                acts,
                &rows,
                nog,
                kb,
                kn,
                &mut sc.pads,
            );
            continue;
        }
        if int8 {
            wide8::step::<T>(&sc.panel, &mut sc.acc, acts, &rows, nog, kb, kn);
            continue;
        }
        if VNNI {
            wide::step::<T>(&sc.panel, &mut sc.acc, acts, &rows, nog, kb, kn);
            continue;
        }
        for r0 in (0..nr).step_by(MR) {
            let tr = MR.min(nr - r0);
            let mut aq = [std::ptr::null::<i16>(); MR];
            let mut ad = [std::ptr::null::<f32>(); MR];
            for r in 0..tr {
                let row = rows.start + r0 + r;
                aq[r] = acts.q.as_ptr().add(row * acts.k + 32 * kb);
                ad[r] = acts.d.as_ptr().add(row * nsub + kb);
            }
            for og in 0..nog {
                let acc = sc.acc.as_mut_ptr().add((r0 * nog + og) * 8);
                let stride = nog * 8;
                match tr {
                    4 => tile::<T, 4>(&sc.panel, og, &aq, &ad, acc, stride, kn),
                    3 => tile::<T, 3>(&sc.panel, og, &aq, &ad, acc, stride, kn),
                    2 => tile::<T, 2>(&sc.panel, og, &aq, &ad, acc, stride, kn),
                    _ => tile::<T, 1>(&sc.panel, og, &aq, &ad, acc, stride, kn),
                }
            }
        }
    }
    for r in 0..nr {
        let at = r * nog * l;
        if has_min(T) {
            for (a, m) in sc.acc[at..at + nc].iter_mut().zip(&sc.macc[at..at + nc]) {
                *a += *m;
            }
        }
        write(rows.start + r, outputs.start, &sc.acc[at..at + nc]);
    }
    SCRATCH.set(sc);
}
