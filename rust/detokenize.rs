//! Incremental detokenization: token ids to text, one id at a time.
//!
//! A [`Vocabulary`] is built once from a Hugging Face `tokenizer.json`: every
//! id's decoded bytes are computed up front and stored in one arena, so a
//! decoding step is a table lookup plus, rarely, a few bytes of UTF-8 repair.
//! A [`DecodeState`] (a few bytes) follows one sequence. The rules, and where
//! they match `tokenizers.decoders.DecodeStream` and `Tokenizer.decode`, are
//! in docs/semantics.md, "Incremental detokenization".

use std::borrow::Cow;

use rustc_hash::FxHashSet;
use serde_json::Value;

use crate::error::{shown, shown_repr};
use crate::error::{Error, Problem};
use crate::limits::MAX_DECODE_BYTES;
use crate::tokenizer_json::{self, at};
pub use crate::tokenizer_json::{
    read_tokenizer_file, MAX_TOKENIZER_JSON_BYTES, MAX_TOKEN_BYTES, MAX_VOCAB_SIZE,
};

/// Decoders in one `Sequence` (published ones have at most 5).
pub const MAX_DECODER_RULES: usize = 32;
/// Bytes all decoder rules together may produce while the table is built
/// (every rule's output for every token): bounds the build time whatever
/// the rules do.
pub const MAX_RULE_OUTPUT_BYTES: usize = 64 << 20;
/// Bytes of the decoded table (the arena of every id's bytes, twice for
/// decoders whose first token differs).
pub const MAX_DECODED_BYTES: usize = 512 << 20;

const FFFD: &str = "\u{FFFD}";

/// How token bytes become text across tokens.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Stream {
    /// Token bytes are concatenated and the stream is decoded as lossy UTF-8
    /// (`String::from_utf8_lossy` of the whole): the ByteLevel decoder.
    Lossy,
    /// Token texts are valid UTF-8; runs of `<0xHH>` byte tokens are decoded
    /// together, a run that is not valid UTF-8 giving one U+FFFD per byte:
    /// the ByteFallback decoder.
    ByteRuns,
    /// Every token text is valid UTF-8 on its own.
    Text,
}

// Per-id flags.
const PRESENT: u8 = 1;
/// Skipped under `skip_special_tokens`: its text is a special added
/// token's content.
const SPECIAL: u8 = tokenizer_json::SPECIAL;
/// An added token (vLLM's `spaces_between_special_tokens` rule).
const ADDED: u8 = tokenizer_json::ADDED;
/// A ByteFallback byte token; its arena entry is the one byte.
const BYTE: u8 = 8;
/// Its bytes are valid UTF-8 on their own.
const UTF8: u8 = 16;

/// Decoded bytes of every id, built from a `tokenizer.json`.
pub struct Vocabulary {
    stream: Stream,
    flags: Vec<u8>,
    /// `arena[offsets[id]..offsets[id + 1]]`: the id's bytes when it is not
    /// the first token of a sequence.
    offsets: Vec<u32>,
    arena: Vec<u8>,
    /// The bytes when it is the first token, for decoders that treat it
    /// differently (WordPiece, Metaspace, none); same layout.
    first: Option<(Vec<u32>, Vec<u8>)>,
    /// Added tokens' ids, ascending, and their contents:
    /// `added_text[added_ends[k - 1]..added_ends[k]]` is that of
    /// `added_ids[k]` (read only by vLLM's raw-pairs rule).
    added_ids: Vec<u32>,
    added_ends: Vec<u32>,
    added_text: String,
    /// The most one step and a flush can append: every byte of the longest
    /// token a 3-byte U+FFFD, or an added token's raw content.
    max_step: usize,
    /// Strip up to this many leading `strip_char` from the whole text
    /// (`Strip` after `Fuse`).
    strip_left: u8,
    strip_char: char,
    decoder_name: String,
    /// A hash of the `tokenizer.json` it was built from: what a snapshot
    /// checks that it restores with the same vocabulary.
    fingerprint: u64,
}

/// Per-sequence decoding options (the vLLM `SamplingParams` fields).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DecodeOptions {
    pub skip_special_tokens: bool,
    pub spaces_between_special_tokens: bool,
}

impl Default for DecodeOptions {
    fn default() -> Self {
        DecodeOptions {
            skip_special_tokens: true,
            spaces_between_special_tokens: true,
        }
    }
}

/// The state of one sequence's decoding.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DecodeState {
    /// Bytes of a character still arriving (or of an undecided byte run).
    pending: [u8; 4],
    pending_len: u8,
    /// No token has reached the decoder yet.
    at_first: bool,
    /// Leading strip budget left (chars); 0 once any text was produced.
    strip_left: u8,
    /// ByteRuns: inside a run of byte tokens, and whether it went invalid.
    in_run: bool,
    run_invalid: bool,
    skip_special: bool,
    /// vLLM's rule when off: an added token right after an added token
    /// yields its raw content.
    raw_added_pairs: bool,
    last_added: bool,
}

impl DecodeState {
    /// Bytes held because the character they start is incomplete.
    pub fn pending(&self) -> &[u8] {
        &self.pending[..self.pending_len as usize]
    }

    /// Leading strip budget left (chars).
    pub(crate) fn strip_left(&self) -> u8 {
        self.strip_left
    }

    /// The held bytes and the flags, packed (a snapshot's fields).
    pub(crate) fn parts(&self) -> (&[u8], u8) {
        let flags = [
            self.at_first,
            self.in_run,
            self.run_invalid,
            self.skip_special,
            self.raw_added_pairs,
            self.last_added,
        ];
        let packed = flags
            .iter()
            .enumerate()
            .fold(0u8, |acc, (i, &f)| acc | u8::from(f) << i);
        (self.pending(), packed)
    }

    /// The state [`parts`](Self::parts) packed, checked so that the
    /// decoder's invariants hold: the held bytes are the start of one UTF-8
    /// character (so at most 3), the strip budget at most `vocab`'s.
    pub(crate) fn from_parts(
        vocab: &Vocabulary,
        pending: &[u8],
        flags: u8,
        strip_left: u8,
    ) -> Result<Self, &'static str> {
        let incomplete = matches!(std::str::from_utf8(pending), Err(e) if e.valid_up_to() == 0 && e.error_len().is_none());
        if !pending.is_empty() && !incomplete {
            return Err("is not the start of one UTF-8 character");
        }
        if flags >> 6 != 0 {
            return Err("has unknown flag bits");
        }
        if strip_left > vocab.strip_left {
            return Err("has a strip budget above the vocabulary's");
        }
        let bit = |i: u8| flags >> i & 1 != 0;
        let mut held = [0u8; 4];
        held[..pending.len()].copy_from_slice(pending);
        Ok(DecodeState {
            pending: held,
            pending_len: pending.len() as u8,
            at_first: bit(0),
            strip_left,
            in_run: bit(1),
            run_invalid: bit(2),
            skip_special: bit(3),
            raw_added_pairs: bit(4),
            last_added: bit(5),
        })
    }
}

/// The chars of GPT-2's byte <-> printable-char table are below this.
const BYTE_LEVEL_CHARS: usize = 0x144;

/// GPT-2's byte <-> printable-char table, inverted: char -> byte, indexed
/// by code point (a lookup per char of every token while building).
fn byte_level_table() -> [Option<u8>; BYTE_LEVEL_CHARS] {
    let mut table = [None; BYTE_LEVEL_CHARS];
    let mut extra = 0usize;
    for b in 0usize..256 {
        let printable =
            (0x21..=0x7E).contains(&b) || (0xA1..=0xAC).contains(&b) || (0xAE..=0xFF).contains(&b);
        let c = if printable {
            b
        } else {
            extra += 1;
            255 + extra
        };
        table[c] = Some(b as u8);
    }
    table
}

/// ByteLevel: the bytes of `text` when every char is in the table, else
/// its UTF-8 (an added token's text, say), appended to `out`.
fn byte_level_bytes(table: &[Option<u8>; BYTE_LEVEL_CHARS], text: &str, out: &mut Vec<u8>) {
    let start = out.len();
    for c in text.chars() {
        match table.get(c as usize).copied().flatten() {
            Some(b) => out.push(b),
            None => {
                out.truncate(start);
                out.extend_from_slice(text.as_bytes());
                return;
            }
        }
    }
}

/// `<0xHH>` -> the byte.
fn byte_token(s: &str) -> Option<u8> {
    let b = s.as_bytes();
    if b.len() == 6 && s.starts_with("<0x") && b[5] == b'>' {
        u8::from_str_radix(&s[3..5], 16).ok()
    } else {
        None
    }
}

/// One per-token string rule of a decoder `Sequence` (or a lone decoder).
enum TokenRule {
    Replace(String, String),
    /// Replacement char; the first token drops it instead.
    Metaspace(char, bool),
    /// Strip per token: char, left count, right count.
    Strip(char, usize, usize),
    /// WordPiece: continuation prefix, cleanup.
    WordPiece(String, bool),
    /// No decoder: tokens joined with " ".
    JoinSpace,
}

/// What a `decoder` entry compiles to.
struct Plan {
    rules: Vec<TokenRule>,
    stream: Stream,
    strip_left: (char, usize),
    /// Rule `k` is `decoder.decoders[k]` (a `Sequence`), else `decoder`.
    sequence: bool,
}

impl Plan {
    /// The JSON path of rule `k`.
    fn rule_path(&self, k: usize) -> String {
        if self.sequence {
            format!("decoder.decoders[{k}]")
        } else {
            "decoder".into()
        }
    }
}

fn str_field<'a>(v: &'a Value, base: &str, key: &str) -> Result<&'a str, Error> {
    v.get(key)
        .and_then(Value::as_str)
        .ok_or_else(|| at(format!("{base}.{key}"), " must be a string"))
}

fn one_char(s: &str, base: &str, key: &str) -> Result<char, Error> {
    let mut it = s.chars();
    match (it.next(), it.next()) {
        (Some(c), None) => Ok(c),
        _ => Err(at(
            format!("{base}.{key}"),
            format!("={} must be one character", shown(s)),
        )),
    }
}

fn count_field(v: &Value, base: &str, key: &str) -> Result<usize, Error> {
    match v.get(key) {
        None | Some(Value::Null) => Ok(0),
        Some(x) => x
            .as_u64()
            .filter(|&n| n <= 255)
            .map(|n| n as usize)
            .ok_or_else(|| at(format!("{base}.{key}"), " must be an int in [0, 255]")),
    }
}

fn decoder_type<'a>(v: &'a Value, base: &str) -> Result<&'a str, Error> {
    v.get("type")
        .and_then(Value::as_str)
        .filter(|t| t.len() <= 64)
        .ok_or_else(|| {
            at(
                format!("{base}.type"),
                " must be a string of at most 64 bytes",
            )
        })
}

/// The supported decoders: ByteLevel; WordPiece; Metaspace; none; and a
/// Sequence of per-token Replace/Strip/Metaspace, then optionally
/// ByteFallback, then optionally Fuse, then optionally a left-only Strip.
/// Errors name the path of the value at fault (`decoder.decoders[2].type`).
fn plan(decoder: Option<&Value>) -> Result<(Plan, String), Error> {
    let Some(d) = decoder.filter(|d| !d.is_null()) else {
        let p = Plan {
            rules: vec![TokenRule::JoinSpace],
            stream: Stream::Text,
            strip_left: (' ', 0),
            sequence: false,
        };
        return Ok((p, "none".into()));
    };
    let ty = decoder_type(d, "decoder")?;
    let sequence = ty == "Sequence";
    let items: Vec<&Value> = if sequence {
        let list = d
            .get("decoders")
            .and_then(Value::as_array)
            .ok_or_else(|| at("decoder.decoders".into(), " must be a list"))?;
        Problem::at_most_entries(list.len(), MAX_DECODER_RULES, false)
            .map_err(|p| at("decoder.decoders".into(), p.about("")))?;
        list.iter().collect()
    } else {
        vec![d]
    };
    let base = |k: usize| {
        if sequence {
            format!("decoder.decoders[{k}]")
        } else {
            "decoder".to_owned()
        }
    };
    let names = items
        .iter()
        .enumerate()
        .map(|(k, v)| decoder_type(v, &base(k)).map(str::to_owned))
        .collect::<Result<Vec<_>, _>>()?;
    let name = if sequence {
        format!("Sequence[{}]", names.join(", "))
    } else {
        ty.to_owned()
    };
    let unsupported = |path: String, why: &str| {
        at(
            path,
            format!(
                ": unsupported decoder {}: {why}; stopline decodes ByteLevel, WordPiece, \
                 Metaspace, no decoder, and Sequence[Replace/Strip/Metaspace..., ByteFallback?, \
                 Fuse?, Strip(left)?]",
                shown_repr(&name)
            ),
        )
    };
    let mut p = Plan {
        rules: vec![],
        stream: Stream::Text,
        strip_left: (' ', 0),
        sequence,
    };
    // 0: per-token rules, 1: after ByteFallback, 2: after Fuse, 3: after the final Strip.
    let mut phase = 0;
    for (k, (v, ty)) in items.iter().zip(&names).enumerate() {
        let base = base(k);
        match ty.as_str() {
            "ByteLevel" if items.len() == 1 => p.stream = Stream::Lossy,
            "WordPiece" if items.len() == 1 => {
                let prefix = v.get("prefix").and_then(Value::as_str).unwrap_or("##");
                let cleanup = v.get("cleanup").and_then(Value::as_bool).unwrap_or(true);
                p.rules
                    .push(TokenRule::WordPiece(prefix.to_owned(), cleanup));
            }
            "Replace" if phase == 0 => {
                let pattern = v
                    .get("pattern")
                    .and_then(|p| p.get("String"))
                    .and_then(Value::as_str)
                    .ok_or_else(|| {
                        unsupported(
                            format!("{base}.pattern"),
                            "Replace needs a {\"String\": ...} pattern",
                        )
                    })?;
                if pattern.is_empty() {
                    return Err(unsupported(
                        format!("{base}.pattern.String"),
                        "Replace with an empty pattern",
                    ));
                }
                let content = str_field(v, &base, "content")?;
                p.rules
                    .push(TokenRule::Replace(pattern.to_owned(), content.to_owned()));
            }
            "Metaspace" if phase == 0 => {
                let r = one_char(str_field(v, &base, "replacement")?, &base, "replacement")?;
                // `prepend_scheme` (tokenizers >= 0.19) or the older `add_prefix_space`.
                let first_drops = match v.get("prepend_scheme").and_then(Value::as_str) {
                    Some("never") => false,
                    Some("first" | "always") => true,
                    Some(other) => {
                        return Err(unsupported(
                            format!("{base}.prepend_scheme"),
                            &format!("Metaspace prepend_scheme {}", shown(other)),
                        ))
                    }
                    None => v
                        .get("add_prefix_space")
                        .and_then(Value::as_bool)
                        .unwrap_or(true),
                };
                p.rules.push(TokenRule::Metaspace(r, first_drops));
            }
            "Strip" if phase <= 2 => {
                let c = one_char(str_field(v, &base, "content")?, &base, "content")?;
                let (start, stop) = (
                    count_field(v, &base, "start")?,
                    count_field(v, &base, "stop")?,
                );
                match phase {
                    0 => p.rules.push(TokenRule::Strip(c, start, stop)),
                    2 if stop == 0 => {
                        p.strip_left = (c, start);
                        phase = 3;
                    }
                    2 => {
                        return Err(unsupported(
                            format!("{base}.stop"),
                            "Strip from the right of the whole text",
                        ))
                    }
                    _ => {
                        return Err(unsupported(
                            format!("{base}.type"),
                            "Strip after ByteFallback without Fuse",
                        ))
                    }
                }
            }
            "ByteFallback" if phase == 0 => {
                p.stream = Stream::ByteRuns;
                phase = 1;
            }
            "Fuse" if phase <= 1 => phase = 2,
            other => {
                return Err(unsupported(
                    format!("{base}.type"),
                    &format!(
                        "{other} is not supported{}",
                        if items.len() > 1 {
                            " at this place"
                        } else {
                            ""
                        }
                    ),
                ))
            }
        }
    }
    Ok((p, name))
}

/// WordPiece's cleanup (tokenizers' `wordpiece::cleanup`): spaces before
/// punctuation and English contractions.
fn wordpiece_cleanup(s: &str) -> String {
    s.replace(" .", ".")
        .replace(" ?", "?")
        .replace(" !", "!")
        .replace(" ,", ",")
        .replace(" ' ", "'")
        .replace(" n't", "n't")
        .replace(" 'm", "'m")
        .replace(" do not", " don't")
        .replace(" 's", "'s")
        .replace(" 've", "'ve")
        .replace(" 're", "'re")
}

/// Applies the per-token rules, refusing any intermediate text over
/// [`MAX_TOKEN_BYTES`] before building it and counting every rule's output
/// against `budget` ([`MAX_RULE_OUTPUT_BYTES`] for the whole build).
fn apply_rules<'t>(
    plan: &Plan,
    token: &'t str,
    first: bool,
    id: usize,
    budget: &mut usize,
) -> Result<Cow<'t, str>, Error> {
    let mut s = Cow::Borrowed(token);
    for (k, r) in plan.rules.iter().enumerate() {
        if let TokenRule::Replace(p, c) = r {
            // The length after the replacement, known before it is built.
            let n = s.matches(p.as_str()).count();
            let len = (s.len() - n * p.len()).saturating_add(n.saturating_mul(c.len()));
            if len > MAX_TOKEN_BYTES {
                return Err(at(
                    plan.rule_path(k),
                    format!(
                        " (Replace {} -> {} bytes) makes token id {id} {len} bytes, more than \
                         the supported {MAX_TOKEN_BYTES} (max_token_bytes)",
                        shown(p),
                        c.len()
                    ),
                ));
            }
        }
        s = Cow::Owned(match r {
            TokenRule::Replace(p, c) => s.replace(p.as_str(), c),
            TokenRule::Metaspace(r, first_drops) => {
                if first && *first_drops {
                    s.chars().filter(|c| c != r).collect()
                } else {
                    s.chars().map(|c| if c == *r { ' ' } else { c }).collect()
                }
            }
            TokenRule::Strip(c, start, stop) => {
                let chars: Vec<char> = s.chars().collect();
                let a = chars.iter().take(*start).take_while(|&&x| x == *c).count();
                let b = chars[a..]
                    .iter()
                    .rev()
                    .take(*stop)
                    .take_while(|&&x| x == *c)
                    .count();
                chars[a..chars.len() - b].iter().collect()
            }
            TokenRule::WordPiece(prefix, cleanup) => {
                let t = if first {
                    s.into_owned()
                } else if let Some(rest) = s.strip_prefix(prefix.as_str()) {
                    rest.to_owned()
                } else {
                    format!(" {s}")
                };
                if *cleanup {
                    wordpiece_cleanup(&t)
                } else {
                    t
                }
            }
            TokenRule::JoinSpace => {
                if first {
                    s.into_owned()
                } else {
                    format!(" {s}")
                }
            }
        });
        // Only Replace grows a token by more than a byte.
        if s.len() > MAX_TOKEN_BYTES {
            return Err(at(
                plan.rule_path(k),
                format!(
                    " makes token id {id} {} bytes, more than the supported {MAX_TOKEN_BYTES} \
                     (max_token_bytes)",
                    s.len()
                ),
            ));
        }
        *budget = budget.checked_sub(s.len()).ok_or_else(|| {
            at(
                "decoder".into(),
                format!(
                    ": its rules produce more than {MAX_RULE_OUTPUT_BYTES} bytes over the \
                     vocabulary (max_rule_output_bytes; {} rules, reached at token id {id})",
                    plan.rules.len()
                ),
            )
        })?;
    }
    Ok(s)
}

/// Appends one id's bytes; `total` counts both arenas against
/// [`MAX_DECODED_BYTES`], and growth is fallible (never an abort).
fn arena_push(
    arena: &mut Vec<u8>,
    offsets: &mut Vec<u32>,
    bytes: &[u8],
    total: &mut usize,
) -> Result<(), Error> {
    *total += bytes.len();
    if *total > MAX_DECODED_BYTES {
        return Err(at(
            String::new(),
            format!(
                ": the decoded vocabulary is more than the supported {MAX_DECODED_BYTES} bytes \
                 (max_decoded_bytes)"
            ),
        ));
    }
    let oom = |_| Error::Alloc {
        what: format!("a decoded vocabulary of {total} bytes"),
    };
    arena.try_reserve(bytes.len()).map_err(oom)?;
    offsets.try_reserve(1).map_err(oom)?;
    arena.extend_from_slice(bytes);
    offsets.push(arena.len() as u32);
    Ok(())
}

/// Bytes of the `decoder` section (published ones are under 1 KiB); it is
/// the one part parsed into a JSON tree.
pub const MAX_DECODER_JSON_BYTES: usize = 64 << 10;

/// The longer of id `i`'s two arena entries.
fn max_len(i: usize, offsets: &[u32], first: &Option<(Vec<u32>, Vec<u8>)>) -> usize {
    let len = |o: &[u32]| (o[i + 1] - o[i]) as usize;
    first
        .as_ref()
        .map_or(len(offsets), |(o, _)| len(offsets).max(len(o)))
}

/// Adds [`SPECIAL`] to the marks of every id whose text is a special
/// added token's content (`tokenizers` skips by text, so a vocab entry
/// equal to one is skipped too). The matches are found by hashing the
/// smaller side, the special contents or the other ids' texts: the
/// transient set is bounded by the smaller of the two.
fn mark_specials(
    tokens: &[Option<Cow<'_, str>>],
    marks: &mut [u8],
    replaced: &[Cow<'_, str>],
) -> Result<(), Error> {
    let of = |special: bool| {
        let marks = &*marks;
        tokens
            .iter()
            .zip(marks)
            .filter(move |(_, &m)| (m & SPECIAL != 0) == special)
            .filter_map(|(t, _)| t.as_deref())
    };
    let specials = || of(true).chain(replaced.iter().map(|c| &**c));
    let (n_special, n_other) = (specials().count(), of(false).count());
    if n_special == 0 || n_other == 0 {
        return Ok(());
    }
    fn set<'a>(
        n: usize,
        texts: impl Iterator<Item = &'a str>,
    ) -> Result<FxHashSet<&'a str>, Error> {
        let mut set: FxHashSet<&str> = FxHashSet::default();
        set.try_reserve(n).map_err(|_| Error::Alloc {
            what: format!("a set of {n} special token texts"),
        })?;
        set.extend(texts);
        Ok(set)
    }
    let matched = if n_special <= n_other {
        set(n_special, specials())?
    } else {
        let others = set(n_other, of(false))?;
        let hits = specials().filter(|t| others.contains(t)).count();
        set(hits, specials().filter(|t| others.contains(t)))?
    };
    if matched.is_empty() {
        return Ok(());
    }
    for (t, m) in tokens.iter().zip(marks.iter_mut()) {
        if t.as_deref().is_some_and(|t| matched.contains(t)) {
            *m |= SPECIAL;
        }
    }
    Ok(())
}

impl Vocabulary {
    /// Builds the vocabulary from the text of a `tokenizer.json`.
    ///
    /// # Errors
    /// [`Error::Tokenizer`] naming the JSON path of what is wrong (its
    /// `field`): not JSON, larger than [`MAX_TOKENIZER_JSON_BYTES`], no
    /// `model.vocab`, an id at or above [`MAX_VOCAB_SIZE`], an unsupported
    /// decoder (named) or a decoder over its caps; [`Error::Alloc`] when a
    /// table cannot be allocated.
    pub fn from_json(json: &[u8]) -> Result<Self, Error> {
        let parsed = tokenizer_json::read(json)?;
        let decoder: Option<Value> = match parsed.decoder {
            None => None,
            Some(raw) => {
                let n = raw.get().len();
                if n > MAX_DECODER_JSON_BYTES {
                    return Err(at(
                        "decoder".into(),
                        format!(
                            " is {n} bytes of JSON, more than the supported \
                             {MAX_DECODER_JSON_BYTES}"
                        ),
                    ));
                }
                Some(serde_json::from_str(raw.get()).map_err(|e| {
                    at(
                        "decoder".into(),
                        format!(" is not valid JSON: {}", shown_repr(&e.to_string())),
                    )
                })?)
            }
        };
        let (plan, decoder_name) = plan(decoder.as_ref())?;

        // id -> token string: the model's vocabulary, overridden by added
        // tokens; the reader's marks become the flags in place.
        let tokenizer_json::Parsed {
            tokens,
            marks: mut flags,
            replaced_specials,
            ..
        } = parsed;
        mark_specials(&tokens, &mut flags, &replaced_specials)?;
        let n = tokens.len();
        let lossy = plan.stream == Stream::Lossy;
        let table = byte_level_table();
        let has_first = plan.rules.iter().any(|r| {
            matches!(
                r,
                TokenRule::Metaspace(..) | TokenRule::WordPiece(..) | TokenRule::JoinSpace
            )
        });
        let oom = |_| Error::Alloc {
            what: format!("the tables of {n} token ids"),
        };
        let mut offsets = Vec::new();
        offsets.try_reserve_exact(n + 1).map_err(oom)?;
        let mut arena = Vec::new();
        offsets.push(0);
        let (mut f_offsets, mut f_arena) = (vec![0u32], Vec::new());
        let (mut added_ids, mut added_ends, mut added_text) =
            (Vec::new(), Vec::new(), String::new());
        let mut bytes = Vec::new();
        let (mut total, mut budget) = (0, MAX_RULE_OUTPUT_BYTES);
        for (i, tok) in tokens.iter().enumerate() {
            let Some(tok) = tok.as_deref() else {
                flags[i] = 0;
                arena_push(&mut arena, &mut offsets, b"", &mut total)?;
                if has_first {
                    arena_push(&mut f_arena, &mut f_offsets, b"", &mut total)?;
                }
                continue;
            };
            let mut f = PRESENT | (flags[i] & (SPECIAL | ADDED));
            if f & ADDED != 0 {
                let k = added_ids.len() + 1;
                let oom = move |_| Error::Alloc {
                    what: format!("the contents of {k} added tokens"),
                };
                added_ids.try_reserve(1).map_err(oom)?;
                added_ends.try_reserve(1).map_err(oom)?;
                added_text.try_reserve(tok.len()).map_err(oom)?;
                added_text.push_str(tok);
                added_ids.push(i as u32);
                // At most the file's size, under 4 GiB.
                added_ends.push(added_text.len() as u32);
            }
            let text = apply_rules(&plan, tok, false, i, &mut budget)?;
            bytes.clear();
            if lossy {
                byte_level_bytes(&table, &text, &mut bytes);
            } else if let Some(b) = (plan.stream == Stream::ByteRuns)
                .then(|| byte_token(&text))
                .flatten()
            {
                f |= BYTE;
                bytes.push(b);
            } else {
                bytes.extend_from_slice(text.as_bytes());
            }
            if f & BYTE == 0 && std::str::from_utf8(&bytes).is_ok() {
                f |= UTF8;
            }
            flags[i] = f;
            arena_push(&mut arena, &mut offsets, &bytes, &mut total)?;
            if has_first {
                let t = apply_rules(&plan, tok, true, i, &mut budget)?;
                let fb = if f & BYTE != 0 {
                    &bytes[..]
                } else {
                    t.as_bytes()
                };
                arena_push(&mut f_arena, &mut f_offsets, fb, &mut total)?;
            }
        }
        let first = has_first.then_some((f_offsets, f_arena));
        let longest_added = added_ends
            .iter()
            .scan(0, |start, &end| {
                let len = end - std::mem::replace(start, end);
                Some(len as usize)
            })
            .max()
            .unwrap_or(0);
        let max_step = 12
            + 3 * (0..flags.len())
                .map(|i| max_len(i, &offsets, &first))
                .max()
                .unwrap_or(0)
            + longest_added;
        let mut v = Vocabulary {
            stream: plan.stream,
            flags,
            offsets,
            arena,
            first,
            max_step,
            added_ids,
            added_ends,
            added_text,
            strip_left: plan.strip_left.1.min(255) as u8,
            strip_char: plan.strip_left.0,
            decoder_name,
            fingerprint: 0,
        };
        v.fingerprint = v.hash_tables();
        Ok(v)
    }

    /// A hash of everything decoding reads: vocabularies that decode alike
    /// (the same file, or one that differs only in what decoding ignores)
    /// hash alike.
    fn hash_tables(&self) -> u64 {
        let mut h = crate::snapshot::Hash::new(0x0076_6f63_6162);
        h.word(self.stream as u64);
        h.bytes(&self.flags);
        self.offsets.iter().for_each(|&o| h.word(o.into()));
        h.bytes(&self.arena);
        if let Some((o, a)) = &self.first {
            o.iter().for_each(|&x| h.word(x.into()));
            h.bytes(a);
        }
        // Added tokens are kept sorted by id, their contents end to end.
        self.added_ids.iter().for_each(|&id| h.word(id.into()));
        self.added_ends.iter().for_each(|&e| h.word(e.into()));
        h.bytes(self.added_text.as_bytes());
        h.word(u64::from(self.strip_left) | u64::from(self.strip_char) << 8);
        h.bytes(self.decoder_name.as_bytes());
        h.finish()
    }

    /// The content of added token `id` (an id flagged [`ADDED`]).
    fn added_content(&self, id: u32) -> &str {
        let k = self.added_ids.binary_search(&id).unwrap_or(0);
        let start = if k == 0 { 0 } else { self.added_ends[k - 1] };
        &self.added_text[start as usize..self.added_ends[k] as usize]
    }

    /// Ids are in `[0, vocab_size)` (one past the largest id the file names;
    /// ids without a token decode to nothing, as in `Tokenizer.decode`).
    pub fn vocab_size(&self) -> usize {
        self.flags.len()
    }

    /// The decoder as the file names it, e.g. `ByteLevel` or
    /// `Sequence[Replace, ByteFallback, Fuse, Strip]`.
    pub fn decoder_name(&self) -> &str {
        &self.decoder_name
    }

    /// Whether `id` is a special added token (skipped under
    /// `skip_special_tokens`). False outside the vocabulary.
    pub fn is_special(&self, id: u32) -> bool {
        self.flags
            .get(id as usize)
            .is_some_and(|f| f & SPECIAL != 0)
    }

    /// Bytes of the arena held for all ids (for memory reports).
    pub fn memory_usage(&self) -> usize {
        self.arena.len()
            + self.offsets.len() * 4
            + self.flags.len()
            + self
                .first
                .as_ref()
                .map_or(0, |(o, a)| o.len() * 4 + a.len())
            + self.added_ids.len() * 8
            + self.added_text.len()
    }

    /// A hash of the `tokenizer.json` this vocabulary was built from.
    pub fn fingerprint(&self) -> u64 {
        self.fingerprint
    }

    /// The leading strip budget a fresh sequence starts with.
    pub(crate) fn strip_left(&self) -> u8 {
        self.strip_left
    }

    /// A fresh sequence's state.
    pub fn start(&self, opts: DecodeOptions) -> DecodeState {
        DecodeState {
            pending: [0; 4],
            pending_len: 0,
            at_first: true,
            strip_left: self.strip_left,
            in_run: false,
            run_invalid: false,
            skip_special: opts.skip_special_tokens,
            // vLLM applies the rule only when special tokens are kept.
            raw_added_pairs: !opts.skip_special_tokens
                && !opts.spaces_between_special_tokens
                && !self.added_ids.is_empty(),
            last_added: false,
        }
    }

    /// The first id at or above [`vocab_size`](Self::vocab_size), with its
    /// index, if any.
    pub fn find_outside(&self, ids: &[u32]) -> Option<(usize, u32)> {
        let n = self.flags.len();
        ids.iter()
            .enumerate()
            .find(|(_, &id)| id as usize >= n)
            .map(|(i, &id)| (i, id))
    }

    #[inline(always)]
    fn bytes(&self, id: usize, first: bool) -> &[u8] {
        match (&self.first, first) {
            (Some((o, a)), true) => &a[o[id] as usize..o[id + 1] as usize],
            _ => &self.arena[self.offsets[id] as usize..self.offsets[id + 1] as usize],
        }
    }

    /// Decodes one id, appending the text it completes to `out`. The id
    /// must be below [`vocab_size`](Self::vocab_size) (see
    /// [`find_outside`](Self::find_outside)); an id outside is ignored.
    ///
    /// Returns true when the appended text is exactly the id's own text
    /// ([`token_text`](Self::token_text)), as for most ids: callers may reuse
    /// one string object per id then.
    #[inline]
    pub fn step(&self, st: &mut DecodeState, id: u32, out: &mut String) -> bool {
        let i = id as usize;
        let Some(&f) = self.flags.get(i) else {
            return false;
        };
        let raw = st.raw_added_pairs && {
            let added = f & ADDED != 0;
            std::mem::replace(&mut st.last_added, added) && added
        };
        if f & PRESENT == 0 || (f & SPECIAL != 0 && st.skip_special) {
            return false;
        }
        let first = std::mem::replace(&mut st.at_first, false);
        let b = self.bytes(i, first);
        let start = out.len();
        // Fast path: nothing pending, the token's text is whole UTF-8.
        let mut plain = f & UTF8 != 0 && st.pending_len == 0 && !st.in_run;
        if plain {
            debug_assert!(std::str::from_utf8(b).is_ok(), "UTF8 flag on id {id}");
            // SAFETY: UTF8 is set only for ids whose bytes are valid UTF-8.
            out.push_str(unsafe { std::str::from_utf8_unchecked(b) });
            plain = !(first && self.first.is_some());
        } else {
            match self.stream {
                Stream::Lossy | Stream::Text => self.lossy(st, b, out),
                Stream::ByteRuns => self.byte_runs(st, f, b, out),
            }
        }
        if raw {
            // vLLM replaces the step's text with the added token's content.
            out.truncate(start);
            out.push_str(self.added_content(id));
            plain = false;
        }
        if st.strip_left > 0 && out.len() > start {
            self.strip(st, out, start);
            plain = false;
        }
        plain
    }

    /// The text of `id` decoded in the middle of a sequence, when it is
    /// whole UTF-8 on its own (None for byte tokens, partial characters and
    /// ids outside the vocabulary).
    pub fn token_text(&self, id: u32) -> Option<&str> {
        let f = *self.flags.get(id as usize)?;
        if f & UTF8 == 0 {
            return None;
        }
        let b = self.bytes(id as usize, false);
        debug_assert!(std::str::from_utf8(b).is_ok(), "UTF8 flag on id {id}");
        // SAFETY: UTF8 is set only for ids whose bytes are valid UTF-8.
        Some(unsafe { std::str::from_utf8_unchecked(b) })
    }

    /// Appends what the held bytes become when the sequence ends: one
    /// U+FFFD for an incomplete character (as `from_utf8_lossy`), one per
    /// byte for an undecided byte run (as ByteFallback).
    pub fn flush(&self, st: &mut DecodeState, out: &mut String) {
        let start = out.len();
        let n = st.pending_len as usize;
        if n > 0 {
            match self.stream {
                Stream::ByteRuns => (0..n).for_each(|_| out.push_str(FFFD)),
                _ => out.push_str(FFFD),
            }
        }
        st.pending_len = 0;
        st.in_run = false;
        st.run_invalid = false;
        if st.strip_left > 0 && out.len() > start {
            self.strip(st, out, start);
        }
    }

    /// Decodes a whole id list as `Tokenizer.decode(ids, skip_special_tokens)`
    /// does (held bytes flushed at the end).
    ///
    /// # Errors
    /// [`Error::Step`] for an id outside the vocabulary or ids whose token
    /// text exceeds [`MAX_DECODE_BYTES`]; [`Error::Alloc`] when the text
    /// cannot be allocated.
    pub fn decode(&self, ids: &[u32], opts: DecodeOptions) -> Result<String, Error> {
        let mut st = self.start(opts);
        let mut out = String::new();
        self.decode_into(&mut st, ids, &mut out)?;
        self.reserve_step(&mut out)?;
        self.flush(&mut st, &mut out);
        Ok(out)
    }

    /// Steps `st` over `ids`, appending their text to `out` (no flush).
    ///
    /// # Errors
    /// As [`decode`](Self::decode), naming `token_ids`; `st` is unchanged
    /// on error.
    pub fn decode_into(
        &self,
        st: &mut DecodeState,
        ids: &[u32],
        out: &mut String,
    ) -> Result<(), Error> {
        self.check_ids(ids, "token_ids")?;
        self.check_decode_size(ids, "token_ids")?;
        let mut next = *st;
        for &id in ids {
            self.reserve_step(out)?;
            self.step(&mut next, id, out);
        }
        *st = next;
        Ok(())
    }

    /// A fresh state primed with `prompt` (its text discarded).
    ///
    /// # Errors
    /// [`Error::Step`] naming `prompt_token_ids[i]` for an id outside the
    /// vocabulary, or `prompt_token_ids` over [`MAX_DECODE_BYTES`] of token
    /// text.
    pub fn primed(&self, opts: DecodeOptions, prompt: &[u32]) -> Result<DecodeState, Error> {
        self.check_ids(prompt, "prompt_token_ids")?;
        // Its text is dropped step by step, but the work is the same.
        self.check_decode_size(prompt, "prompt_token_ids")?;
        let mut st = self.start(opts);
        let mut scratch = String::new();
        for &id in prompt {
            self.step(&mut st, id, &mut scratch);
            scratch.clear();
        }
        Ok(st)
    }

    /// [`Error::Step`] naming `field` when the token text of `ids` (each
    /// id's decoded bytes, ids outside the vocabulary counting 0) is over
    /// [`MAX_DECODE_BYTES`]: checked before anything is decoded.
    pub fn check_decode_size(&self, ids: &[u32], field: &'static str) -> Result<(), Error> {
        let mut n = 0usize;
        for &id in ids {
            n += self.max_bytes(id as usize);
            if n > MAX_DECODE_BYTES {
                return Err(Error::Step {
                    field,
                    problem: Box::new(Problem::DecodesTooLong {
                        n,
                        cap: MAX_DECODE_BYTES,
                    }),
                    slot: None,
                });
            }
        }
        Ok(())
    }

    /// Reserves, fallibly, what one [`step`](Self::step) and a
    /// [`flush`](Self::flush) can append to `out` (one compare when there is
    /// room), so that decoding never aborts on a failed allocation.
    #[inline(always)]
    pub fn reserve_step(&self, out: &mut String) -> Result<(), Error> {
        if out.capacity() - out.len() >= self.max_step {
            return Ok(());
        }
        self.grow(out)
    }

    #[cold]
    fn grow(&self, out: &mut String) -> Result<(), Error> {
        out.try_reserve(self.max_step).map_err(|_| Error::Alloc {
            what: format!("{} bytes of decoded text", out.len() + self.max_step),
        })
    }

    /// The longer of an id's two decodings (0 outside the vocabulary).
    #[inline]
    fn max_bytes(&self, id: usize) -> usize {
        if id >= self.flags.len() {
            return 0;
        }
        max_len(id, &self.offsets, &self.first)
    }

    /// [`Error::Step`] naming `field`, the index and the id of the first id
    /// outside the vocabulary.
    pub fn check_ids(&self, ids: &[u32], field: &'static str) -> Result<(), Error> {
        match self.find_outside(ids) {
            None => Ok(()),
            Some((index, id)) => Err(Error::Step {
                field,
                problem: Box::new(Problem::NotInVocabulary {
                    index,
                    id,
                    vocab_size: self.vocab_size(),
                }),
                slot: None,
            }),
        }
    }

    /// The stream-wide UTF-8 repair of the ByteLevel decoder.
    fn lossy(&self, st: &mut DecodeState, b: &[u8], out: &mut String) {
        let mut buf = [0u8; 4];
        let held = st.pending_len as usize;
        buf[..held].copy_from_slice(&st.pending[..held]);
        st.pending_len = 0;
        if held == 0 {
            return self.lossy_tail(st, b, out);
        }
        // Complete (or break) the held character with the first bytes.
        let take = b.len().min(4 - held);
        buf[held..held + take].copy_from_slice(&b[..take]);
        let joined = &buf[..held + take];
        match std::str::from_utf8(joined) {
            Ok(s) => {
                out.push_str(s);
                self.lossy_tail(st, &b[take..], out)
            }
            Err(e) if e.valid_up_to() > 0 => {
                // The held character completed within the first bytes.
                let used = e.valid_up_to() - held;
                let good = &joined[..e.valid_up_to()];
                debug_assert!(std::str::from_utf8(good).is_ok());
                // SAFETY: `from_utf8` found these bytes valid (`valid_up_to`).
                out.push_str(unsafe { std::str::from_utf8_unchecked(good) });
                self.lossy_tail(st, &b[used..], out)
            }
            Err(e) => match e.error_len() {
                // Still incomplete: every byte of `b` joined the held ones.
                None => {
                    st.pending[..held + take].copy_from_slice(joined);
                    st.pending_len = (held + take) as u8;
                }
                Some(bad_len) => {
                    out.push_str(FFFD);
                    // `bad_len` bytes of `joined` were consumed; the rest of
                    // them come from `b`.
                    let used = bad_len.saturating_sub(held);
                    self.lossy_tail(st, &b[used..], out)
                }
            },
        }
    }

    /// Lossy-decodes `b` with nothing held, holding an incomplete tail.
    fn lossy_tail(&self, st: &mut DecodeState, mut b: &[u8], out: &mut String) {
        loop {
            match std::str::from_utf8(b) {
                Ok(s) => return out.push_str(s),
                Err(e) => {
                    let (good, rest) = b.split_at(e.valid_up_to());
                    debug_assert!(std::str::from_utf8(good).is_ok());
                    // SAFETY: `from_utf8` found these bytes valid (`valid_up_to`).
                    out.push_str(unsafe { std::str::from_utf8_unchecked(good) });
                    match e.error_len() {
                        None => {
                            st.pending[..rest.len()].copy_from_slice(rest);
                            st.pending_len = rest.len() as u8;
                            return;
                        }
                        Some(n) => {
                            out.push_str(FFFD);
                            b = &rest[n..];
                        }
                    }
                }
            }
        }
    }

    /// ByteFallback: byte tokens gather into runs; text tokens end a run.
    fn byte_runs(&self, st: &mut DecodeState, f: u8, b: &[u8], out: &mut String) {
        if f & BYTE == 0 {
            // A run ends undecided: all its held bytes are invalid.
            for _ in 0..st.pending_len {
                out.push_str(FFFD);
            }
            st.pending_len = 0;
            st.in_run = false;
            st.run_invalid = false;
            debug_assert!(std::str::from_utf8(b).is_ok(), "a text token without UTF8");
            // SAFETY: a text token of this stream is valid UTF-8 (UTF8 set).
            out.push_str(unsafe { std::str::from_utf8_unchecked(b) });
            return;
        }
        st.in_run = true;
        if st.run_invalid {
            out.push_str(FFFD);
            return;
        }
        let n = st.pending_len as usize;
        st.pending[n] = b[0];
        let held = &st.pending[..n + 1];
        match std::str::from_utf8(held) {
            Ok(s) => {
                out.push_str(s);
                st.pending_len = 0;
            }
            Err(e) if e.error_len().is_none() => st.pending_len += 1,
            Err(_) => {
                // The run is not UTF-8: ByteFallback turns each of its bytes
                // into U+FFFD (those already emitted as characters stay).
                for _ in 0..=n {
                    out.push_str(FFFD);
                }
                st.pending_len = 0;
                st.run_invalid = true;
            }
        }
    }

    /// Drops up to `strip_left` leading `strip_char` from the text produced
    /// so far (`out[start..]`); any other char ends the stripping.
    fn strip(&self, st: &mut DecodeState, out: &mut String, start: usize) {
        let mut cut = start;
        for c in out[start..].chars() {
            if st.strip_left == 0 || c != self.strip_char {
                st.strip_left = 0;
                break;
            }
            st.strip_left -= 1;
            cut += c.len_utf8();
        }
        out.replace_range(start..cut, "");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bytelevel(tokens: &[&str]) -> Vocabulary {
        let vocab: serde_json::Map<String, Value> = tokens
            .iter()
            .enumerate()
            .map(|(i, t)| (t.to_string(), Value::from(i)))
            .collect();
        let j = serde_json::json!({
            "model": {"type": "BPE", "vocab": vocab},
            "decoder": {"type": "ByteLevel"},
            "added_tokens": [{"id": tokens.len(), "content": "<|end|>", "special": true}],
        });
        Vocabulary::from_json(j.to_string().as_bytes()).unwrap()
    }

    fn steps(v: &Vocabulary, ids: &[u32]) -> Vec<String> {
        let mut st = v.start(DecodeOptions::default());
        ids.iter()
            .map(|&id| {
                let mut s = String::new();
                v.step(&mut st, id, &mut s);
                s
            })
            .collect()
    }

    #[test]
    fn byte_level_holds_incomplete_characters() {
        // "€" is E2 82 AC: ByteLevel chars â (E2), Ĥ (82), ¬ (AC).
        let v = bytelevel(&["a", "â", "Ĥ", "¬", "ĠâĤ¬", "ÿ"]);
        assert_eq!(steps(&v, &[1, 2, 3, 0]), ["", "", "€", "a"]);
        assert_eq!(steps(&v, &[4]), [" €"]);
        // An invalid byte is U+FFFD at once; a broken character too.
        assert_eq!(steps(&v, &[5, 1, 0]), ["\u{FFFD}", "", "\u{FFFD}a"]);
        assert_eq!(
            v.decode(&[1, 2], DecodeOptions::default()).unwrap(),
            "\u{FFFD}"
        );
        assert_eq!(v.decode(&[6, 0], DecodeOptions::default()).unwrap(), "a");
        let keep = DecodeOptions {
            skip_special_tokens: false,
            ..DecodeOptions::default()
        };
        assert_eq!(v.decode(&[1, 6], keep).unwrap(), "\u{FFFD}<|end|>");
        assert!(v.decode(&[7], keep).is_err());
    }

    #[test]
    fn sentencepiece_byte_runs_and_strip() {
        let vocab = serde_json::json!({"▁Hi": 0, "<0xE2>": 1, "<0x82>": 2, "<0xAC>": 3, "x": 4, "<0x41>": 5, "<0xFF>": 6});
        let j = serde_json::json!({
            "model": {"type": "BPE", "vocab": vocab},
            "decoder": {"type": "Sequence", "decoders": [
                {"type": "Replace", "pattern": {"String": "▁"}, "content": " "},
                {"type": "ByteFallback"}, {"type": "Fuse"},
                {"type": "Strip", "content": " ", "start": 1, "stop": 0}]},
        });
        let v = Vocabulary::from_json(j.to_string().as_bytes()).unwrap();
        assert_eq!(steps(&v, &[0, 0, 1, 2, 3]), ["Hi", " Hi", "", "", "€"]);
        // An undecided run ending: one U+FFFD per byte.
        assert_eq!(steps(&v, &[1, 2, 4]), ["", "", "\u{FFFD}\u{FFFD}x"]);
        assert_eq!(steps(&v, &[6, 5, 4]), ["\u{FFFD}", "\u{FFFD}", "x"]);
        assert_eq!(
            v.decode(&[1, 2], DecodeOptions::default()).unwrap(),
            "\u{FFFD}\u{FFFD}"
        );
    }

    #[test]
    fn wordpiece_first_token_and_cleanup() {
        let vocab = serde_json::json!({"hello": 0, "##s": 1, ".": 2, "[CLS]": 3});
        let j = serde_json::json!({
            "model": {"type": "WordPiece", "vocab": vocab},
            "decoder": {"type": "WordPiece", "prefix": "##", "cleanup": true},
            "added_tokens": [{"id": 3, "content": "[CLS]", "special": true}],
        });
        let v = Vocabulary::from_json(j.to_string().as_bytes()).unwrap();
        assert_eq!(
            steps(&v, &[3, 0, 1, 2, 0]),
            ["", "hello", "s", ".", " hello"]
        );
        let raw = DecodeOptions {
            skip_special_tokens: false,
            spaces_between_special_tokens: false,
        };
        let mut st = v.start(raw);
        let mut s = String::new();
        for id in [0, 3, 3] {
            v.step(&mut st, id, &mut s);
        }
        assert_eq!(s, "hello [CLS][CLS]");
    }

    #[test]
    fn malformed_files_are_errors_naming_the_json_path() {
        let seq = |decoders: &str| {
            let a = "a".repeat(4000);
            format!(
                r#"{{"model": {{"vocab": {{"{a}": 0}}}}, "decoder": {{"type": "Sequence", "decoders": {decoders}}}}}"#
            )
        };
        let replace = |p: &str, c: &str| {
            format!(r#"{{"type": "Replace", "pattern": {{"String": "{p}"}}, "content": "{c}"}}"#)
        };
        for (json, field, needle) in [
            ("{".into(), "tokenizer", "tokenizer.json is not valid JSON"),
            (
                "[]".into(),
                "tokenizer",
                "tokenizer.json must be an object, got a list",
            ),
            ("{}".into(), "tokenizer.model", "model is missing"),
            (
                r#"{"model": {"vocab": {"a": -1}}}"#.into(),
                r#"tokenizer.model.vocab["a"]"#,
                "is not a token id",
            ),
            (
                r#"{"model": {"vocab": {"a": 99999999}}}"#.into(),
                r#"tokenizer.model.vocab["a"]"#,
                "supported vocabulary size",
            ),
            (
                r#"{"model": {"vocab": {}}, "decoder": {"type": "CTC"}}"#.into(),
                "tokenizer.decoder.type",
                "decoder.type: unsupported decoder CTC",
            ),
            (
                seq(&format!(r#"[{{"type": "Fuse"}}, {}]"#, replace("a", "b"))),
                "tokenizer.decoder.decoders[1].type",
                "Sequence[Fuse, Replace]",
            ),
            (
                r#"{"model": {"vocab": {}}, "decoder": {"type": 5}}"#.into(),
                "tokenizer.decoder.type",
                "decoder.type must be a string of at most 64 bytes",
            ),
            (
                seq(r#"[{"type": "Strip", "content": "ab"}]"#),
                "tokenizer.decoder.decoders[0].content",
                "must be one character",
            ),
            (
                seq(r#"[{"type": "Strip", "content": " ", "start": -1}]"#),
                "tokenizer.decoder.decoders[0].start",
                "must be an int in [0, 255]",
            ),
            (
                seq(r#"[{"type": "Replace", "pattern": {"Regex": "x"}, "content": ""}]"#),
                "tokenizer.decoder.decoders[0].pattern",
                "Replace needs a",
            ),
            (
                seq(&format!("[{}]", replace("a", &"b".repeat(20)))),
                "tokenizer.decoder.decoders[0]",
                "(Replace \"a\" -> 20 bytes) makes token id 0 80000 bytes",
            ),
            (
                seq("5"),
                "tokenizer.decoder.decoders",
                "decoder.decoders must be a list",
            ),
        ] {
            let e = Vocabulary::from_json(json.as_bytes()).err().unwrap();
            assert_eq!(e.field().as_deref(), Some(field), "{e}");
            assert!(e.to_string().contains(needle), "{e}");
            assert!(e.to_string().len() < 1000, "{e}");
        }
    }

    #[test]
    fn added_tokens_are_flagged_and_keep_their_content() {
        // id 2 is a vocab entry whose text is a special token's: skipped too.
        let j = serde_json::json!({
            "added_tokens": [
                {"id": 3, "content": "<s>", "special": true},
                {"id": 4, "content": "x y", "special": false},
            ],
            "model": {"vocab": {"a": 0, "b": 1, "<s>": 2}},
            "decoder": {"type": "ByteLevel"},
        });
        let v = Vocabulary::from_json(j.to_string().as_bytes()).unwrap();
        assert_eq!(
            (0..5).map(|i| v.is_special(i)).collect::<Vec<_>>(),
            [false, false, true, true, false]
        );
        assert_eq!((v.added_content(3), v.added_content(4)), ("<s>", "x y"));
        let raw = DecodeOptions {
            skip_special_tokens: false,
            spaces_between_special_tokens: false,
        };
        // vLLM's rule: an added token after an added token is its raw content.
        assert_eq!(v.decode(&[0, 4, 3, 4], raw).unwrap(), "ax y<s>x y");
        // Many specials and few other ids: the other side is hashed.
        let mut added: Vec<_> = (1..100)
            .map(|i| serde_json::json!({"id": i, "content": format!("<{i}>"), "special": true}))
            .collect();
        added.push(serde_json::json!({"id": 100, "content": "b", "special": false}));
        let j = serde_json::json!({"added_tokens": added, "model": {"vocab": {"<7>": 0}}});
        let v = Vocabulary::from_json(j.to_string().as_bytes()).unwrap();
        assert!(v.is_special(0) && v.is_special(7) && !v.is_special(100));
    }

    mod props {
        use super::*;
        use proptest::prelude::*;

        proptest! {
            /// Any id stream: the steps' text plus the flush equals a
            /// whole-stream from_utf8_lossy of the token bytes, and a step
            /// never ends in a held-back (incomplete) character.
            #[test]
            fn byte_level_equals_whole_lossy(ids in prop::collection::vec(0u32..12, 0..40)) {
                let toks = ["a", "â", "Ĥ", "¬", "ĠâĤ¬", "ÿ", "ð", "Ł", "ĺ", "Ģ", "Ã©", "Ċ"];
                let v = bytelevel(&toks);
                let table = byte_level_table();
                let mut all = Vec::new();
                for &id in &ids {
                    all.extend(toks[id as usize].chars().map(|c| table[c as usize].unwrap()));
                }
                let mut st = v.start(DecodeOptions::default());
                let mut out = String::new();
                for &id in &ids {
                    v.step(&mut st, id, &mut out);
                }
                v.flush(&mut st, &mut out);
                prop_assert_eq!(out, String::from_utf8_lossy(&all).into_owned());
            }
        }
    }
}
