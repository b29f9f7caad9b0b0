//! Speculative decoding in the step loop: draft tokens join a decoding
//! sequence's step as the tail of a K+1-token chunk (the pending verified
//! token, then the drafts), with the lowest priority of anything scheduled:
//! they take only the budget and free blocks left once every verified token
//! of the step (running, swapped-in and admitted sequences) has its slot,
//! never cause a preemption, and are never scheduled in a step that
//! preempted. How many each sequence gets is the draft-length policy's
//! choice (`spec_decode::draft_policy`). `update()` keeps the accepted
//! drafts and gives back the slots of rejected ones (`update.rs`).

use super::scheduler::Scheduler;
use crate::kv_cache::blocks_for;
use crate::spec_decode::Candidate;

/// A decoding sequence's proposal in the step.
struct Proposal {
    /// Its index in `Scheduler::scheduled`.
    index: usize,
    drafts: Vec<u32>,
    /// Its acceptance rate estimate and optimistic rate.
    rate: f64,
    upper: f64,
}

impl Scheduler {
    /// Give the step's decoding sequences (one pending token, one sample)
    /// draft tokens from their proposer, within `budget` tokens and the
    /// free blocks: each sequence proposes at most `num_speculative_tokens`
    /// (its own cap, then the configuration's), and never more than can be
    /// appended before `max_model_len` or `max_tokens` ends it; with a step
    /// cost model the policy then keeps, of each proposal, the drafts that
    /// raise the step's expected tokens per second, and one probe draft of
    /// a sequence left without drafts whose optimistic rate would pay (a
    /// sequence whose optimistic rate cannot pay is not asked to propose).
    /// Drafts are placed
    /// in schedule order; a sequence whose drafts do not all fit in the
    /// budget or the free blocks keeps as many as fit.
    pub(super) fn schedule_drafts(&mut self, mut budget: usize) {
        let Some(proposers) = self.proposers.as_ref() else {
            return;
        };
        if budget == 0 {
            return;
        }
        let k = proposers.config().num_speculative_tokens;
        let max_model_len = self.config.max_model_len;
        let price = self.draft_policy.costs.as_ref().map(|m| {
            let (mut sampled, mut tokens) = (0, 0);
            for &(id, n) in &self.scheduled {
                let req = &self.requests[&id];
                tokens += n;
                if req.num_computed_tokens + n >= req.num_tokens() {
                    sampled += req.num_samples();
                }
            }
            m.price(sampled, tokens.saturating_sub(sampled))
        });
        let min_gain = price.map_or(f64::NEG_INFINITY, |p| p.min_gain());
        let mut proposals = Vec::new();
        for (index, &(id, n)) in self.scheduled.iter().enumerate() {
            let req = &self.requests[&id];
            let c = req.num_computed_tokens;
            if n != 1 || c + 1 != req.num_tokens() || req.num_samples() != 1 {
                continue;
            }
            let rate = self.draft_policy.rate(&req.spec_acceptance);
            let upper = self.draft_policy.upper(&req.spec_acceptance);
            if upper <= min_gain {
                continue;
            }
            // After the step the sequence holds at most num_tokens + d + 1
            // tokens (the drafts and the token after them).
            let by_len = max_model_len.saturating_sub(req.num_tokens() + 1);
            let by_max_tokens = req
                .stop
                .max_tokens
                .saturating_sub(req.num_output_tokens() + 1);
            let max_d = req
                .num_speculative_tokens
                .unwrap_or(k)
                .min(k)
                .min(by_len)
                .min(by_max_tokens)
                .min(budget);
            if max_d == 0 {
                continue;
            }
            let drafts = proposers.propose(&req.proposer, &req.token_ids, max_d);
            if !drafts.is_empty() {
                proposals.push(Proposal {
                    index,
                    drafts,
                    rate,
                    upper,
                });
            }
        }
        if let Some(p) = price {
            let candidates: Vec<Candidate> = proposals
                .iter()
                .map(|q| Candidate {
                    rate: q.rate,
                    upper: q.upper,
                    proposed: q.drafts.len(),
                })
                .collect();
            for (q, len) in proposals.iter_mut().zip(p.choose(&candidates, budget)) {
                q.drafts.truncate(len);
            }
        }
        let bs = self.config.block_size;
        for Proposal {
            index, mut drafts, ..
        } in proposals
        {
            if budget == 0 {
                break;
            }
            drafts.truncate(budget);
            let id = self.scheduled[index].0;
            let req = self.requests.get_mut(&id).expect("scheduled request");
            let c = req.num_computed_tokens;
            // All-or-nothing per length: the longest prefix of the drafts the
            // free blocks hold.
            while !drafts.is_empty() {
                let extra: usize = req
                    .block_tables
                    .iter()
                    .map(|t| blocks_for(c + 1 + drafts.len(), bs).saturating_sub(t.len()))
                    .sum();
                if extra <= self.kv.pool().num_free() {
                    break;
                }
                drafts.pop();
            }
            if drafts.is_empty() {
                continue;
            }
            let d = drafts.len();
            if !self
                .kv
                .allocate_slots(&mut req.block_tables, c, c + 1 + d, &mut self.moves.copies)
            {
                continue;
            }
            self.stats.spec_num_drafts += 1;
            self.stats.spec_num_draft_tokens += d as u64;
            req.draft_tokens = drafts;
            self.scheduled[index].1 += d;
            budget -= d;
        }
    }
}
