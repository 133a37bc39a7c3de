"""Per-step cost of stop-string matching: stopline's incremental matcher vs the
pure-Python baseline (vLLM-style windowed ``str.find``), ahocorasick-rs and
pyahocorasick, fed real text one token piece (and one 4-8 token run) per step,
K = 1 to 1024 stop strings. A thin entry point over ``stopline bench --suite
stop`` (all its options apply; no plot unless ``--plot PATH`` is given).

    python benches/bench_stop_strings.py [--steps N] [--ks K ...] [--plot PNG]
"""

from __future__ import annotations

import sys

from stopline.tools.bench import main

if __name__ == "__main__":
    sys.exit(main(["--suite", "stop", "--no-plot", *sys.argv[1:]]))
