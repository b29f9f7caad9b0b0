//! The passes of the per-head kernel (`passes::drive`) in AVX-512 intrinsics,
//! for head dimensions 64 and 128 (`D16` vectors of 16 floats per row),
//! over caches of any `KvElem` format: each block's entries are widened to
//! floats once, 16 at a time (`KvElem::load16`: bfloat16 by a shift, int8 by
//! a sign extension and its entry's scale, fp8 through the half-precision
//! converter), into a scratch block that every query head of the group then
//! reads from L1; float32 entries are read in place.
//!
//! The same three passes as the portable ones (`scalar::Scalar`), over the
//! same visible tokens and with the same score normalization, arranged so the vector registers do the work: in the score pass the scaled
//! query head stays in registers, each key row costs `D16` fused
//! multiply-adds into its own accumulator, and the accumulators of up to 16
//! rows are summed together by one transposing tree (`hsum16`: 45 shuffles
//! and adds for 16 scores, where 16 horizontal sums take about twice that);
//! the value pass is `avx512_values`. Each block's rows are prefetched one block ahead, since the
//! next block sits at an unrelated address.

use std::arch::x86_64::{_mm512_loadu_ps, _mm512_mul_ps, _mm512_set1_ps, _mm512_setzero_ps};

use super::avx512_ops::{dots16, store_sums, widen_rows16};
use super::avx512_values::value_pass_tile;
use super::cache::HeadQuery;
use super::format::KvElem;
use super::passes::{drive, split_rows, Isa};
use super::tile::Tile;

/// Whether this CPU runs the AVX-512 variants (AVX-512F, with AVX2 and F16C
/// for the fp8 widening).
pub(crate) fn detected() -> bool {
    crate::cpu_features::avx512f()
}

/// AVX-512 passes over caches of any format (`N = D16`: 16 floats a vector).
pub(crate) struct Avx512;

impl<E: KvElem> Isa<E> for Avx512 {
    const NAME: &'static str = "avx512";
    const UNIT: usize = 16;
    type State<'s> = &'s mut [f32];
    type Keys<'a> = &'a [f32];

    fn detected() -> bool {
        detected()
    }

    #[target_feature(enable = "avx512f,avx2,f16c")]
    unsafe fn tile<const D16: usize>(t: Tile<E>, scratch: &mut Vec<f32>) {
        // SAFETY: forwarded from the caller.
        unsafe { drive::<Self, E, D16>(t, scratch) }
    }

    unsafe fn prepare<'s, const D16: usize>(
        t: &Tile<E>,
        scratch: &'s mut Vec<f32>,
        scores: usize,
    ) -> (&'s mut [f32], &'s mut [f32]) {
        split_rows(&t.caches, scratch, scores)
    }

    /// The block's keys widened to floats once (`widen_rows16`).
    #[inline(always)]
    unsafe fn keys<'a, const D16: usize>(
        rows: &'a mut &mut [f32],
        t: &Tile<'a, E>,
        b: usize,
    ) -> &'a [f32] {
        // SAFETY: the caller runs with the features `widen_rows16` needs.
        unsafe { widen_rows16::<D16, E>(t.block(t.caches.key, b), rows) }
    }

    /// The scaled query head stays in registers; each key row costs `D16`
    /// fused multiply-adds into its own accumulator, and the accumulators
    /// of up to 16 rows are summed together (`dots16`, `store_sums`).
    #[inline(always)]
    unsafe fn scores<const D16: usize>(
        keys: &&[f32],
        _: usize,
        query: &HeadQuery,
        qg: &[f32],
        skip: usize,
        row: &mut [f32],
    ) {
        let (d, scale) = (16 * D16, _mm512_set1_ps(query.scale));
        let mut qv = [_mm512_setzero_ps(); D16];
        for (c, v) in qv.iter_mut().enumerate() {
            // SAFETY: `qg` holds `d = 16 * D16` floats.
            *v = _mm512_mul_ps(scale, unsafe { _mm512_loadu_ps(qg.as_ptr().add(16 * c)) });
        }
        let keys = &keys[skip * d..(skip + row.len()) * d];
        for (out16, keys16) in row.chunks_mut(16).zip(keys.chunks(16 * d)) {
            // SAFETY: `keys16` holds `out16.len()` rows of `d` floats; the
            // caller runs with AVX-512F.
            unsafe { store_sums(out16, &dots16::<D16>(&qv, keys16, out16.len()), None) };
        }
    }

    #[inline(always)]
    unsafe fn values<const D16: usize>(
        rows: &mut [f32],
        t: Tile<E>,
        scores: &[f32],
        off: &[usize],
    ) {
        // SAFETY: forwarded from the caller.
        unsafe { value_pass_tile::<D16, E>(t, scores, off, rows) };
    }
}
