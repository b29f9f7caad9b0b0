//! The kernels' variants (AMX, AVX-512 VNNI, AVX2, portable; the shared
//! `cpu_features::Variant`) and the item kernel (`item::ItemFn`) of each. Every variant
//! computes each output in the same operations (module docs of `quant`), so
//! they give identical bits, whatever the rows, tiles or lanes.

#[cfg(target_arch = "x86_64")]
use super::avx2;
use super::format::QuantType;
use super::item::ItemFn;
use super::portable;
use crate::cpu_features::{Variant, Variants};

/// The variants of the quantized kernels, fastest first.
pub const VARIANTS: Variants = Variants(&[
    Variant::AmxInt8,
    Variant::Avx512Vnni,
    Variant::Avx2,
    Variant::Portable,
]);

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
        Variant::Avx2 => avx2::item_fn(qtype, avx2::Isa::Avx2),
        #[cfg(target_arch = "x86_64")]
        Variant::Avx512Vnni => avx2::item_fn(qtype, avx2::Isa::Vnni),
        #[cfg(target_arch = "x86_64")]
        Variant::AmxInt8 => avx2::item_fn(qtype, avx2::Isa::Amx),
        #[cfg(not(target_arch = "x86_64"))]
        _ => unreachable!("{qtype:?}"),
    }
}

/// The most rows an item of `qtype` runs in `variant`'s few-rows tiles
/// (more run its many-rows path; the portable variant has one path).
pub(crate) fn few_rows(variant: Variant, qtype: QuantType) -> usize {
    match variant {
        Variant::Portable => usize::MAX,
        #[cfg(target_arch = "x86_64")]
        _ => avx2::few_rows(qtype),
        #[cfg(not(target_arch = "x86_64"))]
        _ => unreachable!("{qtype:?}"),
    }
}
