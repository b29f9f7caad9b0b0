//! The passes of the per-head kernel (`passes::drive`) for int8 caches on
//! CPUs with AVX-512 VNNI: both
//! passes over the cache run as exact integer dot products (`vpdpwssd`: pairs
//! of int16 products added into int32 lanes, no rounding), so an int8 value
//! is only sign-extended, never converted to a float.
//!
//! - Scores: each query head `q_g` is quantized once to int16,
//!   `round(q_g / sigma_g)` with `sigma_g = max |q_g| / 32767` (an error of at
//!   most `sigma_g / 2` an element: 2^-16 of the head's largest element, far
//!   below the keys' own int8 rounding of 2^-8 of theirs). The integer sum
//!   `q16 . k8` is exact; one float product scales it:
//!   `s = float(q16 . k8) * (scale * sigma_g * key_scale)`.
//! - Values (`avx512_int8_values`): each head's weights `p * value_scale` are
//!   scaled by one power of two and rounded to int16, summed with the value
//!   rows in int32, and each block's sum added to the float output with one
//!   multiply-add.
//!
//! Every sum is fixed by the query alone, so a token's output has the same
//! bits alone, in any batch, and decoded or in a prefill tile (`tile`).

use std::arch::x86_64::{
    __m256i, __m512i, _mm256_loadu_si256, _mm256_storeu_si256, _mm512_abs_ps, _mm512_add_epi32,
    _mm512_add_ps, _mm512_cvt_roundps_epi32, _mm512_cvtepi32_epi16, _mm512_cvtepi32_ps,
    _mm512_cvtepi8_epi16, _mm512_dpwssd_epi32, _mm512_loadu_ps, _mm512_loadu_si512,
    _mm512_mask_storeu_ps, _mm512_max_ps, _mm512_mul_ps, _mm512_reduce_add_ps,
    _mm512_reduce_max_ps, _mm512_set1_ps, _mm512_setzero_ps, _mm512_setzero_si512,
    _mm512_shuffle_i32x4, _mm512_storeu_si512, _mm512_unpackhi_epi32, _mm512_unpackhi_epi64,
    _mm512_unpacklo_epi32, _mm512_unpacklo_epi64,
};

use super::avx512::Avx512;
use super::avx512_int8_values::{quantize_weights, value_pass, weight_slots};
use super::avx512_ops::ROUND;
use super::cache::HeadQuery;
use super::format::{KvElem, Q8};
use super::passes::{drive, normalize_scores, split_scratch, Isa};
use super::tile::{longest, Tile, TileFn, MAX_TILE};

/// The largest magnitude of a quantized query element or weight (int16).
pub(crate) const Q16_MAX: f32 = 32767.0;

/// Whether this CPU runs this kernel: what `avx512` needs, with AVX-512BW
/// (int8 to int16) and AVX-512 VNNI (`vpdpwssd`; `cpu_features::avx512_vnni`).
pub(crate) fn detected() -> bool {
    crate::cpu_features::avx512_vnni()
}

/// The integer passes over int8 caches (`N = D32`: 32 int16 values a
/// vector):
/// 1. per block: each row's key and value scales into `key_scales` and
///    `value_scales` (by position; reading the value block's scales also
///    brings it into the cache for pass 3), then each query head's exact
///    integer dot products `float(q16 . k8)` into its scores: a lone query
///    sign-extends the keys in registers, a tile widens them to int16 once
///    into scratch for all its queries;
/// 2. each score times `scale * sigma_g * key_scale`, the soft cap and
///    softmax (`normalize_scores`), each weight times its value's scale;
/// 3. the weighted values (`avx512_int8_values`).
pub(crate) struct Vnni;

/// `Vnni`'s scratch after the scores: a block's int16 rows (keys: `bs * d
/// / 2` floats; values in pairs: `bs.div_ceil(2) * d`), the key and value
/// scales by position, each query head's `sigma`, then int16: each query
/// head's weights (`weight_slots`, query `i`'s from `woff[i]`) and its
/// quantized values.
pub(crate) struct Int8State<'s> {
    rows: &'s mut [f32],
    key_scales: &'s mut [f32],
    value_scales: &'s mut [f32],
    sigma: &'s mut [f32],
    weights: &'s mut [i16],
    quantized: &'s mut [i16],
    woff: [usize; MAX_TILE + 1],
    group: usize,
    tiled: bool,
}

impl Isa<Q8> for Vnni {
    const NAME: &'static str = "avx512_vnni";
    const UNIT: usize = 32;
    type State<'s> = Int8State<'s>;
    /// The block's int8 key entries; with the tile's state.
    type Keys<'a> = (&'a [Q8], &'a Int8State<'a>);

    fn detected() -> bool {
        detected()
    }

    #[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx2,f16c")]
    unsafe fn tile<const D32: usize>(t: Tile<Q8>, scratch: &mut Vec<f32>) {
        if !t.caches.shape.block_size.is_multiple_of(2) {
            // Rows pair up within a block only for even block sizes; odd
            // ones take the AVX-512 kernel.
            let avx512: TileFn<Q8> = match D32 {
                2 => <Avx512 as Isa<Q8>>::tile::<4>,
                _ => <Avx512 as Isa<Q8>>::tile::<8>,
            };
            // SAFETY: `detected()` includes what `avx512` needs.
            return unsafe { avx512(t, scratch) };
        }
        // SAFETY: forwarded from the caller.
        unsafe { drive::<Self, Q8, D32>(t, scratch) }
    }

    /// The scratch split, and each query head quantized (`quantize_query`).
    #[inline(always)]
    unsafe fn prepare<'s, const D32: usize>(
        t: &Tile<Q8>,
        scratch: &'s mut Vec<f32>,
        scores: usize,
    ) -> (&'s mut [f32], Int8State<'s>) {
        let (d, queries) = (32 * D32, t.queries);
        let group = queries[0].q.len() / d;
        let mut woff = [0; MAX_TILE + 1];
        for (i, query) in queries.iter().enumerate() {
            woff[i + 1] = woff[i] + group * weight_slots(query);
        }
        let (heads, positions) = (queries.len() * group, longest(queries).seq_len);
        let (room, wide) = (
            t.caches.shape.block_size.div_ceil(2) * d,
            woff[queries.len()] + heads * d,
        );
        let rest = room + 2 * positions + heads + wide / 2;
        let (scores, rest) = split_scratch(scratch, scores, rest);
        let (rows, rest) = rest.split_at_mut(room);
        let (key_scales, rest) = rest.split_at_mut(positions);
        let (value_scales, rest) = rest.split_at_mut(positions);
        let (sigma, rest) = rest.split_at_mut(heads);
        // SAFETY: `rest` holds `wide / 2` floats: as many int16 pairs.
        let wide = unsafe { std::slice::from_raw_parts_mut(rest.as_mut_ptr() as *mut i16, wide) };
        let (weights, quantized) = wide.split_at_mut(woff[queries.len()]);
        for (h, qh) in queries.iter().flat_map(|q| q.q.chunks_exact(d)).enumerate() {
            // SAFETY: AVX-512F and AVX-512BW (caller); `qh` and the head's
            // slots hold `d` values.
            sigma[h] = unsafe { quantize_query::<D32>(qh, &mut quantized[h * d..][..d]) };
        }
        let tiled = queries.len() > 1;
        let state = Int8State {
            rows,
            key_scales,
            value_scales,
            sigma,
            weights,
            quantized,
            woff,
            group,
            tiled,
        };
        (scores, state)
    }

    #[inline(always)]
    unsafe fn keys<'a, const D32: usize>(
        state: &'a mut Int8State<'_>,
        t: &Tile<'a, Q8>,
        b: usize,
    ) -> (&'a [Q8], &'a Int8State<'a>) {
        let (d, bs) = (32 * D32, t.caches.shape.block_size);
        let e = Q8::entry_size(d);
        let (keys, values) = (t.block(t.caches.key, b), t.block(t.caches.value, b));
        for (j, (k, v)) in keys.chunks_exact(e).zip(values.chunks_exact(e)).enumerate() {
            state.key_scales[b * bs + j] = Q8::scale(k, d);
            state.value_scales[b * bs + j] = Q8::scale(v, d);
        }
        if state.tiled {
            // SAFETY: `rows` holds `bs * d` int16 slots; the features are
            // enabled by the caller.
            unsafe { widen_keys::<D32>(keys, keys.len() / e, state.rows.as_mut_ptr() as *mut i16) };
        }
        (keys, state)
    }

    /// `float(q16_h . k8_t)`, exact.
    #[inline(always)]
    unsafe fn scores<const D32: usize>(
        &(entries, state): &(&[Q8], &Int8State<'_>),
        h: usize,
        _: &HeadQuery,
        _: &[f32],
        skip: usize,
        row: &mut [f32],
    ) {
        let (d, e) = (32 * D32, Q8::entry_size(32 * D32));
        let (qh, wide) = (
            &state.quantized[h * d..][..d],
            state.rows.as_ptr() as *const i16,
        );
        let mut qv = [_mm512_setzero_si512(); D32];
        for (c, v) in qv.iter_mut().enumerate() {
            // SAFETY: `qh` holds `d = 32 * D32` values.
            *v = unsafe { _mm512_loadu_si512(qh.as_ptr().add(32 * c) as *const __m512i) };
        }
        for (chunk, out16) in row.chunks_mut(16).enumerate() {
            let (m, first) = (out16.len(), skip + 16 * chunk);
            // SAFETY: rows `first..first + m` of the block, as int8 entries
            // or widened; `out16` holds `m` floats; the features are enabled
            // by the caller.
            unsafe {
                let acc = if state.tiled {
                    dots16::<D32>(&qv, m, |j, c| {
                        let at = wide.add((first + j) * d + 32 * c);
                        _mm512_loadu_si512(at as *const __m512i)
                    })
                } else {
                    dots16::<D32>(&qv, m, |j, c| {
                        let at = entries.as_ptr().add((first + j) * e + 32 * c);
                        _mm512_cvtepi8_epi16(_mm256_loadu_si256(at as *const __m256i))
                    })
                };
                let mask = ((1u32 << m) - 1) as u16;
                _mm512_mask_storeu_ps(out16.as_mut_ptr(), mask, _mm512_cvtepi32_ps(hsum16(&acc)));
            }
        }
    }

    /// Scales, soft cap, softmax (with sink), value scales, int16 weights.
    #[inline(always)]
    unsafe fn normalize(state: &mut Int8State<'_>, i: usize, query: &HeadQuery, s: &mut [f32]) {
        let (span, group) = (query.span(), state.group);
        let visible = query.start..query.seq_len;
        for (g, row) in s.chunks_exact_mut(span).enumerate() {
            let factor = query.scale * state.sigma[i * group + g];
            for (s, &k) in row.iter_mut().zip(&state.key_scales[visible.clone()]) {
                *s *= factor * k;
            }
        }
        normalize_scores::<true>(query, s, span);
        let slots = weight_slots(query);
        for (g, row) in s.chunks_exact_mut(span).enumerate() {
            for (w, &v) in row.iter_mut().zip(&state.value_scales[visible.clone()]) {
                *w *= v;
            }
            let u = &mut state.weights[state.woff[i] + g * slots..][..slots];
            // SAFETY: AVX-512F and AVX-512BW (caller).
            unsafe { quantize_weights(row, query.start, u) };
        }
    }

    #[inline(always)]
    unsafe fn values<const D32: usize>(state: Int8State<'_>, t: Tile<Q8>, _: &[f32], _: &[usize]) {
        // SAFETY: the features `value_pass` needs (caller); `out` as the
        // caller guarantees; `weights` 4-byte aligned with even rows;
        // `rows` holds `bs.div_ceil(2) * d` floats.
        unsafe { value_pass::<D32>(t, state.weights, &state.woff, state.rows) };
    }
}

/// `q` (`[32 * D32]` floats) as int16 values `round(q / sigma)` into `out`
/// (`[32 * D32]`), returning `sigma = max |q| / 32767`: 0 for a zero query,
/// NaN when `q` holds an infinity or NaN (every score of the head is then
/// NaN, as a float dot product would make it).
///
/// # Safety
/// The CPU must support AVX-512F and AVX-512BW (the caller is compiled with
/// them).
#[inline(always)]
unsafe fn quantize_query<const D32: usize>(q: &[f32], out: &mut [i16]) -> f32 {
    debug_assert!(q.len() == 32 * D32 && out.len() == 32 * D32);
    // SAFETY (loads): `q` holds `32 * D32` floats.
    let load = |i: usize| unsafe { _mm512_loadu_ps(q.as_ptr().add(16 * i)) };
    let (mut max, mut finite) = (_mm512_setzero_ps(), _mm512_setzero_ps());
    for i in 0..2 * D32 {
        let x = load(i);
        max = _mm512_max_ps(max, _mm512_abs_ps(x));
        // x * 0 is NaN exactly for an infinity or NaN.
        finite = _mm512_add_ps(finite, _mm512_mul_ps(x, _mm512_setzero_ps()));
    }
    let max = _mm512_reduce_max_ps(max);
    let (sigma, inv) = if _mm512_reduce_add_ps(finite).is_nan() {
        (f32::NAN, 0.0)
    } else if max > 0.0 {
        (max / Q16_MAX, Q16_MAX / max)
    } else {
        (0.0, 0.0)
    };
    let inv = _mm512_set1_ps(inv);
    let half = |i: usize| {
        _mm512_cvtepi32_epi16(_mm512_cvt_roundps_epi32::<ROUND>(_mm512_mul_ps(
            load(i),
            inv,
        )))
    };
    for i in 0..2 * D32 {
        // SAFETY: `out` holds `32 * D32` values.
        unsafe { _mm256_storeu_si256(out.as_mut_ptr().add(16 * i) as *mut __m256i, half(i)) };
    }
    sigma
}

/// The first `n` key rows of `entries` (`[n, d + 2]`, `d = 32 * D32`)
/// sign-extended to int16 into `keys` (`[n, d]`).
///
/// # Safety
/// The CPU must support AVX-512F and AVX-512BW; `keys` holds `n * d` slots.
#[inline(always)]
unsafe fn widen_keys<const D32: usize>(entries: &[Q8], n: usize, keys: *mut i16) {
    let d = 32 * D32;
    for (j, entry) in entries.chunks_exact(Q8::entry_size(d)).take(n).enumerate() {
        for c in 0..D32 {
            // SAFETY: `entry` holds `d` values, row `j` of `keys` `d` slots.
            unsafe {
                let x = _mm256_loadu_si256(entry.as_ptr().add(32 * c) as *const __m256i);
                _mm512_storeu_si512(
                    keys.add(j * d + 32 * c) as *mut __m512i,
                    _mm512_cvtepi8_epi16(x),
                );
            }
        }
    }
}

/// The int32 lane partial sums of `q . k_j` for `n` (<= 16) int16 key
/// rows, `load(j, c)` giving values `32c..32c + 32` of row `j`; a full
/// chunk of 16 rows keeps its accumulators in registers. Rows past `n`
/// stay zero.
///
/// # Safety
/// The CPU must support AVX-512F and AVX-512 VNNI (the caller is compiled
/// with them), and `load` must be safe for `j < n`, `c < D32`.
#[inline(always)]
unsafe fn dots16<const D32: usize>(
    qv: &[__m512i; D32],
    n: usize,
    load: impl Fn(usize, usize) -> __m512i,
) -> [__m512i; 16] {
    let mut acc = [_mm512_setzero_si512(); 16];
    if n == 16 {
        for (c, qc) in qv.iter().enumerate() {
            for (j, a) in acc.iter_mut().enumerate() {
                *a = _mm512_dpwssd_epi32(*a, *qc, load(j, c));
            }
        }
    } else {
        for (j, a) in acc.iter_mut().enumerate().take(n) {
            for (c, qc) in qv.iter().enumerate() {
                *a = _mm512_dpwssd_epi32(*a, *qc, load(j, c));
            }
        }
    }
    acc
}

/// Lane `j`: the sum of the 16 int32 lanes of `v[j]` (exact, so the tree's
/// order does not matter; int32 cannot overflow: at most 128 products of
/// magnitude 32767 * 127 per lane group).
///
/// # Safety
/// The CPU must support AVX-512F (the caller is compiled with it).
#[inline(always)]
unsafe fn hsum16(v: &[__m512i; 16]) -> __m512i {
    let mut p = [_mm512_setzero_si512(); 8];
    for (i, o) in p.iter_mut().enumerate() {
        let (a, b) = (v[2 * i], v[2 * i + 1]);
        *o = _mm512_add_epi32(_mm512_unpacklo_epi32(a, b), _mm512_unpackhi_epi32(a, b));
    }
    let mut u = [_mm512_setzero_si512(); 4];
    for (i, o) in u.iter_mut().enumerate() {
        let (a, b) = (p[2 * i], p[2 * i + 1]);
        *o = _mm512_add_epi32(_mm512_unpacklo_epi64(a, b), _mm512_unpackhi_epi64(a, b));
    }
    let halves = |a: __m512i, b: __m512i| {
        _mm512_add_epi32(
            _mm512_shuffle_i32x4::<0b10_00_10_00>(a, b),
            _mm512_shuffle_i32x4::<0b11_01_11_01>(a, b),
        )
    };
    halves(halves(u[0], u[1]), halves(u[2], u[3]))
}
