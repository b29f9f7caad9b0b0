//! Iteration-level continuous batching scheduler (paper §4.5, Orca-style).
//!
//! Every step: running requests first, in arrival order, each gets the tokens it
//! still needs (1 in decode, the rest of its prompt in prefill) within the token
//! budget; then swapped-out requests come back, then waiting requests join,
//! while budget, `max_num_seqs` and free blocks allow. A new request starts from
//! the longest cached prefix of its prompt (prefix caching). When a running
//! request needs a block and none is free, the most recently arrived running
//! request is preempted: by recompute (blocks freed, back to the front of the
//! waiting queue) or by swap (blocks moved to the CPU pool).

use std::collections::{HashMap, VecDeque};

use super::policy::{AdmissionBlock, AllocationPolicy, MemoryBreakdown};
use super::request::{child_seed, FinishReason, Request, Status};
use crate::kv_cache::{blocks_for, BlockCopy, KvCacheManager};

/// A "sampled" token that appends nothing: the row's last token is computed
/// again at the next step (a beam group waits until all its beams run together).
pub const HOLD_TOKEN: u32 = u32::MAX;

/// How a preempted request gives back its blocks (paper §4.5).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum PreemptionMode {
    /// Free the blocks; recompute the KV cache from the tokens later.
    #[default]
    Recompute,
    /// Copy the blocks to the CPU pool and back (recompute if the pool is full).
    Swap,
}

/// Limits that shape each step.
#[derive(Debug, Clone)]
pub struct SchedulerConfig {
    /// Physical blocks in the device pool.
    pub num_blocks: usize,
    /// Blocks in the CPU swap pool.
    pub num_cpu_blocks: usize,
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
    /// Reuse cached blocks of equal prefixes.
    pub enable_prefix_caching: bool,
    /// Recompute or swap.
    pub preemption_mode: PreemptionMode,
    /// Paged (blocks on demand) or a contiguous-reservation baseline (see
    /// [`AllocationPolicy`]); a reserving policy turns prefix caching off.
    pub allocation_policy: AllocationPolicy,
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
    /// Fork of a request that is not running between steps.
    NotForkable(u64),
    /// A feature (forks, parallel sampling) the reserving allocation
    /// `policy` does not support.
    NeedsPaged {
        what: &'static str,
        policy: &'static str,
    },
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
            AddError::NotForkable(id) => {
                write!(f, "request {id} is not running, or a step is in flight")
            }
            AddError::NeedsPaged { what, policy } => write!(
                f,
                "{what} needs allocation_policy='paged' (this scheduler uses {policy:?}, \
                 which reserves one contiguous run per request)"
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
    /// Blocks copied device -> CPU.
    pub num_swapped_out: u64,
    /// Blocks copied CPU -> device.
    pub num_swapped_in: u64,
    /// Prompt tokens looked up in the prefix cache.
    pub prefix_cache_queries: u64,
    /// Of those, tokens found cached (prefill skipped).
    pub prefix_cache_hits: u64,
}

/// Block moves the executor applies before the step's forward pass, in this
/// order: swap out, swap in, copy-on-write copies.
#[derive(Debug, Clone, Default)]
pub struct BlockMoves {
    /// (device block, CPU block) pairs to copy out.
    pub swap_out: Vec<BlockCopy>,
    /// (CPU block, device block) pairs to copy in.
    pub swap_in: Vec<BlockCopy>,
    /// (source, destination) device block pairs (copy-on-write).
    pub copies: Vec<BlockCopy>,
}

impl BlockMoves {
    fn clear(&mut self) {
        self.swap_out.clear();
        self.swap_in.clear();
        self.copies.clear();
    }

    /// True when there is nothing to move.
    pub fn is_empty(&self) -> bool {
        self.swap_out.is_empty() && self.swap_in.is_empty() && self.copies.is_empty()
    }
}

/// Continuous batching scheduler over a paged KV cache.
#[derive(Debug)]
pub struct Scheduler {
    config: SchedulerConfig,
    kv: KvCacheManager,
    requests: HashMap<u64, Request>,
    waiting: VecDeque<u64>,
    running: Vec<u64>,
    swapped: VecDeque<u64>,
    /// (request id, new tokens) of the last `schedule()`, consumed by `update()`.
    scheduled: Vec<(u64, usize)>,
    moves: BlockMoves,
    stats: SchedulerStats,
    /// Why the waiting queue's head was not admitted at the last step
    /// (reserving policies only).
    admission_block: AdmissionBlock,
}

impl Scheduler {
    /// A scheduler with empty pools.
    pub fn new(mut config: SchedulerConfig) -> Self {
        if config.allocation_policy.reserves() {
            config.enable_prefix_caching = false;
        }
        let kv = KvCacheManager::new(
            config.num_blocks,
            config.num_cpu_blocks,
            config.block_size,
            config.enable_prefix_caching,
        );
        Self {
            config,
            kv,
            requests: HashMap::new(),
            waiting: VecDeque::new(),
            running: Vec::new(),
            swapped: VecDeque::new(),
            scheduled: Vec::new(),
            moves: BlockMoves::default(),
            stats: SchedulerStats::default(),
            admission_block: AdmissionBlock::None,
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

    /// Number of requests waiting (new or preempted by recompute).
    pub fn num_waiting(&self) -> usize {
        self.waiting.len()
    }

    /// Number of running requests.
    pub fn num_running(&self) -> usize {
        self.running.len()
    }

    /// Number of requests swapped out to the CPU pool.
    pub fn num_swapped(&self) -> usize {
        self.swapped.len()
    }

    /// True when no request is waiting, running or swapped.
    pub fn is_idle(&self) -> bool {
        self.requests.is_empty()
    }

    /// The (id, new tokens) pairs of the last scheduled step.
    pub fn scheduled(&self) -> &[(u64, usize)] {
        &self.scheduled
    }

    /// Block moves of the last scheduled step.
    pub fn moves(&self) -> &BlockMoves {
        &self.moves
    }

    /// Queue a request; it joins a batch at the next step with room for it.
    /// Generation stops at `max_model_len` tokens whatever `max_tokens` says.
    pub fn add(&mut self, mut req: Request) -> Result<(), AddError> {
        for &id in std::iter::once(&req.id).chain(&req.pending_children) {
            if self.requests.contains_key(&id) {
                return Err(AddError::DuplicateId(id));
            }
        }
        let len = req.token_ids.len();
        if len == 0 {
            return Err(AddError::EmptyPrompt);
        }
        if !req.pending_children.is_empty() && self.config.allocation_policy.reserves() {
            return Err(AddError::NeedsPaged {
                what: "n > 1, best_of > 1 and beam search",
                policy: self.config.allocation_policy.as_str(),
            });
        }
        if len >= self.config.max_model_len {
            return Err(AddError::PromptTooLong {
                len,
                max_model_len: self.config.max_model_len,
            });
        }
        req.num_prompt_tokens = len;
        req.num_computed_tokens = 0;
        req.status = Status::Waiting;
        if self.config.enable_prefix_caching {
            req.update_block_hashes(self.config.block_size);
        }
        self.waiting.push_back(req.id);
        self.requests.insert(req.id, req);
        Ok(())
    }

    /// Fork running request `parent` into a new running request `child`
    /// sharing all its blocks (ref counts up, no copy). The first write into
    /// a shared partial block copies it (see `moves().copies`).
    pub fn fork(&mut self, parent: u64, child: u64) -> Result<(), AddError> {
        self.fork_with_last_token(parent, child, None)
    }

    /// Fork as [`Scheduler::fork`], and make `last_token` (when given) the
    /// child's newest token in place of the parent's. That token is not yet
    /// computed, so the shared blocks stay valid (beam search: one parent
    /// beam continued with several candidate tokens).
    pub fn fork_with_last_token(
        &mut self,
        parent: u64,
        child: u64,
        last_token: Option<u32>,
    ) -> Result<(), AddError> {
        if self.requests.contains_key(&child) {
            return Err(AddError::DuplicateId(child));
        }
        if self.config.allocation_policy.reserves() {
            return Err(AddError::NeedsPaged {
                what: "fork",
                policy: self.config.allocation_policy.as_str(),
            });
        }
        let p = match self.requests.get(&parent) {
            Some(p) if p.status == Status::Running && self.scheduled.is_empty() => p,
            _ => return Err(AddError::NotForkable(parent)),
        };
        let mut c = p.clone();
        c.id = child;
        c.pending_children.clear();
        if let Some(token) = last_token {
            if c.num_output_tokens() == 0 || c.num_computed_tokens != c.num_tokens() - 1 {
                return Err(AddError::NotForkable(parent));
            }
            *c.token_ids.last_mut().expect("non-empty") = token;
            // Hashes that covered the replaced token no longer name this prefix.
            c.block_hashes
                .truncate((c.num_tokens() - 1) / self.config.block_size);
            if self.config.enable_prefix_caching {
                c.update_block_hashes(self.config.block_size);
            }
        }
        c.block_table = self.kv.fork(&p.block_table);
        self.running.push(child);
        self.requests.insert(child, c);
        Ok(())
    }

    /// Pick this step's requests and token counts, allocating blocks on demand
    /// and preempting when the pool runs dry. Returns the pairs
    /// (request id, number of new tokens), running requests first.
    pub fn schedule(&mut self) -> &[(u64, usize)] {
        self.scheduled.clear();
        self.moves.clear();
        let mut budget = self.config.max_num_batched_tokens;
        let mut preempted_now = false;

        while self.scheduled.len() < self.running.len() && budget > 0 {
            let id = self.running[self.scheduled.len()];
            let num_new = loop {
                let req = self.requests.get_mut(&id).expect("running request");
                let num_new = (req.num_tokens() - req.num_computed_tokens).min(budget);
                let target = req.num_computed_tokens + num_new;
                if self.kv.allocate_slots(
                    &mut req.block_table,
                    req.num_computed_tokens,
                    target,
                    &mut self.moves.copies,
                ) {
                    break Some(num_new);
                }
                let victim = *self.running.last().expect("running is non-empty");
                budget += self.preempt_group(victim);
                preempted_now = true;
                if !self.running.contains(&id) {
                    break None;
                }
            };
            if let Some(n) = num_new {
                self.scheduled.push((id, n));
                budget -= n;
            }
        }

        if !preempted_now {
            budget = self.schedule_swapped(budget);
            if self.swapped.is_empty() {
                self.schedule_waiting(budget);
            }
        }
        self.stats.num_steps += 1;
        &self.scheduled
    }

    /// The leading entries of `queue` that belong to the first one's group.
    fn front_group(&self, queue: &VecDeque<u64>) -> Vec<u64> {
        let Some(first) = queue.front() else {
            return Vec::new();
        };
        let group = self.requests[first].group_id;
        queue
            .iter()
            .copied()
            .take_while(|id| self.requests[id].group_id == group)
            .collect()
    }

    /// The group at the front of `queue` to try next: whole, or only its first
    /// sequence when `single` or when it can never be resident at once. None
    /// when the queue is empty or `max_num_seqs` leaves no room.
    fn next_group(&self, queue: &VecDeque<u64>, single: bool) -> Option<Vec<u64>> {
        let mut group = self.front_group(queue);
        if single || self.never_resident(&group) {
            group.truncate(1);
        }
        let room = self.running.len() + group.len() <= self.config.max_num_seqs;
        (!group.is_empty() && room).then_some(group)
    }

    /// True when `group`'s sequences cannot run together: more of them than
    /// `max_num_seqs`, or, at their current lengths, more blocks than the pool.
    fn never_resident(&self, group: &[u64]) -> bool {
        let bs = self.config.block_size;
        group.len() > 1
            && (group.len() > self.config.max_num_seqs
                || group
                    .iter()
                    .map(|id| blocks_for(self.requests[id].num_tokens(), bs))
                    .sum::<usize>()
                    > self.kv.pool().num_total())
    }

    /// Bring swapped-out groups back, whole groups only, oldest first.
    fn schedule_swapped(&mut self, mut budget: usize) -> usize {
        let bs = self.config.block_size;
        let mut single = false;
        while let Some(group) = self.next_group(&self.swapped, single) {
            let mut plan = Vec::with_capacity(group.len());
            let (mut need, mut left) = (0, budget);
            for &id in &group {
                let req = &self.requests[&id];
                let num_new = (req.num_tokens() - req.num_computed_tokens).min(left);
                if plan.is_empty() && num_new == 0 {
                    break; // later sequences of the group may join with no tokens
                }
                let target = req.num_computed_tokens + num_new;
                need += blocks_for(target, bs).max(req.block_table.len());
                left -= num_new;
                plan.push((id, num_new));
            }
            if plan.len() < group.len() || need > self.kv.pool().num_free() {
                if self.running.is_empty() && group.len() > 1 && !single {
                    single = true; // nothing runs to make room: go one at a time
                    continue;
                }
                break;
            }
            single = false;
            for (id, num_new) in plan {
                let req = self.requests.get_mut(&id).expect("swapped request");
                let before = self.moves.swap_in.len();
                assert!(self
                    .kv
                    .swap_in(&mut req.block_table, &mut self.moves.swap_in));
                self.stats.num_swapped_in += (self.moves.swap_in.len() - before) as u64;
                let target = req.num_computed_tokens + num_new;
                assert!(self.kv.allocate_slots(
                    &mut req.block_table,
                    req.num_computed_tokens,
                    target,
                    &mut self.moves.copies,
                ));
                req.status = Status::Running;
                req.num_cached_blocks = 0; // new device blocks: register them again
                self.swapped.pop_front();
                self.running.push(id);
                if num_new > 0 {
                    self.scheduled.push((id, num_new));
                }
            }
            budget = left;
        }
        budget
    }

    /// Admit waiting groups (new requests, or groups preempted by recompute),
    /// whole groups only (a group larger than the whole pool goes one
    /// sequence at a time), each starting from the longest cached prefix.
    fn schedule_waiting(&mut self, mut budget: usize) {
        if self.config.allocation_policy.reserves() {
            return self.schedule_waiting_reserved(budget);
        }
        let bs = self.config.block_size;
        let mut single = false;
        while let Some(group) = self.next_group(&self.waiting, single) {
            let mut plan = Vec::with_capacity(group.len());
            let (mut need, mut left) = (0, budget);
            for &id in &group {
                let req = &self.requests[&id];
                // A fully cached prompt still computes its last token.
                let hits = self
                    .kv
                    .find_cached_prefix(&req.block_hashes, (req.num_tokens() - 1) / bs);
                let computed = hits.len() * bs;
                let remaining = req.num_tokens() - computed;
                let num_new = remaining.min(left);
                // The first sequence must get tokens; later ones of the group may
                // join with none (the budget ran out) and run from the next step.
                let no_split = !self.config.enable_chunked_prefill && num_new > 0;
                if (plan.is_empty() && num_new == 0) || (no_split && num_new < remaining) {
                    break;
                }
                need +=
                    blocks_for(computed + num_new, bs) - hits.len() + self.kv.num_free_among(&hits);
                left -= num_new;
                plan.push((id, hits, num_new));
            }
            if plan.len() < group.len() || need > self.kv.pool().num_free() {
                if self.running.is_empty() && group.len() > 1 && !single {
                    // Nothing runs to free room for the whole group: rather
                    // than wait forever, let its first sequence go alone.
                    single = true;
                    continue;
                }
                break;
            }
            single = false;
            // Pin every member's cached prefix before any allocation can evict it.
            for (id, hits, _) in &plan {
                let req = self.requests.get_mut(id).expect("waiting request");
                self.kv.take_cached_prefix(&mut req.block_table, hits);
            }
            for (id, hits, num_new) in plan {
                let req = self.requests.get_mut(&id).expect("waiting request");
                let computed = hits.len() * bs;
                assert!(self.kv.allocate_slots(
                    &mut req.block_table,
                    computed,
                    computed + num_new,
                    &mut self.moves.copies,
                ));
                if self.kv.prefix_caching() {
                    self.stats.prefix_cache_queries += req.num_tokens() as u64;
                    self.stats.prefix_cache_hits += computed as u64;
                }
                req.num_computed_tokens = computed;
                req.num_cached_blocks = hits.len();
                req.status = Status::Running;
                self.waiting.pop_front();
                self.running.push(id);
                if num_new > 0 {
                    self.scheduled.push((id, num_new));
                }
            }
            budget = left;
        }
    }

    /// Admission under a reserving policy, first come first served: the head
    /// of the waiting queue takes one contiguous run for its whole
    /// reservation (first fit) or waits, and nothing behind it jumps ahead.
    /// Its `max_tokens` is capped at the reservation, so it never needs
    /// another slot (and is never preempted). Static batching admits only
    /// when the previous batch has finished, all joins in that one step.
    fn schedule_waiting_reserved(&mut self, mut budget: usize) {
        let policy = self.config.allocation_policy;
        let bs = self.config.block_size;
        self.admission_block = AdmissionBlock::None;
        if policy == AllocationPolicy::Static
            && !self.running.is_empty()
            && !self.waiting.is_empty()
        {
            self.admission_block = AdmissionBlock::Batch;
            return;
        }
        while let Some(&id) = self.waiting.front() {
            let req = self.requests.get_mut(&id).expect("waiting request");
            let remaining = req.num_tokens();
            let num_new = remaining.min(budget);
            let split = !self.config.enable_chunked_prefill && num_new < remaining;
            if self.running.len() >= self.config.max_num_seqs || num_new == 0 || split {
                self.admission_block = AdmissionBlock::Limit;
                break;
            }
            let prompt = req.num_prompt_tokens;
            let reserve = policy.reservation(
                prompt,
                req.stop.max_tokens,
                req.expected_output_len,
                self.config.max_model_len,
            );
            if !self
                .kv
                .reserve_contiguous(&mut req.block_table, blocks_for(reserve, bs))
            {
                self.admission_block = AdmissionBlock::Memory;
                break;
            }
            req.stop.max_tokens = req.stop.max_tokens.min(reserve - prompt);
            req.num_computed_tokens = 0;
            req.status = Status::Running;
            self.waiting.pop_front();
            self.running.push(id);
            self.scheduled.push((id, num_new));
            budget -= num_new;
        }
    }

    /// Preempt every running sequence of `victim`'s group (all-or-nothing),
    /// taking back any of them already scheduled this step. Returns the tokens
    /// given back to the step's budget.
    fn preempt_group(&mut self, victim: u64) -> usize {
        let group = self.requests[&victim].group_id;
        let members: Vec<u64> = self
            .running
            .iter()
            .copied()
            .filter(|r| self.requests[r].group_id == group)
            .collect();
        self.running.retain(|r| !members.contains(r));
        let mut returned = 0;
        self.scheduled.retain(|(r, n)| {
            let keep = !members.contains(r);
            if !keep {
                returned += n;
            }
            keep
        });
        // The whole group swaps if the CPU pool holds all of it, else recomputes.
        let blocks: usize = members
            .iter()
            .map(|m| self.requests[m].block_table.len())
            .sum();
        let swap = self.config.preemption_mode == PreemptionMode::Swap
            && blocks <= self.kv.cpu_pool().num_free();
        // Preempted sequences go to the front of their queue: push the last
        // member first so the group keeps its order.
        for &m in members.iter().rev() {
            self.preempt(m, swap);
        }
        returned
    }

    /// Preempt one sequence: swap its blocks out (if `swap` and the CPU pool
    /// has room) or free them for recompute.
    fn preempt(&mut self, id: u64, swap: bool) {
        let req = self.requests.get_mut(&id).expect("preempted request");
        self.stats.num_preemptions += 1;
        req.num_preemptions += 1;
        if swap {
            let before = self.moves.swap_out.len();
            if self
                .kv
                .swap_out(&mut req.block_table, &mut self.moves.swap_out)
            {
                self.stats.num_swapped_out += (self.moves.swap_out.len() - before) as u64;
                req.status = Status::Swapped;
                self.swapped.push_front(id);
                return;
            }
        }
        self.kv.free(&mut req.block_table);
        req.num_computed_tokens = 0;
        req.num_cached_blocks = 0;
        req.status = Status::Waiting;
        self.waiting.push_front(id);
    }

    /// Apply one step's results. `sampled[k]` is the token sampled for the k-th
    /// scheduled request that completed its pending tokens this step (in
    /// schedule order). Full computed blocks enter the prefix cache; finished
    /// requests leave at once and free their blocks.
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
                self.fork_child(id, child, j + 1);
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

    /// Register `id`'s computed full blocks in the prefix cache.
    fn cache_full_blocks(&mut self, id: u64) {
        if !self.config.enable_prefix_caching {
            return;
        }
        let req = self.requests.get_mut(&id).expect("request");
        req.update_block_hashes(self.config.block_size);
        let full = req.num_computed_tokens / self.config.block_size;
        self.kv.cache_full_blocks(
            &req.block_table,
            &req.block_hashes,
            req.num_cached_blocks,
            full,
        );
        req.num_cached_blocks = req.num_cached_blocks.max(full);
    }

    /// Fork `parent` into `child`, the `index`-th sequence of its group, placed
    /// in the running queue right after the group's earlier sequences.
    fn fork_child(&mut self, parent: u64, child: u64, index: usize) {
        let p = &self.requests[&parent];
        let mut c = p.clone();
        c.id = child;
        c.pending_children.clear();
        c.sampling.seed = child_seed(p.sampling.seed, index);
        c.block_table = self.kv.fork(&p.block_table);
        let pos = self
            .running
            .iter()
            .position(|&r| r == parent)
            .expect("forked parent is running");
        self.running.insert(pos + index, child);
        self.requests.insert(child, c);
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

    /// Abort a live request: its blocks return to the pool at once.
    /// Returns `None` if the id is unknown (already finished).
    ///
    /// # Panics
    /// If called between `schedule()` and `update()` for a scheduled request.
    pub fn abort(&mut self, id: u64) -> Option<Finished> {
        self.finish(id, FinishReason::Abort)
    }

    /// End a live request from outside the step (abort, or a stop string the
    /// detokenizer found): its blocks return to the pool at once. Returns
    /// `None` if the id is unknown.
    ///
    /// # Panics
    /// If called between `schedule()` and `update()` for a scheduled request.
    pub fn finish(&mut self, id: u64, reason: FinishReason) -> Option<Finished> {
        assert!(
            !self.scheduled.iter().any(|(s, _)| *s == id),
            "request {id} finished inside a step"
        );
        let output_token_ids = self.requests.get(&id)?.output_token_ids().to_vec();
        self.remove(id);
        Some(Finished {
            id,
            reason,
            stop_token: None,
            output_token_ids,
        })
    }

    fn remove(&mut self, id: u64) {
        let Some(mut req) = self.requests.remove(&id) else {
            return;
        };
        match req.status {
            Status::Swapped => {
                self.kv.free_swapped(&mut req.block_table);
                self.swapped.retain(|&r| r != id);
            }
            Status::Running => {
                self.kv.free(&mut req.block_table);
                self.running.retain(|&r| r != id);
            }
            Status::Waiting => {
                self.kv.free(&mut req.block_table);
                self.waiting.retain(|&r| r != id);
            }
        }
    }

    /// Iterate over live requests (waiting, running and swapped).
    pub fn requests(&self) -> impl Iterator<Item = &Request> {
        self.requests.values()
    }

    /// Block-table entries of the device-resident sequences: the blocks they
    /// would hold if nothing were shared.
    pub fn num_table_blocks(&self) -> usize {
        self.requests
            .values()
            .filter(|r| r.status != Status::Swapped)
            .map(|r| r.block_table.len())
            .sum()
    }

    /// Where the device slots are right after `schedule()`: token states,
    /// reservation, internal and external fragmentation, free (see
    /// [`MemoryBreakdown`] for the exact definitions).
    pub fn memory_breakdown(&self) -> MemoryBreakdown {
        let bs = self.config.block_size;
        let new: HashMap<u64, usize> = self.scheduled.iter().copied().collect();
        let mut m = MemoryBreakdown {
            total: self.config.num_blocks * bs,
            num_running: self.running.len(),
            num_waiting: self.waiting.len(),
            admission_block: self.admission_block,
            ..Default::default()
        };
        for r in self.requests.values() {
            if r.status == Status::Swapped {
                continue;
            }
            let alloc = r.block_table.len() * bs;
            let kv = (r.num_computed_tokens + new.get(&r.id).copied().unwrap_or(0)).min(alloc);
            let final_kv =
                (r.num_prompt_tokens + r.stop.max_tokens).min(self.config.max_model_len) - 1;
            m.token_states += kv;
            m.reservation += alloc.min(final_kv).saturating_sub(kv);
            m.internal += alloc.saturating_sub(final_kv.max(kv));
        }
        let free = self.kv.pool().num_free() * bs;
        let blocked = matches!(
            self.admission_block,
            AdmissionBlock::Memory | AdmissionBlock::Batch
        );
        if self.config.allocation_policy.reserves() && blocked && !self.waiting.is_empty() {
            m.external = free;
        } else {
            m.free = free;
        }
        m
    }

    /// Token states stored in device blocks, and device slots allocated
    /// (used blocks x block size). A shared block counts once.
    pub fn kv_token_usage(&self) -> (usize, usize) {
        let bs = self.config.block_size;
        let mut filled = vec![0usize; self.config.num_blocks];
        for r in self.requests.values() {
            if r.status == Status::Swapped {
                continue;
            }
            for (i, &b) in r.block_table.blocks().iter().enumerate() {
                let n = r.num_computed_tokens.saturating_sub(i * bs).min(bs);
                filled[b as usize] = filled[b as usize].max(n);
            }
        }
        let pool = self.kv.pool();
        (
            filled.iter().sum(),
            (pool.num_total() - pool.num_free()) * bs,
        )
    }
}
