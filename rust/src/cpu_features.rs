//! The instruction-set extensions the CPU kernels choose among at run time
//! (attention, KV cache writes, quantized projections), each a named set
//! checked in one place. `std::arch`'s detection caches what `cpuid` says,
//! so each call is a few loads.
//!
//! Every function is false on other architectures.

/// AVX2 with FMA (the attention kernels' `avx2` variant).
pub fn avx2_fma() -> bool {
    #[cfg(target_arch = "x86_64")]
    return is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma");
    #[cfg(not(target_arch = "x86_64"))]
    return false;
}

/// AVX2, FMA and F16C (the quantized projections' `avx2` variant: float16
/// block scales by `vcvtph2ps`).
pub fn avx2_fma_f16c() -> bool {
    #[cfg(target_arch = "x86_64")]
    return avx2_fma() && is_x86_feature_detected!("f16c");
    #[cfg(not(target_arch = "x86_64"))]
    return false;
}

/// AVX-512F with AVX2 and F16C (the attention kernels' `avx512` variant;
/// F16C for the fp8 widening).
pub fn avx512f() -> bool {
    #[cfg(target_arch = "x86_64")]
    return is_x86_feature_detected!("avx512f")
        && is_x86_feature_detected!("avx2")
        && is_x86_feature_detected!("f16c");
    #[cfg(not(target_arch = "x86_64"))]
    return false;
}

/// `avx512f` with AVX-512BW (byte and word lanes: the int8 and fp8 KV
/// cache writes).
pub fn avx512bw() -> bool {
    #[cfg(target_arch = "x86_64")]
    return avx512f() && is_x86_feature_detected!("avx512bw");
    #[cfg(not(target_arch = "x86_64"))]
    return false;
}

/// `avx512bw` with AVX-512VL, AVX-512 VNNI (`vpdpwssd`) and FMA: the
/// int8 KV cache attention kernel and the quantized projections'
/// `avx512_vnni` variant (`vpdpwssd` on 256-bit vectors).
pub fn avx512_vnni() -> bool {
    #[cfg(target_arch = "x86_64")]
    return avx512bw()
        && avx2_fma_f16c()
        && is_x86_feature_detected!("avx512vl")
        && is_x86_feature_detected!("avx512vnni");
    #[cfg(not(target_arch = "x86_64"))]
    return false;
}

/// `avx512f` with AVX-512 BF16 (`vdpbf16ps`: the bfloat16 attention kernel).
pub fn avx512_bf16() -> bool {
    #[cfg(target_arch = "x86_64")]
    return avx512f() && is_x86_feature_detected!("avx512bf16");
    #[cfg(not(target_arch = "x86_64"))]
    return false;
}

#[cfg(test)]
mod tests {
    /// Each wider set implies the narrower ones it is built on.
    #[test]
    fn the_sets_nest() {
        use super::*;
        assert!(!avx2_fma_f16c() || avx2_fma());
        assert!(!avx512bw() || avx512f());
        assert!(!avx512_vnni() || (avx512bw() && avx2_fma_f16c()));
        assert!(!avx512_bf16() || avx512f());
    }
}
