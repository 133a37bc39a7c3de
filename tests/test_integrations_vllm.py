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

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("vllm.v1.sample.logits_processor", reason="vLLM is not installed (pip install '.[vllm]')")
from vllm import SamplingParams  # noqa: E402
from vllm.sampling_params import StructuredOutputsParams  # noqa: E402
from vllm.v1.sample.logits_processor import BatchUpdate, MoveDirectionality  # noqa: E402
from vllm.v1.sample.logits_processor.builtin import LogitBiasLogitsProcessor, MinTokensLogitsProcessor  # noqa: E402
from vllm.v1.sample.ops.bad_words import apply_bad_words  # noqa: E402

from stopline.integrations.vllm import StoplineBuiltinsProcessor, StoplineLogitsProcessor  # noqa: E402

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


@pytest.mark.parametrize("seed", range(25))
def test_persistent_batch_matches_vllm(seed):
    rng = random.Random(seed)
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
            out.append(rng.randrange(V))  # the step's sampled token, seen through the live list


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


def test_out_of_vocabulary_id_is_refused_before_any_launch():
    ours = StoplineBuiltinsProcessor(config(), torch.device("cpu"), False)
    params = SamplingParams(logit_bias={V + 3: 1.0})
    with pytest.raises(ValueError, match="logit_bias"):
        ours.update_state(BatchUpdate(batch_size=1, removed=[], added=[(0, params, [1], [])], moved=[]))
    # The slot went back to the pool: a valid request still fits every slot.
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
    with pytest.raises(ValueError, match=r"logit_bias\['xxx.*\] must be a finite number, got 'xxx") as info:
        StoplineLogitsProcessor.validate_params(SamplingParams(extra_args={"stopline": {"logit_bias": {big: big}}}))
    assert len(str(info.value)) < 400


def _v1_config():
    cfg = config()
    cfg.speculative_config = None
    return cfg


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


def test_v2_loader_refuses_a_second_instance_in_one_engine():
    """The model-runner-V2 loader hands every processor of one engine the same
    request-state object; a second StoplineLogitsProcessor on it is refused."""
    prompt_len = torch.zeros(MAX_SEQS, dtype=torch.int32)
    req_states = LogitsProcRequestState(
        device=torch.device("cpu"), max_num_reqs=MAX_SEQS, vocab_size=V, all_token_ids=None,
        prompt_len=SimpleNamespace(gpu=prompt_len), prefill_len=None, total_len=None,
    )
    first = StoplineLogitsProcessor(config(), req_states)
    with pytest.raises(ValueError, match="already loaded in this engine"):
        StoplineLogitsProcessor(config(), req_states)
    StoplineBuiltinsProcessor(config(), req_states)  # another class: allowed
    del first
    import gc

    gc.collect()
    StoplineLogitsProcessor(config(), req_states)  # the first one is gone: a rebuild may load it again


def test_docs_example_runs():
    """The vLLM example in docs/integrations.md runs as written."""
    from doc_blocks import run_python_blocks

    run_python_blocks("docs/integrations.md", "integrations.vllm")
# --- the model-runner-V2 shape ---------------------------------------------

import numpy as np  # noqa: E402
from vllm.v1.worker.gpu.sample.logits_processor.interface import LogitsContext, LogitsProcRequestState  # noqa: E402
from vllm.v1.worker.gpu.sample.logits_processor.interface import LogitsProcessor as V2LogitsProcessor  # noqa: E402


@pytest.mark.parametrize("seed", range(10))
def test_v2_shape_equals_v1_path(seed):
    """The same class under vLLM's model-runner-V2 interface (slots = persistent
    request slots, rows reordered every step, positions from ctx.pos) masks
    exactly as its V1 path, which is compared with vLLM's own steps above.
    One-token bad words only (V2 refuses longer ones, tested below)."""
    assert issubclass(StoplineBuiltinsProcessor, V2LogitsProcessor)
    rng = random.Random(seed)
    prompt_len = torch.zeros(MAX_SEQS, dtype=torch.int32)
    req_states = LogitsProcRequestState(
        device=torch.device("cpu"), max_num_reqs=MAX_SEQS, vocab_size=V, all_token_ids=None,
        prompt_len=SimpleNamespace(gpu=prompt_len, np=prompt_len.numpy()), prefill_len=None, total_len=None,
    )
    v2 = StoplineBuiltinsProcessor(config(), req_states)
    params, outs = {}, {}
    for slot in range(MAX_SEQS):
        p = random_params(rng)
        if p.bad_words_token_ids:
            p._bad_words_token_ids = [[w[-1]] for w in p.bad_words_token_ids]
        params[slot], outs[slot] = p, []
        prompt_len[slot] = rng.randint(1, 5)
        v2.add_request(slot, p)
    for _ in range(8):
        order = rng.sample(range(MAX_SEQS), rng.randint(1, MAX_SEQS))  # this step's batch, any order
        v1 = StoplineBuiltinsProcessor(config(), torch.device("cpu"), False)
        v1.update_state(BatchUpdate(batch_size=len(order), removed=[],
                                    added=[(i, params[s], [1], outs[s]) for i, s in enumerate(order)], moved=[]))
        logits = torch.randn(len(order), V)
        idx = torch.tensor(order, dtype=torch.int32)
        pos = torch.tensor([int(prompt_len[s]) + len(outs[s]) - 1 for s in order])
        ctx = LogitsContext(expanded_idx_mapping=idx, idx_mapping=idx, idx_mapping_np=np.array(order),
                            expanded_local_pos=torch.zeros(len(order), dtype=torch.int32), input_ids=None, pos=pos,
                            seq_lens_upper_bound_np=None)
        assert torch.equal(v2.apply(logits.clone(), ctx), v1.apply(logits.clone()))
        for s in order:
            outs[s].append(rng.randrange(V))


def test_v2_refuses_multi_token_bad_words():
    prompt_len = torch.zeros(MAX_SEQS, dtype=torch.int32)
    req_states = LogitsProcRequestState(
        device=torch.device("cpu"), max_num_reqs=MAX_SEQS, vocab_size=V, all_token_ids=None,
        prompt_len=SimpleNamespace(gpu=prompt_len), prefill_len=None, total_len=None,
    )
    v2 = StoplineLogitsProcessor(config(), req_states)
    with pytest.raises(ValueError, match="bad_words: multi-token"):
        v2.add_request(0, SamplingParams(extra_args={"stopline": {"bad_words": [[3, 4]]}}))
    assert v2.add_request(1, SamplingParams(extra_args={"stopline": {"bad_words": [[3]]}})) is True
    assert v2.add_request(2, SamplingParams()) is False
