//! The Q5_0 and Q5_1 quads of a panel block (`repack`, `repack5`) for the
//! panel kernel (`packed`): the quad's nibbles (a mask, or a shift and a
//! mask, as Q4_0's) and its 4 high bits per output from the block's bit
//! plane, shifted from bit `qd` of each byte to bit 4 and merged in by one
//! ternary logic operation: the 5-bit integers `0..32` as unsigned bytes
//! (Q5_0's sums are corrected by `16 * sum(x)`, `decode::unsigned_offset`).

use std::arch::x86_64::*;

/// Offset of the bit plane in a Q5_0 / Q5_1 panel block (after the 4
/// vectors of nibbles).
pub(super) const PLANE_AT: usize = 256;

/// Quad `qd` (values `4 qd .. 4 qd + 4`) of the 16 outputs of the Q5_0 or
/// Q5_1 panel block at `blk`, as unsigned bytes.
#[inline(always)]
pub(super) unsafe fn quad5(blk: *const u8, qd: usize) -> __m512i {
    let low4 = _mm512_set1_epi8(0x0f);
    let v = _mm512_loadu_si512(blk.add(64 * (qd % 4)) as *const __m512i);
    let nib = if qd < 4 {
        _mm512_and_si512(v, low4)
    } else {
        _mm512_and_si512(_mm512_srli_epi32::<4>(v), low4)
    };
    let plane = _mm512_loadu_si512(blk.add(PLANE_AT) as *const __m512i);
    // Bit `qd` of each byte to bit 4.
    let high = match qd {
        0 => _mm512_slli_epi32::<4>(plane),
        1 => _mm512_slli_epi32::<3>(plane),
        2 => _mm512_slli_epi32::<2>(plane),
        3 => _mm512_slli_epi32::<1>(plane),
        4 => plane,
        5 => _mm512_srli_epi32::<1>(plane),
        6 => _mm512_srli_epi32::<2>(plane),
        _ => _mm512_srli_epi32::<3>(plane),
    };
    // nib | (high & 0x10).
    _mm512_ternarylogic_epi32::<0xf8>(nib, high, _mm512_set1_epi8(0x10))
}
