//! A dense Aho-Corasick DFA built directly from a short stop list.
//!
//! [`StopStrings`](crate::stop_strings::StopStrings) uses this for lists of up
//! to [`DFA_MAX_PATTERN_BYTES`](crate::stop_strings::DFA_MAX_PATTERN_BYTES)
//! bytes and the `aho-corasick` crate's contiguous NFA above that. The reason
//! is set-up time: a stop list is compiled whenever a request brings one the
//! cache has not seen, and the crate's builders pay a fixed cost (general
//! match kinds, prefilters, sparse-then-dense NFA) that dominates for the
//! dozen short strings a request carries: about 120 µs for its DFA and 25 µs
//! for its bare NFA on 16 chat stops, against a few µs here. The tables built
//! here hold exactly what the matcher needs and nothing else:
//!
//! * **Transitions**: one row of `stride` `u32` entries per state (stride = the
//!   number of byte classes rounded up to a power of two; every byte that
//!   occurs in some stop string is its own class, all others share class 0).
//!   An entry is the next state's row offset with bit 0 set when that state
//!   completes some stop string, so the scan loop tests for a match on the
//!   entry it already loaded.
//! * **Matches**: per state, the lowest list index among the stop strings
//!   ending there (the state's own string and every suffix of it on the
//!   failure chain), which is the tie rule of
//!   [`StopMatcher::feed`](crate::stop_strings::StopMatcher::feed).
//! * **Hold-back**: per state, in code points, the longest suffix of its
//!   string that is a proper prefix of some stop string: the state's own
//!   string when it has a child in the trie, else its failure state's value.
//!
//! Construction is the textbook one (trie, then failure links breadth first,
//! filling each missing transition from the failure state's finished row),
//! linear in `states x stride`. The test suite checks it against the
//! `aho-corasick` crate's DFA and against a naive search.

const NONE: u32 = u32::MAX;

/// Largest table built (4 MiB of 32-bit entries); a list over it, which takes
/// thousands of strings over many distinct bytes, gets the crate's NFA.
pub(crate) const MAX_TABLE_ENTRIES: usize = 1 << 20;

/// The automaton of one stop list. State ids are row offsets into the table.
pub(crate) struct StopDfa {
    classes: [u8; 256],
    stride2: u32,
    table: Table,
    /// Lowest index of a stop string ending at each state, or `NONE`.
    match_index: Vec<u32>,
    /// Hold-back of each state in code points.
    holdback: Vec<u32>,
}

impl StopDfa {
    /// The start state.
    pub(crate) const START: u32 = 0;

    /// Builds the automaton of `stops` (all non-empty; checked by the
    /// caller), or `None` when its table would have more than
    /// [`MAX_TABLE_ENTRIES`] entries.
    pub(crate) fn new<S: AsRef<str>>(stops: &[S]) -> Option<StopDfa> {
        let mut classes = [0u8; 256];
        let mut used = [false; 256];
        for s in stops {
            for &b in s.as_ref().as_bytes() {
                used[b as usize] = true;
            }
        }
        let mut n_classes = 1usize;
        for b in 0..256 {
            if used[b] {
                classes[b] = n_classes as u8;
                n_classes += 1;
            }
        }
        // Valid UTF-8 never uses 0xC0, 0xC1 or 0xF5..=0xFF, so the classes
        // (used bytes + "other") fit a u8.
        debug_assert!(n_classes <= 256);
        let stride = n_classes.max(2).next_power_of_two();
        let stride2 = stride.trailing_zeros();
        let total: usize = stops.iter().map(|s| s.as_ref().len()).sum();
        let max_states = total.saturating_add(1).min(MAX_TABLE_ENTRIES / stride);

        // Trie: rows of `NONE` filled with children as the strings go in;
        // `edges` lists every (parent row, class, child row) in creation order.
        let mut trans: Vec<u32> = Vec::with_capacity(max_states * stride);
        trans.resize(stride, NONE);
        let mut edges: Vec<(u32, u32, u32)> = Vec::with_capacity(max_states);
        let mut match_index: Vec<u32> = Vec::with_capacity(max_states);
        let mut depth_chars: Vec<u32> = Vec::with_capacity(max_states);
        let mut has_child: Vec<bool> = Vec::with_capacity(max_states);
        match_index.push(NONE);
        depth_chars.push(0);
        has_child.push(false);
        for (index, s) in stops.iter().enumerate() {
            let mut state = 0usize;
            for &b in s.as_ref().as_bytes() {
                let class = classes[b as usize] as usize;
                let next = trans[state + class];
                state = if next == NONE {
                    let new = trans.len();
                    if new + stride > MAX_TABLE_ENTRIES {
                        return None;
                    }
                    trans.resize(new + stride, NONE);
                    let is_lead = (b & 0xC0) != 0x80;
                    depth_chars.push(depth_chars[state >> stride2] + u32::from(is_lead));
                    match_index.push(NONE);
                    has_child.push(false);
                    has_child[state >> stride2] = true;
                    trans[state + class] = new as u32;
                    edges.push((state as u32, class as u32, new as u32));
                    new
                } else {
                    next as usize
                };
            }
            let m = &mut match_index[state >> stride2];
            *m = (*m).min(index as u32);
        }
        // Failure links, breadth first. A state's row starts as a copy of its
        // failure state's finished row (the transitions it inherits); then its
        // own children go in. An entry gets bit 0 when written if its target
        // completes a stop string, so copied entries carry the bit along.
        let n_states = match_index.len();
        let mut holdback: Vec<u32> = vec![0; n_states];
        let mut fail: Vec<u32> = vec![0; n_states];
        let mut queue: Vec<u32> = Vec::with_capacity(n_states);
        // Children of each state, contiguous and in creation order (a
        // counting sort of `edges` by parent).
        let mut first_edge: Vec<u32> = vec![0; n_states + 1];
        for e in &edges {
            first_edge[(e.0 >> stride2) as usize + 1] += 1;
        }
        for i in 0..n_states {
            first_edge[i + 1] += first_edge[i];
        }
        let mut children: Vec<(u32, u32)> = vec![(0, 0); edges.len()];
        let mut fill = first_edge.clone();
        for &(parent, class, child) in &edges {
            let at = &mut fill[(parent >> stride2) as usize];
            children[*at as usize] = (class, child);
            *at += 1;
        }
        trans[..stride].fill(0);
        queue.push(0);
        let mut head = 0;
        while head < queue.len() {
            let s = queue[head] as usize;
            head += 1;
            let si = s >> stride2;
            let f = fail[si] as usize;
            if s != 0 {
                trans.copy_within(f..f + stride, s);
            }
            let own = first_edge[si] as usize..first_edge[si + 1] as usize;
            for &(class, t) in &children[own] {
                let ti = (t >> stride2) as usize;
                // The root's children fail to the root; others through the
                // parent's failure state's (finished) row.
                let tf = if s == 0 {
                    0
                } else {
                    trans[f + class as usize] & !1
                };
                let fi = (tf >> stride2) as usize;
                fail[ti] = tf;
                match_index[ti] = match_index[ti].min(match_index[fi]);
                holdback[ti] = if has_child[ti] {
                    depth_chars[ti]
                } else {
                    holdback[fi]
                };
                trans[s + class as usize] = t | u32::from(match_index[ti] != NONE);
                queue.push(t);
            }
        }

        // Entries are row offsets (plus the flag bit): 16 bits suffice while
        // the table has at most 2^16 entries, which halves the memory a
        // compile writes for most stop lists.
        let table = if trans.len() <= 1 << 16 {
            Table::Narrow(trans.iter().map(|&e| e as u16).collect())
        } else {
            Table::Wide(trans.into_boxed_slice())
        };
        Some(StopDfa {
            classes,
            stride2,
            table,
            match_index,
            holdback,
        })
    }

    /// Steps over `bytes` from `state`; returns the final state and, for the
    /// first position where some stop string ends, the byte offset just past
    /// it and the lowest list index ending there.
    #[inline(always)]
    pub(crate) fn scan(&self, state: u32, bytes: &[u8]) -> (u32, Option<(usize, usize)>) {
        let (state, hit) = match &self.table {
            Table::Narrow(t) => scan_in(t, &self.classes, state, bytes),
            Table::Wide(t) => scan_in(t, &self.classes, state, bytes),
        };
        let hit = hit.map(|(end, at)| {
            (
                end,
                self.match_index[(at >> self.stride2) as usize] as usize,
            )
        });
        (state, hit)
    }

    /// Steps over `bytes` from `state` without looking for matches.
    #[inline(always)]
    pub(crate) fn step(&self, state: u32, bytes: &[u8]) -> u32 {
        match &self.table {
            Table::Narrow(t) => step_in(t, &self.classes, state, bytes),
            Table::Wide(t) => step_in(t, &self.classes, state, bytes),
        }
    }

    /// Hold-back of `state` in code points (for states reached at a code-point
    /// boundary, which are the only ones a matcher rests in).
    #[inline(always)]
    pub(crate) fn holdback(&self, state: u32) -> usize {
        self.holdback[(state >> self.stride2) as usize] as usize
    }

    /// Whether no state holds anything back.
    pub(crate) fn never_holds_back(&self) -> bool {
        self.holdback.iter().all(|&h| h == 0)
    }

    /// Heap bytes of the tables.
    pub(crate) fn memory_usage(&self) -> usize {
        let table = match &self.table {
            Table::Narrow(t) => 2 * t.len(),
            Table::Wide(t) => 4 * t.len(),
        };
        table + 4 * (self.match_index.len() + self.holdback.len())
    }
}

/// Transition entries: the next state's row offset, bit 0 set when that state
/// completes a stop string.
enum Table {
    Narrow(Box<[u16]>),
    Wide(Box<[u32]>),
}

trait Entry: Copy {
    fn get(self) -> u32;
}

impl Entry for u16 {
    #[inline(always)]
    fn get(self) -> u32 {
        u32::from(self)
    }
}

impl Entry for u32 {
    #[inline(always)]
    fn get(self) -> u32 {
        self
    }
}

#[inline(always)]
fn next<T: Entry>(trans: &[T], classes: &[u8; 256], state: u32, byte: u8) -> u32 {
    let at = state as usize + classes[byte as usize] as usize;
    debug_assert!(at < trans.len());
    // SAFETY: every state a matcher holds is a row offset taken from this
    // table (or START), and a class is below the stride, so `at` is in
    // bounds. This is the innermost loop of every feed.
    unsafe { trans.get_unchecked(at) }.get()
}

/// The final state and, at the first completed stop string, the byte offset
/// just past it and the state there.
#[inline(always)]
fn scan_in<T: Entry>(
    trans: &[T],
    classes: &[u8; 256],
    mut state: u32,
    bytes: &[u8],
) -> (u32, Option<(usize, u32)>) {
    for (i, &b) in bytes.iter().enumerate() {
        let e = next(trans, classes, state, b);
        state = e & !1;
        if e & 1 != 0 {
            let end = step_in(trans, classes, state, &bytes[i + 1..]);
            return (end, Some((i + 1, state)));
        }
    }
    (state, None)
}

#[inline(always)]
fn step_in<T: Entry>(trans: &[T], classes: &[u8; 256], mut state: u32, bytes: &[u8]) -> u32 {
    for &b in bytes {
        state = next(trans, classes, state, b) & !1;
    }
    state
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stop_strings::strategies::{chars, stop_lists};
    use aho_corasick::automaton::Automaton;
    use aho_corasick::dfa::DFA;
    use aho_corasick::{Anchored, MatchKind};
    use proptest::prelude::*;

    /// First (end byte, lowest index) on the crate's DFA, and its final state.
    fn crate_scan(dfa: &DFA, bytes: &[u8]) -> Vec<(usize, usize)> {
        let mut sid = dfa.start_state(Anchored::No).unwrap();
        let mut out = vec![];
        for (i, &b) in bytes.iter().enumerate() {
            sid = dfa.next_state(Anchored::No, sid, b);
            if dfa.is_match(sid) {
                let best = (0..dfa.match_len(sid))
                    .map(|k| dfa.match_pattern(sid, k).as_usize())
                    .min()
                    .unwrap();
                out.push((i + 1, best));
            }
        }
        out
    }

    fn own_scan(dfa: &StopDfa, bytes: &[u8]) -> Vec<(usize, usize)> {
        let mut out = vec![];
        let mut state = StopDfa::START;
        let mut at = 0;
        while at < bytes.len() {
            // One byte at a time, so every match position is reported.
            let (s, hit) = dfa.scan(state, &bytes[at..at + 1]);
            state = s;
            at += 1;
            if let Some((_, index)) = hit {
                out.push((at, index));
            }
        }
        out
    }

    #[test]
    fn holdback_and_lowest_index() {
        let dfa = StopDfa::new(&["aab", "ab", "b"]).unwrap();
        let s = dfa.step(StopDfa::START, b"xaa");
        assert_eq!(dfa.holdback(s), 2);
        let (_, hit) = dfa.scan(s, b"b");
        // "aab", "ab" and "b" all end here; the lowest index wins.
        assert_eq!(hit, Some((1, 0)));
        let dfa = StopDfa::new(&["日本"]).unwrap();
        assert_eq!(dfa.holdback(dfa.step(StopDfa::START, "x日".as_bytes())), 1);
    }

    #[test]
    fn wide_alphabet() {
        let all: String = (0u32..0x800).filter_map(char::from_u32).collect();
        let dfa = StopDfa::new(&[all.as_str(), "\u{7ff}\u{0}"]).unwrap();
        let (_, hit) = dfa.scan(StopDfa::START, all.as_bytes());
        assert_eq!(hit.map(|h| h.1), Some(0));
    }

    #[test]
    fn narrow_and_wide_tables_agree_with_the_crate() {
        let hay: String = (0..400)
            .map(|i| format!("<{:04}|{}> ", i * 7, i % 5))
            .collect();
        for n in [12, 1500] {
            let stops: Vec<String> = (0..n).map(|i| format!("<{i:04}|{}>", i % 7)).collect();
            let ours = StopDfa::new(&stops).unwrap();
            assert_eq!(matches!(ours.table, Table::Wide(_)), n == 1500);
            let theirs = DFA::builder()
                .match_kind(MatchKind::Standard)
                .build(&stops)
                .unwrap();
            let found = own_scan(&ours, hay.as_bytes());
            assert!(!found.is_empty());
            assert_eq!(found, crate_scan(&theirs, hay.as_bytes()));
        }
    }

    proptest! {
        #[test]
        fn same_matches_as_the_crate_dfa(
            text in chars(0..60),
            stops in stop_lists(1..6, 1..8),
        ) {
            let stops: Vec<String> = stops.iter().map(|s| s.iter().collect()).collect();
            let text: String = text.iter().collect();
            let ours = StopDfa::new(&stops).unwrap();
            let theirs = DFA::builder()
                .match_kind(MatchKind::Standard)
                .build(&stops)
                .unwrap();
            prop_assert_eq!(own_scan(&ours, text.as_bytes()), crate_scan(&theirs, text.as_bytes()));
        }
    }
}
