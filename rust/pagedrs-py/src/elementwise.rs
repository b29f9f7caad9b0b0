//! PyO3 binding of the element-wise kernels around the projections
//! (`pagedrs_kernels::elementwise`): `rotate_half` on numpy views of float32
//! torch tensors, rows given by their stride.

use numpy::{PyReadonlyArray1, PyReadwriteArray1};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

use pagedrs_kernels::elementwise::{self, RopeShape};

/// Rotary embedding by a half table of every head of each row:
/// head `[x1, x2, rest]` (`rot / 2`, `rot / 2`, `dim - rot` floats) becomes
/// `[x1 c - x2 s, x2 c + x1 s, rest]`, each product and sum rounded to
/// float32 as torch's separate `mul`, `sub_` and `add_` round them.
///
/// Args:
///     x: float32, row `t` at `x[t * x_stride:][:heads * dim]`.
///     x_stride: floats from one row to the next.
///     cos, sin: float32 `[rows * rot / 2]` (each row's position looked up).
///     heads, dim, rot: heads of a row, floats of a head, rotated floats.
///     out: writable float32 `[rows * heads * dim]` (`rows` from its length).
///     num_threads: threads of torch's OpenMP team to split the rows over.
/// Raises:
///     ValueError: `rot` odd or over `dim`, a stride under `heads * dim`, or
///         arrays too short for the rows.
#[pyfunction]
#[pyo3(signature = (x, x_stride, cos, sin, heads, dim, rot, out, num_threads=1))]
#[allow(clippy::too_many_arguments)]
pub fn rotate_half(
    py: Python<'_>,
    x: PyReadonlyArray1<'_, f32>,
    x_stride: usize,
    cos: PyReadonlyArray1<'_, f32>,
    sin: PyReadonlyArray1<'_, f32>,
    heads: usize,
    dim: usize,
    rot: usize,
    mut out: PyReadwriteArray1<'_, f32>,
    num_threads: usize,
) -> PyResult<()> {
    let (x, cos, sin, o) = (
        x.as_slice()?,
        cos.as_slice()?,
        sin.as_slice()?,
        out.as_slice_mut()?,
    );
    let width = heads * dim;
    let rows = o.len().checked_div(width).unwrap_or(0);
    let h = rot / 2;
    let fits = rot.is_multiple_of(2)
        && rot <= dim
        && x_stride >= width
        && o.len() == rows * width
        && (rows == 0 || x.len() >= (rows - 1) * x_stride + width)
        && cos.len() == rows * h
        && sin.len() == rows * h;
    if !fits {
        return Err(PyValueError::new_err(format!(
            "rotate_half: x of {} floats (row stride {x_stride}), cos/sin of {}/{}, out of {} \
             for {heads} heads of {dim} floats with {rot} rotated",
            x.len(),
            cos.len(),
            sin.len(),
            o.len()
        )));
    }
    let shape = RopeShape {
        rows,
        x_stride,
        heads,
        dim,
        rot,
    };
    py.detach(|| elementwise::rotate_half(x, cos, sin, shape, o, num_threads.max(1)));
    Ok(())
}
