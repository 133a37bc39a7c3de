//! The one error type of the core. The Python binding maps each variant to a
//! Python exception whose message names the offending field and value.

use std::fmt;

use crate::limits::{shown, MAX_SHOWN_BYTES};

/// A parser's message, which quotes the whole pattern: for a long pattern
/// only its last line (the kind of error) is kept, itself cut.
fn short_message(message: &str) -> std::borrow::Cow<'_, str> {
    if message.len() <= 4 * MAX_SHOWN_BYTES {
        return message.into();
    }
    let last = message.lines().last().unwrap_or("");
    let mut end = last.len().min(2 * MAX_SHOWN_BYTES);
    while !last.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}...", &last[..end]).into()
}

impl Error {
    /// Heap bytes held (what a cache of rejections counts).
    pub(crate) fn heap_bytes(&self) -> usize {
        match self {
            Error::Build(m) => m.capacity(),
            Error::RegexInvalid {
                pattern, message, ..
            } => pattern.capacity() + message.capacity(),
            Error::RegexEmptyMatch { pattern, .. } | Error::RegexTooLarge { pattern, .. } => {
                pattern.capacity()
            }
            Error::Param { message, .. } | Error::Step { message, .. } => message.capacity(),
            _ => 0,
        }
    }
}

/// Everything the core can reject.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Error {
    /// A stop string is empty (it would match everywhere).
    EmptyStop { index: usize },
    /// The automaton could not be built (for example: too many states).
    Build(String),
    /// A stop regex does not parse or uses what a DFA cannot run.
    RegexInvalid {
        index: usize,
        pattern: String,
        message: String,
    },
    /// A stop regex can match the empty string (it would match everywhere).
    RegexEmptyMatch { index: usize, pattern: String },
    /// The stop regexes need a DFA larger than `limit` bytes.
    RegexTooLarge {
        index: usize,
        pattern: String,
        limit: usize,
    },
    /// `new_char_count` is outside `[0, len(output_text)]`.
    NewCharCount { value: i64, text_len: usize },
    /// A request parameter is out of range; `field` is its public name.
    Param {
        field: &'static str,
        message: String,
    },
    /// A step's arguments are inconsistent with each other or with the state.
    Step {
        field: &'static str,
        message: String,
    },
    /// `update` after the sequence finished.
    Finished { finish_reason: &'static str },
    /// A batch step lists a slot whose sequence already finished.
    SlotFinished {
        slot: i64,
        finish_reason: &'static str,
    },
    /// A batch slot that is out of range, free or already taken.
    Slot { slot: i64, message: &'static str },
    /// A `tokenizer.json` that cannot be read or uses an unsupported decoder.
    Tokenizer { message: String },
    /// A table could not be allocated (`what` says which and how large);
    /// Python gets `MemoryError`, never an abort.
    Alloc { what: String },
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::EmptyStop { index } => {
                write!(f, "stop[{index}] is an empty string; stop strings must be non-empty")
            }
            Error::Build(msg) => write!(f, "cannot compile the stop strings: {msg}"),
            Error::RegexInvalid {
                index,
                pattern,
                message,
            } => write!(
                f,
                "stop_regex[{index}]={} is not a valid stop regex: {}",
                shown(pattern),
                short_message(message)
            ),
            Error::RegexEmptyMatch { index, pattern } => write!(
                f,
                "stop_regex[{index}]={} can match the empty string; stop regexes must match at least one character",
                shown(pattern)
            ),
            Error::RegexTooLarge {
                index,
                pattern,
                limit,
            } => write!(
                f,
                "stop_regex[{index}]={} needs an automaton larger than the {limit}-byte limit (with the patterns before it); simplify it or bound its repetitions",
                shown(pattern)
            ),
            Error::NewCharCount { value, text_len } => write!(
                f,
                "new_char_count={value} is outside [0, {text_len}] (the length of output_text in code points)"
            ),
            Error::Param { field, message } => write!(f, "{field}: {message}"),
            Error::Step { field, message } => write!(f, "{field}: {message}"),
            Error::Finished { finish_reason } => write!(
                f,
                "the sequence already finished (finish_reason={finish_reason:?}); update() after finish is rejected"
            ),
            Error::SlotFinished { slot, finish_reason } => write!(
                f,
                "slot {slot} already finished (finish_reason={finish_reason:?}); remove() it before stepping it again"
            ),
            Error::Slot { slot, message } => write!(f, "slot {slot}: {message}"),
            Error::Tokenizer { message } => write!(f, "tokenizer: {message}"),
            Error::Alloc { what } => write!(f, "cannot allocate {what}"),
        }
    }
}

impl std::error::Error for Error {}
