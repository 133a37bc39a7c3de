"""Finish-state machine (docs/semantics.md section 3): test vectors, bad input, properties."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from conftest import RESULT_FIELDS, brute_holdback
from vectors import load_vectors

try:
    import numpy as np
except ImportError:  # NumPy is optional: the decode-step tests then pass ids as lists
    np = None

# Token ids of a decode step: a list, or a NumPy array of one of these dtypes.
ID_FORMS = [None] + (["int64", "int32", "uint32"] if np is not None else [])

FINISH_CASES = load_vectors("finish.json")
REPETITION_CASES = load_vectors("repetition.json")

STATE_FIELDS = ("finished", "finish_reason", "stop_reason", "matched", "num_tokens",
                "text_len", "text", "token_ids")


def result(r):
    return tuple(getattr(r, f) for f in RESULT_FIELDS)


def state(tr):
    return tuple(getattr(tr, f) for f in STATE_FIELDS)


# ------------------------------------------------------------- vectors

def _case_inputs(case):
    pieces = case.get("tokens", {})
    steps = case["steps"]
    texts = [[pieces.get(str(t), "") for t in run] for run in steps]
    gta = [None] * len(steps)
    if "grammar_terminated_at" in case:
        s, i = case["grammar_terminated_at"]
        gta[s] = i
    with_texts = "tokens" in case or bool(case["params"].get("stop"))
    return steps, texts, gta, with_texts


def _check_expect(got, expect, text):
    for key, want in expect.items():
        if key == "text":
            assert text == want
        else:
            assert getattr(got, key) == want, key


def _check_stream(results, tr):
    assert "".join(r.text_delta for r in results) == tr.text
    assert [t for r in results for t in r.token_ids_delta] == tr.token_ids
    assert len(tr.text) == tr.text_len and len(tr.token_ids) == tr.num_tokens


@pytest.mark.parametrize("case", FINISH_CASES, ids=[c["name"] for c in FINISH_CASES])
def test_finish_vectors_tracker(impl, case):
    steps, texts, gta, with_texts = _case_inputs(case)
    tr = impl.FinishTracker(impl.StopParams(**case["params"]))
    results = []
    for run, pieces, g in zip(steps, texts, gta):
        results.append(tr.update(run, pieces if with_texts else None, g))
    _check_expect(tr, case["expect"], tr.text)
    _check_expect(results[-1], {k: v for k, v in case["expect"].items() if k != "text"}, None)
    _check_stream(results, tr)


@pytest.mark.parametrize("case", FINISH_CASES, ids=[c["name"] for c in FINISH_CASES])
def test_finish_vectors_batch_one_slot(impl, case):
    steps, texts, gta, _ = _case_inputs(case)
    batch = impl.FinishBatch(4)
    batch.add(3, impl.StopParams(**case["params"]))
    text, results = "", []
    for run, pieces, g in zip(steps, texts, gta):
        (r,) = impl.batch_step(batch, [3], run, [len(run)], pieces, [-1 if g is None else g])
        text += r.text_delta
        results.append(r)
    _check_expect(results[-1], case["expect"], text)
    assert results[-1].text_len == len(text)


def test_finish_vectors_batch_all_slots(impl):
    """Every vector case in its own slot of one batch, stepped together."""
    batch = impl.FinishBatch(2 * len(FINISH_CASES) + 1)
    inputs = [_case_inputs(c) for c in FINISH_CASES]
    slot_of = [2 * k + 1 for k in range(len(FINISH_CASES))]  # sparse slots
    for k, case in enumerate(FINISH_CASES):
        batch.add(slot_of[k], impl.StopParams(**case["params"]))
    texts = [""] * len(FINISH_CASES)
    last = [None] * len(FINISH_CASES)
    for step in range(max(len(i[0]) for i in inputs)):
        live = [k for k in range(len(FINISH_CASES)) if step < len(inputs[k][0])]
        ids, pieces, lens, gtas = [], [], [], []
        for k in live:
            steps, tx, gta, _ = inputs[k]
            ids += steps[step]
            pieces += tx[step]
            lens.append(len(steps[step]))
            gtas.append(-1 if gta[step] is None else gta[step])
        out = impl.batch_step(batch, [slot_of[k] for k in live], ids, lens, pieces, gtas)
        assert len(out) == len(live)
        for k, r in zip(live, out):
            texts[k] += r.text_delta
            last[k] = r
    for k, case in enumerate(FINISH_CASES):
        _check_expect(last[k], case["expect"], texts[k])


def _repetition_params(impl, spec):
    mx, mn, cnt = spec
    return impl.StopParams(repetition={"max_pattern_size": mx, "min_pattern_size": mn, "min_count": cnt})


@pytest.mark.parametrize("case", REPETITION_CASES, ids=[f"rep{i}" for i in range(len(REPETITION_CASES))])
def test_repetition_vectors(impl, case):
    tokens, spec, expected = case
    # One token per step through a tracker ...
    tr = impl.FinishTracker(_repetition_params(impl, spec))
    for t in tokens:
        r = tr.update([t])
        if r.finished:
            break
    assert (tr.finished and tr.finish_reason == "repetition") == expected
    if expected:
        assert tr.num_tokens == len(tokens)
        assert (tr.stop_reason, tr.matched) == ("repetition_detected", None)
    # ... as one accept run (same answer) ...
    tr1 = impl.FinishTracker(_repetition_params(impl, spec))
    tr1.update(tokens)
    assert state(tr1) == state(tr)
    # ... and through a batch slot.
    batch = impl.FinishBatch(2)
    batch.add(1, _repetition_params(impl, spec))
    for t in tokens:
        (r,) = impl.batch_step(batch, [1], [t])
        if r.finished:
            break
    assert (r.finished and r.finish_reason == "repetition") == expected


def test_repetition_vectors_many_slots(impl):
    batch = impl.FinishBatch(len(REPETITION_CASES))
    for k, (_, spec, _) in enumerate(REPETITION_CASES):
        batch.add(k, _repetition_params(impl, spec))
    done = {}
    for step in range(max(len(c[0]) for c in REPETITION_CASES)):
        live = [k for k, c in enumerate(REPETITION_CASES) if step < len(c[0]) and k not in done]
        out = impl.batch_step(batch, live, [REPETITION_CASES[k][0][step] for k in live])
        for k, r in zip(live, out):
            if r.finished:
                done[k] = r.finish_reason
    for k, (_, _, expected) in enumerate(REPETITION_CASES):
        assert (done.get(k) == "repetition") == expected


# ---------------------------------------------------------- behaviour

def test_streaming_holds_back_and_emits_tokens_with_their_text(impl):
    tr = impl.FinishTracker(impl.StopParams(stop=["</a>"], eos_token_ids=[0]))
    r = tr.update([5, 6], ["x<", "/"])
    assert (r.text_delta, r.token_ids_delta) == ("x", [])  # "x<" not all emitted yet
    r = tr.update([7], ["b"])
    assert (r.text_delta, r.token_ids_delta) == ("</b", [5, 6, 7])
    r = tr.update([8, 9], ["</", "a>tail"])
    assert (r.finished, r.stop_reason, r.matched) == (True, "</a>", "</a>")
    assert (r.text_delta, r.token_ids_delta, r.num_tokens) == ("", [8, 9], 5)
    assert tr.text == "x</b"


def test_length_finish_flushes_a_partial_stop_prefix(impl):
    tr = impl.FinishTracker(impl.StopParams(stop=["STOP"], max_tokens=2))
    r = tr.update([1], ["ok S"])
    assert r.text_delta == "ok "
    r = tr.update([2], ["T"])
    assert (r.finish_reason, r.text_delta, r.token_ids_delta) == ("length", "ST", [1, 2])


def test_abort_flushes_and_is_idempotent(impl):
    tr = impl.FinishTracker(impl.StopParams(stop=["abc"]))
    r = tr.update([1, 2], ["x", "ab"])
    assert (r.text_delta, r.token_ids_delta) == ("x", [1])
    r = tr.abort()
    assert (r.finished, r.finish_reason, r.stop_reason, r.matched) == (True, "abort", None, None)
    assert (r.text_delta, r.token_ids_delta, r.num_tokens, r.text_len) == ("ab", [2], 2, 3)
    r2 = tr.abort()
    assert result(r2) == (True, "abort", None, None, 2, 3, "", [])
    with pytest.raises(RuntimeError, match="abort"):
        tr.update([3], ["c"])
    done = impl.FinishTracker(impl.StopParams(max_tokens=1))
    done.update([4])
    assert result(done.abort()) == (True, "length", None, None, 1, 0, "", [])


def test_stop_string_match_spanning_min_tokens_boundary(impl):
    # The match starts in a token below min_tokens and completes above it.
    tr = impl.FinishTracker(impl.StopParams(stop=["abc"], min_tokens=2))
    tr.update([1, 2], ["a", "b"])
    r = tr.update([3], ["cz"])
    assert (r.finish_reason, r.stop_reason, r.num_tokens, tr.text) == ("stop", "abc", 3, "")


def test_eos_text_and_stop_string_in_eos_piece(impl):
    tr = impl.FinishTracker(impl.StopParams(stop=["END"], eos_token_ids=[2], include_stop_str_in_output=True))
    r = tr.update([1, 2], ["x", "END"])
    # Check 2 (stop string) precedes check 3 (EOS) at one position, when the
    # EOS text is kept (otherwise it is not matched at all, check 4).
    assert (r.stop_reason, r.matched, tr.text) == ("END", "END", "xEND")
    tr = impl.FinishTracker(impl.StopParams(eos_token_ids=[2], include_stop_str_in_output=True))
    tr.update([1, 2], ["x", "</s>"])
    assert (tr.stop_reason, tr.matched, tr.text, tr.token_ids) == (None, 2, "x</s>", [1, 2])


# Section 3, check 4: an ending token's text that is not kept is not fed to
# the matchers. vLLM 0.33.0 agrees (BaseIncrementalDetokenizer.update leaves a
# stop-terminated token out before check_stop_strings); SGLang 0.5.23 decodes
# the tail with the stop id in it, so there "a<" would finish first.
@pytest.mark.parametrize("ending", [
    {"stop_token_ids": [7]},
    {"eos_token_ids": [7]},
], ids=["stop-token", "eos"])
def test_ending_token_text_is_not_matched_unless_kept(impl, ending):
    kw = dict(stop=["a<", "<|e"], **ending)
    stop_reason = 7 if "stop_token_ids" in ending else None
    for runs in ([[1], [7]], [[1, 7]]):  # one token a step, or one accept run
        tr = impl.FinishTracker(impl.StopParams(**kw))
        results = [tr.update(run, [{1: "xa", 7: "<|end|>"}[t] for t in run]) for run in runs]
        assert (tr.finish_reason, tr.stop_reason, tr.matched) == ("stop", stop_reason, 7)
        assert (tr.text, tr.token_ids) == ("xa", [1, 7])
        _check_stream(results, tr)
    # Kept text is output text: the string completes inside the ending token.
    tr = impl.FinishTracker(impl.StopParams(include_stop_str_in_output=True, **kw))
    tr.update([1, 7], ["xa", "<|end|>"])
    assert (tr.stop_reason, tr.matched, tr.text, tr.token_ids) == ("a<", "a<", "xa<", [1, 7])


def test_ignored_eos_text_is_matched(impl):
    # An EOS under ignore_eos does not end the sequence, so its text is output.
    tr = impl.FinishTracker(impl.StopParams(stop=["a<"], eos_token_ids=[7], ignore_eos=True))
    tr.update([1, 7], ["xa", "<|end|>"])
    assert (tr.stop_reason, tr.text, tr.token_ids) == ("a<", "x", [1, 7])


def test_stop_string_earlier_in_the_run_still_beats_the_stop_token(impl):
    # Spec-decode run: the string completes in token 2, the stop token is token 3.
    # The first position decides; vLLM 0.33.0 reports the string too (its
    # detokenizer matches the text before the stop token). SGLang 0.5.23 too:
    # stop strings are checked over the run before the ids.
    tr = impl.FinishTracker(impl.StopParams(stop=["ab"], stop_token_ids=[7]))
    tr.update([1, 2, 7], ["a", "b", "<|end|>"])
    assert (tr.stop_reason, tr.text, tr.token_ids) == ("ab", "", [1, 2])


# Section 3, checks 5 and 6. SGLang 0.5.23 agrees inside the budget and past it
# (length at the cap) but tests max_new_tokens before grammar.is_terminated(), so
# it reports length for "on-last-budgeted"; stopline's stop there is deliberate
# (docs/semantics.md 6.3).
@pytest.mark.parametrize("run, grammar_at, reason, kept", [
    ([10, 11], 1, "stop", [10, 11]),
    ([10, 11, 12], 2, "length", [10, 11]),
    ([10, 11, 12], 0, "stop", [10]),
], ids=["on-last-budgeted", "past-budget", "inside-budget"])
def test_grammar_end_and_the_length_cap(impl, run, grammar_at, reason, kept):
    tr = impl.FinishTracker(impl.StopParams(max_tokens=2))
    r = tr.update(run, None, grammar_at)
    assert (r.finish_reason, tr.token_ids) == (reason, kept)
    assert r.matched == (kept[-1] if reason == "stop" else None)
    model_cap = impl.FinishTracker(impl.StopParams(prompt_len=3, max_model_len=5))
    assert model_cap.update([10, 11], None, 1).finish_reason == "stop"


def test_prompt_len_and_max_model_len(impl):
    tr = impl.FinishTracker(impl.StopParams(prompt_len=5, max_model_len=8, max_tokens=10))
    r = tr.update([1, 2, 3, 4])
    assert (r.finish_reason, r.num_tokens) == ("length", 3)


# ---------------------------------------------------------- bad input

PARAM_ERRORS = [
    ({"max_tokens": 0}, ValueError, ["max_tokens", "0"]),
    ({"max_tokens": -3}, ValueError, ["max_tokens", "-3"]),
    ({"min_tokens": -1}, ValueError, ["min_tokens", "-1"]),
    ({"min_tokens": 5, "max_tokens": 3}, ValueError, ["min_tokens", "5"]),
    ({"eos_token_ids": [4, -1]}, ValueError, ["eos_token_ids", "-1"]),
    ({"stop_token_ids": [-3]}, ValueError, ["stop_token_ids", "-3"]),
    ({"eos_token_ids": [100], "vocab_size": 100}, ValueError, ["eos_token_ids", "100"]),
    ({"stop_token_ids": [7, 150], "vocab_size": 100}, ValueError, ["stop_token_ids", "150"]),
    ({"stop": ["a", ""]}, ValueError, ["stop"]),
    ({"prompt_len": 10, "max_model_len": 10}, ValueError, ["max_model_len", "10"]),
    ({"prompt_len": 12, "max_model_len": 10}, ValueError, ["12"]),
    ({"repetition": {"max_pattern_size": 0, "min_pattern_size": 0, "min_count": 3}},
     ValueError, ["max_pattern_size", "0"]),
    ({"repetition": {"max_pattern_size": 2, "min_pattern_size": 3, "min_count": 3}},
     ValueError, ["min_pattern_size", "3"]),
    ({"repetition": {"max_pattern_size": 2, "min_pattern_size": 1, "min_count": 1}},
     ValueError, ["min_count", "1"]),
    # A misspelt key would otherwise silently fall back to a default.
    ({"repetition": {"max_pattern_size": 2, "min_count": 2, "min_pattern_len": 2}},
     ValueError, ["min_pattern_len"]),
    ({"repetition": {"max_pattern_size": 2}}, ValueError, ["min_count"]),
    ({"stop": "STOP"}, TypeError, ["stop"]),
    ({"eos_token_ids": ["a"]}, TypeError, ["eos_token_ids"]),
    ({"max_tokens": "5"}, TypeError, ["max_tokens"]),
]


@pytest.mark.parametrize("kw,exc,words", PARAM_ERRORS,
                         ids=[",".join(f"{k}={v}" for k, v in c[0].items()) for c in PARAM_ERRORS])
def test_stop_params_validation(impl, kw, exc, words):
    with pytest.raises(exc) as info:
        impl.StopParams(**kw)
    for w in words:
        assert w in str(info.value), (w, str(info.value))


def test_stop_params_defaults_are_valid(impl):
    tr = impl.FinishTracker(impl.StopParams())
    r = tr.update([1, 2, 3])
    assert result(r) == (False, None, None, None, 3, 0, "", [1, 2, 3])


BAD_UPDATES = [
    ("string id", (["a"],), {}, TypeError),
    ("float id", ([1.5],), {}, TypeError),
    ("None id", ([1, None],), {}, TypeError),
    ("negative id", ([1, -1],), {}, ValueError),
    ("texts too short", ([1, 2], ["a"]), {}, ValueError),
    ("texts too long", ([1], ["a", "b"]), {}, ValueError),
    ("non-str piece", ([1, 2], ["a", 3]), {}, TypeError),
    ("surrogate piece", ([1], ["\ud800"]), {}, ValueError),
    ("grammar past run", ([1, 2], ["a", "b"]), {"grammar_terminated_at": 2}, ValueError),
    ("grammar far past run", ([1], ["a"]), {"grammar_terminated_at": 9}, ValueError),
]


@pytest.mark.parametrize("args,kw,exc", [b[1:] for b in BAD_UPDATES], ids=[b[0] for b in BAD_UPDATES])
def test_bad_update_leaves_tracker_unchanged(impl, args, kw, exc):
    params = dict(stop=["zz"], max_tokens=10)
    tr = impl.FinishTracker(impl.StopParams(**params))
    tr.update([5, 6], ["q", "z"])
    before = state(tr)
    with pytest.raises(exc):
        tr.update(*args, **kw)
    assert state(tr) == before
    ref = impl.FinishTracker(impl.StopParams(**params))
    ref.update([5, 6], ["q", "z"])
    assert result(tr.update([7], ["z"])) == result(ref.update([7], ["z"]))


def test_texts_required_with_stop_strings(impl):
    tr = impl.FinishTracker(impl.StopParams(stop=["x"]))
    with pytest.raises(ValueError):
        tr.update([1])
    assert tr.num_tokens == 0


def test_update_after_finish_names_the_reason(impl):
    tr = impl.FinishTracker(impl.StopParams(max_tokens=1))
    tr.update([1])
    with pytest.raises(RuntimeError, match="length"):
        tr.update([2])
    tr = impl.FinishTracker(impl.StopParams(stop_token_ids=[9]))
    tr.update([9])
    with pytest.raises(RuntimeError, match="stop"):
        tr.update([2])
    assert tr.token_ids == [9]


def _batch_abc(impl):
    batch = impl.FinishBatch(8)
    batch.add(1, impl.StopParams(stop=["xy"], max_tokens=20))
    batch.add(3, impl.StopParams(eos_token_ids=[0], max_tokens=20))
    batch.add(7, impl.StopParams(stop=["q"], max_tokens=20))
    impl.batch_step(batch, [1, 3, 7], [10, 11, 12], None, ["a", "b", "c"])
    return batch


BAD_STEPS = [
    ("negative id in slot 7", ([1, 3, 7], [10, 11, 12, -5], [1, 1, 2], ["x", "b", "c", "d"], None), ValueError),
    ("str id in slot 7", ([1, 3, 7], [10, 11, "12"], None, ["x", "b", "c"], None), TypeError),
    ("non-str piece for slot 7", ([1, 3, 7], [10, 11, 12], None, ["x", "b", 5], None), TypeError),
    ("grammar index past slot 7's run", ([1, 3, 7], [10, 11, 12], None, ["x", "b", "c"], [-1, -1, 1]), ValueError),
    ("grammar index -2 for slot 7", ([1, 3, 7], [10, 11, 12], None, ["x", "b", "c"], [-1, -1, -2]), ValueError),
    ("empty slot 5", ([1, 3, 5], [10, 11, 12], None, ["x", "b", "c"], None), (ValueError, KeyError, IndexError)),
    ("slot 9 out of range", ([1, 3, 9], [10, 11, 12], None, ["x", "b", "c"], None), (ValueError, KeyError, IndexError, OverflowError)),
]


@pytest.mark.parametrize("args,exc", [b[1:] for b in BAD_STEPS], ids=[b[0] for b in BAD_STEPS])
def test_bad_batch_step_changes_nothing(impl, args, exc):
    batch = _batch_abc(impl)
    with pytest.raises(exc) as info:
        impl.batch_step(batch, *args)
    bad_slot = args[0][-1]
    assert str(bad_slot) in str(info.value), str(info.value)
    ref = _batch_abc(impl)
    step = ([1, 3, 7], [20, 21, 22], None, ["x", "y", "z"])
    assert [result(r) for r in impl.batch_step(batch, *step)] == \
           [result(r) for r in impl.batch_step(ref, *step)]


@pytest.mark.parametrize("args", [
    ([1, 3, 7], [10, 11], None, ["x", "b"]),          # fewer ids than slots
    ([1, 3, 7], [10, 11, 12], [1, 1], ["x", "b", "c"]),  # run_lengths too short
    ([1, 3, 7], [10, 11, 12], [1, 1, 2], ["x", "b", "c"]),  # runs longer than ids
    ([1, 3, 7], [10, 11, 12], None, ["x", "b"]),      # texts misaligned
    ([1, 3, 7], [10, 11, 12], None, None),            # slots 1 and 7 need text
], ids=["ids", "run_lengths", "run_sum", "texts", "no texts"])
def test_bad_batch_shapes_change_nothing(impl, args):
    batch = _batch_abc(impl)
    with pytest.raises(ValueError):
        impl.batch_step(batch, *args)
    ref = _batch_abc(impl)
    step = ([1, 3, 7], [20, 21, 22], None, ["x", "y", "z"])
    assert [result(r) for r in impl.batch_step(batch, *step)] == \
           [result(r) for r in impl.batch_step(ref, *step)]


def test_batch_finished_slot_rejected_and_others_untouched(impl):
    batch = _batch_abc(impl)
    (_, r3, _) = impl.batch_step(batch, [1, 3, 7], [10, 0, 12], None, ["x", "", "c"])
    assert (r3.finished, r3.matched) == (True, 0)
    with pytest.raises(RuntimeError) as info:
        impl.batch_step(batch, [1, 3, 7], [20, 21, 22], None, ["x", "y", "z"])
    assert "3" in str(info.value) and "stop" in str(info.value)
    r1, r7 = impl.batch_step(batch, [1, 7], [20, 22], None, ["y", "z"])
    assert (r1.finished, r1.stop_reason, r1.text_len) == (True, "xy", 1)
    assert (r7.finished, r7.text_len, r7.num_tokens) == (False, 3, 3)
    batch.remove(3)
    batch.add(3, impl.StopParams(max_tokens=1))
    (r,) = impl.batch_step(batch, [3], [5])
    assert (r.finish_reason, r.num_tokens) == ("length", 1)


def test_batch_slot_management_errors_name_the_slot(impl):
    batch = impl.FinishBatch(4)
    batch.add(2, impl.StopParams())
    for call, slot in [
        (lambda: batch.add(2, impl.StopParams()), 2),   # occupied: remove() first
        (lambda: batch.remove(1), 1),                    # empty
        (lambda: batch.add(4, impl.StopParams()), 4),   # out of range
        (lambda: batch.remove(9), 9),
        (lambda: impl.batch_step(batch, [2, 2], [1, 1]), 2),  # listed twice
    ]:
        with pytest.raises(ValueError, match=str(slot)):
            call()
    (r,) = impl.batch_step(batch, [2], [5])
    assert (r.num_tokens, r.token_ids_delta) == (1, [5])


def test_empty_runs_are_no_ops(impl):
    tr = impl.FinishTracker(impl.StopParams(max_tokens=2))
    assert result(tr.update([], [])) == (False, None, None, None, 0, 0, "", [])
    batch = impl.FinishBatch(2)
    batch.add(0, impl.StopParams(max_tokens=1))
    batch.add(1, impl.StopParams(max_tokens=1))
    r0, r1 = impl.batch_step(batch, [0, 1], [5], [0, 1], ["x"])
    assert result(r0) == (False, None, None, None, 0, 0, "", [])
    assert result(r1) == (True, "length", None, None, 1, 1, "x", [5])


# ---------------------------------------------------------- properties

PIECES = ["", "a", "b", "c", "ab", "bc", "ST", "OP", "STOP", "日", "本😀", "e\u0301", " "]
STOP_ALPHABET = ["a", "b", "c", "S", "T", "O", "P", "日", "本", "😀"]
VOCAB = 14


@st.composite
def stop_params(draw):
    kw = {}
    if draw(st.booleans()):
        kw["max_tokens"] = draw(st.integers(1, 14))
    if draw(st.booleans()):
        kw["min_tokens"] = draw(st.integers(0, min(kw.get("max_tokens", 8), 8)))
    if draw(st.integers(0, 3)) == 0:
        kw["prompt_len"] = draw(st.integers(0, 6))
        kw["max_model_len"] = kw["prompt_len"] + draw(st.integers(1, 16))
    kw["eos_token_ids"] = draw(st.lists(st.integers(0, VOCAB - 1), max_size=2))
    kw["stop_token_ids"] = draw(st.lists(st.integers(0, VOCAB - 1), max_size=2))
    kw["ignore_eos"] = draw(st.booleans())
    kw["stop"] = draw(st.lists(st.text(st.sampled_from(STOP_ALPHABET), min_size=1, max_size=4),
                               max_size=3))
    kw["include_stop_str_in_output"] = draw(st.booleans())
    if draw(st.booleans()):
        kw["vocab_size"] = VOCAB
    if draw(st.integers(0, 2)) == 0:
        mx = draw(st.integers(1, 4))
        kw["repetition"] = {"max_pattern_size": mx, "min_pattern_size": draw(st.integers(0, mx)),
                            "min_count": draw(st.integers(2, 4))}
    return kw


def _split(draw, n):
    cuts = sorted(draw(st.sets(st.integers(1, max(n - 1, 1)), max_size=6))) if n > 1 else []
    return [(a, b) for a, b in zip([0] + cuts, cuts + [n]) if a < b]


@st.composite
def scenarios(draw):
    kw = draw(stop_params())
    n = draw(st.integers(1, 20))
    # Mostly small ids so repetition and stop ids fire; a few past the vocabulary.
    ids = draw(st.lists(st.one_of(st.integers(0, 5), st.integers(0, VOCAB + 1)), min_size=n, max_size=n))
    use_texts = bool(kw["stop"]) or draw(st.booleans())
    pieces = draw(st.lists(st.sampled_from(PIECES), min_size=n, max_size=n)) if use_texts else [""] * n
    full = "".join(pieces)
    if full and draw(st.booleans()):
        # A stop that does occur, often spanning pieces.
        a = draw(st.integers(0, len(full) - 1))
        kw["stop"] = kw["stop"] + [full[a:draw(st.integers(a + 1, min(len(full), a + 5)))]]
    gpos = draw(st.one_of(st.none(), st.integers(0, n - 1)))
    runs = _split(draw, n)
    abort = draw(st.booleans())
    return kw, ids, pieces, use_texts, gpos, runs, abort


def drive(impl, sc, runs=None):
    kw, ids, pieces, use_texts, gpos, default_runs, abort = sc
    tr = impl.FinishTracker(impl.StopParams(**kw))
    results, snapshots = [], []
    for a, b in (default_runs if runs is None else runs):
        if tr.finished:
            break
        g = gpos - a if gpos is not None and a <= gpos < b else None
        r = tr.update(ids[a:b], pieces[a:b] if use_texts else None, g)
        results.append(r)
        snapshots.append((tr.text, tr.token_ids))
    if abort:
        results.append(tr.abort())
        snapshots.append((tr.text, tr.token_ids))
    return tr, results, snapshots


def joined(results):
    return "".join(r.text_delta for r in results), [t for r in results for t in r.token_ids_delta]


@given(scenarios())
def test_step_invariance(impl, sc):
    """Any split into runs gives what one-token updates give."""
    n = len(sc[1])
    tr, results, _ = drive(impl, sc)
    tr1, results1, _ = drive(impl, sc, runs=[(i, i + 1) for i in range(n)])
    assert state(tr) == state(tr1)
    assert joined(results) == joined(results1)


@given(scenarios())
def test_streaming_invariants(impl, sc):
    kw, ids, pieces = sc[0], sc[1], sc[2]
    stops = kw["stop"]
    hold = stops and not kw["include_stop_str_in_output"]
    tr, results, snaps = drive(impl, sc)
    text, toks = joined(results)
    assert len(tr.text) == tr.text_len and len(tr.token_ids) == tr.num_tokens
    if tr.finished:
        assert (text, toks) == (tr.text, tr.token_ids)
    emitted, emitted_toks = "", 0
    for r, (cur_text, cur_toks) in zip(results, snaps):
        emitted += r.text_delta
        emitted_toks += len(r.token_ids_delta)
        assert (r.num_tokens, r.text_len) == (len(cur_toks), len(cur_text))
        # Never past a cut: what is out is always a prefix of the final text.
        assert tr.text.startswith(emitted)
        if r.finished:
            assert (emitted, emitted_toks) == (cur_text, len(cur_toks))
            continue
        # Running: every kept token so far, with its text; exact hold-back.
        assert cur_toks == ids[:len(cur_toks)]
        assert cur_text == "".join(pieces[:len(cur_toks)])
        hb = brute_holdback(cur_text, stops) if hold else 0
        assert emitted == cur_text[:len(cur_text) - hb]
        ends, acc = [], 0
        for p in pieces[:len(cur_toks)]:
            acc += len(p)
            ends.append(acc)
        assert emitted_toks == sum(1 for e in ends if e <= len(emitted))
    if tr.finish_reason == "stop" and isinstance(tr.stop_reason, str):
        assert tr.stop_reason in stops and tr.matched == tr.stop_reason


@given(scenarios())
def test_rust_equals_baseline(base, rust, sc):
    tr_b, res_b, _ = drive(base, sc)
    tr_r, res_r, _ = drive(rust, sc)
    assert [result(r) for r in res_r] == [result(r) for r in res_b]
    assert state(tr_r) == state(tr_b)


def _slots_arg(slots, form):
    """``slots`` as a list, or as a ``range`` where they are evenly spaced."""
    step = slots[1] - slots[0] if len(slots) > 1 else 1
    if form == "range" and step and all(b - a == step for a, b in zip(slots, slots[1:])):
        return range(slots[0], slots[-1] + step, step)
    return list(slots)


def drive_batch(impl, scs, max_slots=8, decode=None):
    """All scenarios in one batch (sparse slots); runs of each scenario
    advance one per batch step. With ``decode=(slot_form, id_dtype)``, the
    engine's usual decode step instead: one token per slot and batch step, no
    run lengths, a grammar list only on a step where some slot's grammar
    ends; slots as a list or a ``range``, ids as a list or a NumPy array of
    ``id_dtype``."""
    batch = impl.FinishBatch(max_slots)
    slots = [max_slots - 1 - 2 * k for k in range(len(scs))]
    for s, sc in zip(slots, scs):
        batch.add(s, impl.StopParams(**sc[0]))
    runs = [[(i, i + 1) for i in range(len(sc[1]))] if decode else sc[5] for sc in scs]
    any_text = any(sc[3] for sc in scs)
    per_slot = [[] for _ in scs]
    done = [False] * len(scs)
    for step in range(max(len(r) for r in runs)):
        live = [k for k in range(len(scs)) if step < len(runs[k]) and not done[k]]
        if not live:
            break
        ids, pieces, lens, gtas = [], [], [], []
        for k in live:
            _, sid, spc, _, gpos, _, _ = scs[k]
            a, b = runs[k][step]
            ids += sid[a:b]
            pieces += spc[a:b]
            lens.append(b - a)
            gtas.append(gpos - a if gpos is not None and a <= gpos < b else -1)
        live_slots = [slots[k] for k in live]
        if decode is None:
            out = impl.batch_step(batch, live_slots, ids, lens, pieces if any_text else None, gtas)
        else:
            slot_form, id_dtype = decode
            out = impl.batch_step(batch, _slots_arg(live_slots, slot_form),
                                  ids if id_dtype is None else np.array(ids, dtype=id_dtype), None,
                                  pieces if any_text else None, gtas if max(gtas) >= 0 else None)
        for k, r in zip(live, out):
            per_slot[k].append(result(r))
            done[k] = r.finished
    return per_slot


@given(st.lists(scenarios(), min_size=1, max_size=4))
def test_batch_equals_trackers(impl, scs):
    per_slot = drive_batch(impl, scs)
    for sc, got in zip(scs, per_slot):
        _, results, _ = drive(impl, sc[:6] + (False,))
        assert got == [result(r) for r in results]


@given(st.lists(scenarios(), min_size=1, max_size=4))
def test_batch_rust_equals_baseline(base, rust, scs):
    assert drive_batch(rust, scs) == drive_batch(base, scs)


@given(st.lists(scenarios(), min_size=1, max_size=4), st.sampled_from(["list", "range"]),
       st.sampled_from(ID_FORMS))
def test_batch_decode_steps_equal_trackers(impl, scs, slot_form, id_dtype):
    """The engine's usual call (one token per slot, no run lengths) against
    one-token updates of a FinishTracker per sequence."""
    per_slot = drive_batch(impl, scs, decode=(slot_form, id_dtype))
    for sc, got in zip(scs, per_slot):
        singles = [(i, i + 1) for i in range(len(sc[1]))]
        _, results, _ = drive(impl, sc[:6] + (False,), runs=singles)
        assert got == [result(r) for r in results]


@given(st.lists(scenarios(), min_size=1, max_size=4), st.sampled_from(["list", "range"]),
       st.sampled_from(ID_FORMS))
def test_batch_decode_steps_rust_equals_baseline(base, rust, scs, slot_form, id_dtype):
    assert drive_batch(rust, scs, decode=(slot_form, id_dtype)) == drive_batch(base, scs, decode=("list", None))


def test_batch_membership_never_raises():
    import stopline

    b = stopline.FinishBatch(3)
    b.add(1, stopline.StopParams())
    assert (1 in b, 2 in b, 3 in b, -1 in b, 2**70 in b, "a" in b, None in b) == (
        True, False, False, False, False, False, False)


def test_batch_repr_counts_occupied_and_finished_slots():
    import stopline

    b = stopline.FinishBatch(8)
    assert repr(b) == "FinishBatch(max_slots=8, occupied=0, finished=0)"
    b.add(0, stopline.StopParams(max_tokens=1))
    b.add(5, stopline.StopParams())
    assert repr(b) == "FinishBatch(max_slots=8, occupied=2, finished=0)"
    b.step([0, 5], [1, 2])  # slot 0 reaches max_tokens
    assert repr(b) == "FinishBatch(max_slots=8, occupied=2, finished=1)"
    b.remove(0)
    assert repr(b) == "FinishBatch(max_slots=8, occupied=1, finished=0)"
    assert repr(stopline.FinishBatch(0)) == "FinishBatch(max_slots=0, occupied=0, finished=0)"


# ------------------------------------------------- batch input shapes

class _Index:
    """An int-like object (``__index__``), as numpy integers are."""

    def __init__(self, v):
        self.v = v

    def __index__(self):
        return self.v


def test_batch_accepts_range_slots_and_int_like_ids(impl):
    # slots as a range, ids given as int-like objects: the same result as
    # plain lists (the Rust binding reads plain lists through a fast path and
    # everything else through the general one).
    def run(slots, ids):
        b = impl.FinishBatch(8)
        p = impl.StopParams(stop=["yz"], eos_token_ids=[2])
        for s in (1, 3, 5):
            b.add(s, p)
        out = []
        for k, step_ids in enumerate(ids):
            r = b.step(slots, step_ids, None, [["ab", "xy", "z!"][k]] * 3)
            out.append([(x.finished, x.text_delta, list(x.token_ids_delta), x.num_tokens) for x in r])
        return out

    plain = run([1, 3, 5], [[7, 8, 9], [7, 8, 9], [7, 2, 9]])
    assert run(range(1, 6, 2), [[7, 8, 9], [7, 8, 9], [7, 2, 9]]) == plain
    assert run([1, 3, 5], [[_Index(7), 8, True * 9], [7, 8, 9], [7, _Index(2), 9]]) == plain
    assert [row[0] for row in plain[-1]] == [True, True, True]


def test_token_ids_from_buffers_equal_lists(rust):
    # NumPy arrays of any integer dtype, array.array and bytes are read as
    # buffers; strided views go through the general path; both give what a
    # list gives.
    np = pytest.importorskip("numpy")
    import array

    ids = [5, 6, 2, 7]
    forms = [
        np.array(ids, dtype=np.int64), np.array(ids, dtype=np.int32), np.array(ids, dtype=np.uint32),
        np.array(ids, dtype=np.uint8), np.array(ids, dtype=">i4"), np.repeat(np.array(ids, dtype=np.int64), 2)[::2],
        array.array("q", ids), array.array("H", ids), bytes(ids), memoryview(bytearray(ids)),
        # Items not aligned to their size (the general path reads them).
        np.frombuffer(b"\0" + np.array(ids, dtype=np.int64).tobytes(), dtype=np.int64, offset=1),
    ]

    def run(token_ids):
        b = rust.FinishBatch(4)
        for s in range(4):
            b.add(s, rust.StopParams(stop=["END"], eos_token_ids=[2]))
        r = b.step(range(4), token_ids, None, ["a", "b", "c", "d"])
        t = rust.FinishTracker(rust.StopParams(eos_token_ids=[2]))
        u = t.update(token_ids, ["a", "b", "c", "d"])
        return r.finished_flags, r.token_ids_deltas, u.token_ids_delta, u.finish_reason

    want = run(ids)
    assert want[0] == [False, False, True, False]
    for form in forms:
        assert run(form) == want, form
    b = rust.FinishBatch(4)
    b.add(0, rust.StopParams())
    assert b.step(np.array([0]), np.array([9], dtype=np.int16)).token_ids_deltas == [[9]]


@pytest.mark.parametrize(
    "bad, error, message",
    [
        ([5, -1], ValueError, r"token_ids\[1\] \(slot 1\)=-1 is not a valid token id"),
        ([5, 2**40], ValueError, r"token_ids\[1\] \(slot 1\)=1099511627776 is not a valid token id"),
        ([5.0, 6.0], TypeError, r"token_ids\[0\] \(slot 0\) must be an int, got float64"),
        ([[5], [6]], TypeError, r"token_ids\[0\] \(slot 0\) must be an int, got ndarray"),
    ],
)
def test_bad_token_ids_in_arrays_are_named(rust, bad, error, message):
    np = pytest.importorskip("numpy")
    b = rust.FinishBatch(2)
    b.add(0, rust.StopParams())
    b.add(1, rust.StopParams())
    with pytest.raises(error, match=message):
        b.step(range(2), np.array(bad), None, ["a", "b"])
    assert b.token_ids(0) == [] and b.token_ids(1) == []


def test_char_buffers_are_not_token_ids(impl):
    # Format 'c' items are one-byte bytes objects, not ints.
    b = impl.FinishBatch(2)
    b.add(0, impl.StopParams())
    b.add(1, impl.StopParams())
    with pytest.raises(TypeError, match=r"token_ids\[0\].* must be an int, got bytes"):
        b.step([0, 1], memoryview(b"\x01\x02").cast("c"))


_GC_MUTATES_TEXTS = """
import gc
from stopline import FinishBatch, StopParams

N = 64
for runs in (False, True):
    for extra in range(8):
        b = FinishBatch(N)
        for s in range(N):
            b.add(s, StopParams())
        texts = ["piece-%d-" % i + "x" * 200 for i in range(N)]
        want = ["piece-%d-" % i + "x" * 200 for i in range(N)]  # other objects: clear() frees the pieces
        slots, ids, runs_arg = list(range(N)), list(range(N)), [1] * N if runs else None
        junk = []

        def cb(phase, info):
            # The collection drops every piece and reuses its memory, as a
            # __del__ run by the collector may.
            if phase == "start" and texts:
                texts.clear()
                junk.extend(["Z" * 213 for _ in range(300)])

        gc.callbacks.append(cb)
        # Empty CPython's free list of list objects (new lists then come from
        # the allocator, which counts them), then let the extra-th counted
        # allocation from here start a collection.
        hold = [[] for _ in range(100)]
        gc.set_threshold(gc.get_count()[0] + extra)
        try:
            r = b.step(slots, ids, runs_arg, texts)
        except ValueError:
            r = None
        finally:
            gc.set_threshold(700)
            gc.callbacks.remove(cb)
        if r is None:
            assert all(b.text(s) == "" for s in range(N)), (runs, extra)
        else:
            assert r.text_deltas == want, (runs, extra, r.text_deltas[0][:12])
            assert [b.text(s) for s in range(N)] == want, (runs, extra)
print("ok")
"""


def test_batch_step_survives_a_collection_that_changes_the_texts_list():
    # A garbage collection started by an allocation inside the call can run
    # code that empties the caller's list: the step must then see the list
    # whole or fail cleanly, never read freed pieces (it once did).
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", _GC_MUTATES_TEXTS], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "ok", (out.returncode, out.stderr[-2000:])


def test_batch_text_deltas_survive_changes_to_the_input_list(impl):
    b = impl.FinishBatch(2)
    b.add(0, impl.StopParams(stop=["STOP"]))
    b.add(1, impl.StopParams(stop=["STOP"]))
    texts = ["free text", "ST"]  # slot 1 holds "ST" back
    r = b.step([0, 1], [5, 6], None, texts)
    texts[0] = "changed"
    texts.clear()
    assert [x.text_delta for x in r] == ["free text", ""]


def test_batch_text_deltas_is_a_new_list_on_every_read(rust):
    b = rust.FinishBatch(3)
    for s in range(3):
        b.add(s, rust.StopParams(stop=["STOP"]))
    # Slot 1 holds "ST" back, then finishes on "STOP" with the stop cut.
    r = b.step([0, 1], [5, 6], None, ["a", "ST"])
    first = r.text_deltas
    first[0] = "changed"
    first.append("more")
    assert r.text_deltas == ["a", ""]
    assert [x.text_delta for x in r] == ["a", ""]
    r = b.step(range(2), [5, 6], None, ["b", "OP!"])
    assert r.text_deltas == ["b", ""]
    assert r.finished_slots == [1]
    assert r.finish_reasons == [None, "stop"]


def test_batch_hands_back_the_input_piece_without_a_copy(rust):
    b = rust.FinishBatch(2)
    b.add(0, rust.StopParams(stop=["STOP"]))
    pieces = ["".join(["wh", "ole"]), "ST"]
    r = b.step(range(1), [5], None, pieces[:1])
    assert r.text_deltas[0] is pieces[0]


class _Oops(Exception):
    pass


class _IndexRaises:
    def __index__(self):
        raise KeyboardInterrupt


class _IterRaises:
    def __iter__(self):
        raise _Oops


def test_exceptions_from_index_and_iter_propagate(impl):
    # Only "not an int" / "not iterable" become stopline's own TypeError;
    # anything else the caller's objects raise reaches the caller unchanged.
    b = impl.FinishBatch(2)
    b.add(0, impl.StopParams())
    with pytest.raises(KeyboardInterrupt):
        b.step([0], [_IndexRaises()])
    with pytest.raises(KeyboardInterrupt):
        b.step([_IndexRaises()], [1])
    with pytest.raises(_Oops):
        b.step([0], _IterRaises())
    with pytest.raises(_Oops):
        b.step([0], [1], None, _IterRaises())
    with pytest.raises(_Oops):
        impl.FinishTracker(impl.StopParams()).update(_IterRaises())
    assert list(b.step([0], [9]))[0].num_tokens == 1   # nothing was half-applied


def test_exceptions_from_iter_propagate_out_of_stop_lists():
    import stopline

    with pytest.raises(_Oops):
        stopline.StopStrings(_IterRaises())
    with pytest.raises(_Oops):
        stopline.StopParams(stop_regex=_IterRaises())


class _Reversed(list):
    def __iter__(self):
        return iter(list(super().__iter__())[::-1])


def test_list_subclasses_are_read_through_their_iter(impl):
    b = impl.FinishBatch(3)
    for s in (0, 1, 2):
        b.add(s, impl.StopParams(max_tokens=8, stop=["ax"]))
    rows = list(b.step(_Reversed([0, 1, 2]), [5, 6, 7], None, ["a", "b", "c"]))
    # Iterated in reverse: slot 2 takes id 5 and piece "a" (held back: it may
    # start "ax"), slot 0 takes "c".
    assert [(list(r.token_ids_delta), r.text_delta) for r in rows] == [([], ""), ([6], "b"), ([7], "c")]
    # Slot 2 came first and took "a": "x" completes its stop string.
    assert list(b.step([2], [8], None, ["x"]))[0].finish_reason == "stop"


class _Loud(str):
    def __add__(self, other):
        return "HIJACK"


def test_str_subclass_pieces_come_back_as_plain_str(impl):
    b = impl.FinishBatch(1)
    b.add(0, impl.StopParams(stop=["zz"]))
    (row,) = list(b.step([0], [1], None, [_Loud("hi")]))
    assert type(row.text_delta) is str and row.text_delta + "!" == "hi!"
