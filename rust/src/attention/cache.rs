//! The paged KV cache as the kernels address it: one layer's shape
//! (`[num_blocks, num_kv_heads, block_size, head_dim]`, row-major), the rows of
//! a (block, KV head), one work item's view of its sequence's blocks, and the
//! store of new tokens into their slots.

use super::math::prefetch;

/// Shape of one layer's paged KV cache.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CacheShape {
    pub num_blocks: usize,
    pub num_kv_heads: usize,
    pub block_size: usize,
    pub head_dim: usize,
}

impl CacheShape {
    pub(crate) fn block_stride(&self) -> usize {
        self.num_kv_heads * self.block_size * self.head_dim
    }

    pub(crate) fn head_stride(&self) -> usize {
        self.block_size * self.head_dim
    }
}

/// One layer's paged caches.
#[derive(Clone, Copy)]
pub(crate) struct Caches<'a> {
    pub key: &'a [f32],
    pub value: &'a [f32],
    pub shape: CacheShape,
}

impl<'a> Caches<'a> {
    /// The first `rows` token rows (`[rows, head_dim]`) of `kv_head` in physical
    /// block `block` of `cache` (`self.key` or `self.value`).
    #[inline(always)]
    pub fn rows(&self, cache: &'a [f32], block: i32, kv_head: usize, rows: usize) -> &'a [f32] {
        let base = block as usize * self.shape.block_stride() + kv_head * self.shape.head_stride();
        &cache[base..base + rows * self.shape.head_dim]
    }
}

/// One work item: the query heads of one sequence that share KV head
/// `kv_head` (`q` is `[group, head_dim]`), with the sequence's block table
/// row, context length (tokens), the softmax scale, and the logit options.
#[derive(Clone, Copy)]
pub(crate) struct HeadQuery<'a> {
    pub q: &'a [f32],
    pub table: &'a [i32],
    pub seq_len: usize,
    pub kv_head: usize,
    pub scale: f32,
    /// First visible token: `seq_len - window` under a sliding window, else 0.
    /// Tokens before it are never read.
    pub start: usize,
    /// Logit soft cap `c` (`s = c * tanh(s / c)` after scaling); 0 when off.
    pub softcap: f32,
    /// Per query head sink logits (`[group]`), or empty when off.
    pub sinks: &'a [f32],
}

impl HeadQuery<'_> {
    /// Visible tokens: `seq_len - start`.
    #[inline(always)]
    pub fn span(&self) -> usize {
        self.seq_len - self.start
    }

    /// Rows of logical block `b` before the first visible token.
    #[inline(always)]
    pub fn skip(&self, b: usize, block_size: usize) -> usize {
        self.start.saturating_sub(b * block_size)
    }

    /// Tokens held in logical block `b`.
    #[inline(always)]
    pub fn block_len(&self, b: usize, block_size: usize) -> usize {
        block_size.min(self.seq_len - b * block_size)
    }

    /// Logical block `b`'s rows of `cache` (`[tokens, head_dim]`), after asking
    /// the CPU to start loading block `b + 1`'s (it sits at an unrelated
    /// address, beyond the hardware prefetcher's reach).
    #[inline(always)]
    pub fn block<'a>(&self, caches: &Caches<'a>, cache: &'a [f32], b: usize) -> &'a [f32] {
        let bs = caches.shape.block_size;
        if (b + 1) * bs < self.seq_len {
            let next = self.table[b + 1];
            prefetch(caches.rows(cache, next, self.kv_head, self.block_len(b + 1, bs)));
        }
        caches.rows(cache, self.table[b], self.kv_head, self.block_len(b, bs))
    }
}

/// Store new keys/values (`[T, num_kv_heads, head_dim]`) into their slots
/// (`block * block_size + offset`); negative slots are skipped (padding).
pub fn write_kv(
    key: &[f32],
    value: &[f32],
    key_cache: &mut [f32],
    value_cache: &mut [f32],
    shape: CacheShape,
    slot_mapping: &[i64],
) {
    let d = shape.head_dim;
    let token = shape.num_kv_heads * d;
    for (t, &slot) in slot_mapping.iter().enumerate() {
        if slot < 0 {
            continue;
        }
        let slot = slot as usize;
        let (block, offset) = (slot / shape.block_size, slot % shape.block_size);
        for h in 0..shape.num_kv_heads {
            let dst = block * shape.block_stride() + h * shape.head_stride() + offset * d;
            let src = t * token + h * d;
            key_cache[dst..dst + d].copy_from_slice(&key[src..src + d]);
            value_cache[dst..dst + d].copy_from_slice(&value[src..src + d]);
        }
    }
}
