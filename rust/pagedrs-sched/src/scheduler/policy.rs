//! KV allocation policies: paged (this engine) and the contiguous-reservation
//! baselines of the paper's §2.3 / Figure 2, behind one trait,
//! [`AllocationPolicy`], that the scheduler asks at each policy decision.
//!
//! * [`Paged`]: blocks allocated on demand as tokens arrive (PagedAttention).
//! * [`Reserving`] with kind `ReserveMax` (Orca (Max)): at admission a
//!   request reserves one contiguous run of slots for `max_model_len` tokens.
//! * `ReservePow2` (Orca (Pow2)): prompt + the next power of two of its
//!   expected output length.
//! * `ReserveOracle` (Orca (Oracle)): prompt + exactly its expected output
//!   length.
//! * `Static` (FasterTransformer-style static batching): reserves like
//!   `ReserveMax`, and a new batch is admitted only once every request of the
//!   previous batch has finished.
//!
//! The expected output length is the request's `expected_output_len` hint,
//! else its `max_tokens`, and never more than `max_tokens`. A reservation is
//! capped at `max_model_len` tokens, and a request stops (finish reason
//! "length") when it reaches its reservation, so it never writes past it.
//! Reserving policies take a first-fit contiguous run of free block ids
//! (use block size 1 so a block is one token slot), never grow a request
//! afterwards (so they never preempt), and do not support prefix caching
//! (forced off), forks or parallel-sampling groups.

use super::config::AllocationPolicyKind;
use super::request::Request;
use super::types::AddError;

impl AllocationPolicyKind {
    /// The policy of this name.
    pub fn build(self) -> Box<dyn AllocationPolicy> {
        match self {
            AllocationPolicyKind::Paged => Box::new(Paged),
            kind => Box::new(Reserving { kind }),
        }
    }
}

/// Why the head of the waiting queue was not admitted at the last step
/// (recorded by the reserving policies only).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum AdmissionBlock {
    /// Nothing waits, or the policy is paged.
    #[default]
    None,
    /// No free contiguous run is as long as its reservation.
    Memory,
    /// Static batching: the current batch has not finished.
    Batch,
    /// `max_num_seqs` or the step's token budget.
    Limit,
}

impl AdmissionBlock {
    /// "none", "memory", "batch" or "limit".
    pub fn as_str(self) -> &'static str {
        match self {
            AdmissionBlock::None => "none",
            AdmissionBlock::Memory => "memory",
            AdmissionBlock::Batch => "batch",
            AdmissionBlock::Limit => "limit",
        }
    }
}

/// How the scheduler gives KV slots to requests: one answer per policy
/// decision, chosen once when the scheduler is built.
pub trait AllocationPolicy: std::fmt::Debug + Send + Sync {
    /// The policy's name.
    fn kind(&self) -> AllocationPolicyKind;

    /// True when sequences may share blocks: prefix caching, forks and
    /// parallel-sampling groups.
    fn shares_blocks(&self) -> bool;

    /// Tokens `req` reserves in one contiguous run at admission (from its
    /// prompt length, `max_tokens` and expected output length, at most
    /// `max_model_len`), or `None` when its blocks come on demand.
    fn reservation(&self, req: &Request, max_model_len: usize) -> Option<usize>;

    /// True when no waiting request may join while `num_running` requests
    /// run (static batching: the batch has not finished).
    fn holds_admission(&self, num_running: usize) -> bool;

    /// What the memory breakdown reports when waiting admission stopped for
    /// `stopped`.
    fn admission_block(&self, stopped: AdmissionBlock) -> AdmissionBlock;

    /// Of the `free` device slots, those no request can use at this step
    /// (external fragmentation), given why admission last stopped and how
    /// many requests wait.
    fn external_slots(&self, stopped: AdmissionBlock, num_waiting: usize, free: usize) -> usize;

    /// `Ok` when the policy supports `what` (a fork, a parallel-sampling
    /// group), which shares blocks between sequences.
    fn check_sharing(&self, what: &'static str) -> Result<(), AddError> {
        if self.shares_blocks() {
            Ok(())
        } else {
            Err(AddError::NeedsPaged {
                what,
                policy: self.kind().as_str(),
            })
        }
    }
}

/// PagedAttention: blocks on demand; any free block serves any request's
/// next block, so free slots are never external fragmentation.
#[derive(Debug, Clone, Copy, Default)]
pub struct Paged;

impl AllocationPolicy for Paged {
    fn kind(&self) -> AllocationPolicyKind {
        AllocationPolicyKind::Paged
    }

    fn shares_blocks(&self) -> bool {
        true
    }

    fn reservation(&self, _: &Request, _: usize) -> Option<usize> {
        None
    }

    fn holds_admission(&self, _num_running: usize) -> bool {
        false
    }

    fn admission_block(&self, _stopped: AdmissionBlock) -> AdmissionBlock {
        AdmissionBlock::None
    }

    fn external_slots(&self, _: AdmissionBlock, _: usize, _: usize) -> usize {
        0
    }
}

/// The contiguous-reservation baselines (Orca max/pow2/oracle, static
/// batching): see the module documentation.
#[derive(Debug, Clone, Copy)]
pub struct Reserving {
    /// Which baseline; never `Paged`.
    pub kind: AllocationPolicyKind,
}

impl AllocationPolicy for Reserving {
    fn kind(&self) -> AllocationPolicyKind {
        self.kind
    }

    fn shares_blocks(&self) -> bool {
        false
    }

    fn reservation(&self, req: &Request, max_model_len: usize) -> Option<usize> {
        let (prompt_len, max_tokens) = (req.num_prompt_tokens, req.stop.max_tokens);
        let out = req
            .expected_output_len
            .unwrap_or(max_tokens)
            .min(max_tokens)
            .max(1);
        let tokens = match self.kind {
            AllocationPolicyKind::Paged => return None,
            AllocationPolicyKind::ReserveMax | AllocationPolicyKind::Static => max_model_len,
            AllocationPolicyKind::ReservePow2 => prompt_len.saturating_add(out.next_power_of_two()),
            AllocationPolicyKind::ReserveOracle => prompt_len.saturating_add(out),
        };
        Some(tokens.min(max_model_len))
    }

    fn holds_admission(&self, num_running: usize) -> bool {
        self.kind == AllocationPolicyKind::Static && num_running > 0
    }

    fn admission_block(&self, stopped: AdmissionBlock) -> AdmissionBlock {
        stopped
    }

    fn external_slots(&self, stopped: AdmissionBlock, num_waiting: usize, free: usize) -> usize {
        // A running request never takes another slot: only the waiting head
        // could use the free ones, and it did not fit (or must wait).
        let blocked = matches!(stopped, AdmissionBlock::Memory | AdmissionBlock::Batch);
        if blocked && num_waiting > 0 {
            free
        } else {
            0
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scheduler::{SamplingConfig, StopConfig};

    #[test]
    fn names_round_trip() {
        for p in AllocationPolicyKind::ALL {
            assert_eq!(AllocationPolicyKind::parse(p.as_str()), Ok(p));
            assert_eq!(p.build().kind(), p);
        }
        assert_eq!(
            AllocationPolicyKind::parse("orca").unwrap_err().to_string(),
            "allocation_policy must be one of [\"paged\", \"reserve-max\", \
             \"reserve-pow2\", \"reserve-oracle\", \"static\"], got \"orca\""
        );
    }

    #[test]
    fn reservations() {
        use AllocationPolicyKind::*;
        let r = |kind: AllocationPolicyKind, p: usize, m: usize, e: Option<usize>, l| {
            let stop = StopConfig {
                max_tokens: m,
                min_tokens: 0,
                stop_token_ids: Vec::new(),
            };
            let mut req = Request::new(0, vec![1; p], SamplingConfig::default(), stop);
            req.expected_output_len = e;
            kind.build().reservation(&req, l)
        };
        assert_eq!(r(Paged, 10, 100, None, 2048), None);
        assert_eq!(r(ReserveMax, 10, 100, Some(5), 2048), Some(2048));
        assert_eq!(r(Static, 10, 100, None, 2048), Some(2048));
        assert_eq!(r(ReserveOracle, 10, 100, Some(33), 2048), Some(43));
        assert_eq!(r(ReserveOracle, 10, 100, None, 2048), Some(110));
        assert_eq!(r(ReserveOracle, 10, 20, Some(33), 2048), Some(30));
        assert_eq!(r(ReservePow2, 10, 100, Some(33), 2048), Some(74));
        assert_eq!(r(ReservePow2, 10, 100, Some(32), 2048), Some(42));
        assert_eq!(r(ReservePow2, 2000, 100, Some(33), 2048), Some(2048));
        assert_eq!(r(ReserveOracle, 10, 100, Some(0), 2048), Some(11));
    }
}
