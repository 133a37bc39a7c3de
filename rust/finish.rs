//! The ordered finish-state machine of one sequence.
//!
//! # Semantics
//!
//! [`FinishTracker::update`] appends one decoding step: a single token or a
//! speculative-decoding accept run. The run is examined token by token and
//! the first position at which a condition fires decides, so a run of k tokens
//! gives exactly what k one-token updates give. `n` is the number of output
//! tokens after appending the token at hand. At one position the checks are,
//! in order:
//!
//! 1. invalid token (`vocab_size` set, id >= vocab_size) -> `error`; the token
//!    and its text are not kept;
//! 2. a stop string or stop regex completing inside this token's text, only
//!    if `n > min_tokens` (as vLLM v1's detokenizer; the match may start in
//!    earlier tokens) -> `stop`, text cut at the match (kept up to its end with
//!    `include_stop_str_in_output`). The earliest end inside the token wins; at
//!    the same end a string beats a regex;
//! 3. EOS (unless `ignore_eos`) -> `stop`, `stop_reason` None. Fires below
//!    `min_tokens` too: min_tokens is enforced by masking the logits, and an EOS
//!    the sampler produced anyway is honoured;
//! 4. a stop token id -> `stop`, `stop_reason` = the id (not disabled by
//!    `ignore_eos`). For 3 and 4 the token is kept, its text only with
//!    `include_stop_str_in_output`; without it the text is not fed to the
//!    stop-string and stop-regex matchers either, so it cannot decide 2;
//! 5. the grammar terminated at this position -> `stop` (so a grammar end on
//!    the last budgeted token is a stop; SGLang 0.5.23 reports length there,
//!    docs/semantics.md 6.3);
//! 6. `n >= max_tokens` or `prompt_len + n >= max_model_len` -> `length`;
//! 7. repetition (only when `n >= min_tokens`; vLLM's tail rule) -> `repetition`.
//!
//! docs/semantics.md section 3 is the contract these follow.
//!
//! Tokens after the deciding one are dropped. After a finish, `update` is an
//! error and `abort` a no-op.
//!
//! # Streaming
//!
//! Each step reports the text and tokens that may be released: while running,
//! everything but the exact hold-back (the larger of the stop strings' and the
//! stop regexes'), and a token only once all of
//! its text is released; at finish, everything kept. Joined deltas equal the
//! final text and the kept tokens, and no delta ever holds text past a stop cut
//! (a match can only start inside the held-back suffix).

use std::ops::Range;
use std::sync::Arc;

use crate::error::{Error, Problem};
use crate::reasoning::{Channel, ChannelRanges, Channels, PromptState, Reasoning};
use crate::stop_regex::{StopRegexMatcher, StopRegexes};
use crate::stop_strings::{byte_offset_from_end, char_len, StopMatch, StopMatcher, StopStrings};

/// vLLM's repetition rule: the sequence finishes when its last
/// `L * min_count` output tokens are one pattern of `L` tokens repeated
/// `min_count` times, for some `L` in `[min_pattern_size, max_pattern_size]`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Repetition {
    pub max_pattern_size: usize,
    /// 0 means 1.
    pub min_pattern_size: usize,
    pub min_count: usize,
}

/// Per-request stop parameters (field names as in vLLM's `SamplingParams`).
#[derive(Clone, Default)]
pub struct StopParams {
    pub max_tokens: Option<u64>,
    pub min_tokens: u64,
    pub prompt_len: u64,
    pub max_model_len: Option<u64>,
    pub eos_token_ids: Vec<u32>,
    pub ignore_eos: bool,
    pub stop_token_ids: Vec<u32>,
    /// Compiled stop strings; `None` or an empty list for none.
    pub stop: Option<Arc<StopStrings>>,
    /// Compiled stop regexes; `None` or an empty list for none.
    pub stop_regex: Option<Arc<StopRegexes>>,
    pub include_stop_str_in_output: bool,
    pub vocab_size: Option<u32>,
    pub repetition: Option<Repetition>,
    /// Reasoning channels and stop scopes (`reasoning` module); `None`: one
    /// channel, as before.
    pub reasoning: Option<Arc<Reasoning>>,
    /// Release text only in whole tokens (`text_delta` is exactly the text
    /// of `token_ids_delta` while running).
    pub token_aligned: bool,
}

fn param(field: &'static str, problem: Problem) -> Error {
    Error::param(field, problem)
}

/// `field` must be at least `min`.
fn at_least(field: &'static str, min: u64, value: u64) -> Result<(), Error> {
    Problem::at_least(min, value).map_err(|p| param(field, p))
}

/// `field` (= `value`) must not exceed `other` (= `limit`).
fn at_most(field: &'static str, value: u64, other: &'static str, limit: u64) -> Result<(), Error> {
    if value > limit {
        return Err(param(
            field,
            Problem::Greater {
                value,
                other,
                limit,
            },
        ));
    }
    Ok(())
}

impl StopParams {
    /// Whether a prompt can be read for an open reasoning block without a
    /// vocabulary ([`crate::reasoning::ReasoningSpec::reads_prompt_by_ids`]); false without
    /// a reasoning block.
    pub fn reads_prompt_by_ids(&self) -> bool {
        self.reasoning
            .as_ref()
            .is_some_and(|r| r.spec().reads_prompt_by_ids())
    }

    /// Checks every field and their combinations.
    ///
    /// # Errors
    /// [`Error::Param`] naming the first offending field and its value.
    pub fn validate(&self) -> Result<(), Error> {
        if let Some(m) = self.max_tokens {
            at_least("max_tokens", 1, m)?;
            at_most("min_tokens", self.min_tokens, "max_tokens", m)?;
        }
        if let Some(m) = self.max_model_len {
            at_least("max_model_len", 1, m)?;
            if self.prompt_len >= m {
                return Err(param(
                    "prompt_len",
                    Problem::NoRoom {
                        value: self.prompt_len,
                        other: "max_model_len",
                        limit: m,
                    },
                ));
            }
        }
        if let Some(v) = self.vocab_size {
            at_least("vocab_size", 1, v.into())?;
            for (field, ids) in [
                ("eos_token_ids", &self.eos_token_ids),
                ("stop_token_ids", &self.stop_token_ids),
            ] {
                if let Some((index, &id)) = ids.iter().enumerate().find(|(_, &id)| id >= v) {
                    return Err(param(
                        field,
                        Problem::IdOutside {
                            index,
                            id: id.into(),
                            bound_name: "vocab_size",
                            bound: v.into(),
                        },
                    ));
                }
            }
        }
        if let Some(r) = self.repetition {
            const MAX: &str = "repetition[\"max_pattern_size\"]";
            const MIN: &str = "repetition[\"min_pattern_size\"]";
            const COUNT: &str = "repetition[\"min_count\"]";
            let (max, min, count) = (
                r.max_pattern_size as u64,
                r.min_pattern_size as u64,
                r.min_count as u64,
            );
            at_least(MAX, 1, max)?;
            at_most(MIN, min, MAX, max)?;
            if r.max_pattern_size.checked_mul(r.min_count).is_none() {
                return Err(param(
                    COUNT,
                    Problem::ProductOverflows {
                        value: count,
                        other: MAX,
                        other_value: max,
                    },
                ));
            }
            at_least(COUNT, 2, count)?;
        }
        if let (Some(r), Some(v)) = (&self.reasoning, self.vocab_size) {
            r.check_ids("vocab_size", v.into())?;
        }
        Ok(())
    }

    fn stop_strings(&self) -> Option<&Arc<StopStrings>> {
        self.stop.as_ref().filter(|s| !s.is_empty())
    }

    fn stop_regexes(&self) -> Option<&Arc<StopRegexes>> {
        self.stop_regex.as_ref().filter(|s| !s.is_empty())
    }
}

/// Why a sequence finished (vLLM's `FinishReason` names).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FinishReason {
    Stop,
    Length,
    Error,
    Abort,
    Repetition,
}

impl FinishReason {
    /// Every reason, in the order `stopline.FINISH_REASONS` lists them.
    pub const ALL: [FinishReason; 5] = [
        FinishReason::Stop,
        FinishReason::Length,
        FinishReason::Abort,
        FinishReason::Error,
        FinishReason::Repetition,
    ];

    /// The reason whose [`as_str`](Self::as_str) is `name`.
    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|r| r.as_str() == name)
    }

    pub fn as_str(self) -> &'static str {
        match self {
            FinishReason::Stop => "stop",
            FinishReason::Length => "length",
            FinishReason::Error => "error",
            FinishReason::Abort => "abort",
            FinishReason::Repetition => "repetition",
        }
    }
}

/// What caused a stop: the stop string or stop regex (by list index), the
/// stop token id, or the repetition detector. EOS and grammar termination have
/// none.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StopReason {
    StopString(usize),
    StopRegex(usize),
    TokenId(u32),
    RepetitionDetected,
}

/// What matched: the stop string (by list index), a stop regex (by list
/// index; the text is [`FinishTracker::regex_matched`]) or the deciding token
/// id.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Matched {
    StopString(usize),
    StopRegex(usize),
    TokenId(u32),
}

/// The final state of a finished sequence.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Finish {
    pub reason: FinishReason,
    pub stop_reason: Option<StopReason>,
    pub matched: Option<Matched>,
}

/// What one `update` released: ranges into [`FinishTracker::text`] (bytes)
/// and [`FinishTracker::token_ids`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Step {
    pub text_delta: Range<usize>,
    pub token_ids_delta: Range<usize>,
    /// The deltas are exactly the step's input: its token ids and the
    /// concatenation of its text pieces (nothing was held back before or
    /// after, nothing cut, dropped or replaced). A caller holding the pieces
    /// can hand them on instead of copying the delta.
    pub whole_run: bool,
}

/// True when the tail of `tokens` repeats one pattern as `r` describes.
pub fn has_repetition(tokens: &[u32], r: Repetition) -> bool {
    let n = tokens.len();
    for len in r.min_pattern_size.max(1)..=r.max_pattern_size {
        // Longer patterns only need more tokens: stop at the first that cannot fit.
        let Some(span) = len.checked_mul(r.min_count).filter(|&s| s <= n) else {
            return false;
        };
        if (0..span - len).all(|k| tokens[n - 1 - k] == tokens[n - 1 - k - len]) {
            return true;
        }
    }
    false
}

/// The tokens and text a sequence keeps.
#[derive(Clone)]
pub(crate) struct Kept {
    pub(crate) tokens: Vec<u32>,
    pub(crate) text: String,
    pub(crate) text_chars: usize,
}

/// Code-point end of each kept token's text, for tokens not yet released:
/// `ends[head..]` (a queue that empties whenever everything is released,
/// which is most steps).
#[derive(Clone, Default)]
pub(crate) struct Pending {
    pub(crate) ends: Vec<usize>,
    pub(crate) head: usize,
}

impl Kept {
    fn with_capacity(tokens: usize) -> Self {
        Kept {
            tokens: Vec::with_capacity(tokens),
            text: String::with_capacity(tokens * 4),
            text_chars: 0,
        }
    }

    #[inline(always)]
    fn push(&mut self, id: u32, piece: &str, piece_chars: usize) {
        self.tokens.push(id);
        self.text.push_str(piece);
        self.text_chars += piece_chars;
    }

    /// The kept text between two code-point offsets.
    fn slice_chars(&self, start: usize, end: usize) -> &str {
        let a = byte_offset_from_end(&self.text, self.text_chars - start);
        let b = byte_offset_from_end(&self.text, self.text_chars - end);
        &self.text[a..b]
    }

    fn cut_text(&mut self, keep_chars: usize) {
        let byte = byte_offset_from_end(&self.text, self.text_chars - keep_chars);
        self.text.truncate(byte);
        self.text_chars = keep_chars;
    }
}

/// Keeps a token and its piece, queued for release.
#[inline(always)]
fn keep(kept: &mut Kept, pending: &mut Pending, id: u32, piece: &str, piece_chars: usize) {
    kept.push(id, piece, piece_chars);
    pending.ends.push(kept.text_chars);
}

/// The byte offset in `text` that is `forward` chars after byte `from`
/// and `back` chars before the end, walking whichever is shorter: a step
/// costs O(new text) even while a regex holds back a long prefix
/// (`(?s).*zz`), not O(held text). Out of line: most steps hold nothing.
#[inline(never)]
fn released_bytes(text: &str, from: usize, forward: usize, back: usize) -> usize {
    if forward <= back {
        let tail = &text[from..];
        from + tail
            .char_indices()
            .nth(forward)
            .map_or(tail.len(), |(b, _)| b)
    } else {
        byte_offset_from_end(text, back)
    }
}

/// Token `id` with its output text through the reasoning channels: the stop
/// it completes there, if `allow`ed. Out of line, as the other reasoning
/// hooks, so the loops without reasoning stay as small as before.
#[inline(never)]
fn channel_token(
    c: &mut Channels,
    kept: &Kept,
    pending: &Pending,
    id: u32,
    text: &str,
    allow: bool,
) -> Option<crate::reasoning::Hit> {
    let unreleased = &pending.ends[pending.head..];
    c.token(
        &kept.text,
        kept.text_chars,
        unreleased,
        kept.tokens.len(),
        id,
        text,
        allow,
    )
}

#[cfg(test)]
thread_local! {
    /// Steps `plain_token` took on this thread: the tests check that their
    /// inputs reach the fast path, not only the general loop.
    static PLAIN_STEPS: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

/// The finish state of one sequence.
#[derive(Clone)]
pub struct FinishTracker {
    pub(crate) params: Arc<StopParams>,
    pub(crate) matcher: Option<StopMatcher>,
    pub(crate) regex: Option<StopRegexMatcher>,
    /// The text a stop regex matched, once one finished the sequence.
    pub(crate) regex_matched: String,
    /// Smallest and largest EOS / stop token id: most tokens fall outside and
    /// skip both lookups.
    pub(crate) special_ids: (u32, u32),
    /// `vocab_size`, or above every id without one.
    pub(crate) vocab_limit: u64,
    /// The first `n` at which the sequence finishes with `length`.
    pub(crate) length_cap: u64,
    /// `length_cap` when `plain_token` may take a step (no stop regexes, no
    /// repetition rule), else 0, which sends every step to the general loop.
    pub(crate) plain_cap: u64,
    pub(crate) kept: Kept,
    pub(crate) pending: Pending,
    pub(crate) emitted_bytes: usize,
    pub(crate) emitted_chars: usize,
    pub(crate) emitted_tokens: usize,
    pub(crate) finish: Option<Finish>,
    /// Reasoning channels, when configured (the stop matchers then live
    /// there, one pair per channel, and `matcher` / `regex` are `None`).
    pub(crate) channels: Option<Box<Channels>>,
    /// `channels` has a reasoning block (not tool-call spans alone).
    pub(crate) block: bool,
    /// Steps must carry text pieces.
    pub(crate) text_required: bool,
    /// `params.token_aligned`, read on every release.
    pub(crate) token_aligned: bool,
}

impl FinishTracker {
    /// # Errors
    /// [`Error::Param`] if `params` does not validate.
    pub fn new(params: Arc<StopParams>) -> Result<Self, Error> {
        Self::with_prompt(params, PromptState::NoMarker)
    }

    /// [`new`](Self::new) for a prompt in state `prompt`: with reasoning
    /// configured and no start channel in the params, a prompt that ends
    /// inside an open block starts the output in reasoning, its tokens after
    /// the start marker counted against the budget.
    ///
    /// # Errors
    /// [`Error::Param`] if `params` does not validate.
    pub fn with_prompt(params: Arc<StopParams>, prompt: PromptState) -> Result<Self, Error> {
        params.validate()?;
        let specials = params
            .stop_token_ids
            .iter()
            .chain(params.eos_token_ids.iter().filter(|_| !params.ignore_eos));
        let mut special_ids =
            specials.fold((u32::MAX, 0), |(lo, hi), &id| (lo.min(id), hi.max(id)));
        let channels = params.reasoning.as_ref().map(|r| {
            // Marker ids take the general loop, as stop ids do.
            if let Some((lo, hi)) = r.id_range() {
                special_ids = (special_ids.0.min(lo), special_ids.1.max(hi));
            }
            let (start, prior) = match (r.spec().starts_in, prompt) {
                (Some(c), _) => (c, 0),
                (None, PromptState::Open { tokens_after }) => (Channel::Reasoning, tokens_after),
                (None, _) => (Channel::Content, 0),
            };
            Box::new(Channels::new(
                Arc::clone(r),
                params.include_stop_str_in_output,
                start,
                prior,
            ))
        });
        let length_cap = params.max_tokens.unwrap_or(u64::MAX).min(
            params
                .max_model_len
                .map_or(u64::MAX, |m| m - params.prompt_len),
        );
        let plain_stops = channels.is_none();
        let matcher = params
            .stop_strings()
            .filter(|_| plain_stops)
            .map(|s| s.matcher(params.include_stop_str_in_output));
        let regex = params
            .stop_regexes()
            .filter(|_| plain_stops)
            .map(|s| s.matcher(params.include_stop_str_in_output));
        let text_required = matcher.is_some()
            || regex.is_some()
            || channels
                .as_ref()
                .is_some_and(|c| c.reasoning().needs_text());
        let token_aligned = params.token_aligned;
        let block = params.reasoning.as_ref().is_some_and(|r| r.has_block());
        let vocab_limit = params.vocab_size.map_or(u64::MAX, u64::from);
        let plain = regex.is_none() && params.repetition.is_none();
        Ok(FinishTracker {
            params,
            matcher,
            regex,
            regex_matched: String::new(),
            special_ids,
            vocab_limit,
            plain_cap: if plain { length_cap } else { 0 },
            length_cap,
            pending: Pending::default(),
            kept: Kept::with_capacity(length_cap.min(256) as usize),
            emitted_bytes: 0,
            emitted_chars: 0,
            emitted_tokens: 0,
            finish: None,
            channels,
            block,
            text_required,
            token_aligned,
        })
    }

    /// Checks a step's arguments against each other and the state, without
    /// changing anything.
    #[inline]
    pub fn check_step(
        &self,
        run_len: usize,
        texts_len: Option<usize>,
        grammar_terminated_at: Option<usize>,
    ) -> Result<(), Error> {
        if let Some(f) = self.finish {
            return Err(Error::Finished {
                finish_reason: f.reason.as_str(),
            });
        }
        match texts_len {
            Some(t) if t != run_len => {
                return Err(Error::Step {
                    field: "texts",
                    problem: Box::new(Problem::Count {
                        n: t,
                        unit: "pieces",
                        expected: run_len,
                        per: "token ids",
                        hint: "; pass one piece per token",
                    }),
                    slot: None,
                })
            }
            None if self.text_required => {
                let why = if self.params.stop_strings().is_some() {
                    "this sequence has stop strings, which are matched on text"
                } else if self.params.stop_regexes().is_some() {
                    "this sequence has stop regexes, which are matched on text"
                } else if self
                    .params
                    .reasoning
                    .as_ref()
                    .is_some_and(|r| r.has_text_block_marker())
                {
                    "this sequence has reasoning markers given as text"
                } else {
                    // Spans alone, or with a block whose markers are ids.
                    "this sequence has tool-call markers given as text"
                };
                return Err(Error::Step {
                    field: "texts",
                    problem: Box::new(Problem::Required { why }),
                    slot: None,
                });
            }
            _ => {}
        }
        if let Some(g) = grammar_terminated_at {
            if g >= run_len {
                return Err(Error::Step {
                    field: "grammar_terminated_at",
                    problem: Box::new(Problem::OutsideRun {
                        index: None,
                        value: g as i64,
                        run_len,
                    }),
                    slot: None,
                });
            }
        }
        Ok(())
    }

    /// Whether [`check_step`](Self::check_step) accepts a one-token step
    /// with (or without) its text piece and no grammar termination: the
    /// common case, answered without building an error.
    #[inline(always)]
    pub fn accepts_one_token(&self, with_text: bool) -> bool {
        self.finish.is_none() && (with_text || !self.text_required)
    }

    /// Appends one step (a token or an accept run); `texts`, when given, holds
    /// one piece per token.
    ///
    /// # Errors
    /// [`Error::Finished`] after a finish; [`Error::Step`] for a `texts`
    /// length mismatch, missing texts with stop strings, or
    /// `grammar_terminated_at` outside the run. Nothing changes on error.
    pub fn update<S: AsRef<str>>(
        &mut self,
        token_ids: &[u32],
        texts: Option<&[S]>,
        grammar_terminated_at: Option<usize>,
    ) -> Result<Step, Error> {
        self.check_step(
            token_ids.len(),
            texts.map(<[S]>::len),
            grammar_terminated_at,
        )?;
        Ok(self.update_checked(token_ids, texts, grammar_terminated_at, None))
    }

    /// [`update`](Self::update) for an ids-only step, whose decoder flushed
    /// held bytes into a piece (docs/semantics.md 10.3): the last
    /// `flush_tails[j]` bytes of piece j are kept only if token j finishes
    /// with `length` or the grammar, and never reach the stop matchers.
    ///
    /// # Errors
    /// As [`update`](Self::update); a `flush_tails` length other than the
    /// ids' is [`Error::Step`].
    pub fn update_flushed<S: AsRef<str>>(
        &mut self,
        token_ids: &[u32],
        texts: Option<&[S]>,
        grammar_terminated_at: Option<usize>,
        flush_tails: &[u8],
    ) -> Result<Step, Error> {
        if flush_tails.len() != token_ids.len() {
            return Err(Error::Step {
                field: "flush_tails",
                problem: Box::new(Problem::Count {
                    n: flush_tails.len(),
                    unit: "entries",
                    expected: token_ids.len(),
                    per: "token ids",
                    hint: "",
                }),
                slot: None,
            });
        }
        // `update`'s own body, repeated: one shared helper changed what the
        // compiler inlines into `update`'s hot path.
        self.check_step(
            token_ids.len(),
            texts.map(<[S]>::len),
            grammar_terminated_at,
        )?;
        Ok(self.update_checked(token_ids, texts, grammar_terminated_at, Some(flush_tails)))
    }

    /// [`update`](Self::update) for arguments already passed through
    /// [`check_step`](Self::check_step). Inlined so that a caller passing one
    /// token gets the loop compiled away.
    #[inline(always)]
    pub(crate) fn update_checked<S: AsRef<str>>(
        &mut self,
        token_ids: &[u32],
        texts: Option<&[S]>,
        grammar_terminated_at: Option<usize>,
        flush_tails: Option<&[u8]>,
    ) -> Step {
        // A flush tail only comes at the length cap or a grammar end, which
        // `plain_token` sends back anyway; checked so it never keeps one.
        if let ([id], None | Some([0])) = (token_ids, flush_tails) {
            let piece = texts.map_or("", |t| t[0].as_ref());
            if let Some(step) = self.plain_token(*id, piece, grammar_terminated_at == Some(0)) {
                return step;
            }
        }
        let tokens_before = self.emitted_tokens;
        let text_before = self.emitted_bytes;
        // Stays true while every token goes in whole with its piece.
        let mut whole = text_before == self.kept.text.len();
        let p: &StopParams = &self.params;
        for (i, &id) in token_ids.iter().enumerate() {
            let n = self.kept.tokens.len() as u64 + 1;
            let piece = texts.map_or("", |t| t[i].as_ref());
            if u64::from(id) >= self.vocab_limit {
                whole = false;
                self.finish = Some(Finish {
                    reason: FinishReason::Error,
                    stop_reason: None,
                    matched: None,
                });
                break;
            }
            let piece_chars = char_len(piece);
            // A decoder's flush (10.3) is text only for a length or grammar
            // finish: the matchers and a stop-token finish see the head.
            let tail = flush_tails.map_or(0, |f| usize::from(f[i]));
            let head = &piece[..piece.len() - tail];
            let head_chars = if tail == 0 {
                piece_chars
            } else {
                char_len(head)
            };
            let (lo, hi) = self.special_ids;
            let is_special = lo <= id && id <= hi;
            let is_eos = is_special && !p.ignore_eos && p.eos_token_ids.contains(&id);
            let ends = is_eos || (is_special && self.stop_id_fires(id));
            // A stop token's text that will not be kept is not output text, so
            // it can neither complete nor cut a stop string (as vLLM's
            // detokenizer, which leaves it out before matching).
            let matched_text = !head.is_empty() && (!ends || p.include_stop_str_in_output);
            let mut hit: Option<StopMatch> = None;
            if let Some(m) = self.matcher.as_mut().filter(|_| matched_text) {
                hit = m.feed_counted(head, head_chars);
            }
            // Requests without stop regexes pay this one branch.
            let mut by_regex = false;
            if let Some(r) = self.regex.as_mut().filter(|_| matched_text) {
                if let Some(rh) = r.feed_counted(head, head_chars) {
                    // A string wins a tie at the same end.
                    if hit.map_or(true, |h| rh.end < h.end) {
                        hit = Some(rh);
                        by_regex = true;
                    }
                }
            }
            if let Some(c) = self.channels.as_deref_mut() {
                let text = if matched_text { head } else { "" };
                let allow = n > p.min_tokens;
                if let Some(h) = channel_token(c, &self.kept, &self.pending, id, text, allow) {
                    (hit, by_regex) = (Some(h.m), h.by_regex);
                }
            }
            if let Some(hit) = hit.filter(|_| n > p.min_tokens) {
                whole = false;
                keep(&mut self.kept, &mut self.pending, id, head, head_chars);
                let (stop_reason, matched) = if by_regex {
                    self.regex_matched = self.kept.slice_chars(hit.start, hit.end).to_owned();
                    (
                        StopReason::StopRegex(hit.index),
                        Matched::StopRegex(hit.index),
                    )
                } else {
                    (
                        StopReason::StopString(hit.index),
                        Matched::StopString(hit.index),
                    )
                };
                self.kept.cut_text(hit.truncate_to);
                self.finish = Some(Finish {
                    reason: FinishReason::Stop,
                    stop_reason: Some(stop_reason),
                    matched: Some(matched),
                });
                break;
            }
            if ends {
                if p.include_stop_str_in_output {
                    whole &= tail == 0;
                    keep(&mut self.kept, &mut self.pending, id, head, head_chars);
                } else {
                    whole &= piece.is_empty();
                    keep(&mut self.kept, &mut self.pending, id, "", 0);
                }
                self.finish = Some(Finish {
                    reason: FinishReason::Stop,
                    stop_reason: if is_eos {
                        None
                    } else {
                        Some(StopReason::TokenId(id))
                    },
                    matched: Some(Matched::TokenId(id)),
                });
                break;
            }
            keep(&mut self.kept, &mut self.pending, id, piece, piece_chars);
            if grammar_terminated_at == Some(i) {
                self.finish = Some(Finish {
                    reason: FinishReason::Stop,
                    stop_reason: None,
                    matched: Some(Matched::TokenId(id)),
                });
                break;
            }
            if n >= self.length_cap {
                self.finish = Some(Finish {
                    reason: FinishReason::Length,
                    stop_reason: None,
                    matched: None,
                });
                break;
            }
            if let Some(r) = p.repetition {
                if n >= p.min_tokens && has_repetition(&self.kept.tokens, r) {
                    self.finish = Some(Finish {
                        reason: FinishReason::Repetition,
                        stop_reason: Some(StopReason::RepetitionDetected),
                        matched: None,
                    });
                    break;
                }
            }
        }
        self.release();
        Step {
            text_delta: text_before..self.emitted_bytes,
            token_ids_delta: tokens_before..self.emitted_tokens,
            whole_run: whole
                && self.emitted_bytes == self.kept.text.len()
                && self.emitted_tokens == tokens_before + token_ids.len(),
        }
    }

    /// The common decode step, one token that no finish rule applies to,
    /// taken without the general loop of `update_checked`. The tests here
    /// only screen: they send every token some rule could apply to (a
    /// special or out-of-vocabulary id, the length cap, a grammar end, a stop
    /// string ending in the piece, stop regexes or the repetition rule
    /// configured) back to that loop, returning `None` with nothing changed.
    #[inline(always)]
    fn plain_token(&mut self, id: u32, piece: &str, grammar_here: bool) -> Option<Step> {
        let n = self.kept.tokens.len() as u64 + 1;
        let (lo, hi) = self.special_ids;
        if grammar_here
            || (lo <= id && id <= hi)
            || u64::from(id) >= self.vocab_limit
            || n >= self.plain_cap
        {
            return None;
        }
        let piece_chars = char_len(piece);
        match self.matcher.as_mut() {
            Some(m) => {
                if !piece.is_empty() && !m.feed_unless_match(piece, piece_chars) {
                    return None;
                }
            }
            // With reasoning (its matchers are the channels'), text may move
            // a marker: the general loop. A held partial marker or stop keeps
            // `whole` false below, so an empty piece's release is
            // channel-aware.
            None => {
                if !piece.is_empty() && self.channels.is_some() {
                    return None;
                }
            }
        }
        let tokens_before = self.emitted_tokens;
        let text_before = self.emitted_bytes;
        let whole = text_before == self.kept.text.len();
        let whole_run = if whole && self.matcher.as_ref().map_or(0, StopMatcher::holdback) == 0 {
            // Nothing held back before or after: no token end needs queueing.
            self.kept.push(id, piece, piece_chars);
            self.emit_all();
            true
        } else {
            keep(&mut self.kept, &mut self.pending, id, piece, piece_chars);
            self.release();
            whole
                && self.emitted_bytes == self.kept.text.len()
                && self.emitted_tokens == tokens_before + 1
        };
        #[cfg(test)]
        PLAIN_STEPS.with(|c| c.set(c.get() + 1));
        Some(Step {
            text_delta: text_before..self.emitted_bytes,
            token_ids_delta: tokens_before..self.emitted_tokens,
            whole_run,
        })
    }

    /// Finishes with `abort`, releasing everything kept. A no-op (empty
    /// deltas) on a finished sequence.
    pub fn abort(&mut self) -> Step {
        let tokens_before = self.emitted_tokens;
        let text_before = self.emitted_bytes;
        if self.finish.is_none() {
            self.finish = Some(Finish {
                reason: FinishReason::Abort,
                stop_reason: None,
                matched: None,
            });
            self.release();
        }
        Step {
            text_delta: text_before..self.emitted_bytes,
            token_ids_delta: tokens_before..self.emitted_tokens,
            whole_run: false,
        }
    }

    /// Advances the released text and tokens: all at finish, else all but the
    /// hold-back.
    #[inline(always)]
    fn release(&mut self) {
        let mut hold = 0;
        if self.finish.is_none() {
            hold = self.matcher.as_ref().map_or(0, StopMatcher::holdback);
            if let Some(r) = &self.regex {
                // Never more than what is still unreleased.
                hold = hold.max(r.holdback().min(self.kept.text_chars - self.emitted_chars));
            }
            if let Some(c) = &self.channels {
                let unreleased = self.kept.text_chars - self.emitted_chars;
                hold = c.holdback(&self.kept.text).min(unreleased);
            }
        }
        if hold == 0 {
            self.emit_all();
            self.pending.ends.clear();
            self.pending.head = 0;
            return;
        }
        let before = (self.emitted_bytes, self.emitted_chars);
        // Released text never shrinks.
        let to = (self.kept.text_chars - hold).max(self.emitted_chars);
        self.emitted_bytes = released_bytes(
            &self.kept.text,
            self.emitted_bytes,
            to - self.emitted_chars,
            self.kept.text_chars - to,
        );
        self.emitted_chars = to;
        let pending = &self.pending.ends[self.pending.head..];
        let released = pending.partition_point(|&e| e <= self.emitted_chars);
        if self.token_aligned {
            self.align_release(released, before);
        }
        self.pending.head += released;
        self.emitted_tokens += released;
    }

    /// Marks everything kept as emitted (the release queue is the caller's).
    #[inline(always)]
    fn emit_all(&mut self) {
        self.emitted_bytes = self.kept.text.len();
        self.emitted_chars = self.kept.text_chars;
        self.emitted_tokens = self.kept.tokens.len();
    }

    pub fn params(&self) -> &Arc<StopParams> {
        &self.params
    }

    /// The final state, once finished.
    pub fn finish(&self) -> Option<Finish> {
        self.finish
    }

    pub fn is_finished(&self) -> bool {
        self.finish.is_some()
    }

    /// Output tokens kept.
    pub fn token_ids(&self) -> &[u32] {
        &self.kept.tokens
    }

    /// Output text kept (after any stop-string cut).
    pub fn text(&self) -> &str {
        &self.kept.text
    }

    /// Length of [`text`](Self::text) in code points.
    pub fn text_len(&self) -> usize {
        self.kept.text_chars
    }

    /// Code points released to the stream so far.
    pub fn emitted_len(&self) -> usize {
        self.emitted_chars
    }

    /// The stop string with list index `index`.
    pub fn stop_string(&self, index: usize) -> &str {
        self.params
            .stop_strings()
            .map_or("", |s| s.stops()[index].as_str())
    }

    /// The stop regex with list index `index`.
    pub fn stop_regex(&self, index: usize) -> &str {
        self.params
            .stop_regexes()
            .map_or("", |s| s.patterns()[index].as_str())
    }

    /// The text the stop regex that finished the sequence matched (empty
    /// otherwise).
    pub fn regex_matched(&self) -> &str {
        &self.regex_matched
    }

    /// Whether stop token id `id` ends the sequence in the current channel
    /// (its scope, when reasoning is configured).
    #[inline]
    fn stop_id_fires(&self, id: u32) -> bool {
        match self.channels.as_deref() {
            None => self.params.stop_token_ids.contains(&id),
            Some(c) => self.scoped_stop_id_fires(c, id),
        }
    }

    #[inline(never)]
    fn scoped_stop_id_fires(&self, c: &Channels, id: u32) -> bool {
        let ids = &self.params.stop_token_ids;
        let (r, ch) = (c.reasoning(), c.channel());
        // Inside a tool-call span no stop id fires (semantics.md 11.10).
        !c.in_span() && (0..ids.len()).any(|i| ids[i] == id && r.stop_id_applies(i, ch))
    }

    /// Moves the release back to the end of the last whole token released
    /// (`released` of the queue); with none, to `before`, where the text
    /// released before ended (a token end too).
    #[inline(never)]
    fn align_release(&mut self, released: usize, before: (usize, usize)) {
        let pending = &self.pending.ends[self.pending.head..];
        (self.emitted_bytes, self.emitted_chars) = match released {
            0 => before,
            // From the last release or from the end, whichever is nearer
            // (as `release`): O(new text), not O(held text).
            r => {
                let end = pending[r - 1];
                let tail = self.kept.text_chars - end;
                let bytes = released_bytes(&self.kept.text, before.0, end - before.1, tail);
                (bytes, end)
            }
        };
    }

    /// Whether reasoning channels are configured (a reasoning block, not
    /// tool-call spans alone).
    #[inline(always)]
    pub fn has_channels(&self) -> bool {
        self.block
    }

    /// The channel state when a reasoning block is configured.
    #[inline(always)]
    fn block_channels(&self) -> Option<&Channels> {
        self.channels.as_deref().filter(|_| self.block)
    }

    /// Whether a tool-call span is open now, after the last step (at
    /// finish: whether the sequence finished inside one); `false` without
    /// spans (docs/semantics.md 11.10).
    #[inline]
    pub fn in_tool_call(&self) -> bool {
        self.channels.as_deref().is_some_and(Channels::in_span)
    }

    /// The channel that holds all of `text` (a byte range of
    /// [`text`](Self::text)) and `tokens`, if one does (a delta wholly in one
    /// channel, the usual step); `None` without reasoning.
    #[inline]
    pub fn whole_channel(&self, text: &Range<usize>, tokens: &Range<usize>) -> Option<Channel> {
        self.block_channels().and_then(|c| c.whole(text, tokens))
    }

    /// For a sequence with reasoning and no token to force next whose step
    /// released `text` and `tokens` wholly in one channel (the usual step):
    /// that channel and the channel output is in now; `None` otherwise (the
    /// caller then asks [`channel_ranges`](Self::channel_ranges) and
    /// [`forced_token_id`](Self::forced_token_id)).
    #[inline(always)]
    pub fn plain_row(
        &self,
        text: &Range<usize>,
        tokens: &Range<usize>,
    ) -> Option<(Channel, Channel)> {
        let c = self.block_channels()?;
        // A row with a token to force goes the long way, which records it;
        // a budget not yet spent keeps the row plain.
        if c.has_budget() && self.forced_token_id().is_some() {
            return None;
        }
        Some((c.whole(text, tokens)?, c.channel()))
    }

    /// The channel output is in now (at finish: the one it finished in);
    /// `None` without reasoning configured.
    #[inline]
    pub fn channel(&self) -> Option<Channel> {
        self.block_channels().map(Channels::channel)
    }

    /// The reasoning and content parts of `text` (byte range of
    /// [`text`](Self::text)) and `tokens` (range of
    /// [`token_ids`](Self::token_ids)): e.g. a [`Step`]'s deltas, or
    /// everything for the final channels. `None` without reasoning.
    pub fn channel_ranges(
        &self,
        text: Range<usize>,
        tokens: Range<usize>,
    ) -> Option<ChannelRanges> {
        self.block_channels().map(|c| c.split(text, tokens))
    }

    /// Reasoning tokens kept while the reasoning block is open (0 once it
    /// closed or without reasoning).
    pub fn reasoning_tokens(&self) -> usize {
        self.channels
            .as_deref()
            .map_or(0, |c| c.reasoning_tokens(self.kept.tokens.len()))
    }

    /// The token id the engine must sample next: once a running sequence
    /// has `max_reasoning_tokens` reasoning tokens with the block still open,
    /// the end marker's ids, one per step (vLLM's `thinking_token_budget`
    /// counting); `None` otherwise.
    #[inline]
    pub fn forced_token_id(&self) -> Option<u32> {
        let c = self.channels.as_deref().filter(|_| self.finish.is_none())?;
        c.forced(self.kept.tokens.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::batch::StepInput;
    use proptest::prelude::*;

    fn params(f: impl FnOnce(&mut StopParams)) -> Arc<StopParams> {
        let mut p = StopParams::default();
        f(&mut p);
        Arc::new(p)
    }

    fn stops(list: &[&str]) -> Option<Arc<StopStrings>> {
        Some(StopStrings::compile(list.iter().map(|s| s.to_string()).collect()).unwrap())
    }

    #[test]
    fn eos_inside_accept_run_beats_length() {
        let mut t = FinishTracker::new(params(|p| {
            p.eos_token_ids = vec![2];
            p.max_tokens = Some(5);
        }))
        .unwrap();
        t.update::<&str>(&[10], None, None).unwrap();
        t.update::<&str>(&[11], None, None).unwrap();
        t.update::<&str>(&[12, 2, 20], None, None).unwrap();
        let f = t.finish().unwrap();
        assert_eq!(f.reason, FinishReason::Stop);
        assert_eq!(f.matched, Some(Matched::TokenId(2)));
        assert_eq!(t.token_ids(), &[10, 11, 12, 2]);
        assert!(matches!(
            t.update::<&str>(&[1], None, None),
            Err(Error::Finished { .. })
        ));
    }

    #[test]
    fn stop_string_cuts_text_and_drops_later_tokens() {
        let mut t = FinishTracker::new(params(|p| {
            p.stop = stops(&["cd"]);
            p.include_stop_str_in_output = true;
        }))
        .unwrap();
        let s = t
            .update(&[1, 2, 3], Some(&["ab", "cdx", "ef"]), None)
            .unwrap();
        assert_eq!(t.text(), "abcd");
        assert_eq!(t.token_ids(), &[1, 2]);
        assert_eq!(&t.text()[s.text_delta], "abcd");
        assert_eq!(
            t.finish().unwrap().stop_reason,
            Some(StopReason::StopString(0))
        );
    }

    #[test]
    fn streaming_holds_back_partial_stop_and_its_tokens() {
        let mut t = FinishTracker::new(params(|p| p.stop = stops(&["abc"]))).unwrap();
        let s = t.update(&[1], Some(&["xya"]), None).unwrap();
        assert_eq!(&t.text()[s.text_delta], "xy");
        assert_eq!(s.token_ids_delta, 0..0);
        let s = t.update(&[2], Some(&["bq"]), None).unwrap();
        assert_eq!(&t.text()[s.text_delta], "abq");
        assert_eq!(s.token_ids_delta, 0..2);
    }

    #[test]
    fn min_tokens_gates_stop_strings_but_not_eos() {
        let mut t = FinishTracker::new(params(|p| {
            p.stop = stops(&["cd"]);
            p.min_tokens = 2;
        }))
        .unwrap();
        t.update(
            &[99, 100, 99, 100, 120],
            Some(&["c", "d", "c", "d", "x"]),
            None,
        )
        .unwrap();
        assert_eq!(t.text(), "cd");
        assert_eq!(t.token_ids().len(), 4);
    }

    // docs/semantics.md 3, check 4 (vLLM 0.33.0's detokenizer agrees).
    #[test]
    fn stop_token_text_never_reaches_the_matcher_unless_kept() {
        let p = |include| {
            params(move |p| {
                p.stop = stops(&["a<", "<|e"]);
                p.stop_token_ids = vec![7];
                p.include_stop_str_in_output = include;
            })
        };
        let mut t = FinishTracker::new(p(false)).unwrap();
        t.update(&[1, 7], Some(&["xa", "<|end|>"]), None).unwrap();
        let f = t.finish().unwrap();
        assert_eq!(f.stop_reason, Some(StopReason::TokenId(7)));
        assert_eq!((t.text(), t.token_ids()), ("xa", &[1u32, 7][..]));
        // Kept text is matched: the string completes inside the stop token.
        let mut t = FinishTracker::new(p(true)).unwrap();
        t.update(&[1, 7], Some(&["xa", "<|end|>"]), None).unwrap();
        let f = t.finish().unwrap();
        assert_eq!(f.stop_reason, Some(StopReason::StopString(0)));
        assert_eq!((t.text(), t.token_ids()), ("xa<", &[1u32, 7][..]));
    }

    // docs/semantics.md 3, checks 5 and 6; SGLang 0.5.23 tests its cap first and
    // reports length here (6.3).
    #[test]
    fn grammar_end_on_the_last_budgeted_token_is_a_stop() {
        let p = params(|p| p.max_tokens = Some(2));
        let mut t = FinishTracker::new(Arc::clone(&p)).unwrap();
        t.update::<&str>(&[10, 11], None, Some(1)).unwrap();
        let f = t.finish().unwrap();
        assert_eq!(
            (f.reason, f.matched),
            (FinishReason::Stop, Some(Matched::TokenId(11)))
        );
        let mut t = FinishTracker::new(p).unwrap();
        t.update::<&str>(&[10, 11, 12], None, Some(2)).unwrap();
        assert_eq!(t.finish().unwrap().reason, FinishReason::Length);
        assert_eq!(t.token_ids(), &[10, 11]);
    }

    #[test]
    fn invalid_token_is_not_kept() {
        let mut t = FinishTracker::new(params(|p| p.vocab_size = Some(100))).unwrap();
        t.update(&[10, 100], Some(&["a", "?"]), None).unwrap();
        assert_eq!(t.finish().unwrap().reason, FinishReason::Error);
        assert_eq!((t.text(), t.token_ids()), ("a", &[10u32][..]));
    }

    #[test]
    fn validation_names_the_field() {
        let bad = params(|p| {
            p.max_tokens = Some(3);
            p.min_tokens = 4;
        });
        assert!(matches!(
            FinishTracker::new(bad).err(),
            Some(Error::Param {
                field: "min_tokens",
                ..
            })
        ));
        let bad = params(|p| {
            p.vocab_size = Some(10);
            p.stop_token_ids = vec![10];
        });
        assert!(matches!(
            FinishTracker::new(bad).err(),
            Some(Error::Param {
                field: "stop_token_ids",
                ..
            })
        ));
        let t = FinishTracker::new(params(|p| p.stop = stops(&["x"]))).unwrap();
        assert!(matches!(
            t.check_step(1, None, None),
            Err(Error::Step { field: "texts", .. })
        ));
    }

    #[test]
    fn repetition_rule() {
        let r = Repetition {
            max_pattern_size: 3,
            min_pattern_size: 2,
            min_count: 3,
        };
        assert!(has_repetition(&[1, 2, 3, 1, 2, 3, 1, 2, 3], r));
        assert!(!has_repetition(&[1, 2, 3, 1, 2, 3], r));
        let r1 = Repetition {
            max_pattern_size: 1,
            min_pattern_size: 0,
            min_count: 4,
        };
        assert!(has_repetition(&[7, 7, 7, 7], r1));
    }

    fn regexes(list: &[&str]) -> Option<Arc<StopRegexes>> {
        Some(StopRegexes::compile(list.iter().map(|s| s.to_string()).collect()).unwrap())
    }

    #[test]
    fn stop_regex_at_the_end_of_a_token() {
        let mut t = FinishTracker::new(params(|p| p.stop_regex = regexes(&[r"\.$"]))).unwrap();
        t.update(&[1, 2], Some(&["a.b", "c"]), None).unwrap();
        assert!(!t.is_finished());
        let s = t.update(&[3, 4], Some(&[".", "d"]), None).unwrap();
        assert_eq!((t.text(), t.token_ids()), ("a.bc", &[1, 2, 3][..]));
        assert_eq!(&t.text()[s.text_delta], "");
        let f = t.finish().unwrap();
        assert_eq!(f.stop_reason, Some(StopReason::StopRegex(0)));
        assert_eq!((t.stop_regex(0), t.regex_matched()), (r"\.$", "."));
    }

    #[test]
    fn earliest_end_across_strings_and_regexes_string_first_at_a_tie() {
        let p = params(|p| {
            p.stop = stops(&["END"]);
            p.stop_regex = regexes(&[r"x\w+D", r"q\d"]);
        });
        let mut t = FinishTracker::new(Arc::clone(&p)).unwrap();
        t.update(&[1], Some(&["so xEND"]), None).unwrap();
        assert_eq!(t.finish().unwrap().matched, Some(Matched::StopString(0)));
        assert_eq!(t.text(), "so x");
        let mut t = FinishTracker::new(p).unwrap();
        t.update(&[1], Some(&["q1 END"]), None).unwrap();
        assert_eq!(t.finish().unwrap().matched, Some(Matched::StopRegex(1)));
        assert_eq!((t.text(), t.regex_matched()), ("", "q1"));
    }

    #[test]
    fn stop_regex_holds_back_a_live_prefix_and_respects_min_tokens() {
        let mut t = FinishTracker::new(params(|p| {
            p.stop_regex = regexes(&[r"\n\n+User:"]);
            p.min_tokens = 1;
            p.include_stop_str_in_output = false;
        }))
        .unwrap();
        let s = t.update(&[1], Some(&["\n\nUser:"]), None).unwrap();
        assert!(!t.is_finished());
        assert_eq!(&t.text()[s.text_delta], "\n\nUser:");
        let s = t.update(&[2], Some(&["ok\n\nUs"]), None).unwrap();
        assert_eq!(&t.text()[s.text_delta], "ok");
        assert_eq!(s.token_ids_delta, 1..1);
        t.update(&[3], Some(&["er: x"]), None).unwrap();
        assert_eq!((t.text(), t.regex_matched()), ("\n\nUser:ok", "\n\nUser:"));
    }

    fn piece() -> impl Strategy<Value = String> {
        prop::sample::select(vec![
            "", "a", "b", "c", "ab", "ca", "é", "日本", "🙂", "STOP", "x",
        ])
        .prop_map(str::to_string)
    }

    /// Final state and joined stream of one tracker run: finish, text, token
    /// ids, regex match, streamed text, streamed tokens.
    type Run = (Option<Finish>, String, Vec<u32>, String, String, Vec<u32>);

    /// Drives a fresh tracker over `ids`/`texts` cut at `bounds` (the grammar
    /// terminating at token `grammar_at`), aborting it if still running.
    fn drive(
        p: &Arc<StopParams>,
        ids: &[u32],
        texts: &[&str],
        bounds: &[usize],
        grammar_at: Option<usize>,
    ) -> Run {
        let mut t = FinishTracker::new(Arc::clone(p)).unwrap();
        let (mut text, mut tokens) = (String::new(), Vec::new());
        let mut prev = 0;
        for &b in bounds {
            if t.is_finished() {
                break;
            }
            let g = grammar_at.filter(|&g| g >= prev && g < b).map(|g| g - prev);
            let s = t.update(&ids[prev..b], Some(&texts[prev..b]), g).unwrap();
            text.push_str(&t.text()[s.text_delta.clone()]);
            tokens.extend_from_slice(&t.token_ids()[s.token_ids_delta.clone()]);
            prev = b;
        }
        close(&mut t, text, tokens)
    }

    /// Aborts `t` if still running, adding the released rest to the streamed
    /// `text` and `tokens`, and returns the outcome.
    fn close(t: &mut FinishTracker, mut text: String, mut tokens: Vec<u32>) -> Run {
        if !t.is_finished() {
            let s = t.abort();
            text.push_str(&t.text()[s.text_delta]);
            tokens.extend_from_slice(&t.token_ids()[s.token_ids_delta]);
        }
        let (finish, kept_text, kept_ids) =
            (t.finish(), t.text().to_string(), t.token_ids().to_vec());
        (
            finish,
            kept_text,
            kept_ids,
            t.regex_matched().to_string(),
            text,
            tokens,
        )
    }

    /// [`drive`] over sampled `(id, piece)` tokens, after checking that the
    /// streamed text and ids add up to what was kept.
    fn drive_streamed(
        p: &Arc<StopParams>,
        toks: &[(u32, String)],
        bounds: &[usize],
        grammar_at: Option<usize>,
    ) -> Result<Run, TestCaseError> {
        let ids: Vec<u32> = toks.iter().map(|t| t.0).collect();
        let texts: Vec<&str> = toks.iter().map(|t| t.1.as_str()).collect();
        let run = drive(p, &ids, &texts, bounds, grammar_at);
        prop_assert_eq!(&run.1, &run.4);
        prop_assert_eq!(&run.2, &run.5);
        Ok(run)
    }

    /// A step-invariance case: tokens, cut points, `min_tokens`,
    /// `include_stop_str_in_output`.
    type Sample = (Vec<(u32, String)>, Vec<usize>, u64, bool);

    fn sample() -> impl Strategy<Value = Sample> {
        (
            prop::collection::vec((0u32..12, piece()), 1..30),
            prop::collection::vec(1usize..30, 0..6),
            0u64..4,
            any::<bool>(),
        )
    }

    /// With EOS 11, at most 25 tokens and then `f`'s parameters, one token
    /// per update and the runs the cuts make give the same run.
    fn same_run_in_any_steps(
        (toks, cuts, min_tokens, include): Sample,
        grammar_at: Option<usize>,
        f: impl FnOnce(&mut StopParams),
    ) -> Result<(), TestCaseError> {
        let p = params(|p| {
            p.eos_token_ids = vec![11];
            p.max_tokens = Some(25);
            p.min_tokens = min_tokens;
            p.include_stop_str_in_output = include;
            f(p);
        });
        let singles: Vec<usize> = (1..=toks.len()).collect();
        let a = drive_streamed(&p, &toks, &singles, grammar_at)?;
        let b = drive_streamed(&p, &toks, &bounds(cuts, toks.len()), grammar_at)?;
        prop_assert_eq!(a, b);
        Ok(())
    }

    /// The cut points below `n` from `cuts`, sorted, ending at `n`.
    fn bounds(cuts: Vec<usize>, n: usize) -> Vec<usize> {
        let mut b: Vec<usize> = cuts.into_iter().filter(|&c| c < n).collect();
        b.push(n);
        b.sort_unstable();
        b.dedup();
        b
    }

    /// `drive`'s outcome through a [`FinishBatch`] decode step (one token
    /// per slot, no run lengths), next to a slot that takes a token too.
    fn drive_batch_decode(
        p: &Arc<StopParams>,
        ids: &[u32],
        texts: &[&str],
        grammar_at: Option<usize>,
    ) -> Run {
        let mut b = crate::batch::FinishBatch::new(4).unwrap();
        b.add(3, Arc::clone(p)).unwrap();
        b.add(1, Arc::new(StopParams::default())).unwrap();
        let (mut text, mut tokens, mut out) = (String::new(), Vec::new(), Vec::new());
        for (i, (&id, &piece)) in ids.iter().zip(texts).enumerate() {
            if b.get(3).unwrap().is_finished() {
                break;
            }
            let grammar = (grammar_at == Some(i)).then_some(&[0i64, -1][..]);
            out.clear();
            let ids = [id, 7];
            let input = StepInput::new(&[3, 1], &ids).grammar(grammar);
            b.step(input.texts(Some(&[piece, "z"])), &mut out).unwrap();
            let t = b.get(3).unwrap();
            text.push_str(&t.text()[out[0].step.text_delta.clone()]);
            tokens.extend_from_slice(&t.token_ids()[out[0].step.token_ids_delta.clone()]);
        }
        close(&mut b.remove(3).unwrap(), text, tokens)
    }

    /// Neither stop regexes nor the repetition rule, so a one-token update
    /// goes through `plain_token` wherever no finish rule applies. One-token
    /// updates and a batch's decode steps must give what one accept run
    /// through the general loop gives, on both matcher engines.
    #[test]
    fn plain_token_path_equals_the_general_loop() {
        use crate::stop_strings::EngineKind;
        let stop_lists: Vec<&[&str]> = vec![&[], &["c"], &["ab", "STOP", "a日"], &["日本🙂", "x"]];
        let strategy = (
            prop::collection::vec((0u32..14, piece()), 1..30),
            prop::sample::select(stop_lists),
            prop::sample::select(vec![EngineKind::Dfa, EngineKind::Nfa]),
            (prop::option::of(4u64..30), 0u64..4, any::<bool>()),
            (prop::option::of(12u32..14), any::<bool>()),
            prop::option::of(0usize..30),
        );
        let (plain, singles) = (std::cell::Cell::new(0), std::cell::Cell::new(0));
        let mut runner = proptest::test_runner::TestRunner::default();
        let result = runner.run(&strategy, |(toks, list, kind, lengths, ids, grammar_at)| {
            let (max_tokens, min_tokens, include) = lengths;
            let (vocab_size, ignore_eos) = ids;
            let stop = StopStrings::with_engine(list.iter().map(|s| s.to_string()).collect(), kind)
                .unwrap();
            let p = params(|p| {
                p.stop = Some(Arc::new(stop));
                p.eos_token_ids = vec![11];
                p.stop_token_ids = vec![10];
                p.ignore_eos = ignore_eos;
                p.max_tokens = max_tokens;
                p.min_tokens = min_tokens;
                p.include_stop_str_in_output = include;
                p.vocab_size = vocab_size;
            });
            let one_run = drive_streamed(&p, &toks, &[toks.len()], grammar_at)?;
            let before = PLAIN_STEPS.with(std::cell::Cell::get);
            let one_by_one: Vec<usize> = (1..=toks.len()).collect();
            let a = drive_streamed(&p, &toks, &one_by_one, grammar_at)?;
            plain.set(plain.get() + PLAIN_STEPS.with(std::cell::Cell::get) - before);
            singles.set(singles.get() + a.2.len() as u64);
            prop_assert_eq!(&a, &one_run);
            let ids: Vec<u32> = toks.iter().map(|t| t.0).collect();
            let texts: Vec<&str> = toks.iter().map(|t| t.1.as_str()).collect();
            prop_assert_eq!(&drive_batch_decode(&p, &ids, &texts, grammar_at), &one_run);
            Ok(())
        });
        if let Err(e) = result {
            panic!("{e}");
        }
        // Most kept tokens are ordinary ones: the fast path must take them.
        let (plain, singles) = (plain.get(), singles.get());
        assert!(
            2 * plain > singles,
            "plain_token took {plain} of {singles} steps"
        );
    }

    proptest! {
        #[test]
        fn step_invariance_and_stream_reassembly(
            s in sample(),
            grammar_at in prop::option::of(0usize..30),
        ) {
            same_run_in_any_steps(s, grammar_at, |p| {
                p.stop = stops(&["ab", "STOP", "a日"]);
                p.stop_token_ids = vec![10];
                p.vocab_size = Some(12);
                p.repetition = Some(Repetition { max_pattern_size: 2, min_pattern_size: 1, min_count: 4 });
            })?;
        }

        /// The finish machine's regex path is incremental (the DFA threads
        /// carry over, released text advances from where it was): after
        /// every update its released text and its finish equal a full
        /// re-scan of the whole text so far with the `regex` crate.
        #[test]
        fn incremental_stop_regex_equals_a_full_rescan(
            pieces in prop::collection::vec(piece(), 1..40),
            include in any::<bool>(),
        ) {
            let pats = [r"(?s).*zz", r"ab+c", r"日本"];
            let p = params(|p| {
                p.stop_regex = regexes(&pats);
                p.include_stop_str_in_output = include;
            });
            // Each pattern anchored at the end: its leftmost match ending at `end`.
            let ending: Vec<regex::Regex> =
                pats.iter().map(|x| regex::Regex::new(&format!("(?:{x})\\z")).unwrap()).collect();
            let mut t = FinishTracker::new(p).unwrap();
            let mut all = String::new();
            let mut streamed = String::new();
            let mut expect = None;
            for (i, piece) in pieces.iter().enumerate() {
                let from = all.len();
                all.push_str(piece);
                // Full re-scan: the first end inside the new piece where a
                // pattern matches; lowest index first at one end.
                let ends = all[from..].char_indices().map(|(b, c)| from + b + c.len_utf8());
                let hit = ends.into_iter().find_map(|end| {
                    ending.iter().enumerate().find_map(|(k, r)| {
                        r.find(&all[..end]).map(|m| (k, m.start(), end))
                    })
                });
                let s = t.update(&[i as u32], Some(&[piece.as_str()]), None).unwrap();
                streamed.push_str(&t.text()[s.text_delta.clone()]);
                prop_assert!(t.text().starts_with(&streamed));
                prop_assert_eq!(s.text_delta.end, t.text().char_indices().nth(t.emitted_len()).map_or(t.text().len(), |(b, _)| b));
                if let Some((k, start, end)) = hit {
                    expect = Some((k, all[start..end].to_string(), if include { &all[..end] } else { &all[..start] }.to_string()));
                    break;
                }
                prop_assert!(!t.is_finished());
            }
            match expect {
                Some((k, matched, text)) => {
                    prop_assert_eq!(t.finish().unwrap().stop_reason, Some(StopReason::StopRegex(k)));
                    prop_assert_eq!(t.regex_matched(), matched.as_str());
                    prop_assert_eq!(t.text(), text.as_str());
                    prop_assert_eq!(streamed, text);
                }
                None => prop_assert_eq!(t.text(), all.as_str()),
            }
        }

        #[test]
        fn step_invariance_with_stop_regexes(s in sample()) {
            same_run_in_any_steps(s, None, |p| {
                p.stop = stops(&["STOP", "a日"]);
                p.stop_regex = regexes(&[r"b\.?$", r"(?-u:\b)ca(?-u:\b)", r"日本+é", r"[xy]{3}"]);
            })?;
        }
    }
}
