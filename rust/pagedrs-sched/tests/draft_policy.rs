//! The goodput draft-length policy in the scheduler: each sequence's draft
//! length per step follows its acceptance so far and the step cost model,
//! a large batch drafts nothing, the cost model can be replaced between
//! steps, and a "fixed" policy refuses one.

mod common;

use common::*;

use pagedrs_sched::scheduler::{Scheduler, SchedulerConfig, StepBatch};
use pagedrs_sched::spec_decode::{DraftLengthPolicy, SpecMethod, SpeculativeConfig, StepCostModel};

fn costs(points: &[(usize, f64, f64)]) -> StepCostModel {
    StepCostModel::from_points(points).unwrap()
}

fn ngram_with(model: Option<StepCostModel>) -> SpeculativeConfig {
    SpeculativeConfig {
        num_speculative_tokens: 4,
        prompt_lookup_min: 1,
        prompt_lookup_max: 3,
        draft_step_costs: model,
        ..SpeculativeConfig::new(SpecMethod::Ngram)
    }
}

/// "5 6 7 8 9" repeated: ngram always proposes the loop's next tokens.
fn looping() -> Vec<u32> {
    vec![5, 6, 7, 8, 9, 5, 6, 7, 8, 9, 5, 6]
}

/// The loop's token after `ctx`.
fn next_in_loop(ctx: &[u32]) -> u32 {
    let last = *ctx.last().unwrap();
    if last == 9 {
        5
    } else {
        last + 1
    }
}

fn scheduler(
    spec: SpeculativeConfig,
    num_requests: u64,
    max_tokens: impl Fn(u64) -> usize,
) -> Scheduler {
    let mut s = Scheduler::new(SchedulerConfig {
        speculative_config: Some(spec),
        max_model_len: 128,
        max_num_batched_tokens: 256,
        ..config(512, 4)
    })
    .unwrap();
    for id in 0..num_requests {
        s.add(request_with(id, looping(), max_tokens(id))).unwrap();
    }
    s
}

/// Run steps to the end, accepting `accept(step, drafts)` drafts of every
/// row (the loop's next token after them); returns, per step, the sampled
/// rows' draft counts.
fn drive(s: &mut Scheduler, mut accept: impl FnMut(usize, usize) -> usize) -> Vec<Vec<usize>> {
    let mut steps = Vec::new();
    for i in 0..200 {
        if s.is_idle() {
            break;
        }
        s.schedule();
        let b = StepBatch::build(s);
        steps.push(b.num_draft_tokens.iter().map(|&d| d as usize).collect());
        update_with(s, |s, id, _, drafts| {
            let a = accept(i, drafts.len()).min(drafts.len());
            let mut ctx = s.request(id).unwrap().token_ids.clone();
            ctx.extend_from_slice(&drafts[..a]);
            (a, next_in_loop(&ctx))
        });
        assert_no_draft_slots_held(s);
    }
    assert!(s.is_idle());
    assert_idle_frees_all(s);
    steps
}

#[test]
fn draft_lengths_follow_the_acceptance_so_far() {
    // One sequence, a step of 10 ms, 1 ms per draft: a draft pays while its
    // gain rate^j beats tokens/second x 1 ms (hand-computed in the
    // comments; rates per draft_policy.rs with prior weight 4).
    let model = costs(&[(1, 0.010, 0.001)]);
    // Every draft accepted: rate 0.5 (no history) gives 2 drafts; after 2 of
    // 2 accepted the rate is (2 + 4 x 4/6) / 6 = 0.78 and all 4 pay.
    let mut s = scheduler(ngram_with(Some(model.clone())), 1, |_| 40);
    let steps = drive(&mut s, |_, d| d);
    let drafted: Vec<usize> = steps.iter().map(|r| r[0]).collect();
    assert_eq!(drafted[0], 0, "the prefill step");
    assert_eq!(&drafted[1..4], &[2, 4, 4]);
    // Every draft rejected: rates 0.5, 0.32, 0.22, 0.16, 0.125 give 2, 1,
    // 1, 1, 1 drafts; from 0.099, below the least gain 1 ms / 10 ms = 0.1,
    // the optimistic rate (2 standard deviations up) still pays for nine
    // one-draft probes: after 14 judged positions the rate is 8 / 18^2 =
    // 0.025, its optimistic rate 0.025 + 2 sqrt(0.025 x 0.975 / 19) =
    // 0.096, and the sequence is no longer asked to propose.
    let mut s = scheduler(ngram_with(Some(model)), 1, |_| 40);
    let steps = drive(&mut s, |_, _| 0);
    let drafted: Vec<usize> = steps.iter().map(|r| r[0]).collect();
    assert_eq!(&drafted[1..6], &[2, 1, 1, 1, 1]);
    assert_eq!(&drafted[6..16], &[1, 1, 1, 1, 1, 1, 1, 1, 1, 0]);
    assert!(drafted[16..].iter().all(|&d| d == 0), "{drafted:?}");
    let pol = s.draft_policy();
    assert_eq!((pol.engine.accepted, pol.engine.judged), (0.0, 14.0));
}

#[test]
fn probes_find_a_proposer_worth_its_dear_drafts() {
    // A draft costs 0.8 of the step (8 ms of 10): the engine's first rate,
    // 0.5, does not pay, its optimistic rate 0.947 does: one probe a step
    // while the rate climbs (0.68, 0.78, ... 0.92 after 7 accepted), then
    // the goodput's lengths, up to all 4 (rates per draft_policy.rs).
    let model = costs(&[(1, 0.010, 0.008)]);
    let mut s = scheduler(ngram_with(Some(model)), 1, |_| 60);
    let steps = drive(&mut s, |_, d| d);
    let drafted: Vec<usize> = steps.iter().map(|r| r[0]).collect();
    assert_eq!(
        &drafted[1..14],
        &[1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 3, 4, 4],
        "{drafted:?}"
    );
}

#[test]
fn a_large_batch_drafts_nothing_and_a_small_one_does() {
    // At 8 sequences a step is 8 x the per-token cost (compute-bound): the
    // least gain is 8 x 10 ms / 80 ms = 1, above any acceptance rate.
    let model = costs(&[(1, 0.010, 0.001), (8, 0.080, 0.010)]);
    // Seven sequences end after 12 tokens, one runs on alone.
    let mut s = scheduler(
        ngram_with(Some(model)),
        8,
        |id| if id == 0 { 60 } else { 12 },
    );
    let steps = drive(&mut s, |_, d| d);
    let full: Vec<&Vec<usize>> = steps.iter().filter(|r| r.len() == 8).collect();
    assert!(full.len() > 5);
    assert!(full.iter().all(|r| r.iter().all(|&d| d == 0)), "{full:?}");
    let alone: Vec<usize> = steps
        .iter()
        .filter(|r| r.len() == 1)
        .map(|r| r[0])
        .collect();
    assert!(alone.contains(&4), "{alone:?}");
    // Without a cost model the same batch drafts in full (up to max_tokens).
    let mut s = scheduler(ngram_with(None), 8, |id| if id == 0 { 60 } else { 12 });
    let steps = drive(&mut s, |_, d| d);
    let full: Vec<&Vec<usize>> = steps.iter().filter(|r| r.len() == 8).collect();
    assert_eq!(
        full.iter().filter(|r| r.iter().all(|&d| d == 4)).count(),
        2,
        "{full:?}"
    );
}

#[test]
fn the_cost_model_is_replaced_between_steps() {
    let mut s = scheduler(ngram_with(None), 1, |_| 40);
    step(&mut s, 7);
    s.schedule();
    assert_eq!(StepBatch::build(&s).num_draft_tokens, vec![4]);
    update_with(&mut s, |_, _, _, d| (d.len(), 7));
    // A model where no draft pays: none drafted from the next step on.
    s.set_draft_step_costs(Some(costs(&[(1, 0.010, 0.010)])))
        .unwrap();
    s.schedule();
    assert_eq!(StepBatch::build(&s).num_draft_tokens, vec![0]);
    update_with(&mut s, |_, _, _, _| (0, 8));
    s.set_draft_step_costs(None).unwrap();
    s.schedule();
    assert_eq!(StepBatch::build(&s).num_draft_tokens, vec![4]);
    update_with(&mut s, |_, _, _, d| (d.len(), 8));
    // Under the fixed policy a cost model is refused, naming the field.
    let mut fixed = scheduler(
        SpeculativeConfig {
            draft_length_policy: DraftLengthPolicy::Fixed,
            ..ngram_with(None)
        },
        1,
        |_| 40,
    );
    let err = fixed
        .set_draft_step_costs(Some(costs(&[(1, 0.01, 0.0)])))
        .unwrap_err();
    assert_eq!(err.field, "draft_step_costs");
    assert!(fixed.draft_policy().costs.is_none());
}
