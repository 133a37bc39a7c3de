"""Plain-Python reference and baseline for stop strings and the finish machine.

This module implements docs/semantics.md sections 2 and 3 the way inference
engines write this logic today, independently of the Rust core, so that it can
serve both as the oracle of the differential tests and as the baseline the
benchmarks compare against. It is meant to be honest, not slow: windowed
``str.find`` scans and per-token Python checks, as engines do.

Sources of the rules (engine versions as in docs/semantics.md section 6):

- Stop strings: as vLLM 0.33's ``check_stop_strings`` (``vllm/v1/engine/
  detokenizer.py``), which searches only a window of the growing text that
  reaches ``len(stop) - 1`` characters back before the new characters, returns
  ``(stop, offset)`` with ``offset = -1`` when nothing is to be cut, and takes
  the earliest-ending match, ties to the lowest list index (vLLM PR #49391;
  semantics.md section 2).
- Hold-back: exact, the longest suffix of the text that is a proper prefix of
  some stop string (vLLM holds back ``max(len(stop)) - 1`` characters).
- min_tokens gates stop strings as the vLLM v1 detokenizer does (it only
  checks stop strings once ``num_output_tokens > min_tokens``), while the text
  of earlier tokens is still searched, so a match may start there.
- An EOS or stop token that ends the sequence is left out of the text fed to
  the matchers unless ``include_stop_str_in_output`` (vLLM 0.33's detokenizer).
- EOS, stop_token_ids, length and repetition follow vLLM v1's ``check_stop``
  (``vllm/v1/core/sched/utils.py``): EOS reports no stop_reason, a stop token
  reports its id, length fires on ``num_output_tokens >= max_tokens`` or
  ``num_tokens >= max_model_len``, and repetition is
  ``check_sequence_repetition`` (the last ``L * min_count`` output tokens are
  one ``L``-token pattern repeated, for any ``L`` in
  ``[max(min_pattern_size, 1), max_pattern_size]``).
  The order of checks and the per-position evaluation of speculative runs
  follow semantics.md section 3; EOS below min_tokens is honoured (check 3),
  as in vLLM 0.33.0; a grammar end is checked before the length cap
  (stopline's order; SGLang 0.5.23 tests the cap first, semantics.md 6.3).

- Stop regexes: as SGLang's ``Req._check_str_based_finish``
  (``python/sglang/srt/managers/schedule_batch.py``), which runs
  ``re.search(regex, tail_str)`` over a re-decoded tail of the output whose
  length comes from ``get_max_seq_length`` (``sampling_params.py``: the
  pattern's maximum width, or the whole output for unbounded patterns). Here
  the tail is the pattern's maximum width in code points before the new text
  (the whole text when unbounded), and each candidate end in the new text is
  tried in turn with ``(?:pattern)(?=rest\\Z)``, ``rest`` the text after that
  end, so the earliest end wins, ``search`` returns the leftmost start there
  (semantics.md 2.1), and ``$`` / ``\\b`` see the text that follows, as in the core.
  The hold-back for regexes is a safe bound, not exact: the last
  ``max width - 1`` code points, and everything from the first position a
  match could start at for an unbounded pattern (Python's ``re`` cannot tell
  whether a text is a prefix of a match).

Where Python's ``re`` and the core's Rust regex syntax differ (the baseline
compiles patterns with ``re``, so differential tests keep to the common
subset): Python's ``$`` also matches before a final ``"\\n"`` and Rust's only
at the end (Rust's ``\\z`` is Python's ``\\Z``; Rust has no ``\\Z``); Rust has
``\\p{...}`` classes, ``(?-u:...)``, ``[[:alpha:]]`` and class set operations,
Python has look-around and back-references; Python's ``\\b`` is Unicode, the
core accepts only the ASCII ``(?-u:\\b)``; case folding tables differ in
corners.

Choices the contract leaves to the implementation (the Rust core agrees unless noted in the
tests): a bare ``str`` as a stop list is a TypeError (not split into
characters); the whole text, not just the window, must be encodable; an empty
stop list never matches; an empty run is a no-op step; an ``"error"`` finish
reports ``matched=None``; ``abort()`` after a finish is a no-op; a stop match
that ends in a gated token (n <= min_tokens) is ignored for good, later text
is matched normally; FinishBatch rejects adding to an occupied slot, a slot
listed twice, a finished slot (SequenceFinishedError, as the tracker) and
grammar indices other than -1 outside the run; unknown ``repetition`` keys
are rejected.
"""

from __future__ import annotations

import builtins
import functools
import itertools
import operator
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from stopline._core import SequenceFinishedError, StoplineTypeError, StoplineValueError

_E = TypeVar("_E", bound=Exception)

__all__ = [
    "FinishBatch",
    "FinishTracker",
    "StepResult",
    "StopMatch",
    "StopMatcher",
    "StopParams",
    "StopRegexMatcher",
    "check_stop_strings",
]


# ---------------------------------------------------------------- validation


def _err(cls: type[_E], message: str, field: str | None, kind: str, slot: int | None = None) -> _E:
    """``cls(message)`` with the core's attributes: the same classes, and the
    same ``field``, ``slot`` and ``kind`` as the core's exception for the same
    input (docs/errors.md); the messages are this module's own."""
    e = cls(message)
    e.field, e.slot, e.kind = field, slot, kind  # type: ignore[attr-defined]
    return e


def _type_name(v: Any) -> str:
    """The type of ``v`` as the core's messages name it: bare, or qualified
    where the bare name is also a builtin's that it is not (``numpy.bool``)."""
    t = type(v)
    if t.__module__ != "builtins" and hasattr(builtins, t.__name__):
        return f"{t.__module__}.{t.__qualname__}"
    return t.__name__


def _flag(v: Any, name: str) -> bool:
    """A bool argument, as the core reads one: a ``bool``, or NumPy's bool
    scalar (by its type's module and name; NumPy is not imported), read by
    its truth. Anything else (``1``, ``None``, ``"no"``) is a TypeError."""
    if isinstance(v, bool):
        return v
    t = type(v)
    if t.__module__ == "numpy" and t.__name__ in ("bool", "bool_"):
        return bool(v)
    raise _err(StoplineTypeError, f"{name} must be a bool, got {_type_name(v)}", name, "wrong_type")


def _check_encodable(s: str, what: str) -> None:
    # isascii() is O(1) in CPython; only non-ASCII text pays for the scan.
    if not s.isascii():
        try:
            s.encode("utf-8")
        except UnicodeEncodeError as e:
            raise _err(StoplineValueError,
                f"{what} contains a lone surrogate {s[e.start]!r} at code point {e.start}",
                what, "lone_surrogate") from None


def _str_items(obj: Any, what: str, check: Callable[[int, str], None]) -> tuple[str, ...]:
    """``obj`` as a tuple of str, running ``check(i, item)`` on each in order."""
    # A bare str is a Sequence[str] of its characters; that is never what a
    # caller means, so refuse it instead of splitting it.
    if isinstance(obj, str):
        raise _err(StoplineTypeError, f"{what} must be a sequence of str, not a str ({obj!r}); wrap it in a list", what, "single_str")
    try:
        if isinstance(obj, Mapping):  # its keys: never what a caller meant
            raise TypeError
        items = tuple(obj)
    except TypeError:
        raise _err(StoplineTypeError, f"{what} must be a sequence of str, got {_type_name(obj)}", what, "wrong_type") from None
    for i, s in enumerate(items):
        if not isinstance(s, str):
            raise _err(StoplineTypeError, f"{what}[{i}] must be str, got {_type_name(s)}", f"{what}[{i}]", "wrong_type")
        check(i, s)
    return items


def _validate_stops(stop: Any, what: str = "stop") -> tuple[str, ...]:
    def check(i: int, s: str) -> None:
        if not s:
            raise _err(StoplineValueError, f"{what}[{i}] is an empty string", f"{what}[{i}]", "empty_stop")
        _check_encodable(s, f"{what}[{i}]")

    return _str_items(stop, what, check)


def _regex_width(pattern: str) -> tuple[int, int | None]:
    """(min, max) width of a pattern in code points; max None if unbounded."""
    from re import _parser as sre_parse  # type: ignore[attr-defined, unused-ignore]
    lo, hi = sre_parse.parse(pattern).getwidth()
    return lo, (None if hi >= sre_parse.MAXREPEAT else hi)


_GLOBAL_FLAGS = re.compile(r"\(\?[aiLmsux]+\)")


@functools.lru_cache(maxsize=4096)
def _compile_ending(pattern: str, rest: str = "") -> re.Pattern[str]:
    """``pattern`` followed by exactly ``rest`` and the end of the text;
    leading global flags stay in front, where Python requires them."""
    m = _GLOBAL_FLAGS.match(pattern)
    flags = m.group() if m else ""
    return re.compile(f"{flags}(?:{pattern[len(flags):]})(?={re.escape(rest)}\\Z)")


def _validate_regexes(patterns: Any, what: str = "stop_regex") -> tuple[str, ...]:
    def check(i: int, p: str) -> None:
        _check_encodable(p, f"{what}[{i}]")
        try:
            re.compile(p)
        except re.error as e:
            raise _err(StoplineValueError, f"{what}[{i}]={p!r} is not a valid stop regex: {e}", f"{what}[{i}]", "regex_invalid") from None
        if _regex_width(p)[0] == 0:
            raise _err(StoplineValueError, f"{what}[{i}]={p!r} can match the empty string", f"{what}[{i}]", "regex_empty_match")

    return _str_items(patterns, what, check)


def _index(v: Any, what: str) -> int:
    # One policy for every int argument, as in the Rust core: bool is an int
    # subclass, but max_tokens=True or token_ids=[True] is a bug, not 1.
    if isinstance(v, bool):
        raise _err(StoplineTypeError, f"{what} must be an int, got bool", what, "wrong_type")
    try:
        return operator.index(v)
    except TypeError:
        raise _err(StoplineTypeError, f"{what} must be an int, got {_type_name(v)}", what, "wrong_type") from None


def _param_int(name: str, v: Any) -> int:
    return _index(v, name)


def _i64(name: str, v: Any) -> int:
    """An int argument the core reads as a 64-bit int (out_of_range past it)."""
    n = _param_int(name, v)
    if not -(2**63) <= n < 2**63:
        raise _err(StoplineValueError, f"{name}={n} is out of range", name, "out_of_range")
    return n


def _token_id(name: str, v: Any) -> int:
    """One marker id as the core reads it: an int in ``[0, 2**32)``."""
    n = _i64(name, v)
    if n < 0:
        raise _err(StoplineValueError, f"{name} must be >= 0, got {n}", name, "below")
    if n >= 2**32:
        raise _err(StoplineValueError, f"{name}={n} is not a valid token id", name, "not_a_token_id")
    return n


def _text(name: str, v: Any) -> str:
    """A str of valid Unicode, errors naming ``name`` as the core's."""
    if not isinstance(v, str):
        raise _err(StoplineTypeError, f"{name} must be str, got {_type_name(v)}", name, "wrong_type")
    _check_encodable(v, name)
    return v


def _marker_text(name: str, v: Any) -> str:
    """A reasoning marker text: :func:`_text`, at most ``max_marker_bytes``
    (1,024) UTF-8 bytes."""
    text = _text(name, v)
    if len(text.encode()) > _MAX_MARKER_BYTES:
        raise _err(StoplineValueError, f"{name} is longer than {_MAX_MARKER_BYTES} UTF-8 bytes", name, "too_many_bytes")
    return text


_MAX_MARKER_BYTES = 1024
_MAX_SPANS = 8


def _pairs(name: str, obj: Any) -> list[list[Any]] | None:
    """``tool_call_markers`` / ``tool_call_marker_ids``: ``None`` or at most 8
    (start, end) pairs, their sides not read yet (the core checks the two
    lists' lengths first)."""
    if obj is None:
        return None
    try:
        if isinstance(obj, Mapping):  # its keys: never what a caller meant
            raise TypeError
        # Read one past the cap (an iterator may be endless); a sized one is counted whole.
        items = list(itertools.islice(obj, _MAX_SPANS + 1))
        n = len(obj) if hasattr(obj, "__len__") else len(items)
    except TypeError:
        raise _err(StoplineTypeError, f"{name} must be a sequence of (start, end) pairs, got {_type_name(obj)}",
                   name, "wrong_type") from None
    if n > _MAX_SPANS:
        raise _err(StoplineValueError, f"{name} has {n} entries; at most {_MAX_SPANS} are accepted",
                   name, "too_many")
    out = []
    for i, pair in enumerate(items):
        at = f"{name}[{i}]"
        if isinstance(pair, str):
            raise _err(StoplineTypeError, f"{at} must be a (start, end) pair, not a single str", at, "single_str")
        if isinstance(pair, (set, frozenset, Mapping)):
            raise _err(StoplineTypeError, f"{at} must be a (start, end) pair in order (a tuple or list), "
                       f"got {_type_name(pair)}", at, "wrong_type")
        try:
            two = list(pair)
        except TypeError:
            raise _err(StoplineTypeError, f"{at} must be a (start, end) pair, got {_type_name(pair)}",
                       at, "wrong_type") from None
        if len(two) != 2:
            raise _err(StoplineValueError, f"{at} has {len(two)} items; a (start, end) pair has exactly 2", at, "count")
        out.append(two)
    return out


def _pair_sides(name: str, pairs: list[list[Any]] | None, read: Callable[[str, Any], Any]) -> tuple[tuple[Any, Any], ...]:
    """Each side of ``pairs`` read by ``read(field, value)``."""
    return tuple((read(f"{name}[{i}][0]", a), read(f"{name}[{i}][1]", b)) for i, (a, b) in enumerate(pairs or ()))


_MAX_IDS = 65536  # the core's max_stop_token_ids, for every list of ids and of scopes


def _take(obj: Any, name: str, cap: int) -> list[Any]:
    """The items of an iterable, refused past ``cap`` as the core refuses
    them (``too_many``): a sized one by its length, an endless one after
    ``cap + 1`` items instead of being read until memory runs out."""
    try:
        n: int | None = len(obj)
    except OverflowError:
        n = None
    except TypeError:
        n = None
    if n is not None and n > cap:
        raise _err(StoplineValueError, f"{name} has {n} entries; at most {cap} are accepted", name, "too_many")
    items = list(itertools.islice(obj, cap + 1))
    if len(items) > cap:
        raise _err(StoplineValueError, f"{name} has more than {cap} entries; at most {cap} are accepted", name, "too_many")
    return items


def _id_list(name: str, ids: Any) -> tuple[int, ...]:
    """A list of token ids as the core reads one: ``None`` is none, one int
    (or bool, refused as such) is a list of one, named without an index.
    Whether they fit ``vocab_size`` is checked later, with the other fields."""
    if ids is None:
        return ()
    # A str or bytes is read as the core reads it: a sequence (of str,
    # refused at [0]; of ints, bytes being a buffer of them).
    if isinstance(ids, int):
        return (_one_id(name, ids),)
    try:
        if isinstance(ids, Mapping):  # its keys: never what a caller meant
            raise TypeError
        it = iter(ids)
    except TypeError:
        raise _err(StoplineTypeError, f"{name} must be a sequence of int, got {_type_name(ids)}", name, "wrong_type") from None
    items = _take(ids if hasattr(ids, "__len__") else it, name, _MAX_IDS)
    return tuple(_one_id(f"{name}[{i}]", t) for i, t in enumerate(items))


def _one_id(at: str, value: Any) -> int:
    t = _i64(at, value)
    if t < 0:
        raise _err(StoplineValueError, f"{at} = {t} is negative", at, "not_a_token_id")
    if t >= 2**32:
        raise _err(StoplineValueError, f"{at} = {t} is not a valid token id", at, "not_a_token_id")
    return t


# ------------------------------------------------------------- stop strings


def _earliest_match(text: str, new_from: int, stops: tuple[str, ...]) -> tuple[int, int, int] | None:
    """(index, start, end) of the earliest-ending match whose last character
    is at or after ``new_from``; ties go to the lowest index."""
    best: tuple[int, int, int] | None = None
    limit = len(text)
    for i, s in enumerate(stops):
        n = len(s)
        lo = new_from - n + 1
        if lo < 0:
            lo = 0
        # find() with an end bound only reports matches ending <= limit; once
        # something matched, a later stop must end strictly earlier to win.
        j = text.find(s, lo, limit)
        if j != -1:
            best = (i, j, j + n)
            limit = j + n - 1
    return best


def check_stop_strings(
    output_text: str,
    new_char_count: int,
    stop: Sequence[str],
    include_in_output: bool,
) -> tuple[str, int] | None:
    """vLLM-compatible stateless check over the last ``new_char_count`` chars.

    Returns None, or ``(stop_str, offset)``: the match start, or with
    ``include_in_output`` its end, or -1 when that end is the end of the text.
    """
    include_in_output = _flag(include_in_output, "include_in_output")
    if not isinstance(output_text, str):
        raise _err(StoplineTypeError, f"output_text must be str, got {_type_name(output_text)}", "output_text", "wrong_type")
    new_char_count = _index(new_char_count, "new_char_count")
    if new_char_count < 0 or new_char_count > len(output_text):
        raise _err(StoplineValueError,
            f"new_char_count={new_char_count} is outside [0, len(output_text)={len(output_text)}]",
            "new_char_count", "new_char_count")
    stops = _validate_stops(stop)
    _check_encodable(output_text, "output_text")
    if not new_char_count or not stops:
        return None
    m = _earliest_match(output_text, len(output_text) - new_char_count, stops)
    if m is None:
        return None
    i, start, end = m
    if include_in_output:
        return stops[i], (-1 if end >= len(output_text) else end)
    return stops[i], start


@dataclass(frozen=True, slots=True)
class StopMatch:
    """A stop string match, offsets in code points of the cumulative text."""

    index: int
    stop: str
    start: int
    end: int
    truncate_to: int


class StopMatcher:
    """Incremental stop-string matcher for one sequence.

    Keeps only the last ``max(len(stop)) - 1`` characters, which is all a
    match ending in the next delta can reach back into.
    """

    __slots__ = ("_stops", "_include", "_keep", "_prefixes", "_firsts", "_tail", "_fed", "_holdback")

    def __init__(self, stops: Sequence[str], include_in_output: bool = False) -> None:
        self._stops = _validate_stops(stops, "stops")
        self._include = _flag(include_in_output, "include_in_output")
        self._keep = max(map(len, self._stops), default=1) - 1
        self._prefixes = frozenset(s[:k] for s in self._stops for k in range(1, len(s)))
        self._firsts = frozenset(s[0] for s in self._stops)
        self.reset()

    def reset(self) -> None:
        self._tail = ""
        self._fed = 0
        self._holdback = 0

    @property
    def holdback(self) -> int:
        return self._holdback

    @property
    def chars_fed(self) -> int:
        return self._fed

    def feed(self, delta: str) -> StopMatch | None:
        if not isinstance(delta, str):
            raise _err(StoplineTypeError, f"delta must be str, got {_type_name(delta)}", "delta", "wrong_type")
        if not delta:
            return None
        _check_encodable(delta, "delta")
        tail = self._tail
        base = self._fed - len(tail)
        window = tail + delta
        m = _earliest_match(window, len(tail), self._stops) if self._stops else None
        self._fed += len(delta)
        keep = self._keep
        self._tail = window[-keep:] if keep else ""
        if not self._include and self._prefixes:
            # A held suffix can grow by at most len(delta) per feed.
            t = self._tail
            firsts = self._firsts
            hb = 0
            for k in range(min(len(t), self._holdback + len(delta)), 0, -1):
                if t[-k] in firsts and t[-k:] in self._prefixes:
                    hb = k
                    break
            self._holdback = hb
        if m is None:
            return None
        i, start, end = m
        start += base
        end += base
        return StopMatch(i, self._stops[i], start, end, end if self._include else start)


class StopRegexMatcher:
    """Incremental stop-regex matcher for one sequence, the way engines do it:
    ``re`` over a tail window of the text (module docs)."""

    __slots__ = ("_patterns", "_ends", "_include", "_width", "_text", "_holdback")

    def __init__(self, patterns: Sequence[str], include_in_output: bool = False) -> None:
        self._patterns = _validate_regexes(patterns, "patterns")
        self._ends = [_compile_ending(p) for p in self._patterns]
        self._include = _flag(include_in_output, "include_in_output")
        widths = [_regex_width(p)[1] for p in self._patterns]
        bounded = [w for w in widths if w is not None]
        # None: some pattern is unbounded and a match may start anywhere.
        self._width: int | None = max(bounded, default=1) if len(bounded) == len(widths) else None
        self.reset()

    def reset(self) -> None:
        self._text = ""
        self._holdback = 0

    @property
    def holdback(self) -> int:
        return self._holdback

    @property
    def chars_fed(self) -> int:
        return len(self._text)

    def feed(self, delta: str) -> StopMatch | None:
        if not isinstance(delta, str):
            raise _err(StoplineTypeError, f"delta must be str, got {_type_name(delta)}", "delta", "wrong_type")
        if not delta:
            return None
        _check_encodable(delta, "delta")
        new_from = len(self._text)
        text = self._text = self._text + delta
        width = self._width
        lo = 0 if width is None else max(0, new_from + 1 - width)
        found = None
        q = len(text)
        for end in range(new_from + 1, q + 1):
            rest = text[end:]
            for i, rx in enumerate(self._ends):
                if rest:
                    # The text after ``end`` is a look-ahead, so ``$`` and
                    # ``\\b`` see it, as they do in the core.
                    rx = _compile_ending(self._patterns[i], rest)
                m = rx.search(text, lo, q)
                if m is not None:
                    found = (i, m.start(), end)
                    break
            if found is not None:
                break
        if not self._include:
            # A later match starts at most width - 1 characters back; with an
            # unbounded pattern it may start anywhere, so nothing is safe.
            self._holdback = len(text) if width is None else min(width - 1, len(text))
        if found is None:
            return None
        i, start, end = found
        return StopMatch(i, self._patterns[i], start, end, end if self._include else start)


# -------------------------------------------------------------- finish state


_REPETITION_KEYS = ("max_pattern_size", "min_pattern_size", "min_count")


def _repetition(rep: Any) -> dict[str, int] | None:
    """``StopParams(repetition=...)`` read as the core's binding reads it:
    a mapping of the three keys (``min_pattern_size`` defaults to 0), each
    an int >= 0; how they fit together is checked with the other fields."""
    if rep is None:
        return None
    if not isinstance(rep, Mapping):
        raise _err(StoplineTypeError,
                   f"repetition must be a mapping with keys {', '.join(_REPETITION_KEYS)}, got {_type_name(rep)}",
                   "repetition", "wrong_type")
    for k in rep:
        if k not in _REPETITION_KEYS:
            expected = "[" + ", ".join(f'"{x}"' for x in _REPETITION_KEYS) + "]"
            raise _err(StoplineValueError, f"repetition has the unknown key {k!r}; expected {expected}",
                       "repetition", "unknown_key")
    out = {}
    for k, default in zip(_REPETITION_KEYS, (None, 0, None)):
        if k not in rep:
            if default is None:
                raise _err(StoplineValueError, f'repetition is missing the key "{k}"', "repetition", "missing_key")
            out[k] = default
            continue
        name = f'repetition["{k}"]'
        n = _i64(name, rep[k])
        if n < 0:
            raise _err(StoplineValueError, f"{name} must be >= 0, got {n}", name, "below")
        out[k] = n
    return out


_SCOPES = ("content", "reasoning", "any")
_UNSET = 1 << 62


def _scope_list(name: str, v: Any, n: int, count: bool = True) -> tuple[str, ...]:
    """One scope per entry, as the core reads a ``*_scopes=`` argument: one
    name for all (checked even for an empty list), or one per entry; an
    empty sequence is the default, as ``None``. ``count=False``: the names
    only (the core checks the count later)."""
    def scope(x: Any, at: str) -> str:
        if not isinstance(x, str):
            raise _err(StoplineTypeError, f"{at} must be a str, got {_type_name(x)}", at, "wrong_type")
        _check_encodable(x, at)
        if x not in _SCOPES:
            raise _err(StoplineValueError, f"{at}={x!r} is not one of 'content', 'reasoning' or 'any'", at, "not_one_of")
        return x

    if v is None:
        return ("content",) * n
    if isinstance(v, str):
        return (scope(v, name),) * n
    try:
        if isinstance(v, Mapping):  # its keys: never what a caller meant
            raise TypeError
        it = iter(v)
    except TypeError:
        raise _err(StoplineTypeError, f"{name} must be a str or a sequence of str, got {_type_name(v)}",
                   name, "wrong_type") from None
    items = tuple(scope(x, f"{name}[{i}]")
                  for i, x in enumerate(_take(v if hasattr(v, "__len__") else it, name, max(_MAX_IDS, n))))
    if not items:
        return ("content",) * n
    if count and len(items) != n:
        raise _err(StoplineValueError, f"{name} has {len(items)} scopes for {n} entries of the list it scopes", name, "count")
    return items


@dataclass(frozen=True, kw_only=True)
class StopParams:
    """Per-request stop parameters, validated at construction."""

    max_tokens: int | None = None
    min_tokens: int = 0  # None also reads as 0, as the core
    prompt_len: int = 0  # None also reads as 0
    max_model_len: int | None = None
    eos_token_ids: Sequence[int] = ()
    ignore_eos: bool = False
    stop_token_ids: Sequence[int] = ()
    stop: Sequence[str] = ()
    stop_regex: Sequence[str] = ()
    include_stop_str_in_output: bool = False
    vocab_size: int | None = None
    repetition: Mapping[str, int] | None = field(default=None)
    reasoning_start: str | None = None
    reasoning_start_id: int | None = None
    reasoning_end: str | None = None
    reasoning_end_id: int | None = None
    reasoning_end_ids: Sequence[int] = ()
    reasoning_starts_in: str | None = None
    keep_reasoning_markers: bool = False
    max_reasoning_tokens: int | None = None
    stop_scopes: str | Sequence[str] | None = None
    stop_regex_scopes: str | Sequence[str] | None = None
    stop_token_id_scopes: str | Sequence[str] | None = None
    token_aligned: bool = False
    tool_call_markers: Sequence[tuple[str, str]] | None = None
    tool_call_marker_ids: Sequence[tuple[int, int]] | None = None

    @property
    def spans(self) -> tuple[tuple[tuple[str | None, int | None], tuple[str | None, int | None]], ...]:
        """Tool-call span pairs ``((start text, start id), (end text, end id))``."""
        texts, ids = tuple(self.tool_call_markers or ()), tuple(self.tool_call_marker_ids or ())
        n = max(len(texts), len(ids))
        return tuple(
            tuple(
                (texts[i][side] if texts else None, ids[i][side] if ids else None) for side in (0, 1)
            )  # type: ignore[misc]
            for i in range(n)
        )

    def _check_spans(self) -> None:
        """Tool-call span pairs (semantics.md 11.10), as the core checks them."""

        def bad(field: str, i: int, side: int, shown: str, what: str, kind: str) -> StoplineValueError:
            return _err(StoplineValueError, f"{field}[{i}][{side}]={shown} {what}", f"{field}[{i}][{side}]", kind)

        spans = self.spans
        for i, pair in enumerate(spans):
            for side, (t, _) in enumerate(pair):
                if t is None:
                    continue
                if t == "":
                    raise bad("tool_call_markers", i, side, '""', "is an empty string; a marker must be non-empty", "empty_marker")
                shown = '"' + t + '"'
                if len(t.encode()) > _MAX_MARKER_BYTES:
                    raise bad("tool_call_markers", i, side, shown,
                              f"is longer than max_marker_bytes={_MAX_MARKER_BYTES} UTF-8 bytes", "too_many_bytes")
                for name in ("reasoning_start", "reasoning_end"):
                    rt = getattr(self, name) if self.has_reasoning else None
                    if rt is not None and (rt == t or (side == 0 and name == "reasoning_start" and (rt in t or t in rt))):
                        raise bad("tool_call_markers", i, side, shown, f"overlaps {name}", "overlaps")
                if side == 0:
                    for j, other in enumerate(spans):
                        if j != i and other[0][0] is not None and t in other[0][0]:
                            raise bad("tool_call_markers", i, side, shown, f"overlaps tool_call_markers[{j}][0]", "overlaps")
                for k, st in enumerate(self.stop):
                    if t in st:
                        raise _err(StoplineValueError, f"stop[{k}]={st!r} overlaps tool_call_markers", f"stop[{k}]", "overlaps")
            for side, (_, d) in enumerate(pair):
                if d is None:
                    continue
                for name in ("reasoning_start_id", "reasoning_end_id"):
                    if self.has_reasoning and getattr(self, name) == d:
                        raise bad("tool_call_marker_ids", i, side, str(d), f"overlaps {name}", "overlaps")
                if side == 0 and any(j != i and o[0][1] == d for j, o in enumerate(spans)):
                    raise bad("tool_call_marker_ids", i, side, str(d), "overlaps another pair's start", "overlaps")
                for lst_name in ("stop_token_ids", "eos_token_ids"):
                    lst = getattr(self, lst_name)
                    if d in lst:
                        k = lst.index(d)
                        raise _err(StoplineValueError, f"{lst_name}[{k}]={d} overlaps tool_call_marker_ids", f"{lst_name}[{k}]", "overlaps")

    def _has_spans(self) -> bool:
        return bool(self.tool_call_markers or self.tool_call_marker_ids)

    def _given(self) -> dict[str, Any]:
        """The reasoning arguments given, as the core reads them: all but
        ``None`` (``False`` for the flag; 0 is an id or a budget)."""
        return {
            f: v for f in (
                "reasoning_start", "reasoning_start_id", "reasoning_end", "reasoning_end_id",
                "reasoning_end_ids", "reasoning_starts_in", "keep_reasoning_markers",
                "max_reasoning_tokens", "stop_scopes", "stop_regex_scopes", "stop_token_id_scopes",
            )
            if (v := getattr(self, f)) is not None and v is not False and not (type(v) is tuple and not v)
        }

    @property
    def has_reasoning(self) -> bool:
        given = self._given()
        if not self._has_spans():
            return bool(given)
        # With spans, an empty list or a scope of an empty list is none.
        lengths = dict(self._scoped())
        return any(
            not ((isinstance(v, (list, tuple)) and not v) or (isinstance(v, str) and lengths.get(f) == 0))
            for f, v in given.items()
        )

    def _check_reasoning(self, put: Callable[[str, Any], None]) -> None:
        """Reasoning markers and scopes (semantics.md 11)."""
        if not self._given() and not self._has_spans():
            return
        # What the core's binding reads before the core checks them together.
        _id_list("reasoning_end_ids", self.reasoning_end_ids)
        read = [_scope_list(name, getattr(self, name), n, count=False) for name, n in self._scoped()]
        if not self.has_reasoning:
            return
        for name in ("reasoning_start", "reasoning_end"):
            if getattr(self, name) == "":
                raise _err(StoplineValueError, f"{name} is an empty string; a reasoning marker must be non-empty", name, "empty_marker")
        if self.reasoning_end is None and self.reasoning_end_id is None:
            raise _err(
                StoplineValueError,
                "reasoning_end is required: a reasoning channel needs an end marker",
                "reasoning_end", "required",
            )
        start, end = self.reasoning_start, self.reasoning_end
        # Both are awaited inside the block: one within the other is ambiguous.
        if start is not None and end is not None and (start in end or end in start):
            raise _err(StoplineValueError, f"reasoning_end={self.reasoning_end!r} overlaps reasoning_start", "reasoning_end", "overlaps")
        if self.reasoning_start_id is not None and self.reasoning_start_id == self.reasoning_end_id:
            raise _err(
                StoplineValueError,
                f"reasoning_end_id={self.reasoning_end_id} overlaps reasoning_start_id",
                "reasoning_end_id", "overlaps",
            )
        end_ids = _id_list("reasoning_end_ids", self.reasoning_end_ids)
        if not end_ids and self.reasoning_end_id is not None:
            end_ids = (self.reasoning_end_id,)
        if self.max_reasoning_tokens is not None and not end_ids:
            raise _err(
                StoplineValueError,
                "reasoning_end_ids is required: max_reasoning_tokens forces the end marker by id",
                "reasoning_end_ids", "required",
            )
        put("reasoning_end_ids", end_ids)
        self._check_spans()
        for i, st in enumerate(self.stop):
            for name in ("reasoning_start", "reasoning_end"):
                m = getattr(self, name)
                if m is not None and m in st:
                    raise _err(StoplineValueError, f"stop[{i}]={st!r} overlaps {name}", f"stop[{i}]", "overlaps")
        for field_name in ("stop_token_ids", "eos_token_ids"):
            for i, t in enumerate(getattr(self, field_name)):
                for name in ("reasoning_start_id", "reasoning_end_id"):
                    if getattr(self, name) == t:
                        raise _err(StoplineValueError, f"{field_name}[{i}]={t} overlaps {name}", f"{field_name}[{i}]", "overlaps")
        for (name, n), scopes in zip(self._scoped(), read):
            put(name, _scope_list(name, scopes, n))

    def _scoped(self) -> tuple[tuple[str, int], ...]:
        """Each ``*_scopes`` field with the length of the list it scopes."""
        return (("stop_scopes", len(self.stop)), ("stop_regex_scopes", len(self.stop_regex)),
                ("stop_token_id_scopes", len(self.stop_token_ids)))

    def __post_init__(self) -> None:
        def put(name: str, value: Any) -> None:
            object.__setattr__(self, name, value)

        # In the core's order (its binding reads each argument, then
        # `StopParams::validate` checks them together), so that with several
        # bad fields both report the same one first.
        for name in ("ignore_eos", "include_stop_str_in_output", "keep_reasoning_markers", "token_aligned"):
            put(name, _flag(getattr(self, name), name))

        vocab = self.vocab_size
        if vocab is not None:
            vocab = _i64("vocab_size", vocab)
            if vocab < 1:
                raise _err(StoplineValueError, f"vocab_size must be >= 1, got {vocab}", "vocab_size", "below")

        mt = self.max_tokens
        if mt is not None:
            mt = _i64("max_tokens", mt)
            if mt < 1:
                raise _err(StoplineValueError, f"max_tokens must be >= 1, got {mt}", "max_tokens", "below")
        put("max_tokens", mt)

        # None is the default, as the core's `Option` (the stub: `int | None`).
        mn = 0 if self.min_tokens is None else _i64("min_tokens", self.min_tokens)
        if mn < 0:
            raise _err(StoplineValueError, f"min_tokens must be >= 0, got {mn}", "min_tokens", "below")
        put("min_tokens", mn)

        pl = 0 if self.prompt_len is None else _i64("prompt_len", self.prompt_len)
        if pl < 0:
            raise _err(StoplineValueError, f"prompt_len must be >= 0, got {pl}", "prompt_len", "below")
        put("prompt_len", pl)
        mml = self.max_model_len
        if mml is not None:
            mml = _i64("max_model_len", mml)
            if mml < 1:
                raise _err(StoplineValueError, f"max_model_len must be >= 1, got {mml}", "max_model_len", "below")
        put("max_model_len", mml)

        put("eos_token_ids", _id_list("eos_token_ids", self.eos_token_ids))
        put("stop_token_ids", _id_list("stop_token_ids", self.stop_token_ids))
        put("stop", () if self.stop is None else _validate_stops(self.stop))
        put("stop_regex", () if self.stop_regex is None else _validate_regexes(self.stop_regex))
        if vocab is not None and vocab > 2**32 - 1:  # token ids are u32
            raise _err(StoplineValueError, f"vocab_size={vocab} is more than the supported {2**32 - 1}",
                       "vocab_size", "unsupported")
        put("vocab_size", vocab)
        put("repetition", _repetition(self.repetition))

        # The fields the core reads before it checks them together (its
        # classes, fields and kinds, docs/errors.md).
        for name in ("reasoning_start", "reasoning_end"):
            if getattr(self, name) is not None:
                put(name, _marker_text(name, getattr(self, name)))
        sin = self.reasoning_starts_in
        if sin is not None and not isinstance(sin, str):
            raise _err(StoplineTypeError, f"reasoning_starts_in must be str, got {_type_name(sin)}",
                       "reasoning_starts_in", "wrong_type")
        texts, ids = _pairs("tool_call_markers", self.tool_call_markers), _pairs("tool_call_marker_ids", self.tool_call_marker_ids)
        if texts is not None and ids is not None and len(texts) != len(ids):
            raise _err(StoplineValueError, f"tool_call_marker_ids has {len(ids)} pairs for {len(texts)} pairs of tool_call_markers",
                       "tool_call_marker_ids", "count")
        put("tool_call_markers", _pair_sides("tool_call_markers", texts, _text))
        put("tool_call_marker_ids", _pair_sides("tool_call_marker_ids", ids, _token_id))
        if sin is not None and sin not in ("reasoning", "content"):
            raise _err(StoplineValueError, f"reasoning_starts_in={sin!r} is not one of 'reasoning' or 'content'",
                       "reasoning_starts_in", "not_one_of")
        for name in ("reasoning_start_id", "reasoning_end_id"):
            if getattr(self, name) is not None:
                put(name, _token_id(name, getattr(self, name)))
        mrt = self.max_reasoning_tokens
        if mrt is not None:
            mrt = _i64("max_reasoning_tokens", mrt)
            if mrt < 0:
                raise _err(StoplineValueError, f"max_reasoning_tokens must be >= 0, got {mrt}", "max_reasoning_tokens", "below")
            put("max_reasoning_tokens", mrt)
        self._check_reasoning(put)
        if not self.has_reasoning:
            self._check_spans()
        self._check_together()

    def _check_together(self) -> None:
        """What the core's ``StopParams::validate`` checks once every field
        is read, in its order."""
        mt, mn, pl, mml, vocab = self.max_tokens, self.min_tokens, self.prompt_len, self.max_model_len, self.vocab_size
        if mt is not None and mn > mt:
            raise _err(StoplineValueError, f"min_tokens={mn} is greater than max_tokens={mt}", "min_tokens", "greater")
        if mml is not None and pl >= mml:
            raise _err(StoplineValueError, f"prompt_len={pl} leaves no room under max_model_len={mml}",
                       "prompt_len", "no_room")
        if vocab is not None:
            for name in ("eos_token_ids", "stop_token_ids"):
                for i, t in enumerate(getattr(self, name)):
                    if t >= vocab:
                        raise _err(StoplineValueError, f"{name}[{i}]={t} is outside [0, vocab_size={vocab})",
                                   f"{name}[{i}]", "id_outside")
        rep = self.repetition
        if rep is not None:
            mx, mnp, cnt = rep["max_pattern_size"], rep["min_pattern_size"], rep["min_count"]
            big, small, count = (f'repetition["{k}"]' for k in _REPETITION_KEYS)
            if mx < 1:
                raise _err(StoplineValueError, f"{big} must be >= 1, got {mx}", big, "below")
            if mnp > mx:
                raise _err(StoplineValueError, f"{small}={mnp} is greater than {big}={mx}", small, "greater")
            if mx * cnt >= 2**64:  # the core's usize product
                raise _err(StoplineValueError, f"{count}={cnt} times {big}={mx} overflows", count, "product_overflows")
            if cnt < 2:
                raise _err(StoplineValueError, f"{count} must be >= 2, got {cnt}", count, "below")
        if vocab is not None and (self.has_reasoning or self._has_spans()):
            self._check_marker_ids(vocab)

    def _check_marker_ids(self, vocab: int) -> None:
        """Marker ids under ``vocab_size``, last and in the core's order
        (``ReasoningSpec::check_ids``)."""
        for name in ("reasoning_start_id", "reasoning_end_id"):
            v = getattr(self, name)
            if v is not None and v >= vocab:
                raise _err(StoplineValueError, f"{name}={v} is outside [0, vocab_size={vocab})", name, "id_outside")
        for i, t in enumerate(self.reasoning_end_ids or ()):
            if t >= vocab:
                raise _err(StoplineValueError, f"reasoning_end_ids[{i}]={t} is outside [0, vocab_size={vocab})",
                           f"reasoning_end_ids[{i}]", "id_outside")
        for i, pair in enumerate(self.spans):
            for side, (_, d) in enumerate(pair):
                if d is not None and d >= vocab:
                    at = f"tool_call_marker_ids[{i}][{side}]"
                    raise _err(StoplineValueError, f"{at}={d} is outside [0, vocab_size={vocab})", at, "id_outside")


@dataclass(slots=True)
class StepResult:
    finished: bool
    finish_reason: str | None
    stop_reason: str | int | None
    matched: str | int | None
    num_tokens: int
    text_len: int
    text_delta: str
    token_ids_delta: list[int]
    channel: str | None = None
    reasoning_delta: str = ""
    content_delta: str = ""
    reasoning_token_ids_delta: list[int] = field(default_factory=list)
    content_token_ids_delta: list[int] = field(default_factory=list)
    forced_token_id: int | None = None


def _clip(a: int, b: int, lo: int, hi: int) -> tuple[int, int]:
    return (max(a, lo), min(b, hi)) if max(a, lo) < min(b, hi) else (a, a)


def _cut(r: tuple[int, int], holes: list[tuple[int, int]]) -> tuple[tuple[int, int], ...]:
    """``r`` without the ``holes`` (sorted, disjoint), as its pieces in order."""
    pieces, x = [], r[0]
    for a, b in holes:
        if a < r[1] and b > x:
            pieces.append((x, max(x, a)))
            x = b
    pieces.append((x, max(x, r[1])))
    return tuple(p for p in pieces if p[0] < p[1])


class _Channels:
    """Reasoning channels of one sequence (semantics.md 11), written plainly:
    markers found with ``str.find`` from the first undecided character, the
    held partial marker as the longest suffix that is a proper prefix of the
    awaited marker, one stop matcher pair per channel. Positions in code
    points."""

    def __init__(self, p: StopParams, include: bool) -> None:
        # Markers by index: 0 the reasoning start, 1 its end, 2 + 2i / 3 + 2i
        # tool-call span i's start / end (semantics.md 11.10).
        block = ((p.reasoning_start, p.reasoning_start_id), (p.reasoning_end, p.reasoning_end_id))
        self.markers: tuple[tuple[str | None, int | None], ...] = block + tuple(m for pair in p.spans for m in pair)
        self.block = p.has_reasoning
        self.n_spans = len(p.spans)
        self.span: int | None = None
        self.keep = p.keep_reasoning_markers
        self.budget = p.max_reasoning_tokens
        self.end_ids = tuple(p.reasoning_end_ids)
        self.id_scopes = tuple(p.stop_token_id_scopes or ())
        self.phase = 0 if self.block else 2  # 0 before the block, 1 inside, 2 after (or no block)
        self.partial = 0
        self.base = [0, 0]  # per channel: 0 content, 1 reasoning
        self.chars = [_UNSET] * 4
        self.bounds = [_UNSET] * 4
        # Start markers met again inside the block: (chars, tokens) ranges.
        self.inner: list[tuple[tuple[int, int], tuple[int, int]]] = []
        self.strings: list[tuple[StopMatcher | None, list[int]]] = []
        self.regexes: list[tuple[StopRegexMatcher | None, list[int]]] = []
        # Spans alone: every stop is content-scoped.
        stop_scopes = p.stop_scopes if self.block else ("content",) * len(p.stop)
        regex_scopes = p.stop_regex_scopes if self.block else ("content",) * len(p.stop_regex)
        for c in ("content", "reasoning"):
            idx = [i for i, sc in enumerate(stop_scopes or ()) if sc in (c, "any")]
            self.strings.append((StopMatcher([p.stop[i] for i in idx], include) if idx else None, idx))
            idx = [i for i, sc in enumerate(regex_scopes or ()) if sc in (c, "any")]
            self.regexes.append((StopRegexMatcher([p.stop_regex[i] for i in idx], include) if idx else None, idx))
        if p.reasoning_starts_in == "reasoning":
            self.start_inside()

    def start_inside(self) -> None:
        self.phase = 1
        self.chars[0] = self.chars[1] = self.bounds[0] = self.bounds[1] = 0

    @property
    def channel(self) -> str:
        return "reasoning" if self.phase == 1 else "content"

    def stop_id_applies(self, i: int) -> bool:
        if self.span is not None:
            return False
        return i >= len(self.id_scopes) or self.id_scopes[i] in (self.channel, "any")

    def awaited(self) -> list[int]:
        """Indices of the markers awaited now."""
        if self.span is not None:
            return [3 + 2 * self.span]
        if self.phase == 1:
            m = self.markers[0]
            return [1] + ([0] if m[0] is not None or m[1] is not None else [])
        starts = [2 + 2 * i for i in range(self.n_spans)]
        m = self.markers[0]
        return ([0] if self.phase == 0 and (m[0] is not None or m[1] is not None) else []) + starts

    def holdback(self) -> int:
        c = 1 if self.phase == 1 else 0
        s, r = self.strings[c][0], self.regexes[c][0]
        return self.partial + max(s.holdback if s else 0, r.holdback if r else 0)

    def reasoning_tokens(self, n: int) -> int:
        return n - self.bounds[1] if self.phase == 1 else 0

    def forced(self, n: int) -> int | None:
        if self.budget is None or self.phase != 1:
            return None
        used = self.reasoning_tokens(n) - self.budget
        return self.end_ids[used] if 0 <= used < len(self.end_ids) else None

    def _feed(self, text: str, a: int, b: int, allow: bool) -> tuple[StopMatch, bool] | None:
        if a >= b or self.span is not None:
            return None
        c = 1 if self.phase == 1 else 0
        (sm, si), (rm, ri) = self.strings[c], self.regexes[c]
        chunk = text[a:b]
        m = sm.feed(chunk) if sm else None
        mr = rm.feed(chunk) if rm else None
        hit, idx = m, si
        if mr is not None and (m is None or mr.end < m.end):
            hit, idx = mr, ri
        if hit is None or not allow:
            return None
        base = self.base[c]
        found = StopMatch(idx[hit.index], hit.stop, hit.start + base, hit.end + base, hit.truncate_to + base)
        return found, idx is ri

    def _enter(self, w: int, k: int, start: int, end: int, total: int, ends: list[int]) -> None:
        if w == 0 and self.phase == 1:
            # A start marker again inside the block: a marker, the block stays open.
            self.inner.append(((start, end), self._marker_tokens(k, start, end, total, ends)))
        elif w < 2:
            self._enter_block(k, start, end, total, ends)
        else:
            self.span = (w - 2) // 2 if w % 2 == 0 else None
        self.partial = 0
        c = 1 if self.phase == 1 else 0
        self.base[c] = end
        for m in (self.strings[c][0], self.regexes[c][0]):
            if m is not None:
                m.reset()

    @staticmethod
    def _marker_tokens(k: int, start: int, end: int, total: int, ends: list[int]) -> tuple[int, int]:
        """The tokens wholly inside a marker at ``[start, end)`` found in token ``k``."""
        inside = sum(1 for e in ends[:k] if e > start)
        first = k - inside
        # Where the first token the marker overlaps starts (tokens are kept whole).
        first_start = ends[first - 1] if first > 0 else 0
        hi = k + (1 if end == total else 0)
        return min(first + (1 if first_start < start else 0), hi), hi

    def _enter_block(self, k: int, start: int, end: int, total: int, ends: list[int]) -> None:
        slot = 0 if self.phase == 0 else 2
        self.chars[slot], self.chars[slot + 1] = start, end
        self.bounds[slot], self.bounds[slot + 1] = self._marker_tokens(k, start, end, total, ends)
        self.phase += 1

    def token(
        self, kept: str, ends: list[int], t: int, piece: str, allow: bool
    ) -> tuple[StopMatch, bool] | None:
        """Token ``len(ends)`` (not yet kept) with its output text ``piece``."""
        k, n = len(ends), len(kept)
        text = kept + piece
        for w in self.awaited():
            if self.markers[w][1] == t:
                held, self.partial = n - self.partial, 0
                hit = self._feed(text, held, n, allow)
                if hit is None:
                    self._enter(w, k, n, len(text), len(text), ends)
                return hit
        confirmed = n - self.partial
        while True:
            found = [
                (j, w, m)
                for w in self.awaited()
                if (m := self.markers[w][0]) is not None and (j := text.find(m, confirmed)) >= 0
            ]
            if not found:
                break
            # Start markers awaited together never contain each other: the
            # first to start is the first to end.
            j, w, m = min(found)
            hit = self._feed(text, confirmed, j, allow)
            if hit is not None:
                return hit
            self._enter(w, k, j, j + len(m), len(text), ends)
            confirmed = j + len(m)
        self.partial = 0
        for w in self.awaited():
            m = self.markers[w][0]
            if m is None:
                continue
            for q in range(min(len(m) - 1, len(text) - confirmed), self.partial, -1):
                if text.endswith(m[:q]):
                    self.partial = q
                    break
        return self._feed(text, confirmed, len(text) - self.partial, allow)

    def split(self, a: int, b: int, ta: int, tb: int) -> tuple[tuple[tuple[int, int], ...], ...]:
        """(reasoning text, content texts, reasoning tokens, content tokens)
        ranges within text ``[a, b)`` and tokens ``[ta, tb)``."""
        c, t = self.chars, self.bounds
        r0, r1 = (0, 3) if self.keep else (1, 2)
        holes = [] if self.keep else self.inner
        return (
            _cut(_clip(a, b, c[r0], c[r1]), [h[0] for h in holes]),
            (_clip(a, b, 0, c[0]), _clip(a, b, c[3], _UNSET)),
            _cut(_clip(ta, tb, t[r0], t[r1]), [h[1] for h in holes]),
            (_clip(ta, tb, 0, t[0]), _clip(ta, tb, t[3], _UNSET)),
        )


def _repeats(tokens: list[int], lo: int, hi: int, count: int) -> bool:
    n = len(tokens)
    for size in range(lo, hi + 1):
        span = size * count
        if span > n:
            return False
        pattern = tokens[n - size:]
        for k in range(2, count + 1):
            if tokens[n - k * size:n - (k - 1) * size] != pattern:
                break
        else:
            return True
    return False


class FinishTracker:
    """Finish-state machine for one sequence (docs/semantics.md section 3)."""

    __slots__ = (
        "_params", "_vocab", "_min_tokens", "_limit", "_eos", "_stop_ids", "_include",
        "_matcher", "_rx_matcher", "_rep", "_tokens", "_ends", "_emitted_parts", "_pending",
        "_emitted_len", "_emitted_tokens", "_text_len", "_finished", "_reason",
        "_stop_reason", "_matched", "_channels", "_block", "_aligned",
    )

    def __init__(self, params: StopParams, starts_in: str | None = None) -> None:
        """``starts_in="reasoning"``: output starts inside the reasoning block
        (a prompt that opened it), unless the params say where it starts."""
        if not isinstance(params, StopParams):
            raise _err(StoplineTypeError, f"params must be StopParams, got {_type_name(params)}", "params", "wrong_type")
        p = params
        self._params = p
        self._vocab = p.vocab_size
        self._min_tokens = p.min_tokens
        limits = []
        if p.max_tokens is not None:
            limits.append(p.max_tokens)
        if p.max_model_len is not None:
            limits.append(p.max_model_len - p.prompt_len)
        # n >= max_tokens or prompt_len + n >= max_model_len, as one bound.
        self._limit = min(limits) if limits else None
        self._eos = frozenset() if p.ignore_eos else frozenset(p.eos_token_ids)
        self._stop_ids = frozenset(p.stop_token_ids)
        self._include = p.include_stop_str_in_output
        self._matcher = StopMatcher(p.stop, p.include_stop_str_in_output) if p.stop else None
        self._rx_matcher = (
            StopRegexMatcher(p.stop_regex, p.include_stop_str_in_output) if p.stop_regex else None
        )
        r = p.repetition
        self._rep = None if r is None else (max(r["min_pattern_size"], 1), r["max_pattern_size"], r["min_count"])
        self._tokens: list[int] = []
        self._ends: list[int] = []  # text end offset of each kept token
        self._emitted_parts: list[str] = []
        self._pending = ""  # kept text not yet emitted (at most the hold-back while running)
        self._emitted_len = 0
        self._emitted_tokens = 0
        self._text_len = 0
        self._finished = False
        self._reason: str | None = None
        self._stop_reason: str | int | None = None
        self._matched: str | int | None = None
        self._aligned = p.token_aligned
        self._channels = _Channels(p, self._include) if p.has_reasoning or p.spans else None
        # The channel state when a reasoning block is configured (spans alone
        # have no channels to report).
        self._block = self._channels if p.has_reasoning else None
        if self._channels is not None:
            self._matcher = self._rx_matcher = None
            if self._block is not None and p.reasoning_starts_in is None and starts_in == "reasoning":
                self._channels.start_inside()

    # -- read-only state
    @property
    def finished(self) -> bool:
        return self._finished

    @property
    def finish_reason(self) -> str | None:
        return self._reason

    @property
    def stop_reason(self) -> str | int | None:
        return self._stop_reason

    @property
    def matched(self) -> str | int | None:
        return self._matched

    @property
    def num_tokens(self) -> int:
        return len(self._tokens)

    @property
    def text_len(self) -> int:
        return self._text_len

    @property
    def token_ids(self) -> list[int]:
        return list(self._tokens)

    @property
    def text(self) -> str:
        return "".join(self._emitted_parts) + self._pending

    @property
    def channel(self) -> str | None:
        return None if self._block is None else self._block.channel

    @property
    def in_tool_call(self) -> bool:
        return self._channels is not None and self._channels.span is not None

    def _parts(self, a: int, b: int, ta: int, tb: int) -> tuple[str, str, list[int], list[int]]:
        ch = self._block
        assert ch is not None
        rt, ct, rk, ck = ch.split(a, b, ta, tb)
        text, toks = self.text, self._tokens
        return (
            "".join(text[x:y] for x, y in rt),
            "".join(text[x:y] for x, y in ct),
            [i for x, y in rk for i in toks[x:y]],
            [i for x, y in ck for i in toks[x:y]],
        )

    @property
    def reasoning(self) -> str:
        return "" if self._block is None else self._parts(0, self._text_len, 0, len(self._tokens))[0]

    @property
    def content(self) -> str:
        return self.text if self._block is None else self._parts(0, self._text_len, 0, len(self._tokens))[1]

    @property
    def reasoning_token_ids(self) -> list[int]:
        return [] if self._block is None else self._parts(0, self._text_len, 0, len(self._tokens))[2]

    @property
    def content_token_ids(self) -> list[int]:
        if self._block is None:
            return list(self._tokens)
        return self._parts(0, self._text_len, 0, len(self._tokens))[3]

    @property
    def reasoning_tokens(self) -> int:
        return 0 if self._channels is None else self._channels.reasoning_tokens(len(self._tokens))

    @property
    def forced_token_id(self) -> int | None:
        if self._channels is None or self._finished:
            return None
        return self._channels.forced(len(self._tokens))

    # -- stepping
    def _prepare(
        self, token_ids: Any, texts: Any, grammar_terminated_at: Any, where: str = ""
    ) -> tuple[list[int], list[str] | None, int | None]:
        """Validate one step without touching state; returns normalized args."""
        if self._finished:
            raise _err(SequenceFinishedError,
                       f"{where}sequence already finished (finish_reason={self._reason!r}); no more updates",
                       None, "slot_finished" if where else "finished")
        if isinstance(token_ids, (str, bytes, Mapping)):
            raise _err(StoplineTypeError,
                       f"{where}token_ids must be a sequence of int, got {_type_name(token_ids)}",
                       "token_ids", "wrong_type")
        try:
            run = list(token_ids)
        except TypeError:
            raise _err(StoplineTypeError,
                       f"{where}token_ids must be a sequence of int, got {_type_name(token_ids)}",
                       "token_ids", "wrong_type") from None
        for i, t in enumerate(run):
            if type(t) is not int:
                t = run[i] = _index(t, f"{where}token_ids[{i}]")
            if t < 0:
                raise _err(StoplineValueError, f"{where}token_ids[{i}] = {t} is negative", f"token_ids[{i}]", "not_a_token_id")
        if texts is None:
            ch = self._params
            needs = (
                ch.stop or ch.stop_regex or ch.reasoning_start is not None or ch.reasoning_end is not None
                or any(t is not None for pair in ch.spans for t, _ in pair)
            )
            if self._matcher is not None or self._rx_matcher is not None or (self._channels and needs):
                raise _err(StoplineValueError,
                    f"{where}texts is required: stop strings and stop regexes need the token text",
                    "texts", "required")
        else:
            if isinstance(texts, str):
                raise _err(StoplineTypeError, f"{where}texts must be a sequence of str (one per token), not a str", "texts", "single_str")
            if isinstance(texts, Mapping):
                raise _err(StoplineTypeError, f"{where}texts must be a sequence of str, got {_type_name(texts)}",
                           "texts", "wrong_type")
            texts = list(texts)
            if len(texts) != len(run):
                raise _err(StoplineValueError, f"{where}texts has {len(texts)} pieces for {len(run)} token ids", "texts", "count")
            for i, s in enumerate(texts):
                if not isinstance(s, str):
                    raise _err(StoplineTypeError, f"{where}texts[{i}] must be str, got {_type_name(s)}", f"texts[{i}]", "wrong_type")
                _check_encodable(s, f"{where}texts[{i}]")
        g = grammar_terminated_at
        if g is not None:
            g = _index(g, f"{where}grammar_terminated_at")
            if not 0 <= g < len(run):
                raise _err(StoplineValueError,
                    f"{where}grammar_terminated_at={g} is outside the run of {len(run)} tokens",
                    "grammar_terminated_at", "outside_run")
        return run, texts, g

    def _finish(self, reason: str, stop_reason: str | int | None, matched: str | int | None) -> None:
        self._finished = True
        self._reason = reason
        self._stop_reason = stop_reason
        self._matched = matched

    def _apply(self, run: list[int], texts: list[str] | None, g: int | None) -> StepResult:
        tokens = self._tokens
        ends = self._ends
        matcher = self._matcher
        rx_matcher = self._rx_matcher
        vocab = self._vocab
        limit = self._limit
        for i, t in enumerate(run):
            piece = texts[i] if texts is not None else ""
            n = len(tokens) + 1
            # 1. invalid token: neither it nor its text is kept
            if vocab is not None and t >= vocab:
                self._finish("error", None, None)
                break
            ch = self._channels
            if ch is None:
                ending = t in self._eos or t in self._stop_ids
            else:
                ending = t in self._eos or any(
                    s == t and ch.stop_id_applies(j) for j, s in enumerate(self._params.stop_token_ids)
                )
            if ch is not None:
                fed = piece if not ending or self._include else ""
                found = ch.token(self.text, ends, t, fed, n > self._min_tokens)
                if found is not None:
                    hit, by_regex = found
                    tokens.append(t)
                    matched = (self.text + piece)[hit.start:hit.end] if by_regex else hit.stop
                    cut = hit.truncate_to - self._emitted_len
                    self._pending = (self._pending + piece)[:cut]
                    self._text_len = hit.truncate_to
                    self._finish("stop", hit.stop, matched)
                    break
            # 2. stop string or regex completing in this piece; earliest end,
            # a string before a regex. An ending token's text that is not kept
            # is not fed (semantics.md 3, check 4; vLLM's detokenizer agrees).
            if piece and (matcher is not None or rx_matcher is not None) and (
                not ending or self._include
            ):
                m = matcher.feed(piece) if matcher is not None else None
                mr = rx_matcher.feed(piece) if rx_matcher is not None else None
                if mr is not None and (m is None or mr.end < m.end):
                    m = mr
                else:
                    mr = None
                if m is not None and n > self._min_tokens:
                    tokens.append(t)
                    matched = m.stop
                    if mr is not None:
                        matched = (self.text + piece)[mr.start:mr.end]
                    cut = m.truncate_to - self._emitted_len
                    self._pending = (self._pending + piece)[:cut]
                    self._text_len = m.truncate_to
                    self._finish("stop", m.stop, matched)
                    break
            # 3./4. EOS and stop token ids: token kept, text only if included
            if ending:
                tokens.append(t)
                if self._include:
                    self._pending += piece
                    self._text_len += len(piece)
                if t in self._eos:
                    self._finish("stop", None, t)
                else:
                    self._finish("stop", t, t)
                break
            tokens.append(t)
            if piece:
                self._pending += piece
                self._text_len += len(piece)
            ends.append(self._text_len)
            # 5. grammar termination (before length; SGLang 0.5.23 differs, 6.3)
            if g == i:
                self._finish("stop", None, t)
                break
            # 6. length
            if limit is not None and n >= limit:
                self._finish("length", None, None)
                break
            # 7. repetition
            rep = self._rep
            if rep is not None and n >= self._min_tokens and _repeats(tokens, *rep):
                self._finish("repetition", "repetition_detected", None)
                break
        return self._emit()

    def _emit(self) -> StepResult:
        if self._finished:
            text_delta = self._pending
            self._pending = ""
            tok_delta = self._tokens[self._emitted_tokens:]
            self._ends.clear()
        else:
            hb = self._matcher.holdback if self._matcher is not None else 0
            if self._rx_matcher is not None:
                hb = max(hb, self._rx_matcher.holdback)
            if self._channels is not None:
                hb = min(self._channels.holdback(), len(self._pending))
            cut = max(0, len(self._pending) - hb)
            if self._aligned:
                # Whole tokens only: back to the end of the last one released.
                ends = self._ends
                k = self._emitted_tokens
                while k < len(ends) and ends[k] <= self._emitted_len + cut:
                    k += 1
                cut = (ends[k - 1] if k > self._emitted_tokens else self._emitted_len) - self._emitted_len
            text_delta = self._pending[:cut]
            self._pending = self._pending[cut:]
            emitted = self._emitted_len + cut
            ends = self._ends
            k = self._emitted_tokens
            while k < len(ends) and ends[k] <= emitted:
                k += 1
            tok_delta = self._tokens[self._emitted_tokens:k]
        a, ta = self._emitted_len, self._emitted_tokens
        if text_delta:
            self._emitted_parts.append(text_delta)
            self._emitted_len += len(text_delta)
        self._emitted_tokens += len(tok_delta)
        r = StepResult(
            self._finished, self._reason, self._stop_reason, self._matched,
            len(self._tokens), self._text_len, text_delta, tok_delta,
        )
        if self._block is None:
            r.content_delta, r.content_token_ids_delta = text_delta, list(tok_delta)
        else:
            parts = self._parts(a, self._emitted_len, ta, self._emitted_tokens)
            r.reasoning_delta, r.content_delta, r.reasoning_token_ids_delta, r.content_token_ids_delta = parts
            r.channel = self._block.channel
            r.forced_token_id = self.forced_token_id
        return r

    def update(
        self,
        token_ids: Sequence[int],
        texts: Sequence[str] | None = None,
        grammar_terminated_at: int | None = None,
    ) -> StepResult:
        """Append one step (one token or a speculative accept run)."""
        return self._apply(*self._prepare(token_ids, texts, grammar_terminated_at))

    def abort(self) -> StepResult:
        """Finish with "abort" and flush; a no-op on a finished tracker."""
        if self._finished:
            return StepResult(
                True, self._reason, self._stop_reason, self._matched,
                len(self._tokens), self._text_len, "", [],
            )
        self._finish("abort", None, None)
        return self._emit()


def _at_slot(e: Exception, slot: int, pos: int) -> None:
    """Names ``slot`` on a tracker's error from a batch step, whose run
    starts at ``pos`` of the flat ``token_ids`` / ``texts`` (the core names
    their elements by the flat index)."""
    e.slot = slot  # type: ignore[attr-defined]
    field = getattr(e, "field", None)
    if field is not None:
        # The message's "slot N: " prefix is not part of the field.
        field = re.sub(r"^slot \d+: ", "", field)
        if m := re.fullmatch(r"(token_ids|texts)\[(\d+)\]", field):
            field = f"{m.group(1)}[{pos + int(m.group(2))}]"
        e.field = field  # type: ignore[attr-defined]


class FinishBatch:
    """Many FinishTrackers addressed by slot, stepped with one call."""

    __slots__ = ("_slots",)

    def __init__(self, max_slots: int) -> None:
        max_slots = _param_int("max_slots", max_slots)
        if max_slots < 1:
            raise _err(StoplineValueError, f"max_slots must be >= 1, got {max_slots}", "max_slots", "below")
        self._slots: list[FinishTracker | None] = [None] * max_slots

    @property
    def max_slots(self) -> int:
        return len(self._slots)

    def _slot(self, slot: Any) -> int:
        s = _param_int("slot", slot)
        if not 0 <= s < len(self._slots):
            raise _err(StoplineValueError, f"slot {s} is outside [0, {len(self._slots)})", "slot", "slot", slot=s)
        return s

    def add(self, slot: int, params: StopParams) -> None:
        s = self._slot(slot)
        if self._slots[s] is not None:
            raise _err(StoplineValueError, f"slot {s} is already in use; remove it first", "slot", "slot", slot=s)
        try:
            tracker = FinishTracker(params)
        except (StoplineValueError, StoplineTypeError) as e:
            e.slot = s
            raise
        self._slots[s] = tracker

    def remove(self, slot: int) -> None:
        s = self._slot(slot)
        if self._slots[s] is None:
            raise _err(StoplineValueError, f"slot {s} is empty", "slot", "slot", slot=s)
        self._slots[s] = None

    def step(
        self,
        slots: Sequence[int],
        token_ids: Sequence[int],
        run_lengths: Sequence[int] | None = None,
        texts: Sequence[str] | None = None,
        grammar_terminated_at: Sequence[int] | None = None,
    ) -> list[StepResult]:
        """One engine step for the listed slots; validates everything first."""
        if isinstance(slots, (str, bytes)) or isinstance(token_ids, (str, bytes)):
            raise _err(StoplineTypeError, "slots and token_ids must be sequences of int", "slots", "wrong_type")
        for name, v in (("slots", slots), ("token_ids", token_ids), ("run_lengths", run_lengths), ("texts", texts),
                        ("grammar_terminated_at", grammar_terminated_at)):
            if isinstance(v, Mapping):  # its keys: never what a caller meant
                raise _err(StoplineTypeError, f"{name} must be a sequence, got {_type_name(v)}", name, "wrong_type")
        slots = [self._slot(s) for s in slots]
        token_ids = list(token_ids)
        nslots = len(slots)
        if len(set(slots)) != nslots:
            dup = next(s for s in slots if slots.count(s) > 1)
            raise _err(StoplineValueError, f"slot {dup} is listed more than once", "slot", "slot", slot=dup)
        if run_lengths is None:
            if len(token_ids) != nslots:
                raise _err(StoplineValueError,
                    f"{len(token_ids)} token ids for {nslots} slots (run_lengths=None means one each)",
                    "token_ids", "count")
            lengths = [1] * nslots
        else:
            lengths = list(run_lengths)
            if len(lengths) != nslots:
                raise _err(StoplineValueError, f"run_lengths has {len(lengths)} entries for {nslots} slots", "run_lengths", "count")
            for k, s in enumerate(slots):
                r = lengths[k] = _param_int(f"slot {s}: run length", lengths[k])
                if r < 0:
                    raise _err(StoplineValueError, f"slot {s}: run length {r} is negative", f"run_lengths[{k}]", "below", slot=s)
            if sum(lengths) != len(token_ids):
                raise _err(StoplineValueError,
                           f"run_lengths sum to {sum(lengths)} but {len(token_ids)} token ids were given",
                           "token_ids", "count")
        if texts is not None:
            if isinstance(texts, str):
                raise _err(StoplineTypeError, "texts must be a sequence of str (one per token), not a str", "texts", "single_str")
            texts = list(texts)
            if len(texts) != len(token_ids):
                raise _err(StoplineValueError, f"texts has {len(texts)} pieces for {len(token_ids)} token ids", "texts", "count")
        if grammar_terminated_at is not None:
            gta = list(grammar_terminated_at)
            if len(gta) != nslots:
                raise _err(StoplineValueError,
                           f"grammar_terminated_at has {len(gta)} entries for {nslots} slots",
                           "grammar_terminated_at", "count")
        else:
            gta = None
        prepared = []
        pos = 0
        for k, s in enumerate(slots):
            tr = self._slots[s]
            if tr is None:
                raise _err(StoplineValueError, f"slot {s} is empty", "slot", "slot", slot=s)
            r = lengths[k]
            g = None
            try:
                if gta is not None:
                    g = _index(gta[k], f"slot {s}: grammar_terminated_at")
                    if g == -1:
                        g = None
                prepared.append((tr, tr._prepare(
                    token_ids[pos:pos + r],
                    None if texts is None else texts[pos:pos + r],
                    g,
                    f"slot {s}: ",
                )))
            except (StoplineValueError, StoplineTypeError, SequenceFinishedError) as e:
                _at_slot(e, s, pos)
                raise
            pos += r
        return [tr._apply(*args) for tr, args in prepared]
