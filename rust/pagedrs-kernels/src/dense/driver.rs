//! The driver: a projection's work split into items of (a block of
//! activation rows, a chunk of outputs), run on torch's OpenMP team
//! (`attention::omp`) or rayon. Inside an item, for each tile of `MAX_C`
//! weight rows, every tile of `MAX_R` rows of the block: the weight rows are
//! read from memory once and stay in L1 (L2 at large `K`) while the block's
//! rows pass over them, so a decode or verify step of up to a block of rows
//! streams each weight once. How rows and outputs fall into items and tiles
//! changes no output's bits (module docs of `dense`).

use rayon::prelude::*;

use super::kernel;
use super::tile_math::{MAX_C, MAX_R};
use crate::attention::omp;
use crate::cpu_features::Variant;

/// One projection `out = x W^T (+ bias)`, row-major slices.
#[derive(Clone, Copy, Debug)]
pub struct DenseArgs<'a> {
    /// Activations `[m, k]`.
    pub x: &'a [f32],
    /// Weight `[n, k]` (`nn.Linear`'s layout).
    pub weight: &'a [f32],
    /// Bias `[n]`, or None.
    pub bias: Option<&'a [f32]>,
    /// Rows.
    pub m: usize,
    /// Outputs.
    pub n: usize,
    /// Input features.
    pub k: usize,
}

/// Bytes of activation rows an item keeps near the core (L2).
const ROW_BLOCK_BYTES: usize = 256 << 10;
/// Most activation rows per item (a multiple of `MAX_R`).
const MAX_ROW_BLOCK: usize = 64;
/// Most outputs per item (a multiple of `MAX_C`).
const MAX_OUT_CHUNK: usize = 96;

/// Rows per item: as many as fit `ROW_BLOCK_BYTES` at `k` features, a
/// multiple of `MAX_R` in `MAX_R..=MAX_ROW_BLOCK`.
fn row_block(k: usize) -> usize {
    let rows = ROW_BLOCK_BYTES / (4 * k.max(1));
    (rows / MAX_R * MAX_R).clamp(MAX_R, MAX_ROW_BLOCK)
}

/// Outputs per item: about four items per thread, a multiple of `MAX_C` in
/// `MAX_C..=MAX_OUT_CHUNK`.
fn out_chunk(n: usize, threads: usize) -> usize {
    let per = n.div_ceil(4 * threads.max(1));
    (per.div_ceil(MAX_C) * MAX_C).clamp(MAX_C, MAX_OUT_CHUNK)
}

/// Bytes of weights, activations and outputs worth one more thread.
const BYTES_PER_THREAD: usize = 8 << 20;
/// Multiply-adds worth one more thread.
const MACS_PER_THREAD: usize = 4 << 20;

/// Threads for a projection: at most `threads`, one per `BYTES_PER_THREAD`
/// of memory traffic or `MACS_PER_THREAD` of arithmetic (at least one). A
/// small call (a decode step's projection of a small model) runs on the
/// caller alone: waking a sleeping OpenMP worker costs more than it saves
/// (milliseconds on a loaded machine, where torch's own one-row `F.linear`
/// stays on one thread too).
pub(crate) fn threads_for(m: usize, n: usize, k: usize, threads: usize) -> usize {
    let bytes = 4 * (n * k + m * k + m * n);
    let units = (bytes / BYTES_PER_THREAD).max(m * n * k / MACS_PER_THREAD);
    units.clamp(1, threads.max(1))
}

/// The output buffer, shared by the items (each writes its own cells).
struct SharedOut(*mut f32);
// SAFETY: items write disjoint cells of a buffer borrowed mutably for the
// whole call.
unsafe impl Sync for SharedOut {}

/// `out[r, j] = sum_k x[r, k] weight[j, k] (+ bias[j])`, `out` `[m, n]`
/// row-major; in `variant`, on up to `threads` threads of torch's OpenMP
/// team (rayon's current pool without an OpenMP runtime; `threads_for`).
///
/// Panics if a slice's length does not match `m`, `n`, `k`, or this CPU
/// does not run `variant`.
pub fn run_dense(args: &DenseArgs, out: &mut [f32], variant: Variant, threads: usize) {
    let DenseArgs {
        x,
        weight,
        bias,
        m,
        n,
        k,
    } = *args;
    assert_eq!(x.len(), m * k, "activations are not [m, k]");
    assert_eq!(weight.len(), n * k, "weight is not [n, k]");
    assert_eq!(out.len(), m * n, "output is not [m, n]");
    if let Some(b) = bias {
        assert_eq!(b.len(), n, "bias is not [n]");
    }
    let tile = kernel::tile(variant);
    if m == 0 || n == 0 {
        return;
    }
    let threads = threads_for(m, n, k, threads);
    let rows_per = row_block(k);
    let outs_per = out_chunk(n, threads);
    let out_items = n.div_ceil(outs_per);
    let num_items = out_items * m.div_ceil(rows_per);
    let base = SharedOut(out.as_mut_ptr());
    let base = &base;
    let run = |i: usize| {
        let (n_start, r_start) = ((i % out_items) * outs_per, (i / out_items) * rows_per);
        let (n_end, r_end) = ((n_start + outs_per).min(n), (r_start + rows_per).min(m));
        for n0 in (n_start..n_end).step_by(MAX_C) {
            let nc = MAX_C.min(n_end - n0);
            for r0 in (r_start..r_end).step_by(MAX_R) {
                let nr = MAX_R.min(r_end - r0);
                // SAFETY: rows r0..r0 + nr of x and n0..n0 + nc of the
                // weight lie inside their slices (lengths asserted above),
                // and `tile` is a variant this CPU runs.
                let sums = unsafe {
                    tile(
                        x.as_ptr().add(r0 * k),
                        weight.as_ptr().add(n0 * k),
                        k,
                        nr,
                        nc,
                    )
                };
                for (r, row) in sums.iter().enumerate().take(nr) {
                    for (c, &s) in row.iter().enumerate().take(nc) {
                        let v = match bias {
                            Some(b) => s + b[n0 + c],
                            None => s,
                        };
                        // SAFETY: (r0 + r, n0 + c) is inside `out` ([m, n],
                        // asserted) and written by this item only.
                        unsafe { *base.0.add((r0 + r) * n + n0 + c) = v };
                    }
                }
            }
        }
    };
    if threads == 1 {
        (0..num_items).for_each(run);
    } else if !omp::parallel_for(threads, num_items, &run) {
        (0..num_items).into_par_iter().for_each(run);
    }
}
