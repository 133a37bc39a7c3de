//! Stop regexes matched incrementally over a growing text.
//!
//! # Semantics
//!
//! A [`StopRegexes`] is a list of patterns in Rust regex syntax (the `regex`
//! crate's, Unicode-aware: `\w`, `\d`, `.`, `\p{Han}` and case folding work on
//! code points) compiled once into one dense DFA (`regex-automata`) and shared
//! (`Arc`) between sequences and threads; identical lists share one DFA through
//! a process-wide cache ([`StopRegexes::compile`]). A [`StopRegexMatcher`] is
//! the per-sequence state. The rules are those of the stop strings
//! ([`crate::stop_strings`]):
//!
//! * A match counts only if it *ends* inside the newly fed text; it may start
//!   in text fed earlier.
//! * Among the matches ending in the new text the one that ends earliest wins;
//!   at the same end the lowest list index wins. The reported `start` is the
//!   leftmost start of a match of that pattern ending there.
//! * Look-around sees the text received so far and nothing else: `$`, `\z`,
//!   `(?m)$`, `\b` and `\B` treat the end of the last `feed` as the end of the
//!   text, so `\.$` fires on the feed that ends with a period, and not on one
//!   where text follows the period. `^` and `\A` are the start of the whole
//!   text. Feeding in any chunking therefore gives the same first match as
//!   feeding one character at a time for patterns without end-of-text
//!   assertions and word boundaries; with them, the chunking is part of the
//!   input (the finish machine feeds one token's text at a time, so it is the
//!   token boundaries).
//! * `feed` consumes the whole delta whatever it reports, so matching goes on
//!   correctly after a match the caller chose to skip (below `min_tokens`).
//! * Offsets are code points of the cumulative text.
//!
//! Rejected at construction, with an error naming the pattern: a syntax error;
//! a pattern that can match the empty string (`a*`, `\b`, `x|`); a Unicode
//! word boundary (`\b` must be written `(?-u:\b)`; a DFA cannot decide a
//! Unicode `\b` next to non-ASCII text); and a list whose DFA would exceed
//! [`DFA_SIZE_LIMIT`] bytes (or whose determinization would need more than
//! [`DETERMINIZE_SIZE_LIMIT`]).
//!
//! # How it works, and what it costs
//!
//! The DFA is *anchored* and reports every pattern that matches
//! (`MatchKind::All`). The matcher keeps a set of threads: a thread is a
//! start offset plus the DFA state after the text from that offset, kept while
//! the state is not dead. At each code-point boundary a thread is started
//! only if the first byte leaves the start state alive, so text that cannot
//! begin a match costs two table lookups per byte. Two threads in the same
//! DFA state have the same future, so only the one that started first is
//! kept: that is exactly the leftmost start among the matches it can produce,
//! so no text has to be kept and no reverse scan is needed to find where a
//! match begins.
//!
//! A step costs O(len(delta) * (1 + T)), T the number of live threads. T is
//! at most the number of DFA states and is 0 while the text cannot be the
//! start of a match. It stays small for typical stops (`\n\n+(User|Human):`
//! has at most a few), and grows with counted repetition: `a{1,50}b` over a
//! run of `a`s keeps one thread per count. Memory per matcher is O(T).
//!
//! [`StopRegexMatcher::holdback`] is exact: the text from the earliest start
//! of a thread from which a match ending after the current end is still
//! possible (a per-state flag computed once over the DFA). It is 0 when stop
//! matches are kept in the output. A pattern with unbounded repetition can
//! hold back without bound while its prefix keeps matching: `<think>.*?</think>`
//! holds everything from `<think>` until the close tag or the sequence ends.
//! That is the price of never streaming text a later match cuts away; a caller
//! who prefers to stream should bound the pattern (`.{0,200}`).

use std::sync::{Arc, Mutex, OnceLock};

use regex_automata::dfa::{dense, Automaton, StartKind};
use regex_automata::nfa::thompson;
use regex_automata::util::primitives::StateID;
use regex_automata::util::start;
use regex_automata::util::syntax;
use regex_automata::{Anchored, MatchKind};
use regex_syntax::hir::Hir;
use rustc_hash::{FxHashMap, FxHashSet};

use crate::cache::{list_hash, lock, ByteLru, HeapBytes};
pub use crate::cache::{CACHE_CAPACITY, CACHE_MAX_BYTES};
use crate::error::Error;
use crate::limits;
use crate::stop_strings::{char_len, StopMatch};

/// Refuses a list over the caps of [`limits`] before anything is parsed.
fn check_regex_list(patterns: &[String]) -> Result<(), Error> {
    limits::check_count("stop_regex", patterns.len(), limits::MAX_STOP_REGEXES)?;
    let total = patterns.iter().map(String::len).sum();
    limits::check_bytes("stop_regex", total, limits::MAX_STOP_REGEX_BYTES)
}

/// Largest DFA (transition table and match data) a stop-regex list may
/// compile to, in bytes. With [`DETERMINIZE_SIZE_LIMIT`] (the state sets
/// kept while building, whose hashing is most of the time) it bounds the
/// time of any build, accepted or refused (docs/errors.md, "Caps").
pub const DFA_SIZE_LIMIT: usize = 512 << 10;

/// Heap the determinization of one list may use, in bytes.
pub const DETERMINIZE_SIZE_LIMIT: usize = 512 << 10;

/// Largest Thompson NFA of one list, in bytes (the work per DFA state grows
/// with it).
pub const NFA_SIZE_LIMIT: usize = 256 << 10;

/// Threads beyond which duplicate states are found with a hash set instead of
/// a linear scan.
const LINEAR_DEDUP: usize = 16;

/// A compiled, immutable list of stop regexes.
pub struct StopRegexes {
    patterns: Vec<String>,
    dfa: dense::DFA<Vec<u32>>,
    /// Anchored start state after each look-behind: index 0 is the start of
    /// the text, `b + 1` follows the byte `b`.
    starts: Vec<StateID>,
    /// States from which a match ending at least one byte later is reachable.
    future_live: FxHashSet<StateID>,
}

#[derive(Clone, Copy, Debug)]
struct Thread {
    /// Code-point offset where the candidate match starts.
    start: usize,
    state: StateID,
}

/// Per-sequence incremental matcher over a shared [`StopRegexes`].
#[derive(Clone)]
pub struct StopRegexMatcher {
    regexes: Arc<StopRegexes>,
    /// Live threads, in increasing `start`, at most one per DFA state.
    threads: Vec<Thread>,
    scratch: Vec<Thread>,
    seen: FxHashSet<StateID>,
    chars_fed: usize,
    prev_byte: Option<u8>,
    include_in_output: bool,
}

/// A compiled list or the error it was rejected with: rejections are cached
/// too, so a client repeating a list that takes long to reject pays once.
#[derive(Clone)]
struct Compiled {
    patterns: Arc<[String]>,
    result: Result<Arc<StopRegexes>, Error>,
}

impl HeapBytes for Compiled {
    fn heap_bytes(&self) -> usize {
        let strings: usize = self.patterns.iter().map(String::capacity).sum();
        strings
            + match &self.result {
                Ok(rx) => rx.memory_usage() + strings,
                Err(e) => e.heap_bytes(),
            }
    }
}

/// The process-wide cache ([`crate::cache`]'s policy).
fn cache() -> &'static Mutex<ByteLru<Compiled>> {
    static CACHE: OnceLock<Mutex<ByteLru<Compiled>>> = OnceLock::new();
    CACHE.get_or_init(|| Mutex::new(ByteLru::new(CACHE_CAPACITY, CACHE_MAX_BYTES)))
}

fn dfa_builder(dfa_limit: usize) -> dense::Builder {
    let mut b = dense::Builder::new();
    b.configure(
        dense::Config::new()
            .match_kind(MatchKind::All)
            .start_kind(StartKind::Anchored)
            .starts_for_each_pattern(false)
            .accelerate(false)
            .minimize(false)
            .dfa_size_limit(Some(dfa_limit))
            .determinize_size_limit(Some(DETERMINIZE_SIZE_LIMIT)),
    );
    b
}

fn nfa_compiler() -> thompson::Compiler {
    let mut c = thompson::Compiler::new();
    c.configure(
        thompson::Config::new()
            .which_captures(thompson::WhichCaptures::None)
            .nfa_size_limit(Some(NFA_SIZE_LIMIT)),
    );
    c
}

/// A failed build: the size limit in bytes it exceeded (`None` for any other
/// failure) and the message.
type BuildError = (Option<usize>, String);

/// Builds the DFA of `hirs` under the limits above.
fn build(hirs: &[Hir]) -> Result<dense::DFA<Vec<u32>>, BuildError> {
    let nfa = nfa_compiler()
        .build_many_from_hir(hirs)
        .map_err(|e| (e.size_limit(), e.to_string()))?;
    let limit = DFA_SIZE_LIMIT;
    dfa_builder(limit)
        .build_from_nfa(&nfa)
        .map_err(|e| (e.is_size_limit_exceeded().then_some(limit), e.to_string()))
}

impl StopRegexes {
    /// Compiles `patterns`, reusing the DFA of an identical list compiled
    /// earlier in this process (LRU cache of [`CACHE_CAPACITY`] lists).
    ///
    /// # Errors
    /// See [`StopRegexes::new`].
    pub fn compile(patterns: Vec<String>) -> Result<Arc<StopRegexes>, Error> {
        if let Some(hit) = Self::cached(&patterns) {
            return hit;
        }
        check_regex_list(&patterns)?;
        let key = list_hash(&patterns);
        let patterns: Arc<[String]> = patterns.into();
        let result = StopRegexes::new(patterns.to_vec()).map(Arc::new);
        lock(cache()).insert(
            key,
            Compiled {
                patterns,
                result: result.clone(),
            },
        );
        result
    }

    /// What [`compile`](Self::compile) gives for `patterns` if the cache
    /// holds it (a compiled list or its rejection); the cheap part of a
    /// compile, which a caller can run before deciding to give up the GIL.
    pub fn cached(patterns: &[String]) -> Option<Result<Arc<StopRegexes>, Error>> {
        if let Err(e) = check_regex_list(patterns) {
            return Some(Err(e));
        }
        let key = list_hash(patterns);
        lock(cache())
            .get(key, |c| *c.patterns == *patterns)
            .map(|c| c.result)
    }

    /// Compiles `patterns` without consulting the cache.
    ///
    /// # Errors
    /// [`Error::RegexInvalid`] for a syntax error or an unsupported feature,
    /// [`Error::RegexEmptyMatch`] for a pattern that can match the empty
    /// string, [`Error::RegexTooLarge`] when the DFA would exceed the size
    /// limits; each names the pattern.
    pub fn new(patterns: Vec<String>) -> Result<StopRegexes, Error> {
        check_regex_list(&patterns)?;
        let mut hirs = Vec::with_capacity(patterns.len());
        for (index, p) in patterns.iter().enumerate() {
            let hir = syntax::parse(p).map_err(|e| Error::RegexInvalid {
                index,
                pattern: p.clone(),
                message: e.to_string(),
            })?;
            if hir.properties().minimum_len() == Some(0) {
                return Err(Error::RegexEmptyMatch {
                    index,
                    pattern: p.clone(),
                });
            }
            if hir.properties().look_set().contains_word_unicode() {
                return Err(Error::RegexInvalid {
                    index,
                    pattern: p.clone(),
                    message:
                        "a Unicode word boundary (\\b, \\B) cannot be decided by a DFA next to \
                              non-ASCII text; use the ASCII one, (?-u:\\b)"
                            .into(),
                });
            }
            hirs.push(hir);
        }
        let dfa = match build(&hirs) {
            Ok(dfa) => dfa,
            Err(failure) => return Err(Self::blame(&patterns, &hirs, failure)),
        };
        let mut starts = Vec::with_capacity(257);
        for prev in std::iter::once(None).chain((0..=255u8).map(Some)) {
            let cfg = start::Config::new()
                .anchored(Anchored::Yes)
                .look_behind(prev);
            starts.push(dfa.start_state(&cfg).map_err(|e| Error::RegexInvalid {
                index: 0,
                pattern: patterns.first().cloned().unwrap_or_default(),
                message: e.to_string(),
            })?);
        }
        let future_live = future_live(&dfa, &starts);
        Ok(StopRegexes {
            patterns,
            dfa,
            starts,
            future_live,
        })
    }

    /// Turns a failed list build into an error naming one pattern: the
    /// first `i` such that `patterns[..=i]` fails, found by bisection (a
    /// larger prefix never needs a smaller DFA), so a rejection costs at most
    /// about log2(n) + 1 more builds, each cut off by the size limits.
    fn blame(patterns: &[String], hirs: &[Hir], failure: BuildError) -> Error {
        let named = |index: usize, (limit, message): BuildError| match limit {
            Some(limit) => Error::RegexTooLarge {
                index,
                pattern: patterns[index].clone(),
                limit,
            },
            None => Error::RegexInvalid {
                index,
                pattern: patterns[index].clone(),
                message,
            },
        };
        // Invariant: patterns[..=hi] fails (with `failure`), patterns[..lo] builds.
        let (mut lo, mut hi) = (0, hirs.len().saturating_sub(1));
        if hirs.is_empty() {
            return Error::Build(failure.1);
        }
        let mut failure = failure;
        while lo < hi {
            let mid = lo + (hi - lo) / 2;
            match build(&hirs[..=mid]) {
                Ok(_) => lo = mid + 1,
                Err(e) => {
                    hi = mid;
                    failure = e;
                }
            }
        }
        named(hi, failure)
    }

    /// A fresh per-sequence matcher.
    pub fn matcher(self: &Arc<Self>, include_in_output: bool) -> StopRegexMatcher {
        StopRegexMatcher {
            regexes: Arc::clone(self),
            threads: Vec::new(),
            scratch: Vec::new(),
            seen: FxHashSet::default(),
            chars_fed: 0,
            prev_byte: None,
            include_in_output,
        }
    }

    /// The patterns, in list order.
    pub fn patterns(&self) -> &[String] {
        &self.patterns
    }

    /// Number of patterns.
    pub fn len(&self) -> usize {
        self.patterns.len()
    }

    /// True for an empty list (which never matches).
    pub fn is_empty(&self) -> bool {
        self.patterns.is_empty()
    }

    /// Heap bytes used by the DFA.
    pub fn memory_usage(&self) -> usize {
        self.dfa.memory_usage()
    }
}

/// The states from which, after at least one more byte, some match can still
/// be reported (its end then lies past the current position).
fn future_live(dfa: &dense::DFA<Vec<u32>>, starts: &[StateID]) -> FxHashSet<StateID> {
    let reps: Vec<u8> = dfa
        .byte_classes()
        .representatives(..)
        .filter_map(|u| u.as_u8())
        .collect();
    let mut index: FxHashMap<StateID, usize> = FxHashMap::default();
    let mut states: Vec<StateID> = Vec::new();
    let mut succ: Vec<Vec<usize>> = Vec::new();
    let mut intern = |s: StateID, states: &mut Vec<StateID>| -> usize {
        *index.entry(s).or_insert_with(|| {
            states.push(s);
            states.len() - 1
        })
    };
    for &s in starts {
        intern(s, &mut states);
    }
    let mut i = 0;
    while i < states.len() {
        let s = states[i];
        let next: Vec<usize> = reps
            .iter()
            .map(|&b| intern(dfa.next_state(s, b), &mut states))
            .collect();
        succ.push(next);
        i += 1;
    }
    let n = states.len();
    let is_match: Vec<bool> = states.iter().map(|&s| dfa.is_match_state(s)).collect();
    // reaches[x]: some later transition (a byte, or the end of the text)
    // reports a match.
    let mut reaches: Vec<bool> = (0..n)
        .map(|x| {
            dfa.is_match_state(dfa.next_eoi_state(states[x]))
                || succ[x].iter().any(|&y| is_match[y])
        })
        .collect();
    let mut preds: Vec<Vec<usize>> = vec![Vec::new(); n];
    for (x, ys) in succ.iter().enumerate() {
        for &y in ys {
            preds[y].push(x);
        }
    }
    let mut work: Vec<usize> = (0..n).filter(|&x| reaches[x]).collect();
    while let Some(y) = work.pop() {
        for &x in &preds[y] {
            if !reaches[x] {
                reaches[x] = true;
                work.push(x);
            }
        }
    }
    (0..n)
        .filter(|&x| succ[x].iter().any(|&y| reaches[y]))
        .map(|x| states[x])
        .collect()
}

impl StopRegexMatcher {
    /// Feeds the next piece of text; `delta_chars` is its length in code
    /// points. Returns the earliest-ending match inside `delta` (ties: lowest
    /// index, then leftmost start); the whole delta is consumed either way.
    pub fn feed_counted(&mut self, delta: &str, delta_chars: usize) -> Option<StopMatch> {
        let before = self.chars_fed;
        let bytes = delta.as_bytes();
        if bytes.is_empty() {
            return None;
        }
        let rx = &*self.regexes;
        let dfa = &rx.dfa;
        // (end, index, start) of the earliest match found so far.
        let mut best: Option<(usize, usize, usize)> = None;
        let mut pos = before;
        let mut prev = self.prev_byte;
        for &b in bytes {
            // Continuation bytes never start or end a match (the patterns
            // only match valid UTF-8).
            let boundary = (b as i8) >= -0x40;
            if !self.threads.is_empty() {
                let look = best.is_none() && pos > before && boundary;
                let mut found: Option<(usize, usize)> = None;
                self.scratch.clear();
                let many = self.threads.len() > LINEAR_DEDUP;
                if many {
                    self.seen.clear();
                }
                for t in &self.threads {
                    let s = dfa.next_state(t.state, b);
                    if dfa.is_special_state(s) {
                        if dfa.is_dead_state(s) {
                            continue;
                        }
                        if look && dfa.is_match_state(s) {
                            let index = lowest_pattern(dfa, s);
                            if found.map_or(true, |(i, _)| index < i) {
                                found = Some((index, t.start));
                            }
                        }
                    }
                    let dup = if many {
                        !self.seen.insert(s)
                    } else {
                        self.scratch.iter().any(|u| u.state == s)
                    };
                    if !dup {
                        self.scratch.push(Thread {
                            start: t.start,
                            state: s,
                        });
                    }
                }
                std::mem::swap(&mut self.threads, &mut self.scratch);
                if let Some((index, start)) = found {
                    best = Some((pos, index, start));
                }
            }
            if boundary {
                let st = rx.starts[prev.map_or(0, |p| p as usize + 1)];
                let s = dfa.next_state(st, b);
                if !dfa.is_dead_state(s) && !self.threads.iter().any(|u| u.state == s) {
                    self.threads.push(Thread {
                        start: pos,
                        state: s,
                    });
                }
                pos += 1;
            }
            prev = Some(b);
        }
        self.prev_byte = prev;
        self.chars_fed += delta_chars;
        debug_assert_eq!(pos, self.chars_fed);
        if best.is_none() {
            // Matches ending at the end of the text received so far: `$` holds.
            let mut found: Option<(usize, usize)> = None;
            for t in &self.threads {
                let s = dfa.next_eoi_state(t.state);
                if dfa.is_match_state(s) {
                    let index = lowest_pattern(dfa, s);
                    if found.map_or(true, |(i, _)| index < i) {
                        found = Some((index, t.start));
                    }
                }
            }
            best = found.map(|(index, start)| (self.chars_fed, index, start));
        }
        best.map(|(end, index, start)| StopMatch {
            index,
            start,
            end,
            truncate_to: if self.include_in_output { end } else { start },
        })
    }

    /// [`feed_counted`](Self::feed_counted), counting the code points itself.
    pub fn feed(&mut self, delta: &str) -> Option<StopMatch> {
        self.feed_counted(delta, char_len(delta))
    }

    /// Code points at the end of the text fed so far that a later match could
    /// still cut away: from the earliest start of a partial match that can
    /// still complete past the current end. 0 when matches are kept in the
    /// output.
    #[inline]
    pub fn holdback(&self) -> usize {
        if self.include_in_output || self.threads.is_empty() {
            return 0;
        }
        let live = &self.regexes.future_live;
        self.threads
            .iter()
            .find(|t| live.contains(&t.state))
            .map_or(0, |t| self.chars_fed - t.start)
    }

    /// Number of partial matches tracked (the T of the cost).
    pub fn live_threads(&self) -> usize {
        self.threads.len()
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
    pub fn regexes(&self) -> &Arc<StopRegexes> {
        &self.regexes
    }

    /// Forgets all text fed, as if new.
    pub fn reset(&mut self) {
        self.threads.clear();
        self.chars_fed = 0;
        self.prev_byte = None;
    }

    /// Where the earliest live partial match starts (code points), if any:
    /// what a snapshot keeps of the threads.
    pub(crate) fn earliest_start(&self) -> Option<usize> {
        // Threads are kept in increasing start.
        self.threads.first().map(|t| t.start)
    }

    /// Rebuilds the threads of a matcher fed `text` (`text_chars` code
    /// points) whose earliest live thread starts at code point `from`, by
    /// feeding `text` again from there. A thread that started at `from` or
    /// later and died (or merged into an earlier one, which then died) dies
    /// again at the same byte: threads in one DFA state go on alike. So the
    /// live threads, their order and their starts are the original ones.
    pub(crate) fn resume(&mut self, text: &str, text_chars: usize, from: Option<usize>) {
        self.threads.clear();
        self.chars_fed = text_chars;
        self.prev_byte = text.as_bytes().last().copied();
        let Some(from) = from else { return };
        let at = crate::stop_strings::byte_offset_from_end(text, text_chars - from);
        self.chars_fed = from;
        self.prev_byte = text.as_bytes()[..at].last().copied();
        let _ = self.feed_counted(&text[at..], text_chars - from);
    }
}

#[inline]
fn lowest_pattern(dfa: &dense::DFA<Vec<u32>>, s: StateID) -> usize {
    (0..dfa.match_len(s))
        .map(|k| dfa.match_pattern(s, k).as_usize())
        .min()
        .unwrap_or(usize::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn compile(patterns: &[&str]) -> Arc<StopRegexes> {
        StopRegexes::compile(patterns.iter().map(|s| s.to_string()).collect()).unwrap()
    }

    fn feeds(rx: &Arc<StopRegexes>, include: bool, pieces: &[&str]) -> Vec<Option<StopMatch>> {
        let mut m = rx.matcher(include);
        pieces.iter().map(|p| m.feed(p)).collect()
    }

    fn hit(index: usize, start: usize, end: usize) -> Option<StopMatch> {
        Some(StopMatch {
            index,
            start,
            end,
            truncate_to: start,
        })
    }

    #[test]
    fn dollar_is_the_end_of_the_text_received_so_far() {
        let rx = compile(&[r"\.$"]);
        assert_eq!(
            feeds(&rx, false, &["a", ".", "b", "."]),
            vec![None, hit(0, 1, 2), None, hit(0, 3, 4)]
        );
        // A period followed by more text in the same piece is not at the end.
        assert_eq!(feeds(&rx, false, &["a.b"]), vec![None]);
        assert_eq!(feeds(&rx, false, &["a.b."]), vec![hit(0, 3, 4)]);
    }

    #[test]
    fn match_split_across_pieces_starts_in_earlier_text() {
        let rx = compile(&[r"\n\n+(User|Human):"]);
        let got = feeds(&rx, false, &["Sure.\n", "\n\nUs", "er", ": next"]);
        assert_eq!(got, vec![None, None, None, hit(0, 5, 13)]);
        let mut m = rx.matcher(true);
        m.feed("x\n\n");
        let h = m.feed("Human:").unwrap();
        assert_eq!((h.start, h.end, h.truncate_to), (1, 9, 9));
    }

    #[test]
    fn earliest_end_then_list_order_then_leftmost_start() {
        let rx = compile(&["bc", "ab"]);
        assert_eq!(feeds(&rx, false, &["abc"]), vec![hit(1, 0, 2)]);
        let rx = compile(&["b", "ab"]);
        assert_eq!(feeds(&rx, false, &["ab"]), vec![hit(0, 1, 2)]);
        // One pattern, several starts ending at the same place: leftmost.
        let rx = compile(&["b|ab|xab"]);
        assert_eq!(feeds(&rx, false, &["zxa", "b"]), vec![None, hit(0, 1, 4)]);
        let rx = compile(&["a+b"]);
        assert_eq!(feeds(&rx, false, &["caaa", "ab"]), vec![None, hit(0, 1, 6)]);
    }

    #[test]
    fn a_match_ending_where_the_previous_feed_ended_is_not_reported_again() {
        let rx = compile(&["ab"]);
        let mut m = rx.matcher(false);
        assert_eq!(m.feed("ab"), hit(0, 0, 2));
        assert_eq!(m.feed("c"), None);
        assert_eq!(m.feed("ab"), hit(0, 3, 5));
    }

    #[test]
    fn unicode_classes_and_code_point_offsets() {
        let rx = compile(&[r"\p{Han}+。"]);
        assert_eq!(
            feeds(&rx, false, &["答：", "好的", "。🙂"]),
            vec![None, None, hit(0, 2, 5)]
        );
        let rx = compile(&[r"(?i)straße"]);
        assert_eq!(
            feeds(&rx, false, &["🙂STRASSE STRAẞE"]),
            vec![hit(0, 9, 15)]
        );
    }

    #[test]
    fn anchors_and_ascii_word_boundaries() {
        let rx = compile(&[r"^Q"]);
        assert_eq!(feeds(&rx, false, &["Q"]), vec![hit(0, 0, 1)]);
        assert_eq!(feeds(&rx, false, &["a", "Q"]), vec![None, None]);
        let rx = compile(&[r"(?m)^END$"]);
        assert_eq!(feeds(&rx, false, &["x\nEND"]), vec![hit(0, 2, 5)]);
        assert_eq!(feeds(&rx, false, &["x\nENDS"]), vec![None]);
        let rx = compile(&[r"(?-u:\b)cat(?-u:\b)"]);
        assert_eq!(feeds(&rx, false, &["a cat"]), vec![hit(0, 2, 5)]);
        assert_eq!(feeds(&rx, false, &["a cats"]), vec![None]);
    }

    #[test]
    fn holdback_is_the_earliest_live_start() {
        let rx = compile(&[r"\n\n+(User|Human):"]);
        let mut m = rx.matcher(false);
        let mut seen = vec![];
        for p in ["ok", "\n", "\n", "\nUs", "x", "\n"] {
            assert!(m.feed(p).is_none());
            seen.push(m.holdback());
        }
        assert_eq!(seen, vec![0, 1, 2, 5, 0, 1]);
        assert_eq!(rx.matcher(true).holdback(), 0);
    }

    #[test]
    fn holdback_after_a_completed_match_keeps_only_what_can_grow() {
        let rx = compile(&["ab"]);
        let mut m = rx.matcher(false);
        assert!(m.feed("ab").is_some());
        assert_eq!(m.holdback(), 0);
        let rx = compile(&["ab+"]);
        let mut m = rx.matcher(false);
        assert!(m.feed("xab").is_some());
        assert_eq!(m.holdback(), 2);
    }

    #[test]
    fn unbounded_repetition_holds_back_until_it_resolves() {
        let rx = compile(&[r"<t>.*?</t>"]);
        let mut m = rx.matcher(false);
        m.feed("pre <t>");
        assert_eq!(m.holdback(), 3);
        m.feed(" a long thought");
        assert_eq!(m.holdback(), 18);
        assert_eq!(m.feed(" </t>"), hit(0, 4, 27));
    }

    #[test]
    fn rejected_patterns_name_themselves() {
        let err = |p: Vec<&str>| StopRegexes::new(p.into_iter().map(String::from).collect()).err();
        for p in ["a*", r"\b", "x|", "(?:)", "^"] {
            assert!(
                matches!(err(vec!["ok", p]), Some(Error::RegexEmptyMatch { index: 1, ref pattern }) if pattern == p),
                "{p}"
            );
        }
        let e = err(vec!["(unclosed"]).unwrap();
        assert!(matches!(e, Error::RegexInvalid { index: 0, .. }));
        assert!(e.to_string().contains("stop_regex[0]=\"(unclosed\""), "{e}");
        assert!(matches!(
            err(vec![r"cat\b"]),
            Some(Error::RegexInvalid { index: 0, .. })
        ));
        let big = err(vec!["fine", r"\w{300}[0-9]"]).unwrap();
        assert!(
            matches!(big, Error::RegexTooLarge { index: 1, .. }),
            "{big}"
        );
    }

    #[test]
    fn identical_lists_share_one_dfa_and_empty_lists_never_match() {
        let a = compile(&["x+y", "z"]);
        assert!(Arc::ptr_eq(&a, &compile(&["x+y", "z"])));
        assert!(a.memory_usage() > 0);
        assert!(compile(&[]).matcher(false).feed("anything").is_none());
    }

    #[test]
    fn reset_forgets_everything() {
        let rx = compile(&["ab"]);
        let mut m = rx.matcher(false);
        m.feed("a");
        m.reset();
        assert_eq!((m.chars_fed(), m.holdback(), m.live_threads()), (0, 0, 0));
        assert_eq!(m.feed("b"), None);
    }

    const ALPHABET: [char; 4] = ['a', 'b', 'é', '日'];

    fn atom(one_char: bool) -> impl Strategy<Value = String> {
        let mut atoms = vec!["a", "b", "é", "日", ".", "[ab]", "[^a]", r"\p{Han}"];
        if !one_char {
            atoms.extend(["(a|bé)", "(?:ab)"]);
        }
        let quant = if one_char {
            vec!["", "+", "?", "*"]
        } else {
            vec!["", "+", "?", "*", "{2}", "{1,3}", "+?"]
        };
        (prop::sample::select(atoms), prop::sample::select(quant))
            .prop_map(|(a, q)| format!("{a}{q}"))
    }

    fn pattern(one_char: bool) -> impl Strategy<Value = String> {
        (
            prop::collection::vec(atom(one_char), 1..4),
            prop::option::of(prop::collection::vec(atom(one_char), 1..3)),
        )
            .prop_map(|(a, b)| match b {
                None => a.concat(),
                Some(b) => format!("{}|{}", a.concat(), b.concat()),
            })
    }

    fn build_ok(patterns: &[String]) -> Option<Arc<StopRegexes>> {
        StopRegexes::new(patterns.to_vec()).ok().map(Arc::new)
    }

    fn full(patterns: &[String]) -> Vec<regex::Regex> {
        patterns
            .iter()
            .map(|p| regex::Regex::new(&format!(r"\A(?:{p})\z")).unwrap())
            .collect()
    }

    /// The earliest (end, index, start) over matches ending in text[from..].
    fn oracle(text: &[char], from: usize, res: &[regex::Regex]) -> Option<(usize, usize, usize)> {
        for end in from + 1..=text.len() {
            for (i, r) in res.iter().enumerate() {
                for start in 0..end {
                    let sub: String = text[start..end].iter().collect();
                    if r.is_match(&sub) {
                        return Some((end, i, start));
                    }
                }
            }
        }
        None
    }

    fn chunk(text: &[char], cuts: Vec<usize>) -> Vec<usize> {
        let mut cuts: Vec<usize> = cuts.into_iter().filter(|&c| c <= text.len()).collect();
        cuts.push(text.len());
        cuts.sort_unstable();
        cuts
    }

    proptest! {
        #[test]
        fn matches_the_regex_crate_under_any_chunking(
            patterns in prop::collection::vec(pattern(false), 1..4),
            text in prop::collection::vec(prop::sample::select(ALPHABET.to_vec()), 0..16),
            cuts in prop::collection::vec(0usize..16, 0..6),
            include in any::<bool>(),
        ) {
            let Some(rx) = build_ok(&patterns) else { return Ok(()) };
            let res = full(&patterns);
            let mut m = rx.matcher(include);
            let mut prev = 0;
            for cut in chunk(&text, cuts) {
                let delta: String = text[prev..cut].iter().collect();
                let got = m.feed(&delta).map(|h| (h.end, h.index, h.start));
                prop_assert_eq!(got, oracle(&text[..cut], prev, &res), "{:?} fed {:?}", patterns, delta);
                if let Some(h) = m.feed("").or(None) { prop_assert!(false, "empty feed matched {:?}", h); }
                prev = cut;
            }
        }

        #[test]
        fn holdback_is_exact(
            patterns in prop::collection::vec(pattern(true), 1..3),
            text in prop::collection::vec(prop::sample::select(ALPHABET.to_vec()), 0..10),
        ) {
            let Some(rx) = build_ok(&patterns) else { return Ok(()) };
            let res = full(&patterns);
            // Every continuation of up to 3 characters (enough for patterns
            // of at most three single-character atoms).
            let mut conts: Vec<String> = vec![String::new()];
            let mut all = vec![];
            for _ in 0..3 {
                conts = conts.iter().flat_map(|c| ALPHABET.iter().map(move |a| format!("{c}{a}"))).collect();
                all.extend(conts.iter().cloned());
            }
            let mut m = rx.matcher(false);
            for q in 0..text.len() {
                m.feed(&text[q].to_string());
                let q = q + 1;
                let want = (0..q).find(|&s| {
                    let head: String = text[s..q].iter().collect();
                    all.iter().any(|u| res.iter().any(|r| r.is_match(&format!("{head}{u}"))))
                }).map_or(0, |s| q - s);
                prop_assert_eq!(m.holdback(), want, "{:?} after {:?}", patterns, &text[..q]);
            }
        }

        #[test]
        fn dollar_and_boundaries_follow_feed_ends(
            text in prop::collection::vec(prop::sample::select(vec!['a', '.', ' ', '日']), 0..14),
            cuts in prop::collection::vec(0usize..14, 0..6),
        ) {
            // `$` and `\b` evaluated on each prefix the matcher has received.
            let patterns = vec![r"\.$".to_string(), r"a(?-u:\b)".to_string(), r"日 ?a".to_string()];
            let rx = build_ok(&patterns).unwrap();
            let plain = regex::Regex::new(r"\A(?:日 ?a)\z").unwrap();
            let mut m = rx.matcher(false);
            let mut prev = 0;
            for cut in chunk(&text, cuts) {
                let delta: String = text[prev..cut].iter().collect();
                let got = m.feed(&delta).map(|h| (h.end, h.index, h.start));
                let mut want = None;
                'outer: for end in prev + 1..=cut {
                    let at_end = end == cut;
                    let next = text.get(end).copied();
                    let word = |c: Option<char>| c.is_some_and(|c| c == 'a');
                    if text[end - 1] == '.' && at_end {
                        want = Some((end, 0, end - 1));
                        break;
                    }
                    let boundary_after = at_end || !word(next);
                    if text[end - 1] == 'a' && boundary_after {
                        want = Some((end, 1, end - 1));
                        break;
                    }
                    for start in 0..end {
                        let sub: String = text[start..end].iter().collect();
                        if plain.is_match(&sub) {
                            want = Some((end, 2, start));
                            break 'outer;
                        }
                    }
                }
                prop_assert_eq!(got, want, "fed {:?} of {:?}", delta, text);
                prev = cut;
            }
        }
    }
}
