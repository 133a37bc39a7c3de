//! Snapshot bytes are untrusted input: restoring any bytes ends in a value or
//! an error, never a panic, and a restored tracker is one the params allow.
//!
//! A valid snapshot is taken after a random stream (with or without a
//! decoder over a small byte-level vocabulary; half the time with reasoning
//! channels, a thinking budget and a tool-call span), then changed by the input:
//! cut, bytes overwritten, bytes appended, and, half the time, resealed (body
//! length and checksum fixed) so that the field checks behind the checksum
//! are reached. Whatever restores must snapshot again, restore from that to
//! the same bytes, and take more steps without a panic.
#![no_main]

use std::sync::{Arc, OnceLock};

use arbitrary::{Result, Unstructured};
use libfuzzer_sys::fuzz_target;
use stopline::detok_batch::SeqDecoder;
use stopline::reasoning::{Channel, Marker, Reasoning, ReasoningSpec};
use stopline::snapshot::{reseal, restore, snapshot};
use stopline::stop_regex::StopRegexes;
use stopline::{DecodeOptions, FinishTracker, StopParams, StopStrings, Vocabulary};

const PIECES: [&str; 14] = [
    "", "a", "b", "ab", "xy", "é", "日本", "\n", "<think>", "<th", "ink>", "</think>", "<tc>",
    "</tc>",
];

fn vocab() -> &'static Vocabulary {
    static V: OnceLock<Vocabulary> = OnceLock::new();
    // Byte-level: "Ã" "©" are the two bytes of "é".
    V.get_or_init(|| {
        let json = r#"{"model": {"type": "BPE", "vocab": {"a": 0, "b": 1, "Ã": 2, "©": 3, "xy": 4}},
                       "decoder": {"type": "ByteLevel"}}"#;
        Vocabulary::from_json(json.as_bytes()).expect("a valid tokenizer.json")
    })
}

fn params(u: &mut Unstructured<'_>) -> Result<Arc<StopParams>> {
    let mut p = StopParams {
        max_tokens: Some(u.int_in_range(2..=40)?),
        min_tokens: u.int_in_range(0..=2)?,
        stop: Some(StopStrings::compile_strs(&["ab", "日本", "\n\n"]).expect("valid stops")),
        stop_regex: if u.arbitrary()? {
            Some(StopRegexes::compile(vec![r"x+y".into(), r"(?s).*zz".into()]).expect("valid"))
        } else {
            None
        },
        include_stop_str_in_output: u.arbitrary()?,
        token_aligned: u.arbitrary()?,
        eos_token_ids: vec![7],
        vocab_size: Some(8),
        ..StopParams::default()
    };
    // Half the time reasoning channels (text markers, or ids 5 and 6 with a
    // budget) and, sometimes, a tool-call span.
    if u.arbitrary()? {
        let marker = |text: &str, id: Option<u32>| Marker {
            text: Some(text.into()),
            token_id: id,
        };
        let ids = u.arbitrary::<bool>()?;
        let mut spec = ReasoningSpec {
            start: marker("<think>", ids.then_some(5)),
            end: marker("</think>", ids.then_some(6)),
            keep_markers: u.arbitrary()?,
            max_reasoning_tokens: if ids {
                Some(u.int_in_range(0..=3)?)
            } else {
                None
            },
            starts_in: if u.arbitrary()? {
                Some(Channel::Reasoning)
            } else {
                None
            },
            ..ReasoningSpec::default()
        };
        if u.arbitrary()? {
            spec.spans = vec![[marker("<tc>", None), marker("</tc>", None)]];
        }
        if let Ok(r) = Reasoning::new(
            spec,
            p.stop.as_ref(),
            p.stop_regex.as_ref(),
            &[],
            &p.eos_token_ids,
        ) {
            p.reasoning = Some(Arc::new(r));
        }
    }
    Ok(Arc::new(p))
}

fn run(u: &mut Unstructured<'_>) -> Result<()> {
    let p = params(u)?;
    let with_vocab = u.arbitrary::<bool>()?;
    let v = vocab();
    let mut t = FinishTracker::new(Arc::clone(&p)).expect("valid params");
    let mut dec = SeqDecoder::new(v, &p, &[], DecodeOptions::default()).expect("no prompt");
    for _ in 0..u.int_in_range(0..=12)? {
        if t.is_finished() {
            break;
        }
        let id = u.int_in_range(0..=7)?;
        if with_vocab {
            if id < 5 {
                let _ = dec.update(v, &mut t, &[id], None);
            }
        } else {
            let piece = PIECES[u.choose_index(PIECES.len())?];
            let _ = t.update(&[id], Some(&[piece]), None);
        }
    }
    let dv = with_vocab.then_some((v, &dec));
    let mut data = snapshot(&t, dv).expect("no reasoning, small");
    for _ in 0..u.int_in_range(0..=4)? {
        match u.int_in_range(0..=2)? {
            0 => data.truncate(u.int_in_range(0..=data.len())?),
            1 if !data.is_empty() => {
                let i = u.choose_index(data.len())?;
                data[i] = u.arbitrary()?;
            }
            _ => data.extend_from_slice(&[u.arbitrary()?; 3]),
        }
    }
    if u.arbitrary()? {
        reseal(&mut data);
    }
    let vocab_arg = with_vocab.then_some(v);
    let Ok((mut back, back_dec)) = restore(Arc::clone(&p), &data, vocab_arg) else {
        return Ok(());
    };
    let again =
        snapshot(&back, vocab_arg.zip(back_dec.as_ref())).expect("restored state snapshots");
    let (t2, d2) = restore(Arc::clone(&p), &again, vocab_arg).expect("its own snapshot restores");
    assert_eq!(snapshot(&t2, vocab_arg.zip(d2.as_ref())).ok(), Some(again));
    let piece = PIECES[u.choose_index(PIECES.len())?];
    match back_dec {
        Some(mut d) => {
            let _ = d.update(v, &mut back, &[u.int_in_range(0..=4)?], None);
        }
        None => {
            let _ = back.update(&[u.int_in_range(0..=7)?], Some(&[piece]), None);
        }
    }
    back.abort();
    Ok(())
}

fuzz_target!(|data: &[u8]| {
    let _ = run(&mut Unstructured::new(data));
});
