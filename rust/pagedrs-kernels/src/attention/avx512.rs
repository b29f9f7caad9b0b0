//! The passes of the per-head kernel (`kernel::drive`) in AVX-512 intrinsics,
//! for head dimensions 64 and 128 (`D16` vectors of 16 floats per row),
//! over caches of any `KvElem` format: each block's entries are widened to
//! floats once, 16 at a time (`KvElem::load16`: bfloat16 by a shift, int8 by
//! a sign extension and its entry's scale, fp8 through the half-precision
//! converter), into a scratch block that every query head of the group then
//! reads from L1; float32 entries are read in place.
//!
//! The same three passes as the portable ones (`kernel::Scalar`), over the
//! same visible tokens and with the same score normalization, arranged so the vector registers do the work: in the score pass the scaled
//! query head stays in registers, each key row costs `D16` fused
//! multiply-adds into its own accumulator, and the accumulators of up to 16
//! rows are summed together by one transposing tree (`hsum16`: 45 shuffles
//! and adds for 16 scores, where 16 horizontal sums take about twice that);
//! the value pass is `avx512_values`. Each block's rows are prefetched one block ahead, since the
//! next block sits at an unrelated address.

use std::arch::x86_64::{
    __m512, _mm512_add_ps, _mm512_castpd_ps, _mm512_castps_pd, _mm512_fmadd_ps, _mm512_loadu_ps,
    _mm512_mask_storeu_ps, _mm512_mul_ps, _mm512_set1_ps, _mm512_setzero_ps, _mm512_shuffle_f32x4,
    _mm512_storeu_ps, _mm512_unpackhi_pd, _mm512_unpackhi_ps, _mm512_unpacklo_pd,
    _mm512_unpacklo_ps,
};

use super::avx512_values::value_pass_tile;
use super::cache::HeadQuery;
use super::format::KvElem;
use super::kernel::{drive, split_rows, Isa};
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

/// The lane partial sums of `q . k_j` for the `n` (<= 16) key rows `k_j`
/// of `keys` (`[n, 16 * D16]`): lane `l` of `acc[j]` sums `q[16c + l] *
/// k_j[16c + l]` over `c` in order (`hsum16` then adds the lanes). A full
/// chunk of 16 rows runs with constant trip counts, so its 16 accumulators
/// stay in registers and the 16 rows' multiply-adds interleave; fewer rows
/// take the same sums in a plain loop. Rows past `n` stay zero.
///
/// # Safety
/// The CPU must support AVX-512F (the caller is compiled with it), and
/// `keys` must hold `n * 16 * D16` floats.
#[inline(always)]
pub(crate) unsafe fn dots16<const D16: usize>(
    qv: &[__m512; D16],
    keys: &[f32],
    n: usize,
) -> [__m512; 16] {
    let d = 16 * D16;
    debug_assert!(n <= 16 && keys.len() >= n * d);
    let mut acc = [_mm512_setzero_ps(); 16];
    let k = keys.as_ptr();
    if n == 16 {
        for (c, qc) in qv.iter().enumerate() {
            for (j, a) in acc.iter_mut().enumerate() {
                // SAFETY: row `j < 16` of `keys` holds `d` floats.
                *a = _mm512_fmadd_ps(*qc, unsafe { _mm512_loadu_ps(k.add(j * d + 16 * c)) }, *a);
            }
        }
    } else {
        for (j, a) in acc.iter_mut().enumerate().take(n) {
            for (c, qc) in qv.iter().enumerate() {
                // SAFETY: row `j < n` of `keys` holds `d` floats.
                *a = _mm512_fmadd_ps(*qc, unsafe { _mm512_loadu_ps(k.add(j * d + 16 * c)) }, *a);
            }
        }
    }
    acc
}

/// The values of a block's `entries` as floats (`[rows, 16 * D16]`, each
/// times its entry's scale): `entries` itself for `f32`, else widened 16
/// at a time into `scratch` (`KvElem::load16`).
///
/// # Safety
/// The CPU must support AVX-512F, AVX2 and F16C (the caller is compiled
/// with them).
#[inline(always)]
pub(crate) unsafe fn widen_rows16<'a, const D16: usize, E: KvElem>(
    entries: &'a [E],
    scratch: &'a mut [f32],
) -> &'a [f32] {
    if let Some(f) = E::as_f32(entries) {
        return f;
    }
    let d = 16 * D16;
    let e = E::entry_size(d);
    let rows = entries.len() / e;
    for (entry, out) in entries.chunks_exact(e).zip(scratch.chunks_exact_mut(d)) {
        let scale = _mm512_set1_ps(E::scale(entry, d));
        for c in 0..D16 {
            // SAFETY: `entry` holds `d` values, `out` `d` floats; the caller
            // runs with the features `load16` needs.
            unsafe {
                let x = E::load16(entry.as_ptr().add(16 * c));
                let x = if E::SCALE_ELEMS == 0 {
                    x
                } else {
                    _mm512_mul_ps(x, scale)
                };
                _mm512_storeu_ps(out.as_mut_ptr().add(16 * c), x);
            }
        }
    }
    &scratch[..rows * d]
}

/// Lane `j` of the result: the sum of the 16 lanes of `v[j]` (a transposing
/// tree: pairs of vectors interleaved and added, then pairs of pairs, then
/// their 128-bit quarters), in a fixed order.
///
/// # Safety
/// The CPU must support AVX-512F (the caller is compiled with it).
#[inline(always)]
pub(crate) unsafe fn hsum16(v: &[__m512; 16]) -> __m512 {
    // Each 128-bit quarter of `p[i]`: partial sums of rows 2i, 2i + 1, 2i, 2i + 1.
    let mut p = [_mm512_setzero_ps(); 8];
    for (i, o) in p.iter_mut().enumerate() {
        let (a, b) = (v[2 * i], v[2 * i + 1]);
        *o = _mm512_add_ps(_mm512_unpacklo_ps(a, b), _mm512_unpackhi_ps(a, b));
    }
    // Each quarter of `u[i]`: partial sums of rows 4i .. 4i + 3, in order.
    let mut u = [_mm512_setzero_ps(); 4];
    for (i, o) in u.iter_mut().enumerate() {
        let (a, b) = (_mm512_castps_pd(p[2 * i]), _mm512_castps_pd(p[2 * i + 1]));
        *o = _mm512_add_ps(
            _mm512_castpd_ps(_mm512_unpacklo_pd(a, b)),
            _mm512_castpd_ps(_mm512_unpackhi_pd(a, b)),
        );
    }
    // Quarters (0 + 1, 2 + 3) of two `u`s side by side, then of all four.
    let halves = |a: __m512, b: __m512| {
        _mm512_add_ps(
            _mm512_shuffle_f32x4::<0b10_00_10_00>(a, b),
            _mm512_shuffle_f32x4::<0b11_01_11_01>(a, b),
        )
    };
    halves(halves(u[0], u[1]), halves(u[2], u[3]))
}

/// `out[j] = scale * sum(acc[j])` for the first `out.len()` (<= 16) rows
/// (`hsum16`; `scale` None: 1).
///
/// # Safety
/// The CPU must support AVX-512F (the caller is compiled with it).
#[inline(always)]
pub(crate) unsafe fn store_sums(out: &mut [f32], acc: &[__m512; 16], scale: Option<__m512>) {
    debug_assert!(out.len() <= 16);
    // SAFETY: AVX-512F (caller).
    let mut sums = unsafe { hsum16(acc) };
    if let Some(s) = scale {
        sums = _mm512_mul_ps(sums, s);
    }
    let mask = ((1u32 << out.len()) - 1) as u16;
    // SAFETY: the mask writes only the `out.len()` floats `out` holds.
    unsafe { _mm512_mask_storeu_ps(out.as_mut_ptr(), mask, sums) };
}
