//! KV cache manager: grows block tables on demand, shares blocks by reference
//! count (fork, prefix caching) with copy-on-write, releases the blocks that
//! fall behind a sliding window, and swaps block tables between the device
//! pool and the CPU pool. Prefix lookup and registration are in `prefix_cache.rs`.
//!
//! A sequence holds one block table per KV cache group (`tables[g]` for
//! `groups()[g]`); every operation here takes all of them and is
//! all-or-nothing over the groups. One pool serves every group: a block
//! released by a sliding-window group can serve any group's next block.

use super::block::{blocks_for, BlockId};
use super::block_pool::BlockPool;
use super::block_table::BlockTable;
use super::events::KvEvent;
use super::group::KvCacheGroupSpec;

/// A (source, destination) block pair for the executor to copy.
pub type BlockCopy = (BlockId, BlockId);

/// Owns the device and CPU block pools.
#[derive(Debug, Clone)]
pub struct KvCacheManager {
    pub(super) pool: BlockPool,
    cpu_pool: BlockPool,
    pub(super) block_size: usize,
    pub(super) enable_prefix_caching: bool,
    pub(super) groups: Vec<KvCacheGroupSpec>,
    has_sliding: bool,
}

impl KvCacheManager {
    /// A manager over `num_blocks` device blocks and `num_cpu_blocks` CPU
    /// (swap) blocks of `block_size` tokens each, shared by the KV cache
    /// `groups` (at least one).
    pub fn new(
        num_blocks: usize,
        num_cpu_blocks: usize,
        block_size: usize,
        enable_prefix_caching: bool,
        groups: Vec<KvCacheGroupSpec>,
    ) -> Self {
        assert!(block_size > 0, "block_size must be positive");
        assert!(!groups.is_empty(), "at least one KV cache group");
        Self {
            pool: BlockPool::new(num_blocks),
            cpu_pool: BlockPool::new(num_cpu_blocks),
            block_size,
            enable_prefix_caching,
            has_sliding: groups.iter().any(KvCacheGroupSpec::is_sliding),
            groups,
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

    /// The KV cache groups, in the order of a sequence's block tables.
    pub fn groups(&self) -> &[KvCacheGroupSpec] {
        &self.groups
    }

    /// True when some group has a sliding window (blocks can be released
    /// before their sequence ends).
    #[inline]
    pub fn has_sliding(&self) -> bool {
        self.has_sliding
    }

    /// Empty block tables, one per group: a new sequence's.
    pub fn new_tables(&self) -> Vec<BlockTable> {
        vec![BlockTable::default(); self.groups.len()]
    }

    /// The device block pool (read only).
    pub fn pool(&self) -> &BlockPool {
        &self.pool
    }

    /// The CPU swap pool (read only).
    pub fn cpu_pool(&self) -> &BlockPool {
        &self.cpu_pool
    }

    /// Record (or stop recording) the device pool's prefix-cache events.
    /// The CPU swap pool caches no prefixes, so it has none.
    pub fn set_kv_events(&mut self, enabled: bool) {
        self.pool.events_mut().set_enabled(enabled);
    }

    /// The device pool's events since the last call, oldest first.
    pub fn take_kv_events(&mut self) -> Vec<KvEvent> {
        self.pool.events_mut().take()
    }

    /// Forget every cached prefix of the device pool when no block is in
    /// use (records `AllCleared`); false, changing nothing, otherwise.
    pub fn reset_prefix_cache(&mut self) -> bool {
        self.pool.clear_cache()
    }

    /// Most blocks a sequence of `num_tokens` tokens holds at once over all
    /// groups while steps compute at most `max_chunk` of its tokens (a
    /// sliding-window group holds a whole chunk during its step).
    pub fn peak_blocks(&self, num_tokens: usize, max_chunk: usize) -> usize {
        self.groups
            .iter()
            .map(|g| g.max_blocks_per_seq(num_tokens, max_chunk.min(num_tokens), self.block_size))
            .sum()
    }

    /// Release, in every sliding-window group, the leading blocks no query
    /// at position `first_query` or later can see (they go to the free
    /// queue, still findable by their hash until evicted). Nothing to do
    /// without sliding-window groups.
    #[inline]
    pub fn release_skipped(&mut self, tables: &mut [BlockTable], first_query: usize) {
        if !self.has_sliding {
            return;
        }
        for (g, table) in self.groups.iter().zip(tables.iter_mut()) {
            let n = g.num_skippable(first_query, self.block_size);
            for block in table.skip_to(n) {
                self.pool.free(block);
            }
        }
    }

    /// Make `tables` cover `num_tokens` slots when their first
    /// `num_computed` slots already hold KV states. Blocks no query of the
    /// step can see are released first (in sliding-window groups). Missing
    /// blocks are allocated; a block that will be written while shared (ref
    /// count > 1) is first copied (copy-on-write), the pair pushed to
    /// `copies`. All-or-nothing beyond the release: returns false and
    /// allocates nothing when the free queue holds too few blocks.
    pub fn allocate_slots(
        &mut self,
        tables: &mut [BlockTable],
        num_computed: usize,
        num_tokens: usize,
        copies: &mut Vec<BlockCopy>,
    ) -> bool {
        self.release_skipped(tables, num_computed);
        let bs = self.block_size;
        let first_written = |t: &BlockTable| (num_computed / bs).max(t.num_skipped()).min(t.len());
        let want = blocks_for(num_tokens, bs);
        let mut need = 0;
        let mut any_shared = false;
        for table in tables.iter() {
            if num_computed < num_tokens {
                let shared = table.blocks()[first_written(table)..]
                    .iter()
                    .filter(|&&b| self.pool.ref_count(b) > 1)
                    .count();
                any_shared |= shared > 0;
                need += shared;
            }
            need += want.saturating_sub(table.len());
        }
        if need == 0 {
            return true; // the common decode step: room in the last block
        }
        if need > self.pool.num_free() {
            return false;
        }
        for table in tables.iter_mut() {
            if any_shared {
                for i in first_written(table)..table.len() {
                    let src = table.blocks()[i];
                    if self.pool.ref_count(src) > 1 {
                        let dst = self.pool.allocate().expect("checked free count");
                        copies.push((src, dst));
                        table.set(i, dst);
                        self.pool.free(src);
                    }
                }
            }
            for _ in table.len()..want {
                let block = self.pool.allocate().expect("checked free count");
                table.push(block);
            }
        }
        true
    }

    /// Give empty `tables` (one full-attention group) one contiguous run of
    /// `num_blocks` free blocks, the lowest that fits (first fit): the
    /// contiguous reservation of the Orca-style policies. All-or-nothing:
    /// false, nothing taken, when no free run is long enough, however many
    /// blocks are free in total.
    pub fn reserve_contiguous(&mut self, tables: &mut [BlockTable], num_blocks: usize) -> bool {
        debug_assert!(tables.len() == 1 && tables[0].is_empty());
        let Some(start) = self.pool.find_free_run(num_blocks) else {
            return false;
        };
        for b in start..start + num_blocks as BlockId {
            self.pool.take_free(b);
            tables[0].push(b);
        }
        true
    }

    /// New tables sharing every block of `tables` (ref counts up; no copy).
    pub fn fork(&mut self, tables: &[BlockTable]) -> Vec<BlockTable> {
        for table in tables {
            for &b in table.live() {
                self.pool.incref(b);
            }
        }
        tables.to_vec()
    }

    /// Give back the blocks of `tables` past the first `num_tokens` slots,
    /// last block first (rejected draft tokens: a block holding only them
    /// returns to the free queue).
    pub fn truncate(&mut self, tables: &mut [BlockTable], num_tokens: usize) {
        let keep = blocks_for(num_tokens, self.block_size);
        for table in tables.iter_mut() {
            for block in table.truncate(keep).into_iter().rev() {
                self.pool.free(block);
            }
        }
    }

    /// Release every block of `tables`, last block first, so a request's
    /// tail blocks are evicted before its prefix.
    pub fn free(&mut self, tables: &mut [BlockTable]) {
        for table in tables.iter_mut() {
            for block in table.take().into_iter().rev() {
                self.pool.free(block);
            }
        }
    }

    /// Blocks held in `tables` (the live entries of every group).
    pub fn num_live(tables: &[BlockTable]) -> usize {
        tables.iter().map(BlockTable::num_live).sum()
    }

    /// Move `tables` to the CPU pool: pushes (device, cpu) pairs to `swaps`
    /// and frees the device blocks. All-or-nothing: false when the CPU pool
    /// is short.
    pub fn swap_out(&mut self, tables: &mut [BlockTable], swaps: &mut Vec<BlockCopy>) -> bool {
        if Self::num_live(tables) > self.cpu_pool.num_free() {
            return false;
        }
        for table in tables.iter_mut() {
            let moved = Self::move_blocks(table, &mut self.cpu_pool, swaps);
            for &gpu in moved.iter().rev() {
                self.pool.free(gpu);
            }
        }
        true
    }

    /// Point every held entry of `table` at a new block of `to`, pushing the
    /// (old, new) pairs to `swaps`; returns the old blocks in logical order.
    fn move_blocks(
        table: &mut BlockTable,
        to: &mut BlockPool,
        swaps: &mut Vec<BlockCopy>,
    ) -> Vec<BlockId> {
        let old = table.live().to_vec();
        for (i, &from) in (table.num_skipped()..).zip(&old) {
            let block = to.allocate().expect("checked free count");
            swaps.push((from, block));
            table.set(i, block);
        }
        old
    }

    /// Whether the device pool can take back swapped-out `tables` plus
    /// `extra_blocks` new blocks.
    pub fn can_swap_in(&self, tables: &[BlockTable], extra_blocks: usize) -> bool {
        Self::num_live(tables) + extra_blocks <= self.pool.num_free()
    }

    /// Bring swapped-out `tables` back to the device pool: pushes (cpu,
    /// device) pairs to `swaps`. All-or-nothing.
    pub fn swap_in(&mut self, tables: &mut [BlockTable], swaps: &mut Vec<BlockCopy>) -> bool {
        if !self.can_swap_in(tables, 0) {
            return false;
        }
        for table in tables.iter_mut() {
            for cpu in Self::move_blocks(table, &mut self.pool, swaps) {
                self.cpu_pool.free(cpu);
            }
        }
        true
    }

    /// Release every block of swapped-out `tables` (abort while swapped).
    pub fn free_swapped(&mut self, tables: &mut [BlockTable]) {
        for table in tables.iter_mut() {
            for block in table.take() {
                self.cpu_pool.free(block);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kv_cache::NULL_BLOCK;

    fn full(num_blocks: usize, num_cpu: usize, bs: usize) -> KvCacheManager {
        KvCacheManager::new(num_blocks, num_cpu, bs, false, vec![KvCacheGroupSpec::FULL])
    }

    #[test]
    fn allocates_on_demand() {
        let mut m = full(4, 0, 16);
        let mut t = m.new_tables();
        let mut copies = vec![];
        assert!(m.allocate_slots(&mut t, 0, 1, &mut copies));
        assert_eq!(t[0].len(), 1);
        assert!(m.allocate_slots(&mut t, 1, 16, &mut copies));
        assert_eq!(t[0].len(), 1);
        assert!(m.allocate_slots(&mut t, 16, 17, &mut copies));
        assert_eq!(t[0].len(), 2);
        assert_eq!(t[0].slot(16, 16), t[0].blocks()[1] as i64 * 16);
        assert!(
            !m.allocate_slots(&mut t, 17, 16 * 5, &mut copies),
            "all or nothing"
        );
        assert_eq!(t[0].len(), 2);
        assert!(copies.is_empty());
        m.free(&mut t);
        assert_eq!(m.pool().num_free(), 4);
    }

    #[test]
    fn fork_shares_then_copies_on_write() {
        let mut m = full(8, 0, 4);
        let mut parent = m.new_tables();
        let mut copies = vec![];
        assert!(m.allocate_slots(&mut parent, 0, 6, &mut copies)); // 2 blocks, last partial
        let mut child = m.fork(&parent);
        assert_eq!(m.pool().num_free(), 6, "fork copies nothing");
        assert_eq!(m.pool().ref_count(parent[0].blocks()[1]), 2);
        // Parent writes slot 6: the shared partial block is copied first.
        assert!(m.allocate_slots(&mut parent, 6, 7, &mut copies));
        assert_eq!(copies, vec![(child[0].blocks()[1], parent[0].blocks()[1])]);
        assert_eq!(
            parent[0].blocks()[0],
            child[0].blocks()[0],
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
        let mut m = full(10, 0, 1);
        let mut tables: Vec<Vec<BlockTable>> = (0..3).map(|_| m.new_tables()).collect();
        for (t, n) in tables.iter_mut().zip([4, 3, 3]) {
            assert!(m.reserve_contiguous(t, n));
        }
        assert_eq!(tables[1][0].blocks(), &[4, 5, 6]);
        m.free(&mut tables[0]);
        m.free(&mut tables[2]);
        // 7 blocks free, in runs of 4 and 3: a 5-block reservation fails.
        let mut t = m.new_tables();
        assert!(!m.reserve_contiguous(&mut t, 5));
        assert!(t[0].is_empty());
        assert_eq!(m.pool().num_free(), 7);
        assert!(m.reserve_contiguous(&mut t, 3));
        assert_eq!(t[0].blocks(), &[0, 1, 2], "lowest run that fits");
    }

    #[test]
    fn swap_out_and_in_round_trip() {
        let mut m = full(4, 4, 4);
        let mut t = m.new_tables();
        assert!(m.allocate_slots(&mut t, 0, 8, &mut vec![]));
        let gpu = t[0].blocks().to_vec();
        let mut swaps = vec![];
        assert!(m.swap_out(&mut t, &mut swaps));
        assert_eq!(swaps.iter().map(|s| s.0).collect::<Vec<_>>(), gpu);
        assert_eq!((m.pool().num_free(), m.cpu_pool().num_free()), (4, 2));
        swaps.clear();
        assert!(m.swap_in(&mut t, &mut swaps));
        assert_eq!(swaps.len(), 2);
        assert_eq!((m.pool().num_free(), m.cpu_pool().num_free()), (2, 4));
    }

    fn hybrid(num_blocks: usize) -> KvCacheManager {
        let groups = vec![KvCacheGroupSpec::FULL, KvCacheGroupSpec::sliding(8)];
        KvCacheManager::new(num_blocks, 8, 4, false, groups)
    }

    #[test]
    fn sliding_group_holds_only_its_window() {
        let mut m = hybrid(32);
        let mut t = m.new_tables();
        // A 16-token chunk: every block of both groups is needed by some query.
        assert!(m.allocate_slots(&mut t, 0, 16, &mut vec![]));
        assert_eq!((t[0].num_live(), t[1].num_live()), (4, 4));
        // After it, the next query (16) sees 9..=16: blocks 0 and 1 go.
        m.release_skipped(&mut t, 16);
        assert_eq!((t[0].num_live(), t[1].num_live()), (4, 2));
        assert_eq!(t[1].blocks()[..2], [NULL_BLOCK, NULL_BLOCK]);
        assert_eq!(m.pool().num_free(), 32 - 6);
        // Decode 16..=40: the sliding group never holds more than 3 blocks.
        for pos in 16..40 {
            assert!(m.allocate_slots(&mut t, pos, pos + 1, &mut vec![]));
            assert!(t[1].num_live() <= 3, "pos {pos}: {:?}", t[1]);
            m.release_skipped(&mut t, pos + 1);
        }
        assert_eq!(t[0].num_live(), 10);
        // Swap keeps the released entries released.
        let mut swaps = vec![];
        let live = KvCacheManager::num_live(&t);
        assert!(!m.swap_out(&mut t, &mut swaps), "CPU pool of 8 < {live}");
        m.free(&mut t);
        assert_eq!(m.pool().num_free(), 32);
    }
}
