"""stopline.integrations.vllm against vLLM's own V1 sampling steps.

Runs only where vLLM is importable (``pip install '.[vllm]'``; see
docs/integrations.md for the command); skipped otherwise. On random persistent
batches (requests added, removed, moved and swapped; outputs growing each
step) the adapter's logits equal what vLLM 0.33's own path produces: the
allowed-token mask, ``apply_bad_words``, ``MinTokensLogitsProcessor`` (with its
structured-output restore) and ``LogitBiasLogitsProcessor``, in the sampler's
order.
"""

from __future__ import annotations

import random
from types import SimpleNamespace

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("vllm", reason="vLLM is not installed (pip install '.[vllm]')")
from conftest import ENGINE_VERSION_SKIP  # noqa: E402
from vllm import SamplingParams  # noqa: E402
from vllm.sampling_params import StructuredOutputsParams  # noqa: E402
from vllm.v1.worker.gpu.sample.logits_processor.interface import LogitsContext, LogitsProcRequestState  # noqa: E402
from vllm.v1.worker.gpu.sample.logits_processor.interface import LogitsProcessor as V2LogitsProcessor  # noqa: E402

from stopline.integrations.vllm import (  # noqa: E402
    HAS_V1_RUNNER,
    VLLM_VERSION,
    StoplineBuiltinsProcessor,
    StoplineLogitsProcessor,
)

if HAS_V1_RUNNER:  # vLLM 0.33: the V1 runner's interface and its own steps, the reference below
    from vllm.v1.sample.logits_processor import BatchUpdate, MoveDirectionality
    from vllm.v1.sample.logits_processor.builtin import LogitBiasLogitsProcessor, MinTokensLogitsProcessor
    from vllm.v1.sample.ops.bad_words import apply_bad_words
    from vllm.v1.sample.thinking_budget_state import ThinkingBudgetStateHolder

#: Tests of the V1 runner's path (vLLM 0.33; 0.34 has only the V2 runner).
needs_v1 = pytest.mark.skipif(not HAS_V1_RUNNER, reason=f"{ENGINE_VERSION_SKIP}vLLM {VLLM_VERSION} has no V1 runner")

if not torch.cuda.is_available():
    # vLLM's CUDA build assumes pinned host memory, which needs a driver.
    import vllm.utils.torch_utils as _vllm_torch_utils

    _vllm_torch_utils.PIN_MEMORY = False

V = 40
MAX_SEQS = 6


def config():
    return SimpleNamespace(
        scheduler_config=SimpleNamespace(max_num_seqs=MAX_SEQS),
        model_config=SimpleNamespace(get_vocab_size=lambda: V),
    )


def random_params(rng):
    kw = {}
    stop_ids = rng.sample(range(V), rng.randint(1, 2))
    if rng.random() < 0.7:
        kw["min_tokens"] = rng.randint(1, 6)
        kw["stop_token_ids"] = stop_ids
    if rng.random() < 0.4:
        kw["logit_bias"] = {rng.randrange(V): rng.uniform(-4, 4) for _ in range(rng.randint(1, 3))}
    if rng.random() < 0.25:
        # Sometimes only the stop ids are allowed: the row is empty below min_tokens.
        kw["allowed_token_ids"] = stop_ids if rng.random() < 0.5 else rng.sample(range(V), 5)
    if rng.random() < 0.3:
        kw["structured_outputs"] = StructuredOutputsParams(json={"type": "boolean"})
    params = SamplingParams(**kw)
    if rng.random() < 0.5:
        params._bad_words_token_ids = [
            [rng.randrange(V) for _ in range(rng.randint(1, 3))] for _ in range(rng.randint(1, 3))
        ]
    return params


def vllm_reference(logits, rows):
    """vLLM's sampler order: allowed mask, bad words, then the built-in logits processors."""
    for i, (params, _out) in rows.items():
        if params.allowed_token_ids:
            keep = torch.zeros(V, dtype=torch.bool)
            keep[params.allowed_token_ids] = True
            logits[i].masked_fill_(~keep, float("-inf"))
    bad = {i: p.bad_words_token_ids for i, (p, _) in rows.items() if p.bad_words_token_ids}
    if bad:
        past = [rows[i][1] if i in rows else [] for i in range(logits.shape[0])]
        apply_bad_words(logits, bad, past)
    return logits


def fill_placeholders(out, real):
    """vLLM 0.33's ``InputBatch.update_async_output_token_ids`` for one request: the
    trailing ``-1`` placeholders become the sampled ids (fewer ids shorten the list)."""
    first = len(out)
    while first > 0 and out[first - 1] == -1:
        first -= 1
    out[first:] = real[: len(out) - first]


@needs_v1
@pytest.mark.parametrize("mode", ["sync", "async"])
@pytest.mark.parametrize("seed", range(25))
def test_persistent_batch_matches_vllm(seed, mode):
    """``async``: vLLM's default async scheduling. The model runner appends a ``-1``
    placeholder per sampled token; the processors' ``update_state`` sees it, and the
    sampler fills it in before it calls ``apply``."""
    rng = random.Random(seed)
    pending: list[tuple[list[int], list[int]]] = []
    cfg = config()
    ours = StoplineBuiltinsProcessor(cfg, torch.device("cpu"), False)
    mins = MinTokensLogitsProcessor(cfg, torch.device("cpu"), False)
    bias = LogitBiasLogitsProcessor(cfg, torch.device("cpu"), False)
    rows: dict[int, tuple[SamplingParams, list[int]]] = {}
    for _ in range(30):
        removed, added, moved = [], [], []
        for i in list(rows):
            if rng.random() < 0.15:
                removed.append(i)
                del rows[i]
        for _ in range(rng.randint(0, 2)):
            free = [i for i in range(MAX_SEQS) if i not in rows]
            if free:
                i = rng.choice(free)
                params, out = random_params(rng), [rng.randrange(V) for _ in range(rng.randint(0, 2))]
                rows[i] = (params, out)
                added.append((i, params, [1, 2, 3], out))
                if i in removed:  # vLLM reuses a freed index this way (BatchUpdateBuilder.pop_removed)
                    removed.remove(i)
        if len(rows) >= 1 and rng.random() < 0.4:
            a = rng.choice(list(rows))
            b = rng.randrange(MAX_SEQS)
            if b != a:
                if b in rows and rng.random() < 0.5:
                    rows[a], rows[b] = rows[b], rows[a]
                    moved.append((a, b, MoveDirectionality.SWAP))
                elif b not in rows:
                    rows[b] = rows.pop(a)
                    moved.append((a, b, MoveDirectionality.UNIDIRECTIONAL))
        size = max(rows, default=-1) + 1
        update = BatchUpdate(batch_size=size, removed=removed, added=added, moved=moved) if (removed or added or moved) else None
        for proc in (ours, mins, bias):
            proc.update_state(update)
        for out, real in pending:
            fill_placeholders(out, real)
        pending.clear()
        if size:
            logits = torch.randn(size, V)
            expect = vllm_reference(logits.clone(), rows)
            expect = bias.apply(mins.apply(expect))
            got = ours.apply(logits.clone())
            if not torch.equal(got, expect):
                diff = (got != expect).nonzero().tolist()
                detail = {r: (rows[r][0].min_tokens, sorted(rows[r][0].all_stop_token_ids), rows[r][0].allowed_token_ids,
                              rows[r][0].bad_words_token_ids, rows[r][0].logit_bias, rows[r][1]) for r in rows}
                raise AssertionError((diff[:6], [(got[r, c].item(), expect[r, c].item()) for r, c in diff[:6]], detail))
        for _, out in rows.values():
            if mode == "sync":
                out.append(rng.randrange(V))  # the step's sampled token, seen through the live list
            else:
                out.append(-1)
                pending.append((out, [rng.randrange(V)]))


@needs_v1
@pytest.mark.parametrize("seed", range(10))
def test_placeholders_and_dropped_tokens_feed_as_the_settled_list(seed):
    """Async scheduling with speculative decoding: the runner appends optimistic
    placeholders, some left unfilled (fewer ids accepted shorten the list) or still
    unfilled when ``apply`` runs, and a KV-load failure drops output tokens already fed.
    Each step the processor masks as one built afresh on the list as it then stands
    (an unfilled placeholder counts in the position, not in the bad-word history)."""
    rng = random.Random(seed)
    cfg = config()
    ours = StoplineBuiltinsProcessor(cfg, torch.device("cpu"), False)
    params = [random_params(rng) for _ in range(3)]
    for p in params:
        p._bad_words_token_ids = [[1, 2], [3]]
    outs: list[list[int]] = [[rng.randrange(V) for _ in range(rng.randint(0, 2))] for _ in params]
    added = [(i, p, [9, 9], out) for i, (p, out) in enumerate(zip(params, outs))]
    ours.update_state(BatchUpdate(batch_size=len(params), removed=[], added=added, moved=[]))
    for _ in range(25):
        for out in outs:
            u = rng.random()
            if u < 0.15 and out:
                del out[rng.randrange(len(out)):]  # tokens dropped after a KV-load failure
            elif u < 0.85:
                k = rng.randint(1, 3)
                out.extend([-1] * k)
                # Fewer ids accepted than placeholders (the list shortens); sometimes none filled yet.
                if rng.random() < 0.8:
                    fill_placeholders(out, [rng.choice([1, 2, 3, rng.randrange(V)]) for _ in range(rng.randint(1, k))])
        ours.update_state(None)
        logits = torch.randn(len(params), V)
        got = ours.apply(logits.clone())
        fresh = StoplineBuiltinsProcessor(config(), torch.device("cpu"), False)
        settled = [[t for t in out if t != -1] for out in outs]
        fresh.update_state(BatchUpdate(batch_size=len(params), removed=[], moved=[],
                                       added=[(i, p, [9, 9], list(s)) for i, (p, s) in enumerate(zip(params, settled))]))
        # The fresh one sees no placeholders: give it the same positions by padding with
        # ids that end no bad word.
        for i, out in enumerate(outs):
            fresh._outputs[fresh._row_slot[i]].extend([0] * (len(out) - len(settled[i])))
        want = fresh.apply(logits.clone())
        assert torch.equal(got, want), (outs, settled)


@needs_v1
def test_extra_args_processor_equals_builtins_processor():
    """extra_args["stopline"] carries the same constraints; requests without it are untouched."""
    rng = random.Random(7)
    cfg = config()
    by_fields = StoplineBuiltinsProcessor(cfg, torch.device("cpu"), False)
    by_extra = StoplineLogitsProcessor(cfg, torch.device("cpu"), False)
    from stopline.integrations.vllm import constraints_from_params

    added_f, added_e = [], []
    for i in range(MAX_SEQS):
        p = random_params(rng)
        out = [rng.randrange(V) for _ in range(3)]
        added_f.append((i, p, [1], out))
        kw = constraints_from_params(p) if i % 2 == 0 else None
        added_e.append((i, SamplingParams(extra_args={"stopline": kw} if kw else None), [1], out))
    by_fields.update_state(BatchUpdate(batch_size=MAX_SEQS, removed=[], added=added_f, moved=[]))
    by_extra.update_state(BatchUpdate(batch_size=MAX_SEQS, removed=[], added=added_e, moved=[]))
    logits = torch.randn(MAX_SEQS, V)
    a, b = by_fields.apply(logits.clone()), by_extra.apply(logits.clone())
    for i in range(MAX_SEQS):
        assert torch.equal(b[i], a[i] if i % 2 == 0 else logits[i])


def test_validate_params_names_the_field():
    bad = SamplingParams(extra_args={"stopline": {"logit_bias": {3: float("nan")}}})
    with pytest.raises(ValueError, match="logit_bias"):
        StoplineLogitsProcessor.validate_params(bad)
    with pytest.raises(ValueError, match="unknown keys"):
        StoplineLogitsProcessor.validate_params(SamplingParams(extra_args={"stopline": {"min_token": 2}}))
    with pytest.raises(ValueError, match="logit_bias"):
        StoplineBuiltinsProcessor.validate_params(SamplingParams(logit_bias={3: float("nan")}))
    StoplineLogitsProcessor.validate_params(SamplingParams(min_tokens=2))


def test_an_id_past_the_vocabulary_never_fails_the_engine_step():
    """vLLM treats an exception in the engine step as fatal to the whole engine, and admission
    cannot see the model's vocabulary. An id at or past it names no column, so a stop id, a
    biased id or a bad word holding one is dropped (nothing the model can sample changes); an
    allowed_token_ids with no id inside the vocabulary is ended at its next token (forced to
    its stop id) with an error logged. Both runners' paths; the other rows are untouched."""
    bias = SamplingParams(logit_bias={V + 3: 1.0, 2: 1.5}, stop_token_ids=[V + 9])
    words = SamplingParams(extra_args={"stopline": {"bad_words": [[1, V + 1]], "logit_bias": {V: 2.0, 4: 1.0}}})
    nothing = SamplingParams(stop_token_ids=[5], extra_args={"stopline": {"allowed_token_ids": [V, V + 1]}})
    logits = torch.randn(3, V)
    expect = logits.clone()
    expect[0, 4] += 1.0  # the extra_args request: its one biased id inside the vocabulary
    expect[2] = float("-inf")
    expect[2, 5] = logits[2, 5]  # ended: forced to its stop id
    v2 = StoplineLogitsProcessor(config(), v2_req_states())
    for slot, params in enumerate((words, SamplingParams(), nothing)):
        v2.add_request(slot, params)
    idx = torch.tensor([0, 1, 2], dtype=torch.int32)
    ctx = LogitsContext(expanded_idx_mapping=idx, idx_mapping=idx, idx_mapping_np=np.arange(3),
                        expanded_local_pos=torch.zeros(3, dtype=torch.int32), input_ids=torch.zeros(3, dtype=torch.int32),
                        pos=torch.zeros(3, dtype=torch.int64), seq_lens_upper_bound_np=None)
    assert torch.equal(v2.apply(logits.clone(), ctx), expect)
    if HAS_V1_RUNNER:
        ours = StoplineBuiltinsProcessor(config(), torch.device("cpu"), False)
        ours.update_state(BatchUpdate(batch_size=1, removed=[], added=[(0, bias, [1], [])], moved=[]))
        got = ours.apply(logits[:1].clone())
        assert torch.equal(got[0, 2], logits[0, 2] + 1.5) and torch.equal(got[0, 3:], logits[0, 3:])
        # The slot pool is intact: a valid request still fits every slot.
        added = [(i, SamplingParams(min_tokens=1, stop_token_ids=[1]), [1], []) for i in range(MAX_SEQS)]
        ours.update_state(BatchUpdate(batch_size=MAX_SEQS, removed=[], added=added, moved=[]))


# --- RequestStop against vLLM's check_stop ---------------------------------

from vllm.v1.core.sched.utils import check_stop  # noqa: E402
from vllm.v1.request import Request  # noqa: E402

from stopline.integrations.vllm import RequestStop  # noqa: E402


def vllm_request(rng, prompt_len):
    max_tokens = rng.randint(1, 25)
    kw = dict(max_tokens=max_tokens, min_tokens=rng.randint(0, min(6, max_tokens)))
    if rng.random() < 0.6:
        kw["stop_token_ids"] = rng.sample(range(V), rng.randint(1, 2))
    sp = SamplingParams(**kw)
    if rng.random() < 0.8:
        sp.update_from_generation_config({}, eos_token_id=rng.randrange(V))
    return lambda: Request("r", list(range(prompt_len)), sp.clone(), None)


@pytest.mark.parametrize("seed", range(40))
def test_request_stop_matches_check_stop(seed):
    """Token by token and as accept runs: RequestStop stops where vLLM 0.33's
    check_stop stops (its scheduler trims a run at the first stop), with the
    same status and stop_reason."""
    rng = random.Random(seed)
    prompt_len = rng.randint(1, 8)
    make = vllm_request(rng, prompt_len)
    max_model_len = prompt_len + rng.randint(2, 30)
    stream = [rng.choice(range(6)) if rng.random() < 0.5 else rng.randrange(V) for _ in range(40)]

    theirs = make()
    status = stop_reason = None
    for tok in stream:
        theirs.append_output_token_ids(tok)
        if check_stop(theirs, max_model_len):
            status, stop_reason = theirs.status.name, theirs.stop_reason
            break
    kept = theirs.num_output_tokens

    ours, ours_req = None, make()
    ours = RequestStop(ours_req, max_model_len)
    pos = 0
    res = None
    while pos < len(stream):
        k = rng.randint(1, 4)
        ours_req.append_output_token_ids(stream[pos:pos + k])
        pos += k
        stopped = ours.check_stop(ours_req)
        res = ours.result()
        assert stopped == res.stopped
        if stopped:
            # Set on the request as vLLM's check_stop sets them.
            assert (ours_req.status.name, ours_req.stop_reason) == (status, stop_reason)
            break
    assert res is not None
    assert (res.status, res.stop_reason) == (status, stop_reason)
    if status is not None:
        assert res.num_output_tokens == kept


# --- DetokenizerStop against vLLM's incremental detokenizer ----------------

from vllm.v1.engine.detokenizer import BaseIncrementalDetokenizer  # noqa: E402

from stopline.integrations.vllm import DetokenizerStop  # noqa: E402

PIECES = ["a", "b", "ab", "ba", " ", "stop", "st", "op", "x", "", "é", "end", "\n"]


class TableDetokenizer(BaseIncrementalDetokenizer):
    """vLLM's own update/stop-string logic over a fixed id -> text table."""

    def decode_next(self, next_token_id):
        return PIECES[next_token_id]


@pytest.mark.parametrize("seed", range(60))
def test_detokenizer_stop_matches_vllm(seed):
    """Random stop lists, runs of 1-4 tokens and min_tokens: the same stop
    string, the same cut text and the same kept token count as vLLM 0.33's
    BaseIncrementalDetokenizer.update, including a final stop-terminated run."""
    rng = random.Random(seed)
    stops = rng.sample(["ab", "ba", "stop", "b a", "x", "end\n", "aa", "é"], rng.randint(1, 3))
    sp = SamplingParams(
        stop=stops, min_tokens=rng.randint(0, 4), include_stop_str_in_output=rng.random() < 0.4, max_tokens=100
    )
    theirs = TableDetokenizer(SimpleNamespace(sampling_params=sp))
    ours = DetokenizerStop(sp)
    for step in range(12):
        run = [rng.randrange(len(PIECES)) for _ in range(rng.randint(1, 4))]
        terminated = step == 11 and rng.random() < 0.5
        expect = theirs.update(run, terminated)
        got = ours.update([PIECES[t] for t in run], terminated)
        assert got == expect
        assert ours.output_text == theirs.output_text
        assert ours.num_output_tokens == len(theirs.token_ids)
        if expect is not None:
            break


@pytest.mark.parametrize("include", [False, True])
def test_detokenizer_stop_streams_held_text_at_a_stop_terminated_finish(include):
    """Issue 22, wrong answer 1: stop=["ab"], piece "xa" (its "a" held as a live
    prefix), then a stop-terminated "</s>": vLLM 0.33's detokenizer streams
    "xa" (its final get_next_output_text returns the whole remaining text), and
    so does DetokenizerStop (it used to keep the "a")."""
    pieces = ["xa", "</s>"]

    class Two(BaseIncrementalDetokenizer):
        def decode_next(self, next_token_id):
            return pieces[next_token_id]

    sp = SamplingParams(stop=["ab"], include_stop_str_in_output=include, max_tokens=10)
    theirs = Two(SimpleNamespace(sampling_params=sp))
    ours = DetokenizerStop(sp)
    theirs.update([0], False)
    ours.update(["xa"])
    streamed = (theirs.get_next_output_text(False, True), ours.get_next_output_text())
    theirs.update([1], True)
    ours.update(["</s>"], stop_terminated=True)
    theirs_all = streamed[0] + theirs.get_next_output_text(True, True)
    ours_all = streamed[1] + ours.get_next_output_text()
    assert ours_all == theirs_all == theirs.output_text == ours.output_text
    assert theirs_all == ("xa</s>" if include else "xa")


def test_unknown_extra_args_keys_message_is_bounded():
    """Issue 22: 100k unknown keys in extra_args["stopline"] gave a 989 KB message."""
    keys = {f"key{i}": 1 for i in range(100_000)}
    with pytest.raises(ValueError, match=r"extra_args\['stopline'\] has unknown keys \['key0', .*, \.\.\.\]") as info:
        StoplineLogitsProcessor.validate_params(SamplingParams(extra_args={"stopline": {"min_tokens": 1, **keys}}))
    assert len(str(info.value)) < 400
    with pytest.raises(ValueError, match=r"unknown keys \[1, 'b'\]"):  # keys of mixed types are not sorted
        StoplineLogitsProcessor.validate_params(SamplingParams(extra_args={"stopline": {1: 0, "b": 0}}))


def test_validate_params_messages_are_bounded():
    """A client's huge logit_bias key or value is shown bounded, still as ValueError
    (what vLLM turns into a client error)."""
    big = "x" * 1_000_000
    with pytest.raises(ValueError, match=r"logit_bias: token id 'xxx.*' is not an int") as info:
        StoplineLogitsProcessor.validate_params(SamplingParams(extra_args={"stopline": {"logit_bias": {big: big}}}))
    assert len(str(info.value)) < 400
    with pytest.raises(ValueError, match=r"logit_bias: bias for token 5 is not a number: 'xxx") as info:
        StoplineLogitsProcessor.validate_params(SamplingParams(extra_args={"stopline": {"logit_bias": {5: big}}}))
    assert len(str(info.value)) < 400


def test_validate_params_refuses_at_admission_what_update_state_would_refuse():
    """What set() refuses without a vocabulary, validate_params refuses at admission, with the
    same field and kind, always as a ValueError (vLLM's client error; a TypeError would be a
    server error); a one-shot iterator is refused there too (the check would use it up). Before,
    only logit_bias and an empty allowed list were checked at admission, so a stop id of -1 or
    a str min_tokens reached update_state in the engine core. What admission cannot see (an id
    past the model's vocabulary, ...) is listed in docs/integrations.md."""
    from stopline.logits import LogitsConstraints

    bad = [
        ({"min_tokens": 2, "stop_token_ids": [-1]}, "stop_token_ids", "id_outside"),
        ({"min_tokens": "3"}, "min_tokens", "wrong_type"),
        ({"min_tokens": -1}, "min_tokens", "below"),
        ({"bad_words": [[1.5]]}, "bad_words", "id_not_int"),
        ({"bad_words": "abc"}, "bad_words", "wrong_type"),
        ({"bad_words": [[]]}, "bad_words", "empty_word"),
        ({"allowed_token_ids": "x"}, "allowed_token_ids", "wrong_type"),
        ({"allowed_token_ids": []}, "allowed_token_ids", "invalid"),
        ({"restore": "sometimes"}, "restore", "not_one_of"),
        ({"logit_bias": {"a": 1.0}}, "logit_bias", "id_not_int"),
        ({"logit_bias": {3: float("nan")}}, "logit_bias[3]", "invalid"),
        ({"stop_token_ids": [1] * 70_000}, "stop_token_ids", "too_many"),
        ({"max_reasoning_tokens": "5"}, None, "wrong_type"),
    ]
    for kw, field, kind in bad:
        with pytest.raises(ValueError) as info:
            StoplineLogitsProcessor.validate_params(SamplingParams(extra_args={"stopline": kw}))
        assert not isinstance(info.value, TypeError), kw
        assert info.value.kind == kind and str(info.value.field).startswith(field or "extra_args"), (
            kw, info.value.field, info.value.kind, str(info.value))
        set_kw = {k: v for k, v in kw.items() if k != "max_reasoning_tokens"}
        if set_kw:
            with pytest.raises((TypeError, ValueError)) as direct:
                LogitsConstraints(1, V).set(0, **set_kw)
            assert (direct.value.field, direct.value.kind) == (info.value.field, info.value.kind), kw
    for kw, field in (({"stop_token_ids": iter([2, 7]), "min_tokens": 1}, "stop_token_ids"),
                      ({"bad_words": [[1, 2], iter([3, 4])]}, "bad_words[1]"),
                      ({"allowed_token_ids": (t for t in [1, 2])}, "allowed_token_ids")):
        with pytest.raises(ValueError, match="an iterator would be used up at admission") as info:
            StoplineLogitsProcessor.validate_params(SamplingParams(extra_args={"stopline": kw}))
        assert (info.value.field, info.value.kind) == (field, "wrong_type")
        assert list(kw.get("stop_token_ids") or kw.get("allowed_token_ids") or kw["bad_words"][1]), "consumed"
    good = {"min_tokens": 2, "stop_token_ids": [2, 7], "bad_words": [[1, 2], [3]], "logit_bias": {5: 1.5},
            "allowed_token_ids": [1, 2, 3, 5, 7], "restore": "always"}
    StoplineLogitsProcessor.validate_params(SamplingParams(extra_args={"stopline": good}))
    if HAS_V1_RUNNER:
        ours = StoplineLogitsProcessor(config(), torch.device("cpu"), False)
        ours.update_state(BatchUpdate(batch_size=1, removed=[], moved=[],
                                      added=[(0, SamplingParams(extra_args={"stopline": good}), [1], [])]))
    assert StoplineLogitsProcessor(config(), v2_req_states()).add_request(0, SamplingParams(extra_args={"stopline": good}))


def _v1_config():
    cfg = config()
    cfg.speculative_config = None
    return cfg


@needs_v1
def test_explicit_processor_beside_the_entry_point_is_refused():
    """Issue 22, wrong answer 2: vLLM 0.33's build_logitsprocs loads the
    vllm.logits_processors entry point (StoplineLogitsProcessor) and then
    logits_processors=[...] without removing repeats; the class refuses a
    second instance in one engine instead of applying extra_args twice."""
    from importlib.metadata import entry_points

    from vllm.v1.sample.logits_processor import build_logitsprocs

    registered = any(ep.value == "stopline.integrations.vllm:StoplineLogitsProcessor"
                     for ep in entry_points(group="vllm.logits_processors"))
    twice = [StoplineLogitsProcessor] if registered else [StoplineLogitsProcessor, StoplineLogitsProcessor]
    with pytest.raises(ValueError, match="StoplineLogitsProcessor is already loaded in this engine"):
        build_logitsprocs(_v1_config(), torch.device("cpu"), False, False, twice)
    # Once, beside the builtins-field class: both load (they read different fields).
    once = [] if registered else [StoplineLogitsProcessor]
    procs = build_logitsprocs(_v1_config(), torch.device("cpu"), False, False, once + [StoplineBuiltinsProcessor])
    ours = [type(p) for p in procs.all if isinstance(p, StoplineLogitsProcessor)]
    assert sorted(c.__name__ for c in ours) == ["StoplineBuiltinsProcessor", "StoplineLogitsProcessor"]
    # Separate engines (separate configs) each get their own.
    StoplineLogitsProcessor(_v1_config(), torch.device("cpu"), False)
    StoplineLogitsProcessor(_v1_config(), torch.device("cpu"), False)


def v2_req_states(slots=MAX_SEQS, width=64):
    """vLLM's LogitsProcRequestState on CPU: per-slot prompt_len and total_len, and the committed
    tokens in all_token_ids (the model runner's UvaBackedTensor / StagedWriteTensor expose .gpu)."""
    def buf(t):
        return SimpleNamespace(gpu=t, np=t.numpy())

    return LogitsProcRequestState(
        device=torch.device("cpu"), max_num_reqs=slots, vocab_size=V,
        all_token_ids=buf(torch.zeros(slots, width, dtype=torch.int32)),
        prompt_len=buf(torch.zeros(slots, dtype=torch.int32)), prefill_len=None,
        total_len=buf(torch.zeros(slots, dtype=torch.int32)),
    )


def test_v2_loader_refuses_a_second_instance_in_one_engine():
    """The model-runner-V2 loader hands every processor of one engine the same
    request-state object; a second StoplineLogitsProcessor on it is refused."""
    req_states = v2_req_states()
    first = StoplineLogitsProcessor(config(), req_states)
    with pytest.raises(ValueError, match="already loaded in this engine"):
        StoplineLogitsProcessor(config(), req_states)

    class Other(StoplineLogitsProcessor):
        pass

    Other(config(), req_states)  # another class: allowed
    del first
    import gc

    gc.collect()
    StoplineLogitsProcessor(config(), req_states)  # the first one is gone: a rebuild may load it again


def test_v2_refuses_the_builtins_processor():
    """vLLM's V2 sampler always runs its own LogitBiasState and BadWordsState on the ordinary
    fields, so StoplineBuiltinsProcessor there would add each logit_bias a second time: it is
    refused when the engine builds it (named explicitly, so the engine is told at start)."""
    with pytest.raises(ValueError, match="logit_bias would be added twice") as info:
        StoplineBuiltinsProcessor(config(), v2_req_states())
    assert (info.value.field, info.value.kind) == ("logits_processors", "unsupported")


def test_docs_example_runs():
    """The vLLM example in docs/integrations.md runs as written."""
    from doc_blocks import run_python_blocks

    run_python_blocks("docs/integrations.md", "integrations.vllm")
# --- the model-runner-V2 shape ---------------------------------------------



@needs_v1
@pytest.mark.parametrize("seed", range(10))
def test_v2_shape_equals_v1_path(seed):
    """The same class under vLLM's model-runner-V2 interface (slots = persistent
    request slots, rows reordered every step, positions from ctx.pos) masks
    exactly as its V1 path, which is compared with vLLM's own steps above.
    Multi-token bad words read the committed tokens from req_states.all_token_ids."""
    from stopline.integrations.vllm import constraints_from_params

    assert issubclass(StoplineLogitsProcessor, V2LogitsProcessor)
    rng = random.Random(seed)
    req_states = v2_req_states()
    prompt_len = req_states.prompt_len.gpu
    v2 = StoplineLogitsProcessor(config(), req_states)
    params, outs = {}, {}
    for slot in range(MAX_SEQS):
        kw = constraints_from_params(random_params(rng))
        params[slot], outs[slot] = SamplingParams(extra_args={"stopline": kw} if kw else None), []
        prompt_len[slot] = rng.randint(1, 5)
        v2.add_request(slot, params[slot])
    for _ in range(8):
        order = rng.sample(range(MAX_SEQS), rng.randint(1, MAX_SEQS))  # this step's batch, any order
        v1 = StoplineLogitsProcessor(config(), torch.device("cpu"), False)
        v1.update_state(BatchUpdate(batch_size=len(order), removed=[],
                                    added=[(i, params[s], [1], outs[s]) for i, s in enumerate(order)], moved=[]))
        for s in order:
            n = int(prompt_len[s])
            req_states.all_token_ids.gpu[s, n:n + len(outs[s])] = torch.tensor(outs[s], dtype=torch.int32)
            req_states.total_len.gpu[s] = n + len(outs[s])
        logits = torch.randn(len(order), V)
        idx = torch.tensor(order, dtype=torch.int32)
        pos = torch.tensor([int(prompt_len[s]) + len(outs[s]) - 1 for s in order])
        ctx = LogitsContext(expanded_idx_mapping=idx, idx_mapping=idx, idx_mapping_np=np.array(order),
                            expanded_local_pos=torch.zeros(len(order), dtype=torch.int32), input_ids=None, pos=pos,
                            seq_lens_upper_bound_np=None)
        assert torch.equal(v2.apply(logits.clone(), ctx), v1.apply(logits.clone()))
        for s in order:
            outs[s].append(rng.randrange(V))


@pytest.mark.parametrize("seed", range(20))
def test_v2_multi_token_bad_words_read_the_engine_history(seed):
    """Under V2 the processor never sees the output on the host: a multi-token bad word matches
    the committed tokens in req_states.all_token_ids (prompt_len..total_len) and, on a speculative
    row, the drafts fed before it (ctx.input_ids), all on the device. The logits equal a
    LogitsConstraints fed the same tokens through append_tokens and draft_token_ids."""
    from stopline.logits import LogitsConstraints

    rng = random.Random(seed)
    drafts_max = rng.randint(0, 3)
    cfg = config()
    cfg.speculative_config = SimpleNamespace(num_speculative_tokens=drafts_max) if drafts_max else None
    req_states = v2_req_states()
    v2 = StoplineLogitsProcessor(cfg, req_states)
    words = [[rng.randrange(4) for _ in range(rng.randint(1, 4))] for _ in range(3)]
    ref = LogitsConstraints(MAX_SEQS, V)
    outs = {}
    for slot in range(MAX_SEQS):
        kw = {"bad_words": words[: rng.randint(1, 3)]} if rng.random() < 0.8 else None
        assert v2.add_request(slot, SamplingParams(extra_args={"stopline": kw} if kw else None)) == bool(kw)
        if kw:
            ref.set(slot, **kw)
        outs[slot] = [rng.randrange(4) for _ in range(rng.randint(0, 6))]
        n = rng.randint(1, 5)
        req_states.prompt_len.gpu[slot] = n
        req_states.all_token_ids.gpu[slot, :n] = 3  # prompt tokens never count as history
        req_states.all_token_ids.gpu[slot, n:n + len(outs[slot])] = torch.tensor(outs[slot], dtype=torch.int32)
        req_states.total_len.gpu[slot] = n + len(outs[slot])
        ref.append_tokens(slot, outs[slot])
    order = rng.sample(range(MAX_SEQS), rng.randint(1, MAX_SEQS))
    rows, local, fed, pos = [], [], [], []
    for s in order:  # one row per draft position: the committed last token, then the drafts
        k = rng.randint(0, drafts_max)
        draft = [rng.randrange(4) for _ in range(k)]
        last = outs[s][-1] if outs[s] else 3
        for j in range(k + 1):
            rows.append(s)
            local.append(j)
            fed.append(last if j == 0 else draft[j - 1])
            pos.append(int(req_states.total_len.gpu[s]) - 1 + j)
    idx = torch.tensor(rows, dtype=torch.int32)
    ctx = LogitsContext(expanded_idx_mapping=idx, idx_mapping=torch.tensor(order, dtype=torch.int32),
                        idx_mapping_np=np.array(order), expanded_local_pos=torch.tensor(local, dtype=torch.int32),
                        input_ids=torch.tensor(fed, dtype=torch.int32), pos=torch.tensor(pos), seq_lens_upper_bound_np=None)
    logits = torch.randn(len(rows), V)
    got = v2.apply(logits.clone(), ctx)
    width = max(drafts_max, 1)
    drafts = torch.full((len(rows), width), -1, dtype=torch.int32)
    for r, j in enumerate(local):
        drafts[r, :j] = torch.tensor(fed[r - j + 1 : r + 1], dtype=torch.int32)
    positions = torch.tensor([p + 1 - int(req_states.prompt_len.gpu[s]) for p, s in zip(pos, rows)])
    expect = logits.clone()
    ref.apply(expect, idx, positions, draft_token_ids=drafts)
    assert torch.equal(got, expect)


def test_v2_budget_is_vllms_own(caplog):
    """Under V2 vLLM forces thinking_token_budget itself after every processor; a
    max_reasoning_tokens of the entry-point processor is refused at admission, naming the field
    and thinking_token_budget, unless the engine certainly runs V1 (0.33 with
    VLLM_USE_V2_MODEL_RUNNER=0). One that reaches the V2 engine step anyway does not fail it:
    the request is ended at its next token, or (no stop id) runs without it, and an error is logged."""
    from stopline.integrations.vllm import _v1_runner_certain

    sp = SamplingParams(extra_args={"stopline": {"max_reasoning_tokens": 4}})
    if not _v1_runner_certain():
        with pytest.raises(ValueError, match="thinking_token_budget") as info:
            StoplineLogitsProcessor.validate_params(sp)
        assert (info.value.field, info.value.kind) == ("extra_args['stopline']['max_reasoning_tokens']", "unsupported")
    StoplineLogitsProcessor.validate_params(SamplingParams(thinking_token_budget=4))  # vLLM's own field: not ours
    v2 = StoplineLogitsProcessor(config(), v2_req_states())
    with caplog.at_level("ERROR", logger="stopline.integrations.vllm"):
        assert v2.add_request(0, sp) is True
        assert v2.add_request(1, SamplingParams(stop_token_ids=[7], extra_args=sp.extra_args)) is True
    assert "max_reasoning_tokens" in caplog.text and "forced to its stop id 7" in caplog.text
    assert v2.constraints.forced_token(1) == 7 and v2.constraints.forced_token(0) is None


def test_extra_args_of_other_shapes_are_not_stoplines():
    """extra_args is vLLM's field for every custom processor: a list or str there carries
    nothing for stopline and is never refused by it (an AttributeError here would have been a
    server error for a request that never asked for stopline)."""
    for extra in (["stopline"], "stopline", {"other": 1}):
        params = SamplingParams(extra_args=extra)
        StoplineLogitsProcessor.validate_params(params)
        assert StoplineLogitsProcessor(config(), v2_req_states()).add_request(0, params) is False


# --- reasoning channels (docs/semantics.md 11) -------------------------------

from vllm.config.reasoning import ReasoningConfig  # noqa: E402

from stopline.engines import reasoning_from_markers  # noqa: E402
from stopline.integrations.vllm import vllm_reasoning  # noqa: E402


def reasoning_config(start, end, forced=None):
    """A vLLM ReasoningConfig as the engine leaves it after initialize_token_ids
    (set directly: initialising reads a model's tokenizer)."""
    rc = ReasoningConfig()
    rc._reasoning_start_token_ids = list(start)
    rc._natural_reasoning_end_token_ids = list(end)
    rc._reasoning_end_token_ids = list(forced if forced is not None else end)
    rc.initialize_token_ids(None)  # all ids set: only marks it enabled
    assert rc.enabled
    return rc


def real_tokenizer(name):
    from stopline.tools.models import ModelFileError
    from stopline.tools.vocab_files import tokenizer_json_path
    from transformers import PreTrainedTokenizerFast

    try:
        return PreTrainedTokenizerFast(tokenizer_file=str(tokenizer_json_path(name)))
    except ModelFileError as exc:
        pytest.skip(str(exc))


@pytest.fixture(scope="module")
def deepseek():
    """DeepSeek-V3's tokenizer: `<think>` and `</think>` are single special tokens."""
    return real_tokenizer("deepseek-v3")


@pytest.fixture(scope="module")
def smollm2():
    """SmolLM2's tokenizer: `<think>` is several tokens, matched as text."""
    return real_tokenizer("smollm2")


def test_vllm_reasoning_from_the_parser_resolves_marker_ids(deepseek):
    """--reasoning-parser deepseek_r1: the parser's strings, their ids as
    vLLM's ReasoningConfig.initialize_token_ids encodes them."""
    r = vllm_reasoning(reasoning_parser="deepseek_r1", tokenizer=deepseek)
    think, end = deepseek.convert_tokens_to_ids(["<think>", "</think>"])
    assert r.options == {"reasoning_start": "<think>", "reasoning_start_id": think, "reasoning_end": "</think>",
                         "reasoning_end_id": end, "reasoning_end_ids": (end,)}
    # The same markers from the engine's ReasoningConfig (ids, texts decoded).
    assert vllm_reasoning(SimpleNamespace(reasoning_config=reasoning_config([think], [end])),
                          tokenizer=deepseek).options == r.options
    assert vllm_reasoning(SimpleNamespace(reasoning_config=None)) is None


def stream_detokenizer(d, tok, ids):
    """Feeds ids one at a time as vLLM's detokenizer does; the joined channel deltas."""
    reasoning = content = ""
    stop = None
    for i in ids:
        stop = d.update([tok.decode([i])], token_ids=[i])
        r, c = d.get_next_output_channels()
        assert not r.endswith("<") and not c.endswith("<")
        reasoning, content = reasoning + r, content + c
        if stop is not None:
            break
    return stop, reasoning, content


def test_vllm_52393_stop_string_inside_thinking_does_not_fire(deepseek):
    """vllm#52393: stop=["\\n\\n"] on a reasoning model. vLLM 0.33's detokenizer
    stops inside the thinking (content empty); DetokenizerStop with the
    engine's reasoning markers stops in the content."""
    r = vllm_reasoning(reasoning_parser="deepseek_r1", tokenizer=deepseek)
    out = deepseek.encode("<think>Let me see.\n\nOK</think>Hello\n\nbye", add_special_tokens=False)
    sp = SamplingParams(stop=["\n\n"], max_tokens=100)
    pieces = [deepseek.decode([i]) for i in out]

    class Real(BaseIncrementalDetokenizer):
        def decode_next(self, next_token_id):
            return pieces[next_token_id]

    theirs = Real(SimpleNamespace(sampling_params=sp))
    for k in range(len(out)):
        if theirs.update([k], False):
            break
    assert theirs.output_text == "<think>Let me see."  # vLLM: cut inside the thinking
    d = DetokenizerStop(sp, reasoning=r)
    stop, reasoning, content = stream_detokenizer(d, deepseek, out)
    assert (stop, reasoning, content) == ("\n\n", "Let me see.\n\nOK", "Hello")
    assert (d.reasoning, d.content, d.output_text) == ("Let me see.\n\nOK", "Hello", "<think>Let me see.\n\nOK</think>Hello")


def test_prompt_opened_thinking_starts_in_reasoning(deepseek):
    """DeepSeek-R1's template ends the prompt with `<think>\\n`: the output
    starts inside the block (read from the prompt ids with the tokenizer's
    vocabulary), so the stop string in it does not fire; without the prompt it
    would."""
    r = vllm_reasoning(reasoning_parser="deepseek_r1", tokenizer=deepseek)
    prompt = deepseek.encode("User: hi\nAssistant: <think>\n", add_special_tokens=False)
    out = deepseek.encode("Let me see.\n\nOK</think>Hello\n\nbye", add_special_tokens=False)
    sp = SamplingParams(stop=["\n\n"], max_tokens=100)
    d = DetokenizerStop(sp, reasoning=r, prompt_token_ids=prompt)
    assert stream_detokenizer(d, deepseek, out) == ("\n\n", "Let me see.\n\nOK", "Hello")
    d = DetokenizerStop(sp, reasoning=r)
    assert stream_detokenizer(d, deepseek, out) == ("\n\n", "", "Let me see.")
    # The stateless helper agrees.
    from stopline.compat import vllm_detokenizer_stop

    res = vllm_detokenizer_stop([deepseek.decode([i]) for i in out], stop=["\n\n"], reasoning=r, token_ids=out,
                                prompt_token_ids=prompt, num_new_tokens=len(out))
    assert (res.stop_string, res.reasoning, res.content) == ("\n\n", "Let me see.\n\nOK", "Hello")


def test_enable_thinking_false_prompt_starts_in_content(deepseek):
    """chat_template_kwargs={"enable_thinking": False}: Qwen3's template closes
    an empty block in the prompt (`<think>\n\n</think>\n\n`), so the output
    starts in content and the stop string fires there at once."""
    r = vllm_reasoning(reasoning_parser="qwen3", tokenizer=deepseek)
    prompt = deepseek.encode("User: hi\nAssistant: <think>\n\n</think>\n\n", add_special_tokens=False)
    out = deepseek.encode("Hello\n\nbye", add_special_tokens=False)
    d = DetokenizerStop(SamplingParams(stop=["\n\n"], max_tokens=100), reasoning=r, prompt_token_ids=prompt)
    assert stream_detokenizer(d, deepseek, out) == ("\n\n", "", "Hello")


def test_text_markers_split_across_tokens_smollm2(smollm2):
    """SmolLM2 has no `<think>` token (vLLM's deepseek_r1 parser refuses it):
    markers given explicitly are matched as text across tokens, and a cut
    marker is never streamed."""
    r = reasoning_from_markers("<think>", "</think>", smollm2)
    assert "reasoning_start_id" not in r.options and "reasoning_end_id" not in r.options
    out = smollm2.encode("<think>\nplan a\n\nb\n</think>Done.\n\nmore", add_special_tokens=False)
    d = DetokenizerStop(SamplingParams(stop=["\n\n"], max_tokens=100), reasoning=r)
    stop, reasoning, content = stream_detokenizer(d, smollm2, out)
    assert (stop, reasoning, content) == ("\n\n", "\nplan a\n\nb\n", "Done.")


def test_request_stop_stop_token_inside_thinking_does_not_fire(deepseek):
    """A stop token id met while thinking does not stop the request (content
    scope); the same id after `</think>` does. vLLM's check_stop stops at the
    first one."""
    r = vllm_reasoning(reasoning_parser="deepseek_r1", tokenizer=deepseek)
    think, end = deepseek.convert_tokens_to_ids(["<think>", "</think>"])
    nl = deepseek.encode("\n\n", add_special_tokens=False)[0]
    prompt = deepseek.encode("User: hi\nAssistant: <think>\n", add_special_tokens=False)
    out = [*deepseek.encode("a", add_special_tokens=False), nl, end, *deepseek.encode("b", add_special_tokens=False), nl, 7]
    sp = SamplingParams(stop_token_ids=[nl], max_tokens=50)
    req = Request("r", prompt, sp, None)
    ours = RequestStop(req, 4096, reasoning=r)
    for tok in out:
        req.append_output_token_ids(tok)
        if ours.check_stop(req):
            break
    assert (req.status.name, req.stop_reason, ours.result().num_output_tokens) == ("FINISHED_STOPPED", nl, 5)
    assert ours.tracker.reasoning_token_ids == out[:2] and ours.tracker.content_token_ids == out[3:5]
    first = Request("v", prompt, sp.clone(), None)
    first.append_output_token_ids(out[:2])
    assert check_stop(first, 4096) and first.stop_reason == nl  # vLLM: stops inside the thinking


def run_budget(proc_cls, rc, sp, prompt, stream_of, steps, reasoning, vocab, compare=True, vllm_forced=None):
    """Drives our processor and vLLM's own ThinkingBudgetStateHolder on one
    request; each step samples the forced id when a row is forced (as the
    sampler would; ours when they differ), else the stream's next id, and
    (``compare``) the forced ids must agree. Returns ours per step; vLLM's go
    to ``vllm_forced`` when given."""
    class Proc(proc_cls):
        reasoning_for = staticmethod(lambda cfg: reasoning)

    cfg = SimpleNamespace(scheduler_config=SimpleNamespace(max_num_seqs=MAX_SEQS),
                          model_config=SimpleNamespace(get_vocab_size=lambda: vocab), reasoning_config=rc)
    ours = Proc(cfg, torch.device("cpu"), False)
    theirs = ThinkingBudgetStateHolder(rc, MAX_SEQS, 0, torch.device("cpu"), False)
    out_ours, out_theirs = [], []
    ours.update_state(BatchUpdate(batch_size=1, removed=[], added=[(0, sp, prompt, out_ours)], moved=[]))
    theirs.sync_batch(BatchUpdate(batch_size=1, removed=[], added=[(0, sp, prompt, out_theirs)], moved=[]))
    forced = []
    for step in range(steps):
        if step:
            ours.update_state(None)
        theirs.update_state([out_theirs], None)
        logits = torch.zeros(1, vocab)
        got = ours.apply(logits.clone())
        expect = theirs.apply_to_logits(logits.clone(), False, None)
        f_ours = int(got[0].argmax()) if torch.isinf(got[0]).any() else None
        f_theirs = int(expect[0].argmax()) if not torch.equal(expect, logits) else None
        assert f_ours == f_theirs or not compare, (step, forced, f_ours, f_theirs)
        forced.append(f_ours)
        if vllm_forced is not None:
            vllm_forced.append(f_theirs)
        tok = f_ours if f_ours is not None else stream_of(step)
        out_ours.append(tok)
        out_theirs.append(tok)
    return forced


@needs_v1
@pytest.mark.parametrize("seed", range(12))
def test_thinking_budget_forces_the_end_marker_as_vllm(deepseek, seed):
    """thinking_token_budget through StoplineBuiltinsProcessor (LogitsConstraints.force)
    forces the same ids at the same steps as vLLM 0.33's own
    ThinkingBudgetStateHolder, with DeepSeek's real marker ids: a one-token end
    marker or a transition token before it (vLLM's reasoning_end_str with a
    phrase), prompts that open the block or not, budgets 0 to 5, random
    streams that sometimes close the block themselves."""
    rng = random.Random(seed)
    think, end = deepseek.convert_tokens_to_ids(["<think>", "</think>"])
    okay = deepseek.encode("Okay", add_special_tokens=False)
    forced_end = [end] if rng.random() < 0.5 else [*okay, end]
    rc = reasoning_config([think], [end], forced_end)
    r = vllm_reasoning(rc, tokenizer=deepseek)
    prompt = deepseek.encode("User: hi\nAssistant:", add_special_tokens=False)
    opened = rng.random() < 0.5
    if opened:
        prompt += [think, *deepseek.encode("\n", add_special_tokens=False)]
    # Budget 0 with an opened block: the prompt alone spends it.
    budget = rng.randint(0, 5)
    words = deepseek.encode(" one two three four five", add_special_tokens=False)
    # vLLM's budget sees the block close only at its forced ids (okay + end): a
    # natural `</think>` alone closes it for stopline, not for vLLM (a
    # documented difference), so the stream closes it only with a one-id end.
    closes = 0.08 if forced_end == [end] else 0.0
    stream = [think] + [end if rng.random() < closes else rng.choice(words) for _ in range(30)]
    sp = SamplingParams(thinking_token_budget=budget, max_tokens=100)
    forced = run_budget(StoplineBuiltinsProcessor, rc, sp, prompt, lambda i: stream[i], 14, r, len(deepseek))
    assert any(f is not None for f in forced) or end in stream[:14]


@needs_v1
def test_thinking_budget_counts_a_prompt_opened_block(deepseek):
    """extra_args["stopline"]["max_reasoning_tokens"] (the entry-point
    processor) with the engine's real markers: the prompt ends with
    `<think>\n`, whose "\n" counts, so a budget of 3 forces `</think>` after
    two output tokens, as vLLM's own budget does."""
    think, end = deepseek.convert_tokens_to_ids(["<think>", "</think>"])
    rc = reasoning_config([think], [end])
    r = vllm_reasoning(rc, tokenizer=deepseek)
    prompt = deepseek.encode("User: hi\nAssistant: <think>\n", add_special_tokens=False)
    sp = SamplingParams(extra_args={"stopline": {"max_reasoning_tokens": 3}}, thinking_token_budget=3, max_tokens=50)
    forced = run_budget(StoplineLogitsProcessor, rc, sp, prompt, lambda i: 100 + i, 4, r, len(deepseek))
    assert forced == [None, None, end, None]


@needs_v1
def test_an_id_past_the_tokenizer_does_not_fail_the_step(deepseek):
    """vLLM pads the embedding past the tokenizer: a sampled padded id ends
    the budget's enforcement for that request (its text cannot be decoded)
    instead of raising in the engine step; RequestStop with one-token markers
    and no budget never decodes, so the id is just content."""
    think, end = deepseek.convert_tokens_to_ids(["<think>", "</think>"])
    rc = reasoning_config([think], [end])
    r = vllm_reasoning(rc, tokenizer=deepseek)
    padded = len(deepseek) + 3
    sp = SamplingParams(thinking_token_budget=2, max_tokens=50)
    stream = [think, padded, 100, 101, 102]
    forced = run_budget(StoplineBuiltinsProcessor, rc, sp, [1, 2], lambda i: stream[i], 5, r, len(deepseek) + 8,
                        compare=False)
    assert forced == [None] * 5  # the count stopped at the padded id (budget 2 would force at step 3)
    req = Request("r", [1, 2], SamplingParams(stop_token_ids=[100], max_tokens=50), None)
    stop = RequestStop(req, 4096, reasoning=r)
    req.append_output_token_ids([think, padded, 100, end, 100])
    assert stop.check_stop(req) and stop.result().num_output_tokens == 5


@needs_v1
@pytest.mark.parametrize("phrase", [False, True])
def test_thinking_budget_spent_by_the_prompt_forces_the_end_marker(deepseek, phrase):
    """Budget 0 and a prompt ending `<think>\n` (one thinking token already):
    vLLM 0.33 forces the end marker's ids from the first step on (a phrase
    before `</think>`: its ids in order), as stopline does."""
    think, end = deepseek.convert_tokens_to_ids(["<think>", "</think>"])
    okay = deepseek.encode("Okay", add_special_tokens=False) if phrase else []
    rc = reasoning_config([think], [end], [*okay, end])
    prompt = deepseek.encode("User: hi\nAssistant: <think>\n", add_special_tokens=False)
    sp = SamplingParams(thinking_token_budget=0, max_tokens=50)
    forced = run_budget(StoplineBuiltinsProcessor, rc, sp, prompt, lambda i: 100 + i, 2 + len(okay),
                        vllm_reasoning(rc, tokenizer=deepseek), len(deepseek))
    assert forced == [*okay, end, None]


@needs_v1
@pytest.mark.parametrize("opened", [False, True])
def test_thinking_budget_counts_a_start_marker_inside_the_block(deepseek, opened):
    """A `<think>` met again inside the open block is a marker for the
    channels and still one thinking token for the budget, as vLLM counts
    it (its start position stays the first start's)."""
    think, end = deepseek.convert_tokens_to_ids(["<think>", "</think>"])
    rc = reasoning_config([think], [end])
    prompt = deepseek.encode("User: hi\nAssistant:", add_special_tokens=False)
    stream = [100, think, 101, think, 102, 103, 104]
    if opened:
        prompt += [think]
    else:
        stream = [think, *stream]
    sp = SamplingParams(thinking_token_budget=4, max_tokens=50)
    forced = run_budget(StoplineBuiltinsProcessor, rc, sp, prompt, lambda i: stream[i], 6,
                        vllm_reasoning(rc, tokenizer=deepseek), len(deepseek))
    assert forced == ([None] * 4 + [end, None] if opened else [None] * 5 + [end])


@needs_v1
def test_thinking_budget_second_block_differs_from_vllm(deepseek):
    """A documented difference (semantics.md 11.1): stopline has one reasoning
    block, so a `<think>` after `</think>` is content and the budget is over;
    vLLM 0.33's ThinkingBudgetStateHolder counts a second block afresh and
    forces `</think>` again once it holds the budget."""
    think, end = deepseek.convert_tokens_to_ids(["<think>", "</think>"])
    rc = reasoning_config([think], [end])
    prompt = deepseek.encode("User: hi\nAssistant:", add_special_tokens=False)
    stream = [think, 100, 101, end, 102, think, 103, 104, 105, 106]
    sp = SamplingParams(thinking_token_budget=2, max_tokens=50)
    theirs: list[int | None] = []
    ours = run_budget(StoplineBuiltinsProcessor, rc, sp, prompt, lambda i: stream[i], 10,
                      vllm_reasoning(rc, tokenizer=deepseek), len(deepseek), compare=False, vllm_forced=theirs)
    assert ours == [None] * 3 + [end] + [None] * 6
    assert theirs[:4] == ours[:4] and end in theirs[6:]


def test_bad_reasoning_configuration_names_the_field(deepseek, smollm2):
    with pytest.raises(ValueError, match="reasoning_parser='nope'") as e:
        vllm_reasoning(reasoning_parser="nope", tokenizer=deepseek)
    assert e.value.field == "reasoning_parser"
    with pytest.raises(ValueError, match="reasoning_parser='deepseek_r1': 'DeepSeekR1ReasoningParser") as e:
        vllm_reasoning(reasoning_parser="deepseek_r1", tokenizer=smollm2)
    assert e.value.field == "reasoning_parser"
    with pytest.raises(ValueError, match=r"reasoning_config.natural_reasoning_end_token_ids=\[6, 7\] is several") as e:
        vllm_reasoning(reasoning_config([5], [6, 7]))
    if HAS_V1_RUNNER:  # in the engine step: logged and the request ended, never raised (fatal there)
        import logging

        proc = StoplineBuiltinsProcessor(config(), torch.device("cpu"), False)
        logger = logging.getLogger("stopline.integrations.vllm")
        with pytest.MonkeyPatch.context() as mp:
            seen: list[str] = []
            mp.setattr(logger, "error", lambda msg, *args: seen.append(msg % args))
            proc.update_state(BatchUpdate(batch_size=1, removed=[], moved=[],
                                          added=[(0, SamplingParams(thinking_token_budget=2), [1], [])]))
        assert "max_reasoning_tokens: max_reasoning_tokens=2: this engine has no reasoning markers" in seen[0]
    with pytest.raises(ValueError, match="thinking_token_budget=2 needs reasoning markers") as e:
        RequestStop(Request("r", [1], SamplingParams(thinking_token_budget=2), None), 100)
    assert e.value.field == "thinking_token_budget"
    with pytest.raises(ValueError) as e:  # at admission a type error too is a ValueError (vLLM's client error)
        StoplineLogitsProcessor.validate_params(SamplingParams(extra_args={"stopline": {"max_reasoning_tokens": 1.5}}))
    assert "max_reasoning_tokens" in e.value.field and e.value.kind == "wrong_type"


# --- vLLM's V2 thinking-budget kernel (0.34's only runner) against rule 11.8 ----

_KERNEL_SCRIPT = """
import json, sys, importlib.util, types
import torch
path = importlib.util.find_spec("vllm.v1.worker.gpu.sample.thinking_budget").origin
source = open(path).read()
assert "from vllm.triton_utils import tl, triton" in source
source = source.replace("from vllm.triton_utils import tl, triton", "import triton\\nimport triton.language as tl")
module = types.ModuleType("vllm_v2_thinking_budget")
exec(compile(source, path, "exec"), module.__dict__)
out = []
for tokens, budget, start, end, forced_ids, vocab in json.load(sys.stdin):
    table = torch.zeros(2, len(tokens) + 8, dtype=torch.int32)
    table[0, : len(tokens)] = torch.tensor(tokens, dtype=torch.int32)
    logits = torch.zeros(1, vocab)
    one = torch.tensor([0], dtype=torch.int32)
    ids = [torch.tensor(x, dtype=torch.int32) for x in (start, end, forced_ids)]
    module.apply_thinking_budget(
        logits, one, one, torch.tensor([budget, -1], dtype=torch.int32), table,
        torch.tensor([len(tokens), 0], dtype=torch.int32), torch.tensor([tokens[-1]], dtype=torch.int32),
        torch.zeros(1, dtype=torch.int32), torch.full((2,), -1, dtype=torch.int32),
        torch.full((2,), -1, dtype=torch.int32), torch.zeros(2, dtype=torch.int32), *ids)
    out.append(int(logits[0].argmax()) if float(logits[0].max()) > 0 else None)
print(json.dumps(out))
"""


def v2_budget_kernel(queries):
    """For each ``(tokens, budget, start_ids, end_ids, forced_ids)``: the id vLLM's own V2
    budget kernel (``thinking_budget.py``, the same file on 0.33 and 0.34) forces after
    ``tokens``, or None. The kernel runs under Triton's interpreter in a fresh interpreter:
    ``TRITON_INTERPRET`` must be set before Triton is imported, and the file is executed with
    the real ``triton`` where it imports ``vllm.triton_utils`` (a placeholder without a GPU)."""
    import json
    import os
    import subprocess
    import sys

    env = dict(os.environ, TRITON_INTERPRET="1")
    data = json.dumps([[list(t), b, s, e, f, V] for t, b, s, e, f in queries])
    proc = subprocess.run([sys.executable, "-c", _KERNEL_SCRIPT], input=data, capture_output=True, text=True,
                          env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


THINK, END, PHRASE = 10, 11, 30


def budget_runs(cases):
    """Closed loops over one request each (``cases``: (stream, budget, forced_ids, steps)):
    every step stopline's tracker (reasoning_end_ids=forced_ids, rule 11.8) names the id to
    force next, and the token taken is that id, else the stream's next; vLLM's V2 kernel is
    then asked, for every prefix, what it would force. Returns (ours, theirs) per case."""
    from stopline.engines import reasoning_config

    prompt = [1, 2, 3]
    runs, queries = [], []
    for stream, budget, forced_ids, steps in cases:
        r = reasoning_config({"reasoning_start_id": THINK, "reasoning_end_id": END, "reasoning_end_ids": forced_ids})
        counter = r.budget_counter(budget, prompt)
        out, ours = [], []
        for step in range(steps):
            ours.append(counter.forced_token_id)
            if out:
                queries.append((prompt + out, budget, [THINK], [END], forced_ids))
            tok = ours[-1] if ours[-1] is not None else stream[step]
            out.append(tok)
            r.count(counter, [tok])
        runs.append(ours)
    answers = iter(v2_budget_kernel(queries))
    return [(ours, [None] + [next(answers) for _ in ours[1:]]) for ours in runs]


def test_v2_budget_kernel_agrees_on_one_plain_block():
    """On one block that the model opens with the start id, never re-opens inside and never
    begins the forced end itself, vLLM's V2 kernel forces the same ids at the same steps as
    stopline's rule (docs/semantics.md 11 rule 8): budgets 0-5, a one-id end or a phrase
    before it, streams that sometimes close the block themselves (32 random requests)."""
    cases = []
    for seed in range(32):
        rng = random.Random(seed)
        forced_ids = [END] if rng.random() < 0.5 else [PHRASE, END]
        stream = [THINK] + [END if rng.random() < 0.08 else rng.randint(20, 25) for _ in range(14)]
        cases.append((stream, rng.randint(0, 5), forced_ids, 12))
    runs = budget_runs(cases)
    for case, (ours, theirs) in zip(cases, runs):
        assert ours[1:] == theirs[1:], (case, ours, theirs)
    assert sum(1 for ours, _ in runs if any(f is not None for f in ours)) >= 8  # not vacuous


def test_v2_budget_kernel_differs_where_semantics_11_1_says():
    """docs/semantics.md 11.1, "The thinking budget on vLLM 0.34". A `<think>` written again
    inside the open block restarts vLLM's count (its last start wins); stopline counts it as
    one thinking token from the first start. With the forced end `</` `think` `>` (three ids)
    and a model whose last token is already `</`, vLLM forces `think` next; stopline's rule
    forces from the first id once the count reaches the budget (issue 31 asks it to continue)."""
    lt, word = PHRASE, PHRASE + 1
    restart, begun = budget_runs([([THINK, 20, THINK, 21, 22, 23, 24, 25], 3, [END], 8),
                                  ([THINK, 20, 21, lt, 22, 23, 24, 25], 3, [lt, word, END], 5)])
    # stopline forces </think> after `20 <think> 21` (3 thinking tokens) and the block closes;
    # vLLM counted only `21` since the second start, so it forces nothing.
    assert restart == ([None, None, None, None, END, None, None, None], [None] * 8)
    assert begun[0][4] == lt and begun[1][4] == word
