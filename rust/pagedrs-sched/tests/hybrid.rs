//! Hybrid KV caches: full-attention and sliding-window groups over one pool.
//! A sliding-window group holds only what its next query sees (during a
//! chunked prefill, about window + chunk), so a sliding-only model runs
//! prompts far longer than the pool; prefix caching, beam forks with the
//! hold token and both preemption modes work unchanged.

mod common;

use common::*;

use pagedrs_sched::kv_cache::{blocks_for, KvCacheGroupSpec, NULL_BLOCK};
use pagedrs_sched::scheduler::{PreemptionMode, Scheduler, SchedulerConfig, HOLD_TOKEN};

fn hybrid(num_blocks: usize, groups: Vec<KvCacheGroupSpec>) -> SchedulerConfig {
    SchedulerConfig {
        kv_cache_groups: groups,
        max_model_len: 64,
        ..config(num_blocks, 4)
    }
}

#[test]
fn sliding_only_prompt_far_longer_than_the_pool() {
    // 32k-token prompt, window 1024, 2048-token chunks, block 16: the pool
    // holds 200 blocks (3200 tokens), a tenth of the prompt.
    let mut s = Scheduler::new(SchedulerConfig {
        num_blocks: 200,
        block_size: 16,
        max_num_batched_tokens: 2048,
        max_model_len: 40_000,
        kv_cache_groups: vec![KvCacheGroupSpec::sliding(1024)],
        ..config(200, 16)
    })
    .unwrap();
    s.add(request(1, 32_768, 4)).unwrap();
    let mut peak = 0;
    let mut finished = vec![];
    while finished.is_empty() {
        s.schedule();
        assert_no_shared_writes(&s);
        peak = peak.max(s.kv().pool().num_total() - s.kv().pool().num_free());
        let n = s.num_sampled_tokens();
        finished = s.update(&vec![3; n]);
        assert_invariants(&s);
    }
    // Window + chunk: (1023 + 2048) / 16 rounded up, plus one block of slack.
    assert!(
        peak <= blocks_for(1023 + 2048, 16) + 1,
        "peak {peak} blocks"
    );
    assert!(peak * 16 <= 3200);
    assert_eq!(s.stats().num_preemptions, 0);
    assert_eq!(s.kv().pool().num_free(), 200);
}

#[test]
fn decode_holds_the_window_and_full_groups_every_block() {
    let groups = vec![KvCacheGroupSpec::FULL, KvCacheGroupSpec::sliding(8)];
    let mut s = Scheduler::new(hybrid(64, groups)).unwrap();
    s.add(request(1, 20, 40)).unwrap();
    for _ in 0..30 {
        checked_step(&mut s, 5);
        let r = s.request(1).unwrap();
        let (full, sliding) = (&r.block_tables[0], &r.block_tables[1]);
        assert_eq!(full.num_live(), blocks_for(r.num_computed_tokens, 4));
        // The next query (at num_computed) sees 7 earlier tokens: at most 3 blocks.
        assert!(sliding.num_live() <= 3, "{sliding:?}");
        assert!(sliding.blocks()[..sliding.num_skipped()]
            .iter()
            .all(|&b| b == NULL_BLOCK));
    }
    let stats = s.kv_group_usage();
    assert_eq!(
        stats[0].num_used_blocks,
        blocks_for(49, 4),
        "49 tokens computed"
    );
    assert!(stats[1].num_used_blocks <= 3);
}

#[test]
fn prefix_hit_takes_only_the_window_of_a_sliding_group() {
    let groups = vec![KvCacheGroupSpec::FULL, KvCacheGroupSpec::sliding(8)];
    let mut s = Scheduler::new(SchedulerConfig {
        enable_prefix_caching: true,
        ..hybrid(64, groups)
    })
    .unwrap();
    let prompt: Vec<u32> = (100..140).collect();
    s.add(request_with(1, prompt.clone(), 1)).unwrap();
    while !s.is_idle() {
        checked_step(&mut s, 5);
    }
    s.add(request_with(2, prompt, 1)).unwrap();
    s.schedule();
    // 40 tokens: 9 full blocks cached (the last token is computed again).
    let r = s.request(2).unwrap();
    assert_eq!(r.num_computed_tokens, 36);
    assert_eq!(r.block_tables[0].num_live(), 10);
    // The query at 36 sees 29..=36: sliding blocks 7, 8 (cached) and 9 (new).
    assert_eq!(r.block_tables[1].num_skipped(), 7);
    assert_eq!(r.block_tables[1].num_live(), 3);
    assert_eq!(s.stats().prefix_cache_hits, 36);
    let n = s.num_sampled_tokens();
    s.update(&vec![5; n]);
    assert_invariants(&s);
}

#[test]
fn beam_fork_and_hold_keep_the_window() {
    let groups = vec![KvCacheGroupSpec::sliding(6), KvCacheGroupSpec::FULL];
    let mut s = Scheduler::new(hybrid(64, groups)).unwrap();
    s.add(request(1, 14, 20)).unwrap();
    checked_step(&mut s, 5); // 15 tokens, 14 computed
    s.fork_with_last_token(1, 2, Some(9)).unwrap();
    assert_invariants(&s);
    // Beam 2 holds: its last token runs again next step; beam 1 goes on.
    s.schedule();
    assert_no_shared_writes(&s);
    s.update(&[6, HOLD_TOKEN]);
    assert_invariants(&s);
    let (a, b) = (s.request(1).unwrap(), s.request(2).unwrap());
    assert_eq!((a.num_computed_tokens, b.num_computed_tokens), (15, 14));
    for _ in 0..10 {
        checked_step(&mut s, 7);
    }
    s.abort(1);
    s.abort(2);
    assert_eq!(s.kv().pool().num_free(), 64);
}

#[test]
fn both_preemption_modes_with_a_hybrid_cache() {
    for mode in [PreemptionMode::Swap, PreemptionMode::Recompute] {
        let groups = vec![KvCacheGroupSpec::FULL, KvCacheGroupSpec::sliding(8)];
        let mut s = Scheduler::new(SchedulerConfig {
            num_cpu_blocks: 64,
            preemption_mode: mode,
            ..hybrid(40, groups)
        })
        .unwrap();
        for id in 0..4 {
            s.add(request(id, 12, 30)).unwrap();
        }
        for _ in 0..400 {
            if s.is_idle() {
                break;
            }
            checked_step(&mut s, 5);
        }
        assert!(s.is_idle(), "{mode:?}");
        assert!(s.stats().num_preemptions > 0, "{mode:?} preempted");
        if mode == PreemptionMode::Swap {
            assert!(s.stats().num_swapped_in > 0);
        }
    }
}
