//! Ids-only steps: one sequence's [`DecodeState`] beside its finish
//! tracker, turning a step's token ids into the text pieces the tracker
//! takes (what an engine's streaming detokenizer would have produced).
//! `FinishBatch` (`rust/batch.rs`) keeps one in each slot.
//!
//! Decoding never changes state until the finish step accepted the pieces,
//! so a rejected step leaves decoders and trackers as they were.

use crate::detokenize::{DecodeOptions, DecodeState, Vocabulary};
use crate::error::{Error, Problem};
use crate::finish::{FinishTracker, Step, StopParams};

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

    /// Output tokens left before the length cap.
    pub(crate) fn left(&self) -> u64 {
        self.left
    }

    /// This decoder in `state` with `left` tokens left (a snapshot's restore).
    pub(crate) fn with_state(self, state: DecodeState, left: u64) -> Self {
        SeqDecoder {
            state,
            left,
            ..self
        }
    }

    /// [`FinishTracker::update`] with token ids only: decodes them, advances
    /// `tracker` with the pieces and keeps the decoder after the run only if
    /// the update was accepted.
    ///
    /// # Errors
    /// As [`decode_run`](Self::decode_run) and [`FinishTracker::update`];
    /// nothing changes on error.
    pub fn update(
        &mut self,
        vocab: &Vocabulary,
        tracker: &mut FinishTracker,
        ids: &[u32],
        grammar: Option<usize>,
    ) -> Result<Step, Error> {
        vocab.check_decode_size(ids, "token_ids")?;
        let mut pieces = Pieces::default();
        pieces.reserve(ids.len())?;
        let next = self.decode_run(vocab, ids, grammar, &mut pieces, 0, None)?;
        let step = tracker.update_flushed(ids, Some(&pieces.strs()), grammar, &pieces.flush)?;
        *self = next;
        Ok(step)
    }

    /// Decodes one run, appending one piece per id to `out`; returns the decoder after the run (self is unchanged).
    /// `grammar` is the run index at which the grammar terminates; errors
    /// name `token_ids[offset + i]` and the slot. The caller has made room
    /// in `out` for the run's pieces ([`Pieces::reserve`]; once per batch
    /// step, not per run), so that no allocation here can abort.
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
    pub fn reserve(&mut self, n: usize) -> Result<(), Error> {
        let oom = |_| Error::Alloc {
            what: format!("the bookkeeping of {n} text pieces"),
        };
        self.ends.try_reserve(n).map_err(oom)?;
        self.plain.try_reserve(n).map_err(oom)?;
        self.flush.try_reserve(n).map_err(oom)
    }

    pub(crate) fn clear(&mut self) {
        self.buf.clear();
        self.ends.clear();
        self.plain.clear();
        self.flush.clear();
    }

    /// The pieces, in order.
    pub fn iter(&self) -> impl Iterator<Item = &str> {
        let mut start = 0;
        self.ends.iter().map(move |&e| {
            let s = &self.buf[start..e];
            start = e;
            s
        })
    }

    /// The pieces as string slices.
    pub fn strs(&self) -> Vec<&str> {
        self.iter().collect()
    }

    /// `n` empty pieces (a slot the step's check will reject).
    pub(crate) fn push_empty(&mut self, n: usize) -> Result<(), Error> {
        self.reserve(n)?;
        let end = self.buf.len();
        self.ends.extend(std::iter::repeat(end).take(n));
        self.plain.extend(std::iter::repeat(false).take(n));
        self.flush.extend(std::iter::repeat(0).take(n));
        Ok(())
    }
}
