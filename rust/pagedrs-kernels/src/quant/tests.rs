//! Tests of the quantized kernels: every variant this CPU runs against the
//! exact product of the dequantized weights and the quantized activations,
//! the variants' bits against the portable kernel's, and batch invariance.
//! (`tests/kernels/test_quant_linear.py` checks the formats against gguf's
//! own dequantization.)

use super::act::{ActQuant, QuantActs};
use super::blocks::decode;
use super::driver::{run_projection, Part};
use super::format::{QuantType, QuantWeight};
use super::kernel::VARIANTS;
use super::random::random_weight;
use super::repack;
use crate::cpu_features::Variant;
use crate::test_data::Rng;

/// `[rows, k]` activations with a few outliers.
fn random_acts(rows: usize, k: usize, rng: &mut Rng) -> Vec<f32> {
    (0..rows * k)
        .map(|i| rng.uniform() * if i % 37 == 0 { 8.0 } else { 1.0 })
        .collect()
}

/// `f(k, w[n, k], d)` for each feature `k` of row `n` of `w` in order, with
/// `blocks::decode`'s weight and the scale `d` of activation row `r`'s block.
fn each_weight(
    w: &QuantWeight,
    acts: &QuantActs,
    r: usize,
    n: usize,
    mut f: impl FnMut(usize, f64, f64),
) {
    for b in 0..w.k / 32 {
        let sub = decode(w.qtype, w.row(n), b, w.row_scale(n));
        let d = acts.row_d(r)[b] as f64;
        for i in 0..32 {
            f(32 * b + i, sub.weight(i), d);
        }
    }
}

/// `sum_k w[n, k] * d * q[r, k]` in f64 over `blocks::decode`'s values, and
/// the bound of a float32 sum of those terms: `|x| * n_blocks * 2^-22`.
fn exact(w: &QuantWeight, acts: &QuantActs, r: usize, n: usize) -> (f64, f64) {
    let (mut s, mut abs) = (0.0f64, 0.0f64);
    each_weight(w, acts, r, n, |k, wv, d| {
        let xv = d * acts.row_q(r)[k] as f64;
        s += wv * xv;
        abs += (wv * xv).abs();
    });
    (s, abs * (w.k / 32 + 8) as f64 * 2f64.powi(-23) + 1e-30)
}

/// `sum_k w[n, k] * x[r, k]` in f64 over `blocks::decode`'s values and the
/// float activations (dequantize, then a float product), and the bound of
/// the kernels' error against it: `exact`'s summation bound plus the
/// activations' rounding, at most `d / 2` per value (`d = max|x| / 32767`
/// of its block, here taken from `acts`, itself rounded: `2^-23` relative).
fn float_reference(w: &QuantWeight, x: &[f32], acts: &QuantActs, r: usize, n: usize) -> (f64, f64) {
    let (mut s, mut rounding) = (0.0f64, 0.0f64);
    each_weight(w, acts, r, n, |k, wv, d| {
        let xv = x[r * w.k + k] as f64;
        s += wv * xv;
        rounding += wv.abs() * (d * (0.5 + 1e-6) + xv.abs() * 2f64.powi(-23));
    });
    (s, exact(w, acts, r, n).1 + rounding)
}

fn project(w: QuantWeight, acts: &QuantActs, v: Variant, threads: usize) -> Vec<f32> {
    let mut out = vec![0.0; acts.rows * w.n];
    run_projection(
        &[Part { weight: w, col: 0 }],
        acts,
        &mut out,
        w.n,
        v,
        threads,
    );
    out
}

/// `(rows, outputs)`: one row and one output; the many-rows path with a
/// partial row tile; an output count off the tiles.
const SHAPES: [(usize, usize); 4] = [(1, 1), (5, 37), (7, 1), (9, 3)];

/// Both activation schemes.
const SCHEMES: [ActQuant; 2] = [ActQuant::Int16, ActQuant::Int8];

/// Every weight format with each activation scheme.
fn formats_and_schemes() -> impl Iterator<Item = (QuantType, ActQuant)> {
    QuantType::ALL
        .into_iter()
        .flat_map(|t| SCHEMES.map(|a| (t, a)))
}

#[test]
fn every_variant_matches_the_exact_product_and_the_portable_bits() {
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    for (t, a) in formats_and_schemes() {
        // K off the powers of two: one k-quant block and 5; 3 sub-blocks
        // of 32 (a partial step of the many-rows path) and 11 (a whole
        // step and a partial one).
        let ks: [usize; 2] = if t.block_values() == 256 {
            [256, 1280]
        } else {
            [96, 352]
        };
        for (k, (rows, n)) in ks.into_iter().flat_map(|k| SHAPES.map(|s| (k, s))) {
            let (data, scales) = random_weight(t, n, k, &mut rng);
            let w = QuantWeight::new(t, n, k, &data, &scales).unwrap();
            let x = random_acts(rows, k, &mut rng);
            let acts = QuantActs::new(a, rows, k, |i| x[i]);
            let portable = project(w, &acts, Variant::Portable, 1);
            for r in 0..rows {
                for o in 0..n {
                    let (want, tol) = exact(&w, &acts, r, o);
                    let got = portable[r * n + o] as f64;
                    assert!(
                        (got - want).abs() <= tol,
                        "{t:?} {a:?} [{r}, {o}]: {got} vs {want} (tolerance {tol})"
                    );
                    let (want, tol) = float_reference(&w, &x, &acts, r, o);
                    assert!(
                        (got - want).abs() <= tol,
                        "{t:?} {a:?} [{r}, {o}]: {got} vs the float product {want} \
                         (tolerance {tol})"
                    );
                }
            }
            for v in VARIANTS.available() {
                let got = project(w, &acts, v, 2);
                assert_eq!(
                    got.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
                    portable.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
                    "{t:?} {a:?} {} bits differ from the portable kernel's",
                    v.name()
                );
            }
        }
    }
}

#[test]
fn a_rows_bits_do_not_depend_on_the_batch() {
    let mut rng = Rng(7);
    // Rows on both sides of the few-rows tile (4) and the many-rows path
    // (5 and up, tiles of 4 rows, 8-row vectors of the minimum terms), of an
    // item's row block (256) and of several; K in whole and partial steps of
    // the many-rows path (8 sub-blocks: 17 sub-blocks for the 32-value
    // formats, 24 for the k-quants).
    for (t, a) in formats_and_schemes() {
        let (n, k) = (37, if t.block_values() == 256 { 768 } else { 544 });
        let (data, scales) = random_weight(t, n, k, &mut rng);
        let w = QuantWeight::new(t, n, k, &data, &scales).unwrap();
        let x = random_acts(300, k, &mut rng);
        for v in VARIANTS.available() {
            let one = |row: usize| {
                let acts = QuantActs::new(a, 1, k, |i| x[row * k + i]);
                project(w, &acts, v, 1)
            };
            for rows in [2, 4, 5, 8, 9, 13, 64, 65, 131, 256, 257, 300] {
                let acts = QuantActs::new(a, rows, k, |i| x[i]);
                let all = project(w, &acts, v, 2);
                for row in [0, 4.min(rows - 1), rows / 2, rows - 1] {
                    let alone = one(row);
                    for o in 0..n {
                        assert_eq!(
                            alone[o].to_bits(),
                            all[row * n + o].to_bits(),
                            "{t:?} {a:?} {}: row {row} of {rows}, output {o}",
                            v.name()
                        );
                    }
                }
            }
        }
    }
}

#[test]
fn nan_activations_give_nan_outputs() {
    let mut rng = Rng(3);
    let (data, scales) = random_weight(QuantType::Q4_0, 4, 64, &mut rng);
    let w = QuantWeight::new(QuantType::Q4_0, 4, 64, &data, &scales).unwrap();
    let mut x = random_acts(2, 64, &mut rng);
    x[70] = f32::NAN;
    for a in SCHEMES {
        let acts = QuantActs::new(a, 2, 64, |i| x[i]);
        for v in VARIANTS.available() {
            let out = project(w, &acts, v, 1);
            assert!(out[..4].iter().all(|y| y.is_finite()), "row 0 is finite");
            assert!(out[4..].iter().all(|y| y.is_nan()), "row 1 is NaN");
        }
    }
}

#[test]
fn bad_shapes_are_refused_by_name() {
    let err = QuantWeight::new(QuantType::Q4K, 2, 96, &[0; 2 * 54], &[]).unwrap_err();
    assert!(err.contains("Q4_K") && err.contains("96"), "{err}");
    let err = QuantWeight::new(QuantType::Q8_0, 2, 64, &[0; 10], &[]).unwrap_err();
    assert!(err.contains("Q8_0") && err.contains("136"), "{err}");
    let err = QuantWeight::new(QuantType::Int8, 2, 64, &[0; 128], &[]).unwrap_err();
    assert!(err.contains("scales"), "{err}");
}

#[test]
fn the_simd_activation_quantizer_gives_the_portable_bits() {
    let mut rng = Rng(11);
    let k = 32 * 9;
    let mut x = random_acts(3, k, &mut rng);
    // Blocks of zeros, a NaN, an infinity, subnormals only (their scale's
    // inverse overflows), a signed zero, halfway products and the extremes.
    x[32..64].fill(0.0);
    x[64 + 5] = f32::NAN;
    x[96 + 31] = f32::NEG_INFINITY;
    for (i, v) in x[128..160].iter_mut().enumerate() {
        *v = f32::from_bits(1 + i as u32 * 3) * if i % 2 == 0 { 1.0 } else { -1.0 };
    }
    x[160] = -0.0;
    for (i, v) in x[192..224].iter_mut().enumerate() {
        *v = (i as f32 - 16.0) + 0.5;
    }
    x[224] = f32::MAX;
    x[225] = f32::MIN;
    let bits = |a: &QuantActs| {
        (
            a.q.clone(),
            a.q8.clone(),
            a.sum16.clone(),
            a.d.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
            a.dsum.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
        )
    };
    for a in SCHEMES {
        let want = bits(&QuantActs::new(a, 3, k, |i| x[i]));
        assert_eq!(bits(&QuantActs::from_f32(a, 3, k, &x)), want);
        let bf: Vec<u16> = x.iter().map(|v| (v.to_bits() >> 16) as u16).collect();
        let want = bits(&QuantActs::new(a, 3, k, |i| {
            f32::from_bits((bf[i] as u32) << 16)
        }));
        assert_eq!(bits(&QuantActs::from_bf16_bits(a, 3, k, &bf)), want);
    }
}

#[test]
fn int8_activations_are_llama_cpps_q8_0_blocks() {
    // d = max|x| / 127 per 32 values, q = x / d rounded, q8 and the sums of
    // 16 the same integers.
    let mut rng = Rng(5);
    let k = 32 * 5;
    let x = random_acts(2, k, &mut rng);
    let acts = QuantActs::new(ActQuant::Int8, 2, k, |i| x[i]);
    for b in 0..2 * k / 32 {
        let blk = &x[32 * b..32 * b + 32];
        let amax = blk.iter().fold(0.0f32, |m, v| m.max(v.abs()));
        assert_eq!(acts.d[b], amax / 127.0);
        for (i, v) in blk.iter().enumerate() {
            let q = acts.q[32 * b + i];
            assert!(q.abs() <= 127);
            assert!((*v as f64 - acts.d[b] as f64 * q as f64).abs() <= acts.d[b] as f64 * 0.5001);
            assert_eq!(acts.q8[32 * b + i] as i16, q);
        }
        for h in 0..2 {
            let s: i32 = (0..16).map(|i| acts.q[32 * b + 16 * h + i] as i32).sum();
            assert_eq!(acts.sum16[2 * b + h], s);
        }
    }
}

#[test]
fn panels_give_the_portable_bits_at_batch_sizes() {
    // The few-rows tiles and the many-rows path at every row count up to 17
    // and the ones batches run (partial tiles of 6 rows, of 4 output groups
    // and of the 16-output panel groups: 77 outputs, and 32 in whole
    // groups), every format, both activation schemes, every variant.
    let mut rng = Rng(0x51);
    for t in QuantType::ALL {
        for n in [77, 32] {
            let k = if t.block_values() == 256 { 512 } else { 320 };
            let (data, scales) = random_weight(t, n, k, &mut rng);
            let w = QuantWeight::new(t, n, k, &data, &scales).unwrap();
            let x = random_acts(256, k, &mut rng);
            for (rows, a) in (1..=17)
                .chain([23, 64, 256])
                .flat_map(|r| SCHEMES.map(|a| (r, a)))
            {
                let acts = QuantActs::new(a, rows, k, |i| x[i]);
                let want = project(w, &acts, Variant::Portable, 1);
                for v in VARIANTS.available() {
                    let got = project(w, &acts, v, 2);
                    assert!(
                        got.iter()
                            .zip(&want)
                            .all(|(a, b)| a.to_bits() == b.to_bits()),
                        "{t:?} {a:?} {} at {rows} rows, {n} outputs: bits differ from \
                         the portable kernel's",
                        v.name()
                    );
                }
            }
        }
    }
}

/// The formats with a panel layout.
const PANEL_FORMATS: [QuantType; 8] = [
    QuantType::Q4_0,
    QuantType::Q4_1,
    QuantType::Q5_0,
    QuantType::Q5_1,
    QuantType::Q8_0,
    QuantType::Q4K,
    QuantType::Q5K,
    QuantType::Q6K,
];

/// `k` for the panel tests: `k32` (32-value formats) or a multiple of 256
/// of about the same sub-block count (k-quants: 256-value blocks).
fn panel_k(t: QuantType, k32: usize) -> usize {
    if t.block_values() == 256 {
        k32.div_ceil(256) * 256
    } else {
        k32
    }
}

#[test]
fn repacked_panels_unpack_to_the_files_rows() {
    let mut rng = Rng(0x7a);
    for t in PANEL_FORMATS {
        for (n, k) in [(1, 32), (15, 64), (16, 320), (17, 96), (77, 320)] {
            let k = panel_k(t, k);
            let (data, _) = random_weight(t, n, k, &mut rng);
            let panels = repack::repack(t, n, k, &data).unwrap();
            assert_eq!(panels.len(), n.div_ceil(16) * 16 * t.row_bytes(k));
            let w = QuantWeight::panels(t, n, k, &panels).unwrap();
            let all: Vec<usize> = (0..n).collect();
            assert_eq!(repack::unpack_rows(&w, &all), data, "{t:?} [{n}, {k}]");
            let some = [n - 1, 0, n / 2];
            let rb = t.row_bytes(k);
            let want: Vec<u8> = some
                .iter()
                .flat_map(|&r| data[r * rb..(r + 1) * rb].iter().copied())
                .collect();
            assert_eq!(repack::unpack_rows(&w, &some), want, "{t:?} rows {some:?}");
        }
    }
}

#[test]
fn repacking_refuses_other_formats_and_sizes_by_name() {
    let err = repack::repack(QuantType::Q4K, 2, 288, &[0; 2 * 162]).unwrap_err();
    assert!(err.contains("Q4_K") && err.contains("256"), "{err}");
    let err = repack::repack(QuantType::Q4_0, 2, 64, &[0; 10]).unwrap_err();
    assert!(err.contains("Q4_0") && err.contains("72"), "{err}");
    let err = QuantWeight::panels(QuantType::Q4_0, 17, 64, &[0; 17 * 36]).unwrap_err();
    assert!(
        err.contains("panels") && err.contains(&(32 * 36).to_string()),
        "{err}"
    );
    let err = QuantWeight::panels(QuantType::Q6K, 17, 256, &[0; 17 * 210]).unwrap_err();
    assert!(
        err.contains("Q6_K") && err.contains(&(32 * 210).to_string()),
        "{err}"
    );
    let err = QuantWeight::panels(QuantType::Int8, 16, 256, &[0; 16 * 256]).unwrap_err();
    assert!(err.contains("int8") && err.contains("panel"), "{err}");
}

#[test]
fn panel_weights_give_the_portable_bits_of_the_files_rows() {
    // Every row count up to 17 and the ones batches run, output counts in
    // whole 16-output groups and off them (a partial group, a partial tile
    // of 4 groups, items of 64 outputs and a tail), K in whole and partial
    // steps of 8 sub-blocks (k-quants: one and several 256-value blocks),
    // both activation schemes, every variant (the AVX-512 VNNI panel kernel
    // on int8, the portable kernel otherwise).
    let mut rng = Rng(0x9a);
    for t in PANEL_FORMATS {
        for (n, k) in [(77, 320), (32, 256), (5, 96), (130, 544)] {
            let k = panel_k(t, k);
            let (data, _) = random_weight(t, n, k, &mut rng);
            let rows_w = QuantWeight::new(t, n, k, &data, &[]).unwrap();
            let panels = repack::repack(t, n, k, &data).unwrap();
            let w = QuantWeight::panels(t, n, k, &panels).unwrap();
            let x = random_acts(256, k, &mut rng);
            for (rows, a) in (1..=17)
                .chain([23, 64, 256])
                .flat_map(|r| SCHEMES.map(|a| (r, a)))
            {
                let acts = QuantActs::new(a, rows, k, |i| x[i]);
                let want = project(rows_w, &acts, Variant::Portable, 1);
                for v in VARIANTS.available() {
                    for threads in [1, 2] {
                        let got = project(w, &acts, v, threads);
                        assert!(
                            got.iter()
                                .zip(&want)
                                .all(|(a, b)| a.to_bits() == b.to_bits()),
                            "{t:?} {a:?} {} panels at {rows} rows, [{n}, {k}], {threads} \
                             thread(s): bits differ from the portable kernel's on the rows",
                            v.name()
                        );
                    }
                }
            }
        }
    }
}
