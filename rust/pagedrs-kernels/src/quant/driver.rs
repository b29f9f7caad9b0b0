//! The row-tiled driver: a projection's work split into items of (a block
//! of activation rows, a chunk of one part's outputs), run on torch's
//! OpenMP team (`attention::omp`) or rayon. Up to 4 rows an item runs
//! tiles of its rows by 8 outputs, each weight sub-block decoded where it
//! is used; over more rows (prefill chunks, big batches) the SIMD variants
//! step through K, decoding each step's sub-blocks once per item into a
//! panel that all the item's register tiles read (`avx2::many`). How rows
//! and outputs fall into items, paths and tiles changes no output's bits
//! (module docs of `quant`).

use rayon::prelude::*;
use std::ops::Range;

use super::act::QuantActs;
use super::format::QuantWeight;
use super::item::ItemFn;
use super::kernel;
use crate::attention::omp;
use crate::cpu_features::Variant;

/// One weight part of a projection and the output column of its first row.
#[derive(Clone, Copy, Debug)]
pub struct Part<'a> {
    pub weight: QuantWeight<'a>,
    pub col: usize,
}

/// Outputs per item (the many-rows path's tile width in AVX-512).
const OUT_CHUNK: usize = 64;
/// Activation rows per item.
const ROW_BLOCK: usize = 256;

/// The output buffer, shared by the items (each writes its own cells).
struct SharedOut(*mut f32);
// SAFETY: items write disjoint cells of a buffer borrowed mutably for the
// whole call.
unsafe impl Sync for SharedOut {}

/// `out[r, part.col + n] = sum_k w[n, k] x[r, k]` for every part, where
/// `out` is `[acts.rows, ld]` row-major; in `variant`, on `threads` threads
/// of torch's OpenMP team (rayon's current pool without an OpenMP runtime).
///
/// Panics if a part's features differ from the activations', a part's
/// columns fall outside `ld`, or `out` is not `[acts.rows, ld]`.
pub fn run_projection(
    parts: &[Part],
    acts: &QuantActs,
    out: &mut [f32],
    ld: usize,
    variant: Variant,
    threads: usize,
) {
    run_projections(
        &mut [Projection {
            parts,
            acts,
            rows: 0..acts.rows,
            out,
            ld,
        }],
        variant,
        threads,
    );
}

/// One projection of a `run_projections` call: `out` (`[rows.len(), ld]`,
/// its row `i` activation row `rows.start + i`) `= acts[rows] W^T` over
/// `parts`, as `run_projection`'s arguments.
pub struct Projection<'p, 'w> {
    pub parts: &'p [Part<'w>],
    pub acts: &'p QuantActs,
    pub rows: Range<usize>,
    pub out: &'p mut [f32],
    pub ld: usize,
}

/// `run_projection` of every projection, their items run as one parallel
/// loop (the experts of a mixture-of-experts step: few rows each, many
/// projections). Each output has the bits `run_projection` gives it.
///
/// Panics as `run_projection` does, for any projection.
pub fn run_projections(projections: &mut [Projection], variant: Variant, threads: usize) {
    // (projection, part, output chunk, first row, item kernel).
    let mut items: Vec<(usize, usize, usize, usize, ItemFn)> = Vec::new();
    // (parts, activations, output, ld, rows) of each projection.
    let mut jobs = Vec::with_capacity(projections.len());
    for (j, proj) in projections.iter_mut().enumerate() {
        let acts = proj.acts;
        assert!(proj.rows.end <= acts.rows, "rows outside the activations");
        assert_eq!(proj.out.len(), proj.rows.len() * proj.ld, "output size");
        for part in proj.parts {
            assert_eq!(
                part.weight.k, acts.k,
                "weight and activations of different features"
            );
            assert!(
                part.col + part.weight.n <= proj.ld,
                "part's outputs outside the output"
            );
        }
        for rows in proj.rows.clone().step_by(ROW_BLOCK) {
            for (p, part) in proj.parts.iter().enumerate() {
                let f = kernel::item(variant, part.weight.qtype, part.weight.layout, acts.scheme);
                for chunk in 0..part.weight.n.div_ceil(OUT_CHUNK) {
                    items.push((j, p, chunk, rows, f));
                }
            }
        }
        let base = SharedOut(proj.out.as_mut_ptr());
        jobs.push((proj.parts, acts, base, proj.ld, proj.rows.clone()));
    }
    let num_items = items.len();
    if num_items == 0 {
        return;
    }
    let (jobs, items) = (&jobs, &items);
    let run = |i: usize| {
        let (j, p, chunk, rows, f) = items[i];
        let (parts, acts, base, ld, range) = &jobs[j];
        let (acts, ld, first) = (*acts, *ld, range.start);
        let part = &parts[p];
        let n_end = ((chunk + 1) * OUT_CHUNK).min(part.weight.n);
        let r_end = (rows + ROW_BLOCK).min(range.end);
        let col = part.col;
        let mut write = |r: usize, n: usize, v: &[f32]| {
            assert!(n + v.len() <= n_end);
            // SAFETY: (r, col + n .. col + n + v.len()) is inside this
            // projection's `out` (asserted above) and written by this item
            // only.
            unsafe {
                let at = (r - first) * ld + col + n;
                std::ptr::copy_nonoverlapping(v.as_ptr(), base.0.add(at), v.len())
            };
        };
        f(
            &part.weight,
            chunk * OUT_CHUNK..n_end,
            acts,
            rows..r_end,
            &mut write,
        );
    };
    if !omp::parallel_for(threads, num_items, &run) {
        (0..num_items).into_par_iter().for_each(run);
    }
}
