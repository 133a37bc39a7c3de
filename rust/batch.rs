//! Many finish trackers addressed by slot, advanced by one call per engine
//! step.
//!
//! [`FinishBatch::step`] takes the step of every listed slot at once: flat
//! token ids, per-slot run lengths and optionally flat text pieces aligned with
//! the ids. All arguments are checked before any slot changes, so a rejected
//! call leaves the whole batch as it was. Each slot is then advanced exactly as
//! [`FinishTracker::update`] would.

use std::ops::Range;
use std::sync::Arc;

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
    slots: Vec<Option<Box<FinishTracker>>>,
    /// `seen[slot] == epoch` while validating one step: catches duplicates.
    seen: Vec<u64>,
    epoch: u64,
    max_slots: usize,
    /// Occupied slots (`len` in O(1)).
    occupied: usize,
    /// Occupied slots whose sequence has reasoning channels.
    with_channels: usize,
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
        })
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
        let i = self.index(slot)?;
        if self.slots.get(i).is_some_and(Option::is_some) {
            return Err(slot_err(slot, "is already in use; remove() it first"));
        }
        let tracker = FinishTracker::with_prompt(params, prompt)?;
        self.grow_to(i)?;
        self.slots[i] = Some(Box::new(tracker));
        self.occupied += 1;
        self.with_channels += usize::from(self.slots[i].as_ref().is_some_and(|t| t.has_channels()));
        Ok(())
    }

    /// Frees a slot and returns its tracker.
    pub fn remove(&mut self, slot: i64) -> Result<FinishTracker, Error> {
        let i = self.index(slot)?;
        let tracker = self
            .slots
            .get_mut(i)
            .and_then(Option::take)
            .map(|boxed| *boxed)
            .ok_or_else(|| slot_err(slot, "is empty"))?;
        self.occupied -= 1;
        self.with_channels -= usize::from(tracker.has_channels());
        if i + 1 == self.slots.len() {
            self.shrink();
        }
        Ok(tracker)
    }

    pub fn get(&self, slot: i64) -> Result<&FinishTracker, Error> {
        let i = self.index(slot)?;
        self.slots
            .get(i)
            .and_then(Option::as_deref)
            .ok_or_else(|| slot_err(slot, "is empty"))
    }

    pub fn get_mut(&mut self, slot: i64) -> Result<&mut FinishTracker, Error> {
        let i = self.index(slot)?;
        self.slots
            .get_mut(i)
            .and_then(Option::as_deref_mut)
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
            .filter(|t| t.is_finished())
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
        let StepInput {
            slots,
            token_ids,
            run_lengths,
            texts,
            grammar_terminated_at,
            flush_tails,
        } = input;
        if let Some(f) = flush_tails.filter(|f| f.len() != token_ids.len()) {
            return Err(count(
                "flush_tails",
                f.len(),
                "entries",
                token_ids.len(),
                "",
            ));
        }
        self.check(
            slots,
            token_ids,
            run_lengths,
            texts.map(<[S]>::len),
            grammar_terminated_at,
        )?;
        let grammar = |k: usize| grammar_terminated_at.and_then(|g| usize::try_from(g[k]).ok());
        let mut start = 0;
        for (k, &slot) in slots.iter().enumerate() {
            // `check` has bounds-checked the slot and seen it occupied.
            let Some(tracker) = self.slots[slot as usize].as_deref_mut() else {
                unreachable!("checked above")
            };
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
            emit(k, tracker, &step);
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
                Some(t) if t.accepts_one_token(with_text) => {}
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
