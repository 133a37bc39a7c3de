"""Reading a caller's iterable under a cap, shared by the Python modules."""

from __future__ import annotations

import itertools
from collections.abc import Iterable
from typing import Any


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
