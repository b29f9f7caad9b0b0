//! Float32 dense projections `y = x W^T (+ b)` on the CPU whose outputs are
//! batch-invariant: an output's bits depend on its activation row and its
//! weight row alone.
//!
//! `x` is `[M, K]`, `W` `[N, K]` (torch's `nn.Linear` layout, read in
//! place), both row-major float32. The arithmetic of output `(m, n)`, the
//! same in every variant, tile shape, thread split and row count:
//! - 8 float32 lanes, lane `l` accumulating `x[m, k] * W[n, k]` over
//!   `k = l, l + 8, ...` below `K8 = K - K % 8` in increasing `k`, each
//!   step one fused multiply-add (one rounding);
//! - the lanes summed in one fixed tree
//!   (`((l0 + l4) + (l2 + l6)) + ((l1 + l5) + (l3 + l7))`, `tile_math::hsum8`);
//! - the tail `k = K8..K` added in order, one fused multiply-add each;
//! - the bias, when given, added last (one rounding).
//!
//! Work is split over the outputs (and over rows), never over `K`, so the
//! thread count does not change a sum either. `kernel::VARIANTS` lists the
//! variants (AVX2 + FMA, portable); they give identical bits.
//!
//! Error bound (tests): each lane is a recursive sum of at most
//! `ceil(K / 8)` fused products, the tree adds 3 levels and the tail at
//! most 7 more additions, so with `u = 2^-24` and `L = ceil(K / 8) + 10`
//! the result differs from the exact dot product by at most
//! `gamma(L) * sum_k |x_k w_k|` with `gamma(L) = L u / (1 - L u)`
//! (Higham, *Accuracy and Stability of Numerical Algorithms*, §3.1), plus
//! half an ulp of the result for the bias addition.

#[cfg(target_arch = "x86_64")]
mod avx2;
mod driver;
mod kernel;
mod portable;
#[cfg(test)]
mod tests;
mod tile_math;

pub use crate::cpu_features::Variant;
pub use driver::{run_dense, DenseArgs};
pub use kernel::VARIANTS;
// The tile kernel and thread rule the LoRA kernel (`crate::lora`) shares.
pub(crate) use driver::threads_for;
pub(crate) use kernel::tile;
pub(crate) use tile_math::{TileFn, MAX_C, MAX_R};
