//! Conversions and checks of the scheduler methods' Python arguments, each
//! refusing a bad value with a `ValueError` that names it.

use numpy::PyReadonlyArray1;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

use pagedrs_sched::kv_cache::KvCacheGroupSpec;
use pagedrs_sched::scheduler::{check_positive, ConfigError, Scheduler};

/// A `ValueError` with the text of `e` (a core error that names its field).
pub fn value_error(e: impl std::fmt::Display) -> PyErr {
    PyValueError::new_err(e.to_string())
}

/// `[N]` token ids from an int64 array, each in [0, 2^32).
///
/// # Errors
/// `ValueError` "`{what}` must be in [0, 2^32)" for an id outside it.
pub fn token_ids(ids: &PyReadonlyArray1<'_, i64>, what: &str) -> PyResult<Vec<u32>> {
    ids.as_slice()?
        .iter()
        .map(|&t| u32::try_from(t))
        .collect::<Result<_, _>>()
        .map_err(|_| PyValueError::new_err(format!("{what} must be in [0, 2^32)")))
}

/// The KV cache groups of `Scheduler(kv_cache_groups=...)`: one per entry,
/// a sliding window in tokens or None for full attention; None gives one
/// full-attention group.
///
/// # Errors
/// `ValueError` naming `sliding_window` for a window that is not positive.
pub fn kv_cache_groups(windows: Option<Vec<Option<i64>>>) -> PyResult<Vec<KvCacheGroupSpec>> {
    let Some(windows) = windows else {
        return Ok(vec![KvCacheGroupSpec::FULL]);
    };
    windows
        .into_iter()
        .map(|w| match w {
            None => Ok(KvCacheGroupSpec::FULL),
            Some(w) => {
                check_positive("sliding_window", w)?;
                Ok(KvCacheGroupSpec::sliding(w as usize))
            }
        })
        .collect::<Result<_, ConfigError>>()
        .map_err(|e| PyValueError::new_err(e.to_string()))
}

/// `[N]` counts from an int64 array, each >= 0.
///
/// # Errors
/// `ValueError` "`{what}` must be >= 0" for a negative one.
pub fn counts(values: &PyReadonlyArray1<'_, i64>, what: &str) -> PyResult<Vec<usize>> {
    values
        .as_slice()?
        .iter()
        .map(|&n| usize::try_from(n))
        .collect::<Result<_, _>>()
        .map_err(|_| PyValueError::new_err(format!("{what} must be >= 0")))
}

/// `ValueError` when `request_id` is part of `scheduler`'s step in flight
/// (aborting, stopping or forking it must wait for `update()`).
pub fn check_not_scheduled(scheduler: &Scheduler, request_id: u64) -> PyResult<()> {
    if scheduler
        .scheduled()
        .iter()
        .any(|&(id, _)| id == request_id)
    {
        return Err(PyValueError::new_err(format!(
            "request {request_id} is in the step in flight: call update() or \
             cancel_step() first"
        )));
    }
    Ok(())
}
