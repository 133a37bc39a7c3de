"""Pickling and copying of the immutable parameter objects: an engine sends a
request's ``StopParams`` (and compiled stop lists) to another process, or
copies them, and gets objects that behave as the originals. A
``FinishTracker`` pickles through its snapshot (tests/test_snapshot.py); the
other per-sequence objects and step results refuse it when dumped."""

from __future__ import annotations

import copy
import json
import pickle
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_finish import drive, scenarios
from test_reasoning import cases as reasoning_cases
from test_reasoning import drive as drive_channels

import stopline

PROTOCOLS = range(2, pickle.HIGHEST_PROTOCOL + 1)


def round_trips(obj: Any) -> list[Any]:
    return [pickle.loads(pickle.dumps(obj, protocol=p)) for p in PROTOCOLS] + [copy.copy(obj), copy.deepcopy(obj)]


@settings(max_examples=150, deadline=None)
@given(scenarios())
def test_unpickled_stop_params_finish_as_the_originals(sc: Any) -> None:
    kw = sc[0]
    original = stopline.StopParams(**kw)
    _, expected, snaps = drive(stopline, sc)
    for p in round_trips(original):
        assert type(p) is stopline.StopParams and repr(p) == repr(original)
        tr = stopline.FinishTracker(p)
        got = []
        for a, b in sc[5]:
            if tr.finished:
                break
            g = sc[4] - a if sc[4] is not None and a <= sc[4] < b else None
            got.append(tr.update(sc[1][a:b], sc[2][a:b] if sc[3] else None, g))
        if sc[6]:
            got.append(tr.abort())
        assert [repr(r) for r in got] == [repr(r) for r in expected]


@settings(max_examples=100, deadline=None)
@given(reasoning_cases(), st.sampled_from([None, [("<tool_call>", "</tool_call>")]]))
def test_unpickled_reasoning_params_split_channels_as_the_originals(case: Any, spans: Any) -> None:
    kw, toks, _ = case
    if spans:
        kw = dict(kw, tool_call_markers=spans)
    original = stopline.StopParams(**kw)
    steps, t = drive_channels(stopline, original, toks, range(1, len(toks) + 1))
    for p in round_trips(original):
        assert repr(p) == repr(original)
        assert (p.reasoning, p.tool_call_markers, p.token_aligned) == (
            original.reasoning, original.tool_call_markers, original.token_aligned)
        steps2, t2 = drive_channels(stopline, p, toks, range(1, len(toks) + 1))
        assert steps2 == steps and (t2.reasoning, t2.content) == (t.reasoning, t.content)


def test_every_option_survives_a_round_trip() -> None:
    kw: dict[str, Any] = dict(
        max_tokens=9, min_tokens=2, prompt_len=3, max_model_len=40, eos_token_ids=[2], ignore_eos=True,
        stop_token_ids=[7, 8], stop=["ab", "日"], include_stop_str_in_output=True, vocab_size=100,
        repetition={"max_pattern_size": 3, "min_pattern_size": 1, "min_count": 3}, stop_regex=["x+y"],
        reasoning_start="<think>", reasoning_start_id=10, reasoning_end="</think>", reasoning_end_id=11,
        reasoning_end_ids=[11, 12], reasoning_starts_in="reasoning", keep_reasoning_markers=True,
        max_reasoning_tokens=5, stop_scopes=["reasoning", "any"], stop_regex_scopes="any",
        stop_token_id_scopes=["content", "reasoning"], token_aligned=True,
        tool_call_markers=[("<tool_call>", "</tool_call>")], tool_call_marker_ids=[(20, 21)],
    )
    original = stopline.StopParams(**kw)
    for p in round_trips(original):
        assert repr(p) == repr(original)
        for name in ("max_tokens", "min_tokens", "prompt_len", "max_model_len", "eos_token_ids", "ignore_eos",
                     "stop_token_ids", "stop", "include_stop_str_in_output", "vocab_size", "repetition",
                     "stop_regex", "reasoning", "token_aligned", "tool_call_markers", "tool_call_marker_ids",
                     "reads_prompt_by_ids"):
            assert getattr(p, name) == getattr(original, name), name
    # Spans alone (no reasoning block), and nothing set at all.
    for alone in (stopline.StopParams(tool_call_marker_ids=[(20, 21)]), stopline.StopParams()):
        for p in round_trips(alone):
            assert repr(p) == repr(alone)


@pytest.mark.parametrize("cls, entries", [(stopline.StopStrings, ["STOP", "日本"]), (stopline.StopRegexes, [r"\d+\.", "x|y"])])
def test_compiled_stop_lists_round_trip(cls: Any, entries: list[str]) -> None:
    original = cls(entries)
    text = "ab 12. x 日本 STOP"
    for c in round_trips(original):
        assert type(c) is cls and repr(c) == repr(original) and len(c) == len(original)
        m, m0 = c.matcher(), original.matcher()
        assert [m.feed(ch) for ch in text] == [m0.feed(ch) for ch in text]


def test_an_unpickled_params_is_validated_again() -> None:
    """The pickle holds keyword arguments, and building from them checks them as the
    constructor does: a tampered pickle cannot make an invalid StopParams."""
    p = stopline.StopParams(max_tokens=3)
    cls, args, kwargs = p.__reduce_ex__(4)[1][:3]
    assert cls is stopline.StopParams and args == () and kwargs["max_tokens"] == 3
    with pytest.raises(stopline.StoplineValueError, match="max_tokens"):
        cls.__new__(cls, *args, **dict(kwargs, max_tokens=0))


def _per_sequence_objects() -> dict[str, Any]:
    """One of each object that holds one sequence's state or one step's result."""
    vocab = stopline.Vocabulary.from_str(json.dumps({"model": {"vocab": {"a": 0, "b": 1}}}))
    tracker = stopline.FinishTracker(stopline.StopParams(max_tokens=4))
    decoding = stopline.FinishTracker(stopline.StopParams(max_tokens=4), vocab)
    batch = stopline.FinishBatch(2)
    batch.add(0, stopline.StopParams(max_tokens=1))
    return {
        "StopMatcher": stopline.StopStrings(["ab"]).matcher(),
        "StopRegexMatcher": stopline.StopRegexes(["a+"]).matcher(),
        "StopMatch": stopline.StopStrings(["ab"]).matcher().feed("xab"),
        "FinishTracker": decoding,
        "StepResult": tracker.update([1], ["a"]),
        "FinishBatch": batch,
        "BatchStepResult": batch.step([0], [1]),
        "Vocabulary": vocab,
        "IncrementalDecoder": vocab.decoder_for(),
    }


@pytest.mark.parametrize("name", list(_per_sequence_objects()))
def test_per_sequence_objects_refuse_pickling_when_dumped(name: str) -> None:
    """Refused at dump time on every protocol (0 and 1 included, which would
    otherwise write a pickle that fails only when another process loads it),
    and by copy, with the class named and what to send instead."""
    obj = _per_sequence_objects()[name]
    assert type(obj).__name__ == name
    # A FinishTracker pickles through its snapshot; one that decodes with a
    # Vocabulary (which does not pickle) refuses.
    calls = [lambda p=p: pickle.dumps(obj, protocol=p) for p in range(pickle.HIGHEST_PROTOCOL + 1)]
    for call in [*calls, lambda: copy.copy(obj), lambda: copy.deepcopy(obj)]:
        with pytest.raises(stopline.StoplineTypeError, match=f"cannot pickle 'stopline.{name}' object: ") as info:
            call()
        assert (info.value.field, info.value.kind) == (None, "unsupported")
