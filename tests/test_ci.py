"""The CI's own switches in tests/conftest.py."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _pytest(path: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", path],
        cwd=ROOT, capture_output=True, text=True, timeout=300, env={**os.environ, **env},
    )


@pytest.mark.skipif(importlib.util.find_spec("sglang") is not None, reason="SGLang is installed here")
def test_require_engines_turns_an_engine_skip_into_a_failure() -> None:
    """.ci/engines.sh sets STOPLINE_REQUIRE_ENGINES: there a test that skips
    never ran, which must fail the job; elsewhere the engine tests skip."""
    plain = _pytest("tests/test_integrations_sglang.py", STOPLINE_REQUIRE_ENGINES="")
    # Exit status 5: every test skipped at collection, none failed.
    assert plain.returncode in (0, 5) and "skipped" in plain.stdout, plain.stdout
    required = _pytest("tests/test_integrations_sglang.py", STOPLINE_REQUIRE_ENGINES="sglang")
    assert required.returncode not in (0, 5), required.stdout
    assert "STOPLINE_REQUIRE_ENGINES=sglang requires it to run" in required.stdout
    # Another engine's requirement leaves this one's skip alone.
    other = _pytest("tests/test_integrations_sglang.py", STOPLINE_REQUIRE_ENGINES="vllm")
    assert other.returncode in (0, 5), other.stdout


def test_the_default_run_says_why_each_test_skipped(tmp_path: Path) -> None:
    """pyproject's addopts: the short summary lists each skip with its reason,
    and still each failure (a bare -rs would drop the FAILED lines)."""
    (tmp_path / "test_some.py").write_text(
        "import pytest\n"
        "def test_skips():\n    pytest.skip('needs the frobnicate extra')\n"
        "def test_fails():\n    assert False\n"
    )
    p = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-c", str(ROOT / "pyproject.toml"),
         "--rootdir", str(tmp_path), "test_some.py"],
        cwd=tmp_path, capture_output=True, text=True, timeout=120,
    )
    assert p.returncode == 1, p.stdout
    summary = p.stdout[p.stdout.index("short test summary info"):]
    assert "SKIPPED [1] test_some.py:3: needs the frobnicate extra" in summary
    assert "FAILED test_some.py::test_fails" in summary


def test_engine_job_fails_unless_the_package_index_is_out_of_reach(tmp_path: Path) -> None:
    """.ci/engines.sh: an engine release that cannot be installed while the package index
    answers fails the job (exit 1: a broken recipe or a missing release must not pass as a
    skip); only an index out of reach gives exit 75, which .ci/run reports as a skip. Uses a
    release that does not exist and, for the second case, an index URL on a closed loopback
    port. Needs the package index for the first case (skipped when it is out of reach here)."""
    wheel = tmp_path / "stopline-0.0.0-py3-none-any.whl"
    wheel.write_bytes(b"")  # never installed: the engine's install fails first
    env = {**os.environ, "STOPLINE_ENGINES_DIR": str(tmp_path / "engines"), "STOPLINE_ENGINES": "sglang-0.0.1"}

    def job(**extra: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["bash", ".ci/engines.sh", str(wheel)], cwd=ROOT, capture_output=True, text=True,
                              timeout=900, env={**env, **extra})

    answered = job()
    if answered.returncode == 75:
        pytest.skip("the package index is out of reach from this machine")
    assert answered.returncode == 1, answered.stdout[-2000:] + answered.stderr[-2000:]
    assert "sglang 0.0.1 could not be installed" in answered.stdout
    assert "the package index answers, so this is a failure, not a skip" in answered.stdout
    dead = "http://127.0.0.1:9/simple"
    unreachable = job(PIP_INDEX_URL=dead, UV_DEFAULT_INDEX=dead, UV_INDEX_URL=dead, PIP_FIND_LINKS="", UV_OFFLINE="")
    assert unreachable.returncode == 75, unreachable.stdout[-2000:] + unreachable.stderr[-2000:]
    assert "not tested (the package index was out of reach): sglang-0.0.1" in unreachable.stdout
