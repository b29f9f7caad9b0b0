//! Small vectorizable helpers of the CPU attention kernels: dot product,
//! `axpy`, a fast `exp`, softmax and cache prefetch. Written so that LLVM
//! vectorizes them for whatever target features the caller is compiled with.

/// Dot product with sixteen independent accumulators, so LLVM vectorizes it.
#[inline(always)]
pub(crate) fn dot(a: &[f32], b: &[f32]) -> f32 {
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
pub(crate) fn axpy(acc: &mut [f32], w: f32, v: &[f32]) {
    for (a, x) in acc.iter_mut().zip(v) {
        *a += w * x;
    }
}

/// `exp(x)` for `x <= 0` with plain float and bit operations, so a loop over
/// it vectorizes: `2^n * p(r)`, `x = n ln2 + r`, `|r| <= ln2 / 2`, `p` the
/// degree-6 Taylor polynomial (relative error < 2e-7). Inputs below -87 give
/// about `exp(-87)`, which underflows any softmax weight anyway.
#[inline(always)]
pub(crate) fn exp_nonpositive(x: f32) -> f32 {
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

/// `exp(x)` for `x <= 0` evaluated with fused multiply-adds, for callers
/// compiled with FMA (where `mul_add` is one instruction; elsewhere it is a
/// slow library call): `2^n * p(r)` as `exp_nonpositive`, `p` Cephes'
/// `expf` polynomial `1 + r + r^2 P(r)` (`P` of degree 5; relative error
/// < 2e-7), half the operations of the Taylor form's separate multiplies and
/// adds, in a shorter dependency chain.
#[inline(always)]
pub(crate) fn exp_nonpositive_fma(x: f32) -> f32 {
    const LOG2E: f32 = std::f32::consts::LOG2_E;
    const LN2_HI: f32 = 0.693_359_4;
    const LN2_LO: f32 = -2.121_944_4e-4;
    const ROUND: f32 = 12_582_912.0;
    const P: [f32; 6] = [
        1.987_569_1e-4,
        1.398_2e-3,
        8.333_452e-3,
        4.166_579_6e-2,
        0.166_666_65,
        0.5,
    ];
    let x = x.max(-87.0);
    let t = x.mul_add(LOG2E, ROUND);
    let n = t - ROUND;
    let r = n.mul_add(-LN2_LO, n.mul_add(-LN2_HI, x));
    let mut p = P[0];
    for c in &P[1..] {
        p = p.mul_add(r, *c);
    }
    let y = p.mul_add(r * r, r) + 1.0;
    let exponent = (t.to_bits() as i32 - ROUND.to_bits() as i32) + 127;
    y * f32::from_bits((exponent as u32) << 23)
}

/// `exp_nonpositive_fma` when `FMA`, else `exp_nonpositive`.
#[inline(always)]
fn exp_of<const FMA: bool>(x: f32) -> f32 {
    if FMA {
        exp_nonpositive_fma(x)
    } else {
        exp_nonpositive(x)
    }
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

/// The largest of `init` and `xs` (NaN-free input) with sixteen lanes, so
/// the loop vectorizes (a fold over `f32::max` does not).
#[inline(always)]
fn max_of(xs: &[f32], init: f32) -> f32 {
    let mut acc = [init; 16];
    let (chunks, rest) = xs.as_chunks::<16>();
    for c in chunks {
        for i in 0..16 {
            acc[i] = if c[i] > acc[i] { c[i] } else { acc[i] };
        }
    }
    let lanes = acc.iter().copied().fold(init, f32::max);
    rest.iter().copied().fold(lanes, f32::max)
}

/// In-place `row = softmax(row)`; `FMA` picks the exponential
/// (`exp_nonpositive_fma`, for callers compiled with FMA).
#[inline(always)]
pub(crate) fn softmax<const FMA: bool>(row: &mut [f32]) {
    let max = max_of(row, f32::NEG_INFINITY);
    row.iter_mut().for_each(|s| *s = exp_of::<FMA>(*s - max));
    let inv = 1.0 / sum(row);
    row.iter_mut().for_each(|s| *s *= inv);
}

/// In-place softmax of `row` extended by one more logit `sink`, whose
/// weight is dropped: `row_t = exp(row_t) / (exp(sink) + sum exp(row))`.
#[inline(always)]
pub(crate) fn softmax_with_sink<const FMA: bool>(row: &mut [f32], sink: f32) {
    let max = max_of(row, sink);
    row.iter_mut().for_each(|s| *s = exp_of::<FMA>(*s - max));
    let inv = 1.0 / (sum(row) + exp_of::<FMA>(sink - max));
    row.iter_mut().for_each(|s| *s *= inv);
}

/// Ask the CPU to start loading `data` into cache, one 64-byte line at a time
/// (the next block is at a random address, beyond the reach of the hardware
/// prefetcher).
#[inline(always)]
pub(crate) fn prefetch<T>(data: &[T]) {
    #[cfg(target_arch = "x86_64")]
    {
        let base = data.as_ptr() as *const i8;
        for at in (0..std::mem::size_of_val(data)).step_by(64) {
            // SAFETY: `base + at` lies inside `data`; prefetching is a hint
            // and SSE is part of the x86_64 baseline.
            unsafe {
                std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(base.add(at))
            };
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = data;
}

#[cfg(test)]
mod tests {
    use super::*;

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
    fn fused_exp_matches_std() {
        for i in 0..=20_000 {
            let x = -(i as f32) * 0.00435;
            let (want, got) = (x.exp(), exp_nonpositive_fma(x));
            assert!(
                (want - got).abs() <= 3e-7 * want,
                "exp({x}) = {want} vs {got}"
            );
        }
    }

    #[test]
    fn softmax_sums_to_one() {
        let mut row: Vec<f32> = (0..37).map(|i| (i as f32 * 0.7).sin() * 5.0).collect();
        let want: Vec<f32> = {
            let m = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            let e: Vec<f32> = row.iter().map(|x| (x - m).exp()).collect();
            let z: f32 = e.iter().sum();
            e.iter().map(|x| x / z).collect()
        };
        let mut fused = row.clone();
        softmax::<false>(&mut row);
        softmax::<true>(&mut fused);
        for ((a, b), c) in want.iter().zip(&row).zip(&fused) {
            assert!((a - b).abs() < 1e-6, "{a} vs {b}");
            assert!((a - c).abs() < 1e-6, "{a} vs {c}");
        }
    }
}
