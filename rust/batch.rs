//! Many finish trackers addressed by slot, advanced by one call per engine
//! step.
//!
//! [`FinishBatch::step`] takes the step of every listed slot at once: flat
//! token ids, per-slot run lengths and optionally flat text pieces aligned with
//! the ids. All arguments are checked before any slot changes, so a rejected
//! call leaves the whole batch as it was. Each slot is then advanced exactly as
//! [`FinishTracker::update`] would.
//!
//! A batch built [`with_vocabulary`](FinishBatch::with_vocabulary) also keeps
//! each slot's decoder in the slot, and [`FinishBatch::step_ids`] takes token
//! ids alone: it decodes them, then steps and keeps the new decoder state of
//! each slot as it advances (after the whole step was checked).

use std::ops::Range;
use std::sync::Arc;

use crate::detok_batch::{Pieces, SeqDecoder};
use crate::detokenize::Vocabulary;
use crate::error::{Error, Problem};
use crate::finish::{FinishTracker, Step, StopParams};
use crate::reasoning::PromptState;

pub use crate::limits::MAX_SLOTS;

/// A fixed number of slots, each empty or holding one sequence.
///
/// The slot table grows on demand up to the highest slot in use (and shrinks
/// when the top slots are freed), so memory follows the slots in use, not
/// `max_slots`; slots past the table are empty.
pub struct FinishBatch {
    /// Boxed: an empty slot costs a pointer, not a tracker's few hundred
    /// bytes, so a sparse table stays small.
    slots: Vec<Option<Box<Seq>>>,
    /// `seen[slot] == epoch` while validating one step: catches duplicates.
    seen: Vec<u64>,
    epoch: u64,
    max_slots: usize,
    /// Occupied slots (`len` in O(1)).
    occupied: usize,
    /// Occupied slots whose sequence has reasoning channels.
    with_channels: usize,
    /// With a vocabulary: what ids-only steps decode with.
    decoding: Option<Decoding>,
}

/// One occupied slot: its sequence's finish tracker and, in a batch with a
/// vocabulary, its decoder.
struct Seq {
    tracker: FinishTracker,
    dec: Option<SeqDecoder>,
}

/// A batch's vocabulary and the buffers of its ids-only steps, kept for reuse.
struct Decoding {
    vocab: Arc<Vocabulary>,
    pieces: Pieces,
    /// Each row's decoder after the step being made, kept as its slot advances.
    next: Vec<Option<SeqDecoder>>,
}

/// What [`FinishBatch::step_ids`] hands the decoded pieces and the rows to
/// (the binding's delta sink).
pub trait IdsSink {
    /// The step's pieces, one per token id, before any slot changes; an error
    /// rejects the step.
    ///
    /// # Errors
    /// Whatever the sink cannot do (an allocation), returned by the step.
    fn pieces(&mut self, token_ids: &[u32], pieces: &Pieces) -> Result<(), Error>;

    /// Row `k` after its slot advanced, as [`FinishBatch::step_each`]'s `emit`.
    fn row(&mut self, k: usize, tracker: &FinishTracker, step: &SlotStep);
}

/// One batch step's arguments.
///
/// * `slots[i]` takes `run_lengths[i]` tokens (1 each when `None`) from
///   `token_ids`, in order; `texts`, when given, is aligned with `token_ids`.
/// * `grammar_terminated_at[i]` is an index into slot i's run, or -1 for
///   none.
/// * `flush_tails`, aligned with `token_ids` (ids-only steps): the last
///   `flush_tails[j]` bytes of piece j are a decoder's flush (docs/semantics.md
///   10.3), kept only if that token finishes with `length` or the grammar.
#[derive(Debug)]
pub struct StepInput<'a, S = &'a str> {
    pub slots: &'a [i64],
    pub token_ids: &'a [u32],
    pub run_lengths: Option<&'a [usize]>,
    pub texts: Option<&'a [S]>,
    pub grammar_terminated_at: Option<&'a [i64]>,
    pub flush_tails: Option<&'a [u8]>,
}

// By hand: a derive would ask `S: Copy`, but only references are copied.
impl<S> Clone for StepInput<'_, S> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<S> Copy for StepInput<'_, S> {}

impl<'a> StepInput<'a> {
    /// One token per slot, without texts or grammar terminations.
    #[must_use]
    pub fn new(slots: &'a [i64], token_ids: &'a [u32]) -> Self {
        StepInput {
            slots,
            token_ids,
            run_lengths: None,
            texts: None,
            grammar_terminated_at: None,
            flush_tails: None,
        }
    }
}

impl<'a, S> StepInput<'a, S> {
    /// The same step with `texts` as its pieces.
    #[must_use]
    pub fn texts<T>(self, texts: Option<&'a [T]>) -> StepInput<'a, T> {
        StepInput {
            slots: self.slots,
            token_ids: self.token_ids,
            run_lengths: self.run_lengths,
            texts,
            grammar_terminated_at: self.grammar_terminated_at,
            flush_tails: self.flush_tails,
        }
    }

    /// The same step with `run_lengths`.
    #[must_use]
    pub fn runs(self, run_lengths: Option<&'a [usize]>) -> Self {
        StepInput {
            run_lengths,
            ..self
        }
    }

    /// The same step with `grammar_terminated_at`.
    #[must_use]
    pub fn grammar(self, grammar_terminated_at: Option<&'a [i64]>) -> Self {
        StepInput {
            grammar_terminated_at,
            ..self
        }
    }

    /// The same step with `flush_tails` (same length as `token_ids`).
    #[must_use]
    pub fn flush_tails(self, flush_tails: Option<&'a [u8]>) -> Self {
        StepInput {
            flush_tails,
            ..self
        }
    }
}

/// One slot's outcome of a batch step.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SlotStep {
    pub slot: usize,
    /// This slot's run in the step's flat `token_ids` (and `texts`).
    pub run: Range<usize>,
    pub step: Step,
}

/// A step's arguments that disagree (built out of line: the check that
/// calls it is on the hot path).
#[cold]
fn step_err(field: &'static str, problem: Problem) -> Error {
    Error::Step {
        field,
        problem: Box::new(problem),
        slot: None,
    }
}

/// `field` has `n` `unit` where `expected` were due.
#[cold]
fn count(
    field: &'static str,
    n: usize,
    unit: &'static str,
    expected: usize,
    hint: &'static str,
) -> Error {
    let per = if unit == "pieces" {
        "token ids"
    } else {
        "slots"
    };
    step_err(
        field,
        Problem::Count {
            n,
            unit,
            expected,
            per,
            hint,
        },
    )
}

fn slot_err(slot: i64, message: &'static str) -> Error {
    Error::Slot { slot, message }
}

impl FinishBatch {
    /// # Errors
    /// [`Error::Param`] for more than [`MAX_SLOTS`] slots.
    pub fn new(max_slots: usize) -> Result<Self, Error> {
        if max_slots > MAX_SLOTS {
            return Err(Error::Param {
                field: "max_slots",
                problem: Box::new(Problem::Unsupported {
                    value: max_slots as u64,
                    max: MAX_SLOTS as u64,
                }),
            });
        }
        Ok(FinishBatch {
            slots: Vec::new(),
            seen: Vec::new(),
            epoch: 0,
            max_slots,
            occupied: 0,
            with_channels: 0,
            decoding: None,
        })
    }

    /// A batch whose slots each hold a decoder ([`add_decoding`](Self::add_decoding))
    /// for ids-only steps ([`step_ids`](Self::step_ids)).
    ///
    /// # Errors
    /// As [`new`](Self::new).
    pub fn with_vocabulary(max_slots: usize, vocab: Arc<Vocabulary>) -> Result<Self, Error> {
        let mut b = Self::new(max_slots)?;
        b.decoding = Some(Decoding {
            vocab,
            pieces: Pieces::default(),
            next: Vec::new(),
        });
        Ok(b)
    }

    /// The vocabulary of [`with_vocabulary`](Self::with_vocabulary).
    pub fn vocabulary(&self) -> Option<&Arc<Vocabulary>> {
        self.decoding.as_ref().map(|d| &d.vocab)
    }

    pub fn max_slots(&self) -> usize {
        self.max_slots
    }

    fn index(&self, slot: i64) -> Result<usize, Error> {
        usize::try_from(slot)
            .ok()
            .filter(|&s| s < self.max_slots)
            .ok_or_else(|| slot_err(slot, "is outside [0, max_slots)"))
    }

    /// Grows the table to hold slot `i` (doubling, up to `max_slots`); a
    /// failed allocation is an error, never an abort.
    fn grow_to(&mut self, i: usize) -> Result<(), Error> {
        if i < self.slots.len() {
            return Ok(());
        }
        let len = (i + 1).max(self.slots.len() * 2).min(self.max_slots);
        let extra = len - self.slots.len();
        let oom = |_| Error::Alloc {
            what: format!("a slot table of {len} slots (for slot {i})"),
        };
        self.slots.try_reserve_exact(extra).map_err(oom)?;
        self.seen.try_reserve_exact(extra).map_err(oom)?;
        self.slots.resize_with(len, || None);
        self.seen.resize(len, 0);
        Ok(())
    }

    /// Drops empty slots at the top of the table, releasing the memory once
    /// it is mostly unused.
    fn shrink(&mut self) {
        while matches!(self.slots.last(), Some(None)) {
            self.slots.pop();
        }
        self.seen.truncate(self.slots.len());
        if self.slots.capacity() > 2 * self.slots.len() + 64 {
            self.slots.shrink_to(self.slots.len());
            self.seen.shrink_to(self.slots.len());
        }
    }

    /// Starts a sequence in an empty slot.
    ///
    /// # Errors
    /// [`Error::Slot`] if the slot is out of range or taken; [`Error::Param`]
    /// if `params` does not validate.
    pub fn add(&mut self, slot: i64, params: Arc<StopParams>) -> Result<(), Error> {
        self.add_in(slot, params, PromptState::NoMarker)
    }

    /// [`add`](Self::add) for a prompt in state `prompt`
    /// ([`FinishTracker::with_prompt`]).
    ///
    /// # Errors
    /// As [`add`](Self::add).
    pub fn add_in(
        &mut self,
        slot: i64,
        params: Arc<StopParams>,
        prompt: PromptState,
    ) -> Result<(), Error> {
        self.add_decoding(slot, params, prompt, None)
    }

    /// [`add_in`](Self::add_in) with the slot's decoder (`Some` exactly in a
    /// batch [`with_vocabulary`](Self::with_vocabulary)), primed by the caller.
    ///
    /// # Errors
    /// As [`add`](Self::add).
    pub fn add_decoding(
        &mut self,
        slot: i64,
        params: Arc<StopParams>,
        prompt: PromptState,
        dec: Option<SeqDecoder>,
    ) -> Result<(), Error> {
        debug_assert_eq!(dec.is_some(), self.decoding.is_some());
        let i = self.index(slot)?;
        if self.slots.get(i).is_some_and(Option::is_some) {
            return Err(slot_err(slot, "is already in use; remove() it first"));
        }
        let tracker = FinishTracker::with_prompt(params, prompt)?;
        self.grow_to(i)?;
        self.with_channels += usize::from(tracker.has_channels());
        self.slots[i] = Some(Box::new(Seq { tracker, dec }));
        self.occupied += 1;
        Ok(())
    }

    /// Frees a slot and returns its tracker.
    pub fn remove(&mut self, slot: i64) -> Result<FinishTracker, Error> {
        let i = self.index(slot)?;
        let tracker = self
            .slots
            .get_mut(i)
            .and_then(Option::take)
            .map(|boxed| boxed.tracker)
            .ok_or_else(|| slot_err(slot, "is empty"))?;
        self.occupied -= 1;
        self.with_channels -= usize::from(tracker.has_channels());
        if i + 1 == self.slots.len() {
            self.shrink();
        }
        Ok(tracker)
    }

    /// The snapshot of slot `slot`'s sequence, with its decoder in a batch
    /// with a vocabulary ([`crate::snapshot`]).
    ///
    /// # Errors
    /// [`Error::Slot`] for a slot out of range or empty; as
    /// [`crate::snapshot::snapshot`].
    pub fn snapshot(&self, slot: i64) -> Result<Vec<u8>, Error> {
        let i = self.index(slot)?;
        let seq = self
            .slots
            .get(i)
            .and_then(Option::as_deref)
            .ok_or_else(|| slot_err(slot, "is empty"))?;
        let vocab = self.decoding.as_ref().map(|d| &*d.vocab);
        crate::snapshot::snapshot(&seq.tracker, vocab.zip(seq.dec.as_ref()))
    }

    /// Starts slot `slot` (empty, as for [`add`](Self::add)) in the state
    /// `data` holds, a snapshot taken with `params` (and, in a batch with a
    /// vocabulary, the same vocabulary) from any slot of any batch or a
    /// tracker. Nothing changes on error.
    ///
    /// # Errors
    /// [`Error::Slot`] if the slot is out of range or taken; as
    /// [`crate::snapshot::restore`].
    pub fn restore(
        &mut self,
        slot: i64,
        params: Arc<StopParams>,
        data: &[u8],
    ) -> Result<(), Error> {
        let i = self.index(slot)?;
        if self.slots.get(i).is_some_and(Option::is_some) {
            return Err(slot_err(slot, "is already in use; remove() it first"));
        }
        let vocab = self.decoding.as_ref().map(|d| &*d.vocab);
        let (tracker, dec) = crate::snapshot::restore(params, data, vocab)?;
        self.grow_to(i)?;
        self.with_channels += usize::from(tracker.has_channels());
        self.slots[i] = Some(Box::new(Seq { tracker, dec }));
        self.occupied += 1;
        Ok(())
    }

    pub fn get(&self, slot: i64) -> Result<&FinishTracker, Error> {
        let i = self.index(slot)?;
        self.slots
            .get(i)
            .and_then(Option::as_deref)
            .map(|s| &s.tracker)
            .ok_or_else(|| slot_err(slot, "is empty"))
    }

    pub fn get_mut(&mut self, slot: i64) -> Result<&mut FinishTracker, Error> {
        let i = self.index(slot)?;
        self.slots
            .get_mut(i)
            .and_then(Option::as_deref_mut)
            .map(|s| &mut s.tracker)
            .ok_or_else(|| slot_err(slot, "is empty"))
    }

    /// Whether some occupied slot's sequence has reasoning channels.
    #[inline]
    pub fn has_channels(&self) -> bool {
        self.with_channels > 0
    }

    /// Number of occupied slots.
    pub fn len(&self) -> usize {
        self.occupied
    }

    /// Occupied slots whose sequence finished and awaits `remove`; walks the
    /// slot table allocated so far (up to the highest slot used), not `max_slots`.
    pub fn finished_len(&self) -> usize {
        self.slots
            .iter()
            .flatten()
            .filter(|s| s.tracker.is_finished())
            .count()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Advances every listed slot by its run (see [`StepInput`]).
    ///
    /// Results are appended to `out` in the order of `slots`.
    ///
    /// # Errors
    /// Any inconsistency ([`Error::Step`], [`Error::Slot`],
    /// [`Error::Finished`]) is reported before any slot changes.
    pub fn step<S: AsRef<str>>(
        &mut self,
        input: StepInput<'_, S>,
        out: &mut Vec<SlotStep>,
    ) -> Result<(), Error> {
        self.step_each(input, |_, _, step| out.push(step.clone()))
    }

    /// [`step`](Self::step), handing each slot's outcome to `emit(i, tracker,
    /// outcome)` as soon as slot `slots[i]` has advanced, instead of
    /// collecting them (the binding builds its Python result this way).
    ///
    /// # Errors
    /// As [`step`](Self::step); `emit` is never called for a rejected step.
    #[inline]
    pub fn step_each<S: AsRef<str>>(
        &mut self,
        input: StepInput<'_, S>,
        mut emit: impl FnMut(usize, &FinishTracker, &SlotStep),
    ) -> Result<(), Error> {
        self.step_seqs(input, |k, seq, step| emit(k, &seq.tracker, step))
    }

    /// A step with token ids only, in a batch
    /// [`with_vocabulary`](Self::with_vocabulary): decodes each slot's run
    /// with its decoder (no state changes), hands the pieces to `sink`, then
    /// steps as [`step_each`](Self::step_each) with those pieces and the
    /// decoders' flush tails, keeping each slot's new decoder as it advances.
    /// Without a vocabulary it is `step_each` without texts.
    ///
    /// # Errors
    /// [`Error::Step`] naming `token_ids[j]` and its slot for an id outside
    /// the vocabulary; as [`step`](Self::step) and [`IdsSink::pieces`].
    /// Nothing changes on error.
    pub fn step_ids(&mut self, input: StepInput<'_>, sink: &mut impl IdsSink) -> Result<(), Error> {
        let Some(mut d) = self.decoding.take() else {
            return self.step_each(input.texts::<&str>(None), |k, t, s| sink.row(k, t, s));
        };
        let r = self.decode_and_step(&mut d, input, sink);
        self.decoding = Some(d);
        r
    }

    /// [`step_ids`](Self::step_ids) with the decoding buffers taken out.
    fn decode_and_step(
        &mut self,
        d: &mut Decoding,
        input: StepInput<'_>,
        sink: &mut impl IdsSink,
    ) -> Result<(), Error> {
        self.decode(d, input)?;
        sink.pieces(input.token_ids, &d.pieces)?;
        let strs = d.pieces.strs();
        let input = input.flush_tails(Some(&d.pieces.flush)).texts(Some(&strs));
        self.step_decoded(input, &d.next, sink)
    }

    /// The step loop of [`step_ids`](Self::step_ids): each slot keeps its
    /// decoder after the run as it advances. Out of line, as
    /// [`step_each`](Self::step_each) is for the binding: the loop is then
    /// optimized on its own.
    #[inline(never)]
    fn step_decoded(
        &mut self,
        input: StepInput<'_>,
        next: &[Option<SeqDecoder>],
        sink: &mut impl IdsSink,
    ) -> Result<(), Error> {
        self.step_seqs(input, |k, seq, step| {
            if let Some(n) = next[k] {
                seq.dec = Some(n);
            }
            sink.row(k, &seq.tracker, step);
        })
    }

    /// Decodes each slot's run into `d.pieces` and its decoder after the
    /// run into `d.next`, changing no slot.
    fn decode(&self, d: &mut Decoding, input: StepInput<'_>) -> Result<(), Error> {
        let StepInput {
            slots,
            token_ids: ids,
            run_lengths: runs,
            grammar_terminated_at: grammar,
            ..
        } = input;
        d.pieces.clear();
        d.next.clear();
        let total = runs.map_or(Some(slots.len()), |r| {
            r.iter().try_fold(0usize, |a, &n| a.checked_add(n))
        });
        // A mismatch is named by the step's own check: decode nothing.
        if total == Some(ids.len()) && runs.map_or(true, |r| r.len() == slots.len()) {
            d.vocab.check_decode_size(ids, "token_ids")?;
            d.pieces.reserve(ids.len())?;
            let mut start = 0;
            for (k, &slot) in slots.iter().enumerate() {
                let len = runs.map_or(1, |r| r[k]);
                let g = grammar
                    .and_then(|g| g.get(k))
                    .and_then(|&g| usize::try_from(g).ok());
                let dec = usize::try_from(slot)
                    .ok()
                    .and_then(|i| self.slots.get(i))
                    .and_then(|s| s.as_ref()?.dec);
                let next = match dec {
                    Some(dec) => {
                        let run = &ids[start..start + len];
                        let p = &mut d.pieces;
                        Some(dec.decode_run(&d.vocab, run, g, p, start, Some(slot))?)
                    }
                    // Out of range or empty: the step's check rejects it.
                    None => {
                        d.pieces.push_empty(len)?;
                        None
                    }
                };
                d.next.push(next);
                start += len;
            }
        }
        Ok(())
    }

    /// The step loop of [`step_each`](Self::step_each), handing out each
    /// slot's whole state.
    #[inline(always)]
    fn step_seqs<S: AsRef<str>>(
        &mut self,
        input: StepInput<'_, S>,
        mut emit: impl FnMut(usize, &mut Seq, &SlotStep),
    ) -> Result<(), Error> {
        let StepInput {
            slots,
            token_ids,
            run_lengths,
            texts,
            grammar_terminated_at,
            flush_tails,
        } = input;
        // The caller's arguments first: a decoding batch decodes nothing
        // for a run/ids mismatch, so its (internal) flush tails are short
        // too, and that error named no argument the caller gave.
        self.check(
            slots,
            token_ids,
            run_lengths,
            texts.map(<[S]>::len),
            grammar_terminated_at,
        )?;
        if let Some(f) = flush_tails.filter(|f| f.len() != token_ids.len()) {
            return Err(count(
                "flush_tails",
                f.len(),
                "entries",
                token_ids.len(),
                "",
            ));
        }
        let grammar = |k: usize| grammar_terminated_at.and_then(|g| usize::try_from(g[k]).ok());
        let mut start = 0;
        for (k, &slot) in slots.iter().enumerate() {
            // `check` has bounds-checked the slot and seen it occupied.
            let Some(seq) = self.slots[slot as usize].as_deref_mut() else {
                unreachable!("checked above")
            };
            let tracker = &mut seq.tracker;
            let (run, step) = match run_lengths {
                // One token per slot, the usual decode step: a one-token
                // slice lets the compiler drop the loop inside `update_checked`.
                None => {
                    let ids = std::slice::from_ref(&token_ids[k]);
                    let one = texts.map(|t| std::slice::from_ref(&t[k]));
                    let tail = flush_tails.map(|f| std::slice::from_ref(&f[k]));
                    (k..k + 1, tracker.update_checked(ids, one, grammar(k), tail))
                }
                Some(r) => {
                    let run = start..start + r[k];
                    start = run.end;
                    let step = tracker.update_checked(
                        &token_ids[run.clone()],
                        texts.map(|t| &t[run.clone()]),
                        grammar(k),
                        flush_tails.map(|f| &f[run.clone()]),
                    );
                    (run, step)
                }
            };
            let step = SlotStep {
                slot: slot as usize,
                run,
                step,
            };
            emit(k, seq, &step);
        }
        Ok(())
    }

    fn check(
        &mut self,
        slots: &[i64],
        token_ids: &[u32],
        run_lengths: Option<&[usize]>,
        texts_len: Option<usize>,
        grammar: Option<&[i64]>,
    ) -> Result<(), Error> {
        if let Some(r) = run_lengths {
            if r.len() != slots.len() {
                return Err(count("run_lengths", r.len(), "entries", slots.len(), ""));
            }
        }
        if let Some(g) = grammar {
            if g.len() != slots.len() {
                return Err(count(
                    "grammar_terminated_at",
                    g.len(),
                    "entries",
                    slots.len(),
                    "",
                ));
            }
        }
        let total = match run_lengths {
            None => slots.len(),
            Some(r) => r
                .iter()
                .try_fold(0usize, |acc, &n| acc.checked_add(n))
                .ok_or_else(|| step_err("run_lengths", Problem::SumOverflows))?,
        };
        if total != token_ids.len() {
            return Err(step_err(
                "token_ids",
                Problem::Count {
                    n: token_ids.len(),
                    unit: "ids",
                    expected: total,
                    per: "tokens in the runs",
                    hint: "",
                },
            ));
        }
        if let Some(t) = texts_len {
            if t != token_ids.len() {
                return Err(count(
                    "texts",
                    t,
                    "pieces",
                    token_ids.len(),
                    "; pass one piece per token",
                ));
            }
        }
        if run_lengths.is_none() && grammar.is_none() && self.screen(slots, texts_len.is_some()) {
            return Ok(());
        }
        // The full check, which names what is wrong.
        self.epoch += 1;
        for (k, &slot) in slots.iter().enumerate() {
            let i = self.index(slot)?;
            if i >= self.slots.len() {
                return Err(slot_err(slot, "is empty"));
            }
            if self.seen[i] == self.epoch {
                return Err(slot_err(slot, "appears twice in one step"));
            }
            self.seen[i] = self.epoch;
            let tracker = self.slots[i]
                .as_deref()
                .map(|s| &s.tracker)
                .ok_or_else(|| slot_err(slot, "is empty"))?;
            let len = run_lengths.map_or(1, |r| r[k]);
            let g = match grammar.map(|g| g[k]) {
                None | Some(-1) => None,
                Some(g) if g < 0 => {
                    return Err(Error::Step {
                        field: "grammar_terminated_at",
                        problem: Box::new(Problem::OutsideRun {
                            index: Some(k),
                            value: g,
                            run_len: len,
                        }),
                        slot: Some(slot),
                    })
                }
                Some(g) => Some(g as usize),
            };
            tracker
                .check_step(len, texts_len.map(|_| len), g)
                .map_err(|e| match e {
                    Error::Step { field, problem, .. } => Error::Step {
                        field,
                        problem,
                        slot: Some(slot),
                    },
                    Error::Finished { finish_reason } => Error::SlotFinished {
                        slot,
                        finish_reason,
                    },
                    other => other,
                })?;
        }
        Ok(())
    }
}

impl FinishBatch {
    /// The common decode step (one token per slot, no grammar
    /// terminations): true when every slot is in range, listed once,
    /// occupied and accepts one token, as the full check in
    /// [`check`](Self::check) would find. False sends the step to that check.
    #[inline(always)]
    fn screen(&mut self, slots: &[i64], with_text: bool) -> bool {
        self.epoch += 1;
        let epoch = self.epoch;
        let n = self.slots.len();
        for &slot in slots {
            let i = slot as usize; // a negative slot wraps far past `n`
            if i >= n || self.seen[i] == epoch {
                return false;
            }
            self.seen[i] = epoch;
            match &self.slots[i] {
                Some(s) if s.tracker.accepts_one_token(with_text) => {}
                _ => return false,
            }
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stop_strings::StopStrings;

    fn params() -> Arc<StopParams> {
        Arc::new(StopParams {
            stop: Some(StopStrings::compile(vec!["END".into()]).unwrap()),
            eos_token_ids: vec![2],
            max_tokens: Some(4),
            ..StopParams::default()
        })
    }

    #[test]
    fn batch_equals_trackers() {
        let mut b = FinishBatch::new(4).unwrap();
        b.add(0, params()).unwrap();
        b.add(3, params()).unwrap();
        let mut t0 = FinishTracker::new(params()).unwrap();
        let mut t3 = FinishTracker::new(params()).unwrap();
        let mut out = vec![];
        let input = StepInput::new(&[3, 0], &[5, 6, 2, 7]).runs(Some(&[1, 3]));
        b.step(input.texts(Some(&["a", "b", "", "E"])), &mut out)
            .unwrap();
        t3.update(&[5], Some(&["a"]), None).unwrap();
        t0.update(&[6, 2, 7], Some(&["b", "", "E"]), None).unwrap();
        assert_eq!(b.get(0).unwrap().token_ids(), t0.token_ids());
        assert_eq!(b.get(3).unwrap().token_ids(), t3.token_ids());
        assert_eq!(b.get(0).unwrap().finish(), t0.finish());
        assert_eq!(out.len(), 2);
        assert_eq!(out[0].slot, 3);
    }

    #[test]
    fn rejected_step_changes_nothing() {
        let mut b = FinishBatch::new(2).unwrap();
        b.add(0, params()).unwrap();
        b.add(1, params()).unwrap();
        let mut out = vec![];
        let input = StepInput::new(&[0, 1, 0], &[5, 6, 7]).texts(Some(&["a", "b", "c"]));
        let err = b.step(input, &mut out);
        assert!(matches!(err, Err(Error::Slot { slot: 0, .. })));
        let input = StepInput::new(&[0, 5], &[5, 6]).texts(Some(&["a", "b"]));
        let err = b.step(input, &mut out);
        assert!(matches!(err, Err(Error::Slot { slot: 5, .. })));
        let err = b.step(StepInput::new(&[0, 1], &[5, 6]), &mut out);
        assert!(matches!(err, Err(Error::Step { field: "texts", .. })));
        assert!(out.is_empty());
        assert!(b.get(0).unwrap().token_ids().is_empty());
        assert!(b.get(1).unwrap().token_ids().is_empty());
    }

    #[test]
    fn the_batch_knows_whether_any_slot_has_channels() {
        use crate::reasoning::{Marker, Reasoning, ReasoningSpec};
        let spec = ReasoningSpec {
            end: Marker {
                text: None,
                token_id: Some(9),
            },
            ..ReasoningSpec::default()
        };
        let r = Reasoning::new(spec, None, None, &[], &[]).unwrap();
        let with = Arc::new(StopParams {
            reasoning: Some(Arc::new(r)),
            ..StopParams::default()
        });
        let mut b = FinishBatch::new(4).unwrap();
        b.add(0, params()).unwrap();
        assert!(!b.has_channels());
        b.add(2, Arc::clone(&with)).unwrap();
        b.add(3, with).unwrap();
        b.remove(2).unwrap();
        assert!(b.has_channels());
        b.remove(3).unwrap();
        assert!(!b.has_channels());
    }

    #[test]
    fn memory_follows_the_slots_in_use() {
        let mut b = FinishBatch::new(MAX_SLOTS).unwrap();
        assert_eq!((b.len(), b.slots.capacity()), (0, 0));
        let p = Arc::new(StopParams::default());
        b.add(3, Arc::clone(&p)).unwrap();
        b.add(1000, Arc::clone(&p)).unwrap();
        assert_eq!(b.len(), 2);
        assert!(b.slots.len() <= 2048, "{}", b.slots.len());
        assert!(
            b.get(5000).is_err() && b.get(5000).err().unwrap().to_string().contains("is empty")
        );
        let e = b
            .step(StepInput::new(&[5000], &[1]), &mut Vec::new())
            .unwrap_err();
        assert_eq!(e.to_string(), "slot 5000: is empty");
        b.remove(1000).unwrap();
        assert_eq!((b.len(), b.slots.len()), (1, 4));
        b.remove(3).unwrap();
        assert!(b.is_empty() && b.slots.is_empty());
    }
}

/// Ids-only steps ([`FinishBatch::step_ids`]).
#[cfg(test)]
mod ids_tests {
    use super::*;
    use crate::detokenize::DecodeOptions;
    use crate::stop_strings::StopStrings;

    fn vocab() -> Arc<Vocabulary> {
        // "€" is E2 82 AC: ByteLevel chars â (E2), Ĥ (82), ¬ (AC).
        let j = serde_json::json!({
            "model": {"vocab": {"a": 0, "â": 1, "Ĥ": 2, "¬": 3, "ĠEND": 4, "b": 5}},
            "decoder": {"type": "ByteLevel"},
            "added_tokens": [{"id": 6, "content": "<eos>", "special": true}],
        });
        Arc::new(Vocabulary::from_json(j.to_string().as_bytes()).unwrap())
    }

    fn params(max_tokens: Option<u64>) -> Arc<StopParams> {
        Arc::new(StopParams {
            stop: Some(StopStrings::compile(vec!["END".into()]).unwrap()),
            eos_token_ids: vec![6],
            max_tokens,
            ..StopParams::default()
        })
    }

    /// Records the pieces and rows it is handed; `refuse` makes `pieces` fail.
    #[derive(Default)]
    struct Sink {
        pieces: Vec<String>,
        rows: Vec<SlotStep>,
        refuse: bool,
    }

    impl IdsSink for Sink {
        fn pieces(&mut self, _: &[u32], pieces: &Pieces) -> Result<(), Error> {
            if self.refuse {
                return Err(Error::Alloc {
                    what: "a test's pieces".into(),
                });
            }
            self.pieces = pieces.iter().map(str::to_owned).collect();
            Ok(())
        }
        fn row(&mut self, _: usize, _: &FinishTracker, step: &SlotStep) {
            self.rows.push(step.clone());
        }
    }

    /// A batch with the vocabulary and `p` in `slot`, primed with `prompt`.
    fn batch(max_slots: usize, slot: i64, p: &Arc<StopParams>, prompt: &[u32]) -> FinishBatch {
        let v = vocab();
        let dec = SeqDecoder::new(&v, p, prompt, DecodeOptions::default()).unwrap();
        let mut b = FinishBatch::with_vocabulary(max_slots, v).unwrap();
        b.add_decoding(slot, Arc::clone(p), PromptState::NoMarker, Some(dec))
            .unwrap();
        b
    }

    fn pending(b: &FinishBatch, slot: usize) -> Vec<u8> {
        let s = b.slots[slot].as_ref().unwrap();
        s.dec.unwrap().state().pending().to_vec()
    }

    /// Ids only gives what the pieces give, and a run what single steps give.
    #[test]
    fn ids_only_equals_pieces_and_runs_equal_steps() {
        let v = vocab();
        let ids = [0u32, 1, 2, 3, 5, 1, 0, 4, 0];
        let mut by_ids = batch(2, 1, &params(None), &[]);
        let mut by_run = batch(2, 1, &params(None), &[]);
        let mut by_pieces = FinishBatch::new(2).unwrap();
        by_pieces.add(1, params(None)).unwrap();
        let mut st = v.start(DecodeOptions::default());
        for &id in &ids {
            if by_ids.get(1).unwrap().is_finished() {
                break;
            }
            by_ids
                .step_ids(StepInput::new(&[1], &[id]), &mut Sink::default())
                .unwrap();
            let mut piece = String::new();
            v.step(&mut st, id, &mut piece);
            by_pieces
                .step(
                    StepInput::new(&[1], &[id]).texts(Some(&[piece])),
                    &mut vec![],
                )
                .unwrap();
        }
        let mut sink = Sink::default();
        let run = [ids.len()];
        let input = StepInput::new(&[1], &ids).runs(Some(&run));
        by_run.step_ids(input, &mut sink).unwrap();
        assert_eq!(sink.pieces.concat(), "a€b\u{FFFD}a ENDa");
        assert_eq!(sink.rows.len(), 1);
        let (a, b, c) = (
            by_ids.get(1).unwrap(),
            by_pieces.get(1).unwrap(),
            by_run.get(1).unwrap(),
        );
        assert_eq!(a.text(), "a€b\u{FFFD}a ");
        assert_eq!((a.text(), a.finish()), (b.text(), b.finish()));
        assert_eq!((a.text(), a.finish()), (c.text(), c.finish()));
        assert!(a.is_finished());
    }

    /// Runs `ids` as one ids-only run through a fresh batch slot; the kept
    /// text and finish reason.
    fn run_ids(p: Arc<StopParams>, ids: &[u32]) -> (String, &'static str) {
        let mut b = batch(1, 0, &p, &[]);
        let run = [ids.len()];
        let input = StepInput::new(&[0], ids).runs(Some(&run));
        b.step_ids(input, &mut Sink::default()).unwrap();
        let t = b.get(0).unwrap();
        (t.text().to_owned(), t.finish().unwrap().reason.as_str())
    }

    /// Wrong answer 3 of issue 22: EOS on the last budgeted position, kept
    /// with include_stop_str_in_output, carries no flushed U+FFFD (vLLM's
    /// DecodeStream never emits held bytes); a length finish does.
    #[test]
    fn a_stop_token_at_the_length_cap_keeps_no_flush() {
        let with = |ids: &[u32]| {
            let p = Arc::new(StopParams {
                eos_token_ids: vec![6],
                stop_token_ids: vec![2],
                max_tokens: Some(2),
                include_stop_str_in_output: true,
                ..StopParams::default()
            });
            run_ids(p, ids)
        };
        assert_eq!(with(&[1, 6]), (String::new(), "stop"));
        // The stop token 2 ("Ĥ", 0x82) leaves E2 82 held at the cap.
        assert_eq!(with(&[1, 2]), (String::new(), "stop"));
        assert_eq!(with(&[1, 3]), ("\u{FFFD}".into(), "length"));
        assert_eq!(with(&[0, 1]), ("a\u{FFFD}".into(), "length"));
    }

    /// Wrong answer 4: the flushed U+FFFD cannot complete a stop string or
    /// a stop regex; the finish stays `length`.
    #[test]
    fn the_flush_never_completes_a_stop() {
        let stop = |strings: &[&str], regex: Option<&str>| {
            let p = Arc::new(StopParams {
                stop: Some(
                    StopStrings::compile(strings.iter().map(|s| s.to_string()).collect()).unwrap(),
                ),
                stop_regex: regex
                    .map(|r| crate::stop_regex::StopRegexes::compile(vec![r.into()]).unwrap()),
                max_tokens: Some(2),
                ..StopParams::default()
            });
            run_ids(p, &[0, 1])
        };
        assert_eq!(stop(&["a\u{FFFD}"], None), ("a\u{FFFD}".into(), "length"));
        assert_eq!(stop(&["zz"], Some("a.")), ("a\u{FFFD}".into(), "length"));
        // A stop inside the token's own text still wins over the length cap.
        assert_eq!(stop(&["a"], None), (String::new(), "stop"));
    }

    #[test]
    fn length_cap_flushes_and_bad_ids_change_nothing() {
        // Primed mid-character: the first output token completes it.
        let mut b = batch(1, 0, &params(Some(2)), &[1, 2]);
        let err = b.step_ids(StepInput::new(&[0], &[99]), &mut Sink::default());
        assert!(err
            .unwrap_err()
            .to_string()
            .contains("token_ids[0]=99 is outside the vocabulary [0, 7) (slot 0)"));
        assert_eq!(pending(&b, 0), [0xE2, 0x82]);
        let input = StepInput::new(&[0], &[3, 1]).runs(Some(&[2]));
        b.step_ids(input, &mut Sink::default()).unwrap();
        let t = b.get(0).unwrap();
        assert_eq!(t.text(), "€\u{FFFD}");
        assert_eq!(t.finish().unwrap().reason.as_str(), "length");
    }

    /// A step the batch's check or the sink rejects keeps every decoder as
    /// it was (commit on success), though the decode itself succeeded.
    #[test]
    fn a_rejected_step_keeps_the_decoders() {
        let p = params(None);
        let mut b = batch(4, 0, &p, &[]);
        let dec = SeqDecoder::new(&vocab(), &p, &[], DecodeOptions::default()).unwrap();
        b.add_decoding(2, Arc::clone(&p), PromptState::NoMarker, Some(dec))
            .unwrap();
        // Slot 3 is empty: the check rejects the step after slot 0 decoded "â".
        let err = b.step_ids(StepInput::new(&[0, 3], &[1, 0]), &mut Sink::default());
        let msg = err.unwrap_err().to_string();
        assert!(msg.contains("slot 3") && msg.contains("empty"), "{msg}");
        assert_eq!(pending(&b, 0), b"");
        let mut refusing = Sink {
            refuse: true,
            ..Sink::default()
        };
        assert!(b
            .step_ids(StepInput::new(&[0], &[1]), &mut refusing)
            .is_err());
        assert_eq!(
            (pending(&b, 0), b.get(0).unwrap().token_ids()),
            (vec![], &[][..])
        );
        let mut sink = Sink::default();
        b.step_ids(StepInput::new(&[2, 0], &[1, 0]), &mut sink)
            .unwrap();
        assert_eq!((pending(&b, 2), pending(&b, 0)), (vec![0xE2], vec![]));
        assert_eq!(sink.pieces, ["", "a"]);
    }

    /// The decoders live in the slot table, which grows with the highest
    /// slot in use: a batch of 2**24 slots allocates nothing up front.
    #[test]
    fn decoders_grow_with_the_slots_in_use() {
        let b = FinishBatch::with_vocabulary(MAX_SLOTS, vocab()).unwrap();
        assert_eq!(b.slots.capacity(), 0);
        let mut b = batch(MAX_SLOTS, 5, &params(None), &[]);
        assert_eq!(b.slots.len(), 6);
        b.remove(5).unwrap();
        assert!(b.slots.is_empty());
    }
}
