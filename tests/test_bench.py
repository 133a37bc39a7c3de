"""``stopline bench`` code paths on tiny sizes: every implementation shows up
in the tables, the plot is a real PNG, the peers report the same matches.
No timing assertions (speed is shown by the benchmark itself)."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("rich")
pytest.importorskip("matplotlib")

from stopline.tools.bench import data, peers
from stopline.cli import main

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("bench")
    argv = ["bench", "--quick", "--ks", "1", "4", "--steps", "40", "--batches", "1", "8",
            "--seq-steps", "32", "--compiles", "4", "--repeats", "1",
            "--plot", str(out / "plot.png"), "--json", str(out / "run.json"),
            "--markdown", str(out / "run.md")]
    rc = main(argv)
    return rc, out


def test_quick_run_writes_every_output(tiny_run, capsys):
    rc, out = tiny_run
    assert rc == 0
    png = (out / "plot.png").read_bytes()
    assert png.startswith(PNG_MAGIC) and len(png) > 1000
    # IHDR: a real image with a width and a height.
    assert png[12:16] == b"IHDR"
    assert int.from_bytes(png[16:20], "big") > 100 and int.from_bytes(png[20:24], "big") > 100


def test_tables_hold_every_implementation(tiny_run):
    _, out = tiny_run
    doc = json.loads((out / "run.json").read_text())
    impls, _ = peers.available()
    seen = {(r["suite"], r["impl"]) for r in doc["rows"]}
    for name in impls:
        assert ("stop", name) in seen
        assert ("setup", name) in seen
    for name in ("stopline FinishBatch.step", "stopline FinishBatch.step, slots=range",
                 "stopline FinishTracker.update", "baseline FinishBatch.step"):
        assert ("finish", name) in seen
    cases = {(r["case"], r["size"]) for r in doc["rows"] if r["suite"] == "stop"}
    assert cases == {(c, k) for c in ("single token", "4-8 token runs") for k in (1, 4)}
    assert {r["size"] for r in doc["rows"] if r["suite"] == "finish"} == {1, 8}
    reasoning = {(r["impl"], r["size"]) for r in doc["rows"] if r["suite"] == "reasoning"}
    assert reasoning == {(i, b) for i in ("without reasoning", "with reasoning",
                                           "with reasoning, reading forced_tokens") for b in (1, 8)}
    assert all(r["median"] > 0 for r in doc["rows"])
    md = (out / "run.md").read_text()
    for name in impls:
        assert name in md
    assert "FinishBatch.step" in md and "cache hit" in md
    assert "Reasoning channels" in md and "on/off" in md
    # The machine, not pass/fail verdicts: the numbers are only comparable side by side.
    assert "targets" not in doc and "verdict" not in md
    assert {"machine", "os", "python", "stopline"} <= set(doc["meta"])


def test_peers_agree_with_stopline_on_frequent_matches():
    pieces, _ = data.text_pieces(3000)
    stops = list(data.CHECK_STOPS)
    impls, _ = peers.available()
    for deltas in (list(pieces[:2000]), data.accept_runs(pieces, 300)):
        want = peers.find_all(impls[peers.STOPLINE], stops, deltas)
        assert len(want) > 50
        for impl in impls.values():
            assert peers.find_all(impl, stops, deltas) == want, impl.name


@pytest.mark.parametrize("cls", [peers.AhoCorasickRsMatcher, peers.PyAhoCorasickMatcher])
def test_window_peers_find_matches_across_steps_and_non_ascii(cls):
    impls, _ = peers.available()
    name = peers.AC_RS if cls is peers.AhoCorasickRsMatcher else peers.PYAC
    if name not in impls:
        pytest.skip(f"{name} not installed")
    stops = ["日本語", "ab", "b"]
    m = cls(impls[name].compile(stops), stops)
    assert m.feed("xx日") is None
    assert m.feed("本") is None
    assert m.feed("語a") == (0, 5)  # straddles three steps; code-point end
    assert m.feed("b") == (1, 7)  # "ab" and "b" end together: lowest index wins
    assert m.feed("") is None


def test_accept_runs_cycle_through_4_to_8_tokens():
    pieces = tuple(str(i % 10) for i in range(100))
    runs = data.accept_runs(pieces, 6)
    assert [len(r) for r in runs] == [4, 5, 6, 7, 8, 4]
    assert "".join(runs) == "".join(pieces[:34])


def test_reasoning_suite_rows_and_paired_ratios():
    """The reasoning suite times the three cases side by side (one sample per
    round each) and the table's ratios are the median of per-round ratios."""
    from stopline.tools.bench import report, suites

    rows = suites.reasoning([4], seq_steps=16, repeats=3)
    assert [r.impl for r in rows] == [suites.REASONING_OFF, suites.REASONING_ON, suites.REASONING_FORCED]
    assert all(len(r.timing.samples) == 3 and r.extra == {"steps": 4} for r in rows)
    res = report.Result(rows, {})
    off, on = rows[0].timing.samples, rows[1].timing.samples
    want = sorted(a / b for a, b in zip(on, off))[1]
    assert res.paired_ratio("reasoning", suites.REASONING_CASE, 4, suites.REASONING_ON, suites.REASONING_OFF) == want
    (table,) = [t for t in report.tables(res) if t.title.startswith("Reasoning channels")]
    assert table.header == ["batch", "off", "on", "on+forced", "on/off", "forced/off"]
    assert table.rows[0][0] == "4" and table.rows[0][4] == f"{want:.2f}x"
