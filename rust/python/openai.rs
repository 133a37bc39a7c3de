//! The vocabulary of finish reasons (`stopline.FINISH_REASONS`) and the
//! OpenAI API's view of one.

use pyo3::prelude::*;

use super::errors::arg_err;
use crate::error::Problem;
use crate::finish::FinishReason;

/// `stopline.FINISH_REASONS`: every `finish_reason` the core reports, in a
/// fixed order; `compat` and the stubs' `_FinishReason` derive from it.
pub(super) fn finish_reasons() -> [&'static str; 5] {
    FinishReason::ALL.map(FinishReason::as_str)
}

/// Maps stopline's finish_reason to the OpenAI API's: "stop" becomes
/// "tool_calls" when the response carries parsed tool calls (as vLLM's
/// OpenAI server does); other reasons pass through.
#[pyfunction]
#[pyo3(signature = (finish_reason, has_tool_calls = false))]
pub(super) fn to_openai_finish_reason(
    finish_reason: Option<&str>,
    #[pyo3(from_py_with = super::convert::flags::has_tool_calls)] has_tool_calls: bool,
) -> PyResult<Option<&'static str>> {
    let Some(name) = finish_reason else {
        return Ok(None);
    };
    match FinishReason::from_name(name) {
        Some(FinishReason::Stop) if has_tool_calls => Ok(Some("tool_calls")),
        Some(reason) => Ok(Some(reason.as_str())),
        None => Err(arg_err(
            "finish_reason",
            Problem::NotOneOf {
                shown: crate::error::shown(name),
                allowed: finish_reasons().map(|r| format!("'{r}'")).join(", "),
            },
        )),
    }
}
