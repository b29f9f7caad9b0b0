//! Scheduler behaviour through its public API: continuous batching, token
//! budget, preemption by recompute, and block accounting.

use _core::scheduler::{
    FinishReason, Request, SamplingConfig, Scheduler, SchedulerConfig, StepBatch, StopConfig,
};
use proptest::prelude::*;

fn config(num_blocks: usize, block_size: usize) -> SchedulerConfig {
    SchedulerConfig {
        num_blocks,
        block_size,
        max_num_seqs: 8,
        max_num_batched_tokens: 64,
        max_model_len: 256,
        enable_chunked_prefill: true,
    }
}

fn request(id: u64, prompt_len: usize, max_tokens: usize) -> Request {
    Request {
        id,
        token_ids: (0..prompt_len as u32).map(|t| t + 10).collect(),
        num_prompt_tokens: 0,
        num_computed_tokens: 0,
        block_table: Default::default(),
        sampling: SamplingConfig::default(),
        stop: StopConfig {
            max_tokens,
            min_tokens: 0,
            stop_token_ids: vec![2],
        },
        num_preemptions: 0,
    }
}

/// Run one step sampling token `tok` for every row; return finished ids.
fn step(s: &mut Scheduler, tok: u32) -> Vec<u64> {
    s.schedule();
    let rows = s.num_sampled_rows();
    s.update(&vec![tok; rows]).into_iter().map(|f| f.id).collect()
}

fn assert_pool_consistent(s: &Scheduler) {
    let pool = s.kv().pool();
    let mut counts = vec![0u32; pool.num_total()];
    for r in s.requests() {
        for &b in r.block_table.blocks() {
            counts[b as usize] += 1;
        }
    }
    for (b, &c) in counts.iter().enumerate() {
        assert_eq!(pool.ref_count(b as u32), c, "ref count of block {b}");
    }
    let used = counts.iter().filter(|&&c| c > 0).count();
    assert_eq!(pool.num_free() + used, pool.num_total(), "no leak");
}

#[test]
fn prefill_then_decode_until_max_tokens() {
    let mut s = Scheduler::new(config(16, 4));
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
    let mut s = Scheduler::new(config(16, 4));
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
    let mut s = Scheduler::new(cfg);
    s.add(request(1, 25, 2)).unwrap();
    s.add(request(2, 3, 2)).unwrap();
    assert_eq!(s.schedule(), &[(1, 10)]);
    assert_eq!(s.num_sampled_rows(), 0);
    s.update(&[]);
    assert_eq!(s.schedule(), &[(1, 10)]);
    s.update(&[]);
    assert_eq!(s.schedule(), &[(1, 5), (2, 3)]);
    assert_eq!(s.num_sampled_rows(), 2);
    s.update(&[5, 5]);
    assert_pool_consistent(&s);
}

#[test]
fn max_num_seqs_limits_the_batch() {
    let mut cfg = config(64, 4);
    cfg.max_num_seqs = 2;
    let mut s = Scheduler::new(cfg);
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
    });
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
    assert_eq!(r2.num_tokens(), 9, "generated tokens are kept for recompute");
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
    let mut s = Scheduler::new(config(16, 4));
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
    let mut s = Scheduler::new(config(16, 4));
    assert!(s.add(request(1, 0, 4)).is_err());
    assert!(s.add(request(2, 256, 4)).is_err());
    s.add(request(3, 4, 4)).unwrap();
    assert!(s.add(request(3, 4, 4)).is_err());
}

#[derive(Debug, Clone)]
enum Op {
    Add { prompt: usize, max_tokens: usize },
    Step { token: u32 },
    Abort { pick: usize },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        (1usize..40, 1usize..30).prop_map(|(prompt, max_tokens)| Op::Add { prompt, max_tokens }),
        (0u32..4).prop_map(|token| Op::Step { token }),
        (0usize..16).prop_map(|pick| Op::Abort { pick }),
    ]
}

proptest! {
    /// Random interleavings never leak or double-free a block, ref counts match
    /// the block tables, and draining every request frees the whole pool.
    #[test]
    fn random_interleavings_keep_the_pool_consistent(
        ops in proptest::collection::vec(op(), 1..80),
        num_blocks in 16usize..40,
        block_size in prop_oneof![Just(1usize), Just(4), Just(16)],
    ) {
        let mut s = Scheduler::new(SchedulerConfig {
            num_blocks,
            block_size,
            max_num_seqs: 6,
            max_num_batched_tokens: 48,
            max_model_len: 64.min(num_blocks * block_size),
            enable_chunked_prefill: true,
        });
        let mut next = 0u64;
        for op in ops {
            match op {
                Op::Add { prompt, max_tokens } => {
                    let _ = s.add(request(next, prompt, max_tokens));
                    next += 1;
                }
                Op::Step { token } => {
                    step(&mut s, token);
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
            step(&mut s, 3);
            assert_pool_consistent(&s);
        }
        prop_assert!(s.is_idle(), "every request finishes");
        prop_assert_eq!(s.kv().pool().num_free(), num_blocks);
    }
}
