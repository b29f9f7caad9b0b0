//! The portable kernel: the arithmetic of every variant (module docs of
//! `quant`) in plain Rust, one output at a time, so that its outputs are
//! the SIMD variants' bits.

use super::act::QuantActs;
use super::blocks;
use super::format::QuantWeight;
use std::ops::Range;

/// Output `n` of row `r`: per sub-block and scale group in ascending order
/// the exact int32 sum of the integer products, converted to float32 and
/// added by one fused multiply-add with `scale * d`; the minimum terms in
/// their own sum; the two added at the end.
pub(crate) fn output(w: &QuantWeight, n: usize, acts: &QuantActs, r: usize) -> f32 {
    let has_min = w.qtype.has_min();
    let groups = w.qtype.groups();
    let per = 32 / groups;
    let (aq, ad, ads) = (acts.row_q(r), acts.row_d(r), acts.row_dsum(r));
    let (mut acc, mut macc) = (0.0f32, 0.0f32);
    for b in 0..w.k / 32 {
        let sub = blocks::sub(w, n, b);
        for g in 0..groups {
            let isum: i32 = (per * g..per * (g + 1))
                .map(|i| sub.q[i] as i32 * aq[32 * b + i] as i32)
                .sum();
            acc = (isum as f32).mul_add(sub.scale[g] * ad[b], acc);
        }
        if has_min {
            macc = sub.min.mul_add(ads[b], macc);
        }
    }
    if has_min {
        acc + macc
    } else {
        acc
    }
}

/// Outputs `outputs` by rows `rows` (`item::ItemFn`).
pub(crate) fn item(
    w: &QuantWeight,
    outputs: Range<usize>,
    acts: &QuantActs,
    rows: Range<usize>,
    write: &mut dyn FnMut(usize, usize, &[f32]),
) {
    assert!(outputs.end <= w.n && rows.end <= acts.rows);
    assert_eq!(w.k, acts.k, "weight and activations of different features");
    let mut out = Vec::with_capacity(outputs.len());
    for r in rows {
        out.clear();
        out.extend(outputs.clone().map(|n| output(w, n, acts, r)));
        write(r, outputs.start, &out);
    }
}
