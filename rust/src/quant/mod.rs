//! Projections on quantized weights (`y = x W^T`) on the CPU, reading the
//! weights in their GGUF blocks (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K,
//! Q6_K, as the file stores them, ggml's `ggml-common.h` layouts) or as int8
//! with one scale per output channel, never as a float copy.
//!
//! The arithmetic, the same in every variant and at every row count:
//! - each activation row is quantized per block of 32 values to int16 with
//!   one float32 scale (`act`: `d = max|x| / 32767`, `q = round(x * 32767 /
//!   max|x|)`), once per call;
//! - each weight row is read as sub-blocks of 32 values (`blocks`): 32
//!   integers `q`, one float32 scale (Q6_K: its 16-value groups' int8
//!   scales multiplied into `q`, the scale its block's `d`) and, for the
//!   formats with a minimum (Q4_1, Q5_1, Q4_K, Q5_K), an offset, so that
//!   `w = scale * q + min`;
//! - per sub-block the integer products land in 8 int32 lanes (lane `j`:
//!   values `2j, 2j + 1` of each half of 16; exact), each lane is converted
//!   to float32 and added with one fused multiply-add by `scale * d` into
//!   its own float32 accumulator, and `min * d * sum(q_x)` into a scalar
//!   one; at the end the 8 lanes are summed in one fixed tree and the
//!   scalar added.
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
mod kernel;
mod portable;
#[doc(hidden)]
pub mod random;
#[cfg(test)]
mod tests;

pub use crate::cpu_features::Variant;
pub use act::QuantActs;
pub use driver::{run_projection, Part};
pub use format::{QuantType, QuantWeight};
pub use kernel::VARIANTS;
