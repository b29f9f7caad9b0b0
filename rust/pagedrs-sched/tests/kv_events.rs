//! KV cache events: `Stored` when full blocks are registered in the prefix
//! cache, `Removed` when a cached block is evicted, `AllCleared` on a reset,
//! nothing when recording is off; the events replay to the cache's contents.

mod common;

use std::collections::HashSet;

use common::*;

use pagedrs_sched::kv_cache::{extend_block_hashes, BlockHash, KvEvent};
use pagedrs_sched::scheduler::{Scheduler, SchedulerConfig};

fn cached_scheduler(num_blocks: usize, events: bool) -> Scheduler {
    let mut s = Scheduler::new(SchedulerConfig {
        enable_prefix_caching: true,
        max_model_len: 32,
        ..config(num_blocks, 4)
    })
    .unwrap();
    s.enable_kv_events(events);
    s
}

fn hashes_of(tokens: &[u32]) -> Vec<BlockHash> {
    let mut h = Vec::new();
    extend_block_hashes(&mut h, tokens, 4, b"");
    h
}

/// Apply `events` to `held` (the hashes a subscriber thinks are cached).
fn replay(held: &mut HashSet<BlockHash>, events: Vec<KvEvent>) {
    for e in events {
        match e {
            KvEvent::Stored { block_hashes, .. } => {
                for h in block_hashes {
                    assert!(held.insert(h), "stored twice");
                }
            }
            KvEvent::Removed { block_hashes, .. } => {
                for h in block_hashes {
                    assert!(held.remove(&h), "removed without being stored");
                }
            }
            KvEvent::AllCleared => held.clear(),
        }
    }
}

#[test]
fn registration_records_stored_with_parent_and_tokens() {
    let mut s = cached_scheduler(32, true);
    let prompt: Vec<u32> = (100..110).collect(); // 2 full blocks + 2
    s.add(request_with(1, prompt.clone(), 4)).unwrap();
    step(&mut s, 5);
    let hashes = hashes_of(&prompt);
    assert_eq!(
        s.take_kv_events(),
        vec![KvEvent::Stored {
            group: 0,
            block_hashes: hashes.clone(),
            parent_block_hash: None,
            token_ids: prompt[..8].to_vec(),
            lora_id: None,
        }]
    );
    // Two decode steps fill the third block (tokens 100..110, 5, 5).
    step(&mut s, 5);
    assert!(s.take_kv_events().is_empty(), "block 3 not computed yet");
    step(&mut s, 5);
    let full = [prompt.clone(), vec![5, 5]].concat();
    let all = hashes_of(&full);
    assert_eq!(
        s.take_kv_events(),
        vec![KvEvent::Stored {
            group: 0,
            block_hashes: vec![all[2]],
            parent_block_hash: Some(all[1]),
            token_ids: full[8..12].to_vec(),
            lora_id: None,
        }]
    );
    // A second request with the same prompt hits: nothing new is stored.
    s.add(request_with(2, prompt, 1)).unwrap();
    step(&mut s, 5);
    assert!(s.take_kv_events().is_empty());
}

#[test]
fn eviction_records_removed_and_events_replay_to_the_cache() {
    let mut s = cached_scheduler(8, true);
    let mut held = HashSet::new();
    let mut removed = 0;
    for id in 0..6u64 {
        // Distinct 12-token prompts: 3 cached blocks each, 8 blocks in all.
        let prompt: Vec<u32> = (0..12).map(|t| 1000 * (id as u32 + 1) + t).collect();
        s.add(request_with(id, prompt, 1)).unwrap();
        while !s.is_idle() {
            step(&mut s, 7);
        }
        let events = s.take_kv_events();
        removed += events
            .iter()
            .filter(|e| matches!(e, KvEvent::Removed { .. }))
            .count();
        replay(&mut held, events);
        assert_eq!(held.len(), s.kv().pool().num_cached());
        for h in &held {
            assert!(s.kv().pool().lookup(0, h).is_some());
        }
    }
    assert!(removed > 0, "the small pool evicted cached blocks");
    assert!(s.reset_prefix_cache());
    assert_eq!(s.take_kv_events(), vec![KvEvent::AllCleared]);
    assert_eq!(s.kv().pool().num_cached(), 0);
}

#[test]
fn nothing_is_recorded_when_disabled_or_without_prefix_caching() {
    let mut off = cached_scheduler(8, false);
    let mut no_cache = Scheduler::new(config(8, 4)).unwrap();
    no_cache.enable_kv_events(true);
    for s in [&mut off, &mut no_cache] {
        for id in 0..4u64 {
            let prompt: Vec<u32> = (0..12).map(|t| 100 * (id as u32 + 1) + t).collect();
            s.add(request_with(id, prompt, 1)).unwrap();
            while !s.is_idle() {
                step(s, 7);
            }
        }
        assert!(s.take_kv_events().is_empty());
    }
    assert!(off.kv().pool().num_evictions() > 0);
}

#[test]
fn reset_refuses_while_blocks_are_in_use() {
    let mut s = cached_scheduler(32, true);
    s.add(request_with(1, (100..110).collect(), 8)).unwrap();
    step(&mut s, 5);
    s.take_kv_events();
    assert!(!s.reset_prefix_cache());
    assert!(s.take_kv_events().is_empty());
    assert_eq!(s.kv().pool().num_cached(), 2);
}
