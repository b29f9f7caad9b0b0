//! Paged attention on the CPU: the decode kernel of PagedAttention (§4.1) that
//! reads each sequence's keys and values in place, block by block, through its
//! block table — no gathered copy of the context, no padding to the longest
//! sequence of the batch.

#[cfg(target_arch = "x86_64")]
mod avx512;
mod cache;
mod kernel;
mod math;
mod omp;
pub mod paged_decode;
pub(crate) mod python;
#[cfg(test)]
mod tests;

pub use cache::{write_kv, CacheShape};
pub use paged_decode::{paged_decode_attention, DecodeJob, DecodeOptions};
