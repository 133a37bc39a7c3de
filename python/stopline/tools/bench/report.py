"""Turning rows into ratio tables (plain text and Markdown), the JSON record
and the PNG plot."""

from __future__ import annotations

import json
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from stopline._table import Column, counted, fit_width, format_table, wrap

from stopline.tools.bench import peers, suites
from stopline.tools.bench.cells import Table, fmt_ns, fmt_ratio
from stopline.tools.bench.suites import Row

PEER_SHORT = {peers.BASELINE: "baseline", peers.AC_RS: "ac-rs", peers.PYAC: "pyac"}


@dataclass
class Result:
    rows: list[Row]
    meta: dict[str, Any]
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

    def paired_ratio(self, suite: str, case: str, size: int, num: str, den: str) -> float | None:
        """The median over rounds of ``num``'s time over ``den``'s in the same
        round (side by side, so load that changes between rounds cancels)."""
        got = {r.impl: r.timing.samples for r in self.rows
               if (r.suite, r.case, r.size) == (suite, case, size) and r.impl in (num, den)}
        if len(got) < 2 or not got[num]:
            return None
        return statistics.median(a / b for a, b in zip(got[num], got[den]) if b > 0)

    def cases(self, suite: str) -> list[str]:
        seen: list[str] = []
        for r in self.rows:
            if r.suite == suite and r.case not in seen:
                seen.append(r.case)
        return seen


def tables(res: Result) -> list[Table]:
    out = []
    for case in res.cases("stop"):
        impls = res.impls("stop", case)
        others = [i for i in impls if i != peers.STOPLINE]
        header = ["K", *(PEER_SHORT.get(i, i) for i in impls), *(f"vs {PEER_SHORT.get(i, i)}" for i in others)]
        rows = []
        for k in res.sizes("stop", case):
            own = res.get("stop", case, k, peers.STOPLINE)
            vals = [res.get("stop", case, k, i) for i in impls]
            rows.append([str(k), *map(fmt_ns, vals),
                         *(fmt_ratio(res.get("stop", case, k, i), own) for i in others)])
        first = case == res.cases("stop")[0]
        out.append(Table(f"Stop strings, {case} per step: ns per sequence-step", header, rows, [] if not first else [
            "vs X: X's time over stopline's (how many times faster stopline is). "
            "ac-rs = ahocorasick-rs, pyac = pyahocorasick: searched over a window each step, "
            "without hold-back (less work per step than stopline and baseline)."]))
    if res.cases("finish"):
        case = res.cases("finish")[0]
        header = ["batch", "list", "range", "range+np", "trackers", "baseline", "vs base", "vs trk"]
        rows = []
        for b in res.sizes("finish", case):
            fb = res.get("finish", case, b, suites.FINISH_BATCH)
            fr = res.get("finish", case, b, suites.FINISH_BATCH_RANGE)
            fn = res.get("finish", case, b, suites.FINISH_BATCH_NUMPY)
            ft = res.get("finish", case, b, suites.FINISH_TRACKERS)
            py = res.get("finish", case, b, suites.FINISH_BASELINE)
            rows.append([str(b), fmt_ns(fb), fmt_ns(fr), fmt_ns(fn), fmt_ns(ft), fmt_ns(py), fmt_ratio(py, fb), fmt_ratio(ft, fb)])
        out.append(Table(
            "Full finish check (4 stop strings, EOS, 2 stop ids), one token per sequence "
            "per step: ns per sequence-step", header, rows, [
                "list: FinishBatch.step, slots a list; range: slots a range; range+np: and the "
                "token ids a NumPy array; trackers: one FinishTracker.update per sequence; "
                "baseline: the pure-Python FinishBatch.step. vs base = baseline / list, "
                "vs trk = trackers / list."]))
    if res.cases("setup"):
        impls = res.impls("setup")
        header = ["", *(PEER_SHORT.get(i, i) for i in impls)]
        rows = [[case, *(fmt_ns(res.get("setup", case, 16, i)) for i in impls)]
                for case in res.cases("setup")]
        out.append(Table("Set-up: ns per compile of a 16-string stop list "
                         "(a hit is StopStrings(same list); only stopline caches)", header, rows))
    if res.cases("reasoning"):
        case = res.cases("reasoning")[0]
        rows = []
        for b in res.sizes("reasoning", case):
            off = res.get("reasoning", case, b, suites.REASONING_OFF)
            on = res.get("reasoning", case, b, suites.REASONING_ON)
            forced = res.get("reasoning", case, b, suites.REASONING_FORCED)
            on_off = res.paired_ratio("reasoning", case, b, suites.REASONING_ON, suites.REASONING_OFF)
            forced_off = res.paired_ratio("reasoning", case, b, suites.REASONING_FORCED, suites.REASONING_OFF)
            rows.append([str(b), fmt_ns(off), fmt_ns(on), fmt_ns(forced), fmt_ratio(on_off, 1.0, 2),
                         fmt_ratio(forced_off, 1.0, 2)])
        out.append(Table(
            "Reasoning channels, ids-only FinishBatch.step (EOS, 2 stop ids, no texts): ns per "
            "sequence-step", ["batch", "off", "on", "on+forced", "on/off", "forced/off"], rows, [
                "off: no reasoning markers; on: marker ids, every sequence inside the block; "
                "on+forced: a thinking budget, forced_tokens read every step. Times: the median "
                "of the rounds; ratios: the median of each round's ratio (the three run side by side "
                "in every round)."]))
    from stopline.tools.bench import detokenize

    out += detokenize.tables(res)
    return out


# ------------------------------------------------------------------ output


def _columns(t: Table) -> list[Column]:
    return [Column(h, right=i > 0) for i, h in enumerate(t.header)]


def text_lines(res: Result, width: int | None = None) -> list[str]:
    """Every table as plain text fitted to ``width`` (default: the
    terminal's, 80 columns in a pipe), each with its title and legend."""
    width = fit_width() if width is None else width
    lines: list[str] = []
    for t in tables(res):
        lines.append("")
        lines += wrap(t.title, width, "    ")
        lines += format_table(_columns(t), t.rows, width)
        for note in t.notes:
            lines += wrap(note, width, "    ")
    if res.agreement:
        parts = [f"{name}: {counted(n, 'match', 'matches')}{'' if ok else ' (DIFFERENT from stopline)'}"
                 for name, (n, ok) in res.agreement.items()]
        lines.append("")
        lines += wrap("Check list (stops that match often, both step shapes): " + "; ".join(parts), width, "    ")
    return lines


def markdown(res: Result) -> str:
    def md(t: Table) -> str:
        lines = [f"**{t.title}**", "", "| " + " | ".join(t.header) + " |",
                 "|" + "|".join(["---"] + ["---:"] * (len(t.header) - 1)) + "|"]
        lines += ["| " + " | ".join(r) + " |" for r in t.rows]
        lines += ["", *t.notes] if t.notes else []
        return "\n".join(lines)

    return "\n\n".join(md(t) for t in tables(res)) + "\n"


def to_json(res: Result) -> dict[str, Any]:
    return {
        "meta": res.meta,
        "agreement": {k: {"matches": n, "same_as_stopline": ok} for k, (n, ok) in res.agreement.items()},
        "rows": [
            {"suite": r.suite, "case": r.case, "size": r.size, "impl": r.impl, "unit": r.unit,
             "median": r.ns, "samples": list(r.timing.samples), **r.extra}
            for r in res.rows
        ],
    }


def write_json(res: Result, path: str | Path) -> None:
    Path(path).write_text(json.dumps(to_json(res), indent=1) + "\n")


STYLE: dict[str, dict[str, Any]] = {
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


def format_meta(meta: dict[str, Any], width: int | None = None) -> list[str]:
    """The machine and the run, one ``key: value`` per line."""
    return [line for k, v in meta.items() for line in wrap(f"{k}: {v}", width, "    ")]
