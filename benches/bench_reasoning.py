"""Cost of reasoning channels on the ids-only batch step (issue 21's speed
target: at most 1.15x the same step without them): ``FinishBatch.step`` over
256 sequences, one id each, no texts, the engine reading ``finished_slots``
each step, with and without reasoning marker ids, measured side by side in one
run (interleaved, best of ``--repeats``). With reasoning on every sequence is
inside the block (``reasoning_starts_in="reasoning"``), so each row's channel
split is computed; ``+forced`` also reads ``forced_token_ids`` each step (an
engine with a thinking budget does).

    python benches/bench_reasoning.py [--batch 256] [--steps 400] [--repeats 7]

Use a release build (``maturin develop --release``); dev-build numbers mean
nothing. On the 2-core development machine (other jobs running): 29-30 ns
without reasoning, 1.12-1.18x with it, 1.44-1.52x also reading
``forced_token_ids``; instruction counts (``callgrind_step.py ids`` /
``ids-reasoning``) 1.11x.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import stopline

BASE = {"eos_token_ids": [2], "stop_token_ids": [3, 4], "max_tokens": 1 << 30}
REASONING = {"reasoning_start_id": 5, "reasoning_end_id": 6, "reasoning_starts_in": "reasoning"}


def runner(params: stopline.StopParams, batch: int, steps: int, forced: bool) -> Callable[[], int]:
    rows = list(range(batch))
    # Ids from 100 on: never EOS, a stop id or a marker.
    per_step = [[100 + (s * 31 + k) % 30_000 for s in rows] for k in range(steps)]

    def run() -> int:
        b = stopline.FinishBatch(batch)
        for s in rows:
            b.add(s, params)
        t0 = time.perf_counter_ns()
        done = 0
        for ids in per_step:
            r = b.step(rows, ids)
            done += len(r.finished_slots)
            if forced:
                done += r.forced_token_ids.count(None)
        return time.perf_counter_ns() - t0 + 0 * done

    return run


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--steps", type=int, default=400)
    ap.add_argument("--repeats", type=int, default=7)
    a = ap.parse_args()
    cases = {
        "without reasoning": runner(stopline.StopParams(**BASE), a.batch, a.steps, False),  # type: ignore[arg-type]
        "with reasoning": runner(stopline.StopParams(**BASE, **REASONING), a.batch, a.steps, False),  # type: ignore[arg-type]
        "with reasoning +forced": runner(
            stopline.StopParams(**BASE, **REASONING, max_reasoning_tokens=1 << 30), a.batch, a.steps, True  # type: ignore[arg-type]
        ),
    }
    best = {k: float("inf") for k in cases}
    for _ in range(a.repeats):
        for name, run in cases.items():
            best[name] = min(best[name], run())
    per = {k: v / (a.batch * a.steps) for k, v in best.items()}
    base = per["without reasoning"]
    print(f"ids-only FinishBatch.step, {a.batch} sequences x {a.steps} steps, best of {a.repeats}")
    for name, ns in per.items():
        print(f"  {name:<24} {ns:7.1f} ns/seq-step  {ns / base:5.2f}x")


if __name__ == "__main__":
    main()
