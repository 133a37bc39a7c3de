//! Multi-stop-string matching over a growing text.
//!
//! # Semantics
//!
//! A [`StopStrings`] is a list of non-empty stop strings compiled once into an
//! Aho-Corasick automaton (the `aho-corasick` crate, [`MatchKind::Standard`]).
//! It is immutable and shared (`Arc`) between sequences and threads; identical
//! lists share one automaton through a process-wide cache ([`StopStrings::compile`]).
//!
//! A [`StopMatcher`] is the per-sequence state: the automaton state after the
//! text fed so far and the number of code points fed. [`StopMatcher::feed`]
//! steps the automaton over the new text only, so a step costs
//! O(len(delta)) whatever the number of stop strings.
//!
//! * A match counts only if it *ends* inside the newly fed text; it may start
//!   in text fed earlier.
//! * Among the matches ending in the new text, the one that ends earliest wins;
//!   a tie at the same end goes to the lowest list index.
//! * `feed` always consumes the whole delta, so a matcher keeps working after a
//!   reported match (the finish machine relies on this to skip matches that
//!   complete below `min_tokens`). Feeding a text in any chunking therefore
//!   reports the same first match as feeding it one character at a time.
//! * Offsets are code points of the cumulative text, never bytes.
//! * [`StopMatcher::holdback`] is the length of the longest suffix of the text
//!   fed so far that is a proper prefix of some stop string: the exact amount a
//!   streaming detokenizer must keep back. It is 0 when the stop string is
//!   included in the output (the text before a match can always be emitted).
//!
//! # Costs
//!
//! Compiling is linear in the total length of the stop strings. Lists whose
//! stop strings total at most [`DFA_MAX_PATTERN_BYTES`] bytes use a dense DFA
//! built directly from the list (`stop_dfa`: one table lookup per byte, a few
//! µs to build) unless its table would exceed 2^20 entries (4 MiB); larger
//! lists use the `aho-corasick` crate's contiguous NFA, which has the same
//! amortised O(1) cost per byte with far less memory.
//!
//! ```
//! use stopline::stop_strings::StopStrings;
//! let stops = StopStrings::compile(vec!["ST".into(), "OP".into()]).unwrap();
//! let mut m = stops.matcher(false);
//! assert!(m.feed("k").is_none());
//! let hit = m.feed("STOP").unwrap();
//! assert_eq!((hit.index, hit.start, hit.end, hit.truncate_to), (0, 1, 3, 1));
//! ```

use std::sync::{Arc, Mutex, OnceLock};

use aho_corasick::automaton::{Automaton, StateID};
use aho_corasick::nfa::contiguous;
use aho_corasick::{Anchored, MatchKind};
use rustc_hash::FxHashMap;

use crate::cache::{list_hash, lock, ByteLru, HeapBytes};
use crate::error::Error;
use crate::limits;
use crate::stop_dfa::StopDfa;

/// Refuses a list with an empty string or over the caps of [`limits`]; the
/// one check before anything is hashed, copied or built from a list.
pub(crate) fn check_stop_list<S: AsRef<str>>(stops: &[S]) -> Result<(), Error> {
    limits::check_count("stop", stops.len(), limits::MAX_STOP_STRINGS)?;
    if let Some(index) = stops.iter().position(|s| s.as_ref().is_empty()) {
        return Err(Error::EmptyStop { index });
    }
    let total = stops.iter().map(|s| s.as_ref().len()).sum();
    limits::check_bytes("stop", total, limits::MAX_STOP_BYTES)
}

/// Lists whose stop strings total at most this many UTF-8 bytes are compiled
/// to a DFA; larger ones to a contiguous NFA.
pub const DFA_MAX_PATTERN_BYTES: usize = 16 * 1024;

pub use crate::cache::{CACHE_CAPACITY, CACHE_MAX_BYTES};

/// Which automaton [`StopStrings::with_engine`] builds. Only for tests and
/// fuzz targets, which run the same cases on both engines; callers get
/// [`Auto`](EngineKind::Auto) through [`StopStrings::new`].
#[doc(hidden)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EngineKind {
    /// The choice by size described in the module docs.
    Auto,
    /// The dense DFA, whatever the size ([`Error::Build`] if its table would
    /// be over the bound).
    Dfa,
    /// The `aho-corasick` crate's contiguous NFA, whatever the size.
    Nfa,
}

enum Engine {
    Dfa(StopDfa),
    /// With the hold-back of each state reachable at a code-point boundary
    /// that holds anything back, and, when the list has duplicates, the list
    /// index of each of the NFA's (distinct) patterns.
    Nfa(contiguous::NFA, FxHashMap<u32, usize>, Option<Vec<u32>>),
}

/// A compiled, immutable list of stop strings.
pub struct StopStrings {
    stops: Vec<String>,
    /// Length of each stop string in code points.
    stop_chars: Vec<usize>,
    max_stop_chars: usize,
    engine: Engine,
    start: u32,
    /// No state holds anything back (a matcher can skip the lookup).
    never_holds_back: bool,
}

/// The first stop string completed by one `feed`, in code points of the
/// cumulative text.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StopMatch {
    /// Index of the stop string in the list.
    pub index: usize,
    /// Code-point offset where the stop string starts.
    pub start: usize,
    /// Code-point offset just past the stop string.
    pub end: usize,
    /// `end` when the stop string is kept in the output, else `start`.
    pub truncate_to: usize,
}

/// Per-sequence incremental matcher over a shared [`StopStrings`].
#[derive(Clone)]
pub struct StopMatcher {
    stops: Arc<StopStrings>,
    state: u32,
    chars_fed: usize,
    include_in_output: bool,
}

/// Steps `aut` over `bytes` from `sid`; returns the final state and, for the
/// first position where some stop string ends, the byte offset just past it
/// and the lowest pattern index ending there.
#[inline(always)]
fn scan<A: Automaton>(aut: &A, sid: u32, bytes: &[u8]) -> (u32, Option<(usize, usize)>) {
    let mut sid = StateID::from_u32_unchecked(sid);
    let mut i = 0;
    while i < bytes.len() {
        sid = aut.next_state(Anchored::No, sid, bytes[i]);
        i += 1;
        if aut.is_special(sid) && aut.is_match(sid) {
            let mut best = aut.match_pattern(sid, 0).as_usize();
            for k in 1..aut.match_len(sid) {
                best = best.min(aut.match_pattern(sid, k).as_usize());
            }
            return (step_only(aut, sid.as_u32(), &bytes[i..]), Some((i, best)));
        }
    }
    (sid.as_u32(), None)
}

#[inline(always)]
fn step_only<A: Automaton>(aut: &A, sid: u32, bytes: &[u8]) -> u32 {
    let mut sid = StateID::from_u32_unchecked(sid);
    for &b in bytes {
        sid = aut.next_state(Anchored::No, sid, b);
    }
    sid.as_u32()
}

/// Code points in `s`, with a fast path for ASCII.
#[inline]
pub(crate) fn char_len(s: &str) -> usize {
    if s.is_ascii() {
        s.len()
    } else {
        s.chars().count()
    }
}

/// Byte offset of the code point `k` positions before the end of `s`
/// (clamped to 0). O(k).
#[inline]
pub(crate) fn byte_offset_from_end(s: &str, k: usize) -> usize {
    if k == 0 {
        return s.len();
    }
    match s.char_indices().rev().nth(k - 1) {
        Some((b, _)) => b,
        None => 0,
    }
}

impl HeapBytes for Arc<StopStrings> {
    fn heap_bytes(&self) -> usize {
        StopStrings::heap_bytes(self)
    }
}

/// The process-wide cache ([`crate::cache`]'s policy), keyed by a hash of the
/// list; a hit is confirmed by comparing the strings.
fn cache() -> &'static Mutex<ByteLru<Arc<StopStrings>>> {
    static CACHE: OnceLock<Mutex<ByteLru<Arc<StopStrings>>>> = OnceLock::new();
    CACHE.get_or_init(|| Mutex::new(ByteLru::new(CACHE_CAPACITY, CACHE_MAX_BYTES)))
}

/// The cached list under `key` if it is exactly `stops`.
fn cached<S: AsRef<str>>(key: u64, stops: &[S]) -> Option<Arc<StopStrings>> {
    lock(cache()).get(key, |hit| {
        hit.stops.len() == stops.len() && hit.stops.iter().zip(stops).all(|(a, b)| a == b.as_ref())
    })
}

/// Compiles `stops` and caches it under `key`.
fn insert(key: u64, stops: Vec<String>) -> Result<Arc<StopStrings>, Error> {
    let compiled = Arc::new(StopStrings::new(stops)?);
    lock(cache()).insert(key, Arc::clone(&compiled));
    Ok(compiled)
}

impl StopStrings {
    /// Compiles `stops`, reusing the automaton of an identical list compiled
    /// earlier in this process (LRU cache of [`CACHE_CAPACITY`] lists).
    ///
    /// # Errors
    /// [`Error::EmptyStop`] for an empty string, [`Error::Build`] if the
    /// automaton cannot be built.
    pub fn compile(stops: Vec<String>) -> Result<Arc<StopStrings>, Error> {
        let key = list_hash(&stops);
        match cached(key, &stops) {
            Some(hit) => Ok(hit),
            None => insert(key, stops),
        }
    }

    /// [`compile`](Self::compile) from borrowed strings: a cache hit copies
    /// nothing.
    ///
    /// # Errors
    /// As [`compile`](Self::compile).
    pub fn compile_strs(stops: &[&str]) -> Result<Arc<StopStrings>, Error> {
        let key = list_hash(stops);
        match cached(key, stops) {
            Some(hit) => Ok(hit),
            None => insert(key, stops.iter().map(|s| (*s).to_owned()).collect()),
        }
    }

    /// The cached compile of `stops`, if any: the cheap part of
    /// [`compile_strs`](Self::compile_strs), which a caller can run before
    /// deciding to give up the GIL for the rest.
    pub fn cached_strs(stops: &[&str]) -> Option<Arc<StopStrings>> {
        cached(list_hash(stops), stops)
    }

    /// Compiles `stops` without consulting the cache.
    ///
    /// # Errors
    /// As [`compile`](Self::compile); lists over [`limits::MAX_STOP_STRINGS`]
    /// strings or [`limits::MAX_STOP_BYTES`] bytes are refused
    /// ([`Error::Param`]) before anything is built.
    pub fn new(stops: Vec<String>) -> Result<StopStrings, Error> {
        Self::with_engine(stops, EngineKind::Auto)
    }

    /// [`new`](Self::new) on the engine `kind` (tests and fuzz targets only).
    ///
    /// # Errors
    /// As [`new`](Self::new); [`Error::Build`] for [`EngineKind::Dfa`] when
    /// the table would be over its bound.
    #[doc(hidden)]
    pub fn with_engine(stops: Vec<String>, kind: EngineKind) -> Result<StopStrings, Error> {
        check_stop_list(&stops)?;
        let total: usize = stops.iter().map(String::len).sum();
        let too_big = || Error::Build("the DFA's table would be over its bound".into());
        let dfa = match kind {
            EngineKind::Auto if total > DFA_MAX_PATTERN_BYTES => None,
            EngineKind::Auto => StopDfa::new(&stops),
            EngineKind::Dfa => Some(StopDfa::new(&stops).ok_or_else(too_big)?),
            EngineKind::Nfa => None,
        };
        let (engine, start) = if let Some(dfa) = dfa {
            (Engine::Dfa(dfa), StopDfa::START)
        } else {
            // The crate's NFA keeps every pattern that ends at a state: n
            // copies of one string would make each match cost O(n). A
            // duplicate never wins (ties go to the lowest index), so only
            // first occurrences go in, mapped back to their list index.
            let mut first: FxHashMap<&str, u32> = FxHashMap::default();
            let mut unique: Vec<&str> = Vec::new();
            let mut index_of: Vec<u32> = Vec::new();
            for (i, s) in stops.iter().enumerate() {
                first.entry(s.as_str()).or_insert_with(|| {
                    unique.push(s.as_str());
                    index_of.push(i as u32);
                    i as u32
                });
            }
            let nfa = contiguous::NFA::builder()
                .match_kind(MatchKind::Standard)
                .prefilter(false)
                .build(&unique)
                .map_err(|e| Error::Build(e.to_string()))?;
            let start = nfa
                .start_state(Anchored::No)
                .map_err(|e| Error::Build(e.to_string()))?
                .as_u32();
            let holdback = nfa_holdback_table(&nfa, start, &unique);
            let index_of = (unique.len() < stops.len()).then_some(index_of);
            (Engine::Nfa(nfa, holdback, index_of), start)
        };
        let never_holds_back = match &engine {
            Engine::Dfa(d) => d.never_holds_back(),
            Engine::Nfa(_, h, _) => h.is_empty(),
        };
        let stop_chars: Vec<usize> = stops.iter().map(|s| char_len(s)).collect();
        let max_stop_chars = stop_chars.iter().copied().max().unwrap_or(0);
        Ok(StopStrings {
            stops,
            stop_chars,
            max_stop_chars,
            engine,
            start,
            never_holds_back,
        })
    }

    #[inline]
    fn step(&self, sid: u32, bytes: &[u8]) -> u32 {
        match &self.engine {
            Engine::Dfa(a) => a.step(sid, bytes),
            Engine::Nfa(a, ..) => step_only(a, sid, bytes),
        }
    }

    #[inline(always)]
    fn scan(&self, sid: u32, bytes: &[u8]) -> (u32, Option<(usize, usize)>) {
        match &self.engine {
            Engine::Dfa(a) => a.scan(sid, bytes),
            Engine::Nfa(a, _, None) => scan(a, sid, bytes),
            Engine::Nfa(a, _, Some(index_of)) => {
                let (sid, hit) = scan(a, sid, bytes);
                (sid, hit.map(|(end, i)| (end, index_of[i] as usize)))
            }
        }
    }

    /// A fresh per-sequence matcher.
    pub fn matcher(self: &Arc<Self>, include_in_output: bool) -> StopMatcher {
        StopMatcher {
            stops: Arc::clone(self),
            state: self.start,
            chars_fed: 0,
            include_in_output,
        }
    }

    /// The stop strings, in list order.
    pub fn stops(&self) -> &[String] {
        &self.stops
    }

    /// Length of stop string `index` in code points.
    pub fn stop_chars(&self, index: usize) -> usize {
        self.stop_chars[index]
    }

    /// Length of the longest stop string in code points (0 for an empty list).
    pub fn max_stop_chars(&self) -> usize {
        self.max_stop_chars
    }

    /// Number of stop strings.
    pub fn len(&self) -> usize {
        self.stops.len()
    }

    /// True for an empty list (which never matches).
    pub fn is_empty(&self) -> bool {
        self.stops.is_empty()
    }

    /// Heap bytes of the automaton and the strings (what the cache counts).
    fn heap_bytes(&self) -> usize {
        self.memory_usage() + self.stops.iter().map(String::capacity).sum::<usize>()
    }

    /// Heap bytes used by the automaton.
    pub fn memory_usage(&self) -> usize {
        match &self.engine {
            Engine::Dfa(a) => a.memory_usage(),
            Engine::Nfa(a, h, ix) => {
                a.memory_usage() + h.capacity() * 16 + ix.as_ref().map_or(0, |v| 4 * v.len())
            }
        }
    }

    /// Stateless check in the shape of vLLM's `check_stop_strings`: looks for
    /// a stop string that ends inside the last `new_char_count` code points of
    /// `text` (earliest end wins, then list order).
    ///
    /// `text_chars` is `text`'s length in code points (callers that know it
    /// avoid a count). Returns the stop index and vLLM's offset: the match
    /// start, or with `include_in_output` the match end, or -1 when that end is
    /// the end of the text (nothing to cut).
    ///
    /// # Errors
    /// [`Error::NewCharCount`] if `new_char_count > text_chars`.
    pub fn check(
        &self,
        text: &str,
        text_chars: usize,
        new_char_count: usize,
        include_in_output: bool,
    ) -> Result<Option<(usize, isize)>, Error> {
        if new_char_count > text_chars {
            return Err(Error::NewCharCount {
                value: new_char_count as i64,
                text_len: text_chars,
            });
        }
        if new_char_count == 0 || self.stops.is_empty() {
            return Ok(None);
        }
        let new_start = byte_offset_from_end(text, new_char_count);
        let lookback = self.max_stop_chars - 1;
        let window_start = byte_offset_from_end(&text[..new_start], lookback);
        let sid = self.step(self.start, &text.as_bytes()[window_start..new_start]);
        let (_, hit) = self.scan(sid, &text.as_bytes()[new_start..]);
        Ok(hit.map(|(end_byte, index)| {
            let end = text_chars - char_len(&text[new_start + end_byte..]);
            let offset = if include_in_output {
                if end >= text_chars {
                    -1
                } else {
                    end as isize
                }
            } else {
                (end - self.stop_chars[index]) as isize
            };
            (index, offset)
        }))
    }
}

/// For every NFA state at a code-point boundary along some stop string: the
/// longest suffix of its string that is a proper prefix of some stop string,
/// in code points. States that hold nothing back are left out.
fn nfa_holdback_table(nfa: &contiguous::NFA, start: u32, stops: &[&str]) -> FxHashMap<u32, usize> {
    let mut table = FxHashMap::default();
    // Nodes that are a complete stop string but no proper prefix of one,
    // with their string; resolved below through their failure suffix.
    let mut complete_only: Vec<(u32, &str)> = Vec::new();
    for stop in stops {
        let mut sid = start;
        let mut prev = 0;
        for (chars, (b, c)) in stop.char_indices().enumerate() {
            let end = b + c.len_utf8();
            sid = step_only(nfa, sid, &stop.as_bytes()[prev..end]);
            prev = end;
            if end < stop.len() {
                table.insert(sid, chars + 1);
            } else {
                complete_only.push((sid, stop));
            }
        }
    }
    complete_only.sort_by_key(|(_, s)| s.len());
    for (sid, text) in complete_only {
        if table.contains_key(&sid) {
            continue;
        }
        let first = text.chars().next().map_or(0, char::len_utf8);
        let suffix_state = step_only(nfa, start, &text.as_bytes()[first..]);
        let hold = table.get(&suffix_state).copied().unwrap_or(0);
        table.insert(sid, hold);
    }
    table.retain(|_, v| *v > 0);
    table
}

impl StopMatcher {
    /// Feeds the next piece of text. `delta_chars` is its length in code
    /// points when the caller knows it (Python does), else it is counted.
    ///
    /// Returns the earliest stop string that ends inside `delta`; the whole
    /// delta is consumed either way.
    #[inline(always)]
    pub fn feed_counted(&mut self, delta: &str, delta_chars: usize) -> Option<StopMatch> {
        let (state, hit) = self.stops.scan(self.state, delta.as_bytes());
        self.state = state;
        let before = self.chars_fed;
        self.chars_fed += delta_chars;
        hit.map(|(end_byte, index)| {
            let within = if delta_chars == delta.len() {
                end_byte
            } else {
                char_len(&delta[..end_byte])
            };
            let end = before + within;
            let start = end - self.stops.stop_chars[index];
            StopMatch {
                index,
                start,
                end,
                truncate_to: if self.include_in_output { end } else { start },
            }
        })
    }

    /// Feeds `delta` (of `delta_chars` code points) unless a stop string
    /// ends in it; says whether it did. On a match nothing changes, and the
    /// caller feeds the piece through [`feed_counted`](Self::feed_counted).
    #[inline(always)]
    pub fn feed_unless_match(&mut self, delta: &str, delta_chars: usize) -> bool {
        let (state, hit) = self.stops.scan(self.state, delta.as_bytes());
        if hit.is_some() {
            return false;
        }
        self.state = state;
        self.chars_fed += delta_chars;
        true
    }

    /// [`feed_counted`](Self::feed_counted), counting the code points itself.
    #[inline]
    pub fn feed(&mut self, delta: &str) -> Option<StopMatch> {
        self.feed_counted(delta, char_len(delta))
    }

    /// Code points of the longest suffix of the text fed so far that is a
    /// proper prefix of some stop string; 0 when stops are kept in the output.
    #[inline]
    pub fn holdback(&self) -> usize {
        if self.include_in_output || self.stops.never_holds_back {
            return 0;
        }
        match &self.stops.engine {
            Engine::Dfa(d) => d.holdback(self.state),
            // Most steps end outside every stop-string prefix: skip the lookup.
            Engine::Nfa(..) if self.state == self.stops.start => 0,
            Engine::Nfa(_, h, _) => h.get(&self.state).copied().unwrap_or(0),
        }
    }

    /// Code points fed so far.
    pub fn chars_fed(&self) -> usize {
        self.chars_fed
    }

    /// Whether matches are kept in the output (`truncate_to == end`).
    pub fn include_in_output(&self) -> bool {
        self.include_in_output
    }

    /// The compiled list this matcher runs.
    pub fn stop_strings(&self) -> &Arc<StopStrings> {
        &self.stops
    }

    /// Forgets all text fed, as if new.
    pub fn reset(&mut self) {
        self.state = self.stops.start;
        self.chars_fed = 0;
    }

    /// Sets the state a matcher has after being fed a text of `chars_fed`
    /// code points that ends with `text` (a snapshot's restore). The state is
    /// the longest suffix of the text that is a prefix of some stop string,
    /// so the last [`max_stop_chars`](StopStrings::max_stop_chars) code
    /// points decide it: only those of `text` are stepped over.
    pub(crate) fn resume(&mut self, text: &str, chars_fed: usize) {
        let from = byte_offset_from_end(text, self.stops.max_stop_chars);
        self.state = self.stops.step(self.stops.start, &text.as_bytes()[from..]);
        self.chars_fed = chars_fed;
    }
}

/// Proptest inputs of the matcher tests here and in `stop_dfa`.
#[cfg(test)]
pub(crate) mod strategies {
    use proptest::prelude::*;
    use std::ops::Range;

    /// `len` code points from a small alphabet of 1- to 4-byte characters and
    /// a combining mark.
    pub(crate) fn chars(len: Range<usize>) -> impl Strategy<Value = Vec<char>> {
        let alphabet = prop::sample::select(vec!['a', 'b', 'c', 'é', '日', '🙂', '\u{301}']);
        prop::collection::vec(alphabet, len)
    }

    /// `count` stop strings of `len` code points each.
    pub(crate) fn stop_lists(
        len: Range<usize>,
        count: Range<usize>,
    ) -> impl Strategy<Value = Vec<Vec<char>>> {
        prop::collection::vec(chars(len), count)
    }
}

#[cfg(test)]
mod tests {
    use super::strategies::{chars, stop_lists};
    use super::*;
    use proptest::prelude::*;

    /// Every matcher test runs on both engines, as aho-corasick runs its
    /// suite on every automaton kind: the choice by size must never change
    /// an answer.
    const KINDS: [EngineKind; 2] = [EngineKind::Dfa, EngineKind::Nfa];

    /// Runs each listed `fn name(kind: EngineKind)` once per engine, as the
    /// tests `dfa::name` and `nfa::name`.
    macro_rules! on_each_engine {
        ($($name:ident),* $(,)?) => {
            mod dfa {
                $( #[test] fn $name() { super::$name(super::EngineKind::Dfa) } )*
            }
            mod nfa {
                $( #[test] fn $name() { super::$name(super::EngineKind::Nfa) } )*
            }
        };
    }

    on_each_engine!(
        earliest_end_then_list_order,
        match_may_start_in_earlier_text_but_must_end_in_new_text,
        code_point_offsets,
        holdback_is_exact,
        holdback_after_a_completed_stop_uses_its_suffix,
        empty_list_and_empty_stop,
        stateless_check_matches_vllm_shape,
        a_thousand_stops,
        duplicates_report_their_first_index,
        lists_over_the_caps_are_refused,
    );

    fn kind_of(s: &StopStrings) -> EngineKind {
        match s.engine {
            Engine::Dfa(_) => EngineKind::Dfa,
            Engine::Nfa(..) => EngineKind::Nfa,
        }
    }

    /// `stops` on engine `kind`, uncached.
    fn build<S: AsRef<str>>(kind: EngineKind, stops: &[S]) -> Arc<StopStrings> {
        let owned = stops.iter().map(|s| s.as_ref().to_owned()).collect();
        let s = StopStrings::with_engine(owned, kind).unwrap();
        assert_eq!(kind_of(&s), kind);
        Arc::new(s)
    }

    /// Naive reference: the first (end, index) of a stop ending in text[from..].
    fn naive_first(text: &[char], from: usize, stops: &[Vec<char>]) -> Option<(usize, usize)> {
        for end in from + 1..=text.len() {
            for (i, s) in stops.iter().enumerate() {
                if s.len() <= end && text[end - s.len()..end] == s[..] {
                    return Some((end, i));
                }
            }
        }
        None
    }

    fn naive_holdback(text: &[char], stops: &[Vec<char>]) -> usize {
        let mut best = 0;
        for s in stops {
            for k in (1..s.len()).rev() {
                if k <= text.len() && text[text.len() - k..] == s[..k] {
                    best = best.max(k);
                    break;
                }
            }
        }
        best
    }

    /// `(index, start, end)` of the match that feeding `new` after
    /// `earlier` finds.
    fn hit_after(
        kind: EngineKind,
        stops: &[&str],
        earlier: &str,
        new: &str,
    ) -> (usize, usize, usize) {
        let s = build(kind, stops);
        let mut m = s.matcher(false);
        assert!(m.feed(earlier).is_none());
        let hit = m.feed(new).unwrap();
        (hit.index, hit.start, hit.end)
    }

    fn earliest_end_then_list_order(kind: EngineKind) {
        assert_eq!(
            hit_after(kind, &["a", "is"], " The user", " is a"),
            (1, 10, 12)
        );
        assert_eq!(hit_after(kind, &["ab", "b"], "", "ab").0, 0);
        assert_eq!(hit_after(kind, &["b", "ab"], "", "ab").0, 0);
    }

    fn match_may_start_in_earlier_text_but_must_end_in_new_text(kind: EngineKind) {
        let s = build(kind, &["bcd"]);
        let mut m = s.matcher(true);
        assert!(m.feed("abc").is_none());
        let hit = m.feed("dx").unwrap();
        assert_eq!((hit.start, hit.end, hit.truncate_to), (1, 4, 4));
        assert!(m.feed("").is_none());
    }

    fn code_point_offsets(kind: EngineKind) {
        assert_eq!(
            hit_after(kind, &["キス", "テ"], "日本語の", "テキスト"),
            (1, 4, 5)
        );
    }

    fn holdback_is_exact(kind: EngineKind) {
        let s = build(kind, &["aab", "ab"]);
        let mut m = s.matcher(false);
        let mut seen = vec![];
        for c in ["x", "a", "a", "a", "c"] {
            m.feed(c);
            seen.push(m.holdback());
        }
        assert_eq!(seen, vec![0, 1, 2, 2, 0]);
        assert_eq!(s.matcher(true).holdback(), 0);
    }

    fn holdback_after_a_completed_stop_uses_its_suffix(kind: EngineKind) {
        // "cd" completes (a caller may ignore it below min_tokens); "d" is
        // still a live prefix of "dz".
        let s = build(kind, &["cd", "dz"]);
        let mut m = s.matcher(false);
        assert!(m.feed("cd").is_some());
        assert_eq!(m.holdback(), 1);
    }

    fn empty_list_and_empty_stop(kind: EngineKind) {
        let s = build::<&str>(kind, &[]);
        assert!(s.matcher(false).feed("anything").is_none());
        assert!(matches!(
            StopStrings::with_engine(vec!["a".into(), "".into()], kind),
            Err(Error::EmptyStop { index: 1 })
        ));
    }

    #[test]
    fn identical_lists_share_one_automaton() {
        let compile = |l: &[&str]| StopStrings::compile_strs(l).unwrap();
        let a = compile(&["cache", "me"]);
        let b = compile(&["cache", "me"]);
        assert!(Arc::ptr_eq(&a, &b));
    }

    fn stateless_check_matches_vllm_shape(kind: EngineKind) {
        let s = build(kind, &["."]);
        assert_eq!(
            s.check("hello world.", 12, 1, false).unwrap(),
            Some((0, 11))
        );
        assert_eq!(s.check("hello world.", 12, 1, true).unwrap(), Some((0, -1)));
        assert!(s.check("hello", 5, 6, false).is_err());
    }

    fn thousand_stops() -> Vec<String> {
        (0..1000)
            .map(|i| format!("stop-{i:05}-padding!!"))
            .collect()
    }

    #[test]
    fn the_engine_is_chosen_by_size() {
        let big = thousand_stops();
        assert!(big.iter().map(String::len).sum::<usize>() > DFA_MAX_PATTERN_BYTES);
        assert_eq!(kind_of(&StopStrings::new(big).unwrap()), EngineKind::Nfa);
        let small = vec!["stop".to_string(); 2];
        assert_eq!(kind_of(&StopStrings::new(small).unwrap()), EngineKind::Dfa);
    }

    fn a_thousand_stops(kind: EngineKind) {
        let s = build(kind, &thousand_stops());
        let mut m = s.matcher(false);
        assert!(m.feed("xx stop-0").is_none());
        assert_eq!(m.holdback(), 6);
        let hit = m.feed("0999-padding!! yy").unwrap();
        assert_eq!((hit.index, hit.start), (999, 3));
    }

    fn duplicates_report_their_first_index(kind: EngineKind) {
        // 1000 copies: over the DFA's byte bound, and the NFA gets one pattern.
        let mut stops = vec!["x".repeat(30); 1000];
        stops[3] = "yy".into();
        stops.push("yy".into());
        let s = build(kind, &stops);
        if kind == EngineKind::Nfa {
            assert!(matches!(s.engine, Engine::Nfa(_, _, Some(_))));
        }
        let mut m = s.matcher(false);
        assert_eq!(m.feed("a yy").unwrap().index, 3);
        assert_eq!(m.feed(&"x".repeat(30)).unwrap().index, 0);
    }

    fn lists_over_the_caps_are_refused(kind: EngineKind) {
        let too_many = vec!["a".to_string(); limits::MAX_STOP_STRINGS + 1];
        let e = StopStrings::with_engine(too_many, kind).err().unwrap();
        assert!(e.to_string().starts_with("stop has 1025 entries"), "{e}");
        let too_long = vec!["a".repeat(limits::MAX_STOP_BYTES + 1)];
        let e = StopStrings::with_engine(too_long, kind).err().unwrap();
        assert!(e.to_string().contains("at most 65536"), "{e}");
        let at_cap = vec!["ab".repeat(limits::MAX_STOP_BYTES / 2)];
        assert!(StopStrings::with_engine(at_cap, kind).is_ok());
    }

    #[test]
    fn a_list_whose_dfa_would_be_huge_uses_the_nfa() {
        // ~16 KiB over ~190 distinct bytes: a dense table would be ~4M entries.
        let chars: Vec<char> = ('!'..='~').chain('\u{a1}'..='\u{7ff}').collect();
        let stops: Vec<String> = (0..1000)
            .map(|i| (0..6).map(|k| chars[(i * 6 + k) % chars.len()]).collect())
            .collect();
        assert!(stops.iter().map(String::len).sum::<usize>() <= DFA_MAX_PATTERN_BYTES);
        let forced = StopStrings::with_engine(stops.clone(), EngineKind::Dfa);
        assert!(matches!(forced, Err(Error::Build(_))));
        let s = Arc::new(StopStrings::new(stops.clone()).unwrap());
        assert_eq!(kind_of(&s), EngineKind::Nfa);
        let mut m = s.matcher(false);
        let hit = m.feed(&format!("x{}y", stops[999])).unwrap();
        assert_eq!((hit.index, hit.start), (999, 1));
    }

    proptest! {
        #[test]
        fn matches_naive_reference_under_any_chunking(
            text in chars(0..40),
            stops in stop_lists(1..5, 0..6),
            cuts in prop::collection::vec(0usize..40, 0..8),
            include in any::<bool>(),
        ) {
            let stop_strs: Vec<String> = stops.iter().map(|s| s.iter().collect()).collect();
            let mut cuts: Vec<usize> = cuts.into_iter().filter(|&c| c <= text.len()).collect();
            cuts.push(text.len());
            cuts.sort_unstable();
            for kind in KINDS {
                let compiled = build(kind, &stop_strs);
                let mut m = compiled.matcher(include);
                let mut prev = 0;
                for &cut in &cuts {
                    let delta: String = text[prev..cut].iter().collect();
                    // The finish machine's fast path: feeds only when nothing
                    // ends in the delta, else leaves the matcher as it was.
                    let mut probe = m.clone();
                    let fed = probe.feed_unless_match(&delta, cut - prev);
                    let got = m.feed(&delta);
                    let want = naive_first(&text[..cut], prev, &stops);
                    prop_assert_eq!(got.map(|h| (h.end, h.index)), want, "{:?}", kind);
                    prop_assert_eq!(fed, got.is_none(), "{:?}", kind);
                    let probe_chars = if fed { cut } else { prev };
                    prop_assert_eq!(probe.chars_fed(), probe_chars, "{:?}", kind);
                    if let Some(h) = got {
                        prop_assert_eq!(h.start, h.end - stops[h.index].len());
                        prop_assert_eq!(h.truncate_to, if include { h.end } else { h.start });
                    }
                    let hold = if include { 0 } else { naive_holdback(&text[..cut], &stops) };
                    prop_assert_eq!(m.holdback(), hold, "{:?}", kind);
                    prev = cut;
                }
            }
        }

        #[test]
        fn stateless_check_equals_matcher(
            text in chars(0..30),
            stops in stop_lists(1..4, 0..5),
            new in 0usize..30,
        ) {
            let new = new.min(text.len());
            let stop_strs: Vec<String> = stops.iter().map(|s| s.iter().collect()).collect();
            let s: String = text.iter().collect();
            let want = naive_first(&text, text.len() - new, &stops)
                .map(|(end, i)| (i, (end - stops[i].len()) as isize));
            for kind in KINDS {
                let got = build(kind, &stop_strs).check(&s, text.len(), new, false).unwrap();
                prop_assert_eq!(got, want, "{:?}", kind);
            }
        }
    }
}
