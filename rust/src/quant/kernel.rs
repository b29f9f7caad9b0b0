//! The kernels' variants (AVX-512 VNNI, AVX2, portable; the shared
//! `cpu_features::Variant`), the item kernel of each, and the signature of
//! a tile: up to `MAX_R` activation rows by `MAX_C` weight rows. Every
//! variant computes each output in the same operations (module docs of
//! `quant`), so they give identical bits and a tile's shape does not
//! change any output.

use super::act::QuantActs;
#[cfg(target_arch = "x86_64")]
use super::avx2;
use super::format::{QuantType, QuantWeight};
use super::portable;
use crate::cpu_features::{Variant, Variants};
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

/// The variants of the quantized kernels, fastest first.
pub const VARIANTS: Variants = Variants(&[Variant::Avx512Vnni, Variant::Avx2, Variant::Portable]);

/// The item kernel of `qtype` in `variant`.
///
/// Panics if this CPU does not run the variant.
pub(crate) fn item(variant: Variant, qtype: QuantType) -> ItemFn {
    assert!(
        VARIANTS.has(variant) && variant.runs_here(),
        "this CPU does not run the quantized kernels' {} variant",
        variant.name()
    );
    match variant {
        Variant::Portable => portable::item,
        #[cfg(target_arch = "x86_64")]
        Variant::Avx2 => avx2::item_fn(qtype, false),
        #[cfg(target_arch = "x86_64")]
        Variant::Avx512Vnni => avx2::item_fn(qtype, true),
        #[cfg(not(target_arch = "x86_64"))]
        _ => unreachable!("{qtype:?}"),
    }
}

/// The fixed-order sum of 8 lanes every variant uses:
/// `((l0 + l4) + (l2 + l6)) + ((l1 + l5) + (l3 + l7))`.
#[inline(always)]
pub(crate) fn hsum8(l: &[f32; 8]) -> f32 {
    let s = [l[0] + l[4], l[1] + l[5], l[2] + l[6], l[3] + l[7]];
    (s[0] + s[2]) + (s[1] + s[3])
}
