"""``stopline bench --suite logits``: the logits constraints on a GPU, side by
side with xgrammar's bitmask kernels and vLLM's own processor chain.

For every (dtype, vocab, rows, allowed fraction) one logits tensor, one
bitmask and one constraint set are made, and each implementation runs in place
on that same tensor (every one's work depends only on the masks, not on what an
earlier call wrote). Times are CUDA-graph replay medians (device time per call,
no Python launch gaps), so the torch reference, which syncs, is not timed.

Columns:

- ``copy``: ``dst.copy_(logits)``, one read and one write of every logit;
- ``xgr cuda`` / ``xgr triton``: xgrammar's ``apply_token_bitmask_inplace``
  CUDA and Triton backends (``xgrammar.kernels``), where installed;
- ``bitmask``: ``LogitsConstraints.apply(bitmask=...)`` with no other
  constraint (what xgrammar does, plus the infeasible flags), on a state
  built with ``reserve={"forced_token": False}`` (no forcing while a graph
  is live, so the captured kernel does not read the forced ids); ``bitmask
  forceable``: the same on a default state (the graph keeps that read);
- ``all`` (``reserve={"forced_token": False}`` too): bitmask + min_tokens (two stop ids, below min_tokens: the stops are
  masked, half the rows allow only EOS so the restore fires) +
  ``allowed_token_ids`` on half the slots (4096 ids) + bad words (3
  one-token, 3 multi-token, one firing) + 16 ``logit_bias`` ids, one launch;
- ``vllm``: the same constraints as vLLM 0.33 applies them: xgrammar's CUDA
  bitmask kernel, then ``Sampler.apply_logits_processors``' steps (the
  allowed-ids ``masked_fill_``, ``apply_bad_words``, then the
  ``MinTokensLogitsProcessor`` and ``LogitBiasLogitsProcessor`` ``apply``),
  with vLLM's own processor code (:func:`load_vllm_chain`); left out when
  vLLM's sources are not found;
- dense scenarios (no bitmask, no allowed ids): ``min`` (min_tokens, 2 stop
  ids), ``bias`` (16 ``logit_bias`` ids), ``bad`` (the bad words above);
- ``floor``, ``floor split``: the least a Triton launch shaped like ``apply``
  does (``floor_kernel.py``): one program per row reads its slot and writes its
  flag; and the same on the bitmask scenario's grid (rows x chunks), the last
  of a row's programs to arrive writing the flag: the launch and latency
  floors a small batch cannot go under;
- ``forced``: ``all`` with every fourth slot forced to one token id
  (``LogitsConstraints.force``, a spent thinking budget), one launch, on a
  default state (the forced-id read kept); ``forced vs all`` is its time over
  ``all``'s, the read included (issue 21: forced rows should add nothing
  measurable).

A check per case: stopline's ``bitmask`` output equals xgrammar's, and
stopline's ``all`` and ``forced`` outputs equal the torch reference (rows <=
256), each forced row finite at its forced id only.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import statistics
import sys
import types
from collections.abc import Callable, Sequence
from typing import Any

ROWS = (1, 16, 64, 256, 1024, 4096)
VOCABS = (32000, 128256, 151936, 262144)
DTYPES = ("float32", "bfloat16", "float16")
FRACS = (0.01, 0.5)
QUICK = dict(rows=(1, 64, 1024), vocabs=(128256,), dtypes=("float32", "bfloat16"), fracs=(0.01,))
EOS, EOS2 = 2, 0
BAD_WORDS = [[11], [12], [13], [21, 22], [23, 24, 25], [26, 27]]
HISTORY = [5, 23, 24]  # [23, 24, 25] fires
FORCED_ID = 7  # the forced scenario's token (as an end-of-thinking marker id)
FORCED_EVERY = 4  # slots 1, 5, 9, ... are forced
ENV_VLLM_SRC = "STOPLINE_VLLM_SRC"

Fn = Callable[[], object]


def time_graph(fn: Fn, target_ms: float = 2.0, max_calls: int = 200, replays: int = 5) -> float:
    """Median microseconds per call over ``replays`` replays of a CUDA graph of up to
    ``max_calls`` calls of ``fn`` (sized to about ``target_ms``)."""
    import torch

    fn()  # compile and warm up outside the capture
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    with torch.cuda.stream(torch.cuda.Stream()):
        fn()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            fn()
        g.replay()
        torch.cuda.synchronize()
        start.record()
        g.replay()
        end.record()
        torch.cuda.synchronize()
        n = max(1, min(max_calls, int(target_ms / max(start.elapsed_time(end), 1e-3))))
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            for _ in range(n):
                fn()
        g.replay()
        torch.cuda.synchronize()
        times = []
        for _ in range(replays):
            start.record()
            g.replay()
            end.record()
            torch.cuda.synchronize()
            times.append(start.elapsed_time(end) / n)
    return statistics.median(times) * 1e3


def time_eager(fn: Fn, reps: int = 15) -> float:
    """Median microseconds of single eager calls between CUDA events (host launch gaps and
    syncs included): for code that syncs inside and so cannot be graph-captured."""
    import torch

    for _ in range(3):
        fn()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(reps):
        torch.cuda.synchronize()
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times) * 1e3


def xgrammar_kernels() -> tuple[dict[str, Callable[..., None]], str]:
    """xgrammar's bitmask kernels by backend name, and a note (version or why none)."""
    out: dict[str, Callable[..., None]] = {}
    notes = []
    try:
        import xgrammar
    except ImportError as exc:
        return out, f"xgrammar not installed ({exc})"
    from importlib.metadata import version

    notes.append(f"xgrammar {getattr(xgrammar, '__version__', None) or version('xgrammar')}")
    for name, mod, attr in (("xgr cuda", "apply_token_bitmask_inplace_cuda", "apply_token_bitmask_inplace_cuda"),
                            ("xgr triton", "apply_token_bitmask_inplace_triton",
                             "apply_token_bitmask_inplace_triton")):
        try:
            out[name] = getattr(importlib.import_module(f"xgrammar.kernels.{mod}"), attr)
        except Exception as exc:  # a JIT build that fails on this machine: leave the backend out
            notes.append(f"{name} unavailable: {type(exc).__name__}: {str(exc)[:120]}")
    return out, "; ".join(notes)


def _load_file(name: str, path: str) -> types.ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {path}")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


def load_vllm_chain() -> tuple[dict[str, Any] | None, str]:
    """vLLM's processor code: ``MinTokensLogitsProcessor``, ``LogitBiasLogitsProcessor``,
    ``BatchUpdate`` and ``apply_bad_words``, and a note saying where they came from.

    From an installed ``vllm`` when it imports; else from vLLM's own source files in the
    directory ``$STOPLINE_VLLM_SRC`` (a copy of the ``vllm`` package folder, for machines
    where vLLM cannot be installed): ``v1/sample/logits_processor/{interface,builtin}.py``
    and ``v1/sample/ops/bad_words.py`` are loaded as they are, with stand-ins only for
    the names they import for type hints and parameter classes (``vllm.SamplingParams``,
    ``vllm.config``) and for ``vllm.utils.torch_utils.async_tensor_h2d`` (a host-to-device
    copy used by ``update_state``), none of which the timed ``apply`` calls touch."""
    try:
        from vllm.v1.sample.logits_processor import builtin, interface
        from vllm.v1.sample.ops import bad_words

        import vllm
        return ({"builtin": builtin, "interface": interface, "bad_words": bad_words},
                f"vLLM {vllm.__version__} (installed)")
    except Exception as exc:
        why = f"vllm does not import ({type(exc).__name__})"
    src = os.environ.get(ENV_VLLM_SRC)
    if not src:
        return None, f"{why}; {ENV_VLLM_SRC} not set"
    files = {"interface": "v1/sample/logits_processor/interface.py",
             "builtin": "v1/sample/logits_processor/builtin.py", "bad_words": "v1/sample/ops/bad_words.py"}
    if not all(os.path.isfile(os.path.join(src, f)) for f in files.values()):
        return None, f"{why}; {src} lacks {list(files.values())}"
    saved = {k: v for k, v in sys.modules.items() if k == "vllm" or k.startswith("vllm.")}
    try:
        for pkg in ("vllm", "vllm.v1", "vllm.v1.sample", "vllm.v1.sample.logits_processor", "vllm.v1.sample.ops"):
            m = types.ModuleType(pkg)
            m.__path__ = []
            sys.modules[pkg] = m

        class _Stand:  # a parameter or config class the timed code only names
            def __init__(self, *a: object, **k: object) -> None:
                pass

        def async_tensor_h2d(data: Any, device: Any = None, dtype: Any = None, out: Any = None) -> Any:
            import torch  # set-up only (update_state): a plain host-to-device copy

            return torch.tensor(data, dtype=dtype).to(device)

        for mod, names in (("vllm", ["SamplingParams"]), ("vllm.config", ["VllmConfig"]),
                           ("vllm.utils", []), ("vllm.utils.torch_utils", [])):
            m = sys.modules.get(mod) or types.ModuleType(mod)
            for n in names:
                setattr(m, n, _Stand)
            sys.modules[mod] = m
        sys.modules["vllm.utils.torch_utils"].async_tensor_h2d = async_tensor_h2d  # type: ignore[attr-defined]
        loaded = {k: _load_file(f"vllm.{v[:-3].replace('/', '.')}", os.path.join(src, v)) for k, v in files.items()}
    except Exception as exc:
        return None, f"{why}; loading {src} failed: {type(exc).__name__}: {str(exc)[:160]}"
    finally:
        for k in [k for k in sys.modules if k == "vllm" or k.startswith("vllm.")]:
            del sys.modules[k]
        sys.modules.update(saved)
    version = open(os.path.join(src, "version.txt")).read().strip() if os.path.isfile(
        os.path.join(src, "version.txt")) else "?"
    return loaded, f"vLLM {version} processor sources from {src}"


def _pack(keep: Any) -> Any:
    """bool [rows, V] -> int32 [rows, ceil(V/32)] in xgrammar's layout."""
    import torch

    R, V = keep.shape
    W = (V + 31) // 32
    padded = torch.zeros((R, W * 32), dtype=torch.bool, device=keep.device)
    padded[:, :V] = keep
    words = torch.zeros((R, W), dtype=torch.int64, device=keep.device)
    for j in range(32):  # word by word: no [R, W, 32] int64 temporary at 4096 x 262144
        words |= padded[:, j::32].to(torch.int64) << j
    return torch.where(words >= 2**31, words - 2**32, words).to(torch.int32)


class Case:
    """One (rows, vocab, dtype, allowed fraction): tensors, constraint sets, the vLLM chain."""

    def __init__(self, rows: int, V: int, dtype_name: str, frac: float, seed: int = 0, device: str = "cuda",
                 backend: str = "auto"):
        import torch

        from stopline.logits import LogitsConstraints

        self.rows, self.V, self.frac = rows, V, frac
        self.backend = backend  # "triton" on a CPU device runs the kernel under TRITON_INTERPRET=1 (tests)
        dev = device
        g = torch.Generator().manual_seed(seed)
        gd = torch.Generator(dev).manual_seed(seed)
        dtype = getattr(torch, dtype_name)
        self.base = torch.randn(rows, V, generator=gd, device=dev).to(dtype)
        self.work = self.base.clone()  # xgrammar, bitmask, all, vllm: mostly -inf after the first call
        self.fresh = self.base.clone()  # the dense scenarios: model-like rows (finite logits)
        self.dst = torch.empty_like(self.base)
        keep = torch.rand(rows, V, generator=gd, device=dev) < frac
        keep[:, EOS] = True
        keep[::2] = False
        keep[::2, EOS] = True  # grammar allows only EOS: min_tokens masks it, restore puts it back
        self.bitmask = _pack(keep)
        del keep
        self.slots = torch.arange(rows, device=dev)
        self.pos = torch.full((rows,), len(HISTORY), device=dev)
        # No forcing while a graph is live (reserve forced_token False): the captured kernel
        # leaves the forced-id read out, as an engine without thinking budgets would run it.
        # 'bitmask forceable' and 'forced' keep the default reserve (the read kept).
        unforced = {"forced_token": False}
        self.plain = LogitsConstraints(rows, V, dev, reserve=unforced)
        self.forceable = LogitsConstraints(rows, V, dev)
        self.params: list[dict[str, Any]] = []
        self.all = LogitsConstraints(rows, V, dev, reserve=unforced)
        self.forced = LogitsConstraints(rows, V, dev)
        self.dense = {k: LogitsConstraints(rows, V, dev, reserve=unforced) for k in ("min", "bias", "bad")}
        for s in range(rows):
            kw: dict[str, Any] = dict(min_tokens=16, stop_token_ids=[EOS, EOS2], bad_words=BAD_WORDS,
                                      logit_bias={int(t): 0.5 for t in torch.randperm(V, generator=g)[:16]})
            if s % 2 == 0:
                kw["allowed_token_ids"] = torch.randint(0, V, (4096,), generator=g).tolist() + [EOS]
            self.params.append(kw)
            for cons in (self.all, self.forced):
                cons.set(s, **kw)
                cons.append_tokens(s, HISTORY)
            if s % FORCED_EVERY == 1:
                self.forced.force(s, FORCED_ID)
            self.dense["min"].set(s, min_tokens=16, stop_token_ids=[EOS, EOS2])
            self.dense["bias"].set(s, logit_bias=kw["logit_bias"])
            self.dense["bad"].set(s, bad_words=BAD_WORDS)
            self.dense["bad"].append_tokens(s, HISTORY)

    def copy(self) -> Fn:
        return lambda: self.dst.copy_(self.base)

    def floor(self) -> Fn:
        import torch

        from .floor_kernel import slot_to_flag

        flags = torch.empty(self.rows, dtype=torch.bool, device=self.base.device)
        return lambda: slot_to_flag(self.slots, flags)

    def floor_split(self) -> Fn:
        """The floor on the grid the bitmask scenario launches (chunks per row as ``apply`` picks them)."""
        import torch

        from stopline.logits.triton_kernel import chunks_per_row

        from .floor_kernel import arrival_to_flag

        dev = self.base.device
        chunks = chunks_per_row(self.rows, self.V, self.base.dtype, dev, self.plain._tuning)
        flags = torch.empty(self.rows, dtype=torch.bool, device=dev)
        scratch = torch.zeros(self.rows, dtype=torch.int64, device=dev)
        return lambda: arrival_to_flag(self.slots, flags, scratch, chunks)

    def bitmask_only(self, kernel: Callable[..., None]) -> Fn:
        return lambda: kernel(self.work, self.bitmask)

    def stopline(self, which: str) -> Fn:
        x, s, p, be = self.work, self.slots, self.pos, self.backend
        if which in ("bitmask", "bitmask forceable", "all", "forced"):
            cons = {"bitmask": self.plain, "bitmask forceable": self.forceable, "all": self.all,
                    "forced": self.forced}[which]
            return lambda: cons.apply(x, s, p, bitmask=self.bitmask, backend=be)
        cons = self.dense[which]
        return lambda: cons.apply(self.fresh, s, p, backend=be)

    def vllm(self, chain: dict[str, Any], xgr_apply: Callable[..., None]) -> Fn:
        """The 'all' constraints through vLLM's code, state set up by its own update_state.

        ``xgr_apply`` is ``xgrammar.apply_token_bitmask_inplace`` (its auto backend on CUDA:
        Triton), as vLLM 0.33's ``apply_grammar_bitmask`` calls it on the model's logits; the
        sampler then casts to float32 (a copy for 16-bit logits) and runs the processors on
        that. Every row is a grammar row (``structured_outputs`` set), so min_tokens takes its
        restore path."""
        import torch

        b, itf, bw = chain["builtin"], chain["interface"], chain["bad_words"]
        dev = torch.device("cuda")
        min_p = b.MinTokensLogitsProcessor(None, dev, False)
        bias_p = b.LogitBiasLogitsProcessor(None, dev, False)
        added: list[tuple[int, Any, list[int], list[int]]] = []
        outputs: list[list[int]] = []
        for s, kw in enumerate(self.params):
            params = types.SimpleNamespace(min_tokens=kw["min_tokens"], all_stop_token_ids=set(kw["stop_token_ids"]),
                                           logit_bias=kw["logit_bias"], bad_words_token_ids=kw["bad_words"],
                                           structured_outputs=object())
            out = list(HISTORY)
            outputs.append(out)
            added.append((s, params, [], out))
        update = itf.BatchUpdate(batch_size=self.rows, removed=[], added=added, moved=[])
        for proc in (min_p, bias_p):
            proc.update_state(update)
        # vLLM's allowed-ids mask (InputBatch.allowed_token_ids_mask): True = masked.
        mask = torch.zeros((self.rows, self.V), dtype=torch.bool, device=dev)
        for s, kw in enumerate(self.params):
            if "allowed_token_ids" in kw:
                mask[s] = True
                mask[s, kw["allowed_token_ids"]] = False
        bad = {s: kw["bad_words"] for s, kw in enumerate(self.params)}
        x, bitmask = self.work, self.bitmask

        def chain_fn() -> None:
            xgr_apply(x, bitmask)  # the model runner, on the model's dtype
            y = x.to(torch.float32)  # Sampler.forward: "Use float32 for the logits" (a copy for 16-bit)
            y.masked_fill_(mask, float("-inf"))
            bw.apply_bad_words(y, bad, outputs)
            min_p.apply(y)
            bias_p.apply(y)

        return chain_fn


def run_grid(rows: Sequence[int], vocabs: Sequence[int], dtypes: Sequence[str], fracs: Sequence[float],
             log: Callable[[str], None] = print) -> tuple[list[dict[str, Any]], dict[str, str]]:
    """Time every implementation on every case; returns (records, notes)."""
    import torch

    if not torch.cuda.is_available():
        raise RuntimeError("the logits suite needs a CUDA GPU")
    xgr, xgr_note = xgrammar_kernels()
    chain, vllm_note = load_vllm_chain()
    import triton

    notes = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
             "xgrammar": xgr_note, "vllm": vllm_note,
             "timing": "CUDA-graph replay medians, us per call, in place on one tensor"}
    out: list[dict[str, Any]] = []
    for dtype_name in dtypes:
        for V in vocabs:
            for R in rows:
                for frac in fracs:
                    case = Case(R, V, dtype_name, frac)
                    rec: dict[str, Any] = dict(dtype=dtype_name, vocab=V, rows=R, frac=frac)
                    rec["copy"] = time_graph(case.copy())
                    rec["floor"] = time_graph(case.floor())
                    rec["floor split"] = time_graph(case.floor_split())
                    for name, fn in xgr.items():
                        rec[name] = time_graph(case.bitmask_only(fn))
                    rec["bitmask"] = time_graph(case.stopline("bitmask"))
                    rec["bitmask forceable"] = time_graph(case.stopline("bitmask forceable"))
                    rec["all"] = time_graph(case.stopline("all"))
                    rec["forced"] = time_graph(case.stopline("forced"))
                    if chain is not None and xgr:
                        # vLLM's restore (unique_consecutive, boolean indexing) syncs: eager
                        # timing for it, and stopline's 'all' timed the same way beside it.
                        import xgrammar

                        rec["vllm eager"] = time_eager(case.vllm(chain, xgrammar.apply_token_bitmask_inplace))
                        rec["all eager"] = time_eager(case.stopline("all"))
                    if frac == fracs[0]:  # the dense scenarios do not read the bitmask
                        for k in ("min", "bias", "bad"):
                            rec[k] = time_graph(case.stopline(k))
                    rec["checked"] = _check(case, xgr)
                    out.append(rec)
                    log(format_row(rec))
                    del case
                    torch.cuda.empty_cache()
    return out, notes


def _check(case: Case, xgr: dict[str, Callable[..., None]]) -> str:
    """'ok' when stopline's bitmask-only output equals xgrammar's, its 'all' and
    'forced' outputs the reference's, and each forced row is finite at its
    forced id alone."""
    import torch

    checks = []
    if xgr:
        a, b = case.base.clone(), case.base.clone()
        case.plain.apply(a, case.slots, case.pos, bitmask=case.bitmask)
        next(iter(xgr.values()))(b, case.bitmask)
        checks.append(torch.equal(a, b))
    if case.rows <= 256:
        outs = {}
        for name, cons in (("all", case.all), ("forced", case.forced)):
            a, b = case.base.clone(), case.base.clone()
            ia = cons.apply(a, case.slots, case.pos, bitmask=case.bitmask, backend="triton")
            ib = cons.apply(b, case.slots, case.pos, bitmask=case.bitmask, backend="torch")
            checks.append(torch.equal(a, b) and torch.equal(ia, ib))
            outs[name] = (a, ia)
        forced_out, forced_infeasible = outs["forced"]
        finite = torch.isfinite(forced_out[1::FORCED_EVERY])
        checks.append(bool(finite[:, FORCED_ID].all()) and int(finite.sum()) == finite.shape[0]
                      and not bool(forced_infeasible[1::FORCED_EVERY].any()))
    return "ok" if all(checks) else "MISMATCH"


COLUMNS = ("copy", "floor", "floor split", "xgr cuda", "xgr triton", "bitmask", "bitmask forceable", "all", "forced",
           "min", "bias", "bad", "all eager", "vllm eager")


def _best_xgr(r: dict[str, Any]) -> float | None:
    xs = [r[k] for k in ("xgr cuda", "xgr triton") if k in r]
    return min(xs) if xs else None


def header() -> str:
    cols = " | ".join(f"{c} us" for c in COLUMNS)
    return (f"| dtype | vocab | rows | allowed | {cols} | bitmask vs best xgr | all vs best xgr | all vs vllm (eager) | "
            "forced vs all | check |\n"
            "|---|---:|---:|---:|" + "---:|" * (len(COLUMNS) + 4) + "---|")


def format_row(r: dict[str, Any]) -> str:
    cells = " | ".join(f"{r[c]:.1f}" if c in r else "-" for c in COLUMNS)
    best = _best_xgr(r)
    ratio = (lambda a, b: f"{a / b:.2f}x") if best else (lambda a, b: "-")
    vs_b = ratio(best, r["bitmask"]) if best else "-"
    vs_a = ratio(best, r["all"]) if best else "-"
    vs_v = f"{r['vllm eager'] / r['all eager']:.2f}x" if "vllm eager" in r else "-"
    forced = f"{r['forced'] / r['all']:.2f}x" if "forced" in r else "-"
    return (f"| {r['dtype']} | {r['vocab']} | {r['rows']} | {100 * r['frac']:g}% | {cells} | {vs_b} | {vs_a} | "
            f"{vs_v} | {forced} | {r['checked']} |")


def markdown(records: Sequence[dict[str, Any]], notes: dict[str, str]) -> str:
    lines = [f"- {k}: {v}" for k, v in notes.items()] + ["", header()] + [format_row(r) for r in records]
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m stopline.tools.bench.logits`` / ``benches/bench_logits.py``."""
    import argparse

    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("--rows", type=int, nargs="+", default=list(ROWS))
    p.add_argument("--vocabs", type=int, nargs="+", default=list(VOCABS))
    p.add_argument("--dtypes", nargs="+", default=list(DTYPES), choices=DTYPES)
    p.add_argument("--fracs", type=float, nargs="+", default=list(FRACS))
    p.add_argument("--quick", action="store_true", help="a small grid (explicit sizes still win)")
    p.add_argument("--json")
    p.add_argument("--markdown")
    return run_suite(p.parse_args(argv))


def run_suite(args: Any) -> int:
    """Run the grid that ``args`` names (``--quick`` for a small one); print and write the table."""
    import json

    defaults: dict[str, Sequence[Any]] = dict(rows=ROWS, vocabs=VOCABS, dtypes=DTYPES, fracs=FRACS)
    grid = dict(defaults)
    if getattr(args, "quick", False):
        grid.update(QUICK)
    for k in grid:  # explicit sizes win over --quick
        v = getattr(args, k, None)
        if v is not None and list(v) != list(defaults[k]):
            grid[k] = v
    print(header(), flush=True)
    records, notes = run_grid(grid["rows"], grid["vocabs"], grid["dtypes"], grid["fracs"],
                              log=lambda s: print(s, flush=True))
    for k, v in notes.items():
        print(f"{k}: {v}")
    if getattr(args, "json", None):
        with open(args.json, "w") as f:
            json.dump(dict(notes=notes, results=records), f, indent=1)
    if getattr(args, "markdown", None):
        with open(args.markdown, "w") as f:
            f.write(markdown(records, notes))
    return 0 if all(r["checked"] == "ok" for r in records) else 1


if __name__ == "__main__":
    raise SystemExit(main())
