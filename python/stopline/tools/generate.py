"""``stopline generate``: live decoding with SmolLM2-135M-Instruct.

A hand-written decode loop (one forward per token, KV cache) in which every
piece of output semantics comes from stopline: the logits are masked by
:class:`stopline.logits.LogitsConstraints` (min_tokens over the EOS and stop
ids, the xgrammar bitmask for ``--json-schema`` with ``restore="structured"``),
each token's text piece comes from ``tokenizers.decoders.DecodeStream``, and a
:class:`stopline.FinishTracker` decides when to stop and what to keep; the
``text_delta`` of each update is printed as it comes, so the terminal shows
exactly the stop-string hold-back.

Needs the ``demo`` extra (torch, transformers, tokenizers, gguf, xgrammar):
``pip install 'stopline[demo]'``.
"""

from __future__ import annotations

import inspect
import json
import os
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import stopline
from stopline._caps import field_error
from stopline._table import counted

__all__ = ["DEMO_HINT", "GenerateResult", "Token", "compile_json_schema", "decode_tokens", "generate", "main"]

DEMO_HINT = "pip install 'stopline[demo]'"


def _need_demo(with_grammar: bool = False) -> str | None:
    """The first missing demo dependency, or None when all import."""
    mods = ("torch", "transformers", "tokenizers", "gguf", "safetensors")
    for mod in mods + (("xgrammar",) if with_grammar else ()):
        try:
            __import__(mod)
        except ImportError:
            return mod
    return None


@dataclass
class Token:
    """One sampled token of :func:`decode_tokens`.

    ``piece`` is the text the streaming detokenizer released for it ("" while
    a multi-byte character is incomplete and for skipped special tokens);
    ``position`` is its 0-based output position; ``grammar_terminated`` is
    True when the grammar matcher terminated on accepting it; ``infeasible``
    is True when masking left no token to sample (``id`` is then -1).
    """

    id: int
    piece: str
    position: int
    grammar_terminated: bool = False
    infeasible: bool = False


@dataclass
class GenerateResult:
    """Outcome of :func:`generate`; ``text`` is the kept text (code points in
    ``len(text)``), ``token_ids`` the kept output tokens, ``deltas`` the
    streamed text deltas in order (joined, they equal ``text``)."""

    text: str
    token_ids: list[int]
    finish_reason: str | None
    stop_reason: str | int | None
    matched: str | int | None
    prompt_tokens: int
    sampled_tokens: int
    seconds: float
    deltas: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {
            "text": self.text,
            "token_ids": self.token_ids,
            "finish_reason": self.finish_reason,
            "stop_reason": self.stop_reason,
            "matched": self.matched,
            "prompt_tokens": self.prompt_tokens,
            "sampled_tokens": self.sampled_tokens,
            "seconds": round(self.seconds, 3),
            "streamed_text": "".join(self.deltas),
        }


def _mask(constraints: Any, logits: Any, position: int, bitmask: Any) -> bool:
    """The one place logits are masked: min_tokens over the stop ids and the
    grammar bitmask (a row with a bitmask counts as a grammar row, so
    restore="structured" applies), through LogitsConstraints. Returns True
    when the row has no finite logit left."""
    return bool(constraints.apply(logits, [0], [position], bitmask=bitmask)[0])


def _sample(logits: Any, temperature: float, top_p: float, generator: Any) -> int:
    import torch

    if temperature <= 0:
        return int(torch.argmax(logits[0]))
    probs = torch.softmax(logits[0].float() / temperature, dim=-1)
    if top_p < 1.0:
        sorted_p, order = torch.sort(probs, descending=True)
        cut = torch.cumsum(sorted_p, dim=-1) - sorted_p > top_p  # keep the smallest nucleus
        sorted_p[cut] = 0.0
        probs = torch.zeros_like(probs).scatter_(0, order, sorted_p)
    return int(torch.multinomial(probs.cpu(), 1, generator=generator))


def decode_tokens(
    lm: Any,
    prompt_ids: Sequence[int],
    *,
    min_tokens: int = 0,
    stop_token_ids: Sequence[int] = (),
    compiled_grammar: Any = None,
    temperature: float = 0.0,
    top_p: float = 1.0,
    seed: int | None = None,
    max_steps: int = 1 << 30,
) -> Iterator[Token]:
    """Sample tokens from ``lm`` (a :class:`stopline.tools.models.SmolLM2`)
    one at a time; stop iterating to stop decoding.

    ``min_tokens`` masks every id of ``stop_token_ids`` plus the model's EOS
    ids while the output position is below it (docs/semantics.md section 8, step 2);
    ``compiled_grammar`` (an ``xgrammar.CompiledGrammar``) adds the bitmask,
    and a grammar row whose min_tokens masking would leave nothing is given
    its stop ids back (``restore="structured"``). Greedy when
    ``temperature`` is 0, else softmax sampling with ``top_p``, seeded by
    ``seed``. Each token is fed to the grammar matcher before it is yielded.
    """
    import torch
    from tokenizers.decoders import DecodeStream

    from stopline.logits import LogitsConstraints

    model, device, vocab = lm.model, lm.device, lm.vocab_size
    constraints = LogitsConstraints(1, vocab, device)
    stops = sorted(set(lm.eos_token_ids) | set(stop_token_ids))
    constraints.set(0, min_tokens=min_tokens, stop_token_ids=stops, restore="structured")
    matcher: Any = None
    bitmask_host: Any = None
    bitmask: Any = None
    if compiled_grammar is not None:
        import xgrammar as xgr

        matcher = xgr.GrammarMatcher(compiled_grammar)
        bitmask_host = xgr.allocate_token_bitmask(1, vocab)
    generator = None
    if temperature > 0:
        generator = torch.Generator().manual_seed(seed if seed is not None else 0)
    detok = DecodeStream(skip_special_tokens=True)
    input_ids = torch.tensor([list(prompt_ids)], dtype=torch.long, device=device)
    # transformers renamed past_key_values to cache (5.x); support both.
    cache_arg = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
    past = None
    with torch.inference_mode():
        for position in range(max_steps):
            out = model(input_ids=input_ids, use_cache=True, **{cache_arg: past})
            past = getattr(out, cache_arg)
            logits = out.logits[:, -1, :vocab].float().contiguous()
            if matcher is not None:
                matcher.fill_next_token_bitmask(bitmask_host, 0)
                bitmask = bitmask_host.to(device, non_blocking=True)
            if _mask(constraints, logits, position, bitmask):
                yield Token(-1, "", position, infeasible=True)
                return
            tid = _sample(logits, temperature, top_p, generator)
            terminated = False
            if matcher is not None:
                if not matcher.accept_token(tid):  # cannot happen after the mask; be loud if it does
                    raise RuntimeError(f"grammar rejected token {tid} that its own bitmask allowed")
                terminated = matcher.is_terminated()
            constraints.append_tokens(0, [tid])
            piece = detok.step(lm.tokenizer, tid) or ""
            yield Token(tid, piece, position, grammar_terminated=terminated)
            input_ids = torch.tensor([[tid]], dtype=torch.long, device=device)


def compile_json_schema(lm: Any, schema: str) -> Any:
    """Compile a JSON schema (text) with xgrammar for ``lm``'s tokenizer.

    Raises ``ValueError`` when xgrammar rejects the schema.
    """
    import xgrammar as xgr

    info = xgr.TokenizerInfo.from_huggingface(lm.hf_tokenizer, vocab_size=lm.vocab_size)
    try:
        return xgr.GrammarCompiler(info).compile_json_schema(schema)
    except RuntimeError as e:  # xgrammar reports schema errors as RuntimeError
        raise field_error(ValueError, "schema", f"invalid JSON schema: {e}", "invalid") from None


_VOCABULARIES: dict[int, stopline.Vocabulary] = {}


def _vocabulary(lm: Any) -> stopline.Vocabulary:
    """``lm``'s tokenizer as a :class:`stopline.Vocabulary` (built once per tokenizer)."""
    key = id(lm.tokenizer)
    if key not in _VOCABULARIES:
        _VOCABULARIES[key] = stopline.Vocabulary.from_str(lm.tokenizer.to_str())
    return _VOCABULARIES[key]


def generate(
    lm: Any,
    prompt: str,
    *,
    system: str | None = None,
    stop: Sequence[str] = (),
    stop_token_ids: Sequence[int] = (),
    min_tokens: int = 0,
    max_tokens: int = 128,
    include_stop_str_in_output: bool = False,
    ignore_eos: bool = False,
    json_schema: str | None = None,
    temperature: float = 0.0,
    top_p: float = 1.0,
    seed: int | None = None,
    on_delta: Callable[[str], None] | None = None,
) -> GenerateResult:
    """Decode one chat reply; stopline decides when it stops.

    ``max_tokens``/``min_tokens`` count output tokens. ``on_delta`` receives
    each non-empty ``text_delta`` as the tracker releases it. A row left with
    nothing to sample finishes with ``"error"``.

    Raises ``ValueError`` for invalid stop parameters (from
    :class:`stopline.StopParams`) and for a schema xgrammar cannot compile.
    """
    prompt_ids = lm.chat_prompt(prompt, system)
    params = stopline.StopParams(
        max_tokens=max_tokens,
        min_tokens=min_tokens,
        prompt_len=len(prompt_ids),
        max_model_len=lm.max_model_len,
        eos_token_ids=lm.eos_token_ids,
        ignore_eos=ignore_eos,
        stop_token_ids=stop_token_ids,
        stop=stop,
        include_stop_str_in_output=include_stop_str_in_output,
        vocab_size=lm.vocab_size,
    )
    # stopline decodes the ids itself (docs/semantics.md section 10), primed
    # with the prompt; the DecodeStream pieces of decode_tokens go unused.
    tracker = stopline.FinishTracker(params, vocabulary=_vocabulary(lm), prompt_token_ids=prompt_ids)
    grammar = compile_json_schema(lm, json_schema) if json_schema is not None else None
    deltas: list[str] = []
    sampled = 0
    t0 = time.perf_counter()
    for tok in decode_tokens(
        lm, prompt_ids, min_tokens=min_tokens, stop_token_ids=stop_token_ids,
        compiled_grammar=grammar, temperature=temperature, top_p=top_p, seed=seed,
    ):
        if tok.infeasible:
            # The finish machine's only error path is an out-of-vocab id: the
            # sentinel finishes with "error" and is not kept.
            r = tracker.update([lm.vocab_size])
        else:
            sampled += 1
            r = tracker.update([tok.id], None, 0 if tok.grammar_terminated else None)
        if r.text_delta:
            deltas.append(r.text_delta)
            if on_delta:
                on_delta(r.text_delta)
        if r.finished:  # always, at the latest when max_model_len is reached
            break
    return GenerateResult(
        text=tracker.text, token_ids=list(tracker.token_ids), finish_reason=tracker.finish_reason,
        stop_reason=tracker.stop_reason, matched=tracker.matched, prompt_tokens=len(prompt_ids),
        sampled_tokens=sampled, seconds=time.perf_counter() - t0, deltas=deltas,
    )


def _read_schema(arg: str) -> str:
    """``--json-schema``: a file path, else the schema text itself; checked to be JSON."""
    text = arg
    if os.path.isfile(arg):
        with open(arg, encoding="utf-8") as f:
            text = f.read()
    json.loads(text)
    return text


def main(args: Any) -> int:
    """``stopline generate`` with parsed arguments; returns the exit status
    (0 ok, 2 missing dependency, model, device or bad argument).

    stdout carries the text only (streamed; at the end with ``--quiet``), or
    with ``--json`` JSON lines: ``{"type": "delta", "text"}`` per streamed
    delta (none with ``--quiet``), then one ``{"type": "result", ...}``. The
    statistics line, the first run's download and conversion messages and
    errors go to stderr."""
    missing = _need_demo(with_grammar=args.json_schema is not None)
    if missing:
        print(f"stopline generate needs the demo extra ({missing} is not installed):\n"
              f"    {DEMO_HINT}", file=sys.stderr)
        return 2
    import torch
    from transformers.utils import logging as hf_logging

    from stopline.tools import models

    hf_logging.disable_progress_bar()  # type: ignore[no-untyped-call]  # keep the terminal for the streamed text
    if args.device.startswith("cuda"):
        index = int(args.device.partition(":")[2] or 0)
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if index >= count:
            devices = "cuda:0" if count == 1 else f"cuda:0 to cuda:{count - 1}"
            seen = "no CUDA device" if count == 0 else f"{counted(count, 'CUDA device')}, {devices}"
            print(f"stopline generate: --device {args.device}, but torch sees {seen}", file=sys.stderr)
            return 2
    schema = None
    if args.json_schema is not None:
        try:
            schema = _read_schema(args.json_schema)
        except (OSError, ValueError) as e:
            print(f"stopline generate: --json-schema is neither a readable file nor JSON: {e}",
                  file=sys.stderr)
            return 2
    try:
        lm = models.load_smollm2(args.model, device=args.device)
    except models.ModelFileError as e:
        print(f"stopline generate: {e}", file=sys.stderr)
        return 2
    out = sys.stdout
    stream = not args.quiet

    def show(delta: str) -> None:
        if args.json:
            out.write(json.dumps({"type": "delta", "text": delta}, ensure_ascii=False) + "\n")
        else:
            out.write(delta)
        out.flush()

    try:
        res = generate(
            lm, args.prompt, system=args.system, stop=args.stop, stop_token_ids=args.stop_token_id,
            min_tokens=args.min_tokens, max_tokens=args.max_tokens,
            include_stop_str_in_output=args.include_stop_str_in_output, ignore_eos=args.ignore_eos,
            json_schema=schema, temperature=args.temperature, top_p=args.top_p, seed=args.seed,
            on_delta=show if stream else None,
        )
    except (TypeError, ValueError) as e:  # StopParams or LogitsConstraints rejected an argument
        print(f"stopline generate: {e}", file=sys.stderr)
        return 2
    if args.json:
        out.write(json.dumps({"type": "result", **res.as_dict(), "device": str(lm.device)},
                             ensure_ascii=False) + "\n")
        return 0
    out.write(("" if stream else res.text) + "\n")
    out.flush()
    # stdout carries the text alone; the statistics go to stderr.
    rate = res.sampled_tokens / res.seconds if res.seconds > 0 else 0.0
    print(f"[finish_reason={res.finish_reason} stop_reason={res.stop_reason!r} "
          f"output_tokens={len(res.token_ids)} prompt_tokens={res.prompt_tokens} "
          f"device={lm.device} {rate:.1f} tokens/s]", file=sys.stderr)
    return 0
