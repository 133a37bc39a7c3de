"""Installing stopline never stops a vLLM from starting (docs/integrations.md,
"Supported engine versions").

vLLM loads every class under the ``vllm.logits_processors`` entry point at
start-up, in the frontend (``InputProcessor`` builds the params validator from
the classes' ``validate_params``) and in the model runner (which builds each
class); an entry point that fails to import, or is not a subclass of the
loader's ``LogitsProcessor``, stops the engine. These tests run both start-up
paths of the installed vLLM (0.33: V1 and V2 loaders; 0.34: V2 only) on the
CPU with stopline installed, with and without requests that use stopline, and
in fresh interpreters the same paths on a vLLM stopline was not tested with
(its version faked) and with ``STOPLINE_VLLM_PLUGIN=off`` / ``force``.

Runs in the engine job (``.ci/engines.sh``), where the stopline wheel is
installed in the engine's venv so its entry point is registered.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from importlib.metadata import entry_points
from types import SimpleNamespace

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("vllm", reason="vLLM is not installed (pip install '.[vllm]')")

import stopline  # noqa: E402
from stopline.integrations import vllm as adapter  # noqa: E402

ENTRY = "stopline.integrations.vllm:StoplineLogitsProcessor"
V, SLOTS = 64, 4

if not torch.cuda.is_available():
    import vllm.utils.torch_utils as _vllm_torch_utils

    _vllm_torch_utils.PIN_MEMORY = False  # vLLM's CUDA build assumes pinned memory


def _registered() -> bool:
    return any(ep.value == ENTRY for ep in entry_points(group="vllm.logits_processors"))


pytestmark = pytest.mark.skipif(not _registered(), reason="stopline's entry point is not registered (install the wheel)")

# The start-up paths, as one script: run in this process and, with a faked vLLM
# version or STOPLINE_VLLM_PLUGIN set, in a fresh interpreter. It prints one
# line per check; the tests read them.
STARTUP = textwrap.dedent(
    """
    import sys
    from types import SimpleNamespace

    import torch
    import vllm.utils.torch_utils as tu
    from vllm import SamplingParams
    from vllm.v1.worker.gpu.sample.logits_processor import (
        build_custom_logits_processors, build_custom_logits_processors_params_validator)

    tu.PIN_MEMORY = False
    V, SLOTS = 64, 4
    plain = SamplingParams(max_tokens=8)
    ours = SamplingParams(extra_args={"stopline": {"min_tokens": 2, "stop_token_ids": [1], "logit_bias": {5: 2.0}}})
    bad = SamplingParams(extra_args={"stopline": {"min_tokens": -3}})

    from vllm.exceptions import VLLMClientError

    def outcome(check, params):
        try:
            check(params)
            return "ok"
        except (ValueError, VLLMClientError) as exc:  # vLLM turns a validate_params ValueError into a 4xx error
            return f"client error: {exc}"

    # The frontend: vLLM's InputProcessor builds this once at start-up.
    validate = build_custom_logits_processors_params_validator(None)
    for name, params in (("plain", plain), ("ours", ours), ("bad", bad)):
        print(f"frontend {name}: {outcome(validate, params)}")
    # The model runner V2: every class of the entry point, built and run on a one-row batch.
    def buf(t):
        return SimpleNamespace(gpu=t, np=t.numpy())
    req_states = SimpleNamespace(
        device=torch.device("cpu"), max_num_reqs=SLOTS, vocab_size=V,
        all_token_ids=buf(torch.zeros(SLOTS, 16, dtype=torch.int32)), prompt_len=buf(torch.ones(SLOTS, dtype=torch.int32)),
        prefill_len=buf(torch.ones(SLOTS, dtype=torch.int32)), total_len=buf(torch.ones(SLOTS, dtype=torch.int32)))
    config = SimpleNamespace(speculative_config=None)
    procs = build_custom_logits_processors(config, req_states, False)
    names = sorted(type(p).__name__ for p in procs)
    print(f"runner built: {names}")
    from vllm.v1.worker.gpu.sample.logits_processor import LogitsContext
    import numpy as np
    for proc in procs:
        wants = [proc.add_request(0, plain), proc.add_request(1, ours)]
        idx = torch.tensor([0, 1], dtype=torch.int32)
        ctx = LogitsContext(expanded_idx_mapping=idx, idx_mapping=idx, idx_mapping_np=np.array([0, 1]),
                            expanded_local_pos=torch.zeros(2, dtype=torch.int32), input_ids=torch.zeros(2, dtype=torch.int32),
                            pos=torch.zeros(2, dtype=torch.int64), seq_lens_upper_bound_np=np.array([1, 1]))
        logits = torch.zeros(2, V)
        out = proc.apply(logits.clone(), ctx)
        print(f"runner {type(proc).__name__}: wants={wants} changed_rows={[bool((out[i] != 0).any()) for i in range(2)]}")
    """
)


def _run(env: dict[str, str], fake_version: str | None = None, grown_interface: bool = False) -> list[str]:
    """STARTUP in a fresh interpreter (vLLM's version faked by importlib.metadata when given;
    ``grown_interface``: the V2 interface given an abstract method stopline does not know, as
    a later release could add)."""
    prefix = ""
    if fake_version:
        prefix = textwrap.dedent(
            f"""
            import importlib.metadata as _m
            _real = _m.version
            _m.version = lambda name: {fake_version!r} if name == "vllm" else _real(name)
            """
        )
    if grown_interface:
        prefix += textwrap.dedent(
            """
            import abc
            import vllm.v1.worker.gpu.sample.logits_processor.interface as _itf
            def remove_request(self, req_idx): ...
            _itf.LogitsProcessor.remove_request = abc.abstractmethod(remove_request)
            _itf.LogitsProcessor.__abstractmethods__ |= {"remove_request"}
            """
        )
    full = dict(os.environ, **env, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    proc = subprocess.run([sys.executable, "-c", prefix + STARTUP], capture_output=True, text=True, env=full, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return [line for line in proc.stdout.splitlines() if line.startswith(("frontend", "runner"))]


def _lines(lines: list[str]) -> dict[str, str]:
    return dict(line.split(": ", 1) for line in lines)


def test_the_installed_vllm_starts_and_serves_stopline_requests():
    """This vLLM (0.33 or 0.34) with stopline installed: the frontend's validator builds, passes
    a plain request and a valid stopline request, and refuses a bad one as a client error
    (our ValueError, which vLLM's loader raises as its VLLMValidationError) naming the field;
    the model runner builds the entry point's class, which
    constrains the row that asked and leaves the other as it was."""
    got = _lines(_run({"STOPLINE_VLLM_PLUGIN": "auto"}))
    assert got["frontend plain"] == "ok" and got["frontend ours"] == "ok"
    assert got["frontend bad"].startswith("client error: min_tokens must be >= 0"), got
    assert got["runner built"] == "['StoplineLogitsProcessor']"
    assert got["runner StoplineLogitsProcessor"] == "wants=[False, True] changed_rows=[False, True]"


def test_v1_start_up_paths_of_vllm_033():
    """vLLM 0.33's V1 runner (its default) has its own loader and frontend check: both load
    the entry point and run its validate_params."""
    if not adapter.HAS_V1_RUNNER:
        from conftest import ENGINE_VERSION_SKIP

        pytest.skip(f"{ENGINE_VERSION_SKIP}vLLM {adapter.VLLM_VERSION} has no V1 runner")
    from vllm import SamplingParams
    from vllm.exceptions import VLLMClientError
    from vllm.v1.sample.logits_processor import build_logitsprocs, validate_logits_processors_parameters

    config = SimpleNamespace(scheduler_config=SimpleNamespace(max_num_seqs=SLOTS),
                             model_config=SimpleNamespace(get_vocab_size=lambda: V), speculative_config=None)
    procs = build_logitsprocs(config, torch.device("cpu"), False, False, ())
    assert any(type(p).__name__ == "StoplineLogitsProcessor" for p in procs.all)
    validate_logits_processors_parameters(None, SamplingParams())
    with pytest.raises(VLLMClientError, match="min_tokens"):
        validate_logits_processors_parameters(None, SamplingParams(extra_args={"stopline": {"min_tokens": -1}}))


@pytest.mark.parametrize("mode,version,grown", [("auto", "0.99.0", True), ("auto", "0.32.0", False), ("0", None, False)])
def test_inactive_processor_never_stops_the_engine(mode, version, grown):
    """A vLLM stopline was not tested with (faked: newer, with an abstract method stopline does
    not know added to the interface, and older), and STOPLINE_VLLM_PLUGIN=0 (off): the engine
    starts, every plain request runs as without stopline, and a request that asks for stopline
    is refused as a client error naming the installed version and the tested range (or the
    switch), never run half-constrained."""
    got = _lines(_run({"STOPLINE_VLLM_PLUGIN": mode}, fake_version=version, grown_interface=grown))
    assert got["frontend plain"] == "ok"
    assert got["frontend ours"].startswith("client error: stopline's vLLM processors are inactive"), got
    why = f"this is vLLM {version}" if version else "STOPLINE_VLLM_PLUGIN=off"
    assert why in got["frontend ours"] and (adapter.TESTED_VLLM_RANGE in got["frontend ours"] or not version)
    assert "STOPLINE_VLLM_PLUGIN=force" in got["frontend ours"]
    assert got["runner built"] == "['StoplineLogitsProcessor']"
    assert got["runner StoplineLogitsProcessor"] == "wants=[False, False] changed_rows=[False, False]"


def test_force_turns_the_processor_on_for_an_untested_vllm():
    """STOPLINE_VLLM_PLUGIN=force: taking up a new vLLM release before stopline is tested with it."""
    got = _lines(_run({"STOPLINE_VLLM_PLUGIN": "force"}, fake_version="0.99.0"))
    assert got["frontend ours"] == "ok" and got["frontend bad"].startswith("client error: min_tokens")
    assert got["runner StoplineLogitsProcessor"] == "wants=[False, True] changed_rows=[False, True]"


def test_version_rule():
    assert adapter.is_tested_vllm("0.33.0") and adapter.is_tested_vllm("0.34.2.dev5+gabc")
    assert not adapter.is_tested_vllm("0.35.0") and not adapter.is_tested_vllm("0.32.1")
    assert not adapter.is_tested_vllm("1.0") and not adapter.is_tested_vllm("nightly")
    assert adapter.ACTIVE == adapter.is_tested_vllm(adapter.VLLM_VERSION)
    # The V1 runner's tests skip only where the release has no V1 runner, never because an
    # import failed on 0.33 (the adapter reads any import failure as "not in this release").
    assert adapter.HAS_V1_RUNNER == adapter.VLLM_VERSION.startswith("0.33.")
    assert stopline.__version__  # the package the entry point names is the one under test


def test_loader_interface_is_found_where_a_vllm_keeps_its_loader(monkeypatch):
    """On a vLLM whose interface has moved, the entry point's class subclasses the
    ``LogitsProcessor`` of the loader that is loading it (the module defining
    ``LOGITSPROCS_GROUP``)."""
    import types

    fake = types.ModuleType("vllm.some.future.loader")

    class LogitsProcessor:
        def apply(self, logits, ctx):
            return logits

    fake.LOGITSPROCS_GROUP = "vllm.logits_processors"
    fake.LogitsProcessor = LogitsProcessor
    for name in [n for n, m in sys.modules.items() if n.startswith("vllm.") and hasattr(m, "LOGITSPROCS_GROUP")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, fake.__name__, fake)
    assert adapter._loader_interface() is LogitsProcessor
