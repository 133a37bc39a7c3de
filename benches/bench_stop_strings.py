"""Per-step cost of stop-string matching: stopline's incremental matcher vs the
pure-Python baseline (``stopline.baseline.StopMatcher``: vLLM-style windowed
``str.find``), fed real text one token piece per step, with 1 to 256 stop
strings. Both do the work a streaming engine does per step: feed the new
piece and read the exact hold-back. Reports ns per step and the ratio, measured
side by side in this run.

    python benches/bench_stop_strings.py [--steps N]
"""

from __future__ import annotations

import argparse

from _common import median_ns_per_op, print_table, stop_list, text_pieces

import stopline
from stopline import baseline


def run(ks: list[int], steps: int) -> list[tuple[int, float, float]]:
    pieces, _ = text_pieces()
    pieces = pieces[:steps]
    results = []
    for k in ks:
        stops = stop_list(k)
        compiled = stopline.StopStrings(stops)

        def rust() -> int:
            m = compiled.matcher()
            for p in pieces:
                m.feed(p)
                m.holdback
            return len(pieces)

        def python() -> int:
            m = baseline.StopMatcher(stops)
            for p in pieces:
                m.feed(p)
                m.holdback
            return len(pieces)

        results.append((k, median_ns_per_op(rust), median_ns_per_op(python)))
    return results


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=20_000)
    ap.add_argument("--ks", type=int, nargs="*", default=[1, 4, 16, 64, 256])
    args = ap.parse_args()
    _, splitter = text_pieces()
    rows = run(args.ks, args.steps)
    flat = max(r[1] for r in rows) / min(r[1] for r in rows)
    print_table(
        f"stop strings, one token piece per step ({splitter}; {args.steps} steps)",
        ["stop strings", "stopline ns/step", "baseline ns/step", "speed-up"],
        [(k, f"{r:.0f}", f"{b:.0f}", f"{b / r:.1f}x") for k, r, b in rows],
    )
    print(f"stopline per-step cost, slowest / fastest K: {flat:.2f}x")


if __name__ == "__main__":
    main()
