//! The kernel variant a binding runs: the one its caller names, or the
//! fastest this CPU runs.

use pagedrs_kernels::cpu_features::{Variant, Variants};
use pyo3::exceptions::PyValueError;
use pyo3::PyResult;

/// The variant of a `kernel` family (as "dense", "LoRA") named `isa`, or the
/// fastest this CPU runs when `isa` is `None`. A `ValueError` names an
/// unknown variant, or one this CPU does not run, and those it runs.
pub(crate) fn choose(variants: Variants, isa: Option<&str>, kernel: &str) -> PyResult<Variant> {
    match isa {
        None => Ok(variants.best()),
        Some(name) => variants.parse(name).ok_or_else(|| {
            PyValueError::new_err(format!(
                "{kernel} kernel variant {name:?} is not one this CPU runs: {:?}",
                variants.names()
            ))
        }),
    }
}
