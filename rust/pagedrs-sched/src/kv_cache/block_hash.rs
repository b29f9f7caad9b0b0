//! Block hashes for prefix caching (ARCHITECTURE.md):
//! `hash(block i) = SHA256(hash(block i-1) || token ids of block i || extra keys)`.
//!
//! The chain makes a block's hash name its whole prefix, so equal prefixes map
//! to equal hashes. Extra keys (a per-request cache salt, the LoRA adapter)
//! enter the first block, and through the chain every later one: different
//! salts or adapters never share.

use sha2::{Digest, Sha256};

/// A SHA-256 block hash.
pub type BlockHash = [u8; 32];

/// Hash of one full block given its parent's hash (None for the first block).
pub fn hash_block(parent: Option<&BlockHash>, tokens: &[u32], extra: &[u8]) -> BlockHash {
    let mut h = Sha256::new();
    match parent {
        Some(p) => h.update(p),
        None => {
            h.update([0u8; 32]);
            h.update((extra.len() as u64).to_le_bytes());
            h.update(extra);
        }
    }
    for t in tokens {
        h.update(t.to_le_bytes());
    }
    h.finalize().into()
}

/// The extra keys of a request's block hashes: its cache salt (UTF-8), and
/// for a LoRA adapter (`lora_id` > 0) the byte 0xFF (never in UTF-8, so no
/// salt reads as an adapter) and the id as 8 little-endian bytes. Without an
/// adapter the salt alone, so base-model hashes are those of a request
/// without LoRA.
pub fn hash_extra_keys(cache_salt: &[u8], lora_id: u64) -> Vec<u8> {
    let mut extra = cache_salt.to_vec();
    if lora_id != 0 {
        extra.push(0xFF);
        extra.extend_from_slice(&lora_id.to_le_bytes());
    }
    extra
}

/// Extend `hashes` with the hashes of every full block of `tokens` not yet hashed.
pub fn extend_block_hashes(
    hashes: &mut Vec<BlockHash>,
    tokens: &[u32],
    block_size: usize,
    extra: &[u8],
) {
    let start = hashes.len();
    for block in tokens.chunks_exact(block_size).skip(start) {
        let h = hash_block(hashes.last(), block, extra);
        hashes.push(h);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chained_hashes_name_whole_prefixes() {
        let mut a = vec![];
        extend_block_hashes(&mut a, &[1, 2, 3, 4, 5, 6, 7], 2, b"");
        assert_eq!(a.len(), 3);
        let mut b = vec![];
        extend_block_hashes(&mut b, &[9, 2, 3, 4], 2, b"");
        assert_ne!(a[0], b[0]);
        assert_ne!(a[1], b[1], "same tokens, different prefix");
        let mut c = vec![];
        extend_block_hashes(&mut c, &[1, 2, 3, 4], 2, b"");
        assert_eq!(&a[..2], &c[..]);
        let mut salted = vec![];
        extend_block_hashes(&mut salted, &[1, 2, 3, 4], 2, b"tenant-a");
        assert_ne!(salted[1], c[1]);
    }

    #[test]
    fn adapters_never_share_and_base_keeps_its_hashes() {
        assert_eq!(hash_extra_keys(b"salt", 0), b"salt".to_vec());
        let hashes = |extra: &[u8]| {
            let mut h = vec![];
            extend_block_hashes(&mut h, &[1, 2, 3, 4], 2, extra);
            h
        };
        let base = hashes(&hash_extra_keys(b"", 0));
        let one = hashes(&hash_extra_keys(b"", 1));
        let two = hashes(&hash_extra_keys(b"", 2));
        assert_ne!(base[1], one[1]);
        assert_ne!(one[1], two[1]);
        assert_eq!(one, hashes(&hash_extra_keys(b"", 1)));
        // A salt spelling an adapter's bytes is not valid UTF-8: none can.
        assert!(std::str::from_utf8(&hash_extra_keys(b"", 1)).is_err());
    }
}
