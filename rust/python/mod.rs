//! The PyO3 binding: converts Python values to core types and maps core errors
//! to Python exceptions. No semantics live here.
//!
//! * `convert`: every extraction helper and its messages.
//! * `ffi`: raw C-API access, the binding's only `unsafe`, under one contract.
//! * `errors`: which Python exception each core error becomes.
//! * `matchers`: `StopStrings` / `StopRegexes` and their matchers.
//! * `params`, `tracker`, `batch`, `detok`, `openai`: one Python API each.
//! * `logits`: the host-side reading of `stopline.logits`' bad words.

/// `#[pymethods]` of a class with a documented getter for each listed field
/// of `self.$inner`, read through `convert::ReadAs` (a copy, a clone, a
/// compiled list's entries), before the class's other methods.
macro_rules! pymethods_with_getters {
    (
        impl $class:ty {
            getters of $inner:ident {
                $( $(#[doc = $doc:literal])+ $field:ident: $ty:ty, )*
            }
            $($methods:tt)*
        }
    ) => {
        #[pymethods]
        impl $class {
            $(
                $(#[doc = $doc])+
                #[getter]
                fn $field(&self) -> $ty {
                    $crate::python::convert::ReadAs::read_as(&self.$inner.$field)
                }
            )*
            $($methods)*
        }
    };
}

mod batch;
mod convert;
mod detok;
mod errors;
#[allow(unsafe_code)]
mod ffi;
mod logits;
mod matchers;
mod openai;
mod params;
mod result;
mod tracker;

use pyo3::prelude::*;
use pyo3::types::{PyDict, PyTuple};

use crate::limits;

/// Test hook, not API: panics inside the binding layer so the tests can show
/// that PyO3 turns a Rust panic into a Python exception
/// (`pyo3_runtime.PanicException`) instead of crashing the interpreter
/// (`tests/test_errors.py::test_a_rust_panic_is_a_python_exception`). Built
/// only with the `test-hooks` feature (docs/reliability.md).
#[cfg(feature = "test-hooks")]
#[pyfunction]
fn _panic_for_tests(message: &str) -> PyResult<()> {
    panic!("{message}")
}

/// Adds each class to the module.
macro_rules! add_classes {
    ($m:ident, $($class:ty),* $(,)?) => {
        $($m.add_class::<$class>()?;)*
    };
}

// The fast paths read a caller's list items without taking references only
// under the list's critical section (the GIL's job on a GIL build) or from a
// private copy (`ffi`), and the compiled lists and caches are immutable or
// behind a Mutex: the module is safe without the GIL. (The default abi3
// wheel does not load on a free-threaded CPython; this matters for source
// builds. docs/reliability.md, "Threads".)
#[pymodule(gil_used = false)]
fn _core(m: &Bound<'_, PyModule>) -> PyResult<()> {
    add_classes!(
        m,
        matchers::PyStopStrings,
        matchers::PyStopMatcher,
        matchers::PyStopMatch,
        matchers::PyStopRegexes,
        matchers::PyStopRegexMatcher,
        params::PyStopParams,
        result::PyStepResult,
        tracker::PyFinishTracker,
        batch::PyBatchStepResult,
        batch::PyFinishBatch,
        detok::PyVocabulary,
        detok::PyIncrementalDecoder,
    );
    m.add_function(wrap_pyfunction!(matchers::check_stop_strings, m)?)?;
    m.add_function(wrap_pyfunction!(openai::to_openai_finish_reason, m)?)?;
    m.add_function(wrap_pyfunction!(logits::_bad_words_table, m)?)?;
    #[cfg(feature = "test-hooks")]
    m.add_function(wrap_pyfunction!(_panic_for_tests, m)?)?;
    m.add_function(wrap_pyfunction!(errors::_problem, m)?)?;
    for (name, class) in errors::classes(m.py()) {
        for attr in ["field", "slot", "kind"] {
            class.setattr(attr, m.py().None())?;
        }
        m.add(name, class)?;
    }
    m.add(
        "FINISH_REASONS",
        PyTuple::new(m.py(), openai::finish_reasons())?,
    )?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    // Both caps tables are the core's (`rust/limits.rs`); `stopline.logits`
    // re-exports the second as its `LIMITS`.
    for (attr, table) in [("LIMITS", limits::ALL), ("LOGITS_LIMITS", limits::LOGITS)] {
        let caps = PyDict::new(m.py());
        for (name, value) in table {
            caps.set_item(name, value)?;
        }
        m.add(attr, caps)?;
    }
    Ok(())
}
