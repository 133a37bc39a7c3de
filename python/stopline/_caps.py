"""Reading a caller's iterable under a cap, and showing a caller's value in
an error message, shared by the Python modules. Their errors are the core's:
the same classes (``stopline.StoplineValueError``, ...), attributes and
wording, rendered by the core's message writer (``_core._problem``)."""

from __future__ import annotations

import builtins
import itertools
import numbers
import reprlib
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any, TypeVar

from stopline._core import StoplineRuntimeError, StoplineTypeError, StoplineValueError, _problem

T = TypeVar("T")
E = TypeVar("E", bound=BaseException)


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


def type_name(value: Any) -> str:
    """The type of ``value`` as an error message names it, as the core does:
    its bare name, or ``module.qualname`` where the bare name is also a
    builtin's that it is not (NumPy's bool scalar is ``numpy.bool``)."""
    t = type(value)
    if t.__module__ != "builtins" and hasattr(builtins, t.__name__):
        return f"{t.__module__}.{t.__qualname__}"
    return t.__name__


def capped(values: Iterable[Any], field_name: str, cap: int) -> list[Any]:
    """The items of ``values``, refused (``StoplineValueError``, a
    ``ValueError``, naming the field and the cap; ``kind="too_many"``) when
    ``len()`` says there are more than ``cap``, or after ``cap + 1`` items of
    an iterator without a length. Exceptions the iterable raises propagate
    unchanged."""
    sized_within(values, field_name, cap)
    out = list(itertools.islice(values, cap + 1))
    if len(out) > cap:
        raise _problem("too_many", field_name, n=None, cap=cap)
    return out


def sized_within(values: Any, field_name: str, cap: int) -> int | None:
    """``len(values)``, or None when it has no length; refused as :func:`capped`
    refuses it when that is more than ``cap`` (for callers that read a sized
    container in place instead of listing it)."""
    try:
        n = len(values)
    except OverflowError:
        n = cap + 1
    except TypeError:
        return None
    if n > cap:
        # More than a usize holds (never from a real len()): "more than cap".
        raise _problem("too_many", field_name, n=n if n < 2**64 else None, cap=cap)
    return n


# --- field checks shared by compat, the engine layer and the adapters -------
# Every Python-side validation error of a request field is built by one of
# these two functions, so the message shape and the exception type (the
# core's classes, with ``field``, ``slot`` and ``kind``) are decided in one
# place.


_CLASSES: dict[type[Exception], type[Exception]] = {
    ValueError: StoplineValueError,
    TypeError: StoplineTypeError,
    RuntimeError: StoplineRuntimeError,
}


def field_error(
    cls: type[E], field_name: str, message: str, kind: str = "invalid", slot: int | None = None
) -> E:
    """The core's class for the built-in ``cls`` (``ValueError`` gives
    ``StoplineValueError``, ...) with ``message`` as is and the attributes
    ``field``, ``slot`` and ``kind`` set: the one place a Python-side check
    builds its error."""
    exc: Any = _CLASSES[cls](message)  # type: ignore[index]
    exc.field, exc.slot, exc.kind = field_name, slot, kind
    return exc  # type: ignore[no-any-return]


def field_type_error(field_name: str, expected: str, value: Any) -> TypeError:
    """``StoplineTypeError("{field} must be {expected}, got {type}")``,
    ``kind="wrong_type"`` as the core's own type errors."""
    return field_error(
        TypeError, field_name, f"{field_name} must be {expected}, got {type_name(value)}", "wrong_type"
    )


def field_value_error(field_name: str, problem: str, kind: str = "invalid") -> ValueError:
    """``StoplineValueError`` whose message starts with the field's name;
    ``kind`` names the problem for callers that match on it."""
    return field_error(ValueError, field_name, f"{field_name}{problem}", kind)


@contextmanager
def at_slot(slot: int) -> Iterator[None]:
    """Within the block, a stopline error that names no slot gets ``slot``:
    every check of one slot's request names that slot without passing it
    down to each check."""
    try:
        yield
    except (StoplineValueError, StoplineTypeError, StoplineRuntimeError) as exc:
        if exc.slot is None:
            exc.slot = slot
        raise


def integer(value: Any, field_name: str) -> int:
    """``value`` as an int; a bool, float (NaN included), ``None`` or str is a
    TypeError naming the field."""
    if type(value) is int:
        return value
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise field_type_error(field_name, "an int", value)
    return int(value)


def token_id(value: Any, field_name: str) -> int:
    """``value`` as a token id, an int in ``[0, 2**32)``, with the core's
    errors naming the field: a TypeError for a non-int, a ValueError
    (``kind="not_a_token_id"``, or ``"out_of_range"`` past 64 bits) else."""
    v = integer(value, field_name)
    if 0 <= v < 2**32:
        return v
    if -(2**63) <= v < 2**63:
        raise _problem("not_a_token_id", field_name, value=v)
    raise _problem("out_of_range", field_name, shown=shown(v))


def flag(value: Any, field_name: str) -> bool:
    """A request's on/off field: a bool (or numpy's bool scalar, known by its
    type's module and name as the core knows it), ``None`` (off); anything
    else is a TypeError naming the field (``bool("false")`` is True, which
    turned a duck-typed request's ``ignore_eos="false"`` on)."""
    if value is None:
        return False
    if isinstance(value, bool):
        return value
    if type(value).__module__ == "numpy" and type(value).__name__ in ("bool", "bool_"):
        return bool(value)  # numpy's bool scalar, as numpy's ints are taken for ints
    raise field_type_error(field_name, "a bool", value)


def items(values: Any, field_name: str, expected: str, cap: int) -> list[Any]:
    """The items of a caller's iterable read under ``cap`` (:func:`capped`);
    a bare str/bytes, a mapping (whose iteration yields its keys) or a
    non-iterable is a TypeError naming the field."""
    if isinstance(values, (str, bytes, Mapping)) or not isinstance(values, Iterable):
        raise field_type_error(field_name, expected, values)
    return capped(values, field_name, cap)


def _plain_list(values: Any, typ: type, cap: int) -> bool:
    """Whether ``values`` is a list under ``cap`` of exactly ``typ`` (no
    subclass): the usual input, returned as is without a copy."""
    return type(values) is list and len(values) <= cap and all(type(v) is typ for v in values)


def int_items(values: Any, field_name: str, cap: int) -> list[int]:
    """A caller's iterable of token ids, read under ``cap``; an entry that is
    not an int is a TypeError naming ``field[i]``. A list of plain ints
    under the cap (a decoding step's usual input) is returned as is."""
    if _plain_list(values, int, cap):
        return values  # type: ignore[no-any-return]
    out = items(values, field_name, "a sequence of ints", cap)
    for i, v in enumerate(out):
        out[i] = integer(v, f"{field_name}[{i}]")
    return out


def str_items(values: Any, field_name: str, expected: str, cap: int) -> list[str]:
    """A caller's iterable of str, read under ``cap``; a non-str entry is a
    TypeError naming ``field[i]``. A list of str under the cap is returned
    as is."""
    if _plain_list(values, str, cap):
        return values  # type: ignore[no-any-return]
    out = items(values, field_name, expected, cap)
    for i, v in enumerate(out):
        if not isinstance(v, str):
            raise field_type_error(f"{field_name}[{i}]", "str", v)
    return out


def one_of(value: Any, field_name: str, table: Mapping[str, T]) -> T:
    """``table[value]``; anything else is a ValueError (a TypeError for a
    value that is not a str) naming the field, the value shown bounded."""
    if not isinstance(value, str):
        raise field_type_error(field_name, f"one of {_listed(table)}", value)
    try:
        return table[value]
    except KeyError:
        raise field_value_error(field_name, f"={shown(value)} is not one of {_listed(table)}", "not_one_of") from None


def _listed(table: Iterable[str]) -> str:
    return ", ".join(f"'{k}'" for k in table)


def unknown_keys(field_name: str, unknown: Iterable[Any], allowed: Iterable[str]) -> ValueError:
    """The error for a mapping with keys outside ``allowed``: the count and the
    first few unknown keys, bounded whatever the mapping's size."""
    keys = list(itertools.islice(unknown, _SHOWN_KEYS + 1))
    listed = ", ".join(shown(k) for k in keys[:_SHOWN_KEYS])
    more = ", ..." if len(keys) > _SHOWN_KEYS else ""
    return field_value_error(
        field_name, f" has unknown keys [{listed}{more}]; expected some of {sorted(allowed)}", "unknown_key"
    )


_SHOWN_KEYS = 5
