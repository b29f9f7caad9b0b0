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
    assert_eq!(out.len(), acts.rows * ld, "output size");
    let mut items: Vec<(usize, usize, ItemFn)> = Vec::new();
    for (p, part) in parts.iter().enumerate() {
        assert_eq!(
            part.weight.k, acts.k,
            "weight and activations of different features"
        );
        assert!(
            part.col + part.weight.n <= ld,
            "part's outputs outside the output"
        );
        let f = kernel::item(variant, part.weight.qtype);
        for chunk in 0..part.weight.n.div_ceil(OUT_CHUNK) {
            items.push((p, chunk, f));
        }
    }
    let row_blocks = acts.rows.div_ceil(ROW_BLOCK);
    let num_items = items.len() * row_blocks;
    if num_items == 0 {
        return;
    }
    let base = SharedOut(out.as_mut_ptr());
    let base = &base;
    let run = |i: usize| {
        let (p, chunk, f) = items[i % items.len()];
        let rows = (i / items.len()) * ROW_BLOCK;
        let part = &parts[p];
        let n_end = ((chunk + 1) * OUT_CHUNK).min(part.weight.n);
        let r_end = (rows + ROW_BLOCK).min(acts.rows);
        let col = part.col;
        let mut write = |r: usize, n: usize, v: &[f32]| {
            assert!(n + v.len() <= n_end);
            // SAFETY: (r, col + n .. col + n + v.len()) is inside `out`
            // (asserted above) and written by this item only.
            unsafe {
                std::ptr::copy_nonoverlapping(v.as_ptr(), base.0.add(r * ld + col + n), v.len())
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
