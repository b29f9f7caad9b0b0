//! A suffix tree of bounded depth (SuffixDecoding, Oliaro et al. 2024): every
//! substring of at most `max_depth` tokens of the sequences fed to it is a
//! path from the root, each node counting the occurrences of its substring.
//! Feeding a token costs `O(max_depth)`: the sequence's cursor holds the
//! nodes of its suffixes, each extended by the token. Sequences can be
//! removed again (the global tree evicts the oldest outputs).

use rustc_hash::FxHashMap;

/// Index of a node; the root is 0.
type NodeId = u32;

const NONE: NodeId = NodeId::MAX;

#[derive(Debug, Clone)]
struct Node {
    /// Occurrences of the node's substring (end positions).
    count: u32,
    /// The last token of its substring.
    token: u32,
    parent: NodeId,
    first_child: NodeId,
    next_sibling: NodeId,
}

/// The nodes of the suffixes of one fed sequence ending at its last token,
/// by length (`nodes[i]` is the suffix of `i + 1` tokens).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Cursor {
    nodes: Vec<NodeId>,
}

/// A draft with its score: the sum over its tokens of the estimated
/// probability that the draft is right up to that token (the expected
/// accepted length under the tree's frequencies).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Draft {
    /// Drafted tokens.
    pub tokens: Vec<u32>,
    /// Expected accepted tokens.
    pub score: f64,
    /// Tokens of the matched suffix it continues.
    pub match_len: usize,
}

/// Settings of one speculation from a tree.
#[derive(Debug, Clone, Copy)]
pub struct SpecLimits {
    /// Most tokens drafted.
    pub max_tokens: usize,
    /// A match of `m` tokens drafts at most `factor * m` tokens.
    pub max_spec_factor: f64,
    /// The draft stops where its probability falls below this.
    pub min_token_prob: f64,
}

/// Substrings of at most `max_depth` tokens with their counts.
#[derive(Debug, Clone)]
pub struct SuffixTree {
    max_depth: usize,
    nodes: Vec<Node>,
    edges: FxHashMap<(NodeId, u32), NodeId>,
    free: Vec<NodeId>,
}

impl SuffixTree {
    /// An empty tree of substrings of at most `max_depth` tokens.
    pub fn new(max_depth: usize) -> Self {
        let root = Node {
            count: 0,
            token: 0,
            parent: NONE,
            first_child: NONE,
            next_sibling: NONE,
        };
        Self {
            max_depth,
            nodes: vec![root],
            edges: FxHashMap::default(),
            free: Vec::new(),
        }
    }

    /// Longest substring stored.
    pub fn max_depth(&self) -> usize {
        self.max_depth
    }

    /// Nodes in use (the root included).
    pub fn num_nodes(&self) -> usize {
        self.nodes.len() - self.free.len()
    }

    fn child(&self, node: NodeId, token: u32) -> Option<NodeId> {
        self.edges.get(&(node, token)).copied()
    }

    fn child_or_new(&mut self, parent: NodeId, token: u32) -> NodeId {
        if let Some(c) = self.child(parent, token) {
            return c;
        }
        let node = Node {
            count: 0,
            token,
            parent,
            first_child: NONE,
            next_sibling: self.nodes[parent as usize].first_child,
        };
        let id = match self.free.pop() {
            Some(id) => {
                self.nodes[id as usize] = node;
                id
            }
            None => {
                self.nodes.push(node);
                (self.nodes.len() - 1) as NodeId
            }
        };
        self.nodes[parent as usize].first_child = id;
        self.edges.insert((parent, token), id);
        id
    }

    /// Append `token` to the sequence whose suffixes `cursor` holds: every
    /// suffix shorter than `max_depth` grows by it, and the one-token suffix
    /// joins; their counts go up.
    pub fn push(&mut self, cursor: &mut Cursor, token: u32) {
        let keep = cursor.nodes.len().min(self.max_depth - 1);
        let mut next = Vec::with_capacity(keep + 1);
        next.push(self.child_or_new(0, token));
        for i in 0..keep {
            let c = self.child_or_new(cursor.nodes[i], token);
            next.push(c);
        }
        for &n in &next {
            self.nodes[n as usize].count += 1;
        }
        cursor.nodes = next;
    }

    /// Feed a whole sequence from an empty cursor; returns the cursor.
    pub fn insert(&mut self, tokens: &[u32]) -> Cursor {
        let mut cursor = Cursor::default();
        for &t in tokens {
            self.push(&mut cursor, t);
        }
        cursor
    }

    /// Take back a sequence fed with [`SuffixTree::insert`]: its counts go
    /// down, and nodes no sequence occurs in any more are freed.
    pub fn remove(&mut self, tokens: &[u32]) {
        let mut cursor: Vec<NodeId> = Vec::new();
        let mut emptied = Vec::new();
        for &t in tokens {
            let keep = cursor.len().min(self.max_depth - 1);
            let mut next = Vec::with_capacity(keep + 1);
            next.push(self.child(0, t).expect("sequence was inserted"));
            for &n in &cursor[..keep] {
                next.push(self.child(n, t).expect("sequence was inserted"));
            }
            for &n in &next {
                let node = &mut self.nodes[n as usize];
                node.count -= 1;
                if node.count == 0 {
                    emptied.push(n);
                }
            }
            cursor = next;
        }
        // A node empties no later than its descendants: unlink deepest first.
        emptied.sort_by_key(|&n| std::cmp::Reverse(self.depth(n)));
        for n in emptied {
            self.unlink(n);
        }
    }

    fn depth(&self, mut n: NodeId) -> usize {
        let mut d = 0;
        while n != 0 {
            n = self.nodes[n as usize].parent;
            d += 1;
        }
        d
    }

    fn unlink(&mut self, n: NodeId) {
        let Node {
            token,
            parent,
            next_sibling,
            ..
        } = self.nodes[n as usize];
        debug_assert_eq!(self.nodes[n as usize].first_child, NONE, "children first");
        self.edges.remove(&(parent, token));
        let p = &mut self.nodes[parent as usize];
        if p.first_child == n {
            p.first_child = next_sibling;
        } else {
            let mut s = p.first_child;
            while self.nodes[s as usize].next_sibling != n {
                s = self.nodes[s as usize].next_sibling;
            }
            self.nodes[s as usize].next_sibling = next_sibling;
        }
        self.free.push(n);
    }

    /// The node of `pattern` (a path from the root), if stored.
    fn find(&self, pattern: &[u32]) -> Option<NodeId> {
        pattern.iter().try_fold(0, |n, &t| self.child(n, t))
    }

    /// The most frequent child of `n` (lowest token among equals).
    fn best_child(&self, n: NodeId) -> Option<NodeId> {
        let mut best: Option<NodeId> = None;
        let mut c = self.nodes[n as usize].first_child;
        while c != NONE {
            let node = &self.nodes[c as usize];
            best = match best {
                Some(b) => {
                    let bn = &self.nodes[b as usize];
                    if (node.count, std::cmp::Reverse(node.token))
                        > (bn.count, std::cmp::Reverse(bn.token))
                    {
                        Some(c)
                    } else {
                        Some(b)
                    }
                }
                None => Some(c),
            };
            c = node.next_sibling;
        }
        best
    }

    /// Draft from the node of a matched suffix of `match_len` tokens: follow
    /// the most frequent child while the draft's probability (the product of
    /// `count(child) / count(parent)`) stays at or above `min_token_prob`, at
    /// most `min(max_tokens, floor(factor * match_len), max_depth -
    /// match_len)` tokens.
    fn draft_from(&self, mut n: NodeId, match_len: usize, lim: &SpecLimits) -> Draft {
        let by_factor = (lim.max_spec_factor * match_len as f64).floor() as usize;
        let max = lim
            .max_tokens
            .min(by_factor)
            .min(self.max_depth - match_len);
        let mut d = Draft {
            match_len,
            ..Draft::default()
        };
        let mut prob = 1.0;
        while d.tokens.len() < max {
            let Some(c) = self.best_child(n) else { break };
            prob *= self.nodes[c as usize].count as f64 / self.nodes[n as usize].count as f64;
            if prob < lim.min_token_prob {
                break;
            }
            d.tokens.push(self.nodes[c as usize].token);
            d.score += prob;
            n = c;
        }
        d
    }

    /// The best draft continuing a suffix of `context` (highest score; the
    /// longer match among equal scores), looking each suffix up from the root.
    pub fn speculate(&self, context: &[u32], lim: &SpecLimits) -> Draft {
        let mut best = Draft::default();
        let longest = context.len().min(self.max_depth - 1);
        for m in 1..=longest {
            let Some(n) = self.find(&context[context.len() - m..]) else {
                break; // no longer suffix is stored either
            };
            best = better(best, self.draft_from(n, m, lim));
        }
        best
    }

    /// As [`SuffixTree::speculate`] for the sequence whose suffixes `cursor`
    /// holds (fed up to its last token), with no lookup from the root.
    pub fn speculate_at(&self, cursor: &Cursor, lim: &SpecLimits) -> Draft {
        let mut best = Draft::default();
        let longest = cursor.nodes.len().min(self.max_depth - 1);
        for m in 1..=longest {
            best = better(best, self.draft_from(cursor.nodes[m - 1], m, lim));
        }
        best
    }

    /// The cursor of a sequence whose tokens but the last are in the tree
    /// (fed through another cursor), after feeding its last token: a fork
    /// whose newest token differs from its parent's.
    pub fn cursor_for(&mut self, tokens: &[u32]) -> Cursor {
        let Some((&last, head)) = tokens.split_last() else {
            return Cursor::default();
        };
        let longest = head.len().min(self.max_depth - 1);
        let nodes = (1..=longest)
            .map_while(|m| self.find(&head[head.len() - m..]))
            .collect();
        let mut cursor = Cursor { nodes };
        self.push(&mut cursor, last);
        cursor
    }
}

/// The draft with the higher score; the second (longer match) among equals.
pub fn better(a: Draft, b: Draft) -> Draft {
    if b.tokens.is_empty() {
        return a;
    }
    if a.tokens.is_empty() || b.score >= a.score {
        b
    } else {
        a
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LIM: SpecLimits = SpecLimits {
        max_tokens: 8,
        max_spec_factor: 4.0,
        min_token_prob: 0.0,
    };

    /// Occurrences of `s` in `t` (end positions), the count a node must hold.
    fn occurrences(t: &[u32], s: &[u32]) -> u32 {
        t.windows(s.len()).filter(|w| *w == s).count() as u32
    }

    #[test]
    fn counts_are_substring_occurrences() {
        let t = [1, 2, 1, 2, 3, 1, 2, 1];
        let mut tree = SuffixTree::new(3);
        let cursor = tree.insert(&t);
        for len in 1..=3 {
            for w in t.windows(len) {
                let n = tree.find(w).unwrap();
                assert_eq!(tree.nodes[n as usize].count, occurrences(&t, w), "{w:?}");
            }
        }
        assert!(tree.find(&[1, 2, 1, 2]).is_none(), "deeper than max_depth");
        assert_eq!(cursor.nodes.len(), 3);
        assert_eq!(Some(cursor.nodes[2]), tree.find(&[1, 2, 1]));
    }

    #[test]
    fn drafts_follow_the_most_frequent_continuation() {
        // "1 2" is followed by 3 twice and by 4 once.
        let t = [1, 2, 3, 9, 1, 2, 3, 9, 1, 2, 4, 9, 1, 2];
        let mut tree = SuffixTree::new(6);
        let cursor = tree.insert(&t);
        let d = tree.speculate_at(&cursor, &LIM);
        assert_eq!(d.tokens[0], 3, "{d:?}");
        assert_eq!(
            tree.speculate(&t, &LIM),
            d,
            "cursor == lookup from the root"
        );
        // A probability floor cuts the draft where the frequencies thin out.
        let strict = SpecLimits {
            min_token_prob: 0.6,
            ..LIM
        };
        assert!(tree.speculate_at(&cursor, &strict).tokens.is_empty());
        // The spec factor bounds the draft by the match length.
        let short = SpecLimits {
            max_spec_factor: 0.5,
            ..LIM
        };
        let d = tree.speculate_at(&cursor, &short);
        assert_eq!(d.tokens.len(), d.match_len / 2);
        assert!(!d.tokens.is_empty());
    }

    #[test]
    fn a_fork_with_another_last_token_gets_its_own_cursor() {
        let mut tree = SuffixTree::new(4);
        let parent = [1, 2, 3, 4, 5];
        tree.insert(&parent);
        let child = tree.cursor_for(&[1, 2, 3, 4, 7]);
        let mut fresh = SuffixTree::new(4);
        let want = fresh.insert(&[1, 2, 3, 4, 7]);
        let path = |t: &SuffixTree, c: &Cursor| -> Vec<u32> {
            c.nodes.iter().map(|&n| t.nodes[n as usize].token).collect()
        };
        assert_eq!(path(&tree, &child), path(&fresh, &want));
        assert_eq!(child.nodes.len(), 4);
        assert_eq!(
            tree.nodes[child.nodes[3] as usize].count, 1,
            "4-gram 2 3 4 7"
        );
    }

    #[test]
    fn removal_restores_the_tree() {
        let mut tree = SuffixTree::new(4);
        tree.insert(&[5, 6, 7, 5, 6]);
        let before = tree.num_nodes();
        let probe = [5, 6];
        let d0 = tree.speculate(&probe, &LIM);
        tree.insert(&[5, 6, 8, 8, 8, 5, 6, 8]);
        assert_ne!(tree.speculate(&probe, &LIM), d0);
        tree.remove(&[5, 6, 8, 8, 8, 5, 6, 8]);
        assert_eq!(tree.num_nodes(), before);
        assert_eq!(tree.speculate(&probe, &LIM), d0);
        tree.remove(&[5, 6, 7, 5, 6]);
        assert_eq!(tree.num_nodes(), 1, "only the root");
        assert!(tree.edges.is_empty());
    }
}
