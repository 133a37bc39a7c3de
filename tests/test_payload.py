"""HeldPayloads releases each token's payload exactly with its id.

Random stop lists, pieces and accept runs through FinishBatch: at every step
the payloads released for a row are the payloads of the ids in that row's
``token_ids_deltas``, in order, and nothing past a stop is ever released.
"""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

import stopline
from stopline.payload import HeldPayloads

PIECES = ["a", "b", "ab", "ST", "OP", "S", "TOP", " ", "x"]


@given(
    st.lists(st.sampled_from(["STOP", "ab", "TOPx", "b b"]), min_size=0, max_size=3),
    st.lists(st.tuples(st.integers(0, 2), st.lists(st.integers(0, len(PIECES) - 1), min_size=1, max_size=4)),
             min_size=1, max_size=25),
    st.booleans(),
)
def test_payloads_follow_released_ids(stops, steps, include):
    batch = stopline.FinishBatch(3)
    held = HeldPayloads(3)
    for slot in range(3):
        batch.add(slot, stopline.StopParams(stop=stops or None, include_stop_str_in_output=include, max_tokens=30))
    next_id = [0, 0, 0]
    live = {0, 1, 2}
    for slot, run in steps:
        if slot not in live:
            continue
        ids = [next_id[slot] + k for k in range(len(run))]
        next_id[slot] += len(run)
        res = batch.step([slot], ids, [len(ids)], [PIECES[p] for p in run])
        # The payload of token id t is the float t / 2, pushed as one chunk per run.
        released = held.step(res, [[t / 2 for t in ids]])
        flat = [v for chunk in released[0] for v in chunk]
        assert flat == [t / 2 for t in res.token_ids_deltas[0]]
        assert res.released_counts == [len(d) for d in res.token_ids_deltas]
        if res.finished_flags[0]:
            live.discard(slot)
            assert held.held(slot) == 0


def test_release_more_than_held_names_the_slot():
    held = HeldPayloads(2)
    held.push(1, [0.5])
    try:
        held.release(1, 2)
    except ValueError as e:
        assert "slot 1" in str(e) and "only 1" in str(e)
    else:
        raise AssertionError("no error")


def test_docs_integrations_examples_without_engines():
    """The engine-free example of docs/integrations.md (HeldPayloads) runs as written."""
    from doc_blocks import run_python_blocks

    run_python_blocks("docs/integrations.md", "HeldPayloads")


def test_held_payloads_allocate_nothing_up_front_and_cap_max_slots():
    """Issue 22: HeldPayloads(2**24) took ~10 GiB up front and HeldPayloads(10**30)
    had no cap. Now the cap is FinishBatch's (LIMITS["max_slots"]) and a slot's
    queue exists only while it holds payloads."""
    import tracemalloc

    from stopline.payload import MAX_SLOTS

    assert MAX_SLOTS == stopline.LIMITS["max_slots"]
    tracemalloc.start()
    try:
        held = HeldPayloads(MAX_SLOTS)
        held.push(MAX_SLOTS - 1, [1.0, 2.0])
        assert tracemalloc.get_traced_memory()[1] < 1 << 20
    finally:
        tracemalloc.stop()
    assert held.max_slots == MAX_SLOTS and held.held(MAX_SLOTS - 1) == 2
    assert held.release(MAX_SLOTS - 1, 2) == [[1.0, 2.0]] and held.held(MAX_SLOTS - 1) == 0
    for bad in (10**30, MAX_SLOTS + 1, 0, -1):
        with pytest.raises(ValueError, match=r"max_slots must be in \[1, 16777216\]"):
            HeldPayloads(bad)


@pytest.mark.parametrize("call,exc,says", [
    (lambda h: h.release(1, -2), ValueError, "slot 1: count must be >= 0, got -2"),
    (lambda h: h.release(1, True), TypeError, "count must be an int, got bool"),
    (lambda h: h.release(1, 1.5), TypeError, "count must be an int, got float"),
    (lambda h: h.release(True, 1), TypeError, "slot must be an int, got bool"),
    (lambda h: h.push(1, 5), TypeError, "slot 1: chunk must have len() and slicing, got int"),
    (lambda h: h.held(2), ValueError, "slot must be in [0, 2), got 2"),
    (lambda h: h.held(10**5000), ValueError, "slot must be in [0, 2), got"),
    (lambda h: h.release(1, 10**5000), ValueError, "slot 1: releasing"),
    (lambda h: h.step(object()), TypeError, "result must be a BatchStepResult, got object"),
    (lambda h: HeldPayloads(True), TypeError, "max_slots must be an int, got bool"),
    (lambda h: HeldPayloads("8"), TypeError, "max_slots must be an int, got str"),
])
def test_held_payloads_bad_arguments_name_the_field_briefly(call, exc, says):
    """Issue 22: a negative count grew the held count, True passed as a count,
    and bad values raised IndexError / bare TypeErrors or echoed whole values.
    Now each names its field and shows a value bounded; nothing changes."""
    held = HeldPayloads(2)
    held.push(1, [0.5])
    with pytest.raises(exc) as info:
        call(held)
    assert says in str(info.value) and len(str(info.value)) < 300
    assert held.held(1) == 1


def test_a_chunk_that_shrank_after_push_is_a_named_error():
    """A list the engine changed after pushing it leaves the queue short: a
    ValueError naming the slot (was an IndexError from the queue)."""
    held = HeldPayloads(2)
    chunk = [1, 2, 3]
    held.push(0, chunk)
    del chunk[1:]
    with pytest.raises(ValueError, match="slot 0: the held chunks cover fewer tokens"):
        held.release(0, 3)
    assert held.held(0) == 0


def test_payload_errors_carry_field_kind_and_slot():
    """Issue 24: HeldPayloads' argument errors are the core's classes, with the
    slot at fault where there is one; the messages are unchanged."""
    held = HeldPayloads(4)

    def data(info):
        e = info.value
        return type(e), e.field, e.slot, e.kind

    with pytest.raises(ValueError, match=r"slot must be in \[0, 4\), got 7") as info:
        held.push(7, [1])
    assert data(info) == (stopline.StoplineValueError, "slot", 7, "out_of_range")
    with pytest.raises(TypeError, match="slot 1: chunk must have len") as info:
        held.push(1, 5)
    assert data(info) == (stopline.StoplineTypeError, "chunk", 1, "wrong_type")
    held.push(2, [1, 2])
    with pytest.raises(ValueError, match="slot 2: releasing 3 tokens but only 2 are held") as info:
        held.release(2, 3)
    assert data(info) == (stopline.StoplineValueError, "count", 2, "greater")
    with pytest.raises(ValueError, match="slot 2: count must be >= 0") as info:
        held.release(2, -1)
    assert data(info) == (stopline.StoplineValueError, "count", 2, "below")
    # The count of a slot's release names the slot, as every other error of
    # that release does (a bool count named none).
    with pytest.raises(TypeError, match="slot 2: count must be an int, got bool") as info:
        held.release(2, True)
    assert data(info) == (stopline.StoplineTypeError, "count", 2, "wrong_type")
    with pytest.raises(ValueError, match="max_slots must be in") as info:
        HeldPayloads(0)
    assert data(info) == (stopline.StoplineValueError, "max_slots", None, "out_of_range")
    with pytest.raises(TypeError, match="result must be a BatchStepResult, got int") as info:
        held.step(3)
    assert data(info) == (stopline.StoplineTypeError, "result", None, "wrong_type")


def test_a_numpy_bool_count_is_named_unambiguously():
    """NumPy's bool is not an int (it has no ``__index__``): refused like
    ``True``, its type named ``numpy.bool``, not a bare ``bool``."""
    np = pytest.importorskip("numpy")
    held = HeldPayloads(4)
    held.push(0, [1])
    with pytest.raises(TypeError) as info:
        held.release(0, np.True_)
    e = info.value
    assert (e.field, e.slot, e.kind) == ("count", 0, "wrong_type")
    assert str(e) == f"slot 0: count must be an int, got numpy.{type(np.True_).__qualname__}"
