//! Reading a Hugging Face `tokenizer.json` for [`crate::detokenize`].
//!
//! Only `model.vocab`, `added_tokens` and the `decoder` section are kept:
//! token strings are borrowed from the file where they have no escapes,
//! vocab entries and added tokens go into one id-indexed table as they are
//! read (an added token is one table entry and one flag byte, as a vocab
//! entry), and everything else (a `merges` list, the normalizer) is skipped
//! by the parser without being built. Reading takes a small multiple of the
//! file at most, never a JSON tree.
//!
//! Every error names the JSON path of the value at fault
//! (`model.vocab["a"]`, `added_tokens[3].content`, `model.merges[12]`),
//! the JSON parser's own errors included, and shows a bounded part of any
//! value (a type is named, a value is never quoted whole). The path is
//! collected on the way out of a failed read, each level adding its
//! segment as the error passes, so a valid file pays nothing for it; when
//! the parser fails, the file is read a second time walking the skipped
//! sections too, for the path inside them.

use std::borrow::Cow;
use std::cell::RefCell;
use std::fmt;

use serde::de::{self, DeserializeSeed, Deserializer, Expected, MapAccess, SeqAccess, Visitor};
use serde_json::value::RawValue;

use crate::error::{shown, shown_repr, Error, MAX_SHOWN_BYTES};

/// The largest `tokenizer.json` accepted, in bytes (the largest published
/// ones are about 35 MB).
pub const MAX_TOKENIZER_JSON_BYTES: usize = 128 << 20;
/// Ids must be below this (the largest vocabularies hold about 260 000).
pub const MAX_VOCAB_SIZE: usize = 1 << 24;
/// Bytes of one token: its string in the file and its text after each
/// decoder rule (a `Replace` that would grow it past this is refused before
/// it is applied).
pub const MAX_TOKEN_BYTES: usize = 64 << 10;

/// Marks of an id, the same bits as the vocabulary's flags: the id is an
/// added token's, which is special.
pub(crate) const SPECIAL: u8 = 2;
pub(crate) const ADDED: u8 = 4;

/// What is read of a `tokenizer.json`.
pub(crate) struct Parsed<'a> {
    /// id -> token string: `model.vocab`, with `added_tokens` written over
    /// it whatever their order in the file.
    pub tokens: Vec<Option<Cow<'a, str>>>,
    /// Per id: [`ADDED`], and [`SPECIAL`] for an added token marked special.
    pub marks: Vec<u8>,
    /// Contents of special added tokens that a later added token with the
    /// same id replaced: an id whose text is one of them is still special.
    pub replaced_specials: Vec<Cow<'a, str>>,
    /// The `decoder` section (`None` for a missing or `null` one).
    pub decoder: Option<&'a RawValue>,
}

/// Reads `json` (at most [`MAX_TOKENIZER_JSON_BYTES`]).
///
/// # Errors
/// [`Error::Tokenizer`] naming the JSON path of the value at fault (its
/// `field`), [`Error::Alloc`] when the token table cannot be allocated.
pub(crate) fn read(json: &[u8]) -> Result<Parsed<'_>, Error> {
    if json.len() > MAX_TOKENIZER_JSON_BYTES {
        return Err(whole(format!(
            "tokenizer.json is {} bytes, more than the supported {MAX_TOKENIZER_JSON_BYTES}",
            json.len()
        )));
    }
    let (out, seen) = match pass(json, false) {
        Ok(read) => read,
        // The JSON parser failed, perhaps inside a section skipped whole:
        // read again walking those, for the path (only a failing file pays).
        Err((e, true)) => return Err(pass(json, true).err().map_or(e, |(e, _)| e)),
        Err((e, false)) => return Err(e),
    };
    if !seen.model {
        return Err(at("model".into(), " is missing"));
    }
    if !seen.vocab {
        return Err(at("model.vocab".into(), " is missing"));
    }
    Ok(out)
}

/// One reading of `json`; `deep` walks the skipped sections too, for the
/// path of an error inside them. `Err` says whether the JSON parser failed
/// (rather than this reader refusing a value).
fn pass(json: &[u8], deep: bool) -> Result<(Parsed<'_>, Seen), (Error, bool)> {
    let trail = Trail {
        deep,
        ..Trail::default()
    };
    let mut out = Parsed {
        tokens: Vec::new(),
        marks: Vec::new(),
        replaced_specials: Vec::new(),
        decoder: None,
    };
    let mut seen = Seen::default();
    let mut de = serde_json::Deserializer::from_slice(json);
    let read = RootV {
        trail: &trail,
        out: &mut out,
        seen: &mut seen,
    };
    match de.deserialize_any(read).and_then(|()| de.end()) {
        Ok(()) => Ok((out, seen)),
        Err(e) => {
            let parser = trail.refusal.borrow().is_none();
            Err((trail.into_error(e), parser))
        }
    }
}

/// An error about the file as a whole (no one value of it).
fn whole(message: String) -> Error {
    Error::Tokenizer {
        path: None,
        message,
    }
}

/// An error about the value at `path`; `what` follows the path in the
/// message (`" is not a token id"`, `": unsupported decoder ..."`). At the
/// root (an empty path) the file is the subject.
pub(crate) fn at(path: String, what: impl fmt::Display) -> Error {
    if path.is_empty() {
        return whole(format!("tokenizer.json{what}"));
    }
    Error::Tokenizer {
        message: format!("{path}{what}"),
        path: Some(path),
    }
}

/// The path segment of an object member: the name (joined with a dot) for
/// a plain name, else `["the key"]` (shown bounded).
fn member(key: &str) -> String {
    let plain = key
        .bytes()
        .next()
        .is_some_and(|b| b.is_ascii_alphabetic() || b == b'_')
        && key.len() <= 64
        && key.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_');
    if plain {
        key.to_owned()
    } else {
        entry(key)
    }
}

/// The path segment of a vocabulary entry: always `["token"]`.
fn entry(key: &str) -> String {
    format!("[{}]", shown(key))
}

fn index(i: usize) -> String {
    format!("[{i}]")
}

/// A path from its segments, outermost first (`model`, `vocab`, `["a"]`
/// give `model.vocab["a"]`). Past about 400 bytes (a value nested deep in
/// a skipped section) the middle is left out: `normalizer..pattern`.
fn render<'s>(segments: impl DoubleEndedIterator<Item = &'s str> + Clone) -> String {
    fn join<'s>(parts: impl Iterator<Item = &'s str>, out: &mut String) {
        for p in parts {
            if !out.is_empty() && !out.ends_with('.') && !p.starts_with('[') {
                out.push('.');
            }
            out.push_str(p);
        }
    }
    let budget = 2 * MAX_SHOWN_BYTES;
    let mut out = String::new();
    join(segments.clone(), &mut out);
    if out.len() <= budget {
        return out;
    }
    out.clear();
    let mut parts = segments;
    let Some(first) = parts.next() else {
        return out;
    };
    // The innermost segments that fit, at least one.
    let mut tail: Vec<&str> = Vec::new();
    let mut len = first.len();
    for p in parts.rev() {
        if !tail.is_empty() && len + p.len() + 1 > budget {
            break;
        }
        len += p.len() + 1;
        tail.push(p);
    }
    out.push_str(first);
    out.push_str("..");
    join(tail.into_iter().rev(), &mut out);
    out
}

/// Where a failed read was, and why; written only on the error path.
#[derive(Default)]
struct Trail {
    /// Walk the skipped sections ([`Skip`]) rather than skip them whole.
    deep: bool,
    /// Path segments, innermost first, added as the error passes out of
    /// each level.
    segments: RefCell<Vec<String>>,
    /// The reader's own refusal of the value at the path; `None` when the
    /// JSON parser failed.
    refusal: RefCell<Option<Refusal>>,
}

enum Refusal {
    /// Follows the path in the message.
    What(String),
    /// A whole error of its own (a failed allocation).
    Error(Error),
}

impl Trail {
    /// `e`, passing out of the value at `segment`.
    fn at<E>(&self, segment: impl FnOnce() -> String, e: E) -> E {
        self.segments.borrow_mut().push(segment());
        e
    }

    /// Refuses the value being read; `what` follows its path.
    fn refuse<E: de::Error>(&self, what: impl Into<String>) -> E {
        *self.refusal.borrow_mut() = Some(Refusal::What(what.into()));
        // Never shown: `into_error` writes the message from the refusal.
        E::custom("refused")
    }

    /// Refuses the value at `segment` of the one being read.
    fn refuse_at<E: de::Error>(&self, segment: String, what: impl Into<String>) -> E {
        self.at(|| segment, self.refuse(what))
    }

    fn fail<E: de::Error>(&self, e: Error) -> E {
        *self.refusal.borrow_mut() = Some(Refusal::Error(e));
        E::custom("failed")
    }

    fn into_error(self, e: serde_json::Error) -> Error {
        let segments = self.segments.into_inner();
        let path = render(segments.iter().rev().map(String::as_str));
        match self.refusal.into_inner() {
            Some(Refusal::Error(e)) => e,
            Some(Refusal::What(what)) => at(path, what),
            // The parser's message quotes at most a type name and a position
            // (every value is read by this module's visitors), cut anyway.
            None if e.is_data() => at(
                path,
                format!(" is malformed: {}", shown_repr(&e.to_string())),
            ),
            None => at(
                path,
                format!(" is not valid JSON: {}", shown_repr(&e.to_string())),
            ),
        }
    }
}

/// A visitor of this reader: its path's refusals.
trait Node<'de>: Visitor<'de> + Sized {
    fn trail(&self) -> &Trail;

    /// The refusal of a value of the JSON type `got` (named, not shown).
    fn wrong<E: de::Error>(&self, got: &str) -> E {
        let expected = format!("{}", self as &dyn Expected);
        self.trail()
            .refuse(format!(" must be {expected}, got {got}"))
    }
}

/// The visit methods of the JSON types a [`Node`] does not take: each
/// refuses the value by its type, without reading it further.
macro_rules! refuse {
    ($($kind:ident)*) => { $(refuse!(@ $kind);)* };
    (@ str) => {
        fn visit_str<E: de::Error>(self, _: &str) -> Result<Self::Value, E> {
            Err(self.wrong("a string"))
        }
    };
    (@ bool) => {
        fn visit_bool<E: de::Error>(self, _: bool) -> Result<Self::Value, E> {
            Err(self.wrong("a bool"))
        }
    };
    (@ number) => {
        fn visit_u64<E: de::Error>(self, _: u64) -> Result<Self::Value, E> {
            Err(self.wrong("a number"))
        }
        fn visit_i64<E: de::Error>(self, _: i64) -> Result<Self::Value, E> {
            Err(self.wrong("a number"))
        }
        fn visit_f64<E: de::Error>(self, _: f64) -> Result<Self::Value, E> {
            Err(self.wrong("a number"))
        }
    };
    (@ null) => {
        fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
            Err(self.wrong("null"))
        }
    };
    (@ list) => {
        fn visit_seq<A: SeqAccess<'de>>(self, _: A) -> Result<Self::Value, A::Error> {
            Err(self.wrong("a list"))
        }
    };
    (@ object) => {
        fn visit_map<A: MapAccess<'de>>(self, _: A) -> Result<Self::Value, A::Error> {
            Err(self.wrong("an object"))
        }
    };
}

/// A string, borrowed when the file has it without escapes.
struct Str<'a>(Cow<'a, str>);

impl<'de> de::Deserialize<'de> for Str<'de> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Str<'de>;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a string")
            }
            fn visit_borrowed_str<E>(self, v: &'de str) -> Result<Str<'de>, E> {
                Ok(Str(Cow::Borrowed(v)))
            }
            fn visit_str<E>(self, v: &str) -> Result<Str<'de>, E> {
                Ok(Str(Cow::Owned(v.to_owned())))
            }
        }
        d.deserialize_str(V)
    }
}

/// Which of the keys read once were seen.
#[derive(Default)]
struct Seen {
    model: bool,
    vocab: bool,
    added_tokens: bool,
    decoder: bool,
}

/// `true` once: a second `key` is refused (which of two would count is not
/// for the reader to guess; `tokenizers` refuses it too).
fn once<E: de::Error>(trail: &Trail, flag: &mut bool, key: &str) -> Result<(), E> {
    if std::mem::replace(flag, true) {
        return Err(trail.refuse_at(member(key), " appears twice"));
    }
    Ok(())
}

/// Any value, kept in no form: skipped whole by the parser, or (a
/// [`Trail::deep`] reading) walked, so that a failure inside names the
/// index or key it was under. Walking costs a fifth more on a file that is
/// all `merges` (every string is parsed and checked as UTF-8), so it is
/// done only for a file already known to fail.
#[derive(Clone, Copy)]
struct Skip<'t>(&'t Trail);

impl<'de> DeserializeSeed<'de> for Skip<'_> {
    type Value = ();
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        if self.0.deep {
            d.deserialize_any(self)
        } else {
            d.deserialize_ignored_any(de::IgnoredAny).map(drop)
        }
    }
}

impl<'de> Visitor<'de> for Skip<'_> {
    type Value = ();
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("any JSON value")
    }
    fn visit_bool<E>(self, _: bool) -> Result<(), E> {
        Ok(())
    }
    fn visit_u64<E>(self, _: u64) -> Result<(), E> {
        Ok(())
    }
    fn visit_i64<E>(self, _: i64) -> Result<(), E> {
        Ok(())
    }
    fn visit_f64<E>(self, _: f64) -> Result<(), E> {
        Ok(())
    }
    fn visit_str<E>(self, _: &str) -> Result<(), E> {
        Ok(())
    }
    fn visit_unit<E>(self) -> Result<(), E> {
        Ok(())
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut a: A) -> Result<(), A::Error> {
        let mut i = 0;
        while a
            .next_element_seed(self)
            .map_err(|e| self.0.at(|| index(i), e))?
            .is_some()
        {
            i += 1;
        }
        Ok(())
    }
    fn visit_map<A: MapAccess<'de>>(self, mut a: A) -> Result<(), A::Error> {
        while let Some(key) = a.next_key::<Str<'de>>()? {
            a.next_value_seed(self)
                .map_err(|e| self.0.at(|| member(&key.0), e))?;
        }
        Ok(())
    }
}

/// The root object.
struct RootV<'t, 'a> {
    trail: &'t Trail,
    out: &'t mut Parsed<'a>,
    seen: &'t mut Seen,
}

impl<'de> Node<'de> for RootV<'_, 'de> {
    fn trail(&self) -> &Trail {
        self.trail
    }
}

impl<'de> Visitor<'de> for RootV<'_, 'de> {
    type Value = ();
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("an object")
    }
    fn visit_map<A: MapAccess<'de>>(self, mut a: A) -> Result<(), A::Error> {
        let RootV { trail, out, seen } = self;
        while let Some(key) = a.next_key::<Str<'de>>()? {
            let read = match &*key.0 {
                "model" => {
                    once(trail, &mut seen.model, "model")?;
                    a.next_value_seed(ModelV {
                        trail,
                        out: &mut *out,
                        seen: &mut *seen,
                    })
                }
                "added_tokens" => {
                    once(trail, &mut seen.added_tokens, "added_tokens")?;
                    a.next_value_seed(AddedListV {
                        trail,
                        out: &mut *out,
                    })
                }
                "decoder" => {
                    once(trail, &mut seen.decoder, "decoder")?;
                    a.next_value::<&'de RawValue>().map(|raw| {
                        out.decoder = (raw.get() != "null").then_some(raw);
                    })
                }
                _ => a.next_value_seed(Skip(trail)),
            };
            read.map_err(|e| trail.at(|| member(&key.0), e))?;
        }
        Ok(())
    }
    refuse!(str bool number null list);
}

/// `model`: only its `vocab`.
struct ModelV<'t, 'a> {
    trail: &'t Trail,
    out: &'t mut Parsed<'a>,
    seen: &'t mut Seen,
}

impl<'de> Node<'de> for ModelV<'_, 'de> {
    fn trail(&self) -> &Trail {
        self.trail
    }
}

impl<'de> DeserializeSeed<'de> for ModelV<'_, 'de> {
    type Value = ();
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for ModelV<'_, 'de> {
    type Value = ();
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("an object")
    }
    fn visit_map<A: MapAccess<'de>>(self, mut a: A) -> Result<(), A::Error> {
        let ModelV { trail, out, seen } = self;
        while let Some(key) = a.next_key::<Str<'de>>()? {
            let read = if key.0 == "vocab" {
                once(trail, &mut seen.vocab, "vocab")?;
                a.next_value_seed(VocabV {
                    trail,
                    out: &mut *out,
                })
            } else {
                a.next_value_seed(Skip(trail))
            };
            read.map_err(|e| trail.at(|| member(&key.0), e))?;
        }
        Ok(())
    }
    refuse!(str bool number null list);
}

/// Grows the table to hold id `i` (below [`MAX_VOCAB_SIZE`]), fallibly.
fn grow<E: de::Error>(trail: &Trail, out: &mut Parsed<'_>, i: usize) -> Result<(), E> {
    if out.tokens.len() <= i {
        let more = i + 1 - out.tokens.len();
        if out.tokens.try_reserve(more).is_err() || out.marks.try_reserve(more).is_err() {
            return Err(trail.fail(Error::Alloc {
                what: format!("a token table of {} ids", i + 1),
            }));
        }
        out.tokens.resize(i + 1, None);
        out.marks.resize(i + 1, 0);
    }
    Ok(())
}

/// `id` as an index below [`MAX_VOCAB_SIZE`], else the refusal of the value
/// at `segment`.
fn check_id<E: de::Error>(
    trail: &Trail,
    id: u64,
    segment: impl FnOnce() -> String,
) -> Result<usize, E> {
    usize::try_from(id)
        .ok()
        .filter(|&i| i < MAX_VOCAB_SIZE)
        .ok_or_else(|| {
            trail.refuse_at(
                segment(),
                format!("={id} is not below the supported vocabulary size {MAX_VOCAB_SIZE}"),
            )
        })
}

/// A token of at most [`MAX_TOKEN_BYTES`], else the refusal of the value at
/// `segment`.
fn check_token<E: de::Error>(
    trail: &Trail,
    token: &str,
    id: usize,
    segment: impl FnOnce() -> String,
) -> Result<(), E> {
    if token.len() > MAX_TOKEN_BYTES {
        return Err(trail.refuse_at(
            segment(),
            format!(
                ": token id {id} is {} bytes, more than the supported {MAX_TOKEN_BYTES} \
                 (max_token_bytes)",
                token.len()
            ),
        ));
    }
    Ok(())
}

/// `model.vocab`: `{token: id}` (BPE, WordPiece, WordLevel) or
/// `[[piece, score], ...]` (Unigram, the id is the index).
struct VocabV<'t, 'a> {
    trail: &'t Trail,
    out: &'t mut Parsed<'a>,
}

impl<'de> Node<'de> for VocabV<'_, 'de> {
    fn trail(&self) -> &Trail {
        self.trail
    }
}

impl<'de> DeserializeSeed<'de> for VocabV<'_, 'de> {
    type Value = ();
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for VocabV<'_, 'de> {
    type Value = ();
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("an object or a list")
    }
    fn visit_map<A: MapAccess<'de>>(self, mut a: A) -> Result<(), A::Error> {
        let (trail, out) = (self.trail, self.out);
        while let Some(Str(tok)) = a.next_key()? {
            let id = a
                .next_value_seed(IdV(trail))
                .map_err(|e| trail.at(|| entry(&tok), e))?;
            let i = check_id(trail, id, || entry(&tok))?;
            check_token(trail, &tok, i, || entry(&tok))?;
            grow(trail, out, i)?;
            // An added token of the same id wins, whichever comes first.
            if out.marks[i] & ADDED == 0 {
                out.tokens[i] = Some(tok);
            }
        }
        Ok(())
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut a: A) -> Result<(), A::Error> {
        let (trail, out) = (self.trail, self.out);
        let mut i = 0;
        while let Some(tok) = a
            .next_element_seed(PieceV(trail))
            .map_err(|e| trail.at(|| index(i), e))?
        {
            if i >= MAX_VOCAB_SIZE {
                return Err(trail.refuse(format!(
                    " has more entries than the supported vocabulary size {MAX_VOCAB_SIZE}"
                )));
            }
            check_token(trail, &tok, i, || index(i))?;
            grow(trail, out, i)?;
            if out.marks[i] & ADDED == 0 {
                out.tokens[i] = Some(tok);
            }
            i += 1;
        }
        Ok(())
    }
    refuse!(str bool number null);
}

/// A token id: a non-negative integer.
struct IdV<'t>(&'t Trail);

impl<'de> Node<'de> for IdV<'_> {
    fn trail(&self) -> &Trail {
        self.0
    }
    fn wrong<E: de::Error>(&self, _: &str) -> E {
        self.0.refuse(" is not a token id")
    }
}

impl<'de> DeserializeSeed<'de> for IdV<'_> {
    type Value = u64;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<u64, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for IdV<'_> {
    type Value = u64;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a token id")
    }
    fn visit_u64<E>(self, v: u64) -> Result<u64, E> {
        Ok(v)
    }
    fn visit_i64<E: de::Error>(self, _: i64) -> Result<u64, E> {
        // serde_json gives non-negative integers to visit_u64.
        Err(self.wrong("a negative number"))
    }
    fn visit_f64<E: de::Error>(self, _: f64) -> Result<u64, E> {
        Err(self.wrong("a number"))
    }
    refuse!(str bool null list object);
}

/// One Unigram entry, `[piece, score]`: the piece.
struct PieceV<'t>(&'t Trail);

impl<'de> Node<'de> for PieceV<'_> {
    fn trail(&self) -> &Trail {
        self.0
    }
}

impl<'de> DeserializeSeed<'de> for PieceV<'_> {
    type Value = Cow<'de, str>;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Cow<'de, str>, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for PieceV<'_> {
    type Value = Cow<'de, str>;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a [piece, score] list")
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut a: A) -> Result<Cow<'de, str>, A::Error> {
        let trail = self.0;
        let piece = a
            .next_element_seed(StrV(trail))
            .map_err(|e| trail.at(|| index(0), e))?
            .ok_or_else(|| self.wrong("an empty list"))?;
        let mut i = 1;
        while a
            .next_element_seed(Skip(trail))
            .map_err(|e| trail.at(|| index(i), e))?
            .is_some()
        {
            i += 1;
        }
        Ok(piece)
    }
    refuse!(str bool number null object);
}

/// A string value.
struct StrV<'t>(&'t Trail);

impl<'de> Node<'de> for StrV<'_> {
    fn trail(&self) -> &Trail {
        self.0
    }
}

impl<'de> DeserializeSeed<'de> for StrV<'_> {
    type Value = Cow<'de, str>;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Cow<'de, str>, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for StrV<'_> {
    type Value = Cow<'de, str>;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a string")
    }
    fn visit_borrowed_str<E>(self, v: &'de str) -> Result<Cow<'de, str>, E> {
        Ok(Cow::Borrowed(v))
    }
    fn visit_str<E>(self, v: &str) -> Result<Cow<'de, str>, E> {
        Ok(Cow::Owned(v.to_owned()))
    }
    refuse!(bool number null list object);
}

/// A bool value.
struct BoolV<'t>(&'t Trail);

impl<'de> Node<'de> for BoolV<'_> {
    fn trail(&self) -> &Trail {
        self.0
    }
}

impl<'de> DeserializeSeed<'de> for BoolV<'_> {
    type Value = bool;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<bool, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for BoolV<'_> {
    type Value = bool;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a bool")
    }
    fn visit_bool<E>(self, v: bool) -> Result<bool, E> {
        Ok(v)
    }
    refuse!(str number null list object);
}

/// `added_tokens` (`null`: none): each entry's `id`, `content` and
/// `special` go straight into the table.
struct AddedListV<'t, 'a> {
    trail: &'t Trail,
    out: &'t mut Parsed<'a>,
}

impl<'de> Node<'de> for AddedListV<'_, 'de> {
    fn trail(&self) -> &Trail {
        self.trail
    }
}

impl<'de> DeserializeSeed<'de> for AddedListV<'_, 'de> {
    type Value = ();
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for AddedListV<'_, 'de> {
    type Value = ();
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a list or null")
    }
    fn visit_unit<E>(self) -> Result<(), E> {
        Ok(())
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut a: A) -> Result<(), A::Error> {
        let (trail, out) = (self.trail, self.out);
        let mut k = 0;
        while a
            .next_element_seed(AddedV {
                trail,
                out: &mut *out,
            })
            .map_err(|e| trail.at(|| index(k), e))?
            .is_some()
        {
            k += 1;
        }
        Ok(())
    }
    refuse!(str bool number object);
}

/// One added token.
struct AddedV<'t, 'a> {
    trail: &'t Trail,
    out: &'t mut Parsed<'a>,
}

impl<'de> Node<'de> for AddedV<'_, 'de> {
    fn trail(&self) -> &Trail {
        self.trail
    }
}

impl<'de> DeserializeSeed<'de> for AddedV<'_, 'de> {
    type Value = ();
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for AddedV<'_, 'de> {
    type Value = ();
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("an object")
    }
    fn visit_map<A: MapAccess<'de>>(self, mut a: A) -> Result<(), A::Error> {
        let (trail, out) = (self.trail, self.out);
        let (mut id, mut content, mut special) = (None, None, false);
        while let Some(Str(key)) = a.next_key()? {
            match &*key {
                "id" => a.next_value_seed(IdV(trail)).map(|v| id = Some(v)),
                "content" => a.next_value_seed(StrV(trail)).map(|v| content = Some(v)),
                "special" => a.next_value_seed(BoolV(trail)).map(|v| special = v),
                _ => a.next_value_seed(Skip(trail)),
            }
            .map_err(|e| trail.at(|| member(&key), e))?;
        }
        let missing = |name: &str| trail.refuse_at(name.into(), " is missing");
        let id = id.ok_or_else(|| missing("id"))?;
        let content = content.ok_or_else(|| missing("content"))?;
        let i = check_id(trail, id, || "id".into())?;
        check_token(trail, &content, i, || "content".into())?;
        grow(trail, out, i)?;
        let was_special = out.marks[i] & SPECIAL != 0;
        let old = out.tokens[i].replace(content);
        // A special content this id no longer holds keeps its text special.
        if was_special && !(special && old == out.tokens[i]) {
            if out.replaced_specials.try_reserve(1).is_err() {
                return Err(trail.fail(Error::Alloc {
                    what: "the replaced special tokens".into(),
                }));
            }
            out.replaced_specials.extend(old);
        }
        out.marks[i] = ADDED | if special { SPECIAL } else { 0 };
        Ok(())
    }
    refuse!(str bool number null list);
}

/// Reads a `tokenizer.json` file, refusing (`Ok(Err(..))`, naming the path
/// as `shown`) anything but a regular file of at most
/// [`MAX_TOKENIZER_JSON_BYTES`]: checked on the path before it is opened
/// (a FIFO would block the open, `/dev/zero` never ends), again on the open
/// file, and while reading (at most the cap plus one byte is read).
/// `Err` is the operating system's error.
pub fn read_tokenizer_file(
    path: &std::path::Path,
    shown: &str,
) -> std::io::Result<Result<Vec<u8>, Error>> {
    use std::io::Read;
    let too_big = |n: u64| {
        whole(format!(
            "{shown} is {n} bytes, more than the supported {MAX_TOKENIZER_JSON_BYTES}"
        ))
    };
    let not_regular = || whole(format!("{shown} is not a regular file"));
    let meta = std::fs::metadata(path)?;
    if !meta.is_file() {
        return Ok(Err(not_regular()));
    }
    if meta.len() > MAX_TOKENIZER_JSON_BYTES as u64 {
        return Ok(Err(too_big(meta.len())));
    }
    let file = std::fs::File::open(path)?;
    let meta = file.metadata()?;
    if !meta.is_file() {
        return Ok(Err(not_regular()));
    }
    let mut data = Vec::new();
    let expect = meta.len().min(MAX_TOKENIZER_JSON_BYTES as u64) as usize + 1;
    if data.try_reserve_exact(expect).is_err() {
        return Ok(Err(Error::Alloc {
            what: format!("{expect} bytes to read {shown}"),
        }));
    }
    file.take(MAX_TOKENIZER_JSON_BYTES as u64 + 1)
        .read_to_end(&mut data)?;
    if data.len() > MAX_TOKENIZER_JSON_BYTES {
        return Ok(Err(too_big(data.len() as u64)));
    }
    Ok(Ok(data))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// (field, message) of reading `json`.
    fn refused(json: &str) -> (Option<String>, String) {
        let e = read(json.as_bytes()).err().expect("refused");
        (e.field(), e.to_string())
    }

    #[test]
    fn errors_name_the_json_path() {
        for (json, field, says) in [
            (
                r#"{"model": {"vocab": {"a": "x"}}}"#,
                r#"model.vocab["a"]"#,
                r#"model.vocab["a"] is not a token id"#,
            ),
            (
                r#"{"model": {"vocab": {"a": 16777216}}}"#,
                r#"model.vocab["a"]"#,
                "=16777216 is not below",
            ),
            (
                r#"{"model": {"vocab": "x"}}"#,
                "model.vocab",
                "model.vocab must be an object or a list, got a string",
            ),
            (
                r#"{"model": 5}"#,
                "model",
                "model must be an object, got a number",
            ),
            (
                r#"{"model": {"vocab": [["a", 0], [1, 0]]}}"#,
                "model.vocab[1][0]",
                "must be a string, got a number",
            ),
            (
                r#"{"model": {"vocab": [["a", 0], "b"]}}"#,
                "model.vocab[1]",
                "must be a [piece, score] list, got a string",
            ),
            (
                r#"{"model": {"vocab": {}}, "added_tokens": "x"}"#,
                "added_tokens",
                "must be a list or null, got a string",
            ),
            (
                r#"{"model": {"vocab": {}}, "added_tokens": [{"id": 1, "content": "a"}, 7]}"#,
                "added_tokens[1]",
                "added_tokens[1] must be an object, got a number",
            ),
            (
                r#"{"model": {"vocab": {}}, "added_tokens": [{"id": 1}]}"#,
                "added_tokens[0].content",
                "added_tokens[0].content is missing",
            ),
            (
                r#"{"model": {"vocab": {}}, "added_tokens": [{"content": "a"}]}"#,
                "added_tokens[0].id",
                "added_tokens[0].id is missing",
            ),
            (
                r#"{"model": {"vocab": {}}, "added_tokens": [{"id": -1, "content": "a"}]}"#,
                "added_tokens[0].id",
                "added_tokens[0].id is not a token id",
            ),
            (
                r#"{"model": {"vocab": {}}, "added_tokens": [{"id": 1, "content": 5}]}"#,
                "added_tokens[0].content",
                "must be a string, got a number",
            ),
            (
                r#"{"model": {"vocab": {}}, "added_tokens": [{"id": 1, "content": "a", "special": "yes"}]}"#,
                "added_tokens[0].special",
                "must be a bool, got a string",
            ),
            (
                r#"{"model": {"vocab": {}, "merges": ["a b", "c d" "e f"]}}"#,
                "model.merges[2]",
                "model.merges[2] is not valid JSON: expected",
            ),
            (
                r#"{"model": {"vocab": {}}, "normalizer": {"rules": [{"x y": tru}]}}"#,
                r#"normalizer.rules[0]["x y"]"#,
                "is not valid JSON",
            ),
            (
                r#"{"model": {"vocab": {}}, "model": {"vocab": {}}}"#,
                "model",
                "model appears twice",
            ),
            (r#"{"model": {}}"#, "model.vocab", "model.vocab is missing"),
            (r#"{"version": "1"}"#, "model", "model is missing"),
        ] {
            let (f, message) = refused(json);
            assert_eq!(
                f.as_deref(),
                Some(&*format!("tokenizer.{field}")),
                "{json}: {message}"
            );
            assert!(
                message.starts_with(&format!("tokenizer: {field}")),
                "{json}: {message}"
            );
            assert!(message.contains(says), "{json}: {message}");
        }
        // The file as a whole: no path.
        let (f, message) = refused("{");
        assert_eq!(f.as_deref(), Some("tokenizer"));
        assert!(
            message.starts_with("tokenizer: tokenizer.json is not valid JSON: EOF"),
            "{message}"
        );
    }

    #[test]
    fn a_huge_value_is_named_by_its_type_and_never_quoted() {
        let huge = "v".repeat(1 << 20);
        for json in [
            format!(r#"{{"model": {{"vocab": "{huge}"}}}}"#),
            format!(r#"{{"model": "{huge}"}}"#),
            format!(r#"{{"model": {{"vocab": {{}}}}, "added_tokens": "{huge}"}}"#),
            format!(r#"{{"model": {{"vocab": {{}}}}, "added_tokens": ["{huge}"]}}"#),
            format!(r#"{{"model": {{"vocab": {{"{huge}": "x"}}}}}}"#),
            format!(r#"{{"model": {{"vocab": {{}}}}, "{huge}": [1, 2 3]}}"#),
            format!(r#"{{"model": {{"vocab": {{"{huge}": 0}}}}}}"#),
        ] {
            let (f, message) = refused(&json);
            assert!(
                message.len() < 1000,
                "{}",
                &message[..2000.min(message.len())]
            );
            assert!(f.is_some_and(|f| f.len() < 1000));
            assert!(!message.contains('\n'));
        }
    }

    #[test]
    fn a_deep_path_is_cut_in_the_middle() {
        let key = "k".repeat(60);
        let mut json = String::from(r#"{"model": {"vocab": {}}, "deep": "#);
        for _ in 0..100 {
            json.push_str(&format!(r#"{{"{key}": "#));
        }
        json.push_str("tru");
        let (f, message) = refused(&json);
        assert!(message.len() < 1000, "{message}");
        let f = f.unwrap();
        assert!(
            f.starts_with("tokenizer.deep..") && f.ends_with(&key),
            "{f}"
        );
    }

    #[test]
    fn added_tokens_override_vocab_entries_in_either_order() {
        for json in [
            r#"{"added_tokens": [{"id": 1, "content": "<s>", "special": true}], "model": {"vocab": {"a": 0, "b": 1}}}"#,
            r#"{"model": {"vocab": {"a": 0, "b": 1}}, "added_tokens": [{"id": 1, "content": "<s>", "special": true}]}"#,
        ] {
            let p = read(json.as_bytes()).unwrap();
            assert_eq!(p.tokens[1].as_deref(), Some("<s>"));
            assert_eq!(p.marks, [0, ADDED | SPECIAL]);
        }
        let p = read(
            br#"{"model": {"vocab": {}}, "added_tokens": [
                {"id": 0, "content": "<s>", "special": true}, {"id": 0, "content": "<t>"}]}"#,
        )
        .unwrap();
        assert_eq!((p.tokens[0].as_deref(), p.marks[0]), (Some("<t>"), ADDED));
        assert_eq!(p.replaced_specials, ["<s>"]);
    }

    mod props {
        use super::*;
        use proptest::prelude::*;

        const FILE: &str = r#"{"version": "1.0", "added_tokens": [{"id": 3, "content": "<s>", "special": true}], "normalizer": {"type": "Sequence", "normalizers": [{"type": "Replace", "pattern": {"String": " "}, "content": "_"}]}, "model": {"type": "BPE", "vocab": {"a": 0, "b": 1, "ab": 2}, "merges": ["a b", ["a", "b"]]}, "decoder": {"type": "ByteLevel"}}"#;

        proptest! {
            /// A valid file with a few bytes inserted somewhere and its end
            /// perhaps cut: a table or an error, never a panic; an error is
            /// one bounded line whose `field` is the path its message starts
            /// with.
            #[test]
            fn a_damaged_file_fails_at_a_path(
                at in 0..FILE.len(),
                insert in "[\\[\\]{}\",:0-9a-z ]{0,3}",
                keep in (FILE.len() / 2)..(FILE.len() + 4),
            ) {
                let mut s = FILE.to_owned();
                s.insert_str(at, &insert);
                s.truncate(keep.min(s.len()));
                if let Err(e) = read(s.as_bytes()) {
                    let message = e.to_string();
                    prop_assert!(message.len() < 1000 && !message.contains('\n'), "{}", message);
                    let field = e.field().unwrap_or_default();
                    match field.strip_prefix("tokenizer.") {
                        Some(path) => prop_assert!(message.starts_with(&format!("tokenizer: {path}")), "{} {}", field, message),
                        None => prop_assert!(field == "tokenizer" || e.kind() == "alloc", "{} {}", field, message),
                    }
                }
            }
        }
    }
}
