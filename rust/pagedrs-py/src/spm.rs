//! The BPE merges of a SentencePiece vocabulary that lists none (a GGUF
//! whose `tokenizer.ggml.model` is `llama`, such as Gemma's), derived from
//! the vocabulary as transformers derives them for such a file
//! (`tokenization_utils_base.generate_merges` with each token's score its
//! negated position), as the JSON text `tokenizers` reads for a BPE model's
//! `merges`.

use std::collections::HashMap;
use std::fmt::Write;
use std::hash::{BuildHasherDefault, Hasher};

use pyo3::prelude::*;

/// Append `text` to `out` as a JSON string (quotes, backslashes and control
/// characters escaped; every other character as is, UTF-8).
fn push_json_str(out: &mut String, text: &str) {
    out.push('"');
    for c in text.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

/// The multiply-rotate hash of rustc (`FxHasher`): several times faster than
/// the default SipHash on short token strings, which need no protection
/// against chosen collisions here.
#[derive(Default)]
struct FxHasher(u64);

impl Hasher for FxHasher {
    fn write(&mut self, bytes: &[u8]) {
        let mut chunks = bytes.chunks_exact(8);
        for c in &mut chunks {
            self.add(u64::from_le_bytes(c.try_into().expect("8 bytes")));
        }
        for &b in chunks.remainder() {
            self.add(u64::from(b));
        }
    }

    fn write_u8(&mut self, b: u8) {
        self.add(u64::from(b));
    }

    fn finish(&self) -> u64 {
        self.0
    }
}

impl FxHasher {
    fn add(&mut self, word: u64) {
        self.0 = (self.0.rotate_left(5) ^ word).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
    }
}

/// The merges of `tokens` (the vocabulary by id) as `(left, right)` string
/// pairs, best first: for each distinct token in the order of its last id,
/// every split of it into two tokens of the vocabulary, the longer left
/// part (in characters) first. This is transformers' `generate_merges`
/// over `{token: last id}` with scores `{token: -last id}`: the merge
/// `(l, r)` ranks by the position of the token `l + r` in the file.
pub fn spm_merges(tokens: &[String]) -> Vec<(&str, &str)> {
    let mut last: HashMap<&str, usize, BuildHasherDefault<FxHasher>> =
        HashMap::with_capacity_and_hasher(tokens.len(), BuildHasherDefault::default());
    for (i, t) in tokens.iter().enumerate() {
        last.insert(t.as_str(), i);
    }
    let mut merges = Vec::new();
    for (i, t) in tokens.iter().enumerate() {
        if last.get(t.as_str()) != Some(&i) {
            continue; // a later id holds this name
        }
        let bounds: Vec<usize> = t.char_indices().map(|(b, _)| b).skip(1).collect();
        for &b in bounds.iter().rev() {
            let (l, r) = t.split_at(b);
            if last.contains_key(l) && last.contains_key(r) {
                merges.push((l, r));
            }
        }
    }
    merges
}

/// `spm_merges(tokens)` as JSON text: `[["left","right"], ...]`.
///
/// Args:
///     tokens: list[str], the vocabulary by id (`tokenizer.ggml.tokens` as
///         the tokenizer spells it).
///
/// Returns:
///     str: a JSON array of two-string arrays, best merge first.
#[pyfunction]
pub fn spm_merges_json(py: Python<'_>, tokens: Vec<String>) -> String {
    py.detach(|| {
        let merges = spm_merges(&tokens);
        let mut out = String::with_capacity(merges.len() * 16 + 2);
        out.push('[');
        for (k, (l, r)) in merges.iter().enumerate() {
            if k > 0 {
                out.push(',');
            }
            out.push('[');
            push_json_str(&mut out, l);
            out.push(',');
            push_json_str(&mut out, r);
            out.push(']');
        }
        out.push(']');
        out
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn owned(tokens: &[&str]) -> Vec<String> {
        tokens.iter().map(|t| t.to_string()).collect()
    }

    #[test]
    fn merges_follow_positions_then_longer_left_part() {
        let tokens = owned(&["a", "b", "ab", "abb", "bb", "é", "éb"]);
        let merges = spm_merges(&tokens);
        assert_eq!(
            merges,
            vec![("a", "b"), ("ab", "b"), ("a", "bb"), ("b", "b"), ("é", "b")]
        );
    }

    #[test]
    fn a_name_given_twice_ranks_at_its_last_id() {
        let tokens = owned(&["ab", "a", "b", "ab", "x"]);
        assert_eq!(spm_merges(&tokens), vec![("a", "b")]);
        let tokens = owned(&["ab", "a", "b", "abx", "x", "ab"]);
        assert_eq!(spm_merges(&tokens), vec![("ab", "x"), ("a", "b")]);
    }

    #[test]
    fn json_escapes_quotes_backslashes_and_controls() {
        let mut out = String::new();
        push_json_str(&mut out, "a\"b\\c\n\u{1}é▁");
        assert_eq!(out, "\"a\\\"b\\\\c\\n\\u0001é▁\"");
    }
}
