//! The choice among the per-head kernel's variants (`passes::Isa`) this CPU
//! runs: the format's own (the int8 integer kernel, the AVX-512 BF16 dot
//! products for bfloat16 queries), AVX-512, AVX2, portable, each compiled for
//! the head dimension. A single query is a tile of one (`single`).

#[cfg(target_arch = "x86_64")]
use std::any::Any;

#[cfg(target_arch = "x86_64")]
use super::avx512::Avx512;
#[cfg(target_arch = "x86_64")]
use super::avx512_bf16::Avx512Bf16;
#[cfg(target_arch = "x86_64")]
use super::avx512_int8::Vnni;
use super::cache::{Caches, HeadQuery};
use super::format::KvElem;
#[cfg(target_arch = "x86_64")]
use super::format::{Bf16, Q8};
use super::passes::Isa;
use super::scalar::Scalar;
use super::tile::{Tile, TileFn, TileOut};

/// A compiled variant of the per-head kernel for caches of `E` entries.
pub(crate) type AttendFn<E> = fn(HeadQuery, Caches<E>, &mut [f32], &mut Vec<f32>);

/// A kernel variant this CPU runs: its name, its tile kernel, and the same
/// kernel for one query (a tile of one; the tests run each variant so).
#[cfg_attr(not(test), allow(dead_code))]
pub(crate) struct Variant<E> {
    pub(crate) name: &'static str,
    pub(crate) tile: TileFn<E>,
    pub(crate) single: AttendFn<E>,
}

/// `I`'s variant for `head_dim` when this CPU runs it, `I` takes the
/// queries, and `head_dim` is one it is compiled for (64 or 128; any for
/// `UNIT == 0`).
pub(crate) fn variant<E: KvElem, I: Isa<E>>(
    head_dim: usize,
    bf16_query: bool,
) -> Option<Variant<E>> {
    if !(I::detected() && I::takes(bf16_query)) {
        return None;
    }
    match I::UNIT {
        0 => Some(compile::<E, I, 0>()),
        16 => match head_dim {
            64 => Some(compile::<E, I, 4>()),
            128 => Some(compile::<E, I, 8>()),
            _ => None,
        },
        _ => match head_dim {
            64 => Some(compile::<E, I, 2>()),
            128 => Some(compile::<E, I, 4>()),
            _ => None,
        },
    }
}

/// `I`'s variant for `N` vectors a row.
fn compile<E: KvElem, I: Isa<E>, const N: usize>() -> Variant<E> {
    Variant {
        name: I::NAME,
        tile: I::tile::<N>,
        single: single::<E, I, N>,
    }
}

/// `I`'s kernel for one query: a tile of one.
fn single<E: KvElem, I: Isa<E>, const N: usize>(
    query: HeadQuery,
    caches: Caches<E>,
    out: &mut [f32],
    scratch: &mut Vec<f32>,
) {
    // SAFETY: handed out by `variant` only after `I::detected()`, for a
    // `head_dim` of `N * I::UNIT` values; a tile of one writes `out` only.
    let (queries, out) = (&[query], TileOut::single(out));
    unsafe {
        I::tile::<N>(
            Tile {
                queries,
                caches,
                out,
            },
            scratch,
        )
    }
}

/// The kernel variant of the format `E` alone, ahead of the generic ones,
/// when this CPU, `head_dim` and the queries (`bf16_query`: bfloat16 values)
/// allow it: the AVX-512 BF16 dot products for bfloat16 caches, the integer
/// kernel (AVX-512 VNNI) for int8 ones; none for the other formats.
fn native<E: KvElem>(head_dim: usize, bf16_query: bool) -> Option<Variant<E>> {
    #[cfg(target_arch = "x86_64")]
    {
        // `found` is an `Option<Variant<Bf16>>` exactly when `E` is `Bf16`
        // (likewise `Q8`): the format's own kernel is chosen by its type,
        // a check each `E`'s copy of this function settles when compiled.
        let mut found: Option<Variant<E>> = None;
        let slot: &mut dyn Any = &mut found;
        if let Some(slot) = slot.downcast_mut::<Option<Variant<Bf16>>>() {
            *slot = variant::<Bf16, Avx512Bf16>(head_dim, bf16_query);
        } else if let Some(slot) = slot.downcast_mut::<Option<Variant<Q8>>>() {
            *slot = variant::<Q8, Vnni>(head_dim, bf16_query);
        }
        found
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (head_dim, bf16_query);
        None
    }
}

/// The kernel variants this CPU runs for caches of `E` entries with
/// `head_dim` values, fastest first: the format's own (`native`:
/// the int8 integer kernel, the AVX-512 BF16 dot products for bfloat16
/// queries), AVX-512, AVX2, portable.
pub(crate) fn compiled<E: KvElem>(head_dim: usize, bf16_query: bool) -> Vec<Variant<E>> {
    let mut found = Vec::new();
    found.extend(native::<E>(head_dim, bf16_query));
    #[cfg(target_arch = "x86_64")]
    found.extend(variant::<E, Avx512>(head_dim, bf16_query));
    found.extend(variant::<E, Scalar<true>>(head_dim, bf16_query));
    found.extend(variant::<E, Scalar<false>>(head_dim, bf16_query));
    found
}

/// `compiled`'s variants by name, each for one query.
#[cfg(test)]
pub(crate) fn variants<E: KvElem>(
    head_dim: usize,
    bf16_query: bool,
) -> Vec<(&'static str, AttendFn<E>)> {
    let found = compiled::<E>(head_dim, bf16_query);
    found.into_iter().map(|v| (v.name, v.single)).collect()
}

/// The tile kernel of the fastest variant `compiled` lists.
pub(crate) fn tile_variant<E: KvElem>(head_dim: usize, bf16_query: bool) -> Option<TileFn<E>> {
    compiled::<E>(head_dim, bf16_query).first().map(|v| v.tile)
}
