"""The vLLM 0.34 bench's CPU-testable parts (``stopline.tools.bench.vllm_v2``): the
source loader, and the scenario and its check at a tiny size, with vLLM's own
kernels and stopline's under TRITON_INTERPRET=1 when there is no CUDA.

vLLM's sources come from an installed vllm, ``$STOPLINE_VLLM_SRC`` or the
project's engine cache (``~/.cache/stopline-engines/vllm-0.34*``); without any,
the tests that need them skip."""

from __future__ import annotations

import glob
import importlib.util
import os
import shutil
import sys

import pytest
from triton_cpu import interpret_without_cuda

torch = pytest.importorskip("torch")

CUDA = torch.cuda.is_available()
interpret_without_cuda(CUDA)  # before triton's first import
pytest.importorskip("triton")

from stopline.tools.bench import vllm_v2 as bench  # noqa: E402

DEV = "cuda" if CUDA else "cpu"


def _vllm_modules() -> set[str]:
    return {k for k in sys.modules if k == "vllm" or k.startswith("vllm.")}


def _has_files(src: str | None) -> bool:
    return bool(src) and all(os.path.isfile(os.path.join(str(src), f)) for f in bench.FILES.values())


def vllm_034_sources() -> str:
    """A vllm package folder holding 0.34's V2 sampler files, or skip."""
    spec = importlib.util.find_spec("vllm")
    candidates = [os.path.dirname(spec.origin)] if spec is not None and spec.origin else []
    candidates.append(os.environ.get(bench.ENV_VLLM_SRC, ""))
    candidates += sorted(glob.glob(os.path.expanduser("~/.cache/stopline-engines/vllm-0.34*/lib/python3*/site-packages/vllm")))
    for src in candidates:
        if _has_files(src):
            return src
    pytest.skip("vLLM 0.34's V2 sampler sources not found (install vllm 0.34, or set STOPLINE_VLLM_SRC "
                "to a copy of its vllm package folder)")


@pytest.fixture(scope="module")
def vllm_mods():
    mods, note = bench.load_vllm_v2(vllm_034_sources())
    assert mods is not None, note
    return mods


def test_loader_names_what_is_missing(tmp_path):
    mods, note = bench.load_vllm_v2(str(tmp_path))
    assert mods is None and "lacks" in note and "thinking_budget.py" in note


def test_loader_runs_files_shaped_like_vllms_with_stand_ins_for_their_imports(tmp_path):
    """Files importing what vLLM's import load; the stand-ins do their jobs (the real triton,
    device-tensor buffers, envs' defaults); no vllm module stays in sys.modules."""
    files = {
        bench.FILES["interface"]: "from dataclasses import dataclass\n"
        "@dataclass(frozen=True)\nclass LogitsContext:\n    pos: object\n"
        "class LogitsProcessor:\n    pass\nclass LogitsProcRequestState:\n    pass\n",
        bench.FILES["logit_bias"]: "import torch\nfrom vllm.sampling_params import SamplingParams\n"
        "from vllm.triton_utils import tl, triton\n"
        "from vllm.v1.worker.gpu.buffer_utils import StagedWriteTensor, UvaBackedTensor\n"
        "from vllm.v1.worker.gpu.sample.logits_processor.interface import LogitsContext, LogitsProcessor\n"
        "def table(device):\n    t = StagedWriteTensor((2, 3), dtype=torch.int32, device=device)\n"
        "    t.stage_write(1, 1, [7, 8])\n    t.apply_write()\n    return t.gpu\n",
        bench.FILES["bad_words"]: "import vllm.envs as envs\nLIMITS = (envs.VLLM_MAX_NUM_BAD_WORDS, "
        "envs.VLLM_MAX_BAD_WORDS_TOTAL_TOKENS)\n",
        bench.FILES["thinking_budget"]: "from vllm.utils.torch_utils import async_tensor_h2d\n"
        "from vllm.v1.worker.gpu.sample.logits_processor import LogitsContext\n"
        "from vllm.v1.worker.gpu.states import RequestState\nfrom vllm.triton_utils import triton\n",
        "version.txt": "0.34.0\n",
    }
    for rel, text in files.items():
        path = tmp_path / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    before = _vllm_modules()
    mods, note = bench.load_vllm_v2(str(tmp_path))
    assert mods is not None and "0.34.0" in note and "xgrammar's kernel" in note, note
    import triton

    assert mods["thinking_budget"].triton is triton
    assert mods["logit_bias"].table("cpu").tolist() == [[0, 0, 0], [0, 7, 8]]
    assert mods["bad_words"].LIMITS == (128, 1024)
    assert mods["thinking_budget"].LogitsContext is mods["interface"].LogitsContext
    assert _vllm_modules() == before


def test_loader_takes_the_copied_vllm_034_files(tmp_path, vllm_mods):
    """The folder the GPU run carries: vLLM's files (and the grammar kernel's) with a version.txt."""
    src = vllm_034_sources()
    for rel in [*bench.FILES.values(), bench.GRAMMAR_FILE]:
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(os.path.join(src, rel), tmp_path / rel)
    (tmp_path / "version.txt").write_text("0.34.0\n")
    before = _vllm_modules()
    mods, note = bench.load_vllm_v2(str(tmp_path))
    assert mods is not None and "vLLM 0.34.0" in note and "vLLM's grammar kernel" in note, note
    for name in ("apply_logit_bias", "LogitBiasState"):
        assert hasattr(mods["logit_bias"], name)
    assert hasattr(mods["bad_words"], "apply_bad_words") and hasattr(mods["thinking_budget"], "apply_thinking_budget")
    assert hasattr(mods["structured_outputs"], "_apply_grammar_bitmask_kernel")
    assert _vllm_modules() == before


@pytest.fixture(scope="module")
def tiny(vllm_mods):
    return bench.Case(4, 256, vllm_mods, device=DEV, backend="triton")


def test_states_hold_the_scenario_in_vllms_layout(tiny):
    bias, bad, budget = tiny.vllm["states"]
    assert bias.num_allowed_token_ids.np.tolist() == [128, 128, 0, 0]
    assert bias.allowed_token_ids.gpu.shape == (4, 1024) and bias.num_logit_bias.np.tolist() == [16] * 4
    assert sorted(bias.stop_token_ids.gpu[0, :2].tolist()) == [bench.STOP2, bench.EOS]
    assert bias.min_lens.np.tolist() == [len(bench.PROMPT) + bench.MIN_TOKENS] * 4
    assert bias.restore_when_all_masked.np.tolist() == [1] * 4
    assert bad.num_bad_words.np.tolist() == [3] * 4
    assert bad.bad_word_offsets.gpu[0, :4].tolist() == [0, 1, 3, 6]
    assert budget.enabled and budget.thinking_token_budget.np.tolist() == [1000, 1000, 1000, len(bench.OUTPUT)]


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
def test_vllm_chain_and_stopline_agree_on_the_tiny_case(tiny, dtype):
    """vLLM's own kernels (bias/allowed/min_tokens, bad words, thinking budget) after the
    grammar step, against stopline's one launch: the bench's check passes, and what it
    compares is not vacuous (each constraint visibly acted on both outputs)."""
    base = tiny.logits(dtype)
    # On CPU the interpreter cannot run vLLM's grammar kernel (a scalar & block mask), so
    # the chain's grammar step is xgrammar's there; the GPU run uses vLLM's.
    grammar = tiny.vllm_grammar() if CUDA else tiny.xgrammar_grammar()
    ok, detail = tiny.check(base, grammar)
    assert ok, detail
    s = base.clone()
    infeasible = tiny.cons.apply(s, tiny.slots, tiny.positions, bitmask=tiny.bitmask, backend="triton")
    v = tiny.vllm_chain(base.clone(), grammar)()
    assert not infeasible.any()
    for out in (s.float(), v):
        fin = torch.isfinite(out)
        assert fin[0].nonzero().flatten().tolist() == [bench.EOS]  # EOS-only rows: restored
        assert fin[2].nonzero().flatten().tolist() == [bench.EOS]
        assert fin[1, bench.SAFE] and not fin[1, [bench.EOS, bench.STOP2, 11, 25]].any()  # min_tokens, bad words
    assert torch.isfinite(s[3]).nonzero().flatten().tolist() == [bench.THINK_END]  # forced
    assert float(v[3, bench.THINK_END]) == bench.FORCED_LOGIT and int(v[3].argmax()) == bench.THINK_END
    biased = [(t, b) for t, b in tiny.params[1]["logit_bias"].items() if torch.isfinite(s[1, t])]
    assert bench.SAFE in dict(biased)
    for t, b in biased:
        assert float(s[1, t]) == float((base[1, t].float() + b).to(base.dtype))
    assert float(v[0, bench.EOS]) == float(base[0, bench.EOS].float() + tiny.params[0]["logit_bias"][bench.EOS])


def test_the_check_fails_when_the_sides_differ(tiny):
    base = tiny.logits("float32")
    grammar = tiny.vllm_grammar() if CUDA else tiny.xgrammar_grammar()
    tiny.cons.force(tiny.forced_row, None)
    try:
        ok, detail = tiny.check(base, grammar)
        assert not ok and "forced row" in detail
    finally:
        tiny.cons.force(tiny.forced_row, bench.THINK_END)
    kw = dict(tiny.params[1])
    tiny.cons.set(1, **{**kw, "logit_bias": {t: b + 1.0 for t, b in kw["logit_bias"].items()}})
    tiny.cons.append_tokens(1, bench.OUTPUT)
    try:
        ok, detail = tiny.check(base, grammar)
        assert not ok and "values differ" in detail, detail
    finally:
        tiny.cons.set(1, **kw)
        tiny.cons.append_tokens(1, bench.OUTPUT)
    assert tiny.check(base, grammar)[0]


def test_table_rows_and_targets():
    rec = {"dtype": "bfloat16", "vocab": 128256, "rows": 256, "timing": "graph", "copy": 10.0, "xgr cuda": 10.0,
           "stopline": 10.4, "vllm 0.34": 40.0, "vllm 0.34 xgr": 41.0, "checked": "ok"}
    line = bench.format_row(rec)
    assert line.count("|") == bench.header().splitlines()[0].count("|")
    assert "| 3.85x | 1.04 | graph | ok |" in line
    assert bench.summary([rec]) == ["rows 256: vllm/stopline min 3.85x median 3.85x (meets >= 2.5x) "
                                    "stopline/xgr cuda max 1.04 median 1.04 (meets <= 1.05)"]


@pytest.mark.skipif(CUDA, reason="checks the CPU-only error")
def test_bench_says_it_needs_cuda():
    with pytest.raises(RuntimeError, match="needs a CUDA GPU"):
        bench.run_grid([1], [64], ["float32"])


def test_a_case_runs_every_column_and_its_check(tiny, monkeypatch):
    """The per-case glue with the GPU timers replaced by a call and a fixed time: every
    column is filled, the check passes, the table and the markdown carry the record."""
    import xgrammar

    calls: list[str] = []

    def timed(fn, *args, **kwargs):
        fn()
        calls.append("t")
        return 2.0

    monkeypatch.setattr(bench, "time_graph", timed)
    rec = bench._run_case(tiny, "bfloat16", {"xgr cuda": xgrammar.apply_token_bitmask_inplace},
                          tiny.vllm_grammar() if CUDA else None)
    assert {k: rec[k] for k in ("copy", "xgr cuda", "stopline", "vllm 0.34 xgr")} == dict.fromkeys(
        ("copy", "xgr cuda", "stopline", "vllm 0.34 xgr"), 2.0)
    assert rec["checked"] == "ok" and rec["timing"] == "graph", rec
    text = bench.markdown([rec], {"device": "cpu"})
    assert "| bfloat16 | 256 | 4 | 2.0 | 2.0 | 2.0 |" in text and "Check failures" not in text


def test_a_lone_row_is_checked_unforced(vllm_mods):
    """At 1 row no budget is spent (the row keeps its constraints) and the check compares it."""
    case = bench.Case(1, 256, vllm_mods, device=DEV, backend="triton")
    assert case.forced_row is None and case.cons.forced_token(0) is None
    assert case.vllm["states"][2].thinking_token_budget.np.tolist() == [bench.BUDGET]
    ok, detail = case.check(case.logits("float16"), case.vllm_grammar() if CUDA else case.xgrammar_grammar())
    assert ok and detail.startswith("ok (1 rows equal"), detail
