//! Pass 3 of the AVX-512 kernels (`avx512`, `avx512_bf16`): `out_g = sum_t
//! p_gt * v_t`, each value row read once from the cache and converted in
//! registers (`KvElem::load16`), a whole query group's outputs kept in
//! registers where they fit; for a tile of queries (`tile`), each block
//! fetched once for every query that sees it, each query's sums in the same
//! order as alone.

use std::arch::x86_64::{
    __m512, _mm512_fmadd_ps, _mm512_loadu_ps, _mm512_set1_ps, _mm512_setzero_ps, _mm512_storeu_ps,
};

use super::avx512_ops::widen_rows16;
use super::cache::{Caches, HeadQuery};
use super::format::KvElem;
use super::tile::{block_range, longest, Tile};

/// Pass 3 for a tile: for the group sizes whose outputs fit in registers,
/// each block's value rows fetched once for every query that sees it
/// (`value_tile_group`); else `value_pass` per query.
///
/// # Safety
/// As `value_pass`, with `out` as `TileFn` requires and `off` the tile's
/// `score_offsets`.
#[inline(always)]
pub(crate) unsafe fn value_pass_tile<const D16: usize, E: KvElem>(
    t: Tile<E>,
    scores: &[f32],
    off: &[usize],
    rows: &mut [f32],
) {
    let group = t.out.len / (16 * D16);
    let tile = (t, scores, off);
    // The whole group's outputs in registers when they fit (with the row's
    // `D16` vectors and a weight): each value row is then read once.
    // SAFETY (each arm): forwarded from the caller.
    match (D16, group) {
        (4, 1) => return unsafe { value_tile_group::<D16, 1, E>(tile) },
        (4, 2) => return unsafe { value_tile_group::<D16, 2, E>(tile) },
        (4, 3) => return unsafe { value_tile_group::<D16, 3, E>(tile) },
        (4, 4) => return unsafe { value_tile_group::<D16, 4, E>(tile) },
        (8, 1) => return unsafe { value_tile_group::<D16, 1, E>(tile) },
        (8, 2) => return unsafe { value_tile_group::<D16, 2, E>(tile) },
        _ => {}
    }
    for (i, query) in t.queries.iter().enumerate() {
        // SAFETY: forwarded from the caller; query `i`'s output.
        unsafe {
            value_pass::<D16, E>(
                query,
                &t.caches,
                t.out.row(i),
                &scores[off[i]..off[i + 1]],
                query.span(),
                rows,
            )
        };
    }
}

/// Pass 3 for a tile of queries of exactly `G` query heads each: per block,
/// each query's `G * D16` accumulators are loaded from its output, take the
/// block's visible rows (`accumulate_rows`: each value row read once from
/// the cache and converted in registers, its `D16` vectors multiplied into
/// every head's accumulators) and are stored back; the block is fetched
/// once for the tile. A row's scale (int8) multiplies each head's weight
/// instead of the row (`w * s * v`, not `w * (s * v)`).
///
/// # Safety
/// As `value_pass_tile`; `out.len == G * 16 * D16`.
#[inline(always)]
unsafe fn value_tile_group<const D16: usize, const G: usize, E: KvElem>(
    (t, scores, off): (Tile<E>, &[f32], &[usize]),
) {
    let (d, queries, caches, out) = (16 * D16, t.queries, &t.caches, t.out);
    let bs = caches.shape.block_size;
    let e = caches.entry;
    let last = longest(queries);
    for b in block_range(queries, bs) {
        let entries = last.block(caches, caches.value, b);
        for (i, query) in queries.iter().enumerate() {
            let Some((skip, n, at)) = query.visible(b, bs) else {
                continue;
            };
            // SAFETY: query `i`'s output (caller), `G * d` floats.
            let og = unsafe { out.row(i) };
            let mut acc = [[_mm512_setzero_ps(); D16]; G];
            for (ag, o) in acc.iter_mut().zip(og.chunks_exact(d)) {
                for (c, a) in ag.iter_mut().enumerate() {
                    // SAFETY: `o` holds `d` floats.
                    *a = unsafe { _mm512_loadu_ps(o.as_ptr().add(16 * c)) };
                }
            }
            let weights = &scores[off[i]..off[i + 1]];
            let entries = &entries[skip * e..];
            // SAFETY: forwarded from the caller.
            unsafe {
                accumulate_rows::<D16, G, E>(&mut acc, entries, n, weights, query.span(), at)
            };
            for (ag, o) in acc.iter().zip(og.chunks_exact_mut(d)) {
                for (c, a) in ag.iter().enumerate() {
                    // SAFETY: `o` holds `d` floats.
                    unsafe { _mm512_storeu_ps(o.as_mut_ptr().add(16 * c), *a) };
                }
            }
        }
    }
}

/// Pass 3 of the kernels: `out_g = sum_t p_gt * v_t` for the weights
/// `scores` (`[group, span]`), accumulated in registers per block; each
/// block's value entries widened once into `rows` (`widen_rows16`).
///
/// # Safety
/// The CPU must support AVX-512F, AVX2 and F16C (the caller is compiled
/// with them), and `caches.shape.head_dim == 16 * D16`.
#[inline(always)]
pub(crate) unsafe fn value_pass<const D16: usize, E: KvElem>(
    query: &HeadQuery,
    caches: &Caches<E>,
    out: &mut [f32],
    scores: &[f32],
    span: usize,
    rows: &mut [f32],
) {
    let d = 16 * D16;
    let e = caches.entry;
    let bs = caches.shape.block_size;
    let (first, num_blocks) = (query.start / bs, query.seq_len.div_ceil(bs));
    for b in first..num_blocks {
        let skip = query.skip(b, bs);
        let (n, at) = (query.block_len(b, bs) - skip, b * bs + skip - query.start);
        // SAFETY: the caller runs with the features `widen_rows16` needs.
        let values = unsafe {
            widen_rows16::<D16, E>(&query.block(caches, caches.value, b)[skip * e..], rows)
        };
        for (g, og) in out.chunks_exact_mut(d).enumerate() {
            let mut acc: [__m512; D16] = [_mm512_setzero_ps(); D16];
            for (c, a) in acc.iter_mut().enumerate() {
                // SAFETY: `og` holds `d` floats.
                *a = unsafe { _mm512_loadu_ps(og.as_ptr().add(16 * c)) };
            }
            let weights = &scores[g * span + at..][..n];
            for (&w, v) in weights.iter().zip(values.chunks_exact(d)) {
                let w = _mm512_set1_ps(w);
                for (c, a) in acc.iter_mut().enumerate() {
                    // SAFETY: `v` holds `d` floats.
                    *a = _mm512_fmadd_ps(w, unsafe { _mm512_loadu_ps(v.as_ptr().add(16 * c)) }, *a);
                }
            }
            for (c, a) in acc.iter().enumerate() {
                // SAFETY: `og` holds `d` floats.
                unsafe { _mm512_storeu_ps(og.as_mut_ptr().add(16 * c), *a) };
            }
        }
    }
}

/// `acc[g] += w_gt * v_t` for the first `n` value rows of `entries`, in
/// order, with `w_gt = weights[g * span + at + t]` (times the row's scale for
/// int8): each row read once from the cache and converted in registers
/// (`KvElem::load16`).
///
/// # Safety
/// The CPU must support AVX-512F, AVX2 and F16C (the caller is compiled with
/// them); `entries` holds `n` entries of `16 * D16` values.
#[inline(always)]
unsafe fn accumulate_rows<const D16: usize, const G: usize, E: KvElem>(
    acc: &mut [[__m512; D16]; G],
    entries: &[E],
    n: usize,
    weights: &[f32],
    span: usize,
    at: usize,
) {
    let d = 16 * D16;
    for (j, entry) in entries.chunks_exact(E::entry_size(d)).take(n).enumerate() {
        let mut vv = [_mm512_setzero_ps(); D16];
        for (c, x) in vv.iter_mut().enumerate() {
            // SAFETY: `entry` holds `d` values; the caller runs with the
            // features `load16` needs.
            *x = unsafe { E::load16(entry.as_ptr().add(16 * c)) };
        }
        let row_scale = E::scale(entry, d);
        for (g, ag) in acc.iter_mut().enumerate() {
            let p = weights[g * span + at + j];
            let w = _mm512_set1_ps(if E::SCALE_ELEMS == 0 {
                p
            } else {
                p * row_scale
            });
            for (a, x) in ag.iter_mut().zip(&vv) {
                *a = _mm512_fmadd_ps(w, *x, *a);
            }
        }
    }
}
