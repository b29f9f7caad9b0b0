//! Preemption (paper §4.5): when a running request needs a block and none is
//! free, the most recently arrived running group gives its blocks back, all
//! of its sequences at once, by swapping them to the CPU pool (when it holds
//! the whole group) or by freeing them for recompute.

use super::config::PreemptionMode;
use super::config::SchedulingPolicy;
use super::request::Status;
use super::scheduler::{Queue, Scheduler};
use crate::kv_cache::KvCacheManager;

impl Scheduler {
    /// Preempt every running sequence of `victim`'s group (all-or-nothing),
    /// taking back any of them already scheduled this step; by swapping when
    /// `allow_swap`, the preemption mode is swap and the CPU pool holds the
    /// whole group, else by recompute. Returns the tokens given back to the
    /// step's budget.
    pub(super) fn preempt_group(&mut self, victim: u64, allow_swap: bool) -> usize {
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
        let blocks: usize = members
            .iter()
            .map(|m| KvCacheManager::num_live(&self.requests[m].block_tables))
            .sum();
        let swap = allow_swap
            && self.config.preemption_mode == PreemptionMode::Swap
            && blocks <= self.kv.cpu_pool().num_free();
        match self.config.scheduling_policy {
            // To the front of their queue: the last member first, so the
            // group keeps its order.
            SchedulingPolicy::Fcfs => {
                for &m in members.iter().rev() {
                    let queue = self.preempt(m, swap);
                    match queue {
                        Queue::Waiting => self.waiting.push_front(m),
                        Queue::Swapped => self.swapped.push_front(m),
                    }
                }
            }
            // Back to their (priority, arrival) place, in group order.
            SchedulingPolicy::Priority => {
                for &m in &members {
                    let queue = self.preempt(m, swap);
                    self.enqueue_by_key(queue, m);
                }
            }
        }
        returned
    }

    /// Preempt one sequence: swap its blocks out (if `swap` and the CPU pool
    /// has room) or free them for recompute. Returns the queue it belongs in
    /// (the caller puts it there).
    fn preempt(&mut self, id: u64, swap: bool) -> Queue {
        let req = self.requests.get_mut(&id).expect("preempted request");
        self.stats.num_preemptions += 1;
        req.num_preemptions += 1;
        if swap {
            let before = self.moves.swap_out.len();
            if self
                .kv
                .swap_out(&mut req.block_tables, &mut self.moves.swap_out)
            {
                self.stats.num_swapped_out += (self.moves.swap_out.len() - before) as u64;
                req.status = Status::Swapped;
                return Queue::Swapped;
            }
        }
        self.kv.free(&mut req.block_tables);
        req.num_computed_tokens = 0;
        req.num_cached_blocks = 0;
        req.status = Status::Waiting;
        Queue::Waiting
    }

    /// Priority policy: when the head of the waiting queue cannot be
    /// admitted (no room in the KV cache or in `max_num_seqs`), preempt the
    /// worst running group if it is worse than the head (by recompute, so it
    /// waits behind the head rather than in the swapped queue that is
    /// admitted first). Returns the tokens given back to the step's budget,
    /// or `None` when nothing was preempted.
    pub(super) fn preempt_for_waiting_head(&mut self) -> Option<usize> {
        if self.config.scheduling_policy != SchedulingPolicy::Priority {
            return None;
        }
        let head = self.requests[self.waiting.front()?].queue_key();
        let victim = self.preemption_victim()?;
        (self.requests[&victim].queue_key() > head).then(|| self.preempt_group(victim, false))
    }
}
