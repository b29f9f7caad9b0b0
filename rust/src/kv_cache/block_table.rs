//! Per-sequence block table: logical block i -> physical block id (paper §4.2).

use super::block_pool::BlockId;

/// Maps a sequence's logical blocks to physical blocks, filled on demand.
#[derive(Debug, Clone, Default)]
pub struct BlockTable {
    blocks: Vec<BlockId>,
}

impl BlockTable {
    /// Physical block ids in logical order.
    pub fn blocks(&self) -> &[BlockId] {
        &self.blocks
    }

    /// Number of logical blocks held.
    pub fn len(&self) -> usize {
        self.blocks.len()
    }

    /// True when the table holds no block.
    pub fn is_empty(&self) -> bool {
        self.blocks.is_empty()
    }

    /// Append a physical block as the next logical block.
    pub fn push(&mut self, block: BlockId) {
        self.blocks.push(block);
    }

    /// Point logical block `i` at physical block `block` (copy-on-write).
    pub fn set(&mut self, i: usize, block: BlockId) {
        self.blocks[i] = block;
    }

    /// Remove and return every block, leaving the table empty.
    pub fn take(&mut self) -> Vec<BlockId> {
        std::mem::take(&mut self.blocks)
    }

    /// Slot index (`block * block_size + offset`) of token position `pos`.
    ///
    /// # Panics
    /// If `pos` lies past the allocated blocks.
    #[inline]
    pub fn slot(&self, pos: usize, block_size: usize) -> i64 {
        let block = self.blocks[pos / block_size] as i64;
        block * block_size as i64 + (pos % block_size) as i64
    }
}
