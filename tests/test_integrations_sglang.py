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


def overlap_loop(reqs_at, serialized, width, steps, sample, check=None, delayed=False):
    """SGLang's overlap loop (Scheduler.event_loop_overlap, its default) as
    the processor sees it: batch N is prepared (its KV allocated: the whole
    fill by alloc_for_extend, one token by alloc_for_decode) and sampled in
    run_batch, custom processors included, before process_batch_result of
    batch N-1 appends that batch's token to output_ids. ``reqs_at(step)``:
    the requests of the batch; ``sample(step, i, req, row)`` the id sampled.
    ``delayed``: the sample waits until batch N-1's result is processed, as
    with a grammar or SGLANG_ENABLE_DELAY_SAMPLE=1 (launch_batch_sample_if_needed)."""
    pending = {}
    for step in range(steps):
        reqs = reqs_at(step)
        for req in reqs:
            if req.kv.kv_committed_len == 0:
                req.kv.kv_committed_len = len(req.origin_input_ids) + len(req.output_ids)
            else:
                req.kv.kv_committed_len += 1
        if delayed:
            for req, token in pending.values():
                req.output_ids.append(token)
            pending = {}
        logits = torch.randn(len(reqs), width)
        before = logits.clone()
        apply_custom_logit_processor(logits, FakeBatchInfo(reqs, serialized))
        if check is not None:
            check(step, reqs, before, logits, pending)
        sampled = {req.rid: (req, sample(step, i, req, logits[i])) for i, req in enumerate(reqs)}
        for req, token in pending.values():
            req.output_ids.append(token)
        pending = sampled


@pytest.mark.parametrize("delayed", [False, True])
def test_overlap_scheduler_row_is_one_token_ahead_of_output_ids(delayed):
    """Under SGLang's overlap loop a one-row request samples the position
    after the token output_ids lacks yet (req.kv.kv_committed_len counts it):
    min_tokens ends on time, and a bad word is not matched against a history
    that lacks its last token (no ban of 6 after 5 when 8 came between). A
    request prefilled in the same batch has no lag, nor one whose previous
    batch was processed first (it sat out a batch, or the sample is delayed).
    Each row equals a LogitsConstraints built on the visible output at the
    true position."""
    serialized = StoplineLogitProcessor.to_str()
    kw = {"min_tokens": 2, "stop_token_ids": [1], "bad_words": [[5, 6]]}
    script = [5, 8, 5, 6, 9, 5, 7]
    reqs = [Req(f"overlap-{i}-{random.random()}", "", array("i", [3, 4]),
                SamplingParams(max_new_tokens=20, custom_params={"stopline": kw}),
                custom_logit_processor=serialized, vocab_size=V) for i in range(2)]

    def check(step, batch, before, logits, pending):
        expect = before.clone()
        for i, req in enumerate(batch):
            seen = list(req.output_ids)
            ref = LogitsConstraints(1, V)
            ref.set(0, **kw)
            ref.append_tokens(0, seen)
            ref.apply(expect[i:i + 1], row_slots=[0], row_positions=[len(seen) + (req.rid in pending)])
        assert torch.equal(logits, expect)
        if step == 2:  # request 0 has output [5] and 8 unseen: the true position is 2
            assert torch.isfinite(logits[0, [1, 6]]).all()

    batches = [reqs[:1], reqs[:1], reqs, reqs, reqs[1:], reqs, reqs]  # request 0 sits out step 4
    overlap_loop(lambda step: batches[step], serialized, V, len(script),
                 lambda step, i, req, row: script[step], check, delayed)


def test_overlap_scheduler_thinking_budget_is_one_token_late():
    """Under the overlap loop the budget is counted on output_ids, which lack
    the newest token: `</think>` (one id) is forced once, one token after the
    budget (SGLang's own ThinkingBudgetLogitProcessor reads the same list)."""
    width = 40
    budgeted = type("OverlapBudget", (StoplineLogitProcessor,),
                    {"reasoning_markers": {"reasoning_start_id": 30, "reasoning_end_id": 31}})
    serialized = budgeted.to_str()
    req = Req(f"overlap-budget-{random.random()}", "", array("i", [3, 30]),
              SamplingParams(max_new_tokens=20, custom_params={"thinking_budget": 3}),
              custom_logit_processor=serialized, vocab_size=width)
    forced = []

    def sample(step, i, req, row):
        forced.append(int(row.argmax()) if torch.isinf(row).any() else None)
        return forced[-1] if forced[-1] is not None else 10 + step

    overlap_loop(lambda step: [req], serialized, width, 7, sample)
    assert forced == [None, None, None, None, 31, None, None]
    assert list(req.output_ids) == [10, 11, 12, 13, 31, 15]


def test_docs_example_runs():
    """The SGLang example in docs/integrations.md runs as written."""
    from doc_blocks import run_python_blocks

    run_python_blocks("docs/integrations.md", "integrations.sglang")


# --- reasoning channels (docs/semantics.md 11) -------------------------------

from sglang.srt.parser.reasoning_parser import ReasoningParser  # noqa: E402

from stopline.engines.sglang import sglang_reasoning  # noqa: E402


@pytest.fixture(scope="module")
def deepseek():
    """DeepSeek-V3's tokenizer (`<think>` / `</think>` are single special tokens)."""
    from transformers import PreTrainedTokenizerFast

    from stopline.tools.models import ModelFileError
    from stopline.tools.vocab_files import tokenizer_json_path

    try:
        t = PreTrainedTokenizerFast(tokenizer_file=str(tokenizer_json_path("deepseek-v3")))
    except ModelFileError as exc:
        pytest.skip(str(exc))
    t.additional_stop_token_ids = None
    return t


def reasoning_pair(tokenizer, prompt, eos, reasoning, **kw):
    sp = SamplingParams(**kw)
    sp.normalize(tokenizer)
    req = Req("r", "", array("i", prompt), sp, eos_token_ids={eos}, vocab_size=len(tokenizer))
    req.tokenizer = tokenizer
    ours = ReqFinish(sp, eos_token_ids={eos}, vocab_size=len(tokenizer), tokenizer=tokenizer, prompt_ids=prompt,
                     reasoning=reasoning)
    return req, ours


def test_sglang_reasoning_from_the_parser_resolves_marker_ids(deepseek, tok):
    think, end = deepseek.convert_tokens_to_ids(["<think>", "</think>"])
    for name in ("deepseek-r1", "qwen3"):
        r = sglang_reasoning(name, deepseek)
        assert r.options == {"reasoning_start": "<think>", "reasoning_start_id": think, "reasoning_end": "</think>",
                             "reasoning_end_id": end, "reasoning_end_ids": (end,)}
    # SmolLM2 has no `<think>` token: the markers are text only.
    assert set(sglang_reasoning("deepseek-r1", tok).options) == {"reasoning_start", "reasoning_end", "reasoning_end_ids"}


def test_sglang_40529_stop_string_inside_thinking_does_not_fire(deepseek):
    """A stop string met inside the thinking: SGLang 0.5.23 finishes there
    (sglang#40529: the answer is lost); ReqFinish with the parser's markers
    finishes in the content, and its reasoning / content are what SGLang's own
    deepseek-r1 parser splits from the kept text."""
    eos = deepseek.convert_tokens_to_ids("<｜end▁of▁sentence｜>")
    stream = deepseek.encode("<think>Let me see.\n\nOK</think>Hello\n\nbye", add_special_tokens=False)
    prompt = deepseek.encode("User: hi\nAssistant:", add_special_tokens=False)
    req, ours = reasoning_pair(deepseek, prompt, eos, sglang_reasoning("deepseek-r1", deepseek),
                               max_new_tokens=40, stop=["\n\n"])
    req, res = run_pair_all(req, ours, stream)
    assert deepseek.decode(req.output_ids[:req.finished_len]).startswith("<think>Let me see.")
    assert "</think>" not in deepseek.decode(req.output_ids[:req.finished_len])  # SGLang: cut in the thinking
    assert ours_reason(res) == ("FINISH_MATCHED_STR", {"type": "stop", "matched": "\n\n"})
    t = ours.tracker
    assert (t.reasoning, t.content) == ("Let me see.\n\nOK", "Hello")
    theirs = ReasoningParser("deepseek-r1", stream_reasoning=False).parse_non_stream(t.text)
    assert theirs == (t.reasoning, t.content)


def test_prompt_opened_thinking_stop_token_in_thinking_does_not_fire(deepseek):
    """DeepSeek-R1's template ends the prompt with `<think>\\n`: the output
    starts inside the block (read from prompt_ids), so a stop token id met
    there does not fire; after `</think>` it does. SGLang stops at the first."""
    eos = deepseek.convert_tokens_to_ids("<｜end▁of▁sentence｜>")
    end = deepseek.convert_tokens_to_ids("</think>")
    prompt = deepseek.encode("User: hi\nAssistant: <think>\n", add_special_tokens=False)
    nl = deepseek.encode("\n\n", add_special_tokens=False)
    assert len(nl) == 1
    stream = [*deepseek.encode("a", add_special_tokens=False), *nl, end, *deepseek.encode("b", add_special_tokens=False),
              *nl, 7]
    req, ours = reasoning_pair(deepseek, prompt, eos, sglang_reasoning("deepseek-r1", deepseek),
                               max_new_tokens=40, stop_token_ids=nl)
    req, res = run_pair_all(req, ours, stream)
    assert req.finished_len == 2  # SGLang: the stop id inside the thinking
    assert ours_reason(res) == ("FINISH_MATCHED_TOKEN", {"type": "stop", "matched": nl[0]})
    assert res.finished_len == 5 and ours.tracker.reasoning_token_ids == stream[:2]


def test_text_markers_split_across_tokens_smollm2(tok):
    """SmolLM2 (no `<think>` token): the markers arrive over several ids and
    are matched as text; the stop inside the thinking does not fire."""
    stream = tok.encode("<think>\nplan a\n\nb\n</think>Done.\n\nmore")
    req, ours = reasoning_pair(tok, tok.encode("Story: "), EOS, sglang_reasoning("deepseek-r1", tok),
                               max_new_tokens=60, stop=["\n\n"])
    _, res = run_pair_all(req, ours, stream)
    assert ours_reason(res) == ("FINISH_MATCHED_STR", {"type": "stop", "matched": "\n\n"})
    assert (ours.tracker.reasoning, ours.tracker.content) == ("\nplan a\n\nb\n", "Done.")


def test_thinking_budget_from_custom_params(deepseek):
    """custom_params["thinking_budget"] (what SGLang sets from max_thinking_tokens)
    names the end marker to force once that many thinking tokens follow
    `<think>`: counted as vLLM's budget, the prompt's "\\n" included."""
    eos = deepseek.convert_tokens_to_ids("<｜end▁of▁sentence｜>")
    end = deepseek.convert_tokens_to_ids("</think>")
    prompt = deepseek.encode("User: hi\nAssistant: <think>\n", add_special_tokens=False)
    _, ours = reasoning_pair(deepseek, prompt, eos, sglang_reasoning("deepseek-r1", deepseek),
                             max_new_tokens=40, custom_params={"thinking_budget": 3})
    words = deepseek.encode(" one two", add_special_tokens=False)
    assert ours.forced_token_id is None
    ours.update(words[:1])
    assert ours.forced_token_id is None
    ours.update(words[1:2])
    assert ours.forced_token_id == end
    ours.update([end])
    assert ours.forced_token_id is None and ours.tracker.channel == "content"


def test_bad_reasoning_configuration_names_the_field(deepseek):
    with pytest.raises(ValueError, match="reasoning_parser='nope'") as e:
        sglang_reasoning("nope", deepseek)
    assert e.value.field == "reasoning_parser"
    sp = SamplingParams(max_new_tokens=5, custom_params={"thinking_budget": 3})
    with pytest.raises(ValueError, match=r"custom_params\['thinking_budget'\]=3 needs reasoning markers") as e:
        ReqFinish(sp, vocab_size=len(deepseek), tokenizer=deepseek)
    assert e.value.field == "custom_params['thinking_budget']"
    with pytest.raises(TypeError) as e:
        ReqFinish(SamplingParams(max_new_tokens=5, custom_params={"thinking_budget": "3"}),
                  reasoning=sglang_reasoning("deepseek-r1", deepseek))
    assert e.value.field == "custom_params['thinking_budget']"


def test_custom_logit_processor_forces_the_thinking_budget(deepseek):
    """A StoplineLogitProcessor subclass with DeepSeek's marker ids (as SGLang's
    DeepSeekR1ThinkingBudgetLogitProcessor hard-codes its ids) enforces
    custom_params["thinking_budget"] through SGLang's apply_custom_logit_processor:
    the prompt ends `<think>\\n` (one thinking token, read with Req.tokenizer's
    vocabulary), so a budget of 3 forces `</think>` at the third step, then
    nothing; a request without a budget in the same batch is untouched."""
    think, end = deepseek.convert_tokens_to_ids(["<think>", "</think>"])
    budgeted = type("DeepSeekBudget", (StoplineLogitProcessor,),
                    {"reasoning_markers": {"reasoning_start_id": think, "reasoning_end_id": end}})
    serialized = budgeted.to_str()
    width = len(deepseek)
    prompt = deepseek.encode("User: hi\nAssistant: <think>\n", add_special_tokens=False)
    reqs = []
    for i, custom in enumerate([{"thinking_budget": 3}, None]):
        sp = SamplingParams(max_new_tokens=20, custom_params=custom)
        req = Req(f"budget-{i}-{random.random()}", "", array("i", prompt), sp,
                  custom_logit_processor=serialized if custom else None, vocab_size=width)
        req.tokenizer = deepseek
        reqs.append(req)
    words = deepseek.encode(" one two three four", add_special_tokens=False)
    forced = []
    for step in range(4):
        logits = torch.zeros(len(reqs), width)
        apply_custom_logit_processor(logits, FakeBatchInfo(reqs, serialized))
        assert torch.equal(logits[1], torch.zeros(width))
        row = logits[0]
        forced.append(int(row.argmax()) if torch.isinf(row).any() else None)
        for req in reqs:
            req.output_ids.append(forced[-1] if forced[-1] is not None else words[step])
    assert forced == [None, None, end, None]
    with pytest.raises(ValueError) as e:
        bad = type("Bad", (StoplineLogitProcessor,), {"reasoning_markers": {"reasoning_start_id": think}})
        sp = SamplingParams(max_new_tokens=5, custom_params={"thinking_budget": 1})
        req = Req(f"bad-{random.random()}", "", array("i", prompt), sp, custom_logit_processor=bad.to_str(),
                  vocab_size=width)
        apply_custom_logit_processor(torch.zeros(1, width), FakeBatchInfo([req], bad.to_str()))
    assert e.value.field == "reasoning_end"
