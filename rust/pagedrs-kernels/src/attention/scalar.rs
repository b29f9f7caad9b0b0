//! The portable passes of the per-head kernel, for any `head_dim`, compiled
//! as they are (`portable`) or for AVX2 + FMA (`avx2`).

use super::cache::HeadQuery;
use super::format::{widen_rows, KvElem};
use super::math::{axpy, dot};
use super::passes::{drive, split_rows, Isa};
use super::tile::{block_range, Tile};

/// The plain-loop passes that LLVM vectorizes, for any `head_dim`: each
/// block's entries widened to floats once (`widen_rows`: in place for
/// `f32`), `dot` and `axpy` over them; compiled as they are (`portable`)
/// or for AVX2 + FMA (`avx2`), with the same operations.
pub(crate) struct Scalar<const AVX2: bool>;

impl<E: KvElem, const AVX2: bool> Isa<E> for Scalar<AVX2> {
    const NAME: &'static str = if AVX2 { "avx2" } else { "portable" };
    const UNIT: usize = 0;
    const FMA: bool = false;
    type State<'s> = &'s mut [f32];
    type Keys<'a> = &'a [f32];

    fn detected() -> bool {
        !AVX2 || crate::cpu_features::avx2_fma()
    }

    unsafe fn tile<const N: usize>(t: Tile<E>, scratch: &mut Vec<f32>) {
        #[cfg(target_arch = "x86_64")]
        if AVX2 {
            // SAFETY: forwarded from the caller (AVX2 and FMA detected).
            return unsafe { drive_avx2::<E>(t, scratch) };
        }
        // SAFETY: forwarded from the caller.
        unsafe { drive::<Self, E, 0>(t, scratch) }
    }

    unsafe fn prepare<'s, const N: usize>(
        t: &Tile<E>,
        scratch: &'s mut Vec<f32>,
        scores: usize,
    ) -> (&'s mut [f32], &'s mut [f32]) {
        split_rows(&t.caches, scratch, scores)
    }

    #[inline(always)]
    unsafe fn keys<'a, const N: usize>(
        rows: &'a mut &mut [f32],
        t: &Tile<'a, E>,
        b: usize,
    ) -> &'a [f32] {
        widen_rows(t.block(t.caches.key, b), t.caches.shape.head_dim, rows)
    }

    #[inline(always)]
    unsafe fn scores<const N: usize>(
        keys: &&[f32],
        _: usize,
        query: &HeadQuery,
        qg: &[f32],
        skip: usize,
        row: &mut [f32],
    ) {
        let d = qg.len();
        for (s, k) in row.iter_mut().zip(keys[skip * d..].chunks_exact(d)) {
            *s = query.scale * dot(qg, k);
        }
    }

    #[inline(always)]
    unsafe fn values<const N: usize>(rows: &mut [f32], t: Tile<E>, scores: &[f32], off: &[usize]) {
        let (d, bs) = (t.caches.shape.head_dim, t.caches.shape.block_size);
        for b in block_range(t.queries, bs) {
            let values = widen_rows(t.block(t.caches.value, b), d, rows);
            for (i, query) in t.queries.iter().enumerate() {
                let Some((skip, n, at)) = query.visible(b, bs) else {
                    continue;
                };
                let (span, at) = (query.span(), off[i] + at);
                // SAFETY: query `i`'s output (caller).
                let o = unsafe { t.out.row(i) };
                for (j, v) in values[skip * d..].chunks_exact(d).take(n).enumerate() {
                    for (g, og) in o.chunks_exact_mut(d).enumerate() {
                        axpy(og, scores[at + g * span + j], v);
                    }
                }
            }
        }
    }
}

/// The scalar passes compiled for AVX2 + FMA (8-wide vectors).
///
/// # Safety
/// As `Isa::tile`; the CPU must support AVX2 and FMA.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn drive_avx2<E: KvElem>(t: Tile<E>, scratch: &mut Vec<f32>) {
    // SAFETY: forwarded from the caller.
    unsafe { drive::<Scalar<true>, E, 0>(t, scratch) }
}
