"""Reading a caller's iterable under a cap, and showing a caller's value in
an error message, shared by the Python modules."""

from __future__ import annotations

import itertools
import reprlib
from collections.abc import Iterable
from typing import Any


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
    """The items of ``values``, refused (ValueError naming the field and the
    cap) when ``len()`` says there are more than ``cap``, or after ``cap + 1``
    items of an iterator without a length. Exceptions the iterable raises
    propagate unchanged."""
    try:
        n = len(values)  # type: ignore[arg-type]
    except OverflowError:
        n = cap + 1
    except TypeError:
        n = None
    if n is not None and n > cap:
        raise ValueError(f"{field_name} has {n if n <= 2**63 else 'more than 2**63'} entries; at most {cap} are accepted")
    out = list(itertools.islice(values, cap + 1))
    if len(out) > cap:
        raise ValueError(f"{field_name} has more than {cap} entries; at most {cap} are accepted")
    return out
