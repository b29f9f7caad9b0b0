//! Preemption (paper §4.5): when a running request needs a block and none is
//! free, the most recently arrived running group gives its blocks back, all
//! of its sequences at once, by swapping them to the CPU pool (when it holds
//! the whole group) or by freeing them for recompute.

use super::config::PreemptionMode;
use super::request::Status;
use super::scheduler::Scheduler;
use crate::kv_cache::KvCacheManager;

impl Scheduler {
    /// Preempt every running sequence of `victim`'s group (all-or-nothing),
    /// taking back any of them already scheduled this step. Returns the tokens
    /// given back to the step's budget.
    pub(super) fn preempt_group(&mut self, victim: u64) -> usize {
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
            .map(|m| KvCacheManager::num_live(&self.requests[m].block_tables))
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
                .swap_out(&mut req.block_tables, &mut self.moves.swap_out)
            {
                self.stats.num_swapped_out += (self.moves.swap_out.len() - before) as u64;
                req.status = Status::Swapped;
                self.swapped.push_front(id);
                return;
            }
        }
        self.kv.free(&mut req.block_tables);
        req.num_computed_tokens = 0;
        req.num_cached_blocks = 0;
        req.status = Status::Waiting;
        self.waiting.push_front(id);
    }
}
