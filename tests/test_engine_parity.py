"""Parity: the engine layer's stateless helpers against its per-request
objects, and (opt-in) the engines' own functions on the examples of
docs/semantics.md.

The first part always runs: each pair of stopline.engines (a stateless helper
that replays the whole history, and the per-request object fed only what is
new) must give the same answers on the same random histories.

The engine part is skipped unless ``STOPLINE_ENGINE_PARITY=1`` and the engine
imports, so the README's test command never imports vLLM or SGLang. The
statements checked there are about vLLM 0.33.0 and 0.34.0 and SGLang 0.5.23
(``VLLM_RELEASES``, ``SGLANG_RELEASES``); another version is skipped. Run it from an environment that has the engine, with this
checkout's package on the path::

    STOPLINE_ENGINE_PARITY=1 PYTHONPATH=python <python with vllm> -m pytest \\
        tests/test_engine_parity.py -k vllm -p no:cacheprovider
    STOPLINE_ENGINE_PARITY=1 PYTHONPATH=python <python with sglang> -m pytest \\
        tests/test_engine_parity.py -k sglang -p no:cacheprovider

Each check says whether the engine agrees with stopline or differs on purpose
(the entry of docs/semantics.md section 6). The engine code runs unchanged;
only the objects it reads (a request, a tokenizer) are small stand-ins.
"""

from __future__ import annotations

import importlib
import importlib.util
import math
import os
from types import SimpleNamespace as NS

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import stopline
from stopline.compat import sglang_check_finished
from stopline.engines.sglang import ReqFinish
from stopline.engines.vllm import DetokenizerStop, RequestStop, vllm_check_stop_request, vllm_detokenizer_stop
from vectors import load_vectors

# ============================================ stateless helper == per-request ==
# One history, fed in random runs: after every run the per-request object's
# answer equals the stateless helper's on the whole history so far.

_runs = st.lists(st.integers(1, 4), min_size=1, max_size=8)


def _chunks(items, sizes):
    pos = 0
    for k in sizes:
        if pos >= len(items):
            return
        yield items[pos:pos + k]
        pos += k


@settings(max_examples=200, deadline=None)
@given(
    ids=st.lists(st.integers(0, 9), min_size=1, max_size=24),
    sizes=_runs,
    max_tokens=st.none() | st.integers(1, 20),
    min_tokens=st.integers(0, 6),
    stop_token_ids=st.lists(st.integers(0, 9), max_size=2),
    eos=st.none() | st.integers(0, 9),
    ignore_eos=st.booleans(),
    room=st.integers(1, 30),
)
def test_request_stop_equals_vllm_check_stop(ids, sizes, max_tokens, min_tokens, stop_token_ids, eos, ignore_eos, room):
    """stopline.engines.vllm: RequestStop.feed/result == vllm_check_stop_request."""
    sp = NS(max_tokens=max_tokens, min_tokens=min_tokens, eos_token_id=eos, stop_token_ids=stop_token_ids,
            ignore_eos=ignore_eos, repetition_detection=None)
    request = NS(pooling_params=None, sampling_params=sp, num_prompt_tokens=3, max_tokens=max_tokens,
                 output_token_ids=[])
    ours = RequestStop(request, 3 + room)
    for run in _chunks(ids, sizes):
        request.output_token_ids.extend(run)
        stopped = ours.feed(request.output_token_ids)
        want = vllm_check_stop_request(request, 3 + room, num_new_tokens=len(run))
        assert ours.result() == want
        assert stopped == want.stopped


_PIECES = ["a", "b", "ab", "x", "", "</s>", "é", " "]


@settings(max_examples=200, deadline=None)
@given(
    tokens=st.lists(st.integers(0, len(_PIECES) - 1), min_size=1, max_size=20),
    sizes=_runs,
    stop=st.none() | st.sampled_from(["ab", "b"]) | st.lists(st.sampled_from(["ab", "ba", "x", "a</", "é "]), max_size=3),
    min_tokens=st.integers(0, 4),
    include=st.booleans(),
    terminated=st.booleans(),
)
def test_detokenizer_stop_equals_vllm_detokenizer_stop(tokens, sizes, stop, min_tokens, include, terminated):
    """stopline.engines.vllm: DetokenizerStop == vllm_detokenizer_stop, the
    last run stop-terminated or not; the streamed text adds up to output_text."""
    ours = DetokenizerStop(NS(stop=stop, min_tokens=min_tokens, include_stop_str_in_output=include))
    pieces = [_PIECES[t] for t in tokens]
    runs = list(_chunks(pieces, sizes))
    seen: list[str] = []
    streamed = ""
    for i, run in enumerate(runs):
        last = i == len(runs) - 1 and terminated
        got = ours.update(run, last)
        streamed += ours.get_next_output_text()
        seen += run
        want = vllm_detokenizer_stop(seen, stop=stop, include_stop_str_in_output=include, min_tokens=min_tokens,
                                     num_new_tokens=len(run), stop_terminated=last)
        assert (ours.stop_string, ours.output_text, ours.num_output_tokens) == (
            want.stop_string, want.output_text, want.num_output_tokens)
        if got is not None or last:
            assert got == want.stop_string
            # Finished: the stream carries the whole output text (vLLM's final output does).
            assert streamed == ours.output_text
            break
        assert ours.output_text.startswith(streamed)


_SG_TEXT = {0: "a", 1: "b", 2: "</s>", 3: "ab", 4: "1", 5: "", 6: "c", 7: " "}


@settings(max_examples=200, deadline=None)
@given(
    ids=st.lists(st.integers(-1, 8), min_size=1, max_size=20),
    sizes=_runs,
    max_new_tokens=st.integers(0, 16),
    min_new_tokens=st.integers(0, 4),
    stop_strs=st.lists(st.sampled_from(["ab", "b1", "c", "a "]), max_size=2),
    stop_regex_strs=st.lists(st.sampled_from([r"\d", "a+b", "c c"]), max_size=2),
    stop_token_ids=st.lists(st.integers(0, 7), max_size=2),
    ignore_eos=st.booleans(),
    no_stop_trim=st.booleans(),
)
def test_req_finish_equals_sglang_check_finished(ids, sizes, max_new_tokens, min_new_tokens, stop_strs,
                                                 stop_regex_strs, stop_token_ids, ignore_eos, no_stop_trim):
    """stopline.engines.sglang: ReqFinish.update == sglang_check_finished after
    every accept run, max_new_tokens=0 and invalid ids (-1, 8 with vocab_size 8)
    included."""
    kw = dict(max_new_tokens=max_new_tokens, min_new_tokens=min_new_tokens, stop_strs=stop_strs,
              stop_regex_strs=stop_regex_strs, stop_token_ids=stop_token_ids, ignore_eos=ignore_eos,
              no_stop_trim=no_stop_trim)
    ours = ReqFinish(NS(**kw), eos_token_ids={2}, vocab_size=8)
    seen: list[int] = []
    for run in _chunks(ids, sizes):
        seen += run
        texts = [_SG_TEXT.get(i, "") for i in run]
        got = ours.update(run, texts=texts)
        want = sglang_check_finished(seen, new_accepted_len=len(run), output_texts=[_SG_TEXT.get(i, "") for i in seen],
                                     eos_token_ids={2}, vocab_size=8, **kw)
        assert got == want


#: The engine releases these statements are about (docs/integrations.md, "Supported engine versions").
VLLM_RELEASES = ("0.33.0", "0.34.0")
SGLANG_RELEASES = ("0.5.23",)


def _engine(name, versions):
    if os.environ.get("STOPLINE_ENGINE_PARITY") != "1":
        pytest.skip("engine parity checks run only with STOPLINE_ENGINE_PARITY=1")
    mod = pytest.importorskip(name)
    if mod.__version__ not in versions:
        pytest.skip(f"{name} {mod.__version__} installed; these statements are about {', '.join(versions)}")
    return mod


def _v1_runner(vllm):
    """vLLM 0.33's V1 sampler modules (0.34 has only the V2 runner, whose steps are Triton kernels)."""
    if vllm.builtin is None:
        from conftest import ENGINE_VERSION_SKIP

        pytest.skip(f"{ENGINE_VERSION_SKIP}vLLM {vllm.version} has no V1 runner")


# ===================================================================== vLLM ==

@pytest.fixture(scope="module")
def vllm():
    mod = _engine("vllm", VLLM_RELEASES)
    torch_utils = importlib.import_module("vllm.utils.torch_utils")
    torch_utils.PIN_MEMORY = False  # lets the logits processor run on a CPU-only host
    return NS(
        utils=importlib.import_module("vllm.v1.core.sched.utils"),
        scheduler=importlib.import_module("vllm.v1.core.sched.scheduler"),
        detok=importlib.import_module("vllm.v1.engine.detokenizer"),
        request=importlib.import_module("vllm.v1.request"),
        builtin=(importlib.import_module("vllm.v1.sample.logits_processor.builtin")
                 if importlib.util.find_spec("vllm.v1.sample.logits_processor") else None),
        version=mod.__version__,
    )


class _VllmRequest:
    """What check_stop and _update_request_with_output read of a Request."""

    def __init__(self, *, prompt_len, max_tokens, eos, stop_token_ids, min_tokens):
        self.pooling_params = None
        self.output_token_ids: list[int] = []
        self.num_prompt_tokens = prompt_len
        self.max_tokens = max_tokens
        self.status = None
        self.stop_reason = None
        self.num_computed_tokens = 0
        self.num_output_placeholders = 0
        self.sampling_params = NS(eos_token_id=eos, stop_token_ids=list(stop_token_ids),
                                  min_tokens=min_tokens, repetition_detection=None)

    def append_output_token_ids(self, token_id):
        self.output_token_ids.append(token_id)

    @property
    def num_output_tokens(self):
        return len(self.output_token_ids)

    @property
    def num_tokens(self):
        return self.num_prompt_tokens + len(self.output_token_ids)


def _vllm_detokenizer(vllm, pieces, *, stop, min_tokens, include):
    class Detok(vllm.detok.BaseIncrementalDetokenizer):
        def decode_next(self, next_token_id):
            return pieces[next_token_id]

    params = NS(stop=stop, min_tokens=min_tokens, include_stop_str_in_output=include)
    return Detok(NS(sampling_params=params))


def _vllm_run(vllm, pieces, steps, *, prompt_len, max_model_len, max_tokens, min_tokens, eos,
              ignore_eos, stop_token_ids, stop, include):
    """One request through vLLM 0.33.0's scheduler trim and detokenizer, step by step;
    returns (finish_reason, stop_reason, token ids, text)."""
    req = _VllmRequest(prompt_len=prompt_len, max_tokens=max_tokens,
                       eos=None if ignore_eos else eos,  # update_from_generation_config
                       stop_token_ids=stop_token_ids, min_tokens=min_tokens)
    det = _vllm_detokenizer(vllm, pieces, stop=stop, min_tokens=min_tokens, include=include)
    sched = NS(max_model_len=max_model_len)
    stopped_status = vllm.request.RequestStatus.FINISHED_STOPPED
    for run in steps:
        kept, stopped = vllm.scheduler.Scheduler._update_request_with_output(sched, req, list(run))
        stop_string = det.update(kept, stopped and req.status == stopped_status)
        if stop_string is not None:
            return "stop", stop_string, det.token_ids, det.output_text
        if stopped:
            reason = "stop" if req.status == stopped_status else "length"
            return reason, req.stop_reason, det.token_ids, det.output_text
    return None, None, det.token_ids, det.output_text


def test_vllm_check_stop_strings_on_the_vendored_vectors(vllm):
    # vLLM 0.33.0 agrees on every vendored case (semantics.md 2, 6.1).
    for text, new_chars, stop, include, expected in load_vectors("check_stop_strings.json"):
        want = None if expected is None else tuple(expected)
        assert vllm.detok.check_stop_strings(text, new_chars, stop, include) == want
        assert stopline.check_stop_strings(text, new_chars, stop, include) == want


PIECES = {0: "a", 1: "b", 2: "<", 3: "ab", 4: "", 5: "<|e|>", 6: "|"}
EOS = 5


@given(
    steps=st.lists(st.lists(st.integers(0, 6), min_size=1, max_size=4), min_size=1, max_size=5),
    stop=st.lists(st.sampled_from(["ab", "b<", "<|", "a", "|e", "ba"]), max_size=3, unique=True),
    stop_token_ids=st.lists(st.sampled_from([2, 5, 6]), max_size=2, unique=True),
    max_tokens=st.integers(1, 10),
    min_tokens=st.integers(0, 4),
    room=st.integers(1, 12),
    ignore_eos=st.booleans(),
    include=st.booleans(),
)
def test_vllm_pipeline_agrees_with_the_finish_machine(vllm, steps, stop, stop_token_ids, max_tokens,
                                                      min_tokens, room, ignore_eos, include):
    # vLLM 0.33.0 agrees: check_stop per token, the trim after the stopping token,
    # the ending token's text left out unless include_stop_str_in_output, stop
    # strings gated by min_tokens, earliest end, ids after the completing token
    # dropped (semantics.md section 3; 6.3, 6.4, 6.5, 6.7, 6.10).
    min_tokens = min(min_tokens, max_tokens)
    prompt_len = 3
    got = _vllm_run(vllm, PIECES, steps, prompt_len=prompt_len, max_model_len=prompt_len + room,
                    max_tokens=max_tokens, min_tokens=min_tokens, eos=EOS, ignore_eos=ignore_eos,
                    stop_token_ids=stop_token_ids, stop=stop, include=include)
    tracker = stopline.FinishTracker(stopline.StopParams(
        prompt_len=prompt_len, max_model_len=prompt_len + room, max_tokens=max_tokens,
        min_tokens=min_tokens, eos_token_ids=[EOS], ignore_eos=ignore_eos,
        stop_token_ids=stop_token_ids, stop=stop or None, include_stop_str_in_output=include))
    for run in steps:
        tracker.update(run, [PIECES[t] for t in run])
        if tracker.finished:
            break
    assert got == (tracker.finish_reason, tracker.stop_reason, tracker.token_ids, tracker.text)


def test_vllm_min_tokens_restore_and_nan_rows(vllm):
    # vLLM 0.33.0's MinTokensLogitsProcessor restore agrees with semantics.md 8.2 on which
    # stop logits come back (only finite ones); it differs on rows with a NaN or +inf
    # outside the stops, which vLLM treats as live and stopline as empty (6.17).
    torch = pytest.importorskip("torch")
    from stopline.logits import LogitsConstraints

    ninf, nan, inf = -math.inf, math.nan, math.inf
    stops = [1, 3]
    rows = [  # (row, agrees with vLLM)
        ([ninf, 1.0, ninf, 2.0], True),  # grammar allows only the stops: restored by both
        ([nan, 1.0, ninf, 2.0], False),  # a NaN elsewhere: vLLM keeps the row live, stopline restores
        ([inf, 1.0, ninf, 2.0], False),  # +inf: likewise
        ([ninf, nan, ninf, inf], True),  # no finite stop logit to put back
        ([ninf, nan, ninf, 2.0], True),  # only the finite one comes back
    ]
    _v1_runner(vllm)
    proc = object.__new__(vllm.builtin.MinTokensLogitsProcessor)
    proc.neg_inf_tensor = torch.tensor(ninf)
    for row, agrees in rows:
        engine = torch.tensor([row])
        where = (torch.zeros(len(stops), dtype=torch.long), torch.tensor(stops))
        proc._mask_stop_token_logits(engine, where, where)
        ours = torch.tensor([row])
        cons = LogitsConstraints(1, len(row), "cpu")
        cons.set(0, min_tokens=5, stop_token_ids=stops, restore="always")
        cons.apply(ours, [0], [0], backend="torch")
        same = torch.equal(engine.isnan(), ours.isnan()) and torch.equal(engine.nan_to_num(0.0), ours.nan_to_num(0.0))
        assert same == agrees, row
        if not agrees:
            assert engine[0, 1] == ninf and ours[0, 1] == 1.0 and ours[0, 3] == 2.0


def _tokenizer_json(vocab, decoder, added=()):
    """A minimal tokenizer.json the tokenizers library and stopline both read."""
    import json

    return json.dumps({
        "version": "1.0", "truncation": None, "padding": None, "normalizer": None,
        "pre_tokenizer": None, "post_processor": None, "decoder": decoder,
        "added_tokens": [{"id": i, "content": c, "single_word": False, "lstrip": False, "rstrip": False,
                          "normalized": False, "special": True} for i, c in added],
        "model": {"type": "WordPiece", "unk_token": added[0][1] if added else "[UNK]",
                  "continuing_subword_prefix": "##", "max_input_chars_per_word": 100, "vocab": vocab},
    })


def _vllm_fast(vllm, text, prompt, *, skip=True, spaces=True, include=False):
    """vLLM 0.33.0's FastIncrementalDetokenizer over the real tokenizers library."""
    from tokenizers import Tokenizer

    params = NS(stop=None, min_tokens=0, include_stop_str_in_output=include, skip_special_tokens=skip,
                spaces_between_special_tokens=spaces)
    request = NS(sampling_params=params, request_id="r", prompt_token_ids=list(prompt))
    return vllm.detok.FastIncrementalDetokenizer(NS(_tokenizer=Tokenizer.from_str(text)), request)


# ByteLevel ids: 0 "a", 1 E2, 2 82, 3 AC ("\u20ac" is E2 82 AC), 6 the special <eos>.
BYTES = {"a": 0, "\u00e2": 1, "\u0124": 2, "\u00ac": 3, "<eos>": 6}


@pytest.mark.parametrize(("ids", "stop_ids"), [([1, 6], []), ([1, 2], [2])])
def test_vllm_keeps_no_flush_after_a_stop_token_at_the_cap(vllm, ids, stop_ids):
    # Issue 22, wrong answer 3: EOS or a stop token on the last budgeted position,
    # kept by include_stop_str_in_output, while bytes are held: vLLM emits no
    # U+FFFD, nor does stopline's ids-only decoding (semantics.md 10.3).
    decoder = {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True}
    text = _tokenizer_json(BYTES, decoder, added=[(6, "<eos>")])
    det = _vllm_fast(vllm, text, [], include=True)
    det.update(ids[:-1], False)
    det.update(ids[-1:], True)
    v = stopline.Vocabulary.from_str(text)
    p = stopline.StopParams(eos_token_ids=[6], stop_token_ids=stop_ids, max_tokens=len(ids),
                            include_stop_str_in_output=True)
    t = stopline.FinishTracker(p, vocabulary=v)
    t.update(ids)
    assert (t.text, t.finish_reason) == (det.output_text, "stop") == ("", "stop")


def test_vllm_first_added_token_after_a_prompt_differs_as_documented(vllm):
    # semantics.md 10.3: vLLM starts last_special=False whatever the prompt ends
    # with, so the first added output token after a prompt ending in one keeps
    # DecodeStream's leading space; stopline primes the rule from the prompt.
    vocab = {"hello": 0, "##s": 1, "x": 2, "[A]": 3, "[B]": 4}
    text = _tokenizer_json(vocab, {"type": "WordPiece", "prefix": "##", "cleanup": True},
                           added=[(3, "[A]"), (4, "[B]")])
    det = _vllm_fast(vllm, text, [0, 3], skip=False, spaces=False)
    theirs = [det.decode_next(4), det.decode_next(3)]
    d = stopline.Vocabulary.from_str(text).decoder_for([0, 3], skip_special_tokens=False,
                                                       spaces_between_special_tokens=False)
    ours = [d.step([4]), d.step([3])]
    assert theirs == [" [B]", "[A]"]
    assert ours == ["[B]", "[A]"]


# =================================================================== SGLang ==

@pytest.fixture(scope="module")
def sglang_req():
    _engine("sglang", SGLANG_RELEASES)
    return importlib.import_module("sglang.srt.managers.schedule_batch").Req


class _Tokenizer:
    """Renders every id, special ids included, as tokenizer.decode does by default."""

    eos_token_id = None
    additional_stop_token_ids = None

    def __init__(self, pieces):
        self.pieces = pieces

    def decode(self, ids):
        return "".join(self.pieces[i] for i in ids)


def _sglang(req_cls, ids, new, max_new, *, pieces=None, stop=(), stop_ids=None, eos=None,
            grammar=False, ignore_eos=False, vocab=None, tokenizer=None):
    """SGLang 0.5.23's Req.update_finish_state on a request holding only what it reads;
    returns (to_json, ids kept)."""
    req = object.__new__(req_cls)
    req.rid = "parity"
    req.finished_reason = req.to_finish = req.finished_len = None
    req.output_ids = list(ids)
    req.decoded_text = ""
    req.vocab_size = vocab
    req.eos_token_ids = eos
    req.tokenizer = tokenizer or _Tokenizer(pieces or {})
    req.grammar = NS(is_terminated=lambda: True) if grammar else None
    req.sampling_params = NS(
        stop_strs=list(stop), stop_regex_strs=[], stop_regex_max_len=0,
        stop_str_max_len=max((len(s) for s in stop), default=0),  # >= the token count here
        max_new_tokens=max_new, stop_token_ids=stop_ids, ignore_eos=ignore_eos)
    req.update_finish_state(new)
    if req.finished_reason is None:
        return None, None
    kept = req.finished_len if req.finished_len is not None else len(req.output_ids)
    return req.finished_reason.to_json(), kept


def _ours(ids, new, max_new, *, pieces=None, stop=(), stop_ids=None, eos=None, grammar=False,
          ignore_eos=False, vocab=None):
    r = sglang_check_finished(
        ids, new_accepted_len=new, max_new_tokens=max_new, stop_strs=list(stop) or None,
        output_texts=[pieces[i] for i in ids] if stop else None, stop_token_ids=stop_ids,
        eos_token_ids=eos, grammar_terminated=grammar, ignore_eos=ignore_eos, vocab_size=vocab)
    if r.finished_reason is None:
        return None, None
    return r.finished_reason.to_json(), r.finished_len


TEXT = {10: "a", 11: "b", 12: "c", 13: "d", 2: "</s>", 20: "STOP", 7: "<|end|>"}

AGREE = {
    "eos on the last budgeted id": (([10, 11, 2], 1, 3), dict(eos={2})),
    "stop past the budget is length at the cap": (([10, 11, 12, 2], 4, 3), dict(eos={2})),
    "eos inside a run crossing the budget": (([10, 11, 2, 12, 13, 14, 15], 7, 5), dict(eos={2})),
    "stop token id": (([10, 42], 1, 16), dict(stop_ids={42})),
    "length": (([10, 11, 12], 1, 3), dict(eos={2})),
    "grammar end inside the budget": (([10, 11], 2, 16), dict(grammar=True)),
    "grammar end past the budget": (([10, 11, 12], 3, 2), dict(grammar=True)),
    "max_new_tokens 0, plain id": (([5], 1, 0), dict(eos={2})),
    "max_new_tokens 0, eos": (([2], 1, 0), dict(eos={2})),
    "stop string before eos in one step": (([10, 20, 2], 2, 16), dict(stop=["STOP"], eos={2}, pieces=TEXT)),
}


@pytest.mark.parametrize("name", list(AGREE))
def test_sglang_agrees(sglang_req, name):
    # SGLang 0.5.23 agrees (semantics.md 6.3, 6.16, section 3).
    args, kw = AGREE[name]
    assert _sglang(sglang_req, *args, **kw) == _ours(*args, **kw)


DIFFER = {
    # name: (args, kwargs, SGLang 0.5.23's answer, stopline's answer)
    "6.3 grammar end on the last budgeted id": (
        ([10, 11], 2, 2), dict(grammar=True),
        ({"type": "length", "length": 2}, 2), ({"type": "stop", "matched": 11}, 2)),
    "6.10 eos before a stop string in one run": (
        ([10, 2, 20], 3, 16), dict(stop=["STOP"], eos={2}, pieces=TEXT),
        ({"type": "stop", "matched": "STOP"}, 3), ({"type": "stop", "matched": 2}, 2)),
    "6.6 ignore_eos and stop token ids": (
        ([10, 42], 1, 16), dict(stop_ids={42}, ignore_eos=True),
        (None, None), ({"type": "stop", "matched": 42}, 2)),
    "6.1 list order against earliest end": (
        ([10, 11, 12, 13], 4, 16), dict(stop=["cd", "ab"], pieces=TEXT),
        ({"type": "stop", "matched": "cd"}, 4), ({"type": "stop", "matched": "ab"}, 2)),
    "6.7 the stop id's own text": (
        ([10, 7], 1, 16), dict(stop=["a<"], stop_ids={7}, pieces={10: "xa", 7: "<|end|>"}),
        ({"type": "stop", "matched": "a<"}, 2), ({"type": "stop", "matched": 7}, 2)),
}


@pytest.mark.parametrize("name", list(DIFFER))
def test_sglang_differs_as_documented(sglang_req, name):
    # SGLang 0.5.23 differs where docs/semantics.md section 6 says (entry in the name).
    args, kw, theirs, ours = DIFFER[name]
    assert _sglang(sglang_req, *args, **kw) == theirs
    assert _ours(*args, **kw) == ours


def test_sglang_invalid_id_differs_as_documented(sglang_req):
    # semantics.md 6.12: SGLang 0.5.23 substitutes the id and reports "NaN happened";
    # stopline reports an error and keeps only the ids before it.
    for bad in (-1, 100):
        assert _sglang(sglang_req, [10, bad], 1, 16, eos={2}, vocab=100) == (
            {"type": "stop", "matched": "NaN happened"}, 2)
        json, kept = _ours([10, bad], 1, 16, eos={2}, vocab=100)
        assert (json["type"], kept) == ("abort", 1)


def test_sglang_tail_redecode_matches_a_held_character_as_documented(sglang_req):
    # semantics.md 10.3: SGLang's stop check re-decodes the output tail with
    # tokenizer.decode, so bytes of a character still arriving are U+FFFD there
    # and a stop containing U+FFFD matches; stopline holds them and does not.
    from tokenizers import Tokenizer

    decoder = {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True}
    text = _tokenizer_json(BYTES, decoder, added=[(6, "<eos>")])
    stop = ["a\ufffd"]
    theirs = _sglang(sglang_req, [0, 1], 1, 16, stop=stop, tokenizer=Tokenizer.from_str(text))
    assert theirs == ({"type": "stop", "matched": "a\ufffd"}, 2)
    t = stopline.FinishTracker(stopline.StopParams(stop=stop, max_tokens=16),
                               vocabulary=stopline.Vocabulary.from_str(text))
    t.update([0])
    t.update([1])
    assert (t.finished, t.text) == (False, "a")
