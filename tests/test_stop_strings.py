"""Stop strings (docs/semantics.md section 2): test vectors, bad input, differential properties."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from conftest import brute_holdback
from vectors import load_vectors

CSS_CASES = load_vectors("check_stop_strings.json")
HOLDBACK_CASES = load_vectors("holdback.json")

# ASCII, CJK, emoji (astral), combining marks; few letters so stops overlap.
ALPHABET = ["a", "b", "c", "e", " ", "日", "本", "😀", "\u0301", "\u200d"]


# ---------------------------------------------------------------- oracles

def brute_matches(text, stops):
    """All (end, index, start) occurrences, earliest end then list order first."""
    out = []
    for i, s in enumerate(stops):
        for j in range(len(text) - len(s) + 1):
            if text.startswith(s, j):
                out.append((j + len(s), i, j))
    return sorted(out)


def brute_first_in(text, stops, lo, hi):
    """Earliest-ending match with lo < end <= hi, as (index, start, end)."""
    for end, i, start in brute_matches(text[:hi], stops):
        if end > lo:
            return (i, start, end)
    return None


def match_tuple(m):
    if m is None:
        return None
    return (m.index, m.stop, m.start, m.end, m.truncate_to)


# ------------------------------------------------------------- vectors

@pytest.mark.parametrize("case", CSS_CASES, ids=[f"css{i}" for i in range(len(CSS_CASES))])
def test_check_stop_strings_vectors(impl, case):
    text, new_chars, stop, include, expected = case
    got = impl.check_stop_strings(text, new_chars, stop, include)
    assert got == (None if expected is None else tuple(expected))


def _stream_matcher(m, chunks):
    """Deltas a streamer emits using only the matcher: everything but the hold-back
    while running, up to the cut on a match."""
    text, emitted, deltas = "", 0, []
    for chunk in chunks:
        text += chunk
        hit = m.feed(chunk)
        assert m.chars_fed == len(text)
        upto = hit.truncate_to if hit is not None else m.chars_fed - m.holdback
        assert upto >= emitted
        deltas.append(text[emitted:upto])
        emitted = upto
        if hit is not None:
            return deltas, True, text[:upto]
    return deltas, False, text[:emitted]


@pytest.mark.parametrize("case", HOLDBACK_CASES, ids=[c["name"] for c in HOLDBACK_CASES])
def test_holdback_vectors_matcher(impl, case):
    m = impl.matcher(case["stop"], case["include_stop_str_in_output"])
    deltas, finished, text = _stream_matcher(m, case["chunks"])
    assert deltas == case["expect_deltas"]
    assert finished == case["expect_finished"]
    if "expect_text" in case:
        assert text == case["expect_text"]


@pytest.mark.parametrize("case", HOLDBACK_CASES, ids=[c["name"] for c in HOLDBACK_CASES])
def test_holdback_vectors_tracker(impl, case):
    """The same vectors, one chunk per token through the finish machine."""
    tr = impl.FinishTracker(impl.StopParams(
        stop=case["stop"], include_stop_str_in_output=case["include_stop_str_in_output"]))
    deltas = []
    for k, chunk in enumerate(case["chunks"]):
        r = tr.update([k + 1], [chunk])
        deltas.append(r.text_delta)
        if r.finished:
            break
    assert deltas == case["expect_deltas"]
    assert tr.finished == case["expect_finished"]
    if case["expect_finished"]:
        assert tr.finish_reason == "stop"
    if "expect_text" in case:
        assert tr.text == case["expect_text"]


# ----------------------------------------------------------- behaviour

def test_matcher_keeps_working_after_a_match(impl):
    m = impl.matcher(["ab", "b"])
    assert match_tuple(m.feed("xab")) == (0, "ab", 1, 3, 1)
    assert m.feed("x") is None
    # A match that starts in text fed before the previous match is still found.
    assert match_tuple(m.feed("a")) is None and m.holdback == 1
    assert match_tuple(m.feed("b")) == (0, "ab", 4, 6, 4)
    assert m.chars_fed == 6


def test_matcher_reset_and_empty_delta(impl):
    m = impl.matcher(["abc"], include_in_output=True)
    assert m.feed("") is None and m.chars_fed == 0
    assert m.feed("ab") is None
    assert m.holdback == 0  # include_in_output needs no hold-back
    m.reset()
    assert (m.chars_fed, m.holdback) == (0, 0)
    assert m.feed("c") is None  # "ab" was forgotten
    assert match_tuple(m.feed("abc")) == (0, "abc", 1, 4, 4)


def test_matcher_holdback_is_exact_not_max_len(impl):
    m = impl.matcher(["abcdef", "zz"])
    m.feed("xyz")
    assert m.holdback == 1
    m.feed("q")
    assert m.holdback == 0
    m.feed("abc")
    assert m.holdback == 3


def test_tie_at_same_end_goes_to_lowest_index(impl):
    m = impl.matcher(["b", "ab", "b"])
    assert match_tuple(m.feed("ab")) == (0, "b", 1, 2, 1)
    m = impl.matcher(["ab", "b"])
    assert match_tuple(m.feed("ab")) == (0, "ab", 0, 2, 0)


# ------------------------------------------------------------ bad input

BAD_STOPS = [
    (["a", "b", ""], ValueError, ["2"]),
    (["a", 5], TypeError, ["1", "int"]),
    (["a", None, "c"], TypeError, ["1", "None"]),
    (["a", "b", "x\ud800"], ValueError, ["2"]),
]


@pytest.mark.parametrize("stops,exc,words", BAD_STOPS, ids=["empty", "int", "none", "surrogate"])
def test_bad_stop_entries(impl, stops, exc, words):
    for make in (
        lambda: impl.check_stop_strings("hello", 5, stops, False),
        lambda: impl.matcher(stops),
        lambda: impl.StopParams(stop=stops),
    ):
        with pytest.raises(exc) as info:
            make()
        for w in words:
            assert w in str(info.value), (w, str(info.value))


def test_bare_str_is_not_a_stop_list(impl):
    # A str is a Sequence[str] of its characters; never what the caller meant.
    with pytest.raises(TypeError):
        impl.check_stop_strings("xab", 2, "ab", False)
    with pytest.raises(TypeError):
        impl.matcher("ab")


@pytest.mark.parametrize("new_chars", [-1, 6, 100])
def test_new_char_count_out_of_range(impl, new_chars):
    with pytest.raises(ValueError):
        impl.check_stop_strings("hello", new_chars, ["h"], False)


@pytest.mark.parametrize("text,new_chars", [("ab\ud800c", 2), ("a\ud800bc", 1), ("\udfff", 1)])
def test_lone_surrogate_in_text(impl, text, new_chars):
    with pytest.raises(ValueError):
        impl.check_stop_strings(text, new_chars, ["c"], False)


def test_matcher_bad_delta_leaves_state(impl):
    m = impl.matcher(["abc"])
    m.feed("xab")
    with pytest.raises(ValueError):
        m.feed("c\ud800")
    with pytest.raises(TypeError):
        m.feed(b"c")
    assert (m.chars_fed, m.holdback) == (3, 2)
    assert match_tuple(m.feed("c")) == (0, "abc", 1, 4, 1)


# ------------------------------------------------------------ properties

texts = st.text(alphabet=st.sampled_from(ALPHABET), max_size=40)


@st.composite
def cases(draw):
    text = draw(texts)
    n_stops = draw(st.integers(0, 5))
    stops = []
    for _ in range(n_stops):
        if text and draw(st.booleans()):
            a = draw(st.integers(0, len(text) - 1))
            b = draw(st.integers(a + 1, min(len(text), a + 6)))
            stops.append(text[a:b])  # occurs; overlapping/substring stops
        elif stops and draw(st.integers(0, 3)) == 0:
            stops.append(draw(st.sampled_from(stops)))  # duplicate
        else:
            stops.append(draw(st.text(alphabet=st.sampled_from(ALPHABET), min_size=1, max_size=5)))
    cuts = sorted(draw(st.sets(st.integers(1, max(len(text) - 1, 1)), max_size=8)))
    chunks = [text[a:b] for a, b in zip([0] + cuts, cuts + [len(text)])]
    include = draw(st.booleans())
    return text, stops, chunks, include


def _run(m, chunks):
    out = []
    for c in chunks:
        out.append((match_tuple(m.feed(c)), m.holdback, m.chars_fed))
    return out


@given(cases())
def test_matcher_rust_equals_baseline(base, rust, case):
    text, stops, chunks, include = case
    assert _run(rust.matcher(stops, include), chunks) == _run(base.matcher(stops, include), chunks)


@given(cases())
def test_matcher_against_brute_force(impl, case):
    """Every feed reports the earliest-ending match ending inside it, and the
    exact hold-back; the first match does not depend on the chunking."""
    text, stops, chunks, include = case
    m = impl.matcher(stops, include)
    fed = 0
    first = None
    for c in chunks:
        got = match_tuple(m.feed(c))
        want = brute_first_in(text, stops, fed, fed + len(c)) if c else None
        if want is not None:
            i, s, e = want
            want = (i, stops[i], s, e, e if include else s)
        assert got == want
        fed += len(c)
        assert m.chars_fed == fed
        assert m.holdback == (0 if include else brute_holdback(text[:fed], stops))
        if first is None:
            first = got
    m1 = impl.matcher(stops, include)
    first1 = next((r for r in (match_tuple(m1.feed(ch)) for ch in text) if r is not None), None)
    assert first == first1


# A stop that never occurs in the texts here (U+E000, private use, 3 UTF-8
# bytes) and takes a list past 16 KiB: such lists run on the crate's NFA
# instead of the dense DFA (docs/semantics.md section 2), so the same case
# runs on both engines through the public API.
NFA_PAD = "\ue000" * (16 * 1024 // 3 + 1)


@given(cases(), st.data())
def test_matcher_and_check_on_the_nfa_equal_the_dfa(rust, case, data):
    text, stops, chunks, include = case
    padded = stops + [NFA_PAD]
    assert _run(rust.matcher(padded, include), chunks) == _run(rust.matcher(stops, include), chunks)
    new = data.draw(st.integers(0, len(text)))
    got = rust.check_stop_strings(text, new, padded, include)
    assert got == rust.check_stop_strings(text, new, stops, include)


@given(cases(), st.data())
def test_check_stop_strings_properties(base, rust, case, data):
    text, stops, _, include = case
    new = data.draw(st.integers(0, len(text)))
    got = base.check_stop_strings(text, new, stops, include)
    assert rust.check_stop_strings(text, new, stops, include) == got
    want = brute_first_in(text, stops, len(text) - new, len(text)) if new else None
    if want is None:
        assert got is None
    else:
        i, s, e = want
        off = (-1 if e == len(text) else e) if include else s
        assert got == (stops[i], off)
