//! The 5th bit plane of Q5_0 and Q5_1 panel blocks (`repack`): the 32
//! high bits of an output's block kept in one 4-byte lane, 64 bytes for
//! the 16 outputs, the file's `qh` rearranged so that the high bits of a
//! quad of values share a bit position.
//!
//! A file's block holds `qh` (32 bits, bit `j` the high bit of value `j`)
//! beside 16 bytes of nibbles (byte `i`: value `i` low, value `16 + i`
//! high). In the panel's plane lane, bit `b` (`0..8`) of byte `i` (`0..4`)
//! is the high bit of value `4 b + i`: quad `b`'s 4 high bits sit at bit `b`
//! of the lane's 4 bytes, so one shift of the lane by `4 - b` bits puts them
//! at bit 4 beside the quad's nibbles (`avx2::packed5`).

/// The plane lane of a block's `qh`.
pub(super) fn plane_of(qh: u32) -> u32 {
    let mut p = 0u32;
    for b in 0..8 {
        for i in 0..4 {
            p |= ((qh >> (4 * b + i)) & 1) << (8 * i + b);
        }
    }
    p
}

/// The block's `qh` of a plane lane (`plane_of`'s inverse).
pub(super) fn qh_of(plane: u32) -> u32 {
    let mut qh = 0u32;
    for b in 0..8 {
        for i in 0..4 {
            qh |= ((plane >> (8 * i + b)) & 1) << (4 * b + i);
        }
    }
    qh
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_plane_inverts_and_puts_a_quads_bits_in_one_position() {
        let mut x = 0x9e37_79b9u32;
        for _ in 0..1000 {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            let p = plane_of(x);
            assert_eq!(qh_of(p), x);
            for b in 0..8 {
                for i in 0..4 {
                    assert_eq!((p >> (8 * i + b)) & 1, (x >> (4 * b + i)) & 1);
                }
            }
        }
    }
}
