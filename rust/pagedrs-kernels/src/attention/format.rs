//! The element types of the paged KV cache (the `kv_cache_dtype` formats) as
//! the kernels read and write them. One *entry* is one token's key or value of
//! one KV head: `head_dim` elements, then for int8 the two bytes of its
//! bfloat16 scale (little-endian), so `entry_size = head_dim + SCALE_ELEMS`
//! elements and a block carries its own scales.
//!
//! | type | `kv_cache_dtype` | element | entry |
//! |---|---|---|---|
//! | `f32` | float32 | value | `D` |
//! | `Bf16` | bfloat16 | bfloat16 bits | `D` |
//! | `Fp8E4m3` / `Fp8E5m2` | fp8_e4m3 / fp8_e5m2 | fp8 bits, unit scale | `D` |
//! | `Q8` | int8 | `round(x / scale)` in `[-127, 127]` | `D + 2` (scale) |
//!
//! An int8 entry's scale is `bf16(max |x| / 127)`; values are
//! `round_half_even(x / scale)` clamped to `[-127, 127]`, all 0 when the
//! scale is 0. fp8 writes saturate at the largest finite value. Every write
//! rounds to nearest even in `f32` as torch's reference does.

#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

use super::convert::{bf16_to_f32, f32_to_bf16, E4M3, E4M3_VALUES, E5M2, E5M2_VALUES};

/// The values `entries` (`[rows, entry_size(head_dim)]`) hold, as floats
/// (`[rows, head_dim]`, each times its entry's scale): `entries` itself for
/// `f32`, else widened into `scratch` (plain loops that LLVM vectorizes).
#[inline(always)]
pub(crate) fn widen_rows<'a, E: KvElem>(
    entries: &'a [E],
    head_dim: usize,
    scratch: &'a mut [f32],
) -> &'a [f32] {
    if let Some(f) = E::as_f32(entries) {
        return f;
    }
    let e = E::entry_size(head_dim);
    let rows = entries.len() / e;
    for (entry, out) in entries
        .chunks_exact(e)
        .zip(scratch.chunks_exact_mut(head_dim))
    {
        let scale = E::scale(entry, head_dim);
        for (o, x) in out.iter_mut().zip(&entry[..head_dim]) {
            *o = x.value() * scale;
        }
    }
    &scratch[..rows * head_dim]
}

/// bfloat16 bits.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[repr(transparent)]
pub struct Bf16(pub u16);

/// One element of an int8 entry: a quantized value, or a byte of the scale.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[repr(transparent)]
pub struct Q8(pub i8);

/// `float8_e4m3fn` bits.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[repr(transparent)]
pub struct Fp8E4m3(pub u8);

/// `float8_e5m2` bits.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[repr(transparent)]
pub struct Fp8E5m2(pub u8);

/// An element type of the paged KV cache.
pub trait KvElem: Copy + Default + Send + Sync + 'static {
    /// The format's `kv_cache_dtype` name.
    const NAME: &'static str;
    /// Elements after an entry's `head_dim` values (int8: its scale's bytes).
    const SCALE_ELEMS: usize = 0;

    /// Elements per entry for `head_dim` values.
    #[inline(always)]
    fn entry_size(head_dim: usize) -> usize {
        head_dim + Self::SCALE_ELEMS
    }

    /// The value this element stores, before the entry's scale.
    fn value(self) -> f32;

    /// The scale of `entry` (`[entry_size(head_dim)]`); 1 without one.
    #[inline(always)]
    fn scale(entry: &[Self], head_dim: usize) -> f32 {
        let _ = (entry, head_dim);
        1.0
    }

    /// Store `src` (`[head_dim]`) as `entry` (`[entry_size(head_dim)]`).
    fn store(src: &[f32], entry: &mut [Self]);

    /// `entries` as the floats they hold when they are plain `f32` (the
    /// kernels then read them in place), else None.
    #[inline(always)]
    fn as_f32(entries: &[Self]) -> Option<&[f32]> {
        let _ = entries;
        None
    }

    /// Sixteen elements from `p` as floats, before the entry's scale.
    ///
    /// # Safety
    /// The CPU must support AVX-512F, AVX2 and F16C, and `p` must point at 16
    /// readable elements.
    #[cfg(target_arch = "x86_64")]
    unsafe fn load16(p: *const Self) -> __m512;
}

impl KvElem for f32 {
    const NAME: &'static str = "float32";

    #[inline(always)]
    fn value(self) -> f32 {
        self
    }

    #[inline(always)]
    fn store(src: &[f32], entry: &mut [f32]) {
        entry.copy_from_slice(src);
    }

    #[inline(always)]
    fn as_f32(entries: &[f32]) -> Option<&[f32]> {
        Some(entries)
    }

    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn load16(p: *const f32) -> __m512 {
        // SAFETY: 16 readable floats at `p` (caller).
        unsafe { _mm512_loadu_ps(p) }
    }
}

impl KvElem for Bf16 {
    const NAME: &'static str = "bfloat16";

    #[inline(always)]
    fn value(self) -> f32 {
        bf16_to_f32(self.0)
    }

    #[inline(always)]
    fn store(src: &[f32], entry: &mut [Bf16]) {
        for (e, &x) in entry.iter_mut().zip(src) {
            *e = Bf16(f32_to_bf16(x));
        }
    }

    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn load16(p: *const Bf16) -> __m512 {
        // SAFETY: 16 readable 2-byte elements at `p` (caller); AVX-512F.
        unsafe {
            let h = _mm256_loadu_si256(p as *const __m256i);
            _mm512_castsi512_ps(_mm512_slli_epi32::<16>(_mm512_cvtepu16_epi32(h)))
        }
    }
}

impl KvElem for Q8 {
    const NAME: &'static str = "int8";
    const SCALE_ELEMS: usize = 2;

    #[inline(always)]
    fn value(self) -> f32 {
        self.0 as f32
    }

    #[inline(always)]
    fn scale(entry: &[Q8], head_dim: usize) -> f32 {
        let (lo, hi) = (entry[head_dim].0 as u8, entry[head_dim + 1].0 as u8);
        bf16_to_f32(u16::from_le_bytes([lo, hi]))
    }

    #[inline(always)]
    fn store(src: &[f32], entry: &mut [Q8]) {
        #[cfg(target_arch = "x86_64")]
        if src.len().is_multiple_of(16) && crate::cpu_features::avx512f() {
            // SAFETY: AVX-512F is present; `entry` holds `src.len() + 2` elements.
            return unsafe { store_q8_avx512(src, entry) };
        }
        store_q8_portable(src, entry)
    }

    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn load16(p: *const Q8) -> __m512 {
        // SAFETY: 16 readable bytes at `p` (caller); AVX-512F.
        unsafe { _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(p as *const __m128i))) }
    }
}

impl KvElem for Fp8E4m3 {
    const NAME: &'static str = "fp8_e4m3";

    #[inline(always)]
    fn value(self) -> f32 {
        E4M3_VALUES[self.0 as usize]
    }

    #[inline(always)]
    fn store(src: &[f32], entry: &mut [Fp8E4m3]) {
        for (e, &x) in entry.iter_mut().zip(src) {
            *e = Fp8E4m3(E4M3.encode(x));
        }
    }

    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn load16(p: *const Fp8E4m3) -> __m512 {
        // e4m3 bits `s eeee mmm` placed as the half `s 0eeee mmm0000000` are
        // the value times 2^-8, subnormals included: convert, then scale back.
        // SAFETY: 16 readable bytes at `p` (caller); AVX2, F16C, AVX-512F.
        unsafe {
            let b = _mm256_cvtepu8_epi16(_mm_loadu_si128(p as *const __m128i));
            let sign = _mm256_slli_epi16::<8>(_mm256_and_si256(b, _mm256_set1_epi16(0x80)));
            let mag = _mm256_slli_epi16::<7>(_mm256_and_si256(b, _mm256_set1_epi16(0x7f)));
            let half = _mm256_or_si256(sign, mag);
            _mm512_mul_ps(_mm512_cvtph_ps(half), _mm512_set1_ps(256.0))
        }
    }
}

impl KvElem for Fp8E5m2 {
    const NAME: &'static str = "fp8_e5m2";

    #[inline(always)]
    fn value(self) -> f32 {
        E5M2_VALUES[self.0 as usize]
    }

    #[inline(always)]
    fn store(src: &[f32], entry: &mut [Fp8E5m2]) {
        for (e, &x) in entry.iter_mut().zip(src) {
            *e = Fp8E5m2(E5M2.encode(x));
        }
    }

    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn load16(p: *const Fp8E5m2) -> __m512 {
        // e5m2 bits are the upper byte of the half of the same value.
        // SAFETY: 16 readable bytes at `p` (caller); AVX2, F16C, AVX-512F.
        unsafe {
            let b = _mm256_cvtepu8_epi16(_mm_loadu_si128(p as *const __m128i));
            _mm512_cvtph_ps(_mm256_slli_epi16::<8>(b))
        }
    }
}

/// `Q8::store` in AVX-512 registers, 16 values at a time: the same absmax,
/// bfloat16 scale, division, round-half-even (the `1.5 * 2^23` addition),
/// clamp and narrowing, each exactly rounded, so the same bits for every
/// input (a NaN quotient stores 0, as the portable code does).
///
/// # Safety
/// The CPU must support AVX-512F; `src.len()` is a multiple of 16 and
/// `entry` holds `src.len() + 2` elements.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn store_q8_avx512(src: &[f32], entry: &mut [Q8]) {
    const ROUND: f32 = 12_582_912.0;
    let d = src.len();
    debug_assert!(d.is_multiple_of(16) && entry.len() >= d + 2);
    let mut absmax = _mm512_setzero_ps();
    for c in 0..d / 16 {
        // SAFETY: `src` holds `d` floats.
        let x = unsafe { _mm512_loadu_ps(src.as_ptr().add(16 * c)) };
        // max(m, |x|) keeps `m` for a NaN `x`, as `f32::max` does.
        absmax = _mm512_max_ps(_mm512_abs_ps(x), absmax);
    }
    let bits = f32_to_bf16(_mm512_reduce_max_ps(absmax) / 127.0);
    let scale = bf16_to_f32(bits);
    let safe = _mm512_set1_ps(if scale > 0.0 { scale } else { 1.0 });
    let (round, lo, hi) = (
        _mm512_set1_ps(ROUND),
        _mm512_set1_ps(-127.0),
        _mm512_set1_ps(127.0),
    );
    for c in 0..d / 16 {
        // SAFETY: `src` holds `d` floats, `entry` `d` values first.
        unsafe {
            let x = _mm512_loadu_ps(src.as_ptr().add(16 * c));
            let y = _mm512_sub_ps(_mm512_add_ps(_mm512_div_ps(x, safe), round), round);
            // A NaN quotient stores 0 (the portable clamp keeps NaN, `as` makes it 0).
            let ordered = _mm512_cmp_ps_mask::<_CMP_ORD_Q>(y, y);
            let y = _mm512_min_ps(_mm512_max_ps(y, lo), hi);
            let q = _mm512_maskz_cvttps_epi32(ordered, y);
            _mm_storeu_si128(
                entry.as_mut_ptr().add(16 * c) as *mut __m128i,
                _mm512_cvtepi32_epi8(q),
            );
        }
    }
    let [lo_byte, hi_byte] = bits.to_le_bytes();
    entry[d] = Q8(lo_byte as i8);
    entry[d + 1] = Q8(hi_byte as i8);
}

/// `Q8::store` in plain float operations (any CPU).
fn store_q8_portable(src: &[f32], entry: &mut [Q8]) {
    // Adding then subtracting 1.5 * 2^23 rounds |y| < 2^22 to the nearest
    // integer, ties to even (one IEEE addition), as `round_ties_even`
    // does, in plain float operations that vectorize (`round_ties_even`
    // itself is a libm call on the x86_64 baseline).
    const ROUND: f32 = 12_582_912.0;
    let d = src.len();
    let mut lanes = [0.0f32; 16];
    let (chunks, tail) = src.as_chunks::<16>();
    for c in chunks {
        for (m, x) in lanes.iter_mut().zip(c) {
            *m = m.max(x.abs());
        }
    }
    let absmax = tail
        .iter()
        .chain(&lanes)
        .fold(0.0f32, |m, x| m.max(x.abs()));
    let bits = f32_to_bf16(absmax / 127.0);
    let scale = bf16_to_f32(bits);
    let safe = if scale > 0.0 { scale } else { 1.0 };
    for (e, &x) in entry[..d].iter_mut().zip(src) {
        *e = Q8((((x / safe) + ROUND) - ROUND).clamp(-127.0, 127.0) as i8);
    }
    let [lo, hi] = bits.to_le_bytes();
    entry[d] = Q8(lo as i8);
    entry[d + 1] = Q8(hi as i8);
}

#[cfg(test)]
mod q8_tests {
    use super::*;

    /// The AVX-512 int8 store writes the portable store's bits, specials included.
    #[test]
    fn avx512_int8_store_matches_portable() {
        #[cfg(target_arch = "x86_64")]
        if crate::cpu_features::avx512f() {
            let specials = [
                0.0,
                -0.0,
                1e-30,
                -1e-30,
                0.5,
                -0.5,
                1.5,
                2.5,
                f32::NAN,
                f32::INFINITY,
            ];
            for case in 0..200usize {
                let d = 64;
                let mut src: Vec<f32> = (0..d)
                    .map(|i| ((i * 31 + case * 17) as f32 * 0.37).sin() * (1.0 + case as f32))
                    .collect();
                if case % 4 == 1 {
                    src[case % d] = specials[case % specials.len()];
                }
                if case % 10 == 3 {
                    src.iter_mut().for_each(|x| *x = 0.0);
                }
                if case % 10 == 7 {
                    // values that divide onto exact halves: ties to even
                    src.iter_mut()
                        .enumerate()
                        .for_each(|(i, x)| *x = (i as f32 - 32.0) * 0.5);
                    src[0] = 127.0 * 0.5;
                }
                let (mut a, mut b) = (vec![Q8(0); d + 2], vec![Q8(0); d + 2]);
                store_q8_portable(&src, &mut a);
                // SAFETY: AVX-512F is present; `b` holds `d + 2` elements.
                unsafe { store_q8_avx512(&src, &mut b) };
                assert_eq!(a, b, "case {case}: {src:?}");
            }
        }
    }
}
