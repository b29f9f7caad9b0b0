//! pagedrs CPU kernels: PagedAttention's decode kernel over a paged KV cache
//! in every KV cache format (`attention`), projections on quantized weights
//! (`quant`), batch-invariant float32 projections (`dense`), gathered LoRA
//! products (`lora`), the element-wise steps around the projections
//! (`elementwise`: rotary embedding), and the detection of
//! the instruction sets they pick from (`cpu_features`).
//!
//! The SIMD (AVX2, AVX-512, AMX) code and its `unsafe` live here; each
//! kernel has a portable variant giving the same bits. The scheduler is in
//! `pagedrs-sched`, the Python bindings (`pagedrs._core`) in `pagedrs-py`.

pub mod attention;
pub mod cpu_features;
pub mod dense;
pub mod elementwise;
pub mod lora;
pub mod quant;
#[doc(hidden)]
pub mod test_data;
