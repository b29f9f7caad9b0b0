//! PyO3 bindings of the quantized-weight kernels (`rust/pagedrs-kernels/src/quant`): the
//! `QuantWeights` class (a projection's weight parts, held once) whose
//! `forward` runs the kernels on numpy views of torch CPU tensors, the
//! `QuantExperts` class (a mixture-of-experts layer's expert stacks), and
//! `quant_isas()`, the variants this CPU runs.

use numpy::{
    PyArray1, PyArray2, PyArrayMethods, PyReadonlyArray1, PyReadonlyArray2, PyReadwriteArray1,
    PyReadwriteArray2, PyUntypedArrayMethods,
};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

use pagedrs_kernels::quant::{
    repack, run_experts, run_projection, silu_mul, ActQuant, ExpertStacks, Layout, Part, QuantActs,
    QuantType, QuantWeight, Variant, VARIANTS,
};

use crate::variant;

fn invalid(msg: String) -> PyErr {
    PyValueError::new_err(msg)
}

/// One part as held: its format, shape, bytes and (int8) scales.
struct HeldPart {
    qtype: QuantType,
    layout: Layout,
    n: usize,
    k: usize,
    data: Py<PyArray2<u8>>,
    scales: Option<Py<PyArray1<f32>>>,
}

/// The weight parts of one projection `y = x W^T`, stacked along the
/// output features, each in its own format, read in place (no copy).
///
/// Args:
///     parts: `(qtype, data, scales, n, layout)` per part: `qtype` one of
///         "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q4_K", "Q5_K", "Q6_K",
///         "int8"; `layout` "rows" or "panels"; `data` a C-contiguous uint8
///         array: "rows" `[n, row_bytes]` (GGUF blocks, row-major; int8: the
///         values' bytes, `[n, k]`), "panels" `quant_repack`'s `[n rounded
///         up to 16, row_bytes]` (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K);
///         `scales` float32 `[n]` for int8, None otherwise.
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
/// A `QuantWeights` part: a `PartSpec` and its layout's name.
type LaidPartSpec<'py> = (
    String,
    Bound<'py, PyAny>,
    Option<Bound<'py, PyAny>>,
    usize,
    String,
);

/// The activations' scheme named `activations` ("int16", "int8") and the
/// kernel variant `isa` (None: the fastest this CPU runs).
fn scheme_and_variant(activations: &str, isa: Option<&str>) -> PyResult<(ActQuant, Variant)> {
    let scheme = ActQuant::parse(activations).ok_or_else(|| {
        invalid(format!(
            "activations {activations:?} is not \"int16\" or \"int8\""
        ))
    })?;
    Ok((scheme, variant::choose(VARIANTS, isa, "quantized")?))
}

/// The layout named `name` ("rows", "panels").
fn parse_layout(name: &str) -> PyResult<Layout> {
    match name {
        "rows" => Ok(Layout::Rows),
        "panels" => Ok(Layout::Panels),
        _ => Err(invalid(format!(
            "layout {name:?} is not \"rows\" or \"panels\""
        ))),
    }
}

/// The weight over `data` in `layout`.
fn weight<'a>(
    qtype: QuantType,
    layout: Layout,
    n: usize,
    k: usize,
    data: &'a [u8],
    scales: &'a [f32],
) -> Result<QuantWeight<'a>, String> {
    match layout {
        Layout::Rows => QuantWeight::new(qtype, n, k, data, scales),
        Layout::Panels => QuantWeight::panels(qtype, n, k, data),
    }
}

/// One part's spec checked and held; `what` names it in errors.
fn hold_part(
    what: &str,
    spec: PartSpec<'_>,
    layout: Layout,
    in_features: usize,
) -> PyResult<HeldPart> {
    let (name, data, scales, n) = spec;
    let qtype = QuantType::parse(&name).ok_or_else(|| {
        invalid(format!(
            "{what}: quantized type {name:?} is not one of Q4_0, Q4_1, Q5_0, Q5_1, \
             Q8_0, Q4_K, Q5_K, Q6_K, int8"
        ))
    })?;
    let data = data
        .cast_into::<PyArray2<u8>>()
        .map_err(|_| invalid(format!("{what} ({name}): data must be a 2-d uint8 array")))?;
    let scales = scales
        .map(|s| {
            s.cast_into::<PyArray1<f32>>().map_err(|_| {
                invalid(format!(
                    "{what} ({name}): scales must be a 1-d float32 array"
                ))
            })
        })
        .transpose()?;
    {
        let d = data.readonly();
        let s = scales.as_ref().map(|s| s.readonly());
        let bytes = d
            .as_slice()
            .map_err(|_| invalid(format!("{what} ({name}): data must be C-contiguous")))?;
        let sc = match &s {
            Some(s) => s
                .as_slice()
                .map_err(|_| invalid(format!("{what} ({name}): scales must be contiguous")))?,
            None => &[],
        };
        weight(qtype, layout, n, in_features, bytes, sc)
            .map_err(|e| invalid(format!("{what}: {e}")))?;
        let rows = match layout {
            Layout::Rows => n,
            Layout::Panels => n.div_ceil(repack::GROUP) * repack::GROUP,
        };
        if d.shape() != [rows, qtype.row_bytes(in_features)] {
            return Err(invalid(format!(
                "{what} ({name}): data {:?} is not [{rows}, {}]",
                d.shape(),
                qtype.row_bytes(in_features)
            )));
        }
    }
    Ok(HeldPart {
        qtype,
        layout,
        n,
        k: in_features,
        data: data.unbind(),
        scales: scales.map(Bound::unbind),
    })
}

impl HeldPart {
    /// The part's weight over its arrays (read-only views `data`, `scales`).
    fn weight<'a>(
        &self,
        data: &'a PyReadonlyArray2<'_, u8>,
        scales: &'a Option<PyReadonlyArray1<'_, f32>>,
    ) -> PyResult<QuantWeight<'a>> {
        let sc = match scales {
            Some(s) => s.as_slice()?,
            None => &[],
        };
        weight(
            self.qtype,
            self.layout,
            self.n,
            self.k,
            data.as_slice()?,
            sc,
        )
        .map_err(invalid)
    }
}

#[pymethods]
impl PyQuantWeights {
    #[new]
    fn new(parts: Vec<LaidPartSpec<'_>>, in_features: usize) -> PyResult<Self> {
        if parts.is_empty() {
            return Err(invalid(
                "a quantized projection needs at least one part".into(),
            ));
        }
        let held = parts
            .into_iter()
            .enumerate()
            .map(|(i, (name, data, scales, n, layout))| {
                let what = format!("part {i}");
                let layout = parse_layout(&layout).map_err(|e| invalid(format!("{what}: {e}")))?;
                hold_part(&what, (name, data, scales, n), layout, in_features)
            })
            .collect::<PyResult<Vec<_>>>()?;
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
        let (scheme, variant) = scheme_and_variant(activations, isa)?;
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
            let weight = p.weight(d, s)?;
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

/// A mixture-of-experts layer's routed experts over its three quantized
/// expert stacks, read in place (no copy); `forward` runs a step's tokens
/// in one call (`pagedrs_kernels::quant::run_experts`).
///
/// Args:
///     gate, up: `(qtype, data, scales, n)` as `QuantWeights`' parts, of
///         `n = E * I` rows of `H` features (expert `e`'s rows `e * I ..
///         (e + 1) * I`).
///     down: likewise, `E * H` rows of `I` features.
///     num_experts: `E`.
/// Raises:
///     ValueError: a part as `QuantWeights` raises, or stacks that do not
///         split into `E` experts.
#[pyclass(frozen, module = "pagedrs._core", name = "QuantExperts")]
pub struct PyQuantExperts {
    stacks: [HeldPart; 3],
    /// `E`.
    #[pyo3(get)]
    num_experts: usize,
    /// `H`.
    #[pyo3(get)]
    hidden: usize,
    /// `I`.
    #[pyo3(get)]
    intermediate: usize,
}

#[pymethods]
impl PyQuantExperts {
    #[new]
    fn new(
        gate: PartSpec<'_>,
        up: PartSpec<'_>,
        down: PartSpec<'_>,
        num_experts: usize,
    ) -> PyResult<Self> {
        let e = num_experts;
        if e == 0 || !gate.3.is_multiple_of(e) || !down.3.is_multiple_of(e) || up.3 != gate.3 {
            return Err(invalid(format!(
                "expert stacks of {}, {} and {} rows do not split into {e} experts",
                gate.3, up.3, down.3
            )));
        }
        let (inter, hidden) = (gate.3 / e, down.3 / e);
        let stacks = [
            hold_part("gate stack", gate, Layout::Rows, hidden)?,
            hold_part("up stack", up, Layout::Rows, hidden)?,
            hold_part("down stack", down, Layout::Rows, inter)?,
        ];
        Ok(Self {
            stacks,
            num_experts: e,
            hidden,
            intermediate: inter,
        })
    }

    /// `out[t] = sum_j weights[t, j] * expert_{ids[t, j]}(x[t])`, each
    /// expert `down(silu(gate x) * up x)` (torch's `silu` bit for bit), the
    /// sum per token in ascending expert id from 0.0; activations quantized
    /// per row in blocks of 32 (`activations`, as `QuantWeights.forward`).
    ///
    /// Args:
    ///     x: C-contiguous float32 `[T, H]`.
    ///     ids: C-contiguous int64 `[T, k]`: each token's experts.
    ///     weights: C-contiguous float32 `[T, k]`: their routing weights.
    ///     out: C-contiguous writable float32 `[T, H]` (overwritten).
    ///     num_threads, isa, activations: as `QuantWeights.forward`.
    /// Raises:
    ///     ValueError: wrong dtypes or shapes, an expert id outside
    ///         `0..E`, a variant this CPU does not run, or another
    ///         `activations`.
    #[allow(clippy::too_many_arguments)]
    #[pyo3(signature = (x, ids, weights, out, num_threads = 1, isa = None, activations = "int16"))]
    fn forward(
        &self,
        py: Python<'_>,
        x: PyReadonlyArray2<'_, f32>,
        ids: PyReadonlyArray2<'_, i64>,
        weights: PyReadonlyArray2<'_, f32>,
        mut out: PyReadwriteArray2<'_, f32>,
        num_threads: usize,
        isa: Option<&str>,
        activations: &str,
    ) -> PyResult<()> {
        let (scheme, variant) = scheme_and_variant(activations, isa)?;
        let (t, k) = (ids.shape()[0], ids.shape()[1]);
        if x.shape() != [t, self.hidden] || weights.shape() != [t, k] || out.shape() != x.shape() {
            return Err(invalid(format!(
                "x {:?}, ids {:?}, weights {:?}, out {:?} must be [T, {h}], [T, k], [T, k], \
                 [T, {h}]",
                x.shape(),
                ids.shape(),
                weights.shape(),
                out.shape(),
                h = self.hidden
            )));
        }
        let datas: Vec<_> = self
            .stacks
            .iter()
            .map(|p| p.data.bind(py).readonly())
            .collect();
        let scales: Vec<_> = self
            .stacks
            .iter()
            .map(|p| p.scales.as_ref().map(|s| s.bind(py).readonly()))
            .collect();
        let w = |i: usize| self.stacks[i].weight(&datas[i], &scales[i]);
        let stacks = ExpertStacks::new(w(0)?, w(1)?, w(2)?, self.num_experts).map_err(invalid)?;
        let (x, ids, weights) = (x.as_slice()?, ids.as_slice()?, weights.as_slice()?);
        let o = out.as_slice_mut()?;
        py.detach(|| {
            run_experts(
                &stacks,
                x,
                k,
                ids,
                weights,
                o,
                scheme,
                variant,
                num_threads.max(1),
            )
        })
        .map_err(invalid)
    }

    /// Bytes of the stacks' data and scales.
    #[getter]
    fn nbytes(&self, py: Python<'_>) -> usize {
        self.stacks
            .iter()
            .map(|p| p.data.bind(py).len() + p.scales.as_ref().map_or(0, |s| 4 * s.bind(py).len()))
            .sum()
    }
}

/// `out = silu(g) * up` element-wise, float32, as `QuantExperts.forward`
/// computes it: `silu(x) = x / (1 + exp(-x))` with SLEEF's `expf_u10`, the
/// bits of torch's CPU `silu` of float32.
///
/// Args:
///     g, up: C-contiguous float32 `[N]`.
///     out: C-contiguous writable float32 `[N]`.
/// Raises:
///     ValueError: arrays of different lengths.
#[pyfunction]
pub fn quant_silu_mul(
    py: Python<'_>,
    g: PyReadonlyArray1<'_, f32>,
    up: PyReadonlyArray1<'_, f32>,
    mut out: PyReadwriteArray1<'_, f32>,
) -> PyResult<()> {
    let (g, up, o) = (g.as_slice()?, up.as_slice()?, out.as_slice_mut()?);
    if g.len() != up.len() || up.len() != o.len() {
        return Err(invalid(format!(
            "g ({}), up ({}) and out ({}) of different lengths",
            g.len(),
            up.len(),
            o.len()
        )));
    }
    py.detach(|| silu_mul(g, up, o));
    Ok(())
}

/// The quantized kernels' variants this CPU runs, fastest first
/// ("amx_int8", "avx512_vnni", "avx2", "portable"); each gives the same bits.
#[pyfunction]
pub fn quant_isas() -> Vec<&'static str> {
    VARIANTS.names()
}

/// The format named `name` among those with a panel layout.
fn panel_type(name: &str) -> PyResult<QuantType> {
    QuantType::parse(name)
        .filter(|t| repack::supported(*t))
        .ok_or_else(|| {
            invalid(format!(
                "quantized type {name:?} has no panel layout (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K have)"
            ))
        })
}

/// The panel layout (`quant::repack`) of a `[n, in_features]` weight:
/// groups of 16 outputs interleaved per 32-value block, the file's bytes
/// rearranged (the last group padded with zero bytes).
///
/// Args:
///     qtype: "Q4_0", "Q4_1", "Q5_0", "Q5_1" or "Q8_0".
///     data: C-contiguous uint8 `[n, row_bytes]` (the file's blocks).
///     in_features: `k`, a positive multiple of 32.
/// Returns:
///     uint8 `[n rounded up to 16, row_bytes]`.
/// Raises:
///     ValueError: another format, a `k` that is not a multiple of 32, or
///         data of another shape.
#[pyfunction]
pub fn quant_repack<'py>(
    py: Python<'py>,
    qtype: &str,
    data: PyReadonlyArray2<'py, u8>,
    in_features: usize,
) -> PyResult<Bound<'py, PyArray2<u8>>> {
    let t = panel_type(qtype)?;
    let (n, rb) = (data.shape()[0], data.shape()[1]);
    if in_features == 0 || !in_features.is_multiple_of(32) || rb != t.row_bytes(in_features) {
        return Err(invalid(format!(
            "{qtype} data {:?} is not [n, {}] of {in_features} input features (a multiple of 32)",
            data.shape(),
            t.row_bytes(in_features.max(32))
        )));
    }
    let bytes = data
        .as_slice()
        .map_err(|_| invalid("data must be C-contiguous".into()))?;
    let panels = py
        .detach(|| repack::repack(t, n, in_features, bytes))
        .map_err(invalid)?;
    let rows = n.div_ceil(repack::GROUP) * repack::GROUP;
    let flat = PyArray1::from_vec(py, panels);
    flat.reshape([rows, rb])
}

/// The file's bytes of rows `rows` of a panel weight (`quant_repack`'s
/// inverse).
///
/// Args:
///     qtype: "Q4_0", "Q4_1", "Q5_0", "Q5_1" or "Q8_0".
///     panels: C-contiguous uint8 `[n rounded up to 16, row_bytes]`.
///     n: the weight's output features.
///     in_features: `k`.
///     rows: int64 `[R]`, each in `0..n`.
/// Returns:
///     uint8 `[R, row_bytes]`.
/// Raises:
///     ValueError: another format, panels of another size, or a row outside
///         `0..n`.
#[pyfunction]
pub fn quant_unpack_rows<'py>(
    py: Python<'py>,
    qtype: &str,
    panels: PyReadonlyArray2<'py, u8>,
    n: usize,
    in_features: usize,
    rows: PyReadonlyArray1<'py, i64>,
) -> PyResult<Bound<'py, PyArray2<u8>>> {
    let t = panel_type(qtype)?;
    let bytes = panels
        .as_slice()
        .map_err(|_| invalid("panels must be C-contiguous".into()))?;
    let w = QuantWeight::panels(t, n, in_features, bytes).map_err(invalid)?;
    let ids = rows
        .as_slice()
        .map_err(|_| invalid("rows must be contiguous".into()))?;
    let ids = ids
        .iter()
        .map(|&r| {
            usize::try_from(r)
                .ok()
                .filter(|&r| r < n)
                .ok_or_else(|| invalid(format!("row {r} outside a weight of {n} rows")))
        })
        .collect::<PyResult<Vec<usize>>>()?;
    let out = py.detach(|| repack::unpack_rows(&w, &ids));
    let flat = PyArray1::from_vec(py, out);
    flat.reshape([ids.len(), t.row_bytes(in_features)])
}
