//! The int8 panel's fill in AVX-512 (`Panel::fill8` with `W = 2`, the
//! AVX-512 VNNI and AMX variants): a group of 16 outputs decoded together,
//! output `c` of the group in 32-bit lane `c` of every vector. Each
//! output's block bytes are read 16 at a time (one 128-bit lane group of a
//! zmm per output, four outputs a zmm) and transposed in 4 x 4 blocks of
//! dwords, so that one vector holds the same 4 bytes of the 16 outputs'
//! blocks, which is a quad of the panel after the format's masks and shifts
//! (the same bytes `decode::decode_step_u8` gives per output). The scales
//! are computed 16 lanes at a time with the same float32 operations as
//! `decode`'s. Formats: Q4_0, Q4_1, Q8_0, Q4_K, Q5_K, Q6_K (`supported`);
//! the others keep `Panel::fill8`. The next step's bytes of the 16 outputs
//! are asked for two outputs a sub-block, spread over the fill.

use std::arch::x86_64::*;
use std::ops::Range;

use super::super::format::QuantWeight;
use super::decode::{groups, has_min, prefetch_next, KC, Q4K, Q4_0, Q4_1, Q5K, Q6K, Q8_0};
use super::panel::{Panel, QUADS};

/// Whether `fill` handles format `T`.
pub(super) const fn supported(t: u8) -> bool {
    matches!(t, Q4_0 | Q4_1 | Q8_0 | Q4K | Q5K | Q6K)
}

/// Whether `fill` handles the rows of `w`: the 16 rows of a group within
/// the int32 offsets of a gather.
pub(super) fn fits(w: &QuantWeight) -> bool {
    16 * w.qtype.row_bytes(w.k) <= i32::MAX as usize
}

/// Lane `c` of result `w` is the dword at `rows[c] + off + 4 w` (16 bytes
/// of each output: four 128-bit loads a zmm, zmm `k` holding rows `k, 4 +
/// k, 8 + k, 12 + k` in its lane groups, then a 4 x 4 dword transpose in
/// each lane group, which puts row `4 i + k` in lane `4 i + k`).
#[inline(always)]
unsafe fn t16x4(rows: &[*const u8; 16], off: usize) -> [__m512i; 4] {
    let ld = |c: usize| _mm_loadu_si128(rows[c].add(off) as *const __m128i);
    let z = |k: usize| {
        let v = _mm512_castsi128_si512(ld(k));
        let v = _mm512_inserti32x4::<1>(v, ld(4 + k));
        let v = _mm512_inserti32x4::<2>(v, ld(8 + k));
        _mm512_inserti32x4::<3>(v, ld(12 + k))
    };
    let (z0, z1, z2, z3) = (z(0), z(1), z(2), z(3));
    let t0 = _mm512_unpacklo_epi32(z0, z1);
    let t1 = _mm512_unpackhi_epi32(z0, z1);
    let t2 = _mm512_unpacklo_epi32(z2, z3);
    let t3 = _mm512_unpackhi_epi32(z2, z3);
    [
        _mm512_unpacklo_epi64(t0, t2),
        _mm512_unpackhi_epi64(t0, t2),
        _mm512_unpacklo_epi64(t1, t3),
        _mm512_unpackhi_epi64(t1, t3),
    ]
}

/// `t16x4` of 32 bytes: lane `c` of result `w` (0..8) is the dword at
/// `rows[c] + off + 4 w`.
#[inline(always)]
unsafe fn t16x8(rows: &[*const u8; 16], off: usize) -> [__m512i; 8] {
    let a = t16x4(rows, off);
    let b = t16x4(rows, off + 16);
    [a[0], a[1], a[2], a[3], b[0], b[1], b[2], b[3]]
}

/// The float16 in the low (`HI = false`) or high half of each dword of
/// `v`, as float32 (exact, as `decode::f16`).
#[inline(always)]
unsafe fn f16_lanes<const HI: bool>(v: __m512i) -> __m512 {
    let v = if HI { _mm512_srli_epi32::<16>(v) } else { v };
    _mm512_cvtph_ps(_mm512_cvtepi32_epi16(v))
}

/// Byte `b` of each dword of `v` as an int32, zero-extended.
#[inline(always)]
unsafe fn byte(v: __m512i, b: usize) -> __m512i {
    _mm512_and_si512(
        _mm512_srl_epi32(v, _mm_cvtsi32_si128(8 * b as i32)),
        _mm512_set1_epi32(0xff),
    )
}

/// The panel's writer of one group of 16 outputs: the quads, scales and
/// minimums of sub-block `j`, lanes past the item's outputs zeroed (as
/// `Panel::fill8`'s zero sub-blocks).
struct Out {
    q8: *mut __m512i,
    s: *mut f32,
    m: *mut f32,
    og: usize,
    valid: __mmask16,
}

impl Out {
    #[inline(always)]
    unsafe fn quad(&self, j: usize, p: usize, v: __m512i) {
        let at = (self.og * KC + j) * QUADS + p;
        _mm512_storeu_si512(self.q8.add(at), _mm512_maskz_mov_epi32(self.valid, v));
    }

    #[inline(always)]
    unsafe fn scale(&self, g: usize, j: usize, gi: usize, v: __m512) {
        let at = ((self.og * KC + j) * g + gi) * 16;
        _mm512_storeu_ps(self.s.add(at), _mm512_maskz_mov_ps(self.valid, v));
    }

    #[inline(always)]
    unsafe fn min(&self, j: usize, v: __m512) {
        let at = (self.og * KC + j) * 16;
        _mm512_storeu_ps(self.m.add(at), _mm512_maskz_mov_ps(self.valid, v));
    }
}

/// The step's sub-blocks `kb..kb + kn` of the 16 outputs at `rows` (`nsub`
/// sub-blocks a row) into `out`, after asking for rows `2 j, 2 j + 1`'s next
/// step at sub-block `j`.
#[inline(always)]
#[allow(clippy::needless_range_loop)]
unsafe fn group<const T: u8>(
    rows: &[*const u8; 16],
    idx: __m512i,
    out: &Out,
    kb: usize,
    kn: usize,
    nsub: usize,
) {
    let low4 = _mm512_set1_epi8(0x0f);
    let ask = |j: usize| {
        if kn == KC {
            prefetch_next::<T>(rows[2 * j], kb, nsub);
            prefetch_next::<T>(rows[2 * j + 1], kb, nsub);
        }
    };
    match T {
        Q4_0 | Q4_1 => {
            let (bb, qs) = if T == Q4_0 { (18, 2) } else { (20, 4) };
            for j in 0..kn {
                ask(j);
                let at = bb * (kb + j);
                let x = t16x4(rows, at + qs);
                for p in 0..4 {
                    out.quad(j, p, _mm512_and_si512(x[p], low4));
                    out.quad(
                        j,
                        4 + p,
                        _mm512_and_si512(_mm512_srli_epi32::<4>(x[p]), low4),
                    );
                }
                let h = header(rows, idx, at);
                out.scale(1, j, 0, f16_lanes::<false>(h));
                if T == Q4_1 {
                    out.min(j, f16_lanes::<true>(h));
                }
            }
        }
        Q8_0 => {
            let flip = _mm512_set1_epi8(-128);
            for j in 0..kn {
                ask(j);
                let at = 34 * (kb + j);
                let x = t16x8(rows, at + 2);
                for p in 0..8 {
                    out.quad(j, p, _mm512_xor_si512(x[p], flip));
                }
                out.scale(1, j, 0, f16_lanes::<false>(header(rows, idx, at)));
            }
        }
        Q4K | Q5K => {
            let bb = if T == Q4K { 144 } else { 176 };
            let at = bb * (kb / 8);
            // Dwords: float16 d and dmin, then the 12 bytes of 6-bit
            // scales and minimums (`blocks::scale_min_k4`).
            let hd = t16x4(rows, at);
            let (d, dmin) = (f16_lanes::<false>(hd[0]), f16_lanes::<true>(hd[0]));
            let qh = if T == Q5K {
                t16x8(rows, at + 16)
            } else {
                [_mm512_setzero_si512(); 8]
            };
            let qs_at = at + if T == Q4K { 16 } else { 48 };
            for i in 0..4 {
                let x = t16x8(rows, qs_at + 32 * i);
                for half in 0..2 {
                    let j = 2 * i + half;
                    ask(j);
                    for p in 0..8 {
                        let mut q = if half == 0 {
                            x[p]
                        } else {
                            _mm512_srli_epi32::<4>(x[p])
                        };
                        q = _mm512_and_si512(q, low4);
                        if T == Q5K {
                            let bit =
                                _mm512_test_epi8_mask(qh[p], _mm512_set1_epi8((1u8 << j) as i8));
                            q = _mm512_or_si512(
                                q,
                                _mm512_maskz_mov_epi8(bit, _mm512_set1_epi8(0x10)),
                            );
                        }
                        out.quad(j, p, q);
                    }
                    let (sc, m) = if j < 4 {
                        (
                            _mm512_and_si512(byte(hd[1], j), _mm512_set1_epi32(63)),
                            _mm512_and_si512(byte(hd[2], j), _mm512_set1_epi32(63)),
                        )
                    } else {
                        let (a, b, c) =
                            (byte(hd[1], j - 4), byte(hd[2], j - 4), byte(hd[3], j - 4));
                        let hi2 = |v: __m512i| _mm512_slli_epi32::<4>(_mm512_srli_epi32::<6>(v));
                        (
                            _mm512_or_si512(_mm512_and_si512(c, _mm512_set1_epi32(0x0f)), hi2(a)),
                            _mm512_or_si512(_mm512_srli_epi32::<4>(c), hi2(b)),
                        )
                    };
                    out.scale(1, j, 0, _mm512_mul_ps(d, _mm512_cvtepi32_ps(sc)));
                    let mn = _mm512_mul_ps(dmin, _mm512_cvtepi32_ps(m));
                    out.min(j, _mm512_xor_ps(mn, _mm512_set1_ps(-0.0)));
                }
            }
        }
        _ => {
            // Q6_K: 128 bytes of low nibbles, 64 of high bit pairs, 16 int8
            // scales, float16 d at 208 (read as the high half of the dword
            // at 206, inside the block).
            let at = 210 * (kb / 8);
            let d = f16_lanes::<true>(header(rows, idx, at + 206));
            let sc = t16x4(rows, at + 192);
            let int8 = |s: usize| {
                let v = _mm512_sll_epi32(sc[s / 4], _mm_cvtsi32_si128(24 - 8 * (s % 4) as i32));
                _mm512_cvtepi32_ps(_mm512_srai_epi32::<24>(v))
            };
            for h in 0..2 {
                let ql = [t16x8(rows, at + 64 * h), t16x8(rows, at + 64 * h + 32)];
                let qh = t16x8(rows, at + 128 + 32 * h);
                for t in 0..4 {
                    let j = 4 * h + t;
                    ask(j);
                    for p in 0..8 {
                        let lo = _mm512_and_si512(
                            _mm512_srl_epi32(ql[t % 2][p], _mm_cvtsi32_si128(4 * (t as i32 / 2))),
                            low4,
                        );
                        let hb = _mm512_and_si512(
                            _mm512_srl_epi32(qh[p], _mm_cvtsi32_si128(2 * t as i32)),
                            _mm512_set1_epi8(0x03),
                        );
                        out.quad(j, p, _mm512_or_si512(lo, _mm512_slli_epi32::<4>(hb)));
                    }
                    let s = 8 * h + 2 * t;
                    out.scale(2, j, 0, _mm512_mul_ps(d, int8(s)));
                    out.scale(2, j, 1, _mm512_mul_ps(d, int8(s + 1)));
                }
            }
        }
    }
}

/// Lane `c`: the dword at `rows[c] + off` (where the 16 bytes from `off`
/// may run past the block and one dword does not), gathered at `idx`
/// (lane `c`: `rows[c] - rows[0]`).
#[inline(always)]
unsafe fn header(rows: &[*const u8; 16], idx: __m512i, off: usize) -> __m512i {
    _mm512_i32gather_epi32::<1>(idx, rows[0].add(off) as *const _)
}

impl Panel {
    /// `fill8::<T, 2>` in AVX-512 (module docs): sub-blocks `kb..kb + kn`
    /// of the outputs `outputs` of `w` (`nsub` sub-blocks a row). Only for a
    /// CPU with AVX-512F and AVX-512BW, `supported(T)` and `fits(w)`; the panel sized
    /// by `reset::<T, 2>(_, true)`.
    #[inline(always)]
    pub(super) unsafe fn fill8_512<const T: u8>(
        &mut self,
        w: &QuantWeight,
        outputs: &Range<usize>,
        kb: usize,
        kn: usize,
        nsub: usize,
    ) {
        debug_assert!(supported(T) && fits(w));
        let rb = w.qtype.row_bytes(w.k);
        let nc = outputs.len();
        let g = groups(T);
        debug_assert!(self.s.len() >= nc.div_ceil(16) * KC * g * 16);
        debug_assert!(!has_min(T) || self.m.len() >= nc.div_ceil(16) * KC * 16);
        for og in 0..nc.div_ceil(16) {
            let have = (nc - 16 * og).min(16);
            // Lane `c` is output `16 og + c`; lanes past the outputs read
            // the last output and are zeroed when written.
            let rows: [*const u8; 16] = std::array::from_fn(|c| {
                let n = outputs.start + 16 * og + c.min(have - 1);
                w.data.as_ptr().add(n * rb)
            });
            let out = Out {
                q8: self.q8.as_mut_ptr() as *mut __m512i,
                s: self.s.as_mut_ptr(),
                m: self.m.as_mut_ptr(),
                og,
                valid: if have == 16 {
                    0xffff
                } else {
                    (1u16 << have) - 1
                },
            };
            let idx: [i32; 16] = std::array::from_fn(|c| rows[c].offset_from(rows[0]) as i32);
            let idx = _mm512_loadu_si512(idx.as_ptr() as *const __m512i);
            group::<T>(&rows, idx, &out, kb, kn, nsub);
        }
    }
}
