"""The ``stopline`` command line: ``replay``, ``generate`` and ``bench``.

``replay`` needs nothing beyond stopline; ``generate`` and ``bench`` come from
:mod:`stopline.tools` and need the ``demo`` / ``bench`` extras. Exit status 2
means a usage error (with the subcommand's usage line) or a missing extra,
model or device; output cut short by a closed pipe (``| head``) exits 0.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
from collections.abc import Sequence

from stopline._argtypes import float_arg, int_arg, nonneg_int, positive_int


# Argument types raise ArgumentTypeError with the whole message: on a
# ValueError argparse would print the function's name ("invalid _x value").


def _temperature(v: str) -> float:
    t = float_arg(v)
    if not math.isfinite(t) or t < 0:
        raise argparse.ArgumentTypeError(f"must be a finite number >= 0, got {v}")
    return t


def _top_p(v: str) -> float:
    p = float_arg(v)
    if not 0 < p <= 1:  # also rejects NaN
        raise argparse.ArgumentTypeError(f"must be in (0, 1], got {v}")
    return p


def _device(v: str) -> str:
    """``cpu``, ``cuda`` or ``cuda:N``; whether that device exists is checked
    once torch is imported (generate.main)."""
    kind, _, index = v.partition(":")
    if (kind == "cpu" and not index) or (kind == "cuda" and (not index or index.isdigit())):
        return v
    raise argparse.ArgumentTypeError(f"must be cpu, cuda or cuda:N (N a device index), got {v!r}")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="stopline", description="When an LLM sequence stops and what it reports.")
    p.add_argument("--version", action="store_true", help="print the version and exit")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")

    r = sub.add_parser(
        "replay",
        help="replay decode traces through FinishBatch (bundled real traces by default)",
        description="Replay JSONL decode traces (docs/traces.md) through stopline.FinishBatch, "
        "one engine step at a time, and print each request's outcome. Without TRACE, the traces "
        "bundled with the package are replayed; a TRACE of - is standard input. Exit status: 0 ok, "
        "1 malformed lines or --check differences, 2 unreadable trace file.",
    )
    r.add_argument("traces", nargs="*", metavar="TRACE",
                   help="JSONL trace files (gzip-compressed when named .gz); - reads standard input "
                        "(decompressed when it starts with gzip's magic bytes)")
    r.add_argument("--json", action="store_true",
                   help="print JSON lines instead of tables: (with --stream) each delta, each request, "
                        "each file, then a summary")
    r.add_argument("--stream", action="store_true", help="print every streamed delta as it is released")
    r.add_argument("--check", action="store_true",
                   help="also run every request through stopline.baseline and fail on any difference")
    r.add_argument("--max-slots", type=positive_int, default=None,
                   help="batch size (default: all requests of a file at once); others wait for a free slot")
    r.add_argument("--tokenizer", default=None, metavar="TOKENIZER_JSON",
                   help="decode the recorded token ids with this tokenizer.json inside stopline (ids only) "
                        "instead of passing the recorded texts; --check then compares with the recorded texts")

    g = sub.add_parser(
        "generate",
        help="decode with SmolLM2-135M, stopline's masks and finish machine (needs stopline[demo])",
        description="Live greedy or sampled decoding with SmolLM2-135M-Instruct (KV cache), "
        "stopline.logits masks, xgrammar for --json-schema and FinishTracker for stopping; "
        "text is streamed with the exact stop-string hold-back.",
    )
    g.add_argument("--prompt", required=True, help="user message (the chat template is applied)")
    g.add_argument("--system", default=None, help="optional system message")
    g.add_argument("--stop", action="append", default=[], metavar="STR",
                   help="stop string (repeat for several)")
    g.add_argument("--stop-token-id", action="append", type=nonneg_int, default=[], metavar="ID",
                   help="stop token id (repeat for several)")
    g.add_argument("--min-tokens", type=nonneg_int, default=0)
    g.add_argument("--max-tokens", type=positive_int, default=128)
    g.add_argument("--include-stop-str-in-output", action="store_true")
    g.add_argument("--ignore-eos", action="store_true")
    g.add_argument("--json-schema", default=None, metavar="FILE|STRING",
                   help="constrain the output to this JSON schema (a file path or the schema itself)")
    g.add_argument("--temperature", type=_temperature, default=0.0, help="0 = greedy (default)")
    g.add_argument("--top-p", type=_top_p, default=1.0, help="nucleus sampling mass, in (0, 1]")
    g.add_argument("--seed", type=int_arg, default=None, help="sampling seed")
    g.add_argument("--device", type=_device, default="cpu", help="cpu, cuda or cuda:N (default cpu)")
    g.add_argument("--model", default=None, metavar="PATH",
                   help="gguf file or directory holding it (default: stopline's model cache)")
    g.add_argument("--json", action="store_true",
                   help="print JSON lines instead of text: one per streamed delta, then the result")
    g.add_argument("--quiet", action="store_true",
                   help="print the final text only, nothing streamed (statistics go to stderr, as always)")

    from stopline.tools import bench

    b = bench.add_arguments(sub.add_parser(
        "bench",
        help="CPU benchmarks vs the pure-Python baseline and peer libraries (needs stopline[bench])",
        description="Stop strings per K, the finish check per batch size and stop-list set-up, "
        "stopline side by side with the pure-Python baseline, ahocorasick-rs and pyahocorasick: "
        "ratio tables and the machine they ran on. Nothing is written to a file unless asked: "
        "--plot PNG for a plot of ns/step vs K, --json and --markdown for the numbers and tables.",
    ))
    for sp in (r, g, b):
        sp.set_defaults(subparser=sp)  # so that an error shows this subcommand's usage
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``stopline`` script and ``python -m stopline``; returns the exit status."""
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if extra:
        getattr(args, "subparser", parser).error(f"unrecognized arguments: {' '.join(extra)}")
    try:
        status = _run(args)
        sys.stdout.flush()  # inside the try: a reader that left shows up here
        return status
    except BrokenPipeError:
        # `stopline replay | head`: the reader has what it wanted. Point stdout
        # at /dev/null so the flush at exit cannot fail again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except KeyboardInterrupt:
        print("stopline: interrupted", file=sys.stderr)
        return 130


def _run(args: argparse.Namespace) -> int:
    if args.version:
        import stopline

        print(stopline.__version__)
        return 0
    if args.command == "replay":
        from stopline import replay

        return replay.run(args.traces, as_json=args.json, stream=args.stream, check=args.check,
                          max_slots=args.max_slots, tokenizer=args.tokenizer)
    if args.command == "generate":
        from stopline.tools import generate

        return generate.main(args)
    if args.command == "bench":
        from stopline.tools import bench

        return bench.run(args)
    build_parser().print_help(sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
