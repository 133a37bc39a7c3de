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
"""

from __future__ import annotations

import argparse
import importlib.util
import platform
import random
import sys
from collections.abc import Callable
from types import SimpleNamespace

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


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seqs", type=int, default=256)
    ap.add_argument("--steps", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args(argv)
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
