//! KV cache manager: allocates blocks to block tables on demand and frees them.

use super::block_pool::BlockPool;
use super::block_table::BlockTable;

/// Owns the device block pool; grows block tables as sequences produce tokens.
#[derive(Debug, Clone)]
pub struct KvCacheManager {
    pool: BlockPool,
    block_size: usize,
}

/// Number of blocks needed to hold `num_tokens` token states.
#[inline]
pub fn blocks_for(num_tokens: usize, block_size: usize) -> usize {
    num_tokens.div_ceil(block_size)
}

impl KvCacheManager {
    /// A manager over `num_blocks` blocks of `block_size` tokens each.
    pub fn new(num_blocks: usize, block_size: usize) -> Self {
        assert!(block_size > 0, "block_size must be positive");
        Self {
            pool: BlockPool::new(num_blocks),
            block_size,
        }
    }

    /// Tokens per block.
    pub fn block_size(&self) -> usize {
        self.block_size
    }

    /// The underlying block pool (read only).
    pub fn pool(&self) -> &BlockPool {
        &self.pool
    }

    /// Make `table` cover `num_tokens` token slots, allocating only the missing
    /// blocks. All-or-nothing: returns false and changes nothing when the free
    /// queue holds too few blocks.
    pub fn allocate_slots(&mut self, table: &mut BlockTable, num_tokens: usize) -> bool {
        let needed = blocks_for(num_tokens, self.block_size).saturating_sub(table.len());
        if needed > self.pool.num_free() {
            return false;
        }
        for _ in 0..needed {
            let block = self.pool.allocate().expect("checked free count");
            table.push(block);
        }
        true
    }

    /// Release every block of `table` (ref counts down; free at zero).
    pub fn free(&mut self, table: &mut BlockTable) {
        for block in table.take().into_iter().rev() {
            self.pool.free(block);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn allocates_on_demand() {
        let mut m = KvCacheManager::new(4, 16);
        let mut t = BlockTable::default();
        assert!(m.allocate_slots(&mut t, 1));
        assert_eq!(t.len(), 1);
        assert!(m.allocate_slots(&mut t, 16));
        assert_eq!(t.len(), 1);
        assert!(m.allocate_slots(&mut t, 17));
        assert_eq!(t.len(), 2);
        assert_eq!(t.slot(16, 16), t.blocks()[1] as i64 * 16);
        assert!(!m.allocate_slots(&mut t, 16 * 5), "all or nothing");
        assert_eq!(t.len(), 2);
        m.free(&mut t);
        assert_eq!(m.pool().num_free(), 4);
    }
}
