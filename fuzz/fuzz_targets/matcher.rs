//! The incremental stop-string matcher against a naive reference.
//!
//! Random stop lists, random text and a random chunking of that text. After
//! every `feed`, the reported match (end, index, start, truncate_to) must be
//! the naive answer (the earliest-ending stop string that ends inside the new
//! chunk, ties to the lowest index) and `holdback` must be the longest suffix
//! of the text fed so far that is a proper prefix of some stop string. The
//! stateless `check` is compared too. Every input runs on both engines (the
//! dense DFA and the crate's NFA). Half the inputs draw from a small
//! alphabet (so stop strings overlap and match often, with multi-byte and
//! combining characters); the other half are arbitrary Unicode.
#![no_main]

use std::sync::Arc;

use arbitrary::{Arbitrary, Result, Unstructured};
use libfuzzer_sys::fuzz_target;
use stopline::stop_strings::EngineKind;
use stopline::StopStrings;

const ALPHABET: [char; 8] = ['a', 'b', 'c', 'é', '日', '🙂', '\u{301}', '\n'];

fn small_string(u: &mut Unstructured<'_>, min: usize, max: usize) -> Result<Vec<char>> {
    let n = u.int_in_range(min..=max)?;
    (0..n).map(|_| Ok(*u.choose(&ALPHABET)?)).collect()
}

fn any_string(u: &mut Unstructured<'_>, min: usize) -> Result<Vec<char>> {
    let mut s: Vec<char> = String::arbitrary(u)?.chars().take(64).collect();
    while s.len() < min {
        s.push(char::arbitrary(u)?);
    }
    Ok(s)
}

struct Case {
    stops: Vec<Vec<char>>,
    text: Vec<char>,
    cuts: Vec<usize>,
    include: bool,
}

fn case(u: &mut Unstructured<'_>) -> Result<Case> {
    let small = u.arbitrary::<bool>()?;
    let n_stops = u.int_in_range(0..=8)?;
    let mut stops = Vec::with_capacity(n_stops);
    for _ in 0..n_stops {
        stops.push(if small {
            small_string(u, 1, 6)?
        } else {
            any_string(u, 1)?
        });
    }
    let text = if small {
        small_string(u, 0, 96)?
    } else {
        // Arbitrary text, with a stop string spliced in now and then.
        let mut t = any_string(u, 0)?;
        if let (Some(s), true) = (stops.first(), u.arbitrary::<bool>()?) {
            let at = u.int_in_range(0..=t.len())?;
            t.splice(at..at, s.iter().copied());
        }
        t
    };
    let n_cuts = u.int_in_range(0..=12)?;
    let mut cuts = Vec::with_capacity(n_cuts + 1);
    for _ in 0..n_cuts {
        cuts.push(u.int_in_range(0..=text.len())?);
    }
    cuts.push(text.len());
    cuts.sort_unstable();
    Ok(Case {
        stops,
        text,
        cuts,
        include: u.arbitrary()?,
    })
}

/// The first (end, index) of a stop string ending in text[from..], in code points.
fn naive_first(text: &[char], from: usize, stops: &[Vec<char>]) -> Option<(usize, usize)> {
    (from + 1..=text.len()).find_map(|end| {
        stops
            .iter()
            .position(|s| s.len() <= end && text[end - s.len()..end] == s[..])
            .map(|i| (end, i))
    })
}

fn naive_holdback(text: &[char], stops: &[Vec<char>]) -> usize {
    stops
        .iter()
        .filter_map(|s| {
            (1..s.len())
                .rev()
                .find(|&k| k <= text.len() && text[text.len() - k..] == s[..k])
        })
        .max()
        .unwrap_or(0)
}

fuzz_target!(|data: &[u8]| {
    let mut u = Unstructured::new(data);
    let Ok(c) = case(&mut u) else { return };
    check(&c, EngineKind::Dfa);
    check(&c, EngineKind::Nfa);
});

fn check(c: &Case, kind: EngineKind) {
    let stop_strs: Vec<String> = c.stops.iter().map(|s| s.iter().collect()).collect();
    // At most 8 strings of 64 code points: the dense table fits its bound.
    let compiled = Arc::new(StopStrings::with_engine(stop_strs, kind).expect("both engines build"));
    let mut m = compiled.matcher(c.include);
    let mut prev = 0;
    for &cut in &c.cuts {
        let delta: String = c.text[prev..cut].iter().collect();
        let got = m.feed(&delta);
        let want = naive_first(&c.text[..cut], prev, &c.stops);
        assert_eq!(
            got.map(|h| (h.end, h.index)),
            want,
            "first match of feed #{cut} on {kind:?}"
        );
        if let Some(h) = got {
            assert_eq!(h.start, h.end - c.stops[h.index].len());
            assert_eq!(h.truncate_to, if c.include { h.end } else { h.start });
        }
        let hold = if c.include {
            0
        } else {
            naive_holdback(&c.text[..cut], &c.stops)
        };
        assert_eq!(
            m.holdback(),
            hold,
            "holdback after {cut} code points on {kind:?}"
        );
        assert_eq!(m.chars_fed(), cut);

        // The stateless check on the same prefix, new text = this chunk.
        let prefix: String = c.text[..cut].iter().collect();
        let stateless = compiled
            .check(&prefix, cut, cut - prev, c.include)
            .expect("new_char_count within the text");
        let want_stateless = want.map(|(end, i)| {
            let off = if c.include {
                if end == cut {
                    -1
                } else {
                    end as isize
                }
            } else {
                (end - c.stops[i].len()) as isize
            };
            (i, off)
        });
        assert_eq!(stateless, want_stateless);
        prev = cut;
    }
    // Out-of-range new_char_count is an error, never a panic.
    let all: String = c.text.iter().collect();
    assert!(compiled
        .check(&all, c.text.len(), c.text.len() + 1, false)
        .is_err());
}
