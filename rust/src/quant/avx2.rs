//! The x86 tile kernels: each format's sub-blocks decoded in AVX2 (32
//! integers in one vector, widened to two vectors of 16 int16) and their
//! products with the int16 activations by `vpmaddwd` (AVX2) or `vpdpwssd`
//! (AVX-512 VNNI), which give the same exact int32 lanes: lane `j` holds
//! values `2j, 2j + 1` of each half (`|w| <= 128`, `|a| <= 32767`: four
//! products stay below 2^24, so their float32 conversion is exact).

use std::arch::x86_64::*;
use std::cell::RefCell;
use std::ops::Range;

use super::act::QuantActs;
use super::blocks::scale_min_k4;
use super::format::{QuantType, QuantWeight};
use super::kernel::{ItemFn, TileOut, MAX_C, MAX_R};

pub(crate) fn has_avx2() -> bool {
    is_x86_feature_detected!("avx2")
        && is_x86_feature_detected!("fma")
        && is_x86_feature_detected!("f16c")
}

pub(crate) fn has_vnni() -> bool {
    is_x86_feature_detected!("avx512f")
        && is_x86_feature_detected!("avx512bw")
        && is_x86_feature_detected!("avx512vl")
        && is_x86_feature_detected!("avx512vnni")
}

// The formats as const generic parameters.
const Q4_0: u8 = 0;
const Q4_1: u8 = 1;
const Q5_0: u8 = 2;
const Q5_1: u8 = 3;
const Q8_0: u8 = 4;
const Q4K: u8 = 5;
const Q5K: u8 = 6;
const Q6K: u8 = 7;
const INT8: u8 = 8;

const fn has_min(t: u8) -> bool {
    matches!(t, Q4_1 | Q5_1 | Q4K | Q5K)
}

/// A decoded sub-block: its 32 integers as int16 (values 0..16, 16..32),
/// the scale of each half in 8 float lanes, and the minimum.
#[derive(Clone, Copy)]
struct Dec {
    lo: __m256i,
    hi: __m256i,
    s0: __m256,
    s1: __m256,
    min: f32,
}

#[inline(always)]
unsafe fn f16(p: *const u8) -> f32 {
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

/// 32 signed bytes `q` with one scale for both halves and a minimum.
#[inline(always)]
unsafe fn widen(q: __m256i, s0: f32, s1: f32, min: f32) -> Dec {
    Dec {
        lo: _mm256_cvtepi8_epi16(_mm256_castsi256_si128(q)),
        hi: _mm256_cvtepi8_epi16(_mm256_extracti128_si256::<1>(q)),
        s0: _mm256_set1_ps(s0),
        s1: _mm256_set1_ps(s1),
        min,
    }
}

#[inline(always)]
unsafe fn signed(q: __m256i, scale: f32) -> Dec {
    widen(q, scale, scale, 0.0)
}

#[inline(always)]
unsafe fn unsigned(q: __m256i, scale: f32, min: f32) -> Dec {
    widen(q, scale, scale, min)
}

/// Sub-block `b` of the row at `row` (`blocks::decode` in AVX2).
#[inline(always)]
unsafe fn decode<const T: u8>(row: *const u8, b: usize, row_scale: f32) -> Dec {
    match T {
        Q4_0 => {
            let p = row.add(18 * b);
            let q = _mm256_sub_epi8(nibbles16(p.add(2)), _mm256_set1_epi8(8));
            signed(q, f16(p))
        }
        Q4_1 => {
            let p = row.add(20 * b);
            unsigned(nibbles16(p.add(4)), f16(p), f16(p.add(2)))
        }
        Q5_0 => {
            let p = row.add(22 * b);
            let qh = (p.add(2) as *const u32).read_unaligned();
            let q = _mm256_or_si256(nibbles16(p.add(6)), bits_to_0x10(u32::from_le(qh)));
            signed(_mm256_sub_epi8(q, _mm256_set1_epi8(16)), f16(p))
        }
        Q5_1 => {
            let p = row.add(24 * b);
            let qh = (p.add(4) as *const u32).read_unaligned();
            let q = _mm256_or_si256(nibbles16(p.add(8)), bits_to_0x10(u32::from_le(qh)));
            unsigned(q, f16(p), f16(p.add(2)))
        }
        Q8_0 => {
            let p = row.add(34 * b);
            signed(_mm256_loadu_si256(p.add(2) as *const __m256i), f16(p))
        }
        INT8 => signed(
            _mm256_loadu_si256(row.add(32 * b) as *const __m256i),
            row_scale,
        ),
        Q4K | Q5K => {
            let size = if T == Q4K { 144 } else { 176 };
            let (blk, j) = (b / 8, b % 8);
            let p = row.add(blk * size);
            let (d, dmin) = (f16(p), f16(p.add(2)));
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
            unsigned(q, d * sc as f32, -(dmin * m as f32))
        }
        _ => {
            // Q6K
            let (blk, j) = (b / 8, b % 8);
            let p = row.add(blk * 210);
            let d = f16(p.add(208));
            let (h, t) = (j / 4, j % 4);
            let ql = _mm256_loadu_si256(p.add(64 * h + 32 * (t % 2)) as *const __m256i);
            let lo = _mm256_and_si256(
                shift_right_16(ql, 4 * (t as u32 / 2)),
                _mm256_set1_epi8(0x0f),
            );
            let qh = _mm256_loadu_si256(p.add(128 + 32 * h) as *const __m256i);
            let hb = _mm256_and_si256(shift_right_16(qh, 2 * t as u32), _mm256_set1_epi8(0x03));
            let q = _mm256_or_si256(lo, _mm256_slli_epi16::<4>(hb));
            let q = _mm256_sub_epi8(q, _mm256_set1_epi8(32));
            let sc = p.add(192 + 8 * h + 2 * t);
            let s0 = d * (*sc as i8) as f32;
            let s1 = d * (*sc.add(1) as i8) as f32;
            widen(q, s0, s1, 0.0)
        }
    }
}

/// The exact int32 sums per lane `j` of the products of values `2j, 2j + 1`
/// of both halves.
#[inline(always)]
unsafe fn dot<const VNNI: bool>(w: &Dec, alo: __m256i, ahi: __m256i) -> __m256i {
    if VNNI {
        let lo = _mm256_dpwssd_epi32(_mm256_setzero_si256(), w.lo, alo);
        _mm256_dpwssd_epi32(lo, w.hi, ahi)
    } else {
        _mm256_add_epi32(_mm256_madd_epi16(w.lo, alo), _mm256_madd_epi16(w.hi, ahi))
    }
}

/// `kernel::hsum8` of the lanes of `v`.
#[inline(always)]
unsafe fn hsum8(v: __m256) -> f32 {
    let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
    let t = _mm_add_ps(s, _mm_movehl_ps(s, s));
    _mm_cvtss_f32(_mm_add_ss(t, _mm_shuffle_ps::<1>(t, t)))
}

/// An `R` x `C` tile of format `T`: rows `r0..r0 + R`, outputs `n0..n0 + C`;
/// with `PRE`, the outputs' sub-blocks read from `pre` (output `c`'s
/// sub-block `b` at `pre[c * nsub + b]`, `predecode`'s values) instead of
/// being decoded here.
#[inline(always)]
unsafe fn tile_body<
    const T: u8,
    const R: usize,
    const C: usize,
    const VNNI: bool,
    const PRE: bool,
>(
    w: &QuantWeight,
    n0: usize,
    acts: &QuantActs,
    r0: usize,
    pre: *const Dec,
) -> TileOut {
    let nsub = w.k / 32;
    let rb = w.qtype.row_bytes(w.k);
    let mut wrow = [std::ptr::null::<u8>(); C];
    let mut wscale = [0.0f32; C];
    for c in 0..C {
        wrow[c] = w.data.as_ptr().add((n0 + c) * rb);
        wscale[c] = w.row_scale(n0 + c);
    }
    let mut aq = [std::ptr::null::<i16>(); R];
    let mut ad = [std::ptr::null::<f32>(); R];
    let mut ads = [std::ptr::null::<f32>(); R];
    for r in 0..R {
        aq[r] = acts.q.as_ptr().add((r0 + r) * w.k);
        ad[r] = acts.d.as_ptr().add((r0 + r) * nsub);
        ads[r] = acts.dsum.as_ptr().add((r0 + r) * nsub);
    }
    let mut acc = [[_mm256_setzero_ps(); C]; R];
    let mut macc = [[0.0f32; C]; R];
    let zero = Dec {
        lo: _mm256_setzero_si256(),
        hi: _mm256_setzero_si256(),
        s0: _mm256_setzero_ps(),
        s1: _mm256_setzero_ps(),
        min: 0.0,
    };
    for b in 0..nsub {
        let mut dec = [zero; C];
        for c in 0..C {
            dec[c] = if PRE {
                *pre.add(c * nsub + b)
            } else {
                decode::<T>(wrow[c], b, wscale[c])
            };
        }
        for r in 0..R {
            let alo = _mm256_loadu_si256(aq[r].add(32 * b) as *const __m256i);
            let ahi = _mm256_loadu_si256(aq[r].add(32 * b + 16) as *const __m256i);
            let d = _mm256_set1_ps(*ad[r].add(b));
            for c in 0..C {
                let w = &dec[c];
                if T == Q6K {
                    // One scale per half: the halves' lanes separately.
                    let lo = _mm256_cvtepi32_ps(_mm256_madd_epi16(w.lo, alo));
                    let hi = _mm256_cvtepi32_ps(_mm256_madd_epi16(w.hi, ahi));
                    acc[r][c] = _mm256_fmadd_ps(lo, _mm256_mul_ps(w.s0, d), acc[r][c]);
                    acc[r][c] = _mm256_fmadd_ps(hi, _mm256_mul_ps(w.s1, d), acc[r][c]);
                } else {
                    let isum = _mm256_cvtepi32_ps(dot::<VNNI>(w, alo, ahi));
                    acc[r][c] = _mm256_fmadd_ps(isum, _mm256_mul_ps(w.s0, d), acc[r][c]);
                }
                if has_min(T) {
                    macc[r][c] = w.min.mul_add(*ads[r].add(b), macc[r][c]);
                }
            }
        }
    }
    let mut out = [[0.0f32; MAX_C]; MAX_R];
    for r in 0..R {
        for c in 0..C {
            out[r][c] = hsum8(acc[r][c]) + macc[r][c];
        }
    }
    out
}

/// `tile_body` for `nr` x `nc` (the shapes as const parameters).
#[inline(always)]
unsafe fn tile_any<const T: u8, const VNNI: bool, const PRE: bool>(
    w: &QuantWeight,
    n0: usize,
    nc: usize,
    acts: &QuantActs,
    r0: usize,
    nr: usize,
    pre: *const Dec,
) -> TileOut {
    match (nr, nc) {
        (4, 2) => tile_body::<T, 4, 2, VNNI, PRE>(w, n0, acts, r0, pre),
        (4, 1) => tile_body::<T, 4, 1, VNNI, PRE>(w, n0, acts, r0, pre),
        (3, 2) => tile_body::<T, 3, 2, VNNI, PRE>(w, n0, acts, r0, pre),
        (3, 1) => tile_body::<T, 3, 1, VNNI, PRE>(w, n0, acts, r0, pre),
        (2, 2) => tile_body::<T, 2, 2, VNNI, PRE>(w, n0, acts, r0, pre),
        (2, 1) => tile_body::<T, 2, 1, VNNI, PRE>(w, n0, acts, r0, pre),
        (1, 2) => tile_body::<T, 1, 2, VNNI, PRE>(w, n0, acts, r0, pre),
        (1, 1) => tile_body::<T, 1, 1, VNNI, PRE>(w, n0, acts, r0, pre),
        _ => [[0.0; MAX_C]; MAX_R],
    }
}

thread_local! {
    /// A thread's decoded panel (`item`), kept between calls.
    static PANEL: RefCell<Vec<Dec>> = const { RefCell::new(Vec::new()) };
}

/// Outputs `outputs` by rows `rows` (`kernel::ItemFn`). Over more than one
/// tile of rows, the outputs' sub-blocks are decoded once into the thread's
/// panel and every tile reads them from there (the same values, so the same
/// bits as decoding in the tile).
#[inline(always)]
unsafe fn item<const T: u8, const VNNI: bool>(
    w: &QuantWeight,
    outputs: Range<usize>,
    acts: &QuantActs,
    rows: Range<usize>,
    write: &mut dyn FnMut(usize, usize, f32),
) {
    assert!(outputs.end <= w.n && rows.end <= acts.rows);
    assert_eq!(w.k, acts.k, "weight and activations of different features");
    let nsub = w.k / 32;
    let predecoded = rows.len() > MAX_R;
    // Taken out and put back (no closure: a closure would not inherit
    // this function's target features).
    let mut panel = PANEL.take();
    if predecoded {
        let rb = w.qtype.row_bytes(w.k);
        panel.clear();
        for n in outputs.clone() {
            let row = w.data.as_ptr().add(n * rb);
            let scale = w.row_scale(n);
            for b in 0..nsub {
                panel.push(decode::<T>(row, b, scale));
            }
        }
    }
    for r0 in rows.clone().step_by(MAX_R) {
        let nr = MAX_R.min(rows.end - r0);
        for n0 in outputs.clone().step_by(MAX_C) {
            let nc = MAX_C.min(outputs.end - n0);
            let tile = if predecoded {
                let pre = panel.as_ptr().add((n0 - outputs.start) * nsub);
                tile_any::<T, VNNI, true>(w, n0, nc, acts, r0, nr, pre)
            } else {
                tile_any::<T, VNNI, false>(w, n0, nc, acts, r0, nr, std::ptr::null())
            };
            for (r, row) in tile.iter().enumerate().take(nr) {
                for (c, &v) in row.iter().enumerate().take(nc) {
                    write(r0 + r, n0 + c, v);
                }
            }
        }
    }
    PANEL.set(panel);
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn item_avx2<const T: u8>(
    w: &QuantWeight,
    outputs: Range<usize>,
    acts: &QuantActs,
    rows: Range<usize>,
    write: &mut dyn FnMut(usize, usize, f32),
) {
    item::<T, false>(w, outputs, acts, rows, write)
}

#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn item_vnni<const T: u8>(
    w: &QuantWeight,
    outputs: Range<usize>,
    acts: &QuantActs,
    rows: Range<usize>,
    write: &mut dyn FnMut(usize, usize, f32),
) {
    item::<T, true>(w, outputs, acts, rows, write)
}

fn checked<const T: u8, const VNNI: bool>(
    w: &QuantWeight,
    outputs: Range<usize>,
    acts: &QuantActs,
    rows: Range<usize>,
    write: &mut dyn FnMut(usize, usize, f32),
) {
    // SAFETY: handed out by `item_fn`, which `kernel::Variant::item` calls
    // only for a variant this CPU runs (AVX2 + FMA + F16C; AVX-512 VNNI).
    unsafe {
        if VNNI {
            item_vnni::<T>(w, outputs, acts, rows, write)
        } else {
            item_avx2::<T>(w, outputs, acts, rows, write)
        }
    }
}

fn for_vnni<const VNNI: bool>(qtype: QuantType) -> ItemFn {
    match qtype {
        QuantType::Q4_0 => checked::<Q4_0, VNNI>,
        QuantType::Q4_1 => checked::<Q4_1, VNNI>,
        QuantType::Q5_0 => checked::<Q5_0, VNNI>,
        QuantType::Q5_1 => checked::<Q5_1, VNNI>,
        QuantType::Q8_0 => checked::<Q8_0, VNNI>,
        QuantType::Q4K => checked::<Q4K, VNNI>,
        QuantType::Q5K => checked::<Q5K, VNNI>,
        QuantType::Q6K => checked::<Q6K, VNNI>,
        QuantType::Int8 => checked::<INT8, VNNI>,
    }
}

/// The item kernel of `qtype` (AVX2, or AVX-512 VNNI with `vnni`). Only
/// for a CPU that runs it (`has_avx2`, `has_vnni`).
pub(crate) fn item_fn(qtype: QuantType, vnni: bool) -> ItemFn {
    if vnni {
        for_vnni::<true>(qtype)
    } else {
        for_vnni::<false>(qtype)
    }
}
