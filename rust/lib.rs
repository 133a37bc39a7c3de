//! stopline's core: when an LLM sequence stops and what it reports.
//!
//! * [`stop_strings`]: the incremental multi-stop-string matcher.
//! * [`error`]: the one error type.
//!
//! The PyO3 binding (`python` module, feature `python`) is the only code that
//! knows about Python; everything else is tested with plain `cargo test`.

pub mod error;
pub mod stop_strings;

#[cfg(feature = "python")]
mod python;

pub use error::Error;
pub use stop_strings::{StopMatch, StopMatcher, StopStrings};
