//! The results of a step, shared by `FinishTracker` and `FinishBatch`:
//! `StepResult`, a finished row's outcome and the rows' reasoning channels.

use std::ops::Range;

use pyo3::prelude::*;
use pyo3::types::PyString;
use pyo3::IntoPyObjectExt;

use super::errors::not_picklable;
use crate::finish::{Finish, FinishTracker, Matched, Step, StopReason};
use crate::reasoning::{Channel, ChannelRanges};

/// A step's per-channel deltas (only with reasoning channels).
#[derive(Clone)]
pub(super) struct ChannelDeltas {
    channel: Channel,
    pub(super) reasoning: String,
    pub(super) content: String,
    pub(super) reasoning_ids: Vec<u32>,
    pub(super) content_ids: Vec<u32>,
    forced: Option<u32>,
}

/// How a row's deltas split into channels.
#[derive(Clone)]
enum Split {
    /// All of the row's text and ids are in this channel (the usual step).
    Whole(Channel),
    /// Ranges into the row's own text delta (bytes) and token delta.
    Ranges(Box<ChannelRanges>),
}

/// A row's channels, as a batch result hands them out.
#[derive(Clone)]
pub(super) struct RowChannels {
    channel: Channel,
    forced: Option<u32>,
    split: Split,
}

/// Row codes of [`RowTable`]: none, or the split kind plus the channel bit.
const ROW_NONE: u8 = 0;
const ROW_CONTENT: u8 = 1;
const ROW_REASONING: u8 = 2;
const ROW_RANGES: u8 = 3;
const ROW_IN_REASONING: u8 = 4;

/// A batch step's per-row channels, recorded with one byte per row (and only
/// once some row has reasoning channels): rows whose delta is wholly in one
/// channel, the usual step, need nothing more; split rows and forced ids are
/// kept aside.
#[derive(Default)]
pub(super) struct RowTable {
    codes: Vec<u8>,
    ranges: Vec<(usize, Box<ChannelRanges>)>,
    forced: Vec<(usize, u32)>,
}

#[inline(always)]
fn channel_code(c: Channel) -> u8 {
    match c {
        Channel::Reasoning => ROW_IN_REASONING,
        Channel::Content => 0,
    }
}

impl RowTable {
    /// Records row `k` (of `n_rows`): tracker `t` after a step that released
    /// `text` (bytes) and `tokens`.
    #[inline(always)]
    pub(super) fn record(
        &mut self,
        k: usize,
        n_rows: usize,
        t: &FinishTracker,
        text: &Range<usize>,
        tokens: &Range<usize>,
    ) {
        if !t.has_channels() {
            return;
        }
        match t.plain_row(text, tokens) {
            // The usual row: one byte into room already there.
            Some((whole, now)) if self.codes.len() == k && k < self.codes.capacity() => {
                let kind = match whole {
                    Channel::Reasoning => ROW_REASONING,
                    Channel::Content => ROW_CONTENT,
                };
                self.codes.push(kind | channel_code(now));
            }
            _ => self.record_channels(k, n_rows, t, text, tokens),
        }
    }

    #[inline(never)]
    fn record_channels(
        &mut self,
        k: usize,
        n_rows: usize,
        t: &FinishTracker,
        text: &Range<usize>,
        tokens: &Range<usize>,
    ) {
        if self.codes.len() < k || self.codes.capacity() == 0 {
            self.codes.reserve(n_rows);
            self.codes.resize(k, ROW_NONE);
        }
        let now = t.channel().map_or(0, channel_code);
        let kind = match t.whole_channel(text, tokens) {
            Some(Channel::Reasoning) => ROW_REASONING,
            Some(Channel::Content) => ROW_CONTENT,
            None => {
                let r = t
                    .channel_ranges(text.clone(), tokens.clone())
                    .unwrap_or_default();
                let (a, b) = (text.start, tokens.start);
                let shift = |x: &Range<usize>, by: usize| x.start - by..x.end - by;
                let shifted = ChannelRanges {
                    reasoning_text: r.reasoning_text.iter().map(|x| shift(x, a)).collect(),
                    reasoning_tokens: r.reasoning_tokens.iter().map(|x| shift(x, b)).collect(),
                    content_text: [shift(&r.content_text[0], a), shift(&r.content_text[1], a)],
                    content_tokens: [
                        shift(&r.content_tokens[0], b),
                        shift(&r.content_tokens[1], b),
                    ],
                };
                self.ranges.push((k, Box::new(shifted)));
                ROW_RANGES
            }
        };
        self.codes.push(kind | now);
        if let Some(id) = t.forced_token_id() {
            self.forced.push((k, id));
        }
    }

    /// `(row, token id)` of the rows with a token to force next, in row order.
    pub(super) fn forced_rows(&self) -> &[(usize, u32)] {
        &self.forced
    }

    /// Row `i`'s channels; `None` for a row without reasoning channels.
    pub(super) fn get(&self, i: usize) -> Option<RowChannels> {
        let code = self.codes.get(i).copied().unwrap_or(ROW_NONE);
        let channel = if code & ROW_IN_REASONING != 0 {
            Channel::Reasoning
        } else {
            Channel::Content
        };
        let split = match code & 3 {
            ROW_NONE => return None,
            ROW_CONTENT => Split::Whole(Channel::Content),
            ROW_REASONING => Split::Whole(Channel::Reasoning),
            _ => {
                let at = self.ranges.binary_search_by_key(&i, |(row, _)| *row).ok()?;
                Split::Ranges(self.ranges[at].1.clone())
            }
        };
        let forced = self
            .forced
            .binary_search_by_key(&i, |(row, _)| *row)
            .ok()
            .map(|at| self.forced[at].1);
        Some(RowChannels {
            channel,
            forced,
            split,
        })
    }
}

impl RowChannels {
    /// The deltas themselves, cut from the row's `text` and `ids` deltas.
    pub(super) fn deltas(&self, text: &str, ids: &[u32]) -> Box<ChannelDeltas> {
        let (reasoning, content, reasoning_ids, content_ids) = match &self.split {
            Split::Whole(Channel::Reasoning) => {
                (text.to_owned(), String::new(), ids.to_vec(), Vec::new())
            }
            Split::Whole(Channel::Content) => {
                (String::new(), text.to_owned(), Vec::new(), ids.to_vec())
            }
            Split::Ranges(r) => {
                let mut content = String::new();
                let mut content_ids = Vec::new();
                for (a, b) in r.content_text.iter().zip(&r.content_tokens) {
                    content.push_str(&text[a.clone()]);
                    content_ids.extend_from_slice(&ids[b.clone()]);
                }
                let reasoning = r.reasoning_text.iter().map(|x| &text[x.clone()]).collect();
                let reasoning_ids = r
                    .reasoning_tokens
                    .iter()
                    .flat_map(|x| ids[x.clone()].iter().copied())
                    .collect();
                (reasoning, content, reasoning_ids, content_ids)
            }
        };
        Box::new(ChannelDeltas {
            channel: self.channel,
            reasoning,
            content,
            reasoning_ids,
            content_ids,
            forced: self.forced,
        })
    }

    pub(super) fn channel(&self) -> &'static str {
        self.channel.as_str()
    }

    pub(super) fn forced(&self) -> Option<u32> {
        self.forced
    }
}

impl ChannelDeltas {
    /// `t`'s channels within the byte range `text` and token range `tokens`.
    pub(super) fn of(
        t: &FinishTracker,
        text: Range<usize>,
        tokens: Range<usize>,
    ) -> Option<Box<Self>> {
        let ChannelRanges {
            reasoning_text,
            reasoning_tokens,
            content_text,
            content_tokens,
        } = t.channel_ranges(text, tokens)?;
        let (txt, ids) = (t.text(), t.token_ids());
        let mut content = String::new();
        let mut content_ids = Vec::new();
        for (a, b) in content_text.into_iter().zip(content_tokens) {
            content.push_str(&txt[a]);
            content_ids.extend_from_slice(&ids[b]);
        }
        Some(Box::new(ChannelDeltas {
            channel: t.channel()?,
            reasoning: reasoning_text.into_iter().map(|x| &txt[x]).collect(),
            content,
            reasoning_ids: reasoning_tokens
                .into_iter()
                .flat_map(|x| ids[x].iter().copied())
                .collect(),
            content_ids,
            forced: t.forced_token_id(),
        }))
    }
}

/// The state a `StepResult` reports, taken from a tracker.
#[derive(Clone)]
pub(super) struct Outcome {
    finish: Option<Finish>,
    /// Set when a stop string or regex finished the sequence (boxed: most
    /// outcomes of a batch step are unfinished and stay small).
    stop_text: Option<Box<StopText>>,
    num_tokens: usize,
    text_len: usize,
}

#[derive(Clone)]
pub(super) struct StopText {
    /// The stop string or stop regex pattern that finished the sequence.
    stop: String,
    /// The text a stop regex matched.
    regex_matched: Option<String>,
}

impl Outcome {
    /// A row that did not finish.
    pub(super) fn unfinished(num_tokens: usize, text_len: usize) -> Self {
        Outcome {
            finish: None,
            stop_text: None,
            num_tokens,
            text_len,
        }
    }

    #[inline(always)]
    pub(super) fn of(t: &FinishTracker) -> Self {
        let finish = t.finish();
        let stop_text = match finish.and_then(|f| f.matched) {
            Some(Matched::StopString(i)) => Some(Box::new(StopText {
                stop: t.stop_string(i).to_owned(),
                regex_matched: None,
            })),
            Some(Matched::StopRegex(i)) => Some(Box::new(StopText {
                stop: t.stop_regex(i).to_owned(),
                regex_matched: Some(t.regex_matched().to_owned()),
            })),
            _ => None,
        };
        Outcome {
            finish,
            stop_text,
            num_tokens: t.token_ids().len(),
            text_len: t.text_len(),
        }
    }

    pub(super) fn finish_reason(&self) -> Option<&'static str> {
        self.finish.map(|f| f.reason.as_str())
    }

    fn stop_string(&self) -> Option<&str> {
        self.stop_text.as_ref().map(|s| s.stop.as_str())
    }

    pub(super) fn stop_reason(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        Ok(match self.finish.and_then(|f| f.stop_reason) {
            None => py.None(),
            Some(StopReason::StopString(_) | StopReason::StopRegex(_)) => {
                self.stop_string().into_py_any(py)?
            }
            Some(StopReason::TokenId(id)) => id.into_py_any(py)?,
            Some(StopReason::RepetitionDetected) => "repetition_detected".into_py_any(py)?,
        })
    }

    pub(super) fn matched(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        Ok(match self.finish.and_then(|f| f.matched) {
            None => py.None(),
            Some(Matched::StopString(_)) => self.stop_string().into_py_any(py)?,
            Some(Matched::StopRegex(_)) => self
                .stop_text
                .as_ref()
                .and_then(|s| s.regex_matched.as_deref())
                .into_py_any(py)?,
            Some(Matched::TokenId(id)) => id.into_py_any(py)?,
        })
    }
}

/// What one update reported: the state after it and the streaming deltas.
///
/// `num_tokens` counts output tokens kept; `text_len` is the kept text in
/// code points; `text_delta` / `token_ids_delta` are what may be streamed now.
#[pyclass(name = "StepResult", module = "stopline", frozen)]
pub struct PyStepResult {
    pub(super) outcome: Outcome,
    /// Text released by this update for streaming; the hold-back stays until it is decided,
    /// and a finish flushes what is kept (semantics.md 4). Joined, the deltas are the kept
    /// text.
    #[pyo3(get)]
    pub(super) text_delta: String,
    /// Output token ids released by this update, a new list on every read; a token is
    /// released only once all of its text is (semantics.md 5). Joined, the deltas are the
    /// kept ids.
    #[pyo3(get)]
    pub(super) token_ids_delta: Vec<u32>,
    pub(super) channels: Option<Box<ChannelDeltas>>,
}

impl PyStepResult {
    pub(super) fn new(t: &FinishTracker, step: &Step) -> Self {
        PyStepResult {
            outcome: Outcome::of(t),
            text_delta: t.text()[step.text_delta.clone()].to_owned(),
            token_ids_delta: t.token_ids()[step.token_ids_delta.clone()].to_vec(),
            channels: if t.has_channels() {
                ChannelDeltas::of(t, step.text_delta.clone(), step.token_ids_delta.clone())
            } else {
                None
            },
        }
    }
}

pymethods_with_getters! {
impl PyStepResult {
    getters of outcome {
        /// Output tokens kept so far (tokens after the deciding one are not kept).
        num_tokens: usize,
        /// Output text kept so far, in code points.
        text_len: usize,
    }

    /// Whether the sequence has finished (in this or an earlier call).
    #[getter]
    fn finished(&self) -> bool {
        self.outcome.finish.is_some()
    }
    /// Why it finished (semantics.md 1, 3); `None` while running.
    #[getter]
    fn finish_reason(&self) -> Option<&'static str> {
        self.outcome.finish_reason()
    }
    /// The stop string, the stop regex's pattern, the stop token id, or
    /// `"repetition_detected"`; `None` for EOS, grammar end, length, abort, error, or while
    /// running (semantics.md 1).
    #[getter]
    fn stop_reason(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        self.outcome.stop_reason(py)
    }
    /// The stop string, the text a stop regex matched, or the id of the deciding token
    /// (EOS, stop token, grammar end); `None` otherwise (semantics.md 1).
    #[getter]
    fn matched(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        self.outcome.matched(py)
    }

    /// With reasoning channels: `"reasoning"` or `"content"`, the channel the sequence is
    /// in after this step (at finish, the one it finished in); `None` without them
    /// (semantics.md 11).
    #[getter]
    fn channel(&self) -> Option<&'static str> {
        self.channels.as_ref().map(|c| c.channel.as_str())
    }
    /// Reasoning text released by this step (a part of `text_delta`; markers excluded
    /// unless kept); `""` without reasoning channels.
    #[getter]
    fn reasoning_delta(&self) -> &str {
        self.channels.as_ref().map_or("", |c| c.reasoning.as_str())
    }
    /// Content text released by this step; `text_delta` without reasoning channels.
    #[getter]
    fn content_delta(&self) -> &str {
        self.channels.as_ref().map_or(&self.text_delta, |c| c.content.as_str())
    }
    /// Reasoning token ids released by this step (a new list on every read).
    #[getter]
    fn reasoning_token_ids_delta(&self) -> Vec<u32> {
        self.channels.as_ref().map_or_else(Vec::new, |c| c.reasoning_ids.clone())
    }
    /// Content token ids released by this step; `token_ids_delta` without reasoning
    /// channels.
    #[getter]
    fn content_token_ids_delta(&self) -> Vec<u32> {
        self.channels
            .as_ref()
            .map_or_else(|| self.token_ids_delta.clone(), |c| c.content_ids.clone())
    }
    /// The token id the engine must sample next (the thinking budget is spent; the end
    /// marker's ids one per step, as vLLM's thinking_token_budget), else `None`.
    #[getter]
    fn forced_token_id(&self) -> Option<u32> {
        self.channels.as_ref().and_then(|c| c.forced)
    }

    /// Refused on every protocol: it is one step's result.
    fn __reduce__(&self) -> PyResult<()> {
        Err(not_picklable("StepResult", "it is one step's result; send the fields the receiver needs"))
    }

    fn __repr__(&self, py: Python<'_>) -> PyResult<String> {
        Ok(format!(
            "StepResult(finished={}, finish_reason={}, stop_reason={}, matched={}, num_tokens={}, text_len={}, \
             text_delta={}, token_ids_delta={:?})",
            if self.finished() { "True" } else { "False" },
            self.finish_reason().map_or("None".to_string(), |r| format!("'{r}'")),
            self.stop_reason(py)?.bind(py).repr()?,
            self.matched(py)?.bind(py).repr()?,
            self.outcome.num_tokens,
            self.outcome.text_len,
            PyString::new(py, &self.text_delta).repr()?,
            self.token_ids_delta
        ))
    }
}
}
