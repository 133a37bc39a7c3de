"""The ``impl`` fixture: one namespace per implementation, same API.

Tests are written once against this API and run against the plain-Python
baseline (``stopline.baseline``) and the Rust extension (``stopline``):

- ``impl.check_stop_strings(text, new_char_count, stop, include_in_output)``
- ``impl.matcher(stops, include_in_output=False)`` -> feed/holdback/chars_fed/reset
- ``impl.StopParams(**kw)``, ``impl.FinishTracker(params)``, ``impl.FinishBatch(n)``
- ``impl.batch_step(batch, slots, token_ids, run_lengths=None, texts=None,
  grammar_terminated_at=None)`` -> list of StepResult-like objects
"""

from __future__ import annotations

import os

import pytest
from hypothesis import settings

import stopline
from stopline import baseline

# Modest by default to keep the suite fast; `--hypothesis-profile=thorough`
# for a long differential hunt.
settings.register_profile("stopline", max_examples=200, deadline=None)
settings.register_profile("thorough", max_examples=5000, deadline=None)
settings.load_profile("stopline")

RESULT_FIELDS = (
    "finished", "finish_reason", "stop_reason", "matched",
    "num_tokens", "text_len", "text_delta", "token_ids_delta",
)
# BatchStepResult's list attribute for each StepResult field.
_BATCH_LISTS = {
    "finished": "finished_flags", "finish_reason": "finish_reasons", "stop_reason": "stop_reasons",
    "matched": "matches", "num_tokens": "token_counts", "text_len": "text_lengths",
    "text_delta": "text_deltas", "token_ids_delta": "token_ids_deltas", "forced_token_id": "forced_token_ids",
}


class BaselineImpl:
    name = "baseline"
    check_stop_strings = staticmethod(baseline.check_stop_strings)
    StopParams = baseline.StopParams
    FinishTracker = baseline.FinishTracker
    FinishBatch = baseline.FinishBatch

    def matcher(self, stops, include_in_output=False):
        return baseline.StopMatcher(stops, include_in_output)

    def batch_step(self, batch, slots, token_ids, run_lengths=None, texts=None,
                   grammar_terminated_at=None):
        return batch.step(slots, token_ids, run_lengths, texts, grammar_terminated_at)

    def __repr__(self):
        return "baseline"


class RustImpl:
    name = "rust"
    check_stop_strings = staticmethod(stopline.check_stop_strings)
    StopParams = stopline.StopParams
    FinishTracker = stopline.FinishTracker
    FinishBatch = stopline.FinishBatch

    def matcher(self, stops, include_in_output=False):
        return stopline.StopStrings(stops).matcher(include_in_output=include_in_output)

    def batch_step(self, batch, slots, token_ids, run_lengths=None, texts=None,
                   grammar_terminated_at=None):
        r = batch.step(slots, token_ids, run_lengths, texts, grammar_terminated_at)
        items = [r[i] for i in range(len(r))]
        # The compact list view and the per-slot view must agree.
        for field, attr in _BATCH_LISTS.items():
            column = list(getattr(r, attr))
            assert column == [getattr(it, field) for it in items], (field, column)
        # The sparse view of the forced ids: the rows that have one, in row order.
        assert r.forced_tokens == [(s, t) for s, t in zip(r.slots, r.forced_token_ids) if t is not None]
        return items

    def __repr__(self):
        return "rust"


IMPLS = {"baseline": BaselineImpl(), "rust": RustImpl()}


@pytest.fixture(scope="session", params=["baseline", "rust"])
def impl(request):
    return IMPLS[request.param]


@pytest.fixture(scope="session")
def base():
    return IMPLS["baseline"]


@pytest.fixture(scope="session")
def rust():
    return IMPLS["rust"]


def brute_holdback(text, stops):
    """Exact hold-back by brute force: the longest suffix of ``text`` that is a
    proper prefix of some stop string."""
    best = 0
    for s in stops:
        for k in range(1, min(len(s) - 1, len(text)) + 1):
            if text.endswith(s[:k]):
                best = max(best, k)
    return best


# `.ci/engines.sh` runs the engine tests in venvs that hold the engines; there
# a skip means the check never ran, so STOPLINE_REQUIRE_ENGINES (a comma list:
# "vllm", "sglang") turns a skip of a test or module whose node id names one
# of those engines (or of the engine-parity module) into a failure.
_REQUIRED_ENGINES = [e for e in os.environ.get("STOPLINE_REQUIRE_ENGINES", "").split(",") if e]


#: A skip whose reason starts with this is allowed even then: the test is for
#: another release of the engine (vLLM 0.33's V1 runner, gone in 0.34).
ENGINE_VERSION_SKIP = "not in this engine version: "


def _required_skip(report: pytest.TestReport | pytest.CollectReport) -> bool:
    if not (_REQUIRED_ENGINES and report.skipped and not hasattr(report, "wasxfail")):
        return False
    reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
    if str(reason).startswith(("Skipped: " + ENGINE_VERSION_SKIP, ENGINE_VERSION_SKIP)):
        return False
    return any(e in report.nodeid for e in [*_REQUIRED_ENGINES, "test_engine_parity.py"])


def _fail_skip(report: pytest.TestReport | pytest.CollectReport) -> None:
    reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else report.longrepr
    report.outcome = "failed"
    report.longrepr = (f"skipped ({reason}), but STOPLINE_REQUIRE_ENGINES="
                       f"{','.join(_REQUIRED_ENGINES)} requires it to run")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if _required_skip(report):
        _fail_skip(report)


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector):
    outcome = yield
    report = outcome.get_result()
    if _required_skip(report):
        _fail_skip(report)
