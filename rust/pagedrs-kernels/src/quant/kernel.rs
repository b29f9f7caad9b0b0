//! The kernels' variants (AMX, AVX-512 VNNI, AVX2, portable; the shared
//! `cpu_features::Variant`) and the item kernel (`item::ItemFn`) of each. Every variant
//! computes each output in the same operations (module docs of `quant`), so
//! they give identical bits, whatever the rows, tiles or lanes.

use super::act::ActQuant;
#[cfg(target_arch = "x86_64")]
use super::avx2;
use super::format::{Layout, QuantType};
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

/// The item kernel of a weight of `qtype` in `layout` on activations
/// quantized as `scheme`, in `variant`. Panel weights (`Layout::Panels`)
/// run the AVX-512 VNNI panel kernel on int8 activations in the AVX-512
/// VNNI and AMX variants, the portable kernel otherwise (the same bits).
///
/// Panics if this CPU does not run the variant.
pub(crate) fn item(variant: Variant, qtype: QuantType, layout: Layout, scheme: ActQuant) -> ItemFn {
    assert!(
        VARIANTS.has(variant) && variant.runs_here(),
        "this CPU does not run the quantized kernels' {} variant",
        variant.name()
    );
    if layout == Layout::Panels {
        #[cfg(target_arch = "x86_64")]
        if scheme == ActQuant::Int8 && matches!(variant, Variant::Avx512Vnni | Variant::AmxInt8) {
            return avx2::packed_item_fn(qtype);
        }
        let _ = scheme;
        return portable::item;
    }
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
