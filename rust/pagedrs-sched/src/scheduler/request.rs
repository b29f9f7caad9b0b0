//! A request (sequence) as the scheduler sees it: token ids, progress, limits.

use crate::kv_cache::{extend_block_hashes, hash_extra_keys, BlockHash, BlockTable};
use crate::spec_decode::{Acceptance, SeqProposer};

/// Why a request finished. `Stop` covers EOS and stop token ids.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FinishReason {
    /// EOS or a stop token id was sampled.
    Stop,
    /// `max_tokens` reached, or the sequence hit `max_model_len`.
    Length,
    /// Aborted by the user.
    Abort,
}

impl FinishReason {
    /// vLLM / OpenAI spelling of the reason.
    pub fn as_str(self) -> &'static str {
        match self {
            FinishReason::Stop => "stop",
            FinishReason::Length => "length",
            FinishReason::Abort => "abort",
        }
    }
}

/// Seed of the `index`-th sequence of a group whose first sequence has `seed`
/// (-1, no seed, stays -1). The Python sampler uses the same formula.
pub fn child_seed(seed: i64, index: usize) -> i64 {
    if seed < 0 || index == 0 {
        return seed;
    }
    let mixed = (seed as u64).wrapping_add((index as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15));
    (mixed >> 1) as i64
}

/// Per-request sampling settings carried in Rust so each step can hand them to
/// the sampler as flat arrays.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SamplingConfig {
    /// 0 means greedy.
    pub temperature: f32,
    /// Nucleus mass in (0, 1].
    pub top_p: f32,
    /// 0 or -1 means disabled.
    pub top_k: i32,
    /// Per-request seed; -1 means none.
    pub seed: i64,
}

impl Default for SamplingConfig {
    fn default() -> Self {
        Self {
            temperature: 0.0,
            top_p: 1.0,
            top_k: -1,
            seed: -1,
        }
    }
}

/// Stop rules for one request.
#[derive(Debug, Clone, Default)]
pub struct StopConfig {
    /// Maximum number of generated tokens.
    pub max_tokens: usize,
    /// No EOS / stop token finishes the request before this many tokens.
    pub min_tokens: usize,
    /// Token ids that finish the request (EOS is included unless ignore_eos).
    pub stop_token_ids: Vec<u32>,
}

/// Where a request is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Status {
    /// Queued (new, or preempted by recompute).
    #[default]
    Waiting,
    /// In the running batch.
    Running,
    /// Preempted by swapping: its blocks live in the CPU pool.
    Swapped,
}

/// One sequence: prompt + generated token ids and its block table.
#[derive(Debug, Clone)]
pub struct Request {
    /// Caller-assigned id.
    pub id: u64,
    /// Prompt followed by generated tokens.
    pub token_ids: Vec<u32>,
    /// Length of the prompt in tokens.
    pub num_prompt_tokens: usize,
    /// Tokens whose KV states are already in the cache.
    pub num_computed_tokens: usize,
    /// Logical -> physical blocks, one table per KV cache group (empty
    /// until the scheduler queues the request).
    pub block_tables: Vec<BlockTable>,
    /// Sampling settings.
    pub sampling: SamplingConfig,
    /// Stop rules.
    pub stop: StopConfig,
    /// Times this request was preempted.
    pub num_preemptions: u32,
    /// Extra key of its block hashes (per-tenant cache salt); empty for none.
    pub cache_salt: Vec<u8>,
    /// Its LoRA adapter (`LoRARequest.lora_int_id`), 0 for the base model:
    /// an extra key of its block hashes, and what `max_loras` admission counts.
    pub lora_id: u64,
    /// Chained hashes of its full blocks (prefix caching).
    pub block_hashes: Vec<BlockHash>,
    /// Leading blocks already registered in the prefix cache.
    pub num_cached_blocks: usize,
    /// Waiting, running or swapped.
    pub status: Status,
    /// Sequence group (parallel sampling): the id of the request that forked
    /// it, or its own id. Preemption takes a whole group.
    pub group_id: u64,
    /// Ids of the sequences to fork from this one at its first sample
    /// (n / best_of > 1): they share its prompt blocks.
    pub pending_children: Vec<u64>,
    /// Output length the reserving allocation policies plan for (Orca
    /// (Oracle) reserves exactly this, Orca (Pow2) its next power of two);
    /// `None` means `max_tokens`. Ignored by the paged policy.
    pub expected_output_len: Option<usize>,
    /// Lower runs first under the priority scheduling policy (vLLM's
    /// semantics); ignored under first come, first served.
    pub priority: i64,
    /// Arrival order, set when the scheduler queues the request; a forked
    /// sequence keeps its parent's (its group arrived then).
    pub arrival: u64,
    /// Most draft tokens per step for this request under speculative
    /// decoding (capped by the configuration's `num_speculative_tokens`);
    /// `None`: the configuration's, 0: no speculation.
    pub num_speculative_tokens: Option<usize>,
    /// Draft tokens scheduled in the step in flight, after its verified
    /// tokens (never in `token_ids`: only verified tokens are).
    pub draft_tokens: Vec<u32>,
    /// Its proposer state (speculative decoding).
    pub proposer: SeqProposer,
    /// Its drafts' acceptance so far (the draft-length policy's input).
    pub spec_acceptance: Acceptance,
}

impl Request {
    /// Total tokens (prompt + generated).
    pub fn num_tokens(&self) -> usize {
        self.token_ids.len()
    }

    /// Generated tokens so far.
    pub fn num_output_tokens(&self) -> usize {
        self.token_ids.len() - self.num_prompt_tokens
    }

    /// Generated token ids.
    pub fn output_token_ids(&self) -> &[u32] {
        &self.token_ids[self.num_prompt_tokens..]
    }

    /// Hash every full block not hashed yet.
    pub fn update_block_hashes(&mut self, block_size: usize) {
        if self.token_ids.len() / block_size <= self.block_hashes.len() {
            return; // no new full block
        }
        let extra = hash_extra_keys(&self.cache_salt, self.lora_id);
        extend_block_hashes(&mut self.block_hashes, &self.token_ids, block_size, &extra);
    }

    /// A fresh request of `token_ids` (prompt) with default settings.
    pub fn new(id: u64, token_ids: Vec<u32>, sampling: SamplingConfig, stop: StopConfig) -> Self {
        Self {
            id,
            num_prompt_tokens: token_ids.len(),
            token_ids,
            num_computed_tokens: 0,
            block_tables: Vec::new(),
            sampling,
            stop,
            num_preemptions: 0,
            cache_salt: Vec::new(),
            lora_id: 0,
            block_hashes: Vec::new(),
            num_cached_blocks: 0,
            status: Status::Waiting,
            group_id: id,
            pending_children: Vec::new(),
            expected_output_len: None,
            priority: 0,
            arrival: 0,
            num_speculative_tokens: None,
            draft_tokens: Vec::new(),
            proposer: SeqProposer::default(),
            spec_acceptance: Acceptance::default(),
        }
    }

    /// Queue order under the priority policy: (priority, arrival).
    pub fn queue_key(&self) -> (i64, u64) {
        (self.priority, self.arrival)
    }

    /// Tokens sampled for this request's row this step: one, or one per
    /// sequence of its group at the group's first sample.
    pub fn num_samples(&self) -> usize {
        if self.num_output_tokens() == 0 {
            1 + self.pending_children.len()
        } else {
            1
        }
    }

    /// Append a sampled token and say whether the request is done.
    pub fn append_and_check(&mut self, token: u32, max_model_len: usize) -> Option<FinishReason> {
        self.token_ids.push(token);
        let n_out = self.num_output_tokens();
        if n_out >= self.stop.min_tokens && self.stop.stop_token_ids.contains(&token) {
            return Some(FinishReason::Stop);
        }
        if n_out >= self.stop.max_tokens || self.num_tokens() >= max_model_len {
            return Some(FinishReason::Length);
        }
        None
    }
}
