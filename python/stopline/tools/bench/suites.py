"""The CPU suites: stop strings per K, the finish check per batch size,
compiling a stop list, and the cost of reasoning channels on the ids-only
batch step. Each returns :class:`Row` s measured side by side."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import stopline
from stopline import baseline
from stopline.tools.bench import data, peers
from stopline.tools.bench.timing import Timing, time_side_by_side

SINGLE = "single token"
RUNS = "4-8 token runs"

FINISH_BATCH = "stopline FinishBatch.step"
FINISH_BATCH_RANGE = "stopline FinishBatch.step, slots=range"
FINISH_BATCH_NUMPY = "stopline FinishBatch.step, slots=range, token_ids=NumPy"
FINISH_TRACKERS = "stopline FinishTracker.update"
FINISH_BASELINE = "baseline FinishBatch.step"

REASONING_CASE = "ids-only FinishBatch.step"
REASONING_OFF = "without reasoning"
REASONING_ON = "with reasoning"
REASONING_FORCED = "with reasoning, reading forced_tokens"
DEFAULT_REASONING_BATCHES = (256,)

COMPILE_MISS = "compile 16, cache miss"
COMPILE_HIT = "compile 16, cache hit"


@dataclass
class Row:
    """One measured cell: ``ns`` per ``unit`` for ``impl`` at ``size``."""

    suite: str
    case: str
    size: int
    impl: str
    timing: Timing
    unit: str
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def ns(self) -> float:
        return self.timing.median


Tick = Callable[[], None]


# -------------------------------------------------------------- stop strings


def stop_strings(
    impls: dict[str, peers.Impl],
    ks: Sequence[int],
    steps: int,
    repeats: int,
    pieces: Sequence[str],
    cases: Sequence[str] = (SINGLE, RUNS),
    tick: Tick | None = None,
) -> list[Row]:
    """ns per sequence-step feeding ``steps`` deltas (one token piece, or a
    4-8 token run) for every K."""
    inputs = {SINGLE: list(pieces[:steps]), RUNS: data.accept_runs(pieces, steps)}
    rows = []
    for case in cases:
        deltas = inputs[case]
        for k in ks:
            stops = data.stop_list(k)
            fns = {name: _stop_fn(impl, stops, deltas) for name, impl in impls.items()}
            for name, t in time_side_by_side(fns, repeats, tick).items():
                rows.append(Row("stop", case, k, name, t, "ns/step"))
    return rows


def _stop_fn(impl: peers.Impl, stops: list[str], deltas: list[str]) -> Callable[[], int]:
    compiled = impl.compile(stops)
    return lambda: impl.loop(compiled, stops, deltas)


def stop_strings_agreement(
    impls: dict[str, peers.Impl], pieces: Sequence[str], steps: int
) -> dict[str, tuple[int, bool]]:
    """On a list of stops that match often (``data.CHECK_STOPS``), in both
    step shapes: how many matches each implementation reports and whether they
    equal stopline's, match for match."""
    stops = list(data.CHECK_STOPS)
    inputs = [list(pieces[:steps]), data.accept_runs(pieces, max(steps // 6, 1))]
    ref = [peers.find_all(impls[peers.STOPLINE], stops, d) for d in inputs]
    out = {}
    for name, impl in impls.items():
        got = [peers.find_all(impl, stops, d) for d in inputs]
        out[name] = (sum(map(len, got)), got == ref)
    return out


# -------------------------------------------------------------- finish check


def finish_params(text_pieces: Sequence[str]) -> dict[str, Any]:
    """4 stop strings that never occur in the text (a finished sequence would
    reject the next step), an EOS id and 2 stop token ids."""
    text = "".join(text_pieces)
    stops = [s for s in data.stop_list(64) if s not in text][:4]
    return {"stop": stops, "eos_token_ids": [2], "stop_token_ids": [3, 4], "max_tokens": 1 << 30}


def finish(
    batches: Sequence[int],
    seq_steps: int,
    repeats: int,
    pieces: Sequence[str],
    tick: Tick | None = None,
) -> list[Row]:
    """ns per sequence-step of the full finish check, one token with its text
    piece per sequence per step, the engine reading every finished flag and
    text delta: ``FinishBatch.step`` vs one ``FinishTracker.update`` per
    sequence vs the pure-Python ``baseline.FinishBatch``. About ``seq_steps``
    sequence-steps per run whatever the batch size."""
    params = finish_params(pieces)
    rows = []
    for batch in batches:
        steps = max(seq_steps // batch, 4)
        # Sequence s reads the text from its own offset; ids never hit EOS/stop ids.
        per_step = [
            ([100 + (s + k) % 30_000 for s in range(batch)],
             [pieces[(s * 997 + k) % len(pieces)] for s in range(batch)])
            for k in range(steps)
        ]
        fns = _finish_fns(batch, steps, per_step, params)
        for name, t in time_side_by_side(fns, repeats, tick).items():
            rows.append(Row("finish", "one token per step", batch, name, t, "ns/seq-step",
                            {"steps": steps}))
    return rows


def _finish_fns(
    batch: int, steps: int, per_step: list[tuple[list[int], list[str]]], params: dict[str, Any]
) -> dict[str, Callable[[], int]]:
    """The three timed runs of one batch size; each reads every finished
    flag and text delta, as an engine does."""
    slots = list(range(batch))

    def rust_batch(rows: Sequence[int], inputs: Sequence[Any] = per_step) -> Callable[[], int]:
        def run() -> int:
            b = stopline.FinishBatch(batch)
            p = stopline.StopParams(**params)
            for s in slots:
                b.add(s, p)
            done = 0
            for ids, texts in inputs:
                r = b.step(rows, ids, None, texts)
                done += len(r.finished_slots) + len(r.text_deltas)
            return batch * steps

        return run

    def rust_trackers() -> int:
        p = stopline.StopParams(**params)
        trackers = [stopline.FinishTracker(p) for _ in slots]
        done = 0
        for ids, texts in per_step:
            for t, i, piece in zip(trackers, ids, texts):
                r = t.update([i], [piece])
                done += r.finished + len(r.text_delta)
        return batch * steps

    def python() -> int:
        b = baseline.FinishBatch(batch)
        p = baseline.StopParams(**params)
        for s in slots:
            b.add(s, p)
        done = 0
        for ids, texts in per_step:
            for r in b.step(slots, ids, None, texts):
                done += r.finished + len(r.text_delta)
        return batch * steps

    # A persistent batch whose rows are its slots can pass them as a range,
    # and the sampled ids as the array they come off the device in.
    fns = {FINISH_BATCH: rust_batch(slots), FINISH_BATCH_RANGE: rust_batch(range(batch))}
    try:
        import numpy as np
    except ImportError:
        pass
    else:
        as_arrays = [(np.array(ids, dtype=np.int64), texts) for ids, texts in per_step]
        fns[FINISH_BATCH_NUMPY] = rust_batch(range(batch), as_arrays)
    return {**fns, FINISH_TRACKERS: rust_trackers, FINISH_BASELINE: python}


# ---------------------------------------------------------------- reasoning

_REASONING_BASE: dict[str, Any] = {"eos_token_ids": [2], "stop_token_ids": [3, 4], "max_tokens": 1 << 30}
_REASONING_IDS: dict[str, Any] = {"reasoning_start_id": 5, "reasoning_end_id": 6, "reasoning_starts_in": "reasoning"}


def reasoning(
    batches: Sequence[int],
    seq_steps: int,
    repeats: int,
    tick: Tick | None = None,
) -> list[Row]:
    """ns per sequence-step of the ids-only ``FinishBatch.step`` (no
    vocabulary, no texts; an EOS id and 2 stop ids; the engine reads
    ``finished_slots`` every step) without reasoning channels, with marker ids
    and every sequence inside the block (``reasoning_starts_in="reasoning"``,
    so each row's channel split is computed), and with a thinking budget whose
    ``forced_tokens`` the engine reads every step (issue 21 sets the ratio
    it aims at; docs/benchmarks.md judges it). Ids never hit EOS, a
    stop id or a marker, so every sequence runs to the end."""
    rows = []
    for batch in batches:
        steps = max(seq_steps // batch, 4)
        per_step = [[100 + (s * 31 + k) % 30_000 for s in range(batch)] for k in range(steps)]
        fns = {
            REASONING_OFF: _reasoning_run(per_step, {}, False),
            REASONING_ON: _reasoning_run(per_step, _REASONING_IDS, False),
            REASONING_FORCED: _reasoning_run(per_step, {**_REASONING_IDS, "max_reasoning_tokens": 1 << 30}, True),
        }
        for name, t in time_side_by_side(fns, repeats, tick).items():
            rows.append(Row("reasoning", REASONING_CASE, batch, name, t, "ns/seq-step", {"steps": steps}))
    return rows


def _reasoning_run(per_step: list[list[int]], extra: dict[str, Any], forced: bool) -> Callable[[], int]:
    """One timed run: a fresh batch of ``len(per_step[0])`` sequences, every step."""
    batch = len(per_step[0])
    slots = list(range(batch))
    params = stopline.StopParams(**_REASONING_BASE, **extra)

    def run() -> int:
        b = stopline.FinishBatch(batch)
        for s in slots:
            b.add(s, params)
        done = 0
        for ids in per_step:
            r = b.step(slots, ids)
            done += len(r.finished_slots)
            if forced:
                done += len(r.forced_tokens)
        if extra and b.result(0).channel != "reasoning":  # the measured path is the channel split
            raise RuntimeError("reasoning bench: sequences left the reasoning block")
        return batch * len(per_step)

    return run


# ------------------------------------------------------------------- set-up


def setup(
    impls: dict[str, peers.Impl],
    count: int,
    repeats: int,
    tick: Tick | None = None,
) -> list[Row]:
    """ns per compile of a 16-string stop list. Cache miss: a list never seen
    before each time (all lists are built before timing); cache hit: the same
    list again, as ``StopStrings(list)`` (only stopline caches). The baseline's
    compile is a ``StopMatcher`` (it derives its prefix set per matcher)."""
    base = data.stop_list(16)
    runs = repeats + 1  # the warm-up run too
    fresh = [[*base[:-1], f"<<fresh-{j:07d}>>"] for j in range(count * runs * len(impls))]
    taken = 0
    compile_fns = {name: impl.compile for name, impl in impls.items()}
    compile_fns[peers.BASELINE] = baseline.StopMatcher

    def miss(fn: Callable[[list[str]], object]) -> Callable[[], int]:
        def run() -> int:
            nonlocal taken
            lists = fresh[taken:taken + count]
            taken += len(lists)
            for stops in lists:
                fn(stops)
            return len(lists)

        return run

    def hit() -> int:
        fn = stopline.StopStrings
        fn(base)
        for _ in range(count):
            fn(base)
        return count

    fns = {name: miss(fn) for name, fn in compile_fns.items()}
    rows = []
    # One pass over fresh lists per run (no repeats inside a run: every list
    # is compiled once); a run of `count` compiles is long enough.
    for name, t in time_side_by_side(fns, repeats, tick, min_run_ns=0).items():
        rows.append(Row("setup", COMPILE_MISS, 16, name, t, "ns/compile"))
    t = time_side_by_side({peers.STOPLINE: hit}, repeats, tick)[peers.STOPLINE]
    rows.append(Row("setup", COMPILE_HIT, 16, peers.STOPLINE, t, "ns/compile"))
    return rows
