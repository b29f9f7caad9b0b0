//! KV allocation policies: paged (this engine) and the contiguous-reservation
//! baselines of the paper's §2.3 / Figure 2, plus the per-step memory
//! breakdown that compares them.
//!
//! * `Paged`: blocks allocated on demand as tokens arrive (PagedAttention).
//! * `ReserveMax` (Orca (Max)): at admission a request reserves one contiguous
//!   run of slots for `max_model_len` tokens.
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

/// How the scheduler gives KV slots to requests.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum AllocationPolicy {
    /// Blocks on demand (PagedAttention).
    #[default]
    Paged,
    /// Orca (Max): reserve `max_model_len` tokens.
    ReserveMax,
    /// Orca (Pow2): reserve prompt + next power of two of the output length.
    ReservePow2,
    /// Orca (Oracle): reserve prompt + the output length.
    ReserveOracle,
    /// Static batching: reserve like `ReserveMax`; no joins mid-batch.
    Static,
}

impl AllocationPolicy {
    /// Every policy, in the order of [`AllocationPolicy::as_str`]'s names.
    pub const ALL: [AllocationPolicy; 5] = [
        AllocationPolicy::Paged,
        AllocationPolicy::ReserveMax,
        AllocationPolicy::ReservePow2,
        AllocationPolicy::ReserveOracle,
        AllocationPolicy::Static,
    ];

    /// The Python spelling: "paged", "reserve-max", "reserve-pow2",
    /// "reserve-oracle" or "static".
    pub fn as_str(self) -> &'static str {
        match self {
            AllocationPolicy::Paged => "paged",
            AllocationPolicy::ReserveMax => "reserve-max",
            AllocationPolicy::ReservePow2 => "reserve-pow2",
            AllocationPolicy::ReserveOracle => "reserve-oracle",
            AllocationPolicy::Static => "static",
        }
    }

    /// Parse a name of [`AllocationPolicy::as_str`].
    pub fn parse(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|p| p.as_str() == name)
    }

    /// True for the policies that reserve one contiguous run per request.
    #[inline]
    pub fn reserves(self) -> bool {
        self != AllocationPolicy::Paged
    }

    /// Tokens a request with `prompt_len` prompt tokens reserves at admission
    /// (0 for `Paged`): see the module documentation.
    pub fn reservation(
        self,
        prompt_len: usize,
        max_tokens: usize,
        expected_output_len: Option<usize>,
        max_model_len: usize,
    ) -> usize {
        let out = expected_output_len
            .unwrap_or(max_tokens)
            .min(max_tokens)
            .max(1);
        let tokens = match self {
            AllocationPolicy::Paged => return 0,
            AllocationPolicy::ReserveMax | AllocationPolicy::Static => max_model_len,
            AllocationPolicy::ReservePow2 => prompt_len.saturating_add(out.next_power_of_two()),
            AllocationPolicy::ReserveOracle => prompt_len.saturating_add(out),
        };
        tokens.min(max_model_len)
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

/// Where the device pool's `total` token slots are, right after `schedule()`
/// (the memory the step's forward pass runs with). The five shares sum to
/// `total` (blocks shared by several sequences count once per sequence; a
/// benchmark without sharing is exact).
///
/// For each device-resident sequence with `kv` = tokens whose KV is in the
/// cache once this step's tokens are written (computed + scheduled now),
/// `alloc` = its allocated slots (blocks x block size) and `final_kv` = the
/// KV states it will ever hold (prompt + `max_tokens`, capped at
/// `max_model_len`, minus one: the last sampled token is never fed back):
/// slot positions `[0, kv)` are token states, `[kv, min(alloc, final_kv))`
/// reservation, `[max(kv, final_kv), alloc)` internal fragmentation. Free
/// slots are external fragmentation when no request can use them: the policy
/// reserves (a running request never takes another slot, only an admission
/// can) and the head of the waiting queue was not admitted at this step for
/// lack of a fitting contiguous run, or (static batching) because its batch
/// has not finished. Otherwise (paged: any free block serves any request's
/// next block; nothing waits; `max_num_seqs` or the token budget) they are
/// `free`. `final_kv` assumes each request runs to `max_tokens` (no stop
/// token), as in the memory benchmark.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MemoryBreakdown {
    /// Device slots (blocks x block size).
    pub total: usize,
    /// Slots holding KV states of tokens in the cache.
    pub token_states: usize,
    /// Allocated slots a future token of the same request will fill.
    pub reservation: usize,
    /// Allocated slots that will never hold a token.
    pub internal: usize,
    /// Free slots no request can use at this step.
    pub external: usize,
    /// The other free slots.
    pub free: usize,
    /// Running requests.
    pub num_running: usize,
    /// Waiting requests.
    pub num_waiting: usize,
    /// Why the head of the waiting queue was not admitted.
    pub admission_block: AdmissionBlock,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for p in AllocationPolicy::ALL {
            assert_eq!(AllocationPolicy::parse(p.as_str()), Some(p));
        }
        assert_eq!(AllocationPolicy::parse("orca"), None);
    }

    #[test]
    fn reservations() {
        use AllocationPolicy::*;
        assert_eq!(Paged.reservation(10, 100, None, 2048), 0);
        assert_eq!(ReserveMax.reservation(10, 100, Some(5), 2048), 2048);
        assert_eq!(Static.reservation(10, 100, None, 2048), 2048);
        assert_eq!(ReserveOracle.reservation(10, 100, Some(33), 2048), 43);
        assert_eq!(ReserveOracle.reservation(10, 100, None, 2048), 110);
        assert_eq!(ReserveOracle.reservation(10, 20, Some(33), 2048), 30);
        assert_eq!(ReservePow2.reservation(10, 100, Some(33), 2048), 74);
        assert_eq!(ReservePow2.reservation(10, 100, Some(32), 2048), 42);
        assert_eq!(ReservePow2.reservation(2000, 100, Some(33), 2048), 2048);
        assert_eq!(ReserveOracle.reservation(10, 100, Some(0), 2048), 11);
    }
}
