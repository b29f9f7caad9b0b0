//! Allocation policies (the paper's Fig. 2 baselines): reservation sizes,
//! stopping at the reservation, draining without leaks, static batching,
//! external fragmentation, rejected forks, and the paged memory breakdown.

mod common;

use common::*;

use pagedrs_sched::scheduler::{
    AddError, AdmissionBlock, AllocationPolicyKind, FinishReason, Scheduler, Status, StepBatch,
};

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
            let len = *reserved.entry(r.id).or_insert(r.block_tables[0].len());
            assert_eq!(r.block_tables[0].len(), len, "request {} grew", r.id);
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
        assert_eq!(r.block_tables[0].len(), want, "{policy:?}");
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
        assert_eq!(s.request(1).unwrap().block_tables[0].len(), 10);
        let b = StepBatch::build(&s);
        assert!(b.groups[0].slot_mapping.iter().all(|&x| x < 10));
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
    let blocks = |s: &Scheduler, id| s.request(id).unwrap().block_tables[0].blocks().to_vec();
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
