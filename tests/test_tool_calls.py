"""Tool-call spans (docs/semantics.md 11.10): no stop fires inside a
`<tool_call>` span, the Rust core against the pure-Python baseline, step
invariance with spans, the partial-marker hold-back, and the reported engine
failures as named tests."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_reasoning import THINK, bounds_of, both, drive, joined

import stopline
from stopline import baseline

TC = {"tool_call_markers": [("<tool_call>", "</tool_call>")]}

# Pieces that cut the span markers everywhere, next to content and stops.
PIECES = [
    "", "a", "b", "<", "<t", "c>", "</", "tc>", "<tc>", "</tc>", "[C", "C]", "[", "C", "\n", "ab",
    "x<tc>ab</tc>y", "é", "<think>", "</think>", "<th", "ink>",
]


@st.composite
def cases(draw: st.DrawFn) -> tuple[dict[str, Any], list[tuple[int, str]], list[int]]:
    stops = draw(st.lists(st.sampled_from(["ab", "\na", "é", "C"]), max_size=2, unique=True))
    kw: dict[str, Any] = dict(
        stop=stops,
        tool_call_markers=[("<tc>", "</tc>"), ("[C", "C]")],
        include_stop_str_in_output=draw(st.booleans()),
        token_aligned=draw(st.booleans()),
        min_tokens=draw(st.integers(0, 2)),
        max_tokens=25,
        eos_token_ids=[2],
        stop_token_ids=[7],
    )
    if draw(st.booleans()):
        kw["tool_call_marker_ids"] = [(10, 11), (12, 13)]
    if draw(st.booleans()):
        kw.update(THINK, stop_scopes=[draw(st.sampled_from(["content", "reasoning", "any"])) for _ in stops])
    toks = draw(st.lists(st.tuples(st.integers(0, 13), st.sampled_from(PIECES)), min_size=1, max_size=25))
    cuts = draw(st.lists(st.integers(1, 25), max_size=5))
    return kw, toks, cuts


@settings(max_examples=150, deadline=None)
@given(cases())
def test_rust_equals_baseline_with_spans(case: tuple[dict[str, Any], list[tuple[int, str]], list[int]]) -> None:
    kw, toks, cuts = case
    rp, bp = both(**kw)
    b = bounds_of(cuts, len(toks))
    rust_steps, rt = drive(stopline, rp, toks, b)
    base_steps, bt = drive(baseline, bp, toks, b)
    assert rust_steps == base_steps
    for name in ("reasoning", "content", "channel", "text", "in_tool_call"):
        assert getattr(rt, name) == getattr(bt, name), name


@settings(max_examples=100, deadline=None)
@given(cases())
def test_step_invariance_and_joined_deltas_with_spans(
    case: tuple[dict[str, Any], list[tuple[int, str]], list[int]],
) -> None:
    kw, toks, cuts = case
    p = stopline.StopParams(**kw)
    one, t1 = drive(stopline, p, toks, list(range(1, len(toks) + 1)))
    cut, t2 = drive(stopline, p, toks, bounds_of(cuts, len(toks)))
    assert joined(one) == joined(cut)
    assert t1.in_tool_call == t2.in_tool_call
    (text, _, content), (ids, _, content_ids), _, _ = joined(one)
    assert (text, ids) == (t1.text, t1.token_ids)
    assert (content, content_ids) == (t1.content, t1.content_token_ids)


def test_vllm_45167_literal_end_marker_inside_tool_call_json() -> None:
    # A literal `</tool_call>` inside a JSON string argument, spelled in
    # ordinary tokens, with the end marker given by id: the span stays open
    # and the client's stop equal to the marker text does not fire in it.
    for impl in (stopline, baseline):
        p = impl.StopParams(stop=["</tool_call>"], tool_call_marker_ids=[(80, 81)])
        t = impl.FinishTracker(p)
        seq = [(80, "<tool_call>"), (5, '{"text": "a </tool_'), (6, 'call> b"}'), (81, "</tool_call>")]
        for i, s in seq:
            r = t.update([i], [s])
            assert not r.finished
        assert not t.in_tool_call
        r = t.update([9], ["done</tool_call>x"])
        assert (r.finish_reason, r.stop_reason) == ("stop", "</tool_call>")
        assert t.text == '<tool_call>{"text": "a </tool_call> b"}</tool_call>done'


def test_vllm_34101_stop_string_inside_tool_call_arguments() -> None:
    # A client stop string met inside a call's arguments must not end the
    # request with the call cut; it still fires in the content after it.
    for impl in (stopline, baseline):
        p = impl.StopParams(stop=["\n\n"], **TC)
        t = impl.FinishTracker(p)
        out = []
        for s in ['<tool_call>{"name": "write", "arguments": {"body": "para 1', "\n\npara 2", '"}}</tool_call>',
                  "\n\nignored"]:
            r = t.update([5], [s])
            out.append(r.text_delta)
        assert "".join(out) == '<tool_call>{"name": "write", "arguments": {"body": "para 1\n\npara 2"}}</tool_call>'
        assert (r.finish_reason, r.stop_reason, t.in_tool_call) == ("stop", "\n\n", False)


def test_stop_token_id_and_regex_do_not_fire_inside_a_span() -> None:
    p = stopline.StopParams(stop_regex=[r"\}\s*$"], stop_token_ids=[7], **TC)
    t = stopline.FinishTracker(p)
    r = t.update([5, 7, 6], ["<tool_call>{}", " ", "</tool_call>"])
    assert (r.finished, t.in_tool_call) == (False, False)
    r = t.update([7], ["!"])
    assert (r.finish_reason, r.stop_reason) == ("stop", 7)


def test_partial_span_marker_is_held_back_and_never_streamed_cut() -> None:
    t = stopline.FinishTracker(stopline.StopParams(**TC))
    deltas = [t.update([5], [s]).text_delta for s in ["Hi <tool", "_call>{", "}</tool_ca", "ll>"]]
    assert deltas == ["Hi ", "<tool_call>{", "}", "</tool_call>"]
    assert not t.in_tool_call


def test_unclosed_span_at_finish_reports_in_tool_call() -> None:
    for impl in (stopline, baseline):
        t = impl.FinishTracker(impl.StopParams(max_tokens=2, **TC))
        r = t.update([5, 6], ["<tool_call>{", "</tool"])
        assert (r.finish_reason, r.text_delta, t.in_tool_call) == ("length", "<tool_call>{</tool", True)


def test_spans_with_reasoning_open_only_in_content() -> None:
    p = stopline.StopParams(stop=["!"], stop_scopes="any", **THINK, **TC)
    t = stopline.FinishTracker(p)
    r = t.update([1, 2, 3], ["<think>a", "</think><tool_call>!", "</tool_call>b!"])
    assert (r.reasoning_delta, r.content_delta) == ("a", "<tool_call>!</tool_call>b")
    assert r.finish_reason == "stop"
    t = stopline.FinishTracker(p)
    r = t.update([1, 2], ["<think><tool_call>", "x!"])
    assert (r.reasoning_delta, r.channel, r.finish_reason) == ("<tool_call>x", "reasoning", "stop")


def test_batch_reports_in_tool_call_per_slot() -> None:
    b = stopline.FinishBatch(2)
    b.add(0, stopline.StopParams(tool_call_marker_ids=[(80, 81)]))
    b.add(1, stopline.StopParams())
    b.step([0, 1], [80, 5], texts=["<tool_call>", "x"])
    assert (b.in_tool_call(0), b.in_tool_call(1)) == (True, False)
    b.step([0, 1], [81, 5], texts=["</tool_call>", "x"])
    assert b.in_tool_call(0) is False


def test_params_round_trip() -> None:
    p = stopline.StopParams(tool_call_markers=[("<a>", "</a>")], tool_call_marker_ids=[(3, 4)])
    assert (p.tool_call_markers, p.tool_call_marker_ids, p.reasoning) == ([("<a>", "</a>")], [(3, 4)], None)
    assert "tool_call_marker_ids=[(3, 4)]" in repr(p)


@pytest.mark.parametrize("impl", [stopline, baseline], ids=["rust", "baseline"])
@pytest.mark.parametrize(("kw", "field", "message"), [
    (dict(tool_call_markers=[("", "b")]), "tool_call_markers[0][0]", r"tool_call_markers\[0\]\[0\]=\"\" is an empty string"),
    (dict(tool_call_markers=[("<a>", "b"), ("x<a>", "c")]), "tool_call_markers[0][0]",
     r"tool_call_markers\[0\]\[0\]=\"<a>\" overlaps tool_call_markers\[1\]\[0\]"),
    (dict(tool_call_markers=[("<think>", "x")], **THINK), "tool_call_markers[0][0]", "overlaps reasoning_start"),
    (dict(stop=["x</t>"], tool_call_markers=[("<t>", "</t>")]), "stop[0]", "overlaps tool_call_markers"),
    (dict(stop_token_ids=[4], tool_call_marker_ids=[(3, 4)]), "stop_token_ids[0]", "overlaps tool_call_marker_ids"),
    (dict(tool_call_marker_ids=[(3, 99)], vocab_size=50), "tool_call_marker_ids[0][1]",
     r"tool_call_marker_ids\[0\]\[1\]=99 is outside \[0, vocab_size=50\)"),
    (dict(tool_call_marker_ids=[(3, 4), (3, 5)]), "tool_call_marker_ids[0][0]", "overlaps another pair's start"),
    (dict(tool_call_markers=[("a", "b")] * 9), "tool_call_markers", "has 9 entries; at most 8"),
    (dict(tool_call_markers=[("a", "b")], tool_call_marker_ids=[(1, 2), (3, 4)]), "tool_call_marker_ids",
     "has 2 pairs for 1 pairs of tool_call_markers"),
])
def test_bad_span_definitions_name_the_field(impl: Any, kw: dict[str, Any], field: str, message: str) -> None:
    # The field is the element the message names (a marker of a pair: [i][side]), as the
    # conversion names a bad element (tool_call_marker_ids[0][0] for -1).
    with pytest.raises(ValueError, match=message) as e:
        impl.StopParams(**kw)
    assert e.value.field == field  # type: ignore[attr-defined]


def test_marker_pair_shape_and_type_errors() -> None:
    with pytest.raises(ValueError, match=r"tool_call_markers\[0\] has 1 item; a \(start, end\) pair has exactly 2"):
        stopline.StopParams(tool_call_markers=[("a",)])
    with pytest.raises(TypeError, match=r"tool_call_markers\[0\]\[1\] must be str, got int"):
        stopline.StopParams(tool_call_markers=[("a", 5)])
    with pytest.raises(ValueError, match=r"tool_call_marker_ids\[0\]\[0\]"):
        stopline.StopParams(tool_call_marker_ids=[(-1, 2)])
    cap = stopline.LIMITS["max_marker_bytes"]
    with pytest.raises(ValueError, match=rf"^tool_call_markers\[0\]\[0\]=\"x+\".* is longer than max_marker_bytes={cap} UTF-8 bytes$"):
        stopline.StopParams(tool_call_markers=[("x" * (cap + 1), "y")])


def test_real_tokenizer_ids_only_with_a_split_span_marker() -> None:
    # SmolLM2 has no `<tool_call>` token: the marker comes in several
    # ordinary tokens, decoded by the tracker's vocabulary (ids-only steps),
    # and a stop string inside the call's JSON does not cut it.
    from stopline.tools.models import ModelFileError
    from stopline.tools.vocab_files import tokenizer_json_path

    try:
        path = tokenizer_json_path("smollm2")
    except ModelFileError as exc:
        pytest.skip(str(exc))
    v = stopline.Vocabulary.from_file(path)
    from tokenizers import Tokenizer

    text = 'Calling.<tool_call>{"args": {"a": "x\n\ny"}}</tool_call>\n\nafter'
    ids = Tokenizer.from_file(str(path)).encode(text).ids
    t = stopline.FinishTracker(stopline.StopParams(stop=["\n\n"], **TC), vocabulary=v)
    deltas = [t.update(i).text_delta for i in ids if not t.finished]
    assert t.text == 'Calling.<tool_call>{"args": {"a": "x\n\ny"}}</tool_call>'
    assert (t.finish_reason, t.in_tool_call) == ("stop", False)
    assert not any(d.endswith(("<", "<tool", "</")) for d in deltas)
    with pytest.raises(ValueError, match=r"tool_call_marker_ids\[0\]\[1\]=1000000 is outside \[0, vocabulary size="):
        stopline.FinishTracker(stopline.StopParams(tool_call_marker_ids=[(1, 10**6)]), vocabulary=v)


# ------------------------------------------------------------- bad input --


def test_a_tool_call_marker_with_a_lone_surrogate_is_a_value_error_naming_the_element() -> None:
    # As stop[i] (docs/errors.md): a ValueError naming the element.
    for impl in (baseline, stopline):
        with pytest.raises(stopline.StoplineValueError) as e:
            impl.StopParams(tool_call_markers=[("\ud800", "</t>")])
        assert (e.value.field, e.value.kind) == ("tool_call_markers[0][0]", "lone_surrogate")
    assert "not valid Unicode" in str(e.value)


def test_a_str_is_not_a_tool_call_marker_pair() -> None:
    # ["{}"] would otherwise open a span at every "{" and close it at "}".
    for impl in (stopline, baseline):
        with pytest.raises(stopline.StoplineTypeError) as e:
            impl.StopParams(tool_call_markers=["{}"])
        assert (e.value.field, e.value.kind) == ("tool_call_markers[0]", "single_str")


@pytest.mark.parametrize("kw", [
    {"tool_call_markers": [{"<tool_call>", "</tool_call>"}]},
    {"tool_call_markers": [{"<tool_call>": 1, "</tool_call>": 2}]},
    {"tool_call_marker_ids": [frozenset([151657, 151658])]},
], ids=repr)
def test_a_set_or_a_mapping_is_not_a_tool_call_marker_pair(kw: dict[str, Any]) -> None:
    """A set has no order: {"<tool_call>", "</tool_call>"} was read as a pair
    in hash order, so which marker opened the span changed from one process
    to the next (str hashes are seeded per process). The core, the baseline
    and the engines' reader refuse it, naming the pair."""
    from stopline.engines import reasoning_config

    for build in (stopline.StopParams, baseline.StopParams, reasoning_config):
        with pytest.raises(stopline.StoplineTypeError) as e:
            build(**kw) if build is not reasoning_config else build(kw)
        field = next(iter(kw)) + "[0]"
        assert (e.value.field, e.value.kind) == (field, "wrong_type")
        assert "pair in order" in str(e.value)


def test_a_pair_of_the_wrong_length_and_an_over_cap_marker_name_the_element() -> None:
    with pytest.raises(ValueError, match=r"^tool_call_markers\[0\] has 3 items; a \(start, end\) pair has exactly 2$"):
        stopline.StopParams(tool_call_markers=[("<a>", "</a>", "x")])
    with pytest.raises(ValueError) as e:
        stopline.StopParams(tool_call_markers=[("<a>", "</a>"), ("<b>", "b" * 1025)])
    assert str(e.value).startswith('tool_call_markers[1][1]="bbb')
    assert "is longer than max_marker_bytes=1024 UTF-8 bytes" in str(e.value)
    assert e.value.kind == "too_many_bytes"  # type: ignore[attr-defined]


def test_an_end_id_may_be_another_pairs_start_id() -> None:
    # semantics.md 11.10: only start ids are awaited together; inside a span
    # only its own end is, so (1, 2), (2, 3) is unambiguous: 2 closes the first
    # span, a later 2 opens the second.
    kw = {"tool_call_marker_ids": [(1, 2), (2, 3)], "stop_token_ids": [9]}
    for impl in (stopline, baseline):
        t = impl.FinishTracker(impl.StopParams(**kw))
        t.update([1, 9, 2, 2, 9])  # 9 inside either span is an ordinary token
        assert not t.finished and t.in_tool_call
        t.update([3])
        assert not t.in_tool_call
        t.update([9])
        assert (t.finish_reason, t.stop_reason, t.num_tokens) == ("stop", 9, 7)
    with pytest.raises(ValueError, match="overlaps another pair's start"):
        stopline.StopParams(tool_call_marker_ids=[(1, 2), (1, 3)])


def test_an_ids_only_step_with_text_span_markers_names_the_span_markers() -> None:
    """The error said "reasoning markers given as text" for a request with
    no reasoning markers at all (text span markers, or span texts beside
    block marker ids)."""
    for kw in ({"tool_call_markers": [("<a>", "</a>")]},
               {"reasoning_end_id": 5, "tool_call_markers": [("<a>", "</a>")]}):
        with pytest.raises(stopline.StoplineValueError, match="tool-call markers given as text") as e:
            stopline.FinishTracker(stopline.StopParams(**kw)).update([1])
        assert (e.value.field, e.value.kind) == ("texts", "required")
    with pytest.raises(stopline.StoplineValueError, match="reasoning markers given as text"):
        stopline.FinishTracker(stopline.StopParams(reasoning_end="</think>")).update([1])
