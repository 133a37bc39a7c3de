//! Core errors to Python exceptions, in one place: which exception type each
//! variant becomes. The messages are the core's (`crate::error`) or, for
//! arguments the binding checks itself, `convert`'s.

use pyo3::create_exception;
use pyo3::exceptions::{PyMemoryError, PyRuntimeError, PyTypeError, PyValueError};
use pyo3::PyErr;

use crate::error::{Error, Problem};

create_exception!(
    stopline,
    SequenceFinishedError,
    PyRuntimeError,
    "Raised by `FinishTracker.update` / `FinishBatch.step` for a sequence that \
     already finished. A `RuntimeError` subclass: engines catch it by type \
     (docs/errors.md)."
);

pub(super) fn to_py_err(e: Error) -> PyErr {
    match e {
        Error::Finished { .. } | Error::SlotFinished { .. } => {
            SequenceFinishedError::new_err(e.to_string())
        }
        Error::Alloc { .. } => PyMemoryError::new_err(e.to_string()),
        _ => PyValueError::new_err(e.to_string()),
    }
}

/// The binding's own argument errors, whose field is known only at run time
/// (`token_ids[3] (slot 2)`): rendered by the core's [`Problem`], a
/// `TypeError` for a wrong type and a `ValueError` otherwise.
pub(super) fn arg_err(field: &str, problem: Problem) -> PyErr {
    let message = problem.about(field);
    match problem {
        Problem::WrongType { .. }
        | Problem::IdNotInt { .. }
        | Problem::NotASequence { .. }
        | Problem::SingleStr { .. } => PyTypeError::new_err(message),
        _ => PyValueError::new_err(message),
    }
}
