"""`stopline replay`: the bundled real traces, --check, and bad input."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import stopline
from stopline import replay

PKG_PARENT = str(Path(stopline.__file__).resolve().parent.parent)


def run_cli(*args, extra_code=None):
    """`python -m stopline ARGS` in a fresh interpreter that imports the stopline under test."""
    env = dict(os.environ)
    env["PYTHONPATH"] = PKG_PARENT + os.pathsep + env.get("PYTHONPATH", "")
    env.pop("COLUMNS", None)
    cmd = [sys.executable, "-m", "stopline", *args]
    if extra_code is not None:
        cmd = [sys.executable, "-c", extra_code, *args]
    return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)


def json_doc(stdout):
    """`replay --json` prints JSON lines; gathered here into one document:
    {"files": [{"file", "requests": [...], ...}], "summary": {...}}, each
    request with its "deltas" when they were streamed."""
    files, deltas, summary = [], {}, None
    pending = []
    for line in stdout.splitlines():
        obj = json.loads(line)
        kind = obj.pop("type")
        if kind == "delta":
            deltas.setdefault((obj["file"], obj["id"]), []).append(obj)
        elif kind == "request":
            if (obj["file"], obj["id"]) in deltas:
                obj["deltas"] = deltas[obj["file"], obj["id"]]
            pending.append(obj)
        elif kind == "file":
            obj["requests"], pending = pending, []
            files.append(obj)
        else:
            assert kind == "summary" and summary is None
            summary = obj
    assert summary is not None and not pending
    return {"files": files, "summary": summary}


@pytest.fixture(scope="module")
def bundled_json():
    p = run_cli("replay", "--check", "--json", "--stream")
    assert p.returncode == 0, p.stderr[-3000:]
    return json_doc(p.stdout)


def test_bundled_traces_ship_with_the_package():
    files = replay.bundled_traces()
    names = {Path(f).name for f in files}
    assert {"smollm2_chat.jsonl", "text_smollm2.jsonl", "text_cl100k.jsonl",
            "text_o200k.jsonl", "text_deepseek_v3.jsonl"} <= {n.removesuffix(".gz") for n in names}
    assert all(f.endswith(".jsonl.gz") for f in files)  # compressed: the wheel stays small
    assert sum(os.path.getsize(f) for f in files) < 300_000


def test_bundled_check_agrees_with_reference(bundled_json):
    s = bundled_json["summary"]
    assert s["check"] == {"reference": "stopline.baseline", "requests_differing": 0}
    assert s["malformed_lines"] == 0
    items = [it for f in bundled_json["files"] for it in f["requests"]]
    assert len(items) == s["requests"] > 100
    assert all(it["check"] == [] for it in items)


def test_bundled_traces_hit_every_finish_cause_several_times(bundled_json):
    causes = bundled_json["summary"]["causes"]
    for cause in ("stop_string", "eos", "stop_token", "grammar", "length", "error", "repetition", "abort"):
        assert causes.get(cause, 0) >= 3, (cause, causes)


def test_bundled_streams_join_to_the_final_text(bundled_json):
    for f in bundled_json["files"]:
        for it in f["requests"]:
            assert "".join(d["text"] for d in it["deltas"]) == it["text"], it["id"]
            assert [t for d in it["deltas"] for t in d["token_ids"]] == it["token_ids"], it["id"]
            assert len(it["token_ids"]) == it["num_tokens"]


def test_outcomes_do_not_depend_on_batch_size():
    reqs, problems = replay.load_trace(replay.bundled_traces()[0])
    assert not problems
    full, _ = replay.replay_requests(reqs)
    for slots in (1, 3):
        small, stats = replay.replay_requests(reqs, max_slots=slots)
        assert stats.engine_steps > 0
        for rid, o in full.items():
            p = small[rid]
            assert (p.finish_reason, p.stop_reason, p.matched, p.text, p.token_ids) == \
                   (o.finish_reason, o.stop_reason, o.matched, o.text, o.token_ids), rid


def test_check_reports_a_tampered_outcome():
    reqs, _ = replay.load_trace(replay.bundled_traces()[0])
    outcomes, _ = replay.replay_requests(reqs)
    req = next(r for r in reqs if outcomes[r.id].finish_reason == "stop" and outcomes[r.id].text)
    o = outcomes[req.id]
    assert replay.check_against_reference(req, o) == []
    o.text = o.text[:-1]
    diffs = replay.check_against_reference(req, o)
    assert any(d.startswith("text:") for d in diffs)
    assert any("joined text deltas" in d for d in diffs)


def _write(tmp_path, lines):
    p = tmp_path / "t.jsonl"
    p.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return p


GOOD = json.dumps({
    "id": "good", "params": {"stop": ["lo w"], "eos_token_ids": [2]},
    "steps": [{"ids": [5], "texts": ["hel"]}, {"ids": [6, 7, 8], "texts": ["lo", " wor", "ld"]}],
})
GRAMMAR = json.dumps({
    "id": "gram", "params": {"eos_token_ids": [2], "ignore_eos": True},
    "steps": [{"ids": [10469], "texts": ["true"]}, {"ids": [2, 9], "texts": ["", "x"], "grammar_terminated_at": 0}],
})


def test_handmade_trace_outcomes(tmp_path):
    p = run_cli("replay", "--json", "--check", str(_write(tmp_path, [GOOD, GRAMMAR])))
    assert p.returncode == 0, p.stderr
    items = {it["id"]: it for it in json_doc(p.stdout)["files"][0]["requests"]}
    assert items["good"]["finish_reason"] == "stop" and items["good"]["stop_reason"] == "lo w"
    assert items["good"]["text"] == "hel" and items["good"]["num_tokens"] == 3
    assert items["gram"]["cause"] == "grammar" and items["gram"]["token_ids"] == [10469, 2]


def test_malformed_lines_are_reported_and_the_rest_replayed(tmp_path):
    lines = [
        GOOD,
        '{"id": "broken", "steps": [',                                              # line 2
        json.dumps({"id": "p", "params": {"max_tokens": 0}, "steps": []}),           # line 3
        json.dumps({"id": "t", "steps": [{"ids": [1, 2], "texts": ["a"]}]}),         # line 4
        json.dumps({"id": "good", "steps": []}),                                     # line 5: duplicate
        GRAMMAR,
    ]
    path = _write(tmp_path, lines)
    p = run_cli("replay", "--json", str(path))
    assert p.returncode == 1
    for n, what in ((2, "not valid JSON"), (3, "max_tokens"), (4, "2 ids but 1 texts"), (5, "duplicate id")):
        assert f"{path}:{n}:" in p.stderr and what in p.stderr, (n, p.stderr)
    out = json_doc(p.stdout)
    assert [it["id"] for it in out["files"][0]["requests"]] == ["good", "gram"]
    assert out["summary"]["malformed_lines"] == 4


def test_invalid_utf8_line(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_bytes(GOOD.encode() + b"\n" + b'{"id": "\xff"}\n')
    p = run_cli("replay", str(path))
    assert p.returncode == 1
    assert f"{path}:2: not valid UTF-8" in p.stderr
    assert "good" in p.stdout


def test_missing_file_exits_2(tmp_path):
    missing = tmp_path / "nope.jsonl"
    p = run_cli("replay", str(_write(tmp_path, [GOOD])), str(missing))
    assert p.returncode == 2
    assert str(missing) in p.stderr and "cannot read" in p.stderr
    assert p.stdout == ""  # nothing replayed


def test_directory_is_unreadable(tmp_path):
    p = run_cli("replay", str(tmp_path))
    assert p.returncode == 2 and "cannot read" in p.stderr


def test_plain_output_and_stream(tmp_path):
    p = run_cli("replay", "--stream", str(_write(tmp_path, [GOOD, GRAMMAR])))
    assert p.returncode == 0, p.stderr
    assert "step    0  good  +0 tok  'he'" in p.stdout  # "l" is held back: it may start "lo w"
    assert "2 requests in 1 files; finish_reason: stop 2" in p.stdout
    assert "by cause: grammar 1, stop_string 1" in p.stdout


BLOCK_EXTRAS = """
import sys, importlib.abc
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split('.')[0] in {'torch', 'numpy', 'rich', 'transformers', 'tokenizers', 'xgrammar'}:
            raise ImportError('blocked: ' + name)
sys.meta_path.insert(0, Block())
from stopline.cli import main
sys.exit(main(sys.argv[1:]))
"""


def test_replay_needs_no_extras():
    p = run_cli("replay", extra_code=BLOCK_EXTRAS)
    assert p.returncode == 0, p.stderr[-3000:]
    assert "by cause:" in p.stdout


def test_generate_without_extras_says_what_to_install():
    p = run_cli("generate", "--prompt", "hi", extra_code=BLOCK_EXTRAS)
    assert p.returncode == 2
    assert "pip install 'stopline[demo]'" in p.stderr
