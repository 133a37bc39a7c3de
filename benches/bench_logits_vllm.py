"""stopline's fused logits launch against vLLM 0.34's model runner V2 constraint
chain (grammar bitmask, float32 copy, LogitBiasState, BadWordsState,
ThinkingBudgetState), with xgrammar's CUDA bitmask kernel and a copy as floors.

The grid, the scenario, the timing and the check are
:mod:`stopline.tools.bench.vllm_v2`: rows 1-4096, vocab 128256 and 151936,
float32/bfloat16/float16; CUDA-graph replay medians; each case checks
stopline's output against vLLM's chain's.

The GPU run, in one call from the repository root (the machine needs torch,
triton, xgrammar and stopline importable, no vLLM and no network; carry
``.devcarry/vllm034`` — vLLM 0.34.0's V2 sampler sources and a version.txt, see
``.devcarry/README-vllm034.txt``):

    STOPLINE_VLLM_SRC=.devcarry/vllm034 PYTHONPATH=python python3 benches/bench_logits_vllm.py \\
        --markdown $OUT/vllm034.md --jsonl $OUT/vllm034.jsonl

``--quick`` runs rows 1, 64, 1024 at vocab 128256 in float32 and bfloat16;
``--rows/--vocabs/--dtypes`` pick sizes. The JSON lines are written as the
run goes (the notes first, then one record per case), so a run cut short
still returns what it measured. Exit status 1 when a case's check fails.
"""

from __future__ import annotations

from stopline.tools.bench.vllm_v2 import main

if __name__ == "__main__":
    raise SystemExit(main())
