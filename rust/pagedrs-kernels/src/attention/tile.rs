//! Tiles of prefill query tokens: consecutive tokens of one sequence that
//! share its block table, run as one work item per (tile, KV head) so each
//! cached block is fetched (and, for formats that need it, converted) once for
//! the whole tile instead of once per token. Each token's arithmetic is the
//! one its own decode runs, in the same order: a tile changes which work item
//! computes a token, never its bits.

use super::cache::{Caches, HeadQuery};
use super::format::KvElem;

/// The most query tokens of one tile.
pub(crate) const MAX_TILE: usize = 16;

/// The outputs of a tile's queries: query `i`'s `[group, head_dim]` floats
/// (`len` of them) start at `base + i * stride`.
#[derive(Clone, Copy)]
pub(crate) struct TileOut {
    pub base: *mut f32,
    pub stride: usize,
    pub len: usize,
}

impl TileOut {
    /// The output of a single query.
    pub fn single(out: &mut [f32]) -> Self {
        TileOut {
            base: out.as_mut_ptr(),
            stride: 0,
            len: out.len(),
        }
    }

    /// Query `i`'s output.
    ///
    /// # Safety
    /// `i` is a query of the tile, the memory is valid for writes, and no
    /// other live reference covers it.
    #[inline(always)]
    pub unsafe fn row<'a>(&self, i: usize) -> &'a mut [f32] {
        // SAFETY: forwarded from the caller.
        unsafe { std::slice::from_raw_parts_mut(self.base.add(i * self.stride), self.len) }
    }
}

/// A tile: `queries` (1..=`MAX_TILE`, one sequence and KV head, context
/// lengths nondecreasing) over `caches`, into `out`.
#[derive(Clone, Copy)]
pub(crate) struct Tile<'a, E> {
    pub queries: &'a [HeadQuery<'a>],
    pub caches: Caches<'a, E>,
    pub out: TileOut,
}

impl<'a, E: KvElem> Tile<'a, E> {
    /// Logical block `b` of `cache` as the tile's longest query sees it
    /// (`HeadQuery::block`): every row any query of the tile reads.
    #[inline(always)]
    pub fn block(&self, cache: &'a [E], b: usize) -> &'a [E] {
        longest(self.queries).block(&self.caches, cache, b)
    }
}

/// A compiled tile variant of a per-head kernel (`kernel::tile_variant`)
/// with a scratch of its own.
///
/// # Safety
/// `out` holds a valid, disjoint `[group, head_dim]` slice per query.
pub(crate) type TileFn<E> = unsafe fn(Tile<E>, &mut Vec<f32>);

/// Offsets of each query's scores (`[group, span]`) in one scratch, and
/// their total at index `queries.len()`.
#[inline(always)]
pub(crate) fn score_offsets(queries: &[HeadQuery], group: usize) -> [usize; MAX_TILE + 1] {
    let mut off = [0; MAX_TILE + 1];
    for (i, q) in queries.iter().enumerate() {
        off[i + 1] = off[i] + group * q.span();
    }
    off
}

/// The logical blocks any query of the tile sees: from the first visible
/// block of any query to the last query's last block.
#[inline(always)]
pub(crate) fn block_range(queries: &[HeadQuery], block_size: usize) -> std::ops::Range<usize> {
    let first = queries
        .iter()
        .map(|q| q.start / block_size)
        .min()
        .unwrap_or(0);
    let last = queries.iter().map(|q| q.seq_len).max().unwrap_or(0);
    first..last.div_ceil(block_size)
}

/// The query whose context reaches furthest (its blocks hold every row any
/// query of the tile reads).
#[inline(always)]
pub(crate) fn longest<'a>(queries: &'a [HeadQuery<'a>]) -> &'a HeadQuery<'a> {
    queries
        .iter()
        .max_by_key(|q| q.seq_len)
        .expect("a tile has a query")
}

/// Runs of query rows that form tiles: consecutive rows reading the same
/// block-table row (`query_rows`) at consecutive positions (`seq_lens`
/// growing by one), at most `MAX_TILE` each, as `(first row, rows)`. Rows of
/// different sequences (decodes) are tiles of one.
pub fn query_tiles(query_rows: &[i32], seq_lens: &[i32]) -> Vec<(u32, u32)> {
    let mut tiles: Vec<(u32, u32)> = Vec::new();
    for r in 0..query_rows.len() {
        if let Some(last) = tiles.last_mut() {
            let prev = r - 1;
            if (last.1 as usize) < MAX_TILE
                && query_rows[r] == query_rows[prev]
                && seq_lens[r] == seq_lens[prev] + 1
            {
                last.1 += 1;
                continue;
            }
        }
        tiles.push((r as u32, 1));
    }
    tiles
}
