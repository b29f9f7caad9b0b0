//! The few-rows path (decode steps, up to `rows(T)` rows): tiles of the rows
//! by 8 outputs, each weight sub-block decoded where it is used (the next
//! tile's weight rows prefetched into L2: a row of a few KB is too short a
//! stream for the hardware prefetcher). Q4_K and Q5_K tiles (`tile_k4`)
//! read each block's scales once into tables and their integers straight
//! from the bytes with zero-extending loads. Per row and scale group the 8 outputs'
//! int32 lanes over K are reduced exactly to one lane per output, then one
//! conversion, product `scale * d` and fused multiply-add serve the 8.

use std::arch::x86_64::*;
use std::ops::Range;

use super::super::act::ActQuant;
use super::super::act::QuantActs;
use super::super::blocks::scale_min_k4;
use super::super::format::QuantWeight;
use super::decode::{decode, decode_u8, f16, groups, has_min, unsigned_offset, Dec, Q4K, Q5K, Q6K};

/// Rows of a few-rows tile of format `T` (more go to the many-rows path):
/// where the measured time of the few-rows tile stops beating the panel
/// path (AMD EPYC Zen 5, AVX-512 VNNI, 2048 x 2048: the k-quants' tiles
/// of 4 rows, Q5_K's of 2 and Q6_K's of 3 ran slower than the panels).
pub(super) const fn rows(t: u8) -> usize {
    match t {
        Q4K => 3,
        Q5K => 1,
        Q6K => 2,
        _ => 4,
    }
}
/// Asks for the bytes `ahead` past each of the tile's rows (the next
/// tile's rows at the same place) into L2: into L1 (`T0`) they stream from
/// memory at ~0.7x the rate (AMD EPYC Zen 4, Q8_0 131072 x 2048 at 1 row:
/// 12.5 against 17.7 GB/s).
#[inline(always)]
unsafe fn prefetch_next(wrow: &[*const u8; C], ahead: usize) {
    for row in wrow {
        _mm_prefetch::<_MM_HINT_T1>(row.wrapping_add(ahead) as *const i8);
    }
}

/// Outputs of a tile: the lanes of the float32 accumulators.
const C: usize = 8;

/// The exact int32 sums per lane `j` of the products of pairs `j` of both
/// halves (`w.lo` with `alo`, `w.hi` with `ahi`).
#[inline(always)]
unsafe fn dot2<const VNNI: bool>(w: &Dec, alo: __m256i, ahi: __m256i) -> __m256i {
    if VNNI {
        _mm256_dpwssd_epi32(_mm256_madd_epi16(w.lo, alo), w.hi, ahi)
    } else {
        _mm256_add_epi32(_mm256_madd_epi16(w.lo, alo), _mm256_madd_epi16(w.hi, ahi))
    }
}

/// Lane `c` of the result: the sum of the 8 lanes of `v[c]` (exact).
#[inline(always)]
unsafe fn reduce8(v: &[__m256i; C]) -> __m256i {
    let pair = |a: __m256i, b: __m256i| {
        _mm256_add_epi32(_mm256_unpacklo_epi32(a, b), _mm256_unpackhi_epi32(a, b))
    };
    let quad = |x: __m256i, y: __m256i| {
        _mm256_add_epi32(_mm256_unpacklo_epi64(x, y), _mm256_unpackhi_epi64(x, y))
    };
    let lo = quad(pair(v[0], v[1]), pair(v[2], v[3]));
    let hi = quad(pair(v[4], v[5]), pair(v[6], v[7]));
    _mm256_add_epi32(
        _mm256_permute2x128_si256::<0x20>(lo, hi),
        _mm256_permute2x128_si256::<0x31>(lo, hi),
    )
}

/// One float32 step of a tile row: `acc = fma(isum, scale * d, acc)`.
#[inline(always)]
unsafe fn fma_step(isum: __m256i, scale: __m256, d: __m256, acc: __m256) -> __m256 {
    _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), _mm256_mul_ps(scale, d), acc)
}

/// Row pointers of activation rows `r0..r0 + R` (K values each): their int16
/// values `q`, block scales `d` and block sums `dsum` (`QuantActs`).
#[inline(always)]
#[allow(clippy::needless_range_loop)]
unsafe fn act_rows<const R: usize>(
    acts: &QuantActs,
    r0: usize,
    k: usize,
) -> ([*const i16; R], [*const f32; R], [*const f32; R]) {
    let nsub = k / 32;
    let mut aq = [std::ptr::null::<i16>(); R];
    let mut ad = [std::ptr::null::<f32>(); R];
    let mut ads = [std::ptr::null::<f32>(); R];
    for r in 0..R {
        aq[r] = acts.q.as_ptr().add((r0 + r) * k);
        ad[r] = acts.d.as_ptr().add((r0 + r) * nsub);
        ads[r] = acts.dsum.as_ptr().add((r0 + r) * nsub);
    }
    (aq, ad, ads)
}

/// Rows `r0..r0 + R` by outputs `n0..n0 + nc` (`nc <= C`; a missing
/// output's lanes are computed on a copy of the last row and not written).
#[inline(always)]
#[allow(clippy::needless_range_loop)]
unsafe fn tile<const T: u8, const R: usize, const VNNI: bool>(
    w: &QuantWeight,
    n0: usize,
    nc: usize,
    acts: &QuantActs,
    r0: usize,
    write: &mut dyn FnMut(usize, usize, &[f32]),
) {
    let nsub = w.k / 32;
    let rb = w.qtype.row_bytes(w.k);
    let mut wrow = [std::ptr::null::<u8>(); C];
    let mut wscale = [0.0f32; C];
    for c in 0..C {
        let n = n0 + c.min(nc - 1);
        wrow[c] = w.data.as_ptr().add(n * rb);
        wscale[c] = w.row_scale(n);
    }
    let (aq, ad, ads) = act_rows::<R>(acts, r0, w.k);
    let mut acc = [_mm256_setzero_ps(); R];
    let mut macc = [_mm256_setzero_ps(); R];
    for b in 0..nsub {
        prefetch_next(&wrow, C * rb + b * rb / nsub);
        let mut dec = [Dec::zero(); C];
        let mut s = [0.0f32; C];
        let mut s_hi = [0.0f32; C];
        let mut m = [0.0f32; C];
        for c in 0..C {
            dec[c] = decode::<T>(wrow[c], b, wscale[c]);
            s[c] = dec[c].scale;
            s_hi[c] = dec[c].scale_hi;
            m[c] = dec[c].min;
        }
        let s = _mm256_loadu_ps(s.as_ptr());
        for r in 0..R {
            let alo = _mm256_loadu_si256(aq[r].add(32 * b) as *const __m256i);
            let ahi = _mm256_loadu_si256(aq[r].add(32 * b + 16) as *const __m256i);
            let d = _mm256_set1_ps(*ad[r].add(b));
            let mut v = [_mm256_setzero_si256(); C];
            if groups(T) == 1 {
                for c in 0..C {
                    v[c] = dot2::<VNNI>(&dec[c], alo, ahi);
                }
                acc[r] = fma_step(reduce8(&v), s, d, acc[r]);
            } else {
                for c in 0..C {
                    v[c] = _mm256_madd_epi16(dec[c].lo, alo);
                }
                acc[r] = fma_step(reduce8(&v), s, d, acc[r]);
                for c in 0..C {
                    v[c] = _mm256_madd_epi16(dec[c].hi, ahi);
                }
                let s_hi = _mm256_loadu_ps(s_hi.as_ptr());
                acc[r] = fma_step(reduce8(&v), s_hi, d, acc[r]);
            }
            if has_min(T) {
                let dsum = _mm256_set1_ps(*ads[r].add(b));
                macc[r] = _mm256_fmadd_ps(_mm256_loadu_ps(m.as_ptr()), dsum, macc[r]);
            }
        }
    }
    for r in 0..R {
        let v = if has_min(T) {
            _mm256_add_ps(acc[r], macc[r])
        } else {
            acc[r]
        };
        let mut out = [0.0f32; C];
        _mm256_storeu_ps(out.as_mut_ptr(), v);
        write(r0 + r, n0, &out[..nc]);
    }
}

/// `tile` on int8 activations in AVX-512 VNNI, for the formats of 32-value
/// blocks: each sub-block's 32 weights as unsigned bytes (`decode_u8`) and
/// one `vpdpbusd` per output and row, the 8 outputs' lanes reduced exactly
/// and corrected by `-offset * sum(x)` to the exact `sum(q * x)`.
#[inline(always)]
#[allow(clippy::needless_range_loop)]
unsafe fn tile8<const T: u8, const R: usize>(
    w: &QuantWeight,
    n0: usize,
    nc: usize,
    acts: &QuantActs,
    r0: usize,
    write: &mut dyn FnMut(usize, usize, &[f32]),
) {
    let nsub = w.k / 32;
    let rb = w.qtype.row_bytes(w.k);
    let off = unsigned_offset(T);
    let mut wrow = [std::ptr::null::<u8>(); C];
    let mut wscale = [0.0f32; C];
    for c in 0..C {
        let n = n0 + c.min(nc - 1);
        wrow[c] = w.data.as_ptr().add(n * rb);
        wscale[c] = w.row_scale(n);
    }
    let (_, ad, ads) = act_rows::<R>(acts, r0, w.k);
    let mut aq = [std::ptr::null::<i8>(); R];
    let mut asum = [std::ptr::null::<i32>(); R];
    for r in 0..R {
        aq[r] = acts.q8.as_ptr().add((r0 + r) * w.k);
        asum[r] = acts.sum16.as_ptr().add((r0 + r) * 2 * nsub);
    }
    let mut acc = [_mm256_setzero_ps(); R];
    let mut macc = [_mm256_setzero_ps(); R];
    for b in 0..nsub {
        prefetch_next(&wrow, C * rb + b * rb / nsub);
        let mut u = [_mm256_setzero_si256(); C];
        let mut s = [0.0f32; C];
        let mut m = [0.0f32; C];
        for c in 0..C {
            (u[c], s[c], m[c]) = decode_u8::<T>(wrow[c], b, wscale[c]);
        }
        let s = _mm256_loadu_ps(s.as_ptr());
        for r in 0..R {
            let x = _mm256_loadu_si256(aq[r].add(32 * b) as *const __m256i);
            let d = _mm256_set1_ps(*ad[r].add(b));
            let mut v = [_mm256_setzero_si256(); C];
            for c in 0..C {
                v[c] = _mm256_dpbusd_epi32(_mm256_setzero_si256(), u[c], x);
            }
            let mut isum = reduce8(&v);
            if off != 0 {
                let sx = *asum[r].add(2 * b) + *asum[r].add(2 * b + 1);
                isum = _mm256_sub_epi32(isum, _mm256_set1_epi32(off * sx));
            }
            acc[r] = fma_step(isum, s, d, acc[r]);
            if has_min(T) {
                let dsum = _mm256_set1_ps(*ads[r].add(b));
                macc[r] = _mm256_fmadd_ps(_mm256_loadu_ps(m.as_ptr()), dsum, macc[r]);
            }
        }
    }
    for r in 0..R {
        let v = if has_min(T) {
            _mm256_add_ps(acc[r], macc[r])
        } else {
            acc[r]
        };
        let mut out = [0.0f32; C];
        _mm256_storeu_ps(out.as_mut_ptr(), v);
        write(r0 + r, n0, &out[..nc]);
    }
}

/// Outputs `outputs` by rows `rows` (1 to 4 rows).
#[inline(always)]
pub(super) unsafe fn item_few<const T: u8, const VNNI: bool>(
    w: &QuantWeight,
    outputs: Range<usize>,
    acts: &QuantActs,
    rows: Range<usize>,
    write: &mut dyn FnMut(usize, usize, &[f32]),
) {
    for n0 in outputs.clone().step_by(C) {
        let nc = C.min(outputs.end - n0);
        let r0 = rows.start;
        if T == Q4K || T == Q5K {
            match rows.len() {
                3 => tile_k4::<T, 3, VNNI>(w, n0, nc, acts, r0, write),
                2 => tile_k4::<T, 2, VNNI>(w, n0, nc, acts, r0, write),
                1 => tile_k4::<T, 1, VNNI>(w, n0, nc, acts, r0, write),
                n => unreachable!("few-rows tile of {n} rows"),
            }
            continue;
        }
        if VNNI && acts.scheme == ActQuant::Int8 && T != Q6K {
            match rows.len() {
                4 => tile8::<T, 4>(w, n0, nc, acts, r0, write),
                3 => tile8::<T, 3>(w, n0, nc, acts, r0, write),
                2 => tile8::<T, 2>(w, n0, nc, acts, r0, write),
                1 => tile8::<T, 1>(w, n0, nc, acts, r0, write),
                n => unreachable!("few-rows tile of {n} rows"),
            }
            continue;
        }
        match rows.len() {
            4 => tile::<T, 4, VNNI>(w, n0, nc, acts, r0, write),
            3 => tile::<T, 3, VNNI>(w, n0, nc, acts, r0, write),
            2 => tile::<T, 2, VNNI>(w, n0, nc, acts, r0, write),
            1 => tile::<T, 1, VNNI>(w, n0, nc, acts, r0, write),
            n => unreachable!("few-rows tile of {n} rows"),
        }
    }
}

/// Words of `w` with bit `j` set: 16, else 0.
#[inline(always)]
unsafe fn bit_to_16(w: __m256i, j: usize) -> __m256i {
    let bit = _mm256_set1_epi16(1 << j);
    let set = _mm256_cmpeq_epi16(_mm256_and_si256(w, bit), bit);
    _mm256_and_si256(set, _mm256_set1_epi16(16))
}

/// 16 bytes at `p` zero-extended to 16 words.
#[inline(always)]
unsafe fn zx(p: *const u8) -> __m256i {
    _mm256_cvtepu8_epi16(_mm_loadu_si128(p as *const __m128i))
}

/// Sub-block `j` (0..8) of the Q4_K / Q5_K block at `p` as int16, values
/// `0..16` and `16..32`, read straight from its bytes (zero-extending loads).
#[inline(always)]
unsafe fn k4_ints<const T: u8>(p: *const u8, j: usize) -> (__m256i, __m256i) {
    let qs = p.add(if T == Q4K { 16 } else { 48 } + 32 * (j / 2));
    let (w0, w1) = (zx(qs), zx(qs.add(16)));
    let low = _mm256_set1_epi16(0x0f);
    let (mut lo, mut hi) = if j.is_multiple_of(2) {
        (_mm256_and_si256(w0, low), _mm256_and_si256(w1, low))
    } else {
        (_mm256_srli_epi16::<4>(w0), _mm256_srli_epi16::<4>(w1))
    };
    if T == Q5K {
        lo = _mm256_or_si256(lo, bit_to_16(zx(p.add(16)), j));
        hi = _mm256_or_si256(hi, bit_to_16(zx(p.add(32)), j));
    }
    (lo, hi)
}

/// The Q4_K / Q5_K tile (`tile`'s arithmetic): per block, each output's 8
/// scales and minimums (`blocks::decode`'s float32 values) into tables
/// with the outputs in the lanes, then per sub-block the integers of
/// `k4_ints`.
#[inline(always)]
#[allow(clippy::needless_range_loop)]
unsafe fn tile_k4<const T: u8, const R: usize, const VNNI: bool>(
    w: &QuantWeight,
    n0: usize,
    nc: usize,
    acts: &QuantActs,
    r0: usize,
    write: &mut dyn FnMut(usize, usize, &[f32]),
) {
    let nsub = w.k / 32;
    let rb = w.qtype.row_bytes(w.k);
    let bb = rb / (nsub / 8);
    let mut wrow = [std::ptr::null::<u8>(); C];
    for c in 0..C {
        wrow[c] = w.data.as_ptr().add((n0 + c.min(nc - 1)) * rb);
    }
    let (aq, ad, ads) = act_rows::<R>(acts, r0, w.k);
    let mut acc = [_mm256_setzero_ps(); R];
    let mut macc = [_mm256_setzero_ps(); R];
    for kb in (0..nsub).step_by(8) {
        let mut st = [[0.0f32; C]; 8];
        let mut mt = [[0.0f32; C]; 8];
        for c in 0..C {
            let p = wrow[c].add(bb * (kb / 8));
            let (d, dmin) = (f16(p), f16(p.add(2)));
            let s = std::slice::from_raw_parts(p.add(4), 12);
            for j in 0..8 {
                let (sc, m) = scale_min_k4(j, s);
                st[j][c] = d * sc as f32;
                mt[j][c] = -(dmin * m as f32);
            }
        }
        for j in 0..8 {
            let b = kb + j;
            prefetch_next(&wrow, C * rb + b * rb / nsub);
            let mut lo = [_mm256_setzero_si256(); C];
            let mut hi = [_mm256_setzero_si256(); C];
            for c in 0..C {
                (lo[c], hi[c]) = k4_ints::<T>(wrow[c].add(bb * (kb / 8)), j);
            }
            let s = _mm256_loadu_ps(st[j].as_ptr());
            let m = _mm256_loadu_ps(mt[j].as_ptr());
            for r in 0..R {
                let alo = _mm256_loadu_si256(aq[r].add(32 * b) as *const __m256i);
                let ahi = _mm256_loadu_si256(aq[r].add(32 * b + 16) as *const __m256i);
                let d = _mm256_set1_ps(*ad[r].add(b));
                let mut v = [_mm256_setzero_si256(); C];
                for c in 0..C {
                    v[c] = if VNNI {
                        _mm256_dpwssd_epi32(_mm256_madd_epi16(lo[c], alo), hi[c], ahi)
                    } else {
                        _mm256_add_epi32(
                            _mm256_madd_epi16(lo[c], alo),
                            _mm256_madd_epi16(hi[c], ahi),
                        )
                    };
                }
                acc[r] = fma_step(reduce8(&v), s, d, acc[r]);
                let dsum = _mm256_set1_ps(*ads[r].add(b));
                macc[r] = _mm256_fmadd_ps(m, dsum, macc[r]);
            }
        }
    }
    for r in 0..R {
        let mut out = [0.0f32; C];
        _mm256_storeu_ps(out.as_mut_ptr(), _mm256_add_ps(acc[r], macc[r]));
        write(r0 + r, n0, &out[..nc]);
    }
}
