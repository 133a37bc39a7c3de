"""Per-sequence-step cost of the finish machine on an engine's hot path:
``FinishBatch.step`` (one call per engine step for the whole batch) vs the
pure-Python reference doing the same per-step work (``stopline.baseline``: an
engine's ``check_stop`` plus its detokenizer's stop-string check and hold-back),
measured side by side in this run.

Each of B sequences takes one token per step with a real text piece, has 4
stop strings, an EOS id and 2 stop token ids; the engine reads every text
delta. Reports ns per sequence-step and the ratio.

    python benches/bench_finish.py [--batch 256] [--steps 200]
"""

from __future__ import annotations

import argparse

from _common import median_ns_per_op, print_table, stop_list, text_pieces

import stopline
from stopline import baseline

PARAMS = dict(stop=stop_list(4), eos_token_ids=[2], stop_token_ids=[3, 4], max_tokens=100_000)


def run(batch: int, steps: int) -> tuple[float, float, float]:
    pieces, _ = text_pieces()
    # Sequence s reads the text from its own offset; ids never hit EOS/stop ids.
    per_step = [
        ([100 + (s + k) % 30_000 for s in range(batch)],
         [pieces[(s * 997 + k) % len(pieces)] for s in range(batch)])
        for k in range(steps)
    ]
    slots = list(range(batch))

    def rust_batch() -> int:
        b = stopline.FinishBatch(batch)
        params = stopline.StopParams(**PARAMS)
        for s in slots:
            b.add(s, params)
        for ids, texts in per_step:
            b.step(slots, ids, None, texts).text_deltas
        return batch * steps

    def rust_trackers() -> int:
        params = stopline.StopParams(**PARAMS)
        trackers = [stopline.FinishTracker(params) for _ in slots]
        for ids, texts in per_step:
            for t, i, p in zip(trackers, ids, texts):
                t.update(i, [p]).text_delta
        return batch * steps

    def python() -> int:
        b = baseline.FinishBatch(batch)
        params = baseline.StopParams(**PARAMS)
        for s in slots:
            b.add(s, params)
        for ids, texts in per_step:
            for r in b.step(slots, ids, None, texts):
                r.text_delta
        return batch * steps

    return median_ns_per_op(rust_batch), median_ns_per_op(rust_trackers), median_ns_per_op(python)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, nargs="*", default=[256])
    ap.add_argument("--steps", type=int, default=200)
    args = ap.parse_args()
    _, splitter = text_pieces()
    rows = []
    for b in args.batch:
        rb, rt, py = run(b, args.steps)
        rows.append((b, f"{rb:.0f}", f"{rt:.0f}", f"{py:.0f}", f"{py / rb:.1f}x"))
    print_table(
        f"finish check per sequence-step ({splitter}; {args.steps} steps; 4 stop strings, EOS, 2 stop ids)",
        ["batch", "FinishBatch.step ns", "FinishTracker.update ns", "baseline ns", "speed-up (batch)"],
        rows,
    )


if __name__ == "__main__":
    main()
