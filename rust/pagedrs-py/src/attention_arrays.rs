//! The numpy arrays the attention bindings (`attention`) take, by KV cache
//! format: which numpy dtype carries each format's elements (bfloat16 as
//! `int16` bits, fp8 as `uint8` bits, int8 entries as `int8`), and the
//! reinterpretation of their data as the kernels' element types.

use numpy::{PyReadonlyArray3, PyReadwriteArray3, PyUntypedArrayMethods};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

use pagedrs_kernels::attention::{bf16_to_f32, f32_to_bf16};

/// A KV cache format, by its `kv_cache_dtype` name.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Format {
    F32,
    Bf16,
    Int8,
    Fp8E4m3,
    Fp8E5m2,
}

impl Format {
    /// The format named `name` ("float32", "bfloat16", "int8", "fp8_e4m3",
    /// "fp8_e5m2").
    pub fn parse(name: &str) -> PyResult<Self> {
        Ok(match name {
            "float32" => Format::F32,
            "bfloat16" => Format::Bf16,
            "int8" => Format::Int8,
            "fp8_e4m3" => Format::Fp8E4m3,
            "fp8_e5m2" => Format::Fp8E5m2,
            _ => {
                return Err(PyValueError::new_err(format!(
                    "the CPU kernels store no kv_cache_dtype {name:?} (float32, bfloat16, \
                     int8, fp8_e4m3, fp8_e5m2)"
                )))
            }
        })
    }

    /// The numpy dtype that carries this format's elements.
    pub fn numpy_dtype(self) -> &'static str {
        match self {
            Format::F32 => "float32",
            Format::Bf16 => "int16 (bfloat16 bits)",
            Format::Int8 => "int8",
            Format::Fp8E4m3 | Format::Fp8E5m2 => "uint8 (fp8 bits)",
        }
    }
}

/// `s` as a slice of `B`, a `repr(transparent)` wrapper of `A`.
pub(crate) fn cast<A, B>(s: &[A]) -> &[B] {
    assert!(size_of::<A>() == size_of::<B>() && align_of::<A>() == align_of::<B>());
    // SAFETY: `B` wraps `A` transparently (same size, alignment and validity).
    unsafe { std::slice::from_raw_parts(s.as_ptr() as *const B, s.len()) }
}

/// `s` as a mutable slice of `B`, a `repr(transparent)` wrapper of `A`.
pub(crate) fn cast_mut<A, B>(s: &mut [A]) -> &mut [B] {
    assert!(size_of::<A>() == size_of::<B>() && align_of::<A>() == align_of::<B>());
    // SAFETY: as `cast`; the borrow is unique.
    unsafe { std::slice::from_raw_parts_mut(s.as_mut_ptr() as *mut B, s.len()) }
}

/// A `[T, H, D]` array of floats: float32, or bfloat16 as `int16` bits.
pub(crate) enum Floats3<'py> {
    F32(PyReadonlyArray3<'py, f32>),
    Bf16(PyReadonlyArray3<'py, i16>),
}

impl<'py> Floats3<'py> {
    /// `obj` as float32 or `int16` (bfloat16 bits) `[T, H, D]`.
    pub fn extract(obj: &Bound<'py, PyAny>, what: &str) -> PyResult<Self> {
        if let Ok(a) = obj.extract::<PyReadonlyArray3<'py, f32>>() {
            return Ok(Floats3::F32(a));
        }
        if let Ok(a) = obj.extract::<PyReadonlyArray3<'py, i16>>() {
            return Ok(Floats3::Bf16(a));
        }
        Err(PyValueError::new_err(format!(
            "{what} must be a 3-d float32 or int16 (bfloat16 bits) array"
        )))
    }

    pub fn shape(&self) -> &[usize] {
        match self {
            Floats3::F32(a) => a.shape(),
            Floats3::Bf16(a) => a.shape(),
        }
    }

    pub fn is_bf16(&self) -> bool {
        matches!(self, Floats3::Bf16(_))
    }

    /// The values as `f32` (borrowed for float32, widened for bfloat16).
    pub fn to_f32(&self) -> PyResult<std::borrow::Cow<'_, [f32]>> {
        Ok(match self {
            Floats3::F32(a) => std::borrow::Cow::Borrowed(a.as_slice()?),
            Floats3::Bf16(a) => a
                .as_slice()?
                .iter()
                .map(|&b| bf16_to_f32(b as u16))
                .collect(),
        })
    }
}

/// A writable `[T, H, D]` array of floats: float32, or bfloat16 as `int16`.
pub(crate) enum FloatsOut3<'py> {
    F32(PyReadwriteArray3<'py, f32>),
    Bf16(PyReadwriteArray3<'py, i16>),
}

impl<'py> FloatsOut3<'py> {
    /// `obj` as a writable float32 or `int16` (bfloat16 bits) `[T, H, D]`.
    pub fn extract(obj: &Bound<'py, PyAny>, what: &str) -> PyResult<Self> {
        if let Ok(a) = obj.extract::<PyReadwriteArray3<'py, f32>>() {
            return Ok(FloatsOut3::F32(a));
        }
        if let Ok(a) = obj.extract::<PyReadwriteArray3<'py, i16>>() {
            return Ok(FloatsOut3::Bf16(a));
        }
        Err(PyValueError::new_err(format!(
            "{what} must be a writable 3-d float32 or int16 (bfloat16 bits) array"
        )))
    }

    pub fn shape(&self) -> &[usize] {
        match self {
            FloatsOut3::F32(a) => a.shape(),
            FloatsOut3::Bf16(a) => a.shape(),
        }
    }

    pub fn is_bf16(&self) -> bool {
        matches!(self, FloatsOut3::Bf16(_))
    }

    /// Run `f` on an `f32` output buffer, then store it here (bfloat16:
    /// rounded to nearest even).
    pub fn fill(&mut self, f: impl FnOnce(&mut [f32]) -> PyResult<()>) -> PyResult<()> {
        match self {
            FloatsOut3::F32(a) => f(a.as_slice_mut()?),
            FloatsOut3::Bf16(a) => {
                let dst = a.as_slice_mut()?;
                let mut buf = vec![0.0f32; dst.len()];
                f(&mut buf)?;
                for (d, &x) in dst.iter_mut().zip(&buf) {
                    *d = f32_to_bf16(x) as i16;
                }
                Ok(())
            }
        }
    }
}
