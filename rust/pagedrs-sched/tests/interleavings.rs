//! Randomized interleavings of adds (with parallel-sampling groups and
//! shared prefixes), steps, aborts, forks (beam forks with a new last token
//! too) and cancelled steps under every preemption mode, with and without
//! prefix caching, with and without speculative decoding (ngram or suffix
//! proposers; each step accepts a random number of each row's drafts, all
//! or none included). Every invariant of `common` is checked after every
//! step and every other operation, and after each update: no rejected
//! draft keeps a slot, and only verified tokens are hashed. Seeds of past
//! failures are replayed from `interleavings.proptest-regressions`; 10,000
//! cases a run.

mod common;

use common::*;

use pagedrs_sched::kv_cache::KvCacheGroupSpec;
use pagedrs_sched::scheduler::{
    AllocationPolicyKind, PreemptionMode, Scheduler, SchedulerConfig, SchedulingPolicy, Status,
};
use pagedrs_sched::spec_decode::{SpecMethod, SpeculativeConfig, StepCost, StepCostModel};
use proptest::prelude::*;

#[derive(Debug, Clone)]
enum Op {
    /// A prompt drawn from a few shared prefixes, so the prefix cache hits.
    Add {
        prefix: u32,
        prompt: usize,
        max_tokens: usize,
        children: usize,
        priority: i64,
    },
    /// A step whose rows accept a number of their drafts drawn from
    /// `accept` (all of them from 6 up), then sample `token`.
    Step {
        token: u32,
        accept: usize,
    },
    /// A step scheduled, then cancelled (its forward pass failed).
    Cancel,
    Abort {
        pick: usize,
    },
    /// A fork; with `last`, a beam fork continuing with that token.
    Fork {
        pick: usize,
        last: Option<u32>,
    },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        (0u32..3, 1usize..40, 1usize..30, 0usize..3, -2i64..3).prop_map(
            |(prefix, prompt, max_tokens, children, priority)| Op::Add {
                prefix,
                prompt,
                max_tokens,
                children,
                priority,
            }
        ),
        (0u32..4, 0usize..8).prop_map(|(token, accept)| Op::Step { token, accept }),
        (0u32..4, 0usize..8).prop_map(|(token, accept)| Op::Step { token, accept }),
        Just(Op::Cancel),
        (0usize..16).prop_map(|pick| Op::Abort { pick }),
        (0usize..16, proptest::option::of(0u32..4))
            .prop_map(|(pick, last)| Op::Fork { pick, last }),
    ]
}

/// Off, ngram or suffix, with small random settings, drafting in full or
/// under the goodput policy's cost model.
fn speculative_config() -> impl Strategy<Value = Option<SpeculativeConfig>> {
    let proposer = prop_oneof![
        (1usize..6, 1usize..3, 0usize..2).prop_map(|(k, lo, extra)| SpeculativeConfig {
            num_speculative_tokens: k,
            prompt_lookup_min: lo,
            prompt_lookup_max: lo + extra,
            ..SpeculativeConfig::new(SpecMethod::Ngram)
        }),
        (1usize..6, 2usize..8, 0.5f64..4.0, 0.0f64..0.5, 0usize..3).prop_map(
            |(k, depth, factor, prob, cached)| SpeculativeConfig {
                num_speculative_tokens: k,
                suffix_decoding_max_tree_depth: depth,
                suffix_decoding_max_spec_factor: factor,
                suffix_decoding_min_token_prob: prob,
                suffix_decoding_max_cached_requests: cached,
                ..SpeculativeConfig::new(SpecMethod::Suffix)
            }
        ),
    ];
    let costs = prop::option::of((0.001f64..0.02, 0.0f64..0.004, 1.0f64..8.0));
    prop_oneof![
        Just(None),
        (proposer, costs).prop_map(|(spec, costs)| Some(SpeculativeConfig {
            draft_step_costs: costs.map(|(decode_s, draft_s, growth)| {
                StepCostModel::new(vec![
                    StepCost {
                        batch: 1,
                        decode_s,
                        draft_s,
                    },
                    StepCost {
                        batch: 8,
                        decode_s: decode_s * growth,
                        draft_s: draft_s * 2.0,
                    },
                ])
                .expect("valid points")
            }),
            ..spec
        })),
    ]
}

/// Accepted drafts of `row` for a step drawn with `accept`.
fn accepted(accept: usize, row: usize, drafts: usize) -> usize {
    if accept >= 6 {
        drafts
    } else {
        (accept + row * 7) % (drafts + 1)
    }
}

/// One full group (most models), or a hybrid mix of full and sliding-window
/// groups (windows from 1 token to past the longest sequence).
fn kv_cache_groups() -> impl Strategy<Value = Vec<KvCacheGroupSpec>> {
    let group = prop_oneof![
        Just(KvCacheGroupSpec::FULL),
        (1usize..80).prop_map(KvCacheGroupSpec::sliding),
    ];
    prop_oneof![
        Just(vec![KvCacheGroupSpec::FULL]),
        proptest::collection::vec(group, 1..4),
    ]
}

proptest! {
    // 10,000 cases: 2.7 s in `cargo test --release` (Zen 4 EPYC, 2 shared cores).
    #![proptest_config(ProptestConfig::with_cases(10_000))]

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
        groups in kv_cache_groups(),
        priorities in any::<bool>(),
        spec in speculative_config(),
    ) {
        // Each group's blocks come from the one pool.
        let max_model_len = 64.min(num_blocks * block_size);
        let num_blocks = num_blocks * groups.len();
        let mut s = Scheduler::new(SchedulerConfig {
            num_blocks,
            num_cpu_blocks,
            block_size,
            max_num_seqs: 6,
            max_num_batched_tokens: 48,
            max_model_len,
            enable_chunked_prefill: true,
            enable_prefix_caching: caching,
            preemption_mode: if swap { PreemptionMode::Swap } else { PreemptionMode::Recompute },
            allocation_policy: AllocationPolicyKind::Paged,
            kv_cache_groups: groups.clone(),
            scheduling_policy: if priorities { SchedulingPolicy::Priority } else { SchedulingPolicy::Fcfs },
            speculative_config: spec.clone(),
        }).unwrap();
        let mut next = 0u64;
        for op in ops {
            match op {
                Op::Add { prefix, prompt, max_tokens, children, priority } => {
                    let tokens = (0..prompt as u32).map(|t| if t < 20 { prefix * 100 + t } else { next as u32 * 7 + t }).collect();
                    let mut req = request_with(next, tokens, max_tokens);
                    if priorities {
                        req.priority = priority;
                    }
                    req.pending_children = (1..=children as u64).map(|c| next + c).collect();
                    let _ = s.add(req);
                    next += 1 + children as u64;
                }
                Op::Step { token, accept } => {
                    checked_spec_step(&mut s, |_, _, row, d| (accepted(accept, row, d.len()), token));
                }
                Op::Cancel => {
                    s.schedule();
                    assert_no_shared_writes(&s);
                    s.cancel_step();
                    assert_invariants(&s);
                    assert_no_draft_slots_held(&s);
                }
                Op::Fork { pick, last } => {
                    let ids: Vec<u64> = s.requests().map(|r| r.id).collect();
                    if !ids.is_empty() {
                        let parent = ids[pick % ids.len()];
                        let ok = s.fork_with_last_token(parent, next, last).is_ok();
                        if last.is_none() {
                            prop_assert_eq!(ok, s.request(parent).unwrap().status == Status::Running);
                        }
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
            assert_invariants(&s);
        }
        for _ in 0..2000 {
            if s.is_idle() {
                break;
            }
            checked_spec_step(&mut s, |_, _, row, d| (accepted(row, row, d.len()), 3));
        }
        prop_assert!(s.is_idle(), "every request finishes");
        prop_assert_eq!(s.kv().pool().num_free(), num_blocks);
        prop_assert_eq!(s.proposers().map_or(0, |p| p.num_groups()), 0, "no proposer state outlives its group");
    }
}
