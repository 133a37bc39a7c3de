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
/// UTF-8 bytes of one marker text (`reasoning_start`, `reasoning_end`, each
/// of `tool_call_markers`).
pub const MAX_MARKER_BYTES: usize = 1024;
/// Tool-call span marker pairs per request (`tool_call_markers`).
pub const MAX_TOOL_CALL_SPANS: usize = 8;
/// Token ids (and text pieces) in one `FinishTracker.update` or one
/// `FinishBatch.step`.
pub const MAX_STEP_TOKENS: usize = 1 << 22;
/// The largest `FinishBatch`: far above any engine's concurrent sequences,
/// and small enough that the slot table always fits in memory.
pub const MAX_SLOTS: usize = 1 << 24;
/// Bytes of token text (each id's decoded bytes, summed before decoding)
/// one `Vocabulary.decode`, `IncrementalDecoder.step` or ids-only update /
/// step may decode: the text, up to 3x that with U+FFFD repairs, is built
/// in one piece.
pub const MAX_DECODE_BYTES: usize = 64 << 20;
/// Bytes of one snapshot taken or restored (`FinishTracker.snapshot`,
/// `restore`): the kept text and ids of a long sequence fit many times over.
pub const MAX_SNAPSHOT_BYTES: usize = 256 << 20;
/// Bytes shown of a rejected value (a pattern, a stop string) in an error
/// message; it lives with the message writer (`crate::error`).
pub use crate::error::MAX_SHOWN_BYTES;

// `stopline.logits.LogitsConstraints`: its tables live on the device, sized
// `max_slots x` the largest live request's entries, so its caps are tighter
// than the host-side `FinishBatch`'s (and named apart from them here).
/// Slots of one `LogitsConstraints` (device tables are `max_slots x C`).
pub const MAX_LOGITS_SLOTS: usize = 1 << 14;
/// Token ids in one `allowed_token_ids`.
pub const MAX_ALLOWED_TOKEN_IDS: usize = 1 << 22;
/// Words in one `bad_words`.
pub const MAX_BAD_WORDS: usize = 1024;
/// Token ids in one bad word.
pub const MAX_BAD_WORD_TOKENS: usize = 64;
/// Bytes of the batch's multi-token bad-words table on the device.
pub const MAX_BAD_WORDS_TABLE_BYTES: usize = 256 << 20;
/// Entries in one `logit_bias`.
pub const MAX_LOGIT_BIAS: usize = 1 << 16;
/// Bytes of the dense allowed-token mask (`max_slots x ceil(vocab/32) x 4`).
pub const MAX_DENSE_TABLE_BYTES: usize = 1 << 30;

/// All caps of the finish layer by name: the binding's `stopline.LIMITS`.
pub const ALL: &[(&str, usize)] = &[
    ("max_stop_strings", MAX_STOP_STRINGS),
    ("max_stop_bytes", MAX_STOP_BYTES),
    ("max_stop_regexes", MAX_STOP_REGEXES),
    ("max_stop_regex_bytes", MAX_STOP_REGEX_BYTES),
    ("max_stop_token_ids", MAX_STOP_TOKEN_IDS),
    ("max_marker_bytes", MAX_MARKER_BYTES),
    ("max_tool_call_spans", MAX_TOOL_CALL_SPANS),
    ("max_step_tokens", MAX_STEP_TOKENS),
    ("max_decode_bytes", MAX_DECODE_BYTES),
    ("max_slots", MAX_SLOTS),
    ("max_snapshot_bytes", MAX_SNAPSHOT_BYTES),
];

/// The caps of `stopline.logits.LIMITS` by name (`max_slots` there is
/// [`MAX_LOGITS_SLOTS`]: a `LogitsConstraints`, not a `FinishBatch`).
pub const LOGITS: &[(&str, usize)] = &[
    ("max_slots", MAX_LOGITS_SLOTS),
    ("max_stop_token_ids", MAX_STOP_TOKEN_IDS),
    ("max_allowed_token_ids", MAX_ALLOWED_TOKEN_IDS),
    ("max_bad_words", MAX_BAD_WORDS),
    ("max_bad_word_tokens", MAX_BAD_WORD_TOKENS),
    ("max_bad_words_table_bytes", MAX_BAD_WORDS_TABLE_BYTES),
    ("max_logit_bias", MAX_LOGIT_BIAS),
    ("max_dense_table_bytes", MAX_DENSE_TABLE_BYTES),
];

/// `Err` naming `field` when `n` entries exceed `cap`.
pub fn check_count(field: &'static str, n: usize, cap: usize) -> Result<(), Error> {
    Problem::at_most_entries(n, cap, false).map_err(|p| Error::param(field, p))
}

/// `Err` naming `field` when `n` bytes exceed `cap`.
pub fn check_bytes(field: &'static str, n: usize, cap: usize) -> Result<(), Error> {
    Problem::at_most_entries(n, cap, true).map_err(|p| Error::param(field, p))
}

#[cfg(test)]
mod tests {
    use super::*;

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
