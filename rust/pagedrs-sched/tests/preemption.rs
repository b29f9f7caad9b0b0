//! Preemption when the pool runs dry: by recompute, by swapping to the CPU
//! pool and back, and of whole sequence groups.

mod common;

use common::*;

use pagedrs_sched::scheduler::{PreemptionMode, Scheduler, SchedulerConfig, Status};

#[test]
fn preemption_by_recompute_when_blocks_run_out() {
    // 4 blocks of 4 tokens; two requests of 7 tokens take 2 blocks each.
    let mut s = Scheduler::new(config(4, 4)).unwrap();
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
fn preemption_takes_a_whole_group() {
    let mut s = Scheduler::new(config(8, 4)).unwrap();
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
