//! Reading a weight row as sub-blocks of 32 values (the portable decoder):
//! each format's bytes (ggml's `ggml-common.h` layouts, the formulas of
//! `ggml-quants.c`'s `dequantize_row_*`) as 32 integers `q`, one float32
//! scale per 16-value group (one scale for both groups except in Q6_K) and a
//! minimum, `w[i] = scale[i / 16] * q[i] + min`. Q6_K's 16-value groups have
//! integer scales (int8) under one float16 `d`: its `q` are the 6-bit
//! values minus 32, its group scales `d * sc` (exact in float32). The SIMD
//! decoders (`avx2`) give the same integers and the same float32 scales.

use super::format::{f16_to_f32, le16, le32, Layout, QuantType, QuantWeight};

/// One sub-block of 32 weights: `w[i] = scale[i / 16] * q[i] + min`. `q`
/// is signed for the formats without a minimum (`|q| <= 128`), in `0..32`
/// otherwise; `scale[0] == scale[1]` except in Q6_K.
#[derive(Clone, Copy, Debug)]
pub struct Sub {
    pub q: [i16; 32],
    pub scale: [f32; 2],
    pub min: f32,
}

#[cfg(test)]
impl Sub {
    /// The float32 weight `i` (`scale * q + min`, for the tests' references).
    pub fn weight(&self, i: usize) -> f64 {
        self.scale[i / 16] as f64 * self.q[i] as f64 + self.min as f64
    }
}

/// The 6-bit scale and minimum of sub-block `j` (0..8) of a Q4_K / Q5_K
/// block from its 12 packed bytes (ggml's `get_scale_min_k4`).
#[inline(always)]
pub(crate) fn scale_min_k4(j: usize, s: &[u8]) -> (u8, u8) {
    if j < 4 {
        (s[j] & 63, s[j + 4] & 63)
    } else {
        (
            (s[j + 4] & 0xf) | ((s[j - 4] >> 6) << 4),
            (s[j + 4] >> 4) | ((s[j] >> 6) << 4),
        )
    }
}

/// Sub-block `b` (values `32 b .. 32 b + 32`) of a row of `qtype` bytes;
/// `row_scale` is the int8 format's per-channel scale.
pub fn decode(qtype: QuantType, row: &[u8], b: usize, row_scale: f32) -> Sub {
    let mut q = [0i16; 32];
    let (scale, min) = match qtype {
        QuantType::Q4_0 | QuantType::Q4_1 => {
            let size = qtype.block_bytes();
            let p = &row[b * size..(b + 1) * size];
            let d = f16_to_f32(le16(p, 0));
            let (qs, min, offset) = if qtype == QuantType::Q4_0 {
                (&p[2..18], 0.0, 8)
            } else {
                (&p[4..20], f16_to_f32(le16(p, 2)), 0)
            };
            for i in 0..16 {
                q[i] = (qs[i] & 0xf) as i16 - offset;
                q[i + 16] = (qs[i] >> 4) as i16 - offset;
            }
            (d, min)
        }
        QuantType::Q5_0 | QuantType::Q5_1 => {
            let size = qtype.block_bytes();
            let p = &row[b * size..(b + 1) * size];
            let d = f16_to_f32(le16(p, 0));
            let (at, min, offset) = if qtype == QuantType::Q5_0 {
                (2, 0.0, 16)
            } else {
                (4, f16_to_f32(le16(p, 2)), 0)
            };
            let qh = le32(p, at);
            let qs = &p[at + 4..at + 20];
            for i in 0..16 {
                let h0 = (((qh >> i) & 1) << 4) as u8;
                let h1 = (((qh >> (i + 16)) & 1) << 4) as u8;
                q[i] = ((qs[i] & 0xf) | h0) as i16 - offset;
                q[i + 16] = ((qs[i] >> 4) | h1) as i16 - offset;
            }
            (d, min)
        }
        QuantType::Q8_0 => {
            let p = &row[b * 34..(b + 1) * 34];
            for i in 0..32 {
                q[i] = p[2 + i] as i8 as i16;
            }
            (f16_to_f32(le16(p, 0)), 0.0)
        }
        QuantType::Int8 => {
            for i in 0..32 {
                q[i] = row[32 * b + i] as i8 as i16;
            }
            (row_scale, 0.0)
        }
        QuantType::Q4K | QuantType::Q5K => {
            let size = qtype.block_bytes();
            let (blk, j) = (b / 8, b % 8);
            let p = &row[blk * size..(blk + 1) * size];
            let d = f16_to_f32(le16(p, 0));
            let dmin = f16_to_f32(le16(p, 2));
            let (sc, m) = scale_min_k4(j, &p[4..16]);
            let qs_at = if qtype == QuantType::Q4K { 16 } else { 48 };
            let qs = &p[qs_at + 32 * (j / 2)..qs_at + 32 * (j / 2) + 32];
            let shift = 4 * (j % 2);
            for i in 0..32 {
                let mut v = (qs[i] >> shift) & 0xf;
                if qtype == QuantType::Q5K {
                    v |= ((p[16 + i] >> j) & 1) << 4;
                }
                q[i] = v as i16;
            }
            (d * sc as f32, -(dmin * m as f32))
        }
        QuantType::Q6K => {
            let (blk, j) = (b / 8, b % 8);
            let p = &row[blk * 210..(blk + 1) * 210];
            let d = f16_to_f32(le16(p, 208));
            let (h, t) = (j / 4, j % 4);
            let ql = &p[64 * h + 32 * (t % 2)..64 * h + 32 * (t % 2) + 32];
            let qh = &p[128 + 32 * h..128 + 32 * h + 32];
            let lo_shift = 4 * (t / 2);
            let sc = &p[192 + 8 * h + 2 * t..];
            for i in 0..32 {
                let v = ((ql[i] >> lo_shift) & 0xf) | (((qh[i] >> (2 * t)) & 3) << 4);
                q[i] = v as i16 - 32;
            }
            let s = [d * sc[0] as i8 as f32, d * sc[1] as i8 as f32];
            return Sub {
                q,
                scale: s,
                min: 0.0,
            };
        }
    };
    Sub {
        q,
        scale: [scale, scale],
        min,
    }
}

/// Every value of `w` as float32, row-major into `out` (`n * k` values):
/// `w[i] = scale[i / 16] * q[i] + min`, the product and the sum each rounded
/// to float32 (no fused multiply-add): the values of ggml's
/// `dequantize_row_*` and gguf-py's `quants.dequantize`.
///
/// # Panics
/// `out` not `w.n * w.k` long.
pub fn dequantize(w: &QuantWeight, out: &mut [f32]) {
    assert_eq!(out.len(), w.n * w.k, "output of {} x {} values", w.n, w.k);
    for (n, row_out) in out.chunks_exact_mut(w.k).enumerate() {
        for (b, vals) in row_out.chunks_exact_mut(32).enumerate() {
            let sub = sub(w, n, b);
            for (i, v) in vals.iter_mut().enumerate() {
                *v = sub.scale[i / 16] * sub.q[i] as f32 + sub.min;
            }
        }
    }
}

/// Sub-block `b` of output `n` of `w`, in either layout.
pub fn sub(w: &QuantWeight, n: usize, b: usize) -> Sub {
    match w.layout {
        Layout::Rows => decode(w.qtype, w.row(n), b, w.row_scale(n)),
        Layout::Panels => {
            let mut blk = [0u8; 210];
            let (bb, per) = (w.qtype.block_bytes(), w.qtype.block_values() / 32);
            super::repack::unpack_block(w, n, b / per, &mut blk[..bb]);
            decode(w.qtype, &blk[..bb], b % per, 0.0)
        }
    }
}
