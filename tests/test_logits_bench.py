"""The GPU suite's CPU-testable parts: the bitmask packing, the vLLM-source loader, the CUDA check."""

from __future__ import annotations

import sys

import pytest

torch = pytest.importorskip("torch")

from stopline.logits.reference import unpack_bitmask  # noqa: E402
from stopline.tools.bench import logits as suite  # noqa: E402


def test_pack_is_xgrammar_layout_and_round_trips():
    g = torch.Generator().manual_seed(0)
    for V in (1, 31, 32, 33, 100):
        keep = torch.rand(3, V, generator=g) < 0.5
        words = suite._pack(keep)
        assert words.dtype == torch.int32 and words.shape == (3, (V + 31) // 32)
        assert torch.equal(unpack_bitmask(words, V), keep)
    assert suite._pack(torch.tensor([[False] * 31 + [True]])).tolist() == [[-(2**31)]]


def test_vllm_loader_names_what_is_missing(tmp_path, monkeypatch):
    monkeypatch.setenv(suite.ENV_VLLM_SRC, str(tmp_path))
    chain, note = suite.load_vllm_chain()
    if note.endswith("(installed)"):
        pytest.skip("vLLM is installed here: the loader takes it")
    assert chain is None and "lacks" in note and "bad_words.py" in note


def test_vllm_loader_runs_the_files_with_stand_ins_only_for_their_imports(tmp_path, monkeypatch):
    """Files shaped like vLLM's (their imports of vllm names) load, and no stand-in module
    stays in sys.modules afterwards."""
    files = {
        "v1/sample/logits_processor/interface.py":
            "from vllm import SamplingParams\nclass BatchUpdate:\n    pass\n",
        "v1/sample/logits_processor/builtin.py":
            "from vllm import SamplingParams\nfrom vllm.utils.torch_utils import async_tensor_h2d\n"
            "from vllm.v1.sample.logits_processor.interface import BatchUpdate\n"
            "def h2d(x):\n    return async_tensor_h2d(x, device='cpu', dtype=None)\n",
        "v1/sample/ops/bad_words.py": "import torch\ndef apply_bad_words(logits, words, past):\n    return None\n",
        "version.txt": "0.33.0\n",
    }
    for rel, text in files.items():
        path = tmp_path / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    monkeypatch.setenv(suite.ENV_VLLM_SRC, str(tmp_path))
    before = {k for k in sys.modules if k == "vllm" or k.startswith("vllm.")}
    chain, note = suite.load_vllm_chain()
    if note.endswith("(installed)"):
        pytest.skip("vLLM is installed here: the loader takes it")
    assert chain is not None and "0.33.0" in note, note
    assert chain["builtin"].h2d([1, 2]).tolist() == [1, 2]
    assert hasattr(chain["interface"], "BatchUpdate") and callable(chain["bad_words"].apply_bad_words)
    assert {k for k in sys.modules if k == "vllm" or k.startswith("vllm.")} == before


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only error")
def test_logits_suite_says_it_needs_cuda():
    with pytest.raises(RuntimeError, match="needs a CUDA GPU"):
        suite.run_grid([1], [64], ["float32"], [0.5])
