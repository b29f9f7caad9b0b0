//! Physical KV block pool: reference counts, the free block queue, and the
//! prefix cache ((KV cache group, block hash) -> block).
//!
//! Paper §4.2-4.4: the KV cache is split into fixed-size physical blocks; each
//! carries a reference count so several block tables can point at it. A block
//! whose count drops to zero goes to the tail of the free block queue; if it
//! holds a cached prefix it stays findable by its hash until the pool hands it
//! out again (eviction, least recently used first).

use rustc_hash::FxHashMap;

use super::block::BlockId;
use super::block_hash::BlockHash;
use super::events::{KvEvent, KvEventLog};
use super::free_queue::FreeQueue;

/// What names a cached block: its KV cache group and the hash of its tokens
/// (every group caches the same token block in blocks of its own).
pub type CacheKey = (u32, BlockHash);

/// A fixed-size pool of physical blocks.
#[derive(Debug, Clone)]
pub struct BlockPool {
    ref_counts: Vec<u32>,
    free_queue: FreeQueue,
    block_hashes: Vec<Option<CacheKey>>,
    /// Keys are SHA-256 outputs, so a fast non-keyed hasher spreads them.
    cached: FxHashMap<CacheKey, BlockId>,
    num_evictions: u64,
    events: KvEventLog,
}

impl BlockPool {
    /// A pool of `num_blocks` free blocks, handed out in index order.
    pub fn new(num_blocks: usize) -> Self {
        Self {
            ref_counts: vec![0; num_blocks],
            free_queue: FreeQueue::new(num_blocks),
            block_hashes: vec![None; num_blocks],
            cached: FxHashMap::default(),
            num_evictions: 0,
            events: KvEventLog::default(),
        }
    }

    /// Total number of physical blocks.
    pub fn num_total(&self) -> usize {
        self.ref_counts.len()
    }

    /// Blocks with ref count zero (cached or not): what `allocate` can hand out.
    pub fn num_free(&self) -> usize {
        self.free_queue.len()
    }

    /// Blocks that hold a cached prefix (in use or free).
    pub fn num_cached(&self) -> usize {
        self.cached.len()
    }

    /// Cached blocks evicted so far to serve allocations.
    pub fn num_evictions(&self) -> u64 {
        self.num_evictions
    }

    /// Reference count of `block` (0 when free).
    pub fn ref_count(&self, block: BlockId) -> u32 {
        self.ref_counts[block as usize]
    }

    /// Take the least recently freed block with ref count 1, evicting its
    /// cached prefix if it had one. `None` when every block is in use.
    pub fn allocate(&mut self) -> Option<BlockId> {
        let block = self.free_queue.pop_front()?;
        debug_assert_eq!(self.ref_counts[block as usize], 0);
        self.evict(block);
        self.ref_counts[block as usize] = 1;
        Some(block)
    }

    /// First block of the lowest run of `len` consecutive free block ids
    /// (first fit), or `None` when no free run is that long. `len` 0 fits at 0.
    /// One pass over the ref counts (contiguous reservation only; the paged
    /// path never calls it).
    pub fn find_free_run(&self, len: usize) -> Option<BlockId> {
        if len == 0 {
            return Some(0);
        }
        let mut run = 0;
        for (i, &rc) in self.ref_counts.iter().enumerate() {
            if rc == 0 {
                run += 1;
                if run == len {
                    return Some((i + 1 - len) as BlockId);
                }
            } else {
                run = 0;
            }
        }
        None
    }

    /// Take the free block `block` (ref count 0 -> 1), evicting its cached
    /// prefix if it had one: `allocate` for a chosen block id.
    ///
    /// # Panics
    /// If the block is in use.
    pub fn take_free(&mut self, block: BlockId) {
        assert_eq!(
            self.ref_counts[block as usize], 0,
            "block {block} is in use"
        );
        self.free_queue.remove(block);
        self.evict(block);
        self.ref_counts[block as usize] = 1;
    }

    /// Drop the cached prefix of the free block `block`, if it had one.
    fn evict(&mut self, block: BlockId) {
        if let Some(key) = self.block_hashes[block as usize].take() {
            self.cached.remove(&key);
            self.num_evictions += 1;
            self.events.push(KvEvent::Removed {
                group: key.0,
                block_hashes: vec![key.1],
            });
        }
    }

    /// Forget every cached prefix (vLLM's `reset_prefix_cache`), recording
    /// `AllCleared`. Only when no block is in use: returns false (and
    /// changes nothing) otherwise. Forgotten blocks do not count as
    /// evictions.
    pub fn clear_cache(&mut self) -> bool {
        if self.num_free() != self.num_total() {
            return false;
        }
        self.cached.clear();
        self.block_hashes.fill(None);
        self.events.push(KvEvent::AllCleared);
        true
    }

    /// The event log of this pool's prefix cache.
    pub fn events(&self) -> &KvEventLog {
        &self.events
    }

    /// The event log, to record into, enable or drain.
    pub fn events_mut(&mut self) -> &mut KvEventLog {
        &mut self.events
    }

    /// Add one reference (fork, or a prefix-cache hit). A free cached block is
    /// taken out of the free queue first, so nothing can evict it while used.
    pub fn incref(&mut self, block: BlockId) {
        let rc = &mut self.ref_counts[block as usize];
        if *rc == 0 {
            self.free_queue.remove(block);
        }
        *rc += 1;
    }

    /// Drop one reference; at zero the block goes to the tail of the free queue
    /// (keeping its cached prefix, if any).
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

    /// The (group, hash) key `block` is cached under, if any.
    pub fn cached_key(&self, block: BlockId) -> Option<CacheKey> {
        self.block_hashes[block as usize]
    }

    /// Every cached (group, hash) key, in no particular order.
    pub fn cached_keys(&self) -> impl Iterator<Item = &CacheKey> {
        self.cached.keys()
    }

    /// The block of KV cache group `group` caching prefix `hash`, if any.
    #[inline]
    pub fn lookup(&self, group: u32, hash: &BlockHash) -> Option<BlockId> {
        self.cached.get(&(group, *hash)).copied()
    }

    /// Name a full, computed block of `group` by its hash so later requests
    /// can reuse it. A key already cached by another block keeps that block.
    /// Returns whether the key is new (the caller records `Stored`).
    pub fn register(&mut self, block: BlockId, group: u32, hash: BlockHash) -> bool {
        if self.block_hashes[block as usize].is_some() {
            return false;
        }
        let key = (group, hash);
        if let std::collections::hash_map::Entry::Vacant(e) = self.cached.entry(key) {
            e.insert(block);
            self.block_hashes[block as usize] = Some(key);
            return true;
        }
        false
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

    #[test]
    fn first_fit_free_run() {
        let mut pool = BlockPool::new(8);
        for b in [1, 2, 5] {
            pool.take_free(b);
        }
        // Free runs: [0], [3, 4], [6, 7].
        assert_eq!(pool.find_free_run(1), Some(0));
        assert_eq!(pool.find_free_run(2), Some(3));
        assert_eq!(pool.find_free_run(3), None);
        assert_eq!(pool.num_free(), 5);
        pool.take_free(3);
        assert_eq!(pool.find_free_run(2), Some(6));
        pool.free(2);
        assert_eq!(pool.find_free_run(1), Some(0));
        assert_eq!(pool.find_free_run(3), None);
        pool.free(1);
        assert_eq!(pool.find_free_run(3), Some(0));
    }

    #[test]
    fn cached_free_blocks_are_evicted_lru_and_pinned_on_hit() {
        let mut pool = BlockPool::new(3);
        let blocks: Vec<_> = (0..3).map(|_| pool.allocate().unwrap()).collect();
        for (i, &b) in blocks.iter().enumerate() {
            pool.register(b, 0, [i as u8; 32]);
        }
        for &b in &blocks {
            pool.free(b);
        }
        assert_eq!((pool.num_free(), pool.num_cached()), (3, 3));
        // A hit on block 0 pins it: it leaves the free queue.
        let hit = pool.lookup(0, &[0; 32]).unwrap();
        pool.incref(hit);
        assert_eq!(pool.num_free(), 2);
        // Allocation evicts the least recently freed cached block (1, then 2).
        assert_eq!(pool.allocate(), Some(1));
        assert!(pool.lookup(0, &[1; 32]).is_none());
        assert_eq!(pool.allocate(), Some(2));
        assert_eq!(pool.allocate(), None, "the pinned block is never evicted");
        assert_eq!(pool.num_evictions(), 2);
    }
}
