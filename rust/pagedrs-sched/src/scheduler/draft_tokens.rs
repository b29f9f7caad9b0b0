//! A draft model's tokens written into the step in flight: with
//! `method = "draft_model"` the scheduler reserves each drafted sequence's
//! slots with placeholder tokens (`spec_decode::DRAFT_PLACEHOLDER`), the
//! engine runs the draft model and hands its tokens back here before the
//! verify forward, so that `update()` checks accepted tokens against them.

use super::scheduler::Scheduler;

/// `set_draft_tokens` got a number of tokens other than the step's drafts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DraftTokensError {
    /// Tokens given.
    pub got: usize,
    /// Draft slots of the step in flight.
    pub expected: usize,
}

impl std::fmt::Display for DraftTokensError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "set_draft_tokens() got {} tokens, the step in flight has {} draft slots",
            self.got, self.expected
        )
    }
}

impl std::error::Error for DraftTokensError {}

impl Scheduler {
    /// Replace the draft tokens of the step in flight with `tokens`, row by
    /// row in the batch's order (`StepBatch.draft_token_ids`'s layout);
    /// nothing changes on a length mismatch.
    pub fn set_draft_tokens(&mut self, tokens: &[u32]) -> Result<(), DraftTokensError> {
        let expected: usize = self
            .scheduled
            .iter()
            .map(|(id, _)| self.requests[id].draft_tokens.len())
            .sum();
        if tokens.len() != expected {
            return Err(DraftTokensError {
                got: tokens.len(),
                expected,
            });
        }
        let mut k = 0;
        for (id, _) in &self.scheduled {
            let req = self.requests.get_mut(id).expect("scheduled request");
            let d = req.draft_tokens.len();
            req.draft_tokens.copy_from_slice(&tokens[k..k + d]);
            k += d;
        }
        Ok(())
    }
}
