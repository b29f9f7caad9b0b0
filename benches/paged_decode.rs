//! Timing of the CPU paged decode attention kernel on one layer of the default
//! model's shape (256 sequences of 344 tokens, shuffled blocks):
//! `cargo bench --bench paged_decode -- [threads]`.
use _core::attention::{paged_decode_attention, CacheShape};
use std::time::Instant;

/// Layers whose caches the timed runs cycle through.
const LAYERS: usize = 8;

fn main() {
    let shape = CacheShape {
        num_blocks: 6000,
        num_kv_heads: 3,
        block_size: 16,
        head_dim: 64,
    };
    let n = shape.num_blocks * 3 * 16 * 64;
    let kc: Vec<f32> = (0..n)
        .map(|i| ((i * 37 % 101) as f32 / 50.0) - 1.0)
        .collect();
    // Several layers' caches, used in turn, so a run does not find the last
    // layer's K/V in the (large) last-level cache, as in a real step.
    let layers: Vec<(Vec<f32>, Vec<f32>)> = (0..LAYERS).map(|_| (kc.clone(), kc.clone())).collect();
    let (s, width, len) = (256, 22, 344);
    let tables: Vec<i32> = (0..s * width)
        .map(|i| ((i * 2_654_435_761usize) % shape.num_blocks) as i32)
        .collect();
    let lens = vec![len as i32; s];
    let q: Vec<f32> = (0..s * 9 * 64).map(|i| (i as f32 * 0.37).sin()).collect();
    let mut out = vec![0.0; q.len()];
    // `cargo bench` adds `--bench`; the first numeric argument is the thread count.
    let threads: usize = std::env::args()
        .skip(1)
        .find_map(|a| a.parse().ok())
        .unwrap_or(1);
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .unwrap();
    pool.install(|| {
        let run = |out: &mut [f32], i: usize| {
            let (kc, vc) = &layers[i % LAYERS];
            paged_decode_attention(&q, kc, vc, shape, &tables, width, &lens, 0.125, out)
        };
        run(&mut out, 0);
        let iters = 24;
        let t = Instant::now();
        for i in 0..iters {
            run(&mut out, i);
        }
        let secs = t.elapsed().as_secs_f64() / iters as f64;
        let bytes = (2 * s * len * 3 * 64 * 4) as f64;
        println!(
            "{threads} thread(s): {:.2} ms per layer, {:.1} GB/s of K/V read",
            secs * 1e3,
            bytes / secs / 1e9
        );
    });
}
