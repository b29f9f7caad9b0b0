//! Continuous batching through the public API: prefill then decode, stop
//! tokens, the token budget and chunked prefill, `max_num_seqs`, aborts,
//! rejected requests and configurations.

mod common;

use common::*;

use pagedrs_sched::scheduler::{FinishReason, Scheduler, SchedulerConfig, StepBatch};

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
    assert_eq!(b.groups[0].max_blocks, 2);
    assert_eq!(b.logits_indices, vec![5]);
    let bt = &b.groups[0].block_tables;
    assert_eq!(b.groups[0].slot_mapping[4], bt[1] as i64 * 4);
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

#[test]
fn new_rejects_invalid_configurations() {
    use pagedrs_sched::scheduler::ConfigError;
    let err = |cfg| Scheduler::new(cfg).unwrap_err();
    let mut zero = config(16, 4);
    zero.max_num_seqs = 0;
    assert_eq!(
        err(zero),
        ConfigError::NotPositive {
            arg: "max_num_seqs",
            value: 0
        }
    );
    let small = SchedulerConfig {
        max_model_len: 65,
        ..config(16, 4)
    };
    assert!(matches!(err(small), ConfigError::KvCacheTooSmall { .. }));
    let no_chunks = SchedulerConfig {
        enable_chunked_prefill: false,
        max_num_batched_tokens: 32,
        ..config(16, 4)
    };
    assert!(matches!(
        err(no_chunks),
        ConfigError::BudgetBelowModelLen { .. }
    ));
}
