//! Core errors to Python exceptions, in one place: which exception type each
//! variant becomes, and the data it carries. The messages are the core's
//! (`crate::error`) or, for arguments the binding checks itself, `convert`'s
//! rendered by the core's [`Problem`].
//!
//! Every exception raised from an [`Error`] or a [`Problem`] is a subclass of
//! the built-in an engine already catches (`ValueError`, `TypeError`,
//! `RuntimeError`, `MemoryError`, `OverflowError`) with three attributes:
//! `field` (the argument or element at fault, `"token_ids[3]"`, or `None`),
//! `slot` (the batch slot whose arguments or state are at fault, or `None`)
//! and `kind` (the core's snake-case name of what went wrong, `"below"`,
//! `"not_in_vocabulary"`, `"slot_finished"`, ...). docs/errors.md lists them.

use pyo3::create_exception;
use pyo3::exceptions::{PyMemoryError, PyOverflowError, PyRuntimeError, PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyType};
use pyo3::PyErr;

use crate::error::{Error, Problem};

create_exception!(
    stopline,
    StoplineValueError,
    PyValueError,
    "A value of the right type that is out of range, empty, inconsistent with \
     another argument or not valid Unicode. A `ValueError` subclass with \
     `field`, `slot` and `kind` (docs/errors.md)."
);
create_exception!(
    stopline,
    StoplineTypeError,
    PyTypeError,
    "A value of the wrong type. A `TypeError` subclass with `field`, `slot` \
     and `kind` (docs/errors.md)."
);
create_exception!(
    stopline,
    StoplineRuntimeError,
    PyRuntimeError,
    "A call that the object's state forbids. A `RuntimeError` subclass with \
     `field`, `slot` and `kind` (docs/errors.md)."
);
create_exception!(
    stopline,
    StoplineMemoryError,
    PyMemoryError,
    "A table that could not be allocated (the message says which and how \
     large). A `MemoryError` subclass with `field`, `slot` and `kind`."
);
create_exception!(
    stopline,
    StoplineOverflowError,
    PyOverflowError,
    "An integer argument too large for 64 bits. An `OverflowError` subclass \
     with `field`, `slot` and `kind`."
);
create_exception!(
    stopline,
    SequenceFinishedError,
    StoplineRuntimeError,
    "Raised by `FinishTracker.update` / `FinishBatch.step` for a sequence that \
     already finished. A `RuntimeError` subclass: engines catch it by type; \
     `slot` names the batch slot (docs/errors.md)."
);

/// The exception classes, for the module and for their class-level
/// defaults (`field`, `slot` and `kind` are `None` on the class).
pub(super) fn classes(py: Python<'_>) -> [(&'static str, Bound<'_, PyType>); 6] {
    [
        ("StoplineValueError", py.get_type::<StoplineValueError>()),
        ("StoplineTypeError", py.get_type::<StoplineTypeError>()),
        (
            "StoplineRuntimeError",
            py.get_type::<StoplineRuntimeError>(),
        ),
        ("StoplineMemoryError", py.get_type::<StoplineMemoryError>()),
        (
            "StoplineOverflowError",
            py.get_type::<StoplineOverflowError>(),
        ),
        (
            "SequenceFinishedError",
            py.get_type::<SequenceFinishedError>(),
        ),
    ]
}

/// `err` with its data set on the (new) exception object.
pub(super) fn with_data(err: PyErr, field: Option<&str>, slot: Option<i64>, kind: &str) -> PyErr {
    Python::attach(|py| {
        let value = err.value(py);
        // Setting an attribute of a fresh exception object fails only
        // without memory, and then the exception itself is the better report.
        let _ = value.setattr("field", field);
        let _ = value.setattr("slot", slot);
        let _ = value.setattr("kind", kind);
    });
    err
}

pub(super) fn to_py_err(e: Error) -> PyErr {
    let message = e.to_string();
    let err = match &e {
        Error::Finished { .. } | Error::SlotFinished { .. } => {
            SequenceFinishedError::new_err(message)
        }
        Error::Alloc { .. } => StoplineMemoryError::new_err(message),
        Error::Param { problem, .. } | Error::Step { problem, .. } if problem.is_type_error() => {
            StoplineTypeError::new_err(message)
        }
        _ => StoplineValueError::new_err(message),
    };
    with_data(err, e.field().as_deref(), e.slot(), e.kind())
}

/// The binding's own argument errors, whose field is known only at run time
/// (`token_ids[3]`): rendered by the core's [`Problem`], a `TypeError` for a
/// wrong type and a `ValueError` otherwise.
pub(super) fn arg_err(field: &str, problem: Problem) -> PyErr {
    let message = problem.about(field);
    let err = if problem.is_type_error() {
        StoplineTypeError::new_err(message)
    } else {
        StoplineValueError::new_err(message)
    };
    with_data(err, Some(field), None, problem.kind())
}

/// A `ValueError` whose message is not one of the core's [`Problem`]s.
pub(super) fn value_error(field: &str, kind: &str, message: &str) -> PyErr {
    with_data(
        StoplineValueError::new_err(message.to_owned()),
        Some(field),
        None,
        kind,
    )
}

/// Pickling refused, at dump time and on every protocol, for an object that
/// holds one sequence's state or one step's result (without this, protocols
/// 0 and 1 would write a pickle that fails only when it is loaded).
pub(super) fn not_picklable(class: &str, instead: &str) -> PyErr {
    with_data(
        StoplineTypeError::new_err(format!(
            "cannot pickle 'stopline.{class}' object: {instead}"
        )),
        None,
        None,
        "unsupported",
    )
}

/// An int too large for 64 bits (`OverflowError`, as PyO3's own conversion).
pub(super) fn overflow_err(field: &str, problem: Problem) -> PyErr {
    let err = StoplineOverflowError::new_err(problem.about(field));
    with_data(err, Some(field), None, problem.kind())
}

/// `err` (one of the classes above) naming `slot`, and `field` when given:
/// a batch step's argument error found in the element of one slot.
pub(super) fn at_slot(err: PyErr, field: Option<&str>, slot: i64) -> PyErr {
    Python::attach(|py| {
        let value = err.value(py);
        let _ = value.setattr("slot", slot);
        if let Some(field) = field {
            let _ = value.setattr("field", field);
        }
    });
    err
}

/// `err` naming `slot` when it is one of stopline's exceptions (a caller's
/// own exception passing through, from an `__index__` say, is left as it
/// is): an error of `FinishBatch.add` once its slot is read.
pub(super) fn in_slot(err: PyErr, slot: i64) -> PyErr {
    Python::attach(|py| {
        let ours = err.is_instance_of::<StoplineValueError>(py)
            || err.is_instance_of::<StoplineTypeError>(py)
            || err.is_instance_of::<StoplineRuntimeError>(py)
            || err.is_instance_of::<StoplineMemoryError>(py)
            || err.is_instance_of::<StoplineOverflowError>(py);
        if ours {
            let _ = err.value(py).setattr("slot", slot);
        }
    });
    err
}

/// `_core._problem(kind, field, *, slot=None, **values)`: the exception the
/// core raises for `kind` about `field` (class, message and attributes), for
/// the Python modules' own checks (`stopline._caps`), so a message is written
/// in one place. `values` are the [`Problem`] variant's fields by name; the
/// kinds with only numbers and owned text are supported.
#[pyfunction]
#[pyo3(signature = (kind, field, *, slot = None, **values))]
pub(super) fn _problem(
    kind: &str,
    field: &str,
    slot: Option<i64>,
    values: Option<&Bound<'_, PyDict>>,
) -> PyResult<PyErr> {
    let get = |name: &str| -> PyResult<Bound<'_, PyAny>> {
        values
            .and_then(|v| v.get_item(name).ok().flatten())
            .ok_or_else(|| {
                arg_err(
                    "values",
                    Problem::MissingKey {
                        key: name.to_owned(),
                    },
                )
            })
    };
    let text = |name: &str| -> PyResult<String> { get(name)?.extract() };
    let problem = match kind {
        "below" => Problem::Below {
            min: get("min")?.extract()?,
            value: get("value")?.extract()?,
        },
        "too_many" | "too_many_bytes" => {
            let n: Option<usize> = get("n")?.extract().ok();
            let cap = get("cap")?.extract()?;
            if kind == "too_many" {
                Problem::TooMany { n, cap }
            } else {
                Problem::TooManyBytes { n, cap }
            }
        }
        "out_of_range" => Problem::OutOfRange {
            shown: text("shown")?,
        },
        "not_one_of" => Problem::NotOneOf {
            shown: text("shown")?,
            allowed: text("allowed")?,
        },
        "id_not_int" => Problem::IdNotInt {
            shown: text("shown")?,
        },
        "id_not_in_vocab" => Problem::IdNotInVocab {
            shown: text("shown")?,
            vocab_size: get("vocab_size")?.extract()?,
        },
        "missing_key" => Problem::MissingKey { key: text("key")? },
        "unknown_key" => Problem::UnknownKey {
            shown: text("shown")?,
            expected: text("expected")?,
        },
        "not_a_token_id" => Problem::NotATokenId {
            value: get("value")?.extract()?,
        },
        "empty_word" => Problem::EmptyWord,
        "empty_stop" => Problem::EmptyStop,
        "lone_surrogate" => Problem::LoneSurrogate,
        "sum_overflows" => Problem::SumOverflows,
        _ => {
            return Err(arg_err(
                "kind",
                Problem::NotOneOf {
                    shown: crate::error::shown(kind),
                    allowed: "the kinds of docs/errors.md".into(),
                },
            ))
        }
    };
    let err = arg_err(field, problem);
    Ok(match slot {
        Some(slot) => at_slot(err, None, slot),
        None => err,
    })
}
