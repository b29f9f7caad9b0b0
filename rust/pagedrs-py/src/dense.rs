//! PyO3 bindings of the batch-invariant float32 dense kernel
//! (`rust/pagedrs-kernels/src/dense`): `dense_linear`, which runs it on numpy views of torch
//! CPU tensors (the weight read in place), and `dense_isas()`, the variants
//! this CPU runs.

use numpy::{PyReadonlyArray1, PyReadonlyArray2, PyReadwriteArray2, PyUntypedArrayMethods};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

use pagedrs_kernels::dense::{run_dense, DenseArgs, VARIANTS};

fn invalid(msg: String) -> PyErr {
    PyValueError::new_err(msg)
}

/// `out = x @ weight^T (+ bias)` in float32, batch-invariant: each output's
/// bits depend on its row of `x` and its row of `weight` alone (a fixed
/// order of fused multiply-adds over 8 lanes; `rust/pagedrs-kernels/src/dense`), not on the
/// number of rows, their order, the thread count or the variant.
///
/// Args:
///     x: C-contiguous float32 `[M, K]`.
///     weight: C-contiguous float32 `[N, K]` (`nn.Linear`'s layout; read in
///         place, never copied).
///     out: C-contiguous writable float32 `[M, N]`.
///     bias: C-contiguous float32 `[N]`, or None.
///     num_threads: threads of torch's OpenMP team (rayon's pool without an
///         OpenMP runtime); the work is split over outputs and rows.
///     isa: the kernel variant ("avx2", "portable"; one of `dense_isas()`),
///         None for the fastest. Every variant gives the same bits.
/// Raises:
///     ValueError: naming the array, on a dtype other than float32, an array
///         that is not C-contiguous, shapes that do not match, or a variant
///         this CPU does not run.
#[pyfunction]
#[pyo3(signature = (x, weight, out, bias = None, num_threads = 1, isa = None))]
pub fn dense_linear(
    py: Python<'_>,
    x: &Bound<'_, PyAny>,
    weight: &Bound<'_, PyAny>,
    out: &Bound<'_, PyAny>,
    bias: Option<&Bound<'_, PyAny>>,
    num_threads: usize,
    isa: Option<&str>,
) -> PyResult<()> {
    let variant = match isa {
        None => VARIANTS.best(),
        Some(name) => VARIANTS.parse(name).ok_or_else(|| {
            invalid(format!(
                "dense kernel variant {name:?} is not one this CPU runs: {:?}",
                VARIANTS.names()
            ))
        })?,
    };
    let x: PyReadonlyArray2<'_, f32> = x
        .extract()
        .map_err(|_| invalid("x must be a 2-d float32 array".into()))?;
    let weight: PyReadonlyArray2<'_, f32> = weight
        .extract()
        .map_err(|_| invalid("weight must be a 2-d float32 array".into()))?;
    let bias: Option<PyReadonlyArray1<'_, f32>> = bias
        .map(|b| {
            b.extract()
                .map_err(|_| invalid("bias must be a 1-d float32 array".into()))
        })
        .transpose()?;
    let mut out: PyReadwriteArray2<'_, f32> = out
        .extract()
        .map_err(|_| invalid("out must be a writable 2-d float32 array".into()))?;
    let (m, k) = (x.shape()[0], x.shape()[1]);
    let n = weight.shape()[0];
    if weight.shape()[1] != k {
        return Err(invalid(format!(
            "weight {:?} is not [N, {k}] for x {:?}",
            weight.shape(),
            x.shape()
        )));
    }
    if out.shape() != [m, n] {
        return Err(invalid(format!(
            "out {:?} is not [{m}, {n}] (x {:?}, weight {:?})",
            out.shape(),
            x.shape(),
            weight.shape()
        )));
    }
    if let Some(b) = &bias {
        if b.shape() != [n] {
            return Err(invalid(format!("bias {:?} is not [{n}]", b.shape())));
        }
    }
    let contiguous = |name: &str| invalid(format!("{name} must be C-contiguous"));
    // `as_slice` also accepts Fortran order, which would be read transposed.
    for (name, c) in [
        ("x", x.is_c_contiguous()),
        ("weight", weight.is_c_contiguous()),
        ("bias", bias.as_ref().is_none_or(|b| b.is_c_contiguous())),
        ("out", out.is_c_contiguous()),
    ] {
        if !c {
            return Err(contiguous(name));
        }
    }
    let xs = x.as_slice().map_err(|_| contiguous("x"))?;
    let ws = weight.as_slice().map_err(|_| contiguous("weight"))?;
    let bs = match &bias {
        Some(b) => Some(b.as_slice().map_err(|_| contiguous("bias"))?),
        None => None,
    };
    let os = out.as_slice_mut().map_err(|_| contiguous("out"))?;
    let args = DenseArgs {
        x: xs,
        weight: ws,
        bias: bs,
        m,
        n,
        k,
    };
    py.detach(|| run_dense(&args, os, variant, num_threads.max(1)));
    Ok(())
}

/// The dense kernel's variants this CPU runs, fastest first ("avx2",
/// "portable"); each gives the same bits.
#[pyfunction]
pub fn dense_isas() -> Vec<&'static str> {
    VARIANTS.names()
}
