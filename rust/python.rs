//! The PyO3 binding: converts Python values to core types and maps core errors
//! to Python exceptions. No semantics live here.

use std::sync::Arc;

use pyo3::exceptions::{PyRuntimeError, PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyString, PyTuple};

use crate::error::Error;
use crate::stop_strings::{StopMatch as CoreMatch, StopMatcher as CoreMatcher, StopStrings as CoreStops};

fn to_py_err(e: Error) -> PyErr {
    match e {
        Error::Finished { .. } => PyRuntimeError::new_err(e.to_string()),
        _ => PyValueError::new_err(e.to_string()),
    }
}

/// Extracts a `str` as UTF-8 plus its length in code points; `field` names
/// the argument in error messages.
pub(crate) fn extract_str<'a, 'py>(
    obj: &'a Bound<'py, PyAny>,
    field: &dyn Fn() -> String,
) -> PyResult<(&'a str, usize)> {
    let s = obj.cast::<PyString>().map_err(|_| {
        PyTypeError::new_err(format!(
            "{} must be str, got {}",
            field(),
            obj.get_type().name().map(|n| n.to_string()).unwrap_or_else(|_| "?".into())
        ))
    })?;
    let text = s.to_str().map_err(|_| {
        PyValueError::new_err(format!(
            "{} is not valid Unicode (it contains a lone surrogate)",
            field()
        ))
    })?;
    let chars = s.code_point_len()?;
    Ok((text, chars))
}

/// Converts a sequence of `str` (list, tuple or any iterable; a bare `str`
/// is rejected so "STOP" is not read as ['S', 'T', 'O', 'P']).
pub(crate) fn extract_stops(obj: &Bound<'_, PyAny>, field: &str) -> PyResult<Vec<String>> {
    if obj.is_instance_of::<PyString>() {
        return Err(PyTypeError::new_err(format!(
            "{field} must be a sequence of str, not a single str (wrap it in a list: [{:?}])",
            obj.extract::<String>().unwrap_or_default()
        )));
    }
    let mut out = Vec::new();
    for (i, item) in obj.try_iter()?.enumerate() {
        let item = item?;
        let (s, _) = extract_str(&item, &|| format!("{field}[{i}]"))?;
        if s.is_empty() {
            return Err(PyValueError::new_err(format!(
                "{field}[{i}] is an empty string; stop strings must be non-empty"
            )));
        }
        out.push(s.to_owned());
    }
    Ok(out)
}

pub(crate) fn compile_stops(obj: &Bound<'_, PyAny>, field: &str) -> PyResult<Arc<CoreStops>> {
    CoreStops::compile(extract_stops(obj, field)?).map_err(to_py_err)
}

/// A compiled, immutable list of stop strings (Aho-Corasick, standard match
/// semantics), shared between sequences and threads. Identical lists reuse one
/// compiled automaton.
#[pyclass(name = "StopStrings", module = "stopline", frozen)]
pub struct PyStopStrings {
    inner: Arc<CoreStops>,
}

#[pymethods]
impl PyStopStrings {
    #[new]
    fn new(stops: &Bound<'_, PyAny>) -> PyResult<Self> {
        Ok(Self { inner: compile_stops(stops, "stop")? })
    }

    /// A fresh per-sequence incremental matcher.
    #[pyo3(signature = (include_in_output = false))]
    fn matcher(&self, include_in_output: bool) -> PyStopMatcher {
        PyStopMatcher { inner: self.inner.matcher(include_in_output) }
    }

    /// Stateless check in the shape of vLLM's `check_stop_strings`.
    #[pyo3(signature = (output_text, new_char_count, include_in_output = false))]
    fn check<'py>(
        &self,
        py: Python<'py>,
        output_text: &Bound<'py, PyAny>,
        new_char_count: i64,
        include_in_output: bool,
    ) -> PyResult<Option<Bound<'py, PyTuple>>> {
        check_impl(py, &self.inner, output_text, new_char_count, include_in_output)
    }

    /// The stop strings, in list order.
    #[getter]
    fn stops<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyTuple>> {
        PyTuple::new(py, self.inner.stops())
    }

    /// Length of the longest stop string, in code points.
    #[getter]
    fn max_stop_len(&self) -> usize {
        self.inner.max_stop_chars()
    }

    fn __len__(&self) -> usize {
        self.inner.len()
    }

    fn __repr__(&self) -> String {
        format!("StopStrings({:?})", self.inner.stops())
    }
}

fn check_impl<'py>(
    py: Python<'py>,
    stops: &CoreStops,
    output_text: &Bound<'py, PyAny>,
    new_char_count: i64,
    include_in_output: bool,
) -> PyResult<Option<Bound<'py, PyTuple>>> {
    let (text, chars) = extract_str(output_text, &|| "output_text".into())?;
    if new_char_count < 0 || new_char_count as u64 > chars as u64 {
        return Err(to_py_err(Error::NewCharCount { value: new_char_count, text_len: chars }));
    }
    let hit = stops.check(text, chars, new_char_count as usize, include_in_output).map_err(to_py_err)?;
    hit.map(|(index, offset)| {
        PyTuple::new(py, [stops.stops()[index].as_str().into_pyobject(py)?.into_any(), offset.into_pyobject(py)?.into_any()])
    })
    .transpose()
}

/// Per-sequence incremental state over a `StopStrings`. Not thread-safe:
/// concurrent use raises instead of corrupting state.
#[pyclass(name = "StopMatcher", module = "stopline")]
pub struct PyStopMatcher {
    inner: CoreMatcher,
}

#[pymethods]
impl PyStopMatcher {
    /// Feeds the next text piece; returns the earliest stop string that ends
    /// inside it (ties: lowest list index), or None.
    fn feed(&mut self, delta: &Bound<'_, PyAny>) -> PyResult<Option<PyStopMatch>> {
        let (text, chars) = extract_str(delta, &|| "delta".into())?;
        let hit = self.inner.feed_counted(text, chars);
        Ok(hit.map(|m| PyStopMatch::from_core(m, self.inner.stop_strings())))
    }

    /// Code points at the end of the text that must not be streamed yet.
    #[getter]
    fn holdback(&self) -> usize {
        self.inner.holdback()
    }

    /// Code points fed so far.
    #[getter]
    fn chars_fed(&self) -> usize {
        self.inner.chars_fed()
    }

    #[getter]
    fn include_in_output(&self) -> bool {
        self.inner.include_in_output()
    }

    /// Forgets all text fed.
    fn reset(&mut self) {
        self.inner.reset()
    }

    fn __repr__(&self) -> String {
        format!(
            "StopMatcher(chars_fed={}, holdback={}, include_in_output={})",
            self.inner.chars_fed(),
            self.inner.holdback(),
            if self.inner.include_in_output() { "True" } else { "False" }
        )
    }
}

/// A stop string match; offsets are code points of the cumulative text.
#[pyclass(name = "StopMatch", module = "stopline", frozen, eq)]
#[derive(Clone, PartialEq)]
pub struct PyStopMatch {
    #[pyo3(get)]
    index: usize,
    #[pyo3(get)]
    stop: String,
    #[pyo3(get)]
    start: usize,
    #[pyo3(get)]
    end: usize,
    #[pyo3(get)]
    truncate_to: usize,
}

impl PyStopMatch {
    fn from_core(m: CoreMatch, stops: &CoreStops) -> Self {
        Self {
            index: m.index,
            stop: stops.stops()[m.index].clone(),
            start: m.start,
            end: m.end,
            truncate_to: m.truncate_to,
        }
    }
}

#[pymethods]
impl PyStopMatch {
    fn __repr__(&self) -> String {
        format!(
            "StopMatch(index={}, stop={:?}, start={}, end={}, truncate_to={})",
            self.index, self.stop, self.start, self.end, self.truncate_to
        )
    }
}

/// Drop-in for vLLM's `check_stop_strings`: the earliest stop string that
/// ends in the last `new_char_count` code points of `output_text`.
#[pyfunction]
#[pyo3(signature = (output_text, new_char_count, stop, include_in_output))]
fn check_stop_strings<'py>(
    py: Python<'py>,
    output_text: &Bound<'py, PyAny>,
    new_char_count: i64,
    stop: &Bound<'py, PyAny>,
    include_in_output: bool,
) -> PyResult<Option<Bound<'py, PyTuple>>> {
    let stops = compile_stops(stop, "stop")?;
    check_impl(py, &stops, output_text, new_char_count, include_in_output)
}

#[pymodule(gil_used = false)]
fn _core(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyStopStrings>()?;
    m.add_class::<PyStopMatcher>()?;
    m.add_class::<PyStopMatch>()?;
    m.add_function(wrap_pyfunction!(check_stop_strings, m)?)?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
