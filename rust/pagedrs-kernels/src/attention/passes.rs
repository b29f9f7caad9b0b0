//! The per-head kernel's three passes over a tile of queries (`drive`), and
//! what an instruction set (`Isa`) does in each pass over the cache's element
//! type (`KvElem`); the scratch layout and the score normalization every
//! variant shares.
//!
//! Every variant reduces in an order fixed by the query alone (its context's
//! tokens in order, each head dimension in a fixed lane), never by the batch
//! or tile it came in or the thread that ran it: a sequence's output is the
//! same bits alone or in any batch.

use super::cache::{Caches, HeadQuery};
use super::format::KvElem;
use super::math::{softmax, softmax_with_sink};
use super::tile::{block_range, longest, score_offsets, Tile};

/// An instruction set the kernels are compiled for, over caches of `E`
/// entries: what `drive` needs of it in each pass. `N` counts the vectors
/// of `UNIT` values in one row (`head_dim = N * UNIT`). Its unsafe methods
/// but `tile` run inside `tile`, with its features and under its contract.
pub(crate) trait Isa<E: KvElem>: Sized + 'static {
    /// The variant's name (`kernel::variants`).
    const NAME: &'static str;
    /// Values per vector of a row; 0: any `head_dim` (`N` is then 0).
    const UNIT: usize;
    /// Whether pass 2's exponential takes fused multiply-adds
    /// (`math::exp_nonpositive_fma`).
    const FMA: bool = true;
    /// The scratch after the scores (`State`).
    type State<'s>;
    /// A block's keys as pass 1 reads them.
    type Keys<'a>;

    /// Whether this CPU runs it.
    fn detected() -> bool;

    /// Whether it takes these queries (`bf16_query`: bfloat16 values).
    fn takes(_: bool) -> bool {
        true
    }

    /// `drive::<Self, E, N>`, compiled with the instruction set's features.
    ///
    /// # Safety
    /// The CPU has what `detected` checks, `head_dim == N * UNIT` (when
    /// `UNIT > 0`), and `out` as `TileFn` requires.
    unsafe fn tile<const N: usize>(t: Tile<E>, scratch: &mut Vec<f32>);

    /// `scratch` as the tile's zeroed scores (`[scores]`) and its state.
    unsafe fn prepare<'s, const N: usize>(
        t: &Tile<E>,
        scratch: &'s mut Vec<f32>,
        scores: usize,
    ) -> (&'s mut [f32], Self::State<'s>);

    /// Logical block `b`'s keys for pass 1 (`Tile::block`).
    unsafe fn keys<'a, const N: usize>(
        state: &'a mut Self::State<'_>,
        t: &Tile<'a, E>,
        b: usize,
    ) -> Self::Keys<'a>;

    /// Pass 1 for query head `h` of the tile (`qg`, of `query`):
    /// `row[j]` is its score on the key at row `skip + j` of the block.
    unsafe fn scores<const N: usize>(
        keys: &Self::Keys<'_>,
        h: usize,
        query: &HeadQuery,
        qg: &[f32],
        skip: usize,
        row: &mut [f32],
    );

    /// Pass 2 for query `i` of the tile: its scores (`[group, span]`) into
    /// attention weights (`normalize_scores`). Inlined into `tile`, so it runs
    /// with the variant's features (`mul_add` one instruction, not a call).
    #[inline(always)]
    unsafe fn normalize(_: &mut Self::State<'_>, _: usize, query: &HeadQuery, s: &mut [f32]) {
        if Self::FMA {
            normalize_scores::<true>(query, s, query.span())
        } else {
            normalize_scores::<false>(query, s, query.span())
        }
    }

    /// Pass 3: each query's weighted values added into its zeroed output;
    /// query `i`'s weights are `scores[off[i]..off[i + 1]]`.
    unsafe fn values<const N: usize>(s: Self::State<'_>, t: Tile<E>, w: &[f32], off: &[usize]);
}

/// The three passes for a tile of queries (`tile`) with the operations of
/// `I`: each cached block is fetched (and widened, where `I` does) once,
/// then every query that sees it takes its scores (pass 1) and later its
/// weighted values (pass 3) from it, each query in exactly the operations
/// and order it runs alone. Blocks before a window's first block are
/// skipped, and so are the rows of that block before its first visible
/// token.
///
/// # Safety
/// As `Isa::tile`.
#[inline(always)]
pub(crate) unsafe fn drive<I: Isa<E>, E: KvElem, const N: usize>(
    t: Tile<E>,
    scratch: &mut Vec<f32>,
) {
    let (queries, out) = (t.queries, t.out);
    let (d, bs) = (t.caches.shape.head_dim, t.caches.shape.block_size);
    assert!(I::UNIT == 0 || d == N * I::UNIT, "head_dim {d}");
    let group = out.len / d;
    for i in 0..queries.len() {
        // SAFETY: query `i`'s output (caller).
        unsafe { out.row(i) }.fill(0.0);
    }
    if longest(queries).seq_len == 0 {
        return;
    }
    let off = score_offsets(queries, group);
    // SAFETY (each call of `I`): forwarded from the caller.
    let (scores, mut state) = unsafe { I::prepare::<N>(&t, scratch, off[queries.len()]) };
    // Pass 1: scores[g * span + t - start] = scale * q_g . k_t per query.
    for b in block_range(queries, bs) {
        let keys = unsafe { I::keys::<N>(&mut state, &t, b) };
        for (i, query) in queries.iter().enumerate() {
            let Some((skip, n, at)) = query.visible(b, bs) else {
                continue;
            };
            for (g, qg) in query.q.chunks_exact(d).enumerate() {
                let row = &mut scores[off[i] + g * query.span() + at..][..n];
                unsafe { I::scores::<N>(&keys, i * group + g, query, qg, skip, row) };
            }
        }
    }
    // Pass 2: soft cap, softmax (with sink) per query head.
    for (i, query) in queries.iter().enumerate() {
        unsafe { I::normalize(&mut state, i, query, &mut scores[off[i]..off[i + 1]]) };
    }
    // Pass 3: out_g = sum_t p_gt * v_t per query.
    unsafe { I::values::<N>(state, t, scores, &off) };
}

/// `scratch` as zeroed scores (`[scores]`) and room for `rows` more floats
/// (64-byte aligned).
#[inline(always)]
pub(crate) fn split_scratch(
    scratch: &mut Vec<f32>,
    scores: usize,
    rows: usize,
) -> (&mut [f32], &mut [f32]) {
    scratch.clear();
    scratch.resize(scores + rows + ALIGN_FLOATS, 0.0);
    let (scores_part, rest) = scratch.split_at_mut(scores);
    let pad = rest.as_ptr().align_offset(64).min(ALIGN_FLOATS);
    (scores_part, &mut rest[pad..pad + rows])
}

/// `scratch` as zeroed scores (`[scores]`) and room for a block's widened
/// rows (`[block_size, head_dim]`; none for `f32` entries, which are read
/// in place).
#[inline(always)]
pub(crate) fn split_rows<'s, E: KvElem>(
    caches: &Caches<E>,
    scratch: &'s mut Vec<f32>,
    scores: usize,
) -> (&'s mut [f32], &'s mut [f32]) {
    let rows = caches.shape.block_size * caches.shape.head_dim;
    let rows = if E::as_f32(&[]).is_some() { 0 } else { rows };
    split_scratch(scratch, scores, rows)
}

/// Floats of padding that put the widened rows at a 64-byte boundary: a
/// 64-byte vector stored there and loaded back stays in one cache line.
const ALIGN_FLOATS: usize = 16;

/// Scores `[group, span]` into attention weights, in place: the logit soft
/// cap when set (`c * tanh(s / c)`, after scaling), then a softmax per query
/// head, over the head's sink logit as one more column (its weight dropped)
/// when sinks are set. `FMA`: the exponential in fused multiply-adds
/// (`math::exp_nonpositive_fma`), for kernels compiled with FMA.
#[inline(always)]
pub(crate) fn normalize_scores<const FMA: bool>(
    query: &HeadQuery,
    scores: &mut [f32],
    span: usize,
) {
    if query.softcap > 0.0 {
        let c = query.softcap;
        scores.iter_mut().for_each(|s| *s = (*s / c).tanh() * c);
    }
    if query.sinks.is_empty() {
        for row in scores.chunks_exact_mut(span) {
            softmax::<FMA>(row);
        }
    } else {
        for (row, &sink) in scores.chunks_exact_mut(span).zip(query.sinks) {
            softmax_with_sink::<FMA>(row, sink);
        }
    }
}
