//! Stop strings and stop regexes: the compiled lists (`StopStrings`,
//! `StopRegexes`), their per-sequence matchers (one macro for both), the
//! match they report, and vLLM's stateless `check_stop_strings`.

use std::sync::Arc;

use pyo3::prelude::*;
use pyo3::types::{PyString, PyTuple};

use super::convert::{
    detach_if, extract_i64_arg, extract_str, extract_utf8, py_repr, single_str_err, take_capped,
    Entries, DETACH_TEXT_BYTES,
};
use super::errors::{arg_err, not_picklable, to_py_err};
use crate::error::{Error, Problem};
use crate::limits;
use crate::stop_regex::{StopRegexMatcher as CoreRegexMatcher, StopRegexes as CoreRegexes};
use crate::stop_strings::{
    StopMatch as CoreMatch, StopMatcher as CoreMatcher, StopStrings as CoreStops,
};

/// A compiled `StopStrings` is reused as is; any other sequence of `str`
/// (list, tuple or any iterable; a bare `str` is rejected so "STOP" is not
/// read as ['S', 'T', 'O', 'P']) is compiled through the cache, which a list
/// it has seen leaves without copying a string.
pub(super) fn compile_stops(obj: &Bound<'_, PyAny>, field: &str) -> PyResult<Arc<CoreStops>> {
    if let Ok(compiled) = obj.cast::<PyStopStrings>() {
        return Ok(Arc::clone(&compiled.get().inner));
    }
    if obj.is_instance_of::<PyString>() {
        return Err(single_str_err(field, obj));
    }
    let items = take_capped(obj, field, "a sequence of str", limits::MAX_STOP_STRINGS)?;
    let mut stops = Vec::with_capacity(items.len());
    let mut bytes = 0;
    for (i, item) in items.iter().enumerate() {
        let s = extract_utf8(item, &|| format!("{field}[{i}]"))?;
        if s.is_empty() {
            return Err(arg_err(&format!("{field}[{i}]"), Problem::EmptyStop));
        }
        bytes += s.len();
        if bytes > limits::MAX_STOP_BYTES {
            return Err(too_many_bytes(field, limits::MAX_STOP_BYTES));
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

/// A list whose strings total more than `cap` bytes (counting stops there).
fn too_many_bytes(field: &str, cap: usize) -> PyErr {
    arg_err(field, Problem::TooManyBytes { n: None, cap })
}

/// Compiles a sequence of regex patterns (a bare `str` is rejected, as for
/// stop strings); errors name `stop_regex[i]` and the pattern.
pub(super) fn compile_regexes(obj: &Bound<'_, PyAny>) -> PyResult<Arc<CoreRegexes>> {
    if obj.is_instance_of::<PyString>() {
        return Err(single_str_err("stop_regex", obj));
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
            return Err(too_many_bytes("stop_regex", limits::MAX_STOP_REGEX_BYTES));
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

/// A compiled-list class (`StopStrings`, `StopRegexes`): built by
/// `$compile`, its entries read back through the core method `$entries`
/// (also the constructor's argument name), matchers of class `$matcher`;
/// `$extra` are the class's own methods.
macro_rules! compiled_list_class {
    (
        $(#[$doc:meta])*
        $py:ident, $name:literal, $core:ty, $matcher:ident,
        compile: $compile:expr,
        $entries:ident: $entries_doc:literal,
        { $($extra:tt)* }
    ) => {
        $(#[$doc])*
        #[pyclass(name = $name, module = "stopline", frozen)]
        pub struct $py {
            inner: Arc<$core>,
        }

        #[pymethods]
        impl $py {
            #[new]
            fn new($entries: &Bound<'_, PyAny>) -> PyResult<Self> {
                Ok(Self {
                    inner: ($compile)($entries)?,
                })
            }

            /// A fresh per-sequence incremental matcher.
            #[pyo3(signature = (include_in_output = false))]
            fn matcher(
                &self,
                #[pyo3(from_py_with = crate::python::convert::flags::include_in_output)] include_in_output: bool,
            ) -> $matcher {
                $matcher {
                    inner: self.inner.matcher(include_in_output),
                }
            }

            #[doc = $entries_doc]
            #[getter]
            fn $entries<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyTuple>> {
                PyTuple::new(py, self.inner.$entries())
            }

            fn __len__(&self) -> usize {
                self.inner.len()
            }

            fn __repr__(&self, py: Python<'_>) -> PyResult<String> {
                Ok(format!("{}({})", $name, py_repr(py, self.inner.$entries())?))
            }

            /// Pickling (protocol 2 and up, `copy`): the entries, compiled again
            /// when unpickled.
            fn __getnewargs__<'py>(&self, py: Python<'py>) -> PyResult<(Bound<'py, PyTuple>,)> {
                Ok((PyTuple::new(py, self.inner.$entries())?,))
            }

            $($extra)*
        }

        impl Entries for $core {
            fn entries(&self) -> &[String] {
                self.$entries()
            }
        }
    };
}

compiled_list_class!(
    /// A compiled, immutable list of stop regexes (Rust regex syntax, one DFA),
    /// shared between sequences and threads. Identical lists reuse one DFA.
    PyStopRegexes, "StopRegexes", CoreRegexes, PyStopRegexMatcher,
    compile: compile_regexes,
    patterns: "The patterns, in list order.",
    {
        /// Heap bytes of the compiled DFA.
        #[getter]
        fn memory_usage(&self) -> usize {
            self.inner.memory_usage()
        }
    }
);

compiled_list_class!(
    /// A compiled, immutable list of stop strings (Aho-Corasick, standard match
    /// semantics), shared between sequences and threads. Identical lists reuse one
    /// compiled automaton.
    PyStopStrings, "StopStrings", CoreStops, PyStopMatcher,
    compile: |stops| compile_stops(stops, "stop"),
    stops: "The stop strings, in list order.",
    {
        /// Stateless check in the shape of vLLM's `check_stop_strings`.
        #[pyo3(signature = (output_text, new_char_count, include_in_output = false))]
        fn check<'py>(
            &self,
            py: Python<'py>,
            output_text: &Bound<'py, PyAny>,
            new_char_count: &Bound<'py, PyAny>,
            #[pyo3(from_py_with = crate::python::convert::flags::include_in_output)] include_in_output: bool,
        ) -> PyResult<Option<Bound<'py, PyTuple>>> {
            check_impl(py, &self.inner, output_text, new_char_count, include_in_output)
        }

        /// Length of the longest stop string, in code points.
        #[getter]
        fn max_stop_len(&self) -> usize {
            self.inner.max_stop_chars()
        }
    }
);

fn check_impl<'py>(
    py: Python<'py>,
    stops: &CoreStops,
    output_text: &Bound<'py, PyAny>,
    new_char_count: &Bound<'py, PyAny>,
    include_in_output: bool,
) -> PyResult<Option<Bound<'py, PyTuple>>> {
    let new_char_count = extract_i64_arg(new_char_count, "new_char_count")?;
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

/// A per-sequence matcher class over a compiled list: the same Python API
/// for stop strings and stop regexes. `$names` gives the list's entries
/// (what `StopMatch.stop` reports).
macro_rules! matcher_class {
    ($py:ident, $name:literal, $core:ty, $over:literal, $feed_doc:literal, $names:expr) => {
        #[doc = concat!("Per-sequence incremental state over a `", $over, "`. Not thread-safe:")]
        /// concurrent use raises instead of corrupting state.
        #[pyclass(name = $name, module = "stopline")]
        pub struct $py {
            inner: $core,
        }

        #[pymethods]
        impl $py {
            #[doc = $feed_doc]
            fn feed(&mut self, delta: &Bound<'_, PyAny>) -> PyResult<Option<PyStopMatch>> {
                let (text, chars) = extract_str(delta, &|| "delta".into())?;
                let inner = &mut self.inner;
                let long = text.len() >= DETACH_TEXT_BYTES;
                let hit = detach_if(delta.py(), long, || inner.feed_counted(text, chars));
                let names: fn(&$core) -> &[String] = $names;
                Ok(hit.map(|m| PyStopMatch::from_core(m, names(&self.inner))))
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

            /// Whether a match's text is kept in the output (`truncate_to`
            /// is then its end).
            #[getter]
            fn include_in_output(&self) -> bool {
                self.inner.include_in_output()
            }

            /// Forgets all text fed.
            fn reset(&mut self) {
                self.inner.reset()
            }

            /// Refused on every protocol: it is one sequence's streaming state.
            fn __reduce__(&self) -> PyResult<()> {
                Err(not_picklable($name, "it is one sequence's streaming state; pickle the StopStrings or StopRegexes and call .matcher() in the receiving process"))
            }

            fn __repr__(&self) -> String {
                format!(
                    "{}(chars_fed={}, holdback={}, include_in_output={})",
                    $name,
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
    };
}

matcher_class!(
    PyStopMatcher,
    "StopMatcher",
    CoreMatcher,
    "StopStrings",
    "Feeds the next text piece; returns the earliest stop string that ends\n\
     inside it (ties: lowest list index), or None.",
    |m| m.stop_strings().stops()
);

matcher_class!(
    PyStopRegexMatcher,
    "StopRegexMatcher",
    CoreRegexMatcher,
    "StopRegexes",
    "Feeds the next text piece; returns the match that ends earliest inside\n\
     it (ties: lowest list index; then the leftmost start), or None. `stop`\n\
     is the pattern.",
    |m| m.regexes().patterns()
);

/// A stop string match; offsets are code points of the cumulative text.
#[pyclass(name = "StopMatch", module = "stopline", frozen, eq)]
#[derive(Clone, PartialEq)]
pub struct PyStopMatch {
    /// Position of the stop in its list (`StopStrings.stops` or `StopRegexes.patterns`).
    #[pyo3(get)]
    index: usize,
    /// The stop string; for a `StopRegexMatcher`, the pattern (not the matched text, which
    /// is `text[start:end]`).
    #[pyo3(get)]
    stop: String,
    /// Code-point offset of the first character of the match; it may lie in text fed by
    /// earlier `feed` calls.
    #[pyo3(get)]
    start: usize,
    /// Code-point offset just past the match (exclusive); always inside the `delta` of the
    /// `feed` that returned it.
    #[pyo3(get)]
    end: usize,
    /// Code-point length to cut the output text to: `end` when the matcher includes the
    /// stop in the output, else `start` (semantics.md 2, 6.8).
    #[pyo3(get)]
    truncate_to: usize,
}

impl PyStopMatch {
    fn from_core(m: CoreMatch, names: &[String]) -> Self {
        Self {
            index: m.index,
            stop: names[m.index].clone(),
            start: m.start,
            end: m.end,
            truncate_to: m.truncate_to,
        }
    }
}

#[pymethods]
impl PyStopMatch {
    /// Refused on every protocol: it is one step's result.
    fn __reduce__(&self) -> PyResult<()> {
        Err(not_picklable(
            "StopMatch",
            "it is one step's result; send its fields (index, stop, start, end, truncate_to)",
        ))
    }

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
pub(super) fn check_stop_strings<'py>(
    py: Python<'py>,
    output_text: &Bound<'py, PyAny>,
    new_char_count: &Bound<'py, PyAny>,
    stop: &Bound<'py, PyAny>,
    #[pyo3(from_py_with = crate::python::convert::flags::include_in_output)]
    include_in_output: bool,
) -> PyResult<Option<Bound<'py, PyTuple>>> {
    let stops = compile_stops(stop, "stop")?;
    check_impl(py, &stops, output_text, new_char_count, include_in_output)
}
