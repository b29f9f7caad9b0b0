//! PyO3 bindings of the quantized-weight kernels (`rust/pagedrs-kernels/src/quant`): the
//! `QuantWeights` class (a projection's weight parts, held once) whose
//! `forward` runs the kernels on numpy views of torch CPU tensors, and
//! `quant_isas()`, the variants this CPU runs.

use numpy::{
    PyArray1, PyArray2, PyArrayMethods, PyReadonlyArray2, PyReadwriteArray2, PyUntypedArrayMethods,
};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

use pagedrs_kernels::quant::{
    run_projection, ActQuant, Part, QuantActs, QuantType, QuantWeight, VARIANTS,
};

fn invalid(msg: String) -> PyErr {
    PyValueError::new_err(msg)
}

/// One part as held: its format, shape, bytes and (int8) scales.
struct HeldPart {
    qtype: QuantType,
    n: usize,
    data: Py<PyArray2<u8>>,
    scales: Option<Py<PyArray1<f32>>>,
}

/// The weight parts of one projection `y = x W^T`, stacked along the
/// output features, each in its own format, read in place (no copy).
///
/// Args:
///     parts: `(qtype, data, scales, n)` per part: `qtype` one of "Q4_0",
///         "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q4_K", "Q5_K", "Q6_K", "int8";
///         `data` a C-contiguous uint8 `[n, row_bytes]` array (GGUF blocks,
///         row-major; int8: the values' bytes, `[n, k]`); `scales` float32
///         `[n]` for int8, None otherwise.
///     in_features: `k`, a multiple of 32 (and of 256 for k-quants).
/// Raises:
///     ValueError: naming the part, on an unknown format, a `k` the format
///         cannot hold, or arrays of the wrong dtype or shape.
#[pyclass(frozen, module = "pagedrs._core", name = "QuantWeights")]
pub struct PyQuantWeights {
    parts: Vec<HeldPart>,
    /// Input features.
    #[pyo3(get)]
    in_features: usize,
    /// Output features (all parts).
    #[pyo3(get)]
    out_features: usize,
}

type PartSpec<'py> = (String, Bound<'py, PyAny>, Option<Bound<'py, PyAny>>, usize);

#[pymethods]
impl PyQuantWeights {
    #[new]
    fn new(parts: Vec<PartSpec<'_>>, in_features: usize) -> PyResult<Self> {
        if parts.is_empty() {
            return Err(invalid(
                "a quantized projection needs at least one part".into(),
            ));
        }
        let mut held = Vec::with_capacity(parts.len());
        for (i, (name, data, scales, n)) in parts.into_iter().enumerate() {
            let qtype = QuantType::parse(&name).ok_or_else(|| {
                invalid(format!(
                    "part {i}: quantized type {name:?} is not one of Q4_0, Q4_1, Q5_0, Q5_1, \
                     Q8_0, Q4_K, Q5_K, Q6_K, int8"
                ))
            })?;
            let data = data.cast_into::<PyArray2<u8>>().map_err(|_| {
                invalid(format!("part {i} ({name}): data must be a 2-d uint8 array"))
            })?;
            let scales = scales
                .map(|s| {
                    s.cast_into::<PyArray1<f32>>().map_err(|_| {
                        invalid(format!(
                            "part {i} ({name}): scales must be a 1-d float32 array"
                        ))
                    })
                })
                .transpose()?;
            {
                let d = data.readonly();
                let s = scales.as_ref().map(|s| s.readonly());
                let bytes = d.as_slice().map_err(|_| {
                    invalid(format!("part {i} ({name}): data must be C-contiguous"))
                })?;
                let sc = match &s {
                    Some(s) => s.as_slice().map_err(|_| {
                        invalid(format!("part {i} ({name}): scales must be contiguous"))
                    })?,
                    None => &[],
                };
                QuantWeight::new(qtype, n, in_features, bytes, sc)
                    .map_err(|e| invalid(format!("part {i}: {e}")))?;
                if d.shape() != [n, qtype.row_bytes(in_features)] {
                    return Err(invalid(format!(
                        "part {i} ({name}): data {:?} is not [{n}, {}]",
                        d.shape(),
                        qtype.row_bytes(in_features)
                    )));
                }
            }
            held.push(HeldPart {
                qtype,
                n,
                data: data.unbind(),
                scales: scales.map(Bound::unbind),
            });
        }
        let out_features = held.iter().map(|p| p.n).sum();
        Ok(Self {
            parts: held,
            in_features,
            out_features,
        })
    }

    /// `out = x W^T` over every part (part `i` in the columns after parts
    /// `0..i`), activations quantized per row in blocks of 32 to int16 or
    /// int8 (`activations`).
    ///
    /// Args:
    ///     x: C-contiguous `[T, K]`, float32 or int16 holding bfloat16 bits.
    ///     out: C-contiguous writable float32 `[T, N]`.
    ///     num_threads: threads of torch's OpenMP team (rayon's pool without
    ///         an OpenMP runtime).
    ///     isa: the kernel variant ("amx_int8", "avx512_vnni", "avx2",
    ///         "portable"; one of `quant_isas()`), None for the fastest.
    ///         Every variant gives the same bits.
    ///     activations: "int16" (`d = max|x| / 32767` per block, the exact
    ///         option) or "int8" (`d = max|x| / 127`, llama.cpp's Q8_0
    ///         blocks; `vpdpbusd` on AVX-512 VNNI, `tdpbsud` tiles on AMX);
    ///         every variant gives the same bits for either.
    /// Raises:
    ///     ValueError: wrong dtypes or shapes, a variant this CPU does not
    ///         run, or another `activations`.
    #[pyo3(signature = (x, out, num_threads = 1, isa = None, activations = "int16"))]
    fn forward(
        &self,
        py: Python<'_>,
        x: &Bound<'_, PyAny>,
        out: &Bound<'_, PyAny>,
        num_threads: usize,
        isa: Option<&str>,
        activations: &str,
    ) -> PyResult<()> {
        let scheme = ActQuant::parse(activations).ok_or_else(|| {
            invalid(format!(
                "activations {activations:?} is not \"int16\" or \"int8\""
            ))
        })?;
        let variant = match isa {
            None => VARIANTS.best(),
            Some(name) => VARIANTS.parse(name).ok_or_else(|| {
                invalid(format!(
                    "quantized kernel variant {name:?} is not one this CPU runs: {:?}",
                    VARIANTS.names()
                ))
            })?,
        };
        let mut out: PyReadwriteArray2<'_, f32> = out
            .extract()
            .map_err(|_| invalid("out must be a writable 2-d float32 array".into()))?;
        let k = self.in_features;
        let shape_err = |xs: &[usize], os: &[usize]| {
            invalid(format!(
                "x {xs:?} and out {os:?} must be [T, {k}] and [T, {}]",
                self.out_features
            ))
        };
        let acts = if let Ok(a) = x.extract::<PyReadonlyArray2<'_, f32>>() {
            if a.shape()[1] != k || out.shape() != [a.shape()[0], self.out_features] {
                return Err(shape_err(a.shape(), out.shape()));
            }
            let (t, v) = (a.shape()[0], a.as_slice()?);
            py.detach(|| QuantActs::from_f32(scheme, t, k, v))
        } else if let Ok(a) = x.extract::<PyReadonlyArray2<'_, i16>>() {
            if a.shape()[1] != k || out.shape() != [a.shape()[0], self.out_features] {
                return Err(shape_err(a.shape(), out.shape()));
            }
            let (t, v) = (a.shape()[0], a.as_slice()?);
            py.detach(|| {
                // SAFETY: i16 and u16 have one size and alignment.
                let bits = unsafe { std::slice::from_raw_parts(v.as_ptr() as *const u16, v.len()) };
                QuantActs::from_bf16_bits(scheme, t, k, bits)
            })
        } else {
            return Err(invalid(
                "x must be a 2-d float32 or int16 (bfloat16 bits) array".into(),
            ));
        };
        let datas: Vec<_> = self
            .parts
            .iter()
            .map(|p| p.data.bind(py).readonly())
            .collect();
        let scales: Vec<_> = self
            .parts
            .iter()
            .map(|p| p.scales.as_ref().map(|s| s.bind(py).readonly()))
            .collect();
        let mut parts = Vec::with_capacity(self.parts.len());
        let mut col = 0;
        for ((p, d), s) in self.parts.iter().zip(&datas).zip(&scales) {
            let sc = match s {
                Some(s) => s.as_slice()?,
                None => &[],
            };
            let weight = QuantWeight::new(p.qtype, p.n, k, d.as_slice()?, sc).map_err(invalid)?;
            parts.push(Part { weight, col });
            col += p.n;
        }
        let ld = self.out_features;
        let o = out.as_slice_mut()?;
        py.detach(|| run_projection(&parts, &acts, o, ld, variant, num_threads.max(1)));
        Ok(())
    }

    /// Bytes of the parts' data and scales.
    #[getter]
    fn nbytes(&self, py: Python<'_>) -> usize {
        self.parts
            .iter()
            .map(|p| p.data.bind(py).len() + p.scales.as_ref().map_or(0, |s| 4 * s.bind(py).len()))
            .sum()
    }
}

/// The quantized kernels' variants this CPU runs, fastest first
/// ("amx_int8", "avx512_vnni", "avx2", "portable"); each gives the same bits.
#[pyfunction]
pub fn quant_isas() -> Vec<&'static str> {
    VARIANTS.names()
}
