//! Tests of the step cost model and the goodput draft-length policy.

use super::*;

fn model(points: &[(usize, f64, f64)]) -> StepCostModel {
    StepCostModel::from_points(points).unwrap()
}

#[test]
fn the_model_interpolates_in_the_batch() {
    let m = model(&[(1, 0.010, 0.001), (5, 0.030, 0.003)]);
    assert_eq!(m.at(1), (0.010, 0.001));
    let (d, x) = m.at(3);
    assert!((d - 0.020).abs() < 1e-12 && (x - 0.002).abs() < 1e-12);
    // Past the last point: decode time in proportion, draft time kept.
    let (d, x) = m.at(10);
    assert!((d - 0.060).abs() < 1e-12 && (x - 0.003).abs() < 1e-12);
    let p = m.price(1, 4);
    assert!((p.base_s - 0.014).abs() < 1e-12);
}

#[test]
fn bad_points_name_the_field() {
    let err = |p: &[(usize, f64, f64)]| StepCostModel::from_points(p).unwrap_err().to_string();
    assert_eq!(
        err(&[]),
        "speculative_config.draft_step_costs must hold at least one \
         [batch, decode_s, draft_s] point"
    );
    assert_eq!(
        err(&[(4, 0.1, 0.0), (4, 0.2, 0.0)]),
        "speculative_config.draft_step_costs point 1: batch sizes must increase from 1 up, \
         got 4 after 4"
    );
    assert!(err(&[(1, 0.0, 0.0)]).contains("point 0: decode_s must be a positive"));
    assert!(err(&[(1, 0.1, f64::NAN)]).contains("point 0: draft_s must be"));
}

/// Candidates whose optimistic rate equals their rate (no probes).
fn sure(c: &[(f64, usize)]) -> Vec<Candidate> {
    c.iter()
        .map(|&(rate, proposed)| Candidate {
            rate,
            upper: rate,
            proposed,
        })
        .collect()
}

#[test]
fn drafts_follow_the_gains_and_stop_where_goodput_falls() {
    // One sequence alone: a step of 10 ms, 1 ms per draft. The j-th
    // draft at rate 0.5 gains 0.5^j; goodput 1/0.010 = 100 tokens/s
    // rises while 0.5^j / 0.001 > tokens / secs.
    let p = model(&[(1, 0.010, 0.001)]).price(1, 0);
    assert!((p.min_gain() - 0.1).abs() < 1e-12);
    // 0.5 / 1 ms = 500 > 100: 1.5 tokens in 11 ms (136/s); 0.25 / 1 ms
    // = 250 > 136: 1.75 in 12 ms (146/s); 0.125 / 1 ms = 125 < 146.
    assert_eq!(p.choose(&sure(&[(0.5, 8)]), 100), vec![2]);
    // A perfect proposer drafts all it proposed; the budget caps.
    assert_eq!(p.choose(&sure(&[(1.0, 8)]), 100), vec![8]);
    assert_eq!(p.choose(&sure(&[(1.0, 8)]), 5), vec![5]);
    // Below the least gain: nothing.
    assert_eq!(p.choose(&sure(&[(0.1, 8)]), 100), vec![0]);
}

#[test]
fn the_better_sequence_drafts_first() {
    let p = model(&[(2, 0.010, 0.001)]).price(2, 0);
    // Gains 0.9, 0.81, 0.729, ... against 0.6, 0.36: the 0.9 sequence
    // takes its drafts before the other's first.
    let lens = p.choose(&sure(&[(0.6, 5), (0.9, 5), (0.0, 5)]), 100);
    assert_eq!(lens[2], 0);
    assert!(lens[1] >= lens[0], "{lens:?}");
    assert_eq!(lens, vec![1, 5, 0]);
}

#[test]
fn a_sequence_whose_optimistic_rate_pays_probes_one_draft() {
    // A draft costs 0.8 of the step's mean token: a rate of 0.5 does
    // not pay, an optimistic 0.9 does (one probe), 0.7 does not.
    let p = model(&[(4, 0.010, 0.002)]).price(4, 0);
    assert!((p.min_gain() - 0.8).abs() < 1e-12);
    let c = |rate, upper| Candidate {
        rate,
        upper,
        proposed: 5,
    };
    let lens = p.choose(&[c(0.5, 0.9), c(0.5, 0.7), c(0.95, 0.99), c(0.5, 0.9)], 100);
    // The 0.95 sequence: 0.95^j / 2 ms against tokens / secs: 475 >
    // 400, 451 > 412.5, 429 > 418, then 407 < 419.
    assert_eq!(lens, vec![1, 0, 3, 1]);
    // Probes come after the goodput's drafts, within the budget.
    let lens = p.choose(&[c(0.5, 0.9), c(0.5, 0.9), c(0.95, 0.99)], 4);
    assert_eq!(lens, vec![1, 0, 3]);
    // No probe where no rate pays.
    let p = model(&[(4, 0.010, 0.0025)]).price(4, 0);
    assert_eq!(p.choose(&[c(0.5, 1.0)], 100), vec![0]);
}

#[test]
fn a_compute_bound_batch_drafts_nothing() {
    // 256 sequences: the step costs 256 x the per-token time, so a draft
    // pays only with a gain above 1.
    let m = model(&[(1, 0.010, 0.001), (256, 0.256, 0.001)]);
    let p = m.price(256, 0);
    assert!((p.min_gain() - 1.0).abs() < 1e-12);
    let all = vec![
        Candidate {
            rate: 0.99,
            upper: 1.0,
            proposed: 16
        };
        256
    ];
    assert_eq!(p.choose(&all, 4096), vec![0; 256]);
    // The same proposals at 1 sequence draft in full.
    assert_eq!(m.price(1, 0).choose(&all[..1], 4096), vec![16]);
}

#[test]
fn acceptance_counts_judged_positions() {
    let mut a = Acceptance::default();
    a.record(4, 4); // four accepted, none rejected
    a.record(4, 1); // one accepted, the second rejected
    assert_eq!(
        a,
        Acceptance {
            accepted: 5.0,
            judged: 6.0
        }
    );
    assert!((a.rate(0.5, 4.0) - 7.0 / 10.0).abs() < 1e-12);
    let mut pol = DraftPolicy::default();
    let fresh = Acceptance::default();
    assert!((pol.rate(&fresh) - INITIAL_RATE).abs() < 1e-12);
    let mut s = Acceptance::default();
    pol.record(&mut s, 3, 0);
    // Engine: 0 of 1 judged over the prior 0.5 x 4: 2/5; the sequence:
    // 0 of 1 over 2/5 x 4: 1.6 / 5.
    assert!((pol.rate(&s) - 1.6 / 5.0).abs() < 1e-12);
    // Optimistic: 0.32 + 2 sqrt(0.32 x 0.68 / 6).
    let upper = 0.32 + 2.0 * (0.32f64 * 0.68 / 6.0).sqrt();
    assert!((pol.upper(&s) - upper).abs() < 1e-12);
    // A fresh sequence, at the engine's 2/5: 0.4 + 2 sqrt(0.24 / 5);
    // never above 1.
    assert!((pol.upper(&fresh) - (0.4 + 2.0 * 0.048f64.sqrt())).abs() < 1e-12);
    let sure = Acceptance {
        accepted: 3.0,
        judged: 3.0,
    };
    assert!((sure.upper(0.9, 4.0) - 1.0).abs() < 1e-12);
}
