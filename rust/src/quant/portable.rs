//! The portable tile kernel: the arithmetic of every variant (module docs of
//! `quant`) in plain Rust, lanes and all, so that its outputs are the SIMD
//! variants' bits.

use super::act::QuantActs;
use super::blocks::{decode, Sub};
use super::format::QuantWeight;
use std::ops::Range;

use super::kernel::{hsum8, TileOut, MAX_C, MAX_R};

/// Rows `r0..r0 + nr` (`nr <= MAX_R`) by outputs `n0..n0 + nc` (`nc <= MAX_C`).
fn tile(w: &QuantWeight, n0: usize, nc: usize, acts: &QuantActs, r0: usize, nr: usize) -> TileOut {
    assert!(nr <= MAX_R && nc <= MAX_C && n0 + nc <= w.n && r0 + nr <= acts.rows);
    assert_eq!(w.k, acts.k, "weight and activations of different features");
    let has_min = w.qtype.has_min();
    let mut acc = [[[0.0f32; 8]; MAX_C]; MAX_R];
    let mut macc = [[0.0f32; MAX_C]; MAX_R];
    let mut subs = [Sub {
        q: [0; 32],
        scale: 0.0,
        min: 0.0,
    }; MAX_C];
    for b in 0..w.k / 32 {
        for (c, sub) in subs.iter_mut().enumerate().take(nc) {
            *sub = decode(w.qtype, w.row(n0 + c), b, w.row_scale(n0 + c));
        }
        for r in 0..nr {
            let a = &acts.row_q(r0 + r)[32 * b..32 * b + 32];
            let d = acts.row_d(r0 + r)[b];
            let dsum = acts.row_dsum(r0 + r)[b];
            for c in 0..nc {
                let sub = &subs[c];
                // Lane j: values 2j, 2j + 1 of each half (`vpmaddwd`'s pairs).
                let (wl, wh) = sub.q.split_at(16);
                let (al, ah) = a.split_at(16);
                let pair = |w: &[i16], x: &[i16], j: usize| {
                    w[2 * j] as i32 * x[2 * j] as i32 + w[2 * j + 1] as i32 * x[2 * j + 1] as i32
                };
                for (j, lane) in acc[r][c].iter_mut().enumerate() {
                    let (lo, hi) = (pair(wl, al, j), pair(wh, ah, j));
                    *lane = ((lo + hi) as f32).mul_add(sub.scale * d, *lane);
                }
                if has_min {
                    macc[r][c] = sub.min.mul_add(dsum, macc[r][c]);
                }
            }
        }
    }
    let mut out = [[0.0f32; MAX_C]; MAX_R];
    for r in 0..nr {
        for c in 0..nc {
            out[r][c] = hsum8(&acc[r][c]) + macc[r][c];
        }
    }
    out
}

/// Outputs `outputs` by rows `rows` in tiles (`kernel::ItemFn`).
pub(crate) fn item(
    w: &QuantWeight,
    outputs: Range<usize>,
    acts: &QuantActs,
    rows: Range<usize>,
    write: &mut dyn FnMut(usize, usize, f32),
) {
    for r0 in rows.clone().step_by(MAX_R) {
        let nr = MAX_R.min(rows.end - r0);
        for n0 in outputs.clone().step_by(MAX_C) {
            let nc = MAX_C.min(outputs.end - n0);
            let out = tile(w, n0, nc, acts, r0, nr);
            for (r, row) in out.iter().enumerate().take(nr) {
                for (c, &v) in row.iter().enumerate().take(nc) {
                    write(r0 + r, n0 + c, v);
                }
            }
        }
    }
}
