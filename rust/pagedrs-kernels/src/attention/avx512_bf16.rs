//! The passes of the per-head kernel (`passes::drive`) for bfloat16 caches
//! and bfloat16 queries on CPUs with AVX-512 BF16: the score pass takes 32 bfloat16 products per
//! instruction (`vdpbf16ps`: pairs of exact bf16 x bf16 products added into
//! float32 lanes) over the cache's key bits in place, the value pass is the
//! AVX-512 one (`avx512_values`: value rows converted in registers, weights
//! stay float32). Chosen only for bfloat16 queries, whose values the
//! instruction takes exactly (`Isa::takes`); the query's softmax scale
//! multiplies each score after the dot product. (int8 caches take the
//! integer kernel, `avx512_int8`.)

use std::arch::x86_64::{
    __m512, __m512bh, __m512i, _mm512_cvtne2ps_pbh, _mm512_dpbf16_ps, _mm512_loadu_ps,
    _mm512_loadu_si512, _mm512_set1_ps, _mm512_setzero_ps,
};

use super::avx512_ops::store_sums;
use super::avx512_values::value_pass_tile;
use super::cache::HeadQuery;
use super::format::Bf16;
use super::passes::{drive, split_rows, Isa};
use super::tile::Tile;

/// The lane partial sums of `q . k_j` for the `n` (<= 16) bfloat16 key
/// rows at `keys` (row stride `32 * D32`), as `avx512::dots16` does for
/// floats: each `acc[j]` takes the row's `D32` products in order, a full
/// chunk of 16 rows with constant trip counts (accumulators in registers,
/// rows interleaved), fewer in a plain loop. Rows past `n` stay zero.
///
/// # Safety
/// The CPU must support AVX-512F and AVX-512 BF16 (the caller is compiled
/// with them), and `keys` must point at `n` rows of `32 * D32` values.
#[inline(always)]
unsafe fn dots16<const D32: usize>(
    qv: &[__m512bh; D32],
    keys: *const u16,
    n: usize,
) -> [__m512; 16] {
    let d = 32 * D32;
    let load = |j: usize, c: usize| {
        // SAFETY: row `j < n` holds `d` values (caller); 32 bfloat16 values
        // are one `__m512bh`.
        unsafe {
            std::mem::transmute::<__m512i, __m512bh>(_mm512_loadu_si512(
                keys.add(j * d + 32 * c) as *const __m512i
            ))
        }
    };
    let mut acc = [_mm512_setzero_ps(); 16];
    if n == 16 {
        for (c, qc) in qv.iter().enumerate() {
            for (j, a) in acc.iter_mut().enumerate() {
                *a = _mm512_dpbf16_ps(*a, *qc, load(j, c));
            }
        }
    } else {
        for (j, a) in acc.iter_mut().enumerate().take(n) {
            for (c, qc) in qv.iter().enumerate() {
                *a = _mm512_dpbf16_ps(*a, *qc, load(j, c));
            }
        }
    }
    acc
}

/// AVX-512 BF16 passes over bfloat16 caches, for bfloat16 queries (`N =
/// D32`: 32 values a vector).
pub(crate) struct Avx512Bf16;

impl Isa<Bf16> for Avx512Bf16 {
    const NAME: &'static str = "avx512_bf16";
    const UNIT: usize = 32;
    type State<'s> = &'s mut [f32];
    type Keys<'a> = &'a [Bf16];

    fn detected() -> bool {
        crate::cpu_features::avx512_bf16()
    }

    fn takes(bf16_query: bool) -> bool {
        bf16_query
    }

    #[target_feature(enable = "avx512f,avx512bf16,avx2,f16c")]
    unsafe fn tile<const D32: usize>(t: Tile<Bf16>, scratch: &mut Vec<f32>) {
        // SAFETY: forwarded from the caller.
        unsafe { drive::<Self, Bf16, D32>(t, scratch) }
    }

    unsafe fn prepare<'s, const D32: usize>(
        t: &Tile<Bf16>,
        scratch: &'s mut Vec<f32>,
        scores: usize,
    ) -> (&'s mut [f32], &'s mut [f32]) {
        split_rows(&t.caches, scratch, scores)
    }

    /// The block's key bits, read in place.
    #[inline(always)]
    unsafe fn keys<'a, const D32: usize>(
        _: &'a mut &mut [f32],
        t: &Tile<'a, Bf16>,
        b: usize,
    ) -> &'a [Bf16] {
        t.block(t.caches.key, b)
    }

    /// `scale * (q_g . k_t)`, the dot products of up to 16 keys summed
    /// together (`avx512::hsum16`).
    #[inline(always)]
    unsafe fn scores<const D32: usize>(
        keys: &&[Bf16],
        _: usize,
        query: &HeadQuery,
        qg: &[f32],
        skip: usize,
        row: &mut [f32],
    ) {
        let (d, scale) = (32 * D32, _mm512_set1_ps(query.scale));
        // SAFETY: row `skip` of the block's rows.
        let keys = unsafe { (keys.as_ptr() as *const u16).add(skip * d) };
        let mut qv: [__m512bh; D32] =
            [_mm512_cvtne2ps_pbh(_mm512_setzero_ps(), _mm512_setzero_ps()); D32];
        for (c, v) in qv.iter_mut().enumerate() {
            // SAFETY: `qg` holds `d = 32 * D32` floats; they are bfloat16
            // values, so the conversion is exact.
            *v = unsafe {
                let lo = _mm512_loadu_ps(qg.as_ptr().add(32 * c));
                let hi = _mm512_loadu_ps(qg.as_ptr().add(32 * c + 16));
                _mm512_cvtne2ps_pbh(hi, lo)
            };
        }
        for (chunk, out16) in row.chunks_mut(16).enumerate() {
            // SAFETY: the chunk's key rows hold `d` bfloat16 values each;
            // `out16` holds at most 16 floats; the features are enabled.
            unsafe {
                let acc = dots16::<D32>(&qv, keys.add(16 * chunk * d), out16.len());
                store_sums(out16, &acc, Some(scale))
            };
        }
    }

    #[inline(always)]
    unsafe fn values<const D32: usize>(
        rows: &mut [f32],
        t: Tile<Bf16>,
        scores: &[f32],
        off: &[usize],
    ) {
        // SAFETY: forwarded from the caller; `d = 16 * (2 * D32)`.
        match D32 {
            2 => unsafe { value_pass_tile::<4, Bf16>(t, scores, off, rows) },
            _ => unsafe { value_pass_tile::<8, Bf16>(t, scores, off, rows) },
        }
    }
}
