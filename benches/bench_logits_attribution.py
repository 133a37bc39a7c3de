"""Where the logits kernel's time goes at 1-256 rows on a GPU: the floors of the
bitmask grid split into launch, grid and arrival, and the bitmask launch with one
constraint added at a time (docs/benchmarks.md, "Where the time goes at 1-256 rows").

The method is :mod:`stopline.tools.bench.logits_attribution`.

Usage (stopline importable, a CUDA GPU; xgrammar installed for its column):
    python benches/bench_logits_attribution.py
    python benches/bench_logits_attribution.py --shapes float32:128256:16 bfloat16:151936:64
"""

from __future__ import annotations

from stopline.tools.bench.logits_attribution import main

if __name__ == "__main__":
    raise SystemExit(main())
