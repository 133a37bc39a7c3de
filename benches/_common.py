"""Shared pieces of the benchmark scripts: real text cut into real tokenizer
pieces, a median timer, and a table printer (rich when installed)."""

from __future__ import annotations

import re
import statistics
import time
from collections.abc import Callable, Sequence
from functools import lru_cache


@lru_cache(maxsize=1)
def text_pieces(limit: int = 200_000) -> tuple[list[str], str]:
    """Python's ``pydoc_data.topics`` (real English prose and code) as the
    text pieces a streaming detokenizer would emit, one per token.

    Uses the SmolLM2 tokenizer (``stopline.models``) when the ``demo`` extra is
    installed and the model file is cached or fetchable; otherwise a
    word-and-punctuation split that gives pieces of similar length. Returns the
    pieces and the name of the splitter used.
    """
    from pydoc_data.topics import topics

    text = "\n\n".join(topics[k] for k in sorted(topics))
    try:
        from tokenizers.decoders import DecodeStream

        from stopline.models import load_smollm2_tokenizer

        tok = load_smollm2_tokenizer()
        ids = tok(text[: limit * 5], add_special_tokens=False)["input_ids"][:limit]
        backend = tok.backend_tokenizer
        stream = DecodeStream(skip_special_tokens=False)
        pieces = [stream.step(backend, i) or "" for i in ids]
        return pieces, "SmolLM2-135M tokenizer (DecodeStream pieces)"
    except Exception:  # noqa: BLE001 - any missing piece of the demo extra
        pieces = re.findall(r"\s?\w+|\s?[^\w\s]|\s+", text)[:limit]
        return pieces, "regex word pieces (install stopline[demo] for real tokenizer pieces)"


def median_ns_per_op(fn: Callable[[], int], repeats: int = 5) -> float:
    """Runs ``fn`` (which returns how many operations it did) once to warm
    up, then ``repeats`` times, and returns the median nanoseconds per
    operation."""
    fn()
    samples = []
    for _ in range(repeats):
        t0 = time.perf_counter_ns()
        ops = fn()
        samples.append((time.perf_counter_ns() - t0) / ops)
    return statistics.median(samples)


def stop_list(k: int) -> list[str]:
    """``k`` stop strings: real chat-template and prompt-format stops first,
    then distinct rare words so that matches stay rare but every list has the
    same shape."""
    real = ["\n\nUser:", "<|im_end|>", "###", "</s>", "Observation:", "\n\nHuman:",
            "<|endoftext|>", "[/INST]", "<end_of_turn>", "\nQ:", "END OF", "<|eot_id|>"]
    out = real[:k]
    i = 0
    while len(out) < k:
        out.append(f"<<stop-{i:04d}>>")
        i += 1
    return out


def print_table(title: str, header: Sequence[str], rows: Sequence[Sequence[object]]) -> None:
    try:
        from rich.console import Console
        from rich.table import Table

        table = Table(title=title)
        for h in header:
            table.add_column(h, justify="right")
        for r in rows:
            table.add_row(*(str(c) for c in r))
        Console().print(table)
    except ImportError:
        print(title)
        widths = [max(len(str(x)) for x in col) for col in zip(header, *rows)]
        for r in [header, *rows]:
            print("  ".join(str(c).rjust(w) for c, w in zip(r, widths)))
