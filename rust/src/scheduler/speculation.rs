//! Speculative decoding in the step loop: draft tokens join a decoding
//! sequence's step as the tail of a K+1-token chunk (the pending verified
//! token, then the drafts), with the lowest priority of anything scheduled:
//! they take only the budget and free blocks left once every verified token
//! of the step (running, swapped-in and admitted sequences) has its slot,
//! never cause a preemption, and are never scheduled in a step that
//! preempted. `update()` keeps the accepted drafts and gives back the slots
//! of rejected ones (`update.rs`).

use super::scheduler::Scheduler;
use crate::kv_cache::blocks_for;

impl Scheduler {
    /// Give the step's decoding sequences (one pending token, one sample)
    /// draft tokens from their proposer, in schedule order, within `budget`
    /// tokens and the free blocks: each sequence at most
    /// `num_speculative_tokens` (its own cap, then the configuration's), and
    /// never more than can be appended before `max_model_len` or
    /// `max_tokens` ends it. A sequence whose drafts do not all fit in the
    /// free blocks keeps as many as fit.
    pub(super) fn schedule_drafts(&mut self, mut budget: usize) {
        let Some(proposers) = self.proposers.as_ref() else {
            return;
        };
        let k = proposers.config().num_speculative_tokens;
        let max_model_len = self.config.max_model_len;
        for i in 0..self.scheduled.len() {
            if budget == 0 {
                break;
            }
            let (id, n) = self.scheduled[i];
            let req = self.requests.get_mut(&id).expect("scheduled request");
            let c = req.num_computed_tokens;
            if n != 1 || c + 1 != req.num_tokens() || req.num_samples() != 1 {
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
            let mut drafts = proposers.propose(&req.proposer, &req.token_ids, max_d);
            // All-or-nothing per length: the longest prefix of the drafts the
            // free blocks hold.
            let bs = self.config.block_size;
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
            self.scheduled[i].1 += d;
            budget -= d;
        }
    }
}
