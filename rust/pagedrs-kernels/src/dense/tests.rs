//! Tests of the dense kernel: every variant this CPU runs against a float64
//! reference within the bound of the module docs, the variants' bits against
//! the portable kernel's, and batch invariance (a row's bits alone and inside
//! batches, at any position and thread count).

use super::driver::{run_dense, DenseArgs};
use super::kernel::VARIANTS;
use crate::cpu_features::Variant;
use crate::test_data::Rng;

fn project(
    x: &[f32],
    w: &[f32],
    bias: Option<&[f32]>,
    (m, n, k): (usize, usize, usize),
    variant: Variant,
    threads: usize,
) -> Vec<f32> {
    let mut out = vec![f32::NAN; m * n];
    let args = DenseArgs {
        x,
        weight: w,
        bias,
        m,
        n,
        k,
    };
    run_dense(&args, &mut out, variant, threads);
    out
}

const SHAPES: [(usize, usize); 7] = [
    (1, 1),
    (7, 1),
    (8, 5),
    (13, 3),
    (576, 17),
    (100, 64),
    (33, 200),
];

#[test]
fn every_variant_is_within_the_error_bound_of_float64() {
    let mut rng = Rng(7);
    for &(k, n) in &SHAPES {
        let m = 6;
        let (x, w, b) = (rng.vec(m * k), rng.vec(n * k), rng.vec(n));
        for variant in VARIANTS.available() {
            for bias in [None, Some(&b[..])] {
                let out = project(&x, &w, bias, (m, n, k), variant, 2);
                let u = f64::from(f32::EPSILON) / 2.0;
                let l = (k.div_ceil(8) + 10) as f64;
                let gamma = l * u / (1.0 - l * u);
                for r in 0..m {
                    for j in 0..n {
                        let (xr, wj) = (&x[r * k..(r + 1) * k], &w[j * k..(j + 1) * k]);
                        let dot: f64 = xr
                            .iter()
                            .zip(wj)
                            .map(|(&a, &c)| f64::from(a) * f64::from(c))
                            .sum();
                        let abs: f64 = xr
                            .iter()
                            .zip(wj)
                            .map(|(&a, &c)| (f64::from(a) * f64::from(c)).abs())
                            .sum();
                        let bj = bias.map_or(0.0, |b| f64::from(b[j]));
                        let exact = dot + bj;
                        let got = f64::from(out[r * n + j]);
                        // The bias addition rounds once more: half an ulp of |s + b|.
                        let bound = gamma * abs
                            + u * ((1.0 + gamma) * abs + bj.abs())
                                * f64::from(u8::from(bias.is_some()));
                        assert!(
                            (got - exact).abs() <= bound,
                            "{variant:?} k={k} n={n} ({r}, {j}): {got} vs {exact}, bound {bound}"
                        );
                    }
                }
            }
        }
    }
}

#[test]
fn every_variant_gives_the_portable_bits() {
    let mut rng = Rng(11);
    for &(k, n) in &SHAPES {
        let m = 9;
        let (x, w, b) = (rng.vec(m * k), rng.vec(n * k), rng.vec(n));
        let want = project(&x, &w, Some(&b), (m, n, k), Variant::Portable, 1);
        for variant in VARIANTS.available() {
            let got = project(&x, &w, Some(&b), (m, n, k), variant, 2);
            assert_eq!(
                got.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                want.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                "{variant:?} k={k} n={n}"
            );
        }
    }
}

#[test]
fn a_row_has_the_same_bits_alone_and_in_any_batch() {
    let mut rng = Rng(3);
    for &(k, n) in &[(13usize, 7usize), (576, 50), (100, 1)] {
        let row = rng.vec(k);
        let (w, b) = (rng.vec(n * k), rng.vec(n));
        for variant in VARIANTS.available() {
            let alone = project(&row, &w, Some(&b), (1, n, k), variant, 1);
            for m in [2usize, 3, 4, 5, 8, 9, 17, 64, 65, 130] {
                let mut x = rng.vec(m * k);
                let at = (rng.next() % m as u64) as usize;
                x[at * k..(at + 1) * k].copy_from_slice(&row);
                for threads in [1, 2, 3] {
                    let out = project(&x, &w, Some(&b), (m, n, k), variant, threads);
                    let got = &out[at * n..(at + 1) * n];
                    assert!(
                        got.iter()
                            .zip(&alone)
                            .all(|(a, c)| a.to_bits() == c.to_bits()),
                        "{variant:?} k={k} n={n} m={m} at {at} threads={threads}"
                    );
                }
            }
        }
    }
}

#[test]
fn empty_projections_write_nothing() {
    for variant in VARIANTS.available() {
        assert!(project(&[], &[1.0; 4], None, (0, 2, 2), variant, 2).is_empty());
        assert!(project(&[1.0; 4], &[], None, (2, 0, 2), variant, 2).is_empty());
        // k = 0: every sum is empty.
        assert_eq!(
            project(&[], &[], Some(&[1.5, 2.0]), (3, 2, 0), variant, 1),
            vec![1.5, 2.0, 1.5, 2.0, 1.5, 2.0]
        );
    }
}

#[test]
fn thread_splits_do_not_change_bits() {
    // Large enough for `threads_for` to use every thread it is given.
    let (m, n, k) = (130, 300, 601);
    let mut rng = Rng(5);
    let (x, w, b) = (rng.vec(m * k), rng.vec(n * k), rng.vec(n));
    let want = project(&x, &w, Some(&b), (m, n, k), VARIANTS.best(), 1);
    for variant in VARIANTS.available() {
        for threads in [2, 3, 4] {
            let got = project(&x, &w, Some(&b), (m, n, k), variant, threads);
            assert!(
                got.iter()
                    .zip(&want)
                    .all(|(a, c)| a.to_bits() == c.to_bits()),
                "{variant:?} threads={threads}"
            );
        }
    }
}

#[test]
fn small_calls_run_on_one_thread_large_ones_on_all() {
    use super::driver::threads_for;
    assert_eq!(threads_for(1, 1536, 576, 16), 1);
    assert_eq!(threads_for(1, 49152, 576, 2), 2);
    assert_eq!(threads_for(256, 1536, 576, 2), 2);
    assert_eq!(threads_for(0, 0, 0, 8), 1);
}
