//! Ids-only steps: each sequence's [`DecodeState`] beside its finish
//! tracker, turning a step's token ids into the text pieces the tracker
//! takes (what an engine's streaming detokenizer would have produced).
//!
//! Decoding never changes state until the finish step accepted the pieces,
//! so a rejected step leaves decoders and trackers as they were.

use std::sync::Arc;

use crate::batch::{FinishBatch, SlotStep, StepInput};
use crate::detokenize::{DecodeOptions, DecodeState, Vocabulary};
use crate::error::{Error, Problem};
use crate::finish::{FinishTracker, StopParams};

/// One sequence's decoder and what it needs to know about its finish.
#[derive(Clone, Copy, Debug)]
pub struct SeqDecoder {
    state: DecodeState,
    /// Output tokens left before the length cap (max_tokens or
    /// max_model_len): the token that reaches it flushes held bytes.
    left: u64,
    /// `vocab_size` of the params (ids at or above finish with "error").
    vocab_limit: u64,
}

impl SeqDecoder {
    /// A decoder for a sequence with `params`, primed with the prompt's ids
    /// (their text is discarded; decoding continues from their state).
    ///
    /// # Errors
    /// [`Error::Step`] naming `prompt_token_ids[i]` for an id outside the
    /// vocabulary.
    pub fn new(
        vocab: &Vocabulary,
        params: &StopParams,
        prompt_token_ids: &[u32],
        opts: DecodeOptions,
    ) -> Result<Self, Error> {
        let state = vocab.primed(opts, prompt_token_ids)?;
        let left = params.max_tokens.unwrap_or(u64::MAX).min(
            params
                .max_model_len
                .map_or(u64::MAX, |m| m.saturating_sub(params.prompt_len)),
        );
        Ok(SeqDecoder {
            state,
            left,
            vocab_limit: params.vocab_size.map_or(u64::MAX, u64::from),
        })
    }

    pub fn state(&self) -> &DecodeState {
        &self.state
    }

    /// Decodes one run, appending one piece per id to `out`; returns the decoder after the run (self is unchanged).
    /// `grammar` is the run index at which the grammar terminates; errors
    /// name `token_ids[offset + i]` and the slot.
    ///
    /// # Errors
    /// [`Error::Step`] for an id outside the vocabulary that the params'
    /// `vocab_size` would not finish with "error" first.
    #[inline]
    pub fn decode_run(
        &self,
        vocab: &Vocabulary,
        ids: &[u32],
        grammar: Option<usize>,
        out: &mut Pieces,
        offset: usize,
        slot: Option<i64>,
    ) -> Result<SeqDecoder, Error> {
        let mut next = *self;
        out.reserve(ids.len())?;
        let (buf, ends) = (&mut out.buf, &mut out.ends);
        for (i, &id) in ids.iter().enumerate() {
            if id as usize >= vocab.vocab_size() {
                if u64::from(id) >= next.vocab_limit {
                    // The finish rules stop the sequence here ("error").
                    ends.push(buf.len());
                    out.plain.push(false);
                    out.flush.push(0);
                    continue;
                }
                return Err(Error::Step {
                    field: "token_ids",
                    problem: Box::new(Problem::NotInVocabulary {
                        index: offset + i,
                        id,
                        vocab_size: vocab.vocab_size(),
                    }),
                    slot,
                });
            }
            vocab.reserve_step(buf)?;
            let mut plain = vocab.step(&mut next.state, id, buf);
            next.left = next.left.saturating_sub(1);
            // The last token the sequence takes: held bytes become U+FFFD,
            // so a length-finished text equals Tokenizer.decode of the ids.
            // The finish machine keeps this tail only for a length or
            // grammar finish and never matches it (10.3).
            let mut tail = 0;
            if next.left == 0 || grammar == Some(i) {
                let before = buf.len();
                vocab.flush(&mut next.state, buf);
                tail = buf.len() - before;
                plain &= tail == 0;
            }
            ends.push(buf.len());
            out.plain.push(plain);
            out.flush.push(tail as u8);
        }
        Ok(next)
    }
}

/// Pieces of one step, kept for reuse between steps.
#[derive(Default)]
pub struct Pieces {
    pub buf: String,
    pub ends: Vec<usize>,
    /// Piece j is exactly its id's text ([`Vocabulary::token_text`]).
    pub plain: Vec<bool>,
    /// Bytes at the end of piece j that are the decoder's flush at the
    /// length cap or grammar end (at most 12: four U+FFFD), else 0
    /// ([`StepInput::flush_tails`]).
    pub flush: Vec<u8>,
}

impl Pieces {
    /// Room for `n` more pieces' bookkeeping, allocated fallibly.
    fn reserve(&mut self, n: usize) -> Result<(), Error> {
        let oom = |_| Error::Alloc {
            what: format!("the bookkeeping of {n} text pieces"),
        };
        self.ends.try_reserve(n).map_err(oom)?;
        self.plain.try_reserve(n).map_err(oom)?;
        self.flush.try_reserve(n).map_err(oom)
    }

    fn clear(&mut self) {
        self.buf.clear();
        self.ends.clear();
        self.plain.clear();
        self.flush.clear();
    }

    /// The pieces as string slices.
    pub fn strs(&self) -> Vec<&str> {
        let mut start = 0;
        self.ends
            .iter()
            .map(|&e| {
                let s = &self.buf[start..e];
                start = e;
                s
            })
            .collect()
    }
}

/// A vocabulary and one decoder per [`FinishBatch`] slot.
pub struct BatchDecoder {
    vocab: Arc<Vocabulary>,
    /// Grown to the highest slot in use, as the batch's own table: nothing
    /// is allocated up front for `max_slots`.
    slots: Vec<Option<SeqDecoder>>,
    max_slots: usize,
    /// The decoders after the step being made, committed once it is accepted.
    next: Vec<SeqDecoder>,
    pub pieces: Pieces,
}

impl BatchDecoder {
    pub fn new(vocab: Arc<Vocabulary>, max_slots: usize) -> Self {
        BatchDecoder {
            vocab,
            slots: Vec::new(),
            max_slots,
            next: Vec::new(),
            pieces: Pieces::default(),
        }
    }

    pub fn vocab(&self) -> &Arc<Vocabulary> {
        &self.vocab
    }

    /// Makes room for slot `slot` (doubling, up to `max_slots`), so that a
    /// later [`set`](Self::set) of it cannot fail; an out-of-range slot is
    /// left to the batch to reject.
    ///
    /// # Errors
    /// [`Error::Alloc`] when the table cannot grow (never an abort).
    pub fn reserve_slot(&mut self, slot: i64) -> Result<(), Error> {
        let Some(i) = usize::try_from(slot).ok().filter(|&i| i < self.max_slots) else {
            return Ok(());
        };
        if i < self.slots.len() {
            return Ok(());
        }
        let len = (i + 1).max(self.slots.len() * 2).min(self.max_slots);
        self.slots
            .try_reserve_exact(len - self.slots.len())
            .map_err(|_| Error::Alloc {
                what: format!("a decoder table of {len} slots (for slot {i})"),
            })?;
        self.slots.resize(len, None);
        Ok(())
    }

    /// Sets (or with `None` clears) slot `slot`'s decoder; a slot
    /// [`reserve_slot`](Self::reserve_slot) did not make room for is
    /// ignored (the batch rejects it). Clearing the top slots gives their
    /// memory back once the table is mostly empty.
    pub fn set(&mut self, slot: i64, dec: Option<SeqDecoder>) {
        if let Some(s) = usize::try_from(slot)
            .ok()
            .and_then(|i| self.slots.get_mut(i))
        {
            *s = dec;
        }
        if dec.is_none() {
            while matches!(self.slots.last(), Some(None)) {
                self.slots.pop();
            }
            if self.slots.capacity() > 2 * self.slots.len() + 64 {
                self.slots.shrink_to(self.slots.len());
            }
        }
    }

    pub fn get(&self, slot: i64) -> Option<&SeqDecoder> {
        usize::try_from(slot)
            .ok()
            .and_then(|i| self.slots.get(i))
            .and_then(Option::as_ref)
    }

    /// Decodes a batch step's ids into `self.pieces` (one piece per id)
    /// without changing any decoder. Slots that are out of range or empty
    /// get empty pieces: the batch's own check rejects them.
    ///
    /// # Errors
    /// As [`SeqDecoder::decode_run`], naming `token_ids[j] (slot s)`.
    pub fn decode_step(
        &mut self,
        slots: &[i64],
        ids: &[u32],
        runs: Option<&[usize]>,
        grammar: Option<&[i64]>,
    ) -> Result<(), Error> {
        self.pieces.clear();
        self.next.clear();
        let total = runs.map_or(Some(slots.len()), |r| {
            r.iter().try_fold(0usize, |a, &n| a.checked_add(n))
        });
        if total != Some(ids.len()) || runs.is_some_and(|r| r.len() != slots.len()) {
            return Ok(()); // the batch's check names the mismatch
        }
        self.vocab.check_decode_size(ids, "token_ids")?;
        let mut start = 0;
        for (k, &slot) in slots.iter().enumerate() {
            let len = runs.map_or(1, |r| r[k]);
            let run = &ids[start..start + len];
            let g = grammar
                .and_then(|g| g.get(k))
                .and_then(|&g| usize::try_from(g).ok());
            let d = usize::try_from(slot)
                .ok()
                .and_then(|i| self.slots.get(i))
                .copied()
                .flatten();
            match d {
                Some(d) => {
                    let n =
                        d.decode_run(&self.vocab, run, g, &mut self.pieces, start, Some(slot))?;
                    self.next.push(n);
                }
                None => {
                    self.pieces.reserve(len)?;
                    let end = self.pieces.buf.len();
                    self.pieces.ends.extend(std::iter::repeat(end).take(len));
                    self.pieces.plain.extend(std::iter::repeat(false).take(len));
                    self.pieces.flush.extend(std::iter::repeat(0).take(len));
                }
            }
            start += len;
        }
        Ok(())
    }

    /// Keeps the decoders [`decode_step`](Self::decode_step) computed, after
    /// the batch accepted the step.
    pub fn commit(&mut self, slots: &[i64]) {
        let mut next = self.next.iter();
        for &slot in slots {
            if let Some(d) = usize::try_from(slot)
                .ok()
                .and_then(|i| self.slots.get_mut(i))
                .and_then(Option::as_mut)
            {
                if let Some(n) = next.next() {
                    *d = *n;
                }
            }
        }
    }

    /// A step with token ids only: decodes them, then advances the batch
    /// exactly as [`FinishBatch::step_each`] with those pieces.
    ///
    /// # Errors
    /// As [`decode_step`](Self::decode_step) and [`FinishBatch::step`];
    /// nothing changes on error.
    pub fn step_each(
        &mut self,
        batch: &mut FinishBatch,
        slots: &[i64],
        ids: &[u32],
        runs: Option<&[usize]>,
        grammar: Option<&[i64]>,
        emit: impl FnMut(usize, &FinishTracker, &SlotStep),
    ) -> Result<(), Error> {
        self.decode_step(slots, ids, runs, grammar)?;
        let strs = self.pieces.strs();
        let input = StepInput::new(slots, ids)
            .runs(runs)
            .grammar(grammar)
            .flush_tails(Some(&self.pieces.flush));
        batch.step_each(input.texts(Some(&strs)), emit)?;
        self.commit(slots);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
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

    /// Ids only gives what the pieces give, and a run what single steps give.
    #[test]
    fn ids_only_equals_pieces_and_runs_equal_steps() {
        let v = vocab();
        let ids = [0u32, 1, 2, 3, 5, 1, 0, 4, 0];
        let mut by_ids = FinishBatch::new(2).unwrap();
        let mut dec = BatchDecoder::new(Arc::clone(&v), 2);
        let mut by_pieces = FinishBatch::new(2).unwrap();
        let mut by_run = FinishBatch::new(2).unwrap();
        let mut dec_run = BatchDecoder::new(Arc::clone(&v), 2);
        for b in [&mut by_ids, &mut by_pieces, &mut by_run] {
            b.add(1, params(None)).unwrap();
        }
        let opts = DecodeOptions::default();
        dec.reserve_slot(1).unwrap();
        dec.set(
            1,
            Some(SeqDecoder::new(&v, &params(None), &[], opts).unwrap()),
        );
        dec_run.reserve_slot(1).unwrap();
        dec_run.set(
            1,
            Some(SeqDecoder::new(&v, &params(None), &[], opts).unwrap()),
        );
        let mut st = v.start(opts);
        for &id in &ids {
            if by_ids.get(1).unwrap().is_finished() {
                break;
            }
            dec.step_each(&mut by_ids, &[1], &[id], None, None, |_, _, _| {})
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
        dec_run
            .step_each(
                &mut by_run,
                &[1],
                &ids,
                Some(&[ids.len()]),
                None,
                |_, _, _| {},
            )
            .unwrap();
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
        let v = vocab();
        let mut b = FinishBatch::new(1).unwrap();
        let mut dec = BatchDecoder::new(Arc::clone(&v), 1);
        b.add(0, Arc::clone(&p)).unwrap();
        dec.reserve_slot(0).unwrap();
        dec.set(
            0,
            Some(SeqDecoder::new(&v, &p, &[], DecodeOptions::default()).unwrap()),
        );
        dec.step_each(&mut b, &[0], ids, Some(&[ids.len()]), None, |_, _, _| {})
            .unwrap();
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
        let v = vocab();
        let mut b = FinishBatch::new(1).unwrap();
        let mut dec = BatchDecoder::new(Arc::clone(&v), 1);
        let p = params(Some(2));
        b.add(0, Arc::clone(&p)).unwrap();
        dec.reserve_slot(0).unwrap();
        dec.set(
            0,
            Some(SeqDecoder::new(&v, &p, &[1, 2], DecodeOptions::default()).unwrap()),
        );
        // Primed mid-character: the first output token completes it.
        let err = dec.step_each(&mut b, &[0], &[99], None, None, |_, _, _| {});
        assert!(err
            .unwrap_err()
            .to_string()
            .contains("token_ids[0]=99 is outside the vocabulary [0, 7) (slot 0)"));
        assert_eq!(dec.get(0).unwrap().state().pending(), &[0xE2, 0x82]);
        dec.step_each(&mut b, &[0], &[3, 1], Some(&[2]), None, |_, _, _| {})
            .unwrap();
        let t = b.get(0).unwrap();
        assert_eq!(t.text(), "€\u{FFFD}");
        assert_eq!(t.finish().unwrap().reason.as_str(), "length");
    }
}
