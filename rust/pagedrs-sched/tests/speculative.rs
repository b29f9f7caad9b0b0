//! Speculative decoding in the scheduler: with the target model's own
//! tokens accepted (the longest run of drafts equal to what it would
//! produce, then its token), every request's token stream and the prefix
//! cache's blocks equal those of the same run without speculation, under
//! prefix caching, chunked prefill, swap and recompute preemption, sliding
//! windows and parallel sampling; stops and `max_tokens` inside an accepted
//! run cut it; drafts never preempt, stop at `max_model_len`, and give their
//! slots back when rejected.

mod common;

use std::collections::{BTreeMap, BTreeSet};

use common::*;

use pagedrs_sched::kv_cache::{blocks_for, KvCacheGroupSpec, KvEvent};
use pagedrs_sched::scheduler::{
    PreemptionMode, Request, Scheduler, SchedulerConfig, StepBatch, UpdateError,
};
use pagedrs_sched::spec_decode::{SpecMethod, SpeculativeConfig, StepCostModel};

/// Tokens the target model rolls out from `seed` (a prompt whose
/// continuation repeats it once the rollout cycles), or arbitrary ones.
fn prompt(i: u64, len: usize) -> Vec<u32> {
    let mut t = vec![3 + (i % 5) as u32, 4 + (i % 7) as u32, 5 + (i % 11) as u32];
    while t.len() < len {
        let next = if i % 4 == 3 {
            (t.len() as u32 * 13 + i as u32) % 31 + 3 // not the target's
        } else {
            target(&t)
        };
        t.push(next);
    }
    t
}

fn requests() -> Vec<Request> {
    (0..12u64)
        .map(|i| {
            let mut r = request_with(
                i,
                prompt(i, 20 + (i as usize * 37) % 150),
                5 + (i as usize * 13) % 60,
            );
            if i % 5 == 2 {
                r.pending_children = vec![100 + i];
            }
            r
        })
        .collect()
}

#[derive(Debug, PartialEq)]
struct Run {
    /// Per sequence: finish reason and output tokens.
    outputs: BTreeMap<u64, (&'static str, Vec<u32>)>,
    /// Cached (group, hash) keys at the end.
    cached: BTreeSet<(u32, [u8; 32])>,
    /// Hashes of every stored KV event.
    stored: BTreeSet<[u8; 32]>,
}

/// Run `requests` (two arriving per step) to the end; returns the run and
/// the scheduler.
fn run(config: SchedulerConfig) -> (Run, Scheduler) {
    let mut s = Scheduler::new(config).unwrap();
    s.enable_kv_events(true);
    let mut pending = requests().into_iter();
    let mut outputs = BTreeMap::new();
    let mut stored = BTreeSet::new();
    for _ in 0..5000 {
        if !arrive(&mut s, &mut pending, 2) {
            break;
        }
        for f in checked_spec_step(&mut s, verify) {
            outputs.insert(f.id, (f.reason.as_str(), f.output_token_ids));
        }
        for e in s.take_kv_events() {
            if let KvEvent::Stored { block_hashes, .. } = e {
                stored.extend(block_hashes);
            }
        }
    }
    assert!(s.is_idle());
    assert_eq!(s.kv().pool().num_free(), s.kv().pool().num_total());
    assert_eq!(s.proposers().map_or(0, |p| p.num_groups()), 0);
    let cached = s.kv().pool().cached_keys().copied().collect();
    (
        Run {
            outputs,
            cached,
            stored,
        },
        s,
    )
}

fn ngram(k: usize) -> SpeculativeConfig {
    SpeculativeConfig {
        num_speculative_tokens: k,
        prompt_lookup_min: 1,
        prompt_lookup_max: 3,
        ..SpeculativeConfig::new(SpecMethod::Ngram)
    }
}

fn suffix(k: usize) -> SpeculativeConfig {
    SpeculativeConfig {
        num_speculative_tokens: k,
        suffix_decoding_max_tree_depth: 12,
        suffix_decoding_max_spec_factor: 2.0,
        ..SpeculativeConfig::new(SpecMethod::Suffix)
    }
}

/// `spec` under the goodput draft-length policy with a cost model where
/// draft lengths vary with the batch and each sequence's acceptance.
fn goodput(spec: SpeculativeConfig) -> SpeculativeConfig {
    let points = [(1, 0.010, 0.0005), (16, 0.040, 0.002)];
    SpeculativeConfig {
        draft_step_costs: Some(StepCostModel::from_points(&points).unwrap()),
        ..spec
    }
}

/// Same streams with and without speculation; with `same_blocks`, the
/// same cached blocks and stored events too (a pool that never evicts).
fn assert_lossless(base: SchedulerConfig, same_blocks: bool) {
    let (plain, p) = run(base.clone());
    let mut rejected = 0;
    for spec in [
        ngram(1),
        ngram(4),
        suffix(3),
        suffix(8),
        goodput(ngram(4)),
        goodput(suffix(8)),
    ] {
        let (fast, s) = run(SchedulerConfig {
            speculative_config: Some(spec.clone()),
            ..base.clone()
        });
        assert_eq!(fast.outputs, plain.outputs, "{spec:?}");
        if same_blocks {
            assert_eq!(p.kv().pool().num_evictions(), 0);
            assert_eq!(s.kv().pool().num_evictions(), 0);
            assert_eq!(fast.cached, plain.cached, "{spec:?}");
            assert_eq!(fast.stored, plain.stored, "{spec:?}");
        }
        let st = s.stats();
        assert!(st.spec_num_accepted_tokens > 0, "{spec:?}: {st:?}");
        rejected += st.spec_num_draft_tokens - st.spec_num_accepted_tokens;
        assert!(
            st.num_steps < p.stats().num_steps,
            "{spec:?}: {} steps vs {}",
            st.num_steps,
            p.stats().num_steps
        );
    }
    assert!(rejected > 0, "some drafts were rejected");
    assert_eq!(
        plain.outputs.len(),
        12 + 2,
        "every sequence finished (2 children)"
    );
    assert!(plain.outputs.values().any(|(r, _)| *r == "stop"));
    assert!(plain.outputs.values().any(|(r, _)| *r == "length"));
}

fn roomy() -> SchedulerConfig {
    SchedulerConfig {
        enable_prefix_caching: true,
        max_num_batched_tokens: 96,
        ..config(400, 4)
    }
}

#[test]
fn exact_acceptance_reproduces_streams_and_blocks() {
    assert_lossless(roomy(), true);
}

#[test]
fn exact_acceptance_is_lossless_under_chunked_prefill_and_preemption() {
    for mode in [PreemptionMode::Recompute, PreemptionMode::Swap] {
        let tight = SchedulerConfig {
            enable_prefix_caching: true,
            max_num_batched_tokens: 24,
            num_cpu_blocks: 40,
            preemption_mode: mode,
            ..config(64, 4)
        };
        assert_lossless(tight.clone(), false);
        let (_, s) = run(SchedulerConfig {
            speculative_config: Some(ngram(4)),
            ..tight
        });
        assert!(s.stats().num_preemptions > 0, "{mode:?}");
    }
}

#[test]
fn exact_acceptance_is_lossless_with_sliding_windows() {
    let hybrid = SchedulerConfig {
        kv_cache_groups: vec![KvCacheGroupSpec::FULL, KvCacheGroupSpec::sliding(9)],
        enable_prefix_caching: true,
        max_num_batched_tokens: 96,
        ..config(4000, 4)
    };
    assert_lossless(hybrid, true);
}

fn one(spec: SpeculativeConfig, prompt: Vec<u32>, max_tokens: usize) -> Scheduler {
    let mut s = Scheduler::new(SchedulerConfig {
        speculative_config: Some(spec),
        max_model_len: 64,
        ..config(64, 4)
    })
    .unwrap();
    s.add(request_with(1, prompt, max_tokens)).unwrap();
    s
}

/// "5 6 7 8 9 5 6": ngram drafts "7 8 9 5 6 ..." after the first sample.
fn looping() -> Vec<u32> {
    vec![5, 6, 7, 8, 9, 5, 6, 7, 8, 9, 5, 6]
}

#[test]
fn a_stop_token_inside_an_accepted_run_cuts_it() {
    let mut s = one(ngram(4), looping(), 50);
    step(&mut s, 7); // prefill; samples 7
    s.schedule();
    let b = StepBatch::build(&s);
    assert_eq!(b.num_draft_tokens, vec![4]);
    assert_eq!(b.draft_token_ids, vec![8, 9, 5, 6]);
    // The pending 7 at position 12, then the drafts at 13..=16.
    assert_eq!(b.positions, (12..17).collect::<Vec<_>>());
    assert_eq!(b.input_ids, vec![7, 8, 9, 5, 6]);
    assert_eq!(b.spec_logits_indices, vec![0, 1, 2, 3, 4]);
    assert_eq!(b.logits_indices, vec![4]);
    // The target agrees with 8 and 9, then says 2 (a stop) where 5 was drafted.
    let f = s.update_accepted(&[8, 9, 2], Some(&[2])).unwrap();
    assert_eq!(f.len(), 1);
    assert_eq!(f[0].output_token_ids, vec![7, 8, 9, 2]);
    assert_eq!(f[0].stop_token, Some(2));
    assert_eq!(s.kv().pool().num_free(), 64);
}

#[test]
fn max_tokens_inside_an_accepted_run_cuts_it_and_drafts_respect_limits() {
    // max_tokens 3: after the first sample, at most 1 draft (2 more tokens).
    let mut s = one(ngram(4), looping(), 3);
    step(&mut s, 7);
    s.schedule();
    assert_eq!(StepBatch::build(&s).draft_token_ids, vec![8]);
    let f = s.update_accepted(&[8, 9], Some(&[1])).unwrap();
    assert_eq!(f[0].output_token_ids, vec![7, 8, 9]);
    assert_eq!(f[0].reason.as_str(), "length");

    // max_model_len 64 with a prompt of 58: after the first sample (59
    // tokens) at most 64 - 59 - 1 = 4 drafts, then 2, then none.
    let long: Vec<u32> = (0..58).map(|i| 5 + i % 5).collect();
    let mut s = one(ngram(8), long, 100);
    step(&mut s, 8);
    s.schedule();
    assert_eq!(StepBatch::build(&s).num_draft_tokens, vec![4]);
    // Reject all: the pending token's slot stays, the drafts' block goes.
    let free = s.kv().pool().num_free();
    let row = sampled_rows(&s);
    let f = s.update_accepted(&[99], Some(&[0])).unwrap();
    assert!(f.is_empty());
    assert!(s.kv().pool().num_free() > free, "{row:?}");
    let r = s.request(1).unwrap();
    assert_eq!(r.num_tokens(), 60);
    assert_eq!(r.block_tables[0].len(), blocks_for(60, 4));
}

#[test]
fn drafts_never_preempt_and_take_only_spare_blocks() {
    // Two requests fill the pool; drafts would need blocks nobody has.
    let mut s = Scheduler::new(SchedulerConfig {
        speculative_config: Some(ngram(8)),
        max_model_len: 32,
        ..config(8, 4)
    })
    .unwrap();
    s.add(request_with(1, looping()[..11].to_vec(), 20))
        .unwrap();
    s.add(request_with(2, looping()[..11].to_vec(), 20))
        .unwrap();
    step(&mut s, 6); // both prefilled: 3 blocks each (12 tokens), 2 free
    s.schedule();
    let b = StepBatch::build(&s);
    assert_eq!(s.stats().num_preemptions, 0);
    // Each pending token fits its third block; the first request's drafts
    // (all its proposer has: 7 8 9 5 6) take the two spare blocks, the
    // second's get none rather than preempting anyone.
    assert_eq!(b.num_draft_tokens, vec![5, 0], "{b:?}");
    assert_eq!(b.draft_token_ids, vec![7, 8, 9, 5, 6]);
    assert_eq!(s.kv().pool().num_free(), 0);
    update_with(&mut s, |_, _, _, d| (d.len(), 2));
    assert_eq!(s.num_running(), 0);
    assert_eq!(s.kv().pool().num_free(), 8);
}

#[test]
fn update_refuses_bad_acceptance_and_applies_nothing() {
    let mut s = one(ngram(4), looping(), 50);
    step(&mut s, 7);
    s.schedule();
    assert_eq!(
        s.update_accepted(&[8, 9, 1], Some(&[5])),
        Err(UpdateError::TooManyAccepted {
            row: 0,
            accepted: 5,
            drafts: 4
        })
    );
    assert_eq!(
        s.update_accepted(&[8, 1, 1], Some(&[2]))
            .unwrap_err()
            .to_string(),
        "row 0: accepted token 1 at draft position 1 is not the draft (9)"
    );
    assert!(matches!(
        s.update_accepted(&[8, 9], Some(&[2])),
        Err(UpdateError::SampledLength {
            got: 2,
            expected: 3
        })
    ));
    assert!(matches!(
        s.update_accepted(&[8], Some(&[0, 0])),
        Err(UpdateError::AcceptedLength { got: 2, rows: 1 })
    ));
    // Still in flight, unchanged: accept all four and the bonus.
    let f = s.update_accepted(&[8, 9, 5, 6, 7], Some(&[4])).unwrap();
    assert!(f.is_empty());
    let r = s.request(1).unwrap();
    assert_eq!(r.output_token_ids(), &[7, 8, 9, 5, 6, 7]);
    assert_eq!(r.num_computed_tokens, r.num_tokens() - 1);
}

#[test]
fn per_request_cap_turns_speculation_off() {
    let mut s = one(ngram(4), looping(), 50);
    let mut r = request_with(2, looping(), 50);
    r.num_speculative_tokens = Some(0);
    s.add(r).unwrap();
    step(&mut s, 7);
    s.schedule();
    let b = StepBatch::build(&s);
    assert_eq!(b.sample_request_ids, vec![1, 2]);
    assert_eq!(b.num_draft_tokens, vec![4, 0]);
    assert_eq!(b.spec_logits_indices, vec![0, 1, 2, 3, 4, 5]);
    assert_eq!(b.logits_indices, vec![4, 5]);
}

#[test]
fn copy_on_write_covers_every_block_a_draft_run_touches() {
    // Block size 4, prompt of 6: block 1 (positions 4..8) is partial and
    // shared by the parallel-sampling pair after the first sample.
    let mut s = Scheduler::new(SchedulerConfig {
        speculative_config: Some(ngram(5)),
        ..config(32, 4)
    })
    .unwrap();
    let mut r = request_with(1, vec![5, 6, 7, 5, 6, 7], 30);
    r.pending_children = vec![2];
    s.add(r).unwrap();
    step(&mut s, 5); // both sequences: 5 6 7 5 6 7 | 5
    let shared = s.request(1).unwrap().block_tables[0].blocks()[1];
    assert_eq!(s.request(2).unwrap().block_tables[0].blocks()[1], shared);
    s.schedule();
    assert_no_shared_writes(&s);
    let b = StepBatch::build(&s);
    // Each writes its pending 5 at position 6 and drafts what followed
    // "6 7 5" before (6 7 5) at 7..10.
    assert_eq!(b.num_draft_tokens, vec![3, 3]);
    assert_eq!(b.draft_token_ids, vec![6, 7, 5, 6, 7, 5]);
    // The first writer copies the shared block; the second then holds it alone.
    assert_eq!(s.moves().copies.len(), 1);
    assert_eq!(s.moves().copies[0].0, shared);
    let t1 = s.request(1).unwrap().block_tables[0].blocks().to_vec();
    let t2 = s.request(2).unwrap().block_tables[0].blocks().to_vec();
    assert_eq!(t1[0], t2[0], "the full block stays shared");
    assert_ne!(t1[1], t2[1]);
    assert_eq!((t1.len(), t2.len()), (3, 3));
    // One accepts none, the other 2 drafts: 1 gives back block 2 (positions
    // 8..10 hold rejected drafts only), 2 keeps it (position 8 is verified).
    update_with(&mut s, |_, id, _, _| if id == 1 { (0, 9) } else { (2, 9) });
    assert_eq!(s.request(1).unwrap().block_tables[0].len(), 2);
    assert_eq!(s.request(2).unwrap().block_tables[0].len(), 3);
    assert_eq!(s.request(2).unwrap().output_token_ids(), &[5, 6, 7, 9]);
    assert_pool_consistent(&s);
}

#[test]
fn a_reused_id_never_shares_a_live_groups_proposer_state() {
    // Request 1's child 2 outlives it; a new request 1 gets state of its own.
    let mut s = Scheduler::new(SchedulerConfig {
        speculative_config: Some(suffix(4)),
        ..config(64, 4)
    })
    .unwrap();
    let mut r = request_with(1, looping(), 40);
    r.pending_children = vec![2];
    s.add(r).unwrap();
    step(&mut s, 7);
    // 1 stops (token 2), 2 goes on.
    checked_spec_step(&mut s, |_, id, _, _| (0, if id == 1 { 2 } else { 8 }));
    assert!(s.request(1).is_none() && s.request(2).is_some());
    assert_eq!(s.proposers().unwrap().num_groups(), 1);
    s.add(request_with(1, vec![40, 41, 42, 40, 41], 3)).unwrap();
    assert_eq!(s.proposers().unwrap().num_groups(), 2);
    for _ in 0..100 {
        if s.is_idle() {
            break;
        }
        checked_spec_step(&mut s, verify);
    }
    assert!(s.is_idle());
    assert_eq!(s.proposers().unwrap().num_groups(), 0);
}
