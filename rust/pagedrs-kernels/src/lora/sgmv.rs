//! The segment driver: blocks of one slot's tokens (grouped by a stable
//! sort), run on torch's OpenMP team (`attention::omp`) or rayon, each block
//! shrinking and expanding with the dense kernel's tiles (module docs of
//! `lora`).

use rayon::prelude::*;

use crate::attention::omp;
use crate::cpu_features::Variant;
use crate::dense::{threads_for, tile, TileFn, MAX_C, MAX_R};

/// Most tokens of one block (a multiple of the tile's `MAX_R`).
pub const MAX_SEGMENT_ROWS: usize = 16;

/// One gathered LoRA product over a step's tokens; row-major slices.
#[derive(Clone, Copy, Debug)]
pub struct LoraArgs<'a> {
    /// Activations `[t, k]`.
    pub x: &'a [f32],
    /// Adapter slot of each token `[t]`; negative: no adapter.
    pub slots: &'a [i32],
    /// The slots' A matrices `[l, r, k]` (slot `l`: `[ranks[l], k]` first).
    pub a: &'a [f32],
    /// The slots' B matrices `[l, n, r]` (slot `l`: `[n, ranks[l]]` first).
    pub b: &'a [f32],
    /// Rank of each slot's adapter `[l]` (0: an empty slot), at most `r`.
    pub ranks: &'a [i32],
    /// Scaling of each slot's adapter `[l]` (`lora_alpha / r`, or
    /// `lora_alpha / sqrt(r)` for rsLoRA).
    pub scalings: &'a [f32],
    /// Tokens.
    pub t: usize,
    /// Input features.
    pub k: usize,
    /// Output features.
    pub n: usize,
    /// `max_lora_rank`, the slots' rank stride.
    pub r: usize,
    /// Slots.
    pub l: usize,
}

/// Why a call is refused (checked before any work).
fn check(args: &LoraArgs, out_len: usize, out_stride: usize, out_col: usize) -> Result<(), String> {
    let LoraArgs { t, k, n, r, l, .. } = *args;
    if args.x.len() != t * k {
        return Err(format!("x holds {} floats, not [{t}, {k}]", args.x.len()));
    }
    if args.slots.len() != t {
        return Err(format!(
            "slots has {} entries for {t} tokens",
            args.slots.len()
        ));
    }
    if args.a.len() != l * r * k {
        return Err(format!(
            "lora_a holds {} floats, not [{l}, {r}, {k}]",
            args.a.len()
        ));
    }
    if args.b.len() != l * n * r {
        return Err(format!(
            "lora_b holds {} floats, not [{l}, {n}, {r}]",
            args.b.len()
        ));
    }
    if args.ranks.len() != l || args.scalings.len() != l {
        return Err(format!(
            "ranks and scalings must have {l} entries, one per slot"
        ));
    }
    if let Some(bad) = args.ranks.iter().find(|&&q| q < 0 || q as usize > r) {
        return Err(format!("a slot's rank {bad} is outside [0, {r}]"));
    }
    if let Some(bad) = args.slots.iter().find(|&&s| s >= 0 && s as usize >= l) {
        return Err(format!("token slot {bad} is not below the {l} slots"));
    }
    if out_col + n > out_stride || out_len != t * out_stride {
        return Err(format!(
            "out holds {out_len} floats: not [{t}, {out_stride}] with columns {out_col}..{} inside",
            out_col + n
        ));
    }
    Ok(())
}

/// The output buffer, shared by the blocks (each writes its own rows).
struct SharedOut(*mut f32);
// SAFETY: blocks write disjoint rows of a buffer borrowed mutably for the
// whole call.
unsafe impl Sync for SharedOut {}

/// The step's tokens with an adapter, grouped by slot (a stable sort: in
/// token order within a slot), and the blocks over that order: `(first
/// position in the order, tokens, slot)`, each slot's tokens cut at
/// `MAX_SEGMENT_ROWS`. Tokens without an adapter (or of a rank-0 slot) are in
/// none.
fn blocks(slots: &[i32], ranks: &[i32]) -> (Vec<usize>, Vec<(usize, usize, usize)>) {
    let mut order: Vec<usize> = (0..slots.len())
        .filter(|&t| slots[t] >= 0 && ranks[slots[t] as usize] > 0)
        .collect();
    order.sort_by_key(|&t| slots[t]);
    let mut out = Vec::new();
    let mut i = 0;
    while i < order.len() {
        let s = slots[order[i]];
        let mut j = i + 1;
        while j < order.len() && slots[order[j]] == s && j - i < MAX_SEGMENT_ROWS {
            j += 1;
        }
        out.push((i, j - i, s as usize));
        i = j;
    }
    (order, out)
}

/// `h = x[rows] A^T` (`[rows, rank]`, `rank` weight rows `k` apart).
///
/// # Safety
/// `x` holds `rows * k` floats, `a` `rank * k`, `h` `rows * rank`.
unsafe fn product(
    tile: TileFn,
    x: *const f32,
    w: *const f32,
    k: usize,
    rows: usize,
    outs: usize,
    mut put: impl FnMut(usize, usize, f32),
) {
    for n0 in (0..outs).step_by(MAX_C) {
        let nc = MAX_C.min(outs - n0);
        for r0 in (0..rows).step_by(MAX_R) {
            let nr = MAX_R.min(rows - r0);
            let sums = tile(x.add(r0 * k), w.add(n0 * k), k, nr, nc);
            for (r, row) in sums.iter().enumerate().take(nr) {
                for (c, &s) in row.iter().enumerate().take(nc) {
                    put(r0 + r, n0 + c, s);
                }
            }
        }
    }
}

/// `out[t, out_col + j] += scalings[l] * (B_l (A_l x[t]))[j]` for every token
/// `t` with an adapter slot `l` (`slots[t] >= 0`, rank > 0); other rows are
/// left as they are. `out` is `[t, out_stride]` row-major. In `variant`, on
/// up to `threads` threads of torch's OpenMP team (rayon's pool without one).
///
/// # Errors
/// A slice length that does not match the shapes, a slot or rank out of
/// range, or output columns outside `out`'s rows (nothing is written then).
///
/// Panics if this CPU does not run `variant`.
pub fn lora_add(
    args: &LoraArgs,
    out: &mut [f32],
    out_stride: usize,
    out_col: usize,
    variant: Variant,
    threads: usize,
) -> Result<(), String> {
    check(args, out.len(), out_stride, out_col)?;
    let tile = tile(variant);
    let LoraArgs { k, n, r, .. } = *args;
    let (order, work) = blocks(args.slots, args.ranks);
    if work.is_empty() || n == 0 {
        return Ok(());
    }
    let threads = threads_for(order.len(), n + r, k.max(n), threads);
    let base = SharedOut(out.as_mut_ptr());
    let base = &base;
    let run = |i: usize| {
        let (p0, rows, slot) = work[i];
        let tokens = &order[p0..p0 + rows];
        let rank = args.ranks[slot] as usize;
        let scaling = args.scalings[slot];
        let a = &args.a[slot * r * k..slot * r * k + rank * k];
        let b = &args.b[slot * n * r..slot * n * r + n * rank];
        // The block's activation rows, gathered.
        let mut x = Vec::with_capacity(rows * k);
        for &t in tokens {
            x.extend_from_slice(&args.x[t * k..(t + 1) * k]);
        }
        let mut h = vec![0.0f32; rows * rank];
        // SAFETY: `x` holds rows * k floats, `a` rank * k, `b` n * rank
        // (sliced above), `h` rows * rank; `tile` runs on this CPU.
        unsafe {
            product(tile, x.as_ptr(), a.as_ptr(), k, rows, rank, |row, j, s| {
                h[row * rank + j] = s;
            });
            product(tile, h.as_ptr(), b.as_ptr(), rank, rows, n, |row, j, s| {
                // SAFETY: the token's row is this block's alone (each token
                // is in one block), the column inside the stride (checked).
                let o = base.0.add(tokens[row] * out_stride + out_col + j);
                *o += s * scaling;
            });
        }
    };
    if threads == 1 {
        (0..work.len()).for_each(run);
    } else if !omp::parallel_for(threads, work.len(), &run) {
        (0..work.len()).into_par_iter().for_each(run);
    }
    Ok(())
}
