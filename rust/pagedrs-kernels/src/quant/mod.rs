//! Projections on quantized weights (`y = x W^T`) on the CPU, reading the
//! weights in their GGUF blocks (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K,
//! Q6_K, as the file stores them, ggml's `ggml-common.h` layouts) or as int8
//! with one scale per output channel, never as a float copy.
//!
//! The arithmetic, the same in every variant and at every row count:
//! - each activation row is quantized per block of 32 values with one
//!   float32 scale (`act`: `d = max|x| / q_max`, `q = round(x * q_max /
//!   max|x|)`), once per call, to int16 (`q_max = 32767`, the exact option)
//!   or int8 (`q_max = 127`, llama.cpp's Q8_0 blocks: `ActQuant`);
//! - each weight row is read as sub-blocks of 32 values (`blocks`): 32
//!   integers `q`, a float32 scale per scale group (one group of 32; Q6_K:
//!   two groups of 16, each scale `d * sc` with its int8 `sc`) and, for the
//!   formats with a minimum (Q4_1, Q5_1, Q4_K, Q5_K), an offset, so that
//!   `w = scale * q + min`;
//! - per output, per sub-block and scale group in ascending order: the
//!   exact int32 sum `isum` of the group's integer products (at most 32 x
//!   128 x 32767 < 2^31; Q6_K 16 x 32 x 32767), then one fused
//!   multiply-add `acc = fma(isum as f32, scale * d, acc)` (the product
//!   `scale * d` rounded to float32 first); the minimum terms
//!   `macc = fma(min, d * sum(q_x), macc)` in their own accumulator, also in
//!   ascending sub-block order, added at the end (`acc + macc`, those formats only).
//!
//! The integer sums are exact, so the lanes they are formed in do not
//! matter: the few-rows path sums lanes over K and reduces them exactly per
//! sub-block, the many-rows path puts outputs in the lanes (`avx2`). On
//! int8 activations the AVX-512 VNNI many-rows tile runs `vpdpbusd` on the
//! weights made unsigned bytes (`q + offset`), its sums started at
//! `-offset * sum(x)`: the same exact integers.
//!
//! So an output's bits depend on its row and weight row alone: not on the
//! number of rows in the call, the row's place, the tile it ran in, the
//! thread, or the instruction set (`kernel::variants`: AVX-512 VNNI, AVX2,
//! portable give identical bits).

mod act;
#[cfg(target_arch = "x86_64")]
mod avx2;
mod blocks;
mod driver;
mod format;
mod item;
mod kernel;
mod moe;
mod portable;
#[doc(hidden)]
pub mod random;
pub mod repack;
mod repack5;
mod repack_k;
#[cfg(test)]
mod tests;

pub use crate::cpu_features::Variant;
pub use act::{ActQuant, QuantActs};
pub use blocks::dequantize;
pub use driver::{run_projection, run_projections, Part, Projection};
pub use format::{Layout, QuantType, QuantWeight};
pub use kernel::VARIANTS;
pub use moe::{run_experts, silu, silu_mul, sleef_expf, ExpertStacks};
