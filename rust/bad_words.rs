//! `bad_words` of one logits-constraints request, validated and laid out as
//! the tables `stopline.logits.LogitsConstraints.set` copies to the device.
//!
//! A one-token word is a static ban; a longer word bans its last token when
//! its other tokens (the prefix) equal the tail of the output (as vLLM's
//! bad-words processor does). Input is one flat id array plus word ends, so
//! a request at the caps (1024 words of 64 tokens) is two allocations, and
//! validation plus layout is linear in the ids and runs without the GIL.

use rustc_hash::FxHashSet;

use crate::error::{Error, Problem};

const FIELD: &str = "bad_words";

/// The tables of one request, ids as int32 (every id is in
/// `[0, vocab_size)` with `vocab_size < 2**31`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct BadWordsTable {
    /// Distinct one-token words, first occurrence first.
    pub single: Vec<i32>,
    /// Distinct multi-token words, first occurrence first: their prefixes,
    /// `multi x width` row-major, each row padded with -1.
    pub prefix: Vec<i32>,
    /// Prefix length of each multi-token word (`multi` entries, >= 1).
    pub prefix_len: Vec<i32>,
    /// Last token of each multi-token word.
    pub last: Vec<i32>,
    /// Row width of `prefix`: the longest prefix (0 when there is no
    /// multi-token word).
    pub width: usize,
}

impl BadWordsTable {
    /// Number of distinct multi-token words.
    pub fn multi(&self) -> usize {
        self.last.len()
    }
}

/// `Err` naming `bad_words` for the first id of `ids` outside
/// `[0, vocab_size)`, as the whole request would report it.
pub fn check_ids(ids: &[i64], vocab_size: u32) -> Result<(), Error> {
    match ids
        .iter()
        .find(|&&v| !(0..i64::from(vocab_size)).contains(&v))
    {
        Some(v) => Err(Error::param(
            FIELD,
            Problem::IdNotInVocab {
                shown: v.to_string(),
                vocab_size: vocab_size.into(),
            },
        )),
        None => Ok(()),
    }
}

/// `Err` for a word of `n` tokens over `max_tokens`, as a too-long read
/// reports it.
pub fn check_word_len(n: usize, max_tokens: usize) -> Result<(), Error> {
    crate::limits::check_count(FIELD, n, max_tokens)
}

/// Validates the words `ids[ends[i-1]..ends[i]]` (ids in `[0, vocab_size)`,
/// 1 to `max_tokens` tokens each, at most `max_words` words, the caps of
/// `stopline.logits.LIMITS`; errors name the
/// first bad word in order, as reading them one by one would) and lays them
/// out: one-token words deduplicated, multi-token words deduplicated (whole
/// word compared) into a padded prefix table. `ends` must be non-decreasing
/// and end at `ids.len()`. Time and memory are linear in `ids.len()`.
pub fn build(
    ids: &[i64],
    ends: &[usize],
    vocab_size: u32,
    max_words: usize,
    max_tokens: usize,
) -> Result<BadWordsTable, Error> {
    crate::limits::check_count(FIELD, ends.len(), max_words)?;
    debug_assert_eq!(ends.last().copied().unwrap_or(0), ids.len());
    let mut start = 0;
    let (mut n_single, mut n_multi, mut width) = (0, 0, 0);
    for &end in ends {
        let word = &ids[start..end];
        check_word_len(word.len(), max_tokens)?;
        check_ids(word, vocab_size)?;
        match word.len() {
            0 => return Err(Error::param(FIELD, Problem::EmptyWord)),
            1 => n_single += 1,
            n => {
                n_multi += 1;
                width = width.max(n - 1);
            }
        }
        start = end;
    }
    let alloc = |what: &str, n: usize| -> Result<Vec<i32>, Error> {
        let mut v = Vec::new();
        v.try_reserve_exact(n).map_err(|_| Error::Alloc {
            what: format!("the {what} table of bad_words ({n} ids)"),
        })?;
        Ok(v)
    };
    let mut out = BadWordsTable {
        single: alloc("one-token", n_single)?,
        prefix: alloc("prefix", n_multi * width)?,
        prefix_len: alloc("prefix-length", n_multi)?,
        last: alloc("last-token", n_multi)?,
        width,
    };
    let mut seen_single = FxHashSet::default();
    seen_single.reserve(n_single);
    let mut seen_multi: FxHashSet<&[i64]> = FxHashSet::default();
    seen_multi.reserve(n_multi);
    let mut start = 0;
    for &end in ends {
        let word = &ids[start..end];
        start = end;
        // Every id was checked to lie in [0, vocab_size) and vocab_size
        // fits u32, so the casts below are exact for vocab_size < 2**31
        // (the Python caller's bound).
        if let [id] = word {
            if seen_single.insert(*id) {
                out.single.push(*id as i32);
            }
        } else if seen_multi.insert(word) {
            let (pre, last) = word.split_at(word.len() - 1);
            out.prefix.extend(pre.iter().map(|&v| v as i32));
            out.prefix.resize(out.prefix.len() + width - pre.len(), -1);
            out.prefix_len.push(pre.len() as i32);
            out.last.push(last[0] as i32);
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    // The caps of `stopline.logits.LIMITS`, which the binding passes in.
    const MAX_BAD_WORDS: usize = 1024;
    const MAX_BAD_WORD_TOKENS: usize = 64;

    fn words(ws: &[&[i64]]) -> (Vec<i64>, Vec<usize>) {
        let mut ids = Vec::new();
        let mut ends = Vec::new();
        for w in ws {
            ids.extend_from_slice(w);
            ends.push(ids.len());
        }
        (ids, ends)
    }

    fn table(ws: &[&[i64]]) -> Result<BadWordsTable, Error> {
        let (ids, ends) = words(ws);
        build(&ids, &ends, 100, MAX_BAD_WORDS, MAX_BAD_WORD_TOKENS)
    }

    #[test]
    fn splits_dedupes_and_pads_in_first_occurrence_order() {
        let t = table(&[
            &[7],
            &[1, 2, 3],
            &[5],
            &[7],
            &[4, 9],
            &[1, 2, 3],
            &[1, 2, 4],
        ])
        .unwrap();
        assert_eq!(t.single, vec![7, 5]);
        assert_eq!(t.width, 2);
        assert_eq!(t.multi(), 3);
        assert_eq!(t.prefix, vec![1, 2, 4, -1, 1, 2]);
        assert_eq!(t.prefix_len, vec![2, 1, 2]);
        assert_eq!(t.last, vec![3, 9, 4]);
    }

    #[test]
    fn no_words_and_only_single_words_have_no_prefix_table() {
        assert_eq!(table(&[]).unwrap(), BadWordsTable::default());
        let t = table(&[&[3], &[3], &[0], &[99]]).unwrap();
        assert_eq!((t.multi(), t.width, t.single), (0, 0, vec![3, 0, 99]));
    }

    #[test]
    fn errors_name_the_first_bad_word_in_order() {
        let msg = |ws: &[&[i64]]| table(ws).unwrap_err().to_string();
        assert_eq!(
            msg(&[&[1], &[2, 100], &[]]),
            "bad_words: token id 100 is outside [0, vocab_size=100)"
        );
        assert_eq!(
            msg(&[&[1], &[], &[-1]]),
            "bad_words: an empty word bans nothing; remove it"
        );
        assert_eq!(
            msg(&[&[-5, 1]]),
            "bad_words: token id -5 is outside [0, vocab_size=100)"
        );
        let long = vec![1; MAX_BAD_WORD_TOKENS + 1];
        assert_eq!(
            msg(&[&long, &[100]]),
            "bad_words has 65 entries; at most 64 are accepted"
        );
        let (ids, ends) = words(&[&[1][..]; 5]);
        assert_eq!(
            build(&ids, &ends, 100, 4, 64).unwrap_err().to_string(),
            "bad_words has 5 entries; at most 4 are accepted"
        );
    }

    #[test]
    fn a_request_at_the_caps_is_laid_out_whole() {
        let ids: Vec<i64> = (0..(MAX_BAD_WORDS * MAX_BAD_WORD_TOKENS) as i64)
            .map(|i| i % 50_000)
            .collect();
        let ends: Vec<usize> = (1..=MAX_BAD_WORDS)
            .map(|i| i * MAX_BAD_WORD_TOKENS)
            .collect();
        let t = build(&ids, &ends, 50_000, MAX_BAD_WORDS, MAX_BAD_WORD_TOKENS).unwrap();
        assert_eq!(
            (t.multi(), t.width),
            (MAX_BAD_WORDS, MAX_BAD_WORD_TOKENS - 1)
        );
        assert_eq!(t.prefix.len(), MAX_BAD_WORDS * (MAX_BAD_WORD_TOKENS - 1));
        assert_eq!(t.last[1], (2 * MAX_BAD_WORD_TOKENS - 1) as i32);
        assert_eq!(
            t.prefix[MAX_BAD_WORD_TOKENS - 1],
            MAX_BAD_WORD_TOKENS as i32
        );
    }
}
