//! KV cache events: changes to the prefix cache's (KV cache group, block
//! hash) -> block map, recorded for routers that track which engine holds
//! which prefix (published in vLLM's `KVEventBatch` layout by
//! `pagedrs.engine.core.kv_events`).
//!
//! Recording is off by default and costs one branch per registration or
//! eviction when off. Events accumulate until [`KvEventLog::take`] drains
//! them (the engine does so after every step).

use super::block_hash::BlockHash;

/// One change to the prefix cache of the device pool.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KvEvent {
    /// Consecutive full blocks of one sequence became cached in `group`:
    /// `block_hashes[i]` names the block after `block_hashes[i - 1]`, the
    /// first follows `parent_block_hash` (None: the first block of the
    /// sequence). `token_ids` holds every token of those blocks,
    /// `block_size` per block.
    Stored {
        group: u32,
        block_hashes: Vec<BlockHash>,
        parent_block_hash: Option<BlockHash>,
        token_ids: Vec<u32>,
        /// The LoRA adapter of the sequence (None: the base model).
        lora_id: Option<u64>,
    },
    /// Cached blocks of `group` were evicted (their hashes no longer name a
    /// block).
    Removed {
        group: u32,
        block_hashes: Vec<BlockHash>,
    },
    /// Every cached block was dropped at once.
    AllCleared,
}

/// Events recorded since the last [`KvEventLog::take`], when enabled.
#[derive(Debug, Clone, Default)]
pub struct KvEventLog {
    enabled: bool,
    events: Vec<KvEvent>,
}

impl KvEventLog {
    /// Whether changes are recorded.
    #[inline]
    pub fn is_enabled(&self) -> bool {
        self.enabled
    }

    /// Start or stop recording; stopping drops what was not taken.
    pub fn set_enabled(&mut self, enabled: bool) {
        self.enabled = enabled;
        if !enabled {
            self.events.clear();
        }
    }

    /// Record one event (nothing when disabled). A removal right after a
    /// removal of the same group joins it.
    pub fn push(&mut self, event: KvEvent) {
        if !self.enabled {
            return;
        }
        if let (
            KvEvent::Removed {
                group,
                block_hashes,
            },
            Some(KvEvent::Removed {
                group: last_group,
                block_hashes: last,
            }),
        ) = (&event, self.events.last_mut())
        {
            if group == last_group {
                last.extend_from_slice(block_hashes);
                return;
            }
        }
        self.events.push(event);
    }

    /// The recorded events, oldest first; the log is empty afterwards.
    pub fn take(&mut self) -> Vec<KvEvent> {
        std::mem::take(&mut self.events)
    }

    /// Events recorded and not taken yet.
    pub fn len(&self) -> usize {
        self.events.len()
    }

    /// True when nothing is waiting to be taken.
    pub fn is_empty(&self) -> bool {
        self.events.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn disabled_log_records_nothing_and_removals_join() {
        let mut log = KvEventLog::default();
        log.push(KvEvent::AllCleared);
        assert!(log.is_empty());
        log.set_enabled(true);
        let removed = |g, h: u8| KvEvent::Removed {
            group: g,
            block_hashes: vec![[h; 32]],
        };
        log.push(removed(0, 1));
        log.push(removed(0, 2));
        log.push(removed(1, 3));
        let events = log.take();
        assert_eq!(
            events,
            vec![
                KvEvent::Removed {
                    group: 0,
                    block_hashes: vec![[1; 32], [2; 32]]
                },
                removed(1, 3)
            ]
        );
        assert!(log.take().is_empty());
    }
}
