//! The panel layout of the k-quant formats Q4_K, Q5_K and Q6_K: a weight's
//! 256-value blocks rearranged once, at load, into the order the AVX-512
//! VNNI kernel reads (`avx2::packed_k`), in the file's size (Q4_K 144, Q5_K
//! 176, Q6_K 210 bytes per output and block; the last group of 16 outputs
//! padded with zero bytes).
//!
//! The outputs fall into groups of 16. Group `g` is one run of `k / 256`
//! panel blocks, one per block `b`, each `16 * block_bytes` bytes: the 16
//! outputs' block `b`, its byte fields in the order below, each field
//! interleaved so that a 64-byte vector holds one 4-byte quad of each
//! output (output `16 g + c` in 32-bit lane `c`): bytes `at + 64 p .. at +
//! 64 p + 64` of a field at `at` hold the field's bytes `4 p .. 4 p + 4` of
//! every output. The fields, by their offsets in ggml's blocks:
//! - Q4_K: the 128 quant bytes (`qs`, 16..144), then the 16 header bytes
//!   (float16 `d` and `dmin`, the 12 bytes of packed 6-bit scales and
//!   minimums, 0..16);
//! - Q5_K: `qs` (48..176), the 32 bytes of high bits (`qh`, 16..48), the
//!   header (0..16);
//! - Q6_K: the 128 bytes of low nibbles (`ql`, 0..128), the 64 bytes of
//!   high bit pairs (`qh`, 128..192), the 16 int8 scales (192..208), then the
//!   float16 `d` (208..210) of the 16 outputs, 2 bytes each (32 bytes).
//!
//! So the quant vector `p` of a k-quant panel block holds the same value
//! positions of the 16 outputs as the file's bytes `4 p .. 4 p + 4` hold of
//! one, and the kernel's masks and shifts are `blocks::decode`'s.
//! `unpack_block` inverts the layout: a repacked weight's blocks are the file's.

use rayon::prelude::*;

use super::format::{Layout, QuantType, QuantWeight};
use super::repack::GROUP;

/// Whether `t` is a k-quant with a panel layout.
pub fn supported(t: QuantType) -> bool {
    matches!(t, QuantType::Q4K | QuantType::Q5K | QuantType::Q6K)
}

/// A field of a block: `len` bytes from `file` in ggml's block, at `panel`
/// in the panel block; interleaved by quads (`len` a multiple of 4), or by
/// 2-byte values when `len == 2`.
#[derive(Clone, Copy)]
struct Field {
    file: usize,
    len: usize,
    panel: usize,
}

const fn field(file: usize, len: usize, panel: usize) -> Field {
    Field { file, len, panel }
}

/// The fields of `t`'s block in the order of its panel block.
fn fields(t: QuantType) -> &'static [Field] {
    const Q4K: [Field; 2] = [field(16, 128, 0), field(0, 16, 16 * 128)];
    const Q5K: [Field; 3] = [
        field(48, 128, 0),
        field(16, 32, 16 * 128),
        field(0, 16, 16 * 160),
    ];
    const Q6K: [Field; 4] = [
        field(0, 128, 0),
        field(128, 64, 16 * 128),
        field(192, 16, 16 * 192),
        field(208, 2, 16 * 208),
    ];
    match t {
        QuantType::Q4K => &Q4K,
        QuantType::Q5K => &Q5K,
        QuantType::Q6K => &Q6K,
        _ => unreachable!("{} is not a k-quant", t.name()),
    }
}

/// Panel block byte of byte `i` of field `f` of output `c` (`c` in 0..16).
#[inline(always)]
fn at(f: &Field, c: usize, i: usize) -> usize {
    if f.len == 2 {
        f.panel + 2 * c + i
    } else {
        f.panel + 64 * (i / 4) + 4 * c + i % 4
    }
}

/// The panel bytes of the `[n, k]` k-quant weight `w` (rows layout), on
/// rayon's pool: `repack::repack` for Q4_K, Q5_K, Q6_K.
pub(crate) fn repack(w: &QuantWeight, out: &mut [u8]) {
    let t = w.qtype;
    let (bb, nb) = (t.block_bytes(), w.k / 256);
    let pb = GROUP * bb;
    let n = w.n;
    out.par_chunks_mut(nb * pb)
        .enumerate()
        .for_each(|(g, slab)| {
            for c in 0..GROUP.min(n - GROUP * g) {
                let row = w.row(GROUP * g + c);
                for b in 0..nb {
                    let blk = &row[b * bb..(b + 1) * bb];
                    let pan = &mut slab[b * pb..(b + 1) * pb];
                    for f in fields(t) {
                        for i in 0..f.len {
                            pan[at(f, c, i)] = blk[f.file + i];
                        }
                    }
                }
            }
        });
}

/// The file's bytes of block `b` (256 values) of output `n` of the panel
/// weight `w` into `out` (`w.qtype.block_bytes()` bytes).
pub(crate) fn unpack_block(w: &QuantWeight, n: usize, b: usize, out: &mut [u8]) {
    debug_assert_eq!(w.layout, Layout::Panels);
    let t = w.qtype;
    let (bb, nb) = (t.block_bytes(), w.k / 256);
    let (g, c) = (n / GROUP, n % GROUP);
    let pan = &w.data[(g * nb + b) * GROUP * bb..(g * nb + b + 1) * GROUP * bb];
    for f in fields(t) {
        for i in 0..f.len {
            out[f.file + i] = pan[at(f, c, i)];
        }
    }
}
