//! The x86 kernels: each format's sub-blocks decoded in AVX2 (`decode`: 32
//! integers in one vector, widened to two vectors of 16 int16) and their
//! products with the int16 activations by `vpmaddwd` (AVX2) or `vpdpwssd`
//! (AVX-512 VNNI) into exact int32 sums. Few rows run in `few`'s tiles
//! (lanes over K, reduced per sub-block), more in `many`'s panel path
//! (`panel`: outputs in the lanes; AVX-512 VNNI tiles in `wide` and, on
//! int8 activations, `wide8`; AMX tiles in `amx`).

mod amx;
mod decode;
mod few;
mod fill512;
mod many;
mod packed;
mod packed5;
mod packed_k;
mod panel;
mod wide;
mod wide8;

use std::ops::Range;

use super::act::QuantActs;
use super::format::{QuantType, QuantWeight};
use super::item::ItemFn;
use decode::{INT8, Q4K, Q4_0, Q4_1, Q5K, Q5_0, Q5_1, Q6K, Q8_0};

/// Outputs `outputs` by rows `rows` (`item::ItemFn`): up to `few::rows`
/// rows in `few`'s tiles, more in `many::item_many` (AMX tiles with `AMX`).
#[inline(always)]
unsafe fn item<const T: u8, const VNNI: bool, const AMX: bool>(
    w: &QuantWeight,
    outputs: Range<usize>,
    acts: &QuantActs,
    rows: Range<usize>,
    write: &mut dyn FnMut(usize, usize, &[f32]),
) {
    assert!(outputs.end <= w.n && rows.end <= acts.rows);
    assert_eq!(w.k, acts.k, "weight and activations of different features");
    if rows.len() > few::rows(T) {
        many::item_many::<T, VNNI, AMX>(w, outputs, acts, rows, write)
    } else if !rows.is_empty() {
        few::item_few::<T, VNNI>(w, outputs, acts, rows, write)
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn item_avx2<const T: u8>(
    w: &QuantWeight,
    outputs: Range<usize>,
    acts: &QuantActs,
    rows: Range<usize>,
    write: &mut dyn FnMut(usize, usize, &[f32]),
) {
    item::<T, false, false>(w, outputs, acts, rows, write)
}

#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn item_vnni<const T: u8>(
    w: &QuantWeight,
    outputs: Range<usize>,
    acts: &QuantActs,
    rows: Range<usize>,
    write: &mut dyn FnMut(usize, usize, &[f32]),
) {
    item::<T, true, false>(w, outputs, acts, rows, write)
}

#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn item_amx<const T: u8>(
    w: &QuantWeight,
    outputs: Range<usize>,
    acts: &QuantActs,
    rows: Range<usize>,
    write: &mut dyn FnMut(usize, usize, &[f32]),
) {
    item::<T, true, true>(w, outputs, acts, rows, write)
}

/// The instruction sets of an item kernel.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Isa {
    Avx2,
    Vnni,
    Amx,
}

fn checked<const T: u8, const ISA: u8>(
    w: &QuantWeight,
    outputs: Range<usize>,
    acts: &QuantActs,
    rows: Range<usize>,
    write: &mut dyn FnMut(usize, usize, &[f32]),
) {
    // SAFETY: handed out by `item_fn`, which `kernel::Variant::item` calls
    // only for a variant this CPU runs (AVX2 + FMA + F16C; AVX-512 VNNI;
    // AMX-INT8 with the tile state granted).
    unsafe {
        match ISA {
            2 => item_amx::<T>(w, outputs, acts, rows, write),
            1 => item_vnni::<T>(w, outputs, acts, rows, write),
            _ => item_avx2::<T>(w, outputs, acts, rows, write),
        }
    }
}

fn for_isa<const ISA: u8>(qtype: QuantType) -> ItemFn {
    match qtype {
        QuantType::Q4_0 => checked::<Q4_0, ISA>,
        QuantType::Q4_1 => checked::<Q4_1, ISA>,
        QuantType::Q5_0 => checked::<Q5_0, ISA>,
        QuantType::Q5_1 => checked::<Q5_1, ISA>,
        QuantType::Q8_0 => checked::<Q8_0, ISA>,
        QuantType::Q4K => checked::<Q4K, ISA>,
        QuantType::Q5K => checked::<Q5K, ISA>,
        QuantType::Q6K => checked::<Q6K, ISA>,
        QuantType::Int8 => checked::<INT8, ISA>,
    }
}

/// The most rows `qtype`'s items run in the few-rows tiles (more run the
/// many-rows path).
pub(crate) fn few_rows(qtype: QuantType) -> usize {
    few::rows(match qtype {
        QuantType::Q4_0 => Q4_0,
        QuantType::Q4_1 => Q4_1,
        QuantType::Q5_0 => Q5_0,
        QuantType::Q5_1 => Q5_1,
        QuantType::Q8_0 => Q8_0,
        QuantType::Q4K => Q4K,
        QuantType::Q5K => Q5K,
        QuantType::Q6K => Q6K,
        QuantType::Int8 => INT8,
    })
}

/// The item kernel of `qtype` in `isa`. Only for a CPU that runs it
/// (`cpu_features::avx2_fma_f16c`, `avx512_vnni`, `amx_int8`).
pub(crate) fn item_fn(qtype: QuantType, isa: Isa) -> ItemFn {
    match isa {
        Isa::Amx => for_isa::<2>(qtype),
        Isa::Vnni => for_isa::<1>(qtype),
        Isa::Avx2 => for_isa::<0>(qtype),
    }
}

#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn item_packed<const T: u8>(
    w: &QuantWeight,
    outputs: Range<usize>,
    acts: &QuantActs,
    rows: Range<usize>,
    write: &mut dyn FnMut(usize, usize, &[f32]),
) {
    packed::item_packed::<T>(w, outputs, acts, rows, write)
}

fn checked_packed<const T: u8>(
    w: &QuantWeight,
    outputs: Range<usize>,
    acts: &QuantActs,
    rows: Range<usize>,
    write: &mut dyn FnMut(usize, usize, &[f32]),
) {
    // SAFETY: handed out by `packed_item_fn`, which `kernel::item` calls
    // only for the AVX-512 VNNI and AMX variants, on a CPU that runs them.
    unsafe { item_packed::<T>(w, outputs, acts, rows, write) }
}

/// The panel kernel of `qtype` on int8 activations (`packed`: Q4_0, Q4_1,
/// Q5_0, Q5_1, Q8_0; `packed_k`: Q4_K, Q5_K, Q6_K). Only for a CPU that runs
/// AVX-512 VNNI.
pub(crate) fn packed_item_fn(qtype: QuantType) -> ItemFn {
    match qtype {
        QuantType::Q4_0 => checked_packed::<Q4_0>,
        QuantType::Q4_1 => checked_packed::<Q4_1>,
        QuantType::Q5_0 => checked_packed::<Q5_0>,
        QuantType::Q5_1 => checked_packed::<Q5_1>,
        QuantType::Q8_0 => checked_packed::<Q8_0>,
        QuantType::Q4K | QuantType::Q5K | QuantType::Q6K => packed_k::item_fn(qtype),
        t => unreachable!("{} has no panel layout", t.name()),
    }
}
