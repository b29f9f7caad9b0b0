//! `pagedrs._core.BlockMoves`: the block copies of one step (swaps and
//! copy-on-write), applied by the executor before the forward pass. Field
//! names are the Rust ones of [`BlockMoves`]; `M` is the number of block
//! pairs of one move kind.

use numpy::{IntoPyArray, PyArray2, PyArrayMethods, PyUntypedArrayMethods};
use pyo3::prelude::*;
use pyo3::types::PyTuple;

use pagedrs_sched::kv_cache::BlockCopy;
use pagedrs_sched::scheduler::BlockMoves;

/// `[M, 2]` int64 array of block pairs.
fn pairs_to_py(py: Python<'_>, pairs: &[BlockCopy]) -> PyResult<Py<PyArray2<i64>>> {
    let flat: Vec<i64> = pairs
        .iter()
        .flat_map(|&(a, b)| [a as i64, b as i64])
        .collect();
    Ok(flat.into_pyarray(py).reshape([pairs.len(), 2])?.unbind())
}

/// Block moves to apply before the step's forward pass, in this order:
/// swap out, swap in, copy-on-write copies.
#[pyclass(frozen, module = "pagedrs._core", name = "BlockMoves")]
pub struct PyBlockMoves {
    /// int64 `[M, 2]`: (device block, CPU block) pairs to copy out.
    #[pyo3(get)]
    swap_out: Py<PyArray2<i64>>,
    /// int64 `[M, 2]`: (CPU block, device block) pairs to copy in.
    #[pyo3(get)]
    swap_in: Py<PyArray2<i64>>,
    /// int64 `[M, 2]`: (source, destination) device block pairs.
    #[pyo3(get)]
    copies: Py<PyArray2<i64>>,
    /// True when there is nothing to move.
    #[pyo3(get)]
    is_empty: bool,
}

impl PyBlockMoves {
    pub(crate) fn new(py: Python<'_>, m: &BlockMoves) -> PyResult<Self> {
        Ok(Self {
            swap_out: pairs_to_py(py, &m.swap_out)?,
            swap_in: pairs_to_py(py, &m.swap_in)?,
            copies: pairs_to_py(py, &m.copies)?,
            is_empty: m.is_empty(),
        })
    }
}

#[pymethods]
impl PyBlockMoves {
    #[new]
    fn py_new(
        py: Python<'_>,
        swap_out: Py<PyArray2<i64>>,
        swap_in: Py<PyArray2<i64>>,
        copies: Py<PyArray2<i64>>,
    ) -> Self {
        let is_empty = [&swap_out, &swap_in, &copies]
            .iter()
            .all(|a| PyUntypedArrayMethods::len(a.bind(py)) == 0);
        Self {
            swap_out,
            swap_in,
            copies,
            is_empty,
        }
    }

    fn __reduce__<'py>(slf: &Bound<'py, Self>) -> PyResult<Bound<'py, PyTuple>> {
        let py = slf.py();
        let m = slf.get();
        let args = (
            m.swap_out.clone_ref(py),
            m.swap_in.clone_ref(py),
            m.copies.clone_ref(py),
        );
        (slf.get_type(), args).into_pyobject(py)
    }

    pub(crate) fn __repr__(&self, py: Python<'_>) -> String {
        format!(
            "BlockMoves(swap_out={}, swap_in={}, copies={})",
            PyUntypedArrayMethods::len(self.swap_out.bind(py)),
            PyUntypedArrayMethods::len(self.swap_in.bind(py)),
            PyUntypedArrayMethods::len(self.copies.bind(py))
        )
    }
}
