//! Per-sequence block table: logical block i -> physical block id (paper §4.2).
//!
//! Under a sliding window the leading logical blocks that no later query can
//! see are released: their entries become [`NULL_BLOCK`] and the table counts
//! them as skipped. Released blocks are always a prefix of the table.

use super::block::BlockId;

/// The entry of a logical block released behind a sliding window.
pub const NULL_BLOCK: BlockId = BlockId::MAX;

/// Maps a sequence's logical blocks to physical blocks, filled on demand.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BlockTable {
    blocks: Vec<BlockId>,
    num_skipped: usize,
}

impl BlockTable {
    /// Physical block ids in logical order ([`NULL_BLOCK`] for skipped ones).
    pub fn blocks(&self) -> &[BlockId] {
        &self.blocks
    }

    /// The blocks held: every entry after the skipped ones.
    pub fn live(&self) -> &[BlockId] {
        &self.blocks[self.num_skipped..]
    }

    /// Leading logical blocks released behind a sliding window.
    pub fn num_skipped(&self) -> usize {
        self.num_skipped
    }

    /// Number of logical blocks (skipped ones included).
    pub fn len(&self) -> usize {
        self.blocks.len()
    }

    /// Number of physical blocks held.
    pub fn num_live(&self) -> usize {
        self.blocks.len() - self.num_skipped
    }

    /// True when the table has no logical block.
    pub fn is_empty(&self) -> bool {
        self.blocks.is_empty()
    }

    /// Append a physical block as the next logical block.
    pub fn push(&mut self, block: BlockId) {
        self.blocks.push(block);
    }

    /// Point logical block `i` at physical block `block` (copy-on-write, swap).
    pub fn set(&mut self, i: usize, block: BlockId) {
        debug_assert!(i >= self.num_skipped, "logical block {i} was released");
        self.blocks[i] = block;
    }

    /// Release logical blocks `[num_skipped, n)`: their entries become
    /// [`NULL_BLOCK`] (the table grows with null entries up to `n` when
    /// shorter). Returns the physical blocks released, in logical order.
    pub fn skip_to(&mut self, n: usize) -> Vec<BlockId> {
        if n <= self.num_skipped {
            return Vec::new();
        }
        let held = n.min(self.blocks.len());
        let released = (self.num_skipped..held)
            .map(|i| std::mem::replace(&mut self.blocks[i], NULL_BLOCK))
            .collect();
        self.blocks.resize(self.blocks.len().max(n), NULL_BLOCK);
        self.num_skipped = n;
        released
    }

    /// Keep the first `n` logical blocks (never fewer than the released
    /// ones); returns the physical blocks removed, in logical order.
    pub fn truncate(&mut self, n: usize) -> Vec<BlockId> {
        let n = n.max(self.num_skipped);
        if n >= self.blocks.len() {
            return Vec::new();
        }
        self.blocks.split_off(n)
    }

    /// Remove and return every held block, leaving the table empty.
    pub fn take(&mut self) -> Vec<BlockId> {
        let mut blocks = std::mem::take(&mut self.blocks);
        blocks.drain(..self.num_skipped);
        self.num_skipped = 0;
        blocks
    }

    /// Slot index (`block * block_size + offset`) of token position `pos`.
    ///
    /// # Panics
    /// If `pos` lies past the allocated blocks; in debug builds, if its block
    /// was released.
    #[inline]
    pub fn slot(&self, pos: usize, block_size: usize) -> i64 {
        let block = self.blocks[pos / block_size];
        debug_assert_ne!(block, NULL_BLOCK, "position {pos} lies behind the window");
        block as i64 * block_size as i64 + (pos % block_size) as i64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn skip_releases_a_prefix() {
        let mut t = BlockTable::default();
        for b in [7, 8, 9] {
            t.push(b);
        }
        assert_eq!(t.skip_to(2), vec![7, 8]);
        assert_eq!(t.skip_to(1), Vec::<BlockId>::new(), "never un-skips");
        assert_eq!((t.len(), t.num_live(), t.live()), (3, 1, &[9][..]));
        assert_eq!(t.blocks()[..2], [NULL_BLOCK, NULL_BLOCK]);
        assert_eq!(t.skip_to(5), vec![9]);
        assert_eq!((t.len(), t.num_live()), (5, 0));
        t.push(4);
        assert_eq!(t.take(), vec![4]);
        assert_eq!((t.len(), t.num_skipped()), (0, 0));
    }
}
