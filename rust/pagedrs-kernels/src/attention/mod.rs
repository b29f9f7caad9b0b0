//! Paged attention on the CPU: the decode kernel of PagedAttention (§4.1) that
//! reads each sequence's keys and values in place, block by block, through its
//! block table — no gathered copy of the context, no padding to the longest
//! sequence of the batch — in any of the KV cache formats (`format`:
//! float32, bfloat16, fp8, int8 with per-token, per-head scales).

#[cfg(target_arch = "x86_64")]
mod avx512;
#[cfg(target_arch = "x86_64")]
mod avx512_bf16;
#[cfg(target_arch = "x86_64")]
mod avx512_int8;
#[cfg(target_arch = "x86_64")]
mod avx512_int8_values;
#[cfg(target_arch = "x86_64")]
mod avx512_ops;
#[cfg(target_arch = "x86_64")]
mod avx512_values;
mod cache;
mod convert;
mod format;
#[cfg(test)]
mod format_tests;
mod kernel;
mod math;
pub(crate) mod omp;
pub mod paged_decode;
mod passes;
mod scalar;
#[cfg(test)]
mod tests;
mod tile;

pub use cache::{write_kv, CacheShape, KvInput};
pub use convert::{bf16_to_f32, f32_to_bf16};
pub use format::{Bf16, Fp8E4m3, Fp8E5m2, KvElem, Q8};
pub use paged_decode::{paged_decode_attention, DecodeJob, DecodeOptions};
pub use tile::query_tiles;
