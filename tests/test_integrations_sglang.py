"""stopline.integrations.sglang against SGLang's own Req.update_finish_state.

Runs only where SGLang imports (``pip install '.[sglang]'``; docs/integrations.md);
skipped otherwise. A real ``sglang.srt.managers.schedule_batch.Req`` with the
SmolLM2 tokenizer and ``ReqFinish`` are fed the same accepted ids (one per
step, or speculative runs) from real text; both must finish at the same id
with the same finish-reason object, except the deliberate differences of
docs/integrations.md, which are tested as such.
"""

from __future__ import annotations

import random
from array import array

import pytest

pytest.importorskip("sglang.srt.managers.schedule_batch", reason="SGLang is not installed (pip install '.[sglang]')")
from sglang.srt.managers.schedule_batch import Req  # noqa: E402
from sglang.srt.sampling.sampling_params import SamplingParams  # noqa: E402

from stopline.integrations.sglang import ReqFinish  # noqa: E402

EOS = 2
WORDS = ["The", " cat", " sat", " on", " the", " mat", ".", " Then", " it", " ran", " away", "!", "\n", " 42", " 7"]


@pytest.fixture(scope="module")
def tok():
    from stopline.tools.models import load_smollm2_tokenizer

    t = load_smollm2_tokenizer()
    t.additional_stop_token_ids = None  # SGLang's tokenizer loader sets this attribute
    return t


def sglang_reason(req):
    r = req.finished_reason
    if r is None:
        return None
    return type(r).__name__, r.to_json()


def ours_reason(res):
    r = res.finished_reason
    return None if r is None else (r.kind, r.to_json())


def make_pair(tok, prompt, **kw):
    sp = SamplingParams(**kw)
    sp.normalize(tok)
    sp.verify(tok.vocab_size)
    req = Req("r", "", array("i", prompt), sp, eos_token_ids={EOS}, vocab_size=len(tok))
    req.tokenizer = tok
    ours = ReqFinish(sp, eos_token_ids={EOS, tok.eos_token_id}, vocab_size=len(tok), tokenizer=tok, prompt_ids=prompt)
    return req, ours


def run_pair(req, ours, stream, runs):
    pos = 0
    for k in runs:
        new = stream[pos:pos + k]
        if not new:
            break
        pos += len(new)
        req.output_ids.extend(new)
        req.update_finish_state(len(new))
        res = ours.update(new)
        assert res.finished == req.finished(), (new, sglang_reason(req), ours_reason(res))
        if req.finished():
            return req, res
    return req, res


@pytest.mark.parametrize("seed", range(40))
def test_req_finish_matches_sglang(tok, seed):
    """One stop string or one stop regex, stop token ids, EOS and max_new_tokens,
    ids from real text, single ids or runs of 1-4 (SGLang 0.5.23)."""
    rng = random.Random(seed)
    prompt = tok.encode("Story: ")
    text = "".join(rng.choice(WORDS) for _ in range(60))
    stream = tok.encode(text)[:40]
    if rng.random() < 0.3:
        stream[rng.randrange(len(stream))] = EOS
    kw = dict(max_new_tokens=rng.randint(1, 40), no_stop_trim=rng.random() < 0.3)
    kind = rng.choice(["stop", "regex", "ids"])
    if kind == "stop":
        kw["stop"] = [rng.choice([" mat", "sat on", ".", "!\n", "ran away", " 7"])]
    elif kind == "regex":
        kw["stop_regex"] = [rng.choice([r"\d+", r"ran\s+away", r"[.!]", r"the (cat|mat)"])]
    else:
        kw["stop_token_ids"] = list({stream[rng.randrange(len(stream))] for _ in range(2)})
    req, ours = make_pair(tok, prompt, **kw)
    runs = [1] * 40 if rng.random() < 0.5 else [rng.randint(1, 4) for _ in range(40)]
    req, res = run_pair(req, ours, stream, runs)
    assert ours_reason(res) == sglang_reason(req)
    if req.finished():
        assert res.finished_len == (req.finished_len if req.finished_len is not None else len(req.output_ids))


def test_ignore_eos_keeps_stop_token_ids(tok):
    """Deliberate difference: SGLang's ignore_eos skips stop_token_ids too;
    stopline's ignore_eos disables EOS only (as vLLM)."""
    prompt = tok.encode("Story: ")
    stream = tok.encode("The cat sat on the mat.")
    req, ours = make_pair(tok, prompt, max_new_tokens=20, ignore_eos=True, stop_token_ids=[stream[2]])
    req, res = run_pair_all(req, ours, stream[:4])
    assert not req.finished()
    assert ours_reason(res) == ("FINISH_MATCHED_TOKEN", {"type": "stop", "matched": stream[2]})
    assert res.finished_len == 3


def test_stop_string_below_min_new_tokens(tok):
    """Deliberate difference: SGLang enforces min_new_tokens only by masking
    stop ids, so a stop string finishes below it; stopline does not finish on
    a stop string until output token n > min_new_tokens (as vLLM)."""
    prompt = tok.encode("Story: ")
    stream = tok.encode("The cat sat on the mat. Then it ran away")
    req, ours = make_pair(tok, prompt, max_new_tokens=30, min_new_tokens=6, stop=[" cat"])
    req, res = run_pair_all(req, ours, stream)
    assert sglang_reason(req) == ("FINISH_MATCHED_STR", {"type": "stop", "matched": " cat"}) and req.finished_len == 2
    assert not res.finished


def run_pair_all(req, ours, stream):
    """Feed both one id at a time through the whole stream (SGLang's Req
    ignores ids after it finished; ReqFinish reports its state unchanged)."""
    res = None
    for t in stream:
        if not req.finished():
            req.output_ids.append(t)
            req.update_finish_state(1)
        res = ours.update([t]) if not (res and res.finished) else res
    return req, res


# --- StoplineLogitProcessor through SGLang's apply_custom_logit_processor ---

import torch  # noqa: E402
from sglang.srt.layers.sampler import apply_custom_logit_processor  # noqa: E402
from sglang.srt.sampling.custom_logit_processor import CustomLogitProcessor  # noqa: E402
from sglang.srt.sampling.sampling_batch_info import ProcessorEntry  # noqa: E402

from stopline.integrations.sglang import StoplineLogitProcessor  # noqa: E402
from stopline.logits import LogitsConstraints  # noqa: E402

V = 50


class FakeBatchInfo:
    """The fields apply_custom_logit_processor reads from SamplingBatchInfo."""

    def __init__(self, reqs, serialized):
        self.temperatures = [1.0] * len(reqs)
        self.device = "cpu"
        self.custom_params = [r.sampling_params.custom_params for r in reqs]
        rows = [i for i, r in enumerate(reqs) if r.custom_logit_processor]
        self.custom_logit_processor = {
            hash(serialized): ProcessorEntry(
                processor=CustomLogitProcessor.from_str(serialized), rows=rows, indices=torch.tensor(rows)
            )
        }

    def __len__(self):
        return len(self.temperatures)


def test_custom_logit_processor_through_sglang():
    """Requests with and without the processor in one batch, steps of one
    token: each constrained row equals a from-scratch LogitsConstraints over
    its whole output; other rows are untouched."""
    rng = random.Random(3)
    serialized = StoplineLogitProcessor.to_str()
    reqs, kws = [], []
    for i in range(5):
        kw = {"min_tokens": rng.randint(0, 4), "stop_token_ids": [1, 2], "bad_words": [[5, 6], [7]],
              "logit_bias": {rng.randrange(V): 1.5}} if i != 2 else None
        sp = SamplingParams(max_new_tokens=20, custom_params={"stopline": kw} if kw else None)
        req = Req(f"rid-{i}-{rng.random()}", "", array("i", [3, 4]), sp,
                  custom_logit_processor=serialized if kw else None, vocab_size=V)
        reqs.append(req)
        kws.append(kw)
    for _ in range(8):
        logits = torch.randn(len(reqs), V)
        expect = logits.clone()
        for i, (req, kw) in enumerate(zip(reqs, kws)):
            if kw is None:
                continue
            fresh = LogitsConstraints(1, V)
            fresh.set(0, **kw)
            fresh.append_tokens(0, list(req.output_ids))
            fresh.apply(expect[i:i + 1], row_slots=[0], row_positions=[len(req.output_ids)])
        apply_custom_logit_processor(logits, FakeBatchInfo(reqs, serialized))
        assert torch.equal(logits, expect)
        for req in reqs:
            req.output_ids.append(rng.choice([5, 6, 8, 9]))


def test_docs_example_runs():
    """The SGLang example in docs/integrations.md runs as written."""
    from doc_blocks import run_python_blocks

    run_python_blocks("docs/integrations.md", "integrations.sglang")
