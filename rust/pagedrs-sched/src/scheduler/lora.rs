//! LoRA adapters in admission: at most `max_loras` distinct adapters among
//! the running sequences, so every step's batch needs at most that many
//! adapter slots in the executor (vLLM's `max_loras`). A queued group whose
//! adapter is new to the running batch waits at the queue's head while the
//! running sequences hold `max_loras` others (first come, first served is
//! kept: nothing behind it overtakes it); the base model (`lora_id` 0) never
//! counts.

use rustc_hash::FxHashSet;

use super::scheduler::Scheduler;

/// Why a `max_loras` setting is refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MaxLorasError;

impl std::fmt::Display for MaxLorasError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "max_loras must be positive, got 0")
    }
}

impl std::error::Error for MaxLorasError {}

impl Scheduler {
    /// Bound the distinct LoRA adapters among running sequences (None: no
    /// bound, the default).
    ///
    /// # Errors
    /// `Some(0)`.
    pub fn set_max_loras(&mut self, max_loras: Option<usize>) -> Result<(), MaxLorasError> {
        if max_loras == Some(0) {
            return Err(MaxLorasError);
        }
        self.max_loras = max_loras;
        Ok(())
    }

    /// The bound in force.
    pub fn max_loras(&self) -> Option<usize> {
        self.max_loras
    }

    /// The distinct adapters (non-zero `lora_id`s) of the running sequences.
    pub fn running_loras(&self) -> FxHashSet<u64> {
        self.running
            .iter()
            .map(|id| self.requests[id].lora_id)
            .filter(|&l| l != 0)
            .collect()
    }

    /// Whether `group` (one adapter: a group's sequences share their
    /// request's) may join the running batch under `max_loras`.
    pub(super) fn lora_room(&self, group: &[u64]) -> bool {
        let Some(max) = self.max_loras else {
            return true;
        };
        let Some(first) = group.first() else {
            return true;
        };
        let lora = self.requests[first].lora_id;
        if lora == 0 {
            return true;
        }
        let running = self.running_loras();
        running.contains(&lora) || running.len() < max
    }
}

#[cfg(test)]
mod tests {
    use crate::kv_cache::KvCacheGroupSpec;
    use crate::scheduler::{
        AllocationPolicyKind, PreemptionMode, Request, SamplingConfig, Scheduler, SchedulerConfig,
        SchedulingPolicy, StopConfig,
    };

    fn scheduler(max_loras: usize) -> Scheduler {
        let mut s = Scheduler::new(SchedulerConfig {
            num_blocks: 64,
            num_cpu_blocks: 0,
            block_size: 4,
            max_num_seqs: 16,
            max_num_batched_tokens: 256,
            max_model_len: 64,
            enable_chunked_prefill: true,
            enable_prefix_caching: true,
            preemption_mode: PreemptionMode::Recompute,
            allocation_policy: AllocationPolicyKind::Paged,
            kv_cache_groups: vec![KvCacheGroupSpec::FULL],
            scheduling_policy: SchedulingPolicy::Fcfs,
            speculative_config: None,
        })
        .unwrap();
        s.set_max_loras(Some(max_loras)).unwrap();
        s
    }

    fn request(id: u64, lora_id: u64) -> Request {
        let mut r = Request::new(
            id,
            vec![1, 2, 3, 4, 5],
            SamplingConfig::default(),
            StopConfig {
                max_tokens: 4,
                ..StopConfig::default()
            },
        );
        r.lora_id = lora_id;
        r
    }

    #[test]
    fn admission_holds_at_most_max_loras_adapters() {
        let mut s = scheduler(2);
        for (id, lora) in [(1, 7), (2, 0), (3, 8), (4, 7), (5, 9), (6, 0)] {
            s.add(request(id, lora)).unwrap();
        }
        let ids: Vec<u64> = s.schedule().iter().map(|&(id, _)| id).collect();
        // 9 is a third adapter: it waits at the head, and 6 behind it too.
        assert_eq!(ids, vec![1, 2, 3, 4]);
        assert_eq!(s.running_loras().len(), 2);
        assert!(s.set_max_loras(Some(0)).is_err());
    }
}
