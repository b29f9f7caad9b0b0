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

/// An `R` x `C` tile of format `T`: rows `r0..r0 + R`, outputs `n0..n0 + C`,
/// each sub-block decoded where it is used.
#[inline(always)]
unsafe fn tile_body<const T: u8, const R: usize, const C: usize, const VNNI: bool>(
    w: &QuantWeight,
    n0: usize,
    acts: &QuantActs,
    r0: usize,
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
            dec[c] = decode::<T>(wrow[c], b, wscale[c]);
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
unsafe fn tile_any<const T: u8, const VNNI: bool>(
    w: &QuantWeight,
    n0: usize,
    nc: usize,
    acts: &QuantActs,
    r0: usize,
    nr: usize,
) -> TileOut {
    match (nr, nc) {
        (4, 2) => tile_body::<T, 4, 2, VNNI>(w, n0, acts, r0),
        (4, 1) => tile_body::<T, 4, 1, VNNI>(w, n0, acts, r0),
        (3, 2) => tile_body::<T, 3, 2, VNNI>(w, n0, acts, r0),
        (3, 1) => tile_body::<T, 3, 1, VNNI>(w, n0, acts, r0),
        (2, 2) => tile_body::<T, 2, 2, VNNI>(w, n0, acts, r0),
        (2, 1) => tile_body::<T, 2, 1, VNNI>(w, n0, acts, r0),
        (1, 2) => tile_body::<T, 1, 2, VNNI>(w, n0, acts, r0),
        (1, 1) => tile_body::<T, 1, 1, VNNI>(w, n0, acts, r0),
        _ => [[0.0; MAX_C]; MAX_R],
    }
}

/// Sub-blocks of 32 values per K step of the many-rows path: the step's
/// decoded panel (16 outputs: 8 KiB) and activations (64 rows: 32 KiB) stay
/// in L1/L2 while every tile of the item reads them.
const KC: usize = 8;
/// Rows by outputs of a many-rows tile: 8 float32 accumulators in
/// registers, each weight sub-block (2 vectors) loaded once per 4 rows and
/// each activation sub-block once per 2 outputs.
const MR: usize = 4;
const MC: usize = 2;

/// A thread's scratch for the many-rows path, kept between calls.
#[derive(Default)]
struct Scratch {
    /// `[output][j][2]`: sub-block `kb + j`'s int16 values (low, high half).
    q: Vec<__m256i>,
    /// `[output][half][KC]`: the sub-blocks' scales (0 past the step).
    s: Vec<f32>,
    /// `[output][KC]`: the sub-blocks' minimums.
    mins: Vec<f32>,
    /// `[row of the tile][output][half][KC]`: `scale * d` of the step.
    sd: Vec<f32>,
    /// `[row][output]`: the lane accumulators across steps.
    acc: Vec<__m256>,
    /// `[output][row]`: the minimum terms across steps.
    macc: Vec<f32>,
    /// `[j][row]`: the step's `d * sum(q)` per row.
    dsum: Vec<f32>,
}

thread_local! {
    static SCRATCH: RefCell<Scratch> = RefCell::new(Scratch::default());
}

/// The accumulators of an `R` x `C` tile (rows `r0..`, outputs `c0..` of the
/// item) over the step's `kn` sub-blocks from `kb`, in the operations of
/// `tile_body` (each lane's sequence of fused multiply-adds over the
/// sub-blocks is the same, only split across steps).
#[inline(always)]
#[allow(clippy::too_many_arguments, clippy::needless_range_loop)]
unsafe fn many_tile<const T: u8, const R: usize, const C: usize, const VNNI: bool>(
    sc: &mut Scratch,
    nc: usize,
    acts: &QuantActs,
    row0: usize,
    r0: usize,
    c0: usize,
    kb: usize,
    kn: usize,
) {
    let k = acts.k;
    let mut aq = [std::ptr::null::<i16>(); R];
    for r in 0..R {
        aq[r] = acts.q.as_ptr().add((row0 + r0 + r) * k + 32 * kb);
    }
    let accp = sc.acc.as_mut_ptr();
    let mut acc = [[_mm256_setzero_ps(); C]; R];
    for r in 0..R {
        for c in 0..C {
            acc[r][c] = *accp.add((r0 + r) * nc + c0 + c);
        }
    }
    let q = sc.q.as_ptr();
    let sd = sc.sd.as_ptr();
    for j in 0..kn {
        let mut wlo = [_mm256_setzero_si256(); C];
        let mut whi = [_mm256_setzero_si256(); C];
        for c in 0..C {
            wlo[c] = *q.add(((c0 + c) * KC + j) * 2);
            whi[c] = *q.add(((c0 + c) * KC + j) * 2 + 1);
        }
        for r in 0..R {
            let alo = _mm256_loadu_si256(aq[r].add(32 * j) as *const __m256i);
            let ahi = _mm256_loadu_si256(aq[r].add(32 * j + 16) as *const __m256i);
            for c in 0..C {
                let at = sd.add(((r * nc + c0 + c) * 2) * KC + j);
                if T == Q6K {
                    let lo = _mm256_cvtepi32_ps(_mm256_madd_epi16(wlo[c], alo));
                    let hi = _mm256_cvtepi32_ps(_mm256_madd_epi16(whi[c], ahi));
                    acc[r][c] = _mm256_fmadd_ps(lo, _mm256_broadcast_ss(&*at), acc[r][c]);
                    acc[r][c] = _mm256_fmadd_ps(hi, _mm256_broadcast_ss(&*at.add(KC)), acc[r][c]);
                } else {
                    let w = Dec {
                        lo: wlo[c],
                        hi: whi[c],
                        s0: _mm256_setzero_ps(),
                        s1: _mm256_setzero_ps(),
                        min: 0.0,
                    };
                    let isum = _mm256_cvtepi32_ps(dot::<VNNI>(&w, alo, ahi));
                    acc[r][c] = _mm256_fmadd_ps(isum, _mm256_broadcast_ss(&*at), acc[r][c]);
                }
            }
        }
    }
    for r in 0..R {
        for c in 0..C {
            *accp.add((r0 + r) * nc + c0 + c) = acc[r][c];
        }
    }
}

/// `many_tile` for `nr` x `nc` (`nr <= MR`, `nc <= MC`).
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn many_tile_any<const T: u8, const VNNI: bool>(
    sc: &mut Scratch,
    nc_all: usize,
    acts: &QuantActs,
    row0: usize,
    r0: usize,
    nr: usize,
    c0: usize,
    nc: usize,
    kb: usize,
    kn: usize,
) {
    let a = (sc, nc_all, acts, row0, r0, c0, kb, kn);
    macro_rules! go {
        ($r:literal, $c:literal) => {
            many_tile::<T, $r, $c, VNNI>(a.0, a.1, a.2, a.3, a.4, a.5, a.6, a.7)
        };
    }
    match (nr, nc) {
        (4, 2) => go!(4, 2),
        (4, 1) => go!(4, 1),
        (3, 2) => go!(3, 2),
        (3, 1) => go!(3, 1),
        (2, 2) => go!(2, 2),
        (2, 1) => go!(2, 1),
        (1, 2) => go!(1, 2),
        (1, 1) => go!(1, 1),
        _ => unreachable!("many-rows tile {nr} x {nc}"),
    }
}

/// Outputs `outputs` by rows `rows` when the rows span more than one tile:
/// K in steps of `KC` sub-blocks; per step the outputs' sub-blocks are
/// decoded once into the thread's panel, the products `scale * d` formed
/// for a tile's rows at once, and every `MR` x `MC` tile accumulates the
/// step into its lanes (kept in the scratch between steps). The minimum
/// terms run over 8 rows per vector, each lane its own row's sequence of
/// fused multiply-adds. Every output gets the operations of `tile_body`,
/// in the same order, so the same bits as at one row.
#[inline(always)]
unsafe fn item_many<const T: u8, const VNNI: bool>(
    w: &QuantWeight,
    outputs: Range<usize>,
    acts: &QuantActs,
    rows: Range<usize>,
    write: &mut dyn FnMut(usize, usize, f32),
) {
    let nsub = w.k / 32;
    let (nr, nc) = (rows.len(), outputs.len());
    let row0 = rows.start;
    let rb = w.qtype.row_bytes(w.k);
    let mut sc = SCRATCH.take();
    sc.q.clear();
    sc.q.resize(nc * KC * 2, _mm256_setzero_si256());
    sc.s.clear();
    sc.s.resize(nc * 2 * KC, 0.0);
    sc.mins.clear();
    sc.mins.resize(nc * KC, 0.0);
    sc.sd.clear();
    sc.sd.resize(MR * nc * 2 * KC, 0.0);
    sc.acc.clear();
    sc.acc.resize(nr * nc, _mm256_setzero_ps());
    sc.macc.clear();
    sc.macc.resize(nc * nr, 0.0);
    sc.dsum.clear();
    sc.dsum.resize(KC * nr, 0.0);
    for kb in (0..nsub).step_by(KC) {
        let kn = KC.min(nsub - kb);
        for c in 0..nc {
            let n = outputs.start + c;
            let row = w.data.as_ptr().add(n * rb);
            let scale = w.row_scale(n);
            for j in 0..KC {
                let (lo, hi, s0, s1, min) = if j < kn {
                    let d = decode::<T>(row, kb + j, scale);
                    let s0 = _mm_cvtss_f32(_mm256_castps256_ps128(d.s0));
                    let s1 = _mm_cvtss_f32(_mm256_castps256_ps128(d.s1));
                    (d.lo, d.hi, s0, s1, d.min)
                } else {
                    let z = _mm256_setzero_si256();
                    (z, z, 0.0, 0.0, 0.0)
                };
                sc.q[(c * KC + j) * 2] = lo;
                sc.q[(c * KC + j) * 2 + 1] = hi;
                sc.s[(c * 2) * KC + j] = s0;
                sc.s[(c * 2 + 1) * KC + j] = s1;
                sc.mins[c * KC + j] = min;
            }
        }
        if has_min(T) {
            for j in 0..kn {
                for r in 0..nr {
                    sc.dsum[j * nr + r] = *acts.dsum.as_ptr().add((row0 + r) * nsub + kb + j);
                }
            }
            for c in 0..nc {
                let m = sc.macc.as_mut_ptr().add(c * nr);
                for j in 0..kn {
                    let min = sc.mins[c * KC + j];
                    let mv = _mm256_set1_ps(min);
                    let ds = sc.dsum.as_ptr().add(j * nr);
                    let mut r = 0;
                    while r + 8 <= nr {
                        let v = _mm256_loadu_ps(m.add(r));
                        let v = _mm256_fmadd_ps(mv, _mm256_loadu_ps(ds.add(r)), v);
                        _mm256_storeu_ps(m.add(r), v);
                        r += 8;
                    }
                    while r < nr {
                        *m.add(r) = min.mul_add(*ds.add(r), *m.add(r));
                        r += 1;
                    }
                }
            }
        }
        let halves = if T == Q6K { 2 } else { 1 };
        for r0 in (0..nr).step_by(MR) {
            let tr = MR.min(nr - r0);
            // `scale * d` for the tile's rows and every output.
            let mut d = [[0.0f32; KC]; MR];
            for (r, dr) in d.iter_mut().enumerate().take(tr) {
                let src = acts.d.as_ptr().add((row0 + r0 + r) * nsub + kb);
                for (j, v) in dr.iter_mut().enumerate().take(kn) {
                    *v = *src.add(j);
                }
            }
            let sdp = sc.sd.as_mut_ptr();
            for (r, dr) in d.iter().enumerate().take(tr) {
                let dv = _mm256_loadu_ps(dr.as_ptr());
                for c in 0..nc {
                    for h in 0..halves {
                        let sv = _mm256_loadu_ps(sc.s.as_ptr().add((c * 2 + h) * KC));
                        _mm256_storeu_ps(
                            sdp.add(((r * nc + c) * 2 + h) * KC),
                            _mm256_mul_ps(sv, dv),
                        );
                    }
                }
            }
            for c0 in (0..nc).step_by(MC) {
                let tc = MC.min(nc - c0);
                many_tile_any::<T, VNNI>(&mut sc, nc, acts, row0, r0, tr, c0, tc, kb, kn);
            }
        }
    }
    for r in 0..nr {
        for c in 0..nc {
            let mut v = hsum8(sc.acc[r * nc + c]);
            if has_min(T) {
                v += sc.macc[c * nr + r];
            }
            write(row0 + r, outputs.start + c, v);
        }
    }
    SCRATCH.set(sc);
}

/// Outputs `outputs` by rows `rows` (`kernel::ItemFn`): one row tile in
/// `tile_body`, each sub-block decoded where it is used; more rows in
/// `item_many`.
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
    if rows.len() > MAX_R {
        return item_many::<T, VNNI>(w, outputs, acts, rows, write);
    }
    for r0 in rows.clone().step_by(MAX_R) {
        let nr = MAX_R.min(rows.end - r0);
        for n0 in outputs.clone().step_by(MAX_C) {
            let nc = MAX_C.min(outputs.end - n0);
            let tile = tile_any::<T, VNNI>(w, n0, nc, acts, r0, nr);
            for (r, row) in tile.iter().enumerate().take(nr) {
                for (c, &v) in row.iter().enumerate().take(nc) {
                    write(r0 + r, n0 + c, v);
                }
            }
        }
    }
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
/// for a CPU that runs it (`cpu_features::avx2_fma_f16c`, `avx512_vnni`).
pub(crate) fn item_fn(qtype: QuantType, vnni: bool) -> ItemFn {
    if vnni {
        for_vnni::<true>(qtype)
    } else {
        for_vnni::<false>(qtype)
    }
}
