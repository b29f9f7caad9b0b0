//! Scalar conversions between `f32` and the narrow KV cache element types:
//! bfloat16 and the two fp8 formats (`e4m3fn`, `e5m2`), each rounding to
//! nearest even exactly as torch's casts do, so an entry the Rust kernels
//! write has the bits torch's reference writes.

/// The `f32` of bfloat16 bits `b` (exact).
#[inline(always)]
pub fn bf16_to_f32(b: u16) -> f32 {
    f32::from_bits((b as u32) << 16)
}

/// `x` rounded to the nearest bfloat16, ties to even; NaN becomes `0x7fc0`
/// (torch's `c10::detail::round_to_nearest_even`). Plain integer operations,
/// so a loop over it vectorizes.
#[inline(always)]
pub fn f32_to_bf16(x: f32) -> u16 {
    let bits = x.to_bits();
    let rounded = (bits.wrapping_add(0x7fff + ((bits >> 16) & 1)) >> 16) as u16;
    if x.is_nan() {
        0x7fc0
    } else {
        rounded
    }
}

/// An fp8 format: `man` mantissa bits, exponent `bias`, largest finite value.
#[derive(Clone, Copy)]
pub(crate) struct Fp8Format {
    man: u32,
    bias: i32,
    max: f32,
}

/// `float8_e4m3fn`: no infinities, `0x7f` / `0xff` are NaN, largest 448.
pub(crate) const E4M3: Fp8Format = Fp8Format {
    man: 3,
    bias: 7,
    max: 448.0,
};

/// `float8_e5m2`: IEEE-like, largest finite 57344.
pub(crate) const E5M2: Fp8Format = Fp8Format {
    man: 2,
    bias: 15,
    max: 57344.0,
};

/// `2^e` for `-126 <= e <= 127`.
const fn pow2(e: i32) -> f32 {
    f32::from_bits(((e + 127) as u32) << 23)
}

impl Fp8Format {
    /// The value of fp8 bits `b` (NaN / infinity codes give NaN / infinity).
    pub(crate) const fn value(self, b: u8) -> f32 {
        let exp_bits = 7 - self.man;
        let e = ((b >> self.man) as u32 & ((1 << exp_bits) - 1)) as i32;
        let m = (b as u32 & ((1 << self.man) - 1)) as f32;
        let all_ones = (1 << exp_bits) - 1;
        let mag = if self.man == 3 && e == all_ones && m == 7.0 {
            f32::NAN
        } else if self.man == 2 && e == all_ones {
            if m == 0.0 {
                f32::INFINITY
            } else {
                f32::NAN
            }
        } else if e == 0 {
            m * pow2(1 - self.bias - self.man as i32)
        } else {
            (1.0 + m / (1 << self.man) as f32) * pow2(e - self.bias)
        };
        if b & 0x80 != 0 {
            -mag
        } else {
            mag
        }
    }

    /// The value of every fp8 code, indexed by its bits.
    pub(crate) const fn table(self) -> [f32; 256] {
        let mut t = [0.0; 256];
        let mut b = 0;
        while b < 256 {
            t[b] = self.value(b as u8);
            b += 1;
        }
        t
    }

    /// `x` clamped to `[-max, max]` and rounded to the nearest code, ties to
    /// even (torch's `x.clamp(-max, max).to(float8)`); NaN becomes `0x7f`.
    #[inline(always)]
    pub(crate) fn encode(self, x: f32) -> u8 {
        if x.is_nan() {
            return 0x7f;
        }
        let sign = ((x.to_bits() >> 24) & 0x80) as u8;
        let a = x.abs().min(self.max);
        let mag = if a < pow2(1 - self.bias) {
            // Subnormal (or the smallest normal after rounding): whole units
            // of the subnormal step; scaling by a power of two is exact.
            (a * pow2(self.bias - 1 + self.man as i32)).round_ties_even() as u32
        } else {
            let bits = a.to_bits();
            let shift = 23 - self.man;
            let rounded = bits + ((1 << (shift - 1)) - 1) + ((bits >> shift) & 1);
            (rounded >> shift) - (((127 - self.bias) as u32) << self.man)
        };
        sign | mag as u8
    }
}

/// Values of all `float8_e4m3fn` codes.
pub(crate) static E4M3_VALUES: [f32; 256] = E4M3.table();
/// Values of all `float8_e5m2` codes.
pub(crate) static E5M2_VALUES: [f32; 256] = E5M2.table();

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bf16_round_trip_and_ties_to_even() {
        for b in (0..=u16::MAX).filter(|b| (b & 0x7f80) != 0x7f80) {
            assert_eq!(f32_to_bf16(bf16_to_f32(b)), b);
        }
        // 1 + 2^-8 is halfway between 1 and 1 + 2^-7: ties to the even 1.0.
        assert_eq!(f32_to_bf16(1.0 + 2f32.powi(-8)), 0x3f80);
        assert_eq!(f32_to_bf16(1.0 + 3.0 * 2f32.powi(-8)), 0x3f82);
        assert_eq!(f32_to_bf16(f32::NAN), 0x7fc0);
    }

    #[test]
    fn fp8_codes_round_trip() {
        for (fmt, values) in [(E4M3, &E4M3_VALUES), (E5M2, &E5M2_VALUES)] {
            for b in 0..=255u8 {
                let v = values[b as usize];
                if v.is_finite() {
                    let back = fmt.encode(v);
                    // -0.0 and 0.0 keep their sign bit.
                    assert_eq!(back, b, "{b:#x} -> {v} -> {back:#x}");
                }
            }
        }
        assert_eq!(E4M3_VALUES[0x7e], 448.0);
        assert_eq!(E4M3_VALUES[0x01], 2f32.powi(-9));
        assert_eq!(E5M2_VALUES[0x7b], 57344.0);
        assert_eq!(E5M2_VALUES[0x01], 2f32.powi(-16));
    }

    #[test]
    fn fp8_saturates_and_rounds_to_even() {
        assert_eq!(E4M3.encode(1000.0), 0x7e);
        assert_eq!(E4M3.encode(-1e9), 0xfe);
        assert_eq!(E5M2.encode(1e9), 0x7b);
        // 1 + 1/16 is halfway between 1 and 1 + 1/8 (e4m3): the even 1.0.
        assert_eq!(E4M3.encode(1.0625), E4M3.encode(1.0));
        assert_eq!(E4M3.encode(1.1875), E4M3.encode(1.25));
        // Halfway between the two smallest subnormals of e4m3: the even one.
        assert_eq!(E4M3.encode(1.5 * 2f32.powi(-9)), 0x02);
        assert_eq!(E4M3.encode(0.5 * 2f32.powi(-9)), 0x00);
    }
}
