//! The tile kernel's variants (AVX2 + FMA, portable), the choice among those
//! this CPU runs, and the kernel's signature: a tile of up to `MAX_R`
//! activation rows by `MAX_C` weight rows. Every variant computes each output
//! in the same operations (module docs of `dense`), so they give identical
//! bits and a tile's shape does not change any output.

#[cfg(target_arch = "x86_64")]
use super::avx2;
use super::portable;

/// Activation rows per tile.
pub(crate) const MAX_R: usize = 4;
/// Weight rows (outputs) per tile.
pub(crate) const MAX_C: usize = 3;

/// Outputs `[row][output]` of a tile.
pub(crate) type TileOut = [[f32; MAX_C]; MAX_R];

/// `(x, w, k, nr, nc)`: the `nr` x `nc` tile of sums (no bias) of the `nr`
/// activation rows at `x` by the `nc` weight rows at `w`, rows `k` floats
/// apart (`nr <= MAX_R`, `nc <= MAX_C`).
///
/// Callers guarantee `x` holds `nr * k` and `w` `nc * k` readable floats.
pub(crate) type TileFn = unsafe fn(*const f32, *const f32, usize, usize, usize) -> TileOut;

/// A compiled variant of the kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Variant {
    /// AVX2 + FMA (256-bit vectors, 8 lanes).
    Avx2,
    /// Plain Rust, any CPU (`f32::mul_add`, the same 8 lanes).
    Portable,
}

impl Variant {
    pub const ALL: [Variant; 2] = [Variant::Avx2, Variant::Portable];

    pub fn name(self) -> &'static str {
        match self {
            Variant::Avx2 => "avx2",
            Variant::Portable => "portable",
        }
    }

    /// The variant named `name`, if this CPU runs it.
    pub fn parse(name: &str) -> Option<Variant> {
        Self::available().into_iter().find(|v| v.name() == name)
    }

    /// The variants this CPU runs, fastest first.
    pub fn available() -> Vec<Variant> {
        Self::ALL.into_iter().filter(|v| v.runs_here()).collect()
    }

    /// The fastest variant this CPU runs.
    pub fn best() -> Variant {
        Self::available()[0]
    }

    fn runs_here(self) -> bool {
        match self {
            Variant::Portable => true,
            #[cfg(target_arch = "x86_64")]
            Variant::Avx2 => crate::cpu_features::avx2_fma(),
            #[cfg(not(target_arch = "x86_64"))]
            Variant::Avx2 => false,
        }
    }

    /// The tile kernel of this variant.
    ///
    /// Panics if this CPU does not run the variant.
    pub(crate) fn tile(self) -> TileFn {
        assert!(self.runs_here(), "this CPU does not run {}", self.name());
        match self {
            Variant::Portable => portable::tile,
            #[cfg(target_arch = "x86_64")]
            Variant::Avx2 => avx2::tile,
            #[cfg(not(target_arch = "x86_64"))]
            Variant::Avx2 => unreachable!(),
        }
    }
}

/// The names of the variants this CPU runs, fastest first.
pub fn variant_names() -> Vec<&'static str> {
    Variant::available()
        .into_iter()
        .map(Variant::name)
        .collect()
}

/// The fixed-order sum of 8 lanes every variant uses:
/// `((l0 + l4) + (l2 + l6)) + ((l1 + l5) + (l3 + l7))`.
#[inline(always)]
pub(crate) fn hsum8(l: &[f32; 8]) -> f32 {
    let s = [l[0] + l[4], l[1] + l[5], l[2] + l[6], l[3] + l[7]];
    (s[0] + s[2]) + (s[1] + s[3])
}

/// The tail `k8..k` of one output, added in order to `s` by fused
/// multiply-adds (every variant's last step before the bias).
///
/// # Safety
/// `x` and `w` hold `k` readable floats.
#[inline(always)]
pub(crate) unsafe fn tail(x: *const f32, w: *const f32, k8: usize, k: usize, mut s: f32) -> f32 {
    for i in k8..k {
        s = (*x.add(i)).mul_add(*w.add(i), s);
    }
    s
}
