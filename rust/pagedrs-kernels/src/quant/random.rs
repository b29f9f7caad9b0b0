//! Random quantized weights for the kernels' tests and benchmarks: random
//! quants with small random float16 scales (not part of the engine).

use super::format::QuantType;
use crate::test_data::Rng;

/// Byte offsets of a block's float16 fields (scales, minimums).
fn f16_fields(t: QuantType) -> &'static [usize] {
    match t {
        QuantType::Q4_1 | QuantType::Q5_1 | QuantType::Q4K | QuantType::Q5K => &[0, 2],
        QuantType::Q6K => &[208],
        QuantType::Int8 => &[],
        _ => &[0],
    }
}

/// The float16 bits of a small `x` (|x| < 0.03, normal or subnormal range).
fn f16_bits(x: f32) -> u16 {
    // Small values: sign, exponent and 10 mantissa bits by scaling.
    let sign = if x < 0.0 { 0x8000u16 } else { 0 };
    let a = x.abs().max(1e-4);
    let e = a.log2().floor() as i32;
    let m = ((a / 2f32.powi(e) - 1.0) * 1024.0) as u16;
    sign | (((e + 15) as u16) << 10) | m.min(1023)
}

/// Random `[n, k]` weight bytes of `t`: random quants, small random scales.
pub fn random_weight(t: QuantType, n: usize, k: usize, rng: &mut Rng) -> (Vec<u8>, Vec<f32>) {
    let mut data: Vec<u8> = (0..n * t.row_bytes(k)).map(|_| rng.next() as u8).collect();
    for blk in data.chunks_exact_mut(t.block_bytes()) {
        for &at in f16_fields(t) {
            let h = f16_bits(0.02 * rng.uniform()).to_le_bytes();
            blk[at..at + 2].copy_from_slice(&h);
        }
    }
    let scales = if t == QuantType::Int8 {
        (0..n).map(|_| 0.01 * rng.uniform().abs()).collect()
    } else {
        Vec::new()
    };
    (data, scales)
}
