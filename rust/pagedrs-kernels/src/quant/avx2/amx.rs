//! The many-rows step on int8 activations in AMX tiles (`amx-int8`): per
//! sub-block (scale group) one `tdpbsud` multiplies 16 rows of signed int8
//! activations (the A tile, read in place) by 16 outputs of the panel's
//! unsigned weight bytes (the B tile: `panel::fill8`'s quads are AMX's
//! B layout, 4 bytes of K per output, one K quad a tile row) into 16 x 16
//! exact int32 sums. Stored to memory, each sum gets the offset correction
//! `-offset * sum(x)` in integers and then one conversion, product `scale *
//! d` and fused multiply-add, as in every path (module docs of `quant`), so
//! the bits are the AVX-512 VNNI tile's.
//!
//! Four C tiles (2 row tiles by 2 output groups: tmm0-3) share the A tiles
//! (tmm4-5) and B tiles (tmm6-7) of a sub-block. The tile state is set up
//! per item (`Tiles::configure`) and released after it.

use std::arch::asm;
use std::arch::x86_64::*;
use std::ops::Range;

use super::super::act::QuantActs;
use super::decode::{groups, unsigned_offset, KC};
use super::panel::{Panel, QUADS};

/// Rows of an A and a C tile, outputs of a B and a C tile.
const TR: usize = 16;

/// The 64-byte tile configuration `ldtilecfg` reads (palette 1).
#[repr(C, align(64))]
struct Config([u8; 64]);

impl Config {
    /// C tiles 16 x 16 int32; A tiles 16 rows by the group's bytes of K;
    /// B tiles the group's quads by 16 outputs x 4 bytes.
    fn new(group_bytes: usize) -> Self {
        let mut c = Config([0; 64]);
        c.0[0] = 1;
        let mut set = |tmm: usize, rows: usize, colsb: usize| {
            c.0[16 + 2 * tmm..18 + 2 * tmm].copy_from_slice(&(colsb as u16).to_le_bytes());
            c.0[48 + tmm] = rows as u8;
        };
        for tmm in 0..4 {
            set(tmm, TR, 64);
        }
        set(4, TR, group_bytes);
        set(5, TR, group_bytes);
        set(6, group_bytes / 4, 64);
        set(7, group_bytes / 4, 64);
        c
    }
}

/// The thread's tile state for one item: configured on creation, released
/// on drop.
pub(super) struct Tiles(());

impl Tiles {
    /// Tiles for format `T` (its scale group's bytes of K in A).
    ///
    /// # Safety
    /// The CPU has AMX-TILE and AMX-INT8 and the kernel granted this
    /// process the tile state (`cpu_features::amx_int8`).
    #[inline(always)]
    pub(super) unsafe fn configure<const T: u8>() -> Self {
        let cfg = Config::new(32 / groups(T));
        asm!(
            "ldtilecfg [{}]",
            "tilezero tmm0",
            "tilezero tmm1",
            "tilezero tmm2",
            "tilezero tmm3",
            in(reg) cfg.0.as_ptr(),
            options(nostack, readonly)
        );
        Tiles(())
    }
}

impl Drop for Tiles {
    fn drop(&mut self) {
        // SAFETY: only made by `configure`, on a CPU with AMX.
        unsafe { asm!("tilerelease", options(nostack, nomem)) };
    }
}

/// Load tile `M` from `p`, rows `stride` bytes apart.
#[inline(always)]
unsafe fn load<const M: u8>(p: *const u8, stride: usize) {
    asm!("tileloadd tmm{m}, [{p} + {s} * 1]", m = const M, p = in(reg) p,
         s = in(reg) stride, options(nostack, readonly));
}

/// `C += A x B` (signed by unsigned bytes) for C tiles 0 (A 4, B 6), 1
/// (A 4, B 7; with `O2`), 2 (A 5, B 6; with `R2`) and 3 (A 5, B 7; both),
/// then each stored at `out[c]` (16 rows of 16 int32) and zeroed: all
/// products issued before the first store waits on one.
#[inline(always)]
unsafe fn products<const R2: bool, const O2: bool>(out: &mut Sums) {
    asm!("tdpbsud tmm0, tmm4, tmm6", options(nostack, nomem));
    if O2 {
        asm!("tdpbsud tmm1, tmm4, tmm7", options(nostack, nomem));
    }
    if R2 {
        asm!("tdpbsud tmm2, tmm5, tmm6", options(nostack, nomem));
        if O2 {
            asm!("tdpbsud tmm3, tmm5, tmm7", options(nostack, nomem));
        }
    }
    store::<0>(out.0[0].as_mut_ptr());
    if O2 {
        store::<1>(out.0[1].as_mut_ptr());
    }
    if R2 {
        store::<2>(out.0[2].as_mut_ptr());
        if O2 {
            store::<3>(out.0[3].as_mut_ptr());
        }
    }
}

/// Store C tile `C` at `out` (16 rows of 64 bytes) and zero it.
#[inline(always)]
unsafe fn store<const C: u8>(out: *mut i32) {
    asm!(
        "tilestored [{o} + {s} * 1], tmm{c}",
        "tilezero tmm{c}",
        c = const C, o = in(reg) out, s = in(reg) 64usize,
        options(nostack)
    );
}

/// The sums `isum` of a C tile (16 rows by 16 outputs, `tr` rows valid)
/// into the accumulators `acc` (`[row][16]`, row stride `stride`): per
/// row `fma(cvt(isum - offset * asum), scale * d, acc)`.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn apply(
    isum: &[i32; TR * 16],
    tr: usize,
    s: *const f32,
    d: &[f32; TR],
    corr: &[i32; TR],
    acc: *mut f32,
    stride: usize,
    offset: bool,
) {
    let s = _mm512_loadu_ps(s);
    for r in 0..tr {
        let mut v = _mm512_loadu_si512(isum.as_ptr().add(16 * r) as *const __m512i);
        if offset {
            v = _mm512_add_epi32(v, _mm512_set1_epi32(corr[r]));
        }
        let sd = _mm512_mul_ps(s, _mm512_set1_ps(d[r]));
        let at = acc.add(r * stride);
        _mm512_storeu_ps(
            at,
            _mm512_fmadd_ps(_mm512_cvtepi32_ps(v), sd, _mm512_loadu_ps(at)),
        );
    }
}

/// The rows of a row tile: where its A tile is read (`q8` of its first
/// row, stride `k`; or the zero-padded copy of a partial tile at the end
/// of the activations), its valid rows, scales and offset corrections.
struct RowTile {
    a: *const i8,
    stride: usize,
    rows: usize,
    first: usize,
}

impl RowTile {
    /// Row tile `rt` of `rows` for the step at sub-block `kb` (`kn`
    /// sub-blocks); `pad` holds the copy when the tile's 16 rows run past
    /// the activations.
    unsafe fn new(
        acts: &QuantActs,
        rows: &Range<usize>,
        rt: usize,
        kb: usize,
        kn: usize,
        pad: &mut Vec<i8>,
    ) -> Self {
        let first = rows.start + TR * rt;
        let valid = TR.min(rows.end - first);
        let k = acts.k;
        if first + TR <= acts.rows {
            let a = acts.q8.as_ptr().add(first * k + 32 * kb);
            return RowTile {
                a,
                stride: k,
                rows: valid,
                first,
            };
        }
        let w = 32 * kn;
        pad.clear();
        pad.resize(TR * w, 0);
        for r in 0..valid {
            let src = &acts.q8[(first + r) * k + 32 * kb..][..w];
            pad[r * w..(r + 1) * w].copy_from_slice(src);
        }
        RowTile {
            a: pad.as_ptr(),
            stride: w,
            rows: valid,
            first,
        }
    }

    /// Sub-block `j`'s scales and corrections (scale group `gi` of `g`)
    /// of the tile's rows.
    unsafe fn scales(
        &self,
        acts: &QuantActs,
        kb: usize,
        j: usize,
        gi: usize,
        g: usize,
        off: i32,
    ) -> ([f32; TR], [i32; TR]) {
        let nsub = acts.k / 32;
        let mut d = [0.0; TR];
        let mut corr = [0; TR];
        for r in 0..self.rows {
            let row = self.first + r;
            d[r] = acts.d[row * nsub + kb + j];
            let at = row * 2 * nsub + 2 * (kb + j);
            let sum = if g == 2 {
                acts.sum16[at + gi]
            } else {
                acts.sum16[at] + acts.sum16[at + 1]
            };
            corr[r] = -off * sum;
        }
        (d, corr)
    }
}

/// One step (sub-blocks `kb..kb + kn`) of every row of `rows` and every
/// output group of the panel (`fill8`), into `acc` (`[row][og][16]`), in
/// the tiles `Tiles::configure::<T>` set up: per pair of row tiles, pair
/// of output groups and sub-block (scale group), the products into four
/// C tiles, then their sums applied. (Applying a sub-block's sums while the
/// next one's products run is far slower: the loads wait on the tile
/// stores.)
#[inline(always)]
#[allow(clippy::too_many_arguments, clippy::needless_range_loop)]
pub(super) unsafe fn step<const T: u8>(
    p: &Panel,
    acc: &mut [f32],
    acts: &QuantActs,
    rows: &Range<usize>,
    nog: usize,
    kb: usize,
    kn: usize,
    pads: &mut [Vec<i8>; 2],
) {
    let g = groups(T);
    let gb = 32 / g;
    let off = unsigned_offset(T);
    let stride = nog * 16;
    let nrt = rows.len().div_ceil(TR);
    let q = p.q8.as_ptr() as *const u8;
    let accp = acc.as_mut_ptr();
    let mut isum = Sums([[0; TR * 16]; 4]);
    let mut dc = [[([0f32; TR], [0i32; TR]); 2 * KC]; 2];
    for rt0 in (0..nrt).step_by(2) {
        let [pad0, pad1] = pads;
        let t0 = RowTile::new(acts, rows, rt0, kb, kn, pad0);
        let t1 = (rt0 + 1 < nrt).then(|| RowTile::new(acts, rows, rt0 + 1, kb, kn, pad1));
        let tiles = [Some(&t0), t1.as_ref()];
        for (i, t) in tiles.iter().enumerate() {
            let Some(t) = t else { continue };
            for j in 0..kn {
                for gi in 0..g {
                    dc[i][j * g + gi] = t.scales(acts, kb, j, gi, g, off);
                }
            }
        }
        for og0 in (0..nog).step_by(2) {
            let two_o = og0 + 1 < nog;
            for jg in 0..kn * g {
                let (j, gi) = (jg / g, jg % g);
                let b0 = q.add(((og0 * KC + j) * QUADS + gi * QUADS / g) * 64);
                load::<6>(b0, 64);
                if two_o {
                    load::<7>(b0.add(KC * QUADS * 64), 64);
                }
                load::<4>(t0.a.add(32 * j + gb * gi) as *const u8, t0.stride);
                if let Some(t1) = &t1 {
                    load::<5>(t1.a.add(32 * j + gb * gi) as *const u8, t1.stride);
                }
                match (t1.is_some(), two_o) {
                    (true, true) => products::<true, true>(&mut isum),
                    (true, false) => products::<true, false>(&mut isum),
                    (false, true) => products::<false, true>(&mut isum),
                    (false, false) => products::<false, false>(&mut isum),
                }
                for (i, t) in tiles.iter().enumerate() {
                    let Some(t) = t else { continue };
                    let (d, corr) = &dc[i][jg];
                    let base = accp.add((t.first - rows.start) * stride);
                    for o in 0..if two_o { 2 } else { 1 } {
                        let og = og0 + o;
                        let s = p.s.as_ptr().add(((og * KC + j) * g + gi) * 16);
                        let sums = &isum.0[2 * i + o];
                        apply(
                            sums,
                            t.rows,
                            s,
                            d,
                            corr,
                            base.add(og * 16),
                            stride,
                            off != 0,
                        );
                    }
                }
            }
        }
    }
}

/// The four C tiles' sums, 64-byte aligned.
#[repr(C, align(64))]
struct Sums([[i32; TR * 16]; 4]);
