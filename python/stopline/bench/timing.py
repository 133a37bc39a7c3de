"""Side-by-side timing: every implementation runs once per round, rounds
interleaved, so load changes on a shared machine hit all of them alike."""

from __future__ import annotations

import gc
import statistics
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class Timing:
    """Nanoseconds per operation: the median and every round's value."""

    median: float
    samples: tuple[float, ...]

    @property
    def best(self) -> float:
        return min(self.samples)


def time_side_by_side(
    fns: Mapping[str, Callable[[], int]],
    repeats: int,
    tick: Callable[[], None] | None = None,
) -> dict[str, Timing]:
    """Runs each ``fn`` (which returns how many operations it did) once to
    warm up, then ``repeats`` rounds in which every fn runs once, the starting
    fn rotating per round. The collector is off while a fn runs (as in
    ``timeit``) and collects between runs. ``tick`` is called after each run."""
    names = list(fns)
    samples: dict[str, list[float]] = {n: [] for n in names}
    gc_on = gc.isenabled()

    def one(name: str) -> float:
        gc.collect()
        gc.disable()
        try:
            t0 = time.perf_counter_ns()
            ops = fns[name]()
            dt = time.perf_counter_ns() - t0
        finally:
            if gc_on:
                gc.enable()
        if tick is not None:
            tick()
        return dt / max(ops, 1)

    for n in names:
        one(n)
    for r in range(repeats):
        k = r % len(names)
        for n in names[k:] + names[:k]:
            samples[n].append(one(n))
    return {n: Timing(statistics.median(s), tuple(s)) for n, s in samples.items()}


def median_ns_per_op(fn: Callable[[], int], repeats: int = 5) -> float:
    """Median ns per operation of one ``fn`` (see :func:`time_side_by_side`)."""
    return time_side_by_side({"fn": fn}, repeats)["fn"].median
