"""Reading a caller's iterable under a cap, and showing a caller's value in
an error message, shared by the Python modules. Their errors are the core's:
the same classes (``stopline.StoplineValueError``, ...), attributes and
wording, rendered by the core's message writer (``_core._problem``)."""

from __future__ import annotations

import itertools
import reprlib
from collections.abc import Iterable
from typing import Any

from stopline._core import _problem


_SHOWN = reprlib.Repr()  # keyword arguments only from 3.12
_SHOWN.maxlevel, _SHOWN.maxstring, _SHOWN.maxother, _SHOWN.maxlong = 2, 80, 80, 80


def shown(value: Any) -> str:
    """``repr(value)`` as an error message shows it: bounded (about 200
    characters, as the core's messages), whatever the value's size."""
    try:
        return _SHOWN.repr(value)
    except ValueError:  # an int over sys.get_int_max_str_digits()
        if isinstance(value, int):
            return f"<an int of {value.bit_length()} bits>"
        raise


def capped(values: Iterable[Any], field_name: str, cap: int) -> list[Any]:
    """The items of ``values``, refused (``StoplineValueError``, a
    ``ValueError``, naming the field and the cap; ``kind="too_many"``) when
    ``len()`` says there are more than ``cap``, or after ``cap + 1`` items of
    an iterator without a length. Exceptions the iterable raises propagate
    unchanged."""
    try:
        n = len(values)  # type: ignore[arg-type]
    except OverflowError:
        n = cap + 1
    except TypeError:
        n = None
    if n is not None and n > cap:
        # More than a usize holds (never from a real len()): "more than cap".
        raise _problem("too_many", field_name, n=n if n < 2**64 else None, cap=cap)
    out = list(itertools.islice(values, cap + 1))
    if len(out) > cap:
        raise _problem("too_many", field_name, n=None, cap=cap)
    return out
