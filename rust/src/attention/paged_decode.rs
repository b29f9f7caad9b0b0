//! Decode attention over a paged KV cache, on `f32` slices.
//!
//! Layouts (row-major, as the Python side allocates them):
//! * `key_cache`, `value_cache`: `[num_blocks, num_kv_heads, block_size, head_dim]`.
//! * `query`, `out`: `[num_seqs, num_heads, head_dim]`.
//! * `block_tables`: `[num_seqs, table_width]`, physical block of each logical block.
//! * `seq_lens`: `[num_seqs]`, context tokens of each sequence (the query's own
//!   token included, already written to the cache).
//!
//! Query head `h` reads KV head `h / (num_heads / num_kv_heads)` (grouped-query
//! attention, as HF's `repeat_kv`).

use rayon::prelude::*;

#[cfg(target_arch = "x86_64")]
use super::avx512;
use super::math::{axpy, dot, prefetch, softmax};
use super::omp;

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
/// row, context length (tokens) and the softmax scale.
#[derive(Clone, Copy)]
pub(crate) struct HeadQuery<'a> {
    pub q: &'a [f32],
    pub table: &'a [i32],
    pub seq_len: usize,
    pub kv_head: usize,
    pub scale: f32,
}

impl HeadQuery<'_> {
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

/// Attention of one `HeadQuery` over its cached tokens into `out`
/// (`[group, head_dim]`) in three passes: scores, softmax, weighted values;
/// `scores` is scratch space. Plain loops that LLVM vectorizes.
#[inline(always)]
fn attend_head_body(query: HeadQuery, caches: Caches, out: &mut [f32], scores: &mut Vec<f32>) {
    let d = caches.shape.head_dim;
    let bs = caches.shape.block_size;
    let seq_len = query.seq_len;
    out.fill(0.0);
    if seq_len == 0 {
        return;
    }
    scores.clear();
    scores.resize(out.len() / d * seq_len, 0.0);
    let num_blocks = seq_len.div_ceil(bs);
    // Pass 1: scores[g * seq_len + t] = scale * q_g . k_t
    for b in 0..num_blocks {
        let keys = query.block(&caches, caches.key, b);
        for (j, k) in keys.chunks_exact(d).enumerate() {
            for (g, qg) in query.q.chunks_exact(d).enumerate() {
                scores[g * seq_len + b * bs + j] = query.scale * dot(qg, k);
            }
        }
    }
    // Pass 2: softmax per query head.
    for row in scores.chunks_exact_mut(seq_len) {
        softmax(row);
    }
    // Pass 3: out_g = sum_t p_gt * v_t
    for b in 0..num_blocks {
        let values = query.block(&caches, caches.value, b);
        for (j, v) in values.chunks_exact(d).enumerate() {
            for (g, og) in out.chunks_exact_mut(d).enumerate() {
                axpy(og, scores[g * seq_len + b * bs + j], v);
            }
        }
    }
}

/// A compiled variant of the per-head kernel.
pub(crate) type AttendFn = fn(HeadQuery, Caches, &mut [f32], &mut Vec<f32>);

fn attend_head_portable(query: HeadQuery, caches: Caches, out: &mut [f32], scores: &mut Vec<f32>) {
    attend_head_body(query, caches, out, scores)
}

/// The same body compiled for AVX2 + FMA (8-wide vectors).
///
/// # Safety
/// The CPU must support AVX2 and FMA (checked by `variants`).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn attend_head_avx2(
    query: HeadQuery,
    caches: Caches,
    out: &mut [f32],
    scores: &mut Vec<f32>,
) {
    attend_head_body(query, caches, out, scores)
}

#[cfg(target_arch = "x86_64")]
fn attend_head_avx2_checked(
    query: HeadQuery,
    caches: Caches,
    out: &mut [f32],
    scores: &mut Vec<f32>,
) {
    // SAFETY: only listed by `variants` after detecting AVX2 and FMA.
    unsafe { attend_head_avx2(query, caches, out, scores) }
}

/// The kernel variants this CPU runs for `head_dim`, fastest first, by name.
pub(crate) fn variants(head_dim: usize) -> Vec<(&'static str, AttendFn)> {
    let mut found: Vec<(&'static str, AttendFn)> = Vec::new();
    #[cfg(target_arch = "x86_64")]
    {
        if let Some(f) = avx512::for_head_dim(head_dim) {
            found.push(("avx512", f));
        }
        if is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") {
            found.push(("avx2", attend_head_avx2_checked));
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = head_dim;
    found.push(("portable", attend_head_portable));
    found
}

/// A decode attention call, split into one work item per (sequence, KV
/// head): `[group, head_dim]` of the query and of the output. Run it with
/// `run_on_team` (torch's OpenMP threads) or `run_on_rayon`.
#[derive(Clone, Copy)]
pub struct DecodeJob<'a> {
    query: &'a [f32],
    caches: Caches<'a>,
    block_tables: &'a [i32],
    table_width: usize,
    seq_lens: &'a [i32],
    scale: f32,
    attend: AttendFn,
    /// Floats per work item (`group * head_dim`).
    item: usize,
}

impl DecodeJob<'_> {
    fn num_items(&self) -> usize {
        self.seq_lens.len() * self.caches.shape.num_kv_heads
    }

    /// Item `i` into `out` (its `[group, head_dim]` slice of the output).
    fn run(&self, i: usize, out: &mut [f32], scores: &mut Vec<f32>) {
        let hkv = self.caches.shape.num_kv_heads;
        let s = i / hkv;
        let query = HeadQuery {
            q: &self.query[i * self.item..(i + 1) * self.item],
            table: &self.block_tables[s * self.table_width..(s + 1) * self.table_width],
            seq_len: self.seq_lens[s] as usize,
            kv_head: i % hkv,
            scale: self.scale,
        };
        (self.attend)(query, self.caches, out, scores);
    }
}

/// The output pointer shared by the OpenMP team; each item writes only its
/// own disjoint slice.
struct SharedOut(*mut f32);

// SAFETY: work items write disjoint ranges of the output (see `run_on_team`).
unsafe impl Sync for SharedOut {}

thread_local! {
    /// Score scratch of each OpenMP team thread.
    static SCORES: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
}

impl<'a> DecodeJob<'a> {
    /// Layouts as in the module docs; `scale` is the softmax scale.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        query: &'a [f32],
        key_cache: &'a [f32],
        value_cache: &'a [f32],
        shape: CacheShape,
        block_tables: &'a [i32],
        table_width: usize,
        seq_lens: &'a [i32],
        scale: f32,
    ) -> Self {
        let item = if seq_lens.is_empty() {
            0
        } else {
            query.len() / seq_lens.len() / shape.num_kv_heads
        };
        DecodeJob {
            query,
            caches: Caches {
                key: key_cache,
                value: value_cache,
                shape,
            },
            block_tables,
            table_width,
            seq_lens,
            scale,
            attend: variants(shape.head_dim)[0].1,
            item,
        }
    }

    /// Every item on rayon's current pool.
    pub fn run_on_rayon(&self, out: &mut [f32]) {
        if self.num_items() == 0 {
            return;
        }
        out.par_chunks_mut(self.item)
            .enumerate()
            .for_each_init(Vec::new, |scores, (i, o)| self.run(i, o, scores));
    }

    /// Every item on `num_threads` threads of the process's OpenMP team
    /// (`omp::parallel_for`); false, having run nothing, without one.
    pub fn run_on_team(&self, num_threads: usize, out: &mut [f32]) -> bool {
        assert_eq!(out.len(), self.num_items() * self.item, "output size");
        if self.num_items() == 0 {
            return true;
        }
        let base = SharedOut(out.as_mut_ptr());
        let base = &base;
        omp::parallel_for(num_threads, self.num_items(), &|i| {
            // SAFETY: item `i` < num_items owns `out[i * item..(i + 1) * item]`,
            // in bounds by the assert above and disjoint from every other item's,
            // and `out` is borrowed mutably for the whole call.
            let o = unsafe { std::slice::from_raw_parts_mut(base.0.add(i * self.item), self.item) };
            SCORES.with_borrow_mut(|scores| self.run(i, o, scores));
        })
    }
}

/// One query token per sequence attending to its whole paged context, in
/// parallel over (sequence, KV head) items on rayon's current pool.
///
/// Panics if a block id or length points outside the given slices (the caller
/// validates shapes; the scheduler guarantees valid tables).
#[allow(clippy::too_many_arguments)]
pub fn paged_decode_attention(
    query: &[f32],
    key_cache: &[f32],
    value_cache: &[f32],
    shape: CacheShape,
    block_tables: &[i32],
    table_width: usize,
    seq_lens: &[i32],
    scale: f32,
    out: &mut [f32],
) {
    DecodeJob::new(
        query,
        key_cache,
        value_cache,
        shape,
        block_tables,
        table_width,
        seq_lens,
        scale,
    )
    .run_on_rayon(out);
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

#[cfg(test)]
mod tests {
    use super::*;

    /// Dense reference: softmax(q K^T * scale) V over a contiguous context.
    fn reference(q: &[f32], k: &[Vec<f32>], v: &[Vec<f32>], scale: f32) -> Vec<f32> {
        let s: Vec<f32> = k.iter().map(|kt| scale * dot(q, kt)).collect();
        let m = s.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let e: Vec<f32> = s.iter().map(|x| (x - m).exp()).collect();
        let z: f32 = e.iter().sum();
        let mut out = vec![0.0; q.len()];
        for (w, vt) in e.iter().zip(v) {
            axpy(&mut out, w / z, vt);
        }
        out
    }

    /// Every kernel variant this CPU runs, on `seq_lens` with shuffled block
    /// tables, against the dense reference.
    fn check_variants(head_dim: usize, block_size: usize, seq_lens: &[i32]) {
        let (hkv, num_heads, scale) = (2, 6, 0.3);
        let width = seq_lens
            .iter()
            .map(|&l| l as usize)
            .max()
            .unwrap()
            .div_ceil(block_size);
        let shape = CacheShape {
            num_blocks: width * seq_lens.len() + 1,
            num_kv_heads: hkv,
            block_size,
            head_dim,
        };
        let n = shape.num_blocks * shape.block_stride();
        let kc: Vec<f32> = (0..n)
            .map(|i| ((i * 37 % 101) as f32 / 50.0) - 1.0)
            .collect();
        let vc: Vec<f32> = (0..n)
            .map(|i| ((i * 53 % 97) as f32 / 48.0) - 1.0)
            .collect();
        // Block ids in a scrambled order (7 is coprime to most pool sizes here).
        let tables: Vec<i32> = (0..width * seq_lens.len())
            .map(|i| ((i * 7 + 3) % shape.num_blocks) as i32)
            .collect();
        let q: Vec<f32> = (0..seq_lens.len() * num_heads * head_dim)
            .map(|i| (i as f32 * 0.37).sin())
            .collect();
        let group = num_heads / hkv;
        let caches = Caches {
            key: &kc,
            value: &vc,
            shape,
        };
        for (name, attend) in variants(head_dim) {
            let mut out = vec![0.0; q.len()];
            let mut scores = Vec::new();
            for (i, o) in out.chunks_exact_mut(group * head_dim).enumerate() {
                let s = i / hkv;
                let query = HeadQuery {
                    q: &q[i * group * head_dim..(i + 1) * group * head_dim],
                    table: &tables[s * width..(s + 1) * width],
                    seq_len: seq_lens[s] as usize,
                    kv_head: i % hkv,
                    scale,
                };
                attend(query, caches, o, &mut scores);
            }
            for (s, &len) in seq_lens.iter().enumerate() {
                for h in 0..num_heads {
                    let kvh = h / group;
                    let (mut ks, mut vs) = (vec![], vec![]);
                    for t in 0..len as usize {
                        let b = tables[s * width + t / block_size] as usize;
                        let at = b * shape.block_stride()
                            + kvh * shape.head_stride()
                            + (t % block_size) * head_dim;
                        ks.push(kc[at..at + head_dim].to_vec());
                        vs.push(vc[at..at + head_dim].to_vec());
                    }
                    let qh = &q[(s * num_heads + h) * head_dim..][..head_dim];
                    let want = reference(qh, &ks, &vs, scale);
                    let got = &out[(s * num_heads + h) * head_dim..][..head_dim];
                    for (a, b) in want.iter().zip(got) {
                        assert!(
                            (a - b).abs() < 1e-5,
                            "{name}, d {head_dim}, bs {block_size}, len {len}: {a} vs {b}"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn every_variant_matches_dense_attention() {
        for head_dim in [8, 64, 128] {
            for block_size in [1, 4, 16] {
                let lens = [
                    1,
                    block_size as i32 - 1,
                    block_size as i32,
                    2 * block_size as i32 + 1,
                    37,
                ];
                let lens: Vec<i32> = lens.into_iter().filter(|&l| l >= 1).collect();
                check_variants(head_dim, block_size, &lens);
            }
        }
    }

    #[test]
    fn public_entry_matches_dense_attention_through_shuffled_tables() {
        let shape = CacheShape {
            num_blocks: 8,
            num_kv_heads: 2,
            block_size: 4,
            head_dim: 8,
        };
        let n = shape.num_blocks * shape.block_stride();
        let kc: Vec<f32> = (0..n)
            .map(|i| ((i * 37 % 101) as f32 / 50.0) - 1.0)
            .collect();
        let vc: Vec<f32> = (0..n)
            .map(|i| ((i * 53 % 97) as f32 / 48.0) - 1.0)
            .collect();
        let num_heads = 4;
        let tables = [5, 2, 7, 0, 3, 6, 1, 4];
        let lens = [9, 1];
        let q: Vec<f32> = (0..2 * num_heads * 8)
            .map(|i| (i as f32 * 0.37).sin())
            .collect();
        let mut out = vec![0.0; q.len()];
        paged_decode_attention(&q, &kc, &vc, shape, &tables, 4, &lens, 0.3, &mut out);
        for s in 0..2 {
            for h in 0..num_heads {
                let kvh = h / 2;
                let (mut ks, mut vs) = (vec![], vec![]);
                for t in 0..lens[s] as usize {
                    let b = tables[s * 4 + t / 4] as usize;
                    let at = b * shape.block_stride() + kvh * shape.head_stride() + (t % 4) * 8;
                    ks.push(kc[at..at + 8].to_vec());
                    vs.push(vc[at..at + 8].to_vec());
                }
                let qh = &q[(s * num_heads + h) * 8..][..8];
                let want = reference(qh, &ks, &vs, 0.3);
                let got = &out[(s * num_heads + h) * 8..][..8];
                for (a, b) in want.iter().zip(got) {
                    assert!((a - b).abs() < 1e-5, "{a} vs {b}");
                }
            }
        }
    }

    #[test]
    fn write_kv_places_tokens_and_skips_padding() {
        let shape = CacheShape {
            num_blocks: 2,
            num_kv_heads: 1,
            block_size: 2,
            head_dim: 2,
        };
        let mut kc = vec![0.0; 8];
        let mut vc = vec![0.0; 8];
        write_kv(
            &[1.0, 2.0, 3.0, 4.0],
            &[5.0, 6.0, 7.0, 8.0],
            &mut kc,
            &mut vc,
            shape,
            &[3, -1],
        );
        assert_eq!(kc, [0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 1.0, 2.0]);
        assert_eq!(vc, [0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 5.0, 6.0]);
    }
}
