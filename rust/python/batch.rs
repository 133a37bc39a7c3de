//! `FinishBatch` (many sequences, one call per engine step), its ids-only
//! step and its `BatchStepResult`.

use std::cell::Cell;
use std::sync::Arc;

use pyo3::exceptions::PyIndexError;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyList, PyString};

use super::convert::{
    extract_i64_arg, extract_i64s, extract_ids_named, is_conversion_error, opt_list, with_pieces,
    Slots,
};
use super::detok;
use super::errors::{self, arg_err, at_slot, not_picklable, to_py_err};
use super::ffi::PrivateList;
use super::params::params_arg;
use super::result::{Outcome, PyStepResult, RowChannels, RowTable};
use super::tracker::snapshot_arg;
use crate::batch::{FinishBatch, IdsSink, SlotStep, StepInput};
use crate::detok_batch::Pieces;
use crate::error::{Error, Problem};
use crate::finish::{FinishTracker, Step};
use crate::limits;

/// The slot that owns element `j` of a batch step's flat arrays.
fn slot_of(slots: &[i64], runs: Option<&[usize]>, j: usize) -> Option<i64> {
    match runs {
        None => slots.get(j).copied(),
        Some(r) => {
            let mut end = 0;
            r.iter().zip(slots).find_map(|(&len, &slot)| {
                end += len;
                (j < end).then_some(slot)
            })
        }
    }
}

/// One row of a batch step; a finished row's outcome is kept aside.
struct BatchRow {
    slot: usize,
    num_tokens: usize,
    text_len: usize,
    /// End of this row's token delta in `tokens` (it starts where the
    /// previous row's ends).
    tokens_end: usize,
}

/// Per-slot results of one `FinishBatch.step`, in the order of its `slots`.
/// List attributes are built on access.
#[pyclass(name = "BatchStepResult", module = "stopline", frozen)]
pub struct PyBatchStepResult {
    rows: Vec<BatchRow>,
    /// `(row, outcome)` of the rows that finished, in row order (few).
    finished: Vec<(usize, Outcome)>,
    /// Each row's text delta, usually the very piece passed in (no copy).
    /// Private: the getter hands out copies of the list.
    text_deltas: Py<PyList>,
    tokens: Vec<u32>,
    /// The rows' reasoning channels.
    channels: RowTable,
}

impl PyBatchStepResult {
    fn outcome(&self, i: usize) -> Outcome {
        match self.finished.binary_search_by_key(&i, |(row, _)| *row) {
            Ok(f) => self.finished[f].1.clone(),
            Err(_) => Outcome::unfinished(self.rows[i].num_tokens, self.rows[i].text_len),
        }
    }

    fn tokens_of(&self, i: usize) -> &[u32] {
        let start = if i == 0 {
            0
        } else {
            self.rows[i - 1].tokens_end
        };
        &self.tokens[start..self.rows[i].tokens_end]
    }

    fn channels_of(&self, i: usize) -> Option<RowChannels> {
        self.channels.get(i)
    }

    /// One value per row from its channels (`None` for rows without).
    fn per_channel_row<T>(
        &self,
        py: Python<'_>,
        of: impl Fn(&RowChannels, &str, &[u32]) -> T,
    ) -> PyResult<Vec<Option<T>>> {
        let list = self.text_deltas.bind(py);
        (0..self.rows.len())
            .map(|i| match self.channels_of(i) {
                None => Ok(None),
                Some(c) => {
                    let text = list.get_item(i)?.extract::<String>()?;
                    Ok(Some(of(&c, &text, self.tokens_of(i))))
                }
            })
            .collect()
    }

    /// One value per row: `default` but for the finished rows.
    fn per_row<T: Clone>(&self, default: T, of: impl Fn(&Outcome) -> T) -> Vec<T> {
        let mut out = vec![default; self.rows.len()];
        for (i, o) in &self.finished {
            out[*i] = of(o);
        }
        out
    }
}

#[pymethods]
impl PyBatchStepResult {
    /// Refused on every protocol: it is one step's result.
    fn __reduce__(&self) -> PyResult<()> {
        Err(not_picklable(
            "BatchStepResult",
            "it is one step's result; send the fields the receiver needs",
        ))
    }

    fn __len__(&self) -> usize {
        self.rows.len()
    }

    fn __getitem__(&self, py: Python<'_>, index: isize) -> PyResult<PyStepResult> {
        let n = self.rows.len() as isize;
        let i = if index < 0 { index + n } else { index };
        if i < 0 || i >= n {
            return Err(PyIndexError::new_err(format!(
                "index {index} is out of range for {n} rows"
            )));
        }
        let i = i as usize;
        let text_delta = self.text_deltas.bind(py).get_item(i)?.extract::<String>()?;
        let token_ids_delta = self.tokens_of(i).to_vec();
        Ok(PyStepResult {
            outcome: self.outcome(i),
            channels: self
                .channels_of(i)
                .map(|c| c.deltas(&text_delta, &token_ids_delta)),
            text_delta,
            token_ids_delta,
        })
    }

    /// Per row: the channel after the step (`"reasoning"` / `"content"`), `None` for rows
    /// without reasoning channels (see `StepResult.channel`).
    #[getter]
    fn channels(&self) -> Vec<Option<&'static str>> {
        (0..self.rows.len())
            .map(|i| self.channels_of(i).map(|c| c.channel()))
            .collect()
    }
    /// Per row: the token id the engine must sample next (thinking budget spent), else
    /// `None` (see `StepResult.forced_token_id`).
    #[getter]
    fn forced_token_ids(&self) -> Vec<Option<u32>> {
        (0..self.rows.len())
            .map(|i| self.channels_of(i).and_then(|c| c.forced()))
            .collect()
    }
    /// `(slot, token id)` for each row whose next token is forced, in row order: the rows
    /// of `forced_token_ids` that are not `None`, with no list entry for the others (the
    /// cheap read for an engine with a thinking budget, every step).
    #[getter]
    fn forced_tokens(&self) -> Vec<(usize, u32)> {
        self.channels
            .forced_rows()
            .iter()
            .map(|&(i, id)| (self.rows[i].slot, id))
            .collect()
    }
    /// Per row: the reasoning text released (`None` for rows without reasoning channels).
    #[getter]
    fn reasoning_deltas(&self, py: Python<'_>) -> PyResult<Vec<Option<String>>> {
        self.per_channel_row(py, |c, t, ids| c.deltas(t, ids).reasoning)
    }
    /// Per row: the content text released (`None` for rows without reasoning channels).
    #[getter]
    fn content_deltas(&self, py: Python<'_>) -> PyResult<Vec<Option<String>>> {
        self.per_channel_row(py, |c, t, ids| c.deltas(t, ids).content)
    }
    /// Per row: the reasoning token ids released (`None` for rows without reasoning
    /// channels).
    #[getter]
    fn reasoning_token_ids_deltas(&self, py: Python<'_>) -> PyResult<Vec<Option<Vec<u32>>>> {
        self.per_channel_row(py, |c, t, ids| c.deltas(t, ids).reasoning_ids)
    }
    /// Per row: the content token ids released (`None` for rows without reasoning
    /// channels).
    #[getter]
    fn content_token_ids_deltas(&self, py: Python<'_>) -> PyResult<Vec<Option<Vec<u32>>>> {
        self.per_channel_row(py, |c, t, ids| c.deltas(t, ids).content_ids)
    }

    /// The slot of each row, as passed to `step`.
    #[getter]
    fn slots(&self) -> Vec<usize> {
        self.rows.iter().map(|r| r.slot).collect()
    }
    /// Per row: whether the sequence finished in this step.
    #[getter]
    fn finished_flags(&self) -> Vec<bool> {
        self.per_row(false, |_| true)
    }
    /// Slots that finished in this step.
    #[getter]
    fn finished_slots(&self) -> Vec<usize> {
        self.finished
            .iter()
            .map(|(i, _)| self.rows[*i].slot)
            .collect()
    }
    /// Per row: the `finish_reason`, `None` for rows still running.
    #[getter]
    fn finish_reasons(&self) -> Vec<Option<&'static str>> {
        self.per_row(None, Outcome::finish_reason)
    }
    /// Per row: the `stop_reason` (see `StepResult.stop_reason`).
    #[getter]
    fn stop_reasons(&self, py: Python<'_>) -> PyResult<Vec<Py<PyAny>>> {
        (0..self.rows.len())
            .map(|i| self.outcome(i).stop_reason(py))
            .collect()
    }
    /// Per row: what matched (see `StepResult.matched`).
    #[getter]
    fn matches(&self, py: Python<'_>) -> PyResult<Vec<Py<PyAny>>> {
        (0..self.rows.len())
            .map(|i| self.outcome(i).matched(py))
            .collect()
    }
    /// Per row: output tokens kept after the step.
    #[getter]
    fn token_counts(&self) -> Vec<usize> {
        self.rows.iter().map(|r| r.num_tokens).collect()
    }
    /// Per row: output text kept after the step, in code points.
    #[getter]
    fn text_lengths(&self) -> Vec<usize> {
        self.rows.iter().map(|r| r.text_len).collect()
    }
    /// Per row: the text released by this step.
    #[getter]
    fn text_deltas<'py>(&self, py: Python<'py>) -> Bound<'py, PyList> {
        let list = self.text_deltas.bind(py);
        list.get_slice(0, list.len())
    }
    /// Per row, how many output tokens this step released (the length of
    /// its `token_ids_deltas` row, without building the lists).
    #[getter]
    fn released_counts(&self) -> Vec<usize> {
        (0..self.rows.len())
            .map(|i| self.tokens_of(i).len())
            .collect()
    }
    /// Per row: the output token ids released by this step.
    #[getter]
    fn token_ids_deltas(&self) -> Vec<Vec<u32>> {
        (0..self.rows.len())
            .map(|i| self.tokens_of(i).to_vec())
            .collect()
    }

    fn __repr__(&self) -> String {
        format!(
            "BatchStepResult(rows={}, finished_slots={:?})",
            self.rows.len(),
            self.finished_slots()
        )
    }
}

/// Many finish trackers addressed by integer slot, advanced by one call per
/// engine step. Not thread-safe: concurrent use raises.
#[pyclass(name = "FinishBatch", module = "stopline")]
pub struct PyFinishBatch {
    inner: FinishBatch,
    /// With a vocabulary: one `str` per token id, made the first time that
    /// id's text is a whole step's delta and reused after (a delta is then
    /// that very object, as for pieces passed in).
    token_strs: Vec<Option<Py<PyString>>>,
    /// The decode step's replaced deltas, kept to reuse its allocation.
    replaced: Vec<(usize, Py<PyString>)>,
}

#[pymethods]
impl PyFinishBatch {
    /// `vocabulary` (a `Vocabulary`): `step` then takes token ids without
    /// texts and decodes them itself.
    #[new]
    #[pyo3(signature = (max_slots, vocabulary = None))]
    fn new(max_slots: &Bound<'_, PyAny>, vocabulary: Option<&Bound<'_, PyAny>>) -> PyResult<Self> {
        let max_slots = extract_i64_arg(max_slots, "max_slots")?;
        let n = usize::try_from(max_slots).map_err(|_| {
            arg_err(
                "max_slots",
                Problem::Below {
                    min: 0,
                    value: max_slots.into(),
                },
            )
        })?;
        let inner = match detok::vocabulary_arg(vocabulary)? {
            Some(v) => FinishBatch::with_vocabulary(n, v),
            None => FinishBatch::new(n),
        };
        Ok(Self {
            inner: inner.map_err(to_py_err)?,
            token_strs: Vec::new(),
            replaced: Vec::new(),
        })
    }

    /// Starts a sequence in an empty slot. With a vocabulary,
    /// `prompt_token_ids` primes the slot's decoder (decoding continues
    /// after the prompt) and `skip_special_tokens` /
    /// `spaces_between_special_tokens` are as in vLLM's `SamplingParams`.
    /// An error once `slot` is read (the params, the prompt ids, the slot's
    /// state) names it in `slot`.
    #[pyo3(signature = (slot, params, prompt_token_ids = None, skip_special_tokens = true, spaces_between_special_tokens = true))]
    fn add(
        &mut self,
        slot: &Bound<'_, PyAny>,
        params: &Bound<'_, PyAny>,
        prompt_token_ids: Option<&Bound<'_, PyAny>>,
        #[pyo3(from_py_with = crate::python::convert::flags::skip_special_tokens)]
        skip_special_tokens: bool,
        #[pyo3(from_py_with = crate::python::convert::flags::spaces_between_special_tokens)]
        spaces_between_special_tokens: bool,
    ) -> PyResult<()> {
        let slot = extract_i64_arg(slot, "slot")?;
        // From here on every error is about the request for `slot`: the
        // engine refuses that one request.
        let in_slot = |e: PyErr| errors::in_slot(e, slot);
        let params = params_arg(params).map_err(in_slot)?;
        let vocab = self.inner.vocabulary();
        let dec = detok::seq_decoder(
            vocab,
            &params,
            prompt_token_ids,
            skip_special_tokens,
            spaces_between_special_tokens,
        )
        .map_err(in_slot)?;
        let prompt =
            detok::prompt_state(vocab.map(|v| &**v), &params, prompt_token_ids).map_err(in_slot)?;
        self.inner
            .add_decoding(slot, Arc::clone(&params), prompt, dec)
            .map_err(|e| in_slot(to_py_err(e)))
    }

    /// Frees a slot (finished or not).
    fn remove(&mut self, slot: &Bound<'_, PyAny>) -> PyResult<()> {
        let slot = extract_i64_arg(slot, "slot")?;
        self.inner.remove(slot).map(drop).map_err(to_py_err)
    }

    /// Aborts the sequence in a slot; returns what it flushed.
    fn abort(&mut self, slot: &Bound<'_, PyAny>) -> PyResult<PyStepResult> {
        let slot = extract_i64_arg(slot, "slot")?;
        let t = self.inner.get_mut(slot).map_err(to_py_err)?;
        let step = t.abort();
        Ok(PyStepResult::new(t, &step))
    }

    /// The current state of a slot (empty deltas).
    fn result(&self, slot: &Bound<'_, PyAny>) -> PyResult<PyStepResult> {
        let slot = extract_i64_arg(slot, "slot")?;
        let t = self.inner.get(slot).map_err(to_py_err)?;
        let end = t.text().len();
        let n = t.token_ids().len();
        Ok(PyStepResult::new(
            t,
            &Step {
                text_delta: end..end,
                token_ids_delta: n..n,
                whole_run: false,
            },
        ))
    }

    /// Output text kept in a slot.
    fn text(&self, slot: &Bound<'_, PyAny>) -> PyResult<String> {
        let slot = extract_i64_arg(slot, "slot")?;
        Ok(self.inner.get(slot).map_err(to_py_err)?.text().to_owned())
    }

    /// Whether a slot's sequence is inside a tool-call span now (at finish: whether it
    /// finished inside one); `False` without `tool_call_markers` (docs/semantics.md 11.10).
    fn in_tool_call(&self, slot: &Bound<'_, PyAny>) -> PyResult<bool> {
        let slot = extract_i64_arg(slot, "slot")?;
        Ok(self.inner.get(slot).map_err(to_py_err)?.in_tool_call())
    }

    /// Output token ids kept in a slot.
    fn token_ids(&self, slot: &Bound<'_, PyAny>) -> PyResult<Vec<u32>> {
        let slot = extract_i64_arg(slot, "slot")?;
        Ok(self
            .inner
            .get(slot)
            .map_err(to_py_err)?
            .token_ids()
            .to_vec())
    }

    /// Number of slots, as given when built.
    #[getter]
    fn max_slots(&self) -> usize {
        self.inner.max_slots()
    }

    /// The snapshot of a slot's sequence (with its decoder in a batch with a
    /// vocabulary), as `FinishTracker.snapshot`; it restores into any empty
    /// slot of any batch with the same params (and vocabulary), or into a
    /// `FinishTracker`.
    fn snapshot<'py>(&self, slot: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyBytes>> {
        let py = slot.py();
        let slot = extract_i64_arg(slot, "slot")?;
        let bytes = self
            .inner
            .snapshot(slot)
            .map_err(|e| at_slot(to_py_err(e), None, slot))?;
        Ok(PyBytes::new(py, &bytes))
    }

    /// Starts an empty slot in the state `data` (a snapshot taken with
    /// `params` and, for a batch with a vocabulary, the same vocabulary)
    /// holds. Raises as `add` for the slot and as `FinishTracker.restore`
    /// for the bytes, with `slot` set; nothing changes on error.
    fn restore(
        &mut self,
        slot: &Bound<'_, PyAny>,
        params: &Bound<'_, PyAny>,
        data: &Bound<'_, PyAny>,
    ) -> PyResult<()> {
        let slot = extract_i64_arg(slot, "slot")?;
        let params = params_arg(params)?;
        let data = snapshot_arg(data)?;
        // Every refusal names the slot: the engine drops that request alone.
        self.inner
            .restore(slot, params, data.as_bytes())
            .map_err(|e| at_slot(to_py_err(e), None, slot))
    }

    /// Refused on every protocol: its slots are per-sequence state.
    fn __reduce__(&self) -> PyResult<()> {
        Err(not_picklable("FinishBatch", "its slots are per-sequence state; move a request by its StopParams (which pickle) and its tokens"))
    }

    fn __len__(&self) -> usize {
        self.inner.len()
    }

    /// `occupied` is `len(batch)`; `finished` counts the occupied slots whose
    /// sequence finished and awaits `remove()`.
    fn __repr__(&self) -> String {
        let max_slots = self.inner.max_slots();
        let (occupied, finished) = (self.inner.len(), self.inner.finished_len());
        format!("FinishBatch(max_slots={max_slots}, occupied={occupied}, finished={finished})")
    }

    /// Whether `slot` holds a sequence (anything that is not an in-range int
    /// is simply not there).
    fn __contains__(&self, slot: &Bound<'_, PyAny>) -> PyResult<bool> {
        match slot.extract::<i64>() {
            Ok(s) => Ok(self.inner.get(s).is_ok()),
            // An exception from the caller's `__index__` is theirs.
            Err(e) if !is_conversion_error(&e, slot.py()) => Err(e),
            Err(_) => Ok(false),
        }
    }

    /// Advances every listed slot by one engine step.
    ///
    /// `slots[i]` takes `run_lengths[i]` tokens (1 each when None) from the
    /// flat `token_ids`, in the order of `slots`; `texts`, when given, is flat
    /// and aligned with `token_ids` (one piece per token); and
    /// `grammar_terminated_at[i]` is an index into slot i's run or -1 for none.
    /// Each slot advances exactly as `FinishTracker.update` would.
    ///
    /// Fast path (what the hot loop should pass): `slots` a `list` of ints or
    /// a `range` (a persistent batch's rows 0..n), `token_ids` a `list` of
    /// ints or, fastest, a one-dimensional contiguous buffer of native-order
    /// integers (a NumPy int32/int64 array as the sampler returns it, read
    /// without a Python object per id), and `texts` a plain `list` of `str`;
    /// other iterables and int-like objects (numpy integers) work through a
    /// slower general path. A text delta that is exactly the piece passed in
    /// is that very `str` object.
    ///
    /// With a vocabulary (`FinishBatch(n, vocabulary=...)`) `texts` must be
    /// None: each slot's decoder turns the ids into the pieces
    /// (docs/semantics.md section 10); an id outside the vocabulary raises
    /// `ValueError` naming it and its slot.
    ///
    /// Returns a `BatchStepResult` in the order of `slots`. Every argument is
    /// checked before any slot changes, so an error (`ValueError` /
    /// `TypeError` naming the field, element and slot;
    /// `SequenceFinishedError` for a slot that already finished) leaves the whole batch as it was.
    #[pyo3(signature = (slots, token_ids, run_lengths = None, texts = None, grammar_terminated_at = None))]
    fn step(
        &mut self,
        slots: Slots<'_, '_>,
        token_ids: &Bound<'_, PyAny>,
        run_lengths: Option<&Bound<'_, PyAny>>,
        texts: Option<&Bound<'_, PyAny>>,
        grammar_terminated_at: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<PyBatchStepResult> {
        let py = token_ids.py();
        let slots_v = slots.values(self.inner.max_slots())?;
        let runs = opt_list(run_lengths)
            .map(|r| {
                extract_i64s(r, "run_lengths", self.inner.max_slots())?
                    .into_iter()
                    .enumerate()
                    .map(|(i, v)| {
                        usize::try_from(v).map_err(|_| {
                            let problem = Problem::Below {
                                min: 0,
                                value: v.into(),
                            };
                            let err = arg_err(&format!("run_lengths[{i}]"), problem);
                            match slots_v.get(i) {
                                Some(&slot) => at_slot(err, None, slot),
                                None => err,
                            }
                        })
                    })
                    .collect::<PyResult<Vec<usize>>>()
            })
            .transpose()?;
        let grammar = opt_list(grammar_terminated_at)
            .map(|g| extract_i64s(g, "grammar_terminated_at", self.inner.max_slots()))
            .transpose()?;
        // Errors in the flat arrays name the slot that owns the element, in
        // the message and (`tag`) as the exception's `slot` and `field`: the
        // name is rendered only for an error, so the last one is its owner.
        let owned_by: Cell<Option<(String, i64)>> = Cell::new(None);
        let owner = |field: &'static str| {
            let (slots_v, runs, owned_by) = (&slots_v, runs.as_deref(), &owned_by);
            move |j: usize| match slot_of(slots_v, runs, j) {
                Some(slot) => {
                    owned_by.set(Some((format!("{field}[{j}]"), slot)));
                    format!("{field}[{j}] (slot {slot})")
                }
                None => format!("{field}[{j}]"),
            }
        };
        let tag = |err: PyErr| match owned_by.take() {
            Some((field, slot)) => at_slot(err, Some(&field), slot),
            None => err,
        };
        let ids = extract_ids_named(
            token_ids,
            "token_ids",
            limits::MAX_STEP_TOKENS,
            &owner("token_ids"),
        )
        .map_err(tag)?;
        let texts = opt_list(texts);
        if self.inner.vocabulary().is_some() {
            if texts.is_some() {
                return Err(arg_err(
                    "texts",
                    Problem::MustBeNone {
                        why: "this batch decodes the ids with its vocabulary",
                    },
                ));
            }
            let input = StepInput::new(&slots_v, &ids)
                .runs(runs.as_deref())
                .grammar(grammar.as_deref());
            return ids_step(py, &mut self.inner, &mut self.token_strs, input);
        }
        // One piece per slot in a plain list (the decode step): the pieces
        // are read from a private copy, which becomes the result's text
        // deltas once the step is done.
        if let (None, Some(list)) = (&runs, texts.and_then(|t| t.cast_exact::<PyList>().ok())) {
            let copy = PrivateList::copy(list)?;
            if let Some(strs) = copy.strs() {
                self.replaced.clear();
                let mut deltas = Replaced(&mut self.replaced);
                let input = StepInput::new(&slots_v, &ids).grammar(grammar.as_deref());
                let rows = batch_step(py, &mut self.inner, input.texts(Some(&strs)), &mut deltas)?;
                drop(strs);
                return Ok(rows.into_result(deltas.apply(copy.into_list())?));
            }
        }
        // The pieces last (reading ints may call `__index__`, which could
        // change the list); see `with_pieces`.
        let inner = &mut self.inner;
        let fresh = PyList::empty(py);
        with_pieces(texts, &owner("texts"), |pieces, objects| {
            let mut deltas = Appended {
                objects,
                list: &fresh,
            };
            let input = StepInput::new(&slots_v, &ids)
                .runs(runs.as_deref())
                .grammar(grammar.as_deref());
            let rows = batch_step(py, inner, input.texts(pieces), &mut deltas)?;
            Ok(rows.into_result(fresh))
        })
        .map_err(tag)
    }
}

/// Where a batch step's text deltas go, row by row. Generic rather than an
/// enum: each kind's per-row code is compiled into the step's loop on its own.
pub(super) trait Deltas<'py> {
    /// Row `k`: slot step `s` of tracker `t`.
    fn row(&mut self, py: Python<'py>, k: usize, t: &FinishTracker, s: &SlotStep) -> PyResult<()>;
}

/// Whether a row's text delta is exactly its one piece.
#[inline(always)]
fn is_its_piece(s: &SlotStep) -> bool {
    s.step.whole_run && s.run.len() == 1
}

/// A row's text delta as a new `str`.
fn delta_text<'py>(py: Python<'py>, t: &FinishTracker, s: &SlotStep) -> Bound<'py, PyString> {
    PyString::new(py, &t.text()[s.step.text_delta.clone()])
}

/// One piece per slot: the deltas are the pieces' list, in which the rows
/// recorded here (those whose delta is not exactly their piece) are replaced
/// once the step is done ([`Replaced::apply`]).
pub(super) struct Replaced<'a>(pub(super) &'a mut Vec<(usize, Py<PyString>)>);

impl<'py> Deltas<'py> for Replaced<'_> {
    #[inline(always)]
    fn row(&mut self, py: Python<'py>, k: usize, t: &FinishTracker, s: &SlotStep) -> PyResult<()> {
        if !is_its_piece(s) {
            self.0.push((k, delta_text(py, t, s).unbind()));
        }
        Ok(())
    }
}

impl Replaced<'_> {
    /// `pieces` with the recorded rows replaced.
    pub(super) fn apply<'py>(self, pieces: Bound<'py, PyList>) -> PyResult<Bound<'py, PyList>> {
        for (k, s) in self.0.drain(..) {
            pieces.set_item(k, s)?;
        }
        Ok(pieces)
    }
}

/// An empty list that every row's delta is appended to; a one-token row
/// whose delta is exactly its piece appends that piece's object (one per
/// token in `objects`).
struct Appended<'a, 'py> {
    objects: &'a [Bound<'py, PyAny>],
    list: &'a Bound<'py, PyList>,
}

impl<'py> Deltas<'py> for Appended<'_, 'py> {
    #[inline(always)]
    fn row(&mut self, py: Python<'py>, _: usize, t: &FinishTracker, s: &SlotStep) -> PyResult<()> {
        append_delta(py, self.list, self.objects, t, s)
    }
}

/// Appends a row's delta to `list`: its piece's object from `objects` when
/// the delta is exactly that one piece.
#[inline(always)]
fn append_delta<'py>(
    py: Python<'py>,
    list: &Bound<'py, PyList>,
    objects: &[Bound<'py, PyAny>],
    t: &FinishTracker,
    s: &SlotStep,
) -> PyResult<()> {
    match objects.get(s.run.start) {
        Some(o) if is_its_piece(s) => list.append(o),
        _ => list.append(delta_text(py, t, s)),
    }
}

/// A batch step's rows, before their text deltas are a list.
pub(super) struct StepRows {
    rows: Vec<BatchRow>,
    finished: Vec<(usize, Outcome)>,
    tokens: Vec<u32>,
    channels: RowTable,
}

impl StepRows {
    /// The Python result, with `text_deltas` in the order of the rows.
    pub(super) fn into_result(self, text_deltas: Bound<'_, PyList>) -> PyBatchStepResult {
        PyBatchStepResult {
            rows: self.rows,
            finished: self.finished,
            text_deltas: text_deltas.unbind(),
            tokens: self.tokens,
            channels: self.channels,
        }
    }
}

/// Runs one `FinishBatch` step, recording its text deltas in `deltas`.
pub(super) fn batch_step<'py>(
    py: Python<'py>,
    inner: &mut FinishBatch,
    input: StepInput<'_>,
    deltas: &mut impl Deltas<'py>,
) -> PyResult<StepRows> {
    // A batch without reasoning runs a loop that never looks at channels.
    if inner.has_channels() {
        batch_rows::<true>(py, inner, input, deltas)
    } else {
        batch_rows::<false>(py, inner, input, deltas)
    }
}

/// [`batch_step`], recording each row's channels when `CHANNELS`.
#[inline(always)]
fn batch_rows<'py, const CHANNELS: bool>(
    py: Python<'py>,
    inner: &mut FinishBatch,
    input: StepInput<'_>,
    deltas: &mut impl Deltas<'py>,
) -> PyResult<StepRows> {
    let mut rows = Rows::<CHANNELS>::new(&input);
    inner
        .step_each(input, |k, t, s| rows.record(py, deltas, k, t, s))
        .map_err(to_py_err)?;
    rows.done()
}

/// A batch step's rows as their slots advance; the first error a row's
/// delta raised is kept for the end of the step.
struct Rows<const CHANNELS: bool> {
    rows: Vec<BatchRow>,
    tokens: Vec<u32>,
    finished: Vec<(usize, Outcome)>,
    channels: RowTable,
    n_rows: usize,
    failed: Option<PyErr>,
}

impl<const CHANNELS: bool> Rows<CHANNELS> {
    fn new<S>(input: &StepInput<'_, S>) -> Self {
        Rows {
            rows: Vec::with_capacity(input.slots.len()),
            tokens: Vec::with_capacity(input.token_ids.len()),
            finished: Vec::new(),
            channels: RowTable::default(),
            n_rows: input.slots.len(),
            failed: None,
        }
    }

    /// Row `k`: slot step `s` of tracker `t`, its delta given to `deltas`.
    #[inline(always)]
    fn record<'py>(
        &mut self,
        py: Python<'py>,
        deltas: &mut impl Deltas<'py>,
        k: usize,
        t: &FinishTracker,
        s: &SlotStep,
    ) {
        if let Err(e) = deltas.row(py, k, t, s) {
            self.failed.get_or_insert(e);
        }
        let delta = &t.token_ids()[s.step.token_ids_delta.clone()];
        if let [id] = delta {
            self.tokens.push(*id);
        } else {
            self.tokens.extend_from_slice(delta);
        }
        if t.is_finished() {
            self.finished.push((k, Outcome::of(t)));
        }
        if CHANNELS {
            let (text, ids) = (&s.step.text_delta, &s.step.token_ids_delta);
            self.channels.record(k, self.n_rows, t, text, ids);
        }
        self.rows.push(BatchRow {
            slot: s.slot,
            num_tokens: t.token_ids().len(),
            text_len: t.text_len(),
            tokens_end: self.tokens.len(),
        });
    }

    fn done(self) -> PyResult<StepRows> {
        if let Some(e) = self.failed {
            return Err(e);
        }
        Ok(StepRows {
            rows: self.rows,
            finished: self.finished,
            tokens: self.tokens,
            channels: self.channels,
        })
    }
}

/// `FinishBatch.step` with ids only ([`FinishBatch::step_ids`]): the
/// pieces' `str` objects become the result's text deltas, as pieces passed
/// in would (`token_strs` caches one per plain token text).
fn ids_step(
    py: Python<'_>,
    inner: &mut FinishBatch,
    token_strs: &mut Vec<Option<Py<PyString>>>,
    input: StepInput<'_>,
) -> PyResult<PyBatchStepResult> {
    // As `batch_step`: each kind's per-row code compiled into the loop on its own.
    match (inner.has_channels(), input.run_lengths.is_some()) {
        (true, true) => ids_rows::<true, true>(py, inner, token_strs, input),
        (true, false) => ids_rows::<true, false>(py, inner, token_strs, input),
        (false, true) => ids_rows::<false, true>(py, inner, token_strs, input),
        (false, false) => ids_rows::<false, false>(py, inner, token_strs, input),
    }
}

/// [`ids_step`], recording each row's channels when `CHANNELS`; `APPEND`
/// with run lengths (see [`IdsStep`]).
fn ids_rows<const CHANNELS: bool, const APPEND: bool>(
    py: Python<'_>,
    inner: &mut FinishBatch,
    token_strs: &mut Vec<Option<Py<PyString>>>,
    input: StepInput<'_>,
) -> PyResult<PyBatchStepResult> {
    if token_strs.is_empty() {
        let n = inner.vocabulary().map_or(0, |v| v.vocab_size());
        token_strs.try_reserve_exact(n).map_err(|_| {
            to_py_err(Error::Alloc {
                what: format!("a table of {n} token strings"),
            })
        })?;
        token_strs.resize_with(n, || None);
    }
    let mut sink = IdsStep::<CHANNELS, APPEND> {
        py,
        token_strs,
        objects: Vec::new(),
        list: PyList::empty(py),
        replaced: Vec::new(),
        rows: Rows::<CHANNELS>::new(&input),
    };
    inner.step_ids(input, &mut sink).map_err(to_py_err)?;
    let IdsStep {
        list,
        mut replaced,
        rows,
        ..
    } = sink;
    let rows = rows.done()?;
    let list = if APPEND {
        list
    } else {
        Replaced(&mut replaced).apply(list)?
    };
    Ok(rows.into_result(list))
}

/// The delta sink of an ids-only step. One piece per slot: the deltas are
/// the pieces' list, with the rows whose delta is not their piece replaced
/// after the step; with run lengths, each row's delta is appended.
struct IdsStep<'a, 'py, const CHANNELS: bool, const APPEND: bool> {
    py: Python<'py>,
    token_strs: &'a mut Vec<Option<Py<PyString>>>,
    /// One `str` per piece.
    objects: Vec<Bound<'py, PyAny>>,
    list: Bound<'py, PyList>,
    replaced: Vec<(usize, Py<PyString>)>,
    rows: Rows<CHANNELS>,
}

impl<const CHANNELS: bool, const APPEND: bool> IdsSink for IdsStep<'_, '_, CHANNELS, APPEND> {
    fn pieces(&mut self, ids: &[u32], pieces: &Pieces) -> Result<(), Error> {
        let py = self.py;
        let objects = &mut self.objects;
        objects
            .try_reserve_exact(ids.len())
            .map_err(|_| Error::Alloc {
                what: format!("{} text pieces", ids.len()),
            })?;
        for (j, s) in pieces.iter().enumerate() {
            let o = match self.token_strs.get_mut(ids[j] as usize) {
                Some(cached) if pieces.plain[j] => cached
                    .get_or_insert_with(|| PyString::new(py, s).unbind())
                    .bind(py)
                    .clone(),
                _ => PyString::new(py, s),
            };
            objects.push(o.into_any());
        }
        if !APPEND {
            self.list = PyList::new(py, &*objects).map_err(|_| Error::Alloc {
                what: format!("a list of {} text deltas", ids.len()),
            })?;
        }
        Ok(())
    }

    #[inline(always)]
    fn row(&mut self, k: usize, t: &FinishTracker, s: &SlotStep) {
        let py = self.py;
        if APPEND {
            let mut d = Appended {
                objects: &self.objects,
                list: &self.list,
            };
            self.rows.record(py, &mut d, k, t, s);
        } else {
            self.rows
                .record(py, &mut Replaced(&mut self.replaced), k, t, s);
        }
    }
}
