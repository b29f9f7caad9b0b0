//! The tile kernel's variants (AVX-512 VNNI, AVX2, portable), the choice
//! among those this CPU runs, and the kernel's signature: a tile of up to
//! `MAX_R` activation rows by `MAX_C` weight rows. Every variant computes
//! each output in the same operations (module docs of `quant`), so they
//! give identical bits and a tile's shape does not change any output.

use super::act::QuantActs;
#[cfg(target_arch = "x86_64")]
use super::avx2;
use super::format::{QuantType, QuantWeight};
use super::portable;
use std::ops::Range;

/// Activation rows per tile.
pub(crate) const MAX_R: usize = 4;
/// Weight rows (outputs) per tile.
pub(crate) const MAX_C: usize = 2;

/// Outputs `[row][output]` of a tile.
pub(crate) type TileOut = [[f32; MAX_C]; MAX_R];

/// `(weight, outputs, acts, rows, write)`: every output of `outputs` for
/// every row of `rows`, in tiles of `MAX_R` rows by `MAX_C` outputs, handed
/// to `write(row, output, value)`.
pub(crate) type ItemFn =
    fn(&QuantWeight, Range<usize>, &QuantActs, Range<usize>, &mut dyn FnMut(usize, usize, f32));

/// A compiled variant of the kernels.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Variant {
    /// AVX-512 VNNI (`vpdpbusd` on 256-bit vectors) with AVX2.
    Avx512Vnni,
    /// AVX2 + FMA + F16C (`vpmaddubsw`, `vpmaddwd`).
    Avx2,
    /// Plain Rust, any CPU.
    Portable,
}

impl Variant {
    pub const ALL: [Variant; 3] = [Variant::Avx512Vnni, Variant::Avx2, Variant::Portable];

    pub fn name(self) -> &'static str {
        match self {
            Variant::Avx512Vnni => "avx512_vnni",
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
            Variant::Avx2 => crate::cpu_features::avx2_fma_f16c(),
            Variant::Avx512Vnni => crate::cpu_features::avx512_vnni(),
        }
    }

    /// The item kernel of `qtype` in this variant.
    ///
    /// Panics if this CPU does not run the variant.
    pub(crate) fn item(self, qtype: QuantType) -> ItemFn {
        assert!(self.runs_here(), "this CPU does not run {}", self.name());
        match self {
            Variant::Portable => portable::item,
            #[cfg(target_arch = "x86_64")]
            Variant::Avx2 => avx2::item_fn(qtype, false),
            #[cfg(target_arch = "x86_64")]
            Variant::Avx512Vnni => avx2::item_fn(qtype, true),
            #[cfg(not(target_arch = "x86_64"))]
            _ => unreachable!("{qtype:?}"),
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
