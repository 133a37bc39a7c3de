"""Per-sequence-step cost of the finish machine on an engine's hot path:
``FinishBatch.step`` vs one ``FinishTracker.update`` per sequence vs the
pure-Python reference (``stopline.baseline``), batches of 1 to 1024 sequences
with real text pieces, 4 stop strings, an EOS id and 2 stop token ids. A thin
entry point over ``stopline bench --suite finish`` (all its options apply).

    python benches/bench_finish.py [--batch 256] [--seq-steps N]
"""

from __future__ import annotations

import sys

from stopline.tools.bench import main

if __name__ == "__main__":
    sys.exit(main(["--suite", "finish", "--no-plot", *sys.argv[1:]]))
