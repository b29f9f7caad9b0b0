//! Forks and sequence groups: copy-on-write of a shared partial block,
//! parallel sampling, beam forks and the hold token.

mod common;

use common::*;

use pagedrs_sched::scheduler::{Scheduler, StepBatch};

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
    assert_eq!(
        r1.block_tables[0].blocks()[0],
        r2.block_tables[0].blocks()[0]
    );
    assert_ne!(
        r1.block_tables[0].blocks()[1],
        r2.block_tables[0].blocks()[1]
    );
    assert_eq!(
        moves[0],
        (
            r2.block_tables[0].blocks()[1],
            r1.block_tables[0].blocks()[1]
        )
    );
    assert_no_shared_writes(&s);
    s.update(&[6, 7]);
    assert_pool_consistent(&s);
}

#[test]
fn parallel_sampling_group_shares_prompt_blocks_and_is_preempted_whole() {
    let mut s = Scheduler::new(config(8, 4)).unwrap();
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
fn beam_fork_replaces_the_uncomputed_last_token_and_hold_reruns_it() {
    let mut s = prefix_cached(16, 4);
    s.add(request(1, 7, 10)).unwrap();
    step(&mut s, 5); // tokens: 7 prompt + [5]; 7 computed
    s.fork_with_last_token(1, 2, Some(9)).unwrap();
    assert_eq!(s.request(1).unwrap().output_token_ids(), &[5]);
    assert_eq!(s.request(2).unwrap().output_token_ids(), &[9]);
    assert_eq!(s.schedule(), &[(1, 1), (2, 1)]);
    let b = StepBatch::build(&s);
    assert_eq!(b.input_ids, vec![5, 9]);
    // Request 2 holds: nothing appended, its token runs again.
    s.update(&[6, pagedrs_sched::scheduler::HOLD_TOKEN]);
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
