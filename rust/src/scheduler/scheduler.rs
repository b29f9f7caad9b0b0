//! Iteration-level continuous batching scheduler (paper §4.5, Orca-style).
//!
//! Every step: running requests first, in arrival order, each gets the tokens it
//! still needs (1 in decode, the rest of its prompt in prefill) within the token
//! budget; then waiting requests join while budget, `max_num_seqs` and free
//! blocks allow. When a running request needs a block and none is free, the most
//! recently arrived running request is preempted (recompute: its blocks are freed
//! and it goes back to the front of the waiting queue).

use std::collections::{HashMap, VecDeque};

use super::request::{FinishReason, Request};
use crate::kv_cache::{blocks_for, KvCacheManager};

/// Limits that shape each step.
#[derive(Debug, Clone)]
pub struct SchedulerConfig {
    /// Physical blocks in the device pool.
    pub num_blocks: usize,
    /// Tokens per block.
    pub block_size: usize,
    /// Most sequences in one step.
    pub max_num_seqs: usize,
    /// Token budget per step (prefill + decode tokens).
    pub max_num_batched_tokens: usize,
    /// Longest sequence (prompt + output) in tokens.
    pub max_model_len: usize,
    /// Split long prompts across steps when the budget is short.
    pub enable_chunked_prefill: bool,
}

/// Error for a request that can never be served.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AddError {
    /// The id is already in use.
    DuplicateId(u64),
    /// Empty prompt.
    EmptyPrompt,
    /// Prompt of `len` tokens with `max_model_len` limit.
    PromptTooLong { len: usize, max_model_len: usize },
}

impl std::fmt::Display for AddError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            AddError::DuplicateId(id) => write!(f, "request id {id} is already in use"),
            AddError::EmptyPrompt => write!(f, "prompt must contain at least one token"),
            AddError::PromptTooLong { len, max_model_len } => write!(
                f,
                "prompt has {len} tokens, but max_model_len is {max_model_len} \
                 (the prompt plus at least one generated token must fit)"
            ),
        }
    }
}

impl std::error::Error for AddError {}

/// A finished request, reported once by [`Scheduler::update`] or
/// [`Scheduler::abort`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Finished {
    /// Request id.
    pub id: u64,
    /// Why it stopped.
    pub reason: FinishReason,
    /// The stop token that ended it, if any.
    pub stop_token: Option<u32>,
    /// Every generated token id.
    pub output_token_ids: Vec<u32>,
}

/// Counters for `kv_cache_stats()`.
#[derive(Debug, Clone, Default)]
pub struct SchedulerStats {
    /// Requests preempted so far.
    pub num_preemptions: u64,
    /// Steps scheduled so far.
    pub num_steps: u64,
}

/// Continuous batching scheduler over a paged KV cache.
#[derive(Debug)]
pub struct Scheduler {
    config: SchedulerConfig,
    kv: KvCacheManager,
    requests: HashMap<u64, Request>,
    waiting: VecDeque<u64>,
    running: Vec<u64>,
    /// (request id, new tokens) of the last `schedule()`, consumed by `update()`.
    scheduled: Vec<(u64, usize)>,
    stats: SchedulerStats,
}

impl Scheduler {
    /// A scheduler with an empty pool of `config.num_blocks` blocks.
    pub fn new(config: SchedulerConfig) -> Self {
        let kv = KvCacheManager::new(config.num_blocks, config.block_size);
        Self {
            config,
            kv,
            requests: HashMap::new(),
            waiting: VecDeque::new(),
            running: Vec::new(),
            scheduled: Vec::new(),
            stats: SchedulerStats::default(),
        }
    }

    /// Configuration in force.
    pub fn config(&self) -> &SchedulerConfig {
        &self.config
    }

    /// The KV cache manager (read only).
    pub fn kv(&self) -> &KvCacheManager {
        &self.kv
    }

    /// Counters.
    pub fn stats(&self) -> &SchedulerStats {
        &self.stats
    }

    /// A live request by id.
    pub fn request(&self, id: u64) -> Option<&Request> {
        self.requests.get(&id)
    }

    /// Number of requests waiting (new or preempted).
    pub fn num_waiting(&self) -> usize {
        self.waiting.len()
    }

    /// Number of running requests.
    pub fn num_running(&self) -> usize {
        self.running.len()
    }

    /// True when no request is waiting or running.
    pub fn is_idle(&self) -> bool {
        self.waiting.is_empty() && self.running.is_empty()
    }

    /// The (id, new tokens) pairs of the last scheduled step.
    pub fn scheduled(&self) -> &[(u64, usize)] {
        &self.scheduled
    }

    /// Queue a request; it joins a batch at the next step with room for it.
    /// The request's `max_tokens` is capped so the sequence fits `max_model_len`.
    pub fn add(&mut self, mut req: Request) -> Result<(), AddError> {
        if self.requests.contains_key(&req.id) {
            return Err(AddError::DuplicateId(req.id));
        }
        let len = req.token_ids.len();
        if len == 0 {
            return Err(AddError::EmptyPrompt);
        }
        if len >= self.config.max_model_len {
            return Err(AddError::PromptTooLong {
                len,
                max_model_len: self.config.max_model_len,
            });
        }
        req.num_prompt_tokens = len;
        req.num_computed_tokens = 0;
        self.waiting.push_back(req.id);
        self.requests.insert(req.id, req);
        Ok(())
    }

    /// Pick this step's requests and token counts, allocating blocks on demand
    /// and preempting by recompute when the pool runs dry. Returns the pairs
    /// (request id, number of new tokens), running requests first.
    pub fn schedule(&mut self) -> &[(u64, usize)] {
        self.scheduled.clear();
        let mut budget = self.config.max_num_batched_tokens;
        let mut preempted_now = false;

        let mut i = 0;
        while i < self.running.len() && budget > 0 {
            let id = self.running[i];
            let req = &self.requests[&id];
            let num_new = (req.num_tokens() - req.num_computed_tokens).min(budget);
            let target = req.num_computed_tokens + num_new;
            let mut scheduled_self = true;
            loop {
                let req = self.requests.get_mut(&id).expect("running request");
                if self.kv.allocate_slots(&mut req.block_table, target) {
                    break;
                }
                let victim = self.running.pop().expect("running is non-empty");
                self.preempt(victim);
                preempted_now = true;
                if victim == id {
                    scheduled_self = false;
                    break;
                }
            }
            if !scheduled_self {
                break;
            }
            self.scheduled.push((id, num_new));
            budget -= num_new;
            i += 1;
        }

        if !preempted_now {
            while budget > 0 && self.running.len() < self.config.max_num_seqs {
                let Some(&id) = self.waiting.front() else {
                    break;
                };
                let req = self.requests.get_mut(&id).expect("waiting request");
                let remaining = req.num_tokens() - req.num_computed_tokens;
                if remaining > budget && !self.config.enable_chunked_prefill {
                    break;
                }
                let num_new = remaining.min(budget);
                if !self
                    .kv
                    .allocate_slots(&mut req.block_table, req.num_computed_tokens + num_new)
                {
                    break;
                }
                self.waiting.pop_front();
                self.running.push(id);
                self.scheduled.push((id, num_new));
                budget -= num_new;
            }
        }
        self.stats.num_steps += 1;
        &self.scheduled
    }

    fn preempt(&mut self, id: u64) {
        let req = self.requests.get_mut(&id).expect("preempted request");
        self.kv.free(&mut req.block_table);
        req.num_computed_tokens = 0;
        req.num_preemptions += 1;
        self.stats.num_preemptions += 1;
        self.waiting.push_front(id);
    }

    /// Apply one step's results. `sampled[k]` is the token sampled for the k-th
    /// scheduled request that completed its pending tokens this step (in
    /// schedule order). Finished requests leave at once and free their blocks.
    ///
    /// # Panics
    /// If `sampled` has the wrong length.
    pub fn update(&mut self, sampled: &[u32]) -> Vec<Finished> {
        let mut finished = Vec::new();
        let mut k = 0;
        let max_model_len = self.config.max_model_len;
        for &(id, num_new) in &self.scheduled {
            let req = self.requests.get_mut(&id).expect("scheduled request");
            req.num_computed_tokens += num_new;
            if req.num_computed_tokens < req.num_tokens() {
                continue; // partial (chunked) prefill: nothing sampled
            }
            let token = sampled[k];
            k += 1;
            if let Some(reason) = req.append_and_check(token, max_model_len) {
                let stop_token = (reason == FinishReason::Stop).then_some(token);
                finished.push(Finished {
                    id,
                    reason,
                    stop_token,
                    output_token_ids: req.output_token_ids().to_vec(),
                });
            }
        }
        assert_eq!(k, sampled.len(), "one sampled token per completed request");
        self.scheduled.clear();
        for f in &finished {
            self.remove(f.id);
        }
        finished
    }

    /// Number of rows the last step samples (requests whose pending tokens are
    /// all computed after this step).
    pub fn num_sampled_rows(&self) -> usize {
        self.scheduled
            .iter()
            .filter(|(id, n)| {
                let r = &self.requests[id];
                r.num_computed_tokens + n == r.num_tokens()
            })
            .count()
    }

    /// Abort a waiting or running request: its blocks return to the pool at once.
    /// Returns `None` if the id is unknown (already finished).
    ///
    /// # Panics
    /// If called between `schedule()` and `update()` for a scheduled request.
    pub fn abort(&mut self, id: u64) -> Option<Finished> {
        assert!(
            !self.scheduled.iter().any(|(s, _)| *s == id),
            "abort of request {id} inside a step"
        );
        let output_token_ids = self.requests.get(&id)?.output_token_ids().to_vec();
        self.remove(id);
        Some(Finished {
            id,
            reason: FinishReason::Abort,
            stop_token: None,
            output_token_ids,
        })
    }

    fn remove(&mut self, id: u64) {
        if let Some(mut req) = self.requests.remove(&id) {
            self.kv.free(&mut req.block_table);
            self.running.retain(|&r| r != id);
            self.waiting.retain(|&r| r != id);
        }
    }

    /// Blocks a request of `num_tokens` tokens would hold.
    pub fn blocks_for(&self, num_tokens: usize) -> usize {
        blocks_for(num_tokens, self.config.block_size)
    }

    /// Iterate over live requests (waiting and running).
    pub fn requests(&self) -> impl Iterator<Item = &Request> {
        self.requests.values()
    }
}
