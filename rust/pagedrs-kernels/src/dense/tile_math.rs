//! What every variant of the tile kernel shares: the tile's shape (up to
//! `MAX_R` activation rows by `MAX_C` weight rows), its outputs and
//! signature, and the scalar steps of the fixed arithmetic (module docs of
//! `dense`): the 8-lane sum tree and the tail.

/// Activation rows per tile.
pub(crate) const MAX_R: usize = 4;
/// Weight rows (outputs) per tile.
pub(crate) const MAX_C: usize = 3;

/// Outputs `[row][output]` of a tile.
pub(crate) type TileOut = [[f32; MAX_C]; MAX_R];

/// `(x, w, k, nr, nc)`: the `nr` x `nc` tile of sums (no bias) of the `nr`
/// activation rows at `x` by the `nc` weight rows at `w`, rows `k` floats
/// apart (`nr <= MAX_R`, `nc <= MAX_C`).
///
/// Callers guarantee `x` holds `nr * k` and `w` `nc * k` readable floats.
pub(crate) type TileFn = unsafe fn(*const f32, *const f32, usize, usize, usize) -> TileOut;

/// The fixed-order sum of 8 lanes every variant uses:
/// `((l0 + l4) + (l2 + l6)) + ((l1 + l5) + (l3 + l7))`.
#[inline(always)]
pub(crate) fn hsum8(l: &[f32; 8]) -> f32 {
    let s = [l[0] + l[4], l[1] + l[5], l[2] + l[6], l[3] + l[7]];
    (s[0] + s[2]) + (s[1] + s[3])
}

/// The tail `k8..k` of one output, added in order to `s` by fused
/// multiply-adds (every variant's last step before the bias).
///
/// # Safety
/// `x` and `w` hold `k` readable floats.
#[inline(always)]
pub(crate) unsafe fn tail(x: *const f32, w: *const f32, k8: usize, k: usize, mut s: f32) -> f32 {
    for i in k8..k {
        s = (*x.add(i)).mul_add(*w.add(i), s);
    }
    s
}
