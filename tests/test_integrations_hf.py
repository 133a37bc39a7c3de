"""stopline.integrations.hf against transformers' own generation pieces.

Differential: on random rows, ``ConstraintsProcessor`` masks exactly as
transformers' ``MinNewTokensLengthLogitsProcessor`` + ``NoBadWordsLogitsProcessor``
+ ``SequenceBiasLogitsProcessor`` do, and ``FinishCriteria`` ends each row at
the step transformers' ``EosTokenCriteria`` + ``MaxLengthCriteria`` +
``StopStringCriteria`` end it. End to end: ``generate`` on the real
SmolLM2-135M-Instruct with the adapters gives the tokens ``generate`` gives
with its own ``stop_strings``/``min_new_tokens``. The deliberate differences
(docs/integrations.md) are tested as such.
"""

from __future__ import annotations

import random

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
from transformers.generation import logits_process as hf_lp  # noqa: E402
from transformers.generation import stopping_criteria as hf_sc  # noqa: E402

import stopline  # noqa: E402
from stopline.integrations.hf import ConstraintsProcessor, FinishCriteria  # noqa: E402

V = 48


def hf_processors(prompt_len, min_new, eos, bad_words, bias):
    procs = []
    if min_new:
        procs.append(hf_lp.MinNewTokensLengthLogitsProcessor(prompt_len, min_new, eos))
    if bad_words:
        procs.append(hf_lp.NoBadWordsLogitsProcessor(bad_words))
    if bias:
        procs.append(hf_lp.SequenceBiasLogitsProcessor([[[t], b] for t, b in bias.items()]))
    return procs


@pytest.mark.parametrize("seed", range(12))
def test_processor_masks_like_transformers(seed):
    """min_new_tokens, bad words (one and several tokens) and single-token bias:
    identical scores to transformers' processors at every step (transformers 5.x).
    Prompt ids come from [V-8, V) and bad-word prefixes from [0, V-8): a word
    never straddles the prompt (transformers matches into the prompt, stopline
    only the output: see test_bad_word_does_not_match_into_the_prompt)."""
    rng = random.Random(seed)
    rows = rng.randint(1, 4)
    prompt_len = rng.randint(1, 6)
    eos = [rng.randrange(V - 8)]
    min_new = rng.randint(0, 5)
    bad_words = [[rng.randrange(V - 8) for _ in range(rng.randint(1, 3))] for _ in range(rng.randint(1, 4))]
    bad_words = [w for w in bad_words if w != eos] or [[V - 9]]
    bias = {rng.randrange(V): rng.uniform(-3, 3) for _ in range(rng.randint(0, 4))}
    ours = ConstraintsProcessor(
        {"min_tokens": min_new, "stop_token_ids": eos, "bad_words": bad_words, "logit_bias": bias, "restore": "never"}
    )
    theirs = hf_processors(prompt_len, min_new, eos, bad_words, bias)
    ids = torch.randint(V - 8, V, (rows, prompt_len))
    for _ in range(10):
        scores = torch.randn(rows, V)
        expect = scores.clone()
        for p in theirs:
            expect = p(ids, expect)
        got = ours(ids, scores.clone())
        assert torch.equal(got, expect)
        assert not ours.infeasible.any()
        # Prefer bad-word prefixes so multi-token words get exercised.
        nxt = [rng.choice([w[0] for w in bad_words] + [rng.randrange(V - 8)]) for _ in range(rows)]
        ids = torch.cat([ids, torch.tensor(nxt)[:, None]], dim=1)


def test_bad_word_does_not_match_into_the_prompt():
    """Deliberate difference: a bad word's prefix is matched against output
    tokens only (as vLLM's bad_words), while transformers also matches the
    prompt's tail."""
    ours = ConstraintsProcessor({"bad_words": [[5, 6]]})
    hf = hf_lp.NoBadWordsLogitsProcessor([[5, 6]])
    ids = torch.tensor([[1, 5]])  # the prompt ends with the word's prefix
    scores = torch.zeros(1, V)
    assert hf(ids, scores.clone())[0, 6] == float("-inf")
    assert ours(ids, scores.clone())[0, 6] == 0
    ids = torch.tensor([[1, 5, 5]])  # now the output ends with it
    assert ours(ids, scores.clone())[0, 6] == float("-inf")


def test_min_tokens_restore_keeps_a_row_sampleable():
    """Deliberate difference: transformers' min_new_tokens masks EOS even when
    nothing else is allowed (the row becomes all -inf); restore="always" puts it back."""
    allowed = [3]
    ours = ConstraintsProcessor({"min_tokens": 4, "stop_token_ids": [3], "allowed_token_ids": allowed, "restore": "always"})
    scores = torch.zeros(1, V)
    out = ours(torch.tensor([[0, 1]]), scores)
    assert not ours.infeasible[0] and int(out.argmax()) == 3
    hf = hf_lp.MinNewTokensLengthLogitsProcessor(2, 4, [3])
    masked = hf(torch.tensor([[0, 1]]), torch.full((1, V), float("-inf")).index_fill_(1, torch.tensor(allowed), 0.0))
    assert torch.isinf(masked).all()


def test_processor_rows_with_and_without_multi_token_bad_words():
    """Rows keep output history only where a multi-token bad word needs it;
    each row's mask still equals transformers' for that row's constraints."""
    per_row = [{"min_tokens": 2, "stop_token_ids": [0]}, {"bad_words": [[5, 6], [7]]}]
    ours = ConstraintsProcessor(per_row)
    theirs = [hf_processors(1, 2, [0], None, None), hf_processors(1, 0, [0], [[5, 6], [7]], None)]
    ids = torch.tensor([[1], [1]])
    for nxt in ([5, 5], [6, 5], [2, 3]):
        scores = torch.randn(2, V)
        got = ours(ids, scores.clone())
        for row in range(2):
            expect = scores[row:row + 1].clone()
            for p in theirs[row]:
                expect = p(ids[row:row + 1], expect)
            assert torch.equal(got[row:row + 1], expect), (row, nxt)
        ids = torch.cat([ids, torch.tensor(nxt)[:, None]], dim=1)


def test_processor_refuses_reordered_rows():
    ours = ConstraintsProcessor({"min_tokens": 1, "stop_token_ids": [0]})
    ours(torch.tensor([[1, 2], [3, 4]]), torch.zeros(2, V))
    with pytest.raises(ValueError, match="reordered"):
        ours(torch.tensor([[3, 4, 7], [1, 2, 7]]), torch.zeros(2, V))
    with pytest.raises(ValueError, match="rows"):
        ours(torch.tensor([[3, 4, 7]]), torch.zeros(1, V))


def test_processor_bad_constraints_name_the_field():
    with pytest.raises(ValueError, match="bad_words|vocab"):
        ConstraintsProcessor({"bad_words": [[V + 5]]})(torch.tensor([[1]]), torch.zeros(1, V))
    with pytest.raises(ValueError, match="constraints has 1 entries but the batch has 2 rows"):
        ConstraintsProcessor([{}])(torch.tensor([[1], [2]]), torch.zeros(2, V))
    with pytest.raises(TypeError, match="constraints"):
        ConstraintsProcessor("min_tokens=3")


# --- FinishCriteria -------------------------------------------------------

@pytest.fixture(scope="module")
def tok():
    from stopline.tools.models import load_smollm2_tokenizer

    return load_smollm2_tokenizer()


WORDS = ["the", " cat", " sat", ".", " on", " a", " mat", "\n", " END", " Stop", "!", " stop", "ping", " it"]


def hf_stop_step(tok, prompt, rows_ids, eos, max_new, stops):
    """The 0-based output position at which transformers' criteria end each row (None: never)."""
    crit = hf_sc.StoppingCriteriaList(
        [hf_sc.EosTokenCriteria(eos), hf_sc.MaxLengthCriteria(len(prompt) + max_new)]
        + ([hf_sc.StopStringCriteria(tok, stops)] if stops else [])
    )
    ends = [None] * len(rows_ids)
    for n in range(1, len(rows_ids[0]) + 1):
        ids = torch.tensor([prompt + r[:n] for r in rows_ids])
        done = crit(ids, None)
        for i, d in enumerate(done.tolist()):
            if d and ends[i] is None:
                ends[i] = n - 1
    return ends


@pytest.fixture(params=["core", "decodestream"])
def decoding(request, monkeypatch):
    """Both ways FinishCriteria decodes: the core (the tokenizer's Vocabulary)
    and the DecodeStream fallback it takes for a decoder the core refuses
    (forced here by a vocabulary_for that finds none)."""
    if request.param == "decodestream":
        from stopline.integrations import hf

        monkeypatch.setattr(hf, "vocabulary_for", lambda tokenizer: None)
    return request.param


@pytest.mark.parametrize("seed", range(10))
def test_criteria_end_rows_where_transformers_does(tok, seed, decoding):
    """Each row ends at the step where transformers' EOS, max-length and stop-string
    criteria end it (transformers 5.x; ASCII text, one token per step), whether
    the core or the DecodeStream fallback decodes."""
    rng = random.Random(seed)
    stops = rng.sample([".", " mat", "Stop!", "ping it", "\n END", "cat sat"], rng.randint(0, 3))
    eos = 2
    max_new = rng.randint(3, 30)
    prompt = tok.encode("A prompt: ")
    rows_ids = []
    for _ in range(rng.randint(1, 3)):
        text = "".join(rng.choice(WORDS) for _ in range(40))
        ids = tok.encode(text)[:30]
        if rng.random() < 0.3:
            ids[rng.randrange(len(ids))] = eos
        rows_ids.append(ids)
    width = min(len(r) for r in rows_ids)
    rows_ids = [r[:width] for r in rows_ids]
    expect = hf_stop_step(tok, prompt, rows_ids, eos, max_new, stops)

    crit = FinishCriteria(tok, stopline.StopParams(max_tokens=max_new, eos_token_ids=[eos], stop=stops))
    assert crit.decodes_in_core == (decoding == "core")
    got = [None] * len(rows_ids)
    for n in range(1, width + 1):
        done = crit(torch.tensor([prompt + r[:n] for r in rows_ids]), None)
        for i, d in enumerate(done.tolist()):
            if d and got[i] is None:
                got[i] = n - 1
    assert got == expect
    for i, res in enumerate(crit.results()):
        assert res.finished == (got[i] is not None)
        if res.finish_reason == "stop" and isinstance(res.stop_reason, str):
            decoded = tok.decode(rows_ids[i][: got[i] + 1])
            assert crit.texts()[i] == decoded[: decoded.index(res.stop_reason)]


def test_criteria_steps_ids_through_the_core(tok):
    """A ByteLevel tokenizer (SmolLM2) is decoded by the core: one FinishBatch
    step per call with the ids only, built once per tokenizer; the kept text
    equals tokenizers' decode, and a speculative run of three ids gives what
    three one-id calls give."""
    from stopline.integrations.hf import vocabulary_for

    vocab = vocabulary_for(tok)
    assert isinstance(vocab, stopline.Vocabulary) and vocabulary_for(tok) is vocab
    prompt = tok.encode("Hi: ")
    out = tok.encode(" the cat sat on a mat, then it ran. The end")
    params = stopline.StopParams(stop=[" ran"], max_tokens=50)
    one, run = FinishCriteria(tok, params), FinishCriteria(tok, params)
    assert one.decodes_in_core and run.decodes_in_core
    for n in range(1, len(out) + 1):
        one(torch.tensor([prompt + out[:n]]), None)
    for n in range(1, len(out) + 1, 3):
        run(torch.tensor([prompt + out[:n]]), None)
    run(torch.tensor([prompt + out]), None)
    decoded = tok.decode(out)
    expect = decoded[: decoded.index(" ran")]
    assert one.texts() == run.texts() == [expect]
    assert one.results()[0].stop_reason == run.results()[0].stop_reason == " ran"


def test_unsupported_decoder_falls_back_to_decodestream():
    """A decoder the core refuses (here BPEDecoder) is decoded with tokenizers'
    DecodeStream: the criteria still stop on the text tokenizers decodes."""
    from tokenizers import Tokenizer, decoders, models

    words = ["a</w>", "b</w>", "st", "op</w>", "<unk>"]
    bpe = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    bpe.decoder = decoders.BPEDecoder()
    with pytest.raises(ValueError, match="unsupported decoder BPEDecoder"):
        stopline.Vocabulary.from_str(bpe.to_str())
    crit = FinishCriteria(bpe, stopline.StopParams(stop=["stop"], max_tokens=10))
    assert not crit.decodes_in_core
    out = [0, 1, 2, 3, 0]
    ends = [bool(crit(torch.tensor([[4] + out[:n]]), None)[0]) for n in range(1, len(out) + 1)]
    assert ends == [False, False, False, True, True]
    assert crit.texts() == ["a b "] and bpe.decode(out[:4]) == "a b stop"


@pytest.mark.parametrize("cap", [2, 3])
def test_length_cap_inside_a_character_keeps_u_fffd(tok, decoding, cap):
    """semantics.md 10.3: a row that reaches max_tokens with a character half
    finished keeps it as U+FFFD, so its text equals tokenizers' decode of the
    kept ids; the same with the DecodeStream fallback."""
    out = tok.encode("a \U0001F389 b")  # the emoji takes three byte-level tokens
    crit = FinishCriteria(tok, stopline.StopParams(max_tokens=cap))
    for n in range(1, cap + 1):
        done = crit(torch.tensor([[1] + out[:n]]), None)
    assert bool(done[0]) and crit.results()[0].finish_reason == "length"
    assert crit.texts() == [tok.decode(out[:cap])] and crit.texts()[0].endswith("\ufffd")


def test_stop_string_starting_in_the_prompt_does_not_stop(tok, decoding):
    """Deliberate difference (docs/integrations.md): stop strings match the
    output only, as vLLM; transformers' StopStringCriteria also sees the
    prompt's tail, so a stop string the prompt starts stops its row there."""
    prompt, out = tok.encode("Say ST"), tok.encode("OP now")
    ids = torch.tensor([prompt + out[:1]])
    assert tok.decode(ids[0].tolist()).endswith("STOP")
    assert bool(hf_sc.StopStringCriteria(tok, ["STOP"])(ids, None)[0])
    crit = FinishCriteria(tok, stopline.StopParams(stop=["STOP"], max_tokens=10))
    assert not bool(crit(ids, None)[0]) and crit.texts() == [tok.decode(out[:1])]


def test_criteria_refuses_reordered_rows(tok):
    crit = FinishCriteria(tok, stopline.StopParams(max_tokens=10))
    crit(torch.tensor([[5, 6, 7], [5, 6, 8]]), None)
    with pytest.raises(ValueError, match="reordered"):
        crit(torch.tensor([[5, 6, 8, 1], [5, 6, 7, 1]]), None)


def test_criteria_bad_arguments(tok):
    with pytest.raises(TypeError, match="tokenizer"):
        FinishCriteria(object(), stopline.StopParams())
    with pytest.raises(ValueError, match="params has 1 entries but the batch has 2 rows"):
        FinishCriteria(tok, [stopline.StopParams()])(torch.tensor([[1, 2], [3, 4]]), None)
    with pytest.raises(ValueError, match="prompt_len"):
        FinishCriteria(tok, stopline.StopParams(), prompt_len=-1)
    # A wrong type is a TypeError naming prompt_len (it was a ValueError).
    for bad in ("5", 5.0, True):
        with pytest.raises(TypeError, match="prompt_len must be an int") as e:
            FinishCriteria(tok, stopline.StopParams(), prompt_len=bad)
        assert e.value.field == "prompt_len"
    with pytest.raises(TypeError, match="vocabulary must be a stopline.Vocabulary, got str"):
        FinishCriteria(tok, stopline.StopParams(), vocabulary="tokenizer.json")


# --- generate end to end ---------------------------------------------------

@pytest.fixture(scope="module")
def lm():
    from stopline.tools import models

    torch.manual_seed(0)
    return models.load_smollm2(device="cpu")


def test_generate_with_adapters_equals_generate_with_its_own(lm):
    """Greedy generate on SmolLM2 (transformers 5.x): stopline's criteria and
    processor give the tokens that generate's own stop_strings and
    min_new_tokens give, and report the stop string with the text cut before it.
    Deliberate difference: a stop string that completes below min_tokens does
    not stop the row (as vLLM's check_stop), while transformers' StopStringCriteria
    ignores min_new_tokens."""
    hf_tok = lm.hf_tokenizer
    prompts = [lm.chat_prompt("What is the capital of France?"), lm.chat_prompt("Name three colors.")]
    width = max(map(len, prompts))
    pad = hf_tok.pad_token_id if hf_tok.pad_token_id is not None else lm.eos_token_ids[0]
    ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    common = dict(attention_mask=mask, max_new_tokens=30, do_sample=False, pad_token_id=pad)
    free = lm.model.generate(ids, **common)
    first = [hf_tok.decode(t) for t in free[0, width:].tolist()]
    stop_at = 3  # the fourth output token's text, stripped, is the stop string
    stops = [first[stop_at].strip()]
    assert stops[0] and stops[0] not in "".join(first[:stop_at]), first
    eos = lm.eos_token_ids

    def run(min_new):
        theirs = lm.model.generate(ids, stop_strings=stops, tokenizer=hf_tok, min_new_tokens=min_new, **common)
        crit = FinishCriteria(hf_tok, stopline.StopParams(eos_token_ids=eos, stop=stops, min_tokens=min_new, max_tokens=30))
        proc = ConstraintsProcessor({"min_tokens": min_new, "stop_token_ids": eos})
        ours = lm.model.generate(
            ids,
            stopping_criteria=transformers.StoppingCriteriaList([crit]),
            logits_processor=transformers.LogitsProcessorList([proc]),
            **common,
        )
        return theirs, ours, crit

    theirs, ours, crit = run(min_new=2)
    assert torch.equal(ours, theirs)
    res = crit.results()[0]
    assert (res.finish_reason, res.stop_reason, res.num_tokens) == ("stop", stops[0], stop_at + 1)
    text = hf_tok.decode(ours[0, width:], skip_special_tokens=True)
    assert crit.texts()[0] == text[: text.index(stops[0])]

    theirs, ours, crit = run(min_new=stop_at + 2)
    assert crit.results()[0].num_tokens > stop_at + 1
    assert (ours[0, width + stop_at + 1:] != pad).any() and (theirs[0, width + stop_at + 1:] == pad).all()


def test_docs_example_runs(lm, monkeypatch):
    """The HF example in docs/integrations.md runs as written, with public
    imports only, on the local copy of SmolLM2 the model tests use (MODEL)."""
    from doc_blocks import ROOT, run_python_blocks

    page = (ROOT / "docs/integrations.md").read_text(encoding="utf-8")
    block = page[page.index("## HF transformers"):]
    block = block[block.index("```python"):]
    block = block[: block.index("```", 3)]
    assert "stopline.tools" not in block and "import stopline._" not in block
    monkeypatch.setenv("MODEL", lm.model.name_or_path)
    run_python_blocks("docs/integrations.md", "integrations.hf")


def test_adapter_errors_carry_field_and_kind(tok):
    """Issue 24: the HF adapters' argument errors are the core's classes
    with ``field`` and ``kind``; the messages are unchanged."""
    with pytest.raises(TypeError, match="constraints must be a mapping") as info:
        ConstraintsProcessor("min_tokens=3")
    assert (type(info.value), info.value.field, info.value.kind) == (stopline.StoplineTypeError, "constraints", "wrong_type")
    with pytest.raises(ValueError, match="constraints has 1 entries but the batch has 2 rows") as info:
        ConstraintsProcessor([{}])(torch.tensor([[1], [2]]), torch.zeros(2, V))
    assert (type(info.value), info.value.field, info.value.kind) == (stopline.StoplineValueError, "constraints", "count")
    with pytest.raises(TypeError, match="vocabulary must be a stopline.Vocabulary, got str") as info:
        FinishCriteria(tok, stopline.StopParams(), vocabulary="tokenizer.json")
    assert (type(info.value), info.value.field, info.value.kind) == (stopline.StoplineTypeError, "vocabulary", "wrong_type")
    crit = FinishCriteria(tok, stopline.StopParams(max_tokens=10))
    crit(torch.tensor([[5, 6, 7], [5, 6, 8]]), None)
    with pytest.raises(ValueError, match="reordered") as info:
        crit(torch.tensor([[5, 6, 8, 1], [5, 6, 7, 1]]), None)
    assert (type(info.value), info.value.field, info.value.kind) == (stopline.StoplineValueError, "input_ids", "invalid")


# --- reasoning channels (issue 21; semantics.md 11) -------------------------

THINK = dict(reasoning_start="<think>", reasoning_end="</think>")


def test_criteria_stop_strings_apply_to_content_only(tok, decoding):
    """A stop string met inside <think>...</think> does not end the row
    (vllm#52393); the same string in the content does. The split is reported
    per row, markers excluded, with the core decoding and with the
    DecodeStream fallback."""
    prompt = tok.encode("Q: ")
    out = tok.encode("<think>\nplan: STOP here</think>The answer STOP tail")
    crit = FinishCriteria(tok, stopline.StopParams(stop=["STOP"], max_tokens=50, **THINK))
    ends = [bool(crit(torch.tensor([prompt + out[:n]]), None)[0]) for n in range(1, len(out) + 1)]
    res = crit.results()[0]
    assert (res.finish_reason, res.stop_reason, res.channel) == ("stop", "STOP", "content")
    assert ends.index(True) == len(tok.encode("<think>\nplan: STOP here</think>The answer STOP")) - 1
    assert crit.reasoning_texts() == ["\nplan: STOP here"]
    assert crit.content_texts() == ["The answer "]
    assert crit.texts() == ["<think>\nplan: STOP here</think>The answer "]


def test_criteria_prompt_opened_thinking_and_a_row_without_markers(tok):
    """A prompt that ends inside <think> (a forced thinking prefix, as Qwen3's
    and DeepSeek-R1's templates leave it) starts the row in reasoning; in the
    same batch a row without markers is all content and its stop fires."""
    prompt = tok.encode("Q: 2+2?\n<think>")
    out = tok.encode("\nfour, so 4</think>\n4")
    params = [stopline.StopParams(stop=["4"], max_tokens=50, **THINK), stopline.StopParams(stop=["4"], max_tokens=50)]
    crit = FinishCriteria(tok, params)
    for n in range(1, len(out) + 1):
        crit(torch.tensor([prompt + out[:n]] * 2), None)
    first, second = crit.results()
    assert (first.finish_reason, first.channel) == ("stop", "content")
    assert (second.finish_reason, second.channel) == ("stop", None)
    assert crit.reasoning_texts() == ["\nfour, so 4", ""]
    assert crit.content_texts() == ["\n", "\nfour, so "] == [crit.texts()[0][len("\nfour, so 4</think>"):], crit.texts()[1]]


def test_thinking_budget_forces_the_end_marker_through_the_processor(tok):
    """max_reasoning_tokens: once the budget is spent the criteria name the
    end marker's ids, one per step (as vLLM's thinking_token_budget), and
    ConstraintsProcessor(finish=...) leaves each forced row only that id; a
    row without a budget is not touched. Driven like generate: processor,
    argmax, append, criteria."""
    end = tok.encode("</think>")
    assert len(end) > 1  # a text marker of several tokens: forced over several steps
    budget = 3
    params = [
        stopline.StopParams(max_tokens=20, max_reasoning_tokens=budget, reasoning_end_ids=end, reasoning_starts_in="reasoning", **THINK),
        stopline.StopParams(max_tokens=20),
    ]
    crit = FinishCriteria(tok, params)
    proc = ConstraintsProcessor({}, finish=crit)
    vocab = len(tok)
    rng = torch.Generator().manual_seed(0)
    ids = torch.tensor([[5, 6], [5, 6]])
    for _ in range(budget + len(end) + 2):
        scores = proc(ids, torch.randn(2, vocab, generator=rng))
        ids = torch.cat([ids, scores.argmax(dim=1, keepdim=True)], dim=1)
        crit(ids, None)
    row0 = ids[0, 2:].tolist()
    assert row0[budget:budget + len(end)] == end
    assert end != ids[1, 2 + budget:2 + budget + len(end)].tolist()
    assert crit.results()[0].channel == "content" and crit.forced_token_ids() == {}
    assert crit.reasoning_texts()[0] == tok.decode(row0[:budget])
    assert crit.content_texts()[0] == tok.decode(row0[budget + len(end):])


def test_thinking_budget_counts_the_prompt_and_forces_from_the_first_step(tok):
    """As vLLM's thinking_token_budget: a prompt that ends inside <think> counts
    its tokens after the marker, so a budget the prompt already spent forces
    the end marker at the first generated token; the processor, which generate
    calls before the criteria, starts them on the prompt."""
    end = tok.encode("</think>")
    prompt = tok.encode("Q?<think> one two")  # two tokens after the marker: the budget is spent
    params = stopline.StopParams(max_tokens=20, max_reasoning_tokens=2, reasoning_end_ids=end, **THINK)
    crit = FinishCriteria(tok, params)
    proc = ConstraintsProcessor({}, finish=crit)
    ids = torch.tensor([prompt])
    for _ in range(len(end) + 1):
        scores = proc(ids, torch.zeros(1, len(tok)))
        ids = torch.cat([ids, scores.argmax(dim=1, keepdim=True)], dim=1)
        crit(ids, None)
    assert ids[0, len(prompt):len(prompt) + len(end)].tolist() == end
    assert crit.results()[0].channel == "content" and crit.reasoning_texts() == [""]


def test_processor_finish_must_be_finish_criteria():
    with pytest.raises(TypeError, match="finish must be the FinishCriteria of the same generate call, got dict") as info:
        ConstraintsProcessor({}, finish={})
    assert (info.value.field, info.value.kind) == ("finish", "wrong_type")


@pytest.fixture(scope="module")
def thinking_prompt(lm):
    """A chat prompt with a forced thinking prefix: SmolLM2 has no think
    tokens, so the template's generation prompt is followed by the text
    marker, and the model goes on inside the block."""
    return lm.chat_prompt("What is 7 times 8? Think step by step.") + lm.hf_tokenizer.encode("<think>")


def generate_rows(lm, prompt, params, *, budget_processor=False, max_new=40):
    crit = FinishCriteria(lm.hf_tokenizer, params)
    procs = [ConstraintsProcessor({}, finish=crit)] if budget_processor else []
    ids = torch.tensor([prompt] * len(params))
    out = lm.model.generate(
        ids,
        attention_mask=torch.ones_like(ids),
        max_new_tokens=max_new,
        do_sample=False,
        pad_token_id=lm.eos_token_ids[0],
        stopping_criteria=transformers.StoppingCriteriaList([crit]),
        logits_processor=transformers.LogitsProcessorList(procs),
    )
    return crit, out[:, len(prompt):].tolist()


def test_generate_stop_inside_thinking_does_not_fire(lm, thinking_prompt):
    """vllm#52393 on the real SmolLM2 with generate: the row with reasoning
    markers thinks past "Step 2" (the stop string is content-scoped) and ends
    at max_tokens inside the block: finish_reason "length", channel
    "reasoning", empty content, the whole output as reasoning. The row without
    markers, same prompt and stop, stops at "Step 2"."""
    hf_tok = lm.hf_tokenizer
    eos = lm.eos_token_ids
    params = [
        stopline.StopParams(eos_token_ids=eos, stop=["Step 2"], max_tokens=30, **THINK),
        stopline.StopParams(eos_token_ids=eos, stop=["Step 2"], max_tokens=30),
    ]
    crit, outs = generate_rows(lm, thinking_prompt, params)
    thinking, plain = crit.results()
    assert (thinking.finish_reason, thinking.channel, thinking.num_tokens) == ("length", "reasoning", 30)
    assert "Step 2" in crit.reasoning_texts()[0] and crit.content_texts()[0] == ""
    assert crit.reasoning_texts()[0] == hf_tok.decode(outs[0][:30])
    assert (plain.finish_reason, plain.stop_reason, plain.channel) == ("stop", "Step 2", None)
    assert crit.content_texts()[1] == crit.texts()[1] == hf_tok.decode(outs[1])[: hf_tok.decode(outs[1]).index("Step 2")]


def test_generate_thinking_budget_then_content_stop(lm, thinking_prompt):
    """max_reasoning_tokens=12 on the real SmolLM2 with generate: the first 12
    tokens are what free greedy decoding thinks, then ConstraintsProcessor
    forces "</think>" (three tokens, one per step); the model answers in the
    content, where the content-scoped stop string fires."""
    hf_tok = lm.hf_tokenizer
    eos = lm.eos_token_ids
    end = hf_tok.encode("</think>")
    budget = 12
    free = generate_rows(lm, thinking_prompt, [stopline.StopParams(max_tokens=40, **THINK)])[1][0]
    params = [stopline.StopParams(eos_token_ids=eos, stop=["Step 2"], max_tokens=40, max_reasoning_tokens=budget,
                                  reasoning_end_ids=end, **THINK)]
    crit, outs = generate_rows(lm, thinking_prompt, params, budget_processor=True)
    out = outs[0]
    assert out[:budget] == free[:budget] and free[budget:budget + len(end)] != end
    assert out[budget:budget + len(end)] == end
    res = crit.results()[0]
    assert (res.finish_reason, res.stop_reason, res.channel) == ("stop", "Step 2", "content")
    assert crit.reasoning_texts() == [hf_tok.decode(out[:budget])]
    content = hf_tok.decode(out[budget + len(end):])
    assert crit.content_texts() == [content[: content.index("Step 2")]] and crit.content_texts()[0]
