//! Forks: a new running sequence sharing every block of its parent (ref
//! counts up, no copy; the first write into a shared partial block copies it,
//! see `moves().copies`). One path serves the public fork (beam search) and
//! the sequences of a parallel-sampling group forked at its first sample.

use super::request::{child_seed, Status};
use super::scheduler::Scheduler;
use super::types::AddError;

impl Scheduler {
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
        self.policy.check_sharing("fork")?;
        let p = match self.requests.get(&parent) {
            Some(p) if p.status == Status::Running && self.scheduled.is_empty() => p,
            _ => return Err(AddError::NotForkable(parent)),
        };
        if last_token.is_some()
            && (p.num_output_tokens() == 0 || p.num_computed_tokens != p.num_tokens() - 1)
        {
            return Err(AddError::NotForkable(parent));
        }
        let at = self.running.len();
        self.fork_sequence(parent, child, 0, last_token, at);
        Ok(())
    }

    /// Fork `parent` into `child`, the `index`-th sequence of its group, placed
    /// in the running queue right after the group's earlier sequences.
    pub(super) fn fork_group_member(&mut self, parent: u64, child: u64, index: usize) {
        let pos = self
            .running
            .iter()
            .position(|&r| r == parent)
            .expect("forked parent is running");
        self.fork_sequence(parent, child, index, None, pos + index);
    }

    /// Clone `parent` into `child` sharing its blocks, with the seed of the
    /// `index`-th sequence of a group (index 0 keeps the parent's), its newest
    /// token replaced by `last_token` when given (it must not be computed),
    /// and insert it at position `at` of the running queue.
    fn fork_sequence(
        &mut self,
        parent: u64,
        child: u64,
        index: usize,
        last_token: Option<u32>,
        at: usize,
    ) {
        let p = &self.requests[&parent];
        let mut c = p.clone();
        c.id = child;
        c.pending_children.clear();
        c.sampling.seed = child_seed(p.sampling.seed, index);
        if let Some(token) = last_token {
            *c.token_ids.last_mut().expect("non-empty") = token;
            // Hashes that covered the replaced token no longer name this prefix.
            c.block_hashes
                .truncate((c.num_tokens() - 1) / self.config.block_size);
            if self.config.enable_prefix_caching {
                c.update_block_hashes(self.config.block_size);
            }
        }
        c.block_tables = self.kv.fork(&p.block_tables);
        c.draft_tokens.clear();
        if let Some(proposers) = self.proposers.as_mut() {
            proposers.add_member(&c.proposer);
            if last_token.is_some() {
                proposers.replace_last(&mut c.proposer, &c.token_ids);
            }
        }
        self.running.insert(at, child);
        self.requests.insert(child, c);
    }
}
