//! Snapshots: one sequence's finish state as bytes, and back.
//!
//! # What a snapshot holds
//!
//! Everything a [`FinishTracker`] (and, for ids-only steps, its
//! [`SeqDecoder`]) needs for its next step and its getters: the finish, the
//! kept token ids and text, what was released of them, the unreleased
//! tokens' text ends, the text a stop regex matched, where the earliest live
//! stop-regex thread starts, the decoder's held bytes and flags, and with
//! reasoning channels their state (`Channels::write_snapshot`). What
//! follows from the params (the automata, the caps) is not in it: restore
//! takes the params again and rebuilds the matcher states from the kept text
//! (a stop-string state from its last `max_stop_chars` code points, the
//! stop-regex threads by feeding the text again from the earliest live
//! thread's start).
//!
//! # Format (version 1)
//!
//! Little-endian. A 36-byte header: the magic `b"SLsn"`, the version (u16),
//! flags (u8: bit 0, a decoder follows), a zero byte, the params'
//! fingerprint (u64), the vocabulary's (u64, 0 without a decoder), the body
//! length (u32) and a checksum of the body (u64). The body is a sequence of
//! LEB128 varints and length-prefixed byte strings (the order is
//! [`write_body`]'s).
//!
//! # Restore is for untrusted bytes
//!
//! Every length is checked against the bytes left before anything is
//! allocated from it, so a restore allocates at most a small multiple of the
//! input's size (itself capped at [`MAX_SNAPSHOT_BYTES`]), and runs in time
//! linear in it (a stop regex's replay: times its live threads). Every
//! field is checked against the params and the others (indices against the
//! lists, ids against `vocab_size`, offsets against the text, UTF-8); an
//! error names the field and what is wrong, and nothing is built on error.
//! The checksum catches a changed byte; the checks make even a crafted body
//! with a correct checksum harmless (a state the params allow, never a panic).

use std::sync::Arc;

use crate::detok_batch::SeqDecoder;
use crate::detokenize::{DecodeState, Vocabulary};
use crate::error::Error;
use crate::finish::{Finish, FinishReason, FinishTracker, Matched, StopParams, StopReason};
use crate::stop_strings::char_len;

pub use crate::limits::MAX_SNAPSHOT_BYTES;

/// The format version this build writes and reads.
pub const VERSION: u16 = 1;

const MAGIC: &[u8; 4] = b"SLsn";
const HEADER: usize = 36;
const HAS_DECODER: u8 = 1;

fn err(field: &'static str, kind: &'static str, message: impl Into<String>) -> Error {
    Error::Snapshot {
        field,
        kind,
        message: message.into(),
    }
}

/// A 64-bit hash, 8 bytes a step. Each step is a bijection of the state for
/// a fixed word and of the word for a fixed state, so changing any one
/// 8-byte word (any one byte) always changes the result.
pub(crate) struct Hash(u64);

impl Hash {
    pub(crate) fn new(seed: u64) -> Self {
        Hash(seed ^ 0x9e37_79b9_7f4a_7c15)
    }

    #[inline]
    pub(crate) fn word(&mut self, w: u64) {
        self.0 = (self.0.rotate_left(23) ^ w).wrapping_mul(0x5851_f42d_4c95_7f2d);
    }

    /// `b` with its length, so that consecutive strings cannot shift.
    pub(crate) fn bytes(&mut self, b: &[u8]) {
        self.word(b.len() as u64);
        let mut chunks = b.chunks_exact(8);
        for c in &mut chunks {
            self.word(u64::from_le_bytes(c.try_into().unwrap_or([0; 8])));
        }
        let rest = chunks.remainder();
        if !rest.is_empty() {
            let mut w = [0u8; 8];
            w[..rest.len()].copy_from_slice(rest);
            self.word(u64::from_le_bytes(w));
        }
    }

    pub(crate) fn finish(self) -> u64 {
        // murmur3's fmix64: every input bit reaches every output bit.
        let mut h = self.0;
        h ^= h >> 33;
        h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
        h ^= h >> 33;
        h = h.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
        h ^ (h >> 33)
    }
}

/// The fingerprint of `p`: every field that decides a step, so a snapshot
/// restores only with params equal to those it was taken with.
pub fn params_fingerprint(p: &StopParams) -> u64 {
    let mut h = Hash::new(u64::from(VERSION));
    let opt = |h: &mut Hash, v: Option<u64>| match v {
        None => h.word(0),
        Some(v) => {
            h.word(1);
            h.word(v)
        }
    };
    opt(&mut h, p.max_tokens);
    h.word(p.min_tokens);
    h.word(p.prompt_len);
    opt(&mut h, p.max_model_len);
    for ids in [&p.eos_token_ids, &p.stop_token_ids] {
        h.word(ids.len() as u64);
        ids.iter().for_each(|&id| h.word(u64::from(id)));
    }
    h.word(u64::from(p.ignore_eos) | u64::from(p.include_stop_str_in_output) << 1);
    h.word(u64::from(p.token_aligned));
    match &p.reasoning {
        None => h.word(0),
        // A hash of its Debug form, which lists every field (markers,
        // scopes, spans, budget), made once per request.
        Some(r) => {
            h.word(1);
            h.word(r.fingerprint());
        }
    }
    opt(&mut h, p.vocab_size.map(u64::from));
    match p.repetition {
        None => h.word(0),
        Some(r) => {
            h.word(1);
            h.word(r.max_pattern_size as u64);
            h.word(r.min_pattern_size as u64);
            h.word(r.min_count as u64);
        }
    }
    let stops = p.stop.as_ref().map_or(&[][..], |s| s.stops());
    h.word(stops.len() as u64);
    stops.iter().for_each(|s| h.bytes(s.as_bytes()));
    let regexes = p.stop_regex.as_ref().map_or(&[][..], |s| s.patterns());
    h.word(regexes.len() as u64);
    regexes.iter().for_each(|s| h.bytes(s.as_bytes()));
    h.finish()
}

pub(crate) fn put(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push(v as u8 | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

fn put_bytes(out: &mut Vec<u8>, b: &[u8]) {
    put(out, b.len() as u64);
    out.extend_from_slice(b);
}

/// Reads the body, naming the field at fault.
pub(crate) struct Reader<'a> {
    data: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    pub(crate) fn left(&self) -> usize {
        self.data.len() - self.at
    }

    pub(crate) fn u64(&mut self, field: &'static str) -> Result<u64, Error> {
        let mut v = 0u64;
        for shift in (0..64).step_by(7) {
            let Some(&b) = self.data.get(self.at) else {
                return Err(truncated(field));
            };
            self.at += 1;
            let bits = u64::from(b & 0x7f);
            if shift == 63 && b > 1 {
                return Err(err(
                    field,
                    "snapshot_invalid",
                    format!("snapshot field {field} is a varint over 64 bits"),
                ));
            }
            v |= bits << shift;
            if b & 0x80 == 0 {
                return Ok(v);
            }
        }
        Err(err(
            field,
            "snapshot_invalid",
            format!("snapshot field {field} is a varint over 10 bytes"),
        ))
    }

    /// A value that must not exceed `max`.
    pub(crate) fn at_most(&mut self, field: &'static str, max: u64) -> Result<u64, Error> {
        let v = self.u64(field)?;
        if v > max {
            return Err(invalid(field, format!("is {v}, more than {max}")));
        }
        Ok(v)
    }

    /// A count of entries of at least one byte each: never more than the
    /// bytes left, so that nothing larger than the input is allocated.
    pub(crate) fn count(&mut self, field: &'static str) -> Result<usize, Error> {
        let n = self.u64(field)?;
        if n > self.left() as u64 {
            return Err(truncated(field));
        }
        Ok(n as usize)
    }

    fn bytes(&mut self, field: &'static str) -> Result<&'a [u8], Error> {
        let n = self.count(field)?;
        let b = &self.data[self.at..self.at + n];
        self.at += n;
        Ok(b)
    }

    fn str(&mut self, field: &'static str) -> Result<&'a str, Error> {
        std::str::from_utf8(self.bytes(field)?)
            .map_err(|e| invalid(field, format!("is not valid UTF-8 ({e})")))
    }
}

fn truncated(field: &'static str) -> Error {
    err(
        field,
        "snapshot_truncated",
        format!("the snapshot ends inside field {field} (truncated or altered bytes)"),
    )
}

pub(crate) fn invalid(field: &'static str, what: String) -> Error {
    err(
        field,
        "snapshot_invalid",
        format!("snapshot field {field} {what}"),
    )
}

fn reason_code(r: FinishReason) -> u64 {
    match r {
        FinishReason::Stop => 1,
        FinishReason::Length => 2,
        FinishReason::Error => 3,
        FinishReason::Abort => 4,
        FinishReason::Repetition => 5,
    }
}

/// The snapshot of `t` and, for ids-only steps, its decoder over `vocab`.
///
/// # Errors
/// [`Error::Snapshot`] with kind `snapshot_too_large` past
/// [`MAX_SNAPSHOT_BYTES`]; [`Error::Alloc`] when the bytes cannot be
/// allocated.
pub fn snapshot(
    t: &FinishTracker,
    dec: Option<(&Vocabulary, &SeqDecoder)>,
) -> Result<Vec<u8>, Error> {
    let (text, tokens) = (&t.kept.text, &t.kept.tokens);
    let unreleased = &t.pending.ends[t.pending.head..];
    // Text, ids (at most 5 bytes each), unreleased ends and the rest.
    let estimate =
        HEADER + 64 + text.len() + t.regex_matched.len() + 5 * tokens.len() + 10 * unreleased.len();
    if estimate > MAX_SNAPSHOT_BYTES + 64 + HEADER {
        return Err(too_large(estimate));
    }
    let mut out = Vec::new();
    out.try_reserve_exact(estimate).map_err(|_| Error::Alloc {
        what: format!("a snapshot of {estimate} bytes"),
    })?;
    out.resize(HEADER, 0);
    write_body(t, unreleased, &mut out);
    if let Some((_, d)) = dec {
        let st = d.state();
        let (pending, flags) = st.parts();
        put_bytes(&mut out, pending);
        put(&mut out, u64::from(flags));
        put(&mut out, u64::from(st.strip_left()));
        put(&mut out, d.left());
    }
    let body = out.len() - HEADER;
    if body > MAX_SNAPSHOT_BYTES - HEADER {
        return Err(too_large(out.len()));
    }
    let mut h = Hash::new(0);
    h.bytes(&out[HEADER..]);
    let header = &mut out[..HEADER];
    header[..4].copy_from_slice(MAGIC);
    header[4..6].copy_from_slice(&VERSION.to_le_bytes());
    header[6] = if dec.is_some() { HAS_DECODER } else { 0 };
    header[8..16].copy_from_slice(&params_fingerprint(&t.params).to_le_bytes());
    let vfp = dec.map_or(0, |(v, _)| v.fingerprint());
    header[16..24].copy_from_slice(&vfp.to_le_bytes());
    header[24..28].copy_from_slice(&(body as u32).to_le_bytes());
    header[28..36].copy_from_slice(&h.finish().to_le_bytes());
    Ok(out)
}

fn too_large(n: usize) -> Error {
    err(
        "data",
        "snapshot_too_large",
        format!("a snapshot of {n} bytes is more than the supported {MAX_SNAPSHOT_BYTES} (max_snapshot_bytes)"),
    )
}

/// Rewrites the header's body length and checksum for the body `data`
/// holds now: how tests and fuzz targets reach the field checks behind the
/// checksum with crafted bodies.
#[doc(hidden)]
pub fn reseal(data: &mut [u8]) {
    if data.len() < HEADER {
        return;
    }
    let body = (data.len() - HEADER) as u32;
    let mut h = Hash::new(0);
    h.bytes(&data[HEADER..]);
    data[24..28].copy_from_slice(&body.to_le_bytes());
    data[28..36].copy_from_slice(&h.finish().to_le_bytes());
}

/// The body: finish, ids, text, release, unreleased ends, regex state.
fn write_body(t: &FinishTracker, unreleased: &[usize], out: &mut Vec<u8>) {
    match t.finish {
        None => put(out, 0),
        Some(f) => {
            put(out, reason_code(f.reason));
            match f.stop_reason {
                None => put(out, 0),
                Some(StopReason::StopString(i)) => (put(out, 1), put(out, i as u64)).1,
                Some(StopReason::StopRegex(i)) => (put(out, 2), put(out, i as u64)).1,
                Some(StopReason::TokenId(id)) => (put(out, 3), put(out, id.into())).1,
                Some(StopReason::RepetitionDetected) => put(out, 4),
            }
            match f.matched {
                None => put(out, 0),
                Some(Matched::StopString(i)) => (put(out, 1), put(out, i as u64)).1,
                Some(Matched::StopRegex(i)) => (put(out, 2), put(out, i as u64)).1,
                Some(Matched::TokenId(id)) => (put(out, 3), put(out, id.into())).1,
            }
        }
    }
    put(out, t.kept.tokens.len() as u64);
    t.kept.tokens.iter().for_each(|&id| put(out, id.into()));
    put_bytes(out, t.kept.text.as_bytes());
    put(out, t.emitted_bytes as u64);
    put(out, t.emitted_tokens as u64);
    put(out, unreleased.len() as u64);
    // Each end as its distance from the previous (from the release point).
    let mut prev = t.emitted_chars;
    for &e in unreleased {
        put(out, (e - prev) as u64);
        prev = e;
    }
    put_bytes(out, t.regex_matched.as_bytes());
    put(
        out,
        t.regex
            .as_ref()
            .filter(|_| t.finish.is_none())
            .and_then(|r| r.earliest_start())
            .map_or(0, |s| s as u64 + 1),
    );
    if let Some(c) = t.channels.as_deref() {
        c.write_snapshot(out, t.finish.is_none());
    }
}

/// Checks the header of `data` against `params` and `vocab`; returns the
/// body and whether a decoder follows in it.
fn open<'a>(
    data: &'a [u8],
    params: &StopParams,
    vocab: Option<&Vocabulary>,
) -> Result<(&'a [u8], bool), Error> {
    if data.len() > MAX_SNAPSHOT_BYTES {
        return Err(too_large(data.len()));
    }
    if data.len() < 6 || &data[..4] != MAGIC {
        return Err(err(
            "data",
            "snapshot_format",
            "not a stopline snapshot (its first bytes are not the snapshot magic)",
        ));
    }
    let version = u16::from_le_bytes([data[4], data[5]]);
    if version != VERSION {
        return Err(err(
            "version",
            "snapshot_version",
            format!("snapshot format version {version}; this stopline reads version {VERSION}"),
        ));
    }
    if data.len() < HEADER {
        return Err(truncated("header"));
    }
    let word = |at: usize| u64::from_le_bytes(data[at..at + 8].try_into().unwrap_or([0; 8]));
    let flags = data[6];
    if flags & !HAS_DECODER != 0 || data[7] != 0 {
        return Err(invalid(
            "flags",
            format!("has unknown bits ({flags:#x}, {:#x})", data[7]),
        ));
    }
    let body_len = u32::from_le_bytes(data[24..28].try_into().unwrap_or([0; 4])) as usize;
    if data.len() - HEADER != body_len {
        let kind = if data.len() - HEADER < body_len {
            "snapshot_truncated"
        } else {
            "snapshot_invalid"
        };
        return Err(err(
            "body",
            kind,
            format!(
                "the snapshot body is {} bytes; its header says {body_len}",
                data.len() - HEADER
            ),
        ));
    }
    let body = &data[HEADER..];
    let mut h = Hash::new(0);
    h.bytes(body);
    if h.finish() != word(28) {
        return Err(err(
            "checksum",
            "snapshot_checksum",
            "the snapshot's checksum does not match its bytes (altered or corrupted)",
        ));
    }
    if word(8) != params_fingerprint(params) {
        return Err(err(
            "params",
            "snapshot_params",
            "the snapshot was taken with other params; restore it with the params it was taken with",
        ));
    }
    let has_decoder = flags & HAS_DECODER != 0;
    if !has_decoder && word(16) != 0 {
        return Err(invalid(
            "vocabulary",
            "holds a fingerprint without a decoder".into(),
        ));
    }
    match (has_decoder, vocab) {
        (true, None) => Err(err("vocabulary", "snapshot_vocabulary", "the snapshot holds a decoder's state; restore it with the vocabulary it was taken with")),
        (false, Some(_)) => Err(err("vocabulary", "snapshot_vocabulary", "the snapshot holds no decoder (it was taken without a vocabulary); restore it without one")),
        (true, Some(v)) if v.fingerprint() != word(16) => Err(err("vocabulary", "snapshot_vocabulary", "the snapshot was taken with another vocabulary; restore it with the one it was taken with")),
        _ => Ok((body, has_decoder)),
    }
}

/// A tracker for `params` (and its decoder over `vocab`, for a snapshot
/// taken with one) in the state `data` holds.
///
/// # Errors
/// [`Error::Param`] if `params` does not validate; [`Error::Snapshot`]
/// naming the field for bytes that are not a snapshot of this version, were
/// taken with other params or vocabulary, are truncated, altered or
/// inconsistent; [`Error::Alloc`] when the text cannot be allocated.
pub fn restore(
    params: Arc<StopParams>,
    data: &[u8],
    vocab: Option<&Vocabulary>,
) -> Result<(FinishTracker, Option<SeqDecoder>), Error> {
    let (body, has_decoder) = open(data, &params, vocab)?;
    let mut t = FinishTracker::new(Arc::clone(&params))?;
    let mut r = Reader { data: body, at: 0 };
    read_tracker(&mut t, &params, &mut r)?;
    let dec = match vocab.filter(|_| has_decoder) {
        None => None,
        Some(v) => {
            let pending = r.bytes("decoder.pending")?;
            let flags = r.at_most("decoder.flags", 0xff)? as u8;
            let strip = r.at_most("decoder.strip_left", u64::from(v.strip_left()))? as u8;
            let state = DecodeState::from_parts(v, pending, flags, strip)
                .map_err(|what| invalid("decoder.pending", what.into()))?;
            let fresh = SeqDecoder::new(v, &params, &[], Default::default())?;
            let left = r.at_most("decoder.left", fresh.left())?;
            if t.finish.is_none() && left != fresh.left().saturating_sub(t.kept.tokens.len() as u64)
            {
                return Err(invalid(
                    "decoder.left",
                    format!("is {left}, not what the kept tokens leave"),
                ));
            }
            Some(fresh.with_state(state, left))
        }
    };
    if r.left() != 0 {
        return Err(invalid(
            "body",
            format!("has {} bytes after its last field", r.left()),
        ));
    }
    Ok((t, dec))
}

fn index(r: &mut Reader<'_>, field: &'static str, len: usize) -> Result<usize, Error> {
    let i = r.u64(field)?;
    if i >= len as u64 {
        return Err(invalid(
            field,
            format!("is {i}, outside the params' list of {len}"),
        ));
    }
    Ok(i as usize)
}

fn token_id(r: &mut Reader<'_>, field: &'static str) -> Result<u32, Error> {
    Ok(r.at_most(field, u64::from(u32::MAX))? as u32)
}

fn read_finish(r: &mut Reader<'_>, p: &StopParams) -> Result<Option<Finish>, Error> {
    let reason = match r.u64("finish_reason")? {
        0 => return Ok(None),
        1 => FinishReason::Stop,
        2 => FinishReason::Length,
        3 => FinishReason::Error,
        4 => FinishReason::Abort,
        5 => FinishReason::Repetition,
        c => {
            return Err(invalid(
                "finish_reason",
                format!("has the unknown code {c}"),
            ))
        }
    };
    let n_stops = p.stop.as_ref().map_or(0, |s| s.len());
    let n_regexes = p.stop_regex.as_ref().map_or(0, |s| s.len());
    let stop_reason = match r.u64("stop_reason")? {
        0 => None,
        1 => Some(StopReason::StopString(index(r, "stop_reason", n_stops)?)),
        2 => Some(StopReason::StopRegex(index(r, "stop_reason", n_regexes)?)),
        3 => Some(StopReason::TokenId(token_id(r, "stop_reason")?)),
        4 => Some(StopReason::RepetitionDetected),
        c => return Err(invalid("stop_reason", format!("has the unknown code {c}"))),
    };
    let matched = match r.u64("matched")? {
        0 => None,
        1 => Some(Matched::StopString(index(r, "matched", n_stops)?)),
        2 => Some(Matched::StopRegex(index(r, "matched", n_regexes)?)),
        3 => Some(Matched::TokenId(token_id(r, "matched")?)),
        c => return Err(invalid("matched", format!("has the unknown code {c}"))),
    };
    Ok(Some(Finish {
        reason,
        stop_reason,
        matched,
    }))
}

/// Overwrites fresh `t`'s state with the body's, checking each field.
fn read_tracker(t: &mut FinishTracker, p: &StopParams, r: &mut Reader<'_>) -> Result<(), Error> {
    let finish = read_finish(r, p)?;
    let n = r.count("token_ids")?;
    if n as u64 > t.length_cap || (finish.is_none() && n as u64 == t.length_cap) {
        return Err(invalid(
            "token_ids",
            format!("has {n} ids, past the params' length cap {}", t.length_cap),
        ));
    }
    let mut tokens = Vec::new();
    tokens.try_reserve_exact(n).map_err(|_| Error::Alloc {
        what: format!("{n} token ids"),
    })?;
    for _ in 0..n {
        let id = token_id(r, "token_ids")?;
        if u64::from(id) >= t.vocab_limit {
            return Err(invalid(
                "token_ids",
                format!("holds {id}, outside [0, vocab_size={})", t.vocab_limit),
            ));
        }
        tokens.push(id);
    }
    let text = r.str("text")?;
    let text_chars = char_len(text);
    if text_chars > 0 && n == 0 {
        return Err(invalid(
            "text",
            "is not empty while no token is kept".into(),
        ));
    }
    let emitted_bytes = r.at_most("emitted_bytes", text.len() as u64)? as usize;
    if !text.is_char_boundary(emitted_bytes) {
        return Err(invalid(
            "emitted_bytes",
            format!("is {emitted_bytes}, inside a character of the text"),
        ));
    }
    let emitted_tokens = r.at_most("emitted_tokens", n as u64)? as usize;
    let emitted_chars = char_len(&text[..emitted_bytes]);
    let waiting = r.count("unreleased")?;
    if waiting != n - emitted_tokens {
        return Err(invalid(
            "unreleased",
            format!(
                "has {waiting} entries for {} unreleased tokens",
                n - emitted_tokens
            ),
        ));
    }
    if finish.is_some() && (waiting != 0 || emitted_bytes != text.len()) {
        return Err(invalid(
            "unreleased",
            "holds text or tokens back in a finished sequence".into(),
        ));
    }
    if waiting == 0 && emitted_chars != text_chars {
        return Err(invalid(
            "emitted_bytes",
            "holds text back with every token released".into(),
        ));
    }
    let mut ends = Vec::new();
    ends.try_reserve_exact(waiting).map_err(|_| Error::Alloc {
        what: format!("{waiting} token ends"),
    })?;
    let mut end = emitted_chars;
    for k in 0..waiting {
        let step = r.at_most("unreleased", (text_chars - end) as u64)? as usize;
        // Unreleased tokens end past the release point; the last at the end.
        if k == 0 && step == 0 {
            return Err(invalid(
                "unreleased",
                "holds a token that ends where the release does".into(),
            ));
        }
        end += step;
        ends.push(end);
    }
    if waiting > 0 && end != text_chars {
        return Err(invalid(
            "unreleased",
            "does not end at the end of the text".into(),
        ));
    }
    let by_regex = matches!(finish.and_then(|f| f.matched), Some(Matched::StopRegex(_)));
    let regex_matched = r.str("regex_matched")?;
    if !by_regex && !regex_matched.is_empty() {
        return Err(invalid(
            "regex_matched",
            "is set while no stop regex finished the sequence".into(),
        ));
    }
    let threads = r.at_most("regex_threads", text_chars as u64 + 1)?;
    if threads != 0 && (t.regex.is_none() || finish.is_some()) {
        return Err(invalid(
            "regex_threads",
            "is set for a sequence that matches no stop regex now".into(),
        ));
    }
    let regex_matched = copy_str(regex_matched)?;
    let mut kept_text = String::new();
    kept_text
        .try_reserve_exact(text.len())
        .map_err(|_| Error::Alloc {
            what: format!("a text of {} bytes", text.len()),
        })?;
    kept_text.push_str(text);
    // The matchers run only while running; a finished tracker keeps fresh
    // ones, never fed again.
    if let Some(c) = t.channels.as_deref_mut() {
        c.read_snapshot(r, text, n, finish.is_none())?;
    }
    if finish.is_none() {
        if let Some(m) = t.matcher.as_mut() {
            m.resume(text, text_chars);
        }
        if let Some(x) = t.regex.as_mut() {
            x.resume(text, text_chars, threads.checked_sub(1).map(|s| s as usize));
        }
    }
    t.finish = finish;
    t.kept.tokens = tokens;
    t.kept.text = kept_text;
    t.kept.text_chars = text_chars;
    t.pending.ends = ends;
    t.pending.head = 0;
    t.emitted_bytes = emitted_bytes;
    t.emitted_chars = emitted_chars;
    t.emitted_tokens = emitted_tokens;
    t.regex_matched = regex_matched;
    Ok(())
}

fn copy_str(s: &str) -> Result<String, Error> {
    let mut out = String::new();
    out.try_reserve_exact(s.len()).map_err(|_| Error::Alloc {
        what: format!("a text of {} bytes", s.len()),
    })?;
    out.push_str(s);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::detok_batch::SeqDecoder;
    use crate::detokenize::DecodeOptions;
    use crate::finish::{Repetition, Step};
    use crate::stop_regex::StopRegexes;
    use crate::stop_strings::{EngineKind, StopStrings};
    use proptest::prelude::*;

    /// What one step showed the caller: released text and ids, whole run,
    /// finish, regex match and the getters.
    type Seen = (
        String,
        Vec<u32>,
        bool,
        Option<Finish>,
        String,
        usize,
        usize,
        usize,
    );

    fn seen(t: &FinishTracker, s: &Step) -> Seen {
        (
            t.text()[s.text_delta.clone()].to_string(),
            t.token_ids()[s.token_ids_delta.clone()].to_vec(),
            s.whole_run,
            t.finish(),
            t.regex_matched().to_string(),
            t.text_len(),
            t.emitted_len(),
            t.token_ids().len(),
        )
    }

    /// Snapshots `t`, restores it, checks that the copy snapshots to the
    /// same bytes and returns the copy.
    fn round_trip(t: &FinishTracker) -> Result<FinishTracker, TestCaseError> {
        let bytes = snapshot(t, None).unwrap();
        let (back, dec) = restore(Arc::clone(t.params()), &bytes, None).unwrap();
        prop_assert!(dec.is_none());
        prop_assert_eq!(snapshot(&back, None).unwrap(), bytes);
        prop_assert_eq!((back.text(), back.token_ids()), (t.text(), t.token_ids()));
        Ok(back)
    }

    fn piece() -> impl Strategy<Value = String> {
        prop::sample::select(vec![
            "", "a", "b", "c", "ab", "ca", "é", "日本", "🙂", "STOP", "x", "zz", "\n",
        ])
        .prop_map(str::to_string)
    }

    /// Stop strings, their engine, stop regexes, (max_tokens, min_tokens,
    /// include, token_aligned), (vocab_size, ignore_eos, repetition).
    type Desc = (
        &'static [&'static str],
        EngineKind,
        &'static [&'static str],
        (Option<u64>, u64, bool, bool),
        (Option<u32>, bool, bool),
    );

    fn params_strategy() -> impl Strategy<Value = Desc> {
        let stop_lists: Vec<&[&str]> =
            vec![&[], &["c"], &["ab", "STOP", "a日", "zzz"], &["日本🙂", "x"]];
        let regex_lists: Vec<&[&str]> = vec![&[], &[r"(?s).*zz"], &[r"b\.?$", r"ab+c", r"日本+é"]];
        (
            prop::sample::select(stop_lists),
            prop::sample::select(vec![EngineKind::Dfa, EngineKind::Nfa]),
            prop::sample::select(regex_lists),
            (
                prop::option::of(1u64..30),
                0u64..4,
                any::<bool>(),
                any::<bool>(),
            ),
            (prop::option::of(12u32..14), any::<bool>(), any::<bool>()),
        )
    }

    fn build((stops, kind, regexes, lengths, ids): Desc) -> Arc<StopParams> {
        let (max_tokens, min_tokens, include, aligned) = lengths;
        let (vocab_size, ignore_eos, repetition) = ids;
        let stop =
            StopStrings::with_engine(stops.iter().map(|s| s.to_string()).collect(), kind).unwrap();
        Arc::new(StopParams {
            max_tokens,
            min_tokens: max_tokens.map_or(min_tokens, |m| m.min(min_tokens)),
            stop: Some(Arc::new(stop)),
            stop_regex: Some(
                StopRegexes::compile(regexes.iter().map(|s| s.to_string()).collect()).unwrap(),
            ),
            eos_token_ids: vec![11],
            stop_token_ids: vec![10],
            ignore_eos,
            include_stop_str_in_output: include,
            token_aligned: aligned,
            vocab_size,
            repetition: repetition.then_some(Repetition {
                max_pattern_size: 2,
                min_pattern_size: 1,
                min_count: 4,
            }),
            ..StopParams::default()
        })
    }

    /// The run cut at `cuts` (sorted, deduplicated, ending at the end).
    fn runs(n: usize, cuts: &[usize]) -> Vec<(usize, usize)> {
        let mut b: Vec<usize> = cuts.iter().copied().filter(|&c| c > 0 && c < n).collect();
        b.push(n);
        b.sort_unstable();
        b.dedup();
        let mut prev = 0;
        b.into_iter()
            .map(|e| (std::mem::replace(&mut prev, e), e))
            .collect()
    }

    proptest! {
        /// Snapshot and restore after every step (the copy carries on) gives
        /// what an uninterrupted run gives, step by step.
        #[test]
        fn restored_after_every_step_equals_an_uninterrupted_run(
            desc in params_strategy(),
            toks in prop::collection::vec((0u32..14, piece()), 1..30),
            cuts in prop::collection::vec(0usize..30, 0..8),
            abort in any::<bool>(),
        ) {
            let p = build(desc);
            let ids: Vec<u32> = toks.iter().map(|t| t.0).collect();
            let texts: Vec<&str> = toks.iter().map(|t| t.1.as_str()).collect();
            let mut a = FinishTracker::new(Arc::clone(&p)).unwrap();
            let mut b = round_trip(&a)?;
            for (lo, hi) in runs(ids.len(), &cuts) {
                if a.is_finished() {
                    break;
                }
                let sa = a.update(&ids[lo..hi], Some(&texts[lo..hi]), None).unwrap();
                let sb = b.update(&ids[lo..hi], Some(&texts[lo..hi]), None).unwrap();
                prop_assert_eq!(seen(&a, &sa), seen(&b, &sb));
                b = round_trip(&b)?;
            }
            if abort {
                let (sa, sb) = (a.abort(), b.abort());
                prop_assert_eq!(seen(&a, &sa), seen(&b, &sb));
                b = round_trip(&b)?;
            }
            prop_assert_eq!(snapshot(&a, None).unwrap(), snapshot(&b, None).unwrap());
        }

        /// Ids-only: the decoder's held bytes (UTF-8 split across byte
        /// tokens) travel with the tracker.
        #[test]
        fn decoder_state_travels_with_the_snapshot(
            ids in prop::collection::vec(0u32..8, 1..25),
            max_tokens in prop::option::of(1u64..30),
            stops in prop::sample::select(vec![vec![], vec!["é".to_string()], vec!["ab".to_string(), "日".to_string()]]),
        ) {
            let v = vocab();
            let p = Arc::new(StopParams {
                max_tokens,
                stop: Some(StopStrings::compile(stops).unwrap()),
                ..StopParams::default()
            });
            let mut a = FinishTracker::new(Arc::clone(&p)).unwrap();
            let mut da = SeqDecoder::new(&v, &p, &[], DecodeOptions::default()).unwrap();
            let (mut b, mut db) = (a.clone(), da);
            for &id in &ids {
                if a.is_finished() {
                    break;
                }
                let bytes = snapshot(&b, Some((&v, &db))).unwrap();
                let (t, d) = restore(Arc::clone(&p), &bytes, Some(&v)).unwrap();
                prop_assert_eq!(snapshot(&t, Some((&v, d.as_ref().unwrap()))).unwrap(), bytes);
                (b, db) = (t, d.unwrap());
                let sa = da.update(&v, &mut a, &[id], None).unwrap();
                let sb = db.update(&v, &mut b, &[id], None).unwrap();
                prop_assert_eq!(seen(&a, &sa), seen(&b, &sb));
                prop_assert_eq!(da.state().parts(), db.state().parts());
            }
        }
    }

    /// Byte-level tokens: whole characters and the bytes of "é" and "日".
    fn vocab() -> Vocabulary {
        // GPT-2's printable forms: "é" is C3 A9 -> "Ã" "©"; "日" is E6 97 A5
        // -> "æ" "Ĺ" "¥".
        let tokens = ["a", "b", "Ã", "©", "æ", "Ĺ", "¥", "Ã©"];
        let vocab: serde_json::Map<String, serde_json::Value> = tokens
            .iter()
            .enumerate()
            .map(|(i, t)| (t.to_string(), serde_json::Value::from(i)))
            .collect();
        let j = serde_json::json!({
            "model": {"type": "BPE", "vocab": vocab},
            "decoder": {"type": "ByteLevel"},
        });
        Vocabulary::from_json(j.to_string().as_bytes()).unwrap()
    }

    fn mid_stream() -> (Arc<StopParams>, FinishTracker) {
        let p = Arc::new(StopParams {
            max_tokens: Some(100),
            stop: Some(StopStrings::compile_strs(&["STOP", "ab", "日本"]).unwrap()),
            stop_regex: Some(StopRegexes::compile(vec![r"x+y".into()]).unwrap()),
            stop_token_ids: vec![5],
            ..StopParams::default()
        });
        let mut t = FinishTracker::new(Arc::clone(&p)).unwrap();
        t.update(&[1, 2, 3], Some(&["hello ", "wor日", "ld xxa"]), None)
            .unwrap();
        (p, t)
    }

    fn kind(r: Result<(FinishTracker, Option<SeqDecoder>), Error>) -> &'static str {
        match r {
            Err(e @ Error::Snapshot { .. }) => e.kind(),
            Err(e) => panic!("not a snapshot error: {e}"),
            Ok(_) => "ok",
        }
    }

    #[test]
    fn truncated_or_flipped_bytes_are_refused_by_name() {
        let (p, t) = mid_stream();
        let bytes = snapshot(&t, None).unwrap();
        assert_eq!(kind(restore(Arc::clone(&p), &bytes, None)), "ok");
        for n in 0..bytes.len() {
            let k = kind(restore(Arc::clone(&p), &bytes[..n], None));
            assert!(
                matches!(k, "snapshot_format" | "snapshot_truncated"),
                "{n}: {k}"
            );
        }
        for i in 0..bytes.len() {
            for bit in 0..8 {
                let mut b = bytes.clone();
                b[i] ^= 1 << bit;
                assert_ne!(
                    kind(restore(Arc::clone(&p), &b, None)),
                    "ok",
                    "byte {i} bit {bit}"
                );
            }
        }
        let mut longer = bytes.clone();
        longer.push(0);
        assert_eq!(
            kind(restore(Arc::clone(&p), &longer, None)),
            "snapshot_invalid"
        );
    }

    #[test]
    fn other_params_version_or_vocabulary_are_refused_and_reasoning_restores() {
        let (p, t) = mid_stream();
        let bytes = snapshot(&t, None).unwrap();
        let other = Arc::new(StopParams {
            max_tokens: Some(101),
            ..(*p).clone()
        });
        assert_eq!(kind(restore(other, &bytes, None)), "snapshot_params");
        let mut b = bytes.clone();
        b[4] = 2;
        assert_eq!(kind(restore(Arc::clone(&p), &b, None)), "snapshot_version");
        assert_eq!(
            kind(restore(Arc::clone(&p), &bytes, Some(&vocab()))),
            "snapshot_vocabulary"
        );
        let dec = SeqDecoder::new(&vocab(), &p, &[], DecodeOptions::default()).unwrap();
        let with = snapshot(&t, Some((&vocab(), &dec))).unwrap();
        assert_eq!(
            kind(restore(Arc::clone(&p), &with, None)),
            "snapshot_vocabulary"
        );
        use crate::reasoning::{Marker, Reasoning, ReasoningSpec};
        let spec = ReasoningSpec {
            end: Marker {
                text: None,
                token_id: Some(9),
            },
            ..ReasoningSpec::default()
        };
        let r = Reasoning::new(spec, None, None, &[], &[]).unwrap();
        let p = Arc::new(StopParams {
            reasoning: Some(Arc::new(r)),
            ..StopParams::default()
        });
        let mut t = FinishTracker::new(Arc::clone(&p)).unwrap();
        t.update(&[1, 9, 2], Some(&["a", "", "b"]), None).unwrap();
        let bytes = snapshot(&t, None).unwrap();
        let (back, _) = restore(Arc::clone(&p), &bytes, None).unwrap();
        assert_eq!(back.channel(), t.channel());
        // Reasoning params are part of the fingerprint.
        assert_eq!(
            kind(restore(Arc::new(StopParams::default()), &bytes, None)),
            "snapshot_params"
        );
    }

    /// A body rewritten with its checksum fixed: each field's own check.
    fn resealed(bytes: &[u8], body: &[u8]) -> Vec<u8> {
        let mut out = bytes[..HEADER].to_vec();
        out.extend_from_slice(body);
        reseal(&mut out);
        out
    }

    #[test]
    fn crafted_bodies_fail_their_field_checks() {
        let (p, t) = mid_stream();
        let bytes = snapshot(&t, None).unwrap();
        let body = &bytes[HEADER..];
        // Every byte flipped with the checksum fixed: refused or a state
        // the params allow, never a panic; a varint of huge counts is
        // refused before anything is allocated.
        for i in 0..body.len() {
            for v in [0u8, 1, 0x7f, 0x80, 0xff] {
                let mut b = body.to_vec();
                b[i] = v;
                let _ = restore(Arc::clone(&p), &resealed(&bytes, &b), None);
            }
        }
        let huge = [
            0u8, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01,
        ];
        assert_eq!(
            kind(restore(Arc::clone(&p), &resealed(&bytes, &huge), None)),
            "snapshot_truncated"
        );
        let over = [
            0u8, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f,
        ];
        assert_eq!(
            kind(restore(Arc::clone(&p), &resealed(&bytes, &over), None)),
            "snapshot_invalid"
        );
        // A stop-string index past the list.
        let mut finished = body.to_vec();
        finished.splice(0..1, [1u8, 1, 9, 1, 9]);
        let Err(e) = restore(Arc::clone(&p), &resealed(&bytes, &finished), None) else {
            panic!("accepted a stop-string index past the list");
        };
        assert_eq!(
            (e.kind(), e.field().as_deref()),
            ("snapshot_invalid", Some("stop_reason"))
        );
    }

    #[test]
    fn oversized_bytes_are_refused_before_they_are_read() {
        let (p, _) = mid_stream();
        // Zeroed pages: the refusal reads only the length.
        let big = vec![0u8; MAX_SNAPSHOT_BYTES + 1];
        assert_eq!(
            kind(restore(Arc::clone(&p), &big, None)),
            "snapshot_too_large"
        );
        // A header that claims more body than there is.
        let (_, t) = mid_stream();
        let mut b = snapshot(&t, None).unwrap();
        b[24..28].copy_from_slice(&u32::MAX.to_le_bytes());
        assert_eq!(kind(restore(p, &b, None)), "snapshot_truncated");
    }

    #[test]
    fn a_slot_restores_into_any_slot_of_another_batch() {
        use crate::batch::{FinishBatch, StepInput};
        let (p, _) = mid_stream();
        let mut a = FinishBatch::new(8).unwrap();
        a.add(2, Arc::clone(&p)).unwrap();
        let mut out = Vec::new();
        let input = StepInput::new(&[2], &[1]).texts(Some(&["hi ST"]));
        a.step(input, &mut out).unwrap();
        let bytes = a.snapshot(2).unwrap();
        let mut b = FinishBatch::new(8).unwrap();
        b.add(5, Arc::clone(&p)).unwrap();
        assert!(matches!(
            b.restore(5, Arc::clone(&p), &bytes),
            Err(Error::Slot { .. })
        ));
        let other = Arc::new(StopParams::default());
        assert!(b.restore(6, other, &bytes).is_err());
        assert_eq!(b.len(), 1);
        b.restore(6, Arc::clone(&p), &bytes).unwrap();
        for (batch, slot) in [(&mut a, 2), (&mut b, 6)] {
            out.clear();
            let slots = [slot];
            let input = StepInput::new(&slots, &[2]).texts(Some(&["OP"]));
            batch.step(input, &mut out).unwrap();
            let t = batch.get(slot).unwrap();
            assert_eq!(
                (t.text(), t.finish().unwrap().stop_reason),
                ("hi ", Some(StopReason::StopString(0)))
            );
        }
    }

    #[test]
    fn a_mid_stream_snapshot_is_small() {
        let p = Arc::new(StopParams {
            max_tokens: Some(4096),
            stop: Some(StopStrings::compile_strs(&["</s>", "User:", "\n\n\n", "STOP"]).unwrap()),
            ..StopParams::default()
        });
        let mut t = FinishTracker::new(Arc::clone(&p)).unwrap();
        for i in 0..100u32 {
            t.update(&[i], Some(&["tok "]), None).unwrap();
        }
        let bytes = snapshot(&t, None).unwrap();
        // Header, counts and the 100 ids (1 or 2 bytes each) besides the text.
        assert!(bytes.len() <= 256 + t.text().len(), "{}", bytes.len());
    }
}
