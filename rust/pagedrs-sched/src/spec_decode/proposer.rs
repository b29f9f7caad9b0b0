//! The proposers' state: one shared part per sequence group (forked
//! sequences share it), one small part per sequence (carried on the
//! `Request`, cloned by a fork), and for `suffix` the global tree over the
//! outputs of earlier requests. The scheduler feeds it the verified tokens
//! in `update()` and asks it for drafts in `schedule()`.

use std::collections::VecDeque;

use rustc_hash::FxHashMap;

use super::config::{SpecMethod, SpeculativeConfig};
use super::ngram::{self, NgramIndex};
use super::suffix_tree::{better, Cursor, SpecLimits, SuffixTree};

/// A sequence's own proposer state, naming its group's shared state.
#[derive(Debug, Clone, Default)]
pub struct SeqProposer {
    /// Key of its group's shared state (assigned by [`Proposers::add_group`]).
    group: u64,
    state: SeqState,
}

impl SeqProposer {
    /// True when the sequence speculates.
    pub fn is_on(&self) -> bool {
        !matches!(self.state, SeqState::Off)
    }
}

#[derive(Debug, Clone, Default)]
enum SeqState {
    /// No speculation.
    #[default]
    Off,
    /// n-grams followed by a token past the prompt (the prompt's are in the
    /// group's shared index).
    Ngram(NgramIndex),
    /// The sequence's suffixes in its group's tree (`fed` tokens).
    Suffix {
        /// Suffix nodes of the fed tokens.
        cursor: Cursor,
        /// Tokens fed.
        fed: usize,
    },
    /// A draft model outside the core drafts; no state here.
    DraftModel,
}

/// The token of a draft slot reserved for a draft model, until the engine
/// writes the draft model's token in (`Scheduler::set_draft_tokens`).
pub const DRAFT_PLACEHOLDER: u32 = 0;

/// What a sequence group shares.
#[derive(Debug)]
enum Shared {
    /// n-grams of the prompt.
    Ngram(NgramIndex),
    /// Substrings of every member's tokens (the prompt counted once).
    Suffix(SuffixTree),
    /// A draft model's sequences share nothing here.
    DraftModel,
}

#[derive(Debug)]
struct Group {
    members: usize,
    shared: Shared,
}

/// Outputs of finished requests in one suffix tree, oldest evicted first.
#[derive(Debug)]
struct GlobalOutputs {
    tree: SuffixTree,
    outputs: VecDeque<Vec<u32>>,
    max_requests: usize,
}

/// Every proposer state of one scheduler.
#[derive(Debug)]
pub struct Proposers {
    config: SpeculativeConfig,
    groups: FxHashMap<u64, Group>,
    /// Key of the next group.
    next_group: u64,
    global: Option<GlobalOutputs>,
}

impl Proposers {
    /// Proposers of `config` (validated), with no sequence yet.
    pub fn new(config: SpeculativeConfig) -> Self {
        let global = (config.method == SpecMethod::Suffix
            && config.suffix_decoding_max_cached_requests > 0)
            .then(|| GlobalOutputs {
                tree: SuffixTree::new(config.suffix_decoding_max_tree_depth),
                outputs: VecDeque::new(),
                max_requests: config.suffix_decoding_max_cached_requests,
            });
        Self {
            config,
            groups: FxHashMap::default(),
            next_group: 0,
            global,
        }
    }

    /// The settings in force.
    pub fn config(&self) -> &SpeculativeConfig {
        &self.config
    }

    /// Start the state of a new group whose first sequence has `tokens`
    /// (its prompt); returns that sequence's own state.
    pub fn add_group(&mut self, tokens: &[u32]) -> SeqProposer {
        let c = &self.config;
        let (shared, state) = match c.method {
            SpecMethod::Ngram => {
                let mut ix = NgramIndex::new(c.prompt_lookup_min, c.prompt_lookup_max, 0);
                ix.feed(tokens);
                let own = NgramIndex::new(c.prompt_lookup_min, c.prompt_lookup_max, tokens.len());
                (Shared::Ngram(ix), SeqState::Ngram(own))
            }
            SpecMethod::Suffix => {
                let mut tree = SuffixTree::new(c.suffix_decoding_max_tree_depth);
                let cursor = tree.insert(tokens);
                let fed = tokens.len();
                (Shared::Suffix(tree), SeqState::Suffix { cursor, fed })
            }
            SpecMethod::DraftModel => (Shared::DraftModel, SeqState::DraftModel),
        };
        let group = self.next_group;
        self.next_group += 1;
        self.groups.insert(group, Group { members: 1, shared });
        SeqProposer { group, state }
    }

    /// One more sequence sharing `seq`'s group (a fork carrying a clone of
    /// `seq`).
    pub fn add_member(&mut self, seq: &SeqProposer) {
        if !seq.is_on() {
            return;
        }
        if let Some(g) = self.groups.get_mut(&seq.group) {
            g.members += 1;
        }
    }

    /// A forked sequence whose newest token (not in its parent's state)
    /// replaced its parent's: its own state follows its `tokens`.
    pub fn replace_last(&mut self, seq: &mut SeqProposer, tokens: &[u32]) {
        if let (
            SeqState::Suffix { cursor, fed },
            Some(Group {
                shared: Shared::Suffix(tree),
                ..
            }),
        ) = (&mut seq.state, self.groups.get_mut(&seq.group))
        {
            *cursor = tree.cursor_for(tokens);
            *fed = tokens.len();
        }
    }

    /// Sequence `seq` left. With `output` (it finished with those generated
    /// tokens), the global suffix tree learns them. The group's state goes
    /// with its last sequence.
    pub fn remove_member(&mut self, seq: &SeqProposer, output: Option<&[u32]>) {
        if !seq.is_on() {
            return;
        }
        if let Some(g) = self.groups.get_mut(&seq.group) {
            g.members -= 1;
            if g.members == 0 {
                self.groups.remove(&seq.group);
            }
        }
        if let (Some(global), Some(out)) = (self.global.as_mut(), output) {
            if out.is_empty() {
                return;
            }
            global.tree.insert(out);
            global.outputs.push_back(out.to_vec());
            while global.outputs.len() > global.max_requests {
                let old = global.outputs.pop_front().expect("non-empty");
                global.tree.remove(&old);
            }
        }
    }

    /// Feed the verified `tokens` of sequence `seq` (they extend what was
    /// fed before).
    pub fn feed(&mut self, seq: &mut SeqProposer, tokens: &[u32]) {
        match &mut seq.state {
            SeqState::Off | SeqState::DraftModel => {}
            SeqState::Ngram(own) => own.feed(tokens),
            SeqState::Suffix { cursor, fed } => {
                let Some(Group {
                    shared: Shared::Suffix(tree),
                    ..
                }) = self.groups.get_mut(&seq.group)
                else {
                    return;
                };
                for &t in &tokens[(*fed).min(tokens.len())..] {
                    tree.push(cursor, t);
                }
                *fed = tokens.len().max(*fed);
            }
        }
    }

    /// At most `max_len` draft tokens to follow `tokens`, the verified
    /// tokens of sequence `seq` (all fed). A draft model's sequence gets
    /// `max_len` [`DRAFT_PLACEHOLDER`] slots, its tokens written in later.
    pub fn propose(&self, seq: &SeqProposer, tokens: &[u32], max_len: usize) -> Vec<u32> {
        if max_len == 0 {
            return Vec::new();
        }
        let c = &self.config;
        let shared = self.groups.get(&seq.group).map(|g| &g.shared);
        match (&seq.state, shared) {
            (SeqState::Ngram(own), Some(Shared::Ngram(prompt))) => ngram::propose(
                tokens,
                &[own, prompt],
                c.prompt_lookup_min,
                c.prompt_lookup_max,
                max_len,
            ),
            (SeqState::Suffix { cursor, .. }, Some(Shared::Suffix(tree))) => {
                let lim = SpecLimits {
                    max_tokens: max_len,
                    max_spec_factor: c.suffix_decoding_max_spec_factor,
                    min_token_prob: c.suffix_decoding_min_token_prob,
                };
                let own = tree.speculate_at(cursor, &lim);
                match &self.global {
                    Some(g) => better(own, g.tree.speculate(tokens, &lim)).tokens,
                    None => own.tokens,
                }
            }
            (SeqState::DraftModel, _) => vec![DRAFT_PLACEHOLDER; max_len],
            _ => Vec::new(),
        }
    }

    /// Groups with proposer state (for tests: nothing outlives its group).
    pub fn num_groups(&self) -> usize {
        self.groups.len()
    }

    /// Finished requests whose outputs the global suffix tree holds.
    pub fn num_cached_outputs(&self) -> usize {
        self.global.as_ref().map_or(0, |g| g.outputs.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn forked_sequences_share_the_group_state() {
        let mut p = Proposers::new(SpeculativeConfig {
            suffix_decoding_max_tree_depth: 8,
            suffix_decoding_max_spec_factor: 3.0,
            suffix_decoding_min_token_prob: 0.0,
            ..SpeculativeConfig::new(SpecMethod::Suffix)
        });
        let prompt = [1, 2, 3];
        let mut a = p.add_group(&prompt);
        let mut b = a.clone();
        p.add_member(&b);
        // a generates "4 5 1 2"; b, sharing the tree, then drafts "3 4 5"
        // after its own "1 2" although it never saw "4 5" itself.
        let ta = [1, 2, 3, 4, 5, 1, 2];
        p.feed(&mut a, &ta);
        let tb = [1, 2, 3, 9, 1, 2];
        p.feed(&mut b, &tb);
        assert_eq!(p.propose(&b, &tb, 3), vec![3, 4, 5]);
        p.remove_member(&a, Some(&ta[3..]));
        assert_eq!(p.num_groups(), 1);
        p.remove_member(&b, None);
        assert_eq!(p.num_groups(), 0);
        assert_eq!(p.num_cached_outputs(), 1);
        // A new request drafts from the global tree of earlier outputs.
        let c = p.add_group(&[4]);
        assert_eq!(p.propose(&c, &[4], 3), vec![5, 1, 2]);
    }

    #[test]
    fn the_global_tree_keeps_the_latest_outputs() {
        let mut p = Proposers::new(SpeculativeConfig {
            suffix_decoding_max_cached_requests: 2,
            suffix_decoding_max_spec_factor: 2.0,
            suffix_decoding_min_token_prob: 0.0,
            ..SpeculativeConfig::new(SpecMethod::Suffix)
        });
        for out in [[10, 11, 12], [20, 21, 22], [30, 31, 32]] {
            let s = p.add_group(&[0]);
            p.remove_member(&s, Some(&out));
        }
        assert_eq!(p.num_cached_outputs(), 2);
        let s = p.add_group(&[10]);
        assert!(p.propose(&s, &[10], 2).is_empty(), "evicted");
        let s = p.add_group(&[30]);
        assert_eq!(p.propose(&s, &[30], 2), vec![31, 32]);
    }
}
