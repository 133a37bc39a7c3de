"""Deterministic instruction counts of the finish hot paths, for callgrind
(docs/benchmarks.md, "Profiles"): the suite's real SmolLM2 pieces and
parameters, 256 sequences x 50 steps of ``FinishBatch.step`` with the engine
reading ``finished_slots`` and ``text_deltas`` each step, or 5 000
``FinishTracker.update`` calls of one token with its piece.

    valgrind --tool=callgrind \\
        --toggle-collect='*PyFinishBatch*__pymethod_step__*' \\
        --toggle-collect='*PyBatchStepResult*finished_slots*' \\
        --toggle-collect='*PyBatchStepResult*text_deltas*' \\
        python benches/callgrind_step.py lists      # or: range, tracker
    callgrind_annotate callgrind.out.*

``lists``: ``slots`` and ``token_ids`` plain lists; ``range``: ``slots`` a
``range`` and the ids a NumPy int64 array; ``tracker`` (collect with
``--toggle-collect='*PyFinishTracker*__pymethod_update__*'``); ``ids``: the
ids-only step (no texts, no stop strings) and ``ids-reasoning`` the same with
reasoning marker ids, every sequence inside the block (issue 21's 1.15x
target; benches/bench_reasoning.py times the two); ``vocab`` the ids-only
step of a batch with the SmolLM2 ``Vocabulary`` (each slot decodes its ids);
``ids-spans`` / ``lists-spans``: ``ids`` / ``lists`` with tool-call span
markers (ids ``(5, 6)`` / texts ``<tool_call>``, ``</tool_call>``; no span
ever opens), the cost of configuring spans (docs/semantics.md 11.10);
``lists-reasoning``: ``lists`` with reasoning marker texts, every sequence
inside the block and every stop scoped ``any`` (the text-marker channel path).
"""

from __future__ import annotations

import sys

import stopline
from stopline.tools.bench import data
from stopline.tools.bench.suites import finish_params

BATCH, STEPS = 256, 50


def main(mode: str) -> int:
    pieces = list(data.text_pieces(200_000)[0])
    extra: dict[str, object] = {}
    if mode == "lists-spans":
        extra = {"tool_call_markers": [("<tool_call>", "</tool_call>")]}
    if mode == "lists-reasoning":
        extra = {"reasoning_start": "<think>", "reasoning_end": "</think>", "reasoning_starts_in": "reasoning",
                 "stop_scopes": "any"}
    params = stopline.StopParams(**finish_params(pieces), **extra)  # type: ignore[arg-type]
    done = 0
    if mode == "vocab":
        from stopline.tools.models import smollm2_tokenizer_dir

        vocab = stopline.Vocabulary.from_file(smollm2_tokenizer_dir() / "tokenizer.json")
        vb = stopline.FinishBatch(BATCH, vocabulary=vocab)
        for s in range(BATCH):
            vb.add(s, stopline.StopParams(eos_token_ids=[2], max_tokens=1 << 30), prompt_token_ids=[1, 2, 3])
        order = list(range(BATCH))
        for k in range(STEPS):
            r = vb.step(order, [100 + (s * 31 + k) % 30_000 for s in order])
            done += len(r.finished_slots) + len(r.text_deltas)
        return done
    if mode in ("ids", "ids-reasoning", "ids-spans"):
        kw: dict[str, object] = {"eos_token_ids": [2], "stop_token_ids": [3, 4], "max_tokens": 1 << 30}
        if mode == "ids-reasoning":
            kw.update(reasoning_start_id=5, reasoning_end_id=6, reasoning_starts_in="reasoning")
        if mode == "ids-spans":
            kw.update(tool_call_marker_ids=[(5, 6)])
        ids_params = stopline.StopParams(**kw)  # type: ignore[arg-type]
        b = stopline.FinishBatch(BATCH)
        for s in range(BATCH):
            b.add(s, ids_params)
        slots = list(range(BATCH))
        for k in range(STEPS):
            r = b.step(slots, [100 + (s * 31 + k) % 30_000 for s in slots])
            done += len(r.finished_slots)
        return done
    if mode == "tracker":
        trackers = [stopline.FinishTracker(params) for _ in range(50)]
        for k in range(100):
            for s, t in enumerate(trackers):
                r = t.update([100 + (s + k) % 30_000], [pieces[(s * 997 + k) % len(pieces)]])
                done += r.finished + len(r.text_delta)
        return done
    per_step = [([100 + (s + k) % 30_000 for s in range(BATCH)],
                 [pieces[(s * 997 + k) % len(pieces)] for s in range(BATCH)]) for k in range(STEPS)]
    b = stopline.FinishBatch(BATCH)
    for s in range(BATCH):
        b.add(s, params)
    if mode == "range":
        import numpy as np

        rows: object = range(BATCH)
        inputs: list[tuple[object, list[str]]] = [(np.array(i, dtype=np.int64), t) for i, t in per_step]
    else:
        rows, inputs = list(range(BATCH)), list(per_step)
    for ids, texts in inputs:
        r = b.step(rows, ids, None, texts)
        done += len(r.finished_slots) + len(r.text_deltas)
    return done


if __name__ == "__main__":
    print(main(sys.argv[1] if len(sys.argv) > 1 else "lists"))
