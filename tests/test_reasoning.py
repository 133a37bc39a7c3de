"""Reasoning channels (docs/semantics.md section 11): the Rust core against the
pure-Python baseline, step invariance, per-channel deltas, token-aligned
release, the thinking budget, and the reported engine failures as named
tests."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import stopline
from stopline import baseline

THINK = {"reasoning_start": "<think>", "reasoning_end": "</think>"}

# Pieces that cut the markers everywhere, and put them next to content.
PIECES = [
    "", "a", "b", "<", "<th", "ink>", "</", "think>", "</think>", "<think>", "k>", "é", "ab",
    "\n", "\n\n", "x</think>y", "<think>z", "</th", "<thi", "日本",
]

FIELDS = (
    "finished", "finish_reason", "stop_reason", "matched", "num_tokens", "text_len", "text_delta",
    "token_ids_delta", "channel", "reasoning_delta", "content_delta", "reasoning_token_ids_delta",
    "content_token_ids_delta", "forced_token_id",
)


def fields(r: Any) -> tuple[Any, ...]:
    return tuple(getattr(r, f) for f in FIELDS)


def drive(impl: Any, params: Any, toks: Sequence[tuple[int, str]], bounds: Sequence[int],
          **kw: Any) -> tuple[list[tuple[Any, ...]], Any]:
    """Every step's fields (and the abort's if still running) and the tracker."""
    t = impl.FinishTracker(params, **kw)
    out, prev = [], 0
    for b in bounds:
        if t.finished:
            break
        run = toks[prev:b]
        out.append(fields(t.update([i for i, _ in run], [p for _, p in run])))
        prev = b
    if not t.finished:
        out.append(fields(t.abort()))
    return out, t


def joined(steps: list[tuple[Any, ...]]) -> tuple[Any, ...]:
    """The concatenated text / id deltas per channel, and the final fields."""
    cat = [FIELDS.index(f) for f in ("text_delta", "reasoning_delta", "content_delta")]
    ids = [FIELDS.index(f) for f in ("token_ids_delta", "reasoning_token_ids_delta", "content_token_ids_delta")]
    last = steps[-1]
    return (
        tuple("".join(s[i] for s in steps) for i in cat),
        tuple(sum((s[i] for s in steps), []) for i in ids),
        last[:6], last[FIELDS.index("channel")],
    )


def both(**kw: Any) -> tuple[Any, Any]:
    return stopline.StopParams(**kw), baseline.StopParams(**kw)


def bounds_of(cuts: list[int], n: int) -> list[int]:
    return sorted({c for c in cuts if 0 < c < n} | {n})


SCOPES = st.sampled_from(["content", "reasoning", "any"])


@st.composite
def cases(draw: st.DrawFn) -> tuple[dict[str, Any], list[tuple[int, str]], list[int]]:
    stops = draw(st.lists(st.sampled_from(["ab", "\na", "é", "b\n", "日"]), max_size=2, unique=True))
    kw: dict[str, Any] = dict(THINK)
    kw.update(
        stop=stops,
        stop_scopes=[draw(SCOPES) for _ in stops],
        keep_reasoning_markers=draw(st.booleans()),
        include_stop_str_in_output=draw(st.booleans()),
        token_aligned=draw(st.booleans()),
        min_tokens=draw(st.integers(0, 3)),
        max_tokens=25,
        eos_token_ids=[2],
        stop_token_ids=[7],
        stop_token_id_scopes=[draw(SCOPES)],
    )
    if draw(st.booleans()):
        kw["reasoning_starts_in"] = "reasoning"
    if draw(st.booleans()):
        kw.update(reasoning_start_id=10, reasoning_end_id=11)
    if draw(st.booleans()):
        kw.update(reasoning_end_ids=[11, 12], max_reasoning_tokens=draw(st.integers(0, 4)))
        kw.setdefault("reasoning_end_id", 11)
    if draw(st.integers(0, 4)) == 0:
        # No reasoning: token-aligned release and the plain deltas alone.
        kw = {k: v for k, v in kw.items()
              if not k.startswith(("reasoning", "keep_reasoning", "max_reasoning")) and not k.endswith("scopes")}
    toks = draw(st.lists(st.tuples(st.integers(0, 12), st.sampled_from(PIECES)), min_size=1, max_size=25))
    cuts = draw(st.lists(st.integers(1, 25), max_size=5))
    return kw, toks, cuts


@settings(max_examples=150, deadline=None)
@given(cases())
def test_rust_equals_baseline_step_by_step(case: tuple[dict[str, Any], list[tuple[int, str]], list[int]]) -> None:
    kw, toks, cuts = case
    rp, bp = both(**kw)
    b = bounds_of(cuts, len(toks))
    rust_steps, rt = drive(stopline, rp, toks, b)
    base_steps, bt = drive(baseline, bp, toks, b)
    assert rust_steps == base_steps
    for name in ("reasoning", "content", "reasoning_token_ids", "content_token_ids", "channel", "text"):
        assert getattr(rt, name) == getattr(bt, name), name


@settings(max_examples=150, deadline=None)
@given(cases())
def test_step_invariance_and_joined_deltas_equal_the_channels(
    case: tuple[dict[str, Any], list[tuple[int, str]], list[int]],
) -> None:
    kw, toks, cuts = case
    p = stopline.StopParams(**kw)
    singles, t1 = drive(stopline, p, toks, range(1, len(toks) + 1))
    runs, t2 = drive(stopline, p, toks, bounds_of(cuts, len(toks)))
    assert joined(singles) == joined(runs)
    (text, reasoning, content), (ids, r_ids, c_ids), _, channel = joined(runs)
    assert (text, ids) == (t2.text, t2.token_ids)
    assert (reasoning, content, r_ids, c_ids) == (t2.reasoning, t2.content, t2.reasoning_token_ids,
                                                  t2.content_token_ids)
    assert channel == t2.channel
    if kw["token_aligned"]:
        # While running, a step releases whole tokens: its text is its tokens' text.
        pieces = [p for _, p in toks]
        start = 0
        for s in runs:
            n = len(s[FIELDS.index("token_ids_delta")])
            if not s[0]:
                assert s[FIELDS.index("text_delta")] == "".join(pieces[start:start + n])
            start += n


@settings(max_examples=100, deadline=None)
@given(cases(), st.lists(st.sampled_from([r"a+b", r"[xy]{2}", r"\n\n+a", r"é."]), min_size=1, max_size=2,
                         unique=True), st.lists(SCOPES, min_size=2, max_size=2))
def test_stop_regexes_in_channels_rust_equals_baseline(
    case: tuple[dict[str, Any], list[tuple[int, str]], list[int]], regexes: list[str], scopes: list[str],
) -> None:
    # The baseline's regex hold-back is a safe bound, not exact: compare what
    # the sequences keep and how they finish, not the step deltas.
    kw, toks, cuts = case
    kw = dict(kw, stop_regex=regexes)
    if "reasoning_end" in kw or "reasoning_end_id" in kw:
        kw["stop_regex_scopes"] = scopes[:len(regexes)]
    rp, bp = both(**kw)
    b = bounds_of(cuts, len(toks))
    _, rt = drive(stopline, rp, toks, b)
    _, bt = drive(baseline, bp, toks, b)
    for name in ("finish_reason", "stop_reason", "matched", "text", "token_ids", "reasoning", "content",
                 "reasoning_token_ids", "content_token_ids", "channel"):
        assert getattr(rt, name) == getattr(bt, name), name


def stream(params: stopline.StopParams, pieces: Sequence[str], **kw: Any) -> tuple[list[Any], Any]:
    t = stopline.FinishTracker(params, **kw)
    steps = []
    for i, p in enumerate(pieces):
        if t.finished:
            break
        steps.append(t.update(100 + i, [p]))
    return steps, t


def test_vllm_52393_stop_inside_thinking_does_not_fire_under_content_scope() -> None:
    # A client stop string met in the chain of thought used to end the request
    # with empty content (vllm#52393, #14399; lm-evaluation-harness#3700).
    p = stopline.StopParams(stop=["\n\n"], **THINK)
    steps, t = stream(p, ["<think>", "Step 1.\n\nStep 2.", "</think>", "Answer: 4", "\n\nextra"])
    assert (t.finish_reason, t.stop_reason, t.channel) == ("stop", "\n\n", "content")
    assert (t.reasoning, t.content) == ("Step 1.\n\nStep 2.", "Answer: 4")
    assert "".join(s.content_delta for s in steps) == "Answer: 4"


def test_vllm_45636_a_cut_marker_is_never_streamed() -> None:
    # `<thin` + `k>` reached the reasoning parser as two deltas (vllm#45636).
    p = stopline.StopParams(**THINK)
    steps, t = stream(p, ["<thin", "k>", "plan", "</th", "ink>", "Hi"])
    assert [s.text_delta for s in steps] == ["", "<think>", "plan", "", "</think>", "Hi"]
    assert [s.reasoning_delta for s in steps] == ["", "", "plan", "", "", ""]
    assert [s.content_delta for s in steps] == ["", "", "", "", "", "Hi"]
    assert (t.reasoning_token_ids, t.content_token_ids) == ([102], [105])


def test_stop_straddling_the_end_marker_never_matches() -> None:
    p = stopline.StopParams(stop=["ab"], stop_scopes="any", **THINK)
    _, t = stream(p, ["<think>x", "a</think>", "b", " then ab"])
    assert (t.reasoning, t.content, t.stop_reason) == ("xa", "b then ", "ab")


def test_length_mid_think_gives_length_and_empty_content() -> None:
    p = stopline.StopParams(max_tokens=3, **THINK)
    steps, t = stream(p, ["<think>", "long", " thought"])
    assert (t.finish_reason, t.channel, t.content, t.reasoning) == ("length", "reasoning", "", "long thought")
    assert steps[-1].channel == "reasoning" and steps[-1].content_delta == ""


def test_prompt_opened_thinking_with_a_vocabulary() -> None:
    # DeepSeek-R1's chat template ends the prompt with `<think>\n`.
    from stopline.tools.models import ModelFileError
    from stopline.tools.vocab_files import tokenizer_json_path

    try:
        path = tokenizer_json_path("deepseek-v3")
    except ModelFileError as exc:
        pytest.skip(str(exc))
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(path))
    v = stopline.Vocabulary.from_file(path)
    think, end = tok.token_to_id("<think>"), tok.token_to_id("</think>")
    p = stopline.StopParams(reasoning_start_id=think, reasoning_end_id=end, stop=["\n\n"])
    prompt = tok.encode("User: hi\nAssistant: <think>\n").ids
    assert think in prompt
    out = tok.encode("Let me see.\n\nOK</think>Hello\n\nbye").ids
    t = stopline.FinishTracker(p, vocabulary=v, prompt_token_ids=prompt, skip_special_tokens=False)
    for i in out:
        if t.finished:
            break
        t.update(i)
    assert (t.reasoning, t.content, t.stop_reason) == ("Let me see.\n\nOK", "Hello", "\n\n")
    b = stopline.FinishBatch(2, vocabulary=v)
    b.add(0, p, prompt_token_ids=prompt, skip_special_tokens=False)
    content = ""
    for i in out:
        r = b.step([0], [i])
        content += r.content_deltas[0] or ""
        if r.finished_flags[0]:
            break
    assert (content, r.channels[0]) == ("Hello", "content")
    # Without the prompt the output starts in content: the stop fires in the thinking.
    t = stopline.FinishTracker(p, vocabulary=v, skip_special_tokens=False)
    for i in out:
        if not t.finished:
            t.update(i)
    assert (t.reasoning, t.content) == ("", "Let me see.")
    # The budget counts the prompt's tokens after `<think>` (the "\n"), as vLLM.
    budgeted = stopline.StopParams(reasoning_start_id=think, reasoning_end_id=end, max_reasoning_tokens=3)
    t = stopline.FinishTracker(budgeted, vocabulary=v, prompt_token_ids=prompt)
    assert (t.reasoning_tokens, t.forced_token_id) == (1, None)
    t.update(out[:2])
    assert (t.reasoning_tokens, t.forced_token_id) == (3, end)
    with pytest.raises(ValueError, match=r"reasoning_end_id=999999 is outside"):
        stopline.FinishTracker(stopline.StopParams(reasoning_end_id=999999), vocabulary=v)


def test_real_tokenizer_splits_the_marker_across_tokens() -> None:
    from stopline.tools.models import ModelFileError
    from stopline.tools.vocab_files import tokenizer_json_path

    try:
        path = tokenizer_json_path("smollm2")
    except ModelFileError as exc:
        pytest.skip(str(exc))
    v = stopline.Vocabulary.from_file(path)
    from tokenizers import Tokenizer

    ids = Tokenizer.from_file(str(path)).encode("<think>\nplan a\n\nb\n</think>Done.\n\nmore").ids
    p = stopline.StopParams(stop=["\n\n"], **THINK)
    t = stopline.FinishTracker(p, vocabulary=v)
    deltas = [t.update(i) for i in ids if not t.finished]
    assert (t.reasoning, t.content) == ("\nplan a\n\nb\n", "Done.")
    assert not any(d.text_delta.endswith(("<", "<th", "</")) for d in deltas)


def test_thinking_budget_forces_the_end_marker_ids_one_per_step() -> None:
    # As vLLM's ThinkingBudgetStateHolder: once `budget` tokens follow
    # the start marker, the end marker's ids are forced in order.
    p = stopline.StopParams(max_reasoning_tokens=2, reasoning_end_ids=[7, 8], **THINK)
    t = stopline.FinishTracker(p)
    r = t.update([1, 2], ["<think>", "a"])
    assert r.forced_token_id is None
    r = t.update(3, ["b"])
    assert (r.forced_token_id, t.reasoning_tokens) == (7, 2)
    assert t.update(7, ["</think"]).forced_token_id == 8
    r = t.update(8, [">"])
    assert (r.forced_token_id, r.channel) == (None, "content")


def test_batch_ids_only_with_marker_ids_equals_trackers() -> None:
    kw = dict(reasoning_start_id=5, reasoning_end_id=6, stop_token_ids=[9], stop_token_id_scopes=["content"],
              max_reasoning_tokens=3)
    b = stopline.FinishBatch(4)
    b.add(1, stopline.StopParams(**kw))  # type: ignore[arg-type]
    b.add(2, stopline.StopParams())
    t = stopline.FinishTracker(stopline.StopParams(**kw))  # type: ignore[arg-type]
    seq = [5, 9, 3, 4, 6, 8, 9]
    for i in seq:
        r = b.step([1, 2], [i, 0])
        one = t.update(i)
        assert fields(r[0]) == fields(one)
        assert (r.channels[0], r.channels[1]) == (one.channel, None)
        assert r.forced_token_ids[0] == one.forced_token_id
        assert r.forced_tokens == ([] if one.forced_token_id is None else [(1, one.forced_token_id)])
        assert r.reasoning_token_ids_deltas[0] == one.reasoning_token_ids_delta
        assert r.content_token_ids_deltas[1] is None
        if one.finished:
            break
    assert (t.reasoning_token_ids, t.content_token_ids, t.stop_reason) == ([9, 3, 4], [8, 9], 9)


@settings(max_examples=60, deadline=None)
@given(cases(), st.lists(st.integers(0, 3), min_size=1, max_size=8))
def test_batch_with_texts_equals_trackers(
    case: tuple[dict[str, Any], list[tuple[int, str]], list[int]], runs: list[int],
) -> None:
    kw, toks, _ = case
    p = stopline.StopParams(**kw)
    b = stopline.FinishBatch(3)
    b.add(2, p)
    b.add(0, stopline.StopParams())
    t = stopline.FinishTracker(p)
    pos = 0
    for n in runs:
        run = toks[pos:pos + n]
        pos += n
        r = b.step([2, 0], [i for i, _ in run] + [1], [len(run), 1], [x for _, x in run] + ["z"])
        one = t.update([i for i, _ in run], [x for _, x in run])
        assert fields(r[0]) == fields(one)
        lists = (r.channels[0], r.reasoning_deltas[0], r.content_deltas[0],
                 r.reasoning_token_ids_deltas[0], r.content_token_ids_deltas[0])
        if one.channel is None:  # the lists say None for a row without reasoning
            assert lists == (None,) * 5
        else:
            assert lists == (one.channel, one.reasoning_delta, one.content_delta,
                             one.reasoning_token_ids_delta, one.content_token_ids_delta)
        assert (r.channels[1], r.content_deltas[1], r[1].content_delta) == (None, None, "z")
        assert r.forced_tokens == ([] if one.forced_token_id is None else [(2, one.forced_token_id)])
        if one.finished:
            break


@pytest.mark.parametrize("impl", [stopline, baseline], ids=["rust", "baseline"])
@pytest.mark.parametrize(("kw", "message"), [
    (dict(reasoning_start="", reasoning_end="</think>"), "reasoning_start is an empty string"),
    (dict(reasoning_start="<think>"), "reasoning_end is required"),
    (dict(stop=["</think>"], **THINK), r"stop\[0\]=.</think>. overlaps reasoning_end"),
    (dict(stop=["x", "a<think>"], **THINK), r"stop\[1\]=.a<think>. overlaps reasoning_start"),
    (dict(reasoning_end_id=2, eos_token_ids=[2]), r"eos_token_ids\[0\]=2 overlaps reasoning_end_id"),
    (dict(reasoning_end_id=50, vocab_size=50), r"reasoning_end_id=50 is outside"),
    (dict(stop=["a"], stop_scopes=["any", "any"], **THINK), "stop_scopes has 2 scopes for 1"),
    (dict(stop=["a"], stop_scopes="thinking", **THINK), "is not one of 'content', 'reasoning' or 'any'"),
    (dict(max_reasoning_tokens=4, **THINK), "reasoning_end_ids is required"),
    (dict(reasoning_start="<think>", reasoning_end="<think>/"), "reasoning_end=.<think>/. overlaps reasoning_start"),
])
def test_bad_definitions_name_the_field(impl: Any, kw: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        impl.StopParams(**kw)


def test_without_reasoning_everything_is_content() -> None:
    p = stopline.StopParams(stop=["z"])
    r = stopline.FinishTracker(p).update([1, 2], ["ab", "c"])
    assert (r.channel, r.reasoning_delta, r.content_delta, r.content_token_ids_delta) == (None, "", "abc", [1, 2])


def test_marker_text_has_a_cap() -> None:
    cap = stopline.LIMITS["max_marker_bytes"]
    stopline.StopParams(reasoning_end="x" * cap)
    with pytest.raises(ValueError, match=f"reasoning_end totals {cap + 1} UTF-8 bytes; at most {cap}"):
        stopline.StopParams(reasoning_end="x" * (cap + 1))


# sglang#40529 lists five defects of thinking models with stop sequences (PRs
# #33151-#33155); each is a named case here with stopline's output. The
# engines job shows SGLang 0.5.23's own behaviour in test_reasoning_parity.py.

def test_sglang_40529_1_user_stops_sleep_in_the_thinking_eos_does_not() -> None:
    # Defect 1 (#33152): stop strings, regexes and stop ids checked during
    # the thinking. Content-scoped stops wait for the content; EOS and the end
    # marker still act inside the block.
    p = stopline.StopParams(stop=["\n\n"], stop_regex=["Answer:"], stop_token_ids=[9], eos_token_ids=[2], **THINK)
    t = stopline.FinishTracker(p)
    for i, piece in [(1, "<think>"), (3, "plan\n\nAnswer: 4"), (9, "x"), (4, "</think>"), (5, "It is 4"), (6, "\n\n")]:
        r = t.update(i, [piece])
    assert (r.finish_reason, r.stop_reason, r.channel) == ("stop", "\n\n", "content")
    assert (t.reasoning, t.content, t.reasoning_token_ids) == ("plan\n\nAnswer: 4x", "It is 4", [3, 9])
    t = stopline.FinishTracker(p)
    t.update([1, 3], ["<think>", "plan"])
    r = t.update(2, ["</s>"])
    assert (r.finish_reason, r.stop_reason, r.matched, r.channel) == ("stop", None, 2, "reasoning")


def test_sglang_40529_2_a_stop_string_and_eos_finish_apart() -> None:
    # Defect 2 (#33153): the Anthropic route reported end_turn for a matched
    # stop sequence. stopline's result tells them apart (stop_reason is the
    # string, or None for EOS), which is what an adapter maps to
    # "stop_sequence" / "end_turn".
    p = stopline.StopParams(stop=["END"], eos_token_ids=[2], **THINK)
    by_stop = stopline.FinishTracker(p)
    r = by_stop.update([1, 3, 4, 5], ["<think>", "a", "</think>", "b END"])
    assert (r.finish_reason, r.stop_reason, r.matched, by_stop.content) == ("stop", "END", "END", "b ")
    by_eos = stopline.FinishTracker(p)
    r = by_eos.update([1, 3, 4, 5, 2], ["<think>", "a", "</think>", "b", ""])
    assert (r.finish_reason, r.stop_reason, r.matched, by_eos.content) == ("stop", None, 2, "b")


def test_sglang_40529_3_thinking_cut_short_keeps_it_reasoning_and_says_so() -> None:
    # Defect 3 (#33154): thinking ended by a stop before the end marker came
    # back as reasoning with empty content; the PR moves it to content.
    # stopline keeps the split (the text was thinking) and names the channel
    # the sequence finished in, so the engine decides what to show; a stop
    # inside the block can only be EOS, a stop id or a reasoning-scoped stop.
    p = stopline.StopParams(stop=["\n\n"], stop_scopes="reasoning", eos_token_ids=[2], **THINK)
    for last, piece, reason in ((7, "\n\nmore", "\n\n"), (2, "", None)):
        t = stopline.FinishTracker(p)
        r = t.update([1, 3, last], ["<think>", "step one", piece])
        assert (r.finish_reason, r.stop_reason, r.channel) == ("stop", reason, "reasoning")
        assert (t.reasoning, t.content, r.content_delta) == ("step one", "", "")


def test_sglang_40529_4_the_thinking_switch_is_never_dropped() -> None:
    # Defect 4 (#33155): a top-level enable_thinking=false silently ignored.
    # stopline's start state is explicit or read from the prompt: an unknown
    # keyword is a TypeError, and Qwen3's thinking-off prompt (its template
    # closes an empty block) starts the output in content, where the stop
    # fires; reasoning_starts_in="content" says the same without a prompt.
    with pytest.raises(TypeError, match="enable_thinking"):
        stopline.StopParams(enable_thinking=False)  # type: ignore[call-arg]
    pytest.importorskip("tokenizers")
    from reasoning_peers import tokenizer

    from stopline.tools.models import ModelFileError

    try:
        qwen3 = tokenizer("qwen3")
    except ModelFileError as exc:
        pytest.skip(str(exc))
    tok, v = qwen3.tok, qwen3.vocab
    head = "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    out = tok.encode("Sure.\n\nMore").ids
    for prompt, starts_in, want in [
        (head + "<think>\n", None, (None, "reasoning", "Sure.\n\nMore", "")),
        (head + "<think>\n\n</think>\n\n", None, ("stop", "content", "", "Sure.")),
        (head + "<think>\n", "content", ("stop", "content", "", "Sure.")),
    ]:
        p = stopline.StopParams(reasoning_start_id=151667, reasoning_end_id=151668, stop=["\n\n"],
                                reasoning_starts_in=starts_in)  # type: ignore[arg-type]
        t = stopline.FinishTracker(p, vocabulary=v, prompt_token_ids=tok.encode(prompt).ids)
        for i in out:
            if not t.finished:
                t.update(i)
        assert (t.finish_reason, t.channel, t.reasoning, t.content) == want, (prompt, starts_in)


def test_sglang_40529_5_a_stop_cuts_the_content_not_an_earlier_mention_in_thinking() -> None:
    # Defect 5 (#33151): the stop was trimmed at its first occurrence in the
    # whole text, inside the thinking. stopline cuts where the match ended
    # the sequence: in the content.
    p = stopline.StopParams(stop=["END"], **THINK)
    t = stopline.FinishTracker(p)
    t.update([1, 3, 4, 5, 6], ["<think>", "say END at the end", "</think>", "ok END", " more"])
    assert (t.reasoning, t.content, t.text) == ("say END at the end", "ok ", "<think>say END at the end</think>ok ")


@pytest.mark.parametrize("impl", [stopline, baseline], ids=["rust", "baseline"])
def test_a_start_marker_again_inside_a_prompt_opened_block_is_a_marker(impl: Any) -> None:
    # DeepSeek-R1-0528's and Qwen3's templates end the prompt with `<think>\n`
    # and the model may write `<think>` again: a marker, as vLLM's and
    # SGLang's parsers drop it (semantics.md 11 rule 1).
    p = impl.StopParams(reasoning_starts_in="reasoning", stop=["ab"], stop_scopes=["reasoning"], **THINK)
    t = impl.FinishTracker(p)
    steps = [t.update([100 + i], [x]) for i, x in enumerate(["<think>", "a", "<thi", "nk>b", "</think>", "c"])]
    t.abort()
    assert (t.reasoning, t.content, t.finish_reason) == ("ab", "c", "abort")
    assert (t.reasoning_token_ids, t.content_token_ids) == ([101, 103], [105])
    # Never streamed cut, never matched by a stop (`a<think>b` is not `ab`;
    # "a" waits as a prefix of the stop, then the marker restarts the matcher).
    assert [s.text_delta for s in steps] == ["<think>", "", "", "a<think>b", "</think>", "c"]
    assert [s.reasoning_delta for s in steps] == ["", "", "", "ab", "", ""]
    # By id, in one accept run; kept markers go to the reasoning channel.
    p = impl.StopParams(reasoning_start_id=5, reasoning_end_id=6, reasoning_starts_in="reasoning")
    t = impl.FinishTracker(p)
    r = t.update([5, 7, 5, 8, 6, 9], ["", "a", "", "b", "", "c"])
    assert (r.reasoning_delta, r.reasoning_token_ids_delta, r.content_delta) == ("ab", [7, 8], "c")
    p = impl.StopParams(reasoning_starts_in="reasoning", keep_reasoning_markers=True, **THINK)
    t = impl.FinishTracker(p)
    t.update([1, 2, 3], ["<think>a", "</think>", "b"])
    assert (t.reasoning, t.content) == ("<think>a</think>", "b")


@pytest.mark.parametrize("impl", [stopline, baseline], ids=["rust", "baseline"])
@pytest.mark.parametrize("by_id", [False, True], ids=["text", "id"])
def test_text_on_both_sides_of_a_dropped_start_marker_is_not_matched_across_it(impl: Any, by_id: bool) -> None:
    # Markers are matched from the end of the last one on, so `</` and
    # `think>` around an absorbed `<think>` stay reasoning text, joined.
    ids = {"reasoning_start_id": 10, "reasoning_end_id": 11} if by_id else {}
    p = impl.StopParams(reasoning_starts_in="reasoning", **THINK, **ids)
    start = (10, "") if by_id else (1, "<think>")
    toks = [(3, "</"), start, (0, "think>")]
    for bounds in ([1, 2, 3], [3]):
        steps, t = drive(impl, p, toks, bounds)
        assert (t.reasoning, t.content, t.channel) == ("</think>", "", "reasoning")
        assert "".join(s[FIELDS.index("reasoning_delta")] for s in steps) == "</think>"


@pytest.mark.parametrize("impl", [stopline, baseline], ids=["rust", "baseline"])
def test_a_start_marker_after_the_block_closed_is_content_text(impl: Any) -> None:
    t = impl.FinishTracker(impl.StopParams(**THINK))
    r = t.update([1, 2, 3], ["<think>a<think>b", "</think>c", "<think>d"])
    assert (r.reasoning_delta, r.content_delta) == ("ab", "c<think>d")


def test_thinking_budget_spent_by_the_prompt_forces_the_end_marker_at_once() -> None:
    # vLLM 0.33's ThinkingBudgetStateHolder: a prompt that opened the block
    # with more thinking tokens than the budget forces the end ids from the
    # first output token on, one per step (not end_ids[count - budget]).
    Tokenizer = pytest.importorskip("tokenizers").Tokenizer

    tok = Tokenizer.from_str(json.dumps({
        "version": "1.0", "added_tokens": [],
        "model": {"type": "WordLevel", "vocab": {"<think>": 0, "x": 1, "</": 2, "think>": 3, "y": 4, "\n": 5},
                  "unk_token": "x"},
        "pre_tokenizer": {"type": "Whitespace"}, "decoder": {"type": "Fuse"},
    }))
    v = stopline.Vocabulary.from_str(tok.to_str())
    prompt = [1, 0, 5, 1, 1]  # `<think>` then three thinking tokens
    for budget, want in [(0, [2, 3, None]), (3, [2, 3, None]), (4, [None, 2, 3])]:
        p = stopline.StopParams(reasoning_start="<think>", reasoning_end="</think>", reasoning_end_ids=[2, 3],
                                max_reasoning_tokens=budget)
        t = stopline.FinishTracker(p, vocabulary=v, prompt_token_ids=prompt)
        forced = []
        for _ in range(3):
            forced.append(t.forced_token_id)
            t.update(forced[-1] if forced[-1] is not None else 4)
        assert (forced, t.channel, t.reasoning) == (want, "content", "y" if budget == 4 else ""), budget


def test_a_prompt_is_read_by_marker_ids_without_a_vocabulary() -> None:
    # semantics.md 11 rule 1: marker ids read a prompt without a Vocabulary
    # (the prompt-opened block, and the budget's prompt count); text-only
    # markers cannot, and a prompt is then refused, naming the field.
    p = stopline.StopParams(stop=["x"], reasoning_start_id=5, reasoning_end_id=6, max_reasoning_tokens=2)
    t = stopline.FinishTracker(p, prompt_token_ids=[1, 5, 2, 3])
    assert (t.channel, t.forced_token_id) == ("reasoning", 6)
    assert stopline.FinishTracker(p, prompt_token_ids=[5, 2, 6]).channel == "content"
    b = stopline.FinishBatch(2)
    b.add(0, p, prompt_token_ids=[5])
    b.add(1, p, prompt_token_ids=[5, 6])
    r = b.step([0, 1], [7, 7], texts=["x", "x"])
    assert r.finished_slots == [1]  # the stop is content-scoped: slot 0 is thinking
    with pytest.raises(stopline.StoplineTypeError) as e:
        stopline.FinishTracker(p, prompt_token_ids="abc")
    assert e.value.field == "prompt_token_ids[0]"
    with pytest.raises(stopline.StoplineValueError, match="needs a vocabulary") as e:
        stopline.FinishTracker(stopline.StopParams(reasoning_start="<a>", reasoning_end="<b>"), prompt_token_ids=[1])
    assert e.value.field == "prompt_token_ids"


@pytest.mark.parametrize("kw", [
    dict(reasoning_start_id=7, reasoning_end_id=8),
    dict(reasoning_start="<think>", reasoning_start_id=7, reasoning_end="</think>", reasoning_end_id=8),
    dict(reasoning_start="<think>", reasoning_end="</think>"),
    dict(reasoning_start="<think>", reasoning_end_id=8),
    dict(reasoning_end_id=8),
    dict(stop=["x"]),
    dict(tool_call_marker_ids=[(3, 4)]),
])
def test_reads_prompt_by_ids_is_the_trackers_rule(kw: dict) -> None:
    """StopParams.reads_prompt_by_ids says whether a tracker without a vocabulary reads a
    prompt (both block markers are ids) or refuses it: the adapters ask it instead of
    restating the rule."""
    p = stopline.StopParams(**kw)
    by_ids = p.reads_prompt_by_ids
    assert by_ids == ("reasoning_start_id" in kw and "reasoning_end_id" in kw)
    if by_ids:
        t = stopline.FinishTracker(p, prompt_token_ids=[1, 7, 2])
        assert t.channel == "reasoning"
    else:
        with pytest.raises(ValueError, match="prompt_token_ids needs a vocabulary"):
            stopline.FinishTracker(p, prompt_token_ids=[1, 7, 2])
