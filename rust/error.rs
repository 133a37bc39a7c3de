//! The one error type of the core. The Python binding maps each variant to a
//! Python exception whose message names the offending field and value.

use std::fmt;

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
            } => write!(f, "stop_regex[{index}]={pattern:?} is not a valid stop regex: {message}"),
            Error::RegexEmptyMatch { index, pattern } => write!(
                f,
                "stop_regex[{index}]={pattern:?} can match the empty string; stop regexes must match at least one character"
            ),
            Error::RegexTooLarge {
                index,
                pattern,
                limit,
            } => write!(
                f,
                "stop_regex[{index}]={pattern:?} needs a DFA larger than the {limit}-byte limit (with the patterns before it); simplify it or bound its repetitions"
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
        }
    }
}

impl std::error::Error for Error {}
