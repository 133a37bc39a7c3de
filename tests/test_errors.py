"""The input-validation matrix: every public entry point, every way its input
can be wrong, and what it gets.

``ROWS`` below is the single source of the matrix. Each row is one test
(``test_row``) and one line of the table in ``docs/errors.md``; that table is
generated from ``ROWS`` (``python tests/test_errors.py --write``) and
``test_doc_table_is_generated_from_rows`` fails when the two differ.

A row either expects an exception (its type, and a piece of text that the
message, or one of the notes PyO3 attaches naming the argument, must contain)
or expects the input to be accepted, with a check of the result. Enormous
inputs (100,000 stop strings, a 10 MB delta, a million-token run) are accepted
rows: they must give the right answer; how long they take is not asserted
(the matcher is linear, so they finish in well under a second or two).

Rows with ``bug`` set state the behaviour stopline should have and are known
not to have it yet; they run as strict xfails, so fixing the bug turns them
into failures until the row loses its ``bug``. Each is described, with a
reproduction, in docs/errors.md.
"""

from __future__ import annotations

import itertools
import json
import math
import os
import pickle
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any, Callable, Optional

import pytest
import stopline
from hypothesis import given, settings
from hypothesis import strategies as st
from stopline import baseline, compat

from conftest import IMPLS

DOC = Path(__file__).resolve().parent.parent / "docs" / "errors.md"
BEGIN = "<!-- BEGIN MATRIX: generated from tests/test_errors.py ROWS by `python tests/test_errors.py --write` -->"
END = "<!-- END MATRIX -->"

SS = stopline.StopStrings
SP = stopline.StopParams
FT = stopline.FinishTracker
FB = stopline.FinishBatch

BIG = 10_000_000  # code points in an "enormous" text
MANY = stopline.LIMITS["max_stop_strings"]  # stop strings in an "enormous" list (the cap)


@dataclass(frozen=True)
class Row:
    entry: str  # the public entry point
    case: str  # what is wrong with the input
    call: Callable[[], Any]
    raises: Optional[type]  # the exception, or None when the input is accepted
    says: str  # text the message (or a PyO3 argument note) contains; for accepted rows, what the result is
    check: Optional[Callable[[Any], bool]] = None  # accepted rows: the result check
    bug: Optional[str] = None  # a known defect: the row runs as a strict xfail

    @property
    def id(self) -> str:
        return f"{self.entry}: {self.case}"


# ------------------------------------------------------------------ helpers --


def _word_tokenizer() -> Any:
    tokenizers = pytest.importorskip("tokenizers")  # not in the free-threaded job
    return tokenizers.Tokenizer(tokenizers.models.WordLevel({"<a>": 0, "<b>": 1, "x": 2}, unk_token="x"))


def tracker(**kw: Any) -> stopline.FinishTracker:
    return FT(SP(**kw))


def finished_tracker() -> stopline.FinishTracker:
    t = tracker(max_tokens=1)
    t.update([1])
    return t


def _snap() -> bytes:
    """A running tracker's snapshot, taken with ``StopParams()``."""
    t = FT(SP())
    t.update([1, 2], ["a", "b"])
    return t.snapshot()


def _tiny_vocab() -> stopline.Vocabulary:
    return stopline.Vocabulary.from_str('{"model": {"vocab": {"a": 0, "b": 1}}}')


def batch(n: int = 4, **kw: Any) -> stopline.FinishBatch:
    b = FB(n)
    b.add(0, SP(**kw))
    return b


def finished_batch() -> stopline.FinishBatch:
    b = batch(max_tokens=1)
    b.step([0], [1])
    return b


def step_is_atomic() -> tuple[list[int], list[int]]:
    """A step rejected on its third slot leaves the first two untouched."""
    b = batch()
    b.add(1, SP())
    with pytest.raises(ValueError):
        b.step([1, 0, 3], [5, 6, 7])
    return b.token_ids(0), b.token_ids(1)


def failing_source() -> Any:
    """An iterable that yields one stop string, then raises: the caller's
    exception must come through unchanged."""
    yield "a"
    raise LookupError("the caller's source failed")


class RaisingKeys(dict):  # type: ignore[type-arg]
    """A mapping whose ``keys()`` fails: the failure must come through."""

    def keys(self) -> Any:
        raise LookupError("the caller's keys() failed")


def many_stops() -> list[str]:
    return [f"stop-{i:06d}|" for i in range(MANY)]


def in_subprocess(code: str) -> subprocess.CompletedProcess:
    """Runs ``code`` in a fresh interpreter: a crash there cannot take pytest down."""
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True, text=True, timeout=120,
    )


def raises_in_subprocess(expr: str) -> str:
    """The exception class that ``expr`` raises in a fresh interpreter, the
    built-in for stopline's own subclasses (or how the interpreter died)."""
    r = in_subprocess(f"""
        import stopline
        try:
            {expr}
        except BaseException as e:
            print(next(c for c in type(e).__mro__ if c.__module__ == "builtins").__name__, e)
        else:
            print("OK")
    """)
    if r.returncode != 0:
        return f"process died with exit status {r.returncode}: {r.stderr.strip().splitlines()[-1:]}"
    return r.stdout.strip()


def lc(max_slots: int = 4, vocab_size: int = 100) -> Any:
    from stopline.logits import LogitsConstraints

    return LogitsConstraints(max_slots, vocab_size)


def LC() -> Any:
    from stopline.logits import LogitsConstraints

    return LogitsConstraints


def _frozen() -> Any:
    c = lc()
    c.freeze()
    return c


def _check_request() -> Any:
    from stopline.logits import check_request

    return check_request


def _frozen_unforced() -> Any:
    c = LC()(4, 100, reserve={"forced_token": False})
    c.freeze()
    return c


def logits(rows: int = 2, vocab: int = 100, **kw: Any) -> Any:
    import torch

    return torch.zeros(rows, vocab, **kw)


def tensor(*shape: int, dtype: str = "float32") -> Any:
    import torch

    return torch.zeros(*shape, dtype=getattr(torch, dtype))


HUGE_INT = 2**70  # larger than any machine integer


# --------------------------------------------------------------------- rows --

ROWS: list[Row] = [
    # StopStrings(stops)
    Row("StopStrings", "stops is a bare str", lambda: SS("ab"), TypeError,
        "stop must be a sequence of str, not a single str"),
    Row("StopStrings", "stops is not iterable (int)", lambda: SS(5), TypeError, "stop",
        ),
    Row("StopStrings", "stops is None", lambda: SS(None), TypeError, "stop",
        ),
    Row("StopStrings", "an entry is not a str", lambda: SS(["a", 1]), TypeError,
        "stop[1] must be str, got int"),
    Row("StopStrings", "an entry is bytes", lambda: SS([b"a"]), TypeError,
        "stop[0] must be str, got bytes"),
    Row("StopStrings", "stops is bytes (iterates ints)", lambda: SS(b"ab"), TypeError,
        "stop[0] must be str, got int"),
    Row("StopStrings", "an entry is empty", lambda: SS(["a", ""]), ValueError,
        "stop[1] is an empty string"),
    Row("StopStrings", "an entry has a lone surrogate", lambda: SS(["a", "\ud800"]), ValueError,
        "stop[1] is not valid Unicode (it contains a lone surrogate)"),
    Row("StopStrings", "the iterable raises midway", lambda: SS(failing_source()), LookupError,
        "the caller's source failed"),
    Row("StopStrings", "enormous: 1,024 stop strings (the cap)", lambda: SS(many_stops()), None,
        "accepted; len() == 1,024 and the last string matches",
        check=lambda s: len(s) == MANY and s.matcher().feed("xx stop-001023|").index == MANY - 1),
    Row("StopStrings", "over the cap: 1,025 stop strings", lambda: SS(many_stops() + ["x"]), ValueError,
        "stop has 1025 entries; at most 1024 are accepted"),
    Row("StopStrings", "over the cap: range(2**40)", lambda: SS(range(2**40)), ValueError,
        "stop has 1099511627776 entries; at most 1024 are accepted"),
    Row("StopStrings", "over the cap: an endless iterator", lambda: SS(itertools.repeat("a")), ValueError,
        "stop has more than 1024 entries; at most 1024 are accepted"),
    Row("StopStrings", "over the cap: one stop string of 1,000,000 code points",
        lambda: SS(["é" * 1_000_000]), ValueError,
        "stop totals more than 65536 UTF-8 bytes; at most 65536 are accepted"),
    Row("StopStrings", "enormous: one stop string of 32,768 code points (64 KiB, the cap)",
        lambda: SS(["é" * 32_768]).matcher().feed("é" * 40_000), None,
        "accepted; matches at [0, 32,768)",
        check=lambda m: (m.start, m.end) == (0, 32_768)),
    Row("StopStrings.matcher", "include_in_output is not a bool", lambda: SS(["a"]).matcher("yes"),
        TypeError, "include_in_output"),
    Row("StopStrings.check", "output_text is not a str", lambda: SS(["a"]).check(5, 0), TypeError,
        "output_text must be str, got int"),
    Row("StopStrings.check", "output_text has a lone surrogate", lambda: SS(["a"]).check("a\udc00", 1),
        ValueError, "output_text is not valid Unicode"),
    Row("StopStrings.check", "new_char_count < 0", lambda: SS(["a"]).check("ab", -1), ValueError,
        "new_char_count=-1 is outside [0, 2]"),
    Row("StopStrings.check", "new_char_count > len(output_text)", lambda: SS(["a"]).check("ab", 3),
        ValueError, "new_char_count=3 is outside [0, 2]"),
    Row("StopStrings.check", "new_char_count is a float", lambda: SS(["a"]).check("ab", 1.0), TypeError,
        "new_char_count"),
    Row("StopStrings.check", "new_char_count is NaN", lambda: SS(["a"]).check("ab", math.nan), TypeError,
        "new_char_count"),
    Row("StopStrings.check", "new_char_count >= 2**63", lambda: SS(["a"]).check("ab", HUGE_INT),
        OverflowError, "new_char_count"),
    Row("StopStrings.check", "enormous: 10 MB output_text, match in the last 12",
        lambda: SS(["END"]).check("y" * BIG + "END", 12), None,
        "accepted; ('END', 10,000,000)", check=lambda r: r == ("END", BIG)),
    # StopMatcher.feed
    Row("StopMatcher.feed", "delta is not a str", lambda: SS(["a"]).matcher().feed(5), TypeError,
        "delta must be str, got int"),
    Row("StopMatcher.feed", "delta is None", lambda: SS(["a"]).matcher().feed(None), TypeError,
        "delta must be str, got NoneType"),
    Row("StopMatcher.feed", "delta is bytes", lambda: SS(["a"]).matcher().feed(b"a"), TypeError,
        "delta must be str, got bytes"),
    Row("StopMatcher.feed", "delta has a lone surrogate", lambda: SS(["a"]).matcher().feed("\udc00"),
        ValueError, "delta is not valid Unicode"),
    Row("StopMatcher.feed", "enormous: a 10 MB delta, stop at its end",
        lambda: SS(["END", "x"]).matcher().feed("日" * BIG + "END"), None,
        "accepted; match at code points [10,000,000, 10,000,003)",
        check=lambda m: (m.index, m.start, m.end) == (0, BIG, BIG + 3)),
    Row("StopMatcher.feed", "enormous: a 10 MB delta against 1,024 stop strings",
        lambda: SS(many_stops()).matcher().feed("z" * BIG + "stop-000543|"), None,
        "accepted; matches stop[543] at 10,000,000",
        check=lambda m: (m.index, m.start) == (543, BIG)),
    # check_stop_strings
    Row("check_stop_strings", "output_text is not a str", lambda: stopline.check_stop_strings(5, 0, ["a"], False),
        TypeError, "output_text must be str, got int"),
    Row("check_stop_strings", "stop is a bare str", lambda: stopline.check_stop_strings("ab", 1, "a", False),
        TypeError, "stop must be a sequence of str, not a single str"),
    Row("check_stop_strings", "stop is None", lambda: stopline.check_stop_strings("ab", 1, None, False),
        TypeError, "stop"),
    Row("check_stop_strings", "a stop string is empty", lambda: stopline.check_stop_strings("ab", 1, [""], False),
        ValueError, "stop[0] is an empty string"),
    Row("check_stop_strings", "new_char_count < 0", lambda: stopline.check_stop_strings("ab", -1, ["a"], False),
        ValueError, "new_char_count=-1 is outside [0, 2]"),
    Row("check_stop_strings", "include_in_output missing", lambda: stopline.check_stop_strings("ab", 1, ["a"]),
        TypeError, "include_in_output"),
    Row("check_stop_strings", "include_in_output is not a bool",
        lambda: stopline.check_stop_strings("ab", 1, ["a"], "x"), TypeError, "include_in_output"),
    Row("check_stop_strings", "enormous: 1,024 stop strings, 10 MB text",
        lambda: stopline.check_stop_strings("y" * BIG + "stop-000042|", 12, many_stops(), False), None,
        "accepted; ('stop-000042|', 10,000,000)", check=lambda r: r == ("stop-000042|", BIG)),
    # StopParams
    Row("StopParams", "max_tokens = 0", lambda: SP(max_tokens=0), ValueError, "max_tokens must be >= 1, got 0"),
    Row("StopParams", "max_tokens < 0", lambda: SP(max_tokens=-1), ValueError, "max_tokens must be >= 1, got -1"),
    Row("StopParams", "max_tokens is a float", lambda: SP(max_tokens=1.5), TypeError,
        "max_tokens must be an int, got float"),
    Row("StopParams", "max_tokens is NaN", lambda: SP(max_tokens=math.nan), TypeError,
        "max_tokens must be an int, got float"),
    Row("StopParams", "max_tokens is a str", lambda: SP(max_tokens="3"), TypeError,
        "max_tokens must be an int, got str"),
    Row("StopParams", "max_tokens >= 2**63", lambda: SP(max_tokens=HUGE_INT), ValueError, "max_tokens",),
    Row("StopParams", "max_tokens is a bool (an int in Python)", lambda: SP(max_tokens=True), TypeError,
        "max_tokens must be an int, got bool"),
    Row("StopParams", "an eos id is a bool", lambda: SP(eos_token_ids=[True]), TypeError,
        "eos_token_ids[0] must be an int, got bool"),
    Row("FinishTracker.update", "a token id is a bool", lambda: FT(SP()).update([5, False]), TypeError,
        "token_ids[1] must be an int, got bool"),
    Row("FinishBatch", "max_slots is a bool", lambda: FB(True), TypeError, "max_slots must be an int, got bool"),
    Row("FinishBatch.add", "slot is a bool", lambda: batch().add(True, SP()), TypeError,
        "slot must be an int, got bool"),
    Row("FinishBatch.step", "a slot is a bool", lambda: batch().step([False], [5]), TypeError,
        "slots[0] must be an int, got bool"),
    Row("StopStrings.check", "new_char_count is a bool", lambda: SS(["a"]).check("ab", True), TypeError,
        "new_char_count must be an int, got bool"),
    Row("StopParams", "min_tokens < 0", lambda: SP(min_tokens=-1), ValueError, "min_tokens must be >= 0, got -1"),
    Row("StopParams", "min_tokens > max_tokens", lambda: SP(max_tokens=2, min_tokens=3), ValueError,
        "min_tokens=3 is greater than max_tokens=2"),
    Row("StopParams", "prompt_len < 0", lambda: SP(prompt_len=-1), ValueError, "prompt_len must be >= 0, got -1"),
    Row("StopParams", "max_model_len = 0", lambda: SP(max_model_len=0), ValueError,
        "max_model_len must be >= 1, got 0"),
    Row("StopParams", "prompt_len >= max_model_len", lambda: SP(max_model_len=10, prompt_len=10), ValueError,
        "prompt_len=10 leaves no room under max_model_len=10"),
    Row("StopParams", "vocab_size = 0", lambda: SP(vocab_size=0), ValueError, "vocab_size must be >= 1, got 0"),
    Row("StopParams", "vocab_size >= 2**32", lambda: SP(vocab_size=2**33), ValueError,
        "vocab_size=8589934592 is more than the supported 4294967295"),
    Row("StopParams", "an EOS id >= vocab_size", lambda: SP(vocab_size=10, eos_token_ids=[10]), ValueError,
        "eos_token_ids[0]=10 is outside [0, vocab_size=10)"),
    Row("StopParams", "a stop token id >= vocab_size", lambda: SP(vocab_size=10, stop_token_ids=[3, 12]),
        ValueError, "stop_token_ids[1]=12 is outside [0, vocab_size=10)"),
    Row("StopParams", "a negative EOS id", lambda: SP(eos_token_ids=[-1]), ValueError,
        "eos_token_ids[0]=-1 is not a valid token id"),
    Row("StopParams", "an EOS id >= 2**32", lambda: SP(eos_token_ids=[2**32]), ValueError,
        "eos_token_ids[0]=4294967296 is not a valid token id"),
    Row("StopParams", "an EOS id >= 2**63", lambda: SP(eos_token_ids=[HUGE_INT]), ValueError,
        "eos_token_ids[0]"),
    Row("StopParams", "an EOS id is a str", lambda: SP(eos_token_ids=["a"]), TypeError,
        "eos_token_ids[0] must be an int, got str"),
    Row("StopParams", "eos_token_ids is a str", lambda: SP(eos_token_ids="12"), TypeError,
        "eos_token_ids[0] must be an int, got str"),
    Row("StopParams", "eos_token_ids is a float", lambda: SP(eos_token_ids=1.5), TypeError,
        "eos_token_ids must be a sequence of ints, got float"),
    Row("StopParams", "a stop token id is NaN", lambda: SP(stop_token_ids=[math.nan]), TypeError,
        "stop_token_ids[0] must be an int, got float"),
    Row("StopParams", "eos_token_ids is one int", lambda: SP(eos_token_ids=5), None,
        "accepted as [5]", check=lambda p: p.eos_token_ids == [5]),
    Row("StopParams", "stop is a bare str", lambda: SP(stop="x"), TypeError,
        "stop must be a sequence of str, not a single str"),
    Row("StopParams", "stop is a dict", lambda: SP(stop={"x": 1}), TypeError,
        "stop must be a sequence of str, got dict"),
    Row("StopParams", "stop_token_ids is a dict (a logit_bias)", lambda: SP(stop_token_ids={5: 1.0}), TypeError,
        "stop_token_ids must be a sequence of ints, got dict"),
    Row("StopParams", "a stop string is empty", lambda: SP(stop=[""]), ValueError, "stop[0] is an empty string"),
    Row("StopParams", "a stop string is None", lambda: SP(stop=[None]), TypeError, "stop[0] must be str, got NoneType"),
    Row("StopParams", "a stop string has a lone surrogate", lambda: SP(stop=["\udfff"]), ValueError,
        "stop[0] is not valid Unicode"),
    Row("StopParams", "ignore_eos is not a bool", lambda: SP(ignore_eos="yes"), TypeError, "ignore_eos"),
    Row("StopParams", "include_stop_str_in_output is None", lambda: SP(include_stop_str_in_output=None),
        TypeError, "include_stop_str_in_output"),
    Row("StopParams", "repetition is not a mapping", lambda: SP(repetition=5), TypeError,
        "repetition must be a mapping"),
    Row("StopParams", "repetition lacks max_pattern_size", lambda: SP(repetition={}), ValueError,
        'repetition is missing the key "max_pattern_size"'),
    Row("StopParams", "repetition has an unknown key",
        lambda: SP(repetition={"max_pattern_size": 2, "min_count": 2, "bogus": 1}), ValueError,
        "repetition has the unknown key 'bogus'"),
    Row("StopParams", "repetition max_pattern_size = 0",
        lambda: SP(repetition={"max_pattern_size": 0, "min_count": 2}), ValueError,
        'repetition["max_pattern_size"] must be >= 1, got 0'),
    Row("StopParams", "repetition min_pattern_size > max_pattern_size",
        lambda: SP(repetition={"max_pattern_size": 2, "min_pattern_size": 3, "min_count": 2}), ValueError,
        'repetition["min_pattern_size"]=3 is greater than repetition["max_pattern_size"]=2'),
    Row("StopParams", "repetition min_count < 2",
        lambda: SP(repetition={"max_pattern_size": 2, "min_count": 1}), ValueError, 'repetition["min_count"] must be >= 2, got 1'),
    Row("StopParams", "repetition value is a str",
        lambda: SP(repetition={"max_pattern_size": "2", "min_count": 2}), TypeError,
        'repetition["max_pattern_size"] must be an int, got str'),
    Row("StopParams", "an unknown keyword", lambda: SP(bogus=1), TypeError, "unexpected keyword argument 'bogus'"),
    Row("StopParams", "a positional argument", lambda: SP(3), TypeError, "positional"),
    Row("StopParams", "stop_regex is a bare str", lambda: SP(stop_regex="a+"), TypeError,
        "stop_regex must be a sequence of str, not a single str"),
    Row("StopParams", "a stop regex is not a str", lambda: SP(stop_regex=[1]), TypeError,
        "stop_regex[0] must be str, got int"),
    Row("StopParams", "a stop regex does not parse", lambda: SP(stop_regex=["("]), ValueError,
        'stop_regex[0]="(" is not a valid stop regex'),
    Row("StopParams", "a stop regex can match the empty string", lambda: SP(stop_regex=["a*"]), ValueError,
        'stop_regex[0]="a*" can match the empty string'),
    Row("StopParams", "a stop regex has a lone surrogate", lambda: SP(stop_regex=["\ud800"]), ValueError,
        "stop_regex[0] is not valid Unicode"),
    Row("StopParams", "enormous: a stop regex whose DFA is too large", lambda: SP(stop_regex=["a{100000}{1000}"]),
        ValueError, "needs an automaton larger than the"),
    Row("StopRegexes", "a regex does not parse", lambda: stopline.StopRegexes(["("]), ValueError,
        "is not a valid stop regex"),
    Row("StopRegexMatcher.feed", "delta is not a str", lambda: stopline.StopRegexes(["b+c"]).matcher().feed(5),
        TypeError, "delta must be str, got int"),
    Row("FinishTracker.update", "enormous: a 10 MB piece ending in a stop regex match",
        lambda: tracker(stop_regex=[r"E\w+D"]).update([1], ["x" * BIG + "ENDD"]), None,
        "accepted; 'stop', text cut at 10,000,000",
        check=lambda r: (r.finish_reason, r.text_len) == ("stop", BIG)),
    Row("StopParams", "enormous: 1,024 stop strings", lambda: SP(stop=many_stops()), None,
        "accepted; all 1,024 kept", check=lambda p: len(p.stop) == MANY),
    Row("StopParams", "over the cap: 65 stop regexes", lambda: SP(stop_regex=[f"x{i}" for i in range(65)]),
        ValueError, "stop_regex has 65 entries; at most 64 are accepted"),
    Row("StopParams", "over the cap: a 1 MB stop regex", lambda: SP(stop_regex=["a" * 1_000_000]),
        ValueError, "stop_regex totals more than 16384 UTF-8 bytes; at most 16384 are accepted"),
    Row("StopParams", "a 16 KB stop regex that does not parse: the message stays short",
        lambda: SP(stop_regex=["(" * 16_000]), ValueError, "... (16000 bytes in all) is not a valid stop regex",
        check=None),
    Row("StopParams", "over the cap: stop_token_ids is range(2**40)", lambda: SP(stop_token_ids=range(2**40)),
        ValueError, "stop_token_ids has 1099511627776 entries; at most 65536 are accepted"),
    Row("StopParams", "over the cap: eos_token_ids is an endless iterator",
        lambda: SP(eos_token_ids=itertools.repeat(1)), ValueError,
        "eos_token_ids has more than 65536 entries; at most 65536 are accepted"),
    Row("StopParams", "over the cap: tool_call_markers is an endless iterator",
        lambda: SP(tool_call_markers=itertools.repeat(("<a>", "</a>"))), ValueError,
        "tool_call_markers has more than 8 entries; at most 8 are accepted"),
    Row("StopParams", "a reasoning end marker that contains the start marker",
        lambda: SP(reasoning_start="<think>", reasoning_end="<think>/"), ValueError,
        'reasoning_end="<think>/" overlaps reasoning_start; the start and end markers must differ'),
    Row("StopParams", "an empty tool-call marker", lambda: SP(tool_call_markers=[("<a>", "")]), ValueError,
        'tool_call_markers[0][1]="" is an empty string'),
    Row("StopParams", "a tool-call marker id outside vocab_size",
        lambda: SP(tool_call_marker_ids=[(1, 2**31)], vocab_size=10), ValueError,
        "tool_call_marker_ids[0][1]=2147483648 is outside [0, vocab_size=10)"),
    Row("StopParams", "a tool-call marker with a lone surrogate", lambda: SP(tool_call_markers=[("\ud800", "</a>")]),
        ValueError, "tool_call_markers[0][0] is not valid Unicode"),
    Row("StopParams", "a str where a tool-call marker pair is expected", lambda: SP(tool_call_markers=["{}"]),
        TypeError, "tool_call_markers[0] must be a (start, end) pair, not a single str"),
    Row("StopParams", "a set where a tool-call marker pair is expected", lambda: SP(tool_call_markers=[{"<a>", "</a>"}]),
        TypeError, "tool_call_markers[0] must be a (start, end) pair in order (a tuple or list), got set"),
    Row("StopParams", "a tool-call marker pair of one marker", lambda: SP(tool_call_markers=[("<a>",)]),
        ValueError, "tool_call_markers[0] has 1 item; a (start, end) pair has exactly 2"),
    Row("StopParams", "over the cap: a tool-call marker of 1025 bytes", lambda: SP(tool_call_markers=[("<a>", "x" * 1025)]),
        ValueError, "is longer than max_marker_bytes=1024 UTF-8 bytes"),
    Row("StopParams", "reasoning_end is an int", lambda: SP(reasoning_end=5), TypeError,
        "reasoning_end must be str, got int"),
    Row("StopParams", "reasoning_end with a lone surrogate", lambda: SP(reasoning_end="\ud800"), ValueError,
        "reasoning_end is not valid Unicode"),
    Row("StopParams", "reasoning_end_id outside vocab_size", lambda: SP(reasoning_end_id=99, vocab_size=10),
        ValueError, "reasoning_end_id=99 is outside [0, vocab_size=10)"),
    Row("StopParams", "repetition's keys() raises", lambda: SP(repetition=RaisingKeys()), LookupError,
        "the caller's keys() failed"),
    # FinishTracker
    Row("FinishTracker", "params is not a StopParams", lambda: FT({"max_tokens": 3}), TypeError,
        "params must be a stopline.StopParams, got dict"),
    Row("FinishTracker", "skip_special_tokens is an int", lambda: FT(SP(), skip_special_tokens=1), TypeError,
        "skip_special_tokens must be a bool, got int"),
    Row("FinishTracker.update", "a token id is a str", lambda: tracker().update(["a"]), TypeError,
        "token_ids[0] must be an int, got str"),
    Row("FinishTracker.update", "token_ids is a str", lambda: tracker().update("a"), TypeError,
        "token_ids[0] must be an int, got str"),
    Row("FinishTracker.update", "token_ids is None", lambda: tracker().update(None), TypeError,
        "token_ids must be a sequence of ints, got NoneType"),
    Row("FinishTracker.update", "token_ids is a dict", lambda: tracker().update({1: "a"}), TypeError,
        "token_ids must be a sequence of ints, got dict"),
    Row("FinishTracker.update", "one token id of 2**63", lambda: tracker().update(2**63), ValueError,
        "token_ids=9223372036854775808 is out of range"),
    Row("FinishTracker.update", "grammar_terminated_at of 2**63",
        lambda: tracker().update([1], grammar_terminated_at=2**63), ValueError,
        "grammar_terminated_at=9223372036854775808 is out of range"),
    Row("FinishTracker.update", "a negative token id", lambda: tracker().update([-1]), ValueError,
        "token_ids[0]=-1 is not a valid token id"),
    Row("FinishTracker.update", "a token id >= 2**32", lambda: tracker().update([2**32]), ValueError,
        "token_ids[0]=4294967296 is not a valid token id"),
    Row("FinishTracker.update", "a token id >= 2**63", lambda: tracker().update([HUGE_INT]), ValueError,
        "token_ids[0]"),
    Row("FinishTracker.update", "a token id is a float", lambda: tracker().update([1.0]), TypeError,
        "token_ids[0] must be an int, got float"),
    Row("FinishTracker.update", "a token id is NaN", lambda: tracker().update([math.nan]), TypeError,
        "token_ids[0] must be an int, got float"),
    Row("FinishTracker.update", "a token id >= vocab_size",
        lambda: tracker(vocab_size=5).update([7]), None,
        "accepted: finish_reason 'error', the token is not kept (semantics.md 3, check 1)",
        check=lambda r: (r.finish_reason, r.num_tokens) == ("error", 0)),
    Row("FinishTracker.update", "an empty run", lambda: tracker().update([]), None,
        "accepted; nothing changes", check=lambda r: (r.finished, r.num_tokens) == (False, 0)),
    Row("FinishTracker.update", "texts shorter than token_ids", lambda: tracker().update([1, 2], ["a"]),
        ValueError, "texts has 1 pieces for 2 token ids"),
    Row("FinishTracker.update", "texts is a bare str", lambda: tracker().update([1], "a"), TypeError,
        "texts must be a sequence of str (one piece per token), not a single str"),
    Row("FinishTracker.update", "a piece is not a str", lambda: tracker().update([1], [1]), TypeError,
        "texts[0] must be str, got int"),
    Row("FinishTracker.update", "a piece has a lone surrogate", lambda: tracker().update([1], ["\ud800"]),
        ValueError, "texts[0] is not valid Unicode"),
    Row("FinishTracker.update", "texts missing with stop strings", lambda: tracker(stop=["x"]).update([1]),
        ValueError, "texts is required: this sequence has stop strings"),
    Row("FinishTracker.update", "grammar_terminated_at < 0", lambda: tracker().update([1], None, -1),
        ValueError, "grammar_terminated_at=-1 is outside the run of 1 tokens"),
    Row("FinishTracker.update", "grammar_terminated_at past the run", lambda: tracker().update([1], None, 1),
        ValueError, "=1 is outside the run of 1 tokens"),
    Row("FinishTracker.update", "grammar_terminated_at is a float", lambda: tracker().update([1], None, 1.0),
        TypeError, "grammar_terminated_at"),
    Row("FinishTracker.update", "update after finish", lambda: finished_tracker().update([2]), stopline.SequenceFinishedError,
        'the sequence already finished (finish_reason="length")'),
    Row("FinishTracker.update", "a rejected update changes nothing",
        lambda: (lambda t: (pytest.raises(ValueError, t.update, [1, 2], ["a"]), t.num_tokens)[1])(tracker()),
        None, "accepted check: num_tokens still 0", check=lambda n: n == 0),
    Row("FinishTracker.update", "enormous: a 10 MB piece ending in a stop string",
        lambda: tracker(stop=["END"]).update([1], ["a" * BIG + "END"]), None,
        "accepted; 'stop', text_len 10,000,000",
        check=lambda r: (r.finish_reason, r.text_len, len(r.text_delta)) == ("stop", BIG, BIG)),
    Row("FinishTracker.update", "enormous: a run of 1,000,000 tokens",
        lambda: tracker(stop=["END"]).update(list(range(1_000_000)), ["ab"] * 1_000_000), None,
        "accepted; 1,000,000 tokens kept, no match",
        check=lambda r: (r.finished, r.num_tokens, r.text_len) == (False, 1_000_000, 2_000_000)),
    Row("FinishTracker.update", "over the cap: token_ids is an endless iterator",
        lambda: tracker().update(itertools.repeat(1)), ValueError,
        "token_ids has more than 4194304 entries; at most 4194304 are accepted"),
    Row("FinishTracker.update", "over the cap: token_ids is range(2**40)",
        lambda: tracker().update(range(2**40)), ValueError,
        "token_ids has 1099511627776 entries; at most 4194304 are accepted"),
    Row("FinishTracker.update", "over the cap: texts is an endless iterator",
        lambda: tracker().update([1], itertools.repeat("a")), ValueError,
        "texts has more than 4194304 entries; at most 4194304 are accepted"),
    Row("FinishTracker.abort", "an argument", lambda: tracker().abort(1), TypeError, "takes no arguments"),
    Row("FinishTracker.abort", "abort after finish", lambda: finished_tracker().abort(), None,
        "accepted: a no-op, empty deltas, finish_reason stays",
        check=lambda r: (r.finish_reason, r.text_delta, r.token_ids_delta) == ("length", "", [])),
    # FinishBatch
    Row("FinishBatch", "max_slots < 0", lambda: FB(-1), ValueError, "max_slots must be >= 0, got -1"),
    Row("FinishBatch", "max_slots is a float", lambda: FB(1.5), TypeError, "max_slots"),
    Row("FinishBatch", "max_slots >= 2**63", lambda: FB(HUGE_INT), OverflowError, "max_slots"),
    Row("FinishBatch", "max_slots = 2**62 (capacity overflow)",
        lambda: raises_in_subprocess("stopline.FinishBatch(2**62)"), None,
        "ValueError naming max_slots, in a fresh interpreter",
        check=lambda out: out.startswith("ValueError") and "max_slots" in out),
    Row("FinishBatch", "max_slots = 10**12 (more memory than the machine has)",
        lambda: raises_in_subprocess("stopline.FinishBatch(10**12)"), None,
        "ValueError or MemoryError naming max_slots, in a fresh interpreter",
        check=lambda out: out.split()[:1] in (["ValueError"], ["MemoryError"]) and "max_slots" in out),
    Row("FinishBatch.add", "slot < 0", lambda: batch().add(-1, SP()), ValueError, "slot -1: is outside [0, max_slots)"),
    Row("FinishBatch.add", "slot >= max_slots", lambda: batch().add(4, SP()), ValueError,
        "slot 4: is outside [0, max_slots)"),
    Row("FinishBatch.add", "slot >= 2**63", lambda: batch().add(HUGE_INT, SP()), OverflowError, "slot"),
    Row("FinishBatch.add", "slot already taken", lambda: batch().add(0, SP()), ValueError,
        "slot 0: is already in use"),
    Row("FinishBatch.add", "slot is a str", lambda: batch().add("1", SP()), TypeError, "slot"),
    Row("FinishBatch.add", "params is None", lambda: batch().add(1, None), TypeError,
        "params must be a stopline.StopParams, got NoneType"),
    Row("FinishBatch.remove", "empty slot", lambda: batch().remove(1), ValueError, "slot 1: is empty"),
    Row("FinishBatch.remove", "slot >= max_slots", lambda: batch().remove(9), ValueError,
        "slot 9: is outside [0, max_slots)"),
    Row("FinishBatch.remove", "slot is None", lambda: batch().remove(None), TypeError, "slot"),
    Row("FinishBatch.abort", "empty slot", lambda: batch().abort(1), ValueError, "slot 1: is empty"),
    Row("FinishBatch.abort", "slot < 0", lambda: batch().abort(-3), ValueError, "slot -3: is outside [0, max_slots)"),
    Row("FinishBatch.result", "empty slot", lambda: batch().result(1), ValueError, "slot 1: is empty"),
    Row("FinishBatch.result", "slot >= max_slots", lambda: batch().result(99), ValueError,
        "slot 99: is outside [0, max_slots)"),
    Row("FinishBatch.step", "token_ids longer than the runs", lambda: batch().step([0], [1, 2]), ValueError,
        "token_ids has 2 ids for 1 tokens in the runs"),
    Row("FinishBatch.step", "an empty slot", lambda: batch().step([1], [1]), ValueError, "slot 1: is empty"),
    Row("FinishBatch.step", "a slot twice", lambda: batch().step([0, 0], [1, 2]), ValueError,
        "slot 0: appears twice in one step"),
    Row("FinishBatch.step", "a slot >= max_slots", lambda: batch().step([7], [1]), ValueError,
        "slot 7: is outside [0, max_slots)"),
    Row("FinishBatch.step", "slots is a range longer than max_slots",
        lambda: batch().step(range(10**12), [1]), ValueError,
        "slots has 1000000000000 entries; at most 4 are accepted"),
    Row("FinishBatch.step", "slots is a range past 2**63",
        lambda: batch().step(range(2**63, 2**63 + 2), [1, 1]), ValueError,
        "slots=range(9223372036854775808, 9223372036854775810) is out of range"),
    Row("FinishBatch.step", "slots is a str", lambda: batch().step("0", [1]), TypeError,
        "slots[0] must be an int, got str"),
    Row("FinishBatch.step", "a slot is None", lambda: batch().step([None], [1]), TypeError,
        "slots[0] must be an int, got NoneType"),
    Row("FinishBatch.step", "a negative token id", lambda: batch().step([0], [-1]), ValueError,
        "token_ids[0] (slot 0)=-1 is not a valid token id"),
    Row("FinishBatch.step", "a token id is a str", lambda: batch().step([0], ["a"]), TypeError,
        "token_ids[0] (slot 0) must be an int, got str"),
    Row("FinishBatch.step", "run_lengths and slots differ in length", lambda: batch().step([0], [1, 2], [1, 1]),
        ValueError, "run_lengths has 2 entries for 1 slots"),
    Row("FinishBatch.step", "run_lengths do not add up", lambda: batch().step([0], [1, 2], [3]), ValueError,
        "token_ids has 2 ids for 3 tokens in the runs"),
    Row("FinishBatch.step", "a negative run length", lambda: batch().step([0], [1, 2], [-2]), ValueError,
        "run_lengths[0] must be >= 0, got -2"),
    Row("FinishBatch.step", "a run length is a float", lambda: batch().step([0], [1], [1.0]), TypeError,
        "run_lengths[0] must be an int, got float"),
    Row("FinishBatch.step", "texts and token_ids differ in length", lambda: batch().step([0], [1], None, ["a", "b"]),
        ValueError, "texts has 2 pieces for 1 token ids"),
    Row("FinishBatch.step", "texts is a bare str", lambda: batch().step([0], [1], None, "a"), TypeError,
        "texts must be a sequence of str (one piece per token), not a single str"),
    Row("FinishBatch.step", "a piece is not a str", lambda: batch().step([0], [1], None, [1]), TypeError,
        "texts[0] (slot 0) must be str, got int"),
    Row("FinishBatch.step", "a piece has a lone surrogate", lambda: batch().step([0], [1], None, ["\udfff"]),
        ValueError, "texts[0] (slot 0) is not valid Unicode"),
    Row("FinishBatch.step", "texts missing with stop strings", lambda: batch(stop=["x"]).step([0], [1]),
        ValueError, "texts is required: this sequence has stop strings, which are matched on text (slot 0)"),
    Row("FinishBatch.step", "grammar_terminated_at and slots differ in length",
        lambda: batch().step([0], [1], None, None, [0, 0]), ValueError,
        "grammar_terminated_at has 2 entries for 1 slots"),
    Row("FinishBatch.step", "grammar_terminated_at < -1", lambda: batch().step([0], [1], None, None, [-2]),
        ValueError, "[0]=-2: use -1 for none or an index into the run (slot 0)"),
    Row("FinishBatch.step", "grammar_terminated_at past the run", lambda: batch().step([0], [1], None, None, [1]),
        ValueError, "=1 is outside the run of 1 tokens (slot 0)"),
    Row("FinishBatch.step", "a finished slot", lambda: finished_batch().step([0], [2]), stopline.SequenceFinishedError,
        'slot 0 already finished (finish_reason="length"); remove() it before stepping it again'),
    Row("FinishBatch.step", "a rejected step changes no slot", step_is_atomic, None,
        "accepted check: slots 0 and 1 still empty", check=lambda r: r == ([], [])),
    Row("FinishBatch.step", "an empty step", lambda: batch().step([], []), None,
        "accepted; zero rows", check=lambda r: len(r) == 0),
    Row("FinishBatch.step", "enormous: 100,000 slots in one step",
        lambda: (lambda b: b.step(range(100_000), [1] * 100_000))(
            (lambda b: [b.add(i, SP(max_tokens=1)) for i in range(100_000)] and b)(FB(100_000))), None,
        "accepted; 100,000 'length' finishes",
        check=lambda r: len(r) == 100_000 and set(r.finish_reasons) == {"length"}),
    Row("FinishBatch.step", "over the cap: slots is an endless iterator",
        lambda: batch().step(itertools.repeat(0), [1]), ValueError,
        "slots has more than 4 entries; at most 4 are accepted"),
    Row("FinishBatch.step", "over the cap: run_lengths is longer than max_slots",
        lambda: batch().step([0], [1], [1] * 5), ValueError,
        "run_lengths has 5 entries; at most 4 are accepted"),
    Row("FinishBatch.step", "over the cap: token_ids is an endless iterator",
        lambda: batch().step([0], itertools.repeat(1)), ValueError,
        "token_ids has more than 4194304 entries; at most 4194304 are accepted"),
    Row("FinishBatch.step", "over the cap: texts is range(2**40)",
        lambda: batch().step([0], [1], None, range(2**40)), ValueError,
        "texts has 1099511627776 entries; at most 4194304 are accepted"),
    Row("FinishBatch", "max_slots = 2**24 (the cap): no memory up front, len() O(1)",
        lambda: (lambda b: (b.add(2**20, SP()), len(b), 2**20 in b, 5 in b))(FB(2**24)), None,
        "accepted; one sequence in slot 2**20 (a 16 MiB table)", check=lambda r: r[1:] == (1, True, False)),
    # to_openai_finish_reason
    Row("to_openai_finish_reason", "an unknown reason", lambda: stopline.to_openai_finish_reason("bogus"),
        ValueError, "finish_reason=\"bogus\" is not one of 'stop', 'length', 'abort', 'error', 'repetition'"),
    Row("to_openai_finish_reason", "an empty reason", lambda: stopline.to_openai_finish_reason(""), ValueError,
        'finish_reason="" is not one of'),
    Row("to_openai_finish_reason", "reason is an int", lambda: stopline.to_openai_finish_reason(1), TypeError,
        "finish_reason"),
    Row("to_openai_finish_reason", "reason has a lone surrogate",
        lambda: stopline.to_openai_finish_reason("\ud800"), UnicodeEncodeError, "finish_reason"),
    Row("to_openai_finish_reason", "has_tool_calls is not a bool",
        lambda: stopline.to_openai_finish_reason("stop", "x"), TypeError, "has_tool_calls"),
    # stopline.compat
    Row("compat.to_vllm_status", "an unknown reason", lambda: compat.to_vllm_status("bogus"), ValueError,
        "finish_reason='bogus' is not one of"),
    Row("compat.vllm_check_stop", "output_token_ids is a str",
        lambda: compat.vllm_check_stop("abc", num_prompt_tokens=1, max_model_len=10), TypeError,
        "output_token_ids must be a sequence of ints, got str"),
    Row("compat.vllm_check_stop", "num_new_tokens > len(output_token_ids)",
        lambda: compat.vllm_check_stop([1, 2], num_prompt_tokens=1, max_model_len=10, num_new_tokens=5),
        ValueError, "num_new_tokens=5 is outside [0, 2]"),
    Row("compat.vllm_check_stop", "num_new_tokens is a float",
        lambda: compat.vllm_check_stop([1, 2], num_prompt_tokens=1, max_model_len=10, num_new_tokens=1.0),
        TypeError, "num_new_tokens must be an int, got float"),
    Row("compat.vllm_check_stop", "a negative token id",
        lambda: compat.vllm_check_stop([1, -2], num_prompt_tokens=1, max_model_len=10), ValueError,
        "output_token_ids[1]=-2 is not a valid token id"),
    Row("compat.vllm_check_stop", "num_prompt_tokens >= max_model_len",
        lambda: compat.vllm_check_stop([1, 2], num_prompt_tokens=10, max_model_len=10), ValueError,
        "num_prompt_tokens=10 leaves no room under max_model_len=10"),
    Row("compat.vllm_check_stop", "all_stop_token_ids lacks the EOS id",
        lambda: compat.vllm_check_stop([1, 2], num_prompt_tokens=1, max_model_len=10, eos_token_id=2,
                                       all_stop_token_ids=[5]), ValueError, "all_stop_token_ids lacks [2]"),
    Row("compat.vllm_check_stop", "max_model_len is NaN",
        lambda: compat.vllm_check_stop([1, 2], num_prompt_tokens=1, max_model_len=math.nan), TypeError,
        "max_model_len must be an int, got float"),
    Row("compat.vllm_check_stop_request", "a pooling request",
        lambda: compat.vllm_check_stop_request(type("R", (), {"pooling_params": object()})(), 10), ValueError,
        "this is a pooling request"),
    Row("compat.vllm_check_stop_request", "sampling_params is None",
        lambda: compat.vllm_check_stop_request(type("R", (), {"sampling_params": None})(), 10), ValueError,
        "request.sampling_params is None"),
    Row("compat.vllm_detokenizer_stop", "a piece is not a str",
        lambda: compat.vllm_detokenizer_stop([1, 2], stop=["a"]), TypeError, "texts[0] must be str, got int"),
    Row("compat.vllm_detokenizer_stop", "a stop string is empty",
        lambda: compat.vllm_detokenizer_stop(["a"], stop=[""]), ValueError, "stop[0] is an empty string"),
    Row("compat.vllm_detokenizer_stop", "a piece has a lone surrogate",
        lambda: compat.vllm_detokenizer_stop(["\ud800"], stop=["a"]), ValueError, "texts[0] is not valid Unicode"),
    Row("compat.vllm_detokenizer_stop", "num_new_tokens > len(texts)",
        lambda: compat.vllm_detokenizer_stop(["a"], stop=["a"], num_new_tokens=3), ValueError,
        "num_new_tokens=3 is outside [0, 1]"),
    Row("compat.vllm_check_stop", "output_token_ids is an int",
        lambda: compat.vllm_check_stop(5, num_prompt_tokens=1, max_model_len=10), TypeError,
        "output_token_ids must be a sequence of ints, got int"),
    Row("compat.vllm_check_stop", "an output token id is a str",
        lambda: compat.vllm_check_stop([1, "x"], num_prompt_tokens=1, max_model_len=10), TypeError,
        "output_token_ids[1] must be an int, got str"),
    Row("compat.vllm_check_stop", "stop_token_ids is an int",
        lambda: compat.vllm_check_stop([1], num_prompt_tokens=1, max_model_len=10, stop_token_ids=3), TypeError,
        "stop_token_ids must be a sequence of ints, got int"),
    Row("compat.vllm_check_stop", "output_token_ids is an endless iterator",
        lambda: compat.vllm_check_stop(itertools.repeat(1), num_prompt_tokens=1, max_model_len=10), ValueError,
        "output_token_ids has more than 4194304 entries; at most 4194304 are accepted"),
    Row("compat.vllm_check_stop", "a repetition size is a str",
        lambda: compat.vllm_check_stop([1], num_prompt_tokens=1, max_model_len=10,
                                       repetition_detection={"max_pattern_size": "8"}), TypeError,
        "repetition_detection.max_pattern_size must be an int, got str"),
    Row("compat.vllm_detokenizer_stop", "texts is an int",
        lambda: compat.vllm_detokenizer_stop(5, stop=["a"]), TypeError,
        "texts must be a sequence of str (one piece per token), got int"),
    Row("compat.vllm_detokenizer_stop", "stop is an int",
        lambda: compat.vllm_detokenizer_stop(["a"], stop=5), TypeError,
        "stop must be a str or a sequence of str, got int"),
    Row("compat.reasoning_config", "not a mapping",
        lambda: compat.reasoning_config(["<think>"]), TypeError, "reasoning must be a mapping"),
    Row("compat.reasoning_config", "no end marker",
        lambda: compat.reasoning_config({"reasoning_start": "<think>"}), ValueError, "reasoning_end is required"),
    Row("compat.reasoning_config", "an unknown key",
        lambda: compat.reasoning_config({"reasoning_end_id": 6, "stop": ["x"]}), ValueError,
        "reasoning has unknown keys ['stop']"),
    Row("compat.vllm_reasoning", "a multi-token marker without a tokenizer",
        lambda: compat.vllm_reasoning(type("C", (), {"enabled": True, "reasoning_start_token_ids": [5],
                                                     "natural_reasoning_end_token_ids": [6, 7],
                                                     "reasoning_end_token_ids": [6, 7]})()), ValueError,
        "reasoning_config.natural_reasoning_end_token_ids=[6, 7] is several tokens"),
    Row("compat.vllm_reasoning", "reasoning_parser is not a str",
        lambda: compat.vllm_reasoning(reasoning_parser=3, tokenizer=object()), TypeError,
        "reasoning_parser must be a str"),
    Row("compat.reasoning_config", "a marker of the wrong type",
        lambda: compat.reasoning_config({"reasoning_end": 5}), TypeError, "reasoning_end must be str, got int"),
    Row("compat.vllm_reasoning", "a parser name given as vllm_config",
        lambda: compat.vllm_reasoning("qwen3"), TypeError, "vllm_config must be a vLLM VllmConfig or ReasoningConfig"),
    Row("compat.vllm_reasoning", "a config id outside the tokenizer",
        lambda: compat.vllm_reasoning(type("C", (), {"enabled": True, "reasoning_start_token_ids": [0],
                                                     "natural_reasoning_end_token_ids": [50]})(),
                                      tokenizer=_word_tokenizer()), ValueError,
        "reasoning_config.natural_reasoning_end_token_ids=[50]: the id 50 is outside the tokenizer's 3 ids"),
    Row("compat.vllm_check_stop", "reasoning is a parser name",
        lambda: compat.vllm_check_stop([1], num_prompt_tokens=1, max_model_len=10, reasoning="qwen3"), TypeError,
        "reasoning must be a mapping of StopParams reasoning keywords, a Reasoning or None, got str"),
    Row("compat.vllm_check_stop", "thinking_token_budget over 64 bits",
        lambda: compat.vllm_check_stop([1], num_prompt_tokens=1, max_model_len=10, thinking_token_budget=2**70,
                                       reasoning={"reasoning_end_id": 6}), ValueError,
        "thinking_token_budget=1180591620717411303424 is out of range"),
    Row("compat.vllm_check_stop", "thinking_token_budget without reasoning markers",
        lambda: compat.vllm_check_stop([1], num_prompt_tokens=1, max_model_len=10, thinking_token_budget=4),
        ValueError, "thinking_token_budget=4 needs reasoning markers"),
    Row("compat.sglang_reasoning", "reasoning_parser is not a str",
        lambda: compat.sglang_reasoning(None, object()), TypeError, "reasoning_parser must be a str"),
    Row("compat.sglang_check_finished", "an output id is a str",
        lambda: compat.sglang_check_finished([1, "x"], max_new_tokens=5), TypeError,
        "output_ids[1] must be an int, got str"),
    Row("compat.sglang_check_finished", "output_texts is range(2**40)",
        lambda: compat.sglang_check_finished([1], max_new_tokens=5, output_texts=range(2**40)), ValueError,
        "output_texts has 1099511627776 entries; at most 4194304 are accepted"),
    Row("compat.sglang_check_finished", "output_texts and output_ids differ in length",
        lambda: compat.sglang_check_finished([1, 2], max_new_tokens=5, output_texts=["a"]), ValueError,
        "output_texts has 1 pieces for 2 output ids"),
    Row("compat.sglang_check_finished", "stop_strs without output_texts",
        lambda: compat.sglang_check_finished([1, 2], max_new_tokens=5, stop_strs=["a"]), ValueError,
        "texts is required"),
    Row("compat.sglang_check_finished", "max_new_tokens < 0",
        lambda: compat.sglang_check_finished([1, 2], max_new_tokens=-1), ValueError,
        "max_new_tokens must be >= 0, got -1"),
    Row("compat.sglang_check_finished", "new_accepted_len < 0",
        lambda: compat.sglang_check_finished([1, 2], max_new_tokens=5, new_accepted_len=-1), ValueError,
        "new_accepted_len=-1 is outside [0, 2]"),
    Row("compat.to_sglang_finish_reason", "'repetition' (SGLang has none)",
        lambda: compat.to_sglang_finish_reason("repetition"), ValueError, "SGLang has no finish reason for repetition"),
    Row("compat.to_sglang_finish_reason", "an unknown reason", lambda: compat.to_sglang_finish_reason("bogus"),
        ValueError, "finish_reason='bogus' is not one of"),
    Row("compat.to_sglang_finish_reason", "'stop' without matched", lambda: compat.to_sglang_finish_reason("stop"),
        ValueError, "a 'stop' finish needs matched"),
    Row("compat.SglangFinishReason", "an unknown kind", lambda: compat.SglangFinishReason(kind="X", type="stop"),
        ValueError, "kind='X' is not one of"),
    # stopline.logits.LogitsConstraints
    Row("LogitsConstraints", "max_slots = 0", lambda: lc(0), ValueError, "max_slots must be positive, got 0"),
    Row("LogitsConstraints", "vocab_size is a str", lambda: lc(4, "a"), TypeError, "vocab_size must be an int"),
    Row("LogitsConstraints", "vocab_size >= 2**31", lambda: lc(4, 2**31), ValueError,
        "vocab_size 2147483648 does not fit int32 token ids"),
    Row("LogitsConstraints.set", "slot >= max_slots", lambda: lc().set(4), ValueError,
        "slot 4 is outside [0, max_slots=4)"),
    Row("LogitsConstraints.set", "slot is a float", lambda: lc().set(1.0), TypeError, "slot must be an int, got 1.0"),
    Row("LogitsConstraints.set", "slot is a bool", lambda: lc().set(True), TypeError, "slot must be an int, got True"),
    Row("LogitsConstraints.set", "min_tokens < 0", lambda: lc().set(0, min_tokens=-1), ValueError,
        "min_tokens must be >= 0, got -1"),
    Row("LogitsConstraints.set", "min_tokens >= 2**31", lambda: lc().set(0, min_tokens=2**31), ValueError,
        "min_tokens 2147483648 does not fit int32"),
    Row("LogitsConstraints.set", "an unknown restore policy", lambda: lc().set(0, restore="sometimes"), ValueError,
        "restore must be one of ['always', 'never', 'structured'], got 'sometimes'"),
    Row("LogitsConstraints.set", "a stop id >= vocab_size", lambda: lc().set(0, stop_token_ids=[100]), ValueError,
        "stop_token_ids: token id 100 is outside [0, vocab_size=100)"),
    Row("LogitsConstraints.set", "a negative stop id", lambda: lc().set(0, stop_token_ids=[-1]), ValueError,
        "stop_token_ids: token id -1 is outside [0, vocab_size=100)"),
    Row("LogitsConstraints.set", "stop_token_ids is a str", lambda: lc().set(0, stop_token_ids="a"), TypeError,
        "stop_token_ids: expected a sequence of token ids"),
    Row("LogitsConstraints.set", "a stop id is a float", lambda: lc().set(0, stop_token_ids=[1.0]), TypeError,
        "stop_token_ids: token id 1.0 is not an int"),
    Row("LogitsConstraints.set", "allowed_token_ids is empty", lambda: lc().set(0, allowed_token_ids=[]), ValueError,
        "allowed_token_ids is empty"),
    Row("LogitsConstraints.set", "an allowed id >= vocab_size", lambda: lc().set(0, allowed_token_ids=[200]),
        ValueError, "allowed_token_ids: token id 200 is outside [0, vocab_size=100)"),
    Row("LogitsConstraints.set", "an empty bad word", lambda: lc().set(0, bad_words=[[]]), ValueError,
        "bad_words: an empty word bans nothing"),
    Row("LogitsConstraints.set", "allowed_token_ids is a dict", lambda: lc().set(0, allowed_token_ids={1: 0.5}),
        TypeError, "allowed_token_ids: expected a sequence of token ids, got {1: 0.5}"),
    Row("LogitsConstraints.set", "bad_words is an int", lambda: lc().set(0, bad_words=5), TypeError,
        "bad_words: expected a sequence of token-id sequences"),
    Row("LogitsConstraints.set", "a bad-word id is a str", lambda: lc().set(0, bad_words=[[1, "x"]]), TypeError,
        "bad_words: token id 'x' is not an int"),
    Row("LogitsConstraints.set", "a NaN bias", lambda: lc().set(0, logit_bias={1: math.nan}), ValueError,
        "logit_bias: bias for token 1 is not finite in float32: nan"),
    Row("LogitsConstraints.set", "an infinite bias", lambda: lc().set(0, logit_bias={1: math.inf}), ValueError,
        "logit_bias: bias for token 1 is not finite in float32: inf"),
    Row("LogitsConstraints.set", "a bias beyond float32", lambda: lc().set(0, logit_bias={1: 1e39}), ValueError,
        "not finite in float32: 1e+39"),
    Row("LogitsConstraints.set", "a bias is a str", lambda: lc().set(0, logit_bias={1: "x"}), TypeError,
        "logit_bias: bias for token 1 is not a number: 'x'"),
    Row("LogitsConstraints.set", "a bias id twice", lambda: lc().set(0, logit_bias=[(1, 1.0), (1, 2.0)]),
        ValueError, "logit_bias: token id 1 appears twice"),
    Row("LogitsConstraints.set", "a bias id >= vocab_size", lambda: lc().set(0, logit_bias={100: 1.0}), ValueError,
        "logit_bias: token id 100 is outside [0, vocab_size=100)"),
    Row("LogitsConstraints.set", "logit_bias is not pairs", lambda: lc().set(0, logit_bias=[1, 2]), TypeError,
        "logit_bias: expected (token_id, bias) pairs, got 1"),
    Row("LogitsConstraints.set", "enormous: allowed_token_ids of 1,000,000 ids",
        lambda: (lambda c: (c.set(0, allowed_token_ids=range(0, 1_000_000, 2)), c)[1])(lc(2, 1_000_000)), None,
        "accepted; odd ids masked on apply",
        check=lambda c: (lambda x: (c.apply(x, [0], [0]), bool(x[0, 1].isinf() and x[0, 2] == 0))[1])(
            logits(1, 1_000_000))),
    Row("LogitsConstraints.apply", "logits is a list", lambda: lc().apply([[0.0] * 100] * 2, [0, 1], [0, 0]),
        TypeError, "logits must be a torch.Tensor, got list"),
    Row("LogitsConstraints.apply", "logits are int32", lambda: lc().apply(tensor(2, 100, dtype="int32"), [0, 1], [0, 0]),
        TypeError, "logits dtype must be float32, bfloat16 or float16, got torch.int32"),
    Row("LogitsConstraints.apply", "logits width != vocab_size", lambda: lc().apply(logits(2, 99), [0, 1], [0, 0]),
        ValueError, "logits must be [rows, vocab_size=100], got (2, 99)"),
    Row("LogitsConstraints.apply", "logits are 1-D", lambda: lc().apply(tensor(100), [0], [0]), ValueError,
        "logits must be [rows, vocab_size=100], got (100,)"),
    Row("LogitsConstraints.apply", "logits not contiguous in vocab", lambda: lc().apply(logits(100, 2).t(), [0, 1], [0, 0]),
        ValueError, "logits: the vocab dimension must be contiguous"),
    Row("LogitsConstraints.apply", "row_slots is a dict", lambda: lc().apply(logits(), {0: 1, 1: 1}, [0, 0]),
        TypeError, "row_slots must be an int tensor or a sequence of ints, got {0: 1, 1: 1}"),
    Row("LogitsConstraints.apply", "row_slots shorter than the rows", lambda: lc().apply(logits(), [0], [0, 0]),
        ValueError, "row_slots must have one entry per logits row (2), got 1"),
    Row("LogitsConstraints.apply", "a row slot >= max_slots", lambda: lc().apply(logits(), [0, 4], [0, 0]),
        ValueError, "row_slots: slot 4 is outside [0, max_slots=4)"),
    Row("LogitsConstraints.apply", "a negative row slot", lambda: lc().apply(logits(), [0, -1], [0, 0]),
        ValueError, "row_slots: slot -1 is outside [0, max_slots=4)"),
    Row("LogitsConstraints.apply", "a row slot is a float", lambda: lc().apply(logits(), [0, 1.0], [0, 0]),
        TypeError, "row_slots: 1.0 is not an int"),
    Row("LogitsConstraints.apply", "row_positions shorter than the rows", lambda: lc().apply(logits(), [0, 1], [0]),
        ValueError, "row_positions must have one entry per logits row (2), got 1"),
    Row("LogitsConstraints.apply", "an unknown backend", lambda: lc().apply(logits(), [0, 1], [0, 0], backend="cuda"),
        ValueError, "backend must be one of ('auto', 'torch', 'triton'), got 'cuda'"),
    Row("LogitsConstraints.apply", "bitmask is int64",
        lambda: lc().apply(logits(), [0, 1], [0, 0], bitmask=tensor(2, 4, dtype="int64")), TypeError,
        "bitmask dtype must be one of ['torch.int32'], got torch.int64"),
    Row("LogitsConstraints.apply", "bitmask has the wrong width",
        lambda: lc().apply(logits(), [0, 1], [0, 0], bitmask=tensor(2, 3, dtype="int32")), ValueError,
        "bitmask must have shape (2, 4), got (2, 3)"),
    Row("LogitsConstraints.apply", "grammar_rows is int32",
        lambda: lc().apply(logits(), [0, 1], [0, 0], grammar_rows=tensor(2, dtype="int32")), TypeError,
        "grammar_rows dtype must be one of ['torch.bool'], got torch.int32"),
    Row("LogitsConstraints.apply", "NaN logits",
        lambda: lc().apply(logits().fill_(math.nan), [0, 1], [0, 0]), None,
        "accepted; every row reported infeasible (no finite logit)",
        check=lambda inf: inf.tolist() == [True, True]),
    Row("LogitsConstraints.append_tokens", "an id >= vocab_size", lambda: lc().append_tokens(0, [100]), ValueError,
        "token_ids: token id 100 is outside [0, vocab_size=100)"),
    Row("LogitsConstraints.append_tokens", "a negative id", lambda: lc().append_tokens(0, [-1]), ValueError,
        "token_ids: token id -1 is outside [0, vocab_size=100)"),
    Row("LogitsConstraints.append_tokens", "token_ids is a str", lambda: lc().append_tokens(0, "ab"), TypeError,
        "token_ids: expected a sequence of token ids, got 'ab'"),
    Row("LogitsConstraints.append_tokens", "a 2-D tensor",
        lambda: lc().append_tokens(0, tensor(2, 2, dtype="int64")), TypeError,
        "token_ids tensor must be 1-D integer, got torch.int64 (2, 2)"),
    Row("LogitsConstraints.append_tokens", "a float tensor", lambda: lc().append_tokens(0, tensor(2)), TypeError,
        "token_ids tensor must be 1-D integer, got torch.float32 (2,)"),
    Row("LogitsConstraints.append_tokens", "slot >= max_slots", lambda: lc().append_tokens(9, [1]), ValueError,
        "slot 9 is outside [0, max_slots=4)"),
    Row("LogitsConstraints.set", "a bad-word id is a bool", lambda: lc().set(0, bad_words=[[0, True]]), TypeError,
        "bad_words: token id True is not an int"),
    Row("LogitsConstraints.set", "a bad word is a bytes", lambda: lc().set(0, bad_words=[b"ab"]), TypeError,
        "bad_words: expected a sequence of token ids, got b'ab'"),
    Row("LogitsConstraints.set", "frozen tables (a CUDA graph captured apply) too narrow",
        lambda: _frozen().set(1, stop_token_ids=list(range(5))), RuntimeError,
        "slot 1 needs 5 stop_token_ids (the tables hold 4), but the tables are frozen"),
    Row("LogitsConstraints", "reserve names an unknown table",
        lambda: LC()(4, 100, reserve={"stops": 4}), ValueError, "reserve: unknown table 'stops'"),
    Row("LogitsConstraints", "reserve over a cap",
        lambda: LC()(4, 100, reserve={"logit_bias": 2**17}), ValueError,
        "reserve['logit_bias']=131072 is outside [0, 65536]"),
    Row("pickle.dumps", "a StopMatcher, protocol 0 (refused when dumped, not when loaded)",
        lambda: pickle.dumps(SS(["a"]).matcher(), protocol=0), TypeError,
        "cannot pickle 'stopline.StopMatcher' object: it is one sequence's streaming state"),
    Row("pickle.dumps", "a StepResult, protocol 1", lambda: pickle.dumps(FT(SP()).abort(), protocol=1), TypeError,
        "cannot pickle 'stopline.StepResult' object: it is one step's result"),
    Row("pickle.dumps", "a FinishTracker that decodes with a Vocabulary",
        lambda: pickle.dumps(FT(SP(), _tiny_vocab()), protocol=4), TypeError,
        "cannot pickle 'stopline.FinishTracker' object: it decodes with a Vocabulary"),
    Row("FinishTracker.restore", "taken with other reasoning markers",
        lambda: FT.restore(SP(reasoning_end="</think>"), FT(SP(reasoning_end="</th>")).snapshot()), ValueError,
        "the snapshot was taken with other params"),
    Row("FinishTracker.restore", "data is a bytearray", lambda: FT.restore(SP(), bytearray(_snap())), TypeError,
        "data must be bytes, got bytearray"),
    Row("FinishTracker.restore", "not a snapshot", lambda: FT.restore(SP(), b"{}"), ValueError,
        "not a stopline snapshot"),
    Row("FinishTracker.restore", "a later format version", lambda: FT.restore(SP(), _snap()[:4] + b"\x02\x00"),
        ValueError, "snapshot format version 2; this stopline reads version 1"),
    Row("FinishTracker.restore", "truncated", lambda: FT.restore(SP(), _snap()[:-1]), ValueError,
        "the snapshot body is"),
    Row("FinishTracker.restore", "a byte altered", lambda: FT.restore(SP(), _snap()[:-1] + b"?"), ValueError,
        "the snapshot's checksum does not match its bytes"),
    Row("FinishTracker.restore", "taken with other params", lambda: FT.restore(SP(stop=["b"]), _snap()),
        ValueError, "the snapshot was taken with other params"),
    Row("FinishTracker.restore", "taken without a vocabulary, restored with one",
        lambda: FT.restore(SP(), _snap(), vocabulary=_tiny_vocab()), ValueError,
        "the snapshot holds no decoder"),
    Row("FinishBatch.restore", "slot in use", lambda: batch().restore(0, SP(), _snap()), ValueError,
        "slot 0: is already in use"),
    Row("FinishBatch.snapshot", "an empty slot", lambda: batch().snapshot(1), ValueError, "slot 1: is empty"),
    # The engine helpers name their callers' fields, not the core's.
    Row("compat.vllm_check_stop", "a bad id among the new ids of the history",
        lambda: compat.vllm_check_stop([1, 2, 3, -4], num_prompt_tokens=1, max_model_len=10, num_new_tokens=2),
        ValueError, "output_token_ids[3]=-4 is not a valid token id"),
    Row("compat.vllm_check_stop", "eos_token_id is negative",
        lambda: compat.vllm_check_stop([1], num_prompt_tokens=1, max_model_len=10, eos_token_id=-1), ValueError,
        "eos_token_id=-1 is not a valid token id"),
    Row("compat.vllm_detokenizer_stop", "stop_terminated is a str",
        lambda: compat.vllm_detokenizer_stop(["a"], stop=["x"], stop_terminated="no"), TypeError,
        "stop_terminated must be a bool, got str"),
    Row("compat.sglang_check_finished", "a stop id outside vocab_size, after a smaller one",
        lambda: compat.sglang_check_finished([1], max_new_tokens=4, vocab_size=10, stop_token_ids=[50, 5]),
        ValueError, "stop_token_ids[0]=50 is outside [0, vocab_size=10)"),
    Row("compat.sglang_check_finished", "max_new_tokens over 64 bits",
        lambda: compat.sglang_check_finished([1], max_new_tokens=2**70), ValueError,
        "max_new_tokens=1180591620717411303424 is out of range"),
    Row("compat.sglang_check_finished", "an empty stop string",
        lambda: compat.sglang_check_finished([1], max_new_tokens=4, stop_strs=["a", ""], output_texts=["a"]),
        ValueError, "stop_strs[1] is an empty string"),
    Row("compat.sglang_check_finished", "a stop regex that does not compile",
        lambda: compat.sglang_check_finished([1], max_new_tokens=4, stop_regex_strs=["("], output_texts=["a"]),
        ValueError, 'stop_regex_strs[0]="(" is not a valid stop regex'),
    Row("compat.sglang_check_finished", "no_stop_trim is a str",
        lambda: compat.sglang_check_finished([1], max_new_tokens=4, no_stop_trim="no"), TypeError,
        "no_stop_trim must be a bool, got str"),
    Row("compat.sglang_check_finished", "grammar_terminated is a str",
        lambda: compat.sglang_check_finished([1], max_new_tokens=4, grammar_terminated="no"), TypeError,
        "grammar_terminated must be a bool, got str"),
    Row("LogitsConstraints.force", "frozen, and reserved without forced tokens",
        lambda: _frozen_unforced().force(1, 5), RuntimeError,
        "slot 1 cannot be forced while the tables are frozen"),
    Row("logits.check_request", "vocab_size is 0",
        lambda: _check_request()(0, min_tokens=1), ValueError, "vocab_size must be an int in [1, 2147483583], got 0"),
]

_TORCH_ENTRIES = ("LogitsConstraints", "logits.")  # stopline.logits needs torch


def _describe(e: BaseException) -> str:
    """The message plus the notes PyO3 adds ("while processing 'slot'")."""
    return " ".join([str(e), *getattr(e, "__notes__", [])])


def _params() -> list[Any]:
    out = []
    for row in ROWS:
        marks = []
        if row.bug:
            marks.append(pytest.mark.xfail(strict=True, reason=row.bug))
        out.append(pytest.param(row, id=row.id, marks=marks))
    return out


# The built-ins and stopline's subclasses of them that carry field/slot/kind.
_WITH_DATA: dict[type, type] = {
    ValueError: stopline.StoplineValueError,
    TypeError: stopline.StoplineTypeError,
    RuntimeError: stopline.StoplineRuntimeError,
    MemoryError: stopline.StoplineMemoryError,
    OverflowError: stopline.StoplineOverflowError,
}


@pytest.mark.parametrize("row", _params())
def test_row(row: Row) -> None:
    if row.entry.startswith(_TORCH_ENTRIES):
        pytest.importorskip("torch")
    if row.raises is None:
        result = row.call()
        assert row.check is not None, "an accepted row needs a check"
        assert row.check(result), f"unexpected result: {result!r}"[:500]
        return
    with pytest.raises(BaseException) as info:
        row.call()
    if isinstance(info.value, pytest.skip.Exception):  # an optional package the row needs
        raise info.value
    # The exact class, or stopline's data-carrying subclass of it
    # (`StoplineValueError` for `ValueError`): another class (say
    # PanicException for ValueError) would change what an engine's `except`
    # catches.
    assert type(info.value) in (row.raises, _WITH_DATA.get(row.raises)), _describe(info.value)
    assert row.says in _describe(info.value)


def test_rows_are_distinct() -> None:
    ids = [row.id for row in ROWS]
    assert len(ids) == len(set(ids))


def test_every_public_entry_point_has_rows() -> None:
    entries = {row.entry for row in ROWS}
    wanted = {
        "StopStrings", "StopStrings.matcher", "StopStrings.check", "StopMatcher.feed",
        "check_stop_strings", "StopParams", "FinishTracker", "FinishTracker.update",
        "FinishTracker.abort", "FinishBatch", "FinishBatch.add", "FinishBatch.remove",
        "FinishBatch.step", "FinishBatch.abort", "FinishBatch.result",
        "to_openai_finish_reason", "LogitsConstraints.set", "LogitsConstraints.apply",
        "LogitsConstraints.append_tokens",
    } | {f"compat.{name}" for name in compat.__all__ if not name.endswith("Result")}
    assert wanted <= entries, sorted(wanted - entries)


# ---------------------------------------------------------------- the doc --


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def markdown_table() -> str:
    lines = [
        "| # | entry point | wrong input | raises | message contains / result | status |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for i, row in enumerate(ROWS, 1):
        raises = row.raises.__name__ if row.raises else "nothing (accepted)"
        says = f"`{_cell(row.says)}`" if row.raises else _cell(row.says)
        status = f"**known bug**: {_cell(row.bug)}" if row.bug else "ok"
        lines.append(f"| {i} | `{row.entry}` | {_cell(row.case)} | {raises} | {says} | {status} |")
    return "\n".join(lines)


def _doc_block(text: str) -> str:
    start = text.index(BEGIN) + len(BEGIN)
    return text[start:text.index(END)].strip("\n")


def test_doc_table_is_generated_from_rows() -> None:
    assert _doc_block(DOC.read_text(encoding="utf-8")) == markdown_table(), (
        "docs/errors.md is out of date: run `python tests/test_errors.py --write`"
    )


def write_doc() -> None:
    text = DOC.read_text(encoding="utf-8")
    start = text.index(BEGIN) + len(BEGIN)
    end = text.index(END)
    DOC.write_text(text[:start] + "\n" + markdown_table() + "\n" + text[end:], encoding="utf-8")


if __name__ == "__main__":
    if sys.argv[1:] == ["--write"]:
        write_doc()
        print(f"wrote {len(ROWS)} rows to {DOC}")
    else:
        print(markdown_table())


# -------------------------------------- one policy in Rust and the baseline --


@pytest.mark.parametrize("impl", [stopline, baseline], ids=["rust", "baseline"])
def test_a_finished_sequence_raises_sequence_finished_error(impl: Any) -> None:
    """Engines catch a late step by type: the same class from the core and
    the pure-Python baseline, a RuntimeError subclass."""
    assert issubclass(stopline.SequenceFinishedError, RuntimeError)
    t = impl.FinishTracker(impl.StopParams(max_tokens=1))
    t.update([1])
    with pytest.raises(stopline.SequenceFinishedError, match="already finished.*length"):
        t.update([2])
    b = impl.FinishBatch(2)
    b.add(0, impl.StopParams(max_tokens=1))
    b.step([0], [1])
    with pytest.raises(stopline.SequenceFinishedError, match="length"):
        b.step([0], [2])


@pytest.mark.parametrize("impl", [stopline, baseline], ids=["rust", "baseline"])
@pytest.mark.parametrize("call", [
    lambda m: m.StopParams(max_tokens=True),
    lambda m: m.StopParams(min_tokens=False),
    lambda m: m.StopParams(vocab_size=True),
    lambda m: m.StopParams(stop_token_ids=[3, True]),
    lambda m: m.FinishTracker(m.StopParams()).update([True]),
    lambda m: m.FinishBatch(True),
    lambda m: m.FinishBatch(2).add(True, m.StopParams()),
], ids=["max_tokens", "min_tokens", "vocab_size", "stop_token_ids", "token_ids", "max_slots", "slot"])
def test_bool_where_an_int_is_expected_is_a_type_error(impl: Any, call: Callable[[Any], Any]) -> None:
    with pytest.raises(TypeError, match="must be an int, got bool"):
        call(impl)


# ------------------------------------------------------------ Rust panics --


# `_panic_for_tests` exists only in a build with the `test-hooks` feature
# (never a release wheel); .ci/run builds one and runs these tests with
# STOPLINE_REQUIRE_TEST_HOOKS=1, which turns the skip into a failure.
_no_hooks = not hasattr(stopline._core, "_panic_for_tests")
if _no_hooks and os.environ.get("STOPLINE_REQUIRE_TEST_HOOKS") == "1":
    raise RuntimeError("STOPLINE_REQUIRE_TEST_HOOKS=1 but this build has no test hooks (--features test-hooks)")
needs_test_hooks = pytest.mark.skipif(_no_hooks, reason="a build without the test-hooks feature")


@needs_test_hooks
def test_a_rust_panic_is_a_python_exception() -> None:
    """A panic inside the binding comes out as pyo3_runtime.PanicException
    (a BaseException: stopline code must never panic on input, which is what
    the matrix above checks), and the interpreter and stopline keep working."""
    panic = stopline._core._panic_for_tests
    with pytest.raises(BaseException) as info:
        panic("test hook: deliberate panic")
    assert type(info.value).__name__ == "PanicException"
    assert "deliberate panic" in str(info.value)
    # Still usable afterwards, as often as it happens.
    for _ in range(3):
        with pytest.raises(BaseException) as again:
            panic("again")
        assert type(again.value) is type(info.value)
    assert stopline.check_stop_strings("hello world.", 1, ["."], False) == (".", 11)


@needs_test_hooks
def test_panic_in_a_fresh_interpreter_does_not_crash_it() -> None:
    r = in_subprocess("""
        import stopline._core as c
        try:
            c._panic_for_tests("boom")
        except BaseException as e:
            print(type(e).__name__)
        print("alive")
    """)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["PanicException", "alive"]


def test_release_profile_unwinds() -> None:
    """panic = "abort" would turn every panic into a process abort."""
    cargo = (Path(__file__).resolve().parent.parent / "Cargo.toml").read_text(encoding="utf-8")
    profile = cargo.split("[profile.release]", 1)[1].split("\n[", 1)[0]
    assert 'panic = "unwind"' in profile


# ------------------------------------------------- exceptions that carry data --
# An engine that steps many requests in one call needs to know which request
# a rejected step is about, without parsing the message: the exception's
# `slot`, `field` and `kind` (docs/errors.md, "Error types and messages").


def _two_live_slots(impl: Any) -> Any:
    b = impl.FinishBatch(8)
    for slot in (2, 5):
        b.add(slot, impl.StopParams(max_tokens=4, vocab_size=100))
    return b


@pytest.mark.parametrize(("case", "call", "cls", "slot", "field", "kind"), [
    ("an id of slot 5 is not an int", lambda i, b: i.batch_step(b, [2, 5], [1, "x"]),
     stopline.StoplineTypeError, 5, "token_ids[1]", "wrong_type"),
    ("a piece of slot 5 is not a str", lambda i, b: i.batch_step(b, [2, 5], [1, 2, 3], [1, 2], ["a", "b", 3]),
     stopline.StoplineTypeError, 5, "texts[2]", "wrong_type"),
    ("an id of slot 5 is negative", lambda i, b: i.batch_step(b, [2, 5], [1, -3]),
     stopline.StoplineValueError, 5, "token_ids[1]", "not_a_token_id"),
    ("slot 5's grammar_terminated_at is past its run", lambda i, b: i.batch_step(b, [2, 5], [1, 2], None, None, [-1, 1]),
     stopline.StoplineValueError, 5, "grammar_terminated_at", "outside_run"),
    ("slot 3 is empty", lambda i, b: i.batch_step(b, [2, 3], [1, 2]),
     stopline.StoplineValueError, 3, "slot", "slot"),
    ("slot 5 already finished", lambda i, b: (i.batch_step(b, [5], [1, 1, 1, 1], [4]), i.batch_step(b, [2, 5], [1, 2])),
     stopline.SequenceFinishedError, 5, None, "slot_finished"),
])
def test_a_batch_step_error_names_its_slot(impl: Any, case: str, call: Any, cls: type, slot: int,
                                           field: Optional[str], kind: str) -> None:
    """The core and the baseline raise the same class with the same data; the
    step changes no slot, so the engine aborts the one request and steps the
    rest again."""
    b = _two_live_slots(impl)
    with pytest.raises(cls) as info:
        call(impl, b)
    e = info.value
    assert (e.slot, e.field, e.kind) == (slot, field, kind), str(e)
    # What an engine does with it: abort that request, step the others.
    b.remove(e.slot) if e.slot in (2, 5) else None
    survivors = [s for s in (2, 5) if s != e.slot]
    results = impl.batch_step(b, survivors, [7] * len(survivors))
    assert [r.num_tokens for r in results] == [1] * len(survivors)


def test_a_refused_add_names_its_slot_in_the_core_and_the_baseline(impl: Any) -> None:
    b = impl.FinishBatch(8)
    with pytest.raises(stopline.StoplineTypeError) as info:
        b.add(3, "max_tokens=4")
    e = info.value
    assert (e.slot, e.field, e.kind) == (3, "params", "wrong_type")  # type: ignore[attr-defined]


class _Boom(Exception):
    pass


class _BadIndex:
    def __index__(self) -> int:
        raise _Boom("the caller's own")


def _add_vocab() -> Any:
    return stopline.Vocabulary.from_str('{"model": {"vocab": {"a": 0, "b": 1, "<t>": 2, "</t>": 3}}}')


@pytest.mark.parametrize(("case", "add", "cls", "field", "kind"), [
    ("a prompt id outside the vocabulary", lambda b: b.add(5, stopline.StopParams(), prompt_token_ids=[0, 9]),
     stopline.StoplineValueError, "prompt_token_ids[1]", "not_in_vocabulary"),
    ("a prompt id that is not an int", lambda b: b.add(5, stopline.StopParams(), prompt_token_ids=[0, "x"]),
     stopline.StoplineTypeError, "prompt_token_ids[1]", "wrong_type"),
    ("marker ids checked against the vocabulary",
     lambda b: b.add(5, stopline.StopParams(reasoning_start_id=2, reasoning_end_id=40)),
     stopline.StoplineValueError, "reasoning_end_id", "id_outside"),
    ("params that are not StopParams", lambda b: b.add(5, {"max_tokens": 4}),
     stopline.StoplineTypeError, "params", "wrong_type"),
    ("a prompt over max_decode_bytes",
     lambda b: b.add(5, stopline.StopParams(), prompt_token_ids=[0] * 1200),  # 72 MB of token text
     stopline.StoplineValueError, "prompt_token_ids", "decodes_too_long"),
    ("a slot in use", lambda b: (b.add(5, stopline.StopParams()), b.add(5, stopline.StopParams())),
     stopline.StoplineValueError, "slot", "slot"),
])
def test_every_error_of_add_names_its_slot(case: str, add: Any, cls: type, field: str, kind: str) -> None:
    """``FinishBatch.add`` errors found once the slot is read (the params,
    the prompt ids, the params against the batch's vocabulary) carried
    ``slot=None``; each names the slot now, so the engine refuses that one
    request. The slot stays empty."""
    vocab = stopline.Vocabulary.from_str(json.dumps({"model": {"vocab": {"x" * 60_000: 0, "a": 1}}}))
    b = stopline.FinishBatch(8, vocabulary=_add_vocab() if "marker" in case else vocab)
    with pytest.raises(cls) as info:
        add(b)
    e = info.value
    assert (e.slot, e.field, e.kind) == (5, field, kind), str(e)  # type: ignore[attr-defined]
    if kind != "slot":
        assert 5 not in b


def test_a_callers_own_exception_during_add_passes_unchanged() -> None:
    b = stopline.FinishBatch(8, vocabulary=_add_vocab())
    with pytest.raises(_Boom) as info:
        b.add(5, stopline.StopParams(), prompt_token_ids=[0, _BadIndex()])
    assert not hasattr(info.value, "slot")


@pytest.mark.parametrize("arg", ["slots", "token_ids", "run_lengths", "texts", "grammar_terminated_at"])
def test_a_batch_step_refuses_a_mapping_for_a_sequence(impl: Any, arg: str) -> None:
    """A dict's iteration yields its keys: the core and the baseline refuse it by name."""
    b = _two_live_slots(impl)
    args = dict(slots=[2], token_ids=[7], run_lengths=[1], texts=["x"], grammar_terminated_at=[-1])
    args[arg] = {k: 0 for k in args[arg]}
    with pytest.raises(stopline.StoplineTypeError) as info:
        impl.batch_step(b, **args)
    assert (info.value.field, info.value.kind) == (arg, "wrong_type")


def test_errors_without_a_slot_carry_field_and_kind(impl: Any) -> None:
    with pytest.raises(stopline.StoplineValueError) as info:
        impl.StopParams(min_tokens=5, max_tokens=3)
    assert (info.value.field, info.value.slot, info.value.kind) == ("min_tokens", None, "greater")
    with pytest.raises(stopline.StoplineTypeError) as info2:
        impl.StopParams(max_tokens=True)
    assert (info2.value.field, info2.value.kind) == ("max_tokens", "wrong_type")


def test_the_classes_subclass_the_builtins() -> None:
    assert issubclass(stopline.SequenceFinishedError, stopline.StoplineRuntimeError)
    for cls, base in _WITH_DATA.items():
        assert issubclass(base, cls) and base.__module__ == "stopline"
        assert (base.field, base.slot, base.kind) == (None, None, None)


def test_python_checks_render_through_the_core() -> None:
    """stopline._caps raises the core's exception, message and data."""
    from stopline._caps import capped
    with pytest.raises(stopline.StoplineValueError) as info:
        capped(range(10), "output_ids", 3)
    assert str(info.value) == "output_ids has 10 entries; at most 3 are accepted"
    assert (info.value.field, info.value.kind) == ("output_ids", "too_many")
    with pytest.raises(stopline.StoplineValueError, match="has more than 3 entries"):
        capped(itertools.count(), "output_ids", 3)
    with pytest.raises(stopline.StoplineValueError, match="kind="):
        stopline._core._problem("no_such_kind", "x")


def test_the_abort_one_slot_example_of_the_docs_runs() -> None:
    from doc_blocks import run_python_blocks

    assert run_python_blocks("docs/errors.md", "e.slot") == 1


def _both_refuse_alike(kw: dict[str, Any]) -> None:
    """The core and the baseline refuse ``StopParams(**kw)`` with the same
    class, field and kind."""
    seen = []
    for impl in (stopline, baseline):
        with pytest.raises((stopline.StoplineValueError, stopline.StoplineTypeError)) as info:
            impl.StopParams(**kw)
        seen.append((type(info.value), info.value.field, info.value.kind))
    assert seen[0] == seen[1]


@pytest.mark.parametrize("kw", [
    {"reasoning_end_id": -1}, {"reasoning_end_id": 1.5}, {"reasoning_end_id": True}, {"reasoning_end_id": 2**32},
    {"reasoning_end_id": 2**64}, {"reasoning_end_id": 99, "vocab_size": 10}, {"reasoning_end": 5},
    {"reasoning_end": "\ud800"}, {"reasoning_end": "x" * 1025}, {"reasoning_start": "x" * 1025, "reasoning_end": "y"},
    {"reasoning_end": "x", "reasoning_starts_in": 3}, {"reasoning_end": "x", "reasoning_end_ids": [2**32]},
    {"reasoning_end": "x", "max_reasoning_tokens": -1}, {"reasoning_end_id": 3, "max_reasoning_tokens": 2**64},
    {"stop_token_ids": [2**32]}, {"stop_token_ids": [2**64]},
    {"tool_call_marker_ids": [(2**64, 2)]}, {"tool_call_marker_ids": [(2**32, 2)]},
    {"tool_call_marker_ids": [(-1, 2)]}, {"tool_call_marker_ids": [(1.5, 2)]}, {"tool_call_marker_ids": ["ab"]},
    {"tool_call_markers": [("\ud800", "x")]}, {"tool_call_markers": ["{}"]}, {"tool_call_markers": [("a",)]},
    {"tool_call_markers": [("a" * 1025, "b")]}, {"tool_call_markers": [(1, "b")]},
    {"tool_call_markers": [("a", "b")] * 9},
    # Found by a differential probe: the baseline accepted (0 read as "not
    # given", a scope name unchecked for an empty list), or named another
    # field or kind.
    {"reasoning_start_id": 0}, {"max_reasoning_tokens": 0}, {"reasoning_end_id": 0, "vocab_size": 0},
    {"reasoning_start_id": 2**63}, {"reasoning_end_id": -(2**100)},
    {"reasoning_end": "x", "max_reasoning_tokens": 2**63}, {"reasoning_end": "x", "max_reasoning_tokens": -(2**100)},
    {"reasoning_end": "x", "stop_scopes": "bogus"}, {"tool_call_markers": [("<a>", "</a>")], "stop_scopes": "c"},
    {"reasoning_end": "x", "stop": ["a"], "stop_scopes": 5}, {"reasoning_end": "x", "stop": ["a"], "stop_scopes": [5]},
    {"reasoning_end": "x", "stop": ["a"], "stop_regex_scopes": "bogus"},
    {"reasoning_end": "x", "stop": ["a"], "stop_scopes": ["\ud800"]},
    {"reasoning_end": "x", "stop_token_ids": [1], "stop_token_id_scopes": "\ud800"},
    {"reasoning_end_ids": [-1]}, {"reasoning_end_ids": [1.5]}, {"reasoning_starts_in": "bogus"},
    {"reasoning_end": "x", "reasoning_end_ids": "ab"}, {"eos_token_ids": True},
    # A mapping where a sequence goes (its iteration yields the keys): refused, whatever its size
    # (a dict over a cap was "too many" in the core) and whatever kind of mapping.
    {"stop": {"a": 1}}, {"stop_regex": {"a": 1}}, {"stop_token_ids": {1: 2.0}}, {"eos_token_ids": {1: 2}},
    {"reasoning_end": "x", "reasoning_end_ids": {1: 2}}, {"reasoning_end": "x", "stop": ["a"], "stop_scopes": {}},
    {"tool_call_markers": {"<a>": "</a>"}}, {"tool_call_marker_ids": {1: 2}},
    {"tool_call_marker_ids": {(i, i + 100): 0 for i in range(9)}}, {"stop_regex": {f"x{i}": 0 for i in range(65)}},
    {"stop_token_ids": {i: 0 for i in range(5000)}}, {"stop_token_ids": MappingProxyType({5: 1.0})},
    {"tool_call_markers": MappingProxyType({"<a>": "</a>"})},
    {"tool_call_markers": [MappingProxyType({"<a>": 0, "</a>": 0})]},
    # A bool argument given as something else: named, as in the baseline.
    {"ignore_eos": 1}, {"include_stop_str_in_output": None}, {"keep_reasoning_markers": "yes", "reasoning_end": "x"},
    {"token_aligned": 0},
], ids=repr)
def test_the_baseline_refuses_reasoning_and_span_params_as_the_core_does(kw: dict[str, Any]) -> None:
    """The baseline is the differential tests' oracle: it refuses what the
    core refuses, with the same class, field and kind."""
    _both_refuse_alike(kw)


try:
    import numpy as _np

    # NumPy's bool scalars: taken by every flag, refused by every int field.
    _NP_BOOLS: list[Any] = [_np.True_, _np.False_]
except ImportError:  # not in every CI job; the flags then get no NumPy values
    _NP_BOOLS = []

# Values for each field, good and bad (alone or beside others: min_tokens
# over max_tokens, an id outside vocab_size or equal to a marker id, a span
# overlapping a stop, ...).
_FIELD_VALUES: dict[str, list[Any]] = {
    "max_tokens": [None, 1, 10, 0, -1, "x", 2**70, 1.5, True, *_NP_BOOLS[:1]],
    "min_tokens": [None, 0, 3, 20, -1, "x", 2**70],
    "prompt_len": [None, 0, 3, 200, -1, 2**70, "x"],
    "max_model_len": [None, 100, 2, 0, 2**70, "x"],
    "eos_token_ids": [None, [], [2], [2, 11], [60], [-1], ["x"], 5, 5.5, [2**70], (2,), {2: 1}, b"\x02"],
    "stop_token_ids": [None, [3], [11], [60, 3], [-1], 5, [True], [3, 3]],
    "stop": [None, ["x"], ["</think>"], ["a<think>b"], [""], [1], 5, "x", ["<tool>"]],
    "stop_regex": [None, ["y"], ["("], ["a*"], [1], "y"],
    "vocab_size": [None, 50, 12, 0, -3, "x", 2**33, 2**70, 2**32 - 1],
    "ignore_eos": [False, True, "x", None, 1, *_NP_BOOLS],
    "include_stop_str_in_output": [False, True, None, 0, *_NP_BOOLS],
    "repetition": [None, {"max_pattern_size": 3, "min_count": 2}, 5, {"a": 1}, {"max_pattern_size": 0, "min_count": 2},
                   {"max_pattern_size": 3}, {"max_pattern_size": 3, "min_pattern_size": 4, "min_count": 2},
                   {"max_pattern_size": 3, "min_count": 1}, {"max_pattern_size": 2**62, "min_count": 2**62},
                   {"max_pattern_size": 2**70, "min_count": 2}, {"max_pattern_size": -1, "min_count": 2}, {1: 2}],
    "reasoning_start": [None, "<think>", "", 5, "think", "<tool>"],
    "reasoning_end": [None, "</think>", "", 5, "<think>"],
    "reasoning_start_id": [None, 10, 11, 60, -1, "x", 2**32, 3],
    "reasoning_end_id": [None, 11, 10, 60, -1, "x", 2],
    "reasoning_end_ids": [None, [], [11], [11, 12], [60], [-1], 5, ["x"]],
    "reasoning_starts_in": [None, "reasoning", "content", "x", 5],
    "keep_reasoning_markers": [False, True, "x", *_NP_BOOLS],
    "max_reasoning_tokens": [None, 0, 5, -1, "x", 2**70],
    "stop_scopes": [None, "any", ["any"], ["x"], "x", [], 5, ["any", "any"]],
    "stop_token_id_scopes": [None, "any", ["any"], ["any", "any"], "x"],
    "token_aligned": [False, True, "x", *_NP_BOOLS],
    "tool_call_markers": [None, [], [("<tool>", "</tool>")], [("<a>", "</a>"), ("<ab>", "</b>")], [("", "x")],
                          [(1, 2)], 5, [("<tool>",)], [("<think>", "x")]],
    "tool_call_marker_ids": [None, [], [(20, 21)], [(1, 70)], [(1, 2, 3)], 5, [(3, 4)], [(20, 21), (20, 22)],
                             [(10, 21)], [(-1, 2)]],
}


@settings(max_examples=400, deadline=None)
@given(st.lists(st.sampled_from(sorted(_FIELD_VALUES)), min_size=1, max_size=8, unique=True).flatmap(
    lambda names: st.tuples(*(st.tuples(st.just(n), st.sampled_from(_FIELD_VALUES[n])) for n in names))))
def test_the_core_and_the_baseline_accept_alike_and_report_the_same_first_error(fields: tuple[Any, ...]) -> None:
    """Both check in one order (the core's: the flags, each count, the id
    lists, stops and regexes, the reasoning and span fields as read, then
    what must fit together), so a request with several bad fields gets the
    same class, field and kind from both. The baseline used to check the
    flags after the counts and the relations with the counts, refused
    ``min_tokens=None``, accepted repetition sizes past 64 bits or whose
    product overflows, and an empty ``tool_call_marker_ids`` beside markers."""
    kw = dict(fields)
    seen = []
    for impl in (stopline, baseline):
        try:
            impl.StopParams(**kw)
            seen.append(None)
        except (stopline.StoplineValueError, stopline.StoplineTypeError) as e:
            seen.append((type(e), e.field, e.kind))
    assert seen[0] == seen[1]


@pytest.mark.parametrize("name", ["max_tokens", "min_tokens", "prompt_len", "max_model_len", "vocab_size"])
def test_the_baseline_reads_counts_in_the_cores_range(name: str) -> None:
    """Counts are 64-bit ints in the core (vocab_size also at most 2**32 - 1, ids being
    u32): the baseline accepts and refuses the same values, with the same message, field
    and kind (it used to accept 2**64). A negative count that must be >= 1 says so."""
    for v in (-(2**64), -(2**63) - 1, -(2**63), -1, 0, 1, 2**32 - 1, 2**32, 2**63 - 1, 2**63, 2**64):
        seen = []
        for impl in (stopline, baseline):
            try:
                impl.StopParams(**{name: v})
                seen.append(None)
            except (stopline.StoplineValueError, stopline.StoplineTypeError) as e:
                seen.append((type(e), str(e), e.field, e.kind))
        assert seen[0] == seen[1], (v, seen)
        if v == -1 and name in ("max_tokens", "max_model_len", "vocab_size"):
            assert seen[0] is not None and f"{name} must be >= 1, got -1" in seen[0][1]
        if v >= 2**63:
            assert seen[0] is not None and seen[0][3] == "out_of_range"


@pytest.mark.parametrize("kw", [
    {"reasoning_end_id": 0}, {"reasoning_start_id": 0, "reasoning_end_id": 1, "max_reasoning_tokens": 0},
    {"reasoning_end": "x", "stop": ["a"], "stop_scopes": []},
    {"reasoning_end": "x", "stop": ["a", "b"], "stop_scopes": iter(["any", "reasoning"])},
    {"eos_token_ids": None, "stop_token_ids": None, "stop": None, "stop_regex": None},
    {"eos_token_ids": 2, "reasoning_end_id": 3, "reasoning_end_ids": 3}, {"stop_token_ids": b"\x01\x02"},
    {"tool_call_markers": [("<a>", "</a>")], "stop_scopes": "any"},
    {"tool_call_marker_ids": [(1, 2)], "reasoning_end_ids": []},
], ids=repr)
def test_the_baseline_accepts_what_the_core_accepts_with_the_same_channels(kw: dict[str, Any]) -> None:
    """An id or budget of 0 is given (the baseline read 0 as "not set" and
    built no channels), an empty scope list is the default, ``None`` and one
    int are the core's list forms; the baseline builds what the core builds."""
    def fresh() -> dict[str, Any]:
        return {k: (iter(["any", "reasoning"]) if k == "stop_scopes" and not isinstance(v, (str, list)) else v)
                for k, v in kw.items()}
    core, base = stopline.StopParams(**fresh()), baseline.StopParams(**fresh())
    assert (core.reasoning is not None) == base.has_reasoning
    assert core.eos_token_ids == list(base.eos_token_ids) and core.stop_token_ids == list(base.stop_token_ids)
    if core.reasoning is not None:
        for name in ("stop_scopes", "stop_regex_scopes", "stop_token_id_scopes", "reasoning_end_ids"):
            assert core.reasoning[name] == list(getattr(base, name)), name


@pytest.mark.parametrize("name", ["keep_reasoning_markers", "token_aligned"])
def test_the_baseline_refuses_a_non_bool_flag_as_the_core_does(name: str) -> None:
    """The baseline took ``token_aligned=1`` / ``keep_reasoning_markers=None``
    as flags; the core refuses them (a TypeError naming the argument)."""
    for v in (1, 0, None, "yes"):
        for impl in (stopline, baseline):
            with pytest.raises(TypeError) as info:
                impl.StopParams(reasoning_end="x", **{name: v})
            assert name in _describe(info.value)


class _NotABool:
    """A type whose bare name is a builtin's: messages must not call it ``bool``."""

    def __bool__(self) -> bool:
        return True


_NotABool.__name__ = _NotABool.__qualname__ = "bool"


# Every flag of the bindings, read by the one reader (`convert::flags`): a
# call that takes `value` for it, and whether the baseline has the call.
_FLAG_CALLS: list[tuple[str, Callable[[Any, Any], Any], bool]] = [
    ("ignore_eos", lambda impl, v: impl.StopParams(ignore_eos=v).ignore_eos, True),
    ("include_stop_str_in_output",
     lambda impl, v: impl.StopParams(include_stop_str_in_output=v).include_stop_str_in_output, True),
    ("keep_reasoning_markers", lambda impl, v: _keep_markers(impl.StopParams(reasoning_end="x", keep_reasoning_markers=v)),
     True),
    ("token_aligned", lambda impl, v: impl.StopParams(token_aligned=v).token_aligned, True),
    ("include_in_output", lambda impl, v: impl.check_stop_strings("xab", 2, ["a"], v), True),
    ("include_in_output", lambda impl, v: impl.matcher(["a"], v).feed("xa"), True),
    ("include_in_output", lambda impl, v: stopline.StopStrings(["a"]).check("xab", 2, v), False),
    ("include_in_output", lambda impl, v: stopline.StopRegexes(["a"]).matcher(v).feed("xa"), False),
    ("has_tool_calls", lambda impl, v: stopline.to_openai_finish_reason("stop", has_tool_calls=v), False),
    ("skip_special_tokens", lambda impl, v: _flag_vocab().decode([0, 1], skip_special_tokens=v), False),
    ("spaces_between_special_tokens", lambda impl, v: _flag_vocab().decode(
        [1, 1], skip_special_tokens=False, spaces_between_special_tokens=v), False),
    ("skip_special_tokens", lambda impl, v: _flag_vocab().decoder_for(skip_special_tokens=v).step([0, 1]), False),
    ("skip_special_tokens", lambda impl, v: stopline.FinishTracker(
        stopline.StopParams(), vocabulary=_flag_vocab(), skip_special_tokens=v).update([0, 1]).text_delta, False),
    ("spaces_between_special_tokens", lambda impl, v: _flag_batch_add(spaces_between_special_tokens=v), False),
]


def _keep_markers(p: Any) -> bool:
    """The flag as read: the core shows it in ``reasoning``, the baseline as a field."""
    if isinstance(p, stopline.StopParams):
        return bool(p.reasoning["keep_reasoning_markers"])  # type: ignore[index]
    return bool(p.keep_reasoning_markers)


def _flag_vocab() -> Any:
    return stopline.Vocabulary.from_str(
        '{"model": {"vocab": {"a": 0}}, "added_tokens": [{"id": 1, "content": "<s>", "special": true}]}')


def _flag_batch_add(**kw: Any) -> Any:
    b = stopline.FinishBatch(2, vocabulary=_flag_vocab())
    b.add(1, stopline.StopParams(), skip_special_tokens=False, **kw)
    return b.step([1], [1, 1], [2]).text_deltas


@pytest.mark.parametrize(("name", "call", "in_baseline"), _FLAG_CALLS,
                         ids=[f"{n}-{i}" for i, (n, _, _) in enumerate(_FLAG_CALLS)])
def test_every_flag_takes_numpy_bools_and_names_a_refused_type_unambiguously(
        name: str, call: Callable[[Any, Any], Any], in_baseline: bool) -> None:
    """``StopParams(ignore_eos=numpy.bool_(True))`` said "ignore_eos must be a
    bool, got bool". A NumPy bool scalar is now read as the bool it holds
    (as NumPy's ints are read as ints) by every flag, in the core and the
    baseline alike; a refused value's type is named with its module where
    its bare name is a builtin's."""
    np = pytest.importorskip("numpy")
    for impl in [IMPLS["rust"], IMPLS["baseline"]] if in_baseline else [IMPLS["rust"]]:
        for value in (True, False):
            assert call(impl, np.bool_(value)) == call(impl, value), (impl, value)
        for bad, shown in ((1, "int"), (None, "NoneType"), (_NotABool(), f"{__name__}.bool")):
            with pytest.raises(stopline.StoplineTypeError) as info:
                call(impl, bad)
            e = info.value
            assert (e.field, e.kind) == (name, "wrong_type"), (impl, e)  # type: ignore[attr-defined]
            assert f"{name} must be a bool, got {shown}" in str(e), (impl, str(e))


def test_a_numpy_bool_for_an_int_is_refused_by_its_qualified_name(impl: Any) -> None:
    np = pytest.importorskip("numpy")
    with pytest.raises(stopline.StoplineTypeError) as info:
        impl.StopParams(max_tokens=np.True_)
    assert (info.value.field, info.value.kind) == ("max_tokens", "wrong_type")  # type: ignore[attr-defined]
    assert str(info.value) == f"max_tokens must be an int, got numpy.{type(np.True_).__qualname__}"


def test_the_baseline_reads_endless_reasoning_lists_under_the_cores_caps() -> None:
    """An endless ``reasoning_end_ids`` or scope iterator grew the baseline
    until memory ran out; both refuse it after the cap (``too_many``)."""
    for kw in ({"reasoning_end_ids": lambda: itertools.repeat(3)},
               {"stop_scopes": lambda: itertools.repeat("any")}):
        seen = []
        for impl in (stopline, baseline):
            with pytest.raises(ValueError) as info:
                impl.StopParams(reasoning_end="x", **{k: f() for k, f in kw.items()})
            seen.append((info.value.field, info.value.kind))  # type: ignore[attr-defined]
        assert seen[0] == seen[1] and seen[0][1] == "too_many", seen


def test_none_span_lists_are_no_spans_in_the_core_and_the_baseline() -> None:
    for impl in (stopline, baseline):
        p = impl.StopParams(tool_call_markers=None, tool_call_marker_ids=None)
        assert list(p.tool_call_markers) == [] and list(p.tool_call_marker_ids) == []
