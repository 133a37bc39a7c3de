"""The scripts in examples/, run as a user runs them: a fresh interpreter, the
repository root as working directory. Their output is checked against what
stopline gives in this process, never against itself."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import stopline
from stopline import replay

ROOT = Path(__file__).resolve().parent.parent
PKG_PARENT = str(Path(stopline.__file__).resolve().parent.parent)


def _smollm2_tokenizer() -> str:
    from stopline.tools.models import ModelFileError
    from stopline.tools.vocab_files import tokenizer_json_path

    try:
        return str(tokenizer_json_path("smollm2"))
    except ModelFileError as exc:
        pytest.skip(f"smollm2: {exc}")


def _single_process(tokenizer: str, req: replay.Request) -> dict[str, object]:
    """One request streamed by one ids-only batch, start to end, no hand-over."""
    batch = stopline.FinishBatch(1, vocabulary=stopline.Vocabulary.from_file(tokenizer))
    batch.add(0, stopline.StopParams(**req.params))
    text, result = "", None
    for step in req.steps:
        result = batch.step([0], step.ids, run_lengths=[len(step.ids)])[0]
        text += result.text_delta
        if result.finished:
            break
    if result is None or not result.finished:
        result = batch.abort(0)
        text += result.text_delta
    return {"text": text, "finish_reason": result.finish_reason, "stop_reason": result.stop_reason}


@pytest.mark.parametrize("handover_step", [None, 1, 3])
def test_router_handover_streams_what_one_process_streams(handover_step: int | None) -> None:
    tokenizer = _smollm2_tokenizer()
    env = dict(os.environ)
    env["PYTHONPATH"] = PKG_PARENT + os.pathsep + env.get("PYTHONPATH", "")
    args = [sys.executable, "examples/router_handover.py", "--json", "--tokenizer", tokenizer]
    if handover_step is not None:
        args += ["--handover-step", str(handover_step)]
    done = subprocess.run(args, cwd=ROOT, env=env, capture_output=True, timeout=300)
    assert done.returncode == 0, done.stderr.decode(errors="replace")

    got = [json.loads(line) for line in done.stdout.decode().splitlines()]
    trace = {r.id: r for r in replay.load_trace(Path(stopline.__file__).parent / "traces" / "text_smollm2.jsonl.gz")[0]}
    assert len(got) >= 5 and len({g["id"] for g in got}) == len(got)
    # Requests were handed over mid-stream and finished in the worker; by
    # default some also finished in the front process before the hand-over.
    served = {g["served_by"] for g in got}
    assert "worker" in served and ("front" in served or handover_step is not None)
    log = done.stderr.decode()
    for g in got:
        want = _single_process(tokenizer, trace[g["id"]])
        assert g["text"].encode() == want["text"].encode(), g["id"]
        assert (g["finish_reason"], g["stop_reason"]) == (want["finish_reason"], want["stop_reason"]), g["id"]
        # The finish was reported where the request was served, so the caller can abort the backend request.
        assert f"[{g['served_by']}] {g['id']} finished ({want['finish_reason']}, stop reason {want['stop_reason']!r})" in log
