"""Benchmark of stopline.logits on a GPU, side by side with xgrammar and vLLM.

The grid, the implementations and the method are
:mod:`stopline.tools.bench.logits` (also ``stopline bench --suite logits``):
rows 1-4096, vocab 32000-262144, float32/bfloat16/float16, 1% and 50% of the
vocabulary allowed; CUDA-graph replay medians of the copy roofline, xgrammar's
CUDA and Triton bitmask kernels, stopline's kernel (bitmask only, everything
fused, everything fused with every fourth row forced to one token, dense
scenarios) and vLLM 0.33's processor chain on the same tensors.

Usage (stopline importable; xgrammar installed for its columns; vLLM installed,
or STOPLINE_VLLM_SRC=<a copy of the vllm package folder> for its column):
    python benches/bench_logits.py                       # the full grid
    python benches/bench_logits.py --quick
    python benches/bench_logits.py --rows 16 256 --vocabs 128256 --dtypes bfloat16 --markdown out.md
"""

from __future__ import annotations

from stopline.tools.bench.logits import main

if __name__ == "__main__":
    raise SystemExit(main())
