//! Tests of the CPU attention kernels against dense attention.

use super::cache::{write_kv, CacheShape, Caches, HeadQuery};
use super::convert::{bf16_to_f32, f32_to_bf16};
use super::format::KvElem;
use super::kernel::variants;
use super::math::{axpy, dot};
use super::paged_decode::{paged_decode_attention, DecodeOptions};

/// Dense reference: softmax(q K^T * scale) V over a contiguous context.
fn reference(q: &[f32], k: &[Vec<f32>], v: &[Vec<f32>], scale: f32) -> Vec<f32> {
    reference_with(q, k, v, scale, None, None)
}

/// Dense reference with HF's eager soft cap (`tanh(s / c) * c` after scaling)
/// and sink (one more logit in the softmax, its weight dropped).
pub(super) fn reference_with(
    q: &[f32],
    k: &[Vec<f32>],
    v: &[Vec<f32>],
    scale: f32,
    softcap: Option<f32>,
    sink: Option<f32>,
) -> Vec<f32> {
    let mut s: Vec<f32> = k.iter().map(|kt| scale * dot(q, kt)).collect();
    if let Some(c) = softcap {
        s.iter_mut().for_each(|x| *x = (*x / c).tanh() * c);
    }
    let m = s
        .iter()
        .copied()
        .fold(sink.unwrap_or(f32::NEG_INFINITY), f32::max);
    let e: Vec<f32> = s.iter().map(|x| (x - m).exp()).collect();
    let z: f32 = e.iter().sum::<f32>() + sink.map_or(0.0, |x| (x - m).exp());
    let mut out = vec![0.0; q.len()];
    for (w, vt) in e.iter().zip(v) {
        axpy(&mut out, w / z, vt);
    }
    out
}

/// Every kernel variant this CPU runs, on `seq_lens` with shuffled block
/// tables, against the dense reference.
/// How far the int8 kernel (`avx512_int8`) may be from exact attention
/// over the values its entries hold, from its int16 rounding alone: a
/// query element moves by at most `max |q| / 65534`, so a score by `ds =
/// scale * max |q| / 65534 * max_t sum |k_t|` and the output by at most
/// `2 * ds * max |v|` through the softmax; each weight (at most 1) moves by
/// at most 2^-14 of the head's largest (one step of its power-of-two
/// scale), the output by `len / 16384 * max |v|` over `len` rows.
fn integer_kernel_bound(q: &[f32], ks: &[Vec<f32>], vs: &[Vec<f32>], scale: f32) -> f32 {
    let max_abs = |x: &[f32]| x.iter().fold(0.0f32, |m, v| m.max(v.abs()));
    let key_sum = ks
        .iter()
        .map(|k| k.iter().map(|x| x.abs()).sum::<f32>())
        .fold(0.0f32, f32::max);
    let max_v = vs.iter().map(|v| max_abs(v)).fold(0.0f32, f32::max);
    let ds = scale * max_abs(q) / 65534.0 * key_sum;
    (2.0 * ds + vs.len() as f32 / 16384.0) * max_v
}

fn check_variants(head_dim: usize, block_size: usize, seq_lens: &[i32]) {
    check_variants_with::<f32>(
        head_dim,
        block_size,
        seq_lens,
        DecodeOptions::default(),
        false,
    );
}

/// A test layer: float32 values `[num_blocks, hkv, bs, head_dim]` stored as
/// `E` entries, and the values the entries hold (dequantized).
pub(super) struct Layer<E> {
    pub key: Vec<E>,
    pub value: Vec<E>,
    pub key_values: Vec<f32>,
    pub value_values: Vec<f32>,
}

/// `values` (`[rows, head_dim]`) stored as `E` entries, and what they hold.
pub(super) fn store_rows<E: KvElem>(values: &[f32], head_dim: usize) -> (Vec<E>, Vec<f32>) {
    let e = E::entry_size(head_dim);
    let rows = values.len() / head_dim;
    let mut entries = vec![E::default(); rows * e];
    let mut held = vec![0.0; values.len()];
    for r in 0..rows {
        let entry = &mut entries[r * e..(r + 1) * e];
        E::store(&values[r * head_dim..(r + 1) * head_dim], entry);
        let scale = E::scale(entry, head_dim);
        for (h, x) in held[r * head_dim..(r + 1) * head_dim]
            .iter_mut()
            .zip(&entry[..head_dim])
        {
            *h = x.value() * scale;
        }
    }
    (entries, held)
}

impl<E: KvElem> Layer<E> {
    pub(super) fn new(kc: &[f32], vc: &[f32], head_dim: usize) -> Self {
        let (key, key_values) = store_rows::<E>(kc, head_dim);
        let (value, value_values) = store_rows::<E>(vc, head_dim);
        Layer {
            key,
            value,
            key_values,
            value_values,
        }
    }
}

/// As `check_variants`, for caches of `E` entries, with a window, soft cap
/// and sinks; the reference attends to the window's tokens only (over the
/// values the entries hold), and the cache rows before each window hold a
/// huge value, so a kernel that read them would show it. `bf16_query`: the
/// queries are bfloat16 values and the bfloat16 variants may run.
pub(super) fn check_variants_with<E: KvElem>(
    head_dim: usize,
    block_size: usize,
    seq_lens: &[i32],
    options: DecodeOptions,
    bf16_query: bool,
) {
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
    let mut kc: Vec<f32> = (0..n)
        .map(|i| ((i * 37 % 101) as f32 / 50.0) - 1.0)
        .collect();
    let mut vc: Vec<f32> = (0..n)
        .map(|i| ((i * 53 % 97) as f32 / 48.0) - 1.0)
        .collect();
    // Block ids in a scrambled order (7 is coprime to most pool sizes here).
    let tables: Vec<i32> = (0..width * seq_lens.len())
        .map(|i| ((i * 7 + 3) % shape.num_blocks) as i32)
        .collect();
    let start = |len: i32| {
        options
            .sliding_window
            .map_or(0, |w| (len as usize).saturating_sub(w))
    };
    // Rows before each window: huge (blocks are not shared between sequences).
    for (s, &len) in seq_lens.iter().enumerate() {
        for t in 0..start(len) {
            let b = tables[s * width + t / block_size] as usize;
            for h in 0..hkv {
                let at = b * shape.block_stride()
                    + h * shape.head_stride()
                    + (t % block_size) * head_dim;
                kc[at..at + head_dim].fill(1e4);
                vc[at..at + head_dim].fill(1e4);
            }
        }
    }
    let layer = Layer::<E>::new(&kc, &vc, head_dim);
    let mut q: Vec<f32> = (0..seq_lens.len() * num_heads * head_dim)
        .map(|i| (i as f32 * 0.37).sin())
        .collect();
    if bf16_query {
        q.iter_mut().for_each(|x| *x = bf16_to_f32(f32_to_bf16(*x)));
    }
    let group = num_heads / hkv;
    let caches = Caches::new(&layer.key[..], &layer.value[..], shape);
    for (name, attend) in variants::<E>(head_dim, bf16_query) {
        let mut out = vec![0.0; q.len()];
        let mut scores = Vec::new();
        for (i, o) in out.chunks_exact_mut(group * head_dim).enumerate() {
            let s = i / hkv;
            let kv_head = i % hkv;
            let query = HeadQuery {
                q: &q[i * group * head_dim..(i + 1) * group * head_dim],
                table: &tables[s * width..(s + 1) * width],
                seq_len: seq_lens[s] as usize,
                kv_head,
                scale,
                start: start(seq_lens[s]),
                softcap: options.softcap.unwrap_or(0.0),
                sinks: options
                    .sinks
                    .map_or(&[][..], |x| &x[kv_head * group..(kv_head + 1) * group]),
            };
            attend(query, caches, o, &mut scores);
        }
        for (s, &len) in seq_lens.iter().enumerate() {
            for h in 0..num_heads {
                let kvh = h / group;
                let (mut ks, mut vs) = (vec![], vec![]);
                for t in start(len)..len as usize {
                    let b = tables[s * width + t / block_size] as usize;
                    let at = b * shape.block_stride()
                        + kvh * shape.head_stride()
                        + (t % block_size) * head_dim;
                    ks.push(layer.key_values[at..at + head_dim].to_vec());
                    vs.push(layer.value_values[at..at + head_dim].to_vec());
                }
                let qh = &q[(s * num_heads + h) * head_dim..][..head_dim];
                let sink = options.sinks.map(|x| x[h]);
                let want = reference_with(qh, &ks, &vs, scale, options.softcap, sink);
                let got = &out[(s * num_heads + h) * head_dim..][..head_dim];
                let tol = 1e-5
                    + if name == "avx512_vnni" {
                        integer_kernel_bound(qh, &ks, &vs, scale)
                    } else {
                        0.0
                    };
                for (a, b) in want.iter().zip(got) {
                    assert!(
                        (a - b).abs() < tol,
                        "{} {name}, d {head_dim}, bs {block_size}, len {len}, {options:?}: {a} vs {b}",
                        E::NAME
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
fn every_variant_matches_dense_attention_with_window_softcap_sinks() {
    let sinks = [0.5, -1.0, 2.0, 0.0, 3.0, -0.25];
    for head_dim in [8, 64, 128] {
        for block_size in [1, 4, 16] {
            let lens = [1, 3, block_size as i32 + 2, 2 * block_size as i32 + 1, 37];
            for (window, softcap, with_sinks) in [
                (Some(5), None, false),
                (Some(1), None, false),
                (Some(16), None, false),
                (Some(100), None, false),
                (None, Some(0.7), false),
                (None, None, true),
                (Some(6), Some(1.5), true),
            ] {
                let options = DecodeOptions {
                    sliding_window: window,
                    softcap,
                    sinks: with_sinks.then_some(&sinks[..]),
                };
                check_variants_with::<f32>(head_dim, block_size, &lens, options, false);
            }
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
    paged_decode_attention(
        &q,
        &kc,
        &vc,
        shape,
        &tables,
        4,
        &lens,
        0.3,
        DecodeOptions::default(),
        &mut out,
    );
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
