//! Admission: which queued groups join the running batch at this step.
//!
//! One planning path serves both queues. The group at the queue's front is
//! planned whole (tokens within the budget, blocks it needs), admitted only
//! if every member fits, and otherwise retried one sequence at a time when
//! nothing runs to free room. The queues differ only in how a member starts:
//! a waiting request from the longest cached prefix of its prompt (pinned
//! before any allocation can evict it), or from the contiguous reservation
//! of a reserving allocation policy; a swapped request from its KV, swapped
//! back in from the CPU pool.

use std::collections::VecDeque;

use super::policy::AdmissionBlock;
use super::request::Status;
use super::scheduler::{Queue, Scheduler};
use crate::kv_cache::{blocks_for, CachedPrefix};

/// One sequence of a group planned for admission.
#[derive(Debug)]
struct Planned {
    id: u64,
    /// Tokens whose KV is in the cache when it joins.
    computed: usize,
    /// Tokens scheduled this step (0: it joins and runs from the next step).
    num_new: usize,
    /// Cached prefix it starts from (waiting queue).
    hits: CachedPrefix,
    /// Tokens it reserves in one contiguous run (reserving policies).
    reserve: Option<usize>,
}

impl Scheduler {
    /// Bring swapped-out groups back, whole groups only, oldest first.
    /// Returns the budget left.
    pub(super) fn admit_swapped(&mut self, budget: usize) -> usize {
        self.admit(Queue::Swapped, budget).0
    }

    /// Admit waiting groups (new requests, or groups preempted by recompute),
    /// whole groups only (a group larger than the whole pool goes one
    /// sequence at a time), and record why the queue's head stays waiting.
    /// Returns the budget left.
    pub(super) fn admit_waiting(&mut self, budget: usize) -> usize {
        let (left, stopped) =
            if !self.waiting.is_empty() && self.policy.holds_admission(self.running.len()) {
                (budget, AdmissionBlock::Batch)
            } else {
                self.admit(Queue::Waiting, budget)
            };
        self.admission_block = self.policy.admission_block(stopped);
        left
    }

    fn queue(&self, queue: Queue) -> &VecDeque<u64> {
        match queue {
            Queue::Waiting => &self.waiting,
            Queue::Swapped => &self.swapped,
        }
    }

    /// Admit groups from the front of `queue` while they fit. Returns the
    /// budget left and why admission stopped.
    fn admit(&mut self, queue: Queue, mut budget: usize) -> (usize, AdmissionBlock) {
        let mut single = false;
        let stopped = loop {
            let Some(group) = self.next_group(self.queue(queue), single) else {
                if queue == Queue::Waiting {
                    if let Some(returned) = self.preempt_for_waiting_head() {
                        budget += returned;
                        continue;
                    }
                }
                break if self.queue(queue).is_empty() {
                    AdmissionBlock::None
                } else {
                    AdmissionBlock::Limit
                };
            };
            let mut plan = Vec::with_capacity(group.len());
            let (mut need, mut left) = (0, budget);
            for &id in &group {
                let Some((member, blocks)) = self.plan_member(queue, id, left, plan.is_empty())
                else {
                    break;
                };
                need += blocks;
                left -= member.num_new;
                plan.push(member);
            }
            let complete = plan.len() == group.len();
            if !complete || !self.fits(&plan, need) {
                // Out of memory (not budget): the priority policy may make room.
                if complete && queue == Queue::Waiting {
                    if let Some(returned) = self.preempt_for_waiting_head() {
                        budget += returned;
                        continue;
                    }
                }
                if self.running.is_empty() && group.len() > 1 && !single {
                    // Nothing runs to free room for the whole group: rather
                    // than wait forever, let its first sequence go alone.
                    single = true;
                    continue;
                }
                break if complete {
                    AdmissionBlock::Memory
                } else {
                    AdmissionBlock::Limit
                };
            }
            single = false;
            self.commit(queue, plan);
            budget = left;
        };
        (budget, stopped)
    }

    /// Plan `id` with `left` tokens of budget, `first` in its group: where it
    /// starts, its tokens this step and the free blocks it takes. `None` when
    /// it cannot join now: the first sequence gets no tokens, or a waiting
    /// prompt would be split without chunked prefill. Later sequences of a
    /// group may join with no tokens (the budget ran out) and run from the
    /// next step.
    fn plan_member(
        &self,
        queue: Queue,
        id: u64,
        left: usize,
        first: bool,
    ) -> Option<(Planned, usize)> {
        let bs = self.config.block_size;
        let req = &self.requests[&id];
        match queue {
            Queue::Waiting => {
                // A fully cached prompt still computes its last token.
                let hits = self
                    .kv
                    .find_cached_prefix(&req.block_hashes, (req.num_tokens() - 1) / bs);
                let computed = hits.num_blocks * bs;
                let remaining = req.num_tokens() - computed;
                let num_new = remaining.min(left);
                let no_split = !self.config.enable_chunked_prefill && num_new > 0;
                if (first && num_new == 0) || (no_split && num_new < remaining) {
                    return None;
                }
                let reserve = self.policy.reservation(req, self.config.max_model_len);
                let blocks = match reserve {
                    Some(tokens) => blocks_for(tokens, bs),
                    None => {
                        let groups = self.kv.groups().len();
                        groups * (blocks_for(computed + num_new, bs) - hits.num_blocks)
                            + self.kv.num_free_among(&hits)
                    }
                };
                let member = Planned {
                    id,
                    computed,
                    num_new,
                    hits,
                    reserve,
                };
                Some((member, blocks))
            }
            Queue::Swapped => {
                let computed = req.num_computed_tokens;
                let num_new = (req.num_tokens() - computed).min(left);
                if first && num_new == 0 {
                    return None;
                }
                // Its held blocks come back; new ones follow them.
                let target = blocks_for(computed + num_new, bs);
                let blocks = req
                    .block_tables
                    .iter()
                    .map(|t| target.max(t.len()) - t.num_skipped())
                    .sum();
                let member = Planned {
                    id,
                    computed,
                    num_new,
                    hits: CachedPrefix::default(),
                    reserve: None,
                };
                Some((member, blocks))
            }
        }
    }

    /// True when the device pool has the `need` free blocks of `plan`, and a
    /// free contiguous run for each reservation.
    fn fits(&self, plan: &[Planned], need: usize) -> bool {
        let pool = self.kv.pool();
        let bs = self.config.block_size;
        need <= pool.num_free()
            && plan.iter().all(|m| {
                m.reserve
                    .is_none_or(|tokens| pool.find_free_run(blocks_for(tokens, bs)).is_some())
            })
    }

    /// Move the planned group from the front of `queue` into the running batch.
    fn commit(&mut self, queue: Queue, plan: Vec<Planned>) {
        let bs = self.config.block_size;
        if queue == Queue::Waiting {
            // Pin every member's cached prefix before any allocation can evict it.
            for m in &plan {
                let req = self.requests.get_mut(&m.id).expect("waiting request");
                self.kv.take_cached_prefix(&mut req.block_tables, &m.hits);
            }
        }
        for m in plan {
            let req = self.requests.get_mut(&m.id).expect("queued request");
            match queue {
                Queue::Swapped => {
                    let before = self.moves.swap_in.len();
                    assert!(self
                        .kv
                        .swap_in(&mut req.block_tables, &mut self.moves.swap_in));
                    self.stats.num_swapped_in += (self.moves.swap_in.len() - before) as u64;
                }
                Queue::Waiting if self.kv.prefix_caching() => {
                    self.stats.prefix_cache_queries += req.num_tokens() as u64;
                    self.stats.prefix_cache_hits += m.computed as u64;
                }
                Queue::Waiting => {}
            }
            match m.reserve {
                Some(tokens) => {
                    assert!(self
                        .kv
                        .reserve_contiguous(&mut req.block_tables, blocks_for(tokens, bs)));
                    // The request stops when it reaches its reservation.
                    req.stop.max_tokens = req.stop.max_tokens.min(tokens - req.num_prompt_tokens);
                }
                None => assert!(self.kv.allocate_slots(
                    &mut req.block_tables,
                    m.computed,
                    m.computed + m.num_new,
                    &mut self.moves.copies,
                )),
            }
            req.num_computed_tokens = m.computed;
            // Swapped-in blocks are new device blocks: register them again.
            req.num_cached_blocks = m.hits.num_blocks;
            req.status = Status::Running;
            match queue {
                Queue::Waiting => self.waiting.pop_front(),
                Queue::Swapped => self.swapped.pop_front(),
            };
            self.running.push(m.id);
            if m.num_new > 0 {
                self.scheduled.push((m.id, m.num_new));
            }
        }
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
    /// when the queue is empty, or `max_num_seqs` or `max_loras` leaves no
    /// room.
    fn next_group(&self, queue: &VecDeque<u64>, single: bool) -> Option<Vec<u64>> {
        let mut group = self.front_group(queue);
        if single || self.never_resident(&group) {
            group.truncate(1);
        }
        let room = self.running.len() + group.len() <= self.config.max_num_seqs;
        (!group.is_empty() && room && self.lora_room(&group)).then_some(group)
    }

    /// True when `group`'s sequences cannot run together: more of them than
    /// `max_num_seqs`, or, at their current lengths, more blocks than the
    /// pool (counting the whole chunk a sliding-window group holds during a
    /// step: otherwise a member's prefill could preempt its own group).
    fn never_resident(&self, group: &[u64]) -> bool {
        let chunk = self.config.max_num_batched_tokens;
        group.len() > 1
            && (group.len() > self.config.max_num_seqs
                || group
                    .iter()
                    .map(|id| self.kv.peak_blocks(self.requests[id].num_tokens(), chunk))
                    .sum::<usize>()
                    > self.kv.pool().num_total())
    }
}
