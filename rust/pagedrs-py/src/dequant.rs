//! PyO3 binding of the quantized formats' reference dequantization
//! (`pagedrs_kernels::quant::dequantize`): embedding rows and reference
//! values without gguf-py.

use numpy::{PyArray2, PyArrayMethods, PyReadonlyArray1, PyReadonlyArray2, PyUntypedArrayMethods};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

use pagedrs_kernels::quant::{dequantize as dequantize_weight, QuantType, QuantWeight};

/// float32 `[n, k]`: the values of a quantized weight's rows (ggml's
/// `dequantize_row_*` formulas, bit for bit gguf-py's `quants.dequantize`).
///
/// Args:
///     qtype: "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q4_K", "Q5_K", "Q6_K"
///         or "int8".
///     data: C-contiguous uint8 `[n, row_bytes]` (GGUF blocks, row-major;
///         int8: the values' bytes, `[n, k]`).
///     scales: float32 `[n]` for int8, None otherwise.
///     k: values per row, a multiple of the format's block.
/// Raises:
///     ValueError: an unknown format, a `k` the format cannot hold, or
///         arrays of the wrong shape.
#[pyfunction]
#[pyo3(signature = (qtype, data, scales, k))]
pub fn dequantize<'py>(
    py: Python<'py>,
    qtype: &str,
    data: PyReadonlyArray2<'py, u8>,
    scales: Option<PyReadonlyArray1<'py, f32>>,
    k: usize,
) -> PyResult<Bound<'py, PyArray2<f32>>> {
    let qt = QuantType::parse(qtype)
        .ok_or_else(|| PyValueError::new_err(format!("unknown quantized format {qtype:?}")))?;
    let n = data.shape()[0];
    let scales = match &scales {
        Some(s) => s.as_slice()?,
        None => &[],
    };
    let weight =
        QuantWeight::new(qt, n, k, data.as_slice()?, scales).map_err(PyValueError::new_err)?;
    let out = PyArray2::<f32>::zeros(py, [n, k], false);
    {
        let mut rw = out.readwrite();
        let o = rw.as_slice_mut()?;
        py.detach(|| dequantize_weight(&weight, o));
    }
    Ok(out)
}
