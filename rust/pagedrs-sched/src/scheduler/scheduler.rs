//! The scheduler's state and its step loop (paper §4.5, Orca-style
//! iteration-level batching).
//!
//! Every step: running requests first, in arrival order, each gets the tokens it
//! still needs (1 in decode, the rest of its prompt in prefill) within the token
//! budget; then swapped-out requests come back, then waiting requests join,
//! while budget, `max_num_seqs` and free blocks allow (`admission.rs`). When a
//! running request needs a block and none is free, the most recently arrived
//! running request's group is preempted (`preemption.rs`). The other concerns
//! live beside this file: draft tokens (`speculation.rs`), applying a
//! step's samples (`update.rs`), forks (`fork.rs`) and memory accounting
//! (`accounting.rs`).

use std::collections::VecDeque;

use rustc_hash::FxHashMap;

use super::config::{ConfigError, SchedulerConfig, SchedulingPolicy};
use super::policy::{AdmissionBlock, AllocationPolicy};
use super::request::{FinishReason, Request, Status};
use super::types::{check_prompt_len, AddError, BlockMoves, Finished, SchedulerStats};
use crate::kv_cache::{KvCacheManager, KvEvent};
use crate::spec_decode::{
    DraftPolicy, Proposers, SeqProposer, SpecConfigError, SpeculativeConfig, StepCostModel,
};

/// A queue a preempted or new group waits in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Queue {
    /// New requests, and groups preempted by recompute.
    Waiting,
    /// Groups preempted by swapping.
    Swapped,
}

/// Continuous batching scheduler over a paged KV cache.
#[derive(Debug)]
pub struct Scheduler {
    pub(super) config: SchedulerConfig,
    /// The allocation policy named by `config.allocation_policy`.
    pub(super) policy: Box<dyn AllocationPolicy>,
    pub(super) kv: KvCacheManager,
    pub(super) requests: FxHashMap<u64, Request>,
    pub(super) waiting: VecDeque<u64>,
    pub(super) running: Vec<u64>,
    pub(super) swapped: VecDeque<u64>,
    /// (request id, new tokens) of the last `schedule()`, consumed by `update()`.
    pub(super) scheduled: Vec<(u64, usize)>,
    pub(super) moves: BlockMoves,
    pub(super) stats: SchedulerStats,
    /// Why the waiting queue's head was not admitted at the last step
    /// (reserving policies only).
    pub(super) admission_block: AdmissionBlock,
    /// Arrival number of the next request queued.
    pub(super) next_arrival: u64,
    /// The draft proposers (speculative decoding on).
    pub(super) proposers: Option<Proposers>,
    /// How long each sequence's drafts are (speculative decoding on).
    pub(super) draft_policy: DraftPolicy,
    /// Most distinct LoRA adapters among the running sequences (`lora.rs`);
    /// None: no bound.
    pub(super) max_loras: Option<usize>,
}

impl Scheduler {
    /// A scheduler with empty pools, once `config` passes
    /// [`SchedulerConfig::validate`]. A policy whose sequences never share
    /// blocks turns prefix caching off.
    pub fn new(mut config: SchedulerConfig) -> Result<Self, ConfigError> {
        config.validate()?;
        let policy = config.allocation_policy.build();
        if !policy.shares_blocks() {
            config.enable_prefix_caching = false;
        }
        let kv = KvCacheManager::new(
            config.num_blocks,
            config.num_cpu_blocks,
            config.block_size,
            config.enable_prefix_caching,
            config.kv_cache_groups.clone(),
        );
        let proposers = config.speculative_config.clone().map(Proposers::new);
        let draft_policy = DraftPolicy {
            costs: config
                .speculative_config
                .as_ref()
                .and_then(|c| c.draft_step_costs.clone()),
            ..DraftPolicy::default()
        };
        Ok(Self {
            config,
            policy,
            kv,
            requests: FxHashMap::default(),
            waiting: VecDeque::new(),
            running: Vec::new(),
            swapped: VecDeque::new(),
            scheduled: Vec::new(),
            moves: BlockMoves::default(),
            stats: SchedulerStats::default(),
            admission_block: AdmissionBlock::None,
            next_arrival: 0,
            proposers,
            draft_policy,
            max_loras: None,
        })
    }

    /// Configuration in force.
    pub fn config(&self) -> &SchedulerConfig {
        &self.config
    }

    /// The allocation policy in force.
    pub fn policy(&self) -> &dyn AllocationPolicy {
        self.policy.as_ref()
    }

    /// The KV cache manager (read only).
    pub fn kv(&self) -> &KvCacheManager {
        &self.kv
    }

    /// Record (or stop recording) prefix-cache events (off by default).
    pub fn enable_kv_events(&mut self, enabled: bool) {
        self.kv.set_kv_events(enabled);
    }

    /// Prefix-cache events since the last call, oldest first.
    pub fn take_kv_events(&mut self) -> Vec<KvEvent> {
        self.kv.take_kv_events()
    }

    /// Forget every cached prefix when no device block is in use (no
    /// request running); false, changing nothing, otherwise.
    pub fn reset_prefix_cache(&mut self) -> bool {
        self.kv.reset_prefix_cache()
    }

    /// The draft proposers, when speculative decoding is on.
    pub fn proposers(&self) -> Option<&Proposers> {
        self.proposers.as_ref()
    }

    /// The draft-length policy: its cost model and the engine's acceptance
    /// counts.
    pub fn draft_policy(&self) -> &DraftPolicy {
        &self.draft_policy
    }

    /// Replace the step cost model of the goodput draft-length policy
    /// (`None`: every proposal drafted in full), from the next
    /// `schedule()` on; the acceptance counts stay. Ignored without
    /// speculative decoding.
    ///
    /// # Errors
    /// A cost model under `draft_length_policy` "fixed" (the
    /// configuration's check, naming `draft_step_costs`).
    pub fn set_draft_step_costs(
        &mut self,
        costs: Option<StepCostModel>,
    ) -> Result<(), SpecConfigError> {
        if let Some(c) = self.config.speculative_config.as_mut() {
            let new = SpeculativeConfig {
                draft_step_costs: costs.clone(),
                ..c.clone()
            };
            new.validate()?;
            *c = new;
            self.draft_policy.costs = costs;
        }
        Ok(())
    }

    /// Counters.
    pub fn stats(&self) -> &SchedulerStats {
        &self.stats
    }

    /// A live request by id.
    pub fn request(&self, id: u64) -> Option<&Request> {
        self.requests.get(&id)
    }

    /// Iterate over live requests (waiting, running and swapped).
    pub fn requests(&self) -> impl Iterator<Item = &Request> {
        self.requests.values()
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
        check_prompt_len(len, self.config.max_model_len)?;
        if req.priority != 0 && self.config.scheduling_policy == SchedulingPolicy::Fcfs {
            return Err(AddError::PriorityNeedsPolicy(req.priority));
        }
        if !req.pending_children.is_empty() {
            self.policy
                .check_sharing("n > 1, best_of > 1 and beam search")?;
        }
        req.num_prompt_tokens = len;
        req.num_computed_tokens = 0;
        req.status = Status::Waiting;
        req.block_tables = self.kv.new_tables();
        req.arrival = self.next_arrival;
        self.next_arrival += 1;
        if self.config.enable_prefix_caching {
            req.update_block_hashes(self.config.block_size);
        }
        req.draft_tokens.clear();
        req.proposer = match self.proposers.as_mut() {
            Some(p) if req.num_speculative_tokens != Some(0) => p.add_group(&req.token_ids),
            _ => SeqProposer::default(),
        };
        let id = req.id;
        self.requests.insert(id, req);
        match self.config.scheduling_policy {
            SchedulingPolicy::Fcfs => self.waiting.push_back(id),
            SchedulingPolicy::Priority => self.enqueue_by_key(Queue::Waiting, id),
        }
        Ok(())
    }

    /// Insert `id` into `queue` after every entry whose (priority, arrival)
    /// is not worse than its own (the priority policy's order).
    pub(super) fn enqueue_by_key(&mut self, queue: Queue, id: u64) {
        let key = self.requests[&id].queue_key();
        let requests = &self.requests;
        let q = match queue {
            Queue::Waiting => &mut self.waiting,
            Queue::Swapped => &mut self.swapped,
        };
        let at = q.partition_point(|other| requests[other].queue_key() <= key);
        q.insert(at, id);
    }

    /// The running sequence whose group is preempted first: the most
    /// recently arrived (first come, first served), or the worst
    /// (priority, arrival) (priority policy; among equals, the last in the
    /// running order).
    pub(super) fn preemption_victim(&self) -> Option<u64> {
        match self.config.scheduling_policy {
            SchedulingPolicy::Fcfs => self.running.last().copied(),
            SchedulingPolicy::Priority => self
                .running
                .iter()
                .copied()
                .max_by_key(|id| self.requests[id].queue_key()),
        }
    }

    /// Pick this step's requests and token counts, allocating blocks on demand
    /// and preempting when the pool runs dry; with speculative decoding,
    /// then give decoding sequences draft tokens from what budget and free
    /// blocks are left (drafts never preempt, never delay a verified token,
    /// and stop at `max_model_len` and `max_tokens`). Returns the pairs
    /// (request id, number of new tokens, drafts included), running
    /// requests first.
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
                    &mut req.block_tables,
                    req.num_computed_tokens,
                    target,
                    &mut self.moves.copies,
                ) {
                    break Some(num_new);
                }
                let victim = self.preemption_victim().expect("running is non-empty");
                budget += self.preempt_group(victim, true);
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
            budget = self.admit_swapped(budget);
            if self.swapped.is_empty() {
                budget = self.admit_waiting(budget);
            }
            self.schedule_drafts(budget);
        }
        self.stats.num_steps += 1;
        &self.scheduled
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
        self.remove(id, reason != FinishReason::Abort);
        Some(Finished {
            id,
            reason,
            stop_token: None,
            output_token_ids,
        })
    }

    /// Drop request `id` from its queue and free its blocks; with
    /// `learn`, its outputs join the proposers' global state (it finished
    /// rather than being aborted).
    pub(super) fn remove(&mut self, id: u64, learn: bool) {
        let Some(mut req) = self.requests.remove(&id) else {
            return;
        };
        if let Some(p) = self.proposers.as_mut() {
            p.remove_member(&req.proposer, learn.then(|| req.output_token_ids()));
        }
        match req.status {
            Status::Swapped => {
                self.kv.free_swapped(&mut req.block_tables);
                self.swapped.retain(|&r| r != id);
            }
            Status::Running => {
                self.kv.free(&mut req.block_tables);
                self.running.retain(|&r| r != id);
            }
            Status::Waiting => {
                self.kv.free(&mut req.block_tables);
                self.waiting.retain(|&r| r != id);
            }
        }
    }
}
