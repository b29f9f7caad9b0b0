//! Decode attention over a paged KV cache: a call split into (sequence, KV
//! head) work items (`DecodeJob`), each run by the per-head kernel (`kernel`),
//! on torch's OpenMP team (`omp`) or on rayon. Queries and outputs are `f32`;
//! the caches hold entries of any `KvElem` format (`format`).
//!
//! Layouts (row-major, as the Python side allocates them):
//! * `key_cache`, `value_cache`: `[num_blocks, num_kv_heads, block_size, entry]`
//!   elements, `entry = E::entry_size(head_dim)`.
//! * `query`, `out`: `[num_seqs, num_heads, head_dim]`.
//! * `block_tables`: `[num_seqs, table_width]`, physical block of each logical block.
//! * `seq_lens`: `[num_seqs]`, context tokens of each sequence (the query's own
//!   token included, already written to the cache).
//!
//! A prefill chunk runs through the same kernel one query token at a time
//! (`DecodeJob::with_query_rows`): query row `r` is the token at position
//! `seq_lens[r] - 1` of the sequence whose block table is row
//! `query_rows[r]`, so it attends to the cached tokens `0..=position` exactly
//! as a decode of that token would. A token's output then has the same bits
//! whether its prompt was computed whole, in chunks, over a cached prefix or
//! token by token. Consecutive tokens of one sequence form tiles
//! (`tile::query_tiles`), one work item per (tile, KV head), so each block
//! is fetched once per tile, with each token's arithmetic unchanged; a
//! decode is a tile of one.
//!
//! Query head `h` reads KV head `h / (num_heads / num_kv_heads)` (grouped-query
//! attention, as HF's `repeat_kv`).
//!
//! `DecodeOptions` adds what some models' attention has on top (HF
//! transformers' eager semantics): a sliding window (the query at position
//! `p` sees keys `p - window < k <= p`, so only the last `window` tokens of
//! each context are read), a logit soft cap (`c * tanh(s / c)` after
//! scaling) and attention sinks (one extra logit per query head in the
//! softmax, its weight dropped).

use rayon::prelude::*;

use super::cache::{CacheShape, Caches, HeadQuery};
use super::format::KvElem;
use super::kernel::tile_variant;
use super::omp;
use super::tile::{Tile, TileFn, TileOut, MAX_TILE};

/// The tile kernel of the fastest variant this CPU runs.
fn fastest<E: KvElem>(head_dim: usize, bf16_query: bool) -> TileFn<E> {
    tile_variant::<E>(head_dim, bf16_query).expect("the portable variant runs everywhere")
}

/// The optional logit features of a decode call; the default has none.
#[derive(Clone, Copy, Debug, Default)]
pub struct DecodeOptions<'a> {
    /// Attend to the last `window` tokens of each context only (>= 1).
    pub sliding_window: Option<usize>,
    /// Soft cap `c > 0`: scores become `c * tanh(s / c)` after scaling.
    pub softcap: Option<f32>,
    /// Sink logit per query head, `[num_heads]`.
    pub sinks: Option<&'a [f32]>,
}

/// A decode attention call over caches of `E` entries, split into one work
/// item per (sequence, KV head): `[group, head_dim]` of the query and of the
/// output. Run it with `run_on_team` (torch's OpenMP threads) or
/// `run_on_rayon`. Each item's reductions run in one fixed order, so a
/// sequence's output does not depend on the batch or the threads.
pub struct DecodeJob<'a, E = f32> {
    query: &'a [f32],
    caches: Caches<'a, E>,
    block_tables: &'a [i32],
    table_width: usize,
    seq_lens: &'a [i32],
    /// Block-table row of each query row; None: row `r` reads row `r`.
    query_rows: Option<&'a [i32]>,
    /// Tiles of query rows (`(first row, rows)`, `tile::query_tiles`); None:
    /// each query row is a tile of one.
    tiles: Option<&'a [(u32, u32)]>,
    scale: f32,
    options: DecodeOptions<'a>,
    /// The fastest variant's tile kernel (`kernel::tile_variant`).
    kernel: TileFn<E>,
    /// Floats per work item (`group * head_dim`).
    item: usize,
}

impl<E> Clone for DecodeJob<'_, E> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<E> Copy for DecodeJob<'_, E> {}

impl<E: KvElem> DecodeJob<'_, E> {
    fn num_items(&self) -> usize {
        let rows = self.tiles.map_or(self.seq_lens.len(), |t| t.len());
        rows * self.caches.shape.num_kv_heads
    }

    /// Query row `r`'s heads on KV head `kv_head`.
    fn head_query(&self, r: usize, kv_head: usize) -> HeadQuery<'_> {
        let hkv = self.caches.shape.num_kv_heads;
        let i = r * hkv + kv_head;
        let seq_len = self.seq_lens[r] as usize;
        let s = self.query_rows.map_or(r, |rows| rows[r] as usize);
        let group = self.item / self.caches.shape.head_dim.max(1);
        let first_head = kv_head * group;
        HeadQuery {
            q: &self.query[i * self.item..(i + 1) * self.item],
            table: &self.block_tables[s * self.table_width..(s + 1) * self.table_width],
            seq_len,
            kv_head,
            scale: self.scale,
            start: self
                .options
                .sliding_window
                .map_or(0, |w| seq_len.saturating_sub(w)),
            softcap: self.options.softcap.unwrap_or(0.0),
            sinks: self
                .options
                .sinks
                .map_or(&[][..], |s| &s[first_head..first_head + group]),
        }
    }

    /// Item `i` (a tile of query rows on one KV head) into its rows of the
    /// output at `out` (`[rows, num_heads, head_dim]`).
    ///
    /// # Safety
    /// `out` is valid for writes of the whole output, and no other item
    /// runs on the same index at the same time (items write disjoint rows).
    unsafe fn run(&self, i: usize, out: *mut f32, scores: &mut Vec<f32>) {
        let hkv = self.caches.shape.num_kv_heads;
        let (r, kv_head) = (i / hkv, i % hkv);
        let (first, len) = self
            .tiles
            .map_or((r, 1), |t| (t[r].0 as usize, t[r].1 as usize));
        let mut queries = [self.head_query(first, kv_head); MAX_TILE];
        for (k, q) in queries.iter_mut().enumerate().take(len).skip(1) {
            *q = self.head_query(first + k, kv_head);
        }
        let out = TileOut {
            // SAFETY: row `first`'s slice of KV head `kv_head` lies in `out`.
            base: unsafe { out.add((first * hkv + kv_head) * self.item) },
            stride: hkv * self.item,
            len: self.item,
        };
        // SAFETY: the tile's rows `first..first + len` on `kv_head` belong to
        // this item alone (tiles do not overlap) and lie in `out`.
        let (queries, caches) = (&queries[..len], self.caches);
        unsafe {
            (self.kernel)(
                Tile {
                    queries,
                    caches,
                    out,
                },
                scores,
            )
        }
    }
}

/// The output pointer shared by the OpenMP team; each item writes only its
/// own disjoint slice.
struct SharedOut(*mut f32);

// SAFETY: work items write disjoint ranges of the output (see `run_on_team`).
unsafe impl Sync for SharedOut {}

thread_local! {
    /// Score scratch of each OpenMP team thread.
    static SCORES: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
}

impl<'a, E: KvElem> DecodeJob<'a, E> {
    /// Layouts as in the module docs; `scale` is the softmax scale.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        query: &'a [f32],
        key_cache: &'a [E],
        value_cache: &'a [E],
        shape: CacheShape,
        block_tables: &'a [i32],
        table_width: usize,
        seq_lens: &'a [i32],
        scale: f32,
    ) -> Self {
        let item = if seq_lens.is_empty() {
            0
        } else {
            query.len() / seq_lens.len() / shape.num_kv_heads
        };
        DecodeJob {
            query,
            caches: Caches::new(key_cache, value_cache, shape),
            block_tables,
            table_width,
            seq_lens,
            query_rows: None,
            tiles: None,
            scale,
            options: DecodeOptions::default(),
            kernel: fastest::<E>(shape.head_dim, false),
            item,
        }
    }

    /// The same call for queries that hold bfloat16 values (widened to
    /// `f32`): on a CPU with AVX-512 BF16 a bfloat16 cache's scores then take
    /// its dot-product instruction (`kernel::variants`).
    pub fn with_bf16_query(mut self) -> Self {
        self.kernel = fastest::<E>(self.caches.shape.head_dim, true);
        self
    }

    /// The same call with query row `r` reading block-table row
    /// `query_rows[r]` (`[num_queries]`, as many as `seq_lens`), so several
    /// query tokens of one sequence (a prefill chunk, each with its own
    /// context length `position + 1`) share its table.
    ///
    /// Panics if `query_rows` and `seq_lens` differ in length.
    pub fn with_query_rows(mut self, query_rows: &'a [i32]) -> Self {
        assert_eq!(query_rows.len(), self.seq_lens.len(), "one row per query");
        self.query_rows = Some(query_rows);
        self
    }

    /// The same call run in `tiles` of query rows (`tile::query_tiles` of
    /// the query rows and context lengths): the same bits, each block
    /// fetched once per tile.
    ///
    /// Panics if the tiles do not cover the query rows in order, or a tile
    /// is not consecutive positions of one block-table row.
    pub fn with_tiles(mut self, tiles: &'a [(u32, u32)]) -> Self {
        let mut next = 0usize;
        for &(first, len) in tiles {
            let (first, len) = (first as usize, len as usize);
            assert!(
                first == next && (1..=MAX_TILE).contains(&len),
                "tiles cover the rows in order"
            );
            for r in first + 1..first + len {
                let rows = self.query_rows.unwrap_or(&[]);
                assert!(
                    self.seq_lens[r] == self.seq_lens[r - 1] + 1
                        && rows.get(r).is_some()
                        && rows[r] == rows[r - 1],
                    "a tile is consecutive positions of one sequence"
                );
            }
            next = first + len;
        }
        assert_eq!(next, self.seq_lens.len(), "tiles cover the rows in order");
        self.tiles = Some(tiles);
        self
    }

    /// The same call with `options` (sliding window, soft cap, sinks).
    ///
    /// Panics if `options.sinks` does not hold one logit per query head.
    pub fn with_options(mut self, options: DecodeOptions<'a>) -> Self {
        if let Some(sinks) = options.sinks {
            let heads =
                self.item / self.caches.shape.head_dim.max(1) * self.caches.shape.num_kv_heads;
            assert!(
                self.item == 0 || sinks.len() == heads,
                "one sink per query head"
            );
        }
        self.options = options;
        self
    }

    /// Every item on rayon's current pool.
    pub fn run_on_rayon(&self, out: &mut [f32]) {
        if self.num_items() == 0 {
            return;
        }
        assert_eq!(
            out.len(),
            self.seq_lens.len() * self.caches.shape.num_kv_heads * self.item,
            "output size"
        );
        let base = SharedOut(out.as_mut_ptr());
        let base = &base;
        (0..self.num_items())
            .into_par_iter()
            // SAFETY: each index runs once, and items write disjoint rows of
            // `out`, which is borrowed mutably for the whole call.
            .for_each_init(Vec::new, |scores, i| unsafe { self.run(i, base.0, scores) });
    }

    /// Every item on `num_threads` threads of the process's OpenMP team
    /// (`omp::parallel_for`); false, having run nothing, without one.
    pub fn run_on_team(&self, num_threads: usize, out: &mut [f32]) -> bool {
        assert_eq!(
            out.len(),
            self.seq_lens.len() * self.caches.shape.num_kv_heads * self.item,
            "output size"
        );
        if self.num_items() == 0 {
            return true;
        }
        let base = SharedOut(out.as_mut_ptr());
        let base = &base;
        omp::parallel_for(num_threads, self.num_items(), &|i| {
            // SAFETY: each index < num_items runs once; items write disjoint
            // rows of `out` (in bounds by the assert above), which is borrowed
            // mutably for the whole call.
            SCORES.with_borrow_mut(|scores| unsafe { self.run(i, base.0, scores) });
        })
    }
}

/// One query token per sequence attending to its paged context (all of it,
/// or its last `options.sliding_window` tokens) in caches of `E` entries, in
/// parallel over (sequence, KV head) items on rayon's current pool.
///
/// Panics if a block id or length points outside the given slices (the caller
/// validates shapes; the scheduler guarantees valid tables).
#[allow(clippy::too_many_arguments)]
pub fn paged_decode_attention<E: KvElem>(
    query: &[f32],
    key_cache: &[E],
    value_cache: &[E],
    shape: CacheShape,
    block_tables: &[i32],
    table_width: usize,
    seq_lens: &[i32],
    scale: f32,
    options: DecodeOptions,
    out: &mut [f32],
) {
    DecodeJob::new(
        query,
        key_cache,
        value_cache,
        shape,
        block_tables,
        table_width,
        seq_lens,
        scale,
    )
    .with_options(options)
    .run_on_rayon(out);
}
