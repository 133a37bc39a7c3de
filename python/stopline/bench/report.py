"""Turning rows into ratio tables (terminal and Markdown), the targets check,
the JSON record and the PNG plot."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from stopline.bench import peers, suites
from stopline.bench.suites import Row

PEER_SHORT = {peers.BASELINE: "baseline", peers.AC_RS: "ac-rs", peers.PYAC: "pyac"}


@dataclass
class Result:
    rows: list[Row]
    meta: dict
    agreement: dict[str, tuple[int, bool]] = field(default_factory=dict)

    def get(self, suite: str, case: str, size: int, impl: str) -> float | None:
        for r in self.rows:
            if (r.suite, r.case, r.size, r.impl) == (suite, case, size, impl):
                return r.ns
        return None

    def sizes(self, suite: str, case: str) -> list[int]:
        return sorted({r.size for r in self.rows if (r.suite, r.case) == (suite, case)})

    def impls(self, suite: str, case: str | None = None) -> list[str]:
        seen: list[str] = []
        for r in self.rows:
            if r.suite == suite and (case is None or r.case == case) and r.impl not in seen:
                seen.append(r.impl)
        return seen

    def cases(self, suite: str) -> list[str]:
        seen: list[str] = []
        for r in self.rows:
            if r.suite == suite and r.case not in seen:
                seen.append(r.case)
        return seen


@dataclass
class Table:
    title: str
    header: list[str]
    rows: list[list[str]]


def _ns(v: float | None) -> str:
    if v is None:
        return "-"
    return f"{v:,.0f}" if v >= 100 else f"{v:.1f}"


def _x(num: float | None, den: float | None) -> str:
    if num is None or den is None or den == 0:
        return "-"
    r = num / den
    return f"{r:,.0f}x" if r >= 100 else f"{r:.1f}x"


def tables(res: Result) -> list[Table]:
    out = []
    for case in res.cases("stop"):
        impls = res.impls("stop", case)
        others = [i for i in impls if i != peers.STOPLINE]
        header = ["K", *impls, *(f"vs {PEER_SHORT.get(i, i)}" for i in others)]
        rows = []
        for k in res.sizes("stop", case):
            own = res.get("stop", case, k, peers.STOPLINE)
            vals = [res.get("stop", case, k, i) for i in impls]
            rows.append([str(k), *map(_ns, vals),
                         *(_x(res.get("stop", case, k, i), own) for i in others)])
        out.append(Table(
            f"Stop strings, {case} per step: ns per sequence-step; "
            "'vs X' = how many times faster stopline is than X",
            header, rows))
    if res.cases("finish"):
        case = res.cases("finish")[0]
        header = ["batch", "FinishBatch.step", "step, slots=range", "step, range + NumPy ids",
                  "FinishTracker.update", "baseline", "vs baseline", "batch vs trackers"]
        rows = []
        for b in res.sizes("finish", case):
            fb = res.get("finish", case, b, suites.FINISH_BATCH)
            fr = res.get("finish", case, b, suites.FINISH_BATCH_RANGE)
            fn = res.get("finish", case, b, suites.FINISH_BATCH_NUMPY)
            ft = res.get("finish", case, b, suites.FINISH_TRACKERS)
            py = res.get("finish", case, b, suites.FINISH_BASELINE)
            rows.append([str(b), _ns(fb), _ns(fr), _ns(fn), _ns(ft), _ns(py), _x(py, fb), _x(ft, fb)])
        out.append(Table(
            "Full finish check (4 stop strings, EOS, 2 stop ids), one token per sequence "
            "per step: ns per sequence-step", header, rows))
    if res.cases("setup"):
        impls = res.impls("setup")
        header = ["", *impls]
        rows = [[case, *(_ns(res.get("setup", case, 16, i)) for i in impls)]
                for case in res.cases("setup")]
        out.append(Table("Set-up: ns per compile of a 16-string stop list "
                         "(a hit is StopStrings(same list); only stopline caches)", header, rows))
    from stopline.bench import detokenize

    out += detokenize.tables(res)
    return out


# ------------------------------------------------------------------ targets


def _verdict(ok: bool | None) -> str:
    return "not measured" if ok is None else ("met" if ok else "NOT met")


def targets(res: Result) -> Table:
    """The issue's CPU targets, each with the measured number and a verdict."""
    rows = []
    case = suites.SINGLE if suites.SINGLE in res.cases("stop") else (res.cases("stop") or [None])[0]

    def stop(k: int, impl: str) -> float | None:
        return None if case is None else res.get("stop", case, k, impl)

    for k, want in ((1, 3), (16, 30), (256, 300)):
        own, base = stop(k, peers.STOPLINE), stop(k, peers.BASELINE)
        ratio = None if own is None or base is None else base / own
        rows.append([f"matcher vs baseline at K={k} ({case}): >= {want}x",
                     "-" if ratio is None else f"{ratio:.1f}x ({_ns(own)} vs {_ns(base)} ns)",
                     _verdict(None if ratio is None else ratio >= want)])
    for c in res.cases("stop"):
        ks = res.sizes("stop", c)
        vals = [res.get("stop", c, k, peers.STOPLINE) for k in ks]
        vals = [v for v in vals if v is not None]
        spread = max(vals) / min(vals) if vals else None
        full = 1 in ks and 1024 in ks
        rows.append([f"matcher flat within 1.5x, K=1..1024 ({c})",
                     "-" if spread is None else f"{spread:.2f}x (slowest/fastest K, {_ns(min(vals))}-{_ns(max(vals))} ns)",
                     _verdict(None if spread is None or not full else spread <= 1.5)])
    for c in res.cases("stop"):
        worst = None
        for k in res.sizes("stop", c):
            own = res.get("stop", c, k, peers.STOPLINE)
            for peer in (peers.AC_RS, peers.PYAC):
                v = res.get("stop", c, k, peer)
                if v is not None and own and (worst is None or v / own < worst[0]):
                    worst = (v / own, peer, k)
        rows.append([f"faster than both Aho-Corasick peers at every K ({c})",
                     "-" if worst is None else f"slowest margin {worst[0]:.1f}x ({worst[1]}, K={worst[2]})",
                     _verdict(None if worst is None else worst[0] > 1)])
    fcase = (res.cases("finish") or [None])[0]
    fb = fcase and res.get("finish", fcase, 256, suites.FINISH_BATCH)
    py = fcase and res.get("finish", fcase, 256, suites.FINISH_BASELINE)
    rows.append(["FinishBatch.step at 256 sequences: <= 60 ns per sequence-step",
                 "-" if not fb else f"{fb:.1f} ns", _verdict(None if not fb else fb <= 60)])
    fn = fcase and res.get("finish", fcase, 256, suites.FINISH_BATCH_NUMPY)
    rows.append(["... with slots=range and token_ids a NumPy array: <= 60 ns",
                 "-" if not fn else f"{fn:.1f} ns", _verdict(None if not fn else fn <= 60)])
    rows.append(["FinishBatch.step at 256 sequences: >= 15x the pure-Python reference",
                 "-" if not (fb and py) else f"{py / fb:.1f}x ({_ns(py)} ns)",
                 _verdict(None if not (fb and py) else py / fb >= 15)])
    miss = res.get("setup", suites.COMPILE_MISS, 16, peers.STOPLINE)
    hit = res.get("setup", suites.COMPILE_HIT, 16, peers.STOPLINE)
    rows.append(["compiling 16 stop strings (cache miss): <= 20 us",
                 "-" if miss is None else f"{miss / 1000:.2f} us", _verdict(None if miss is None else miss <= 20_000)])
    rows.append(["cache hit: <= 1 us",
                 "-" if hit is None else f"{hit / 1000:.3f} us", _verdict(None if hit is None else hit <= 1_000)])
    rows = [r for r in rows if r[2] != _verdict(None)]
    return Table("Targets (CPU)", ["target", "measured", "verdict"], rows)


# ------------------------------------------------------------------ output


def print_tables(res: Result, console) -> None:
    from rich.table import Table as RichTable

    def show(t: Table) -> None:
        rt = RichTable(title=t.title, title_justify="left")
        for i, h in enumerate(t.header):
            rt.add_column(h, justify="left" if i == 0 else "right")
        for r in t.rows:
            style = None
            if t.header and t.header[-1] == "verdict":
                style = "green" if r[-1] == "met" else ("red" if r[-1] == "NOT met" else "dim")
            rt.add_row(*r, style=style)
        console.print(rt)

    for t in tables(res):
        show(t)
    if res.agreement:
        parts = [f"{name}: {n} matches{'' if ok else ' (DIFFERENT from stopline)'}"
                 for name, (n, ok) in res.agreement.items()]
        console.print("Check list (stops that match often, both step shapes): " + "; ".join(parts))
    t = targets(res)
    if t.rows:
        show(t)


def markdown(res: Result) -> str:
    def md(t: Table) -> str:
        lines = [f"**{t.title}**", "", "| " + " | ".join(t.header) + " |",
                 "|" + "|".join(["---"] + ["---:"] * (len(t.header) - 1)) + "|"]
        lines += ["| " + " | ".join(r) + " |" for r in t.rows]
        return "\n".join(lines)

    parts = [md(t) for t in tables(res)]
    t = targets(res)
    if t.rows:
        parts.append(md(t))
    return "\n\n".join(parts) + "\n"


def to_json(res: Result) -> dict:
    return {
        "meta": res.meta,
        "agreement": {k: {"matches": n, "same_as_stopline": ok} for k, (n, ok) in res.agreement.items()},
        "rows": [
            {"suite": r.suite, "case": r.case, "size": r.size, "impl": r.impl, "unit": r.unit,
             "median": r.ns, "samples": list(r.timing.samples), **r.extra}
            for r in res.rows
        ],
        "targets": [dict(zip(["target", "measured", "verdict"], r)) for r in targets(res).rows],
    }


def write_json(res: Result, path: str | Path) -> None:
    Path(path).write_text(json.dumps(to_json(res), indent=1) + "\n")


STYLE = {
    peers.STOPLINE: {"color": "#d62728", "marker": "o", "linewidth": 2.2},
    peers.BASELINE: {"color": "#7f7f7f", "marker": "s"},
    peers.AC_RS: {"color": "#1f77b4", "marker": "^"},
    peers.PYAC: {"color": "#2ca02c", "marker": "v"},
}


def plot(res: Result, path: str | Path) -> bool:
    """ns/step vs K, log-log, one line per implementation and one panel per
    step shape. Returns False when there is nothing to plot."""
    cases = res.cases("stop")
    if not cases:
        return False
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(cases), figsize=(5.2 * len(cases), 4.2), squeeze=False, sharey=True)
    for ax, case in zip(axes[0], cases):
        for impl in res.impls("stop", case):
            ks = [k for k in res.sizes("stop", case) if res.get("stop", case, k, impl) is not None]
            ys = [res.get("stop", case, k, impl) for k in ks]
            ax.plot(ks, ys, label=impl, markersize=5, **STYLE.get(impl, {}))
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("number of stop strings K")
        ax.set_title(f"{case} per step")
        ax.grid(True, which="both", alpha=0.3)
    axes[0][0].set_ylabel("ns per sequence-step (lower is better)")
    axes[0][-1].legend(loc="upper left", fontsize=8)
    fig.suptitle(f"stop-string matching, {res.meta.get('pieces', '')}", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return True


def format_meta(meta: dict) -> Sequence[str]:
    return [f"{k}: {v}" for k, v in meta.items()]
