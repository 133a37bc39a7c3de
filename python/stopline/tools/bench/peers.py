"""The stop-string implementations the benchmark compares, each driven the
way a streaming engine drives it, one ``feed(new_text)`` per sequence-step.

- ``stopline``: :class:`stopline.StopStrings` / ``StopMatcher`` (Rust): feeds
  only the new text; the exact hold-back is read every step.
- ``baseline``: :class:`stopline.baseline.StopMatcher`, vLLM-style windowed
  ``str.find`` per stop string; the exact hold-back is read every step.
- ``ahocorasick-rs`` and ``pyahocorasick``: an automaton over the stop list
  searched each step over the *window* (the last ``longest stop - 1``
  characters plus the new text), all overlapping matches, keeping the
  earliest-ending match that ends in the new text (ties: lowest list index).
  These libraries keep no state between searches, so the window is how an
  engine gets matches that straddle two steps. They give no hold-back (an
  engine would hold ``longest stop - 1`` characters back), so they do less
  work per step than the first two.

Every implementation's ``feed`` returns ``(index, end)`` (``end`` in code
points of the cumulative text) or None; :func:`find_all` uses that to check
they agree.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from importlib import metadata
from typing import Any

import stopline
from stopline import baseline

STOPLINE = "stopline"
BASELINE = "baseline"
AC_RS = "ahocorasick-rs"
PYAC = "pyahocorasick"
ALL = (STOPLINE, BASELINE, AC_RS, PYAC)


class _Window:
    """The text an automaton without state must search each step."""

    __slots__ = ("_fed", "_keep", "_tail")

    def __init__(self, stops: Sequence[str]) -> None:
        self._keep = max(map(len, stops), default=1) - 1
        self._tail = ""
        self._fed = 0

    def _advance(self, delta: str) -> tuple[str, int, int]:
        """(window, characters of old text in it, cumulative offset of the window)."""
        tail = self._tail
        window = tail + delta
        keep = self._keep
        self._tail = window[-keep:] if keep else ""
        base = self._fed - len(tail)
        self._fed += len(delta)
        return window, len(tail), base


class AhoCorasickRsMatcher(_Window):
    """``ahocorasick_rs.AhoCorasick`` searched over the window each step."""

    __slots__ = ("_find",)

    def __init__(self, automaton: Any, stops: Sequence[str]) -> None:
        super().__init__(stops)
        self._find = automaton.find_matches_as_indexes

    def feed(self, delta: str) -> tuple[int, int] | None:
        if not delta:
            return None
        window, old, base = self._advance(delta)
        hits = self._find(window, True)  # overlapping: a match may hide another
        if not hits:
            return None
        best = None
        for i, _start, end in hits:
            if end > old and (best is None or (end, i) < best):
                best = (end, i)
        if best is None:
            return None
        return best[1], base + best[0]


class PyAhoCorasickMatcher(_Window):
    """``ahocorasick.Automaton`` (pyahocorasick) iterated over the window each
    step; its matches come in order of their end."""

    __slots__ = ("_iter",)

    def __init__(self, automaton: Any, stops: Sequence[str]) -> None:
        super().__init__(stops)
        self._iter = automaton.iter

    def feed(self, delta: str) -> tuple[int, int] | None:
        if not delta:
            return None
        window, old, base = self._advance(delta)
        best_end = -1
        best_i = 0
        for last, i in self._iter(window):
            end = last + 1
            if end <= old:
                continue
            if best_end == -1:
                best_end, best_i = end, i
            elif end == best_end:
                best_i = min(best_i, i)
            else:
                break
        if best_end == -1:
            return None
        return best_i, base + best_end


@dataclass(frozen=True)
class Impl:
    """One implementation: ``compile(stops)`` builds what is shared between
    sequences; ``loop(compiled, stops, deltas)`` runs one sequence over the
    deltas as an engine would and returns the step count; ``matcher`` gives a
    per-sequence object whose ``feed`` returns ``(index, end)`` or None."""

    name: str
    version: str
    compile: Callable[[list[str]], Any]
    loop: Callable[[Any, list[str], Sequence[str]], int]
    matcher: Callable[[Any, list[str]], Any]


# ------------------------------------------------------------------ stopline


def _stopline_loop(compiled: Any, stops: list[str], deltas: Sequence[str]) -> int:
    m = compiled.matcher()
    feed = m.feed
    held = 0
    for d in deltas:
        if feed(d) is not None:
            held -= 1
        held += m.holdback
    return len(deltas)


class _StoplineFeeder:
    def __init__(self, compiled: Any) -> None:
        self._m = compiled.matcher()

    def feed(self, delta: str) -> tuple[int, int] | None:
        hit = self._m.feed(delta)
        return None if hit is None else (hit.index, hit.end)


# ------------------------------------------------------------------ baseline


def _baseline_loop(compiled: Any, stops: list[str], deltas: Sequence[str]) -> int:
    m = baseline.StopMatcher(compiled)
    feed = m.feed
    held = 0
    for d in deltas:
        if feed(d) is not None:
            held -= 1
        held += m.holdback
    return len(deltas)


class _BaselineFeeder:
    def __init__(self, stops: Sequence[str]) -> None:
        self._m = baseline.StopMatcher(stops)

    def feed(self, delta: str) -> tuple[int, int] | None:
        hit = self._m.feed(delta)
        return None if hit is None else (hit.index, hit.end)


# --------------------------------------------------------------------- peers


def _window_loop(cls: type) -> Callable[[Any, list[str], Sequence[str]], int]:
    def loop(compiled: Any, stops: list[str], deltas: Sequence[str]) -> int:
        feed = cls(compiled, stops).feed
        hits = 0
        for d in deltas:
            if feed(d) is not None:
                hits += 1
        return len(deltas)

    return loop


def _ac_rs_compile(stops: list[str]) -> Any:
    import ahocorasick_rs

    return ahocorasick_rs.AhoCorasick(stops, matchkind=ahocorasick_rs.MATCHKIND_STANDARD)


def _pyac_compile(stops: list[str]) -> Any:
    import ahocorasick

    a = ahocorasick.Automaton()
    for i, s in enumerate(stops):
        a.add_word(s, i)
    a.make_automaton()
    return a


def _version(dist: str) -> str:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return "?"


def available() -> tuple[dict[str, Impl], dict[str, str]]:
    """The implementations importable here, and for the others why not."""
    impls = {
        STOPLINE: Impl(STOPLINE, stopline.__version__, stopline.StopStrings, _stopline_loop,
                       lambda c, s: _StoplineFeeder(c)),
        # The baseline has nothing to share between sequences: its "compiled"
        # form is the validated list, and each matcher derives its prefix set.
        BASELINE: Impl(BASELINE, stopline.__version__, list, _baseline_loop,
                       lambda c, s: _BaselineFeeder(c)),
    }
    missing = {}
    try:
        import ahocorasick_rs  # noqa: F401

        impls[AC_RS] = Impl(AC_RS, _version("ahocorasick-rs"), _ac_rs_compile,
                            _window_loop(AhoCorasickRsMatcher), AhoCorasickRsMatcher)
    except ImportError:
        missing[AC_RS] = "not installed (pip install 'stopline[bench]')"
    try:
        import ahocorasick  # noqa: F401

        impls[PYAC] = Impl(PYAC, _version("pyahocorasick"), _pyac_compile,
                           _window_loop(PyAhoCorasickMatcher), PyAhoCorasickMatcher)
    except ImportError:
        missing[PYAC] = "not installed (pip install 'stopline[bench]')"
    return impls, missing


def find_all(impl: Impl, stops: list[str], deltas: Sequence[str]) -> list[tuple[int, int, int]]:
    """Every ``(step, index, end)`` an implementation reports over ``deltas``."""
    m = impl.matcher(impl.compile(stops), stops)
    out = []
    for k, d in enumerate(deltas):
        hit = m.feed(d)
        if hit is not None:
            out.append((k, *hit))
    return out
