//! Forced tokens (jump-forward decoding of structured outputs): between
//! steps, a running request's newest token, sampled but not yet computed,
//! is replaced by a run of tokens the caller chose (the grammar leaves one
//! text there, written as the tokenizer's own tokens). The run is computed
//! by the next step like a chunk of prompt, and its last token's logits
//! give the next sample.

use super::request::{FinishReason, Status};
use super::scheduler::Scheduler;
use super::types::Finished;

/// Why `replace_pending` refused (nothing changed).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReplacePendingError {
    /// No live request has this id.
    Unknown(u64),
    /// The request is not running between steps with exactly one pending
    /// (sampled, not computed) output token and no drafts.
    NotPending(u64),
    /// No tokens given.
    Empty,
}

impl std::fmt::Display for ReplacePendingError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ReplacePendingError::Unknown(id) => write!(f, "request {id} is not live"),
            ReplacePendingError::NotPending(id) => write!(
                f,
                "request {id} has no single pending output token to replace \
                 (not running, in a step in flight, or its last token is computed)"
            ),
            ReplacePendingError::Empty => write!(f, "replace_pending() needs at least one token"),
        }
    }
}

impl std::error::Error for ReplacePendingError {}

impl Scheduler {
    /// Replace request `id`'s pending output token (the one `update()`
    /// appended last, not computed yet) by `tokens`, appended one by one
    /// with the same checks as sampled tokens: a stop token, `max_tokens` or
    /// `max_model_len` ends the request there (the rest are dropped) and it
    /// leaves at once. Block hashes that covered the replaced token are
    /// dropped; the next step computes every appended token.
    ///
    /// Returns the number of tokens appended, and the request's `Finished`
    /// when it ended.
    pub fn replace_pending(
        &mut self,
        id: u64,
        tokens: &[u32],
    ) -> Result<(usize, Option<Finished>), ReplacePendingError> {
        if tokens.is_empty() {
            return Err(ReplacePendingError::Empty);
        }
        let in_flight = !self.scheduled.is_empty();
        let bs = self.config.block_size;
        let max_model_len = self.config.max_model_len;
        let req = self
            .requests
            .get_mut(&id)
            .ok_or(ReplacePendingError::Unknown(id))?;
        if in_flight
            || req.status != Status::Running
            || req.num_output_tokens() == 0
            || req.num_computed_tokens + 1 != req.num_tokens()
            || !req.draft_tokens.is_empty()
        {
            return Err(ReplacePendingError::NotPending(id));
        }
        req.token_ids.pop();
        req.block_hashes.truncate(req.num_tokens() / bs);
        let mut appended = 0;
        let mut finished = None;
        for &token in tokens {
            appended += 1;
            if let Some(reason) = req.append_and_check(token, max_model_len) {
                finished = Some(Finished {
                    id,
                    reason,
                    stop_token: (reason == FinishReason::Stop).then_some(token),
                    output_token_ids: req.output_token_ids().to_vec(),
                });
                break;
            }
        }
        if self.config.enable_prefix_caching {
            req.update_block_hashes(bs);
        }
        if let Some(p) = self.proposers.as_mut() {
            p.replace_last(&mut req.proposer, &req.token_ids);
        }
        if finished.is_some() {
            self.remove(id, true);
        }
        Ok((appended, finished))
    }
}
