//! The paged KV cache as the kernels address it: one layer's shape
//! (`[num_blocks, num_kv_heads, block_size, entry_size]` elements of one
//! `KvElem` type, row-major; `entry_size` is `head_dim` plus an int8 entry's
//! scale), the entries of a (block, KV head), one work item's view of its
//! sequence's blocks, and the store of new tokens into their slots.

use super::format::KvElem;
use super::math::prefetch;

/// Shape of one layer's paged KV cache (`head_dim` values per entry).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CacheShape {
    pub num_blocks: usize,
    pub num_kv_heads: usize,
    pub block_size: usize,
    pub head_dim: usize,
}

impl CacheShape {
    /// Elements of one block (all KV heads), entries of `entry` elements.
    pub(crate) fn block_stride_of(&self, entry: usize) -> usize {
        self.num_kv_heads * self.block_size * entry
    }

    /// Elements of one (block, KV head), entries of `entry` elements.
    pub(crate) fn head_stride_of(&self, entry: usize) -> usize {
        self.block_size * entry
    }

    /// `block_stride_of(head_dim)`: float32 entries.
    #[cfg(test)]
    pub(crate) fn block_stride(&self) -> usize {
        self.block_stride_of(self.head_dim)
    }

    /// `head_stride_of(head_dim)`: float32 entries.
    #[cfg(test)]
    pub(crate) fn head_stride(&self) -> usize {
        self.head_stride_of(self.head_dim)
    }

    /// Elements of one layer's cache of `E` entries.
    pub fn len_of<E: KvElem>(&self) -> usize {
        self.num_blocks * self.block_stride_of(E::entry_size(self.head_dim))
    }
}

/// One layer's paged caches of `E` entries.
pub(crate) struct Caches<'a, E> {
    pub key: &'a [E],
    pub value: &'a [E],
    pub shape: CacheShape,
    /// Elements per entry (`E::entry_size(head_dim)`).
    pub entry: usize,
}

impl<E> Clone for Caches<'_, E> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<E> Copy for Caches<'_, E> {}

impl<'a, E: KvElem> Caches<'a, E> {
    pub fn new(key: &'a [E], value: &'a [E], shape: CacheShape) -> Self {
        Caches {
            key,
            value,
            shape,
            entry: E::entry_size(shape.head_dim),
        }
    }

    /// The first `rows` entries (`[rows, entry]`) of `kv_head` in physical
    /// block `block` of `cache` (`self.key` or `self.value`).
    #[inline(always)]
    pub fn rows(&self, cache: &'a [E], block: i32, kv_head: usize, rows: usize) -> &'a [E] {
        let e = self.entry;
        let base =
            block as usize * self.shape.block_stride_of(e) + kv_head * self.shape.head_stride_of(e);
        &cache[base..base + rows * e]
    }
}

/// Blocks of a sequence whose entries are requested ahead of use.
const PREFETCH_BLOCKS: usize = 4;

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

    /// Where logical block `b` holds visible tokens of this query: the rows
    /// it skips, the visible rows after them and the score index of the
    /// first; None when it holds none.
    #[inline(always)]
    pub fn visible(&self, b: usize, block_size: usize) -> Option<(usize, usize, usize)> {
        if b < self.start / block_size || b * block_size >= self.seq_len {
            return None;
        }
        let skip = self.skip(b, block_size);
        let n = self.block_len(b, block_size) - skip;
        Some((skip, n, b * block_size + skip - self.start))
    }

    /// Logical block `b`'s entries of `cache` (`[tokens, entry]`), after
    /// asking the CPU to start loading the entries `PREFETCH_BLOCKS` blocks
    /// ahead (all of them up to there at the first visible block): each
    /// sits at an unrelated address, beyond the hardware prefetcher's reach,
    /// and one block's loads alone leave most of the memory bandwidth idle.
    #[inline(always)]
    pub fn block<'a, E: KvElem>(
        &self,
        caches: &Caches<'a, E>,
        cache: &'a [E],
        b: usize,
    ) -> &'a [E] {
        let bs = caches.shape.block_size;
        let from = if b == self.start / bs {
            b + 1
        } else {
            b + PREFETCH_BLOCKS
        };
        for next in from..=b + PREFETCH_BLOCKS {
            if next * bs >= self.seq_len {
                break;
            }
            prefetch(caches.rows(
                cache,
                self.table[next],
                self.kv_head,
                self.block_len(next, bs),
            ));
        }
        caches.rows(cache, self.table[b], self.kv_head, self.block_len(b, bs))
    }
}

/// An element type of the new keys and values a step writes.
pub trait KvInput: Copy + Sync {
    /// `src` as floats into `out` (same length; exact).
    fn widen(src: &[Self], out: &mut [f32]);
}

impl KvInput for f32 {
    #[inline(always)]
    fn widen(src: &[f32], out: &mut [f32]) {
        out.copy_from_slice(src);
    }
}

impl KvInput for super::format::Bf16 {
    #[inline(always)]
    fn widen(src: &[Self], out: &mut [f32]) {
        for (o, x) in out.iter_mut().zip(src) {
            *o = x.value();
        }
    }
}

/// Store new keys/values (`[T, num_kv_heads, head_dim]` of `I`) into their
/// slots (`block * block_size + offset`) of caches of `E` entries, in `E`'s
/// format; negative slots are skipped (padding). On a CPU with AVX-512 the
/// same code runs compiled for it (int8 quantization then vectorizes); every
/// operation is exactly rounded, so the entries have the same bits.
pub fn write_kv<I: KvInput, E: KvElem>(
    key: &[I],
    value: &[I],
    key_cache: &mut [E],
    value_cache: &mut [E],
    shape: CacheShape,
    slot_mapping: &[i64],
) {
    #[cfg(target_arch = "x86_64")]
    if crate::cpu_features::avx512bw() {
        // SAFETY: the features are present (checked above).
        return unsafe { write_kv_avx512(key, value, key_cache, value_cache, shape, slot_mapping) };
    }
    write_kv_body(key, value, key_cache, value_cache, shape, slot_mapping)
}

/// `write_kv_body` compiled for AVX-512.
///
/// # Safety
/// The CPU must support AVX-512F, AVX-512BW, AVX2 and F16C.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx2,f16c")]
unsafe fn write_kv_avx512<I: KvInput, E: KvElem>(
    key: &[I],
    value: &[I],
    key_cache: &mut [E],
    value_cache: &mut [E],
    shape: CacheShape,
    slot_mapping: &[i64],
) {
    write_kv_body(key, value, key_cache, value_cache, shape, slot_mapping)
}

#[inline(always)]
fn write_kv_body<I: KvInput, E: KvElem>(
    key: &[I],
    value: &[I],
    key_cache: &mut [E],
    value_cache: &mut [E],
    shape: CacheShape,
    slot_mapping: &[i64],
) {
    let d = shape.head_dim;
    let e = E::entry_size(d);
    let token = shape.num_kv_heads * d;
    let mut row = vec![0.0f32; d];
    for (t, &slot) in slot_mapping.iter().enumerate() {
        if slot < 0 {
            continue;
        }
        let slot = slot as usize;
        let (block, offset) = (slot / shape.block_size, slot % shape.block_size);
        for h in 0..shape.num_kv_heads {
            let dst = block * shape.block_stride_of(e) + h * shape.head_stride_of(e) + offset * e;
            let src = t * token + h * d;
            I::widen(&key[src..src + d], &mut row);
            E::store(&row, &mut key_cache[dst..dst + e]);
            I::widen(&value[src..src + d], &mut row);
            E::store(&row, &mut value_cache[dst..dst + e]);
        }
    }
}
