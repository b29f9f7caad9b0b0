//! The panel layout of the 32-value block formats Q4_0, Q4_1, Q5_0, Q5_1
//! and Q8_0: a weight's blocks rearranged once, at load, into the order the
//! AVX-512 VNNI kernel reads (`avx2::packed`), in the file's size.
//!
//! The outputs fall into groups of 16 (the last group padded with zero
//! bytes to 16 outputs). Group `g` is one run of `nsub = k / 32` panel
//! blocks, one per sub-block `b`, each `16 * block_bytes` bytes: the 16
//! outputs' block `b`, interleaved so that a 64-byte vector holds one
//! 4-byte quad of each output (output `16 g + c` in 32-bit lane `c`):
//! - bytes `64 p .. 64 p + 64` (`p` in `0..quads`): lane `c` holds bytes
//!   `4 p .. 4 p + 4` of output `c`'s quants (Q4_0, Q4_1, Q5_0, Q5_1: 4
//!   quads of packed nibbles, the low nibbles values `4 p .. 4 p + 4`, the
//!   high ones values `16 + 4 p ..`; Q8_0: 8 quads of values `4 p .. 4 p +
//!   4`, each byte `q + 128`, the unsigned bytes of `vpdpbusd`);
//! - Q5_0 and Q5_1: then the 5th bit plane, 64 bytes, lane `c` the 32 high
//!   bits of output `c`'s block (`repack5`: the file's `qh` rearranged, 4
//!   bytes a block as in the file);
//! - then per float16 field of the block (the scale `d`; Q4_1 also the
//!   minimum `m`; Q5_1 also `m`) its 16 outputs' values, 32 bytes.
//!
//! So a panel block holds 16 blocks' bytes: 288 (Q4_0), 320 (Q4_1), 352
//! (Q5_0), 384 (Q5_1), 544 (Q8_0).
//!
//! `unpack_block` inverts it: a repacked weight's blocks are the file's.
//! The k-quants Q4_K, Q5_K and Q6_K have their own panel blocks (`repack_k`)
//! in the same groups of 16 outputs.

use rayon::prelude::*;

use super::format::{Layout, QuantType, QuantWeight};
use super::repack5::{plane_of, qh_of};
use super::repack_k;

/// Outputs of a panel group (the lanes of a 512-bit vector of dwords).
pub const GROUP: usize = 16;

/// Whether `t` has a panel layout.
pub fn supported(t: QuantType) -> bool {
    matches!(
        t,
        QuantType::Q4_0 | QuantType::Q4_1 | QuantType::Q5_0 | QuantType::Q5_1 | QuantType::Q8_0
    ) || repack_k::supported(t)
}

/// Bytes of the panels of an `[n, k]` weight of `t`: `n` rounded up to a
/// multiple of 16 rows of the file's row bytes.
pub fn panel_bytes(t: QuantType, n: usize, k: usize) -> usize {
    n.div_ceil(GROUP) * GROUP * t.row_bytes(k)
}

/// Where a format's fields sit in its block and in a panel block.
#[derive(Clone, Copy)]
struct Form {
    /// Offset of the quant bytes in the block.
    qs: usize,
    /// Quads of quant bytes per block.
    quads: usize,
    /// Float16 fields at the block's start (`d`; Q4_1, Q5_1 `d`, `m`).
    heads: usize,
    /// Offset of the high bits `qh` in the block (Q5_0, Q5_1), whose plane
    /// follows the quants in a panel block.
    qh: Option<usize>,
    /// XORed into each quant byte (Q8_0: int8 to `q + 128`).
    flip: u8,
}

impl Form {
    /// Offset of the float16 fields in a panel block (after the quants and
    /// the bit plane).
    fn heads_at(&self) -> usize {
        64 * self.quads + if self.qh.is_some() { 64 } else { 0 }
    }
}

fn form(t: QuantType) -> Form {
    match t {
        QuantType::Q4_0 => Form {
            qs: 2,
            quads: 4,
            heads: 1,
            qh: None,
            flip: 0,
        },
        QuantType::Q4_1 => Form {
            qs: 4,
            quads: 4,
            heads: 2,
            qh: None,
            flip: 0,
        },
        QuantType::Q5_0 => Form {
            qs: 6,
            quads: 4,
            heads: 1,
            qh: Some(2),
            flip: 0,
        },
        QuantType::Q5_1 => Form {
            qs: 8,
            quads: 4,
            heads: 2,
            qh: Some(4),
            flip: 0,
        },
        QuantType::Q8_0 => Form {
            qs: 2,
            quads: 8,
            heads: 1,
            qh: None,
            flip: 0x80,
        },
        _ => unreachable!("{} has no panel layout", t.name()),
    }
}

/// The panel bytes of the `[n, k]` weight `data` of `t` (the file's
/// blocks, `n` rows of `t.row_bytes(k)` bytes), built on rayon's pool.
///
/// Errors: a format without a panel layout (`supported`), `k` not a
/// positive multiple of 32, or `data` of another size.
pub fn repack(t: QuantType, n: usize, k: usize, data: &[u8]) -> Result<Vec<u8>, String> {
    let w = QuantWeight::new(t, n, k, data, &[])?;
    if !supported(t) {
        return Err(format!(
            "{} weights have no panel layout (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K have)",
            t.name()
        ));
    }
    if repack_k::supported(t) {
        let mut out = vec![0u8; panel_bytes(t, n, k)];
        repack_k::repack(&w, &mut out);
        return Ok(out);
    }
    let f = form(t);
    let (bb, nsub) = (t.block_bytes(), k / 32);
    let pb = GROUP * bb;
    let mut out = vec![0u8; panel_bytes(t, n, k)];
    out.par_chunks_mut(nsub * pb)
        .enumerate()
        .for_each(|(g, slab)| {
            for c in 0..GROUP.min(n - GROUP * g) {
                let row = w.row(GROUP * g + c);
                for b in 0..nsub {
                    let blk = &row[b * bb..(b + 1) * bb];
                    let pan = &mut slab[b * pb..(b + 1) * pb];
                    let flip = u32::from_ne_bytes([f.flip; 4]);
                    let qs = &blk[f.qs..f.qs + 4 * f.quads];
                    for (p, quad) in qs.chunks_exact(4).enumerate() {
                        let v = u32::from_ne_bytes([quad[0], quad[1], quad[2], quad[3]]) ^ flip;
                        pan[64 * p + 4 * c..64 * p + 4 * c + 4].copy_from_slice(&v.to_ne_bytes());
                    }
                    if let Some(at) = f.qh {
                        let qh =
                            u32::from_le_bytes([blk[at], blk[at + 1], blk[at + 2], blk[at + 3]]);
                        let to = 64 * f.quads + 4 * c;
                        pan[to..to + 4].copy_from_slice(&plane_of(qh).to_le_bytes());
                    }
                    for h in 0..f.heads {
                        let at = f.heads_at() + 32 * h + 2 * c;
                        pan[at..at + 2].copy_from_slice(&blk[2 * h..2 * h + 2]);
                    }
                }
            }
        });
    Ok(out)
}

/// The file's bytes of block `b` (the format's blocks: 32 values, k-quants
/// 256, `repack_k`) of output `n` of the panel weight `w` into `out`
/// (`w.qtype.block_bytes()` bytes).
pub fn unpack_block(w: &QuantWeight, n: usize, b: usize, out: &mut [u8]) {
    debug_assert_eq!(w.layout, Layout::Panels);
    if repack_k::supported(w.qtype) {
        return repack_k::unpack_block(w, n, b, out);
    }
    let t = w.qtype;
    let f = form(t);
    let (bb, nsub) = (t.block_bytes(), w.k / 32);
    let (g, c) = (n / GROUP, n % GROUP);
    let pan = &w.data[(g * nsub + b) * GROUP * bb..(g * nsub + b + 1) * GROUP * bb];
    for p in 0..f.quads {
        for i in 0..4 {
            out[f.qs + 4 * p + i] = pan[64 * p + 4 * c + i] ^ f.flip;
        }
    }
    if let Some(to) = f.qh {
        let at = 64 * f.quads + 4 * c;
        let p = u32::from_le_bytes([pan[at], pan[at + 1], pan[at + 2], pan[at + 3]]);
        out[to..to + 4].copy_from_slice(&qh_of(p).to_le_bytes());
    }
    for h in 0..f.heads {
        let at = f.heads_at() + 32 * h + 2 * c;
        out[2 * h..2 * h + 2].copy_from_slice(&pan[at..at + 2]);
    }
}

/// The file's bytes of rows `rows` of the panel weight `w`, one row of
/// `w.qtype.row_bytes(w.k)` bytes after another.
///
/// Panics if a row is not below `w.n`.
pub fn unpack_rows(w: &QuantWeight, rows: &[usize]) -> Vec<u8> {
    let (bb, rb) = (w.qtype.block_bytes(), w.qtype.row_bytes(w.k));
    let mut out = vec![0u8; rows.len() * rb];
    for (o, &n) in out.chunks_exact_mut(rb).zip(rows) {
        assert!(n < w.n, "row {n} of a weight of {} rows", w.n);
        for (b, blk) in o.chunks_exact_mut(bb).enumerate() {
            unpack_block(w, n, b, blk);
        }
    }
    out
}
