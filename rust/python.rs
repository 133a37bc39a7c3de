//! The PyO3 binding: converts Python values to core types and maps core errors
//! to Python exceptions. No semantics live here.

use std::sync::Arc;

use pyo3::exceptions::{PyRuntimeError, PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList, PyRange, PyRangeMethods, PyString, PyTuple};
use pyo3::IntoPyObjectExt;

use crate::batch::FinishBatch;
use crate::error::Error;
use crate::finish::{Finish, FinishTracker, Matched, Repetition, Step, StopParams, StopReason};
use crate::limits;
use crate::stop_regex::{StopRegexMatcher as CoreRegexMatcher, StopRegexes as CoreRegexes};
use crate::stop_strings::{
    StopMatch as CoreMatch, StopMatcher as CoreMatcher, StopStrings as CoreStops,
};

// Vocabulary, IncrementalDecoder and the ids-only steps.
#[path = "python_detok.rs"]
mod detok;
#[path = "python_logits.rs"]
mod logits;

/// Python's `repr()` of a Rust value converted to its Python counterpart.
fn py_repr<'py, T: IntoPyObject<'py>>(py: Python<'py>, value: T) -> PyResult<String> {
    Ok(value.into_bound_py_any(py)?.repr()?.to_string())
}

fn to_py_err(e: Error) -> PyErr {
    match e {
        Error::Finished { .. } | Error::SlotFinished { .. } => {
            PyRuntimeError::new_err(e.to_string())
        }
        Error::Alloc { .. } => pyo3::exceptions::PyMemoryError::new_err(e.to_string()),
        _ => PyValueError::new_err(e.to_string()),
    }
}

/// Extracts a `str` as UTF-8 plus its length in code points; `field` names
/// the argument in error messages.
#[inline(always)]
pub(crate) fn extract_str<'a, 'py>(
    obj: &'a Bound<'py, PyAny>,
    field: &dyn Fn() -> String,
) -> PyResult<(&'a str, usize)> {
    let text = extract_utf8(obj, field)?;
    let chars = obj
        .cast::<PyString>()
        .map_err(PyErr::from)?
        .code_point_len()?;
    Ok((text, chars))
}

/// Extracts a `str` as UTF-8 (no code-point count: the core counts while it
/// scans, which is cheaper for the short pieces of a decoding step).
#[inline(always)]
fn extract_utf8<'a, 'py>(
    obj: &'a Bound<'py, PyAny>,
    field: &dyn Fn() -> String,
) -> PyResult<&'a str> {
    let s = obj.cast::<PyString>().map_err(|_| {
        PyTypeError::new_err(format!(
            "{} must be str, got {}",
            field(),
            obj.get_type()
                .name()
                .map(|n| n.to_string())
                .unwrap_or_else(|_| "?".into())
        ))
    })?;
    let text = s.to_str().map_err(|_| {
        PyValueError::new_err(format!(
            "{} is not valid Unicode (it contains a lone surrogate)",
            field()
        ))
    })?;
    Ok(text)
}

/// `obj`'s iterator; "not iterable" becomes a TypeError naming `field` and
/// `what` it must be, anything else `__iter__` raised propagates as is.
fn iter_of<'py>(
    obj: &Bound<'py, PyAny>,
    field: &str,
    what: &str,
) -> PyResult<Bound<'py, pyo3::types::PyIterator>> {
    obj.try_iter().map_err(|e| {
        if e.is_instance_of::<PyTypeError>(obj.py()) {
            PyTypeError::new_err(format!("{field} must be {what}, got {}", type_name(obj)))
        } else {
            e
        }
    })
}

/// A compiled `StopStrings` is reused as is; any other sequence of `str`
/// (list, tuple or any iterable; a bare `str` is rejected so "STOP" is not
/// read as ['S', 'T', 'O', 'P']) is compiled through the cache, which a list
/// it has seen leaves without copying a string.
pub(crate) fn compile_stops(obj: &Bound<'_, PyAny>, field: &str) -> PyResult<Arc<CoreStops>> {
    if let Ok(compiled) = obj.cast::<PyStopStrings>() {
        return Ok(Arc::clone(&compiled.get().inner));
    }
    if obj.is_instance_of::<PyString>() {
        return Err(PyTypeError::new_err(format!(
            "{field} must be a sequence of str, not a single str (wrap it in a list: [{:?}])",
            obj.extract::<String>().unwrap_or_default()
        )));
    }
    let items = take_capped(obj, field, "a sequence of str", limits::MAX_STOP_STRINGS)?;
    let mut stops = Vec::with_capacity(items.len());
    let mut bytes = 0;
    for (i, item) in items.iter().enumerate() {
        let s = extract_utf8(item, &|| format!("{field}[{i}]"))?;
        if s.is_empty() {
            return Err(PyValueError::new_err(format!(
                "{field}[{i}] is an empty string; stop strings must be non-empty"
            )));
        }
        bytes += s.len();
        if bytes > limits::MAX_STOP_BYTES {
            return Err(PyValueError::new_err(format!(
                "{field}: totals more than {} UTF-8 bytes (at {field}[{i}]); at most {} are accepted",
                limits::MAX_STOP_BYTES,
                limits::MAX_STOP_BYTES
            )));
        }
        stops.push(s);
    }
    if let Some(hit) = CoreStops::cached_strs(&stops) {
        return Ok(hit);
    }
    // A short list builds in microseconds, less than it would cost to get
    // the GIL back; a long one builds without it.
    let compile = || CoreStops::compile_strs(&stops);
    let compiled = if bytes >= DETACH_MIN_BYTES {
        obj.py().detach(compile)
    } else {
        compile()
    };
    compiled.map_err(to_py_err)
}

/// Stop lists of at least this many bytes are compiled without the GIL.
const DETACH_MIN_BYTES: usize = 2048;

/// The items of `obj` (an iterable), refused with a `ValueError` naming
/// `field` and `cap` when there are more than `cap`: before anything is
/// materialized when `len()` tells, else after `cap + 1` items (an endless
/// iterator ends there). "Not iterable" is a `TypeError` naming `field` and
/// `what`; anything the caller's object raises propagates unchanged.
fn take_capped<'py>(
    obj: &Bound<'py, PyAny>,
    field: &str,
    what: &str,
    cap: usize,
) -> PyResult<Vec<Bound<'py, PyAny>>> {
    let over = |n: Option<usize>| {
        let n = n.map_or_else(|| format!("more than {cap}"), |n| n.to_string());
        PyValueError::new_err(format!(
            "{field}: has {n} entries; at most {cap} are accepted"
        ))
    };
    if let Ok(list) = obj.cast_exact::<PyList>() {
        if list.len() > cap {
            return Err(over(Some(list.len())));
        }
        return Ok(list.iter().collect());
    }
    known_len(obj, cap, &over)?;
    let mut out = Vec::new();
    for item in iter_of(obj, field, what)? {
        if out.len() == cap {
            return Err(over(None));
        }
        out.push(item?);
    }
    Ok(out)
}

/// Refuses `obj` when `len(obj)` says it has more than `cap` items (a length
/// too large for an index counts as more). Objects without a length pass;
/// an exception other than "no len" or "too large" propagates.
fn known_len(
    obj: &Bound<'_, PyAny>,
    cap: usize,
    over: &dyn Fn(Option<usize>) -> PyErr,
) -> PyResult<()> {
    if obj.is_instance_of::<PyString>() {
        return Ok(());
    }
    match obj.len() {
        Ok(n) if n > cap => Err(over(Some(n))),
        Ok(_) => Ok(()),
        Err(e) if e.is_instance_of::<pyo3::exceptions::PyOverflowError>(obj.py()) => {
            Err(over(None))
        }
        Err(e) if e.is_instance_of::<PyTypeError>(obj.py()) => Ok(()),
        Err(e) => Err(e),
    }
}

/// Compiles a sequence of regex patterns (a bare `str` is rejected, as for
/// stop strings); errors name `stop_regex[i]` and the pattern.
fn compile_regexes(obj: &Bound<'_, PyAny>) -> PyResult<Arc<CoreRegexes>> {
    if obj.is_instance_of::<PyString>() {
        return Err(PyTypeError::new_err(format!(
            "stop_regex must be a sequence of str, not a single str (wrap it in a list: [{:?}])",
            obj.extract::<String>().unwrap_or_default()
        )));
    }
    let items = take_capped(
        obj,
        "stop_regex",
        "a sequence of str",
        limits::MAX_STOP_REGEXES,
    )?;
    let mut patterns = Vec::with_capacity(items.len());
    let mut bytes = 0;
    for (i, item) in items.iter().enumerate() {
        let (s, _) = extract_str(item, &|| format!("stop_regex[{i}]"))?;
        bytes += s.len();
        if bytes > limits::MAX_STOP_REGEX_BYTES {
            return Err(PyValueError::new_err(format!(
                "stop_regex: totals more than {} UTF-8 bytes (at stop_regex[{i}]); at most {} are accepted",
                limits::MAX_STOP_REGEX_BYTES,
                limits::MAX_STOP_REGEX_BYTES
            )));
        }
        patterns.push(s.to_owned());
    }
    if let Some(hit) = CoreRegexes::cached(&patterns) {
        return hit.map_err(to_py_err);
    }
    // Building a DFA takes from tens of microseconds to the size limits'
    // worth: never with the GIL held.
    obj.py()
        .detach(|| CoreRegexes::compile(patterns))
        .map_err(to_py_err)
}

/// A compiled, immutable list of stop regexes (Rust regex syntax, one DFA),
/// shared between sequences and threads. Identical lists reuse one DFA.
#[pyclass(name = "StopRegexes", module = "stopline", frozen)]
pub struct PyStopRegexes {
    inner: Arc<CoreRegexes>,
}

#[pymethods]
impl PyStopRegexes {
    #[new]
    fn new(patterns: &Bound<'_, PyAny>) -> PyResult<Self> {
        Ok(Self {
            inner: compile_regexes(patterns)?,
        })
    }

    /// A fresh per-sequence incremental matcher.
    #[pyo3(signature = (include_in_output = false))]
    fn matcher(&self, include_in_output: bool) -> PyStopRegexMatcher {
        PyStopRegexMatcher {
            inner: self.inner.matcher(include_in_output),
        }
    }

    /// The patterns, in list order.
    #[getter]
    fn patterns<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyTuple>> {
        PyTuple::new(py, self.inner.patterns())
    }

    /// Heap bytes of the compiled DFA.
    #[getter]
    fn memory_usage(&self) -> usize {
        self.inner.memory_usage()
    }

    fn __len__(&self) -> usize {
        self.inner.len()
    }

    fn __repr__(&self, py: Python<'_>) -> PyResult<String> {
        Ok(format!(
            "StopRegexes({})",
            py_repr(py, self.inner.patterns())?
        ))
    }
}

/// Per-sequence incremental state over a `StopRegexes`. Not thread-safe:
/// concurrent use raises instead of corrupting state.
#[pyclass(name = "StopRegexMatcher", module = "stopline")]
pub struct PyStopRegexMatcher {
    inner: CoreRegexMatcher,
}

#[pymethods]
impl PyStopRegexMatcher {
    /// Feeds the next text piece; returns the match that ends earliest inside
    /// it (ties: lowest list index; then the leftmost start), or None. `stop`
    /// is the pattern.
    fn feed(&mut self, delta: &Bound<'_, PyAny>) -> PyResult<Option<PyStopMatch>> {
        let (text, chars) = extract_str(delta, &|| "delta".into())?;
        let hit = self.inner.feed_counted(text, chars);
        Ok(hit.map(|m| PyStopMatch {
            index: m.index,
            stop: self.inner.regexes().patterns()[m.index].clone(),
            start: m.start,
            end: m.end,
            truncate_to: m.truncate_to,
        }))
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
            "StopRegexMatcher(chars_fed={}, holdback={}, include_in_output={})",
            self.inner.chars_fed(),
            self.inner.holdback(),
            if self.inner.include_in_output() {
                "True"
            } else {
                "False"
            }
        )
    }
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
        Ok(Self {
            inner: compile_stops(stops, "stop")?,
        })
    }

    /// A fresh per-sequence incremental matcher.
    #[pyo3(signature = (include_in_output = false))]
    fn matcher(&self, include_in_output: bool) -> PyStopMatcher {
        PyStopMatcher {
            inner: self.inner.matcher(include_in_output),
        }
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
        check_impl(
            py,
            &self.inner,
            output_text,
            new_char_count,
            include_in_output,
        )
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

    fn __repr__(&self, py: Python<'_>) -> PyResult<String> {
        Ok(format!("StopStrings({})", py_repr(py, self.inner.stops())?))
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
        return Err(to_py_err(Error::NewCharCount {
            value: new_char_count,
            text_len: chars,
        }));
    }
    let hit = stops
        .check(text, chars, new_char_count as usize, include_in_output)
        .map_err(to_py_err)?;
    hit.map(|(index, offset)| {
        PyTuple::new(
            py,
            [
                stops.stops()[index].as_str().into_pyobject(py)?.into_any(),
                offset.into_pyobject(py)?.into_any(),
            ],
        )
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
            if self.inner.include_in_output() {
                "True"
            } else {
                "False"
            }
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
    fn __repr__(&self, py: Python<'_>) -> PyResult<String> {
        Ok(format!(
            "StopMatch(index={}, stop={}, start={}, end={}, truncate_to={})",
            self.index,
            py_repr(py, &self.stop)?,
            self.start,
            self.end,
            self.truncate_to
        ))
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

/// Test hook, not API: panics inside the binding layer so the tests can show
/// that PyO3 turns a Rust panic into a Python exception
/// (`pyo3_runtime.PanicException`) instead of crashing the interpreter
/// (`tests/test_errors.py::test_a_rust_panic_is_a_python_exception`).
#[pyfunction]
fn _panic_for_tests(message: &str) -> PyResult<()> {
    panic!("{message}")
}

// The fast paths that read a caller's list items without taking references
// hold the list's critical section (the GIL's job on a GIL build), the batch
// step reads its pieces from a private copy, and the compiled lists and
// caches are immutable or behind a Mutex: the module is safe without the
// GIL. (The default abi3 wheel does not load on a free-threaded CPython;
// this matters for source builds. docs/reliability.md, "Threads".)
#[pymodule(gil_used = false)]
fn _core(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyStopStrings>()?;
    m.add_class::<PyStopMatcher>()?;
    m.add_class::<PyStopMatch>()?;
    m.add_class::<PyStopRegexes>()?;
    m.add_class::<PyStopRegexMatcher>()?;
    m.add_class::<PyStopParams>()?;
    m.add_class::<PyStepResult>()?;
    m.add_class::<PyFinishTracker>()?;
    m.add_class::<PyBatchStepResult>()?;
    m.add_class::<PyFinishBatch>()?;
    m.add_class::<detok::PyVocabulary>()?;
    m.add_class::<detok::PyIncrementalDecoder>()?;
    m.add_function(wrap_pyfunction!(check_stop_strings, m)?)?;
    m.add_function(wrap_pyfunction!(to_openai_finish_reason, m)?)?;
    m.add_function(wrap_pyfunction!(_panic_for_tests, m)?)?;
    m.add_function(wrap_pyfunction!(logits::_bad_words_table, m)?)?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    let caps = PyDict::new(m.py());
    for (name, value) in limits::ALL {
        caps.set_item(name, value)?;
    }
    m.add("LIMITS", caps)?;
    Ok(())
}

// ---------------------------------------------------------------- finish ---

fn type_name(obj: &Bound<'_, PyAny>) -> String {
    obj.get_type()
        .name()
        .map(|n| n.to_string())
        .unwrap_or_else(|_| "?".into())
}

/// One token id: a non-negative int below 2**32.
#[inline]
fn extract_id(item: &Bound<'_, PyAny>, field: &dyn Fn() -> String) -> PyResult<u32> {
    let v = extract_int(item, field)?;
    u32::try_from(v).map_err(|_| {
        PyValueError::new_err(format!(
            "{}={v} is not a valid token id (must be in [0, 2**32))",
            field()
        ))
    })
}

/// A sequence of at most `cap` token ids (list, tuple, any iterable of
/// ints, or one int).
fn extract_ids(obj: &Bound<'_, PyAny>, field: &str, cap: usize) -> PyResult<Vec<u32>> {
    extract_ids_named(obj, field, cap, &|i| format!("{field}[{i}]"))
}

/// An empty Vec with room for `n` items, or `MemoryError`: a failed
/// allocation in Rust would abort the process. `n` is capped by the caller.
fn try_vec<T>(n: usize, field: &str) -> PyResult<Vec<T>> {
    let mut v = Vec::new();
    v.try_reserve_exact(n).map_err(|_| {
        pyo3::exceptions::PyMemoryError::new_err(format!(
            "{field}: cannot allocate room for {n} entries"
        ))
    })?;
    Ok(v)
}

/// The error for a sequence of more than `cap` entries (`n` when known).
fn over_cap(field: &str, n: Option<usize>, cap: usize) -> PyErr {
    let n = n.map_or_else(|| format!("more than {cap}"), |n| n.to_string());
    PyValueError::new_err(format!(
        "{field}: has {n} entries; at most {cap} are accepted"
    ))
}

/// [`extract_ids`] with `name(i)` naming element i in errors.
fn extract_ids_named(
    obj: &Bound<'_, PyAny>,
    field: &str,
    cap: usize,
    name: &dyn Fn(usize) -> String,
) -> PyResult<Vec<u32>> {
    if let Ok(list) = obj.cast_exact::<PyList>() {
        if list.len() > cap {
            return Err(over_cap(field, Some(list.len()), cap));
        }
        let room = try_vec(list.len(), field)?;
        if let Some(ids) = list_ints_fast(list, |v| u32::try_from(v).ok(), room) {
            return Ok(ids);
        }
        let mut out = try_vec(list.len(), field)?;
        for (i, item) in list.iter().enumerate() {
            out.push(extract_id(&item, &|| name(i))?);
        }
        return Ok(out);
    }
    if let Some(ids) = buffer_ids(obj, field, cap)? {
        return Ok(ids);
    }
    // One int (or int-like, as numpy integers are) for a one-token run.
    if obj.is_instance_of::<pyo3::types::PyInt>() {
        return Ok(vec![extract_id(obj, &|| field.to_string())?]);
    }
    if !obj.is_instance_of::<PyString>() {
        match obj.extract::<i64>() {
            Ok(_) if obj.try_iter().is_err() => {
                return Ok(vec![extract_id(obj, &|| field.to_string())?])
            }
            Ok(_) => {}
            Err(e) if !is_conversion_error(&e, obj.py()) => return Err(e),
            Err(_) => {}
        }
    }
    known_len(obj, cap, &|n| over_cap(field, n, cap))?;
    let mut out = Vec::new();
    for (i, item) in iter_of(obj, field, "a sequence of ints")?.enumerate() {
        if i == cap {
            return Err(over_cap(field, None, cap));
        }
        out.push(extract_id(&item?, &|| name(i))?);
    }
    Ok(out)
}

/// The errors of converting a value that is no int (TypeError) or too large
/// (OverflowError); anything else came from the caller's code.
fn is_conversion_error(e: &PyErr, py: Python<'_>) -> bool {
    e.is_instance_of::<PyTypeError>(py) || e.is_instance_of::<pyo3::exceptions::PyOverflowError>(py)
}

/// An int that fits in i64: a wrong type is a TypeError, an int out of range
/// a ValueError; both name the field. Anything else an `__index__` raises
/// (KeyboardInterrupt, MemoryError, ...) propagates as is.
#[inline]
fn extract_int(item: &Bound<'_, PyAny>, field: &dyn Fn() -> String) -> PyResult<i64> {
    item.extract::<i64>().map_err(|e| {
        let py = item.py();
        if item.is_instance_of::<pyo3::types::PyInt>()
            || e.is_instance_of::<pyo3::exceptions::PyOverflowError>(py)
        {
            let shown = item.repr().map(|r| r.to_string()).unwrap_or_default();
            PyValueError::new_err(format!("{}={shown} is out of range", field()))
        } else if e.is_instance_of::<PyTypeError>(py) {
            PyTypeError::new_err(format!(
                "{} must be an int, got {}",
                field(),
                type_name(item)
            ))
        } else {
            e
        }
    })
}

fn extract_nonneg(obj: &Bound<'_, PyAny>, field: &str) -> PyResult<u64> {
    let v = extract_int(obj, &|| field.to_string())?;
    u64::try_from(v).map_err(|_| PyValueError::new_err(format!("{field} must be >= 0, got {v}")))
}

fn extract_opt_nonneg(obj: Option<&Bound<'_, PyAny>>, field: &str) -> PyResult<Option<u64>> {
    match obj {
        None => Ok(None),
        Some(o) if o.is_none() => Ok(None),
        Some(o) => extract_nonneg(o, field).map(Some),
    }
}

/// The slot that owns element `j` of a batch step's flat arrays.
fn slot_of(slots: &[i64], runs: Option<&[usize]>, j: usize) -> Option<i64> {
    match runs {
        None => slots.get(j).copied(),
        Some(r) => {
            let mut end = 0;
            r.iter().zip(slots).find_map(|(&len, &slot)| {
                end += len;
                (j < end).then_some(slot)
            })
        }
    }
}

/// Text pieces aligned with token ids, as `str` objects checked to be valid
/// Unicode. `name(i)` names element i in errors.
fn extract_piece_objects<'py>(
    obj: &Bound<'py, PyAny>,
    field: &str,
    name: &dyn Fn(usize) -> String,
) -> PyResult<Vec<Bound<'py, PyString>>> {
    if obj.is_instance_of::<PyString>() {
        return Err(PyTypeError::new_err(format!(
            "{field} must be a sequence of str (one piece per token), not a single str"
        )));
    }
    let one = |i: usize, item: Bound<'py, PyAny>| -> PyResult<Bound<'py, PyString>> {
        let s = item.cast_into::<PyString>().map_err(|e| {
            PyTypeError::new_err(format!(
                "{} must be str, got {}",
                name(i),
                type_name(e.into_inner().as_any())
            ))
        })?;
        s.to_str().map_err(|_| {
            PyValueError::new_err(format!(
                "{} is not valid Unicode (it contains a lone surrogate)",
                name(i)
            ))
        })?;
        Ok(s)
    };
    take_capped(obj, field, "a sequence of str", limits::MAX_STEP_TOKENS)?
        .into_iter()
        .enumerate()
        .map(|(i, item)| one(i, item))
        .collect()
}

fn extract_repetition(obj: &Bound<'_, PyAny>) -> PyResult<Repetition> {
    let get = |key: &str, default: Option<u64>| -> PyResult<usize> {
        let v = match obj.get_item(key) {
            Ok(v) => Some(v),
            Err(e) if e.is_instance_of::<pyo3::exceptions::PyKeyError>(obj.py()) => None,
            // Whatever else the caller's `__getitem__` raised is theirs.
            Err(e) if !e.is_instance_of::<PyTypeError>(obj.py()) => return Err(e),
            Err(_) => {
                return Err(PyTypeError::new_err(format!(
                    "repetition must be a mapping with keys max_pattern_size, min_pattern_size, min_count; got {}",
                    type_name(obj)
                )))
            }
        };
        match (v, default) {
            (Some(v), _) => Ok(extract_nonneg(&v, &format!("repetition[{key:?}]"))? as usize),
            (None, Some(d)) => Ok(d as usize),
            (None, None) => Err(PyValueError::new_err(format!(
                "repetition is missing the key {key:?}"
            ))),
        }
    };
    const KEYS: [&str; 3] = ["max_pattern_size", "min_pattern_size", "min_count"];
    // A mapping's `keys()` is called and its errors propagate: a mapping
    // whose keys cannot be listed is not silently taken as having none.
    let keys = match obj.getattr("keys") {
        Ok(keys) => Some(keys.call0()?),
        Err(e) if e.is_instance_of::<pyo3::exceptions::PyAttributeError>(obj.py()) => None,
        Err(e) => return Err(e),
    };
    if let Some(keys) = keys {
        let keys = take_capped(&keys, "repetition.keys()", "an iterable of keys", 64)?;
        for key in keys {
            let known = key
                .extract::<String>()
                .is_ok_and(|k| KEYS.contains(&k.as_str()));
            if !known {
                return Err(PyValueError::new_err(format!(
                    "repetition has the unknown key {}; expected {KEYS:?}",
                    key.repr()?
                )));
            }
        }
    }
    Ok(Repetition {
        max_pattern_size: get("max_pattern_size", None)?,
        min_pattern_size: get("min_pattern_size", Some(0))?,
        min_count: get("min_count", None)?,
    })
}

/// Per-request stop parameters, validated at construction (field names as in
/// vLLM's `SamplingParams`; all keyword-only).
///
/// Counts are output tokens (`max_tokens`, `min_tokens`) or prompt + output
/// tokens (`max_model_len`, with `prompt_len` the prompt's). `stop` is a
/// sequence of non-empty str or a compiled `StopStrings`; `stop_regex` a
/// sequence of Rust-syntax patterns; `eos_token_ids` / `stop_token_ids` ints in
/// [0, vocab_size) when `vocab_size` is set; `repetition` a mapping with
/// `max_pattern_size`, `min_pattern_size` (0 means 1) and `min_count` (vLLM's
/// repetition detection). The order of checks these feed is in
/// docs/semantics.md.
///
/// Raises `ValueError` naming the field and value for out-of-range values
/// (max_tokens < 1, min_tokens > max_tokens, prompt_len >= max_model_len, ids
/// >= vocab_size, empty stop strings, bad repetition values, unknown
/// repetition keys) and `TypeError` for wrong types.
#[pyclass(name = "StopParams", module = "stopline", frozen)]
pub struct PyStopParams {
    inner: Arc<StopParams>,
}

#[pymethods]
impl PyStopParams {
    #[new]
    #[pyo3(signature = (
        *, max_tokens = None, min_tokens = None, prompt_len = None, max_model_len = None,
        eos_token_ids = None, ignore_eos = false, stop_token_ids = None, stop = None,
        include_stop_str_in_output = false, vocab_size = None, repetition = None,
        stop_regex = None,
    ))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        max_tokens: Option<&Bound<'_, PyAny>>,
        min_tokens: Option<&Bound<'_, PyAny>>,
        prompt_len: Option<&Bound<'_, PyAny>>,
        max_model_len: Option<&Bound<'_, PyAny>>,
        eos_token_ids: Option<&Bound<'_, PyAny>>,
        ignore_eos: bool,
        stop_token_ids: Option<&Bound<'_, PyAny>>,
        stop: Option<&Bound<'_, PyAny>>,
        include_stop_str_in_output: bool,
        vocab_size: Option<&Bound<'_, PyAny>>,
        repetition: Option<&Bound<'_, PyAny>>,
        stop_regex: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Self> {
        let ids = |o: Option<&Bound<'_, PyAny>>, field: &str| -> PyResult<Vec<u32>> {
            match o {
                Some(o) if !o.is_none() => extract_ids(o, field, limits::MAX_STOP_TOKEN_IDS),
                _ => Ok(Vec::new()),
            }
        };
        let vocab = extract_opt_nonneg(vocab_size, "vocab_size")?;
        let params = StopParams {
            max_tokens: extract_opt_nonneg(max_tokens, "max_tokens")?,
            min_tokens: extract_opt_nonneg(min_tokens, "min_tokens")?.unwrap_or(0),
            prompt_len: extract_opt_nonneg(prompt_len, "prompt_len")?.unwrap_or(0),
            max_model_len: extract_opt_nonneg(max_model_len, "max_model_len")?,
            eos_token_ids: ids(eos_token_ids, "eos_token_ids")?,
            ignore_eos,
            stop_token_ids: ids(stop_token_ids, "stop_token_ids")?,
            stop: match stop {
                Some(s) if !s.is_none() => Some(compile_stops(s, "stop")?),
                _ => None,
            },
            stop_regex: match stop_regex {
                Some(s) if !s.is_none() => Some(compile_regexes(s)?),
                _ => None,
            },
            include_stop_str_in_output,
            vocab_size: vocab
                .map(|v| {
                    u32::try_from(v).map_err(|_| {
                        PyValueError::new_err(format!("vocab_size={v} is larger than 2**32 - 1"))
                    })
                })
                .transpose()?,
            repetition: match repetition {
                Some(r) if !r.is_none() => Some(extract_repetition(r)?),
                _ => None,
            },
        };
        params.validate().map_err(to_py_err)?;
        Ok(Self {
            inner: Arc::new(params),
        })
    }

    #[getter]
    fn max_tokens(&self) -> Option<u64> {
        self.inner.max_tokens
    }
    #[getter]
    fn min_tokens(&self) -> u64 {
        self.inner.min_tokens
    }
    #[getter]
    fn prompt_len(&self) -> u64 {
        self.inner.prompt_len
    }
    #[getter]
    fn max_model_len(&self) -> Option<u64> {
        self.inner.max_model_len
    }
    #[getter]
    fn eos_token_ids(&self) -> Vec<u32> {
        self.inner.eos_token_ids.clone()
    }
    #[getter]
    fn ignore_eos(&self) -> bool {
        self.inner.ignore_eos
    }
    #[getter]
    fn stop_token_ids(&self) -> Vec<u32> {
        self.inner.stop_token_ids.clone()
    }
    #[getter]
    fn stop(&self) -> Vec<String> {
        self.inner
            .stop
            .as_ref()
            .map_or_else(Vec::new, |s| s.stops().to_vec())
    }
    #[getter]
    fn stop_regex(&self) -> Vec<String> {
        self.inner
            .stop_regex
            .as_ref()
            .map_or_else(Vec::new, |s| s.patterns().to_vec())
    }
    #[getter]
    fn include_stop_str_in_output(&self) -> bool {
        self.inner.include_stop_str_in_output
    }
    #[getter]
    fn vocab_size(&self) -> Option<u32> {
        self.inner.vocab_size
    }
    /// `{"max_pattern_size", "min_pattern_size", "min_count"}`, as accepted.
    #[getter]
    fn repetition<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyDict>>> {
        self.inner
            .repetition
            .map(|r| {
                let d = PyDict::new(py);
                d.set_item("max_pattern_size", r.max_pattern_size)?;
                d.set_item("min_pattern_size", r.min_pattern_size)?;
                d.set_item("min_count", r.min_count)?;
                Ok(d)
            })
            .transpose()
    }

    fn __repr__(&self, py: Python<'_>) -> PyResult<String> {
        let p = &self.inner;
        Ok(format!(
            "StopParams(max_tokens={}, min_tokens={}, prompt_len={}, max_model_len={}, eos_token_ids={}, \
             ignore_eos={}, stop_token_ids={}, stop={}, stop_regex={}, include_stop_str_in_output={}, vocab_size={}, \
             repetition={})",
            py_repr(py, p.max_tokens)?,
            p.min_tokens,
            p.prompt_len,
            py_repr(py, p.max_model_len)?,
            py_repr(py, &p.eos_token_ids)?,
            py_repr(py, p.ignore_eos)?,
            py_repr(py, &p.stop_token_ids)?,
            py_repr(py, self.stop())?,
            py_repr(py, self.stop_regex())?,
            py_repr(py, p.include_stop_str_in_output)?,
            py_repr(py, p.vocab_size)?,
            py_repr(py, self.repetition(py)?)?,
        ))
    }
}

/// The state a `StepResult` reports, taken from a tracker.
#[derive(Clone)]
struct Outcome {
    finish: Option<Finish>,
    /// Set when a stop string or regex finished the sequence (boxed: most
    /// outcomes of a batch step are unfinished and stay small).
    stop_text: Option<Box<StopText>>,
    num_tokens: usize,
    text_len: usize,
}

#[derive(Clone)]
struct StopText {
    /// The stop string or stop regex pattern that finished the sequence.
    stop: String,
    /// The text a stop regex matched.
    regex_matched: Option<String>,
}

impl Outcome {
    #[inline(always)]
    fn of(t: &FinishTracker) -> Self {
        let finish = t.finish();
        let stop_text = match finish.and_then(|f| f.matched) {
            Some(Matched::StopString(i)) => Some(Box::new(StopText {
                stop: t.stop_string(i).to_owned(),
                regex_matched: None,
            })),
            Some(Matched::StopRegex(i)) => Some(Box::new(StopText {
                stop: t.stop_regex(i).to_owned(),
                regex_matched: Some(t.regex_matched().to_owned()),
            })),
            _ => None,
        };
        Outcome {
            finish,
            stop_text,
            num_tokens: t.token_ids().len(),
            text_len: t.text_len(),
        }
    }

    fn finish_reason(&self) -> Option<&'static str> {
        self.finish.map(|f| f.reason.as_str())
    }

    fn stop_string(&self) -> Option<&str> {
        self.stop_text.as_ref().map(|s| s.stop.as_str())
    }

    fn stop_reason(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        Ok(match self.finish.and_then(|f| f.stop_reason) {
            None => py.None(),
            Some(StopReason::StopString(_) | StopReason::StopRegex(_)) => {
                self.stop_string().into_py_any(py)?
            }
            Some(StopReason::TokenId(id)) => id.into_py_any(py)?,
            Some(StopReason::RepetitionDetected) => "repetition_detected".into_py_any(py)?,
        })
    }

    fn matched(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        Ok(match self.finish.and_then(|f| f.matched) {
            None => py.None(),
            Some(Matched::StopString(_)) => self.stop_string().into_py_any(py)?,
            Some(Matched::StopRegex(_)) => self
                .stop_text
                .as_ref()
                .and_then(|s| s.regex_matched.as_deref())
                .into_py_any(py)?,
            Some(Matched::TokenId(id)) => id.into_py_any(py)?,
        })
    }
}

/// What one update reported: the state after it and the streaming deltas.
///
/// `num_tokens` counts output tokens kept; `text_len` is the kept text in
/// code points; `text_delta` / `token_ids_delta` are what may be streamed now.
#[pyclass(name = "StepResult", module = "stopline", frozen)]
pub struct PyStepResult {
    outcome: Outcome,
    #[pyo3(get)]
    text_delta: String,
    #[pyo3(get)]
    token_ids_delta: Vec<u32>,
}

impl PyStepResult {
    fn new(t: &FinishTracker, step: &Step) -> Self {
        PyStepResult {
            outcome: Outcome::of(t),
            text_delta: t.text()[step.text_delta.clone()].to_owned(),
            token_ids_delta: t.token_ids()[step.token_ids_delta.clone()].to_vec(),
        }
    }
}

#[pymethods]
impl PyStepResult {
    #[getter]
    fn finished(&self) -> bool {
        self.outcome.finish.is_some()
    }
    #[getter]
    fn finish_reason(&self) -> Option<&'static str> {
        self.outcome.finish_reason()
    }
    #[getter]
    fn stop_reason(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        self.outcome.stop_reason(py)
    }
    #[getter]
    fn matched(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        self.outcome.matched(py)
    }
    #[getter]
    fn num_tokens(&self) -> usize {
        self.outcome.num_tokens
    }
    #[getter]
    fn text_len(&self) -> usize {
        self.outcome.text_len
    }

    fn __repr__(&self, py: Python<'_>) -> PyResult<String> {
        Ok(format!(
            "StepResult(finished={}, finish_reason={}, stop_reason={}, matched={}, num_tokens={}, text_len={}, \
             text_delta={}, token_ids_delta={:?})",
            if self.finished() { "True" } else { "False" },
            self.finish_reason().map_or("None".to_string(), |r| format!("'{r}'")),
            self.stop_reason(py)?.bind(py).repr()?,
            self.matched(py)?.bind(py).repr()?,
            self.outcome.num_tokens,
            self.outcome.text_len,
            PyString::new(py, &self.text_delta).repr()?,
            self.token_ids_delta
        ))
    }
}

/// The finish state of one sequence. Not thread-safe: concurrent use raises
/// instead of corrupting state.
#[pyclass(name = "FinishTracker", module = "stopline")]
pub struct PyFinishTracker {
    inner: FinishTracker,
    /// With a vocabulary: its decoder for ids-only updates.
    detok: Option<(
        Arc<crate::detokenize::Vocabulary>,
        crate::detok_batch::SeqDecoder,
    )>,
}

#[pymethods]
impl PyFinishTracker {
    /// `vocabulary` (a `Vocabulary`) lets `update` take ids without texts;
    /// then `prompt_token_ids` primes its decoder and `skip_special_tokens` /
    /// `spaces_between_special_tokens` are as in vLLM's `SamplingParams`.
    #[new]
    #[pyo3(signature = (params, vocabulary = None, prompt_token_ids = None, skip_special_tokens = true, spaces_between_special_tokens = true))]
    fn new(
        params: &Bound<'_, PyAny>,
        vocabulary: Option<&Bound<'_, PyAny>>,
        prompt_token_ids: Option<&Bound<'_, PyAny>>,
        skip_special_tokens: bool,
        spaces_between_special_tokens: bool,
    ) -> PyResult<Self> {
        let p = params.cast::<PyStopParams>().map_err(|_| {
            PyTypeError::new_err(format!(
                "params must be a stopline.StopParams, got {}",
                type_name(params)
            ))
        })?;
        let vocab = detok::vocabulary_arg(vocabulary)?;
        let dec = detok::seq_decoder(
            vocab.as_ref(),
            &p.get().inner,
            prompt_token_ids,
            skip_special_tokens,
            spaces_between_special_tokens,
        )?;
        Ok(Self {
            inner: FinishTracker::new(Arc::clone(&p.get().inner)).map_err(to_py_err)?,
            detok: vocab.zip(dec),
        })
    }

    /// Appends one decoding step: one token or a speculative accept run.
    ///
    /// `token_ids`: an int or a sequence of ints (the run, in order).
    /// `texts`: one str piece per token as a streaming detokenizer produced it
    /// ("" while a multi-byte character is incomplete); required when the
    /// params have stop strings or regexes. `grammar_terminated_at`: index in
    /// the run of the token that terminated the grammar, if any.
    ///
    /// The run is examined token by token in the order of docs/semantics.md, so
    /// a run of k tokens gives exactly what k one-token updates give; tokens
    /// after the deciding one are dropped. Returns a `StepResult` whose
    /// `text_delta` (code points) and `token_ids_delta` are what may be
    /// streamed now.
    ///
    /// With a vocabulary `texts` must be None: the ids are decoded
    /// (docs/semantics.md section 10).
    ///
    /// Raises `RuntimeError` after the sequence finished; `ValueError` /
    /// `TypeError` for negative or non-int ids, a `texts` length that differs
    /// from the run, missing texts, or `grammar_terminated_at` outside the run.
    /// Nothing changes on error.
    #[pyo3(signature = (token_ids, texts = None, grammar_terminated_at = None))]
    fn update(
        &mut self,
        token_ids: &Bound<'_, PyAny>,
        texts: Option<&Bound<'_, PyAny>>,
        grammar_terminated_at: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<PyStepResult> {
        let ids = extract_ids(token_ids, "token_ids", limits::MAX_STEP_TOKENS)?;

        let g = match opt_list(grammar_terminated_at) {
            None => None,
            Some(g) => Some(extract_int(g, &|| "grammar_terminated_at".into())?),
        };
        let g = match g {
            None => None,
            Some(g) => Some(usize::try_from(g).map_err(|_| {
                PyValueError::new_err(format!(
                    "grammar_terminated_at={g} is outside the run of {} tokens",
                    ids.len()
                ))
            })?),
        };
        if let Some((vocab, dec)) = self.detok.as_mut() {
            if opt_list(texts).is_some() {
                return Err(PyValueError::new_err(
                    "texts must be None: this tracker decodes the ids with its vocabulary",
                ));
            }
            let step = detok::tracker_ids_update(vocab, dec, &mut self.inner, &ids, g)?;
            return Ok(PyStepResult::new(&self.inner, &step));
        }
        let inner = &mut self.inner;
        let step = with_pieces(opt_list(texts), &|i| format!("texts[{i}]"), |pieces, _| {
            inner.update(&ids, pieces, g).map_err(to_py_err)
        })?;
        Ok(PyStepResult::new(&self.inner, &step))
    }

    /// Finishes with "abort" and flushes everything kept; a no-op (empty
    /// deltas) once finished.
    fn abort(&mut self) -> PyStepResult {
        let step = self.inner.abort();
        PyStepResult::new(&self.inner, &step)
    }

    #[getter]
    fn finished(&self) -> bool {
        self.inner.is_finished()
    }
    #[getter]
    fn finish_reason(&self) -> Option<&'static str> {
        self.inner.finish().map(|f| f.reason.as_str())
    }
    #[getter]
    fn stop_reason(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        Outcome::of(&self.inner).stop_reason(py)
    }
    #[getter]
    fn matched(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        Outcome::of(&self.inner).matched(py)
    }
    #[getter]
    fn num_tokens(&self) -> usize {
        self.inner.token_ids().len()
    }
    #[getter]
    fn text_len(&self) -> usize {
        self.inner.text_len()
    }
    /// Output token ids kept (a copy).
    #[getter]
    fn token_ids(&self) -> Vec<u32> {
        self.inner.token_ids().to_vec()
    }
    /// Output text kept.
    #[getter]
    fn text(&self) -> &str {
        self.inner.text()
    }
    /// Code points released through `text_delta` so far.
    #[getter]
    fn emitted_len(&self) -> usize {
        self.inner.emitted_len()
    }

    fn __repr__(&self) -> String {
        format!(
            "FinishTracker(num_tokens={}, text_len={}, finish_reason={})",
            self.inner.token_ids().len(),
            self.inner.text_len(),
            self.finish_reason()
                .map_or("None".to_string(), |r| format!("'{r}'"))
        )
    }
}

/// One row of a batch step; a finished row's outcome is kept aside.
struct BatchRow {
    slot: usize,
    num_tokens: usize,
    text_len: usize,
    /// End of this row's token delta in `tokens` (it starts where the
    /// previous row's ends).
    tokens_end: usize,
}

/// Per-slot results of one `FinishBatch.step`, in the order of its `slots`.
/// List attributes are built on access.
#[pyclass(name = "BatchStepResult", module = "stopline", frozen)]
pub struct PyBatchStepResult {
    rows: Vec<BatchRow>,
    /// `(row, outcome)` of the rows that finished, in row order (few).
    finished: Vec<(usize, Outcome)>,
    /// Each row's text delta, usually the very piece passed in (no copy).
    /// Private: the getter hands out copies of the list.
    text_deltas: Py<PyList>,
    tokens: Vec<u32>,
}

impl PyBatchStepResult {
    fn outcome(&self, i: usize) -> Outcome {
        match self.finished.binary_search_by_key(&i, |(row, _)| *row) {
            Ok(f) => self.finished[f].1.clone(),
            Err(_) => Outcome {
                finish: None,
                stop_text: None,
                num_tokens: self.rows[i].num_tokens,
                text_len: self.rows[i].text_len,
            },
        }
    }

    fn tokens_of(&self, i: usize) -> &[u32] {
        let start = if i == 0 {
            0
        } else {
            self.rows[i - 1].tokens_end
        };
        &self.tokens[start..self.rows[i].tokens_end]
    }

    /// One value per row: `default` but for the finished rows.
    fn per_row<T: Clone>(&self, default: T, of: impl Fn(&Outcome) -> T) -> Vec<T> {
        let mut out = vec![default; self.rows.len()];
        for (i, o) in &self.finished {
            out[*i] = of(o);
        }
        out
    }
}

#[pymethods]
impl PyBatchStepResult {
    fn __len__(&self) -> usize {
        self.rows.len()
    }

    fn __getitem__(&self, py: Python<'_>, index: isize) -> PyResult<PyStepResult> {
        let n = self.rows.len() as isize;
        let i = if index < 0 { index + n } else { index };
        if i < 0 || i >= n {
            return Err(pyo3::exceptions::PyIndexError::new_err(format!(
                "index {index} is out of range for {n} rows"
            )));
        }
        let i = i as usize;
        Ok(PyStepResult {
            outcome: self.outcome(i),
            text_delta: self.text_deltas.bind(py).get_item(i)?.extract::<String>()?,
            token_ids_delta: self.tokens_of(i).to_vec(),
        })
    }

    #[getter]
    fn slots(&self) -> Vec<usize> {
        self.rows.iter().map(|r| r.slot).collect()
    }
    #[getter]
    fn finished_flags(&self) -> Vec<bool> {
        self.per_row(false, |_| true)
    }
    /// Slots that finished in this step.
    #[getter]
    fn finished_slots(&self) -> Vec<usize> {
        self.finished
            .iter()
            .map(|(i, _)| self.rows[*i].slot)
            .collect()
    }
    #[getter]
    fn finish_reasons(&self) -> Vec<Option<&'static str>> {
        self.per_row(None, Outcome::finish_reason)
    }
    #[getter]
    fn stop_reasons(&self, py: Python<'_>) -> PyResult<Vec<Py<PyAny>>> {
        (0..self.rows.len())
            .map(|i| self.outcome(i).stop_reason(py))
            .collect()
    }
    #[getter]
    fn matches(&self, py: Python<'_>) -> PyResult<Vec<Py<PyAny>>> {
        (0..self.rows.len())
            .map(|i| self.outcome(i).matched(py))
            .collect()
    }
    #[getter]
    fn token_counts(&self) -> Vec<usize> {
        self.rows.iter().map(|r| r.num_tokens).collect()
    }
    #[getter]
    fn text_lengths(&self) -> Vec<usize> {
        self.rows.iter().map(|r| r.text_len).collect()
    }
    #[getter]
    fn text_deltas<'py>(&self, py: Python<'py>) -> Bound<'py, PyList> {
        let list = self.text_deltas.bind(py);
        list.get_slice(0, list.len())
    }
    /// Per row, how many output tokens this step released (the length of
    /// its `token_ids_deltas` row, without building the lists).
    #[getter]
    fn released_counts(&self) -> Vec<usize> {
        (0..self.rows.len())
            .map(|i| self.tokens_of(i).len())
            .collect()
    }
    #[getter]
    fn token_ids_deltas(&self) -> Vec<Vec<u32>> {
        (0..self.rows.len())
            .map(|i| self.tokens_of(i).to_vec())
            .collect()
    }

    fn __repr__(&self) -> String {
        format!(
            "BatchStepResult(rows={}, finished_slots={:?})",
            self.rows.len(),
            self.finished_slots()
        )
    }
}

/// Many finish trackers addressed by integer slot, advanced by one call per
/// engine step. Not thread-safe: concurrent use raises.
#[pyclass(name = "FinishBatch", module = "stopline")]
pub struct PyFinishBatch {
    inner: FinishBatch,
    /// With a vocabulary: one decoder per slot, for ids-only steps.
    detok: Option<detok::BatchDetok>,
}

fn opt_list<'a, 'py>(obj: Option<&'a Bound<'py, PyAny>>) -> Option<&'a Bound<'py, PyAny>> {
    obj.filter(|o| !o.is_none())
}

#[pymethods]
impl PyFinishBatch {
    /// `vocabulary` (a `Vocabulary`): `step` then takes token ids without
    /// texts and decodes them itself.
    #[new]
    #[pyo3(signature = (max_slots, vocabulary = None))]
    fn new(max_slots: i64, vocabulary: Option<&Bound<'_, PyAny>>) -> PyResult<Self> {
        let n = usize::try_from(max_slots).map_err(|_| {
            PyValueError::new_err(format!("max_slots must be >= 0, got {max_slots}"))
        })?;
        let inner = FinishBatch::new(n).map_err(to_py_err)?;
        let detok = detok::vocabulary_arg(vocabulary)?.map(|v| detok::BatchDetok::new(v, n));
        Ok(Self { inner, detok })
    }

    /// Starts a sequence in an empty slot. With a vocabulary,
    /// `prompt_token_ids` primes the slot's decoder (decoding continues
    /// after the prompt) and `skip_special_tokens` /
    /// `spaces_between_special_tokens` are as in vLLM's `SamplingParams`.
    #[pyo3(signature = (slot, params, prompt_token_ids = None, skip_special_tokens = true, spaces_between_special_tokens = true))]
    fn add(
        &mut self,
        slot: i64,
        params: &Bound<'_, PyAny>,
        prompt_token_ids: Option<&Bound<'_, PyAny>>,
        skip_special_tokens: bool,
        spaces_between_special_tokens: bool,
    ) -> PyResult<()> {
        let p = params.cast::<PyStopParams>().map_err(|_| {
            PyTypeError::new_err(format!(
                "params must be a stopline.StopParams, got {}",
                type_name(params)
            ))
        })?;
        let dec = detok::seq_decoder(
            self.detok.as_ref().map(|d| d.vocab()),
            &p.get().inner,
            prompt_token_ids,
            skip_special_tokens,
            spaces_between_special_tokens,
        )?;
        self.inner
            .add(slot, Arc::clone(&p.get().inner))
            .map_err(to_py_err)?;
        if let Some(d) = self.detok.as_mut() {
            d.set(slot, dec);
        }
        Ok(())
    }

    /// Frees a slot (finished or not).
    fn remove(&mut self, slot: i64) -> PyResult<()> {
        self.inner.remove(slot).map(drop).map_err(to_py_err)?;
        if let Some(d) = self.detok.as_mut() {
            d.set(slot, None);
        }
        Ok(())
    }

    /// Aborts the sequence in a slot; returns what it flushed.
    fn abort(&mut self, slot: i64) -> PyResult<PyStepResult> {
        let t = self.inner.get_mut(slot).map_err(to_py_err)?;
        let step = t.abort();
        Ok(PyStepResult::new(t, &step))
    }

    /// The current state of a slot (empty deltas).
    fn result(&self, slot: i64) -> PyResult<PyStepResult> {
        let t = self.inner.get(slot).map_err(to_py_err)?;
        let end = t.text().len();
        let n = t.token_ids().len();
        Ok(PyStepResult::new(
            t,
            &Step {
                text_delta: end..end,
                token_ids_delta: n..n,
                whole_run: false,
            },
        ))
    }

    /// Output text kept in a slot.
    fn text(&self, slot: i64) -> PyResult<String> {
        Ok(self.inner.get(slot).map_err(to_py_err)?.text().to_owned())
    }

    /// Output token ids kept in a slot.
    fn token_ids(&self, slot: i64) -> PyResult<Vec<u32>> {
        Ok(self
            .inner
            .get(slot)
            .map_err(to_py_err)?
            .token_ids()
            .to_vec())
    }

    #[getter]
    fn max_slots(&self) -> usize {
        self.inner.max_slots()
    }

    fn __len__(&self) -> usize {
        self.inner.len()
    }

    /// `occupied` is `len(batch)`; `finished` counts the occupied slots whose
    /// sequence finished and awaits `remove()`.
    fn __repr__(&self) -> String {
        let max_slots = self.inner.max_slots();
        let (occupied, finished) = (self.inner.len(), self.inner.finished_len());
        format!("FinishBatch(max_slots={max_slots}, occupied={occupied}, finished={finished})")
    }

    /// Whether `slot` holds a sequence (anything that is not an in-range int
    /// is simply not there).
    fn __contains__(&self, slot: &Bound<'_, PyAny>) -> PyResult<bool> {
        match slot.extract::<i64>() {
            Ok(s) => Ok(self.inner.get(s).is_ok()),
            // An exception from the caller's `__index__` is theirs.
            Err(e) if !is_conversion_error(&e, slot.py()) => Err(e),
            Err(_) => Ok(false),
        }
    }

    /// Advances every listed slot by one engine step.
    ///
    /// `slots[i]` takes `run_lengths[i]` tokens (1 each when None) from the
    /// flat `token_ids`, in the order of `slots`; `texts`, when given, is flat
    /// and aligned with `token_ids` (one piece per token); and
    /// `grammar_terminated_at[i]` is an index into slot i's run or -1 for none.
    /// Each slot advances exactly as `FinishTracker.update` would.
    ///
    /// Fast path (what the hot loop should pass): `slots` a `list` of ints or
    /// a `range` (a persistent batch's rows 0..n), `token_ids` a `list` of
    /// ints or, fastest, a one-dimensional contiguous buffer of native-order
    /// integers (a NumPy int32/int64 array as the sampler returns it, read
    /// without a Python object per id), and `texts` a plain `list` of `str`;
    /// other iterables and int-like objects (numpy integers) work through a
    /// slower general path. A text delta that is exactly the piece passed in
    /// is that very `str` object.
    ///
    /// With a vocabulary (`FinishBatch(n, vocabulary=...)`) `texts` must be
    /// None: each slot's decoder turns the ids into the pieces
    /// (docs/semantics.md section 10); an id outside the vocabulary raises
    /// `ValueError` naming it and its slot.
    ///
    /// Returns a `BatchStepResult` in the order of `slots`. Every argument is
    /// checked before any slot changes, so an error (`ValueError` /
    /// `TypeError` naming the field, element and slot; `RuntimeError` for a
    /// slot that already finished) leaves the whole batch as it was.
    #[pyo3(signature = (slots, token_ids, run_lengths = None, texts = None, grammar_terminated_at = None))]
    fn step(
        &mut self,
        slots: &Bound<'_, PyAny>,
        token_ids: &Bound<'_, PyAny>,
        run_lengths: Option<&Bound<'_, PyAny>>,
        texts: Option<&Bound<'_, PyAny>>,
        grammar_terminated_at: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<PyBatchStepResult> {
        let py = slots.py();
        let slots_v: Vec<i64> = match slots.cast::<PyRange>() {
            Ok(r) => range_values(r, self.inner.max_slots())?,
            Err(_) => extract_i64s(slots, "slots", self.inner.max_slots())?,
        };
        let runs = opt_list(run_lengths)
            .map(|r| {
                extract_i64s(r, "run_lengths", self.inner.max_slots())?
                    .into_iter()
                    .enumerate()
                    .map(|(i, v)| {
                        usize::try_from(v).map_err(|_| {
                            PyValueError::new_err(format!("run_lengths[{i}]={v} must be >= 0"))
                        })
                    })
                    .collect::<PyResult<Vec<usize>>>()
            })
            .transpose()?;
        let grammar = opt_list(grammar_terminated_at)
            .map(|g| extract_i64s(g, "grammar_terminated_at", self.inner.max_slots()))
            .transpose()?;
        // Errors in the flat arrays name the slot that owns the element.
        let owner = |field: &'static str| {
            let (slots_v, runs) = (&slots_v, runs.as_deref());
            move |j: usize| match slot_of(slots_v, runs, j) {
                Some(slot) => format!("{field}[{j}] (slot {slot})"),
                None => format!("{field}[{j}]"),
            }
        };
        let ids = extract_ids_named(
            token_ids,
            "token_ids",
            limits::MAX_STEP_TOKENS,
            &owner("token_ids"),
        )?;
        let texts = opt_list(texts);
        if let Some(dec) = self.detok.as_mut() {
            if texts.is_some() {
                return Err(PyValueError::new_err(
                    "texts must be None: this batch decodes the ids with its vocabulary",
                ));
            }
            return detok::batch_ids_step(
                py,
                &mut self.inner,
                dec,
                &slots_v,
                &ids,
                runs.as_deref(),
                grammar.as_deref(),
            );
        }
        // One piece per slot in a plain list (the decode step): the result's
        // text deltas start as a private copy of that list, and the pieces
        // are read from the copy, which no other code can change.
        if let (None, Some(list)) = (&runs, texts.and_then(|t| t.cast_exact::<PyList>().ok())) {
            // `PySequence_List` allocates the new list before it reads the
            // old one; `PyList_GetSlice` reads first, and a garbage
            // collection started by its allocation could shrink the list
            // under it (a `__del__` may run any code).
            // SAFETY: `list` is a live list; a null result is an error.
            let copy = unsafe {
                Bound::from_owned_ptr_or_err(py, pyo3::ffi::PySequence_List(list.as_ptr()))?
                    .cast_into_unchecked::<PyList>()
            };
            // SAFETY: the views borrow items of `copy`, which only this
            // call holds; `batch_step` replaces item k only after slot k's
            // step, the one step that reads piece k.
            if let Some(strs) = unsafe { list_strs_fast(&copy) } {
                return batch_step(
                    &mut self.inner,
                    &slots_v,
                    &ids,
                    None,
                    Some(&strs),
                    grammar.as_deref(),
                    Deltas::Pieces(copy.clone()),
                );
            }
        }
        // The pieces last (reading ints may call `__index__`, which could
        // change the list); see `with_pieces`.
        let inner = &mut self.inner;
        // Created before `with_pieces` borrows the pieces: creating a list
        // can start a garbage collection, which may run code that changes
        // the caller's list.
        let fresh = PyList::empty(py);
        with_pieces(texts, &owner("texts"), |pieces, objects| {
            let deltas = Deltas::Fresh(objects, fresh);
            batch_step(
                inner,
                &slots_v,
                &ids,
                runs.as_deref(),
                pieces,
                grammar.as_deref(),
                deltas,
            )
        })
    }
}

/// Where a batch step's text deltas go.
enum Deltas<'a, 'py> {
    /// One piece per slot: a copy of the pieces list, in which rows whose
    /// delta is not exactly their piece are replaced.
    Pieces(Bound<'py, PyList>),
    /// An empty list that every row's delta is appended to; a one-token row
    /// whose delta is exactly its piece appends that piece's object.
    Fresh(&'a [Borrowed<'a, 'py, PyAny>], Bound<'py, PyList>),
}

/// Runs one `FinishBatch` step and builds its Python result.
fn batch_step<'py>(
    inner: &mut FinishBatch,
    slots: &[i64],
    ids: &[u32],
    runs: Option<&[usize]>,
    pieces: Option<&[&str]>,
    grammar: Option<&[i64]>,
    deltas: Deltas<'_, 'py>,
) -> PyResult<PyBatchStepResult> {
    let mut rows = Vec::with_capacity(slots.len());
    let mut tokens = Vec::with_capacity(ids.len());
    let mut finished = Vec::new();
    let mut failed = None;
    let py = match &deltas {
        Deltas::Pieces(l) | Deltas::Fresh(_, l) => l.py(),
    };
    inner
        .step_each(slots, ids, runs, pieces, grammar, |k, t, s| {
            let whole_one = s.step.whole_run && s.run.len() == 1;
            let text = || PyString::new(py, &t.text()[s.step.text_delta.clone()]);
            let r = match &deltas {
                Deltas::Pieces(_) if whole_one => Ok(()),
                Deltas::Pieces(list) => list.set_item(k, text()),
                Deltas::Fresh(objects, list) if whole_one && !objects.is_empty() => {
                    list.append(objects[s.run.start])
                }
                Deltas::Fresh(_, list) => list.append(text()),
            };
            if let Err(e) = r {
                failed.get_or_insert(e);
            }
            let delta = &t.token_ids()[s.step.token_ids_delta.clone()];
            if let [id] = delta {
                tokens.push(*id);
            } else {
                tokens.extend_from_slice(delta);
            }
            if t.is_finished() {
                finished.push((k, Outcome::of(t)));
            }
            rows.push(BatchRow {
                slot: s.slot,
                num_tokens: t.token_ids().len(),
                text_len: t.text_len(),
                tokens_end: tokens.len(),
            });
        })
        .map_err(to_py_err)?;
    if let Some(e) = failed {
        return Err(e);
    }
    let (Deltas::Pieces(list) | Deltas::Fresh(_, list)) = deltas;
    Ok(PyBatchStepResult {
        rows,
        finished,
        text_deltas: list.unbind(),
        tokens,
    })
}

/// Runs `f` on the text pieces of `texts` (one `str` per token) as UTF-8
/// views, each with its `str` object, or on `None` without texts.
///
/// A plain list is read through the C API without taking a reference per
/// item: the views borrow the list's items, which is sound because nothing in
/// `f` runs Python code that could change the list (the core never calls
/// back into Python, and `f` must not allocate a garbage-collected object,
/// which can start a collection that runs arbitrary `__del__` code) and `f`
/// cannot keep the views. Anything else, or an item that is not a valid
/// `str`, goes through `extract_piece_objects`, whose errors name the element
/// with `name(i)`.
fn with_pieces<'py, R>(
    texts: Option<&Bound<'py, PyAny>>,
    name: &dyn Fn(usize) -> String,
    mut f: impl FnOnce(Option<&[&str]>, &[Borrowed<'_, 'py, PyAny>]) -> PyResult<R>,
) -> PyResult<R> {
    let Some(texts) = texts else {
        return f(None, &[]);
    };
    if let Ok(list) = texts.cast_exact::<PyList>() {
        if list.len() > limits::MAX_STEP_TOKENS {
            return Err(over_cap("texts", Some(list.len()), limits::MAX_STEP_TOKENS));
        }
        // Without the GIL (a free-threaded build) another thread could change
        // the list while the views borrow its items: the list's critical
        // section keeps it still (a no-op on a GIL build).
        let mut f_once = Some(f);
        let done = pyo3::sync::critical_section::with_critical_section(list.as_any(), || {
            // SAFETY: the views and items are used only inside `f` (see above).
            let strs = unsafe { list_strs_fast(list) }?;
            let items: Vec<Borrowed<'_, 'py, PyAny>> = (0..strs.len())
                // SAFETY: in bounds, and the list is unchanged since; the
                // items are borrowed like the views.
                .map(|i| unsafe {
                    Borrowed::from_ptr(
                        list.py(),
                        pyo3::ffi::PyList_GetItem(list.as_ptr(), i as pyo3::ffi::Py_ssize_t),
                    )
                })
                .collect();
            f_once.take().map(|f| f(Some(&strs), &items))
        });
        match (done, f_once.take()) {
            (Some(result), _) => return result,
            (None, Some(g)) => f = g,
            // `f` is taken only to run it, which gives a result.
            (None, None) => return Err(PyRuntimeError::new_err("internal: pieces lost")),
        }
    }
    // Pieces of a `str` subclass are handed on as plain `str` copies.
    let held: Vec<Bound<'py, PyString>> = extract_piece_objects(texts, "texts", name)?
        .into_iter()
        .map(|s| {
            if s.is_exact_instance_of::<PyString>() {
                Ok(s)
            } else {
                Ok(PyString::new(s.py(), s.to_str()?))
            }
        })
        .collect::<PyResult<_>>()?;
    let strs = held
        .iter()
        .map(|s| s.to_str())
        .collect::<PyResult<Vec<&str>>>()?;
    let items: Vec<Borrowed<'_, 'py, PyAny>> =
        held.iter().map(|s| s.as_any().as_borrowed()).collect();
    f(Some(&strs), &items)
}

/// The values of a `range` (any step). One longer than `max_slots` cannot
/// hold distinct slots in range, and is refused before it is materialized.
fn range_values(r: &Bound<'_, PyRange>, max_slots: usize) -> PyResult<Vec<i64>> {
    let n = r.len().ok().filter(|&n| n <= max_slots).ok_or_else(|| {
        let shown = r.repr().map(|s| s.to_string()).unwrap_or_default();
        PyValueError::new_err(format!(
            "slots={shown} has more entries than max_slots={max_slots}"
        ))
    })?;
    let out_of_range = |_| {
        let shown = r.repr().map(|s| s.to_string()).unwrap_or_default();
        PyValueError::new_err(format!("slots={shown} is out of range"))
    };
    let (start, step) = (
        r.start().map_err(out_of_range)?,
        r.step().map_err(out_of_range)?,
    );
    // start and step fit isize, and n <= max_slots, so no value overflows i64
    // unless the range does; such a slot is out of range for the batch anyway.
    let (start, step) = (start as i64, step as i64);
    let last = (n as i64 - 1)
        .max(0)
        .checked_mul(step)
        .and_then(|d| start.checked_add(d));
    Ok(match last {
        // No value overflows: a plain loop the compiler vectorizes.
        Some(_) => (0..n as i64).map(|k| start + k * step).collect(),
        None => (0..n as i64)
            .map(|k| start.saturating_add(k.saturating_mul(step)))
            .collect(),
    })
}

/// The ints of a list, read through the C API without taking a reference per
/// element (the hot path of `FinishBatch.step`). `None` when an element is
/// not an int or `conv` rejects it; the caller's slow path then names it.
/// `out` comes with room for the list's items ([`try_vec`]).
fn list_ints_fast<T>(
    list: &Bound<'_, PyList>,
    conv: impl Fn(i64) -> Option<T>,
    out: Vec<T>,
) -> Option<Vec<T>> {
    // Items are borrowed one at a time: on a free-threaded build the list's
    // critical section keeps other threads from freeing them meanwhile.
    pyo3::sync::critical_section::with_critical_section(list.as_any(), || {
        list_ints_locked(list, conv, out)
    })
}

fn list_ints_locked<T>(
    list: &Bound<'_, PyList>,
    conv: impl Fn(i64) -> Option<T>,
    mut out: Vec<T>,
) -> Option<Vec<T>> {
    use pyo3::ffi;
    let n = list.len();
    for i in 0..n {
        // SAFETY: the list is alive for the call; PyList_GetItem bounds-checks
        // and returns a borrowed reference; PyLong_AsLongAndOverflow on an
        // int (or int subclass) runs no Python code.
        let v = unsafe {
            let item = ffi::PyList_GetItem(list.as_ptr(), i as ffi::Py_ssize_t);
            if item.is_null() {
                ffi::PyErr_Clear();
                return None;
            }
            // The exact check is inline; the subclass check is a call.
            if ffi::PyLong_CheckExact(item) == 0 && ffi::PyLong_Check(item) == 0 {
                return None;
            }
            let mut overflow = 0;
            let v = ffi::PyLong_AsLongAndOverflow(item, &mut overflow);
            if overflow != 0 {
                return None;
            }
            if v == -1 && !ffi::PyErr_Occurred().is_null() {
                ffi::PyErr_Clear();
                return None;
            }
            v as i64
        };
        out.push(conv(v)?);
    }
    Some(out)
}

/// The str items of a list as borrowed UTF-8. `None` when an item is not a
/// str or not valid Unicode; the caller's slow path then names it.
///
/// # Safety
/// The strs borrow the list's items: they stay valid only while no Python
/// code runs (which could change the list) and the list is alive.
unsafe fn list_strs_fast<'a>(list: &'a Bound<'_, PyList>) -> Option<Vec<&'a str>> {
    use pyo3::ffi;
    let n = list.len();
    let mut strs = Vec::with_capacity(n);
    for i in 0..n {
        let item = ffi::PyList_GetItem(list.as_ptr(), i as ffi::Py_ssize_t);
        if item.is_null() {
            ffi::PyErr_Clear();
            return None;
        }
        if ffi::PyUnicode_CheckExact(item) == 0 {
            return None;
        }
        let mut size: ffi::Py_ssize_t = 0;
        let data = ffi::PyUnicode_AsUTF8AndSize(item, &mut size);
        if data.is_null() {
            ffi::PyErr_Clear();
            return None;
        }
        // PyUnicode_AsUTF8AndSize returns valid UTF-8 that lives as long as
        // the str object.
        strs.push(std::str::from_utf8_unchecked(std::slice::from_raw_parts(
            data.cast::<u8>(),
            size as usize,
        )));
    }
    Some(strs)
}

/// At most `cap` ints (a longer sequence is refused naming `field`).
fn extract_i64s(obj: &Bound<'_, PyAny>, field: &str, cap: usize) -> PyResult<Vec<i64>> {
    let one = |item: &Bound<'_, PyAny>, i: usize| -> PyResult<i64> {
        extract_int(item, &|| format!("{field}[{i}]"))
    };
    if let Ok(list) = obj.cast_exact::<PyList>() {
        if list.len() > cap {
            return Err(over_cap(field, Some(list.len()), cap));
        }
        if let Some(v) = list_ints_fast(list, Some, try_vec(list.len(), field)?) {
            return Ok(v);
        }
        let mut out = try_vec(list.len(), field)?;
        for (i, item) in list.iter().enumerate() {
            out.push(one(&item, i)?);
        }
        return Ok(out);
    }
    if let Some(v) = buffer_i64s(obj, field, cap)? {
        return Ok(v);
    }
    known_len(obj, cap, &|n| over_cap(field, n, cap))?;
    iter_of(obj, field, "a sequence of ints")?
        .enumerate()
        .map(|(i, x)| {
            if i == cap {
                return Err(over_cap(field, None, cap));
            }
            one(&x?, i)
        })
        .collect()
}

/// The ints of a one-dimensional, C-contiguous buffer of native-order
/// integers (a NumPy int32/int64/uint32 array, `array.array`, `bytes`),
/// read in one pass with no Python object per element. `None` when `obj`
/// exports no such buffer (or a uint64 above `i64::MAX`); the caller's
/// general path then iterates `obj` and names any bad element.
fn buffer_i64s(obj: &Bound<'_, PyAny>, field: &str, cap: usize) -> PyResult<Option<Vec<i64>>> {
    let Some(buf) = native_int_buffer(obj) else {
        return Ok(None);
    };
    if buf.item_count() > cap {
        return Err(over_cap(field, Some(buf.item_count()), cap));
    }
    Ok(read_int_buffer(&buf, try_vec(buf.item_count(), field)?))
}

/// `obj`'s buffer when it is one-dimensional, C-contiguous, aligned and of
/// native-order integers, the kind [`read_int_buffer`] reads.
fn native_int_buffer(obj: &Bound<'_, PyAny>) -> Option<pyo3::buffer::PyUntypedBuffer> {
    use pyo3::buffer::PyUntypedBuffer;
    // SAFETY: a type check; it runs no Python code.
    if unsafe { pyo3::ffi::PyObject_CheckBuffer(obj.as_ptr()) } == 0 {
        return None;
    }
    let buf = PyUntypedBuffer::get(obj).ok()?;
    let format = buf.format().to_bytes();
    // 'c' items are one-byte `bytes` objects, not ints.
    if format.last() == Some(&b'c') {
        return None;
    }
    let order = format.first().copied();
    let native = matches!(order, Some(b'@' | b'=' | b'a'..=b'z' | b'A'..=b'Z'))
        || (cfg!(target_endian = "little") && order == Some(b'<'));
    if buf.dimensions() != 1 || !buf.is_c_contiguous() || !native {
        return None;
    }
    // A buffer may start at any byte (`np.frombuffer(..., offset=1)`); the
    // slices read need their items aligned, so such a buffer goes the
    // general way. Every item size here is its type's alignment.
    if (buf.buf_ptr() as usize) % buf.item_size().max(1) != 0 {
        return None;
    }
    Some(buf)
}

/// The ints of a buffer accepted by [`native_int_buffer`]; `None` for an
/// element type it does not read (or a uint64 above `i64::MAX`).
/// `out` comes with room for the buffer's items ([`try_vec`]).
fn read_int_buffer(buf: &pyo3::buffer::PyUntypedBuffer, out: Vec<i64>) -> Option<Vec<i64>> {
    use pyo3::buffer::ElementType;
    let (n, ptr) = (buf.item_count(), buf.buf_ptr());
    fn widen<E: Copy + Into<i64>>(
        ptr: *mut std::ffi::c_void,
        n: usize,
        mut out: Vec<i64>,
    ) -> Vec<i64> {
        // SAFETY: the exporter guarantees `n` contiguous, aligned items of
        // this type at `ptr` while the buffer is held (by the caller), and
        // nothing here runs Python code that could resize it.
        let items = unsafe { std::slice::from_raw_parts(ptr as *const E, n) };
        out.extend(items.iter().map(|&e| e.into()));
        out
    }
    Some(
        match (ElementType::from_format(buf.format()), buf.item_size()) {
            (ElementType::SignedInteger { bytes: 8 }, 8) => widen::<i64>(ptr, n, out),
            (ElementType::SignedInteger { bytes: 4 }, 4) => widen::<i32>(ptr, n, out),
            (ElementType::SignedInteger { bytes: 2 }, 2) => widen::<i16>(ptr, n, out),
            (ElementType::SignedInteger { bytes: 1 }, 1) => widen::<i8>(ptr, n, out),
            (ElementType::UnsignedInteger { bytes: 8 }, 8) => {
                // SAFETY: as in `widen`.
                let items = unsafe { std::slice::from_raw_parts(ptr as *const u64, n) };
                if items.iter().any(|&e| e > i64::MAX as u64) {
                    return None;
                }
                let mut out = out;
                out.extend(items.iter().map(|&e| e as i64));
                out
            }
            (ElementType::UnsignedInteger { bytes: 4 }, 4) => widen::<u32>(ptr, n, out),
            (ElementType::UnsignedInteger { bytes: 2 }, 2) => widen::<u16>(ptr, n, out),
            (ElementType::UnsignedInteger { bytes: 1 }, 1) => widen::<u8>(ptr, n, out),
            _ => return None,
        },
    )
}

/// [`buffer_i64s`] for token ids: `None` also when one is outside `u32`.
fn buffer_ids(obj: &Bound<'_, PyAny>, field: &str, cap: usize) -> PyResult<Option<Vec<u32>>> {
    let Some(v) = buffer_i64s(obj, field, cap)? else {
        return Ok(None);
    };
    // Two branch-free passes the compiler vectorizes.
    if v.iter().any(|&x| u32::try_from(x).is_err()) {
        return Ok(None);
    }
    let mut out = try_vec(v.len(), field)?;
    out.extend(v.iter().map(|&x| x as u32));
    Ok(Some(out))
}

/// Maps stopline's finish_reason to the OpenAI API's: "stop" becomes
/// "tool_calls" when the response carries parsed tool calls (as vLLM's
/// OpenAI server does); other reasons pass through.
#[pyfunction]
#[pyo3(signature = (finish_reason, has_tool_calls = false))]
fn to_openai_finish_reason(
    finish_reason: Option<&str>,
    has_tool_calls: bool,
) -> PyResult<Option<&'static str>> {
    Ok(match finish_reason {
        None => None,
        Some("stop") if has_tool_calls => Some("tool_calls"),
        Some("stop") => Some("stop"),
        Some("length") => Some("length"),
        Some("abort") => Some("abort"),
        Some("error") => Some("error"),
        Some("repetition") => Some("repetition"),
        Some(other) => {
            return Err(PyValueError::new_err(format!(
                "finish_reason={other:?} is not one of 'stop', 'length', 'abort', 'error', 'repetition'"
            )))
        }
    })
}
