//! The activations quantized per row in blocks of 32, each with a float32
//! scale, to int16 or to int8 (`ActQuant`): one pass per call, shared by
//! every weight part and output of the call. A row's blocks depend on that
//! row alone. int16 (`d = max|x| / 32767`) is the exact option: its
//! rounding is 258 times finer than int8's. int8 (`d = max|x| / 127`,
//! llama.cpp's Q8_0 activations with a float32 scale) runs `vpdpbusd`,
//! four products a 32-bit lane where int16's `vpdpwssd` does two.

/// How the activations are quantized: per block of 32 values, to int16 or
/// to int8, `d = max|x| / q_max`, `q = round_ties_even(x * q_max / max|x|)`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ActQuant {
    /// `q_max = 32767`.
    Int16,
    /// `q_max = 127`.
    Int8,
}

impl ActQuant {
    /// The largest quantized magnitude.
    pub fn q_max(self) -> f32 {
        match self {
            ActQuant::Int16 => 32767.0,
            ActQuant::Int8 => 127.0,
        }
    }

    /// "int16" or "int8".
    pub fn name(self) -> &'static str {
        match self {
            ActQuant::Int16 => "int16",
            ActQuant::Int8 => "int8",
        }
    }

    /// The scheme named `name` ("int16", "int8").
    pub fn parse(name: &str) -> Option<Self> {
        [ActQuant::Int16, ActQuant::Int8]
            .into_iter()
            .find(|a| a.name() == name)
    }
}

/// `[T, K]` activations as blocks of 32: `x ≈ d * q`.
pub struct QuantActs {
    pub scheme: ActQuant,
    pub rows: usize,
    pub k: usize,
    /// `[T, K]`, in `-q_max..=q_max` (int8's values widened to int16, so
    /// that the int16 kernels run them with the same integer sums).
    pub q: Vec<i16>,
    /// int8: `[T, K]`, the values of `q` as int8 (the `vpdpbusd` kernels);
    /// empty for int16.
    pub q8: Vec<i8>,
    /// int8: `[T, K / 16]`, the exact sum of `q` over each 16 values (the
    /// `vpdpbusd` kernels' offset correction); empty for int16.
    pub sum16: Vec<i32>,
    /// `[T, K / 32]`: `max |x| / 32767` of each block (NaN when the block
    /// holds a NaN or an infinity, so that the outputs are NaN).
    pub d: Vec<f32>,
    /// `[T, K / 32]`: `d * sum(q)` of each block (the formats with a minimum).
    pub dsum: Vec<f32>,
}

impl QuantActs {
    /// Quantize `x` (`[rows, k]` values given by `value(i)`, `k` a multiple
    /// of 32) as `scheme`: per block `d = amax / q_max`, `q =
    /// round_ties_even(x * (q_max / amax))` (0 where `amax` is 0).
    pub fn new(scheme: ActQuant, rows: usize, k: usize, x: impl Fn(usize) -> f32 + Sync) -> Self {
        let mut acts = Self::zeroed(scheme, rows, k);
        let mut block = [0.0f32; 32];
        for b in 0..acts.d.len() {
            for (i, v) in block.iter_mut().enumerate() {
                *v = x(32 * b + i);
            }
            let (d, dsum) =
                quantize_block(&block, &mut acts.q[32 * b..32 * b + 32], scheme.q_max());
            acts.d[b] = d;
            acts.dsum[b] = dsum;
        }
        acts.fill_int8();
        acts
    }

    /// int8: `q8` and `sum16` from `q`.
    fn fill_int8(&mut self) {
        if self.scheme != ActQuant::Int8 {
            return;
        }
        self.q8 = self.q.iter().map(|&v| v as i8).collect();
        self.sum16 = self
            .q
            .chunks_exact(16)
            .map(|c| c.iter().map(|&v| v as i32).sum())
            .collect();
    }

    /// `new` over float32 `x` (`[rows, k]`), in AVX2 where the CPU runs it
    /// (the same bits).
    ///
    /// Panics if `x` is not `rows * k` values.
    pub fn from_f32(scheme: ActQuant, rows: usize, k: usize, x: &[f32]) -> Self {
        assert_eq!(x.len(), rows * k, "activations of the wrong size");
        #[cfg(target_arch = "x86_64")]
        if crate::cpu_features::avx2_fma() {
            // SAFETY: the CPU runs AVX2; `x` holds `rows * k` values.
            return unsafe { Self::quantize_avx2(scheme, rows, k, x) };
        }
        Self::new(scheme, rows, k, |i| x[i])
    }

    /// `new` over bfloat16 bits `x` (`[rows, k]`), in AVX2 where the CPU
    /// runs it (the same bits).
    ///
    /// Panics if `x` is not `rows * k` values.
    pub fn from_bf16_bits(scheme: ActQuant, rows: usize, k: usize, x: &[u16]) -> Self {
        assert_eq!(x.len(), rows * k, "activations of the wrong size");
        #[cfg(target_arch = "x86_64")]
        if crate::cpu_features::avx2_fma() {
            // SAFETY: the CPU runs AVX2; `x` holds `rows * k` values.
            return unsafe { Self::quantize_avx2(scheme, rows, k, x) };
        }
        Self::new(scheme, rows, k, |i| f32::from_bits((x[i] as u32) << 16))
    }

    /// A zeroed set for `rows` x `k` (`k` a multiple of 32).
    fn zeroed(scheme: ActQuant, rows: usize, k: usize) -> Self {
        assert!(
            k.is_multiple_of(32),
            "activations of {k} features: not blocks of 32"
        );
        let nb = rows * k / 32;
        QuantActs {
            scheme,
            rows,
            k,
            q: vec![0; rows * k],
            q8: Vec::new(),
            sum16: Vec::new(),
            d: vec![0.0; nb],
            dsum: vec![0.0; nb],
        }
    }

    /// `new` in AVX2 over `x` (`[rows, k]`) of float32 or bfloat16 bits,
    /// 32 values loaded as float32 at a time.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2")]
    unsafe fn quantize_avx2<T: avx2::Load32>(
        scheme: ActQuant,
        rows: usize,
        k: usize,
        x: &[T],
    ) -> Self {
        let mut acts = Self::zeroed(scheme, rows, k);
        for b in 0..acts.d.len() {
            let v = T::load32(x.as_ptr().add(32 * b));
            let (d, dsum) =
                avx2::quantize_block(v, acts.q.as_mut_ptr().add(32 * b), scheme.q_max());
            acts.d[b] = d;
            acts.dsum[b] = dsum;
        }
        acts.fill_int8();
        acts
    }

    /// The quantized rows `rows` (in that order, repeats allowed): the
    /// same values as quantizing those rows of the activations, since each
    /// row's blocks depend on that row alone.
    ///
    /// Panics if a row is outside `0..self.rows`.
    pub fn gather(&self, rows: &[usize]) -> Self {
        let (k, nb) = (self.k, self.k / 32);
        let mut acts = Self::zeroed(self.scheme, rows.len(), k);
        for (i, &r) in rows.iter().enumerate() {
            assert!(
                r < self.rows,
                "row {r} outside {} activation rows",
                self.rows
            );
            acts.q[i * k..(i + 1) * k].copy_from_slice(self.row_q(r));
            acts.d[i * nb..(i + 1) * nb].copy_from_slice(self.row_d(r));
            acts.dsum[i * nb..(i + 1) * nb].copy_from_slice(self.row_dsum(r));
        }
        if self.scheme == ActQuant::Int8 {
            let n16 = k / 16;
            acts.q8.reserve(rows.len() * k);
            acts.sum16.reserve(rows.len() * n16);
            for &r in rows {
                acts.q8.extend_from_slice(&self.q8[r * k..(r + 1) * k]);
                acts.sum16
                    .extend_from_slice(&self.sum16[r * n16..(r + 1) * n16]);
            }
        }
        acts
    }

    /// Row `r`'s int16 values.
    #[inline(always)]
    pub fn row_q(&self, r: usize) -> &[i16] {
        &self.q[r * self.k..(r + 1) * self.k]
    }

    /// Row `r`'s block scales.
    #[inline(always)]
    pub fn row_d(&self, r: usize) -> &[f32] {
        let nb = self.k / 32;
        &self.d[r * nb..(r + 1) * nb]
    }

    /// Row `r`'s `d * sum(q)` per block.
    #[inline(always)]
    pub fn row_dsum(&self, r: usize) -> &[f32] {
        let nb = self.k / 32;
        &self.dsum[r * nb..(r + 1) * nb]
    }
}

/// `quantize_block` in AVX2.
#[cfg(target_arch = "x86_64")]
mod avx2 {
    use std::arch::x86_64::*;

    /// An activation element type the quantizer reads 32 of at a time.
    pub(super) trait Load32: Sized {
        /// 32 values at `p`, as float32.
        unsafe fn load32(p: *const Self) -> [__m256; 4];
    }

    impl Load32 for f32 {
        #[inline(always)]
        unsafe fn load32(p: *const f32) -> [__m256; 4] {
            [
                _mm256_loadu_ps(p),
                _mm256_loadu_ps(p.add(8)),
                _mm256_loadu_ps(p.add(16)),
                _mm256_loadu_ps(p.add(24)),
            ]
        }
    }

    /// bfloat16 bits.
    impl Load32 for u16 {
        #[inline(always)]
        unsafe fn load32(p: *const u16) -> [__m256; 4] {
            let mut v = [_mm256_setzero_ps(); 4];
            for (i, o) in v.iter_mut().enumerate() {
                let h = _mm_loadu_si128(p.add(8 * i) as *const __m128i);
                *o = _mm256_castsi256_ps(_mm256_slli_epi32::<16>(_mm256_cvtepu16_epi32(h)));
            }
            v
        }
    }

    /// `super::quantize_block` of the 32 values `x` into `q[0..32]`: the
    /// same maximum (exact in any order), scale, rounding (`vroundps` to
    /// nearest even), clamp (NaN products, from a subnormal maximum, to 0
    /// as Rust's `as i16` does) and exact integer sum.
    #[inline(always)]
    pub(super) unsafe fn quantize_block(x: [__m256; 4], q: *mut i16, q_max: f32) -> (f32, f32) {
        let sign = _mm256_set1_ps(-0.0);
        let inf = _mm256_set1_ps(f32::INFINITY);
        let mut abs = [_mm256_setzero_ps(); 4];
        let mut finite = [_mm256_setzero_ps(); 4];
        for i in 0..4 {
            abs[i] = _mm256_andnot_ps(sign, x[i]);
            finite[i] = _mm256_cmp_ps::<_CMP_LT_OQ>(abs[i], inf);
        }
        let all = _mm256_and_ps(
            _mm256_and_ps(finite[0], finite[1]),
            _mm256_and_ps(finite[2], finite[3]),
        );
        if _mm256_movemask_ps(all) != 0xff {
            _mm256_storeu_si256(q as *mut __m256i, _mm256_setzero_si256());
            _mm256_storeu_si256(q.add(16) as *mut __m256i, _mm256_setzero_si256());
            return (f32::NAN, f32::NAN);
        }
        let m = _mm256_max_ps(_mm256_max_ps(abs[0], abs[1]), _mm256_max_ps(abs[2], abs[3]));
        let m = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps::<1>(m));
        let m = _mm_max_ps(m, _mm_movehl_ps(m, m));
        let amax = _mm_cvtss_f32(_mm_max_ss(m, _mm_shuffle_ps::<1>(m, m)));
        if amax == 0.0 {
            _mm256_storeu_si256(q as *mut __m256i, _mm256_setzero_si256());
            _mm256_storeu_si256(q.add(16) as *mut __m256i, _mm256_setzero_si256());
            return (0.0, 0.0);
        }
        let d = amax / q_max;
        let id = _mm256_set1_ps(q_max / amax);
        let (lo, hi) = (_mm256_set1_ps(-q_max), _mm256_set1_ps(q_max));
        let mut ints = [_mm256_setzero_si256(); 4];
        for i in 0..4 {
            let r = _mm256_round_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(
                _mm256_mul_ps(x[i], id),
            );
            let ordered = _mm256_cmp_ps::<_CMP_ORD_Q>(r, r);
            let c = _mm256_min_ps(_mm256_max_ps(r, lo), hi);
            ints[i] = _mm256_cvtps_epi32(_mm256_and_ps(c, ordered));
        }
        // `packs` interleaves the 128-bit halves; the permute restores order.
        let a = _mm256_permute4x64_epi64::<0b11_01_10_00>(_mm256_packs_epi32(ints[0], ints[1]));
        let b = _mm256_permute4x64_epi64::<0b11_01_10_00>(_mm256_packs_epi32(ints[2], ints[3]));
        _mm256_storeu_si256(q as *mut __m256i, a);
        _mm256_storeu_si256(q.add(16) as *mut __m256i, b);
        let s = _mm256_add_epi32(
            _mm256_add_epi32(ints[0], ints[1]),
            _mm256_add_epi32(ints[2], ints[3]),
        );
        let s = _mm_add_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256::<1>(s));
        let s = _mm_add_epi32(s, _mm_shuffle_epi32::<0b01_00_11_10>(s));
        let s = _mm_add_epi32(s, _mm_shuffle_epi32::<0b00_00_00_01>(s));
        (d, d * _mm_cvtsi128_si32(s) as f32)
    }
}

/// One block of 32 into `q` (`q_max`: `ActQuant::q_max`); returns `(d, d *
/// sum(q))`.
#[inline(always)]
pub(crate) fn quantize_block(x: &[f32; 32], q: &mut [i16], q_max: f32) -> (f32, f32) {
    let finite = x.iter().all(|v| v.is_finite());
    let amax = x.iter().fold(0.0f32, |m, v| m.max(v.abs()));
    if !finite {
        q.fill(0);
        return (f32::NAN, f32::NAN);
    }
    if amax == 0.0 {
        q.fill(0);
        return (0.0, 0.0);
    }
    let d = amax / q_max;
    let id = q_max / amax;
    let mut sum = 0i32;
    for (o, v) in q.iter_mut().zip(x) {
        let r = (v * id).round_ties_even().clamp(-q_max, q_max) as i16;
        *o = r;
        sum += r as i32;
    }
    (d, d * sum as f32)
}
