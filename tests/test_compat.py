"""stopline.compat on the inputs the engines' own test suites use.

Each test feeds a helper the inputs of an engine test (named in the test's
comment) and checks the decision that test expects. Where stopline decides
differently on purpose, the test asserts stopline's documented answer and its
name ends in ``_semantics_6_N``: the entry of docs/semantics.md, section 6,
that explains the difference. Each test's comment names the engine version
whose behaviour it checks (vLLM 0.33.0, SGLang 0.5.23 unless it says otherwise;
``tests/test_engine_parity.py`` runs the engines' own functions on many of these
inputs when they are installed).
"""

from __future__ import annotations

import ast
from pathlib import Path
from types import SimpleNamespace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import stopline
from stopline.compat import (
    SglangFinishReason,
    sglang_check_finished,
    to_sglang_finish_reason,
    to_vllm_status,
    vllm_check_stop,
    vllm_check_stop_request,
    vllm_detokenizer_stop,
)
from vectors import load_vectors

# vLLM's tests/v1/core/utils.py: the EOS id its scheduler tests use.
VLLM_EOS = 50256


def vllm_request(output, *, prompt_len, max_tokens, min_tokens=0, stop_token_ids=(),
                 ignore_eos=False, eos=VLLM_EOS, pooling_params=None, repetition=None):
    """A duck-typed ``vllm.v1.request.Request`` as vLLM's tests build it
    (``SamplingParams(...)`` then ``update_from_generation_config({}, EOS)``)."""
    all_stop = set(stop_token_ids) | ({eos} if eos is not None and not ignore_eos else set())
    sp = SimpleNamespace(
        max_tokens=max_tokens, min_tokens=min_tokens, eos_token_id=eos,
        stop_token_ids=list(stop_token_ids), ignore_eos=ignore_eos,
        all_stop_token_ids=all_stop, repetition_detection=repetition,
    )
    return SimpleNamespace(
        output_token_ids=list(output), num_prompt_tokens=prompt_len, max_tokens=max_tokens,
        sampling_params=sp, pooling_params=pooling_params,
    )


def check(entry, output, max_model_len, num_new_tokens=1, **kw):
    """Runs the keyword helper and the request-reading helper; they must agree."""
    req = vllm_request(output, **kw)
    by_request = vllm_check_stop_request(req, max_model_len, num_new_tokens=num_new_tokens)
    by_keywords = vllm_check_stop(
        output, num_prompt_tokens=kw["prompt_len"], max_model_len=max_model_len,
        max_tokens=kw["max_tokens"], min_tokens=kw.get("min_tokens", 0),
        eos_token_id=kw.get("eos", VLLM_EOS), stop_token_ids=kw.get("stop_token_ids", ()),
        ignore_eos=kw.get("ignore_eos", False), repetition_detection=kw.get("repetition"),
        num_new_tokens=num_new_tokens,
    )
    assert by_request == by_keywords
    return by_request if entry == "request" else by_keywords


ENTRIES = pytest.mark.parametrize("entry", ["keywords", "request"])


# ----------------------------------------------- vLLM: scheduler check_stop --
# Inputs of vLLM tests/v1/core/test_scheduler.py::test_check_stop_min_tokens
# (the revision that expects sampled stop tokens to finish below min_tokens):
# prompt [0, 1, 2], max_tokens=20, max_model_len=100.

@ENTRIES
def test_vllm_min_tokens_regular_tokens_keep_running(entry):
    r = check(entry, [10, 11, 12], 100, prompt_len=3, max_tokens=20, min_tokens=5)
    assert (r.stopped, r.status, r.finish_reason) == (False, None, None)
    assert r.num_output_tokens == 3


@ENTRIES
def test_vllm_min_tokens_sampled_eos_finishes(entry):
    # vLLM 0.33.0's check_stop agrees: it tests EOS before its min_tokens gate
    # (PR #26317 once ignored it; docs/semantics.md 6.4).
    r = check(entry, [10, 11, VLLM_EOS], 100, prompt_len=3, max_tokens=20, min_tokens=5)
    assert (r.stopped, r.status, r.finish_reason, r.stop_reason) == (
        True, "FINISHED_STOPPED", "stop", None)


@ENTRIES
def test_vllm_min_tokens_ignore_eos_suppresses_eos(entry):
    r = check(entry, [VLLM_EOS], 100, prompt_len=3, max_tokens=20, min_tokens=5,
              ignore_eos=True)
    assert not r.stopped and r.status is None


@ENTRIES
def test_vllm_min_tokens_zero_stops_on_eos(entry):
    r = check(entry, [10, VLLM_EOS], 100, prompt_len=3, max_tokens=20, min_tokens=0)
    assert (r.stopped, r.status) == (True, "FINISHED_STOPPED")


@ENTRIES
def test_vllm_min_tokens_sampled_stop_token_finishes_with_its_id(entry):
    r = check(entry, [10, 11, 42], 100, prompt_len=3, max_tokens=20, min_tokens=5,
              stop_token_ids=[42])
    assert (r.stopped, r.status, r.stop_reason) == (True, "FINISHED_STOPPED", 42)


# vLLM tests/v1/core/test_scheduler.py::test_check_stop_length_cap_below_min_tokens

@ENTRIES
def test_vllm_model_length_cap_below_min_tokens(entry):
    r = check(entry, [10, 11, 12, 13, 14, 15, 16], 10, prompt_len=3, max_tokens=500,
              min_tokens=500, ignore_eos=True)
    assert (r.stopped, r.status, r.finish_reason) == (True, "FINISHED_LENGTH_CAPPED", "length")


@ENTRIES
def test_vllm_max_tokens_clamped_below_min_tokens(entry):
    # vLLM lowers max_tokens to 3 after SamplingParams validated min_tokens=500.
    r = check(entry, [10, 11, 12], 100, prompt_len=3, max_tokens=3, min_tokens=500,
              ignore_eos=True)
    assert (r.stopped, r.status) == (True, "FINISHED_LENGTH_CAPPED")


# vLLM tests/v1/core/test_scheduler.py::test_stop_via_update_from_output: each
# request has its prompt computed and no output yet; the sampled run is fed to
# _update_request_with_output, which trims after the token that stops. The
# prompt length and model length only need to be out of the way.

RUN_PROMPT, RUN_MODEL_LEN = 10, 1024


@pytest.mark.parametrize(
    "sampled, kw, stopped, status, stop_reason, kept",
    [
        # case 1: EOS stops one request, the other keeps both tokens
        ([VLLM_EOS], dict(max_tokens=10), True, "FINISHED_STOPPED", None, [VLLM_EOS]),
        ([10, 11], dict(max_tokens=10), False, None, None, [10, 11]),
        # case 2: custom stop token inside the accepted run
        ([10, 42, 12], dict(max_tokens=10, stop_token_ids=[42, 43]), True,
         "FINISHED_STOPPED", 42, [10, 42]),
        ([13, 14], dict(max_tokens=10, stop_token_ids=[42, 43]), False, None, None, [13, 14]),
        # case 3: the run exceeds max_tokens and is truncated to it
        ([10, 11, 12], dict(max_tokens=2), True, "FINISHED_LENGTH_CAPPED", None, [10, 11]),
        ([13], dict(max_tokens=2), False, None, None, [13]),
        # case 4: ignore_eos runs past an EOS inside the run
        ([VLLM_EOS, 10, 11], dict(max_tokens=10, ignore_eos=True), False, None, None,
         [VLLM_EOS, 10, 11]),
    ],
)
@ENTRIES
def test_vllm_stop_via_update_from_output(entry, sampled, kw, stopped, status, stop_reason, kept):
    r = check(entry, sampled, RUN_MODEL_LEN, num_new_tokens=len(sampled),
              prompt_len=RUN_PROMPT, **kw)
    assert (r.stopped, r.status, r.stop_reason) == (stopped, status, stop_reason)
    assert list(r.new_token_ids) == kept
    assert r.num_output_tokens == len(kept)


def test_vllm_eos_on_last_budgeted_token_reports_stop():
    # vLLM 0.33.0's check_stop agrees (order from vllm-project/vllm#27555): EOS
    # is checked before the length cap, so an EOS as max_tokens-th token is "stop".
    r = vllm_check_stop([10, 11, VLLM_EOS], num_prompt_tokens=3, max_model_len=100,
                        max_tokens=3, eos_token_id=VLLM_EOS)
    assert (r.status, r.finish_reason) == ("FINISHED_STOPPED", "stop")


def test_vllm_history_with_ignored_eos_is_reported_as_decided():
    # Under the PR #26317 rule (gone by vLLM 0.33.0) an EOS below
    # min_tokens was ignored and decoding went on. Replayed through stopline,
    # that history had already finished.
    r = vllm_check_stop([10, VLLM_EOS, 12, 13, 14, 15], num_prompt_tokens=3,
                        max_model_len=100, max_tokens=20, min_tokens=5, eos_token_id=VLLM_EOS)
    assert r.stopped and r.decided_before_new
    assert (r.num_output_tokens, r.new_token_ids) == (2, ())


# Repetition: shared vectors (vLLM's check_sequence_repetition rule), one token
# per step; the helper reports the decision for the last token.

@pytest.mark.parametrize("tokens, sizes, expected", load_vectors("repetition.json"))
def test_vllm_repetition_detection(tokens, sizes, expected):
    max_size, min_size, min_count = sizes
    rep = SimpleNamespace(max_pattern_size=max_size, min_pattern_size=min_size,
                          min_count=min_count)
    r = vllm_check_stop(tokens, num_prompt_tokens=0, max_model_len=1 << 20,
                        repetition_detection=rep)
    assert not r.decided_before_new
    if expected:
        assert (r.stopped, r.status, r.finish_reason, r.stop_reason) == (
            True, "FINISHED_REPETITION", "repetition", "repetition_detected")
    else:
        assert not r.stopped


def test_vllm_repetition_detection_off_when_max_pattern_size_is_zero():
    # vLLM's check_sequence_repetition returns False for max_pattern_size <= 0.
    rep = {"max_pattern_size": 0, "min_pattern_size": 0, "min_count": 0}
    r = vllm_check_stop([7, 7, 7, 7, 7, 7], num_prompt_tokens=0, max_model_len=100,
                        repetition_detection=rep)
    assert not r.stopped


# Shared finish vectors that only use what vLLM's check_stop reads.

_VLLM_KEYS = {"eos_token_ids", "max_tokens", "min_tokens", "stop_token_ids", "ignore_eos",
              "prompt_len", "max_model_len", "repetition"}
_VLLM_CASES = [
    c for c in load_vectors("finish.json")
    if set(c["params"]) <= _VLLM_KEYS and "tokens" not in c
    and "grammar_terminated_at" not in c and len(c["params"].get("eos_token_ids", [])) <= 1
]


@pytest.mark.parametrize("case", _VLLM_CASES, ids=[c["name"] for c in _VLLM_CASES])
def test_vllm_check_stop_on_shared_finish_vectors(case):
    p, exp = case["params"], case["expect"]
    ids = [t for run in case["steps"] for t in run]
    eos = p.get("eos_token_ids", [None])[0] if p.get("eos_token_ids") else None
    r = vllm_check_stop(
        ids, num_prompt_tokens=p.get("prompt_len", 0),
        max_model_len=p.get("max_model_len", 1 << 20), max_tokens=p.get("max_tokens"),
        min_tokens=p.get("min_tokens", 0), eos_token_id=eos,
        stop_token_ids=p.get("stop_token_ids", ()), ignore_eos=p.get("ignore_eos", False),
        repetition_detection=p.get("repetition"), num_new_tokens=len(case["steps"][-1]),
    )
    assert r.stopped == exp["finished"]
    if exp["finished"]:
        assert r.finish_reason == exp["finish_reason"]
        assert r.status == to_vllm_status(exp["finish_reason"])
        assert r.num_output_tokens == exp["num_tokens"]
        if "stop_reason" in exp:
            assert r.stop_reason == exp["stop_reason"]


# The stateless helper against a long-lived tracker (the hot path) translated
# with to_vllm_status: any split of the history into "before" and "new" agrees.

@settings(max_examples=150, deadline=None)
@given(
    ids=st.lists(st.sampled_from([1, 2, 3, 42, VLLM_EOS]), min_size=1, max_size=25),
    data=st.data(),
    min_tokens=st.integers(0, 6),
    max_tokens=st.integers(6, 30),
    ignore_eos=st.booleans(),
)
def test_vllm_helper_matches_a_live_tracker(ids, data, min_tokens, max_tokens, ignore_eos):
    new = data.draw(st.integers(1, len(ids)))
    r = vllm_check_stop(ids, num_prompt_tokens=4, max_model_len=28, max_tokens=max_tokens,
                        min_tokens=min_tokens, eos_token_id=VLLM_EOS, stop_token_ids=[42],
                        ignore_eos=ignore_eos, num_new_tokens=new)
    tracker = stopline.FinishTracker(stopline.StopParams(
        prompt_len=4, max_model_len=28, max_tokens=max_tokens, min_tokens=min_tokens,
        eos_token_ids=[VLLM_EOS], stop_token_ids=[42], ignore_eos=ignore_eos))
    for t in ids:
        if tracker.finished:
            break
        tracker.update([t])
    assert r.stopped == tracker.finished
    assert r.status == to_vllm_status(tracker.finish_reason)
    assert r.stop_reason == tracker.stop_reason
    assert r.num_output_tokens == tracker.num_tokens
    start = len(ids) - new
    assert list(r.new_token_ids) == tracker.token_ids[start:]


def test_vllm_helper_rejects_bad_inputs():
    with pytest.raises(ValueError, match="num_new_tokens"):
        vllm_check_stop([1, 2], num_prompt_tokens=1, max_model_len=10, num_new_tokens=3)
    with pytest.raises(ValueError, match="all_stop_token_ids"):
        vllm_check_stop([1], num_prompt_tokens=1, max_model_len=10, eos_token_id=2,
                        stop_token_ids=[5], all_stop_token_ids=[2])
    with pytest.raises(ValueError, match="^num_prompt_tokens=10 leaves no room under max_model_len=10"):
        vllm_check_stop([1], num_prompt_tokens=10, max_model_len=10)
    with pytest.raises(ValueError, match="pooling"):
        vllm_check_stop_request(
            vllm_request([1], prompt_len=1, max_tokens=4, pooling_params=object()), 10)


@pytest.mark.parametrize("reason, status", [
    ("stop", "FINISHED_STOPPED"), ("length", "FINISHED_LENGTH_CAPPED"),
    ("abort", "FINISHED_ABORTED"), ("error", "FINISHED_ERROR"),
    ("repetition", "FINISHED_REPETITION"), (None, None),
])
def test_to_vllm_status(reason, status):
    # vllm/v1/request.py maps these statuses back to exactly these reasons.
    assert to_vllm_status(reason) == status


def test_to_vllm_status_rejects_unknown_reason():
    with pytest.raises(ValueError, match="eos_token"):
        to_vllm_status("eos_token")


# -------------------------------------------- vLLM: detokenizer stop strings --
# vLLM tests/detokenizer/test_min_tokens.py::test_min_tokens_with_stop: the
# prompt is "Hello, my name" and the output " is Lee, and I'm a student in the
# college of engineering", decoded with facebook/opt-125m (GPT-2 BPE). The
# pieces below are that split; the expected texts only need tokens 1-5 to end
# after "Lee" and before "student", which any split of these words satisfies.

OPT_PIECES = [" is", " Lee", ",", " and", " I", "'m", " a", " student", " in", " the",
              " college", " of", " engineering"]


@pytest.mark.parametrize("min_tokens, stop, truth", [
    (0, None, " is Lee, and I'm a student in the college of engineering"),
    (0, "e", " is L"),
    (5, "e", " is Lee, and I'm a stud"),
])
def test_vllm_detokenizer_min_tokens_with_stop(min_tokens, stop, truth):
    r = vllm_detokenizer_stop(OPT_PIECES, stop=stop, min_tokens=min_tokens,
                              num_new_tokens=len(OPT_PIECES))
    assert r.output_text == truth
    assert r.stop_string == stop


@pytest.mark.parametrize("stop", [["a", "is"], ["is", "a"]])
def test_vllm_stop_string_earliest_end_not_list_order(stop):
    # vLLM 0.33.0's check_stop_strings agrees (PR #49391, whose example this is;
    # before it the list-order loop returned "a" for ["a", "is"]).
    r = vllm_detokenizer_stop([" The user", " is a"], stop=stop)
    assert (r.stop_string, r.output_text, r.num_output_tokens) == ("is", " The user ", 2)
    assert stopline.check_stop_strings(" The user is a", 5, stop, False) == ("is", 10)


def test_vllm_detokenizer_include_stop_str_in_output():
    r = vllm_detokenizer_stop(["hello world", "."], stop=["."], include_stop_str_in_output=True)
    assert (r.stop_string, r.output_text) == (".", "hello world.")


def test_vllm_stop_string_in_accept_run_drops_later_tokens():
    # vLLM 0.33.0 agrees (BaseIncrementalDetokenizer.update, PR #47616): the ids
    # after the completing token go too.
    r = vllm_detokenizer_stop(["a", "b", "STOP", "c", "d"], stop=["STOP"], num_new_tokens=3)
    assert (r.stop_string, r.output_text, r.num_output_tokens) == ("STOP", "ab", 3)


# --------------------------------------------------------------- SGLang ------
# Req.update_finish_state in python/sglang/srt/managers/schedule_batch.py
# (SGLang 0.5.23).

def test_sglang_stop_string_wins_over_eos_in_same_step():
    # SGLang 0.5.23 agrees: sgl-project/sglang#28802 (test_stop_str_wins_over_eos_in_same_step): one
    # step accepts "STOP" and EOS; the string finishes, finished_len past it.
    r = sglang_check_finished([10, 20, 2], new_accepted_len=2, max_new_tokens=16,
                              stop_strs=["STOP"], output_texts=["a", "STOP", ""],
                              eos_token_ids={2})
    assert r.finished_reason.kind == "FINISH_MATCHED_STR"
    assert r.finished_reason.to_json() == {"type": "stop", "matched": "STOP"}
    assert r.finished_len == 2


def test_sglang_eos_inside_accept_run_sets_finished_len():
    # _check_token_based_finish: finished_len = position of the matching id + 1.
    r = sglang_check_finished([10, 11, 2, 12], new_accepted_len=3, max_new_tokens=16,
                              eos_token_ids={2})
    assert r.finished_reason == SglangFinishReason(kind="FINISH_MATCHED_TOKEN", type="stop",
                                                   matched=2)
    assert r.finished_len == 3


def test_sglang_stop_token_id_reports_the_id():
    r = sglang_check_finished([10, 42], max_new_tokens=16, stop_token_ids=[42])
    assert r.finished_reason.to_json() == {"type": "stop", "matched": 42}
    assert r.finished_len == 2


def test_sglang_length():
    r = sglang_check_finished([10, 11, 12], max_new_tokens=3, eos_token_ids={2})
    assert r.finished_reason.kind == "FINISH_LENGTH"
    assert r.finished_reason.to_json() == {"type": "length", "length": 3}
    assert r.finished_len == 3


def test_sglang_grammar_terminated_matches_last_id():
    r = sglang_check_finished([10, 11], max_new_tokens=16, grammar_terminated=True)
    assert r.finished_reason.to_json() == {"type": "stop", "matched": 11}


def test_sglang_grammar_end_on_last_budgeted_id_is_stop_semantics_6_3():
    # SGLang 0.5.23 differs: update_finish_state tests max_new_tokens before
    # grammar.is_terminated() and reports FINISH_LENGTH(length=2). stopline
    # reports the grammar finish (section 3, checks 5 and 6).
    r = sglang_check_finished([10, 11], new_accepted_len=2, max_new_tokens=2,
                              grammar_terminated=True)
    assert r.finished_reason.to_json() == {"type": "stop", "matched": 11}
    assert r.finished_len == 2


def test_sglang_grammar_end_past_the_budget_is_length():
    # SGLang 0.5.23 agrees: its max_new_tokens check comes before the grammar's.
    r = sglang_check_finished([10, 11, 12], new_accepted_len=3, max_new_tokens=2,
                              grammar_terminated=True)
    assert r.finished_reason.to_json() == {"type": "length", "length": 2}
    assert r.finished_len == 2


def test_sglang_stop_past_the_budget_is_length_at_the_cap():
    # SGLang 0.5.23 agrees (PR #33758, _cap_finished_len_at_max_new_tokens).
    r = sglang_check_finished([10, 11, 12, 2], new_accepted_len=4, max_new_tokens=3,
                              eos_token_ids={2})
    assert r.finished_reason.to_json() == {"type": "length", "length": 3}
    assert r.finished_len == 3


@pytest.mark.parametrize("ids, new", [([], 0), ([7], 1), ([2, 9], 2)],
                         ids=["no-id", "prefill-token", "eos-and-more"])
def test_sglang_max_new_tokens_zero_finishes_with_length_and_no_ids(ids, new):
    # SGLang 0.5.23's prefill-only requests (max_new_tokens=0): FINISH_LENGTH,
    # length 0, nothing kept, even when the sampled id is EOS.
    r = sglang_check_finished(ids, new_accepted_len=new, max_new_tokens=0, eos_token_ids={2})
    assert r.finished and r.finished_len == 0 and not r.decided_before_new
    assert r.finished_reason.to_json() == {"type": "length", "length": 0}
    later = sglang_check_finished([7, 8], new_accepted_len=1, max_new_tokens=0)
    assert later.decided_before_new and later.finished_len == 0


def test_sglang_running_has_no_reason():
    r = sglang_check_finished([10, 11], max_new_tokens=16, eos_token_ids={2},
                              stop_strs="zz", output_texts=["a", "b"])
    assert (r.finished, r.finished_reason, r.finished_len) == (False, None, None)


def test_sglang_eos_on_last_budgeted_id_is_stop():
    # SGLang 0.5.23 agrees (PR #33758 moved the stops before max_new_tokens).
    r = sglang_check_finished([10, 11, 2], max_new_tokens=3, eos_token_ids={2})
    assert r.finished_reason.kind == "FINISH_MATCHED_TOKEN" and r.finished_len == 3


def test_sglang_eos_before_a_stop_string_in_one_run_semantics_6_10():
    # SGLang 0.5.23 checks stop strings over the whole run before the ids
    # (PR #28802), so "STOP" after the EOS wins there (FINISH_MATCHED_STR,
    # finished_len 3); the first position decides here, as in vLLM 0.33.0
    # (_update_request_with_output trims the run at the EOS).
    r = sglang_check_finished([10, 2, 20], new_accepted_len=3, max_new_tokens=16,
                              stop_strs=["STOP"], output_texts=["a", "", "STOP"],
                              eos_token_ids={2})
    assert r.finished_reason.to_json() == {"type": "stop", "matched": 2}
    assert r.finished_len == 2


def test_sglang_eos_inside_run_crossing_budget():
    # SGLang 0.5.23 agrees (PR #33758; before it: FINISH_LENGTH, finished_len 5).
    r = sglang_check_finished([10, 11, 2, 12, 13, 14, 15], new_accepted_len=7,
                              max_new_tokens=5, eos_token_ids={2})
    assert r.finished_reason.to_json() == {"type": "stop", "matched": 2}
    assert r.finished_len == 3


def test_sglang_ignore_eos_keeps_stop_token_ids_semantics_6_6():
    # SGLang 0.5.23's _check_token_based_finish returns early on ignore_eos.
    r = sglang_check_finished([10, 42], max_new_tokens=16, stop_token_ids=[42],
                              eos_token_ids={2}, ignore_eos=True)
    assert r.finished_reason.to_json() == {"type": "stop", "matched": 42}
    eos = sglang_check_finished([10, 2], max_new_tokens=16, eos_token_ids={2}, ignore_eos=True)
    assert not eos.finished


def test_sglang_stop_strings_earliest_end_semantics_6_1():
    # SGLang 0.5.23's list-order loop matches "cd" first; stopline ends at "ab".
    r = sglang_check_finished([10, 11, 12, 13], new_accepted_len=4, max_new_tokens=16,
                              stop_strs=["cd", "ab"], output_texts=["a", "b", "c", "d"])
    assert r.finished_reason.to_json() == {"type": "stop", "matched": "ab"}
    assert r.finished_len == 2


def test_sglang_min_new_tokens_gates_stop_strings_semantics_6_5():
    # SGLang 0.5.23 does not gate stop strings by min_new_tokens; vLLM 0.33 does.
    texts = ["a", "b", "c", "b"]
    gated = sglang_check_finished([1, 2, 3, 2], new_accepted_len=4, max_new_tokens=16,
                                  stop_strs=["b"], output_texts=texts, min_new_tokens=3)
    assert gated.finished_reason.to_json() == {"type": "stop", "matched": "b"}
    assert gated.finished_len == 4
    early = sglang_check_finished([1, 2], new_accepted_len=2, max_new_tokens=16,
                                  stop_strs=["b"], output_texts=texts[:2], min_new_tokens=3)
    assert not early.finished


@pytest.mark.parametrize("bad_id", [1000, -1])
def test_sglang_invalid_token_is_an_error_semantics_6_12(bad_id):
    # SGLang 0.5.23: FINISH_MATCHED_STR("NaN happened"); stopline: error, id not kept.
    r = sglang_check_finished([10, bad_id], max_new_tokens=16, eos_token_ids={2},
                              vocab_size=1000)
    assert r.finished_reason.kind == "FINISH_ABORT" and r.finished_reason.is_error
    assert r.finished_reason.to_json()["status_code"] == 500
    assert r.finished_len == 1


def test_sglang_no_stop_trim_changes_text_not_the_decision():
    r = sglang_check_finished([1, 2], max_new_tokens=16, stop_strs=["b"],
                              output_texts=["a", "bc"], no_stop_trim=True)
    assert r.finished_reason.matched == "b" and r.finished_len == 2


def test_sglang_helper_rejects_bad_inputs():
    with pytest.raises(ValueError, match="texts"):
        sglang_check_finished([1, 2], max_new_tokens=8, stop_strs=["x"])
    with pytest.raises(ValueError, match="output_texts"):
        sglang_check_finished([1, 2], max_new_tokens=8, stop_strs=["x"], output_texts=["a"])
    with pytest.raises(ValueError, match="new_accepted_len"):
        sglang_check_finished([1], max_new_tokens=8, new_accepted_len=2)
    with pytest.raises(ValueError, match="max_new_tokens"):
        sglang_check_finished([1], max_new_tokens=-1)
    with pytest.raises(ValueError, match="new_accepted_len"):
        sglang_check_finished([1], max_new_tokens=0, new_accepted_len=2)
    with pytest.raises(ValueError, match="output_texts"):
        sglang_check_finished([1], max_new_tokens=0, stop_strs=["x"])


def test_to_sglang_finish_reason_from_a_live_tracker():
    tracker = stopline.FinishTracker(stopline.StopParams(max_tokens=8))
    tracker.update([5])
    aborted = tracker.abort()
    reason = to_sglang_finish_reason(aborted.finish_reason, aborted.matched)
    # SGLang 0.5.23's FINISH_ABORT: default message "Aborted" (is_error is
    # stopline's flag; 0.5.23's finish classes have none).
    assert reason.to_json() == {"type": "abort", "message": "Aborted", "status_code": None,
                                "err_type": None}
    assert reason.is_error
    assert to_sglang_finish_reason(None) is None
    assert to_sglang_finish_reason("length", num_tokens=7).length == 7
    with pytest.raises(ValueError, match="repetition"):
        to_sglang_finish_reason("repetition")
    with pytest.raises(ValueError, match="matched"):
        to_sglang_finish_reason("stop")


# ----------------------------------------------- OpenAI finish_reason --------
# vLLM 0.33.0's resolve_finish_reason (vllm/entrypoints/serve/utils/
# tool_calls_utils.py) gives the same answers, except that it reports "stop" for
# a finished output without a reason and for a forced named tool.

@pytest.mark.parametrize("reason, tools, expected", [
    ("stop", True, "tool_calls"),
    ("stop", False, "stop"),
    ("length", False, "length"),
    ("abort", False, "abort"),
    ("error", False, "error"),
    ("repetition", False, "repetition"),
    (None, False, None),
    (None, True, None),
])
def test_to_openai_finish_reason(reason, tools, expected):
    assert stopline.to_openai_finish_reason(reason, tools) == expected


def test_to_openai_finish_reason_length_with_tools_semantics_6_13():
    # A cut-off tool call keeps "length"; vLLM 0.33.0 agrees (older vLLM chat
    # servers reported "tool_calls" here).
    assert stopline.to_openai_finish_reason("length", True) == "length"


@pytest.mark.parametrize("bad", ["eos_token", "stop_sequence", ""])
def test_to_openai_finish_reason_rejects_other_engines_names(bad):
    # TGI's FinishReason names are not stopline's.
    with pytest.raises(ValueError):
        stopline.to_openai_finish_reason(bad, False)


def test_sglang_regex_finish_reports_the_pattern():
    """SGLang 0.5.23 reports a stop regex as FINISHED_MATCHED_REGEX(matched=pattern)."""
    r = sglang_check_finished(
        [1, 2, 3], max_new_tokens=10, new_accepted_len=3,
        stop_regex_strs=[r"\d+!"], output_texts=["a 4", "2", "! b"],
    )
    assert r.finished and r.finished_len == 3
    assert (r.finished_reason.kind, r.finished_reason.to_json()) == (
        "FINISHED_MATCHED_REGEX", {"type": "stop", "matched": r"\d+!"}
    )
    plain = to_sglang_finish_reason("stop", "42!", stop_reason=r"\d+!", stop_regex=[r"\d+!"])
    assert plain.kind == "FINISHED_MATCHED_REGEX"
    assert to_sglang_finish_reason("stop", "ab", stop_reason="ab").kind == "FINISH_MATCHED_STR"


# ------------------------------------------------- one vocabulary of reasons --


def _stub_literal(name: str) -> tuple[str, ...]:
    """The strings of a ``Literal`` alias in the hand-written stubs."""
    stub = Path(stopline.__file__).with_name("_core.pyi").read_text(encoding="utf-8")
    for node in ast.parse(stub).body:
        if isinstance(node, ast.AnnAssign) and getattr(node.target, "id", None) == name:
            literal = node.value
            assert isinstance(literal, ast.Subscript)
            elts = literal.slice.elts if isinstance(literal.slice, ast.Tuple) else [literal.slice]
            return tuple(e.value for e in elts if isinstance(e, ast.Constant))
    raise AssertionError(f"{name} is not in _core.pyi")


def test_finish_reasons_are_one_vocabulary() -> None:
    """The core's FINISH_REASONS, the stubs' Literal, compat's vLLM table and
    the OpenAI and SGLang mappings name the same reasons."""
    reasons = stopline.FINISH_REASONS
    assert reasons == ("stop", "length", "abort", "error", "repetition")
    assert _stub_literal("_FinishReason") == reasons
    assert set(_stub_literal("_OpenAIFinishReason")) == {*reasons, "tool_calls"}
    assert [stopline.to_openai_finish_reason(r) for r in reasons] == list(reasons)
    assert [to_vllm_status(r) is not None for r in reasons] == [True] * len(reasons)
    for r in reasons:
        if r == "repetition":  # SGLang has no such reason (documented)
            with pytest.raises(ValueError, match="SGLang has no finish reason"):
                to_sglang_finish_reason(r, matched=None)
        else:
            assert to_sglang_finish_reason(r, matched=5 if r == "stop" else None) is not None
    # Outside the vocabulary, all three refuse with the same message.
    for convert in (stopline.to_openai_finish_reason, to_vllm_status, to_sglang_finish_reason):
        with pytest.raises(ValueError, match="is not one of 'stop', 'length', 'abort', 'error', 'repetition'"):
            convert("bogus")
