//! Prefix caching over KV cache groups: the longest cached prefix a prompt can
//! start from (every block in full-attention groups, only the blocks the first
//! query after it sees in sliding-window groups), pinning it, and registering
//! computed full blocks under their (group, SHA-256 block hash) keys.

use super::block::BlockId;
use super::block_hash::BlockHash;
use super::block_table::BlockTable;
use super::events::KvEvent;
use super::manager::KvCacheManager;

/// The longest prefix of a prompt the prefix cache can serve in every group.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CachedPrefix {
    /// Leading token blocks whose KV need not be computed.
    pub num_blocks: usize,
    /// Per group: (leading logical blocks no query after the prefix sees,
    /// the cached blocks that follow them up to `num_blocks`). Full groups
    /// skip none.
    pub groups: Vec<(usize, Vec<BlockId>)>,
}

impl KvCacheManager {
    /// The longest prefix of `hashes`, at most `max_blocks` blocks, whose KV
    /// every group can serve from the cache: full-attention groups need
    /// every block of the prefix cached, sliding-window groups only the
    /// blocks the first query after it sees. Nothing is pinned yet.
    pub fn find_cached_prefix(&self, hashes: &[BlockHash], max_blocks: usize) -> CachedPrefix {
        let none = || CachedPrefix {
            num_blocks: 0,
            groups: vec![(0, Vec::new()); self.groups.len()],
        };
        if !self.enable_prefix_caching {
            return none();
        }
        let bs = self.block_size;
        let mut limit = max_blocks.min(hashes.len());
        for (g, spec) in self.groups.iter().enumerate() {
            if !spec.is_sliding() {
                limit = hashes[..limit]
                    .iter()
                    .take_while(|h| self.pool.lookup(g as u32, h).is_some())
                    .count();
            }
        }
        // runs[g][i]: cached blocks of sliding group g ending at block i.
        let runs: Vec<(usize, Vec<usize>)> = self
            .groups
            .iter()
            .enumerate()
            .filter(|(_, spec)| spec.is_sliding())
            .map(|(g, _)| {
                let mut run = 0;
                let ends = hashes[..limit]
                    .iter()
                    .map(|h| {
                        run = if self.pool.lookup(g as u32, h).is_some() {
                            run + 1
                        } else {
                            0
                        };
                        run
                    })
                    .collect();
                (g, ends)
            })
            .collect();
        let num_blocks = (0..=limit)
            .rev()
            .find(|&n| {
                n == 0
                    || runs.iter().all(|(g, ends)| {
                        ends[n - 1] >= n - self.groups[*g].num_skippable(n * bs, bs)
                    })
            })
            .unwrap_or(0);
        if num_blocks == 0 {
            return none();
        }
        let groups = self
            .groups
            .iter()
            .enumerate()
            .map(|(g, spec)| {
                let skipped = spec.num_skippable(num_blocks * bs, bs);
                let blocks = hashes[skipped..num_blocks]
                    .iter()
                    .map(|h| self.pool.lookup(g as u32, h).expect("cached"))
                    .collect();
                (skipped, blocks)
            })
            .collect();
        CachedPrefix { num_blocks, groups }
    }

    /// Free blocks that pinning `prefix` would take out of the free queue.
    pub fn num_free_among(&self, prefix: &CachedPrefix) -> usize {
        prefix
            .groups
            .iter()
            .flat_map(|(_, blocks)| blocks)
            .filter(|&&b| self.pool.ref_count(b) == 0)
            .count()
    }

    /// Pin the cached blocks of `prefix` (ref counts up) and make them the
    /// first blocks of the empty `tables`, after the skipped ones.
    pub fn take_cached_prefix(&mut self, tables: &mut [BlockTable], prefix: &CachedPrefix) {
        for (table, (skipped, blocks)) in tables.iter_mut().zip(&prefix.groups) {
            debug_assert!(table.is_empty());
            table.skip_to(*skipped);
            for &b in blocks {
                self.pool.incref(b);
                table.push(b);
            }
        }
    }

    /// Register the computed full blocks `[from, to)` of every group's table
    /// under `hashes[from..to]` (the blocks still held). `tokens` are the
    /// sequence's token ids (at least `to` blocks of them); with event
    /// recording on, each run of newly cached blocks of a group is recorded
    /// as one `Stored` event carrying the sequence's LoRA adapter
    /// (`lora_id`, 0 for the base model).
    pub fn cache_full_blocks(
        &mut self,
        tables: &[BlockTable],
        hashes: &[BlockHash],
        tokens: &[u32],
        (from, to): (usize, usize),
        lora_id: u64,
    ) {
        if !self.enable_prefix_caching {
            return;
        }
        let record = self.pool.events().is_enabled();
        let bs = self.block_size;
        for (g, table) in tables.iter().enumerate() {
            let to = to.min(hashes.len()).min(table.len());
            let from = from.max(table.num_skipped());
            if from >= to {
                continue;
            }
            // The run of newly cached blocks being recorded: its first block.
            let mut run: Option<usize> = None;
            for i in from..=to {
                let stored = i < to && self.pool.register(table.blocks()[i], g as u32, hashes[i]);
                if !record {
                    continue;
                }
                match (stored, run) {
                    (true, None) => run = Some(i),
                    (false, Some(start)) => {
                        self.pool.events_mut().push(KvEvent::Stored {
                            group: g as u32,
                            block_hashes: hashes[start..i].to_vec(),
                            parent_block_hash: start.checked_sub(1).map(|p| hashes[p]),
                            token_ids: tokens[start * bs..i * bs].to_vec(),
                            lora_id: (lora_id != 0).then_some(lora_id),
                        });
                        run = None;
                    }
                    _ => {}
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kv_cache::KvCacheGroupSpec;

    fn hybrid(num_blocks: usize) -> KvCacheManager {
        let groups = vec![KvCacheGroupSpec::FULL, KvCacheGroupSpec::sliding(8)];
        KvCacheManager::new(num_blocks, 8, 4, true, groups)
    }

    #[test]
    fn prefix_hit_needs_only_the_window_in_sliding_groups() {
        let mut m = hybrid(64);
        let hashes: Vec<BlockHash> = (0..8u8).map(|i| [i; 32]).collect();
        let mut a = m.new_tables();
        assert!(m.allocate_slots(&mut a, 0, 32, &mut vec![]));
        m.cache_full_blocks(&a, &hashes, &[0; 32], (0, 8), 0);
        let sliding = a[1].blocks().to_vec();
        m.release_skipped(&mut a, 32);
        // Sliding blocks 0..6 were released (the query at 32 sees 25..=32),
        // still cached and evictable.
        assert_eq!(a[1].num_skipped(), 6);
        let p = m.find_cached_prefix(&hashes, 7);
        assert_eq!(p.num_blocks, 7);
        assert_eq!(p.groups[0].1.len(), 7);
        // The query at 28 sees 21..=28: sliding blocks 5 and 6.
        assert_eq!(p.groups[1].0, 5);
        assert_eq!(p.groups[1].1, sliding[5..7].to_vec());
        let mut b = m.new_tables();
        m.take_cached_prefix(&mut b, &p);
        assert_eq!((b[1].len(), b[1].num_live()), (7, 2));
        m.free(&mut b);
        m.free(&mut a);
        // Every block is free (and still cached): the whole prompt hits.
        assert_eq!(m.pool().num_free(), 64);
        assert_eq!(m.find_cached_prefix(&hashes, 8).num_blocks, 8);
        // Evict sliding block 6 (cached under group 1): a hit of 7 or 8 blocks
        // needs it, one of 6 blocks (query 24 sees 17..=24: blocks 4, 5) does not.
        let mut c = m.new_tables();
        while m.pool().lookup(1, &hashes[6]).is_some() {
            let n = c[0].len() * 4;
            assert!(m.allocate_slots(&mut c, n, n + 4, &mut vec![]));
        }
        let p = m.find_cached_prefix(&hashes, 8);
        assert!(p.num_blocks <= 6, "{p:?}");
        m.free(&mut c);
    }
}
