//! The priority scheduling policy (vLLM's semantics: lower value first, then
//! arrival): queue order, preemption of worse running groups when the KV
//! cache or max_num_seqs is the limit, preempted requests keeping their
//! place, and first come, first served among equals.

mod common;

use common::*;

use pagedrs_sched::scheduler::{AddError, Scheduler, SchedulerConfig, SchedulingPolicy};

fn priority(num_blocks: usize, max_num_seqs: usize) -> Scheduler {
    Scheduler::new(SchedulerConfig {
        scheduling_policy: SchedulingPolicy::Priority,
        max_num_seqs,
        max_model_len: 64,
        ..config(num_blocks, 4)
    })
    .unwrap()
}

fn with_priority(
    id: u64,
    prompt: usize,
    max_tokens: usize,
    p: i64,
) -> pagedrs_sched::scheduler::Request {
    let mut r = request(id, prompt, max_tokens);
    r.stop.stop_token_ids.clear();
    r.priority = p;
    r
}

fn running(s: &Scheduler) -> Vec<u64> {
    let mut ids: Vec<u64> = s
        .requests()
        .filter(|r| r.status == pagedrs_sched::scheduler::Status::Running)
        .map(|r| r.id)
        .collect();
    ids.sort();
    ids
}

#[test]
fn fcfs_refuses_a_priority() {
    let mut s = Scheduler::new(config(16, 4)).unwrap();
    let err = s.add(with_priority(1, 4, 4, 3)).unwrap_err();
    assert_eq!(err, AddError::PriorityNeedsPolicy(3));
    assert!(err
        .to_string()
        .contains("priority scheduling is not enabled"));
}

#[test]
fn waiting_queue_runs_by_priority_then_arrival() {
    let mut s = priority(64, 2);
    for (id, p) in [(1, 5), (2, 0), (3, 5), (4, -1)] {
        s.add(with_priority(id, 4, 2, p)).unwrap();
    }
    s.schedule();
    assert_eq!(running(&s), vec![2, 4], "-1 and 0 first");
    let n = s.num_sampled_tokens();
    s.update(&vec![3; n]);
    while running(&s) != vec![1, 3] {
        checked_step(&mut s, 3);
    }
}

#[test]
fn a_better_request_preempts_when_max_num_seqs_is_the_limit() {
    let mut s = priority(64, 2);
    s.add(with_priority(1, 4, 20, 1)).unwrap();
    s.add(with_priority(2, 4, 20, 2)).unwrap();
    checked_step(&mut s, 3);
    assert_eq!(running(&s), vec![1, 2]);
    s.add(with_priority(3, 4, 20, 0)).unwrap();
    checked_step(&mut s, 3);
    assert_eq!(running(&s), vec![1, 3], "the worst (2) made room");
    assert_eq!(s.stats().num_preemptions, 1);
    // An equal or worse newcomer preempts nobody.
    s.add(with_priority(4, 4, 20, 1)).unwrap();
    checked_step(&mut s, 3);
    assert_eq!(running(&s), vec![1, 3]);
    assert_eq!(s.stats().num_preemptions, 1);
}

#[test]
fn a_better_request_preempts_when_the_kv_cache_is_full() {
    // 16 blocks of 4: two requests of 28 tokens hold 14 blocks.
    let mut s = priority(16, 8);
    s.add(with_priority(1, 24, 20, 3)).unwrap();
    s.add(with_priority(2, 24, 20, 3)).unwrap();
    for _ in 0..4 {
        checked_step(&mut s, 3);
    }
    assert_eq!(running(&s), vec![1, 2]);
    s.add(with_priority(3, 20, 4, 0)).unwrap();
    checked_step(&mut s, 3);
    assert!(running(&s).contains(&3), "{:?}", running(&s));
    // The most recent of the equal-priority pair was taken: 1 goes on.
    assert!(running(&s).contains(&1));
    assert_eq!(s.request(2).unwrap().num_computed_tokens, 0, "recomputed");
    while !s.is_idle() {
        checked_step(&mut s, 3);
    }
}

#[test]
fn preempted_requests_keep_their_place() {
    // Request 1 (arrived first) is preempted by 3; it waits ahead of 2, which
    // arrived after it with the same priority.
    let mut s = priority(64, 1);
    s.add(with_priority(1, 4, 20, 1)).unwrap();
    checked_step(&mut s, 3);
    s.add(with_priority(2, 4, 20, 1)).unwrap();
    s.add(with_priority(3, 4, 2, 0)).unwrap();
    checked_step(&mut s, 3);
    assert_eq!(running(&s), vec![3]);
    while s.request(3).is_some() {
        checked_step(&mut s, 3);
    }
    checked_step(&mut s, 3);
    assert_eq!(running(&s), vec![1], "back in its place, ahead of 2");
}
