//! The detokenizer: no input panics, and ByteLevel decoding one id at a time
//! equals `String::from_utf8_lossy` of all the ids' bytes.
//!
//! Half the inputs are arbitrary bytes read as a `tokenizer.json` (they must
//! build or be refused, never panic) and then decoded with arbitrary ids. The
//! other half build a ByteLevel vocabulary of random tokens over a small
//! alphabet of byte-level characters (bytes that start, continue or break
//! UTF-8 sequences), decode a random id stream step by step with a flush at
//! the end, and compare with the lossy decoding of the concatenated bytes.
#![no_main]

use arbitrary::{Result, Unstructured};
use libfuzzer_sys::fuzz_target;
use stopline::{DecodeOptions, Vocabulary};

// Byte-level chars for: 'a', ' ', 0xC3, 0xA9, 0xE2, 0x82, 0xAC, 0xF0, 0x9F, 0xFF.
const ALPHABET: [char; 10] = ['a', 'Ġ', 'Ã', '©', 'â', 'Ĥ', '¬', 'ð', 'Ł', 'ÿ'];
const BYTES: [u8; 10] = [b'a', b' ', 0xC3, 0xA9, 0xE2, 0x82, 0xAC, 0xF0, 0x9F, 0xFF];

fn run(u: &mut Unstructured<'_>) -> Result<()> {
    if u.arbitrary::<bool>()? {
        let json: Vec<u8> = u.arbitrary()?;
        if let Ok(v) = Vocabulary::from_json(&json) {
            let ids: Vec<u32> = u.arbitrary()?;
            let opts = DecodeOptions {
                skip_special_tokens: u.arbitrary()?,
                spaces_between_special_tokens: u.arbitrary()?,
            };
            let _ = v.decode(&ids, opts);
        }
        return Ok(());
    }
    // Distinct tokens; a bounded number of draws (an exhausted input draws
    // the same token forever).
    let mut tokens: Vec<Vec<usize>> = Vec::new();
    for _ in 0..u.int_in_range(1..=24)? {
        let len = u.int_in_range(1..=4)?;
        let t: Vec<usize> = (0..len)
            .map(|_| u.int_in_range(0..=9))
            .collect::<Result<_>>()?;
        if !tokens.contains(&t) {
            tokens.push(t);
        }
    }
    let n = tokens.len();
    let mut vocab = String::from("{");
    for (i, t) in tokens.iter().enumerate() {
        let s: String = t.iter().map(|&k| ALPHABET[k]).collect();
        vocab.push_str(&format!("{}\"{s}\": {i}", if i > 0 { ", " } else { "" }));
    }
    vocab.push('}');
    let json = format!(r#"{{"model": {{"vocab": {vocab}}}, "decoder": {{"type": "ByteLevel"}}}}"#);
    let v = Vocabulary::from_json(json.as_bytes()).expect("a valid ByteLevel vocabulary");
    let ids: Vec<u32> = (0..u.int_in_range(0..=24)?)
        .map(|_| u.int_in_range(0..=n as u32 - 1))
        .collect::<Result<_>>()?;
    let mut st = v.start(DecodeOptions::default());
    let mut out = String::new();
    let mut bytes = Vec::new();
    for &id in &ids {
        v.step(&mut st, id, &mut out);
        bytes.extend(tokens[id as usize].iter().map(|&k| BYTES[k]));
    }
    v.flush(&mut st, &mut out);
    assert_eq!(out, String::from_utf8_lossy(&bytes));
    assert_eq!(out, v.decode(&ids, DecodeOptions::default()).unwrap());
    Ok(())
}

fuzz_target!(|data: &[u8]| {
    let _ = run(&mut Unstructured::new(data));
});
