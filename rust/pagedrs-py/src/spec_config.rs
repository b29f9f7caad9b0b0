//! `speculative_config` from Python: a dict of vLLM's field names, parsed
//! into [`SpeculativeConfig`] and validated in Rust, errors naming the field.

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyDict;

use pagedrs_sched::spec_decode::{
    DraftLengthPolicy, SpecConfigError, SpecMethod, SpeculativeConfig, StepCostModel,
};

/// Fields read from the dict; any other key is refused.
const FIELDS: [&str; 11] = [
    "method",
    "num_speculative_tokens",
    "prompt_lookup_min",
    "prompt_lookup_max",
    "model",
    "suffix_decoding_max_tree_depth",
    "suffix_decoding_max_spec_factor",
    "suffix_decoding_min_token_prob",
    "suffix_decoding_max_cached_requests",
    "draft_length_policy",
    "draft_step_costs",
];

fn bad(field: &'static str, message: String) -> SpecConfigError {
    SpecConfigError { field, message }
}

/// The value of `field`, `None` when absent or None.
fn get<'py>(d: &Bound<'py, PyDict>, field: &str) -> PyResult<Option<Bound<'py, PyAny>>> {
    Ok(d.get_item(field)?.filter(|v| !v.is_none()))
}

/// A whole number >= 0 (not a bool).
fn count(d: &Bound<'_, PyDict>, field: &'static str) -> PyResult<Option<usize>> {
    let Some(v) = get(d, field)? else {
        return Ok(None);
    };
    let n = (!v.is_instance_of::<pyo3::types::PyBool>())
        .then(|| v.extract::<i64>().ok())
        .flatten()
        .ok_or_else(|| bad(field, format!("must be an integer, got {v}")))
        .map_err(to_py)?;
    if n < 0 {
        return Err(to_py(bad(field, format!("must be >= 0, got {n}"))));
    }
    Ok(Some(n as usize))
}

/// A real number (ints accepted, not bools).
fn number(d: &Bound<'_, PyDict>, field: &'static str) -> PyResult<Option<f64>> {
    let Some(v) = get(d, field)? else {
        return Ok(None);
    };
    (!v.is_instance_of::<pyo3::types::PyBool>())
        .then(|| v.extract::<f64>().ok())
        .flatten()
        .ok_or_else(|| to_py(bad(field, format!("must be a number, got {v}"))))
        .map(Some)
}

fn to_py(e: SpecConfigError) -> PyErr {
    PyValueError::new_err(e.to_string())
}

/// Parse and validate a `speculative_config` dict (vLLM's field names;
/// absent or None fields take vLLM's defaults; `prompt_lookup_min` /
/// `prompt_lookup_max` given alone set both). A `model` is taken only with
/// method "draft_model", whose model the Python engine loads and runs.
pub fn parse(d: &Bound<'_, PyDict>) -> PyResult<SpeculativeConfig> {
    for key in d.keys() {
        let name: String = key.str()?.extract()?;
        if !FIELDS.contains(&name.as_str()) {
            return Err(PyValueError::new_err(format!(
                "speculative_config has an unknown field {name:?} (known: {FIELDS:?})"
            )));
        }
    }
    let method = match get(d, "method")? {
        None => {
            return Err(to_py(bad(
                "method",
                "is required ('ngram', 'suffix' or 'draft_model')".to_string(),
            )))
        }
        Some(m) => {
            let name: String = m
                .extract()
                .map_err(|_| to_py(bad("method", format!("must be a string, got {m}"))))?;
            SpecMethod::parse(&name).map_err(to_py)?
        }
    };
    if let Some(model) = get(d, "model")? {
        if method != SpecMethod::DraftModel {
            return Err(to_py(bad(
                "model",
                format!(
                    "is not supported for method '{}': only method 'draft_model' takes a \
                     model, got {model}",
                    method.as_str()
                ),
            )));
        }
    }
    let mut c = SpeculativeConfig::new(method);
    if method == SpecMethod::DraftModel && get(d, "num_speculative_tokens")?.is_none() {
        return Err(to_py(bad(
            "num_speculative_tokens",
            "is required for method 'draft_model' (the draft model's steps per engine step)"
                .to_string(),
        )));
    }
    if let Some(k) = count(d, "num_speculative_tokens")? {
        c.num_speculative_tokens = k;
    }
    let (lo, hi) = (
        count(d, "prompt_lookup_min")?,
        count(d, "prompt_lookup_max")?,
    );
    match (lo, hi) {
        (Some(lo), Some(hi)) => (c.prompt_lookup_min, c.prompt_lookup_max) = (lo, hi),
        (Some(n), None) | (None, Some(n)) => (c.prompt_lookup_min, c.prompt_lookup_max) = (n, n),
        (None, None) => {}
    }
    if let Some(v) = count(d, "suffix_decoding_max_tree_depth")? {
        c.suffix_decoding_max_tree_depth = v;
        if get(d, "num_speculative_tokens")?.is_none() && method == SpecMethod::Suffix {
            c.num_speculative_tokens = v;
        }
    }
    if let Some(v) = number(d, "suffix_decoding_max_spec_factor")? {
        c.suffix_decoding_max_spec_factor = v;
    }
    if let Some(v) = number(d, "suffix_decoding_min_token_prob")? {
        c.suffix_decoding_min_token_prob = v;
    }
    if let Some(v) = count(d, "suffix_decoding_max_cached_requests")? {
        c.suffix_decoding_max_cached_requests = v;
    }
    if let Some(p) = get(d, "draft_length_policy")? {
        let name: String = p.extract().map_err(|_| {
            to_py(bad(
                "draft_length_policy",
                format!("must be a string, got {p}"),
            ))
        })?;
        c.draft_length_policy = DraftLengthPolicy::parse(&name).map_err(to_py)?;
    }
    if let Some(v) = get(d, "draft_step_costs")? {
        c.draft_step_costs = Some(step_costs(&v)?);
    }
    c.validate().map_err(to_py)?;
    Ok(c)
}

/// A step cost model from a sequence of `[batch, decode_s, draft_s]`
/// points (`draft_step_costs`, pagedrs' field).
///
/// # Errors
/// `ValueError` naming `draft_step_costs`: not a sequence of three-number
/// points, or points [`StepCostModel::new`] refuses.
pub fn step_costs(v: &Bound<'_, PyAny>) -> PyResult<StepCostModel> {
    let shape = || {
        to_py(bad(
            "draft_step_costs",
            format!("must be a list of [batch, decode_s, draft_s] points, got {v}"),
        ))
    };
    if v.is_instance_of::<pyo3::types::PyString>() {
        return Err(shape());
    }
    let rows: Vec<Vec<Bound<'_, PyAny>>> = v.extract().map_err(|_| shape())?;
    let mut points = Vec::with_capacity(rows.len());
    for row in rows {
        let [b, d, x] = row.as_slice() else {
            return Err(shape());
        };
        if [b, d, x]
            .iter()
            .any(|e| e.is_instance_of::<pyo3::types::PyBool>())
        {
            return Err(shape());
        }
        let batch: usize = b.extract().map_err(|_| shape())?;
        let decode_s: f64 = d.extract().map_err(|_| shape())?;
        let draft_s: f64 = x.extract().map_err(|_| shape())?;
        points.push((batch, decode_s, draft_s));
    }
    StepCostModel::from_points(&points).map_err(to_py)
}

/// `model`'s points as `[batch, decode_s, draft_s]` lists.
pub fn step_cost_points(model: &StepCostModel) -> Vec<(usize, f64, f64)> {
    model
        .points()
        .iter()
        .map(|p| (p.batch, p.decode_s, p.draft_s))
        .collect()
}

/// Validate a `speculative_config` dict as `Scheduler(speculative_config=...)`
/// does (vLLM's field names: method "ngram", "suffix" or "draft_model",
/// num_speculative_tokens, prompt_lookup_min, prompt_lookup_max,
/// suffix_decoding_max_tree_depth, suffix_decoding_max_spec_factor,
/// suffix_decoding_min_token_prob, suffix_decoding_max_cached_requests;
/// pagedrs' draft_length_policy "goodput" or "fixed" and draft_step_costs:
/// `[batch, decode_s, draft_s]` points).
/// Returns the settings in force, every field filled.
///
/// Raises:
///     ValueError: naming the field (an unknown field, a bad value, a
///         draft `model`).
#[pyfunction]
pub fn check_speculative_config<'py>(
    py: Python<'py>,
    speculative_config: &Bound<'py, PyDict>,
) -> PyResult<Bound<'py, PyDict>> {
    to_dict(py, &parse(speculative_config)?)
}

/// Every field of `c` by vLLM's name.
pub fn to_dict<'py>(py: Python<'py>, c: &SpeculativeConfig) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("method", c.method.as_str())?;
    d.set_item("num_speculative_tokens", c.num_speculative_tokens)?;
    d.set_item("prompt_lookup_min", c.prompt_lookup_min)?;
    d.set_item("prompt_lookup_max", c.prompt_lookup_max)?;
    d.set_item(
        "suffix_decoding_max_tree_depth",
        c.suffix_decoding_max_tree_depth,
    )?;
    d.set_item(
        "suffix_decoding_max_spec_factor",
        c.suffix_decoding_max_spec_factor,
    )?;
    d.set_item(
        "suffix_decoding_min_token_prob",
        c.suffix_decoding_min_token_prob,
    )?;
    d.set_item(
        "suffix_decoding_max_cached_requests",
        c.suffix_decoding_max_cached_requests,
    )?;
    d.set_item("draft_length_policy", c.draft_length_policy.as_str())?;
    d.set_item(
        "draft_step_costs",
        c.draft_step_costs.as_ref().map(step_cost_points),
    )?;
    Ok(d)
}
