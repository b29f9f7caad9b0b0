//! KV cache groups: layers of one attention type and page size whose blocks
//! come from one shared pool (the hybrid KV cache). Each sequence has one
//! block table per group; a block id belongs to one group at a time and
//! indexes one layer of that group in every layer position (the executor
//! lays the pool out so). A full-attention group keeps every block of a
//! sequence; a sliding-window group only the blocks some query can still see.

use super::block::blocks_for;

/// The attention type of one KV cache group.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Hash)]
pub struct KvCacheGroupSpec {
    /// Sliding window in tokens: the query at position `p` sees the keys
    /// `p - w < k <= p` (transformers' semantics). `None`: full attention.
    pub sliding_window: Option<usize>,
}

impl KvCacheGroupSpec {
    /// Full attention: every token's KV stays until the sequence ends.
    pub const FULL: Self = Self {
        sliding_window: None,
    };

    /// A sliding-window group of `window` tokens.
    pub fn sliding(window: usize) -> Self {
        Self {
            sliding_window: Some(window),
        }
    }

    /// True for a sliding-window group.
    pub fn is_sliding(&self) -> bool {
        self.sliding_window.is_some()
    }

    /// Leading logical blocks that no query at position `first_query` or
    /// later can see: block `i` covers positions `[i * bs, (i + 1) * bs)`,
    /// and the query at `first_query` sees back to `first_query + 1 - w`.
    #[inline]
    pub fn num_skippable(&self, first_query: usize, block_size: usize) -> usize {
        match self.sliding_window {
            None => 0,
            Some(w) => (first_query + 1).saturating_sub(w) / block_size,
        }
    }

    /// Blocks a sequence with `num_computed` tokens in the cache holds
    /// between steps.
    pub fn blocks_held(&self, num_computed: usize, block_size: usize) -> usize {
        blocks_for(num_computed, block_size) - self.num_skippable(num_computed, block_size)
    }

    /// Most blocks one sequence of at most `max_model_len` tokens holds at
    /// once when a step computes at most `max_chunk` of its tokens: the
    /// chunk's queries see `w - 1 + max_chunk` positions, which span at most
    /// one block more than they fill.
    pub fn max_blocks_per_seq(
        &self,
        max_model_len: usize,
        max_chunk: usize,
        block_size: usize,
    ) -> usize {
        let full = blocks_for(max_model_len, block_size);
        match self.sliding_window {
            None => full,
            Some(w) => full.min(blocks_for(w - 1 + max_chunk, block_size) + 1),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn window_bounds() {
        let g = KvCacheGroupSpec::sliding(8);
        // The query at 7 sees 0..=7; at 8 it no longer sees 0; at 11, 4..=11.
        assert_eq!(g.num_skippable(7, 4), 0);
        assert_eq!(g.num_skippable(11, 4), 1);
        assert_eq!(g.num_skippable(12, 4), 1);
        assert_eq!(g.num_skippable(15, 4), 2);
        assert_eq!(KvCacheGroupSpec::FULL.num_skippable(1000, 4), 0);
        assert_eq!(g.blocks_held(16, 4), 4 - 2);
        // Every chunk [c, c + n) needs blocks floor((c + 1 - w) / bs) ..= floor((c + n - 1) / bs).
        for c in 0..64 {
            for n in 1..=16 {
                let need = (c + n - 1) / 4 + 1 - g.num_skippable(c, 4);
                assert!(need <= g.max_blocks_per_seq(1 << 20, 16, 4), "c={c} n={n}");
            }
        }
        assert_eq!(g.max_blocks_per_seq(10, 16, 4), 3, "never above full");
    }
}
