//! The element-wise steps of a decoder layer around its projections, in one
//! pass over their rows with the bits of the torch ops they stand for:
//! `rotate_half`, rotary embedding by table lookup over a half table (the
//! native models' `RotaryTable.rotate`), `[x1 c - x2 s, x2 c + x1 s]` with
//! each product and the sum rounded to `f32` on its own, as torch's separate
//! `mul`, `sub_` and `add_` round them (Rust never fuses them into a
//! multiply-add).
//!
//! Rows split over torch's OpenMP team when more than one thread is asked for
//! (`attention::omp`); each row's values do not depend on the split.

use std::ops::Range;

use crate::attention::omp;

/// Rows of one work item on the team.
const ROWS_PER_ITEM: usize = 16;

/// An output pointer shared by the team; each work item writes its own rows.
struct SharedOut(*mut f32);

// SAFETY: work items write disjoint rows of the output (see `for_rows`).
unsafe impl Sync for SharedOut {}

/// `work(rows)` over `0..rows` in items of `ROWS_PER_ITEM` rows on
/// `num_threads` threads of the OpenMP team, or all at once on this thread
/// (one thread, few rows, or no OpenMP runtime).
fn for_rows(num_threads: usize, rows: usize, work: &(dyn Fn(Range<usize>) + Sync)) {
    if num_threads <= 1 || rows <= ROWS_PER_ITEM {
        work(0..rows);
        return;
    }
    let items = rows.div_ceil(ROWS_PER_ITEM);
    let item = |i: usize| work(i * ROWS_PER_ITEM..((i + 1) * ROWS_PER_ITEM).min(rows));
    if !omp::parallel_for(num_threads, items, &item) {
        work(0..rows);
    }
}

/// The shape of a `rotate_half` call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RopeShape {
    /// Rows (tokens).
    pub rows: usize,
    /// Floats from one row of `x` to the next (at least `heads * dim`).
    pub x_stride: usize,
    /// Heads of a row.
    pub heads: usize,
    /// Floats of a head.
    pub dim: usize,
    /// Rotated floats of a head (even, at most `dim`); the rest pass unchanged.
    pub rot: usize,
}

/// One row's heads rotated: head `h`'s `[x1, x2, rest]` (`rot / 2`, `rot / 2`,
/// `dim - rot` floats) into `[x1 c - x2 s, x2 c + x1 s, rest]`.
#[inline(always)]
fn rotate_row(x: &[f32], c: &[f32], s: &[f32], dim: usize, rot: usize, out: &mut [f32]) {
    let h = rot / 2;
    for (xh, oh) in x.chunks_exact(dim).zip(out.chunks_exact_mut(dim)) {
        let (x1, rest) = xh.split_at(h);
        let (x2, pass) = rest.split_at(h);
        let (o1, rest) = oh.split_at_mut(h);
        let (o2, o_pass) = rest.split_at_mut(h);
        for i in 0..h {
            let (a, b) = (x1[i], x2[i]);
            o1[i] = a * c[i] - b * s[i];
            o2[i] = b * c[i] + a * s[i];
        }
        o_pass.copy_from_slice(pass);
    }
}

/// Rotary embedding of every head of `shape.rows` rows by a half table.
///
/// Layouts: row `t` of `x` is `x[t * x_stride..][..heads * dim]` (heads one
/// after the other); `cos`, `sin` are `[rows, rot / 2]` (each row's position
/// looked up); `out` is `[rows, heads, dim]`.
///
/// Panics if `rot` is odd or over `dim`, or a slice is shorter than its
/// layout.
pub fn rotate_half(
    x: &[f32],
    cos: &[f32],
    sin: &[f32],
    shape: RopeShape,
    out: &mut [f32],
    num_threads: usize,
) {
    let RopeShape {
        rows,
        x_stride,
        heads,
        dim,
        rot,
    } = shape;
    let (width, h) = (heads * dim, rot / 2);
    assert!(
        rot.is_multiple_of(2) && rot <= dim,
        "rotated width {rot} of head dim {dim}"
    );
    assert!(x_stride >= width, "row stride {x_stride} under {width}");
    assert!(
        rows == 0 || x.len() >= (rows - 1) * x_stride + width,
        "x holds {} floats",
        x.len()
    );
    assert!(
        cos.len() == rows * h && sin.len() == rows * h,
        "cos/sin rows"
    );
    assert_eq!(out.len(), rows * width, "out size");
    let base = SharedOut(out.as_mut_ptr());
    let base = &base;
    for_rows(num_threads, rows, &|range: Range<usize>| {
        for t in range {
            // SAFETY: row `t` of `out` lies in it (asserted above), and each
            // row belongs to one work item.
            let o = unsafe { std::slice::from_raw_parts_mut(base.0.add(t * width), width) };
            let xr = &x[t * x_stride..t * x_stride + width];
            rotate_row(
                xr,
                &cos[t * h..(t + 1) * h],
                &sin[t * h..(t + 1) * h],
                dim,
                rot,
                o,
            );
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    fn values(n: usize, seed: u32) -> Vec<f32> {
        let mut s = seed.wrapping_mul(2654435761).wrapping_add(1);
        (0..n)
            .map(|_| {
                s ^= s << 13;
                s ^= s >> 17;
                s ^= s << 5;
                (s as f32 / u32::MAX as f32) * 8.0 - 4.0
            })
            .collect()
    }

    #[test]
    fn rotate_half_matches_the_formula_with_a_row_stride_and_a_passed_rest() {
        let shape = RopeShape {
            rows: 37,
            x_stride: 3 * 10 + 7,
            heads: 3,
            dim: 10,
            rot: 6,
        };
        let x = values(shape.rows * shape.x_stride, 1);
        let (cos, sin) = (values(shape.rows * 3, 2), values(shape.rows * 3, 3));
        for threads in [1, 3] {
            let mut out = vec![f32::NAN; shape.rows * 30];
            rotate_half(&x, &cos, &sin, shape, &mut out, threads);
            for t in 0..shape.rows {
                for hd in 0..3 {
                    let xh = &x[t * shape.x_stride + hd * 10..][..10];
                    let oh = &out[t * 30 + hd * 10..][..10];
                    for i in 0..3 {
                        let (c, s) = (cos[t * 3 + i], sin[t * 3 + i]);
                        let (a, b) = (xh[i], xh[3 + i]);
                        let first = (a * c) - (b * s);
                        let second = (b * c) + (a * s);
                        assert_eq!(oh[i].to_bits(), first.to_bits());
                        assert_eq!(oh[3 + i].to_bits(), second.to_bits());
                    }
                    assert_eq!(&oh[6..], &xh[6..]);
                }
            }
        }
    }
}
