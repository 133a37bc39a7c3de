"""Snapshot size and the cost of snapshot + restore (semantics.md 12).

A mid-stream sequence with four stop strings and nothing held back (the
issue's target case), at several output lengths, as a ``FinishTracker``
with texts (also inside an open ``<think>`` block with stops scoped
``any``) and as an ids-only ``FinishBatch`` slot over a real tokenizer
(``stopline.tools.vocab_files``; skipped when the file cannot be had).
Printed per case:

* ``bytes``: the snapshot's size, and its size less the kept text (the
  fixed part plus the varint token ids);
* ``snapshot``, ``restore``, ``both``: per call, the best of ``--reps``
  rounds of ``--n`` calls in thread CPU time (so other processes on a shared
  machine count less; one Python call each, its overhead included);
* ``vs new``: ``both`` over building a fresh ``FinishTracker`` from the same
  params (the floor of any restore), measured in the same run.

    python benches/bench_snapshot.py [--reps 7] [--n 2000] [--json]
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any, Callable

import stopline
from stopline import FinishBatch, FinishTracker, StopParams

STOPS = ["</s>", "User:", "\n\n\n", "<|im_end|>"]


def per_call(fn: Callable[[], Any], n: int, reps: int) -> float:
    best = float("inf")
    for _ in range(reps):
        t0 = time.thread_time()
        for _ in range(n):
            fn()
        best = min(best, (time.thread_time() - t0) / n)
    return best


def tracker_case(tokens: int, n: int, reps: int, think: bool = False) -> dict[str, Any]:
    extra: dict[str, Any] = {}
    if think:
        extra = {"reasoning_start": "<think>", "reasoning_end": "</think>", "reasoning_starts_in": "reasoning",
                 "stop_scopes": "any"}
    params = StopParams(stop=STOPS, max_tokens=100_000, **extra)
    t = FinishTracker(params)
    for i in range(tokens):
        t.update([1000 + i % 30000], ["word "])
    data = t.snapshot()
    assert FinishTracker.restore(params, data).snapshot() == data
    snap = per_call(t.snapshot, n, reps)
    rest = per_call(lambda: FinishTracker.restore(params, data), n, reps)
    both = per_call(lambda: FinishTracker.restore(params, t.snapshot()), n, reps)
    new = per_call(lambda: FinishTracker(params), n, reps)
    name = "tracker in <think>" if think else "tracker"
    return {"case": f"{name}, {tokens} tokens", "bytes": len(data),
            "bytes_less_text": len(data) - len(t.text.encode()), "snapshot_us": snap * 1e6,
            "restore_us": rest * 1e6, "both_us": both * 1e6, "new_us": new * 1e6}


def batch_case(tokens: int, n: int, reps: int) -> dict[str, Any] | None:
    from stopline.tools.models import ModelFileError
    from stopline.tools.vocab_files import tokenizer_json_path

    try:
        path = tokenizer_json_path("smollm2")
    except ModelFileError:
        return None
    vocab = stopline.Vocabulary.from_file(path)
    params = StopParams(stop=STOPS, max_tokens=100_000)
    b = FinishBatch(4, vocab)
    b.add(0, params)
    for i in range(tokens):
        b.step([0], [1000 + i % 30000])
    data = b.snapshot(0)
    text = b.text(0)

    def both() -> None:
        b.restore(1, params, b.snapshot(0))
        b.remove(1)

    def restore() -> None:
        b.restore(1, params, data)
        b.remove(1)

    def add() -> None:
        b.add(1, params)
        b.remove(1)

    snap = per_call(lambda: b.snapshot(0), n, reps)
    rest = per_call(restore, n, reps)
    both_t = per_call(both, n, reps)
    new = per_call(add, n, reps)
    return {"case": f"ids-only slot (smollm2), {tokens} tokens", "bytes": len(data),
            "bytes_less_text": len(data) - len(text.encode()), "snapshot_us": snap * 1e6,
            "restore_us": rest * 1e6, "both_us": both_t * 1e6, "new_us": new * 1e6}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--n", type=int, default=2000)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    rows: list[dict[str, Any]] = []
    for tokens in (16, 256, 4096):
        rows.append(tracker_case(tokens, a.n, a.reps))
        rows.append(tracker_case(tokens, a.n, a.reps, think=True))
        r = batch_case(tokens, a.n, a.reps)
        if r is not None:
            rows.append(r)
    if a.json:
        print(json.dumps(rows, indent=1))
        return
    print(f"{'case':42} {'bytes':>7} {'less text':>9} {'snapshot':>9} {'restore':>9} {'both':>9} {'vs new':>7}")
    for r in rows:
        print(f"{r['case']:42} {r['bytes']:7d} {r['bytes_less_text']:9d} {r['snapshot_us']:8.2f}u"
              f" {r['restore_us']:8.2f}u {r['both_us']:8.2f}u {r['both_us'] / r['new_us']:6.1f}x")


if __name__ == "__main__":
    main()
