//! Prompt lookup (n-gram) drafting: the tokens that followed the latest
//! earlier occurrence of the sequence's last n tokens, the longest n of
//! `prompt_lookup_min..=prompt_lookup_max` that occurs (vLLM's `ngram`,
//! transformers' prompt lookup decoding).
//!
//! An [`NgramIndex`] maps each n-gram to the position of the token that
//! followed its latest occurrence, so a proposal costs one hash lookup per n
//! whatever the sequence's length; it grows by the tokens fed to it.

use std::hash::{Hash, Hasher};

use rustc_hash::{FxHashMap, FxHasher};

/// For each n in `min_n..=max_n`: n-gram hash -> position of the token that
/// followed its latest occurrence, over the positions fed so far.
#[derive(Debug, Clone)]
pub struct NgramIndex {
    min_n: usize,
    maps: Vec<FxHashMap<u64, u32>>,
    /// Next follower position to index.
    fed: usize,
}

fn ngram_hash(tokens: &[u32]) -> u64 {
    let mut h = FxHasher::default();
    tokens.hash(&mut h);
    h.finish()
}

impl NgramIndex {
    /// An empty index of n-grams of `min_n..=max_n` tokens whose followers
    /// are at positions `from` or later.
    pub fn new(min_n: usize, max_n: usize, from: usize) -> Self {
        debug_assert!(1 <= min_n && min_n <= max_n);
        Self {
            min_n,
            maps: vec![FxHashMap::default(); max_n - min_n + 1],
            fed: from,
        }
    }

    /// Index every n-gram followed by a token of `tokens` not indexed yet
    /// (`tokens` extends the sequence fed before).
    pub fn feed(&mut self, tokens: &[u32]) {
        for p in self.fed..tokens.len() {
            for (i, map) in self.maps.iter_mut().enumerate() {
                let n = self.min_n + i;
                if p >= n {
                    map.insert(ngram_hash(&tokens[p - n..p]), p as u32);
                }
            }
        }
        self.fed = self.fed.max(tokens.len());
    }

    /// Where the token after the latest indexed occurrence of the last `n`
    /// tokens of `tokens` is, if that n-gram is indexed (checked token by
    /// token: a hash collision is no match).
    fn follower(&self, tokens: &[u32], n: usize) -> Option<usize> {
        let map = self.maps.get(n.checked_sub(self.min_n)?)?;
        let len = tokens.len();
        if len < n {
            return None;
        }
        let tail = &tokens[len - n..];
        let f = *map.get(&ngram_hash(tail))? as usize;
        (f < len && f >= n && &tokens[f - n..f] == tail).then_some(f)
    }
}

/// Up to `k` tokens that followed the latest earlier occurrence of the last
/// n tokens of `tokens`, for the longest n in `min_n..=max_n` found in one of
/// `indexes` (the first index that has it wins: pass the most recent
/// positions first). Empty when nothing matches.
pub fn propose(
    tokens: &[u32],
    indexes: &[&NgramIndex],
    min_n: usize,
    max_n: usize,
    k: usize,
) -> Vec<u32> {
    if k == 0 {
        return Vec::new();
    }
    for n in (min_n..=max_n).rev() {
        if let Some(f) = indexes.iter().find_map(|ix| ix.follower(tokens, n)) {
            return tokens[f..(f + k).min(tokens.len())].to_vec();
        }
    }
    Vec::new()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The reference: scan every earlier position, latest first.
    fn scan(tokens: &[u32], min_n: usize, max_n: usize, k: usize) -> Vec<u32> {
        let len = tokens.len();
        for n in (min_n..=max_n).rev() {
            if len <= n {
                continue;
            }
            let tail = &tokens[len - n..];
            for start in (0..len - n).rev() {
                if &tokens[start..start + n] == tail {
                    let f = start + n;
                    return tokens[f..(f + k).min(len)].to_vec();
                }
            }
        }
        Vec::new()
    }

    #[test]
    fn drafts_what_followed_the_latest_longest_match() {
        let t = [1, 2, 3, 4, 9, 1, 2, 3, 5, 6, 7, 1, 2, 3];
        let mut ix = NgramIndex::new(1, 3, 0);
        ix.feed(&t);
        // Latest earlier "1 2 3" is at 5..8, followed by 5 6 7 1 2 3.
        assert_eq!(propose(&t, &[&ix], 1, 3, 4), vec![5, 6, 7, 1]);
        assert_eq!(propose(&t, &[&ix], 1, 3, 10), vec![5, 6, 7, 1, 2, 3]);
        assert_eq!(propose(&t, &[&ix], 1, 3, 0), Vec::<u32>::new());
        // Only 4-grams: "7 1 2 3" never occurred before.
        let mut ix4 = NgramIndex::new(4, 4, 0);
        ix4.feed(&t);
        assert!(propose(&t, &[&ix4], 4, 4, 3).is_empty());
    }

    #[test]
    fn incremental_feeding_equals_the_scan() {
        let mut state = 12345u64;
        let mut tokens = Vec::new();
        let mut ix = NgramIndex::new(2, 4, 0);
        for _ in 0..600 {
            state = state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            tokens.push(((state >> 33) % 5) as u32);
            ix.feed(&tokens);
            assert_eq!(propose(&tokens, &[&ix], 2, 4, 3), scan(&tokens, 2, 4, 3));
        }
    }

    #[test]
    fn a_shared_prompt_index_and_an_own_index_together() {
        // The prompt index is frozen at the prompt; the sequence's own index
        // covers followers from the prompt's end on.
        let prompt = [7, 8, 9, 1, 7, 8];
        let mut shared = NgramIndex::new(1, 2, 0);
        shared.feed(&prompt);
        let mut tokens = prompt.to_vec();
        let mut own = NgramIndex::new(1, 2, prompt.len());
        own.feed(&tokens);
        // Tail "7 8": followed by 9 in the prompt.
        assert_eq!(propose(&tokens, &[&own, &shared], 1, 2, 2), vec![9, 1]);
        tokens.extend([4, 7, 8]);
        own.feed(&tokens);
        // Now the latest "7 8" (positions 4..6) was followed by 4.
        assert_eq!(propose(&tokens, &[&own, &shared], 1, 2, 2), vec![4, 7]);
    }
}
