//! The formats' sub-blocks decoded in AVX2 (`blocks::decode`'s integers and
//! scales): 32 integers widened to two vectors of 16 int16, a float32
//! scale and a minimum. `decode` reads one sub-block; `decode_step` the
//! `KC` sub-blocks of a many-rows step, a k-quant block's header (float16
//! scales, packed 6-bit scales, high bits) read once for its 8 sub-blocks.

use std::arch::x86_64::*;

use super::super::blocks::scale_min_k4;

// The formats as const generic parameters.
pub(super) const Q4_0: u8 = 0;
pub(super) const Q4_1: u8 = 1;
pub(super) const Q5_0: u8 = 2;
pub(super) const Q5_1: u8 = 3;
pub(super) const Q8_0: u8 = 4;
pub(super) const Q4K: u8 = 5;
pub(super) const Q5K: u8 = 6;
pub(super) const Q6K: u8 = 7;
pub(super) const INT8: u8 = 8;

pub(super) const fn has_min(t: u8) -> bool {
    matches!(t, Q4_1 | Q5_1 | Q4K | Q5K)
}

/// What the `vpdpbusd` panels add to format `T`'s integers to make them
/// unsigned bytes (`0..=255`); the products' sums are corrected by
/// `offset * sum(x)` exactly. The formats with a minimum are unsigned.
pub(super) const fn unsigned_offset(t: u8) -> i32 {
    match t {
        Q4_0 => 8,
        Q5_0 => 16,
        Q6K => 32,
        Q8_0 | INT8 => 128,
        _ => 0,
    }
}

const fn is_k_quant(t: u8) -> bool {
    matches!(t, Q4K | Q5K | Q6K)
}

/// Bytes of format `T`'s block (32 values; k-quants 256).
const fn block_bytes(t: u8) -> usize {
    match t {
        Q4_0 => 18,
        Q4_1 => 20,
        Q5_0 => 22,
        Q5_1 => 24,
        Q8_0 => 34,
        Q4K => 144,
        Q5K => 176,
        Q6K => 210,
        _ => 32,
    }
}

/// A decoded sub-block: its 32 integers as int16 (values 0..16, 16..32),
/// the scales of its two 16-value halves (equal except in Q6_K) and its
/// minimum.
#[derive(Clone, Copy)]
pub(super) struct Dec {
    pub lo: __m256i,
    pub hi: __m256i,
    pub scale: f32,
    pub scale_hi: f32,
    pub min: f32,
}

impl Dec {
    pub(super) unsafe fn zero() -> Dec {
        Dec {
            lo: _mm256_setzero_si256(),
            hi: _mm256_setzero_si256(),
            scale: 0.0,
            scale_hi: 0.0,
            min: 0.0,
        }
    }
}

/// A sub-block as the int8 panels read it: its 32 integers as unsigned
/// bytes `q + unsigned_offset` in value order, `Dec`'s scales and minimum.
#[derive(Clone, Copy)]
pub(super) struct U8Sub {
    pub q: __m256i,
    pub scale: f32,
    pub scale_hi: f32,
    pub min: f32,
}

impl U8Sub {
    pub(super) unsafe fn zero() -> U8Sub {
        U8Sub {
            q: _mm256_setzero_si256(),
            scale: 0.0,
            scale_hi: 0.0,
            min: 0.0,
        }
    }
}

/// Scale groups per sub-block of format `T` (`QuantType::groups`).
pub(super) const fn groups(t: u8) -> usize {
    if t == Q6K {
        2
    } else {
        1
    }
}

#[inline(always)]
pub(super) unsafe fn f16(p: *const u8) -> f32 {
    let h = u16::from_le_bytes([*p, *p.add(1)]);
    _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(h as i32)))
}

/// 16 bytes of nibble pairs as 32 values: low nibbles, then high nibbles.
#[inline(always)]
unsafe fn nibbles16(p: *const u8) -> __m256i {
    let x = _mm_loadu_si128(p as *const __m128i);
    let m = _mm_set1_epi8(0x0f);
    let lo = _mm_and_si128(x, m);
    let hi = _mm_and_si128(_mm_srli_epi16::<4>(x), m);
    _mm256_set_m128i(hi, lo)
}

/// Byte `i` of the result is `0x10` where bit `i` of `bits` is set.
#[inline(always)]
unsafe fn bits_to_0x10(bits: u32) -> __m256i {
    let v = _mm256_set1_epi32(bits as i32);
    let spread = _mm256_setr_epi64x(
        0x0000_0000_0000_0000,
        0x0101_0101_0101_0101,
        0x0202_0202_0202_0202,
        0x0303_0303_0303_0303,
    );
    let bytes = _mm256_shuffle_epi8(v, spread);
    let mask = _mm256_set1_epi64x(0x8040_2010_0804_0201u64 as i64);
    let set = _mm256_cmpeq_epi8(_mm256_and_si256(bytes, mask), mask);
    _mm256_and_si256(set, _mm256_set1_epi8(0x10))
}

#[inline(always)]
unsafe fn shift_right_16(x: __m256i, n: u32) -> __m256i {
    _mm256_srl_epi16(x, _mm_cvtsi32_si128(n as i32))
}

/// 32 signed bytes `q` widened, with a scale and a minimum.
#[inline(always)]
unsafe fn widen(q: __m256i, scale: f32, min: f32) -> Dec {
    Dec {
        lo: _mm256_cvtepi8_epi16(_mm256_castsi256_si128(q)),
        hi: _mm256_cvtepi8_epi16(_mm256_extracti128_si256::<1>(q)),
        scale,
        scale_hi: scale,
        min,
    }
}

/// Sub-block `j` (0..8) of the Q4_K / Q5_K block at `p`, whose float16
/// scale and minimum scale are `d`, `dmin`.
#[inline(always)]
unsafe fn k4<const T: u8>(p: *const u8, j: usize, d: f32, dmin: f32) -> Dec {
    let u = k4_u8::<T>(p, j, d, dmin);
    widen(u.q, u.scale, u.min)
}

/// Sub-block `j` (0..8) of the Q6_K block at `p` (float16 `d`): the 6-bit
/// values minus 32, the halves' scales `d` times their int8 scales.
#[inline(always)]
unsafe fn k6(p: *const u8, j: usize, d: f32) -> Dec {
    let u = k6_u8(p, j, d);
    Dec {
        scale_hi: u.scale_hi,
        ..widen(_mm256_sub_epi8(u.q, _mm256_set1_epi8(32)), u.scale, 0.0)
    }
}

/// `k4`'s sub-block as 32 unsigned bytes (its integers have no offset),
/// its scale and minimum term.
#[inline(always)]
unsafe fn k4_u8<const T: u8>(p: *const u8, j: usize, d: f32, dmin: f32) -> U8Sub {
    let scales = std::slice::from_raw_parts(p.add(4), 12);
    let (sc, m) = scale_min_k4(j, scales);
    let qs_at = if T == Q4K { 16 } else { 48 };
    let x = _mm256_loadu_si256(p.add(qs_at + 32 * (j / 2)) as *const __m256i);
    let mut q = _mm256_and_si256(
        shift_right_16(x, 4 * (j as u32 % 2)),
        _mm256_set1_epi8(0x0f),
    );
    if T == Q5K {
        let qh = _mm256_loadu_si256(p.add(16) as *const __m256i);
        let bit = _mm256_set1_epi8((1u8 << j) as i8);
        let set = _mm256_cmpeq_epi8(_mm256_and_si256(qh, bit), bit);
        q = _mm256_or_si256(q, _mm256_and_si256(set, _mm256_set1_epi8(0x10)));
    }
    let scale = d * sc as f32;
    U8Sub {
        q,
        scale,
        scale_hi: scale,
        min: -(dmin * m as f32),
    }
}

/// `k6`'s sub-block as 32 unsigned bytes (the 6-bit values, offset 32),
/// the halves' scales.
#[inline(always)]
unsafe fn k6_u8(p: *const u8, j: usize, d: f32) -> U8Sub {
    let (h, t) = (j / 4, j % 4);
    let ql = _mm256_loadu_si256(p.add(64 * h + 32 * (t % 2)) as *const __m256i);
    let lo = _mm256_and_si256(
        shift_right_16(ql, 4 * (t as u32 / 2)),
        _mm256_set1_epi8(0x0f),
    );
    let qh = _mm256_loadu_si256(p.add(128 + 32 * h) as *const __m256i);
    let hb = _mm256_and_si256(shift_right_16(qh, 2 * t as u32), _mm256_set1_epi8(0x03));
    let sc = p.add(192 + 8 * h + 2 * t);
    U8Sub {
        q: _mm256_or_si256(lo, _mm256_slli_epi16::<4>(hb)),
        scale: d * (*sc as i8) as f32,
        scale_hi: d * (*sc.add(1) as i8) as f32,
        min: 0.0,
    }
}

/// Sub-block `b` of the row at `row` (`blocks::decode` in AVX2).
#[inline(always)]
pub(super) unsafe fn decode<const T: u8>(row: *const u8, b: usize, row_scale: f32) -> Dec {
    match T {
        Q4_0 => {
            let p = row.add(18 * b);
            let q = _mm256_sub_epi8(nibbles16(p.add(2)), _mm256_set1_epi8(8));
            widen(q, f16(p), 0.0)
        }
        Q4_1 => {
            let p = row.add(20 * b);
            widen(nibbles16(p.add(4)), f16(p), f16(p.add(2)))
        }
        Q5_0 => {
            let p = row.add(22 * b);
            let qh = (p.add(2) as *const u32).read_unaligned();
            let q = _mm256_or_si256(nibbles16(p.add(6)), bits_to_0x10(u32::from_le(qh)));
            widen(_mm256_sub_epi8(q, _mm256_set1_epi8(16)), f16(p), 0.0)
        }
        Q5_1 => {
            let p = row.add(24 * b);
            let qh = (p.add(4) as *const u32).read_unaligned();
            let q = _mm256_or_si256(nibbles16(p.add(8)), bits_to_0x10(u32::from_le(qh)));
            widen(q, f16(p), f16(p.add(2)))
        }
        Q8_0 => {
            let p = row.add(34 * b);
            widen(_mm256_loadu_si256(p.add(2) as *const __m256i), f16(p), 0.0)
        }
        INT8 => widen(
            _mm256_loadu_si256(row.add(32 * b) as *const __m256i),
            row_scale,
            0.0,
        ),
        Q4K | Q5K => {
            let p = row.add((b / 8) * block_bytes(T));
            k4::<T>(p, b % 8, f16(p), f16(p.add(2)))
        }
        _ => {
            let p = row.add((b / 8) * 210);
            k6(p, b % 8, f16(p.add(208)))
        }
    }
}

/// Sub-block `b` of the row at `row` of a format of 32-value blocks as 32
/// unsigned bytes `q + unsigned_offset(T)` in value order, with its scale
/// and minimum (`decode`'s integers, offset, without widening).
#[inline(always)]
pub(super) unsafe fn decode_u8<const T: u8>(
    row: *const u8,
    b: usize,
    row_scale: f32,
) -> (__m256i, f32, f32) {
    let flip = _mm256_set1_epi8(-128);
    match T {
        Q4_0 => {
            let p = row.add(18 * b);
            (nibbles16(p.add(2)), f16(p), 0.0)
        }
        Q4_1 => {
            let p = row.add(20 * b);
            (nibbles16(p.add(4)), f16(p), f16(p.add(2)))
        }
        Q5_0 => {
            let p = row.add(22 * b);
            let qh = (p.add(2) as *const u32).read_unaligned();
            let q = _mm256_or_si256(nibbles16(p.add(6)), bits_to_0x10(u32::from_le(qh)));
            (q, f16(p), 0.0)
        }
        Q5_1 => {
            let p = row.add(24 * b);
            let qh = (p.add(4) as *const u32).read_unaligned();
            let q = _mm256_or_si256(nibbles16(p.add(8)), bits_to_0x10(u32::from_le(qh)));
            (q, f16(p), f16(p.add(2)))
        }
        Q8_0 => {
            let p = row.add(34 * b);
            let q = _mm256_loadu_si256(p.add(2) as *const __m256i);
            (_mm256_xor_si256(q, flip), f16(p), 0.0)
        }
        _ => {
            let q = _mm256_loadu_si256(row.add(32 * b) as *const __m256i);
            (_mm256_xor_si256(q, flip), row_scale, 0.0)
        }
    }
}

/// Sub-blocks per step of the many-rows path (a k-quant block).
pub(super) const KC: usize = 8;

/// The step of sub-blocks `kb..kb + kn` (`kn <= KC`; k-quants: `kb` a
/// multiple of `KC` and `kn = KC`) of the row at `row` into `dec[..kn]`,
/// after asking for the next step's bytes (`next`, sub-blocks past the
/// row's `nsub` are not asked for).
#[inline(always)]
pub(super) unsafe fn decode_step<const T: u8>(
    row: *const u8,
    kb: usize,
    kn: usize,
    nsub: usize,
    row_scale: f32,
    dec: &mut [Dec; KC],
) {
    prefetch_next::<T>(row, kb, nsub);
    if is_k_quant(T) {
        let p = row.add((kb / 8) * block_bytes(T));
        if T == Q6K {
            let d = f16(p.add(208));
            for (j, v) in dec.iter_mut().enumerate() {
                *v = k6(p, j, d);
            }
        } else {
            let (d, dmin) = (f16(p), f16(p.add(2)));
            for (j, v) in dec.iter_mut().enumerate() {
                *v = k4::<T>(p, j, d, dmin);
            }
        }
    } else {
        for (j, v) in dec.iter_mut().enumerate().take(kn) {
            *v = decode::<T>(row, kb + j, row_scale);
        }
    }
}

/// `decode_step` for the int8 panels: the step's sub-blocks as unsigned
/// bytes (`decode_u8`, `k4_u8`, `k6_u8`), never widened to int16.
#[inline(always)]
pub(super) unsafe fn decode_step_u8<const T: u8>(
    row: *const u8,
    kb: usize,
    kn: usize,
    nsub: usize,
    row_scale: f32,
    out: &mut [U8Sub; KC],
) {
    prefetch_next::<T>(row, kb, nsub);
    if is_k_quant(T) {
        let p = row.add((kb / 8) * block_bytes(T));
        if T == Q6K {
            let d = f16(p.add(208));
            for (j, v) in out.iter_mut().enumerate() {
                *v = k6_u8(p, j, d);
            }
        } else {
            let (d, dmin) = (f16(p), f16(p.add(2)));
            for (j, v) in out.iter_mut().enumerate() {
                *v = k4_u8::<T>(p, j, d, dmin);
            }
        }
    } else {
        for (j, v) in out.iter_mut().enumerate().take(kn) {
            let (q, scale, min) = decode_u8::<T>(row, kb + j, row_scale);
            *v = U8Sub {
                q,
                scale,
                scale_hi: scale,
                min,
            };
        }
    }
}

/// Ask for the bytes of the row's next step (sub-blocks `kb + KC..`, none
/// past the row's `nsub`).
#[inline(always)]
pub(super) unsafe fn prefetch_next<const T: u8>(row: *const u8, kb: usize, nsub: usize) {
    let bytes_per_sub = if is_k_quant(T) {
        block_bytes(T) / 8
    } else {
        block_bytes(T)
    };
    let next = kb + KC;
    if next < nsub {
        let from = row.add(next * bytes_per_sub);
        let len = KC.min(nsub - next) * bytes_per_sub;
        for off in (0..len).step_by(64) {
            _mm_prefetch::<_MM_HINT_T0>(from.add(off) as *const i8);
        }
        _mm_prefetch::<_MM_HINT_T0>(from.add(len - 1) as *const i8);
    }
}
