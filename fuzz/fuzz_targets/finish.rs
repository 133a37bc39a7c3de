//! The finish-state machine: no panic on any input, and step invariance.
//!
//! Random parameters (anything, valid or not: invalid ones must be rejected
//! with an error, never a panic; stop strings on either matcher engine, stop
//! regexes with end-of-text and word-boundary assertions), a random stream of
//! (token id, text piece) and a random split of it into accept runs. The same
//! stream is run
//!
//! * as single-token updates,
//! * as the random runs, through `FinishTracker::update`,
//! * as the random runs, through a `FinishBatch` slot next to a second slot,
//!
//! and all three must end in the same state (finish, text, kept tokens), with
//! the streamed deltas joining to the final text and tokens. Updating after a
//! finish must be an error that changes nothing.
#![no_main]

use std::sync::Arc;

use arbitrary::{Result, Unstructured};
use libfuzzer_sys::fuzz_target;
use stopline::stop_regex::StopRegexes;
use stopline::stop_strings::EngineKind;
use stopline::{FinishBatch, FinishTracker, Repetition, StepInput, StopParams, StopStrings};

const PIECES: [&str; 12] = [
    "", "a", "b", "ab", "END", "E", "ND", "é", "日本", "🙂", "\n", "x\u{301}",
];
const STOP_WORDS: [&str; 8] = ["END", "ab", "b", "日", "本🙂", "\n\n", "x\u{301}", "é"];
/// Over the pieces' alphabet: `$` and `(?-u:\b)` (decided at token
/// boundaries), `^`, repetition, alternation, classes.
const STOP_REGEXES: [&str; 7] = [
    r"a?b$",
    r"(?-u:\b)ab(?-u:\b)",
    r"日本+",
    r"E\w*D",
    r"\n\n+",
    r"(?m)^END|é$",
    r"x\x{301}|🙂{2}",
];
/// Refused at compile (empty match, Unicode `\b`, syntax), never a panic.
const BAD_REGEXES: [&str; 3] = ["a*", r"\bab", "(ab"];

// Fields are drawn one after another, some overwritten by later draws.
#[allow(clippy::field_reassign_with_default)]
fn params(u: &mut Unstructured<'_>) -> Result<StopParams> {
    let mut p = StopParams::default();
    // Wide ranges on purpose: zero, huge and inconsistent values must be
    // rejected by validate(), not crash.
    p.max_tokens = if u.arbitrary()? {
        Some(u.int_in_range(0..=48)?)
    } else {
        None
    };
    p.min_tokens = u.int_in_range(0..=8)?;
    if u.arbitrary()? {
        p.prompt_len = u.int_in_range(0..=20)?;
        p.max_model_len = Some(u.int_in_range(0..=60)?);
    }
    if u.ratio(1, 8)? {
        p.prompt_len = u.arbitrary()?;
        p.max_model_len = Some(u.arbitrary()?);
        p.max_tokens = Some(u.arbitrary()?);
    }
    let n = u.int_in_range(0..=2)?;
    p.eos_token_ids = (0..n)
        .map(|_| u.int_in_range(0..=20))
        .collect::<Result<_>>()?;
    p.ignore_eos = u.arbitrary()?;
    let n = u.int_in_range(0..=2)?;
    p.stop_token_ids = (0..n)
        .map(|_| u.int_in_range(0..=20))
        .collect::<Result<_>>()?;
    let n = u.int_in_range(0..=3)?;
    let stops: Vec<String> = (0..n)
        .map(|_| Ok(u.choose(&STOP_WORDS)?.to_string()))
        .collect::<Result<_>>()?;
    p.stop = Some(if u.arbitrary()? {
        Arc::new(StopStrings::with_engine(stops, EngineKind::Nfa).expect("the NFA builds"))
    } else {
        StopStrings::compile(stops).expect("non-empty stop strings compile")
    });
    let n = u.int_in_range(0..=2)?;
    let mut regexes: Vec<String> = (0..n)
        .map(|_| Ok(u.choose(&STOP_REGEXES)?.to_string()))
        .collect::<Result<_>>()?;
    if u.ratio(1, 16)? {
        let at = u.int_in_range(0..=regexes.len())?;
        regexes.insert(at, u.choose(&BAD_REGEXES)?.to_string());
        assert!(StopRegexes::compile(regexes).is_err());
    } else {
        p.stop_regex = Some(StopRegexes::compile(regexes).expect("valid stop regexes compile"));
    }
    p.include_stop_str_in_output = u.arbitrary()?;
    p.vocab_size = if u.arbitrary()? {
        Some(u.int_in_range(0..=18)?)
    } else {
        None
    };
    if u.arbitrary()? {
        p.repetition = Some(if u.ratio(1, 8)? {
            // Sizes near usize::MAX: products and sums must not overflow.
            Repetition {
                max_pattern_size: u.arbitrary()?,
                min_pattern_size: u.arbitrary()?,
                min_count: u.arbitrary()?,
            }
        } else {
            Repetition {
                max_pattern_size: u.int_in_range(0..=4)?,
                min_pattern_size: u.int_in_range(0..=4)?,
                min_count: u.int_in_range(0..=5)?,
            }
        });
    }
    if u.ratio(1, 16)? {
        p.min_tokens = u.arbitrary()?;
    }
    Ok(p)
}

type Outcome = (Option<stopline::Finish>, String, Vec<u32>, String, Vec<u32>);

fn run_tracker(
    p: &Arc<StopParams>,
    ids: &[u32],
    texts: &[&str],
    bounds: &[usize],
    grammar_at: Option<usize>,
) -> Outcome {
    let mut t = FinishTracker::new(Arc::clone(p)).expect("validated params");
    let (mut text, mut tokens) = (String::new(), Vec::new());
    let mut prev = 0;
    for &b in bounds {
        if t.is_finished() {
            // After a finish: an error, and nothing changes.
            let before = (t.text().to_string(), t.token_ids().to_vec());
            assert!(t
                .update(&ids[prev..b], Some(&texts[prev..b]), None)
                .is_err());
            assert_eq!(before, (t.text().to_string(), t.token_ids().to_vec()));
            break;
        }
        let g = grammar_at.filter(|&g| g >= prev && g < b).map(|g| g - prev);
        let s = t
            .update(&ids[prev..b], Some(&texts[prev..b]), g)
            .expect("consistent step");
        text.push_str(&t.text()[s.text_delta.clone()]);
        tokens.extend_from_slice(&t.token_ids()[s.token_ids_delta.clone()]);
        prev = b;
    }
    if !t.is_finished() {
        let s = t.abort();
        text.push_str(&t.text()[s.text_delta]);
        tokens.extend_from_slice(&t.token_ids()[s.token_ids_delta]);
    }
    // abort after a finish is a no-op.
    let s = t.abort();
    assert!(s.text_delta.is_empty() && s.token_ids_delta.is_empty());
    (
        t.finish(),
        t.text().to_string(),
        t.token_ids().to_vec(),
        text,
        tokens,
    )
}

fn run_batch(
    p: &Arc<StopParams>,
    ids: &[u32],
    texts: &[&str],
    bounds: &[usize],
    grammar_at: Option<usize>,
) -> Outcome {
    let mut b = FinishBatch::new(3).expect("3 slots");
    b.add(2, Arc::clone(p)).expect("validated params");
    b.add(0, Arc::new(StopParams::default()))
        .expect("default params");
    let (mut text, mut tokens) = (String::new(), Vec::new());
    let mut out = Vec::new();
    let mut prev = 0;
    for &end in bounds {
        if b.get(2).expect("slot 2").is_finished() {
            break;
        }
        let len = end - prev;
        let g = grammar_at
            .filter(|&g| g >= prev && g < end)
            .map_or(-1, |g| (g - prev) as i64);
        // Slot 0 takes a one-token step alongside: it must not disturb slot 2.
        let mut step_ids = vec![7u32];
        step_ids.extend_from_slice(&ids[prev..end]);
        let mut step_texts = vec!["z"];
        step_texts.extend_from_slice(&texts[prev..end]);
        out.clear();
        let (runs, grammar) = ([1, len], [-1, g]);
        let input = StepInput::new(&[0, 2], &step_ids)
            .runs(Some(&runs))
            .grammar(Some(&grammar));
        b.step(input.texts(Some(&step_texts)), &mut out)
            .expect("consistent batch step");
        let t = b.get(2).expect("slot 2");
        let row = &out[1];
        assert_eq!(row.slot, 2);
        text.push_str(&t.text()[row.step.text_delta.clone()]);
        tokens.extend_from_slice(&t.token_ids()[row.step.token_ids_delta.clone()]);
        prev = end;
    }
    let t = b.get_mut(2).expect("slot 2");
    if !t.is_finished() {
        let s = t.abort();
        text.push_str(&t.text()[s.text_delta]);
        tokens.extend_from_slice(&t.token_ids()[s.token_ids_delta]);
    }
    let t = b.remove(2).expect("slot 2");
    assert_eq!(
        b.get(0).expect("slot 0").text().len(),
        bounds_used(bounds, prev)
    );
    (
        t.finish(),
        t.text().to_string(),
        t.token_ids().to_vec(),
        text,
        tokens,
    )
}

/// Steps slot 0 took ("z" each): the bounds up to and including `last`.
fn bounds_used(bounds: &[usize], last: usize) -> usize {
    bounds.iter().take_while(|&&b| b <= last).count()
}

/// A batch step with arbitrary (mostly inconsistent) arguments: an error or
/// a step, never a panic; a rejected step leaves every slot as it was.
fn malformed_batch_step(u: &mut Unstructured<'_>, p: &Arc<StopParams>) -> Result<()> {
    let mut b = FinishBatch::new(u.int_in_range(0..=4)?).expect("at most 4 slots");
    for slot in 0..b.max_slots() as i64 {
        if u.arbitrary()? {
            let _ = b.add(slot, Arc::clone(p));
        }
    }
    let n = u.int_in_range(0..=5)?;
    let slots: Vec<i64> = (0..n)
        .map(|_| {
            Ok(if u.ratio(1, 4)? {
                u.arbitrary()?
            } else {
                u.int_in_range(-1..=4)?
            })
        })
        .collect::<Result<_>>()?;
    let runs: Option<Vec<usize>> = if u.arbitrary()? {
        let k = if u.ratio(1, 8)? { n + 1 } else { n };
        Some(
            (0..k)
                .map(|_| {
                    Ok(if u.ratio(1, 4)? {
                        u.arbitrary()?
                    } else {
                        u.int_in_range(0..=3)?
                    })
                })
                .collect::<Result<_>>()?,
        )
    } else {
        None
    };
    let n_ids = u.int_in_range(0..=12)?;
    let ids: Vec<u32> = (0..n_ids).map(|_| u.arbitrary()).collect::<Result<_>>()?;
    let texts: Option<Vec<&str>> = if u.arbitrary()? {
        let k = if u.ratio(1, 8)? { n_ids + 1 } else { n_ids };
        Some(
            (0..k)
                .map(|_| u.choose(&PIECES).copied())
                .collect::<Result<_>>()?,
        )
    } else {
        None
    };
    let grammar: Option<Vec<i64>> = if u.arbitrary()? {
        Some((0..n).map(|_| u.arbitrary()).collect::<Result<_>>()?)
    } else {
        None
    };
    let before: Vec<Option<(String, Vec<u32>)>> = (0..b.max_slots() as i64)
        .map(|s| {
            b.get(s)
                .ok()
                .map(|t| (t.text().to_string(), t.token_ids().to_vec()))
        })
        .collect();
    let mut out = Vec::new();
    let input = StepInput {
        slots: &slots,
        token_ids: &ids,
        run_lengths: runs.as_deref(),
        texts: texts.as_deref(),
        grammar_terminated_at: grammar.as_deref(),
        flush_tails: None,
    };
    let r = b.step(input, &mut out);
    if r.is_err() {
        let after: Vec<Option<(String, Vec<u32>)>> = (0..b.max_slots() as i64)
            .map(|s| {
                b.get(s)
                    .ok()
                    .map(|t| (t.text().to_string(), t.token_ids().to_vec()))
            })
            .collect();
        assert_eq!(before, after, "a rejected step changed a slot");
        assert!(out.is_empty());
    }
    Ok(())
}

fuzz_target!(|data: &[u8]| {
    let mut u = Unstructured::new(data);
    let Ok(p) = params(&mut u) else { return };
    let p = Arc::new(p);
    if FinishTracker::new(Arc::clone(&p)).is_err() {
        // Rejected parameters: the batch must reject them the same way.
        assert!(FinishBatch::new(1).expect("1 slot").add(0, p).is_err());
        return;
    }
    if u.ratio(1, 4).unwrap_or(false) {
        let _ = malformed_batch_step(&mut u, &p);
        return;
    }
    let Ok(n) = u.int_in_range(1..=40usize) else {
        return;
    };
    let mut ids = Vec::with_capacity(n);
    let mut texts = Vec::with_capacity(n);
    for _ in 0..n {
        let Ok(id) = u.int_in_range(0..=20u32) else {
            return;
        };
        let Ok(piece) = u.choose(&PIECES) else { return };
        ids.push(id);
        texts.push(*piece);
    }
    let grammar_at = match u.arbitrary::<bool>() {
        Ok(true) => u.int_in_range(0..=n - 1).ok(),
        _ => None,
    };
    let mut bounds: Vec<usize> = (0..u.int_in_range(0..=8usize).unwrap_or(0))
        .filter_map(|_| u.int_in_range(1..=n).ok())
        .collect();
    bounds.push(n);
    bounds.sort_unstable();
    bounds.dedup();
    let singles: Vec<usize> = (1..=n).collect();

    let one = run_tracker(&p, &ids, &texts, &singles, grammar_at);
    let runs = run_tracker(&p, &ids, &texts, &bounds, grammar_at);
    let batch = run_batch(&p, &ids, &texts, &bounds, grammar_at);
    assert_eq!(one, runs, "single-token updates vs accept runs");
    assert_eq!(one, batch, "single-token updates vs FinishBatch runs");
    // The streamed deltas join to the final text and tokens.
    assert_eq!(one.1, one.3);
    assert_eq!(one.2, one.4);
    // Kept tokens are a prefix of the stream; kept text a prefix of the pieces.
    assert_eq!(&ids[..one.2.len()], &one.2[..]);
    let all: String = texts[..one.2.len()].concat();
    assert!(all.starts_with(&one.1));
});
