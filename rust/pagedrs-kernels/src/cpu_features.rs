//! The instruction-set extensions the CPU kernels choose among at run time
//! (attention, KV cache writes, dense and quantized projections), each a
//! named set checked in one place, and `Variant`, the one type by which a
//! kernel family names the sets it is compiled for (`Variants`: a family's
//! list, fastest first). `std::arch`'s detection caches what `cpuid` says,
//! so each call is a few loads.
//!
//! Every detection function is false on other architectures.

/// An instruction set a kernel family is compiled for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Variant {
    /// AMX-TILE and AMX-INT8 (`tdpbsud` on 16 x 64-byte tiles) with the
    /// tile state granted by the kernel, and everything `Avx512Vnni` has
    /// (`amx_int8`).
    AmxInt8,
    /// AVX-512 VNNI (`vpdpwssd`) with AVX-512 BW/VL, AVX2, FMA and F16C
    /// (`avx512_vnni`).
    Avx512Vnni,
    /// AVX2 with FMA and F16C (`avx2_fma_f16c`).
    Avx2,
    /// Plain Rust, any CPU.
    Portable,
}

impl Variant {
    /// The name the Python API and the benchmarks use ("amx_int8",
    /// "avx512_vnni", "avx2", "portable").
    pub fn name(self) -> &'static str {
        match self {
            Variant::AmxInt8 => "amx_int8",
            Variant::Avx512Vnni => "avx512_vnni",
            Variant::Avx2 => "avx2",
            Variant::Portable => "portable",
        }
    }

    /// Whether this CPU runs it.
    pub fn runs_here(self) -> bool {
        match self {
            Variant::AmxInt8 => amx_int8(),
            Variant::Avx512Vnni => avx512_vnni(),
            Variant::Avx2 => avx2_fma_f16c(),
            Variant::Portable => true,
        }
    }
}

/// The variants one kernel family is compiled for, fastest first (the
/// portable one last: every family has it).
#[derive(Clone, Copy, Debug)]
pub struct Variants(pub &'static [Variant]);

impl Variants {
    /// Those this CPU runs, fastest first.
    pub fn available(self) -> Vec<Variant> {
        self.0.iter().copied().filter(|v| v.runs_here()).collect()
    }

    /// The fastest this CPU runs.
    pub fn best(self) -> Variant {
        self.available()
            .first()
            .copied()
            .unwrap_or(Variant::Portable)
    }

    /// The one named `name`, if the family has it and this CPU runs it.
    pub fn parse(self, name: &str) -> Option<Variant> {
        self.available().into_iter().find(|v| v.name() == name)
    }

    /// The names of those this CPU runs, fastest first.
    pub fn names(self) -> Vec<&'static str> {
        self.available().into_iter().map(Variant::name).collect()
    }

    /// Whether the family has `v` (whatever this CPU runs).
    pub fn has(self, v: Variant) -> bool {
        self.0.contains(&v)
    }
}

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

/// `avx512_vnni` with AMX-TILE and AMX-INT8 (CPUID leaf 7: EDX bits 24
/// and 25), the tile state enabled by the OS (XCR0 bits 17-18) and granted
/// to this process (`arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)`,
/// Linux >= 5.16; asked for once). False where any is missing, so the
/// kernels fall back to `avx512_vnni`.
pub fn amx_int8() -> bool {
    #[cfg(all(target_arch = "x86_64", target_os = "linux"))]
    {
        static GRANTED: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
        avx512_vnni() && *GRANTED.get_or_init(amx_granted)
    }
    #[cfg(not(all(target_arch = "x86_64", target_os = "linux")))]
    false
}

#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
fn amx_granted() -> bool {
    use std::arch::x86_64::{__cpuid, __cpuid_count, _xgetbv};
    const ARCH_REQ_XCOMP_PERM: libc::c_long = 0x1023;
    const XFEATURE_XTILEDATA: libc::c_long = 18;
    // SAFETY: CPUID leaf 0 is always there; leaf 7 and XGETBV only where
    // it says so (max leaf >= 7, OSXSAVE: leaf 1 ECX bit 27).
    let (tile, int8, os) = unsafe {
        if __cpuid(0).eax < 7 || __cpuid(1).ecx >> 27 & 1 == 0 {
            return false;
        }
        let l7 = __cpuid_count(7, 0);
        (
            l7.edx >> 24 & 1 == 1,
            l7.edx >> 25 & 1 == 1,
            _xgetbv(0) >> 17 & 3 == 3,
        )
    };
    // SAFETY: a plain system call; a kernel without it answers an error.
    tile && int8
        && os
        && unsafe {
            libc::syscall(
                libc::SYS_arch_prctl,
                ARCH_REQ_XCOMP_PERM,
                XFEATURE_XTILEDATA,
            )
        } == 0
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
        assert!(!amx_int8() || avx512_vnni());
    }

    #[test]
    fn a_family_offers_what_it_has_and_this_cpu_runs() {
        use super::{Variant, Variants};
        let family = Variants(&[Variant::Avx512Vnni, Variant::Portable]);
        assert_eq!(family.available().last(), Some(&Variant::Portable));
        assert_eq!(family.parse("avx2"), None, "not in the family");
        assert_eq!(family.parse("portable"), Some(Variant::Portable));
        let vnni = Variant::Avx512Vnni.runs_here();
        assert_eq!(family.parse("avx512_vnni").is_some(), vnni);
        assert_eq!(family.best() == Variant::Avx512Vnni, vnni);
        assert_eq!(family.names().len(), family.available().len());
    }
}
