//! The tile kernel's variants (AVX2 + FMA, portable; the shared
//! `cpu_features::Variant`) and the tile kernel of each (`tile_math::TileFn`).
//! Every variant computes each output in the same operations (module docs of
//! `dense`), so they give identical bits and a tile's shape does not change
//! any output.

#[cfg(target_arch = "x86_64")]
use super::avx2;
use super::portable;
use super::tile_math::TileFn;
use crate::cpu_features::{Variant, Variants};

/// The variants of the dense kernel, fastest first.
pub const VARIANTS: Variants = Variants(&[Variant::Avx2, Variant::Portable]);

/// The tile kernel of `variant`.
///
/// Panics if the family has no such variant or this CPU does not run it.
pub(crate) fn tile(variant: Variant) -> TileFn {
    assert!(
        VARIANTS.has(variant) && variant.runs_here(),
        "this CPU does not run the dense kernel's {} variant",
        variant.name()
    );
    match variant {
        #[cfg(target_arch = "x86_64")]
        Variant::Avx2 => avx2::tile,
        _ => portable::tile,
    }
}
