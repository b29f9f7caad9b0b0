//! PyO3 binding of the gathered LoRA product (`rust/pagedrs-kernels/src/lora`): `lora_add`
//! on numpy views of torch CPU tensors, and `lora_isas()`.

use numpy::PyUntypedArrayMethods;
use numpy::{PyReadonlyArray1, PyReadonlyArray2, PyReadonlyArray3, PyReadwriteArray2};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

use pagedrs_kernels::lora::{lora_add as run_lora, LoraArgs, VARIANTS};

fn invalid(msg: String) -> PyErr {
    PyValueError::new_err(msg)
}

fn c_slice<'a, T: numpy::Element, D: numpy::ndarray::Dimension>(
    a: &'a numpy::PyReadonlyArray<'_, T, D>,
    name: &str,
) -> PyResult<&'a [T]> {
    if !a.is_c_contiguous() {
        return Err(invalid(format!("{name} must be C-contiguous")));
    }
    a.as_slice()
        .map_err(|_| invalid(format!("{name} must be C-contiguous")))
}

/// `out[t, out_col:out_col + N] += scalings[l] * (x[t] @ A_l^T) @ B_l^T` for
/// every token `t` whose slot `l = slots[t]` is not negative (rows of other
/// tokens untouched): the gathered low-rank products of multi-LoRA serving
/// (shrink, then expand, per segment of one slot's consecutive tokens), in
/// float32, batch-invariant (a token's bits depend on its row and adapter
/// alone; `rust/pagedrs-kernels/src/lora`).
///
/// Args:
///     x: C-contiguous float32 `[T, K]`.
///     out: C-contiguous writable float32 `[T, W]`, `out_col + N <= W`.
///     slots: int32 `[T]`, each token's adapter slot, -1 for none.
///     lora_a: C-contiguous float32 `[L, R, K]`; slot `l` holds its
///         `[ranks[l], K]` A matrix in its first `ranks[l] * K` floats.
///     lora_b: C-contiguous float32 `[L, N, R]`; slot `l` holds its
///         `[N, ranks[l]]` B matrix in its first `N * ranks[l]` floats.
///     ranks: int32 `[L]` (0: an empty slot).
///     scalings: float32 `[L]`.
///     out_col: first output column written (a fused projection's part).
///     num_threads: threads of torch's OpenMP team.
///     isa: the variant (`lora_isas()`), None for the fastest; all give the
///         same bits.
/// Raises:
///     ValueError: naming the array, on a dtype or shape that does not
///         match, a slot or rank out of range, or an unknown variant.
#[pyfunction]
#[pyo3(signature = (x, out, slots, lora_a, lora_b, ranks, scalings, out_col = 0, num_threads = 1, isa = None))]
#[allow(clippy::too_many_arguments)]
pub fn lora_add(
    py: Python<'_>,
    x: PyReadonlyArray2<'_, f32>,
    out: &Bound<'_, PyAny>,
    slots: PyReadonlyArray1<'_, i32>,
    lora_a: PyReadonlyArray3<'_, f32>,
    lora_b: PyReadonlyArray3<'_, f32>,
    ranks: PyReadonlyArray1<'_, i32>,
    scalings: PyReadonlyArray1<'_, f32>,
    out_col: usize,
    num_threads: usize,
    isa: Option<&str>,
) -> PyResult<()> {
    let variant = match isa {
        None => VARIANTS.best(),
        Some(name) => VARIANTS.parse(name).ok_or_else(|| {
            invalid(format!(
                "LoRA kernel variant {name:?} is not one this CPU runs: {:?}",
                VARIANTS.names()
            ))
        })?,
    };
    let mut out: PyReadwriteArray2<'_, f32> = out
        .extract()
        .map_err(|_| invalid("out must be a writable 2-d float32 array".into()))?;
    let (t, k) = (x.shape()[0], x.shape()[1]);
    let (l, r) = (lora_a.shape()[0], lora_a.shape()[1]);
    let n = lora_b.shape()[1];
    if lora_a.shape()[2] != k {
        return Err(invalid(format!(
            "lora_a {:?} is not [L, R, {k}]",
            lora_a.shape()
        )));
    }
    if lora_b.shape()[0] != l || lora_b.shape()[2] != r {
        return Err(invalid(format!(
            "lora_b {:?} is not [{l}, N, {r}]",
            lora_b.shape()
        )));
    }
    if out.shape()[0] != t {
        return Err(invalid(format!("out {:?} has not {t} rows", out.shape())));
    }
    let stride = out.shape()[1];
    if !out.is_c_contiguous() {
        return Err(invalid("out must be C-contiguous".into()));
    }
    let args = LoraArgs {
        x: c_slice(&x, "x")?,
        slots: c_slice(&slots, "slots")?,
        a: c_slice(&lora_a, "lora_a")?,
        b: c_slice(&lora_b, "lora_b")?,
        ranks: c_slice(&ranks, "ranks")?,
        scalings: c_slice(&scalings, "scalings")?,
        t,
        k,
        n,
        r,
        l,
    };
    let os = out
        .as_slice_mut()
        .map_err(|_| invalid("out must be C-contiguous".into()))?;
    py.detach(|| run_lora(&args, os, stride, out_col, variant, num_threads.max(1)))
        .map_err(invalid)
}

/// The LoRA kernel's variants this CPU runs, fastest first (the dense
/// kernel's: "avx2", "portable"); each gives the same bits.
#[pyfunction]
pub fn lora_isas() -> Vec<&'static str> {
    VARIANTS.names()
}
