//! The gathered LoRA product against a float64 reference, and its
//! invariance: a token's bits alone and in a mixed batch, in every variant.

use super::*;
use crate::cpu_features::Variant;

/// A deterministic pseudo-random float in [-1, 1).
fn value(i: usize, salt: u64) -> f32 {
    let mut z = (i as u64)
        .wrapping_add(salt)
        .wrapping_mul(0x9E37_79B9_7F4A_7C15);
    z ^= z >> 31;
    z = z.wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z ^= z >> 29;
    ((z >> 40) as f32 / (1u64 << 23) as f32) - 1.0
}

struct Case {
    k: usize,
    n: usize,
    r: usize,
    ranks: Vec<i32>,
    scalings: Vec<f32>,
    a: Vec<f32>,
    b: Vec<f32>,
}

impl Case {
    fn new(k: usize, n: usize, r: usize, ranks: Vec<i32>) -> Self {
        let l = ranks.len();
        let scalings = (0..l).map(|i| 0.5 + i as f32).collect();
        let a = (0..l * r * k).map(|i| value(i, 1)).collect();
        let b = (0..l * n * r).map(|i| value(i, 2)).collect();
        Self {
            k,
            n,
            r,
            ranks,
            scalings,
            a,
            b,
        }
    }

    fn run(&self, x: &[f32], slots: &[i32], out: &mut [f32], variant: Variant, threads: usize) {
        let args = LoraArgs {
            x,
            slots,
            a: &self.a,
            b: &self.b,
            ranks: &self.ranks,
            scalings: &self.scalings,
            t: slots.len(),
            k: self.k,
            n: self.n,
            r: self.r,
            l: self.ranks.len(),
        };
        lora_add(&args, out, self.n, 0, variant, threads).unwrap();
    }

    /// float64 `scaling * B (A x)` of one token.
    fn reference(&self, x: &[f32], slot: usize) -> Vec<f64> {
        let (k, n, r) = (self.k, self.n, self.r);
        let rank = self.ranks[slot] as usize;
        let a = &self.a[slot * r * k..];
        let b = &self.b[slot * n * r..];
        let h: Vec<f64> = (0..rank)
            .map(|j| (0..k).map(|i| x[i] as f64 * a[j * k + i] as f64).sum())
            .collect();
        (0..n)
            .map(|o| {
                let s: f64 = (0..rank).map(|j| h[j] * b[o * rank + j] as f64).sum();
                s * self.scalings[slot] as f64
            })
            .collect()
    }
}

#[test]
fn equals_the_reference_and_leaves_base_rows_alone() {
    let case = Case::new(67, 29, 16, vec![8, 16, 3]);
    let slots = [0, 0, 1, -1, 2, 2, 2, 0, 1, -1, 1];
    let t = slots.len();
    let x: Vec<f32> = (0..t * case.k).map(|i| value(i, 3)).collect();
    let base: Vec<f32> = (0..t * case.n).map(|i| value(i, 4)).collect();
    let mut out = base.clone();
    case.run(&x, &slots, &mut out, VARIANTS.best(), 2);
    for (tok, &s) in slots.iter().enumerate() {
        let row = &out[tok * case.n..(tok + 1) * case.n];
        let before = &base[tok * case.n..(tok + 1) * case.n];
        if s < 0 {
            assert_eq!(row, before);
            continue;
        }
        let want = case.reference(&x[tok * case.k..(tok + 1) * case.k], s as usize);
        for j in 0..case.n {
            let got = (row[j] - before[j]) as f64;
            assert!(
                (got - want[j]).abs() < 1e-4 * (1.0 + want[j].abs()),
                "{got} vs {}",
                want[j]
            );
        }
    }
}

#[test]
fn a_token_has_the_same_bits_alone_and_in_any_batch_and_variant() {
    let case = Case::new(40, 21, 8, vec![8, 4, 8, 1]);
    let t = 37;
    let slots: Vec<i32> = (0..t).map(|i| ((i * 7) % 5) as i32 - 1).collect();
    let x: Vec<f32> = (0..t * case.k).map(|i| value(i, 5)).collect();
    let mut batch = vec![0.0; t * case.n];
    case.run(&x, &slots, &mut batch, VARIANTS.best(), 2);
    for v in VARIANTS.available() {
        let mut again = vec![0.0; t * case.n];
        case.run(&x, &slots, &mut again, v, 1);
        assert_eq!(again, batch, "variant {}", v.name());
    }
    for tok in 0..t {
        let mut alone = vec![0.0; case.n];
        let row = &x[tok * case.k..(tok + 1) * case.k];
        case.run(row, &slots[tok..tok + 1], &mut alone, Variant::Portable, 1);
        assert_eq!(alone, batch[tok * case.n..(tok + 1) * case.n]);
    }
}

#[test]
fn bad_shapes_are_refused_naming_the_array() {
    let case = Case::new(8, 4, 2, vec![2]);
    let args = LoraArgs {
        x: &[0.0; 8],
        slots: &[1],
        a: &case.a,
        b: &case.b,
        ranks: &case.ranks,
        scalings: &case.scalings,
        t: 1,
        k: 8,
        n: 4,
        r: 2,
        l: 1,
    };
    let mut out = [0.0; 4];
    let err = lora_add(&args, &mut out, 4, 0, Variant::Portable, 1).unwrap_err();
    assert!(err.contains("token slot 1"), "{err}");
    let err = lora_add(
        &LoraArgs {
            slots: &[0],
            ..args
        },
        &mut out,
        4,
        1,
        Variant::Portable,
        1,
    )
    .unwrap_err();
    assert!(err.contains("out holds"), "{err}");
}
