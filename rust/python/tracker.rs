//! `FinishTracker` (one sequence), with or without its own decoder.

use std::sync::Arc;

use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyTuple, PyType};

use super::convert::wrong_type;
use super::convert::{
    detach_if, extract_ids, extract_int, opt_list, with_pieces, DETACH_IDS, DETACH_TEXT_BYTES,
};
use super::detok;
use super::errors::{arg_err, not_picklable, to_py_err};
use super::params::{params_arg, PyStopParams};
use super::result::{ChannelDeltas, Outcome, PyStepResult};
use crate::detok_batch::SeqDecoder;
use crate::detokenize::Vocabulary;
use crate::error::Problem;
use crate::finish::FinishTracker;
use crate::limits;
use crate::reasoning::Channel;

/// All of `t`'s kept output by channel; `None` without reasoning channels.
fn all_channels(t: &FinishTracker) -> Option<Box<ChannelDeltas>> {
    ChannelDeltas::of(t, 0..t.text().len(), 0..t.token_ids().len())
}

/// The finish state of one sequence. Not thread-safe: concurrent use raises
/// instead of corrupting state.
#[pyclass(name = "FinishTracker", module = "stopline")]
pub struct PyFinishTracker {
    inner: FinishTracker,
    /// With a vocabulary: its decoder for ids-only updates.
    detok: Option<(Arc<Vocabulary>, SeqDecoder)>,
}

#[pymethods]
impl PyFinishTracker {
    /// `vocabulary` (a `Vocabulary`) lets `update` take ids without texts;
    /// then `prompt_token_ids` primes its decoder and `skip_special_tokens` /
    /// `spaces_between_special_tokens` are as in vLLM's `SamplingParams`.
    #[new]
    #[pyo3(signature = (params, vocabulary = None, prompt_token_ids = None, skip_special_tokens = true, spaces_between_special_tokens = true))]
    fn new(
        params: &Bound<'_, PyAny>,
        vocabulary: Option<&Bound<'_, PyAny>>,
        prompt_token_ids: Option<&Bound<'_, PyAny>>,
        #[pyo3(from_py_with = crate::python::convert::flags::skip_special_tokens)]
        skip_special_tokens: bool,
        #[pyo3(from_py_with = crate::python::convert::flags::spaces_between_special_tokens)]
        spaces_between_special_tokens: bool,
    ) -> PyResult<Self> {
        let params = params_arg(params)?;
        let vocab = detok::vocabulary_arg(vocabulary)?;
        let dec = detok::seq_decoder(
            vocab.as_ref(),
            &params,
            prompt_token_ids,
            skip_special_tokens,
            spaces_between_special_tokens,
        )?;
        let prompt = detok::prompt_state(vocab.as_deref(), &params, prompt_token_ids)?;
        Ok(Self {
            inner: FinishTracker::with_prompt(Arc::clone(&params), prompt).map_err(to_py_err)?,
            detok: vocab.zip(dec),
        })
    }

    /// Appends one decoding step: one token or a speculative accept run.
    ///
    /// `token_ids`: an int or a sequence of ints (the run, in order).
    /// `texts`: one str piece per token as a streaming detokenizer produced it
    /// ("" while a multi-byte character is incomplete); required when the
    /// params have stop strings or regexes. `grammar_terminated_at`: index in
    /// the run of the token that terminated the grammar, if any.
    ///
    /// The run is examined token by token in the order of docs/semantics.md, so
    /// a run of k tokens gives exactly what k one-token updates give; tokens
    /// after the deciding one are dropped. Returns a `StepResult` whose
    /// `text_delta` (code points) and `token_ids_delta` are what may be
    /// streamed now.
    ///
    /// With a vocabulary `texts` must be None: the ids are decoded
    /// (docs/semantics.md section 10).
    ///
    /// Raises `SequenceFinishedError` (a `RuntimeError`) after the sequence
    /// finished; `ValueError` / `TypeError` for negative, non-int or bool ids, a `texts` length that differs
    /// from the run, missing texts, or `grammar_terminated_at` outside the run.
    /// Nothing changes on error.
    #[pyo3(signature = (token_ids, texts = None, grammar_terminated_at = None))]
    fn update(
        &mut self,
        token_ids: &Bound<'_, PyAny>,
        texts: Option<&Bound<'_, PyAny>>,
        grammar_terminated_at: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<PyStepResult> {
        let ids = extract_ids(token_ids, "token_ids", limits::MAX_STEP_TOKENS)?;

        let g = match opt_list(grammar_terminated_at) {
            None => None,
            Some(g) => Some(extract_int(g, &|| "grammar_terminated_at".into())?),
        };
        let g = match g {
            None => None,
            Some(g) => Some(usize::try_from(g).map_err(|_| {
                let problem = Problem::OutsideRun {
                    index: None,
                    value: g,
                    run_len: ids.len(),
                };
                arg_err("grammar_terminated_at", problem)
            })?),
        };
        if let Some((vocab, dec)) = self.detok.as_mut() {
            if opt_list(texts).is_some() {
                return Err(arg_err(
                    "texts",
                    Problem::MustBeNone {
                        why: "this tracker decodes the ids with its vocabulary",
                    },
                ));
            }
            let inner = &mut self.inner;
            let long = ids.len() >= DETACH_IDS;
            let step = detach_if(token_ids.py(), long, || dec.update(vocab, inner, &ids, g))
                .map_err(to_py_err)?;
            return Ok(PyStepResult::new(&self.inner, &step));
        }
        let inner = &mut self.inner;
        let py = token_ids.py();
        let step = with_pieces(opt_list(texts), &|i| format!("texts[{i}]"), |pieces, _| {
            let bytes: usize = pieces.map_or(0, |p| p.iter().map(|s| s.len()).sum());
            let long = bytes >= DETACH_TEXT_BYTES || ids.len() >= DETACH_IDS;
            detach_if(py, long, || inner.update(&ids, pieces, g)).map_err(to_py_err)
        })?;
        Ok(PyStepResult::new(&self.inner, &step))
    }

    /// Finishes with "abort" and flushes everything kept; a no-op (empty
    /// deltas) once finished.
    fn abort(&mut self) -> PyStepResult {
        let step = self.inner.abort();
        PyStepResult::new(&self.inner, &step)
    }

    /// Whether the sequence has finished.
    #[getter]
    fn finished(&self) -> bool {
        self.inner.is_finished()
    }
    /// Why it finished (semantics.md 1, 3); `None` while running.
    #[getter]
    fn finish_reason(&self) -> Option<&'static str> {
        self.inner.finish().map(|f| f.reason.as_str())
    }
    /// As `StepResult.stop_reason`.
    #[getter]
    fn stop_reason(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        Outcome::of(&self.inner).stop_reason(py)
    }
    /// As `StepResult.matched`.
    #[getter]
    fn matched(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        Outcome::of(&self.inner).matched(py)
    }
    /// Output tokens kept.
    #[getter]
    fn num_tokens(&self) -> usize {
        self.inner.token_ids().len()
    }
    /// Output text kept, in code points.
    #[getter]
    fn text_len(&self) -> usize {
        self.inner.text_len()
    }
    /// Output token ids kept (a copy).
    #[getter]
    fn token_ids(&self) -> Vec<u32> {
        self.inner.token_ids().to_vec()
    }
    /// Output text kept.
    #[getter]
    fn text(&self) -> &str {
        self.inner.text()
    }
    /// With reasoning channels, the channel output is in now (at finish, the one it
    /// finished in); `None` without them.
    #[getter]
    fn channel(&self) -> Option<&'static str> {
        self.inner.channel().map(Channel::as_str)
    }
    /// Whether the sequence is inside a tool-call span now (at finish: whether it finished
    /// inside one, the call cut); `False` without `tool_call_markers` (docs/semantics.md 11.10).
    #[getter]
    fn in_tool_call(&self) -> bool {
        self.inner.in_tool_call()
    }
    /// The reasoning kept (markers excluded unless kept); `""` without reasoning channels.
    #[getter]
    fn reasoning(&self) -> String {
        all_channels(&self.inner).map_or_else(String::new, |c| c.reasoning)
    }
    /// The content kept; `text` without reasoning channels.
    #[getter]
    fn content(&self) -> String {
        all_channels(&self.inner).map_or_else(|| self.inner.text().to_owned(), |c| c.content)
    }
    /// The reasoning token ids kept (a copy).
    #[getter]
    fn reasoning_token_ids(&self) -> Vec<u32> {
        all_channels(&self.inner).map_or_else(Vec::new, |c| c.reasoning_ids)
    }
    /// The content token ids kept (a copy); `token_ids` without reasoning channels.
    #[getter]
    fn content_token_ids(&self) -> Vec<u32> {
        all_channels(&self.inner).map_or_else(|| self.inner.token_ids().to_vec(), |c| c.content_ids)
    }
    /// Reasoning tokens kept while the reasoning block is open (the thinking budget's
    /// count; 0 once closed).
    #[getter]
    fn reasoning_tokens(&self) -> usize {
        self.inner.reasoning_tokens()
    }
    /// As `StepResult.forced_token_id`, for the state now.
    #[getter]
    fn forced_token_id(&self) -> Option<u32> {
        self.inner.forced_token_id()
    }
    /// Code points released through `text_delta` so far.
    #[getter]
    fn emitted_len(&self) -> usize {
        self.inner.emitted_len()
    }

    /// Everything the next step and the getters depend on, as bytes
    /// (docs/semantics.md 12): restore them with `FinishTracker.restore` and
    /// the same params (and vocabulary).
    fn snapshot<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyBytes>> {
        let dec = self.detok.as_ref().map(|(v, d)| (&**v, d));
        let bytes = crate::snapshot::snapshot(&self.inner, dec).map_err(to_py_err)?;
        Ok(PyBytes::new(py, &bytes))
    }

    /// A tracker in the state `data` (a `snapshot()`) holds, for the params
    /// it was taken with and, when it was taken with one, the same
    /// vocabulary. Feeding it the rest of the stream gives exactly what the
    /// original would have given.
    ///
    /// Raises `TypeError` for `data` that is not bytes and `ValueError`
    /// (`field`, `kind` `snapshot_*`) for bytes that are not a snapshot of
    /// this format version, were taken with other params or vocabulary, or
    /// are truncated, altered or inconsistent (docs/errors.md).
    #[classmethod]
    #[pyo3(signature = (params, data, *, vocabulary = None))]
    fn restore(
        _cls: &Bound<'_, PyType>,
        params: &Bound<'_, PyAny>,
        data: &Bound<'_, PyAny>,
        vocabulary: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Self> {
        let params = params_arg(params)?;
        let data = snapshot_arg(data)?;
        let vocab = detok::vocabulary_arg(vocabulary)?;
        let (inner, dec) = crate::snapshot::restore(params, data.as_bytes(), vocab.as_deref())
            .map_err(to_py_err)?;
        Ok(Self {
            inner,
            detok: vocab.zip(dec),
        })
    }

    /// Pickles (protocol 2 and up) as its params and its snapshot; refused
    /// for a tracker with a vocabulary (which does not pickle: send
    /// `snapshot()` and restore it with the vocabulary).
    fn __reduce__<'py>(slf: &Bound<'py, Self>) -> PyResult<Bound<'py, PyTuple>> {
        let py = slf.py();
        let this = slf.borrow();
        if this.detok.is_some() {
            return Err(not_picklable("FinishTracker", "it decodes with a Vocabulary, which does not pickle; send tracker.snapshot() and call FinishTracker.restore(params, data, vocabulary=...) in the receiving process"));
        }
        let data = this.snapshot(py)?;
        let params = Py::new(
            py,
            PyStopParams {
                inner: Arc::clone(this.inner.params()),
            },
        )?;
        let restore = py.get_type::<Self>().getattr("restore")?;
        PyTuple::new(
            py,
            [
                restore.into_any(),
                PyTuple::new(py, [params.into_any().into_bound(py), data.into_any()])?.into_any(),
            ],
        )
    }

    fn __repr__(&self) -> String {
        format!(
            "FinishTracker(num_tokens={}, text_len={}, finish_reason={})",
            self.inner.token_ids().len(),
            self.inner.text_len(),
            self.finish_reason()
                .map_or("None".to_string(), |r| format!("'{r}'"))
        )
    }
}

/// A snapshot argument: `bytes` (a TypeError naming `data` otherwise).
pub(super) fn snapshot_arg<'a, 'py>(
    data: &'a Bound<'py, PyAny>,
) -> PyResult<&'a Bound<'py, PyBytes>> {
    data.cast::<PyBytes>()
        .map_err(|_| arg_err("data", wrong_type("bytes", data)))
}
