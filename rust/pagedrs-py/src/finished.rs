//! `pagedrs._core.FinishedRequest`: a sequence that left the scheduler in
//! `update()`, `abort()` or `stop_request()`, with its reason and every
//! generated token (the Rust [`Finished`]).

use numpy::{IntoPyArray, PyArray1, PyUntypedArrayMethods};
use pyo3::prelude::*;

use pagedrs_sched::scheduler::Finished;

/// A request (one sequence) that left the scheduler.
#[pyclass(frozen, module = "pagedrs._core", name = "FinishedRequest")]
pub struct PyFinished {
    /// Request (sequence) id.
    #[pyo3(get)]
    id: u64,
    /// "stop", "length" or "abort".
    #[pyo3(get)]
    reason: &'static str,
    /// The stop token that ended it, or None.
    #[pyo3(get)]
    stop_token: Option<u32>,
    /// uint32 `[N]`: every generated token id.
    #[pyo3(get)]
    output_token_ids: Py<PyArray1<u32>>,
}

impl PyFinished {
    pub(crate) fn new(py: Python<'_>, f: Finished) -> Self {
        Self {
            id: f.id,
            reason: f.reason.as_str(),
            stop_token: f.stop_token,
            output_token_ids: f.output_token_ids.into_pyarray(py).unbind(),
        }
    }
}

#[pymethods]
impl PyFinished {
    fn __repr__(&self, py: Python<'_>) -> String {
        format!(
            "FinishedRequest(id={}, reason={:?}, stop_token={:?}, num_output_tokens={})",
            self.id,
            self.reason,
            self.stop_token,
            PyUntypedArrayMethods::len(self.output_token_ids.bind(py))
        )
    }
}
