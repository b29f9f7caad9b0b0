//! Timing of the CPU paged decode attention kernel on one layer of the default
//! model's shape (256 sequences of 344 tokens, shuffled blocks), on both paths
//! the Python binding takes: the process's OpenMP team (`DecodeJob::run_on_team`,
//! what runs under torch) and a rayon pool (`DecodeJob::run_on_rayon`, the
//! fallback without an OpenMP runtime).
//!
//! `cargo bench --bench paged_decode -- [threads...] [--json]`: numeric
//! arguments are the thread counts to time (default: 1 and every core);
//! `--json` adds one JSON object of the figures as the last line.
//!
//! A plain bench process has no OpenMP runtime, so the bench loads
//! `libgomp.so.1` (the runtime PyPI's torch ships, and gcc's) once the rayon
//! timings are done; the kernel finds it as it finds torch's. Without it the
//! bench says so and times rayon only.
use pagedrs_kernels::attention::{CacheShape, DecodeJob};
use std::ffi::CStr;
use std::time::Instant;

/// Layers whose caches the timed runs cycle through.
const LAYERS: usize = 8;
/// Timed rounds per (path, threads); the median round is reported.
const ROUNDS: usize = 5;
/// Calls per round.
const CALLS: usize = 8;

const OPENMP_LIB: &CStr = c"libgomp.so.1";

struct Figure {
    path: &'static str,
    threads: usize,
    ms: f64,
    gbs: f64,
}

/// Median over `ROUNDS` of the mean seconds per call of `call(i)`, after one
/// untimed call.
fn time(mut call: impl FnMut(usize)) -> f64 {
    call(0);
    let mut rounds: Vec<f64> = (0..ROUNDS)
        .map(|r| {
            let t = Instant::now();
            for i in 0..CALLS {
                call(r * CALLS + i + 1);
            }
            t.elapsed().as_secs_f64() / CALLS as f64
        })
        .collect();
    rounds.sort_by(f64::total_cmp);
    rounds[ROUNDS / 2]
}

/// Loads the OpenMP runtime into the process, so that `run_on_team` finds it.
fn load_openmp() -> bool {
    // SAFETY: dlopen of a shared library by name with a valid C string; the
    // handle is kept for the life of the process.
    !unsafe { libc::dlopen(OPENMP_LIB.as_ptr(), libc::RTLD_NOW | libc::RTLD_GLOBAL) }.is_null()
}

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
    let jobs: Vec<DecodeJob> = layers
        .iter()
        .map(|(kc, vc)| DecodeJob::new(&q, kc, vc, shape, &tables, width, &lens, 0.125))
        .collect();
    let bytes = (2 * s * len * 3 * 64 * 4) as f64;

    // `cargo bench` adds `--bench`; numeric arguments are thread counts.
    let args: Vec<String> = std::env::args().skip(1).collect();
    let json = args.iter().any(|a| a == "--json");
    let mut thread_counts: Vec<usize> = args.iter().filter_map(|a| a.parse().ok()).collect();
    if thread_counts.is_empty() {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        thread_counts = vec![1, cores];
        thread_counts.dedup();
    }

    let mut figures = Vec::new();
    let mut record = |path, threads, secs: f64| {
        figures.push(Figure {
            path,
            threads,
            ms: secs * 1e3,
            gbs: bytes / secs / 1e9,
        })
    };
    // Rayon first: once loaded, the OpenMP runtime's idle workers spin after
    // each team run and would share the cores with the rayon pool.
    for &threads in &thread_counts {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .unwrap();
        let secs = pool.install(|| time(|i| jobs[i % LAYERS].run_on_rayon(&mut out)));
        record("rayon", threads, secs);
    }
    let openmp = load_openmp();
    if openmp {
        for &threads in &thread_counts {
            let secs = time(|i| {
                assert!(
                    jobs[i % LAYERS].run_on_team(threads, &mut out),
                    "OpenMP runtime loaded but not found by the kernel"
                )
            });
            record("openmp", threads, secs);
        }
    } else {
        println!(
            "{} not found: no OpenMP runtime, rayon path only",
            OPENMP_LIB.to_string_lossy()
        );
    }

    println!(
        "paged decode attention, {s} seqs x {len} tokens, {} KV heads x {} dims, \
         {:.1} MB of K/V per call (median of {ROUNDS} rounds of {CALLS} calls)",
        shape.num_kv_heads,
        shape.head_dim,
        bytes / 1e6
    );
    println!(
        "{:<8} {:>7} {:>12} {:>8}",
        "path", "threads", "ms per call", "GB/s"
    );
    for f in &figures {
        println!(
            "{:<8} {:>7} {:>12.2} {:>8.2}",
            f.path, f.threads, f.ms, f.gbs
        );
    }
    if json {
        let results: Vec<String> = figures
            .iter()
            .map(|f| {
                format!(
                    "{{\"path\":\"{}\",\"threads\":{},\"ms_per_call\":{:.4},\"gb_per_s\":{:.4}}}",
                    f.path, f.threads, f.ms, f.gbs
                )
            })
            .collect();
        println!(
            "{{\"bench\":\"paged_decode\",\"num_seqs\":{s},\"seq_len\":{len},\
             \"num_kv_heads\":{},\"head_dim\":{},\"block_size\":{},\"kv_bytes_per_call\":{bytes},\
             \"openmp_runtime\":{},\"results\":[{}]}}",
            shape.num_kv_heads,
            shape.head_dim,
            shape.block_size,
            if openmp {
                format!("\"{}\"", OPENMP_LIB.to_string_lossy())
            } else {
                "null".to_string()
            },
            results.join(",")
        );
    }
}
