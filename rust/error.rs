//! The one error type of the core, and the one place its messages are
//! written. The Python binding maps each variant to a Python exception
//! (`rust/python/errors.rs`) and renders its own argument errors with
//! [`Problem`] too, so a message names the field once, with its value.

use std::fmt;

/// Bytes shown of a rejected value (a pattern, a stop string) in an error
/// message: a 1 MB pattern must not make a 2 MB message.
pub const MAX_SHOWN_BYTES: usize = 200;

/// `s` quoted and cut to at most [`MAX_SHOWN_BYTES`] (at a char boundary),
/// with how much was left out; what error messages show of a caller's value.
pub fn shown(s: &str) -> String {
    let (head, rest) = cut(s);
    format!("{head:?}{rest}")
}

/// A Python `repr` (already quoted where it is a string) cut as in
/// [`shown`].
pub fn shown_repr(repr: &str) -> String {
    let (head, rest) = cut(repr);
    format!("{head}{rest}")
}

/// At most [`MAX_SHOWN_BYTES`] of `s`, and what to append when it was cut.
fn cut(s: &str) -> (&str, String) {
    if s.len() <= MAX_SHOWN_BYTES {
        return (s, String::new());
    }
    let mut end = MAX_SHOWN_BYTES;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    (&s[..end], format!("... ({} bytes in all)", s.len()))
}

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
    /// A request parameter `field` with `problem`.
    pub fn param(field: &'static str, problem: Problem) -> Self {
        Error::Param {
            field,
            problem: Box::new(problem),
        }
    }

    /// What went wrong, in snake case: the [`Problem::kind`] of a `Param` or
    /// `Step` error, else the variant's own name (`"empty_stop"`,
    /// `"regex_invalid"`, `"slot_finished"`, ...). The Python exception's
    /// `kind`.
    pub fn kind(&self) -> &'static str {
        match self {
            Error::EmptyStop { .. } => "empty_stop",
            Error::Build(_) => "build",
            Error::RegexInvalid { .. } => "regex_invalid",
            Error::RegexEmptyMatch { .. } => "regex_empty_match",
            Error::RegexTooLarge { .. } => "regex_too_large",
            Error::NewCharCount { .. } => "new_char_count",
            Error::Param { problem, .. } | Error::Step { problem, .. } => problem.kind(),
            Error::Finished { .. } => "finished",
            Error::SlotFinished { .. } => "slot_finished",
            Error::Slot { .. } => "slot",
            Error::Tokenizer { .. } => "tokenizer",
            Error::Alloc { .. } => "alloc",
            Error::Snapshot { kind, .. } => kind,
        }
    }

    /// The argument (or element, `stop[2]`) at fault, as the message names
    /// it; `None` when no one argument is (a finished sequence, a failed
    /// allocation).
    pub fn field(&self) -> Option<String> {
        Some(match self {
            Error::EmptyStop { index } => format!("stop[{index}]"),
            Error::Build(_) => "stop".into(),
            Error::RegexInvalid { index, .. }
            | Error::RegexEmptyMatch { index, .. }
            | Error::RegexTooLarge { index, .. } => format!("stop_regex[{index}]"),
            Error::NewCharCount { .. } => "new_char_count".into(),
            Error::Param { field, problem } | Error::Step { field, problem, .. } => {
                match (&**problem, problem.index()) {
                    // As the message names it, and as the conversion names a
                    // bad element of the pair: `tool_call_marker_ids[0][1]`.
                    (Problem::PairMarker { index, side, .. }, _) => {
                        format!("{field}[{index}][{side}]")
                    }
                    (_, Some(i)) => format!("{field}[{i}]"),
                    (_, None) => (*field).into(),
                }
            }
            Error::Slot { .. } => "slot".into(),
            Error::Tokenizer { path: None, .. } => "tokenizer".into(),
            Error::Tokenizer {
                path: Some(path), ..
            } => format!("tokenizer.{path}"),
            Error::Snapshot { field, .. } => (*field).into(),
            Error::Finished { .. } | Error::SlotFinished { .. } | Error::Alloc { .. } => {
                return None
            }
        })
    }

    /// The batch slot whose arguments or state are at fault, when there is
    /// one: an engine aborts that request alone.
    pub fn slot(&self) -> Option<i64> {
        match self {
            Error::Step { slot, .. } => *slot,
            Error::SlotFinished { slot, .. } | Error::Slot { slot, .. } => Some(*slot),
            _ => None,
        }
    }

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
            Error::Param { .. } | Error::Step { .. } => std::mem::size_of::<Problem>(),
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
        problem: Box<Problem>,
    },
    /// A step's arguments are inconsistent with each other or with the
    /// state; `slot` is the batch slot whose arguments they are. (The
    /// problems are boxed: a small `Error` keeps the hot path's `Result`s
    /// small.)
    Step {
        field: &'static str,
        problem: Box<Problem>,
        slot: Option<i64>,
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
    /// A `tokenizer.json` that cannot be read or uses an unsupported
    /// decoder. `path` is the JSON path of the value at fault
    /// (`model.vocab["a"]`, `added_tokens[3].content`), `None` for the file
    /// as a whole; `message` starts with it.
    Tokenizer {
        path: Option<String>,
        message: String,
    },
    /// A table could not be allocated (`what` says which and how large);
    /// Python gets `MemoryError`, never an abort.
    Alloc { what: String },
    /// Bytes that [`crate::snapshot::restore`] refuses (or a sequence
    /// [`crate::snapshot::snapshot`] cannot write): `field` is the snapshot's
    /// part at fault, `kind` one of the `snapshot_*` kinds of docs/errors.md.
    Snapshot {
        field: &'static str,
        kind: &'static str,
        message: String,
    },
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::EmptyStop { index } => Problem::EmptyStop.write(f, &format!("stop[{index}]")),
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
            Error::Param { field, problem } => problem.write(f, field),
            Error::Step {
                field,
                problem,
                slot,
            } => {
                problem.write(f, field)?;
                match slot {
                    Some(slot) => write!(f, " (slot {slot})"),
                    None => Ok(()),
                }
            }
            Error::Finished { finish_reason } => write!(
                f,
                "the sequence already finished (finish_reason={finish_reason:?}); update() after finish is rejected"
            ),
            Error::SlotFinished { slot, finish_reason } => write!(
                f,
                "slot {slot} already finished (finish_reason={finish_reason:?}); remove() it before stepping it again"
            ),
            Error::Slot { slot, message } => write!(f, "slot {slot}: {message}"),
            Error::Tokenizer { message, .. } => write!(f, "tokenizer: {message}"),
            Error::Alloc { what } => write!(f, "cannot allocate {what}"),
            Error::Snapshot { message, .. } => f.write_str(message),
        }
    }
}

impl std::error::Error for Error {}

/// What is wrong with one field, without the field: [`Problem::write`]
/// renders it with the field's name (`field`, or `field[i]` for an element).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Problem {
    /// `{field} must be >= {min}, got {value}`.
    Below { min: i128, value: i128 },
    /// `{field}={value} is greater than {other}={limit}`.
    Greater {
        value: u64,
        other: &'static str,
        limit: u64,
    },
    /// `{field}={value} leaves no room under {other}={limit}`.
    NoRoom {
        value: u64,
        other: &'static str,
        limit: u64,
    },
    /// `{field}[{index}]={id} is outside [0, {bound_name}={bound})`.
    IdOutside {
        index: usize,
        id: u64,
        bound_name: &'static str,
        bound: u64,
    },
    /// `{field}={id} is outside [0, {bound_name}={bound})`: one id, not a
    /// list's element (kind `id_outside`).
    OneIdOutside {
        id: u64,
        bound_name: &'static str,
        bound: u64,
    },
    /// `{field} has {n} item(s); a (start, end) pair has exactly 2` (kind
    /// `count`).
    NotAPair { n: usize },
    /// `{field}[{index}]={id} is outside the vocabulary [0, {vocab_size})`.
    NotInVocabulary {
        index: usize,
        id: u32,
        vocab_size: usize,
    },
    /// `{field}={value} times {other}={other_value} overflows`.
    ProductOverflows {
        value: u64,
        other: &'static str,
        other_value: u64,
    },
    /// `{field}={value} is more than the supported {max}`.
    Unsupported { value: u64, max: u64 },
    /// `{field} has {n} entries; at most {cap} are accepted` (`n` unknown:
    /// more than `cap`).
    TooMany { n: Option<usize>, cap: usize },
    /// `{field} totals {n} UTF-8 bytes; at most {cap} are accepted` (`n`
    /// unknown: more than `cap`).
    TooManyBytes { n: Option<usize>, cap: usize },
    /// `{field} has {n} {unit} for {expected} {per}{hint}`: a length that
    /// must match another argument's.
    Count {
        n: usize,
        unit: &'static str,
        expected: usize,
        per: &'static str,
        hint: &'static str,
    },
    /// `{field} add up to more than any list of token ids can hold`.
    SumOverflows,
    /// `{field} is required: {why}`.
    Required { why: &'static str },
    /// `{field} must be None: {why}`.
    MustBeNone { why: &'static str },
    /// `{field} must be {what}, not a single str` and, with `wrapped`,
    /// ` (wrap it in a list: [{wrapped}])` (a TypeError).
    SingleStr {
        what: &'static str,
        wrapped: Option<String>,
    },
    /// `{field} is missing the key {key:?}`.
    MissingKey { key: String },
    /// `{field} has the unknown key {shown}; expected {expected}`.
    UnknownKey { shown: String, expected: String },
    /// `{field}={value} is outside the run of {run_len} tokens`, or for a
    /// batch row `{field}[{index}]={value}: use -1 for none or an index
    /// into the run`.
    OutsideRun {
        index: Option<usize>,
        value: i64,
        run_len: usize,
    },
    /// `{field}={shown} is out of range` (`shown` is the value's repr).
    OutOfRange { shown: String },
    /// `{field}={value} is not a valid token id (must be in [0, 2**32))`.
    NotATokenId { value: i64 },
    /// `{field} is not valid Unicode (it contains a lone surrogate)`.
    LoneSurrogate,
    /// `{field} decode to at least {n} bytes of token text; at most {cap}
    /// are decoded in one call (max_decode_bytes)`.
    DecodesTooLong { n: usize, cap: usize },
    /// `{field} is an empty string; stop strings must be non-empty`.
    EmptyStop,
    /// `{field}={shown} is not one of {allowed}`.
    NotOneOf { shown: String, allowed: String },
    /// `{field} must be {expected}, got {got}` (a type name; a TypeError).
    WrongType { expected: &'static str, got: String },
    // The logits module's token-id lists (`stopline.logits`), whose
    // messages read "field: ..." as its Python checks do.
    /// `{field}: token id {shown} is not an int` (a TypeError).
    IdNotInt { shown: String },
    /// `{field}: token id {shown} is outside [0, vocab_size={vocab_size})`.
    IdNotInVocab { shown: String, vocab_size: u64 },
    /// `{field}: an empty word bans nothing; remove it`.
    EmptyWord,
    /// `{field} is an empty string; a reasoning marker must be non-empty`.
    EmptyMarker,
    /// `{field}={shown}` (or `{field}[{index}]={shown}`) `overlaps {other}`:
    /// a stop or marker definition that would fire inside a marker.
    Overlaps {
        index: Option<usize>,
        shown: String,
        other: &'static str,
    },
    /// `{field}: expected {expected}, got {got}` (a repr; a TypeError).
    NotASequence { expected: &'static str, got: String },
    /// `{field}[{index}][{side}]={shown} {what}`: one marker of a pair list
    /// (`tool_call_markers`), with the problem's `kind` (`empty_marker`,
    /// `overlaps`, `required`).
    PairMarker {
        index: usize,
        side: usize,
        shown: String,
        what: String,
        kind: &'static str,
    },
}

impl Problem {
    /// `Below` when `value < min`.
    pub fn at_least(min: impl Into<i128>, value: impl Into<i128>) -> Result<(), Problem> {
        let (min, value) = (min.into(), value.into());
        if value < min {
            return Err(Problem::Below { min, value });
        }
        Ok(())
    }

    /// `TooMany` (or, for bytes, `TooManyBytes`) when `n > cap`.
    pub fn at_most_entries(n: usize, cap: usize, bytes: bool) -> Result<(), Problem> {
        if n <= cap {
            return Ok(());
        }
        Err(if bytes {
            Problem::TooManyBytes { n: Some(n), cap }
        } else {
            Problem::TooMany { n: Some(n), cap }
        })
    }

    /// Writes the message about `field`.
    pub fn write(&self, f: &mut dyn fmt::Write, field: &str) -> fmt::Result {
        match self {
            Problem::Below { min, value } => write!(f, "{field} must be >= {min}, got {value}"),
            Problem::Greater {
                value,
                other,
                limit,
            } => write!(f, "{field}={value} is greater than {other}={limit}"),
            Problem::NoRoom {
                value,
                other,
                limit,
            } => write!(f, "{field}={value} leaves no room under {other}={limit}"),
            Problem::IdOutside {
                index,
                id,
                bound_name,
                bound,
            } => write!(
                f,
                "{field}[{index}]={id} is outside [0, {bound_name}={bound})"
            ),
            Problem::OneIdOutside {
                id,
                bound_name,
                bound,
            } => write!(f, "{field}={id} is outside [0, {bound_name}={bound})"),
            Problem::NotAPair { n } => {
                let s = if *n == 1 { "" } else { "s" };
                write!(
                    f,
                    "{field} has {n} item{s}; a (start, end) pair has exactly 2"
                )
            }
            Problem::NotInVocabulary {
                index,
                id,
                vocab_size,
            } => write!(
                f,
                "{field}[{index}]={id} is outside the vocabulary [0, {vocab_size})"
            ),
            Problem::ProductOverflows {
                value,
                other,
                other_value,
            } => write!(f, "{field}={value} times {other}={other_value} overflows"),
            Problem::Unsupported { value, max } => {
                write!(f, "{field}={value} is more than the supported {max}")
            }
            Problem::TooMany { n: Some(n), cap } => {
                write!(f, "{field} has {n} entries; at most {cap} are accepted")
            }
            Problem::TooMany { n: None, cap } => write!(
                f,
                "{field} has more than {cap} entries; at most {cap} are accepted"
            ),
            Problem::TooManyBytes { n: Some(n), cap } => write!(
                f,
                "{field} totals {n} UTF-8 bytes; at most {cap} are accepted"
            ),
            Problem::TooManyBytes { n: None, cap } => write!(
                f,
                "{field} totals more than {cap} UTF-8 bytes; at most {cap} are accepted"
            ),
            Problem::Count {
                n,
                unit,
                expected,
                per,
                hint,
            } => write!(f, "{field} has {n} {unit} for {expected} {per}{hint}"),
            Problem::SumOverflows => write!(
                f,
                "{field} add up to more than any list of token ids can hold"
            ),
            Problem::Required { why } => write!(f, "{field} is required: {why}"),
            Problem::MustBeNone { why } => write!(f, "{field} must be None: {why}"),
            Problem::SingleStr { what, wrapped } => {
                write!(f, "{field} must be {what}, not a single str")?;
                match wrapped {
                    Some(w) => write!(f, " (wrap it in a list: [{w}])"),
                    None => Ok(()),
                }
            }
            Problem::MissingKey { key } => write!(f, "{field} is missing the key {key:?}"),
            Problem::UnknownKey { shown, expected } => {
                write!(
                    f,
                    "{field} has the unknown key {shown}; expected {expected}"
                )
            }
            Problem::OutsideRun {
                index: None,
                value,
                run_len,
            } => write!(f, "{field}={value} is outside the run of {run_len} tokens"),
            Problem::OutsideRun {
                index: Some(i),
                value,
                ..
            } => write!(
                f,
                "{field}[{i}]={value}: use -1 for none or an index into the run"
            ),
            Problem::OutOfRange { shown } => write!(f, "{field}={shown} is out of range"),
            Problem::NotATokenId { value } => write!(
                f,
                "{field}={value} is not a valid token id (must be in [0, 2**32))"
            ),
            Problem::DecodesTooLong { n, cap } => write!(
                f,
                "{field} decode to at least {n} bytes of token text; at most {cap} are \
                 decoded in one call (max_decode_bytes)"
            ),
            Problem::LoneSurrogate => write!(
                f,
                "{field} is not valid Unicode (it contains a lone surrogate)"
            ),
            Problem::EmptyStop => write!(
                f,
                "{field} is an empty string; stop strings must be non-empty"
            ),
            Problem::NotOneOf { shown, allowed } => {
                write!(f, "{field}={shown} is not one of {allowed}")
            }
            Problem::WrongType { expected, got } => {
                write!(f, "{field} must be {expected}, got {got}")
            }
            Problem::IdNotInt { shown } => write!(f, "{field}: token id {shown} is not an int"),
            Problem::IdNotInVocab { shown, vocab_size } => write!(
                f,
                "{field}: token id {shown} is outside [0, vocab_size={vocab_size})"
            ),
            Problem::EmptyWord => write!(f, "{field}: an empty word bans nothing; remove it"),
            Problem::EmptyMarker => write!(
                f,
                "{field} is an empty string; a reasoning marker must be non-empty"
            ),
            Problem::Overlaps {
                index,
                shown,
                other,
            } => {
                write!(f, "{field}")?;
                if let Some(i) = index {
                    write!(f, "[{i}]")?;
                }
                let why = if other.starts_with("reasoning_start")
                    && field.starts_with("reasoning_end")
                {
                    // Both are awaited inside the block.
                    "the start and end markers must differ, and neither text may contain the other"
                } else {
                    "a stop string may not contain a marker (it could never match), and a marker id may not be a stop or EOS id"
                };
                write!(f, "={shown} overlaps {other}; {why}")
            }
            Problem::NotASequence { expected, got } => {
                write!(f, "{field}: expected {expected}, got {got}")
            }
            Problem::PairMarker {
                index,
                side,
                shown,
                what,
                ..
            } => write!(f, "{field}[{index}][{side}]={shown} {what}"),
        }
    }

    /// The variant's name in snake case (`"below"`, `"too_many"`, ...): the
    /// Python exception's `kind`, stable for callers to match on.
    pub fn kind(&self) -> &'static str {
        match self {
            Problem::Below { .. } => "below",
            Problem::Greater { .. } => "greater",
            Problem::NoRoom { .. } => "no_room",
            Problem::IdOutside { .. } | Problem::OneIdOutside { .. } => "id_outside",
            Problem::NotAPair { .. } => "count",
            Problem::NotInVocabulary { .. } => "not_in_vocabulary",
            Problem::ProductOverflows { .. } => "product_overflows",
            Problem::Unsupported { .. } => "unsupported",
            Problem::TooMany { .. } => "too_many",
            Problem::TooManyBytes { .. } => "too_many_bytes",
            Problem::Count { .. } => "count",
            Problem::SumOverflows => "sum_overflows",
            Problem::Required { .. } => "required",
            Problem::MustBeNone { .. } => "must_be_none",
            Problem::SingleStr { .. } => "single_str",
            Problem::MissingKey { .. } => "missing_key",
            Problem::UnknownKey { .. } => "unknown_key",
            Problem::OutsideRun { .. } => "outside_run",
            Problem::OutOfRange { .. } => "out_of_range",
            Problem::NotATokenId { .. } => "not_a_token_id",
            Problem::DecodesTooLong { .. } => "decodes_too_long",
            Problem::LoneSurrogate => "lone_surrogate",
            Problem::EmptyStop => "empty_stop",
            Problem::NotOneOf { .. } => "not_one_of",
            Problem::WrongType { .. } => "wrong_type",
            Problem::IdNotInt { .. } => "id_not_int",
            Problem::IdNotInVocab { .. } => "id_not_in_vocab",
            Problem::EmptyWord => "empty_word",
            Problem::EmptyMarker => "empty_marker",
            Problem::Overlaps { .. } => "overlaps",
            Problem::NotASequence { .. } => "not_a_sequence",
            Problem::PairMarker { kind, .. } => kind,
        }
    }

    /// The element of the field at fault, for problems whose message names
    /// one (`token_ids[3]=...`).
    pub fn index(&self) -> Option<usize> {
        match self {
            Problem::IdOutside { index, .. } | Problem::NotInVocabulary { index, .. } => {
                Some(*index)
            }
            Problem::OutsideRun { index, .. } | Problem::Overlaps { index, .. } => *index,
            Problem::PairMarker { index, .. } => Some(*index),
            _ => None,
        }
    }

    /// Whether the problem is the value's type (Python's `TypeError`)
    /// rather than its value (`ValueError`).
    pub fn is_type_error(&self) -> bool {
        matches!(
            self,
            Problem::WrongType { .. }
                | Problem::IdNotInt { .. }
                | Problem::NotASequence { .. }
                | Problem::SingleStr { .. }
        )
    }

    /// The message about `field`, for errors whose field is only known at
    /// run time (an element `token_ids[3] (slot 2)`).
    pub fn about(&self, field: &str) -> String {
        let mut out = String::new();
        // Writing to a String cannot fail.
        let _ = self.write(&mut out, field);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shown_is_bounded_and_cut_at_a_char_boundary() {
        let long = "é".repeat(1_000_000);
        let s = shown(&long);
        assert!(s.len() < 2 * MAX_SHOWN_BYTES + 40, "{}", s.len());
        assert!(s.ends_with("(2000000 bytes in all)"));
        assert_eq!(shown("ab"), "\"ab\"");
        assert_eq!(shown_repr("[1, 2]"), "[1, 2]");
        assert!(shown_repr(&"x".repeat(1000)).ends_with("... (1000 bytes in all)"));
    }

    #[test]
    fn errors_say_their_field_slot_and_kind() {
        let step = Error::Step {
            field: "token_ids",
            problem: Box::new(Problem::NotInVocabulary {
                index: 3,
                id: 9,
                vocab_size: 5,
            }),
            slot: Some(2),
        };
        assert_eq!(
            (step.field().as_deref(), step.slot(), step.kind()),
            (Some("token_ids[3]"), Some(2), "not_in_vocabulary")
        );
        assert!(step.to_string().starts_with("token_ids[3]=9"));
        let param = Error::param("min_tokens", Problem::at_least(0, -1).unwrap_err());
        assert_eq!(
            (param.field().as_deref(), param.slot(), param.kind()),
            (Some("min_tokens"), None, "below")
        );
        let finished = Error::SlotFinished {
            slot: 7,
            finish_reason: "stop",
        };
        assert_eq!(
            (finished.field(), finished.slot(), finished.kind()),
            (None, Some(7), "slot_finished")
        );
        assert!(Problem::WrongType {
            expected: "an int",
            got: "str".into()
        }
        .is_type_error());
    }
}
