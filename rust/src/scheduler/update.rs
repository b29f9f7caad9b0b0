//! Applying a step: the sampled tokens join their requests, full computed
//! blocks enter the prefix cache, blocks that fell behind a sliding window
//! are released, parallel-sampling groups fork at their first sample, and
//! finished requests leave.

use super::request::FinishReason;
use super::scheduler::Scheduler;
use super::types::{Finished, HOLD_TOKEN};

impl Scheduler {
    /// Apply one step's results. `sampled[k]` is the token sampled for the k-th
    /// scheduled request that completed its pending tokens this step (in
    /// schedule order). Full computed blocks enter the prefix cache, then
    /// blocks no later query can see (sliding-window groups) are released;
    /// finished requests leave at once and free their blocks.
    ///
    /// # Panics
    /// If `sampled` has the wrong length.
    pub fn update(&mut self, sampled: &[u32]) -> Vec<Finished> {
        let mut finished = Vec::new();
        let mut k = 0;
        let scheduled = std::mem::take(&mut self.scheduled);
        for &(id, num_new) in &scheduled {
            let req = self.requests.get_mut(&id).expect("scheduled request");
            req.num_computed_tokens += num_new;
            if req.num_computed_tokens < req.num_tokens() {
                self.cache_full_blocks(id); // partial (chunked) prefill: nothing sampled
                self.release_skipped(id);
                continue;
            }
            let n = req.num_samples();
            let tokens = &sampled[k..k + n];
            k += n;
            if n == 1 && tokens[0] == HOLD_TOKEN && num_new > 0 {
                // Nothing appended: the last token runs again next step.
                req.num_computed_tokens -= 1;
                continue;
            }
            let children = if n > 1 {
                std::mem::take(&mut req.pending_children)
            } else {
                Vec::new()
            };
            for (j, &child) in children.iter().enumerate() {
                self.fork_group_member(id, child, j + 1);
            }
            for (&seq, &token) in std::iter::once(&id).chain(&children).zip(tokens) {
                let req = self.requests.get_mut(&seq).expect("sequence");
                if let Some(reason) = req.append_and_check(token, self.config.max_model_len) {
                    finished.push(Finished {
                        id: seq,
                        reason,
                        stop_token: (reason == FinishReason::Stop).then_some(token),
                        output_token_ids: req.output_token_ids().to_vec(),
                    });
                }
                self.cache_full_blocks(seq);
                self.release_skipped(seq);
            }
        }
        assert_eq!(
            k,
            sampled.len(),
            "sampled tokens do not match the step's rows"
        );
        for f in &finished {
            self.remove(f.id);
        }
        finished
    }

    /// Forget the scheduled step without applying it (its forward pass
    /// failed): nothing was computed, so every request stays where it was and
    /// is scheduled again (or aborted) afterwards. Blocks stay allocated.
    pub fn cancel_step(&mut self) {
        self.scheduled.clear();
        self.moves.clear();
    }

    /// Tokens `update()` expects for the last step: one per sampled row, or
    /// one per sequence of a group at its first sample.
    pub fn num_sampled_tokens(&self) -> usize {
        self.scheduled
            .iter()
            .map(|(id, n)| {
                let r = &self.requests[id];
                if r.num_computed_tokens + n == r.num_tokens() {
                    r.num_samples()
                } else {
                    0
                }
            })
            .sum()
    }

    /// Release `id`'s blocks that no query from its next token on can see.
    fn release_skipped(&mut self, id: u64) {
        if !self.kv.has_sliding() {
            return;
        }
        let req = self.requests.get_mut(&id).expect("request");
        self.kv
            .release_skipped(&mut req.block_tables, req.num_computed_tokens);
    }

    /// Register `id`'s computed full blocks in the prefix cache.
    fn cache_full_blocks(&mut self, id: u64) {
        if !self.config.enable_prefix_caching {
            return;
        }
        let req = self.requests.get_mut(&id).expect("request");
        req.update_block_hashes(self.config.block_size);
        let full = req.num_computed_tokens / self.config.block_size;
        self.kv.cache_full_blocks(
            &req.block_tables,
            &req.block_hashes,
            &req.token_ids,
            req.num_cached_blocks,
            full,
        );
        req.num_cached_blocks = req.num_cached_blocks.max(full);
    }
}
