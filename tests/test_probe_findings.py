"""Defects found by the issue-21 probe (reasoning keywords, tool-call spans,
the engine readers, replay), each a strict xfail naming the defect, so the
fix turns it into a plain test. Expected behaviour: docs/errors.md (bad input
gets a stopline error naming the field and value) and docs/semantics.md 11."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
from tokenizers import Tokenizer
from tokenizers.models import WordLevel

import stopline
from stopline import baseline
from stopline.compat import vllm_reasoning
from stopline.engines import reasoning_from_markers
from stopline.replay import load_trace


def _word_tokenizer() -> Tokenizer:
    return Tokenizer(WordLevel({"<a>": 0, "<b>": 1, "x": 2}, unk_token="x"))


def test_tool_call_marker_lone_surrogate_is_a_value_error_naming_the_element() -> None:
    # As stop[i] (docs/errors.md row 72): a ValueError naming the element.
    with pytest.raises(stopline.StoplineValueError) as e:
        stopline.StopParams(tool_call_markers=[("\ud800", "</t>")])
    assert e.value.field is not None and e.value.field.startswith("tool_call_markers[0]")
    assert "not valid Unicode" in str(e.value)


def test_reasoning_marker_lone_surrogate_is_a_stopline_value_error() -> None:
    with pytest.raises(stopline.StoplineValueError) as e:
        stopline.StopParams(reasoning_end="\ud800")
    assert e.value.field == "reasoning_end"


def test_replay_names_the_field_of_a_wrong_typed_reasoning_param(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    line = {"id": "r0", "params": {"reasoning_end": 5}, "steps": [{"ids": [1], "texts": ["a"]}]}
    path.write_text(json.dumps(line) + "\n")
    requests, problems = load_trace(path)
    assert requests == [] and len(problems) == 1
    assert "reasoning_end" in problems[0]


def test_vllm_reasoning_negative_config_id_names_the_field() -> None:
    config = SimpleNamespace(enabled=True, reasoning_start_token_ids=[0], natural_reasoning_end_token_ids=[-6])
    with pytest.raises(ValueError) as e:
        vllm_reasoning(config, tokenizer=_word_tokenizer())
    assert "natural_reasoning_end_token_ids" in str(e.value)


def test_vllm_reasoning_id_outside_the_tokenizer_names_the_config_field() -> None:
    config = SimpleNamespace(enabled=True, reasoning_start_token_ids=[0], natural_reasoning_end_token_ids=[50])
    with pytest.raises(ValueError) as e:
        vllm_reasoning(config, tokenizer=_word_tokenizer())
    assert "natural_reasoning_end_token_ids" in str(e.value) and "50" in str(e.value)


def test_vllm_reasoning_rejects_a_str_as_vllm_config() -> None:
    with pytest.raises(TypeError):
        vllm_reasoning("qwen3", tokenizer=_word_tokenizer())


def test_reasoning_from_markers_without_a_tokenizer_names_it() -> None:
    with pytest.raises(TypeError) as e:
        reasoning_from_markers("<think>", "</think>", None)
    assert "tokenizer" in str(e.value)


def test_baseline_accepts_none_tool_call_markers_as_the_core_does() -> None:
    for impl in (stopline, baseline):
        p = impl.StopParams(tool_call_markers=None, tool_call_marker_ids=None)
        assert list(p.tool_call_markers) == []


def test_baseline_rejects_a_span_marker_id_over_2_32_as_the_core_does() -> None:
    for impl in (stopline, baseline):
        with pytest.raises(ValueError):
            impl.StopParams(tool_call_marker_ids=[(2**64, 2)])


def test_compat_helpers_reject_a_reasoning_that_is_not_a_reasoning() -> None:
    from stopline import compat

    calls = [
        lambda: compat.vllm_check_stop([10, 5], num_prompt_tokens=3, max_model_len=100, max_tokens=20,
                                       reasoning="qwen3"),  # type: ignore[arg-type]
        lambda: compat.sglang_check_finished([10, 5], max_new_tokens=10, reasoning="qwen3"),  # type: ignore[arg-type]
        lambda: compat.vllm_detokenizer_stop(["a", "b"], stop=["b"], reasoning="qwen3"),  # type: ignore[arg-type]
    ]
    for call in calls:
        with pytest.raises(TypeError) as e:
            call()
        assert "reasoning" in str(e.value)


@pytest.mark.parametrize("kw", [
    {"reasoning_end_id": -1}, {"reasoning_end_id": 1.5}, {"reasoning_end_id": True},
    {"reasoning_end_id": 2**64}, {"reasoning_end": "x" * 1025},
], ids=["negative", "float", "bool", "huge", "over_cap"])
def test_baseline_validates_reasoning_markers_as_the_core_does(kw: dict[str, object]) -> None:
    for impl in (stopline, baseline):
        with pytest.raises((ValueError, TypeError)):
            impl.StopParams(**kw)


def test_a_str_is_not_a_tool_call_marker_pair() -> None:
    with pytest.raises(TypeError):
        stopline.StopParams(tool_call_markers=["{}"])  # type: ignore[list-item]
