"""stopline.engines: the rules each engine's helpers and adapters share, and
what a request can make them do (issue 22: bounded cost, bounded messages,
errors naming the field). No engine is imported; the objects read are
stand-ins with the engines' attribute names."""

from __future__ import annotations

import itertools
import math
import re
from types import SimpleNamespace as NS

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from stopline import compat
from stopline.engines import sglang as sg
from stopline.engines import vllm as vl


def sglang_params(**kw):
    base = dict(max_new_tokens=8, min_new_tokens=0, stop_strs=None, stop_regex_strs=None, stop_token_ids=None,
                ignore_eos=False, no_stop_trim=False)
    base.update(kw)
    return NS(**base)


def vllm_params(**kw):
    base = dict(stop=None, min_tokens=0, include_stop_str_in_output=False)
    base.update(kw)
    return NS(**base)


# ------------------------------------------------------------ one engine layer --


def test_compat_reexports_the_engine_layer():
    """compat keeps its names for existing callers; they are the engine layer's objects."""
    assert compat.vllm_check_stop is vl.vllm_check_stop
    assert compat.vllm_detokenizer_stop is vl.vllm_detokenizer_stop
    assert compat.to_vllm_status is vl.to_vllm_status
    assert compat.sglang_check_finished is sg.sglang_check_finished
    assert compat.to_sglang_finish_reason is sg.to_sglang_finish_reason
    assert compat.SglangFinishResult is sg.SglangFinishResult


def test_detokenizer_stop_and_helper_build_the_same_params():
    """DetokenizerStop's StopParams come from detokenizer_params, as vllm_detokenizer_stop's."""
    fields = vl.detokenizer_fields(vllm_params(stop="ab", min_tokens=2, include_stop_str_in_output=True))
    assert fields == {"stop": "ab", "min_tokens": 2, "include_stop_str_in_output": True}
    params = vl.detokenizer_params(**fields)
    assert (params.stop, params.min_tokens, params.include_stop_str_in_output) == (["ab"], 2, True)


# ------------------------------------------------ drift: ReqFinish follows SGLang --


@pytest.mark.parametrize("ids", [[7], [2], [2, 9]])
def test_req_finish_max_new_tokens_zero_follows_sglang_semantics_6_16(ids):
    """max_new_tokens=0 (prefill-only): FINISH_LENGTH(length=0), nothing kept,
    whatever the id, as sglang_check_finished (it used to raise)."""
    finish = sg.ReqFinish(sglang_params(max_new_tokens=0, stop_strs=["x"]), eos_token_ids={2})
    first = finish.update(ids[:1], texts=["x"])
    want = compat.sglang_check_finished(ids[:1], max_new_tokens=0, stop_strs=["x"], output_texts=["x"],
                                        eos_token_ids={2})
    assert first == want
    assert first.finished and first.finished_len == 0 and not first.decided_before_new
    assert first.finished_reason.to_json() == {"type": "length", "length": 0}
    again = finish.update(ids[1:], texts=["x"] * len(ids[1:]))
    assert again.finished_len == 0 and again.decided_before_new


# ---------------------------------------- issue 22 wrong answer 1: the hold-back --


@pytest.mark.parametrize("include", [False, True])
def test_detokenizer_stop_releases_held_text_after_a_stop_terminated_update(include):
    """stop=["ab"], piece "xa" (the "a" held as a live prefix of "ab"), then a
    stop-terminated "</s>": the stream carries "xa" (and "</s>" with
    include_stop_str_in_output), as vLLM's final output does."""
    d = vl.DetokenizerStop(vllm_params(stop=["ab"], include_stop_str_in_output=include))
    assert d.update(["xa"]) is None
    streamed = d.get_next_output_text()
    assert d.update(["</s>"], stop_terminated=True) is None
    streamed += d.get_next_output_text()
    want = "xa</s>" if include else "xa"
    assert streamed == d.output_text == want
    assert d.num_output_tokens == 2
    assert d.update(["more"]) is None and d.get_next_output_text() == ""


def test_flags_take_numpy_bools_as_bools():
    """A numpy bool scalar (what an array's element is) is read as the bool it holds, as
    numpy's ints are read as ints; a str is still refused."""
    np = pytest.importorskip("numpy")
    for value in (True, False):
        want = compat.vllm_detokenizer_stop(["xa", "</s>"], stop=["ab"], stop_terminated=value)
        got = compat.vllm_detokenizer_stop(["xa", "</s>"], stop=["ab"], stop_terminated=np.bool_(value))
        assert (got.stop_string, got.output_text, got.num_output_tokens) == (
            want.stop_string, want.output_text, want.num_output_tokens)
        assert (compat.sglang_check_finished([1, 2], max_new_tokens=8, grammar_terminated=np.bool_(value))
                == compat.sglang_check_finished([1, 2], max_new_tokens=8, grammar_terminated=value))
    with pytest.raises(TypeError, match="grammar_terminated must be a bool, got str"):
        compat.sglang_check_finished([1], max_new_tokens=4, grammar_terminated="True")


def test_vllm_detokenizer_stop_takes_stop_terminated():
    r = compat.vllm_detokenizer_stop(["xa", "</s>"], stop=["ab"], stop_terminated=True)
    assert (r.stop_string, r.output_text, r.num_output_tokens) == (None, "xa", 2)
    # Passing the ending token's piece as "" (the documented way) gives the same.
    r2 = compat.vllm_detokenizer_stop(["xa", ""], stop=["ab"])
    assert r2.output_text == "xa"


# --------------------------------------- issue 22: request-controlled cost --


@pytest.mark.parametrize("field, value, says", [
    ("stop_token_ids", range(10**8), "stop_token_ids has 100000000 entries; at most 65536 are accepted"),
    ("stop_strs", itertools.repeat("a"), "stop_strs has more than 1024 entries; at most 1024 are accepted"),
    ("stop_regex_strs", itertools.repeat("a"), "stop_regex_strs has more than 64 entries; at most 64 are accepted"),
])
def test_req_finish_reads_request_lists_under_their_caps(field, value, says):
    with pytest.raises(ValueError, match=says):
        sg.ReqFinish(sglang_params(**{field: value}))


def test_req_finish_reads_eos_ids_under_the_cap():
    with pytest.raises(ValueError, match="eos_token_ids has 100000000 entries; at most 65536"):
        sg.ReqFinish(sglang_params(), eos_token_ids=range(10**8))
    with pytest.raises(ValueError, match="eos_token_ids has more than 65536 entries"):
        sg.ReqFinish(sglang_params(), eos_token_ids=itertools.count())


def test_req_finish_update_reads_ids_under_the_cap():
    finish = sg.ReqFinish(sglang_params())
    with pytest.raises(ValueError, match="new_accepted_ids has 1000000000 entries; at most 4194304"):
        finish.update(range(10**9))
    with pytest.raises(ValueError, match="new_accepted_ids has more than 4194304 entries"):
        finish.update(itertools.count())
    assert not finish.update([5]).finished  # nothing was fed by the refused calls
    assert finish.tracker.num_tokens == 1


@pytest.mark.parametrize("value, raises, says", [
    (math.nan, TypeError, "max_new_tokens must be an int, got float"),
    (None, TypeError, "max_new_tokens must be an int, got NoneType"),
    ("5", TypeError, "max_new_tokens must be an int, got str"),
    (-1, ValueError, "max_new_tokens must be >= 0, got -1"),
])
def test_req_finish_max_new_tokens_errors_name_the_field(value, raises, says):
    with pytest.raises(raises, match=says):
        sg.ReqFinish(sglang_params(max_new_tokens=value))
    with pytest.raises(raises, match=says):
        compat.sglang_check_finished([1], max_new_tokens=value)


@pytest.mark.parametrize("value, says", [
    ([1, "a"], r"stop_token_ids\[1\] must be an int, got str"),
    ([[1]], r"stop_token_ids\[0\] must be an int, got list"),
    ([1.0], r"stop_token_ids\[0\] must be an int, got float"),
])
def test_req_finish_stop_token_ids_errors_name_the_entry(value, says):
    with pytest.raises(TypeError, match=says):
        sg.ReqFinish(sglang_params(stop_token_ids=value))
    with pytest.raises(TypeError, match=says):
        compat.sglang_check_finished([1], max_new_tokens=4, stop_token_ids=value)


def test_req_finish_min_new_tokens_named():
    with pytest.raises(TypeError, match="min_new_tokens must be an int, got float"):
        sg.ReqFinish(sglang_params(min_new_tokens=math.nan))


# ----------------------------------------- issue 22: bounded messages --


def test_to_sglang_finish_reason_message_is_bounded():
    with pytest.raises(ValueError, match="is not one of 'stop'") as info:
        compat.to_sglang_finish_reason("x" * 10**6)
    assert len(str(info.value)) < 300


def test_to_vllm_status_message_is_bounded():
    with pytest.raises(ValueError, match="is not one of 'stop'") as info:
        compat.to_vllm_status("x" * 10**6)
    assert len(str(info.value)) < 300


@pytest.mark.parametrize("reason", [["stop"], {"stop": 1}, 5])
def test_to_vllm_status_unhashable_or_non_str_reason_names_the_field(reason):
    with pytest.raises(TypeError, match="finish_reason must be one of 'stop', .*, got"):
        compat.to_vllm_status(reason)


def test_to_sglang_finish_reason_non_str_reason_names_the_field():
    with pytest.raises(TypeError, match="finish_reason must be one of"):
        compat.to_sglang_finish_reason(["stop"], 5)


# ----------------------------------------- issue 22: validation --


def test_vllm_check_stop_max_tokens_str_names_the_field():
    with pytest.raises(TypeError, match="max_tokens must be an int, got str"):
        compat.vllm_check_stop([1], num_prompt_tokens=1, max_model_len=10, max_tokens="5")
    with pytest.raises(TypeError, match="min_tokens must be an int, got str"):
        compat.vllm_check_stop([1], num_prompt_tokens=1, max_model_len=10, max_tokens=5, min_tokens="1")


def test_sglang_check_finished_max_new_tokens_none_names_the_field():
    with pytest.raises(TypeError, match="max_new_tokens must be an int, got NoneType"):
        compat.sglang_check_finished([1], max_new_tokens=None)


@pytest.mark.parametrize("matched", [1.5, True, b"x", [1]])
def test_to_sglang_finish_reason_refuses_a_match_that_is_not_an_id_or_str(matched):
    """1.5 used to become FINISH_MATCHED_TOKEN(matched=1)."""
    with pytest.raises(TypeError, match="matched must be a stop string or a token id, got"):
        compat.to_sglang_finish_reason("stop", matched)
    assert compat.to_sglang_finish_reason("stop", 1).matched == 1


def test_vllm_all_stop_token_ids_message_is_bounded():
    with pytest.raises(ValueError, match=r"all_stop_token_ids lacks \[0, 1, 2, 3, 4, 5, 6, 7\] \.\.\.") as info:
        compat.vllm_check_stop([1], num_prompt_tokens=1, max_model_len=10, stop_token_ids=range(60000),
                               all_stop_token_ids=[])
    assert len(str(info.value)) < 300


def test_request_stop_fields_named():
    sp = NS(max_tokens=None, min_tokens=0, eos_token_id="2", stop_token_ids=None, ignore_eos=False)
    request = NS(pooling_params=None, sampling_params=sp, num_prompt_tokens=1, max_tokens=4, output_token_ids=[])
    with pytest.raises(TypeError, match="eos_token_id must be an int, got str"):
        vl.RequestStop(request, 10)


# A bad id is reported in the caller's list at the caller's index, whatever
# list the core was handed (a split history, a step's slice, one id as an int).
BAD_IDS = [
    (-2, ValueError, "not_a_token_id", "=-2 is not a valid token id (must be in [0, 2**32))"),
    (2**32, ValueError, "not_a_token_id", "=4294967296 is not a valid token id (must be in [0, 2**32))"),
    (2**70, ValueError, "out_of_range", "=1180591620717411303424 is out of range"),
    (1.5, TypeError, "wrong_type", " must be an int, got float"),
]


def _request_stop():
    sp = NS(max_tokens=None, min_tokens=0, eos_token_id=2, stop_token_ids=None, ignore_eos=False)
    request = NS(pooling_params=None, sampling_params=sp, num_prompt_tokens=3, max_tokens=20, output_token_ids=[])
    return vl.RequestStop(request, 100)


def _feeds(bad):
    """(label, call, the field the error must name) for one bad id."""
    def request_stop(before, ids):
        r = _request_stop()
        if before:
            r.feed(before)
        return lambda: r.feed(ids)

    def req_finish(ids):
        return lambda: sg.ReqFinish(sglang_params(max_new_tokens=20)).update(ids)

    def detok(ids, **kw):
        return lambda: vl.DetokenizerStop(vllm_params(stop=["x"])).update(["a"] * len(ids), token_ids=ids, **kw)

    return [
        ("vllm_check_stop, in the history", lambda: compat.vllm_check_stop(
            [5, bad, 6, 7], num_prompt_tokens=3, max_model_len=100, num_new_tokens=2), "output_token_ids[1]"),
        ("vllm_check_stop, in the new ids", lambda: compat.vllm_check_stop(
            [5, 6, 7, bad], num_prompt_tokens=3, max_model_len=100, num_new_tokens=2), "output_token_ids[3]"),
        ("RequestStop, one new id", request_stop([5, 6], [5, 6, bad]), "output_token_ids[2]"),
        ("RequestStop, a run after a step", request_stop([5], [5, 6, 7, bad]), "output_token_ids[3]"),
        ("RequestStop, a first run", request_stop([], [5, bad]), "output_token_ids[1]"),
        ("vllm_detokenizer_stop", lambda: compat.vllm_detokenizer_stop(
            ["a", "b", "c"], stop=["x"], token_ids=[5, 6, bad], num_new_tokens=1), "token_ids[2]"),
        ("vllm_detokenizer_stop, stop-terminated", lambda: compat.vllm_detokenizer_stop(
            ["a", "b"], stop=["x"], token_ids=[5, bad], stop_terminated=True), "token_ids[1]"),
        ("DetokenizerStop", detok([5, bad]), "token_ids[1]"),
        ("DetokenizerStop, stop-terminated", detok([5, bad], stop_terminated=True), "token_ids[1]"),
        ("sglang_check_finished, in the history", lambda: compat.sglang_check_finished(
            [5, bad, 6, 7], max_new_tokens=20, new_accepted_len=2), "output_ids[1]"),
        ("sglang_check_finished, in the new ids", lambda: compat.sglang_check_finished(
            [5, 6, 7, bad], max_new_tokens=20, new_accepted_len=2), "output_ids[3]"),
        ("ReqFinish", req_finish([5, bad]), "new_accepted_ids[1]"),
        ("vllm stop_token_ids (not reordered by the adapter)", lambda: compat.vllm_check_stop(
            [5], num_prompt_tokens=3, max_model_len=100, stop_token_ids=[9, bad]), "stop_token_ids[1]"),
        ("vllm eos_token_id", lambda: compat.vllm_check_stop(
            [5], num_prompt_tokens=3, max_model_len=100, eos_token_id=bad), "eos_token_id"),
        ("sglang eos_token_ids (not reordered by the adapter)", lambda: compat.sglang_check_finished(
            [5], max_new_tokens=20, eos_token_ids=[9, bad]), "eos_token_ids[1]"),
    ]


@pytest.mark.parametrize("bad, raises, kind, says", BAD_IDS, ids=["negative", "2**32", "2**70", "float"])
def test_a_bad_id_is_named_in_the_callers_list_at_the_callers_index(bad, raises, kind, says):
    """The adapters used to pass on the core's names: `token_ids[0]` for the
    second id of `vllm_check_stop`'s history (the core indexes the step it
    was given), `eos_token_ids[0]` for vLLM's `eos_token_id`, and an index
    into the sorted stop ids."""
    for label, call, field in _feeds(bad):
        if raises is TypeError and field.startswith(("stop_token_ids", "eos_token")):
            kind_expected = "wrong_type"
        else:
            kind_expected = kind
        with pytest.raises(raises) as info:
            call()
        e = info.value
        assert (e.field, e.kind, str(e)) == (field, kind_expected, field + says), label


# Every error an engine entry point raises names one of its own inputs: a
# parameter, or an attribute it reads from the engine's request / params.
_JUNK = [-1, 2**32, 2**70, "x", "", 1.5, math.nan, None, True, [], [-1], [2**70], ["a"], [""], [1.5], {"a": 1},
         range(3), b"ab", object(), {"max_pattern_size": 3, "min_pattern_size": 5, "min_count": 2},
         {"max_pattern_size": 3, "min_count": 1}, {"max_pattern_size": 2**62, "min_count": 2**62},
         "\ud800", ["\ud800"], ["a", "\ud800"], [6, 7], [[6, 7]], [5], [6], [(2,)]]
_VLLM_READS = {"num_prompt_tokens", "max_tokens", "min_tokens", "eos_token_id", "stop_token_ids", "ignore_eos",
               "all_stop_token_ids", "repetition_detection", "thinking_token_budget"}


def _entries():
    """(name, valid inputs, call(inputs), the names an error may start with)."""
    def request_stop(kw):
        sp = NS(**{k: kw[k] for k in _VLLM_READS - {"num_prompt_tokens", "max_tokens"}})
        request = NS(pooling_params=None, sampling_params=sp, num_prompt_tokens=kw["num_prompt_tokens"],
                     max_tokens=kw["max_tokens"], output_token_ids=[])
        r = vl.RequestStop(request, kw["max_model_len"])
        ids = kw["output_token_ids"]
        if isinstance(ids, list) and len(ids) > 1:  # then the rest: a step that starts past 0
            r.feed(ids[:1])
        return r.feed(ids)

    def req_finish(kw):
        sp = sglang_params(**{k: kw[k] for k in ("max_new_tokens", "min_new_tokens", "stop_strs", "stop_regex_strs",
                                                  "stop_token_ids", "ignore_eos", "no_stop_trim")})
        f = sg.ReqFinish(sp, eos_token_ids=kw["eos_token_ids"], vocab_size=kw["vocab_size"])
        return f.update(kw["new_accepted_ids"], kw["texts"])

    def detok(kw):
        d = vl.DetokenizerStop(vllm_params(stop=kw["stop"], min_tokens=kw["min_tokens"],
                                           include_stop_str_in_output=kw["include_stop_str_in_output"]))
        return d.update(kw["new_texts"], kw["stop_terminated"], kw["token_ids"])

    vllm = dict(num_prompt_tokens=3, max_model_len=100, max_tokens=20, min_tokens=1, eos_token_id=2,
                stop_token_ids=[7], ignore_eos=False, all_stop_token_ids=None, repetition_detection=None,
                thinking_token_budget=None, output_token_ids=[8, 5, 9, 6], num_new_tokens=2, reasoning=R56,
                prompt_token_ids=[1, 5])
    sglang = dict(output_ids=[8, 5, 9, 6], max_new_tokens=20, new_accepted_len=2, stop_strs=["x"],
                  stop_regex_strs=["y+"], output_texts=["a", "b", "c", "d"], stop_token_ids=[7], eos_token_ids=[2],
                  ignore_eos=False, min_new_tokens=1, vocab_size=50, no_stop_trim=False, grammar_terminated=False,
                  reasoning=R56, prompt_ids=[1, 5], thinking_budget=None)
    detok_kw = dict(texts=["a", "b", "c"], stop=["x"], include_stop_str_in_output=False, min_tokens=1,
                    num_new_tokens=1, stop_terminated=False, token_ids=[5, 6, 7])
    return [
        ("vllm_check_stop", vllm, lambda kw: compat.vllm_check_stop(**kw), set(vllm)),
        ("vllm_detokenizer_stop", detok_kw, lambda kw: compat.vllm_detokenizer_stop(**kw), set(detok_kw)),
        ("sglang_check_finished", sglang, lambda kw: compat.sglang_check_finished(**kw), set(sglang)),
        ("RequestStop", {k: v for k, v in vllm.items() if k not in ("num_new_tokens", "reasoning", "prompt_token_ids")},
         request_stop, set(vllm) | {"request"}),
        ("ReqFinish", dict(max_new_tokens=20, min_new_tokens=1, stop_strs=["x"], stop_regex_strs=["y+"],
                           stop_token_ids=[7], ignore_eos=False, no_stop_trim=False, eos_token_ids=[2],
                           vocab_size=50, new_accepted_ids=[5, 6], texts=["a", "b"]), req_finish,
         {"max_new_tokens", "min_new_tokens", "stop_strs", "stop_regex_strs", "stop_token_ids", "ignore_eos",
          "no_stop_trim", "eos_token_ids", "vocab_size", "new_accepted_ids", "texts"}),
        ("DetokenizerStop", dict(stop=["x"], min_tokens=1, include_stop_str_in_output=False, new_texts=["a", "b"],
                                 stop_terminated=False, token_ids=[5, 6]), detok,
         {"stop", "min_tokens", "include_stop_str_in_output", "new_texts", "stop_terminated", "token_ids"}),
    ]


@settings(max_examples=300, deadline=None)
@given(entry=st.integers(0, 5), bad=st.lists(st.tuples(st.integers(0, 20), st.sampled_from(_JUNK)), min_size=1,
                                              max_size=2))
def test_every_error_of_an_engine_entry_names_one_of_its_inputs(entry, bad):
    name, valid, call, names = _entries()[entry]
    kw = dict(valid)
    keys = sorted(valid)
    for i, value in bad:
        kw[keys[i % len(keys)]] = value
    try:
        call(kw)
    except (stopline.StoplineValueError, stopline.StoplineTypeError, stopline.StoplineOverflowError) as e:
        root = re.match(r"[A-Za-z_]+", e.field or "")
        assert root is not None and root.group() in names, f"{name}: {e.field!r} ({e})"
    # Anything else (an AttributeError, a bare ValueError, ...) fails the test.


R56 = {"reasoning_start_id": 5, "reasoning_end_id": 6}


@pytest.mark.parametrize("call, field, says", [
    (lambda: compat.sglang_check_finished([1], max_new_tokens=4, stop_token_ids=[9, 6], reasoning=R56),
     "stop_token_ids[1]", "=6 overlaps reasoning_end_id"),
    (lambda: compat.vllm_check_stop([1], num_prompt_tokens=1, max_model_len=10, eos_token_id=6, reasoning=R56),
     "eos_token_id", "=6 overlaps reasoning_end_id"),
    (lambda: compat.sglang_check_finished([1], max_new_tokens=4, reasoning=R56, prompt_ids=[1, -1]),
     "prompt_ids[1]", "=-1 is not a valid token id"),
    (lambda: vl.DetokenizerStop(vllm_params(stop=["x"])).update(["a", "\ud800"]),
     "new_texts[1]", " is not valid Unicode"),
    (lambda: compat.vllm_detokenizer_stop(["a", "b", "\ud800"], stop=["x"], stop_terminated=True,
                                          include_stop_str_in_output=True, num_new_tokens=3,
                                          reasoning={"tool_call_markers": [("<tool>", "</tool>")]}),
     "texts[2]", " is not valid Unicode"),
    (lambda: compat.vllm_check_stop([1], num_prompt_tokens=1, max_model_len=10,
                                    repetition_detection={"max_pattern_size": 3, "min_pattern_size": 4, "min_count": 2}),
     "repetition_detection.min_pattern_size", "=4 is greater than repetition_detection.max_pattern_size=3"),
], ids=["overlap, caller's index", "vLLM's one EOS id", "SGLang's prompt_ids", "DetokenizerStop's new_texts",
        "the last piece fed alone", "repetition_detection"])
def test_errors_from_the_core_name_the_callers_field(call, field, says):
    with pytest.raises(ValueError) as info:
        call()
    assert info.value.field == field and str(info.value).startswith(field + says), str(info.value)


@pytest.mark.parametrize("one", [[6, 7], b"\x02", (2,), 1.5])
def test_request_stop_refuses_a_list_in_place_of_the_one_new_id(one):
    """With one new id the adapter passes it to the core as an int; a list
    or bytes there used to be read as several ids (feeding 6 and 7 while
    the request grew by one, or finishing on a hidden EOS)."""
    r = _request_stop()
    r.feed([5])
    with pytest.raises(TypeError, match=r"^output_token_ids\[1\] must be an int, got "):
        r.feed([5, one])
    assert r.tracker.token_ids == [5] and r.feed([5, 7]) is False


def test_request_stop_caps_the_ids_new_in_one_call():
    cap = stopline.LIMITS["max_step_tokens"]
    r = _request_stop()
    r.feed([5])
    with pytest.raises(ValueError) as info:
        r.feed([5] * (cap + 2))
    assert (info.value.field, info.value.kind) == ("output_token_ids", "too_many")
    assert str(info.value) == f"output_token_ids grew by {cap + 1} ids in one call; at most {cap} are accepted"
    assert r.tracker.token_ids == [5]


def test_a_refused_step_feeds_nothing():
    r = _request_stop()
    r.feed([5, 6])
    with pytest.raises(ValueError, match=r"output_token_ids\[3\]=-1"):
        r.feed([5, 6, 7, -1])
    assert r.feed([5, 6, 7, 8]) is False and r.tracker.token_ids == [5, 6, 7, 8]


def test_request_stop_refuses_an_output_that_shrank():
    """A RequestStop feeds the ids past those it has seen; an output list
    shorter than that (another request's, or a reset one) used to be read
    from its end again, so [5, 6, 7] then [5] then [5, 6, 7] counted
    [5, 6, 7, 6, 7]. It is refused naming output_token_ids, nothing fed."""
    sp = NS(max_tokens=10, min_tokens=0, eos_token_id=2, stop_token_ids=None, ignore_eos=False)
    request = NS(pooling_params=None, sampling_params=sp, num_prompt_tokens=3, max_tokens=None, output_token_ids=[])
    r = vl.RequestStop(request, 100)
    assert r.feed([5, 6, 7]) is False
    with pytest.raises(ValueError, match="output_token_ids shrank from 3 to 1 ids") as info:
        r.feed([5])
    assert info.value.field == "output_token_ids"
    assert r.feed([5, 6, 7, 8]) is False
    assert r.tracker.token_ids == [5, 6, 7, 8]


def test_request_stop_refuses_a_dict_for_the_output():
    """feed indexes its argument: a dict {0: 2} was read as the one token 2 (an EOS)."""
    sp = NS(max_tokens=10, min_tokens=0, eos_token_id=2, stop_token_ids=None, ignore_eos=False)
    request = NS(pooling_params=None, sampling_params=sp, num_prompt_tokens=3, max_tokens=None, output_token_ids=[])
    r = vl.RequestStop(request, 100)
    with pytest.raises(TypeError, match="output_token_ids must be a sequence of ints, got dict") as info:
        r.feed({0: 2})
    assert info.value.field == "output_token_ids" and r.tracker.token_ids == []


def test_detokenizer_stop_update_reads_under_the_cap():
    d = vl.DetokenizerStop(vllm_params(stop=["ab"]))
    with pytest.raises(ValueError, match="new_texts has more than 4194304 entries"):
        d.update(itertools.repeat("a"))
    with pytest.raises(TypeError, match=r"new_texts\[0\] must be str, got int"):
        d.update([1])



# ------------------------------------- ReqFinish decodes through the core --

_WORDS = ["The", " cat", " sat", " on", " the", " mat", ".", " Then", " it", " ran", " away", "!", "\n", " 42",
          " é", " 😀", "<|im_end|>"]


@pytest.fixture(scope="module")
def smollm2():
    pytest.importorskip("transformers")
    from stopline.tools.models import load_smollm2_tokenizer

    return load_smollm2_tokenizer()


def _decode_stream_pieces(tok, prompt, ids):
    """The pieces the DecodeStream path gave (ReqFinish before the core path)."""
    from tokenizers.decoders import DecodeStream

    stream = DecodeStream(ids=prompt[-8:], skip_special_tokens=False)
    return [stream.step(tok.backend_tokenizer, i) or "" for i in ids]


@pytest.mark.parametrize("seed", range(12))
def test_req_finish_core_decoding_agrees_with_decode_stream(smollm2, seed):
    """A ReqFinish given the tokenizer decodes ids in the core (ids-only
    tracker; per-id IncrementalDecoder when the engine's vocabulary is wider)
    and finishes where the same ReqFinish fed DecodeStream's pieces does, on
    real text with stop strings, regexes and stop ids (runs of 1-3 ids)."""
    import random

    rng = random.Random(seed)
    tok = smollm2
    prompt = tok.encode("Story: ")
    ids = tok.encode("".join(rng.choice(_WORDS) for _ in range(40)))[:40]
    kw = rng.choice([dict(stop_strs=[" mat", "ran away"]), dict(stop_regex_strs=[r"\d+", r"[.!]\n"]),
                     dict(stop_strs=["é 😀"]), dict(stop_token_ids=[ids[rng.randrange(len(ids))]])])
    sp = sglang_params(max_new_tokens=rng.randint(1, 40), no_stop_trim=rng.random() < 0.5, **kw)
    wide = rng.random() < 0.5  # the model's vocabulary padded past the tokenizer's
    vocab = len(tok) + (64 if wide else 0)
    ours = sg.ReqFinish(sp, eos_token_ids={2}, vocab_size=vocab, tokenizer=tok, prompt_ids=prompt)
    assert ours._mode == ("decoder" if wide else "ids")
    before = sg.ReqFinish(sp, eos_token_ids={2}, vocab_size=vocab)
    pieces = _decode_stream_pieces(tok, prompt, ids)
    pos = 0
    while pos < len(ids):
        k = rng.randint(1, 3)
        got = ours.update(ids[pos:pos + k])
        want = before.update(ids[pos:pos + k], texts=pieces[pos:pos + k])
        assert got == want
        pos += k
        if got.finished:
            break
    assert ours.tracker.token_ids == before.tracker.token_ids


def test_req_finish_id_past_the_tokenizer_has_no_text(smollm2):
    """An id inside the engine's (padded) vocabulary but past the tokenizer's
    decodes to "" (as DecodeStream), not an error; past vocab_size it is SGLang's
    invalid id (FINISH_ABORT here, semantics.md 6.12)."""
    tok = smollm2
    finish = sg.ReqFinish(sglang_params(stop_strs=["x"]), vocab_size=len(tok) + 64, tokenizer=tok)
    assert not finish.update([len(tok) + 3]).finished
    assert finish.tracker.text == ""
    res = finish.update([len(tok) + 64])
    assert res.finished and res.finished_reason.kind == "FINISH_ABORT" and res.finished_len == 1


def test_req_finish_with_a_tokenizer_refuses_texts(smollm2):
    finish = sg.ReqFinish(sglang_params(), vocab_size=len(smollm2), tokenizer=smollm2)
    with pytest.raises(ValueError, match="texts: this ReqFinish decodes the ids itself"):
        finish.update([5], texts=["x"])


def test_vocabulary_for_is_built_once_per_tokenizer(smollm2):
    assert sg.vocabulary_for(smollm2) is sg.vocabulary_for(smollm2)
    assert sg.vocabulary_for(smollm2).vocab_size == len(smollm2)


def test_req_finish_falls_back_to_decode_stream_for_a_refused_decoder():
    """A decoder the core refuses (BPEDecoder, semantics.md 10.1): ReqFinish
    decodes with tokenizers' DecodeStream and still finishes on the stop string."""
    tokenizers = pytest.importorskip("tokenizers")
    words = {"<unk>": 0, "hello</w>": 1, "wor": 2, "ld</w>": 3, "stop</w>": 4}
    tok = tokenizers.Tokenizer(tokenizers.models.WordLevel(words, unk_token="<unk>"))
    tok.decoder = tokenizers.decoders.BPEDecoder()
    assert sg.vocabulary_for(tok) is None
    finish = sg.ReqFinish(sglang_params(stop_strs=["world stop"]), vocab_size=5, tokenizer=tok)
    assert finish._mode == "stream"
    assert not finish.update([1, 2, 3]).finished
    res = finish.update([4])
    assert res.finished and res.finished_reason.to_json() == {"type": "stop", "matched": "world stop"}


# ------------------------------------------ reasoning: one reader (semantics 11) --

import random  # noqa: E402

from stopline.engines import Reasoning, reasoning_config, reasoning_from_markers  # noqa: E402

IDS = reasoning_config({"reasoning_start_id": 5, "reasoning_end_id": 6})
TEXT = reasoning_config({"reasoning_start": "<think>", "reasoning_end": "</think>"})


def test_compat_reexports_the_reasoning_reader():
    assert compat.reasoning_config is reasoning_config and isinstance(compat.reasoning_config(IDS), Reasoning)
    assert compat.vllm_reasoning is vl.vllm_reasoning and compat.sglang_reasoning is sg.sglang_reasoning
    assert reasoning_config(IDS) is IDS and reasoning_config(None) is None


def test_reasoning_config_reads_a_span_pair_under_a_cap():
    """A span pair given as an endless iterator was copied with tuple() and
    grew until memory ran out; it is refused naming the pair, as
    StopParams names a pair of the wrong length (kind "count"), and a
    one-shot iterator pair is kept as a tuple every request can read."""
    with pytest.raises(ValueError, match=r"tool_call_markers\[0\] has more than 2 items") as info:
        reasoning_config({"tool_call_markers": [itertools.repeat("<a>")]})
    assert (info.value.field, info.value.kind) == ("tool_call_markers[0]", "count")
    with pytest.raises(ValueError, match=r"tool_call_marker_ids\[1\] has 3 items") as info:
        reasoning_config({"tool_call_marker_ids": [(1, 2), [3, 4, 5]]})
    assert info.value.kind == "count"
    r = reasoning_config({"tool_call_markers": [iter(["<a>", "</a>"])]})
    assert r is not None and r.options["tool_call_markers"] == (("<a>", "</a>"),)
    assert stopline.StopParams(**r.options).tool_call_markers == [("<a>", "</a>")]


@pytest.mark.parametrize("value, raises, field, says", [
    (["<think>"], TypeError, "reasoning", "reasoning must be a mapping"),
    ({"reasoning_end": "</think>", "stop": ["x"]}, ValueError, "reasoning", "unknown keys ['stop']"),
    ({"reasoning_start": "<think>"}, ValueError, "reasoning_end", "reasoning_end is required"),
    ({"reasoning_start": "", "reasoning_end": "</think>"}, ValueError, "reasoning_start", "empty"),
    ({"reasoning_end_id": 6, "reasoning_end_ids": [6, "7"]}, TypeError, "reasoning_end_ids[1]", "must be an int"),
    ({"reasoning_end_id": -1}, ValueError, "reasoning_end_id", "reasoning_end_id"),
    ({"reasoning_end_id": 6, "reasoning_starts_in": "thinking"}, ValueError, "reasoning_starts_in", "thinking"),
])
def test_bad_reasoning_configuration_names_the_field(value, raises, field, says):
    with pytest.raises(raises, match=re.escape(says)) as e:
        reasoning_config(value)
    assert e.value.field == field


def test_unknown_reasoning_keys_message_is_bounded():
    with pytest.raises(ValueError) as e:
        reasoning_config({f"k{i}" * 100: i for i in range(10_000)})
    assert len(str(e.value)) < 1000 and e.value.kind == "unknown_key"


def test_ids_only_check_needs_marker_ids_or_a_vocabulary():
    """vLLM's scheduler sees ids only: a marker given only as text cannot be
    recognised there without a vocabulary; the error names it."""
    with pytest.raises(ValueError, match="reasoning_start='<think>' has no single token id") as e:
        TEXT.stop_kwargs(max_reasoning_tokens=None, ids_only=True)
    assert e.value.field == "reasoning_start"
    assert TEXT.stop_kwargs(max_reasoning_tokens=3, ids_only=False)["max_reasoning_tokens"] == 3


@pytest.mark.parametrize("budget, says", [(2.0, TypeError), (-2, ValueError), ("3", TypeError)])
def test_thinking_token_budget_errors_name_the_field(budget, says):
    with pytest.raises(says) as e:
        vl.vllm_check_stop([1], num_prompt_tokens=1, max_model_len=10, thinking_token_budget=budget, reasoning=IDS)
    assert e.value.field == "thinking_token_budget"


def test_thinking_token_budget_minus_one_is_unlimited_and_needs_reasoning_otherwise():
    r = vl.vllm_check_stop([5, 1, 1], num_prompt_tokens=1, max_model_len=10, thinking_token_budget=-1)
    assert not r.stopped
    with pytest.raises(ValueError, match="thinking_token_budget=0 needs reasoning markers"):
        vl.vllm_check_stop([1], num_prompt_tokens=1, max_model_len=10, thinking_token_budget=0)


def _request(output, **sp):
    base = dict(max_tokens=None, min_tokens=0, eos_token_id=2, stop_token_ids=[9], ignore_eos=False,
                all_stop_token_ids=None, repetition_detection=None, thinking_token_budget=None)
    base.update(sp)
    return NS(output_token_ids=output, num_prompt_tokens=3, max_tokens=base["max_tokens"], sampling_params=NS(**base),
              pooling_params=None, prompt_token_ids=[1, 2, 3])


@pytest.mark.parametrize("seed", range(30))
def test_request_stop_and_check_stop_agree_with_reasoning(seed):
    """With marker ids 5/6: the stop token 9 fires only in content, EOS in
    either channel; the stateless helper and RequestStop agree on every
    prefix, token by token and in runs."""
    rng = random.Random(seed)
    stream = [rng.choice([1, 3, 4, 5, 6, 9, 9, 2] if rng.random() < 0.3 else [1, 3, 4, 5, 6, 9]) for _ in range(25)]
    req = _request([], max_tokens=rng.randint(5, 30))
    ours = vl.RequestStop(req, 100, reasoning=IDS)
    pos = 0
    while pos < len(stream):
        k = rng.randint(1, 3)
        req.output_token_ids = stream[:pos + k]
        stopped = ours.feed(req.output_token_ids)
        expect = vl.vllm_check_stop_request(req, 100, num_new_tokens=len(req.output_token_ids) - pos, reasoning=IDS)
        assert ours.result() == expect
        pos += k
        if stopped:
            kept = stream[:expect.num_output_tokens]
            if expect.stop_reason == 9:  # the stop id arrived in content: after the block closed
                assert 6 in kept[:-1] or 5 not in kept
            break


@pytest.mark.parametrize("seed", range(30))
def test_detokenizer_stop_and_helper_agree_with_text_markers(seed):
    """Text markers cut across pieces, stop strings scoped to content:
    DetokenizerStop and vllm_detokenizer_stop agree, and the streamed channel
    deltas join to the final split."""
    rng = random.Random(seed)
    pieces = [rng.choice(["a", "b", "<th", "ink>", "</", "think>", "ab", "\n\n", "x", "<think>", "</think>"])
              for _ in range(20)]
    sp = vllm_params(stop=["\n\n", "ba"], min_tokens=rng.randint(0, 3))
    d = vl.DetokenizerStop(sp, reasoning=TEXT)
    reasoning = content = ""
    fed = 0
    while fed < len(pieces):
        run = pieces[fed:fed + rng.randint(1, 3)]
        fed += len(run)
        stop = d.update(run)
        r, c = d.get_next_output_channels()
        reasoning, content = reasoning + r, content + c
        res = vl.vllm_detokenizer_stop(pieces[:fed], stop=sp.stop, min_tokens=sp.min_tokens,
                                       num_new_tokens=len(run), reasoning=TEXT)
        assert (res.stop_string, res.output_text, res.reasoning, res.content) == (
            stop, d.output_text, d.reasoning, d.content)
        if stop is not None:
            break
    assert (reasoning, content) == (d.reasoning, d.content)


def test_detokenizer_stop_needs_ids_for_marker_ids():
    d = vl.DetokenizerStop(vllm_params(stop=["x"]), reasoning=IDS)
    with pytest.raises(ValueError, match="token_ids is required") as e:
        d.update(["<think>"])
    assert e.value.field == "token_ids"
    with pytest.raises(ValueError, match="token_ids has 1 ids for 2 text pieces"):
        d.update(["a", "b"], token_ids=[5])
    # The adapter feeds 2**32 - 1 as the stop-terminated token: a real one is refused, not
    # silently read as the scheduler's stop.
    with pytest.raises(ValueError, match="token_ids holds 4294967295, which this adapter reserves") as e:
        d.update(["a", "b"], token_ids=[5, 2**32 - 1])
    assert e.value.field == "token_ids"
    assert d.update(["", "x", "", "y x"], token_ids=[5, 7, 6, 8]) == "x"
    assert (d.reasoning, d.content) == ("x", "y ")


@pytest.mark.parametrize("seed", range(20))
def test_req_finish_and_check_finished_agree_with_reasoning(seed):
    rng = random.Random(seed)
    pieces = [rng.choice(["a", "<think>", "</think>", "stop", "b", "</th", "ink>"]) for _ in range(16)]
    ids = [rng.choice([1, 9, 3]) for _ in pieces]
    fields = dict(max_new_tokens=rng.randint(3, 16), stop_strs=["stop"], stop_token_ids=[9])
    finish = sg.ReqFinish(sglang_params(**fields), eos_token_ids={2}, reasoning=TEXT)
    for n in range(1, len(ids) + 1):
        res = finish.update(ids[n - 1:n], pieces[n - 1:n])
        expect = sg.sglang_check_finished(ids[:n], output_texts=pieces[:n], eos_token_ids={2}, reasoning=TEXT, **fields)
        assert res == expect
        if res.finished:
            break


def test_prompt_channel_reads_a_prompt_opened_block(smollm2):
    """With a tokenizer's vocabulary the prompt's tail decides where output
    starts (docs/semantics.md 11.1): DeepSeek-R1 / Qwen3-thinking templates
    end with `<think>\\n`; a closed block or none starts in content."""
    r = reasoning_from_markers("<think>", "</think>", smollm2)
    assert r.vocabulary is not None and "reasoning_start_id" not in r.options  # several tokens: text only
    assert r.prompt_channel(smollm2.encode("User: hi\nAssistant: <think>\n")) == "reasoning"
    assert r.prompt_channel(smollm2.encode("<think>\nx</think>\nAssistant:")) == "content"
    assert r.prompt_channel(None) is None
    assert TEXT.prompt_channel(smollm2.encode("<think>")) is None  # no vocabulary: the params decide
    forced = reasoning_config({"reasoning_end": "</think>", "reasoning_starts_in": "reasoning"})
    assert forced.prompt_channel(None) == "reasoning"
    # A stop string inside a prompt-opened block does not fire (semantics 11.3).
    d = vl.DetokenizerStop(vllm_params(stop=["\n\n"]), reasoning=r,
                           prompt_token_ids=smollm2.encode("Assistant: <think>\n"))
    assert d.update(["plan\n\n", "done</think>", "Hi\n\n"]) == "\n\n"
    assert (d.reasoning, d.content) == ("plan\n\ndone", "Hi")


# ------------------------------------- reasoning: the readers' bad input --

import stopline  # noqa: E402

WORDS = "a three-word tokenizers.Tokenizer"  # built in the test: tokenizers is optional here


def _word_tokenizer():
    tokenizers = pytest.importorskip("tokenizers")
    return tokenizers.Tokenizer(tokenizers.models.WordLevel({"<a>": 0, "<b>": 1, "x": 2}, unk_token="x"))


def _config(start, end, forced=None):
    return NS(enabled=True, reasoning_start_token_ids=start, natural_reasoning_end_token_ids=end,
              reasoning_end_token_ids=forced)


@pytest.mark.parametrize("call", [
    lambda r: compat.vllm_check_stop([10, 5], num_prompt_tokens=3, max_model_len=100, max_tokens=20, reasoning=r),
    lambda r: compat.sglang_check_finished([10, 5], max_new_tokens=10, reasoning=r),
    lambda r: compat.vllm_detokenizer_stop(["a", "b"], stop=["b"], reasoning=r, token_ids=[1, 2]),
    lambda r: vl.RequestStop(_request([1]), 100, reasoning=r),
    lambda r: vl.DetokenizerStop(NS(stop=None, include_stop_str_in_output=False, min_tokens=0), reasoning=r),
], ids=["vllm_check_stop", "sglang_check_finished", "vllm_detokenizer_stop", "RequestStop", "DetokenizerStop"])
def test_reasoning_argument_is_a_reasoning_or_a_mapping(call):
    # A parser name is refused naming the argument (not an AttributeError
    # from deep inside); a mapping of REASONING_KEYS is read as reasoning_config.
    with pytest.raises(stopline.StoplineTypeError) as e:
        call("qwen3")
    assert e.value.field == "reasoning" and "reasoning must be a mapping" in str(e.value)
    call({"reasoning_start_id": 5, "reasoning_end_id": 6})
    with pytest.raises(stopline.StoplineValueError, match="reasoning has unknown keys"):
        call({"reasoning_end_id": 6, "enable": True})


def test_a_mapping_reasoning_splits_as_its_reasoning_config():
    kw = {"num_prompt_tokens": 3, "max_model_len": 100, "max_tokens": 20, "stop_token_ids": [7]}
    as_map = compat.vllm_check_stop([5, 7, 6, 1], **kw, reasoning={"reasoning_start_id": 5, "reasoning_end_id": 6})
    assert as_map == compat.vllm_check_stop([5, 7, 6, 1], **kw, reasoning=IDS)
    assert as_map.stopped is False  # 7 met inside the block does not stop


@pytest.mark.parametrize("config", ["qwen3", 42, NS(reasoning_config=NS())], ids=["str", "int", "no-enabled"])
def test_vllm_reasoning_refuses_what_is_not_a_config(config):
    # vllm_reasoning("qwen3") used to return None: reasoning silently off.
    with pytest.raises(stopline.StoplineTypeError) as e:
        vl.vllm_reasoning(config, tokenizer=_word_tokenizer())
    assert e.value.field == "vllm_config" and "reasoning_parser=" in str(e.value)
    assert vl.vllm_reasoning(NS(reasoning_config=None)) is None
    assert vl.vllm_reasoning(NS(enabled=False)) is None


@pytest.mark.parametrize("start, end, forced, field, says", [
    ([0], [-6], None, "natural_reasoning_end_token_ids", "the id -6 is outside the tokenizer's 3 ids"),
    ([0], [50], None, "natural_reasoning_end_token_ids", "the id 50 is outside the tokenizer's 3 ids"),
    ([5, 60000], [1], None, "reasoning_start_token_ids", "the id 5 is outside"),
    ([0], [2**32], None, "natural_reasoning_end_token_ids", "the id 4294967296 is outside"),
    ([0], [1], [1, 9], "reasoning_end_token_ids", "the id 9 is outside"),
], ids=["negative", "past-the-tokenizer", "multi-token-past", "over-2**32", "forced"])
def test_vllm_reasoning_checks_config_ids_against_the_tokenizer(start, end, forced, field, says):
    # Checked before decoding: the tokenizer's own OverflowError names no
    # field, and an id past it decodes to "" ("reasoning_end is an empty string").
    with pytest.raises(stopline.StoplineValueError) as e:
        vl.vllm_reasoning(_config(start, end, forced), tokenizer=_word_tokenizer())
    assert e.value.field == f"reasoning_config.{field}" and says in str(e.value), str(e.value)
    assert e.value.kind == "id_outside"


def test_vllm_reasoning_without_a_tokenizer_checks_ids_against_2_32():
    with pytest.raises(stopline.StoplineValueError, match=r"natural_reasoning_end_token_ids=\[-1\]"):
        vl.vllm_reasoning(_config([0], [-1]))
    r = vl.vllm_reasoning(_config([0], [1]), tokenizer=_word_tokenizer())
    assert (r.options["reasoning_start_id"], r.options["reasoning_end_id"]) == (0, 1)


@pytest.mark.parametrize("args, kw, raises, field", [
    (("<a>", "<b>", None), {}, TypeError, "tokenizer"),
    (("<a>", "<b>", "a tokenizer name"), {}, TypeError, "tokenizer"),
    (("<a>", "<b>", WORDS), {"forced_end": 5}, TypeError, "forced_end"),
    (("<a>", "\ud800", WORDS), {}, ValueError, "reasoning_end"),
    (("\ud800", "<b>", WORDS), {}, ValueError, "reasoning_start"),
], ids=["none", "str", "forced_end-int", "end-surrogate", "start-surrogate"])
def test_reasoning_from_markers_bad_input_names_the_argument(args, kw, raises, field):
    args = tuple(_word_tokenizer() if a is WORDS else a for a in args)
    with pytest.raises(raises) as e:
        reasoning_from_markers(*args, **kw)
    assert e.value.field == field, str(e.value)


def test_reasoning_from_markers_reads_a_tokenizers_tokenizer():
    # A tokenizers.Tokenizer's encode() gives an Encoding, not a list of ids.
    r = reasoning_from_markers("<a>", "<b>", _word_tokenizer())
    assert (r.options["reasoning_start_id"], r.options["reasoning_end_id"]) == (0, 1)


@pytest.mark.parametrize("budget", [2**70, 2**64, 2**63])
def test_a_thinking_budget_over_64_bits_names_thinking_token_budget(budget):
    # 2**63 and 2**64 - 1 passed the adapter's check (it allowed 2**64 - 1)
    # and the core then named max_reasoning_tokens, a field the caller never set.
    with pytest.raises(stopline.StoplineValueError) as e:
        compat.vllm_check_stop([1], num_prompt_tokens=1, max_model_len=10, thinking_token_budget=budget, reasoning=IDS)
    assert (e.value.field, e.value.kind) == ("thinking_token_budget", "out_of_range")
    # Each SGLang entry names the budget as its caller passes it.
    with pytest.raises(stopline.StoplineValueError) as e:
        compat.sglang_check_finished([1], max_new_tokens=10, thinking_budget=budget, reasoning=IDS)
    assert (e.value.field, e.value.kind) == ("thinking_budget", "out_of_range")
    with pytest.raises(stopline.StoplineValueError) as e:
        sg.ReqFinish(sglang_params(custom_params={"thinking_budget": budget}), reasoning=IDS)
    assert (e.value.field, e.value.kind) == ("custom_params['thinking_budget']", "out_of_range")


# ------------------------------------ tool-call spans through the one reader --

SPANS = reasoning_config({"tool_call_marker_ids": [(3, 4)]})


def test_tool_call_spans_alone_are_a_reasoning_configuration():
    # semantics 11.10: spans without a reasoning block; REASONING_KEYS carry them.
    from stopline.engines import REASONING_KEYS

    assert {"tool_call_markers", "tool_call_marker_ids"} <= set(REASONING_KEYS)
    kw = {"num_prompt_tokens": 1, "max_model_len": 100, "stop_token_ids": [7]}
    # 7 inside the span is an ordinary token; after its end it stops.
    assert not compat.vllm_check_stop([1, 3, 7], **kw, reasoning=SPANS, num_new_tokens=3).stopped
    assert compat.vllm_check_stop([1, 3, 7, 4, 7], **kw, reasoning=SPANS, num_new_tokens=5).stopped
    assert compat.sglang_check_finished([3, 7], max_new_tokens=10, stop_token_ids=[7], reasoning=SPANS).finished_reason \
        is None
    with pytest.raises(stopline.StoplineValueError, match="reasoning_end is required"):
        reasoning_config({"keep_reasoning_markers": True})
    with pytest.raises(stopline.StoplineTypeError, match=r"tool_call_markers\[0\] must be a \(start, end\) pair"):
        reasoning_config({"tool_call_markers": ["{}"]})


def test_text_spans_in_an_ids_only_check_need_ids_or_a_vocabulary():
    text_spans = reasoning_config({"tool_call_markers": [("<a>", "<b>")]})
    with pytest.raises(stopline.StoplineValueError) as e:
        compat.vllm_check_stop([1], num_prompt_tokens=1, max_model_len=10, reasoning=text_spans)
    assert e.value.field == "tool_call_markers" and "tool_call_marker_ids" in str(e.value)
    both_forms = reasoning_config({"tool_call_markers": [("<a>", "<b>")], "tool_call_marker_ids": [(3, 4)]})
    assert not compat.vllm_check_stop([3, 7], num_prompt_tokens=1, max_model_len=10, stop_token_ids=[7],
                                      reasoning=both_forms, num_new_tokens=2).stopped


def test_the_detokenizer_step_feeds_real_ids_for_span_marker_ids():
    with pytest.raises(stopline.StoplineValueError, match="token_ids is required"):
        compat.vllm_detokenizer_stop(["a", "b"], stop=["b"], reasoning=SPANS)
    inside = compat.vllm_detokenizer_stop(["<tc>", "b", "</tc>"], stop=["b"], reasoning=SPANS, token_ids=[3, 9, 4],
                                          num_new_tokens=3)
    assert inside.stop_string is None and inside.output_text == "<tc>b</tc>"
    after = compat.vllm_detokenizer_stop(["<tc>", "x", "</tc>", "b"], stop=["b"], reasoning=SPANS,
                                         token_ids=[3, 9, 4, 9], num_new_tokens=4)
    assert after.stop_string == "b" and after.output_text == "<tc>x</tc>"


def test_marker_ids_read_the_prompt_without_a_vocabulary():
    # The integrations.md form (marker ids, no tokenizer): a prompt that
    # opened the block starts the output in reasoning, so a content-scoped
    # stop id met while thinking does not fire (vllm#52393).
    r = reasoning_config({"reasoning_start_id": 151667, "reasoning_end_id": 151668})
    res = compat.vllm_check_stop([3, 7, 151668, 7], num_prompt_tokens=3, max_model_len=100, stop_token_ids=[7],
                                 prompt_token_ids=[1, 2, 151667], reasoning=r)
    assert (res.stop_reason, res.num_output_tokens) == (7, 4)
    assert r.prompt_channel([1, 2, 151667]) == "reasoning" and r.prompt_channel([151667, 5, 151668]) == "content"


@pytest.mark.parametrize("include", [False, True])
def test_a_stop_terminated_update_inside_a_tool_call_span_finishes(include):
    # The scheduler ended the request (EOS or a stop id) while a tool call
    # was open: no stop token id fires inside a span (semantics.md 11.10),
    # yet the update finishes, and the last token's text is kept only with
    # include_stop_str_in_output, as vLLM's detokenizer does; a later update
    # is ignored. vllm_detokenizer_stop agrees.
    spans = reasoning_config({"tool_call_markers": [("<tool_call>", "</tool_call>")]})
    d = vl.DetokenizerStop(vllm_params(stop=["\n\n"], include_stop_str_in_output=include), reasoning=spans)
    assert d.update(['Sure<tool_call>{"a": 1']) is None
    assert d.update(["</s>"], stop_terminated=True) is None
    want = 'Sure<tool_call>{"a": 1' + ("</s>" if include else "")
    assert (d.output_text, d.num_output_tokens, d.get_next_output_text()) == (want, 2, want)
    assert d.update(["more"]) is None and d.output_text == want
    r = compat.vllm_detokenizer_stop(['Sure<tool_call>{"a": 1', "</s>"], stop=["\n\n"], stop_terminated=True,
                                     include_stop_str_in_output=include, num_new_tokens=1, reasoning=spans)
    assert (r.output_text, r.num_output_tokens, r.content) == (want, 2, want)


@pytest.mark.parametrize("value", ["false", 0, 1, 1.0])
def test_a_request_flag_that_is_not_a_bool_is_refused_naming_it(value):
    """bool() read a duck-typed request's flags: ignore_eos="false" was True
    (EOS then never finished the request), no_stop_trim="no" kept the stop.
    A flag is a bool or None (off); anything else names the field."""
    sp = NS(max_tokens=10, min_tokens=0, eos_token_id=2, stop_token_ids=None, ignore_eos=value)
    request = NS(pooling_params=None, sampling_params=sp, num_prompt_tokens=1, max_tokens=None, output_token_ids=[])
    with pytest.raises(TypeError, match="ignore_eos must be a bool") as e:
        vl.RequestStop(request, 10)
    assert e.value.field == "ignore_eos"
    with pytest.raises(TypeError, match="include_stop_str_in_output must be a bool"):
        vl.DetokenizerStop(NS(stop=["x"], include_stop_str_in_output=value, min_tokens=0))
    for name in ("ignore_eos", "no_stop_trim"):
        sgp = NS(max_new_tokens=5, min_new_tokens=0, stop_strs=None, stop_regex_strs=None, stop_token_ids=None,
                 ignore_eos=False, no_stop_trim=False, custom_params=None)
        setattr(sgp, name, value)
        with pytest.raises(TypeError, match=f"{name} must be a bool"):
            sg.ReqFinish(sgp)
    sp.ignore_eos = None  # None is off, as a missing attribute
    assert vl.RequestStop(request, 10).feed([2]) is True
