//! Timing of the quantized projection kernels (`rust/pagedrs-kernels/src/quant`) alone, on
//! one thread of a rayon pool, without Python: per (shape, format, rows) the
//! activations' quantization and the projection, each the median of
//! `ROUNDS` rounds, in the process's CPU time (not wall time: on a shared
//! machine the CPU time of one thread is the steadier figure). For profiling (`perf record`) and quick comparisons of
//! kernel changes; `benches/bench_quant_linear.py` compares against torch.
//!
//! `cargo bench --bench quant_kernel -- [N,K] [FORMAT,...] [ROWS,...]
//! [--acts int16,int8] [--variant NAME] [--threads T] [--seconds S]
//! [--layout rows|panels]`, e.g.
//! `cargo bench --bench quant_kernel -- 2048,2048 Q4_0,Q4_K 1,256 --acts int8`.
//! GOP/s counts a multiply-add as 2 operations (`2 rows N K / s`).
//! `--layout panels` times the weights repacked into 16-output panels
//! (`quant::repack`; Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K), as the engine holds them for the
//! AVX-512 VNNI kernel on int8 activations; `rows` (the default) the file's
//! blocks.
//! `--peak` first measures the core's int8 dot-product peak: 12 independent
//! chains of 512-bit `vpdpbusd` (64 multiply-adds each), instructions per
//! CPU second times 128 operations.
use pagedrs_kernels::quant::random::random_weight;
use pagedrs_kernels::quant::{
    repack, run_projection, ActQuant, Layout, Part, QuantActs, QuantType, QuantWeight, VARIANTS,
};
use pagedrs_kernels::test_data::Rng;

const ROUNDS: usize = 5;

/// The process's CPU seconds.
fn cpu_seconds() -> f64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a valid clock id and a valid out pointer.
    unsafe { libc::clock_gettime(libc::CLOCK_PROCESS_CPUTIME_ID, &mut ts) };
    ts.tv_sec as f64 + ts.tv_nsec as f64 * 1e-9
}

/// Median CPU seconds per call of `call` over `ROUNDS` rounds of at least
/// `seconds / ROUNDS` CPU seconds each.
fn time(seconds: f64, mut call: impl FnMut()) -> f64 {
    call();
    let mut rounds: Vec<f64> = (0..ROUNDS)
        .map(|_| {
            let t = cpu_seconds();
            let mut calls = 0;
            while calls == 0 || cpu_seconds() - t < seconds / ROUNDS as f64 {
                call();
                calls += 1;
            }
            (cpu_seconds() - t) / calls as f64
        })
        .collect();
    rounds.sort_by(f64::total_cmp);
    rounds[ROUNDS / 2]
}

/// The measured `vpdpbusd` zmm rate (instructions per CPU second) of this
/// core, None where the CPU has no AVX-512 VNNI.
#[cfg(target_arch = "x86_64")]
fn vpdpbusd_rate() -> Option<f64> {
    if !(is_x86_feature_detected!("avx512f") && is_x86_feature_detected!("avx512vnni")) {
        return None;
    }
    const ITERS: usize = 20_000_000;
    let run = || {
        // SAFETY: the CPU runs AVX-512 VNNI (checked above); registers only.
        unsafe {
            std::arch::asm!(
                "vpxord zmm0, zmm0, zmm0",
                "vpxord zmm1, zmm1, zmm1",
                "2:",
                "vpdpbusd zmm2, zmm0, zmm1",
                "vpdpbusd zmm3, zmm0, zmm1",
                "vpdpbusd zmm4, zmm0, zmm1",
                "vpdpbusd zmm5, zmm0, zmm1",
                "vpdpbusd zmm6, zmm0, zmm1",
                "vpdpbusd zmm7, zmm0, zmm1",
                "vpdpbusd zmm8, zmm0, zmm1",
                "vpdpbusd zmm9, zmm0, zmm1",
                "vpdpbusd zmm10, zmm0, zmm1",
                "vpdpbusd zmm11, zmm0, zmm1",
                "vpdpbusd zmm12, zmm0, zmm1",
                "vpdpbusd zmm13, zmm0, zmm1",
                "dec {n}",
                "jnz 2b",
                n = inout(reg) ITERS => _,
                out("zmm0") _, out("zmm1") _, out("zmm2") _, out("zmm3") _,
                out("zmm4") _, out("zmm5") _, out("zmm6") _, out("zmm7") _,
                out("zmm8") _, out("zmm9") _, out("zmm10") _, out("zmm11") _,
                out("zmm12") _, out("zmm13") _,
                options(nostack)
            );
        }
    };
    Some(12.0 * ITERS as f64 / time(1.0, run))
}

#[cfg(not(target_arch = "x86_64"))]
fn vpdpbusd_rate() -> Option<f64> {
    None
}

fn main() {
    let mut pos = Vec::new();
    let mut variant = VARIANTS.best();
    let mut threads = 1;
    let mut seconds = 1.0;
    let mut schemes = vec![ActQuant::Int16, ActQuant::Int8];
    let mut layout = Layout::Rows;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--variant" => {
                let name = args.next().expect("--variant NAME");
                variant = VARIANTS.parse(&name).expect("a variant this CPU runs");
            }
            "--threads" => {
                threads = args
                    .next()
                    .and_then(|t| t.parse().ok())
                    .expect("--threads T")
            }
            "--seconds" => {
                seconds = args
                    .next()
                    .and_then(|t| t.parse().ok())
                    .expect("--seconds S")
            }
            "--acts" => {
                schemes = args
                    .next()
                    .expect("--acts int16,int8")
                    .split(',')
                    .map(|a| ActQuant::parse(a).expect("int16 or int8"))
                    .collect()
            }
            "--peak" => match vpdpbusd_rate() {
                Some(rate) => println!(
                    "int8 dot-product peak: {:.2} G vpdpbusd zmm/s x 128 = {:.1} GOP/s",
                    rate / 1e9,
                    rate * 128.0 / 1e9
                ),
                None => println!("int8 dot-product peak: no AVX-512 VNNI"),
            },
            "--layout" => {
                layout = match args.next().as_deref() {
                    Some("rows") => Layout::Rows,
                    Some("panels") => Layout::Panels,
                    _ => panic!("--layout rows|panels"),
                }
            }
            "--bench" => {}
            _ => pos.push(a),
        }
    }
    let nk: Vec<usize> = pos
        .first()
        .map_or("2048,2048", |s| s.as_str())
        .split(',')
        .map(|v| v.parse().expect("N,K"))
        .collect();
    let (n, k) = (nk[0], nk[1]);
    let formats: Vec<QuantType> = pos
        .get(1)
        .map_or("Q4_0,Q8_0,Q4_K,Q6_K", |s| s.as_str())
        .split(',')
        .map(|f| QuantType::parse(f).expect("a format"))
        .collect();
    let rows_list: Vec<usize> = pos
        .get(2)
        .map_or("1,256", |s| s.as_str())
        .split(',')
        .map(|v| v.parse().expect("rows"))
        .collect();
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .expect("a rayon pool");
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    println!(
        "quantized kernels, {n} x {k}, variant {}, {threads} thread(s), layout {layout:?}",
        variant.name()
    );
    for &t in &formats {
        let (data, scales) = random_weight(t, n, k, &mut rng);
        let panels = match layout {
            Layout::Panels => repack::repack(t, n, k, &data).expect("a format with panels"),
            Layout::Rows => Vec::new(),
        };
        let weight = match layout {
            Layout::Panels => QuantWeight::panels(t, n, k, &panels).expect("panels"),
            Layout::Rows => QuantWeight::new(t, n, k, &data, &scales).expect("a weight"),
        };
        for (&rows, &a) in rows_list
            .iter()
            .flat_map(|r| schemes.iter().map(move |a| (r, a)))
        {
            let x: Vec<f32> = (0..rows * k).map(|_| rng.uniform()).collect();
            let acts = QuantActs::from_f32(a, rows, k, &x);
            let mut out = vec![0.0f32; rows * n];
            let parts = [Part { weight, col: 0 }];
            let act_s = time(seconds / 4.0, || {
                std::hint::black_box(QuantActs::from_f32(a, rows, k, &x));
            });
            let s = pool.install(|| {
                time(seconds, || {
                    run_projection(&parts, &acts, &mut out, n, variant, threads)
                })
            });
            let gops = 2.0 * (rows * n * k) as f64 / s / 1e9;
            println!(
                "{:>5} {:>5} rows={rows:<4} projection {:9.3} ms ({gops:6.1} GOP/s, {:6.2} GB/s)  \
                 activations {:8.3} ms",
                t.name(),
                a.name(),
                s * 1e3,
                data.len() as f64 / s / 1e9,
                act_s * 1e3
            );
        }
    }
}
