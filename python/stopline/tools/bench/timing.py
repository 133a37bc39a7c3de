"""Side-by-side timing: every implementation runs once per round, rounds
interleaved, so load changes on a shared machine hit all of them alike.

Time is the thread's CPU time (``CLOCK_THREAD_CPUTIME_ID``), not wall time:
on a shared machine a wall-clock run also counts the time the scheduler gave
to other processes, which swamps a run of a few milliseconds. For this
single-threaded, CPU-bound code the two agree on an idle machine. A run that
takes less than ``min_run_ns`` is repeated inside one timing until it does."""

from __future__ import annotations

import gc
import statistics
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

MIN_RUN_NS = 20_000_000


@dataclass(frozen=True)
class Timing:
    """Nanoseconds per operation: the median and every round's value."""

    median: float
    samples: tuple[float, ...]

    @property
    def best(self) -> float:
        return min(self.samples)


def _clock() -> Callable[[], int]:
    try:
        time.thread_time_ns()
        return time.thread_time_ns
    except (AttributeError, OSError):  # platforms without a thread CPU clock
        return time.perf_counter_ns


def time_side_by_side(
    fns: Mapping[str, Callable[[], int]],
    repeats: int,
    tick: Callable[[], None] | None = None,
    min_run_ns: int = MIN_RUN_NS,
) -> dict[str, Timing]:
    """Runs each ``fn`` (which returns how many operations it did) once to
    warm up and to size its runs, then ``repeats`` rounds in which every fn
    runs once (repeated until ``min_run_ns``), the starting fn rotating per
    round. The collector is off while a fn runs (as in ``timeit``) and
    collects between runs. ``tick`` is called after each run."""
    clock = _clock()
    names = list(fns)
    samples: dict[str, list[float]] = {n: [] for n in names}
    loops: dict[str, int] = {}
    gc_on = gc.isenabled()

    def one(name: str, n: int) -> tuple[float, int]:
        gc.collect()
        gc.disable()
        try:
            fn = fns[name]
            ops = 0
            t0 = clock()
            for _ in range(n):
                ops += fn()
            dt = clock() - t0
        finally:
            if gc_on:
                gc.enable()
        if tick is not None:
            tick()
        return dt / max(ops, 1), dt

    for name in names:
        _, dt = one(name, 1)
        loops[name] = max(1, -(-min_run_ns // max(dt, 1)))
    for r in range(repeats):
        k = r % len(names)
        for name in names[k:] + names[:k]:
            samples[name].append(one(name, loops[name])[0])
    return {n: Timing(statistics.median(s), tuple(s)) for n, s in samples.items()}


def median_ns_per_op(fn: Callable[[], int], repeats: int = 5) -> float:
    """Median ns per operation of one ``fn`` (see :func:`time_side_by_side`)."""
    return time_side_by_side({"fn": fn}, repeats)["fn"].median
