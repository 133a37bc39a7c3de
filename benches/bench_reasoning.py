"""Cost of reasoning channels on the ids-only batch step (issue 21's speed
target: at most 1.15x the same step without them): ``FinishBatch.step`` over
256 sequences, one id each, no texts, the engine reading ``finished_slots``
each step, without reasoning, with marker ids and every sequence inside the
block, and with a thinking budget whose ``forced_tokens`` are read every
step, measured side by side in one run. A thin entry point over ``stopline
bench --suite reasoning`` (all its options apply; the table and how it was
measured are in docs/benchmarks.md, "Reasoning channels").

    python benches/bench_reasoning.py [--batches 256] [--seq-steps N] [--repeats 7]

Use a release build (``maturin develop --release``); dev-build numbers mean
nothing. Instruction counts of the same step: ``benches/callgrind_step.py ids``
/ ``ids-reasoning``.
"""

from __future__ import annotations

import sys

from stopline.tools.bench import main

if __name__ == "__main__":
    sys.exit(main(["--suite", "reasoning", "--no-plot", *sys.argv[1:]]))
