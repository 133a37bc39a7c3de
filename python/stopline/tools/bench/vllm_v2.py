"""stopline's one fused launch against vLLM 0.34's model runner V2 constraint chain,
on a GPU (``benches/bench_logits_vllm.py``).

vLLM 0.34's model runner V2 constrains a step's logits with Triton kernels, in
this order:

1. the grammar bitmask on the model's logits, in the model's dtype
   (``StructuredOutputsWorker.apply_grammar_bitmask``: vLLM's own
   ``_apply_grammar_bitmask_kernel``, adapted from xgrammar's Triton kernel);
2. ``Sampler.apply_sampling_params``: a copy of the logits to a new float32
   tensor, then the logits processors in list order: ``LogitBiasState.apply``
   (``apply_logit_bias``: allowed token ids, ``logit_bias``, min_tokens with
   its stop ids and the restore of the stop logits when the row would be
   empty), ``PenaltiesState`` (no penalties here: it launches nothing),
   ``BadWordsState.apply`` (``apply_bad_words``), then
   ``ThinkingBudgetState.apply`` (``apply_thinking_budget``: a marker scan and
   a kernel writing ``1e9`` to the end-marker id of a row whose budget is
   spent).

:func:`load_vllm_v2` loads those files as source (an installed vLLM's, or a
copy of the ``vllm`` package folder in ``$STOPLINE_VLLM_SRC``) with the real
``triton``; :class:`Case` fills vLLM's state objects through their own
``add_request`` and ``apply_staged_writes`` and runs their own ``apply``
methods, whose kernels are the files' own.

Columns (us per call):

- ``copy``: ``dst.copy_(logits)`` in the model dtype, one read and one write
  of every logit (the floor of anything that writes the logits);
- ``xgr cuda``: xgrammar's CUDA bitmask kernel alone
  (``xgrammar.kernels.apply_token_bitmask_inplace_cuda``);
- ``stopline``: one ``LogitsConstraints.apply(logits, slots, positions,
  bitmask=bitmask)`` on the model-dtype logits: the bitmask and every
  constraint below, the forced row included, on a default-reserve state (the
  forced-id read kept);
- ``vllm 0.34``: the chain above, with vLLM's grammar kernel;
- ``vllm 0.34 xgr``: the same chain with ``xgrammar.apply_token_bitmask_inplace``
  as the grammar step (what vLLM 0.33's runner called);
- ``vllm/stopline`` and ``stopline/xgr cuda``: ratios of the columns.

The scenario, the same on both sides, per (rows, vocab, dtype): every row is a
grammar row (1% of the vocabulary allowed and, on every even row, only EOS);
rows ``r % 4 in (0, 1)`` have 1,024 ``allowed_token_ids``; every row has 16
``logit_bias`` ids (EOS and token 5 among them: a stop id biased, masked and
restored, a kept token biased), ``min_tokens`` above its position with two stop
ids (EOS and 0; the restore for grammar rows: the EOS-only rows get EOS back),
three bad words (one one-token, two multi-token, one of them firing on the
output history) and a thinking budget, spent on the last row only (none at 1 row: a
lone forced row would time a one-hot write, not the constraints; vLLM: by its
budget tensors and a start marker at the end of the prompt; stopline:
``LogitsConstraints.force(slot, end_id)``).

Timing: CUDA-graph replay medians of each side (:func:`~stopline.tools.bench.logits.time_graph`),
each side on its own copy of the logits. vLLM's chain does not sync (its
host-side checks read numpy mirrors), so it is captured; should a capture fail,
every side of that case is timed eagerly (``time_eager``) and the record says so
(``timing``). What the timed chain leaves out or gives vLLM: the host-to-device
copies of the bitmask and of the row mapping (stopline's bitmask is on the
device too); vLLM's per-request scalars (``UvaBackedTensor``) are read from
pinned host memory through UVA in vLLM, from device memory here; the
thinking-budget marker cache is warm after the first call (the steady state of
a decode step); and vLLM's V2 sampler runs eagerly in a real step, so graph
replay spares it the launch gaps of its six launches.

The check (column ``check``): stopline's output and vLLM's chain's, both cast
to float32, are equal bit for bit on every row but the forced one, after
vLLM's float32 result is rounded to the logits' dtype (stopline adds the bias
in float32 and rounds once to the logits' dtype; vLLM keeps the float32 sum);
on the forced row, stopline leaves only the end marker finite and vLLM writes
``1e9`` there (both pick it). The EOS-only rows must come out with EOS alone
finite on both sides (the restore fired), and no row may be infeasible.

Deliberate differences in semantics, which the scenario keeps out of the
compared rows: vLLM applies the bias before min_tokens and the bad words after
the min_tokens restore; stopline bans bad words before min_tokens and biases
last. The results differ only on a row whose finite logits, once the stop ids
are masked, are all bad-word tokens (vLLM restores nothing and then bans them,
leaving the row empty; stopline restores the stop ids). Every non-EOS-only row
here keeps token 5 (grammar and allowed ids), so no row is such a row.
"""

from __future__ import annotations

import importlib
import json
import os
import random
import statistics
import sys
import time
import types
from collections.abc import Callable, Sequence
from typing import Any

from .logits import ENV_VLLM_SRC, _load_file, _pack, time_eager, time_graph, xgrammar_kernels

Fn = Callable[[], object]

ROWS = (1, 16, 64, 256, 1024, 4096)
VOCABS = (128256, 151936)
DTYPES = ("float32", "bfloat16", "float16")
QUICK = dict(rows=(1, 64, 1024), vocabs=(128256,), dtypes=("float32", "bfloat16"))

EOS, STOP2 = 2, 0
SAFE = 5  # kept on every non-EOS-only row by the grammar and the allowed ids
THINK_START, THINK_END = 9, 7
BAD_WORDS = [[11], [21, 22], [23, 24, 25]]
OUTPUT = [SAFE, 23, 24]  # the output so far: [23, 24, 25] fires (bans 25), [21, 22] does not
PROMPT = [1, 3, 4, THINK_START]  # the thinking block opens at the end of the prompt
MIN_TOKENS = 16
N_ALLOWED = 1024  # vLLM 0.34's MAX_NUM_ALLOWED_TOKEN_IDS
N_BIAS = 16
BUDGET, SPENT_BUDGET = 1000, len(OUTPUT)  # tokens since the start marker: len(OUTPUT)
FORCED_LOGIT = 1.0e9  # what vLLM's thinking-budget kernel writes

# vLLM's files as they sit in the vllm package folder. The grammar kernel's file is optional.
FILES = {
    "interface": "v1/worker/gpu/sample/logits_processor/interface.py",
    "logit_bias": "v1/worker/gpu/sample/logit_bias.py",
    "bad_words": "v1/worker/gpu/sample/bad_words.py",
    "thinking_budget": "v1/worker/gpu/sample/thinking_budget.py",
}
GRAMMAR_FILE = "v1/worker/gpu/structured_outputs.py"
# vllm.envs defaults (VLLM_MAX_NUM_BAD_WORDS, VLLM_MAX_BAD_WORDS_TOTAL_TOKENS in 0.34's envs.py)
ENVS = {"VLLM_MAX_NUM_BAD_WORDS": 128, "VLLM_MAX_BAD_WORDS_TOTAL_TOKENS": 1024}


# --- stand-ins for what the files import ------------------------------------------------

class _Named:
    """A class the files name only in annotations or TYPE_CHECKING blocks."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        raise TypeError(f"{type(self).__name__} stands in for a vLLM type name only")


class UvaBackedTensor:
    """``buffer_utils.UvaBackedTensor``: a host array (``np``) the state writes and a device
    copy (``gpu``) its kernels read, refreshed by ``copy_to_uva``. vLLM keeps ``gpu`` in
    pinned host memory that kernels read through UVA; here it is device memory (the faster
    of the two for vLLM's kernels)."""

    device: Any = "cuda"

    def __init__(self, size: int | Sequence[int], dtype: Any, max_concurrency: int | None = None) -> None:
        import torch

        self.dtype = dtype
        self.cpu = torch.zeros(size, dtype=dtype)
        self.np = self.cpu.numpy()
        self.gpu = torch.zeros(size, dtype=dtype, device=self.device)

    def copy_to_uva(self, n: int | None = None) -> Any:
        src = self.cpu if n is None else self.cpu[:n]
        self.gpu[: src.shape[0]].copy_(src)
        return self.gpu


class StagedWriteTensor:
    """``buffer_utils.StagedWriteTensor``: ``stage_write`` records rows on the host,
    ``apply_write`` copies them to the device tensor ``gpu`` (vLLM does the copy with a
    scatter kernel from UVA buffers; the device tensor's layout is the same)."""

    def __init__(self, size: int | Sequence[int], dtype: Any, device: Any, max_concurrency: int | None = None,
                 uva_instead_of_gpu: bool = False) -> None:
        import torch

        self.dtype = dtype
        self.device = device
        self._host = torch.zeros(size, dtype=dtype)
        self.gpu = torch.zeros(size, dtype=dtype, device=device)
        self._rows: set[int] = set()

    def stage_write(self, index: int, start: int, x: Any) -> None:
        import torch

        values = list(x)
        if values:
            self._host[index, start:start + len(values)] = torch.tensor(values, dtype=self.dtype)
            self._rows.add(index)

    def stage_write_elem(self, index: int, x: int) -> None:
        self._host[index] = x
        self._rows.add(index)

    def apply_write(self) -> None:
        if self._rows:
            self.gpu.copy_(self._host)
            self._rows.clear()


def _async_tensor_h2d(data: Any, device: Any = None, dtype: Any = None, out: Any = None) -> Any:
    """``vllm.utils.torch_utils.async_tensor_h2d``: a host-to-device copy."""
    import torch

    t = torch.as_tensor(data, dtype=dtype if dtype is not None else (out.dtype if out is not None else None))
    return out.copy_(t, non_blocking=True) if out is not None else t.to(device, non_blocking=True)


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _stand_in_modules() -> dict[str, types.ModuleType]:
    import triton
    import triton.language as tl

    mods: dict[str, types.ModuleType] = {}
    for pkg in ("vllm", "vllm.v1", "vllm.v1.worker", "vllm.v1.worker.gpu", "vllm.v1.worker.gpu.sample",
                "vllm.v1.worker.gpu.sample.logits_processor", "vllm.utils", "vllm.config"):
        m = types.ModuleType(pkg)
        m.__path__ = []
        mods[pkg] = m
    names: dict[str, dict[str, Any]] = {
        "vllm.triton_utils": {"triton": triton, "tl": tl},
        "vllm.sampling_params": {"SamplingParams": type("SamplingParams", (_Named,), {})},
        "vllm.envs": dict(ENVS),
        "vllm.v1.worker.gpu.buffer_utils": {"UvaBackedTensor": UvaBackedTensor, "StagedWriteTensor": StagedWriteTensor},
        "vllm.v1.worker.gpu.states": {"RequestState": type("RequestState", (_Named,), {})},
        "vllm.v1.worker.gpu.input_batch": {"InputBatch": type("InputBatch", (_Named,), {})},
        "vllm.utils.torch_utils": {"async_tensor_h2d": _async_tensor_h2d, "PIN_MEMORY": False},
        "vllm.utils.math_utils": {"cdiv": _cdiv},
    }
    for name, attrs in names.items():
        m = types.ModuleType(name)
        for k, v in attrs.items():
            setattr(m, k, v)
        mods[name] = m
    for name, m in mods.items():  # `import vllm.envs as envs` reads the parent's attribute
        parent, _, child = name.rpartition(".")
        if parent in mods:
            setattr(mods[parent], child, m)
    return mods


def _installed_source() -> tuple[str | None, str]:
    """The installed vllm package folder when its logit_bias module imports with the real
    Triton, else None; and why."""
    try:
        import triton

        mod = importlib.import_module("vllm.v1.worker.gpu.sample.logit_bias")
        import vllm
    except Exception as exc:
        return None, f"vllm does not import ({type(exc).__name__})"
    if getattr(mod, "triton", None) is not triton:
        return None, "the installed vllm has no real Triton here (vllm.triton_utils placeholder)"
    return os.path.dirname(os.path.abspath(vllm.__file__)), f"vLLM {getattr(vllm, '__version__', '?')} (installed)"


def _version(src: str) -> str:
    """``version.txt`` in the folder (a copied one), else the wheel's ``_version.py``."""
    import re

    for name, pattern in (("version.txt", r"(\S+)"), ("_version.py", r"__version__\s*=\s*(?:version\s*=\s*)?['\"]([^'\"]+)")):
        path = os.path.join(src, name)
        if os.path.isfile(path):
            m = re.search(pattern, open(path).read())
            if m:
                return m.group(1)
    return "?"


def load_vllm_v2(src: str | None = None) -> tuple[dict[str, types.ModuleType] | None, str]:
    """vLLM 0.34's V2 sampler modules ``logit_bias``, ``bad_words``, ``thinking_budget``,
    ``interface`` (and ``structured_outputs`` for its grammar kernel when present), loaded
    from their source files, and a note saying from where.

    ``src`` is a copy of the ``vllm`` package folder; by default the installed vLLM's when
    it imports with the real Triton, else ``$STOPLINE_VLLM_SRC``. The files run as they
    are; only the names they import from elsewhere in vLLM are stand-ins (the real
    ``triton`` for ``vllm.triton_utils``, device-tensor ``UvaBackedTensor`` and
    ``StagedWriteTensor``, ``envs``' defaults for the bad-words table sizes, a plain
    host-to-device copy, type names). ``sys.modules`` is restored afterwards."""
    where = "given"
    if src is None:
        src, where = _installed_source()
        if src is None:
            src = os.environ.get(ENV_VLLM_SRC)
            if not src:
                return None, f"{where}; {ENV_VLLM_SRC} not set"
            where = f"{where}; sources from ${ENV_VLLM_SRC}"
    missing = [f for f in FILES.values() if not os.path.isfile(os.path.join(src, f))]
    if missing:
        return None, f"{where}; {src} lacks {missing}"
    version = _version(src)
    saved = {k: v for k, v in sys.modules.items() if k == "vllm" or k.startswith("vllm.")}
    for k in saved:
        del sys.modules[k]
    try:
        stand_ins = _stand_in_modules()
        sys.modules.update(stand_ins)
        files = dict(FILES)
        if os.path.isfile(os.path.join(src, GRAMMAR_FILE)):
            files["structured_outputs"] = GRAMMAR_FILE
        loaded: dict[str, types.ModuleType] = {}
        for key, rel in files.items():
            name = "vllm." + rel[:-3].replace("/", ".")
            loaded[key] = _load_file(name, os.path.join(src, rel))
            parent, _, child = name.rpartition(".")
            if parent in sys.modules:
                setattr(sys.modules[parent], child, loaded[key])
            if key == "interface":  # the package re-exports the interface classes
                lp = sys.modules["vllm.v1.worker.gpu.sample.logits_processor"]
                for n in ("LogitsContext", "LogitsProcessor", "LogitsProcRequestState"):
                    setattr(lp, n, getattr(loaded[key], n))
    except Exception as exc:
        return None, f"{where}; loading {src} failed: {type(exc).__name__}: {str(exc)[:160]}"
    finally:
        for k in [k for k in sys.modules if k == "vllm" or k.startswith("vllm.")]:
            del sys.modules[k]
        sys.modules.update(saved)
    grammar = "vLLM's grammar kernel" if "structured_outputs" in loaded else f"no {GRAMMAR_FILE}: xgrammar's kernel"
    return loaded, f"vLLM {version} V2 sampler sources from {src} ({where}; {grammar})"


# --- the scenario -----------------------------------------------------------------------

def _distinct(V: int, n: int, exclude: Sequence[int], rng: random.Random) -> list[int]:
    """``n`` distinct random ids in ``[0, V)`` outside ``exclude``, in random order."""
    ids = [t for t in rng.sample(range(V), min(V, n + len(exclude))) if t not in exclude]
    return ids[:n]


class Case:
    """One (rows, vocab) scenario on both sides; logits per dtype come from :meth:`logits`."""

    def __init__(self, rows: int, V: int, mods: dict[str, types.ModuleType] | None, device: str = "cuda",
                 seed: int = 0, backend: str = "auto") -> None:
        import torch

        from stopline.logits import LogitsConstraints

        self.rows, self.V, self.device, self.backend, self.seed = rows, V, device, backend, seed
        # The last row's thinking budget is spent; a lone row is left unforced (forcing the whole
        # batch would time a one-hot write instead of the constraints).
        self.forced_row: int | None = rows - 1 if rows > 1 else None
        rng = random.Random(seed)
        gd = torch.Generator(device).manual_seed(seed)
        keep = torch.rand(rows, V, generator=gd, device=device) < 0.01
        keep[:, [EOS, STOP2, SAFE, 11, 25]] = True  # the stops, the safe token and two banned ids
        keep[::2] = False
        keep[::2, EOS] = True  # the grammar allows only EOS: min_tokens masks it, the restore puts it back
        self.bitmask = _pack(keep)
        del keep
        self.slots = torch.arange(rows, device=device)
        self.positions = torch.full((rows,), len(OUTPUT), device=device)  # output tokens so far
        self.params: list[dict[str, Any]] = []
        n_allowed = min(N_ALLOWED, V // 2)
        special = [EOS, SAFE, 11, 25]
        for r in range(rows):
            kw: dict[str, Any] = dict(min_tokens=MIN_TOKENS, stop_token_ids=[EOS, STOP2], bad_words=BAD_WORDS,
                                      restore="structured")
            # EOS: biased, masked, restored; SAFE: biased and kept
            bias_ids = [EOS, SAFE] + _distinct(V, N_BIAS - 2, special[:2], rng)
            bias_vals = [rng.randint(-1024, 1024) / 1024 for _ in bias_ids]  # exact in float32
            kw["logit_bias"] = dict(zip(bias_ids, bias_vals))
            if r % 4 in (0, 1):
                kw["allowed_token_ids"] = special + _distinct(V, n_allowed - len(special), special, rng)
            self.params.append(kw)
        # stopline: one state, default reserve (the forced-id read kept)
        self.cons = LogitsConstraints(rows, V, device)
        for r, kw in enumerate(self.params):
            self.cons.set(r, **kw)
            self.cons.append_tokens(r, OUTPUT)
        if self.forced_row is not None:
            self.cons.force(self.forced_row, THINK_END)
        self.vllm: dict[str, Any] | None = None
        if mods is not None:
            self.vllm = self._vllm_states(mods)

    def _vllm_states(self, mods: dict[str, types.ModuleType]) -> dict[str, Any]:
        """vLLM's states filled through their own add_request/apply_staged_writes, and the
        step's LogitsContext for a decode step (one row per request)."""
        import numpy as np
        import torch

        rows, dev = self.rows, torch.device(self.device)
        UvaBackedTensor.device = dev
        itf = mods["interface"]
        prompt_len = UvaBackedTensor(rows, dtype=torch.int32)
        prefill_len = UvaBackedTensor(rows, dtype=torch.int32)
        history = PROMPT + OUTPUT
        all_token_ids = StagedWriteTensor((rows, 2 * len(history)), dtype=torch.int32, device=dev)
        total_len = StagedWriteTensor(rows, dtype=torch.int32, device=dev)
        for r in range(rows):
            prompt_len.np[r] = len(PROMPT)
            prefill_len.np[r] = len(PROMPT)
            all_token_ids.stage_write(r, 0, history)
            total_len.stage_write_elem(r, len(history))
        prompt_len.copy_to_uva()
        prefill_len.copy_to_uva()
        all_token_ids.apply_write()
        total_len.apply_write()
        req = itf.LogitsProcRequestState(device=dev, max_num_reqs=rows, vocab_size=self.V,
                                         all_token_ids=all_token_ids, prompt_len=prompt_len,
                                         prefill_len=prefill_len, total_len=total_len)
        bias = mods["logit_bias"].LogitBiasState(None, req)
        bad = mods["bad_words"].BadWordsState(None, req)
        reasoning = types.SimpleNamespace(reasoning_start_token_ids=[THINK_START], reasoning_end_token_ids=[THINK_END],
                                          natural_reasoning_end_token_ids=[THINK_END])
        budget = mods["thinking_budget"].ThinkingBudgetState(req, reasoning)
        for r, kw in enumerate(self.params):
            sp = types.SimpleNamespace(
                allowed_token_ids=kw.get("allowed_token_ids"), logit_bias=kw["logit_bias"], min_tokens=kw["min_tokens"],
                all_stop_token_ids=set(kw["stop_token_ids"]), structured_outputs=object(),
                bad_words_token_ids=kw["bad_words"],
                thinking_token_budget=SPENT_BUDGET if r == self.forced_row else BUDGET)
            for state in (bias, bad, budget):
                state.add_request(r, sp)
        for state in (bias, bad, budget):
            state.apply_staged_writes()
        idx = torch.arange(rows, dtype=torch.int32, device=dev)
        ctx = itf.LogitsContext(
            expanded_idx_mapping=idx, idx_mapping=idx, idx_mapping_np=np.arange(rows, dtype=np.int32),
            expanded_local_pos=torch.zeros(rows, dtype=torch.int32, device=dev),
            input_ids=torch.full((rows,), history[-1], dtype=torch.int32, device=dev),
            pos=torch.full((rows,), len(history) - 1, dtype=torch.int64, device=dev),  # the input token's position
            seq_lens_upper_bound_np=np.full(rows, len(history), dtype=np.int32))
        out: dict[str, Any] = dict(states=(bias, bad, budget), ctx=ctx, mods=mods)
        if "structured_outputs" in mods:
            out["grammar_indices"] = idx.clone()  # StructuredOutputsWorker.logits_indices: one mask per row
            out["cu_num_logits"] = torch.arange(rows + 1, dtype=torch.int32, device=dev)
        return out

    def logits(self, dtype_name: str) -> Any:
        import torch

        gd = torch.Generator(self.device).manual_seed(self.seed + 1)
        return torch.randn(self.rows, self.V, generator=gd, device=self.device).to(getattr(torch, dtype_name))

    # --- the timed calls ---

    def stopline(self, x: Any) -> Fn:
        cons, s, p, b, be = self.cons, self.slots, self.positions, self.bitmask, self.backend
        return lambda: cons.apply(x, s, p, bitmask=b, backend=be)

    def vllm_grammar(self) -> Callable[[Any], None]:
        """vLLM's grammar step as ``apply_grammar_bitmask`` launches its kernel (the bitmask
        and the row mapping already on the device: their host-to-device copies are left out)."""
        assert self.vllm is not None
        so = self.vllm["mods"]["structured_outputs"]
        bitmask, indices, cu = self.bitmask, self.vllm["grammar_indices"], self.vllm["cu_num_logits"]

        def grammar(x: Any) -> None:
            V = x.shape[-1]
            block = so.GRAMMAR_BITMASK_BLOCK_SIZE
            so._apply_grammar_bitmask_kernel[(bitmask.shape[0], _cdiv(V, block))](
                x, x.stride(0), indices, cu, bitmask, bitmask.stride(0), V, MASK_STRIDE=1, BLOCK_SIZE=block)

        return grammar

    def xgrammar_grammar(self) -> Callable[[Any], None]:
        """xgrammar's ``apply_token_bitmask_inplace`` (its default backend) as the grammar step."""
        import xgrammar

        bitmask = self.bitmask
        return lambda x: xgrammar.apply_token_bitmask_inplace(x, bitmask)

    def vllm_chain(self, x: Any, grammar: Callable[[Any], None]) -> Callable[[], Any]:
        """The step on ``x`` (in place for the grammar), returning vLLM's float32 logits."""
        import torch

        assert self.vllm is not None
        bias, bad, budget = self.vllm["states"]
        ctx = self.vllm["ctx"]

        def chain() -> Any:
            grammar(x)
            y = torch.empty_like(x, dtype=torch.float32).copy_(x)  # Sampler.apply_sampling_params
            y = bias.apply(y, ctx)
            y = bad.apply(y, ctx)
            budget.apply(y, ctx)  # forcing runs last
            return y

        return chain

    # --- the check ---

    def check(self, base: Any, grammar: Callable[[Any], None]) -> tuple[bool, str]:
        """(ok, detail): stopline vs vLLM on a fresh copy of ``base`` (see the module doc)."""
        import torch

        s = base.clone()
        infeasible = self.cons.apply(s, self.slots, self.positions, bitmask=self.bitmask, backend=self.backend)
        v = self.vllm_chain(base.clone(), grammar)()
        a = s.to(torch.float32)
        b = v.to(base.dtype).to(torch.float32)  # vLLM's float32 bias sums rounded as stopline rounds them
        f = self.forced_row
        others = torch.ones(self.rows, dtype=torch.bool, device=base.device)
        if f is not None:
            others[f] = False
        problems = []
        fin_a, fin_b = torch.isfinite(a[others]), torch.isfinite(b[others])
        if not torch.equal(fin_a, fin_b):
            rows = (fin_a != fin_b).any(dim=1).nonzero().flatten()
            problems.append(f"finiteness differs on {rows.numel()} rows")
        elif not torch.equal(torch.where(fin_a, a[others], 0.0), torch.where(fin_b, b[others], 0.0)):
            problems.append("finite values differ")
        if f is not None:
            fa = torch.isfinite(a[f]).nonzero().flatten().tolist()
            if fa != [THINK_END] or int(v[f].argmax()) != THINK_END or float(v[f, THINK_END]) != FORCED_LOGIT:
                problems.append(f"forced row: stopline finite at {fa[:4]}, vLLM argmax {int(v[f].argmax())}")
        eos_rows = [r for r in range(0, self.rows, 2) if r != f]
        if eos_rows:
            sel = torch.tensor(eos_rows, device=base.device)
            only_eos = torch.zeros(self.V, dtype=torch.bool, device=base.device)
            only_eos[EOS] = True
            if not bool((torch.isfinite(a[sel]) == only_eos).all()):
                problems.append("an EOS-only row was not restored to EOS alone")
        if bool(infeasible.any()):
            problems.append(f"{int(infeasible.sum())} rows infeasible")
        forced = "" if f is None else f", forced row both pick {THINK_END}"
        return not problems, "; ".join(problems) or f"ok ({int(others.sum())} rows equal{forced})"


def run_grid(rows: Sequence[int], vocabs: Sequence[int], dtypes: Sequence[str], log: Callable[[str], None] = print,
             jsonl: str | None = None) -> tuple[list[dict[str, Any]], dict[str, str]]:
    """Time every column on every case (vocab, then rows, then dtype); returns (records, notes)."""
    import torch

    if not torch.cuda.is_available():
        raise RuntimeError("the vLLM 0.34 logits bench needs a CUDA GPU")
    import triton

    xgr, xgr_note = xgrammar_kernels()
    mods, vllm_note = load_vllm_v2()
    notes = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
             "xgrammar": xgr_note, "vllm": vllm_note,
             "timing": "CUDA-graph replay medians, us per call (a record's 'timing' says 'eager' where a capture failed)"}
    sink = open(jsonl, "w") if jsonl else None
    if sink:
        sink.write(json.dumps({"notes": notes}) + "\n")
        sink.flush()
    out: list[dict[str, Any]] = []
    t0 = time.monotonic()
    try:
        for V in vocabs:
            for R in rows:
                t_set = time.monotonic()
                case = Case(R, V, mods)
                log(f"<!-- {R} rows x {V}: both sides set up in {time.monotonic() - t_set:.1f} s -->")
                grammar = case.vllm_grammar() if mods is not None and "structured_outputs" in mods else None
                for dtype_name in dtypes:
                    rec = _run_case(case, dtype_name, xgr, grammar)
                    rec["elapsed s"] = round(time.monotonic() - t0, 1)
                    out.append(rec)
                    log(format_row(rec))
                    if sink:
                        sink.write(json.dumps(rec) + "\n")
                        sink.flush()
                    torch.cuda.empty_cache()
                del case, grammar
                torch.cuda.empty_cache()
    finally:
        if sink:
            sink.close()
    return out, notes


def _run_case(case: Case, dtype_name: str, xgr: dict[str, Callable[..., None]],
              grammar: Callable[[Any], None] | None) -> dict[str, Any]:
    """One (rows, vocab, dtype): every column, each side on its own copy of the logits, and the check."""
    import torch

    base = case.logits(dtype_name)
    rec: dict[str, Any] = dict(dtype=dtype_name, vocab=case.V, rows=case.rows, timing="graph")
    dst = torch.empty_like(base)
    rec["copy"] = time_graph(lambda: dst.copy_(base))
    if "xgr cuda" in xgr:
        kernel, x_xgr = xgr["xgr cuda"], base.clone()
        rec["xgr cuda"] = time_graph(lambda: kernel(x_xgr, case.bitmask))
    sides = {"stopline": case.stopline(base.clone())}
    if case.vllm is not None:
        if grammar is not None:
            sides["vllm 0.34"] = case.vllm_chain(base.clone(), grammar)
        sides["vllm 0.34 xgr"] = case.vllm_chain(base.clone(), case.xgrammar_grammar())
    try:
        for k, fn in sides.items():
            rec[k] = time_graph(fn)
    except Exception as exc:  # a side that cannot be captured: every side eagerly
        rec["timing"] = f"eager ({type(exc).__name__}: {str(exc)[:80]})"
        for k, fn in sides.items():
            rec[k] = time_eager(fn)
    if case.vllm is not None:
        ok, detail = case.check(base, grammar or case.xgrammar_grammar())
        if grammar is not None:  # vLLM's grammar kernel and xgrammar's: the same masked logits
            a, b = base.clone(), base.clone()
            grammar(a)
            case.xgrammar_grammar()(b)
            if not torch.equal(a, b):
                ok, detail = False, f"{detail}; vLLM's grammar kernel and xgrammar's differ"
        rec["checked"] = "ok" if ok else "MISMATCH"
        rec["check detail"] = detail
    else:
        rec["checked"] = "-"
    return rec


COLUMNS = ("copy", "xgr cuda", "stopline", "vllm 0.34", "vllm 0.34 xgr")


def _vllm_col(r: dict[str, Any]) -> str | None:
    return "vllm 0.34" if "vllm 0.34" in r else ("vllm 0.34 xgr" if "vllm 0.34 xgr" in r else None)


def header() -> str:
    cols = " | ".join(f"{c} us" for c in COLUMNS)
    return (f"| dtype | vocab | rows | {cols} | vllm/stopline | stopline/xgr cuda | timing | check |\n"
            "|---|---:|---:|" + "---:|" * (len(COLUMNS) + 2) + "---|---|")


def format_row(r: dict[str, Any]) -> str:
    cells = " | ".join(f"{r[c]:.1f}" if c in r else "-" for c in COLUMNS)
    vc = _vllm_col(r)
    vs = f"{r[vc] / r['stopline']:.2f}x" if vc and "stopline" in r else "-"
    xs = f"{r['stopline'] / r['xgr cuda']:.2f}" if "xgr cuda" in r and "stopline" in r else "-"
    timing = "graph" if r.get("timing") == "graph" else "eager"
    return f"| {r['dtype']} | {r['vocab']} | {r['rows']} | {cells} | {vs} | {xs} | {timing} | {r.get('checked', '-')} |"


def markdown(records: Sequence[dict[str, Any]], notes: dict[str, str]) -> str:
    lines = [f"- {k}: {v}" for k, v in notes.items()] + ["", header()] + [format_row(r) for r in records]
    bad = [r for r in records if r.get("checked") not in ("ok", "-")]
    if bad:
        lines += ["", "Check failures:"] + [f"- {r['dtype']} {r['vocab']} x {r['rows']}: {r['check detail']}"
                                            for r in bad]
    return "\n".join(lines) + "\n"


def summary(records: Sequence[dict[str, Any]]) -> list[str]:
    """The targets, per row count: vllm/stopline >= 2.5x everywhere, stopline/xgr cuda <= 1.05 from 256 rows."""
    lines = []
    for R in sorted({r["rows"] for r in records}):
        rs = [r for r in records if r["rows"] == R]
        vs = [r[c] / r["stopline"] for r in rs if (c := _vllm_col(r))]
        xs = [r["stopline"] / r["xgr cuda"] for r in rs if "xgr cuda" in r]
        part = [f"rows {R}:"]
        if vs:
            part.append(f"vllm/stopline min {min(vs):.2f}x median {statistics.median(vs):.2f}x"
                        f" ({'meets' if min(vs) >= 2.5 else 'misses'} >= 2.5x)")
        if xs:
            target = "" if R < 256 else f" ({'meets' if max(xs) <= 1.05 else 'misses'} <= 1.05)"
            part.append(f"stopline/xgr cuda max {max(xs):.2f} median {statistics.median(xs):.2f}{target}")
        lines.append(" ".join(part))
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    """``benches/bench_logits_vllm.py``."""
    import argparse

    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("--rows", type=int, nargs="+")
    p.add_argument("--vocabs", type=int, nargs="+")
    p.add_argument("--dtypes", nargs="+", choices=DTYPES)
    p.add_argument("--quick", action="store_true", help="a small grid (explicit sizes still win)")
    p.add_argument("--markdown", help="write the table here")
    p.add_argument("--jsonl", help="write one JSON line per case here (notes first), as the run goes")
    args = p.parse_args(argv)
    grid: dict[str, Sequence[Any]] = dict(QUICK) if args.quick else dict(rows=ROWS, vocabs=VOCABS, dtypes=DTYPES)
    for k in ("rows", "vocabs", "dtypes"):
        if getattr(args, k) is not None:
            grid[k] = getattr(args, k)
    print(header(), flush=True)
    records, notes = run_grid(grid["rows"], grid["vocabs"], grid["dtypes"], log=lambda s: print(s, flush=True),
                              jsonl=args.jsonl)
    for k, v in notes.items():
        print(f"{k}: {v}")
    for line in summary(records):
        print(line)
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(markdown(records, notes))
            f.write("\n" + "\n".join(f"- {s}" for s in summary(records)) + "\n")
    return 0 if all(r["checked"] in ("ok", "-") for r in records) else 1


if __name__ == "__main__":
    raise SystemExit(main())
