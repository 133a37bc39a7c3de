//! The OpenAI API's view of a finish reason.

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

/// Maps stopline's finish_reason to the OpenAI API's: "stop" becomes
/// "tool_calls" when the response carries parsed tool calls (as vLLM's
/// OpenAI server does); other reasons pass through.
#[pyfunction]
#[pyo3(signature = (finish_reason, has_tool_calls = false))]
pub(super) fn to_openai_finish_reason(
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
