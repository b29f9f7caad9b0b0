//! pagedrs scheduler layer: the paged KV cache manager and the
//! continuous-batching scheduler of PagedAttention (Kwon et al., SOSP 2023),
//! and the speculative decoding proposers the scheduler drafts from.
//!
//! Safe Rust without SIMD intrinsics or Python: the CPU kernels are in
//! `pagedrs-kernels`, the Python bindings (`pagedrs._core`) in `pagedrs-py`.

#![forbid(unsafe_code)]

pub mod kv_cache;
pub mod scheduler;
pub mod spec_decode;
