//! KV cache manager: grows block tables on demand, shares blocks by reference
//! count (fork, prefix caching) with copy-on-write, and swaps block tables
//! between the device pool and the CPU pool.

use super::block_hash::BlockHash;
use super::block_pool::{BlockId, BlockPool};
use super::block_table::BlockTable;

/// A (source, destination) block pair for the executor to copy.
pub type BlockCopy = (BlockId, BlockId);

/// Number of blocks needed to hold `num_tokens` token states.
#[inline]
pub fn blocks_for(num_tokens: usize, block_size: usize) -> usize {
    num_tokens.div_ceil(block_size)
}

/// Owns the device and CPU block pools.
#[derive(Debug, Clone)]
pub struct KvCacheManager {
    pool: BlockPool,
    cpu_pool: BlockPool,
    block_size: usize,
    enable_prefix_caching: bool,
}

impl KvCacheManager {
    /// A manager over `num_blocks` device blocks and `num_cpu_blocks` CPU
    /// (swap) blocks of `block_size` tokens each.
    pub fn new(
        num_blocks: usize,
        num_cpu_blocks: usize,
        block_size: usize,
        enable_prefix_caching: bool,
    ) -> Self {
        assert!(block_size > 0, "block_size must be positive");
        Self {
            pool: BlockPool::new(num_blocks),
            cpu_pool: BlockPool::new(num_cpu_blocks),
            block_size,
            enable_prefix_caching,
        }
    }

    /// Tokens per block.
    pub fn block_size(&self) -> usize {
        self.block_size
    }

    /// Whether full blocks are named by hash and reused.
    pub fn prefix_caching(&self) -> bool {
        self.enable_prefix_caching
    }

    /// The device block pool (read only).
    pub fn pool(&self) -> &BlockPool {
        &self.pool
    }

    /// The CPU swap pool (read only).
    pub fn cpu_pool(&self) -> &BlockPool {
        &self.cpu_pool
    }

    /// Make `table` cover `num_tokens` slots when its first `num_computed`
    /// slots already hold KV states. Missing blocks are allocated; a block
    /// that will be written while shared (ref count > 1) is first copied
    /// (copy-on-write), the pair pushed to `copies`. All-or-nothing: returns
    /// false and changes nothing when the free queue holds too few blocks.
    pub fn allocate_slots(
        &mut self,
        table: &mut BlockTable,
        num_computed: usize,
        num_tokens: usize,
        copies: &mut Vec<BlockCopy>,
    ) -> bool {
        let bs = self.block_size;
        let first_written = num_computed / bs;
        let shared = (first_written..table.len())
            .filter(|&i| num_computed < num_tokens && self.pool.ref_count(table.blocks()[i]) > 1)
            .count();
        let new = blocks_for(num_tokens, bs).saturating_sub(table.len());
        if new + shared > self.pool.num_free() {
            return false;
        }
        if shared > 0 {
            for i in first_written..table.len() {
                let src = table.blocks()[i];
                if self.pool.ref_count(src) > 1 {
                    let dst = self.pool.allocate().expect("checked free count");
                    copies.push((src, dst));
                    table.set(i, dst);
                    self.pool.free(src);
                }
            }
        }
        for _ in 0..new {
            let block = self.pool.allocate().expect("checked free count");
            table.push(block);
        }
        true
    }

    /// Give an empty `table` one contiguous run of `num_blocks` free blocks,
    /// the lowest that fits (first fit): the contiguous reservation of the
    /// Orca-style policies. All-or-nothing: false, nothing taken, when no
    /// free run is long enough, however many blocks are free in total.
    pub fn reserve_contiguous(&mut self, table: &mut BlockTable, num_blocks: usize) -> bool {
        debug_assert!(table.is_empty());
        let Some(start) = self.pool.find_free_run(num_blocks) else {
            return false;
        };
        for b in start..start + num_blocks as BlockId {
            self.pool.take_free(b);
            table.push(b);
        }
        true
    }

    /// The longest run of cached blocks naming `hashes`' prefix, at most
    /// `max_blocks` long. Nothing is pinned yet.
    pub fn find_cached_prefix(&self, hashes: &[BlockHash], max_blocks: usize) -> Vec<BlockId> {
        if !self.enable_prefix_caching {
            return Vec::new();
        }
        hashes
            .iter()
            .take(max_blocks)
            .map_while(|h| self.pool.lookup(h))
            .collect()
    }

    /// Free blocks that pinning `blocks` would take out of the free queue.
    pub fn num_free_among(&self, blocks: &[BlockId]) -> usize {
        blocks
            .iter()
            .filter(|&&b| self.pool.ref_count(b) == 0)
            .count()
    }

    /// Pin cached `blocks` (ref counts up) and make them `table`'s first blocks.
    pub fn take_cached_prefix(&mut self, table: &mut BlockTable, blocks: &[BlockId]) {
        debug_assert!(table.is_empty());
        for &b in blocks {
            self.pool.incref(b);
            table.push(b);
        }
    }

    /// Register the computed full blocks `table[from..to]` under `hashes[from..to]`.
    pub fn cache_full_blocks(
        &mut self,
        table: &BlockTable,
        hashes: &[BlockHash],
        from: usize,
        to: usize,
    ) {
        if !self.enable_prefix_caching {
            return;
        }
        let to = to.min(hashes.len()).min(table.len());
        if from >= to {
            return;
        }
        for (&block, &hash) in table.blocks()[from..to].iter().zip(&hashes[from..to]) {
            self.pool.register(block, hash);
        }
    }

    /// A new table sharing every block of `table` (ref counts up; no copy).
    pub fn fork(&mut self, table: &BlockTable) -> BlockTable {
        for &b in table.blocks() {
            self.pool.incref(b);
        }
        table.clone()
    }

    /// Release every block of `table`, last block first, so a request's tail
    /// blocks are evicted before its prefix.
    pub fn free(&mut self, table: &mut BlockTable) {
        for block in table.take().into_iter().rev() {
            self.pool.free(block);
        }
    }

    /// Move `table` to the CPU pool: pushes (device, cpu) pairs to `swaps` and
    /// frees the device blocks. All-or-nothing: false when the CPU pool is short.
    pub fn swap_out(&mut self, table: &mut BlockTable, swaps: &mut Vec<BlockCopy>) -> bool {
        if table.len() > self.cpu_pool.num_free() {
            return false;
        }
        let blocks = table.take();
        for &gpu in &blocks {
            let cpu = self.cpu_pool.allocate().expect("checked free count");
            swaps.push((gpu, cpu));
            table.push(cpu);
        }
        for &gpu in blocks.iter().rev() {
            self.pool.free(gpu);
        }
        true
    }

    /// Device blocks a swapped-out `table` needs to come back.
    pub fn can_swap_in(&self, table: &BlockTable, extra_blocks: usize) -> bool {
        table.len() + extra_blocks <= self.pool.num_free()
    }

    /// Bring a swapped-out `table` back to the device pool: pushes
    /// (cpu, device) pairs to `swaps`. All-or-nothing.
    pub fn swap_in(&mut self, table: &mut BlockTable, swaps: &mut Vec<BlockCopy>) -> bool {
        if !self.can_swap_in(table, 0) {
            return false;
        }
        let blocks = table.take();
        for &cpu in &blocks {
            let gpu = self.pool.allocate().expect("checked free count");
            swaps.push((cpu, gpu));
            table.push(gpu);
        }
        for &cpu in &blocks {
            self.cpu_pool.free(cpu);
        }
        true
    }

    /// Release every block of a swapped-out `table` (abort while swapped).
    pub fn free_swapped(&mut self, table: &mut BlockTable) {
        for block in table.take() {
            self.cpu_pool.free(block);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn allocates_on_demand() {
        let mut m = KvCacheManager::new(4, 0, 16, false);
        let mut t = BlockTable::default();
        let mut copies = vec![];
        assert!(m.allocate_slots(&mut t, 0, 1, &mut copies));
        assert_eq!(t.len(), 1);
        assert!(m.allocate_slots(&mut t, 1, 16, &mut copies));
        assert_eq!(t.len(), 1);
        assert!(m.allocate_slots(&mut t, 16, 17, &mut copies));
        assert_eq!(t.len(), 2);
        assert_eq!(t.slot(16, 16), t.blocks()[1] as i64 * 16);
        assert!(
            !m.allocate_slots(&mut t, 17, 16 * 5, &mut copies),
            "all or nothing"
        );
        assert_eq!(t.len(), 2);
        assert!(copies.is_empty());
        m.free(&mut t);
        assert_eq!(m.pool().num_free(), 4);
    }

    #[test]
    fn fork_shares_then_copies_on_write() {
        let mut m = KvCacheManager::new(8, 0, 4, false);
        let mut parent = BlockTable::default();
        let mut copies = vec![];
        assert!(m.allocate_slots(&mut parent, 0, 6, &mut copies)); // 2 blocks, last partial
        let mut child = m.fork(&parent);
        assert_eq!(m.pool().num_free(), 6, "fork copies nothing");
        assert_eq!(m.pool().ref_count(parent.blocks()[1]), 2);
        // Parent writes slot 6: the shared partial block is copied first.
        assert!(m.allocate_slots(&mut parent, 6, 7, &mut copies));
        assert_eq!(copies, vec![(child.blocks()[1], parent.blocks()[1])]);
        assert_eq!(
            parent.blocks()[0],
            child.blocks()[0],
            "full blocks stay shared"
        );
        // The child now holds the original alone and writes in place.
        copies.clear();
        assert!(m.allocate_slots(&mut child, 6, 7, &mut copies));
        assert!(copies.is_empty());
        m.free(&mut parent);
        m.free(&mut child);
        assert_eq!(m.pool().num_free(), 8);
    }

    #[test]
    fn contiguous_reservation_is_first_fit_and_all_or_nothing() {
        let mut m = KvCacheManager::new(10, 0, 1, false);
        let mut tables: Vec<BlockTable> = (0..3).map(|_| BlockTable::default()).collect();
        for (t, n) in tables.iter_mut().zip([4, 3, 3]) {
            assert!(m.reserve_contiguous(t, n));
        }
        assert_eq!(tables[1].blocks(), &[4, 5, 6]);
        m.free(&mut tables[0]);
        m.free(&mut tables[2]);
        // 7 blocks free, in runs of 4 and 3: a 5-block reservation fails.
        let mut t = BlockTable::default();
        assert!(!m.reserve_contiguous(&mut t, 5));
        assert!(t.is_empty());
        assert_eq!(m.pool().num_free(), 7);
        assert!(m.reserve_contiguous(&mut t, 3));
        assert_eq!(t.blocks(), &[0, 1, 2], "lowest run that fits");
    }

    #[test]
    fn swap_out_and_in_round_trip() {
        let mut m = KvCacheManager::new(4, 4, 4, false);
        let mut t = BlockTable::default();
        assert!(m.allocate_slots(&mut t, 0, 8, &mut vec![]));
        let gpu = t.blocks().to_vec();
        let mut swaps = vec![];
        assert!(m.swap_out(&mut t, &mut swaps));
        assert_eq!(swaps.iter().map(|s| s.0).collect::<Vec<_>>(), gpu);
        assert_eq!((m.pool().num_free(), m.cpu_pool().num_free()), (4, 2));
        swaps.clear();
        assert!(m.swap_in(&mut t, &mut swaps));
        assert_eq!(swaps.len(), 2);
        assert_eq!((m.pool().num_free(), m.cpu_pool().num_free()), (2, 4));
    }
}
