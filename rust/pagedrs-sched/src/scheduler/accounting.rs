//! Memory accounting: where the device pool's token slots are (the memory
//! breakdown that compares the allocation policies), token states stored,
//! and block-table entries.

use std::collections::HashMap;

use super::policy::AdmissionBlock;
use super::request::Status;
use super::scheduler::Scheduler;
use crate::kv_cache::KvCacheManager;

/// Where the device pool's `total` token slots are, right after `schedule()`
/// (the memory the step's forward pass runs with). The five shares sum to
/// `total` (blocks shared by several sequences count once per sequence; a
/// benchmark without sharing is exact).
///
/// For each device-resident sequence with `kv` = tokens whose KV is in the
/// cache once this step's tokens are written (computed + scheduled now),
/// `alloc` = its allocated slots (blocks x block size) and `final_kv` = the
/// KV states it will ever hold (prompt + `max_tokens`, capped at
/// `max_model_len`, minus one: the last sampled token is never fed back):
/// slot positions `[0, kv)` are token states, `[kv, min(alloc, final_kv))`
/// reservation, `[max(kv, final_kv), alloc)` internal fragmentation. Free
/// slots are external fragmentation when no request can use them: the policy
/// reserves (a running request never takes another slot, only an admission
/// can) and the head of the waiting queue was not admitted at this step for
/// lack of a fitting contiguous run, or (static batching) because its batch
/// has not finished. Otherwise (paged: any free block serves any request's
/// next block; nothing waits; `max_num_seqs` or the token budget) they are
/// `free`. `final_kv` assumes each request runs to `max_tokens` (no stop
/// token), as in the memory benchmark.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MemoryBreakdown {
    /// Device slots (blocks x block size).
    pub total: usize,
    /// Slots holding KV states of tokens in the cache.
    pub token_states: usize,
    /// Allocated slots a future token of the same request will fill.
    pub reservation: usize,
    /// Allocated slots that will never hold a token.
    pub internal: usize,
    /// Free slots no request can use at this step.
    pub external: usize,
    /// The other free slots.
    pub free: usize,
    /// Running requests.
    pub num_running: usize,
    /// Waiting requests.
    pub num_waiting: usize,
    /// Why the head of the waiting queue was not admitted.
    pub admission_block: AdmissionBlock,
}

/// What one KV cache group's blocks hold (a shared block counts once).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct GroupUsage {
    /// Device blocks held by the group's tables.
    pub num_used_blocks: usize,
    /// Token states stored in them.
    pub num_token_states: usize,
}

impl Scheduler {
    /// Block-table entries of the device-resident sequences: the blocks they
    /// would hold if nothing were shared.
    pub fn num_table_blocks(&self) -> usize {
        self.requests
            .values()
            .filter(|r| r.status != Status::Swapped)
            .map(|r| KvCacheManager::num_live(&r.block_tables))
            .sum()
    }

    /// Where the device slots are right after `schedule()`: token states,
    /// reservation, internal and external fragmentation, free (see
    /// [`MemoryBreakdown`] for the exact definitions). A sliding-window
    /// group's released blocks hold nothing: each group counts the positions
    /// of the blocks it holds.
    pub fn memory_breakdown(&self) -> MemoryBreakdown {
        let bs = self.config.block_size;
        let new: HashMap<u64, usize> = self.scheduled.iter().copied().collect();
        let mut m = MemoryBreakdown {
            total: self.config.num_blocks * bs,
            num_running: self.running.len(),
            num_waiting: self.waiting.len(),
            admission_block: self.admission_block,
            ..Default::default()
        };
        for r in self.requests.values() {
            if r.status == Status::Swapped {
                continue;
            }
            let final_kv =
                (r.num_prompt_tokens + r.stop.max_tokens).min(self.config.max_model_len) - 1;
            for t in &r.block_tables {
                // Held positions: [lo, alloc).
                let (lo, alloc) = (t.num_skipped() * bs, t.len() * bs);
                let at = |pos: usize| pos.clamp(lo, alloc);
                let kv = at(r.num_computed_tokens + new.get(&r.id).copied().unwrap_or(0));
                m.token_states += kv - lo;
                m.reservation += at(final_kv).saturating_sub(kv);
                m.internal += alloc - at(final_kv).max(kv);
            }
        }
        let free = self.kv.pool().num_free() * bs;
        m.external = self
            .policy
            .external_slots(self.admission_block, self.waiting.len(), free);
        m.free = free - m.external;
        m
    }

    /// Token states stored in device blocks, and device slots allocated
    /// (used blocks x block size). A shared block counts once.
    pub fn kv_token_usage(&self) -> (usize, usize) {
        let stored = self
            .kv_group_usage()
            .iter()
            .map(|g| g.num_token_states)
            .sum();
        let pool = self.kv.pool();
        (
            stored,
            (pool.num_total() - pool.num_free()) * self.config.block_size,
        )
    }

    /// Per KV cache group (in `config.kv_cache_groups` order): blocks held
    /// and token states stored in them (a shared block counts once).
    pub fn kv_group_usage(&self) -> Vec<GroupUsage> {
        let bs = self.config.block_size;
        let mut filled = vec![0usize; self.config.num_blocks];
        let mut owner = vec![u32::MAX; self.config.num_blocks];
        for r in self.requests.values() {
            if r.status == Status::Swapped {
                continue;
            }
            for (g, t) in r.block_tables.iter().enumerate() {
                for (i, &b) in t.blocks().iter().enumerate().skip(t.num_skipped()) {
                    let n = r.num_computed_tokens.saturating_sub(i * bs).min(bs);
                    filled[b as usize] = filled[b as usize].max(n);
                    owner[b as usize] = g as u32;
                }
            }
        }
        let mut usage = vec![GroupUsage::default(); self.kv.groups().len()];
        for (&g, &n) in owner.iter().zip(&filled) {
            if let Some(u) = usage.get_mut(g as usize) {
                u.num_used_blocks += 1;
                u.num_token_states += n;
            }
        }
        usage
    }
}
