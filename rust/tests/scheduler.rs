//! Scheduler behaviour through its public API: continuous batching, token
//! budget, preemption by recompute, and block accounting.

use _core::scheduler::{
    AddError, AdmissionBlock, AllocationPolicyKind, FinishReason, PreemptionMode, Request,
    SamplingConfig, Scheduler, SchedulerConfig, Status, StepBatch, StopConfig,
};
use proptest::prelude::*;

fn config(num_blocks: usize, block_size: usize) -> SchedulerConfig {
    SchedulerConfig {
        num_blocks,
        num_cpu_blocks: 0,
        block_size,
        max_num_seqs: 8,
        max_num_batched_tokens: 64,
        // Capped so the pool holds one sequence of max_model_len tokens.
        max_model_len: 256.min(num_blocks * block_size),
        enable_chunked_prefill: true,
        enable_prefix_caching: false,
        preemption_mode: PreemptionMode::Recompute,
        allocation_policy: AllocationPolicyKind::Paged,
    }
}

fn request(id: u64, prompt_len: usize, max_tokens: usize) -> Request {
    request_with(
        id,
        (0..prompt_len as u32).map(|t| t + 10).collect(),
        max_tokens,
    )
}

fn request_with(id: u64, token_ids: Vec<u32>, max_tokens: usize) -> Request {
    Request::new(
        id,
        token_ids,
        SamplingConfig::default(),
        StopConfig {
            max_tokens,
            min_tokens: 0,
            stop_token_ids: vec![2],
        },
    )
}

/// Run one step sampling token `tok` for every row; return finished ids.
fn step(s: &mut Scheduler, tok: u32) -> Vec<u64> {
    s.schedule();
    let rows = s.num_sampled_tokens();
    s.update(&vec![tok; rows])
        .into_iter()
        .map(|f| f.id)
        .collect()
}

/// Every block's ref count equals the number of block tables holding it (in
/// the device pool, and in the CPU pool for swapped requests); free counts
/// match; no two running requests will write one block in the next step.
fn assert_pool_consistent(s: &Scheduler) {
    for cpu in [false, true] {
        let pool = if cpu {
            s.kv().cpu_pool()
        } else {
            s.kv().pool()
        };
        let mut counts = vec![0u32; pool.num_total()];
        for r in s.requests() {
            if (r.status == Status::Swapped) == cpu {
                for &b in r.block_table.blocks() {
                    counts[b as usize] += 1;
                }
            }
        }
        for (b, &c) in counts.iter().enumerate() {
            assert_eq!(
                pool.ref_count(b as u32),
                c,
                "ref count of block {b} (cpu: {cpu})"
            );
        }
        let used = counts.iter().filter(|&&c| c > 0).count();
        assert_eq!(
            pool.num_free() + used,
            pool.num_total(),
            "no leak (cpu: {cpu})"
        );
    }
}

/// After `schedule()`: each block written this step belongs to one request.
fn assert_no_shared_writes(s: &Scheduler) {
    let bs = s.config().block_size;
    let mut writer = std::collections::HashMap::new();
    for &(id, n) in s.scheduled() {
        let r = s.request(id).unwrap();
        for pos in r.num_computed_tokens..r.num_computed_tokens + n {
            let block = r.block_table.blocks()[pos / bs];
            assert_eq!(
                s.kv().pool().ref_count(block),
                1,
                "write into shared block {block}"
            );
            assert_eq!(*writer.entry(block).or_insert(id), id);
        }
    }
}

#[test]
fn prefill_then_decode_until_max_tokens() {
    let mut s = Scheduler::new(config(16, 4)).unwrap();
    s.add(request(1, 6, 3)).unwrap();
    assert_eq!(s.schedule(), &[(1, 6)]);
    let b = StepBatch::build(&s);
    assert_eq!(b.input_ids.len(), 6);
    assert_eq!(b.positions, (0..6).collect::<Vec<i64>>());
    assert_eq!(b.query_start_loc, vec![0, 6]);
    assert_eq!(b.seq_lens, vec![6]);
    assert_eq!(b.max_blocks, 2);
    assert_eq!(b.logits_indices, vec![5]);
    let bt = &b.block_tables;
    assert_eq!(b.slot_mapping[4], bt[1] as i64 * 4);
    assert!(s.update(&[7]).is_empty());
    assert_eq!(s.schedule(), &[(1, 1)]);
    let b = StepBatch::build(&s);
    assert_eq!(b.input_ids, vec![7]);
    assert_eq!(b.positions, vec![6]);
    assert!(s.update(&[8]).is_empty());
    s.schedule();
    let fin = s.update(&[9]);
    assert_eq!(fin.len(), 1);
    assert_eq!(fin[0].reason, FinishReason::Length);
    assert_eq!(fin[0].output_token_ids, vec![7, 8, 9]);
    assert_eq!(s.kv().pool().num_free(), 16);
    assert!(s.is_idle());
}

#[test]
fn stop_token_finishes_and_frees() {
    let mut s = Scheduler::new(config(16, 4)).unwrap();
    s.add(request(1, 5, 10)).unwrap();
    s.schedule();
    let fin = s.update(&[2]);
    assert_eq!(fin[0].reason, FinishReason::Stop);
    assert_eq!(fin[0].stop_token, Some(2));
    assert_eq!(s.kv().pool().num_free(), 16);
}

#[test]
fn chunked_prefill_respects_token_budget() {
    let mut cfg = config(64, 4);
    cfg.max_num_batched_tokens = 10;
    let mut s = Scheduler::new(cfg).unwrap();
    s.add(request(1, 25, 2)).unwrap();
    s.add(request(2, 3, 2)).unwrap();
    assert_eq!(s.schedule(), &[(1, 10)]);
    assert_eq!(s.num_sampled_tokens(), 0);
    s.update(&[]);
    assert_eq!(s.schedule(), &[(1, 10)]);
    s.update(&[]);
    assert_eq!(s.schedule(), &[(1, 5), (2, 3)]);
    assert_eq!(s.num_sampled_tokens(), 2);
    s.update(&[5, 5]);
    assert_pool_consistent(&s);
}

#[test]
fn max_num_seqs_limits_the_batch() {
    let mut cfg = config(64, 4);
    cfg.max_num_seqs = 2;
    let mut s = Scheduler::new(cfg).unwrap();
    for id in 0..3 {
        s.add(request(id, 3, 5)).unwrap();
    }
    assert_eq!(s.schedule().len(), 2);
    assert_eq!(s.num_waiting(), 1);
}

#[test]
fn preemption_by_recompute_when_blocks_run_out() {
    // 4 blocks of 4 tokens; two requests of 7 tokens take 2 blocks each.
    let mut s = Scheduler::new(SchedulerConfig {
        max_model_len: 16,
        ..config(4, 4)
    })
    .unwrap();
    s.add(request(1, 7, 8)).unwrap();
    s.add(request(2, 7, 8)).unwrap();
    step(&mut s, 5); // prefill: 7 slots each, 2 blocks each, pool empty
    step(&mut s, 5); // decode fills slot 8 of both
    assert_eq!(s.kv().pool().num_free(), 0);
    // Request 1 needs a third block for slot 9: request 2 (latest) is preempted.
    assert_eq!(s.schedule(), &[(1, 1)]);
    assert_eq!(s.stats().num_preemptions, 1);
    assert_eq!(s.num_waiting(), 1);
    let r2 = s.request(2).unwrap();
    assert_eq!(r2.num_computed_tokens, 0);
    assert_eq!(
        r2.num_tokens(),
        9,
        "generated tokens are kept for recompute"
    );
    s.update(&[5]);
    assert_pool_consistent(&s);
    let mut finished = vec![];
    for _ in 0..40 {
        finished.extend(step(&mut s, 5));
        assert_pool_consistent(&s);
        if s.is_idle() {
            break;
        }
    }
    finished.sort();
    assert_eq!(finished, vec![1, 2]);
    assert_eq!(s.kv().pool().num_free(), 4);
}

#[test]
fn abort_frees_blocks() {
    let mut s = Scheduler::new(config(16, 4)).unwrap();
    s.add(request(1, 9, 10)).unwrap();
    step(&mut s, 5);
    assert_eq!(s.kv().pool().num_free(), 13);
    let f = s.abort(1).unwrap();
    assert_eq!(f.reason, FinishReason::Abort);
    assert_eq!(s.kv().pool().num_free(), 16);
    assert!(s.abort(1).is_none());
}

#[test]
fn rejects_bad_requests() {
    let mut s = Scheduler::new(config(16, 4)).unwrap();
    assert!(s.add(request(1, 0, 4)).is_err());
    assert!(s.add(request(2, 256, 4)).is_err());
    s.add(request(3, 4, 4)).unwrap();
    assert!(s.add(request(3, 4, 4)).is_err());
}

#[derive(Debug, Clone)]
enum Op {
    /// A prompt drawn from a few shared prefixes, so the prefix cache hits.
    Add {
        prefix: u32,
        prompt: usize,
        max_tokens: usize,
        children: usize,
    },
    Step {
        token: u32,
    },
    Abort {
        pick: usize,
    },
    Fork {
        pick: usize,
    },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        (0u32..3, 1usize..40, 1usize..30, 0usize..3).prop_map(
            |(prefix, prompt, max_tokens, children)| Op::Add {
                prefix,
                prompt,
                max_tokens,
                children,
            }
        ),
        (0u32..4).prop_map(|token| Op::Step { token }),
        (0u32..4).prop_map(|token| Op::Step { token }),
        (0usize..16).prop_map(|pick| Op::Abort { pick }),
        (0usize..16).prop_map(|pick| Op::Fork { pick }),
    ]
}

proptest! {
    /// Random interleavings never leak or double-free a block, ref counts match
    /// the block tables, and draining every request frees the whole pool.
    #[test]
    fn random_interleavings_keep_the_pool_consistent(
        ops in proptest::collection::vec(op(), 1..80),
        num_blocks in 16usize..40,
        num_cpu_blocks in 0usize..24,
        block_size in prop_oneof![Just(1usize), Just(4), Just(16)],
        caching in any::<bool>(),
        swap in any::<bool>(),
    ) {
        let mut s = Scheduler::new(SchedulerConfig {
            num_blocks,
            num_cpu_blocks,
            block_size,
            max_num_seqs: 6,
            max_num_batched_tokens: 48,
            max_model_len: 64.min(num_blocks * block_size),
            enable_chunked_prefill: true,
            enable_prefix_caching: caching,
            preemption_mode: if swap { PreemptionMode::Swap } else { PreemptionMode::Recompute },
            allocation_policy: AllocationPolicyKind::Paged,
        }).unwrap();
        let mut next = 0u64;
        for op in ops {
            match op {
                Op::Add { prefix, prompt, max_tokens, children } => {
                    let tokens = (0..prompt as u32).map(|t| if t < 20 { prefix * 100 + t } else { next as u32 * 7 + t }).collect();
                    let mut req = request_with(next, tokens, max_tokens);
                    req.pending_children = (1..=children as u64).map(|c| next + c).collect();
                    let _ = s.add(req);
                    next += 1 + children as u64;
                }
                Op::Step { token } => {
                    s.schedule();
                    assert_no_shared_writes(&s);
                    let rows = s.num_sampled_tokens();
                    s.update(&vec![token; rows]);
                }
                Op::Fork { pick } => {
                    let ids: Vec<u64> = s.requests().map(|r| r.id).collect();
                    if !ids.is_empty() {
                        let parent = ids[pick % ids.len()];
                        let ok = s.fork(parent, next).is_ok();
                        prop_assert_eq!(ok, s.request(parent).unwrap().status == Status::Running);
                        next += 1;
                    }
                }
                Op::Abort { pick } => {
                    let ids: Vec<u64> = s.requests().map(|r| r.id).collect();
                    if !ids.is_empty() {
                        s.abort(ids[pick % ids.len()]);
                    }
                }
            }
            assert_pool_consistent(&s);
        }
        for _ in 0..2000 {
            if s.is_idle() {
                break;
            }
            s.schedule();
            assert_no_shared_writes(&s);
            let rows = s.num_sampled_tokens();
            s.update(&vec![3; rows]);
            assert_pool_consistent(&s);
        }
        prop_assert!(s.is_idle(), "every request finishes");
        prop_assert_eq!(s.kv().pool().num_free(), num_blocks);
    }
}

#[test]
fn prefix_cache_reuses_blocks_and_skips_prefill() {
    let mut s = Scheduler::new(SchedulerConfig {
        enable_prefix_caching: true,
        ..config(32, 4)
    })
    .unwrap();
    let prompt: Vec<u32> = (100..110).collect(); // 10 tokens: 2 full blocks + 2
    s.add(request_with(1, prompt.clone(), 1)).unwrap();
    assert_eq!(s.schedule(), &[(1, 10)]);
    s.update(&[5]);
    assert_eq!(s.kv().pool().num_cached(), 2);
    // Same prompt again: 8 tokens cached, only 2 computed.
    s.add(request_with(2, prompt.clone(), 1)).unwrap();
    assert_eq!(s.schedule(), &[(2, 2)]);
    assert_eq!(s.stats().prefix_cache_hits, 8);
    assert_eq!(s.stats().prefix_cache_queries, 20);
    s.update(&[5]);
    // An exact multiple of the block size, fully cached: the last token is
    // still computed, in a fresh block (the cached last block is not reused).
    s.add(request_with(3, prompt[..8].to_vec(), 1)).unwrap();
    s.schedule();
    s.update(&[5]);
    s.add(request_with(4, prompt[..8].to_vec(), 1)).unwrap();
    assert_eq!(s.schedule(), &[(4, 4)]);
    s.update(&[5]);
    assert_pool_consistent(&s);
    assert_eq!(s.kv().pool().num_free(), 32);
}

#[test]
fn requests_sharing_a_prefix_allocate_it_once() {
    let mut s = Scheduler::new(SchedulerConfig {
        enable_prefix_caching: true,
        ..config(64, 4)
    })
    .unwrap();
    let prefix: Vec<u32> = (100..116).collect(); // 4 full blocks
    s.add(request_with(0, [prefix.clone(), vec![1, 2]].concat(), 8))
        .unwrap();
    s.schedule();
    s.update(&[7]);
    for id in 1..5u64 {
        s.add(request_with(
            id,
            [prefix.clone(), vec![id as u32 + 50; 3]].concat(),
            8,
        ))
        .unwrap();
    }
    s.schedule();
    // 5 requests: 4 shared prefix blocks + 1 own block each.
    assert_eq!(s.kv().pool().num_total() - s.kv().pool().num_free(), 4 + 5);
    let first = s.request(1).unwrap().block_table.blocks()[..4].to_vec();
    for id in 0..5u64 {
        assert_eq!(
            &s.request(id).unwrap().block_table.blocks()[..4],
            &first[..]
        );
    }
}

#[test]
fn cache_salt_separates_tenants() {
    let mut s = Scheduler::new(SchedulerConfig {
        enable_prefix_caching: true,
        ..config(32, 4)
    })
    .unwrap();
    let prompt: Vec<u32> = (100..110).collect();
    let salted = |id, salt: &str| {
        let mut r = request_with(id, prompt.clone(), 1);
        r.cache_salt = salt.as_bytes().to_vec();
        r
    };
    s.add(salted(1, "a")).unwrap();
    s.schedule();
    s.update(&[5]);
    s.add(salted(2, "b")).unwrap();
    s.schedule();
    s.update(&[5]);
    assert_eq!(s.stats().prefix_cache_hits, 0);
    s.add(salted(3, "a")).unwrap();
    s.schedule();
    s.update(&[5]);
    assert_eq!(s.stats().prefix_cache_hits, 8);
}

#[test]
fn fork_then_append_copies_the_shared_partial_block() {
    let mut s = Scheduler::new(config(16, 4)).unwrap();
    s.add(request(1, 6, 5)).unwrap();
    step(&mut s, 5); // 7 tokens, 6 computed: blocks [a, b], b partial
    s.fork(1, 2).unwrap();
    assert_eq!(s.kv().pool().num_free(), 14);
    assert_eq!(s.schedule(), &[(1, 1), (2, 1)]);
    let moves = s.moves().copies.clone();
    assert_eq!(moves.len(), 1, "one copy-on-write of the partial block");
    let (r1, r2) = (s.request(1).unwrap(), s.request(2).unwrap());
    assert_eq!(r1.block_table.blocks()[0], r2.block_table.blocks()[0]);
    assert_ne!(r1.block_table.blocks()[1], r2.block_table.blocks()[1]);
    assert_eq!(
        moves[0],
        (r2.block_table.blocks()[1], r1.block_table.blocks()[1])
    );
    assert_no_shared_writes(&s);
    s.update(&[6, 7]);
    assert_pool_consistent(&s);
}

#[test]
fn swap_preemption_moves_blocks_out_and_back() {
    let mut s = Scheduler::new(SchedulerConfig {
        max_model_len: 16,
        num_cpu_blocks: 8,
        preemption_mode: PreemptionMode::Swap,
        ..config(4, 4)
    })
    .unwrap();
    s.add(request(1, 7, 8)).unwrap();
    s.add(request(2, 7, 8)).unwrap();
    step(&mut s, 5);
    step(&mut s, 5);
    assert_eq!(s.schedule(), &[(1, 1)]);
    assert_eq!(s.moves().swap_out.len(), 2);
    assert_eq!(s.num_swapped(), 1);
    let r2 = s.request(2).unwrap();
    assert_eq!(r2.num_computed_tokens, 8, "swapped KV is kept");
    s.update(&[5]);
    assert_pool_consistent(&s);
    let mut swapped_in = 0;
    for _ in 0..40 {
        s.schedule();
        swapped_in += s.moves().swap_in.len();
        let rows = s.num_sampled_tokens();
        s.update(&vec![5; rows]);
        assert_pool_consistent(&s);
        if s.is_idle() {
            break;
        }
    }
    assert!(s.is_idle());
    assert!(swapped_in >= 2);
    assert_eq!(s.stats().num_swapped_in, s.stats().num_swapped_out);
    assert_eq!(s.kv().pool().num_free(), 4);
    assert_eq!(s.kv().cpu_pool().num_free(), 8);
}

#[test]
fn parallel_sampling_group_shares_prompt_blocks_and_is_preempted_whole() {
    let mut s = Scheduler::new(SchedulerConfig {
        max_model_len: 32,
        ..config(8, 4)
    })
    .unwrap();
    let mut req = request(1, 6, 20);
    req.sampling.seed = 42;
    req.pending_children = vec![2, 3];
    s.add(req).unwrap();
    assert_eq!(s.schedule(), &[(1, 6)]);
    assert_eq!(s.num_sampled_tokens(), 3);
    assert_eq!(StepBatch::build(&s).num_samples, vec![3]);
    assert!(s.update(&[5, 6, 7]).is_empty());
    // Three sequences share the 2 prompt blocks; nothing was copied.
    assert_eq!(s.num_running(), 3);
    assert_eq!(s.kv().pool().num_free(), 6);
    let seeds: Vec<i64> = (1..=3)
        .map(|id| s.request(id).unwrap().sampling.seed)
        .collect();
    assert_eq!(seeds[0], 42);
    assert!(seeds[1] != 42 && seeds[2] != seeds[1]);
    for id in 1..=3 {
        assert_eq!(s.request(id).unwrap().output_token_ids(), &[4 + id as u32]);
    }
    // Each writes slot 6 of the shared partial block: two copy-on-writes.
    assert_eq!(s.schedule(), &[(1, 1), (2, 1), (3, 1)]);
    assert_eq!(s.moves().copies.len(), 2);
    assert_no_shared_writes(&s);
    s.update(&[8, 8, 8]);
    assert_pool_consistent(&s);
    assert!(s.is_idle() || s.num_running() == 3);
}

#[test]
fn preemption_takes_a_whole_group() {
    let mut s = Scheduler::new(SchedulerConfig {
        max_model_len: 32,
        ..config(8, 4)
    })
    .unwrap();
    s.add(request(9, 7, 20)).unwrap(); // older: never the victim
    let mut req = request(1, 6, 20);
    req.pending_children = vec![2, 3];
    s.add(req).unwrap();
    let group = [1u64, 2, 3];
    for _ in 0..30 {
        let before = s.stats().num_preemptions;
        s.schedule();
        if s.stats().num_preemptions > before {
            for id in group {
                assert_eq!(s.request(id).unwrap().status, Status::Waiting, "seq {id}");
            }
            assert!(s.scheduled().iter().all(|(id, _)| !group.contains(id)));
            assert_eq!(s.request(9).unwrap().status, Status::Running);
            return;
        }
        let t = s.num_sampled_tokens();
        s.update(&vec![8; t]);
        assert_pool_consistent(&s);
    }
    panic!("the pool never ran dry");
}

#[test]
fn beam_fork_replaces_the_uncomputed_last_token_and_hold_reruns_it() {
    let mut s = Scheduler::new(SchedulerConfig {
        enable_prefix_caching: true,
        ..config(16, 4)
    })
    .unwrap();
    s.add(request(1, 7, 10)).unwrap();
    step(&mut s, 5); // tokens: 7 prompt + [5]; 7 computed
    s.fork_with_last_token(1, 2, Some(9)).unwrap();
    assert_eq!(s.request(1).unwrap().output_token_ids(), &[5]);
    assert_eq!(s.request(2).unwrap().output_token_ids(), &[9]);
    assert_eq!(s.schedule(), &[(1, 1), (2, 1)]);
    let b = StepBatch::build(&s);
    assert_eq!(b.input_ids, vec![5, 9]);
    // Request 2 holds: nothing appended, its token runs again.
    s.update(&[6, _core::scheduler::HOLD_TOKEN]);
    assert_eq!(s.request(1).unwrap().output_token_ids(), &[5, 6]);
    let r2 = s.request(2).unwrap();
    assert_eq!(
        (r2.output_token_ids(), r2.num_computed_tokens),
        (&[9u32][..], 7)
    );
    assert_eq!(s.schedule(), &[(1, 1), (2, 1)]);
    s.update(&[7, 8]);
    assert_eq!(s.request(2).unwrap().output_token_ids(), &[9, 8]);
    assert_pool_consistent(&s);
}

// ---- Allocation policies (paper Fig. 2 baselines) ----

/// A scheduler of `slots` one-token blocks under `policy`.
fn reserving(policy: AllocationPolicyKind, slots: usize, max_model_len: usize) -> Scheduler {
    Scheduler::new(SchedulerConfig {
        max_num_seqs: 64,
        max_num_batched_tokens: 4096,
        max_model_len,
        allocation_policy: policy,
        enable_prefix_caching: true, // forced off by a reserving policy
        ..config(slots, 1)
    })
    .unwrap()
}

fn hinted(id: u64, prompt_len: usize, max_tokens: usize, expected: Option<usize>) -> Request {
    let mut r = request(id, prompt_len, max_tokens);
    r.stop.stop_token_ids.clear();
    r.expected_output_len = expected;
    r
}

/// Each running request's blocks are one contiguous run.
fn assert_contiguous(s: &Scheduler) {
    for r in s.requests().filter(|r| r.status == Status::Running) {
        let b = r.block_table.blocks();
        assert!(
            b.windows(2).all(|w| w[1] == w[0] + 1),
            "request {} holds a non-contiguous reservation {b:?}",
            r.id
        );
    }
}

/// Drive `s` until idle (token 5, never a stop token here), checking every
/// step; returns the finish order and the largest running batch.
fn drain(s: &mut Scheduler) -> (Vec<u64>, usize) {
    let (mut order, mut widest) = (vec![], 0);
    let mut reserved = std::collections::HashMap::new();
    for _ in 0..10_000 {
        if s.is_idle() {
            break;
        }
        s.schedule();
        assert_contiguous(s);
        assert_pool_consistent(s);
        widest = widest.max(s.num_running());
        let m = s.memory_breakdown();
        assert_eq!(
            m.token_states + m.reservation + m.internal + m.external + m.free,
            m.total
        );
        for r in s.requests().filter(|r| r.status == Status::Running) {
            // A reservation never grows, and no token is written past it.
            let len = *reserved.entry(r.id).or_insert(r.block_table.len());
            assert_eq!(r.block_table.len(), len, "request {} grew", r.id);
            assert!(r.num_tokens() <= len + 1);
        }
        order.extend(step(s, 5));
    }
    assert!(s.is_idle(), "did not drain");
    assert_eq!(
        s.stats().num_preemptions,
        0,
        "reserving policies never preempt"
    );
    assert_eq!(s.kv().pool().num_free(), s.kv().pool().num_total(), "leak");
    (order, widest)
}

#[test]
fn reservation_sizes_per_policy() {
    use AllocationPolicyKind::*;
    // Prompt 10, max_tokens 40, expected output 20 (pow2: 32), max_model_len 100.
    for (policy, want) in [
        (ReserveMax, 100),
        (Static, 100),
        (ReservePow2, 42),
        (ReserveOracle, 30),
    ] {
        let mut s = reserving(policy, 200, 100);
        s.add(hinted(1, 10, 40, Some(20))).unwrap();
        s.schedule();
        let r = s.request(1).unwrap();
        assert_eq!(r.block_table.len(), want, "{policy:?}");
        assert_contiguous(&s);
        assert!(
            !s.kv().prefix_caching(),
            "reserving turns prefix caching off"
        );
        let m = s.memory_breakdown();
        assert_eq!((m.token_states, m.total), (10, 200));
        // Final KV length: prompt + the output the request may produce - 1.
        let out = if policy == ReserveMax || policy == Static {
            40
        } else {
            want.min(50) - 10
        };
        let final_kv = 10 + out.min(40) - 1;
        assert_eq!(m.reservation, final_kv - 10, "{policy:?}");
        assert_eq!(m.internal, want - final_kv, "{policy:?}");
        assert_eq!(m.free, 200 - want);
        assert_eq!(m.external, 0);
    }
}

#[test]
fn oracle_stops_at_its_reservation() {
    // The hint (6) is below max_tokens (50): the request stops after 6
    // tokens and never writes past its 4 + 6 slots.
    let mut s = reserving(AllocationPolicyKind::ReserveOracle, 64, 64);
    s.add(hinted(1, 4, 50, Some(6))).unwrap();
    let mut outputs = vec![];
    for _ in 0..20 {
        if s.is_idle() {
            break;
        }
        s.schedule();
        assert_eq!(s.request(1).unwrap().block_table.len(), 10);
        let b = StepBatch::build(&s);
        assert!(b.slot_mapping.iter().all(|&x| x < 10));
        let rows = s.num_sampled_tokens();
        outputs.extend(s.update(&vec![5; rows]));
    }
    assert_eq!(outputs.len(), 1);
    assert_eq!(outputs[0].reason, FinishReason::Length);
    assert_eq!(outputs[0].output_token_ids.len(), 6);
    assert_eq!(s.kv().pool().num_free(), 64);
}

#[test]
fn every_reserving_policy_drains_without_leaks() {
    use AllocationPolicyKind::*;
    for policy in [ReserveMax, ReservePow2, ReserveOracle, Static] {
        let mut s = reserving(policy, 300, 100);
        for id in 0..12u64 {
            let prompt = 3 + (id as usize * 7) % 20;
            let out = 1 + (id as usize * 13) % 60;
            s.add(hinted(id, prompt, out, Some(out))).unwrap();
        }
        let (order, widest) = drain(&mut s);
        assert_eq!(order.len(), 12, "{policy:?}");
        match policy {
            ReserveMax | Static => assert!(widest <= 3, "300 slots hold 3 x 100"),
            _ => assert!(widest > 3, "{policy:?} packs more than max reservations"),
        }
    }
}

#[test]
fn static_batching_admits_no_joins_mid_batch() {
    let mut s = reserving(AllocationPolicyKind::Static, 300, 100);
    s.add(hinted(1, 5, 2, None)).unwrap();
    s.add(hinted(2, 5, 6, None)).unwrap();
    s.schedule();
    assert_eq!(s.num_running(), 2);
    s.update(&[5, 5]);
    // Room for a third reservation, but the batch is running: it waits,
    // also after request 1 finishes, until request 2 has finished too.
    s.add(hinted(3, 5, 2, None)).unwrap();
    let mut finished = vec![];
    while s.request(2).is_some() {
        s.schedule();
        assert!(s.request(3).unwrap().status == Status::Waiting);
        let m = s.memory_breakdown();
        assert_eq!(m.admission_block, AdmissionBlock::Batch);
        assert_eq!(m.external, s.kv().pool().num_free(), "idle free slots");
        finished.extend(step(&mut s, 5));
    }
    assert_eq!(finished, vec![1, 2]);
    s.schedule();
    assert_eq!(s.request(3).unwrap().status, Status::Running);
    // Continuous batching (reserve-max) lets request 3 join at once.
    let mut s = reserving(AllocationPolicyKind::ReserveMax, 300, 100);
    s.add(hinted(1, 5, 2, None)).unwrap();
    step(&mut s, 5);
    s.add(hinted(3, 5, 2, None)).unwrap();
    s.schedule();
    assert_eq!(s.num_running(), 2);
}

#[test]
fn external_fragmentation_when_no_run_fits() {
    // 10 slots, oracle reservations: A [0, 4), B [4, 7), C [7, 10). B
    // finishes first; D needs a run of 5, but only [4, 7) is free: it waits
    // and those 3 free slots are external fragmentation.
    let mut s = reserving(AllocationPolicyKind::ReserveOracle, 10, 10);
    s.add(hinted(1, 2, 2, None)).unwrap(); // A: 2 + 2 slots
    s.add(hinted(2, 2, 1, None)).unwrap(); // B: 2 + 1 slots
    s.add(hinted(3, 1, 2, None)).unwrap(); // C: 1 + 2 slots
    s.schedule();
    let blocks = |s: &Scheduler, id| s.request(id).unwrap().block_table.blocks().to_vec();
    assert_eq!(blocks(&s, 1), vec![0, 1, 2, 3]);
    assert_eq!(blocks(&s, 2), vec![4, 5, 6]);
    assert_eq!(blocks(&s, 3), vec![7, 8, 9]);
    assert_eq!(s.update(&[5, 5, 5]).len(), 1, "B is done after 1 token");
    s.add(hinted(4, 3, 2, None)).unwrap(); // D: 3 + 2 slots
    s.schedule();
    assert_eq!(s.request(4).unwrap().status, Status::Waiting);
    let m = s.memory_breakdown();
    assert_eq!(m.admission_block, AdmissionBlock::Memory);
    assert_eq!((m.external, m.free), (3, 0));
    // A: 3 states, final KV length 3 in 4 slots; C: 2 states, final 2 in 3.
    assert_eq!((m.token_states, m.reservation, m.internal), (5, 0, 2));
    assert_eq!(step(&mut s, 5), vec![1, 3]);
    s.schedule();
    assert_eq!(blocks(&s, 4), vec![0, 1, 2, 3, 4], "first fit");
}

#[test]
fn reserving_policies_reject_forks_and_groups() {
    let mut s = reserving(AllocationPolicyKind::ReserveOracle, 64, 64);
    let mut r = hinted(1, 4, 4, None);
    r.pending_children = vec![2];
    assert!(matches!(s.add(r), Err(AddError::NeedsPaged { .. })));
    s.add(hinted(1, 4, 4, None)).unwrap();
    step(&mut s, 5);
    assert!(matches!(s.fork(1, 9), Err(AddError::NeedsPaged { .. })));
}

#[test]
fn paged_breakdown_counts_the_last_block_tail() {
    // Block size 4, prompt 6, max_tokens 4: final KV length 9 (3 blocks).
    let mut s = Scheduler::new(config(8, 4)).unwrap();
    s.add(hinted(1, 6, 4, None)).unwrap();
    s.schedule();
    let m = s.memory_breakdown();
    // 2 blocks: 6 states, slots 6 and 7 will hold tokens 7 and 8.
    assert_eq!((m.token_states, m.reservation, m.internal), (6, 2, 0));
    assert_eq!((m.free, m.external, m.total), (24, 0, 32));
    s.update(&[5]);
    s.schedule();
    s.update(&[5]);
    s.schedule();
    s.update(&[5]);
    s.schedule(); // 9 states in 3 blocks: slots 9..12 never used
    let m = s.memory_breakdown();
    assert_eq!((m.token_states, m.reservation, m.internal), (9, 0, 3));
    assert_eq!(step(&mut s, 5), vec![1]);
    assert_eq!(s.kv().pool().num_free(), 8);
}
