//! Applying a step: the sampled tokens (with speculative decoding, the
//! accepted drafts and the token after them) join their requests, rejected
//! draft slots are given back, full computed blocks of verified tokens enter
//! the prefix cache, blocks that fell behind a sliding window are released,
//! parallel-sampling groups fork at their first sample, and finished
//! requests leave.

use super::request::FinishReason;
use super::scheduler::Scheduler;
use super::types::{Finished, HOLD_TOKEN};

/// Why `update()` refused a step's results (nothing was applied).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum UpdateError {
    /// `num_accepted` does not have one entry per sampled row.
    AcceptedLength {
        /// Entries given.
        got: usize,
        /// Sampled rows of the step.
        rows: usize,
    },
    /// `sampled` does not hold `num_samples + num_accepted` tokens per row.
    SampledLength {
        /// Tokens given.
        got: usize,
        /// Tokens the rows and their accepted counts need.
        expected: usize,
    },
    /// A row accepted more drafts than it was given.
    TooManyAccepted {
        /// Sampled row.
        row: usize,
        /// Its accepted count.
        accepted: usize,
        /// Its draft tokens.
        drafts: usize,
    },
    /// An accepted token differs from the draft at its position.
    NotTheDraft {
        /// Sampled row.
        row: usize,
        /// Draft position (0-based).
        pos: usize,
        /// The token given.
        token: u32,
        /// The draft there.
        draft: u32,
    },
}

impl std::fmt::Display for UpdateError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            UpdateError::AcceptedLength { got, rows } => write!(
                f,
                "num_accepted has {got} entries, but the step has {rows} sampled rows"
            ),
            UpdateError::SampledLength { got, expected } => write!(
                f,
                "sampled has {got} tokens, but the step's rows and num_accepted need {expected} \
                 (per row: its accepted drafts, then num_samples tokens)"
            ),
            UpdateError::TooManyAccepted {
                row,
                accepted,
                drafts,
            } => write!(
                f,
                "row {row} accepted {accepted} draft tokens, but it had {drafts}"
            ),
            UpdateError::NotTheDraft {
                row,
                pos,
                token,
                draft,
            } => write!(
                f,
                "row {row}: accepted token {token} at draft position {pos} is not the draft \
                 ({draft})"
            ),
        }
    }
}

impl std::error::Error for UpdateError {}

impl Scheduler {
    /// Apply one step's results without speculation (or with every draft
    /// rejected): `sampled[k]` is the token sampled for the k-th scheduled
    /// request that completed its pending tokens this step (in schedule
    /// order). See [`Scheduler::update_accepted`].
    ///
    /// # Panics
    /// If `sampled` has the wrong length.
    pub fn update(&mut self, sampled: &[u32]) -> Vec<Finished> {
        self.update_accepted(sampled, None)
            .unwrap_or_else(|e| panic!("{e}"))
    }

    /// Check one step's results against the step in flight: one accepted
    /// count per sampled row, at most its drafts; per row its accepted
    /// drafts (equal to them) then `num_samples` tokens.
    pub fn check_update(
        &self,
        sampled: &[u32],
        num_accepted: Option<&[usize]>,
    ) -> Result<(), UpdateError> {
        let rows: Vec<(usize, &[u32])> = self
            .scheduled
            .iter()
            .filter_map(|&(id, n)| {
                let r = &self.requests[&id];
                (r.num_computed_tokens + n - r.draft_tokens.len() == r.num_tokens())
                    .then(|| (r.num_samples(), r.draft_tokens.as_slice()))
            })
            .collect();
        if let Some(acc) = num_accepted {
            if acc.len() != rows.len() {
                return Err(UpdateError::AcceptedLength {
                    got: acc.len(),
                    rows: rows.len(),
                });
            }
        }
        let accepted = |row: usize| num_accepted.map_or(0, |a| a[row]);
        for (row, &(_, drafts)) in rows.iter().enumerate() {
            if accepted(row) > drafts.len() {
                return Err(UpdateError::TooManyAccepted {
                    row,
                    accepted: accepted(row),
                    drafts: drafts.len(),
                });
            }
        }
        let expected: usize = (0..rows.len()).map(|r| rows[r].0 + accepted(r)).sum();
        if sampled.len() != expected {
            return Err(UpdateError::SampledLength {
                got: sampled.len(),
                expected,
            });
        }
        let mut k = 0;
        for (row, &(n, drafts)) in rows.iter().enumerate() {
            let a = accepted(row);
            for (pos, (&token, &draft)) in sampled[k..k + a].iter().zip(drafts).enumerate() {
                if token != draft {
                    return Err(UpdateError::NotTheDraft {
                        row,
                        pos,
                        token,
                        draft,
                    });
                }
            }
            k += a + n;
        }
        Ok(())
    }

    /// Apply one step's results. Per sampled row (the scheduled requests
    /// that completed their pending tokens, in schedule order),
    /// `num_accepted[row]` (0 when `None`) draft tokens the target model
    /// verified, then the row's `num_samples` tokens (its request's, then one
    /// per child at a group's first sample): `sampled` holds each row's
    /// accepted drafts followed by the token the target model gave after
    /// them. The tokens are appended one by one, and a stop token,
    /// `max_tokens` or `max_model_len` inside the run ends the request
    /// there (the rest are dropped). The slots of rejected drafts are given
    /// back (a block holding only rejected tokens returns to the free
    /// queue); full computed blocks of verified tokens enter the prefix
    /// cache, then blocks no later query can see (sliding-window groups)
    /// are released; the proposers learn the verified tokens; finished
    /// requests leave at once and free their blocks. A row's token may be
    /// [`HOLD_TOKEN`] (no drafts accepted): nothing is appended and its
    /// pending token runs again next step.
    ///
    /// Nothing is applied when [`Scheduler::check_update`] fails.
    pub fn update_accepted(
        &mut self,
        sampled: &[u32],
        num_accepted: Option<&[usize]>,
    ) -> Result<Vec<Finished>, UpdateError> {
        self.check_update(sampled, num_accepted)?;
        let mut finished = Vec::new();
        let (mut k, mut row) = (0, 0);
        let scheduled = std::mem::take(&mut self.scheduled);
        for &(id, num_new) in &scheduled {
            let req = self.requests.get_mut(&id).expect("scheduled request");
            let drafts = std::mem::take(&mut req.draft_tokens);
            req.num_computed_tokens += num_new - drafts.len();
            if req.num_computed_tokens < req.num_tokens() {
                self.cache_full_blocks(id); // partial (chunked) prefill: nothing sampled
                self.release_skipped(id);
                continue;
            }
            let a = num_accepted.map_or(0, |acc| acc[row]);
            row += 1;
            let n = req.num_samples();
            let tokens = &sampled[k..k + a + n];
            k += a + n;
            if !drafts.is_empty() {
                // Slots up to the last verified token's stay; the rest held
                // only rejected drafts.
                self.kv
                    .truncate(&mut req.block_tables, req.num_computed_tokens + a);
                self.draft_policy
                    .record(&mut req.spec_acceptance, drafts.len(), a);
                self.stats.spec_num_accepted_tokens += a as u64;
                let per_pos = &mut self.stats.spec_num_accepted_tokens_per_pos;
                if per_pos.len() < drafts.len() {
                    per_pos.resize(drafts.len(), 0);
                }
                for p in &mut per_pos[..a] {
                    *p += 1;
                }
            }
            if n == 1 && a == 0 && tokens[0] == HOLD_TOKEN && num_new > 0 {
                // Nothing appended: the last token runs again next step.
                req.num_computed_tokens -= 1;
                continue;
            }
            if n == 1 {
                for (i, &token) in tokens.iter().enumerate() {
                    // Accepted drafts were computed in this step; the
                    // token after them is not.
                    let reason = req.append_and_check(token, self.config.max_model_len);
                    if i < a {
                        req.num_computed_tokens += 1;
                    }
                    if let Some(reason) = reason {
                        finished.push(Finished {
                            id,
                            reason,
                            stop_token: (reason == FinishReason::Stop).then_some(token),
                            output_token_ids: req.output_token_ids().to_vec(),
                        });
                        break;
                    }
                }
                self.learn(id);
                self.cache_full_blocks(id);
                self.release_skipped(id);
                continue;
            }
            let children = std::mem::take(&mut req.pending_children);
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
                self.learn(seq);
                self.cache_full_blocks(seq);
                self.release_skipped(seq);
            }
        }
        for f in &finished {
            self.remove(f.id, true);
        }
        Ok(finished)
    }

    /// Forget the scheduled step without applying it (its forward pass
    /// failed): nothing was computed, so every request stays where it was and
    /// is scheduled again (or aborted) afterwards. Blocks stay allocated,
    /// but those of draft tokens.
    pub fn cancel_step(&mut self) {
        for (id, _) in std::mem::take(&mut self.scheduled) {
            let req = self.requests.get_mut(&id).expect("scheduled request");
            if !std::mem::take(&mut req.draft_tokens).is_empty() {
                self.kv
                    .truncate(&mut req.block_tables, req.num_computed_tokens + 1);
            }
        }
        self.moves.clear();
    }

    /// Tokens `update()` expects for the last step: one per sampled row, or
    /// one per sequence of a group at its first sample (plus, with
    /// speculation, each row's accepted drafts).
    pub fn num_sampled_tokens(&self) -> usize {
        self.scheduled
            .iter()
            .map(|(id, n)| {
                let r = &self.requests[id];
                if r.num_computed_tokens + n - r.draft_tokens.len() == r.num_tokens() {
                    r.num_samples()
                } else {
                    0
                }
            })
            .sum()
    }

    /// Feed `id`'s verified tokens to its proposer.
    fn learn(&mut self, id: u64) {
        if let Some(p) = self.proposers.as_mut() {
            let req = self.requests.get_mut(&id).expect("request");
            p.feed(&mut req.proposer, &req.token_ids);
        }
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
            (req.num_cached_blocks, full),
            req.lora_id,
        );
        req.num_cached_blocks = req.num_cached_blocks.max(full);
    }
}
