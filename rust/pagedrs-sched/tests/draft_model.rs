//! `method = "draft_model"` in the scheduler: the draft slots hold
//! placeholders until `set_draft_tokens` writes a draft model's tokens in;
//! with the draft's KV as a second full-attention group, the streams equal
//! those without speculation under prefix caching, chunked prefill, and
//! recompute and swap preemption, both groups' rejected slots return, and
//! every block is free at the end.

mod common;

use std::collections::BTreeMap;

use common::*;

use pagedrs_sched::kv_cache::KvCacheGroupSpec;
use pagedrs_sched::scheduler::{PreemptionMode, Request, Scheduler, SchedulerConfig, Status};
use pagedrs_sched::spec_decode::{SpecMethod, SpeculativeConfig, DRAFT_PLACEHOLDER};

/// The "draft model": the target's token, but a wrong one at every third
/// position (some drafts rejected, some accepted).
fn draft(ctx: &[u32]) -> u32 {
    let t = target(ctx);
    if ctx.len().is_multiple_of(3) {
        t % 13 + 4
    } else {
        t
    }
}

fn requests() -> Vec<Request> {
    (0..10u64)
        .map(|i| {
            let p = (0..(12 + (i as usize * 29) % 90))
                .map(|k| 3 + ((k as u64 * 7 + i * 3) % 11) as u32)
                .collect();
            request_with(i, p, 8 + (i as usize * 13) % 40)
        })
        .collect()
}

/// Write the draft model's tokens into the step in flight, after checking
/// the slots hold placeholders and a wrong length is refused.
fn write_drafts(s: &mut Scheduler) -> usize {
    let mut tokens = Vec::new();
    let scheduled: Vec<u64> = s.scheduled().iter().map(|&(id, _)| id).collect();
    for id in scheduled {
        let r = s.request(id).unwrap();
        assert!(r.draft_tokens.iter().all(|&t| t == DRAFT_PLACEHOLDER));
        let mut ctx = r.token_ids.clone();
        for _ in 0..r.draft_tokens.len() {
            let t = draft(&ctx);
            ctx.push(t);
            tokens.push(t);
        }
    }
    if !tokens.is_empty() {
        let err = s.set_draft_tokens(&tokens[1..]).unwrap_err();
        assert_eq!((err.got, err.expected), (tokens.len() - 1, tokens.len()));
    }
    s.set_draft_tokens(&tokens).unwrap();
    tokens.len()
}

/// The draft's group holds a slot for every position the target's holds
/// (drafts included): the same number of blocks in both tables.
fn assert_groups_cover_the_same_slots(s: &Scheduler) {
    for r in s.requests().filter(|r| r.status == Status::Running) {
        let (t, d) = (&r.block_tables[0], &r.block_tables[1]);
        assert_eq!(t.len(), d.len(), "request {}", r.id);
    }
}

/// Run every request to the end; the outputs per sequence and the scheduler.
fn run(config: SchedulerConfig) -> (BTreeMap<u64, (&'static str, Vec<u32>)>, Scheduler) {
    let mut s = Scheduler::new(config).unwrap();
    let mut pending = requests().into_iter();
    let mut outputs = BTreeMap::new();
    for _ in 0..5000 {
        if !arrive(&mut s, &mut pending, 2) {
            break;
        }
        s.schedule();
        assert_groups_cover_the_same_slots(&s);
        write_drafts(&mut s);
        assert_no_shared_writes(&s);
        assert_invariants(&s);
        for f in update_with(&mut s, verify) {
            outputs.insert(f.id, (f.reason.as_str(), f.output_token_ids));
        }
        assert_invariants(&s);
        assert_no_draft_slots_held(&s);
        assert_hashes_verified(&s);
    }
    assert!(s.is_idle());
    assert_eq!(s.kv().pool().num_free(), s.kv().pool().num_total());
    (outputs, s)
}

#[test]
fn draft_model_tokens_are_verified_losslessly_in_both_groups() {
    for mode in [PreemptionMode::Recompute, PreemptionMode::Swap] {
        let base = SchedulerConfig {
            kv_cache_groups: vec![KvCacheGroupSpec::FULL, KvCacheGroupSpec::FULL],
            enable_prefix_caching: true,
            max_num_batched_tokens: 24,
            num_cpu_blocks: 160,
            preemption_mode: mode,
            // Two groups: a sequence of max_model_len tokens takes 80 blocks.
            max_model_len: 160,
            ..config(80, 4)
        };
        let (plain, _) = run(base.clone());
        let spec = SpeculativeConfig {
            num_speculative_tokens: 4,
            ..SpeculativeConfig::new(SpecMethod::DraftModel)
        };
        let (fast, s) = run(SchedulerConfig {
            speculative_config: Some(spec),
            ..base
        });
        assert_eq!(fast, plain, "{mode:?}");
        let st = s.stats();
        assert!(st.spec_num_accepted_tokens > 0, "{st:?}");
        assert!(
            st.spec_num_draft_tokens > st.spec_num_accepted_tokens,
            "{st:?}"
        );
        assert!(st.num_preemptions > 0, "{mode:?}: {st:?}");
    }
}
