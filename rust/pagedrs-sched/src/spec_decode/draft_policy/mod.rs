//! When to speculate: each sequence's draft length in a step, from its
//! acceptance so far and a cost model of the step measured on the machine
//! (`draft_length_policy = "goodput"`, docs/speculative_decoding.md).
//!
//! The model of a step (SmartSpec, Liu et al. 2024, "Optimizing Speculative
//! Decoding for Serving Large Language Models Using Goodput"; the expected
//! accepted length of Leviathan et al. 2023): a step of `S` sampling
//! sequences costs `decode_s(S)` seconds, and every draft token (and every
//! prompt token of a prefill chunk) adds `draft_s(S)` seconds: a verify
//! step of `S` sequences with `k` drafts each costs
//! `decode_s(S) + S * k * draft_s(S)`, against `(k + 1) * decode_s(S)` for
//! `k + 1` decode steps. A sequence whose drafts are accepted with
//! probability `a` each (given the ones before) gains `a^j` expected tokens
//! from its `j`-th draft. The policy adds drafts by decreasing gain while
//! the step's expected tokens per second (goodput) grows:
//! `(S + G) / (T0 + m * draft_s)` for `m` drafts of total gain `G`. Gains
//! fall and the ratio rises as drafts are added, so the first draft that
//! does not raise it ends the choice, and the choice is the best of every
//! `m`. As the batch grows the step turns compute-bound
//! (`S * draft_s(S) / decode_s(S)` nears 1), no gain below 1 pays, and
//! speculation turns itself off.
//!
//! A rate is an estimate: a sequence (or a whole engine) whose estimate
//! does not pay would never draft again and never learn otherwise. So a
//! sequence whose mean rate does not pay but whose optimistic rate (the
//! Beta posterior's mean plus [`PROBE_SDS`] standard deviations) does
//! drafts one token, a probe; each judged probe narrows the posterior, so
//! probes end after a few rejections, or turn into full drafts after a
//! run of acceptances. Where no rate can pay (a draft costs as much as the
//! step's mean token) nobody probes.

use std::cmp::Ordering;
use std::collections::BinaryHeap;

use super::config_error::SpecConfigError;

/// One measured point of the step cost model.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StepCost {
    /// Sampling sequences in the step (decode rows).
    pub batch: usize,
    /// Seconds of a step of `batch` sequences of one token each.
    pub decode_s: f64,
    /// Seconds each further token (a draft) adds to that step.
    pub draft_s: f64,
}

/// Step time as a function of the batch: points interpolated linearly in
/// the batch size; below the first point its values; past the last one,
/// `decode_s` grows in proportion to the batch (compute-bound) and
/// `draft_s` stays.
#[derive(Debug, Clone, PartialEq)]
pub struct StepCostModel {
    points: Vec<StepCost>,
}

impl StepCostModel {
    /// The model of `(batch, decode_s, draft_s)` points (`draft_step_costs`'
    /// form), checked as [`StepCostModel::new`] checks them.
    ///
    /// # Errors
    /// As [`StepCostModel::new`].
    pub fn from_points(points: &[(usize, f64, f64)]) -> Result<Self, SpecConfigError> {
        Self::new(
            points
                .iter()
                .map(|&(batch, decode_s, draft_s)| StepCost {
                    batch,
                    decode_s,
                    draft_s,
                })
                .collect(),
        )
    }

    /// The model of `points`.
    ///
    /// # Errors
    /// No point, batch sizes not strictly increasing from 1 up, a
    /// `decode_s` not positive and finite, or a `draft_s` negative or not
    /// finite; the error names `draft_step_costs`.
    pub fn new(points: Vec<StepCost>) -> Result<Self, SpecConfigError> {
        let bad = |message: String| SpecConfigError {
            field: "draft_step_costs",
            message,
        };
        if points.is_empty() {
            return Err(bad(
                "must hold at least one [batch, decode_s, draft_s] point".to_string(),
            ));
        }
        let mut last = 0;
        for (i, p) in points.iter().enumerate() {
            if p.batch <= last {
                return Err(bad(format!(
                    "point {i}: batch sizes must increase from 1 up, got {} after {last}",
                    p.batch
                )));
            }
            last = p.batch;
            if !(p.decode_s.is_finite() && p.decode_s > 0.0) {
                return Err(bad(format!(
                    "point {i}: decode_s must be a positive number of seconds, got {}",
                    p.decode_s
                )));
            }
            if !(p.draft_s.is_finite() && p.draft_s >= 0.0) {
                return Err(bad(format!(
                    "point {i}: draft_s must be a number of seconds >= 0, got {}",
                    p.draft_s
                )));
            }
        }
        Ok(Self { points })
    }

    /// The measured points, by batch size.
    pub fn points(&self) -> &[StepCost] {
        &self.points
    }

    /// `(decode_s, draft_s)` at `batch` sampling sequences.
    pub fn at(&self, batch: usize) -> (f64, f64) {
        let p = &self.points;
        let first = p[0];
        if batch <= first.batch {
            return (first.decode_s, first.draft_s);
        }
        let last = p[p.len() - 1];
        if batch >= last.batch {
            return (
                last.decode_s * batch as f64 / last.batch as f64,
                last.draft_s,
            );
        }
        let i = p.partition_point(|q| q.batch <= batch);
        let (lo, hi) = (p[i - 1], p[i]);
        let t = (batch - lo.batch) as f64 / (hi.batch - lo.batch) as f64;
        (
            lo.decode_s + t * (hi.decode_s - lo.decode_s),
            lo.draft_s + t * (hi.draft_s - lo.draft_s),
        )
    }

    /// The price of drafting in a step of `sampled` sampling sequences and
    /// `other_tokens` more tokens (prompt tokens of prefill chunks).
    pub fn price(&self, sampled: usize, other_tokens: usize) -> StepPrice {
        let (decode_s, draft_s) = self.at(sampled.max(1));
        StepPrice {
            sampled,
            base_s: decode_s + other_tokens as f64 * draft_s,
            draft_s,
        }
    }
}

/// A step's cost before drafts and the cost of each draft token.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StepPrice {
    /// Sampling sequences (tokens the step gives without drafts).
    pub sampled: usize,
    /// Seconds of the step without drafts.
    pub base_s: f64,
    /// Seconds per draft token.
    pub draft_s: f64,
}

impl StepPrice {
    /// The least gain a first draft must have to raise the step's goodput
    /// (`sampled * draft_s / base_s`): a sequence whose acceptance rate is
    /// no higher gets no draft.
    pub fn min_gain(&self) -> f64 {
        self.sampled as f64 * self.draft_s / self.base_s
    }

    /// The draft length of each candidate, at most `budget` in all: drafts
    /// by decreasing expected gain `rate^j` (ties: the earlier candidate,
    /// then the earlier position) while each raises the step's expected
    /// tokens per second; then, in candidate order, one probe draft for
    /// each candidate left without drafts whose optimistic rate is above
    /// [`Self::min_gain`].
    pub fn choose(&self, candidates: &[Candidate], budget: usize) -> Vec<usize> {
        let mut lens = vec![0; candidates.len()];
        let mut heap: BinaryHeap<Next> = candidates
            .iter()
            .enumerate()
            .filter(|(_, c)| c.proposed > 0)
            .map(|(i, c)| Next {
                gain: c.rate,
                index: i,
            })
            .collect();
        let (mut tokens, mut secs) = (self.sampled as f64, self.base_s);
        let mut m = 0;
        while m < budget {
            let Some(next) = heap.pop() else { break };
            // Goodput rises iff gain / draft_s > tokens / secs.
            if next.gain * secs <= tokens * self.draft_s {
                break;
            }
            tokens += next.gain;
            secs += self.draft_s;
            m += 1;
            let i = next.index;
            lens[i] += 1;
            let c = candidates[i];
            if lens[i] < c.proposed {
                heap.push(Next {
                    gain: next.gain * c.rate,
                    index: i,
                });
            }
        }
        let min_gain = self.min_gain();
        for (len, c) in lens.iter_mut().zip(candidates) {
            if m == budget {
                break;
            }
            if *len == 0 && c.proposed > 0 && c.upper > min_gain {
                *len = 1;
                m += 1;
            }
        }
        lens
    }
}

/// A sequence's proposal, as [`StepPrice::choose`] weighs it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Candidate {
    /// Acceptance rate per draft position (the posterior mean).
    pub rate: f64,
    /// Its optimistic rate ([`Acceptance::upper`]).
    pub upper: f64,
    /// Drafts proposed.
    pub proposed: usize,
}

/// A candidate's next draft in [`StepPrice::choose`]: the largest gain
/// first, then the lowest index.
#[derive(Debug, Clone, Copy)]
struct Next {
    gain: f64,
    index: usize,
}

impl PartialEq for Next {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}

impl Eq for Next {}

impl PartialOrd for Next {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Next {
    fn cmp(&self, other: &Self) -> Ordering {
        self.gain
            .total_cmp(&other.gain)
            .then_with(|| other.index.cmp(&self.index))
    }
}

/// Acceptance counts of drafts: a verify of `d` drafts with `a` accepted
/// observed `a` accepted positions and, when `a < d`, one rejected (the
/// positions after it were never judged).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Acceptance {
    /// Draft positions accepted.
    pub accepted: f64,
    /// Draft positions judged (accepted, or the first rejected of a verify).
    pub judged: f64,
}

impl Acceptance {
    /// Record a verify of `drafted` drafts of which the first `accepted`
    /// were kept.
    pub fn record(&mut self, drafted: usize, accepted: usize) {
        self.accepted += accepted as f64;
        self.judged += accepted as f64 + f64::from(u8::from(accepted < drafted));
    }

    /// Acceptance rate per draft position: these counts with `weight`
    /// pseudo-positions at rate `prior` (a Beta prior's mean).
    pub fn rate(&self, prior: f64, weight: f64) -> f64 {
        (self.accepted + weight * prior) / (self.judged + weight)
    }

    /// The optimistic rate: [`Self::rate`] plus [`PROBE_SDS`] standard
    /// deviations of the Beta posterior it is the mean of
    /// (`sqrt(mean (1 - mean) / (n + 1))` over `n = judged + weight`
    /// positions), at most 1.
    pub fn upper(&self, prior: f64, weight: f64) -> f64 {
        let mean = self.rate(prior, weight);
        let n = self.judged + weight;
        (mean + PROBE_SDS * (mean * (1.0 - mean) / (n + 1.0)).sqrt()).min(1.0)
    }
}

/// Standard deviations above the mean of a sequence's optimistic rate
/// (the rate a probe draft needs to pay).
pub const PROBE_SDS: f64 = 2.0;

/// Weight, in draft positions, of the prior of a sequence's acceptance rate
/// (the engine's rate so far) and of the engine's (0.5).
pub const PRIOR_WEIGHT: f64 = 4.0;

/// The engine's rate before any draft is judged.
pub const INITIAL_RATE: f64 = 0.5;

/// The draft-length policy of one scheduler: the cost model (none: every
/// proposal drafted in full) and the engine's acceptance counts.
#[derive(Debug, Clone, Default)]
pub struct DraftPolicy {
    /// The cost model; `None` drafts every proposal in full.
    pub costs: Option<StepCostModel>,
    /// Every sequence's verifies.
    pub engine: Acceptance,
}

impl DraftPolicy {
    /// The acceptance rate of a sequence with counts `seq`: its own counts
    /// over the engine's rate (itself over [`INITIAL_RATE`]).
    pub fn rate(&self, seq: &Acceptance) -> f64 {
        let prior = self.engine.rate(INITIAL_RATE, PRIOR_WEIGHT);
        seq.rate(prior, PRIOR_WEIGHT)
    }

    /// The optimistic rate of a sequence with counts `seq`
    /// ([`Acceptance::upper`] over the engine's rate).
    pub fn upper(&self, seq: &Acceptance) -> f64 {
        let prior = self.engine.rate(INITIAL_RATE, PRIOR_WEIGHT);
        seq.upper(prior, PRIOR_WEIGHT)
    }

    /// Record a verify of `drafted` drafts with `accepted` kept, in `seq`
    /// and in the engine's counts.
    pub fn record(&mut self, seq: &mut Acceptance, drafted: usize, accepted: usize) {
        seq.record(drafted, accepted);
        self.engine.record(drafted, accepted);
    }
}

#[cfg(test)]
mod tests;
