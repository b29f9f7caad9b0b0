//! The AVX-512 operations that several variants of the per-head kernel
//! share: the float key-row dot products and their transposing sum tree
//! (`dots16`, `hsum16`, `store_sums`), a block's entries widened to floats
//! (`widen_rows16`), and the rounding mode of the int16 quantization
//! (`ROUND`).

use std::arch::x86_64::*;

use super::format::KvElem;

/// Round to nearest, ties to even, exceptions suppressed.
pub(crate) const ROUND: i32 = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;

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
