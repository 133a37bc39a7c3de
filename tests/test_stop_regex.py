"""Stop regexes (docs/semantics.md 2.1): the matcher,
the finish machine and the batch, against the baseline and Python's ``re``."""

from __future__ import annotations

import re

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

import stopline
from stopline import baseline

from conftest import RESULT_FIELDS

USER_TURN = r"\n\n+(User|Human):"


def rx_matcher(impl, patterns, include_in_output=False):
    if impl.name == "rust":
        return stopline.StopRegexes(patterns).matcher(include_in_output=include_in_output)
    return baseline.StopRegexMatcher(patterns, include_in_output)


def run_pieces(impl, pieces, **params):
    """One token per piece (ids 10, 11, ...) until finished; returns the
    tracker and the step results."""
    tr = impl.FinishTracker(impl.StopParams(**params))
    results = []
    for k, p in enumerate(pieces):
        results.append(tr.update([10 + k], [p]))
        if tr.finished:
            break
    return tr, results


def joined(results):
    return "".join(r.text_delta for r in results), [t for r in results for t in r.token_ids_delta]


# ------------------------------------------------------- engine cases

def test_period_at_end_of_text_stops_after_the_token_that_ends_with_it(impl):
    tr, results = run_pieces(impl, ["a", ".", "b", "."], stop_regex=[r"\.$"])
    assert (tr.finished, tr.finish_reason, tr.stop_reason, tr.matched) == (True, "stop", r"\.$", ".")
    assert (tr.num_tokens, tr.text, tr.token_ids) == (2, "a", [10, 11])
    assert joined(results) == ("a", [10, 11])


def test_period_followed_by_text_in_the_same_piece_is_not_at_the_end(impl):
    tr, _ = run_pieces(impl, ["a.b", "c"], stop_regex=[r"\.$"])
    assert not tr.finished
    tr, _ = run_pieces(impl, ["a.b", "c."], stop_regex=[r"\.$"], include_stop_str_in_output=True)
    assert (tr.num_tokens, tr.text, tr.matched) == (2, "a.bc.", ".")


@pytest.mark.parametrize("include", [False, True])
def test_user_turn_split_across_pieces(impl, include):
    pieces = ["Sure.", "\n", "\nUs", "er:", " more"]
    tr, results = run_pieces(impl, pieces, stop_regex=[USER_TURN], include_stop_str_in_output=include)
    assert (tr.finish_reason, tr.stop_reason, tr.matched) == ("stop", USER_TURN, "\n\nUser:")
    assert tr.num_tokens == 4
    assert tr.text == ("Sure.\n\nUser:" if include else "Sure.")
    assert joined(results) == (tr.text, tr.token_ids)


def test_longer_newline_run_is_cut_at_its_leftmost_start(impl):
    tr, _ = run_pieces(impl, ["x\n", "\n\n\nHuman", ":"], stop_regex=[USER_TURN])
    assert (tr.text, tr.matched) == ("x", "\n\n\n\nHuman:")


def test_string_beats_regex_at_the_same_end(impl):
    tr, _ = run_pieces(impl, ["so", " xEND tail"], stop=["END"], stop_regex=[r"x\w+D"])
    assert (tr.stop_reason, tr.matched, tr.text) == ("END", "END", "so x")


def test_regex_ending_earlier_in_the_piece_beats_a_string(impl):
    tr, _ = run_pieces(impl, ["go", " x1 END"], stop=["END"], stop_regex=[r"x\d"])
    assert (tr.stop_reason, tr.matched, tr.text) == (r"x\d", "x1", "go ")


def test_string_ending_earlier_beats_a_regex(impl):
    tr, _ = run_pieces(impl, ["abbc"], stop=["ab"], stop_regex=[r"b+c"])
    assert (tr.stop_reason, tr.matched, tr.text) == ("ab", "ab", "")


def test_regexes_tie_by_list_order(impl):
    tr, _ = run_pieces(impl, ["q", "xyz"], stop_regex=[r"y\w", r"xy\w"])
    assert (tr.stop_reason, tr.matched, tr.text) == (r"y\w", "yz", "qx")


def test_han_range_and_code_point_offsets(impl):
    tr, _ = run_pieces(impl, ["答案：", "北京", "。", "更多"], stop_regex=["[\\u4e00-\\u9fff]+。"])
    assert (tr.num_tokens, tr.text, tr.text_len, tr.matched) == (3, "答案：", 3, "北京。")


def test_unicode_property_class(rust):
    tr, _ = run_pieces(rust, ["🙂 答案：", "北京", "。", "更多"], stop_regex=[r"\p{Han}+。"])
    assert (tr.num_tokens, tr.text, tr.text_len, tr.matched) == (3, "🙂 答案：", 5, "北京。")


def test_min_tokens_gates_regexes_like_strings(impl):
    tr, _ = run_pieces(impl, ["7!", "x", "9!", "z"], stop_regex=[r"\d+!"], min_tokens=2)
    assert (tr.num_tokens, tr.text, tr.matched) == (3, "7!x", "9!")
    # A match may start inside the gated tokens and complete after them.
    tr, _ = run_pieces(impl, ["1", "2", "!"], stop_regex=[r"\d+!"], min_tokens=2)
    assert (tr.num_tokens, tr.text, tr.matched) == (3, "", "12!")


def test_regex_before_eos_at_one_position(impl):
    # The EOS text is output text only when kept (semantics.md 3, check 4).
    tr = impl.FinishTracker(impl.StopParams(stop_regex=[r"!+"], eos_token_ids=[2],
                                            include_stop_str_in_output=True))
    r = tr.update([1, 2, 3], ["hi", "!", "x"])
    assert (r.finish_reason, r.stop_reason, r.matched, r.num_tokens, tr.text) == ("stop", "!+", "!", 2, "hi!")
    tr = impl.FinishTracker(impl.StopParams(stop_regex=[r"!+"], eos_token_ids=[2]))
    r = tr.update([1, 2, 3], ["hi", "!", "x"])
    assert (r.finish_reason, r.stop_reason, r.matched, r.num_tokens, tr.text) == ("stop", None, 2, 2, "hi")


def test_accept_run_equals_single_tokens(impl):
    pieces = ["A", "b.", " c", ".", "d"]
    params = dict(stop_regex=[r"[a-z]\.$", r"\.\s"], stop=["zz"])
    one, _ = run_pieces(impl, pieces, **params)
    run = impl.FinishTracker(impl.StopParams(**params))
    run.update(list(range(10, 10 + len(pieces))), pieces)
    fields = ("finish_reason", "stop_reason", "matched", "num_tokens", "text", "token_ids")
    assert [getattr(run, f) for f in fields] == [getattr(one, f) for f in fields]
    assert (one.num_tokens, one.text) == (2, "A")


def test_texts_are_required_with_stop_regexes(impl):
    tr = impl.FinishTracker(impl.StopParams(stop_regex=["x"]))
    with pytest.raises(ValueError, match="texts"):
        tr.update([1])


# ---------------------------------------------------------- streaming

def test_holdback_is_exact_while_streaming(rust):
    pieces = ["ok", "\n", "\n", "Us", "x", "\n", "done"]
    _, results = run_pieces(rust, pieces, stop_regex=[USER_TURN])
    deltas = [(r.text_delta, r.token_ids_delta) for r in results]
    assert deltas == [
        ("ok", [10]), ("", []), ("", []), ("", []),
        ("\n\nUsx", [11, 12, 13, 14]), ("", []), ("\ndone", [15, 16]),
    ]


def test_holdback_of_the_matcher(impl):
    m = rx_matcher(impl, [USER_TURN])
    m.feed("ok\n\nHu")
    if impl.name == "rust":
        assert m.holdback == 4
    else:
        assert m.holdback >= 4  # the baseline's bound is safe, not exact
    assert rx_matcher(impl, [USER_TURN], include_in_output=True).holdback == 0


def test_unbounded_pattern_holds_back_until_it_resolves(rust):
    tr, results = run_pieces(rust, ["pre ", "<t>", "long", " thought", "</t>", "after"],
                             stop_regex=[r"<t>.*?</t>"])
    assert [r.text_delta for r in results] == ["pre ", "", "", "", ""]
    assert (tr.text, tr.matched) == ("pre ", "<t>long thought</t>")


@pytest.mark.parametrize("finish", ["length", "abort"])
def test_non_stop_finish_flushes_the_held_text(impl, finish):
    params = dict(stop_regex=[USER_TURN], max_tokens=3 if finish == "length" else None)
    tr = impl.FinishTracker(impl.StopParams(**params))
    results = [tr.update([1], ["a"]), tr.update([2], ["\n\n"])]
    results.append(tr.update([3], ["Hu"]) if finish == "length" else tr.abort())
    assert results[-1].finish_reason == finish
    assert joined(results) == (tr.text, tr.token_ids)
    assert tr.text == ("a\n\nHu" if finish == "length" else "a\n\n")


# ------------------------------------------------------------- batch

def test_finish_batch_mixes_regex_and_plain_slots(impl):
    plans = {
        0: (dict(stop_regex=[r"\.$"]), ["a", ".", "b"]),
        1: (dict(max_tokens=3), ["x", "y", "z"]),
        2: (dict(stop_regex=[USER_TURN], stop=["STOP"]), ["q\n", "\nUser", ":"]),
        3: (dict(stop_regex=[USER_TURN], include_stop_str_in_output=True), ["q\n", "\nHuman:", "w"]),
    }
    batch = impl.FinishBatch(4)
    for slot, (params, _) in plans.items():
        batch.add(slot, impl.StopParams(**params))
    streams = {s: ["", []] for s in plans}
    last = {}
    for step in range(3):
        live = [s for s in plans if s not in last or not last[s].finished]
        out = impl.batch_step(batch, live, [100 + step] * len(live), None,
                              [plans[s][1][step] for s in live])
        for s, r in zip(live, out):
            streams[s][0] += r.text_delta
            streams[s][1] += r.token_ids_delta
            last[s] = r
    for slot, (params, pieces) in plans.items():
        tr, _ = run_pieces(impl, pieces, **params)
        got = last[slot]
        assert (got.finish_reason, got.stop_reason, got.matched, got.num_tokens) == (
            tr.finish_reason, tr.stop_reason, tr.matched, tr.num_tokens), slot
        assert streams[slot][0] == tr.text
    assert (last[0].matched, last[2].matched, last[3].matched) == (".", "\n\nUser:", "\n\nHuman:")
    assert streams[3][0] == "q\n\nHuman:"


# ---------------------------------------------------------- errors

@pytest.mark.parametrize("pattern", ["a*", "(?:x)?", "x|", "b{0}", r"\b"])
def test_pattern_matching_the_empty_string_is_rejected(impl, pattern):
    with pytest.raises(ValueError, match="empty") as info:
        impl.StopParams(stop_regex=["fine", pattern])
    assert pattern in str(info.value) and "stop_regex[1]" in str(info.value)


def test_invalid_pattern_is_named(impl):
    with pytest.raises(ValueError) as info:
        impl.StopParams(stop_regex=["ok", "(unclosed"])
    assert "stop_regex[1]" in str(info.value) and "(unclosed" in str(info.value)


@pytest.mark.parametrize("value,exc", [("x+", TypeError), ([3], TypeError), (["a", None], TypeError),
                                       (["", "a"], ValueError), (["\ud800"], ValueError)])
def test_bad_stop_regex_values(impl, value, exc):
    with pytest.raises(exc, match="stop_regex"):
        impl.StopParams(stop_regex=value)


def test_rust_only_rejections_name_the_pattern(rust):
    with pytest.raises(ValueError, match=r"stop_regex\[0\].*\(\?-u:\\b\)"):
        rust.StopParams(stop_regex=[r"cat\b"])
    with pytest.raises(ValueError, match=r"stop_regex\[1\].*limit"):
        rust.StopParams(stop_regex=["ok", r"\w{300}[0-9]"])
    with pytest.raises(ValueError, match="stop_regex"):
        stopline.StopRegexes([r"(?<=a)b"])


def test_stop_regexes_class(rust):
    rx = stopline.StopRegexes([r"\d+", USER_TURN])
    assert (rx.patterns, len(rx)) == ((r"\d+", USER_TURN), 2)
    assert "StopRegexes" in repr(rx)
    m = rx.matcher()
    assert m.feed("ab") is None
    hit = m.feed("c12")
    assert (hit.index, hit.stop, hit.start, hit.end, hit.truncate_to) == (0, r"\d+", 3, 4, 3)
    assert (m.chars_fed, m.include_in_output) == (5, False)
    m.reset()
    assert m.chars_fed == 0
    assert rust.StopParams(stop_regex=(r"\d",)).stop_regex == [r"\d"]


# ------------------------------------------------------ properties

ATOMS = ["a", "b", "é", "日", ".", "[ab]", "[^a]", "(a|bé)", "(?:ab)"]
QUANTS = ["", "+", "?", "*", "{2}", "{1,3}", "+?"]
ALPHABET = "abé日"

atoms = st.builds(lambda a, q: a + q, st.sampled_from(ATOMS), st.sampled_from(QUANTS))
branches = st.lists(atoms, min_size=1, max_size=3).map("".join)
patterns = st.lists(branches, min_size=1, max_size=2).map("|".join)


def nonempty(p):
    return baseline._regex_width(p)[0] > 0


def chunks(text, cuts):
    bounds = sorted({c for c in cuts if 0 < c < len(text)} | {len(text)})
    out, prev = [], 0
    for b in bounds:
        out.append(text[prev:b])
        prev = b
    return [c for c in out if c]


def oracle(text, new_from, pats):
    """Earliest end in text[new_from:], then list order, then leftmost start,
    by ``re.fullmatch`` on every substring."""
    for end in range(new_from + 1, len(text) + 1):
        for i, p in enumerate(pats):
            for start in range(end):
                if re.fullmatch(p, text[start:end]):
                    return i, start, end
    return None


@given(pats=st.lists(patterns, min_size=1, max_size=3),
       text=st.text(alphabet=ALPHABET, max_size=14),
       cuts=st.lists(st.integers(0, 14), max_size=6),
       include=st.booleans())
def test_matchers_equal_python_re_under_any_chunking(pats, text, cuts, include):
    assume(all(map(nonempty, pats)))
    rust_m = stopline.StopRegexes(pats).matcher(include_in_output=include)
    base_m = baseline.StopRegexMatcher(pats, include)
    fed = ""
    for piece in chunks(text, cuts):
        want = oracle(fed + piece, len(fed), pats)
        for m in (rust_m, base_m):
            got = m.feed(piece)
            assert (None if got is None else (got.index, got.start, got.end)) == want, (pats, fed, piece)
            if got is not None:
                assert got.truncate_to == (got.end if include else got.start)
        fed += piece


@given(pats=st.lists(patterns, min_size=1, max_size=2))
def test_both_reject_the_same_empty_matching_patterns(pats):
    def accepted(build):
        try:
            build(pats)
            return True
        except ValueError:
            return False
    assert accepted(stopline.StopRegexes) == accepted(baseline.StopRegexMatcher) == all(map(nonempty, pats))


# Patterns with end-of-text and boundary assertions, for step invariance.
ANCHORED = [r"\.$", r"[a-z]+\z", r"(?m)^x.$", r"(?-u:\b)ab(?-u:\b)", r"b\n", r"a.{1,3}?b"]
PIECES = ["", "a", "b", ".", "x", "ab", "b.", "\n", " ", "xa.", "日"]


@given(tokens=st.lists(st.sampled_from(PIECES), min_size=1, max_size=14),
       pats=st.lists(st.sampled_from(ANCHORED), min_size=1, max_size=3, unique=True),
       stop=st.lists(st.sampled_from(["ab", ".\n", "xx"]), max_size=2),
       bounds=st.lists(st.integers(1, 14), max_size=5),
       min_tokens=st.integers(0, 3),
       include=st.booleans())
def test_step_invariance_and_stream_reassembly_with_any_pattern(
        tokens, pats, stop, bounds, min_tokens, include):
    params = stopline.StopParams(stop_regex=pats, stop=stop or None, min_tokens=min_tokens,
                                 include_stop_str_in_output=include, max_tokens=20)
    ids = list(range(100, 100 + len(tokens)))

    def run(cuts):
        tr = stopline.FinishTracker(params)
        text, toks, prev = "", [], 0
        for c in cuts:
            if tr.finished:
                break
            r = tr.update(ids[prev:c], tokens[prev:c])
            text += r.text_delta
            toks += r.token_ids_delta
            prev = c
        if not tr.finished:
            r = tr.abort()
            text += r.text_delta
            toks += r.token_ids_delta
        assert (text, toks) == (tr.text, tr.token_ids)
        return tuple(getattr(tr, f) for f in ("finish_reason", "stop_reason", "matched", "text", "token_ids"))

    singles = run(range(1, len(tokens) + 1))
    runs = run(sorted({b for b in bounds if b < len(tokens)} | {len(tokens)}))
    assert singles == runs


@given(tokens=st.lists(st.sampled_from(["a", "b", "é", "日", "ab", "bé", ""]), min_size=1, max_size=12),
       pats=st.lists(patterns, min_size=1, max_size=2),
       min_tokens=st.integers(0, 3),
       include=st.booleans())
def test_tracker_equals_baseline_on_the_common_subset(tokens, pats, min_tokens, include):
    assume(all(map(nonempty, pats)))
    kw = dict(stop_regex=pats, min_tokens=min_tokens, include_stop_str_in_output=include)
    results = {}
    for impl in (baseline, stopline):
        tr = impl.FinishTracker(impl.StopParams(**kw))
        stream = ""
        for k, p in enumerate(tokens):
            r = tr.update([k], [p])
            stream += r.text_delta
            if tr.finished:
                break
        if not tr.finished:
            stream += tr.abort().text_delta
        assert stream == tr.text
        results[impl.__name__] = tuple(getattr(tr, f) for f in RESULT_FIELDS if hasattr(tr, f)) + (tr.text,)
    assert results["stopline.baseline"] == results["stopline"]
