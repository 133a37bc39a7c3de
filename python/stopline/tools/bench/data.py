"""Benchmark inputs: real text cut into the pieces a streaming detokenizer
emits, stop lists of any size, and speculative accept runs."""

from __future__ import annotations

import re
from collections.abc import Sequence
from functools import lru_cache
from typing import Any

# Chat-template and prompt-format stops that engines really receive.
REAL_STOPS = (
    "\n\nUser:", "<|im_end|>", "###", "</s>", "Observation:", "\n\nHuman:",
    "<|endoftext|>", "[/INST]", "<end_of_turn>", "\nQ:", "END OF", "<|eot_id|>",
)

# Stops that occur often in the benchmark text: used only to check that every
# implementation reports the same matches (the timed lists almost never match,
# as stop strings fire once per sequence).
CHECK_STOPS = ("\n\n", " the", "()", "**", "statement", " is a", "e", ":\n")


def stop_list(k: int) -> list[str]:
    """``k`` stop strings: the real ones first, then distinct rare markers,
    so every list has the same shape and matches stay rare."""
    out = list(REAL_STOPS[:k])
    i = 0
    while len(out) < k:
        out.append(f"<<stop-{i:04d}>>")
        i += 1
    return out


def _text() -> str:
    from pydoc_data.topics import topics

    return "\n\n".join(topics[k] for k in sorted(topics))


def _smollm2_tokenizer() -> Any:
    """The SmolLM2 tokenizer as a ``tokenizers.Tokenizer``, from stopline's
    model cache (never downloads); None when unavailable."""
    try:
        from tokenizers import Tokenizer

        from stopline.tools.models import load_smollm2_tokenizer, smollm2_tokenizer_dir

        saved = smollm2_tokenizer_dir() / "tokenizer.json"
        if saved.is_file():  # fast path: no transformers import
            return Tokenizer.from_file(str(saved))
        return load_smollm2_tokenizer(download=False).backend_tokenizer
    except Exception:  # noqa: BLE001 - any missing piece of the demo extra
        return None


@lru_cache(maxsize=4)
def text_pieces(limit: int = 200_000) -> tuple[tuple[str, ...], str]:
    """Python's ``pydoc_data.topics`` (English prose and code) as up to
    ``limit`` text pieces, one per token, and the name of the splitter.

    With the ``demo`` extra and the SmolLM2 tokenizer in stopline's model cache
    the pieces are that tokenizer's ``DecodeStream`` output (an empty piece
    where a token ends inside a UTF-8 sequence); otherwise a
    word-and-punctuation split with pieces of similar length.
    """
    text = _text()
    tok = _smollm2_tokenizer()
    if tok is not None:
        from tokenizers.decoders import DecodeStream

        # ~4.1 characters per token on this text; cut before encoding.
        ids = tok.encode(text[: limit * 6], add_special_tokens=False).ids[:limit]
        stream = DecodeStream(skip_special_tokens=False)
        pieces = tuple(stream.step(tok, i) or "" for i in ids)
        return pieces, "SmolLM2-135M tokenizer (DecodeStream pieces)"
    pieces = tuple(re.findall(r"\s?\w+|\s?[^\w\s]|\s+", text)[:limit])
    return pieces, "regex word pieces (install stopline[demo] for real tokenizer pieces)"


def accept_runs(pieces: Sequence[str], count: int, lo: int = 4, hi: int = 8) -> list[str]:
    """``count`` speculative accept runs: consecutive pieces joined in runs of
    ``lo``..``hi`` tokens (cycling through the lengths), wrapping around the
    pieces if needed."""
    out = []
    pos = 0
    n = len(pieces)
    span = hi - lo + 1
    for k in range(count):
        length = lo + k % span
        out.append("".join(pieces[(pos + j) % n] for j in range(length)))
        pos += length
    return out
