"""`stopline replay`: the bundled real traces, --check, and bad input."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path
from unittest import mock

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

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
    assert {"smollm2_chat.jsonl", "reasoning_smollm2.jsonl", "text_smollm2.jsonl", "text_cl100k.jsonl",
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


def test_bundled_reasoning_trace_reports_the_channels(bundled_json):
    """reasoning_smollm2 (SmolLM2 thinking in a forced <think>, </think> forced
    by a thinking budget): a stop phrase of the thinking stops the request
    without markers (the vllm#52393 failure) and not with them (content
    scope), but does with stop_scopes=["reasoning"]; a length cap inside the
    block leaves the content empty; the budgeted request's reasoning is
    exactly its budget of tokens; joined channel deltas are the channels."""
    (f,) = [f for f in bundled_json["files"] if f["file"].endswith("reasoning_smollm2.jsonl.gz")]
    items = {it["id"]: it for it in f["requests"]}
    gens = sorted({i.split("-")[0] for i in items})
    assert len(gens) >= 3
    params = {r.id: r.params for r in replay.load_trace(f["file"])[0]}
    for g in gens:
        plain, scoped, reasoning_scope = (items[f"{g}-{k}"] for k in ("no_markers", "stop_in_reasoning", "stop_reasoning_scope"))
        assert plain["cause"] == "stop_string" and plain["channel"] is None and plain["reasoning"] == ""
        assert scoped["num_tokens"] > plain["num_tokens"] and scoped["channel"] == "content"
        assert (reasoning_scope["cause"], reasoning_scope["channel"], reasoning_scope["content"]) == ("stop_string", "reasoning", "")
        assert reasoning_scope["num_tokens"] == plain["num_tokens"]
        length = items[f"{g}-length"]
        assert (length["finish_reason"], length["channel"]) == ("length", "reasoning")
        assert length["content"] == "" and length["content_token_ids"] == []
        full = items[f"{g}-as_generated"]
        assert len(full["reasoning_token_ids"]) == params[f"{g}-as_generated"]["max_reasoning_tokens"]
        assert "</think>" not in full["reasoning"] + full["content"] and "</think>" in full["text"]
        opened = items[f"{g}-prompt_opened"]
        assert opened["reasoning"].endswith("</think>") and opened["reasoning"][: -len("</think>")] == full["reasoning"]
        for it in (full, scoped, length, opened):
            r_ids, c_ids = it["reasoning_token_ids"], it["content_token_ids"]
            assert "".join(d["reasoning"] for d in it["deltas"]) == it["reasoning"]
            assert "".join(d["content"] for d in it["deltas"]) == it["content"]
            assert len(r_ids) + len(c_ids) <= it["num_tokens"] and set(r_ids + c_ids) <= set(it["token_ids"])
            assert it["deltas"][-1]["channel"] == it["channel"]


def test_reasoning_trace_ids_only_agrees_with_recorded_texts():
    """--tokenizer on reasoning_smollm2: the batch decodes the ids itself and
    finds the text markers and stop strings in its own text; every request,
    channels included, agrees with the reference fed the recorded pieces."""
    import io

    from stopline.tools.models import ModelFileError
    from stopline.tools.vocab_files import tokenizer_json_path

    try:
        tokenizer = tokenizer_json_path("smollm2")
    except ModelFileError as e:  # pragma: no cover - offline without the cached tokenizer
        pytest.skip(str(e))
    (trace,) = [t for t in replay.bundled_traces() if t.endswith("reasoning_smollm2.jsonl.gz")]
    out, err = io.StringIO(), io.StringIO()
    assert replay.run([trace], check=True, tokenizer=str(tokenizer), out=out, err=err) == 0, err.getvalue()[-2000:]
    assert "all agree" in out.getvalue() and "reasoning channels of" in " ".join(out.getvalue().split())


def test_reasoning_trace_table_and_check(tmp_path):
    """A handmade reasoning trace: the plain output adds a channel table; --check
    compares the channels with stopline.baseline; a tampered content is reported."""
    think = json.dumps({
        "id": "think", "params": {"reasoning_start": "<think>", "reasoning_end": "</think>", "stop": ["STOP"]},
        "steps": [{"ids": [1, 2], "texts": ["<thi", "nk>a STOP"]}, {"ids": [3], "texts": [" b</think>"]},
                  {"ids": [4, 5], "texts": ["ans", " STOP x"]}],
    })
    path = _write(tmp_path, [think, GOOD])
    p = run_cli("replay", "--check", str(path))
    assert p.returncode == 0, p.stderr
    assert "reasoning channels of 1 request." in " ".join(p.stdout.split())  # the title wraps
    row = next(line for line in p.stdout.splitlines() if line.startswith("think ") and "content" in line)
    assert row.split()[1:4] == ["content", "2", "2"] and "'a STOP b'" in row and "'ans '" in row
    reqs, _ = replay.load_trace(path)
    outcomes, _ = replay.replay_requests(reqs)
    o = outcomes["think"]
    assert (o.channel, o.reasoning, o.content) == ("content", "a STOP b", "ans ")
    assert (o.reasoning_token_ids, o.content_token_ids) == ([2, 3], [4, 5])
    assert outcomes["good"].channel is None and outcomes["good"].content == outcomes["good"].text
    assert replay.check_against_reference(reqs[0], o) == []
    o.content = "ans"
    assert any(d.startswith("content:") for d in replay.check_against_reference(reqs[0], o))


def test_reasoning_params_are_validated_when_loaded(tmp_path):
    bad = json.dumps({"id": "x", "params": {"reasoning_end": "</think>", "stop_scopes": ["thinking"], "stop": ["a"]},
                      "steps": [{"ids": [1], "texts": ["a"]}]})
    no_texts = json.dumps({"id": "y", "params": {"reasoning_end": "</think>", "reasoning_starts_in": "reasoning"},
                           "steps": [{"ids": [1]}]})
    reqs, problems = replay.load_trace(_write(tmp_path, [bad, no_texts, GOOD]))
    assert [r.id for r in reqs] == ["good"]
    assert "invalid params" in problems[0] and "thinking" in problems[0]
    assert "text reasoning markers" in problems[1]


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


@pytest.mark.parametrize("doc, path", [
    ('{"model": {"vocab": "' + "v" * 10_000_000 + '"}}', "model.vocab"),
    ('{"model": {"vocab": {}}, "added_tokens": [{"id": 0, "content": "a"}, "' + "v" * 10_000_000 + '"]}',
     "added_tokens[1]"),
    ('{"model": {"vocab": {}, "merges": ["a b", "' + "v" * 10_000_000 + '" "a b"]}}', "model.merges[2]"),
], ids=["model.vocab", "an added token", "merges"])
def test_a_bad_tokenizer_file_is_one_bounded_line(tmp_path, doc, path):
    """`replay --tokenizer` prints the Vocabulary's error: one line that
    names the JSON path, never the 10 MB value it is about."""
    tok = tmp_path / "tokenizer.json"
    tok.write_text(doc)
    p = run_cli("replay", "--tokenizer", str(tok), str(_write(tmp_path, [GOOD])))
    assert p.returncode == 2 and p.stdout == ""
    lines = p.stderr.splitlines()
    assert len(lines) == 1 and len(lines[0]) < 600, p.stderr[:2000]
    assert f"--tokenizer {tok}: tokenizer: {path}" in lines[0]


def test_directory_is_unreadable(tmp_path):
    p = run_cli("replay", str(tmp_path))
    assert p.returncode == 2 and "cannot read" in p.stderr


def test_plain_output_and_stream(tmp_path):
    p = run_cli("replay", "--stream", str(_write(tmp_path, [GOOD, GRAMMAR])))
    assert p.returncode == 0, p.stderr
    assert "step    0  good  +0 tok  'he'" in p.stdout  # "l" is held back: it may start "lo w"
    assert "2 requests in 1 file; finish_reason: stop 2" in p.stdout
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


# The cap is what the child has mapped plus ``limit``: interpreters differ in
# what they map before any work (a free-threaded build reserves far more).
LIMITED = """
import resource, sys
with open("/proc/self/status") as f:
    mapped = next(int(line.split()[1]) << 10 for line in f if line.startswith("VmSize:"))
resource.setrlimit(resource.RLIMIT_AS, (mapped + {limit}, mapped + {limit}))
from stopline.cli import main
sys.exit(main(sys.argv[1:]))
"""


def _gz_lines(path, lines):
    import gzip

    with gzip.open(path, "wb", compresslevel=1) as f:
        for parts in lines:
            for part in parts:
                f.write(part)
            f.write(b"\n")
    return path


def test_a_small_gz_of_many_48_mb_requests_ends_in_a_bounded_error(tmp_path):
    """Issue 22: a small .gz that expands to many 48 MB requests ended in a
    MemoryError traceback. Lines over MAX_LINE_BYTES are skipped as they are
    read, and past MAX_TRACE_BYTES decompressed the file is left unread: a
    one-line problem each, under a 1 GiB address-space limit."""
    step = b'{"ids": [1]}, ' * (1 << 16)  # ~0.9 MB
    request = [b'{"id": "r", "steps": [', *([step] * 52), b'{"ids": [1]}]}']  # ~48 MB
    path = _gz_lines(tmp_path / "bomb.jsonl.gz", [request] * 5)
    assert path.stat().st_size < 2 << 20
    p = run_cli("replay", str(path), extra_code=LIMITED.format(limit=1 << 30))
    assert p.returncode == 1, p.stderr[-2000:]
    assert "Traceback" not in p.stderr and "MemoryError" not in p.stderr
    assert f"{path}:1: line longer than {replay.MAX_LINE_BYTES} bytes" in p.stderr
    assert f"not read: a trace file holds at most {replay.MAX_TRACE_BYTES} bytes (decompressed)" in p.stderr
    assert len(p.stderr) < 2000


@pytest.mark.parametrize("damage", ["corrupt", "truncated", "not gzip"])
def test_a_damaged_gz_is_a_one_line_error(tmp_path, damage):
    """Issue 22: a corrupt .gz showed a zlib.error traceback. Corrupt,
    truncated or non-gzip data is one line naming the file (exit 2)."""
    import gzip

    data = gzip.compress((GOOD + "\n").encode() * 2000)
    if damage == "corrupt":
        data = data[:40] + bytes(b ^ 0x5A for b in data[40:80]) + data[80:]
    elif damage == "truncated":
        data = data[: len(data) // 2]
    else:
        data = b"this is not gzip data\n" * 10
    path = tmp_path / "damaged.jsonl.gz"
    path.write_bytes(data)
    p = run_cli("replay", str(path))
    assert p.returncode == 2 and "Traceback" not in p.stderr, p.stderr[-2000:]
    assert p.stderr.count("\n") == 1 and str(path) in p.stderr
    assert "not a complete, valid gzip file" in p.stderr


def test_problems_with_huge_unknown_keys_stay_short(tmp_path):
    """Issue 22: lines with 32 MB unknown keys printed over a GB of problem
    text. Each problem shows at most four keys, each cut short, and their
    count, whatever the line holds (keys of 4 MB here, and 100k keys)."""
    big_key = b"k" * (4 << 20)
    lines = [[b'{"id": "a%d", "steps": [], "' % i, big_key, b'": 1}'] for i in range(6)]
    lines.append([json.dumps({"id": "b", "steps": [], **{f"x{i}": 0 for i in range(100_000)}}).encode()])
    lines.append([b'{"id": "c", "params": {"', big_key, b'": 1}, "steps": []}'])
    lines.append([b'{"id": "', big_key, b'", "steps": [{"ids": ["', big_key, b'"]}]}'])
    path = _gz_lines(tmp_path / "keys.jsonl.gz", lines)
    p = run_cli("replay", str(path))
    assert p.returncode == 1 and "Traceback" not in p.stderr
    problems = p.stderr.splitlines()
    assert len(problems) == len(lines), problems[-1][:300]
    assert max(map(len, problems)) < 600
    assert "has unknown keys" in problems[0] and "(100004 in all)" not in problems[0]
    assert "(100000 in all)" in problems[6] and "params has unknown fields" in problems[7]


def test_malformed_json_message_reads_cleanly(tmp_path):
    """Issue 24: 'Unterminated string starting at at column 8': json's
    messages that end in 'at' now read on into the column."""
    path = tmp_path / "t.jsonl"
    path.write_bytes(b'{"id": "x\n{"id": \n{"id": "x')  # the last line has no newline
    p = run_cli("replay", str(path))
    assert p.returncode == 1
    assert ":1: not valid JSON: Invalid control character at column 10" in p.stderr
    assert ":2: not valid JSON: Expecting value at column 1" in p.stderr
    assert ":3: not valid JSON: Unterminated string starting at column 8" in p.stderr
    assert "at at" not in p.stderr


@pytest.mark.parametrize("params, says", [
    ({"reasoning_end": 5}, "reasoning_end must be str, got int (reasoning_end=5)"),
    ({"reasoning_end": "x", "keep_reasoning_markers": 1}, "keep_reasoning_markers must be true or false, got 1"),
    ({"token_aligned": "yes"}, "token_aligned must be true or false, got 'yes'"),
    ({"reasoning_end": "x", "reasoning_starts_in": 3}, "reasoning_starts_in must be str, got int (reasoning_starts_in=3)"),
    ({"reasoning_end": "\ud800"}, "reasoning_end is not valid Unicode"),
    ({"tool_call_markers": [["<a>"]]}, "tool_call_markers[0] has 1 item; a (start, end) pair has exactly 2 "
                                       "(tool_call_markers=[['<a>']])"),
], ids=["end-int", "keep-int", "aligned-str", "starts-in-int", "surrogate", "span-pair"])
def test_invalid_params_name_the_key_and_value(tmp_path, params, says):
    line = json.dumps({"id": "r0", "params": params, "steps": [{"ids": [1], "texts": ["a"]}]})
    requests, problems = replay.load_trace(_write(tmp_path, [line]))
    assert requests == [] and len(problems) == 1
    assert says in problems[0], problems[0]


def test_a_trace_with_tool_call_spans_replays_and_agrees_with_the_reference(tmp_path):
    # semantics 11.10: "b" met inside the span does not stop; after it, it does.
    line = json.dumps({"id": "r0", "params": {"stop": ["b"], "tool_call_markers": [["<tc>", "</tc>"]],
                                              "tool_call_marker_ids": [[3, 4]]},
                       "steps": [{"ids": [3, 1, 4], "texts": ["<tc>", "b", "</tc>"]},
                                 {"ids": [1, 1], "texts": ["x", "b"]}]})
    requests, problems = replay.load_trace(_write(tmp_path, [line]))
    assert problems == []
    outcomes, _ = replay.replay_requests(requests)
    o = outcomes["r0"]
    assert (o.finish_reason, o.text) == ("stop", "<tc>b</tc>x")
    assert replay.check_against_reference(requests[0], o) == []
    no_texts = json.dumps({"id": "r1", "params": {"tool_call_markers": [["<tc>", "</tc>"]]},
                           "steps": [{"ids": [3]}]})
    assert "text tool-call markers" in replay.load_trace(_write(tmp_path, [no_texts]))[1][0]


# ------------------------------------------------ blank lines, read in bulk


class _LineByLine:
    """How a trace was read before blank runs were skipped in bulk: the
    stream's own readline and read, no read-ahead, nothing skipped. The
    reference the chunked reader must agree with."""

    def __init__(self, stream, limit=None, head=b""):
        self._stream = stream

    def readline(self, limit):
        return self._stream.readline(limit)

    def read(self, n=-1):
        return self._stream.read(n)

    def skip_blank(self, budget, max_line):
        return 0, 0


def _loaded(data, name="t.jsonl"):
    reqs, problems = replay._read_trace(io.BytesIO(data), name, stopline)
    return [(r.id, r.line) for r in reqs], problems


_PIECES = [b"", b" ", b"\t", b"\r", b"\x0b\x0c", b"  \t ", b"{", b"\xff", b" " * 30, b"x" * 30,
           b'{"id": "a", "steps": []}', b'{"id": "b", "steps": [{"ids": [1]}]}']


_LINES = st.one_of(
    st.lists(st.sampled_from(_PIECES), max_size=3).map(b"".join),
    st.just(b""),
    # whitespace-only lines around the line cap (40 below)
    st.builds(lambda c, n: c * n, st.sampled_from([b" ", b"\t", b"\r", b"\x0c"]), st.integers(35, 45)),
)


@settings(max_examples=400, deadline=None)
@given(
    lines=st.lists(_LINES, max_size=30),
    last_newline=st.booleans(),
    trace_cap=st.integers(0, 400),
    read_size=st.sampled_from([1, 2, 3, 7, 64, 1 << 20]),
    caps=st.tuples(st.integers(1, 4), st.integers(1, 5)),
)
def test_blank_runs_read_in_bulk_report_what_line_by_line_reading_reports(
        lines, last_newline, trace_cap, read_size, caps):
    """The chunked reader, whatever its piece size, loads the same requests on
    the same lines and reports the same problems (long lines, whitespace-only
    ones included; the file, request and problem caps) as reading line by
    line, with the caps made small enough for short inputs to reach them."""
    data = b"\n".join(lines) + (b"\n" if last_newline and lines else b"")
    small = {"MAX_LINE_BYTES": 40, "MAX_TRACE_BYTES": trace_cap, "MAX_REQUESTS": caps[0], "MAX_PROBLEMS": caps[1]}
    with mock.patch.multiple(replay, **small, _READ_SIZE=read_size):
        got = _loaded(data)
        with mock.patch.object(replay, "_Lines", _LineByLine):
            want = _loaded(data)
    assert got == want


def test_long_blank_runs_keep_the_line_numbers_and_the_line_cap():
    """At the real caps: 3 MB of CRLF blank lines (several 1 MiB reads), then
    a malformed line, a whitespace-only line 1 byte over MAX_LINE_BYTES (still
    a long line), a request after leading spaces, a whitespace-only line of
    exactly MAX_LINE_BYTES (blank) and a request: each on its own line number."""
    n = 1_500_000
    data = b"".join([
        b"\r\n" * n,
        b"{\n",
        b" " * (replay.MAX_LINE_BYTES + 1) + b"\n",
        b"   " + GOOD.encode() + b"\n",
        b"\t" * replay.MAX_LINE_BYTES + b"\n",
        GRAMMAR.encode(),
    ])
    got, problems = _loaded(data)
    assert got == [("good", n + 3), ("gram", n + 5)]
    assert len(problems) == 2 and problems[0].startswith(f"t.jsonl:{n + 1}: not valid JSON: ")
    assert problems[1] == f"t.jsonl:{n + 2}: line longer than {replay.MAX_LINE_BYTES} bytes"
