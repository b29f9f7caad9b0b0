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

/// Shape of one layer's paged KV cache.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CacheShape {
    pub num_blocks: usize,
    pub num_kv_heads: usize,
    pub block_size: usize,
    pub head_dim: usize,
}

impl CacheShape {
    fn block_stride(&self) -> usize {
        self.num_kv_heads * self.block_size * self.head_dim
    }

    fn head_stride(&self) -> usize {
        self.block_size * self.head_dim
    }
}

/// Dot product with sixteen independent accumulators, so LLVM vectorizes it.
#[inline(always)]
fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0.0f32; 16];
    let (ca, ra) = a.as_chunks::<16>();
    let (cb, rb) = b.as_chunks::<16>();
    for (x, y) in ca.iter().zip(cb) {
        for i in 0..16 {
            acc[i] += x[i] * y[i];
        }
    }
    let mut tail = 0.0;
    for (x, y) in ra.iter().zip(rb) {
        tail += x * y;
    }
    acc.iter().sum::<f32>() + tail
}

/// `acc += w * v`.
#[inline(always)]
fn axpy(acc: &mut [f32], w: f32, v: &[f32]) {
    for (a, x) in acc.iter_mut().zip(v) {
        *a += w * x;
    }
}

/// `exp(x)` for `x <= 0` with plain float and bit operations, so a loop over
/// it vectorizes: `2^n * p(r)`, `x = n ln2 + r`, `|r| <= ln2 / 2`, `p` the
/// degree-6 Taylor polynomial (relative error < 2e-7). Inputs below -87 give
/// about `exp(-87)`, which underflows any softmax weight anyway.
#[inline(always)]
fn exp_nonpositive(x: f32) -> f32 {
    const LOG2E: f32 = std::f32::consts::LOG2_E;
    const LN2_HI: f32 = 0.693_145_75;
    const LN2_LO: f32 = 1.428_606_8e-6;
    const ROUND: f32 = 12_582_912.0; // 1.5 * 2^23: adding it rounds to an integer
    let x = x.max(-87.0);
    let t = x * LOG2E + ROUND;
    let n = t - ROUND;
    let r = x - n * LN2_HI - n * LN2_LO;
    let p = 1.0
        + r * (1.0
            + r * (0.5
                + r * (1.0 / 6.0 + r * (1.0 / 24.0 + r * (1.0 / 120.0 + r * (1.0 / 720.0))))));
    let exponent = (t.to_bits() as i32 - ROUND.to_bits() as i32) + 127;
    p * f32::from_bits((exponent as u32) << 23)
}

/// Sum with sixteen independent accumulators (vectorizes, unlike a fold).
#[inline(always)]
fn sum(xs: &[f32]) -> f32 {
    let mut acc = [0.0f32; 16];
    let (chunks, rest) = xs.as_chunks::<16>();
    for c in chunks {
        for i in 0..16 {
            acc[i] += c[i];
        }
    }
    acc.iter().sum::<f32>() + rest.iter().sum::<f32>()
}

/// Ask the CPU to start loading `data` into cache (the next block is at a
/// random address, beyond the reach of the hardware prefetcher).
#[inline(always)]
fn prefetch(data: &[f32]) {
    #[cfg(target_arch = "x86_64")]
    for line in data.chunks(16) {
        // SAFETY: prefetching is a hint; SSE is part of the x86_64 baseline.
        unsafe {
            std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(
                line.as_ptr() as *const i8
            )
        };
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = data;
}

/// Offset of this head's rows in the block after logical block `b` (this
/// block again at the end, a harmless prefetch of cached lines).
#[inline(always)]
fn next_block(table: &[i32], b: usize, num_blocks: usize, shape: CacheShape, head: usize) -> usize {
    let next = table[(b + 1).min(num_blocks - 1)] as usize;
    next * shape.block_stride() + head * shape.head_stride()
}

/// In-place `row = softmax(row)`.
#[inline(always)]
fn softmax(row: &mut [f32]) {
    let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    row.iter_mut().for_each(|s| *s = exp_nonpositive(*s - max));
    let inv = 1.0 / sum(row);
    row.iter_mut().for_each(|s| *s *= inv);
}

/// One layer's paged caches.
#[derive(Clone, Copy)]
struct Caches<'a> {
    key: &'a [f32],
    value: &'a [f32],
    shape: CacheShape,
}

/// One sequence's query heads (`[num_heads, head_dim]`), block table row,
/// context length (tokens) and softmax scale.
#[derive(Clone, Copy)]
struct Query<'a> {
    q: &'a [f32],
    table: &'a [i32],
    seq_len: usize,
    scale: f32,
}

/// Attention of one sequence over its cached tokens into `out`
/// (`[num_heads, head_dim]`); `scores` is scratch space.
#[inline(always)]
fn attend_one_body(query: Query, caches: Caches, out: &mut [f32], scores: &mut Vec<f32>) {
    let Query {
        q,
        table,
        seq_len,
        scale,
    } = query;
    let shape = caches.shape;
    let d = shape.head_dim;
    let bs = shape.block_size;
    let group = q.len() / d / shape.num_kv_heads;
    out.fill(0.0);
    if seq_len == 0 {
        return;
    }
    scores.clear();
    scores.resize(group * seq_len, 0.0);
    let num_blocks = seq_len.div_ceil(bs);
    for kv_head in 0..shape.num_kv_heads {
        let q_group = &q[kv_head * group * d..(kv_head + 1) * group * d];
        // Pass 1: scores[g * seq_len + t] = scale * q_g . k_t
        for (b, &block) in table[..num_blocks].iter().enumerate() {
            let base = block as usize * shape.block_stride() + kv_head * shape.head_stride();
            let n = bs.min(seq_len - b * bs);
            let keys = &caches.key[base..base + n * d];
            let next = next_block(table, b, num_blocks, shape, kv_head);
            for (j, k) in keys.chunks_exact(d).enumerate() {
                prefetch(&caches.key[next + j * d..next + (j + 1) * d]);
                for (g, qg) in q_group.chunks_exact(d).enumerate() {
                    scores[g * seq_len + b * bs + j] = scale * dot(qg, k);
                }
            }
        }
        // Pass 2: softmax per query head.
        for row in scores.chunks_exact_mut(seq_len) {
            softmax(row);
        }
        // Pass 3: out_g = sum_t p_gt * v_t
        let out_group = &mut out[kv_head * group * d..(kv_head + 1) * group * d];
        for (b, &block) in table[..num_blocks].iter().enumerate() {
            let base = block as usize * shape.block_stride() + kv_head * shape.head_stride();
            let n = bs.min(seq_len - b * bs);
            let values = &caches.value[base..base + n * d];
            let next = next_block(table, b, num_blocks, shape, kv_head);
            for (j, v) in values.chunks_exact(d).enumerate() {
                prefetch(&caches.value[next + j * d..next + (j + 1) * d]);
                for (g, og) in out_group.chunks_exact_mut(d).enumerate() {
                    axpy(og, scores[g * seq_len + b * bs + j], v);
                }
            }
        }
    }
}

type AttendFn = fn(Query, Caches, &mut [f32], &mut Vec<f32>);

fn attend_one_portable(query: Query, caches: Caches, out: &mut [f32], scores: &mut Vec<f32>) {
    attend_one_body(query, caches, out, scores)
}

/// The same body compiled for AVX2 + FMA (8-wide vectors).
///
/// # Safety
/// The CPU must support AVX2 and FMA (checked by `attend_fn`).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn attend_one_avx2(query: Query, caches: Caches, out: &mut [f32], scores: &mut Vec<f32>) {
    attend_one_body(query, caches, out, scores)
}

#[cfg(target_arch = "x86_64")]
fn attend_one_avx2_checked(query: Query, caches: Caches, out: &mut [f32], scores: &mut Vec<f32>) {
    // SAFETY: only selected by `attend_fn` after detecting AVX2 and FMA.
    unsafe { attend_one_avx2(query, caches, out, scores) }
}

/// The widest variant this CPU runs.
fn attend_fn() -> AttendFn {
    #[cfg(target_arch = "x86_64")]
    if is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") {
        return attend_one_avx2_checked;
    }
    attend_one_portable
}

/// One query token per sequence attending to its whole paged context, in
/// parallel over sequences (rayon's current pool).
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
    let num_seqs = seq_lens.len();
    if num_seqs == 0 {
        return;
    }
    let row = query.len() / num_seqs;
    let attend = attend_fn();
    let caches = Caches {
        key: key_cache,
        value: value_cache,
        shape,
    };
    out.par_chunks_mut(row)
        .zip(query.par_chunks(row))
        .enumerate()
        .for_each_init(Vec::new, |scores, (s, (o, q))| {
            let query = Query {
                q,
                table: &block_tables[s * table_width..(s + 1) * table_width],
                seq_len: seq_lens[s] as usize,
                scale,
            };
            attend(query, caches, o, scores);
        });
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

    #[test]
    fn matches_dense_attention_through_shuffled_tables() {
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
    fn fast_exp_matches_std() {
        for i in 0..=20_000 {
            let x = -(i as f32) * 0.00435;
            let (want, got) = (x.exp(), exp_nonpositive(x));
            assert!(
                (want - got).abs() <= 3e-7 * want,
                "exp({x}) = {want} vs {got}"
            );
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
