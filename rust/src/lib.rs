//! pagedrs core: the paged KV cache manager and the continuous-batching
//! scheduler of PagedAttention (Kwon et al., SOSP 2023), exposed to Python as
//! `pagedrs._core`.

pub mod attention;
pub mod cpu_features;
pub mod dense;
pub mod kv_cache;
pub mod lora;
mod python;
pub mod quant;
pub mod scheduler;
pub mod spec_decode;
#[doc(hidden)]
pub mod test_data;

use pyo3::prelude::*;

#[pymodule]
fn _core(m: &Bound<'_, PyModule>) -> PyResult<()> {
    python::register(m)?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
