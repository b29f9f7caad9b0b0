//! Deterministic random data for the kernels' tests and benchmarks
//! (`src/*/tests.rs` of this crate, `benches/*.rs`): not part of the engine.

/// A small deterministic generator (xorshift64*, Marsaglia 2003 / Vigna 2016).
pub struct Rng(pub u64);

impl Rng {
    /// The next 64 random bits.
    #[allow(clippy::should_implement_trait)]
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// A float32 uniform in [-1, 1) (24 random bits).
    pub fn uniform(&mut self) -> f32 {
        (self.next() >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0
    }

    /// `len` values of [`Rng::uniform`].
    pub fn vec(&mut self, len: usize) -> Vec<f32> {
        (0..len).map(|_| self.uniform()).collect()
    }
}
