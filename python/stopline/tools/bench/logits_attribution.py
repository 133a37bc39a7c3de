"""Where a small batch's time goes: the floors of the ``bitmask`` grid split
into its parts, and ``bitmask`` with one constraint of ``all`` added at a time
(issue 23; docs/benchmarks.md, "Where the time goes at 1-256 rows").

For each (dtype, vocab, rows) of the logits suite's :class:`~.logits.Case`
(1% allowed), CUDA-graph replay medians in µs of:

- the floors (``floor_kernel.py``) on the grid the ``bitmask`` scenario
  launches (``chunks`` programs a row): ``floor`` (one program a row),
  ``split`` (the relaxed arrival, as ``floor split``), ``grid`` (no arrival,
  chunk 0 writes the flag), ``allstore`` (every program writes it), ``red``
  (every program adds to the row's word without waiting for the result),
  ``acqrel`` (``split`` with an acquire-release add);
- ``xgr``: xgrammar's CUDA bitmask kernel; ``bitmask`` and ``forceable`` as in
  the suite;
- ``+min``, ``+min_off``, ``+bias``, ``+ban1``, ``+badmulti``, ``+allowed``:
  ``bitmask`` on a state with one kind of constraint of ``all`` on every slot
  (``VARIANTS``), each reserved without forced tokens; and ``all``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from . import logits as suite

SHAPES = tuple((d, 128256, r) for d in ("float32", "bfloat16") for r in (1, 16, 64, 256)) + tuple(
    ("float16", 151936, r) for r in (1, 16, 64))

# One kind of the 'all' scenario's constraints each (a slot's own values where they are drawn per slot).
VARIANTS: dict[str, Callable[[dict[str, Any]], dict[str, Any]]] = {
    "+min": lambda p: dict(min_tokens=p["min_tokens"], stop_token_ids=p["stop_token_ids"]),
    "+min_off": lambda p: dict(min_tokens=0, stop_token_ids=p["stop_token_ids"]),
    "+bias": lambda p: dict(logit_bias=p["logit_bias"]),
    "+ban1": lambda p: dict(bad_words=[w for w in p["bad_words"] if len(w) == 1]),
    "+badmulti": lambda p: dict(bad_words=[w for w in p["bad_words"] if len(w) > 1]),
    "+allowed": lambda p: {k: v for k, v in p.items() if k == "allowed_token_ids"},
}


def variant_states(case: suite.Case) -> dict[str, Any]:
    """One ``LogitsConstraints`` per ``VARIANTS`` entry, every slot set from ``case.params``
    and given the case's history."""
    from stopline.logits import LogitsConstraints

    out = {}
    for name, pick in VARIANTS.items():
        cons = LogitsConstraints(case.rows, case.V, case.base.device, reserve={"forced_token": False})
        for slot, params in enumerate(case.params):
            kw = pick(params)
            if kw:
                cons.set(slot, **kw)
            cons.append_tokens(slot, suite.HISTORY)
        out[name] = cons
    return out


def functions(case: suite.Case, xgr_cuda: Callable[..., None] | None) -> dict[str, suite.Fn]:
    """The timed callables of one case, in column order."""
    import torch

    from stopline.logits.triton_kernel import chunks_per_row

    from .floor_kernel import arrival_to_flag, grid_flag

    R, dev = case.rows, case.base.device
    chunks = chunks_per_row(R, case.V, case.base.dtype, dev, case.plain._tuning)
    flags = torch.empty(R, dtype=torch.bool, device=dev)
    zeroed = torch.zeros(R, dtype=torch.int64, device=dev)
    growing = torch.zeros(R, dtype=torch.int64, device=dev)
    s = case.slots
    fns: dict[str, suite.Fn] = {
        "floor": case.floor(),
        "split": case.floor_split(),
        "grid": lambda: grid_flag(s, flags, growing, chunks),
        "allstore": lambda: grid_flag(s, flags, growing, chunks, all_store=True),
        "red": lambda: grid_flag(s, flags, growing, chunks, add=True),
        "acqrel": lambda: arrival_to_flag(s, flags, zeroed, chunks, acq_rel=True),
    }
    if xgr_cuda is not None:
        fns["xgr"] = case.bitmask_only(xgr_cuda)
    fns["bitmask"] = case.stopline("bitmask")
    fns["forceable"] = case.stopline("bitmask forceable")
    for name, cons in variant_states(case).items():
        fns[name] = (lambda c: lambda: c.apply(case.work, s, case.pos, bitmask=case.bitmask, backend=case.backend))(
            cons)
    fns["all"] = case.stopline("all")
    return fns


def main(argv: Sequence[str] | None = None) -> int:
    """``benches/bench_logits_attribution.py``: print the table (markdown) for ``SHAPES``."""
    import argparse

    import torch

    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("--shapes", nargs="+", metavar="DTYPE:VOCAB:ROWS",
                   help="e.g. float32:128256:16 (default: %s)" % " ".join(f"{d}:{v}:{r}" for d, v, r in SHAPES))
    args = p.parse_args(argv)
    shapes = [(d, int(v), int(r)) for d, v, r in (x.split(":") for x in args.shapes)] if args.shapes else SHAPES
    if not torch.cuda.is_available():
        raise SystemExit("the attribution needs a CUDA GPU")
    xgr, note = suite.xgrammar_kernels()
    print(f"{torch.cuda.get_device_name()}; {note}", flush=True)
    columns: list[str] | None = None
    for dtype, V, R in shapes:
        case = suite.Case(R, V, dtype, 0.01)
        fns = functions(case, xgr.get("xgr cuda"))
        times = {k: suite.time_graph(f) for k, f in fns.items()}
        if columns is None:
            columns = list(times)
            print("| dtype | vocab | rows | chunks | " + " | ".join(columns) + " |")
            print("|---|---:|---:|---:|" + "---:|" * len(columns), flush=True)
        from stopline.logits.triton_kernel import chunks_per_row

        chunks = chunks_per_row(R, V, case.base.dtype, case.base.device, case.plain._tuning)
        print(f"| {dtype} | {V} | {R} | {chunks} | " + " | ".join(f"{times[c]:.2f}" for c in columns) + " |",
              flush=True)
        del case, fns
        torch.cuda.empty_cache()
    return 0
