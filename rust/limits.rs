//! Caps on what one request or one call may bring, in one place.
//!
//! Every input comes from an untrusted client, so each has a documented cap
//! that keeps its cost (time, memory, GIL hold) bounded; `docs/errors.md`
//! lists them with the measured worst case at each. Sizes are checked before
//! anything is allocated from them: an allocation failure aborts a Rust
//! process, which for stopline is the whole inference server.

use crate::error::{Error, Problem};

/// Stop strings in one list.
pub const MAX_STOP_STRINGS: usize = 1024;
/// UTF-8 bytes of all stop strings of one list together.
pub const MAX_STOP_BYTES: usize = 64 * 1024;
/// Stop regexes in one list.
pub const MAX_STOP_REGEXES: usize = 64;
/// UTF-8 bytes of all stop-regex patterns of one list together.
pub const MAX_STOP_REGEX_BYTES: usize = 16 * 1024;
/// Token ids in `eos_token_ids` or `stop_token_ids`.
pub const MAX_STOP_TOKEN_IDS: usize = 1 << 16;
/// UTF-8 bytes of one reasoning marker text (`reasoning_start`,
/// `reasoning_end`).
pub const MAX_MARKER_BYTES: usize = 1024;
/// Token ids (and text pieces) in one `FinishTracker.update` or one
/// `FinishBatch.step`.
pub const MAX_STEP_TOKENS: usize = 1 << 22;
/// Bytes shown of a rejected value (a pattern, a stop string) in an error
/// message: a 1 MB pattern must not make a 2 MB message.
pub const MAX_SHOWN_BYTES: usize = 200;

/// All caps by name, for the binding's `stopline.LIMITS` and the docs.
pub const ALL: &[(&str, usize)] = &[
    ("max_stop_strings", MAX_STOP_STRINGS),
    ("max_stop_bytes", MAX_STOP_BYTES),
    ("max_stop_regexes", MAX_STOP_REGEXES),
    ("max_stop_regex_bytes", MAX_STOP_REGEX_BYTES),
    ("max_stop_token_ids", MAX_STOP_TOKEN_IDS),
    ("max_marker_bytes", MAX_MARKER_BYTES),
    ("max_step_tokens", MAX_STEP_TOKENS),
    ("max_slots", crate::batch::MAX_SLOTS),
];

/// `Err` naming `field` when `n` entries exceed `cap`.
pub fn check_count(field: &'static str, n: usize, cap: usize) -> Result<(), Error> {
    Problem::at_most_entries(n, cap, false).map_err(|p| Error::param(field, p))
}

/// `Err` naming `field` when `n` bytes exceed `cap`.
pub fn check_bytes(field: &'static str, n: usize, cap: usize) -> Result<(), Error> {
    Problem::at_most_entries(n, cap, true).map_err(|p| Error::param(field, p))
}

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
    fn counts_over_the_cap_name_the_field() {
        assert!(check_count("stop", MAX_STOP_STRINGS, MAX_STOP_STRINGS).is_ok());
        let e = check_count("stop", MAX_STOP_STRINGS + 1, MAX_STOP_STRINGS).unwrap_err();
        assert_eq!(
            e.to_string(),
            "stop has 1025 entries; at most 1024 are accepted"
        );
    }
}
