"""Snapshots of one sequence (``FinishTracker.snapshot`` / ``restore``,
``FinishBatch.snapshot`` / ``restore``, pickling through them): restoring
after any step and feeding the rest gives what an uninterrupted run gives,
restore then snapshot gives the same bytes, and bytes that are not a
snapshot of these params are refused by field and kind (semantics.md 12)."""

from __future__ import annotations

import copy
import pickle
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_finish import scenarios
from test_reasoning import cases as reasoning_cases
from test_reasoning import fields as reasoning_fields

import stopline
from stopline import FinishBatch, FinishTracker, StopParams

PROTOCOLS = range(2, pickle.HIGHEST_PROTOCOL + 1)
RESULT = ("text_delta", "token_ids_delta", "finished", "finish_reason", "stop_reason", "matched")


def seen(r: Any) -> tuple[Any, ...]:
    return tuple(getattr(r, f) for f in RESULT)


def state(t: FinishTracker) -> tuple[Any, ...]:
    return (t.finished, t.finish_reason, t.stop_reason, t.matched, t.text, t.token_ids, t.emitted_len)


def moved(t: FinishTracker, params: StopParams, how: int) -> FinishTracker:
    """`t` handed over: by snapshot and restore, by pickle, or by copy."""
    data = t.snapshot()
    if how == 0:
        back = FinishTracker.restore(params, data)
    elif how == 1:
        back = pickle.loads(pickle.dumps(t, protocol=PROTOCOLS[len(data) % len(PROTOCOLS)]))
    else:
        back = copy.deepcopy(t)
    assert back.snapshot() == data and state(back) == state(t)
    return back


@settings(max_examples=200, deadline=None)
@given(scenarios(), st.lists(st.integers(0, 2), min_size=25, max_size=25), st.booleans())
def test_restored_after_every_step_equals_an_uninterrupted_run(sc: Any, hows: list[int], aligned: bool) -> None:
    kw, ids, pieces, use_texts, gpos, runs, abort = sc
    params = StopParams(**kw, token_aligned=aligned)
    a = FinishTracker(params)
    b = moved(FinishTracker(params), params, hows[0])
    for k, (lo, hi) in enumerate(runs):
        if a.finished:
            break
        g = gpos - lo if gpos is not None and lo <= gpos < hi else None
        texts = pieces[lo:hi] if use_texts else None
        assert seen(a.update(ids[lo:hi], texts, g)) == seen(b.update(ids[lo:hi], texts, g))
        b = moved(b, params, hows[k + 1])
    if abort:
        assert seen(a.abort()) == seen(b.abort())
    assert state(a) == state(b) and a.snapshot() == moved(b, params, 0).snapshot()


@settings(max_examples=100, deadline=None)
@given(
    st.lists(st.sampled_from(["a", "b", "ab", "é", "日本", "🙂", "\n", "xy", "z"]), min_size=1, max_size=25),
    st.sampled_from([[], [r"(?s).*zz"], [r"b\.?$", r"x+y", r"日本+é"]]),
    st.integers(0, 3),
    st.booleans(),
)
def test_stop_regex_threads_survive_a_restore(pieces: list[str], regexes: list[str], min_tokens: int,
                                              include: bool) -> None:
    params = StopParams(stop_regex=regexes, stop=["zzz", "ab"], min_tokens=min_tokens,
                        include_stop_str_in_output=include)
    a, b = FinishTracker(params), FinishTracker(params)
    for i, p in enumerate(pieces):
        if a.finished:
            break
        b = FinishTracker.restore(params, b.snapshot())
        assert seen(a.update([i], [p])) == seen(b.update([i], [p]))
    assert state(a) == state(b)


def _real_vocab(name: str) -> tuple[stopline.Vocabulary, list[int]]:
    from stopline.tools.models import ModelFileError
    from stopline.tools.vocab_files import tokenizer_json_path

    try:
        path = tokenizer_json_path(name)
    except ModelFileError as exc:
        pytest.skip(f"{name}: {exc}")
    from tokenizers import Tokenizer

    ids = Tokenizer.from_file(str(path)).encode("héllo wörld € 😀🎉 日本語 STOP naïve\n\nUser: x").ids
    return stopline.Vocabulary.from_file(path), ids


@pytest.mark.parametrize("name", ["smollm2", "mistral-v1"])
@settings(max_examples=30, deadline=None)
@given(data=st.data())
def test_ids_only_slots_move_between_batches(name: str, data: Any) -> None:
    """A real tokenizer's ids, with characters split across byte tokens: each
    step, the slot moves to another slot of another batch."""
    vocab, text_ids = _real_vocab(name)
    ids = data.draw(st.lists(st.sampled_from(text_ids), min_size=1, max_size=30))
    params = StopParams(stop=data.draw(st.sampled_from([[], ["STOP"], ["日本", "\n\n"]])),
                        max_tokens=data.draw(st.integers(2, 40)),
                        min_tokens=data.draw(st.integers(0, 2)))
    a = FinishBatch(4, vocab)
    a.add(1, params)
    b = FinishBatch(4, vocab)
    b.add(0, params)
    slot = 0
    for i in ids:
        if a.result(1).finished:
            break
        data_ = b.snapshot(slot)
        b = FinishBatch(4, vocab)
        slot = (slot + 1) % 4
        b.restore(slot, params, data_)
        assert b.snapshot(slot) == data_
        ra, rb = a.step([1], [i]), b.step([slot], [i])
        assert (ra.text_deltas, ra.token_ids_deltas, ra.finish_reasons) == (
            rb.text_deltas, rb.token_ids_deltas, rb.finish_reasons)
    t = FinishTracker.restore(params, b.snapshot(slot), vocabulary=vocab)
    assert (t.text, t.token_ids) == (a.text(1), a.token_ids(1))


def _mid_stream() -> tuple[StopParams, FinishTracker, bytes]:
    params = StopParams(stop=["STOP", "ab", "日本"], stop_regex=["x+y"], max_tokens=100, stop_token_ids=[5])
    t = FinishTracker(params)
    t.update([1, 2, 3], ["hello ", "wor日", "ld xxa"])
    return params, t, t.snapshot()


def _refused(params: StopParams, data: Any, **kw: Any) -> tuple[type, str | None, str]:
    with pytest.raises((stopline.StoplineValueError, stopline.StoplineTypeError)) as info:
        FinishTracker.restore(params, data, **kw)
    return type(info.value), info.value.field, info.value.kind


def test_truncated_flipped_or_longer_bytes_are_refused_by_field_and_kind() -> None:
    params, _, data = _mid_stream()
    for n in range(len(data)):
        cls, field, kind = _refused(params, data[:n])
        assert cls is stopline.StoplineValueError and field and kind in ("snapshot_format", "snapshot_truncated")
    for i in range(len(data)):
        flipped = bytearray(data)
        flipped[i] ^= 0x41
        cls, field, kind = _refused(params, bytes(flipped))
        assert cls is stopline.StoplineValueError and field and kind.startswith("snapshot_")
    assert _refused(params, data + b"\0")[1:] == ("body", "snapshot_invalid")


def test_foreign_bytes_params_and_vocabulary_are_refused() -> None:
    params, _, data = _mid_stream()
    assert _refused(StopParams(stop=["STOP", "ab", "日本"]), data)[1:] == ("params", "snapshot_params")
    assert _refused(params, b"\x80\x04K\x01." + bytes(40))[1:] == ("data", "snapshot_format")
    assert _refused(params, data[:4] + b"\x09\x00" + data[6:])[1:] == ("version", "snapshot_version")
    assert _refused(params, bytearray(data)) == (stopline.StoplineTypeError, "data", "wrong_type")
    assert _refused(params, "text")[0] is stopline.StoplineTypeError
    vocab = stopline.Vocabulary.from_str('{"model": {"vocab": {"a": 0, "b": 1}}}')
    assert _refused(params, data, vocabulary=vocab)[1:] == ("vocabulary", "snapshot_vocabulary")
    with_vocab = FinishTracker(params, vocab).snapshot()
    assert _refused(params, with_vocab)[1:] == ("vocabulary", "snapshot_vocabulary")
    other = stopline.Vocabulary.from_str('{"model": {"vocab": {"a": 0, "c": 1}}}')
    assert _refused(params, with_vocab, vocabulary=other)[1:] == ("vocabulary", "snapshot_vocabulary")
    assert FinishTracker.restore(params, with_vocab, vocabulary=vocab).snapshot() == with_vocab


def test_a_failed_batch_restore_changes_nothing() -> None:
    params, _, data = _mid_stream()
    b = FinishBatch(4)
    b.add(2, params)
    before = (len(b), repr(b), b.snapshot(2))
    with pytest.raises(stopline.StoplineValueError) as info:
        b.restore(2, params, data)
    assert info.value.kind == "slot"
    for p, d in ((params, data[:-1]), (params, data[:10]), (StopParams(), data)):
        with pytest.raises(stopline.StoplineValueError) as info:
            b.restore(1, p, d)
        assert info.value.slot == 1 and info.value.kind.startswith("snapshot_")
    assert (len(b), repr(b), b.snapshot(2)) == before
    with pytest.raises(stopline.StoplineValueError):
        b.snapshot(1)
    b.restore(1, params, data)
    r = b.step([1, 2], [4, 4], texts=["xy", "xy"])
    assert r.finish_reasons == ["stop", "stop"] and (b.text(1), b.text(2)) == ("hello wor日ld xxa", "")


@settings(max_examples=150, deadline=None)
@given(reasoning_cases(), st.sampled_from([None, [("<tool_call>", "</tool_call>")]]),
       st.lists(st.integers(0, 2), min_size=26, max_size=26))
def test_reasoning_channels_spans_and_budget_survive_a_restore(case: Any, spans: Any, hows: list[int]) -> None:
    """Channels (markers split across pieces, held partial markers), tool-call
    spans and the thinking budget's forced ids: handed over after every
    step, the copy streams what the original streams."""
    kw, toks, cuts = case
    if spans:
        kw = dict(kw, tool_call_markers=spans)
    params = StopParams(**kw)
    a = FinishTracker(params)
    b = moved(FinishTracker(params), params, hows[0])
    for k, (i, piece) in enumerate(toks):
        if a.finished:
            break
        assert reasoning_fields(a.update([i], [piece])) == reasoning_fields(b.update([i], [piece]))
        assert (b.forced_token_id, b.reasoning_tokens, b.in_tool_call, b.channel) == (
            a.forced_token_id, a.reasoning_tokens, a.in_tool_call, a.channel)
        b = moved(b, params, hows[k + 1])
    assert (a.reasoning, a.content, a.reasoning_token_ids, a.content_token_ids) == (
        b.reasoning, b.content, b.reasoning_token_ids, b.content_token_ids)
    assert reasoning_fields(a.abort()) == reasoning_fields(b.abort())


def test_a_tracker_pickles_finished_or_running() -> None:
    params, t, _ = _mid_stream()
    for obj in (t, FinishTracker(StopParams())):
        for p in PROTOCOLS:
            back = pickle.loads(pickle.dumps(obj, protocol=p))
            assert type(back) is FinishTracker and state(back) == state(obj)
    back = pickle.loads(pickle.dumps(t, protocol=2))
    r = back.update([4], ["xyz"])
    assert seen(r) == seen(t.update([4], ["xyz"]))
    assert (r.finish_reason, r.text_delta, back.text) == ("stop", "a", "hello wor日ld xxa")
    t.abort()
    assert state(copy.copy(t)) == state(t)
