//! The many-rows path's panel: a step of `KC` sub-blocks of an item's
//! outputs decoded once and laid out with the outputs in the lanes, so that
//! a register tile multiplies `L` outputs by one row's int16 pair (`fill`)
//! or by one row's 4 int8 values (`fill8`, the weights as unsigned bytes
//! for `vpdpbusd`) with one instruction. `L` is 8 (AVX2) or 16 (AVX-512,
//! `W = 2` halves of 8).

use std::arch::x86_64::*;
use std::ops::Range;

use super::super::format::QuantWeight;
use super::decode::{decode_step, decode_step_u8, groups, has_min, Dec, U8Sub, KC};

/// Pairs of int16 values (32-bit lanes) per sub-block.
pub(super) const PAIRS: usize = 16;
/// Quads of int8 values (32-bit lanes) per sub-block.
pub(super) const QUADS: usize = 8;

/// The decoded step of an item's outputs, `og` the groups of `L = 8 W`
/// outputs.
#[derive(Default)]
pub(super) struct Panel {
    /// `[og][KC][PAIRS][W]`: pair `p` of sub-block `j` of the group's
    /// outputs (lane `8 h + c` of half `h`: output `L og + 8 h + c`).
    pub q: Vec<__m256i>,
    /// `[og][KC][QUADS][W]` (`fill8`): quad `p` of sub-block `j` of the
    /// group's outputs as unsigned bytes (`q + unsigned_offset`), lane `8 h
    /// + c` of half `h` holding output `L og + 8 h + c`.
    pub q8: Vec<__m256i>,
    /// `[og][KC][groups][L]`: the scale groups' scales.
    pub s: Vec<f32>,
    /// `[og][KC][L]`: the minimums (formats with a minimum).
    pub m: Vec<f32>,
}

/// Resize `v` to `n` copies of `x`.
pub(super) fn reset<X: Copy>(v: &mut Vec<X>, n: usize, x: X) {
    v.clear();
    v.resize(n, x);
}

/// Grow `v` to at least `n` entries (new ones `x`), keeping what it holds.
fn grow<X: Copy>(v: &mut Vec<X>, n: usize, x: X) {
    if v.len() < n {
        v.resize(n, x);
    }
}

/// The transpose of 8 vectors of 8 32-bit lanes: lane `c` of result `p` is
/// lane `p` of `r[c]`.
#[inline(always)]
unsafe fn transpose8(r: &[__m256i; 8]) -> [__m256i; 8] {
    let t0 = _mm256_unpacklo_epi32(r[0], r[1]);
    let t1 = _mm256_unpackhi_epi32(r[0], r[1]);
    let t2 = _mm256_unpacklo_epi32(r[2], r[3]);
    let t3 = _mm256_unpackhi_epi32(r[2], r[3]);
    let t4 = _mm256_unpacklo_epi32(r[4], r[5]);
    let t5 = _mm256_unpackhi_epi32(r[4], r[5]);
    let t6 = _mm256_unpacklo_epi32(r[6], r[7]);
    let t7 = _mm256_unpackhi_epi32(r[6], r[7]);
    let u0 = _mm256_unpacklo_epi64(t0, t2);
    let u1 = _mm256_unpackhi_epi64(t0, t2);
    let u2 = _mm256_unpacklo_epi64(t1, t3);
    let u3 = _mm256_unpackhi_epi64(t1, t3);
    let u4 = _mm256_unpacklo_epi64(t4, t6);
    let u5 = _mm256_unpackhi_epi64(t4, t6);
    let u6 = _mm256_unpacklo_epi64(t5, t7);
    let u7 = _mm256_unpackhi_epi64(t5, t7);
    [
        _mm256_permute2x128_si256::<0x20>(u0, u4),
        _mm256_permute2x128_si256::<0x20>(u1, u5),
        _mm256_permute2x128_si256::<0x20>(u2, u6),
        _mm256_permute2x128_si256::<0x20>(u3, u7),
        _mm256_permute2x128_si256::<0x31>(u0, u4),
        _mm256_permute2x128_si256::<0x31>(u1, u5),
        _mm256_permute2x128_si256::<0x31>(u2, u6),
        _mm256_permute2x128_si256::<0x31>(u3, u7),
    ]
}

impl Panel {
    /// Sized for at least `nog` groups of `8 W` outputs, for `fill8` with
    /// `int8` (`fill` otherwise). The buffers only grow (a thread keeps its
    /// panel between calls): every fill writes every entry that its step's
    /// tiles read (sub-blocks `0..kn` of groups `0..nog`).
    pub(super) fn reset<const T: u8, const W: usize>(&mut self, nog: usize, int8: bool) {
        // SAFETY: a zero vector, no CPU feature needed beyond the caller's.
        let zero = unsafe { _mm256_setzero_si256() };
        if int8 {
            grow(&mut self.q8, nog * KC * QUADS * W, zero);
        } else {
            grow(&mut self.q, nog * KC * PAIRS * W, zero);
        }
        grow(&mut self.s, nog * KC * groups(T) * 8 * W, 0.0);
        grow(&mut self.m, nog * KC * 8 * W, 0.0);
    }

    /// Sub-blocks `kb..kb + kn` of the outputs `outputs` of `w` (`nsub`
    /// sub-blocks a row), the next step's bytes asked for meanwhile.
    #[inline(always)]
    #[allow(clippy::needless_range_loop)]
    pub(super) unsafe fn fill<const T: u8, const W: usize>(
        &mut self,
        w: &QuantWeight,
        outputs: &Range<usize>,
        kb: usize,
        kn: usize,
        nsub: usize,
    ) {
        let rb = w.qtype.row_bytes(w.k);
        let nc = outputs.len();
        for c8 in 0..nc.div_ceil(8) {
            let mut dec = [[Dec::zero(); KC]; 8];
            for (c, d) in dec.iter_mut().enumerate() {
                if 8 * c8 + c < nc {
                    let n = outputs.start + 8 * c8 + c;
                    let row = w.data.as_ptr().add(n * rb);
                    decode_step::<T>(row, kb, kn, nsub, w.row_scale(n), d);
                }
            }
            let (og, h) = (c8 / W, c8 % W);
            for j in 0..kn {
                let lo = transpose8(&std::array::from_fn(|c| dec[c][j].lo));
                let hi = transpose8(&std::array::from_fn(|c| dec[c][j].hi));
                let at = (og * KC + j) * PAIRS;
                for p in 0..8 {
                    self.q[(at + p) * W + h] = lo[p];
                    self.q[(at + 8 + p) * W + h] = hi[p];
                }
                self.scales::<T, W>(&dec, og, h, j);
            }
        }
    }

    /// The scales and minimums of sub-block `j` of the 8 outputs `dec` (half
    /// `h` of group `og`).
    #[inline(always)]
    #[allow(clippy::needless_range_loop)]
    unsafe fn scales<const T: u8, const W: usize>(
        &mut self,
        dec: &[[Dec; KC]; 8],
        og: usize,
        h: usize,
        j: usize,
    ) {
        let (g, l) = (groups(T), 8 * W);
        let s = ((og * KC + j) * g) * l + 8 * h;
        let m = (og * KC + j) * l + 8 * h;
        for c in 0..8 {
            self.s[s + c] = dec[c][j].scale;
            if g == 2 {
                self.s[s + l + c] = dec[c][j].scale_hi;
            }
            if has_min(T) {
                self.m[m + c] = dec[c][j].min;
            }
        }
    }

    /// `fill` for the int8 kernels: the integers as unsigned bytes in quads
    /// (`q8`, read as bytes from the blocks: `decode_step_u8`), the same
    /// scales and minimums.
    #[inline(always)]
    #[allow(clippy::needless_range_loop)]
    pub(super) unsafe fn fill8<const T: u8, const W: usize>(
        &mut self,
        w: &QuantWeight,
        outputs: &Range<usize>,
        kb: usize,
        kn: usize,
        nsub: usize,
    ) {
        let rb = w.qtype.row_bytes(w.k);
        let nc = outputs.len();
        let (g, l) = (groups(T), 8 * W);
        for c8 in 0..nc.div_ceil(8) {
            let mut dec = [[U8Sub::zero(); KC]; 8];
            for (c, d) in dec.iter_mut().enumerate() {
                if 8 * c8 + c < nc {
                    let n = outputs.start + 8 * c8 + c;
                    let row = w.data.as_ptr().add(n * rb);
                    decode_step_u8::<T>(row, kb, kn, nsub, w.row_scale(n), d);
                }
            }
            let (og, h) = (c8 / W, c8 % W);
            for j in 0..kn {
                let quads = transpose8(&std::array::from_fn(|c| dec[c][j].q));
                let at = (og * KC + j) * QUADS;
                for (p, v) in quads.into_iter().enumerate() {
                    self.q8[(at + p) * W + h] = v;
                }
                let s = ((og * KC + j) * g) * l + 8 * h;
                let m = (og * KC + j) * l + 8 * h;
                for c in 0..8 {
                    self.s[s + c] = dec[c][j].scale;
                    if g == 2 {
                        self.s[s + l + c] = dec[c][j].scale_hi;
                    }
                    if has_min(T) {
                        self.m[m + c] = dec[c][j].min;
                    }
                }
            }
        }
    }
}
