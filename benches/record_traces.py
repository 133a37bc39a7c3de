#!/usr/bin/env python3
"""Re-record the decode traces bundled with stopline (``python/stopline/traces/``).

Two kinds of input, both real (format: ``docs/traces.md``):

* ``smollm2_chat.jsonl``: SmolLM2-135M-Instruct decoding real chat prompts
  (greedy and seeded sampling; some under an xgrammar JSON schema) through
  ``stopline.tools.generate.decode_tokens``, text pieces from ``DecodeStream``.
* ``reasoning_smollm2.jsonl``: SmolLM2-135M-Instruct thinking inside a
  forced ``<think>`` with a thinking budget: ``transformers.generate`` with
  ``stopline.integrations.hf``'s ``FinishCriteria`` and
  ``ConstraintsProcessor(finish=...)``, which force ``</think>`` once the
  budget is spent; the answer follows as content. Replayed under reasoning
  parameters (docs/semantics.md section 11).
* ``text_<tokenizer>.jsonl``: passages of ``pydoc_data.topics`` (stdlib) and
  of the Jargon File (Debian ``jargon-text``, when installed) tokenized by
  SmolLM2's tokenizer, cl100k_base and o200k_base (tiktoken rank files from
  the PyPI ``litellm`` wheel) and DeepSeek-V3's ``tokenizer.json`` (same
  wheel); pieces are what a streaming detokenizer releases.

Every token stream is replayed under several real-world stop parameter sets
and cut into single-token steps or speculative accept runs of 2-8 tokens.

Usage (needs ``stopline[demo]`` and ``tiktoken``)::

    pip download --no-deps litellm -d /tmp/litellm && unzip -q /tmp/litellm/*.whl \\
        'litellm/litellm_core_utils/tokenizers/*' -d /tmp/litellm
    python benches/record_traces.py --litellm /tmp/litellm [--model PATH] [--out DIR]

Output is deterministic for a given model, tokenizer files and seeds.
"""

from __future__ import annotations

import argparse
import codecs
import gzip
import json
import os
import random
import re
import sys
import time
from collections import Counter
from pathlib import Path

import stopline

ROOT = Path(__file__).resolve().parents[1]
TOKENIZER_SUBDIR = "litellm/litellm_core_utils/tokenizers"
JARGON = "/usr/share/doc/jargon-text/jargon.txt.gz"

# ----------------------------------------------------------------- tokenizers


class HFTok:
    """A ``tokenizers.Tokenizer``; pieces from ``DecodeStream`` (special tokens skipped)."""

    def __init__(self, name, tok, eos_id, padded_vocab):
        self.name, self.tok, self.eos_id = name, tok, eos_id
        self.vocab = tok.get_vocab_size(with_added_tokens=True)
        self.padded_vocab = padded_vocab  # the model's logits width

    def encode(self, text):
        return self.tok.encode(text, add_special_tokens=False).ids

    def pieces(self, ids):
        from tokenizers.decoders import DecodeStream

        ds = DecodeStream(skip_special_tokens=True)
        return [ds.step(self.tok, i) or "" for i in ids]


class TikTok:
    """A tiktoken encoding; pieces are the token bytes run through an
    incremental UTF-8 decoder, so a character split over tokens appears with
    the token that completes it and the earlier ones give ""."""

    def __init__(self, name, enc, padded_vocab):
        self.name, self.enc = name, enc
        self.eos_id = enc.eot_token
        self.vocab = enc.n_vocab
        self.padded_vocab = padded_vocab

    def encode(self, text):
        return self.enc.encode_ordinary(text)

    def pieces(self, ids):
        dec = codecs.getincrementaldecoder("utf-8")()
        special = set(self.enc._special_tokens.values())
        return ["" if i in special else dec.decode(self.enc.decode_single_token_bytes(i)) for i in ids]


def load_text_tokenizers(lm, litellm_dir):
    from tokenizers import Tokenizer

    toks = [HFTok("smollm2", lm.tokenizer, lm.eos_token_ids[0], lm.vocab_size)]
    tdir = Path(litellm_dir) / TOKENIZER_SUBDIR
    if not tdir.is_dir():
        sys.exit(f"record_traces: {tdir} not found (see the usage in this script's docstring)")
    os.environ["TIKTOKEN_CACHE_DIR"] = str(tdir)  # rank files are named by the sha1 of their URL
    import tiktoken

    # Logits widths of models using these encodings (padded past the tokenizer).
    toks.append(TikTok("cl100k", tiktoken.get_encoding("cl100k_base"), 100352))
    toks.append(TikTok("o200k", tiktoken.get_encoding("o200k_base"), 200064))
    ds = Tokenizer.from_file(str(tdir / "deepseek_tokenizer.json"))
    toks.append(HFTok("deepseek_v3", ds, ds.token_to_id("<｜end▁of▁sentence｜>"), 129280))
    return toks


# ----------------------------------------------------------------- text sources

PYDOC_TOPICS = ["calls", "formatstrings", "string-methods", "try", "compound", "types",
                "with", "comparisons", "exceptions", "typesmapping"]
JARGON_ENTRIES = ["hacker", "kludge", "cruft", "HP-SUX", "foo", "hotlink"]


def text_passages(max_chars=900):
    """(label, text) pairs: pydoc topics cut at a paragraph, Jargon entries."""
    from pydoc_data.topics import topics

    out = []
    for name in PYDOC_TOPICS:
        t = topics[name]
        # Start at the first paragraph with a non-ASCII character, when there is one.
        m = re.search(r"\n\n[^\n]*[^\x00-\x7f]", t)
        start = m.start() + 2 if m and m.start() < len(t) - max_chars else 0
        out.append((f"pydoc_data.topics[{name!r}]", t[start:start + max_chars]))
    if os.path.exists(JARGON):
        with gzip.open(JARGON, "rt", encoding="utf-8") as f:
            jargon = f.read()
        for head in JARGON_ENTRIES:
            m = re.search(rf"^   :{re.escape(head)}: ", jargon, re.M)
            if m:
                out.append((f"jargon-text:{head}", jargon[m.start():m.start() + max_chars]))
        # The front matter's box-drawing rule is a real run of one repeated token.
        m = re.search("═{20,}", jargon)
        if m:
            out.append(("jargon-text:front-matter", jargon[max(0, m.start() - 500):m.start() + 300]))
    return out


# ----------------------------------------------------------------- steps


def cut_steps(ids, pieces, spec, rng, grammar_at=None):
    """Single-token steps, or speculative accept runs of 2-8 tokens."""
    steps, i = [], 0
    while i < len(ids):
        k = rng.randint(2, 8) if spec else 1
        run = {"ids": ids[i:i + k], "texts": pieces[i:i + k]}
        if grammar_at is not None and i <= grammar_at < i + k:
            run["grammar_terminated_at"] = grammar_at - i
        steps.append(run)
        i += k
    return steps


def first_at_or_after(pieces, frac, pred):
    """Index of the first token at or after ``frac`` of the stream whose piece satisfies pred."""
    for j in range(int(len(pieces) * frac), len(pieces)):
        if pred(pieces[j]):
            return j
    return None


def phrase_after(text, frac, words=2):
    """A phrase of the text starting at the first word boundary after ``frac`` of it."""
    m = re.compile(r"\s\S+" * words).search(text, int(len(text) * frac))
    return m.group(0) if m else None


# ----------------------------------------------------------------- text requests


def text_requests(tok, passages, rng):
    reqs = []
    kinds = ["stop_string", "eos", "stop_token", "length", "error", "min_tokens", "abort",
             "unicode_stop", "max_model_len"]
    for p_no, (label, text) in enumerate(passages):
        ids = tok.encode(text)
        pieces = tok.pieces(ids)
        joined = "".join(pieces)
        base = {"source": {"kind": "text", "tokenizer": tok.name, "text": label}}
        rep_hit = _repetition_point(ids, REPETITION)
        picks = [kinds[(p_no + j) % len(kinds)] for j in (0, 3, 6)]
        if rep_hit is not None:
            picks = ["repetition", "repetition_below_min"]
        for j, kind in enumerate(picks):
            spec = (p_no + j) % 2 == 1
            params = {"eos_token_ids": [tok.eos_id]}
            r_ids, r_pieces = list(ids), list(pieces)
            injected = None
            if kind == "stop_string":
                phrase = phrase_after(joined, 0.55)
                params["stop"] = ["\nUser:", "</s>", phrase]
                params["include_stop_str_in_output"] = p_no % 2 == 0
            elif kind == "unicode_stop":
                # a multi-byte character (split over byte-level tokens) and the next one
                m = re.compile(r"[^\x00-\x7f].").search(joined, len(joined) // 3)
                params["stop"] = [m.group(0) if m else "\n\n"]
            elif kind == "eos":
                r_ids.append(tok.eos_id)
                r_pieces.append("")
                params["max_tokens"] = len(r_ids) + 50
            elif kind == "stop_token":
                j_nl = first_at_or_after(pieces, 0.6, lambda s: "\n" in s or "." in s)
                if j_nl is None:
                    continue
                params["stop_token_ids"] = [ids[j_nl]]
                params["include_stop_str_in_output"] = p_no % 3 == 0
            elif kind == "length":
                params["max_tokens"] = max(1, int(len(ids) * 0.7))
            elif kind == "max_model_len":
                params["prompt_len"] = 700 + p_no
                params["max_model_len"] = params["prompt_len"] + int(len(ids) * 0.45)
            elif kind == "error":
                at = len(r_ids) // 2
                if tok.padded_vocab > tok.vocab:
                    bad = tok.vocab + rng.randrange(tok.padded_vocab - tok.vocab)
                    why = f"inside the model's padded logits ({tok.padded_vocab}) but not in the tokenizer"
                else:
                    bad = tok.vocab + rng.randrange(1024)
                    why = "outside the vocabulary, as from a corrupted sample"
                r_ids[at] = bad
                r_pieces[at] = ""
                params["vocab_size"] = tok.vocab
                injected = f"id {bad} at output position {at}: {why} (vocab {tok.vocab})"
            elif kind == "min_tokens":
                # a stop string that occurs early; min_tokens skips the early hits
                params["stop"] = [". ", ".\n"]
                params["min_tokens"] = int(len(ids) * 0.4)
            elif kind == "abort":
                params["stop"] = ["\nUser:", "<|im_end|>"]
                params["max_tokens"] = len(ids) + 100
            elif kind in ("repetition", "repetition_below_min"):
                params["repetition"] = dict(REPETITION)
                if kind == "repetition_below_min":
                    params["min_tokens"] = rep_hit + 3  # the detector waits for min_tokens
                cut = min(len(r_ids), rep_hit + 40)
                r_ids, r_pieces = r_ids[:cut], r_pieces[:cut]
            src = dict(base["source"], kind_of_params=kind, steps="spec 2-8" if spec else "single")
            if injected:
                src["injected"] = injected
            reqs.append({
                "id": f"{tok.name}-{p_no:02d}-{kind}",
                "params": params,
                "steps": cut_steps(r_ids, r_pieces, spec, rng),
                "source": src,
            })
    return reqs


REPETITION = {"max_pattern_size": 4, "min_pattern_size": 1, "min_count": 6}


def _repetition_point(ids, rep):
    """Output count at which the repetition rule fires on ``ids``, or None (uses stopline)."""
    t = stopline.FinishTracker(stopline.StopParams(repetition=rep))
    r = t.update(ids)
    return r.num_tokens if r.finish_reason == "repetition" else None


# ----------------------------------------------------------------- model requests

CHAT_PROMPTS = [
    ("What is the capital of France?", None),
    ("Write a haiku about the sea.", None),
    ("List three fruits, one per line.", None),
    ("Explain what a stop sequence is in one sentence.", None),
    ("Give me a short recipe for pancakes.", None),
    ("Translate 'good morning' into French, Spanish and German.", None),
    ("Write a Python function that adds two numbers.", None),
    ("Say 'ha' twenty times.", None),
    ("Repeat the word 'hello' over and over.", None),
    ("Count from 1 to 30.", None),
    ("Tell me a joke about computers.", "You are a funny assistant."),
    ("What is 12 times 7?", None),
]
SCHEMAS = [
    ("Is the sky blue? Answer in JSON.", {"type": "boolean"}, 8),
    ("Is water dry? Answer in JSON.", {"type": "boolean"}, 0),
    ("Describe a person named Ana who is 31, as JSON.",
     {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
      "required": ["name", "age"]}, 0),
    ("Pick a primary color.", {"enum": ["red", "green", "blue"]}, 4),
    ("Give two small prime numbers as a JSON array.",
     {"type": "array", "items": {"type": "integer"}, "minItems": 2, "maxItems": 2}, 0),
]
GEN_MAX = 96


def model_requests(lm, rng, log):
    from stopline.tools.generate import compile_json_schema, decode_tokens

    reqs = []
    runs = []  # (label, prompt, system, sampling, schema, min_tokens)
    for k, (prompt, system) in enumerate(CHAT_PROMPTS):
        runs.append((prompt, system, {"temperature": 0.0}, None, 0))
        if k % 3 == 0:
            runs.append((prompt, system, {"temperature": 0.8, "top_p": 0.95, "seed": 1000 + k}, None, 0))
    for prompt, schema, mt in SCHEMAS:
        runs.append((prompt, None, {"temperature": 0.0}, schema, mt))
        runs.append((prompt, None, {"temperature": 1.0, "seed": 7}, schema, mt))
    for g_no, (prompt, system, sampling, schema, min_tokens) in enumerate(runs):
        prompt_ids = lm.chat_prompt(prompt, system)
        grammar = compile_json_schema(lm, json.dumps(schema)) if schema else None
        ids, pieces, g_at = [], [], None
        t0 = time.perf_counter()
        for tok in decode_tokens(lm, prompt_ids, min_tokens=min_tokens, compiled_grammar=grammar,
                                 max_steps=GEN_MAX, **sampling):
            if tok.infeasible:
                break
            ids.append(tok.id)
            pieces.append(tok.piece)
            if tok.grammar_terminated:
                g_at = len(ids) - 1
                break
            if tok.id in lm.eos_token_ids:
                break
        log(f"  gen {g_no:2d}: {len(ids)} tokens in {time.perf_counter() - t0:.1f}s "
            f"{''.join(pieces)[:60]!r}")
        source = {"kind": "generation", "model": "SmolLM2-135M-Instruct.Q4_1.gguf", "prompt": prompt,
                  "system": system, "sampling": sampling, "prompt_tokens": len(prompt_ids)}
        if schema is not None:
            source["json_schema"] = schema
            source["min_tokens_masked"] = min_tokens
        base = {"prompt_len": len(prompt_ids), "max_model_len": lm.max_model_len,
                "eos_token_ids": lm.eos_token_ids, "vocab_size": lm.vocab_size}
        text = "".join(pieces)
        variants = [("as_generated", dict(base, max_tokens=GEN_MAX, min_tokens=min_tokens))]
        if schema is not None:
            # ignore_eos leaves the grammar's own termination to finish it
            variants.append(("grammar_ignore_eos", dict(base, ignore_eos=True, min_tokens=min_tokens)))
            # a constrained run stuck emitting whitespace is what the detector is for
            variants.append(("grammar_repetition", dict(base, repetition={"max_pattern_size": 2, "min_count": 8})))
        else:
            if "\n" in text:
                variants.append(("stop_newline", dict(base, stop=["\n"], include_stop_str_in_output=g_no % 2 == 0)))
            phrase = phrase_after(text, 0.4, words=1)
            if phrase:
                variants.append(("stop_phrase", dict(base, stop=["Sure!", phrase.strip(), "###"])))
            j = first_at_or_after(pieces, 0.3, lambda s: s.strip() in {".", ",", "!", "?", ":"})
            if j is not None:
                variants.append(("stop_token", dict(base, stop_token_ids=[ids[j]])))
            variants.append(("max_tokens", dict(base, max_tokens=max(1, len(ids) // 2))))
            variants.append(("min_tokens_stop", dict(base, stop=[" ", "\n"], min_tokens=min(len(ids) // 3, 20),
                                                     max_tokens=GEN_MAX)))
            variants.append(("repetition", dict(base, repetition={"max_pattern_size": 8, "min_pattern_size": 1,
                                                                  "min_count": 3})))
        for v_no, (kind, params) in enumerate(variants):
            spec = (g_no + v_no) % 2 == 1
            reqs.append({
                "id": f"smollm2-gen{g_no:02d}-{kind}",
                "params": params,
                "steps": cut_steps(ids, pieces, spec, rng, g_at),
                "source": dict(source, kind_of_params=kind, steps="spec 2-8" if spec else "single"),
                # staggered arrivals: continuous batching, slots are reused
                "arrival": rng.randrange(0, 40),
            })
    return reqs


# ----------------------------------------------------------------- reasoning requests

THINK_PROMPTS = [
    ("What is 7 times 8? Think step by step.", 24),
    ("Is 17 a prime number? Explain.", 32),
    ("Write a haiku about the sea.", 16),
    ("Which is heavier, a kilo of feathers or a kilo of iron?", 40),
]
THINK = {"reasoning_start": "<think>", "reasoning_end": "</think>"}


def reasoning_requests(lm, rng, log):
    """SmolLM2 has no think tokens: the chat prompt is followed by the text
    ``<think>`` (a forced prefix), the model thinks greedily, and after
    ``budget`` reasoning tokens the HF adapters force ``</think>``; it then
    answers until EOS or ``GEN_MAX`` tokens. The forced ``<think>`` ids are
    replayed as the first output tokens (as a model that opens the block
    itself would emit them), except in ``think_prompt_opened``."""
    import torch
    import transformers
    from tokenizers.decoders import DecodeStream

    from stopline.integrations.hf import ConstraintsProcessor, FinishCriteria

    hf_tok, tok = lm.hf_tokenizer, lm.tokenizer
    start = tok.encode("<think>", add_special_tokens=False).ids
    end = tok.encode("</think>", add_special_tokens=False).ids
    reqs = []
    for g_no, (prompt, budget) in enumerate(THINK_PROMPTS):
        prompt_ids = lm.chat_prompt(prompt) + start
        params = stopline.StopParams(eos_token_ids=lm.eos_token_ids, max_tokens=GEN_MAX, max_reasoning_tokens=budget,
                                     reasoning_end_ids=end, **THINK)
        crit = FinishCriteria(hf_tok, params)
        t0 = time.perf_counter()
        out = lm.model.generate(
            torch.tensor([prompt_ids]), attention_mask=torch.ones(1, len(prompt_ids), dtype=torch.long),
            max_new_tokens=GEN_MAX, do_sample=False, pad_token_id=lm.eos_token_ids[0],
            stopping_criteria=transformers.StoppingCriteriaList([crit]),
            logits_processor=transformers.LogitsProcessorList([ConstraintsProcessor({}, finish=crit)]),
        )[0, len(prompt_ids):].tolist()
        out = out[: crit.results()[0].num_tokens or len(out)]  # no padding after EOS
        assert out[budget:budget + len(end)] == end, "the budget did not force </think>"
        ids = start + out
        ds = DecodeStream(skip_special_tokens=True)
        pieces = [ds.step(tok, i) or "" for i in ids]
        reasoning, content = crit.reasoning_texts()[0], crit.content_texts()[0]
        log(f"  think {g_no}: {len(out)} tokens in {time.perf_counter() - t0:.1f}s; "
            f"reasoning {reasoning[:40]!r}, content {content[:40]!r}")
        r_phrase = (phrase_after(reasoning, 0.3, words=1) or "").strip()
        c_phrase = (phrase_after(content, 0.3, words=1) or "").strip()
        base = {"prompt_len": len(prompt_ids) - len(start), "max_model_len": lm.max_model_len,
                "eos_token_ids": lm.eos_token_ids, "vocab_size": lm.vocab_size}
        budgeted = dict(base, **THINK, max_tokens=GEN_MAX, max_reasoning_tokens=budget, reasoning_end_ids=end)
        variants = [("think_as_generated", budgeted, ids, pieces)]
        if r_phrase:
            variants += [
                # vllm#52393: without markers the phrase stops the request inside the thinking
                ("think_no_markers", dict(base, stop=[r_phrase]), ids, pieces),
                ("think_stop_in_reasoning", dict(budgeted, stop=[r_phrase]), ids, pieces),
                ("think_stop_reasoning_scope", dict(budgeted, stop=[r_phrase], stop_scopes=["reasoning"]), ids, pieces),
            ]
        if c_phrase:
            variants.append(("think_stop_in_content", dict(budgeted, stop=[c_phrase]), ids, pieces))
        variants.append(("think_length", dict(base, **THINK, max_tokens=(len(start) + budget) // 2), ids, pieces))
        variants.append(("think_prompt_opened", dict(base, **THINK, reasoning_starts_in="reasoning",
                                                     keep_reasoning_markers=True, token_aligned=True),
                         out, pieces[len(start):]))
        source = {"kind": "generation", "model": "SmolLM2-135M-Instruct.Q4_1.gguf", "prompt": prompt,
                  "sampling": {"temperature": 0.0}, "prompt_tokens": len(prompt_ids) - len(start),
                  "forced": f"'<think>' after the chat prompt; '</think>' after {budget} reasoning tokens "
                            "(thinking budget, stopline.integrations.hf)"}
        for v_no, (kind, p, r_ids, r_pieces) in enumerate(variants):
            spec = (g_no + v_no) % 2 == 1
            reqs.append({
                "id": f"think{g_no}-{kind.removeprefix('think_')}",
                "params": p,
                "steps": cut_steps(r_ids, r_pieces, spec, rng),
                "source": dict(source, kind_of_params=kind, steps="spec 2-8" if spec else "single"),
                "arrival": rng.randrange(0, 20),
            })
    return reqs


# ----------------------------------------------------------------- main


def write(path, reqs):
    """gzip-compressed JSONL; mtime 0 so that the same traces give the same bytes."""
    text = "".join(json.dumps(r, ensure_ascii=False, separators=(",", ":")) + "\n" for r in reqs)
    with open(path, "wb") as f:
        f.write(gzip.compress(text.encode("utf-8"), compresslevel=9, mtime=0))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--litellm", help="folder where the litellm wheel was unzipped (needed for the text traces)")
    ap.add_argument("--model", default=None, help="SmolLM2 gguf (default: stopline's model cache)")
    ap.add_argument("--out", default=str(ROOT / "python" / "stopline" / "traces"))
    ap.add_argument("--seed", type=int, default=20261130)
    ap.add_argument("--skip-model", action="store_true", help="re-record only the text traces")
    ap.add_argument("--only-reasoning", action="store_true", help="re-record only reasoning_smollm2 (no litellm needed)")
    a = ap.parse_args(argv)
    if not a.litellm and not a.only_reasoning:
        ap.error("--litellm is required unless --only-reasoning")

    import torch

    from stopline.tools.models import load_smollm2

    torch.manual_seed(a.seed)
    log = lambda msg: print(msg, file=sys.stderr, flush=True)  # noqa: E731
    lm = load_smollm2(a.model, device="cpu")
    os.makedirs(a.out, exist_ok=True)
    files = {}
    if not a.only_reasoning:
        passages = text_passages()
        for tok in load_text_tokenizers(lm, a.litellm):
            files[f"text_{tok.name}.jsonl.gz"] = text_requests(tok, passages, random.Random(f"{a.seed}-{tok.name}"))
    if not a.skip_model:
        log("thinking with SmolLM2 ...")
        files["reasoning_smollm2.jsonl.gz"] = reasoning_requests(lm, random.Random(f"{a.seed}-reasoning"), log)
    if not a.skip_model and not a.only_reasoning:
        log("decoding with SmolLM2 ...")
        files["smollm2_chat.jsonl.gz"] = model_requests(lm, random.Random(a.seed), log)
    for name, reqs in files.items():
        write(os.path.join(a.out, name), reqs)
        counts = Counter(r["source"]["kind_of_params"] for r in reqs)
        log(f"{name}: {len(reqs)} requests, {os.path.getsize(os.path.join(a.out, name))} bytes; {dict(counts)}")


if __name__ == "__main__":
    main()
