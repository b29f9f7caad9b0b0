//! Physical KV block pool: reference counts and the free block queue.
//!
//! Paper §4.2: the KV cache is split into fixed-size physical blocks; each block
//! carries a reference count so that several block tables may point at it.
//! A block whose count drops to zero goes back to the free block queue.

use std::collections::VecDeque;

/// Index of a physical block in the device (or CPU) block pool.
pub type BlockId = u32;

/// A fixed-size pool of physical blocks.
#[derive(Debug, Clone)]
pub struct BlockPool {
    ref_counts: Vec<u32>,
    free_queue: VecDeque<BlockId>,
}

impl BlockPool {
    /// A pool of `num_blocks` free blocks, handed out in index order.
    pub fn new(num_blocks: usize) -> Self {
        Self {
            ref_counts: vec![0; num_blocks],
            free_queue: (0..num_blocks as BlockId).collect(),
        }
    }

    /// Total number of physical blocks.
    pub fn num_total(&self) -> usize {
        self.ref_counts.len()
    }

    /// Number of blocks in the free block queue.
    pub fn num_free(&self) -> usize {
        self.free_queue.len()
    }

    /// Reference count of `block` (0 when free).
    pub fn ref_count(&self, block: BlockId) -> u32 {
        self.ref_counts[block as usize]
    }

    /// Take one block from the head of the free queue with ref count 1.
    /// Returns `None` when the pool is exhausted.
    pub fn allocate(&mut self) -> Option<BlockId> {
        let block = self.free_queue.pop_front()?;
        debug_assert_eq!(self.ref_counts[block as usize], 0);
        self.ref_counts[block as usize] = 1;
        Some(block)
    }

    /// Add one reference to an allocated block (fork / sharing).
    ///
    /// # Panics
    /// If the block is free: sharing a free block is a bookkeeping bug.
    pub fn incref(&mut self, block: BlockId) {
        let rc = &mut self.ref_counts[block as usize];
        assert!(*rc > 0, "incref of free block {block}");
        *rc += 1;
    }

    /// Drop one reference; at zero the block returns to the tail of the free queue.
    ///
    /// # Panics
    /// On a double free.
    pub fn free(&mut self, block: BlockId) {
        let rc = &mut self.ref_counts[block as usize];
        assert!(*rc > 0, "double free of block {block}");
        *rc -= 1;
        if *rc == 0 {
            self.free_queue.push_back(block);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn allocate_and_free_round_trip() {
        let mut pool = BlockPool::new(3);
        let a = pool.allocate().unwrap();
        let b = pool.allocate().unwrap();
        assert_eq!((a, b), (0, 1));
        assert_eq!(pool.num_free(), 1);
        pool.incref(a);
        pool.free(a);
        assert_eq!(pool.num_free(), 1, "still referenced once");
        pool.free(a);
        pool.free(b);
        assert_eq!(pool.num_free(), 3);
    }

    #[test]
    fn exhausted_pool_returns_none() {
        let mut pool = BlockPool::new(1);
        assert!(pool.allocate().is_some());
        assert!(pool.allocate().is_none());
    }

    #[test]
    #[should_panic(expected = "double free")]
    fn double_free_panics() {
        let mut pool = BlockPool::new(1);
        let a = pool.allocate().unwrap();
        pool.free(a);
        pool.free(a);
    }
}
