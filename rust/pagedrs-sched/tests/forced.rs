//! Forced tokens (jump-forward decoding): a running request's pending
//! token replaced between steps by a run the next step computes whole.

mod common;

use common::*;

use pagedrs_sched::scheduler::{
    FinishReason, ReplacePendingError, Scheduler, SchedulerConfig, StepBatch,
};

#[test]
fn a_run_replaces_the_pending_token_and_the_next_step_computes_it() {
    let mut s = Scheduler::new(config(16, 4)).unwrap();
    s.add(request(1, 6, 10)).unwrap();
    step(&mut s, 5); // 6 prompt tokens + [5]; 6 computed
    assert_eq!(s.replace_pending(1, &[7, 8, 9]), Ok((3, None)));
    let r = s.request(1).unwrap();
    assert_eq!(
        (r.output_token_ids(), r.num_computed_tokens),
        (&[7u32, 8, 9][..], 6)
    );
    assert_eq!(s.schedule(), &[(1, 3)]);
    let b = StepBatch::build(&s);
    assert_eq!(b.input_ids, vec![7, 8, 9]);
    assert_eq!(b.positions, vec![6, 7, 8]);
    assert_eq!(s.num_sampled_tokens(), 1);
    assert_no_shared_writes(&s);
    s.update(&[4]);
    let r = s.request(1).unwrap();
    assert_eq!(
        (r.output_token_ids(), r.num_computed_tokens),
        (&[7u32, 8, 9, 4][..], 9)
    );
    assert_pool_consistent(&s);
}

#[test]
fn a_stop_token_or_max_tokens_inside_the_run_ends_the_request_there() {
    let mut s = Scheduler::new(config(16, 4)).unwrap();
    s.add(request(1, 6, 10)).unwrap();
    s.add(request(2, 6, 3)).unwrap();
    step(&mut s, 5);
    let (n, f) = s.replace_pending(1, &[7, 2, 9]).unwrap();
    let f = f.unwrap();
    assert_eq!(
        (n, f.reason, f.stop_token),
        (2, FinishReason::Stop, Some(2))
    );
    assert_eq!(f.output_token_ids, vec![7, 2]);
    let (n, f) = s.replace_pending(2, &[7, 8, 9, 6]).unwrap();
    let f = f.unwrap();
    assert_eq!((n, f.reason), (3, FinishReason::Length));
    assert_eq!(f.output_token_ids, vec![7, 8, 9]);
    assert!(s.request(1).is_none() && s.request(2).is_none());
    assert_idle_frees_all(&s);
}

#[test]
fn only_a_single_pending_token_between_steps_is_replaced() {
    let mut s = Scheduler::new(config(16, 4)).unwrap();
    assert_eq!(
        s.replace_pending(1, &[7]),
        Err(ReplacePendingError::Unknown(1))
    );
    s.add(request(1, 6, 10)).unwrap();
    // Waiting, nothing generated: no pending output token.
    assert_eq!(
        s.replace_pending(1, &[7]),
        Err(ReplacePendingError::NotPending(1))
    );
    step(&mut s, 5);
    assert_eq!(s.replace_pending(1, &[]), Err(ReplacePendingError::Empty));
    s.schedule();
    // In a step in flight.
    assert_eq!(
        s.replace_pending(1, &[7]),
        Err(ReplacePendingError::NotPending(1))
    );
    s.update(&[6]);
    assert_eq!(s.replace_pending(1, &[7, 8]), Ok((2, None)));
    // Two pending tokens now: the first of them is not the sampled one.
    assert_eq!(
        s.replace_pending(1, &[9]),
        Err(ReplacePendingError::NotPending(1))
    );
    assert_eq!(s.request(1).unwrap().output_token_ids(), &[5, 7, 8]);
}

#[test]
fn prefix_cache_blocks_hold_the_replacing_tokens() {
    let cfg = SchedulerConfig {
        enable_prefix_caching: true,
        ..config(16, 4)
    };
    let mut s = Scheduler::new(cfg).unwrap();
    s.add(request(1, 7, 10)).unwrap();
    step(&mut s, 5); // 7 prompt + [5]: the second block, full, was hashed with 5
    s.replace_pending(1, &[6, 7, 8, 9, 3]).unwrap();
    step(&mut s, 4); // computes 6, 7, 8, 9, 3: blocks 2 and 3 full
    let mut tokens: Vec<u32> = (0..7).map(|t| t + 10).collect();
    tokens.extend([6, 7, 8, 9, 3, 4]);
    assert_eq!(s.request(1).unwrap().token_ids, tokens);
    // A request with the same tokens finds all three full blocks cached.
    s.add(request_with(2, tokens.clone(), 4)).unwrap();
    s.schedule();
    assert_eq!(s.scheduled().iter().find(|(id, _)| *id == 2), Some(&(2, 1)));
    let mut other = tokens.clone();
    other[7] = 5; // the replaced token's block was never cached: only block 0 is
    s.update(&[1, 1]);
    s.add(request_with(3, other, 4)).unwrap();
    s.schedule();
    assert_eq!(s.scheduled().iter().find(|(id, _)| *id == 3), Some(&(3, 9)));
}
