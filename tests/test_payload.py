"""HeldPayloads releases each token's payload exactly with its id.

Random stop lists, pieces and accept runs through FinishBatch: at every step
the payloads released for a row are the payloads of the ids in that row's
``token_ids_deltas``, in order, and nothing past a stop is ever released.
"""

from __future__ import annotations

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
