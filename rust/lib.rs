//! stopline's core: when an LLM sequence stops and what it reports.
//!
//! * [`stop_strings`]: the incremental multi-stop-string matcher.
//! * [`stop_regex`]: stop regexes, matched incrementally on a shared DFA.
//! * `stop_dfa`, `cache`: the dense DFA of short stop lists and the
//!   byte-bounded cache of compiled lists.
//! * [`finish`]: the ordered finish-state machine of one sequence.
//! * [`bad_words`]: a logits request's bad words, validated and laid out.
//! * [`reasoning`]: reasoning channels and tool-call spans of one sequence.
//! * [`batch`]: many sequences advanced by one call per engine step.
//! * [`detokenize`]: token ids to text, incrementally (a `tokenizer.json`'s decoder).
//! * `tokenizer_json`: reading a `tokenizer.json`, each error at its JSON path.
//! * [`detok_batch`]: one sequence's decoder for ids-only steps.
//! * [`snapshot`]: one sequence's state as bytes, and back.
//! * [`limits`]: the caps on every input; [`error`]: the one error type.
//!
//! The PyO3 binding (`python` module, feature `python`) is the only code that
//! knows about Python; everything else is tested with plain `cargo test`.
//! Its raw C-API access (`python/ffi.rs`) is the binding's only `unsafe`,
//! under one written contract; the lints below keep every `unsafe` block
//! documented.

#![deny(unsafe_op_in_unsafe_fn)]
#![deny(clippy::undocumented_unsafe_blocks)]
#![deny(clippy::missing_safety_doc)]

pub mod bad_words;
pub mod batch;
mod cache;
pub mod detok_batch;
pub mod detokenize;
pub mod error;
pub mod finish;
pub mod limits;
pub mod reasoning;
pub mod snapshot;
mod stop_dfa;
pub mod stop_regex;
pub mod stop_strings;
mod tokenizer_json;

#[cfg(feature = "python")]
#[deny(unsafe_code)]
mod python;

pub use batch::{FinishBatch, SlotStep, StepInput};
pub use detokenize::{DecodeOptions, DecodeState, Vocabulary};
pub use error::Error;
pub use finish::{
    Finish, FinishReason, FinishTracker, Matched, Repetition, Step, StopParams, StopReason,
};
pub use stop_strings::{StopMatch, StopMatcher, StopStrings};
