//! The kernel over k-quant panel weights (`repack_k`: Q4_K, Q5_K, Q6_K
//! repacked at load into groups of 16 interleaved outputs) on int8
//! activations, in AVX-512 VNNI, at every row count. A panel block's quant
//! vector `p` holds the same 4 value positions of the 16 outputs, so a
//! weight vector is one load and its format's masks and shifts, done 16
//! outputs at a time (Q4_K: the low or high nibbles; Q5_K: and the high bit
//! of `qh`, rotated into bit 4; Q6_K: the low or high nibbles of `ql` and
//! the bit pair of `qh` rotated into bits 4..6, joined by one `vpternlogd`),
//! with neither a per-call fill nor a horizontal reduction.
//!
//! The kernel steps through K one 256-value block at a time. Per step the
//! item's 16-output groups' scales are decoded once, 16 lanes at a time,
//! into float32 (`d * sc` and `-(dmin * m)`, exact products, as
//! `blocks::decode` forms them), then register tiles of `MR` rows by `MO`
//! groups run the step's 8 sub-blocks: per row, sub-block (Q6_K: 16-value
//! scale group) and 16 outputs one `vpdpbusd` per 4 int8 values of the row
//! (the quad broadcast) into int32 sums (Q6_K: started at `-32 * sum(x)`
//! of the group, so that they end at the exact `sum(q * x)` of its signed
//! integers), then one conversion, product `scale * d` and fused
//! multiply-add into the float32 accumulator, in sub-block and group order;
//! (Q4_K, Q5_K) per row and 16 outputs `fma(min, d * sum(x), macc)` into
//! the minimum terms, in sub-block order, once per step for all the tiles.
//! These are the portable kernel's operations (module docs of `quant`).
//! Over more than `PRE_ROWS` rows Q5_K's and Q6_K's quads of a step are
//! decoded once into the thread's scratch, which every row tile reads;
//! otherwise each tile decodes its own, straight from the panel block.

use std::arch::x86_64::*;
use std::cell::RefCell;
use std::ops::Range;

use super::super::act::QuantActs;
use super::super::format::{QuantType, QuantWeight};
use super::super::item::ItemFn;
use super::super::repack::GROUP;
use super::decode::{groups, has_min, Q4K, Q5K, Q6K};
use super::panel::reset;

/// Rows by 16-output groups of a tile: 24 int32 sums in registers.
const MR: usize = 6;
const MO: usize = 4;

/// Rows over which Q5_K's and Q6_K's quads are decoded once per step.
const PRE_ROWS: usize = 32;

/// Sub-blocks of a 256-value block.
const SUBS: usize = 8;

/// Bytes of a panel block (16 outputs' 256-value blocks).
const fn panel_block(t: u8) -> usize {
    GROUP
        * match t {
            Q4K => 144,
            Q5K => 176,
            _ => 210,
        }
}

/// A thread's buffers, kept between calls.
#[derive(Default)]
struct Scratch {
    /// `[og][sub-block][quad]`: the step's unsigned weight bytes (`quad`),
    /// decoded once per step over more than `MR` rows.
    q: Vec<__m512i>,
    /// `[row][og][16]`.
    acc: Vec<f32>,
    /// `[row][og][16]`: the minimum terms (Q4_K, Q5_K).
    macc: Vec<f32>,
    /// `[og][sub-block][scale group][16]`: the step's float32 scales.
    s: Vec<f32>,
    /// `[og][sub-block][16]`: the step's float32 minimums.
    m: Vec<f32>,
}

thread_local! {
    static SCRATCH: RefCell<Scratch> = RefCell::new(Scratch::default());
}

#[inline(always)]
unsafe fn load(p: *const u8) -> __m512i {
    _mm512_loadu_si512(p as *const __m512i)
}

/// `c ? a : b`, bit by bit.
#[inline(always)]
unsafe fn select(c: __m512i, a: __m512i, b: __m512i) -> __m512i {
    _mm512_ternarylogic_epi32::<0xe4>(a, b, c)
}

/// Quad `p` (values `4 p .. 4 p + 4`) of sub-block `j` of the 16 outputs of
/// the panel block at `blk`, as unsigned bytes (`blocks::decode`'s integers;
/// Q6_K's plus 32). `rot` is `rotation::<T>(j)`.
#[inline(always)]
unsafe fn quad<const T: u8>(blk: *const u8, j: usize, p: usize, rot: __m512i) -> __m512i {
    let low4 = _mm512_set1_epi8(0x0f);
    match T {
        Q4K | Q5K => {
            let v = load(blk.add(64 * (8 * (j / 2) + p)));
            let v = if j % 2 == 1 {
                _mm512_srli_epi32::<4>(v)
            } else {
                v
            };
            if T == Q4K {
                return _mm512_and_si512(v, low4);
            }
            // Bit `j` of each `qh` byte rotated into bit 4.
            let h = _mm512_rolv_epi32(load(blk.add(16 * 128 + 64 * p)), rot);
            _mm512_and_si512(select(low4, v, h), _mm512_set1_epi8(0x1f))
        }
        _ => {
            let (h, t) = (j / 4, j % 4);
            let v = load(blk.add(64 * (16 * h + 8 * (t % 2) + p)));
            let v = if t >= 2 { _mm512_srli_epi32::<4>(v) } else { v };
            // Bits `2 t, 2 t + 1` of each `qh` byte rotated into bits 4, 5.
            let hb = _mm512_rolv_epi32(load(blk.add(16 * 128 + 64 * (8 * h + p))), rot);
            _mm512_and_si512(select(low4, v, hb), _mm512_set1_epi8(0x3f))
        }
    }
}

/// The dword rotation (left) that takes sub-block `j`'s high bits to bit 4
/// of their byte (Q5_K: bit `j`; Q6_K: bits `2 (j % 4)` and up).
#[inline(always)]
unsafe fn rotation<const T: u8>(j: usize) -> __m512i {
    let from = if T == Q5K { j } else { 2 * (j % 4) };
    _mm512_set1_epi32(((4 + 32 - from) % 32) as i32)
}

/// The float16 in the low (`HI = false`) or high half of each dword of
/// `v`, as float32 (exact).
#[inline(always)]
unsafe fn f16_lanes<const HI: bool>(v: __m512i) -> __m512 {
    let v = if HI { _mm512_srli_epi32::<16>(v) } else { v };
    _mm512_cvtph_ps(_mm512_cvtepi32_epi16(v))
}

/// Byte `b` of each dword of `v` as an int32, zero-extended.
#[inline(always)]
unsafe fn byte(v: __m512i, b: usize) -> __m512i {
    _mm512_and_si512(
        _mm512_srl_epi32(v, _mm_cvtsi32_si128(8 * b as i32)),
        _mm512_set1_epi32(0xff),
    )
}

/// The float32 scales (`s`, `[sub-block][scale group][16]`) and minimums
/// (`m`, `[sub-block][16]`) of the panel block at `blk`: `blocks::decode`'s
/// products `d * sc` and `-(dmin * m)`, 16 outputs at a time.
#[inline(always)]
unsafe fn scales<const T: u8>(blk: *const u8, s: *mut f32, m: *mut f32) {
    if T == Q6K {
        let d = _mm512_cvtph_ps(_mm256_loadu_si256(blk.add(16 * 208) as *const __m256i));
        for v in 0..4 {
            let sc = load(blk.add(16 * 192 + 64 * v));
            for b in 0..4 {
                let x = _mm512_sll_epi32(sc, _mm_cvtsi32_si128(24 - 8 * b as i32));
                let x = _mm512_cvtepi32_ps(_mm512_srai_epi32::<24>(x));
                _mm512_storeu_ps(s.add(16 * (4 * v + b)), _mm512_mul_ps(d, x));
            }
        }
        return;
    }
    let at = 16 * if T == Q4K { 128 } else { 160 };
    // Dwords: float16 d and dmin, then the 12 bytes of 6-bit scales and
    // minimums (`blocks::scale_min_k4`).
    let hd: [__m512i; 4] = std::array::from_fn(|v| load(blk.add(at + 64 * v)));
    let (d, dmin) = (f16_lanes::<false>(hd[0]), f16_lanes::<true>(hd[0]));
    let six = _mm512_set1_epi32(63);
    for j in 0..SUBS {
        let (sc, mn) = if j < 4 {
            (
                _mm512_and_si512(byte(hd[1], j), six),
                _mm512_and_si512(byte(hd[2], j), six),
            )
        } else {
            let (a, b, c) = (byte(hd[1], j - 4), byte(hd[2], j - 4), byte(hd[3], j - 4));
            let hi2 = |v: __m512i| _mm512_slli_epi32::<4>(_mm512_srli_epi32::<6>(v));
            (
                _mm512_or_si512(_mm512_and_si512(c, _mm512_set1_epi32(0x0f)), hi2(a)),
                _mm512_or_si512(_mm512_srli_epi32::<4>(c), hi2(b)),
            )
        };
        _mm512_storeu_ps(s.add(16 * j), _mm512_mul_ps(d, _mm512_cvtepi32_ps(sc)));
        let v = _mm512_mul_ps(dmin, _mm512_cvtepi32_ps(mn));
        _mm512_storeu_ps(m.add(16 * j), _mm512_xor_ps(v, _mm512_set1_ps(-0.0)));
    }
}

/// The activation rows of a tile, from the step's first sub-block.
struct Rows {
    q: [*const i8; MR],
    d: [*const f32; MR],
    sum16: [*const i32; MR],
}

/// The step's unsigned weight bytes of the panel block at `blk` into `q`
/// (`[sub-block][quad]`), asking for the group's next panel block (`pb`
/// bytes on) meanwhile.
#[inline(always)]
unsafe fn decode_block<const T: u8>(blk: *const u8, q: *mut __m512i) {
    let pb = panel_block(T);
    let next = blk.wrapping_add(pb);
    for line in 0..pb.div_ceil(64) + 1 {
        _mm_prefetch::<_MM_HINT_T1>(next.wrapping_add(64 * line) as *const i8);
    }
    for j in 0..SUBS {
        let rot = rotation::<T>(j);
        for p in 0..8 {
            _mm512_storeu_si512(q.add(8 * j + p), quad::<T>(blk, j, p, rot));
        }
    }
}

/// One 256-value block of a tile of `R` rows by the `O` groups whose panel
/// blocks start at `w` (group stride `gs` bytes; with `PRE`, their decoded
/// quads at `dq`, `decode_block`'s, 64 vectors a group), their scales at `s` and
/// (`scales`' layout, group stride `8 * groups` vectors), into `acc`
/// (`[row of the tile][og][16]`, row stride `stride`); with `ahead`, each group's next panel block asked for into L2
/// meanwhile, an eighth a sub-block.
#[inline(always)]
#[allow(clippy::too_many_arguments, clippy::needless_range_loop)]
unsafe fn tile<const T: u8, const R: usize, const O: usize, const PRE: bool>(
    w: *const u8,
    gs: usize,
    dq: *const __m512i,
    s: *const f32,
    a: &Rows,
    acc: *mut f32,
    stride: usize,
    ahead: bool,
) {
    let pb = panel_block(T);
    let g = groups(T);
    let lines = pb.div_ceil(64) + 1;
    let blk: [*const u8; O] = std::array::from_fn(|o| w.add(o * gs));
    for j in 0..SUBS {
        if ahead {
            for b in blk {
                let next = b.wrapping_add(pb);
                for line in j * lines / SUBS..(j + 1) * lines / SUBS {
                    _mm_prefetch::<_MM_HINT_T1>(next.wrapping_add(64 * line) as *const i8);
                }
            }
        }
        let rot = rotation::<T>(j);
        for gi in 0..g {
            let mut isum = [[_mm512_setzero_si512(); O]; R];
            if T == Q6K {
                for r in 0..R {
                    let sum = *a.sum16[r].add(2 * j + gi);
                    isum[r] = [_mm512_set1_epi32(-32 * sum); O];
                }
            }
            for p in 8 / g * gi..8 / g * (gi + 1) {
                let mut wv = [_mm512_setzero_si512(); O];
                for o in 0..O {
                    wv[o] = if PRE {
                        _mm512_loadu_si512(dq.add(64 * o + 8 * j + p))
                    } else {
                        quad::<T>(blk[o], j, p, rot)
                    };
                }
                for r in 0..R {
                    let x = a.q[r].add(32 * j + 4 * p);
                    let xb = _mm512_set1_epi32((x as *const i32).read_unaligned());
                    for o in 0..O {
                        isum[r][o] = _mm512_dpbusd_epi32(isum[r][o], wv[o], xb);
                    }
                }
            }
            let mut sv = [_mm512_setzero_ps(); O];
            for o in 0..O {
                sv[o] = _mm512_loadu_ps(s.add(16 * (o * SUBS * g + j * g + gi)));
            }
            for r in 0..R {
                let d = _mm512_set1_ps(*a.d[r].add(j));
                for o in 0..O {
                    let sd = _mm512_mul_ps(sv[o], d);
                    let at = acc.add(r * stride + 16 * o);
                    let v =
                        _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum[r][o]), sd, _mm512_loadu_ps(at));
                    _mm512_storeu_ps(at, v);
                }
            }
        }
    }
}

/// The minimum terms of one 256-value block for every row of `rows` and
/// group of the item: per row and 16 outputs, `fma(min, d * sum(x), macc)`
/// in sub-block order, the sum held in a register over the block's 8
/// sub-blocks (`m`: `scales`' minimums, 8 vectors a group; `macc`: `[row][og][16]`).
#[inline(always)]
unsafe fn min_terms(
    m: *const f32,
    macc: &mut [f32],
    acts: &QuantActs,
    rows: &Range<usize>,
    nog: usize,
    kb: usize,
) {
    let nsub = acts.k / 32;
    for (i, r) in rows.clone().enumerate() {
        let ds = acts.dsum.as_ptr().add(r * nsub + kb);
        for og in 0..nog {
            let at = macc.as_mut_ptr().add((i * nog + og) * 16);
            let mut v = _mm512_loadu_ps(at);
            for j in 0..SUBS {
                let mv = _mm512_loadu_ps(m.add(16 * (og * SUBS + j)));
                v = _mm512_fmadd_ps(mv, _mm512_set1_ps(*ds.add(j)), v);
            }
            _mm512_storeu_ps(at, v);
        }
    }
}

/// Outputs `outputs` (starting at a multiple of 16) by rows `rows` of the
/// k-quant panel weight `w` on int8 activations (`item::ItemFn`). Only for
/// a CPU with AVX-512F, AVX-512BW and AVX-512 VNNI.
#[inline(always)]
unsafe fn item_packed_k<const T: u8>(
    w: &QuantWeight,
    outputs: Range<usize>,
    acts: &QuantActs,
    rows: Range<usize>,
    write: &mut dyn FnMut(usize, usize, &[f32]),
) {
    if !super::packed::panel_call(w, &outputs, acts, &rows) {
        return;
    }
    let (k, nsub, nb) = (w.k, w.k / 32, w.k / 256);
    let g = groups(T);
    let pb = panel_block(T);
    let gs = nb * pb;
    let (nr, nc) = (rows.len(), outputs.len());
    let nog = nc.div_ceil(GROUP);
    let stride = nog * GROUP;
    let g0 = outputs.start / GROUP;
    let (ss, ms) = (SUBS * g * 16, SUBS * 16);
    let mut sc = SCRATCH.take();
    reset(&mut sc.acc, nr * stride, 0.0);
    if has_min(T) {
        reset(&mut sc.macc, nr * stride, 0.0);
    }
    reset(&mut sc.s, nog * ss, 0.0);
    reset(&mut sc.m, nog * ms, 0.0);
    // Over many rows Q5_K's and Q6_K's quads are decoded once per step (up
    // to 32 rows, and for Q4_K's mask or shift and mask at any count, each
    // tile decoding its own was as fast or faster on AMD EPYC Zen 5).
    let pre = T != Q4K && nr > PRE_ROWS;
    if pre {
        reset(&mut sc.q, nog * 64, _mm512_setzero_si512());
    }
    for b in 0..nb {
        for og in 0..nog {
            let blk = w.data.as_ptr().add((g0 + og) * gs + b * pb);
            scales::<T>(
                blk,
                sc.s.as_mut_ptr().add(og * ss),
                sc.m.as_mut_ptr().add(og * ms),
            );
            if pre {
                decode_block::<T>(blk, sc.q.as_mut_ptr().add(og * 64));
            }
        }
        let kb = SUBS * b;
        if has_min(T) {
            min_terms(sc.m.as_ptr(), &mut sc.macc, acts, &rows, nog, kb);
        }
        for r0 in (0..nr).step_by(MR) {
            let tr = MR.min(nr - r0);
            let mut a = Rows {
                q: [std::ptr::null(); MR],
                d: [std::ptr::null(); MR],
                sum16: [std::ptr::null(); MR],
            };
            for r in 0..tr {
                let row = rows.start + r0 + r;
                a.q[r] = acts.q8.as_ptr().add(row * k + 32 * kb);
                a.d[r] = acts.d.as_ptr().add(row * nsub + kb);
                a.sum16[r] = acts.sum16.as_ptr().add(row * 2 * nsub + 2 * kb);
            }
            for og0 in (0..nog).step_by(MO) {
                let to = MO.min(nog - og0);
                let wp = w.data.as_ptr().add((g0 + og0) * gs + b * pb);
                let s = sc.s.as_ptr().add(og0 * ss);
                let at = r0 * stride + og0 * GROUP;
                let ahead = r0 == 0 && !pre;
                let dq = if pre {
                    sc.q.as_ptr().add(og0 * 64)
                } else {
                    std::ptr::null()
                };
                let acc = sc.acc.as_mut_ptr().add(at);
                macro_rules! go {
                    ($pre:literal; $($r:literal),*) => {
                        match (tr, to) {
                            $(($r, 4) => tile::<T, $r, 4, $pre>(wp, gs, dq, s, &a, acc, stride, ahead),
                              ($r, 3) => tile::<T, $r, 3, $pre>(wp, gs, dq, s, &a, acc, stride, ahead),
                              ($r, 2) => tile::<T, $r, 2, $pre>(wp, gs, dq, s, &a, acc, stride, ahead),
                              ($r, _) => tile::<T, $r, 1, $pre>(wp, gs, dq, s, &a, acc, stride, ahead),)*
                            _ => unreachable!("panel tile of {tr} rows"),
                        }
                    };
                }
                if pre {
                    go!(true; 6, 5, 4, 3, 2, 1);
                } else {
                    go!(false; 6, 5, 4, 3, 2, 1);
                }
            }
        }
    }
    for r in 0..nr {
        let at = r * stride;
        if has_min(T) {
            for (a, m) in sc.acc[at..at + nc].iter_mut().zip(&sc.macc[at..at + nc]) {
                *a += *m;
            }
        }
        write(rows.start + r, outputs.start, &sc.acc[at..at + nc]);
    }
    SCRATCH.set(sc);
}

#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn item_vnni<const T: u8>(
    w: &QuantWeight,
    outputs: Range<usize>,
    acts: &QuantActs,
    rows: Range<usize>,
    write: &mut dyn FnMut(usize, usize, &[f32]),
) {
    item_packed_k::<T>(w, outputs, acts, rows, write)
}

fn checked<const T: u8>(
    w: &QuantWeight,
    outputs: Range<usize>,
    acts: &QuantActs,
    rows: Range<usize>,
    write: &mut dyn FnMut(usize, usize, &[f32]),
) {
    // SAFETY: handed out by `item_fn`, which `kernel::item` reaches only
    // for the AVX-512 VNNI and AMX variants, on a CPU that runs them.
    unsafe { item_vnni::<T>(w, outputs, acts, rows, write) }
}

/// The panel kernel of the k-quant `qtype` (Q4_K, Q5_K, Q6_K) on int8
/// activations. Only for a CPU that runs AVX-512 VNNI.
pub(super) fn item_fn(qtype: QuantType) -> ItemFn {
    match qtype {
        QuantType::Q4K => checked::<Q4K>,
        QuantType::Q5K => checked::<Q5K>,
        QuantType::Q6K => checked::<Q6K>,
        t => unreachable!("{} has no k-quant panel layout", t.name()),
    }
}
