"""Drivers for the engines' own reasoning parsers and for stopline on the same
id streams (tests/test_reasoning_parity.py). Each driver takes the prompt ids
and the output ids cut into steps (several ids per step: an accept run) and
returns the reasoning and content deltas per step, as the engine's serving
layer would stream them."""

from __future__ import annotations

import random
from collections.abc import Sequence
from functools import lru_cache
from types import SimpleNamespace as NS
from typing import Any

import stopline

Steps = Sequence[Sequence[int]]
Deltas = list[tuple[str, str]]  # (reasoning, content) per step

START, END = "<think>", "</think>"


class Tok:
    """A real tokenizer (stopline.tools.vocab_files), its marker ids and a pool
    of ids whose text is whole characters, markup-free."""

    def __init__(self, name: str) -> None:
        from tokenizers import Tokenizer

        from stopline.tools.vocab_files import tokenizer_json_path

        self.name = name
        self.path = str(tokenizer_json_path(name))
        self.tok = Tokenizer.from_file(self.path)
        self.vocab = stopline.Vocabulary.from_file(self.path)
        self.start = self.tok.token_to_id(START)
        self.end = self.tok.token_to_id(END)
        # Marker text cut across ordinary tokens (byte-level spellings).
        self.start_splits = self._splits(["<", "think", ">"], ["<th", "ink", ">"], ["<", "th", "ink", ">"])
        self.end_splits = self._splits(["</", "think", ">"], ["<", "/", "think", ">"], ["</", "th", "ink", ">"])
        self.near = self._ids("<", "</", "<th", "th", "think", ">", "></", ">\u010a", "/", "ink")
        self.plain = self._ids("a", "\u0120the", "\u010a", "\u010a\u010a", ".", "\u00c3\u00a9", "\u0120answer", "1")
        rng = random.Random(21)
        n = self.tok.get_vocab_size()
        added = set(self.tok.get_added_tokens_decoder())
        picked: list[int] = []
        while len(picked) < 200:
            i = rng.randrange(n)
            t = self.tok.decode([i], skip_special_tokens=False)
            if i not in added and t and "\ufffd" not in t and not any(m in t for m in "<>|\uff5c"):
                picked.append(i)
        self.random = picked

    def _ids(self, *pieces: str) -> list[int]:
        ids = [self.tok.token_to_id(p) for p in pieces]
        return [i for i in ids if i is not None]

    def _splits(self, *splits: list[str]) -> list[list[int]]:
        out = []
        for s in splits:
            ids = [self.tok.token_to_id(p) for p in s]
            if None not in ids:
                out.append(ids)
        return out

    def decode(self, ids: Sequence[int], skip: bool) -> str:
        return str(self.tok.decode(list(ids), skip_special_tokens=skip))


@lru_cache(maxsize=None)
def tokenizer(name: str) -> Tok:
    return Tok(name)


def text_deltas(tok: Tok, prompt: Sequence[int], steps: Steps, skip: bool) -> list[str]:
    """The detokenizer's text per step (the pools hold whole-character tokens,
    so decoding the whole output and taking the new suffix is exact)."""
    out, seen, prev = [], [], ""
    for run in steps:
        seen.extend(run)
        now = tok.decode(seen, skip)
        assert now.startswith(prev), (prev, now)
        out.append(now[len(prev):])
        prev = now
    return out


# ------------------------------------------------------------------ stopline --

def stopline_deltas(tok: Tok, params: stopline.StopParams, prompt: Sequence[int], steps: Steps,
                    skip: bool) -> tuple[Deltas, Any]:
    """FinishTracker fed ids only (stopline decodes them); ``params`` should
    cap the output at its length so the last step finishes and flushes."""
    t = stopline.FinishTracker(params, vocabulary=tok.vocab, prompt_token_ids=list(prompt), skip_special_tokens=skip)
    out = []
    for run in steps:
        r = t.update(list(run))
        out.append((r.reasoning_delta, r.content_delta))
        if t.finished:
            break
    return out, t


# ---------------------------------------------------------------------- vLLM --

def vllm_hf_tokenizer(tok: Tok) -> Any:
    """The tokenizer as vLLM serves one: wrapped by ``get_cached_tokenizer``."""
    from transformers import PreTrainedTokenizerFast
    from vllm.tokenizers.hf import get_cached_tokenizer

    return get_cached_tokenizer(PreTrainedTokenizerFast(tokenizer_file=tok.path))


def vllm_stream(parser_cls: Any, hf: Any, tok: Tok, prompt: Sequence[int], steps: Steps, skip: bool) -> Deltas:
    """vLLM 0.33's chat streaming: one Parser per request (serving.py
    ``_make_parser``), ``parse_delta`` per step with the step's text and ids,
    ``finished=True`` on the last (stream_processor.py ``step``)."""
    parser = parser_cls(hf, None, chat_template_kwargs=None)
    request = NS(include_reasoning=True, tools=None, tool_choice="none", messages=[])
    out = []
    texts = text_deltas(tok, prompt, steps, skip)
    for k, (run, text) in enumerate(zip(steps, texts)):
        d = parser.parse_delta(text, list(run), request, prompt_token_ids=list(prompt), finished=k == len(steps) - 1)
        out.append(((d.reasoning or "") if d else "", (d.content or "") if d else ""))
    return out


def vllm_whole(parser_cls: Any, hf: Any, tok: Tok, output: Sequence[int], skip: bool) -> tuple[str, str]:
    """vLLM 0.33's non-streaming chat path (serving.py: ``parser.parse``)."""
    parser = parser_cls(hf, None, chat_template_kwargs=None)
    request = NS(include_reasoning=True, tools=None, tool_choice="none", messages=[])
    reasoning, content, _ = parser.parse(tok.decode(output, skip), request, model_output_token_ids=list(output))
    return reasoning or "", content or ""


# -------------------------------------------------------------------- SGLang --

def sglang_stream(parser_cls: Any, model: str, force: bool, tok: Tok, prompt: Sequence[int], steps: Steps,
                  skip: bool) -> Deltas:
    """SGLang 0.5.23's chat streaming (serving_chat.py
    ``_process_reasoning_stream``): ``parse_stream_chunk`` per text delta, and
    ``parse_stream_end`` added to the finishing chunk."""
    parser = parser_cls(model, True, force)
    out = []
    texts = text_deltas(tok, prompt, steps, skip)
    for k, text in enumerate(texts):
        r, c = parser.parse_stream_chunk(text)
        if k == len(texts) - 1:
            er, ec = parser.parse_stream_end()
            r, c = (r or "") + (er or ""), (c or "") + (ec or "")
        out.append((r or "", c or ""))
    return out


def sglang_whole(parser_cls: Any, model: str, force: bool, text: str) -> tuple[str, str]:
    """SGLang 0.5.23's non-streaming chat path: ``parse_non_stream`` with
    ``stream_reasoning=False``."""
    r, c = parser_cls(model, False, force).parse_non_stream(text)
    return r or "", c or ""


def joined(deltas: Deltas) -> tuple[str, str]:
    return "".join(r for r, _ in deltas), "".join(c for _, c in deltas)
