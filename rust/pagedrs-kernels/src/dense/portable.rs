//! The portable tile kernel: the arithmetic of every variant (module docs of
//! `dense`) in plain Rust, 8 lanes and all, so that its outputs are the SIMD
//! variant's bits.

use super::tile_math::{hsum8, tail, TileOut, MAX_C, MAX_R};

/// `tile_math::TileFn` in plain Rust.
///
/// # Safety
/// `x` holds `nr * k` and `w` `nc * k` readable floats; `nr <= MAX_R`,
/// `nc <= MAX_C`.
pub(crate) unsafe fn tile(x: *const f32, w: *const f32, k: usize, nr: usize, nc: usize) -> TileOut {
    assert!(nr <= MAX_R && nc <= MAX_C);
    let k8 = k - k % 8;
    let mut out = [[0.0f32; MAX_C]; MAX_R];
    for (r, out_row) in out.iter_mut().enumerate().take(nr) {
        let xr = std::slice::from_raw_parts(x.add(r * k), k);
        for (c, o) in out_row.iter_mut().enumerate().take(nc) {
            let wc = std::slice::from_raw_parts(w.add(c * k), k);
            let mut lanes = [0.0f32; 8];
            for (xs, ws) in xr[..k8].chunks_exact(8).zip(wc[..k8].chunks_exact(8)) {
                for l in 0..8 {
                    lanes[l] = xs[l].mul_add(ws[l], lanes[l]);
                }
            }
            *o = tail(xr.as_ptr(), wc.as_ptr(), k8, k, hsum8(&lanes));
        }
    }
    out
}
