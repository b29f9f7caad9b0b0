//! The weight formats: GGUF block types (values and bytes per block) and
//! int8 per output channel, and a borrowed `[N, K]` weight in one of them.

/// A quantized weight format.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum QuantType {
    Q4_0,
    Q4_1,
    Q5_0,
    Q5_1,
    Q8_0,
    Q4K,
    Q5K,
    Q6K,
    /// int8 values `[N, K]`, one float32 scale per output channel.
    Int8,
}

impl QuantType {
    pub const ALL: [QuantType; 9] = [
        QuantType::Q4_0,
        QuantType::Q4_1,
        QuantType::Q5_0,
        QuantType::Q5_1,
        QuantType::Q8_0,
        QuantType::Q4K,
        QuantType::Q5K,
        QuantType::Q6K,
        QuantType::Int8,
    ];

    /// The format named `name` (GGUF's names, "Q4_K", ..., and "int8").
    pub fn parse(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|t| t.name() == name)
    }

    pub fn name(self) -> &'static str {
        match self {
            QuantType::Q4_0 => "Q4_0",
            QuantType::Q4_1 => "Q4_1",
            QuantType::Q5_0 => "Q5_0",
            QuantType::Q5_1 => "Q5_1",
            QuantType::Q8_0 => "Q8_0",
            QuantType::Q4K => "Q4_K",
            QuantType::Q5K => "Q5_K",
            QuantType::Q6K => "Q6_K",
            QuantType::Int8 => "int8",
        }
    }

    /// Values per block (int8: the 32-value sub-block the kernels read).
    pub fn block_values(self) -> usize {
        match self {
            QuantType::Q4K | QuantType::Q5K | QuantType::Q6K => 256,
            _ => 32,
        }
    }

    /// Bytes per block (ggml's `type_size`).
    pub fn block_bytes(self) -> usize {
        match self {
            QuantType::Q4_0 => 18,
            QuantType::Q4_1 => 20,
            QuantType::Q5_0 => 22,
            QuantType::Q5_1 => 24,
            QuantType::Q8_0 => 34,
            QuantType::Q4K => 144,
            QuantType::Q5K => 176,
            QuantType::Q6K => 210,
            QuantType::Int8 => 32,
        }
    }

    /// Bytes of one row of `k` values (`k` a multiple of `block_values`).
    pub fn row_bytes(self, k: usize) -> usize {
        k / self.block_values() * self.block_bytes()
    }

    /// Scale groups per 32-value sub-block: 2 in Q6_K (16-value groups,
    /// each with its own int8 scale), 1 otherwise.
    pub fn groups(self) -> usize {
        if self == QuantType::Q6K {
            2
        } else {
            1
        }
    }

    /// Whether `w = scale * q + min` with a per-sub-block `min` (the
    /// weights' integers are then unsigned); otherwise `w = scale * q` with
    /// signed integers.
    pub fn has_min(self) -> bool {
        matches!(
            self,
            QuantType::Q4_1 | QuantType::Q5_1 | QuantType::Q4K | QuantType::Q5K
        )
    }
}

/// How a weight's bytes are laid out.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Layout {
    /// The file's: `n` rows of `qtype.row_bytes(k)` bytes.
    Rows,
    /// Interleaved panels of 16 outputs (`repack`: Q4_0, Q4_1, Q8_0, Q4_K,
    /// Q5_K, Q6_K), read by the AVX-512 VNNI kernel on int8 activations.
    Panels,
}

/// A borrowed `[n, k]` weight: `n` rows of `qtype.row_bytes(k)` bytes (int8:
/// `k` bytes and `scales[n]`), or the same blocks repacked into panels
/// (`layout`, `repack`).
#[derive(Clone, Copy, Debug)]
pub struct QuantWeight<'a> {
    pub qtype: QuantType,
    pub n: usize,
    pub k: usize,
    pub data: &'a [u8],
    /// int8: one scale per row; empty otherwise.
    pub scales: &'a [f32],
    pub layout: Layout,
}

impl<'a> QuantWeight<'a> {
    /// A weight over `data`, or the reason it cannot be one.
    pub fn new(
        qtype: QuantType,
        n: usize,
        k: usize,
        data: &'a [u8],
        scales: &'a [f32],
    ) -> Result<Self, String> {
        let name = qtype.name();
        if k == 0 || !k.is_multiple_of(32) || !k.is_multiple_of(qtype.block_values()) {
            return Err(format!(
                "{name} weight of {k} input features: the kernels need a positive multiple of {} \
                 (32 for the activations' int8 blocks)",
                qtype.block_values().max(32)
            ));
        }
        if data.len() != n * qtype.row_bytes(k) {
            return Err(format!(
                "{name} weight [{n}, {k}] must hold {} bytes, got {}",
                n * qtype.row_bytes(k),
                data.len()
            ));
        }
        let want = if qtype == QuantType::Int8 { n } else { 0 };
        if scales.len() != want {
            return Err(format!(
                "{name} weight [{n}, {k}] needs {want} scales, got {}",
                scales.len()
            ));
        }
        Ok(QuantWeight {
            qtype,
            n,
            k,
            data,
            scales,
            layout: Layout::Rows,
        })
    }

    /// A weight over `data` in the panel layout (`repack::repack`'s bytes of
    /// an `[n, k]` weight), or the reason it cannot be one.
    pub fn panels(qtype: QuantType, n: usize, k: usize, data: &'a [u8]) -> Result<Self, String> {
        let name = qtype.name();
        if !super::repack::supported(qtype) {
            return Err(format!(
                "{name} weights have no panel layout (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K have)"
            ));
        }
        let kb = qtype.block_values().max(32);
        if k == 0 || !k.is_multiple_of(kb) {
            return Err(format!(
                "{name} weight of {k} input features: the kernels need a positive multiple of {kb}"
            ));
        }
        let want = super::repack::panel_bytes(qtype, n, k);
        if data.len() != want {
            return Err(format!(
                "{name} panels of a [{n}, {k}] weight must hold {want} bytes, got {}",
                data.len()
            ));
        }
        Ok(QuantWeight {
            qtype,
            n,
            k,
            data,
            scales: &[],
            layout: Layout::Panels,
        })
    }

    /// Row `i`'s bytes (the rows layout only).
    #[inline(always)]
    pub fn row(&self, i: usize) -> &'a [u8] {
        debug_assert_eq!(self.layout, Layout::Rows, "a row of a panel weight");
        let b = self.qtype.row_bytes(self.k);
        &self.data[i * b..(i + 1) * b]
    }

    /// Row `i`'s per-channel scale (int8), 0 for block formats.
    #[inline(always)]
    pub fn row_scale(&self, i: usize) -> f32 {
        self.scales.get(i).copied().unwrap_or(0.0)
    }
}

/// The `f32` of IEEE half-precision bits `h` (exact; F16C's `vcvtph2ps`).
#[inline(always)]
pub(crate) fn f16_to_f32(h: u16) -> f32 {
    let sign = ((h as u32) & 0x8000) << 16;
    let exp = ((h >> 10) & 0x1f) as u32;
    let man = (h & 0x3ff) as u32;
    let bits = if exp == 0 {
        if man == 0 {
            sign
        } else {
            // Subnormal: man * 2^-24, exact in f32.
            let v = man as f32 * f32::from_bits(0x3380_0000);
            return if sign != 0 { -v } else { v };
        }
    } else if exp == 0x1f {
        sign | 0x7f80_0000 | (man << 13)
    } else {
        sign | ((exp + 112) << 23) | (man << 13)
    };
    f32::from_bits(bits)
}

/// Little-endian `u16` at `p[at..]`.
#[inline(always)]
pub(crate) fn le16(p: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([p[at], p[at + 1]])
}

/// Little-endian `u32` at `p[at..]`.
#[inline(always)]
pub(crate) fn le32(p: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([p[at], p[at + 1], p[at + 2], p[at + 3]])
}
