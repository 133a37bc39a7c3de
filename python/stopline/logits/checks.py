"""The checks of one ``set`` request that need no state, run by
:meth:`LogitsConstraints.set <stopline.logits.LogitsConstraints.set>` and by
:func:`check_request` (an engine's admission step), so both refuse the same
requests with the same errors.

Each rule is written once, for one value: :func:`token_id` for an id,
:func:`_bias` for a ``logit_bias`` entry. A long list is not walked entry by
entry in Python: one ``type`` pass over it, then numpy over its values, find the
first entry a rule refuses, and the rule itself then raises for that entry, so
the error (class, field with the entry's index, kind, message) is the one an
entry-by-entry loop raises. An array is read by numpy alone. Entries of other
types than Python's and numpy's numbers (an ``IntEnum``, a user-defined
``Integral``) are checked one by one, at the cost of their own conversions.
Measured worst cases at the caps: docs/errors.md, "Caps".
"""

from __future__ import annotations

import itertools
import math
import numbers
import operator
import struct
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from operator import itemgetter
from typing import Any, NamedTuple, NoReturn

import numpy as np
import torch

from stopline import _core
from stopline._caps import capped, field_error, shown, sized_within

from .limits import LIMITS, RESTORE_POLICIES

#: The largest vocab_size a state takes (ids must fit int32 with room for the kernel's padding).
MAX_VOCAB = 2**31 - 65
#: Token ids as the checks return them: a list of ints, or an int64 array (long lists).
Ids = list[int] | np.ndarray

# A list this short is checked with Python's own passes (numpy's fixed cost is larger).
_SHORT = 256
# When numpy cannot convert a run (an int past 64 bits or past float64's range), the run
# is converted again in chunks of this size and only the failing chunk is read entry by entry.
_CHUNK = 4096
# Entry types numpy converts as the rules do (int() / float() of each): Python's int and
# float and numpy's integer and float scalars. Not numpy's timedelta64 (an Integral whose
# int() may refuse it) nor long double (its cast to float64 warns on overflow).
_INT_TYPES = frozenset({int} | {np.dtype(code).type for code in np.typecodes["AllInteger"]})
_REAL_TYPES = _INT_TYPES | {float, np.float16, np.float32, np.float64}


def token_id(value, field_name: str, vocab_size: int, shown_as: str | None = None) -> int:
    """``value`` as a token id: an int (not a bool) in ``[0, vocab_size)``, else a TypeError
    (``id_not_int``) or ValueError (``id_outside``) naming ``field_name``."""
    shown_as = shown_as or field_name
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise field_error(TypeError, field_name, f"{shown_as}: token id {shown(value)} is not an int", "id_not_int")
    value = int(value)
    if not 0 <= value < vocab_size:
        raise field_error(ValueError, field_name, f"{shown_as}: token id {value} is outside [0, vocab_size={vocab_size})", "id_outside")
    return value


def token_ids(values, field_name: str, vocab_size: int, cap: int = 1 << 22) -> Ids:
    """``values`` checked as token ids in ``[0, vocab_size)``, in order: a list, tuple, 1-D
    integer array or other iterable of ints (not ``str``, ``bytes`` or a mapping) of at most
    ``cap`` entries. Raises what :func:`token_id` raises for the first entry it refuses
    (field ``field_name[i]``), a TypeError for the container, a ValueError over ``cap``."""
    # A mapping iterates over its keys: a logit_bias passed here by mistake is refused, not read.
    if isinstance(values, (str, bytes, Mapping)) or not isinstance(values, Iterable):
        raise field_error(TypeError, field_name, f"{field_name}: expected a sequence of token ids, got {shown(values)}", "wrong_type")
    if isinstance(values, torch.Tensor) and values.dim() != 1:
        raise field_error(
            TypeError,
            field_name,
            f"{field_name}: expected a 1-D sequence of token ids, got a {values.dim()}-d tensor",
            "wrong_type",
        )
    if isinstance(values, torch.Tensor) or (type(values) is np.ndarray and values.ndim and (
            values.ndim > 1 or values.dtype.kind not in "iuO")):
        # Every entry has the first one's type (a 0-d tensor, an array row, one numpy scalar
        # type), so the rule refuses all of them or checks their values: ask it about the first.
        if sized_within(values, field_name, cap):
            token_id(values[0], f"{field_name}[0]", vocab_size, shown_as=field_name)
    if type(values) is np.ndarray and values.ndim == 1 and values.dtype.kind in "iu":
        sized_within(values, field_name, cap)
        entries: Any = values
        ids, bad = _array_ids(values, vocab_size)
    else:
        if type(values) in (list, tuple):
            sized_within(values, field_name, cap)
            entries = values
        else:
            entries = capped(values, field_name, cap)
        types = set(map(type, entries))
        if types <= {int} and len(entries) <= _SHORT and (
                not entries or (min(entries) >= 0 and max(entries) < vocab_size)):
            return list(entries)  # the usual short list (a decoding step's tokens): no numpy
        ids, bad = _scan(entries, types - _INT_TYPES, lambda lo, hi: _id_run(entries, lo, hi, vocab_size), np.int64,
                         lambda v: token_id(v, field_name, vocab_size))
    if ids is None:
        _refuse(entries, bad, field_name, vocab_size)
    return ids


def distinct(ids: Ids) -> Ids:
    """``ids`` without repeats, each where it first appears."""
    if isinstance(ids, list):
        return list(dict.fromkeys(ids))
    _, first = np.unique(ids, return_index=True)
    return ids[np.sort(first)]


def _refuse(entries: Any, i: int | None, field_name: str, vocab_size: int) -> NoReturn:
    """Raise :func:`token_id`'s error for ``entries[i]``, the first entry found refused."""
    token_id(entries[i], f"{field_name}[{i}]", vocab_size, shown_as=field_name)
    _disagree(field_name, i)


def _disagree(field_name: str, i: int | None) -> NoReturn:
    raise AssertionError(f"{field_name}[{i}] was found refused, but its rule takes it")


def _first(mask: np.ndarray) -> int | None:
    return int(mask.argmax()) if mask.any() else None


def _array_ids(ids: np.ndarray, vocab_size: int) -> tuple[np.ndarray | None, int | None]:
    """A 1-D integer array's ids as int64, or the index of the first one outside ``[0, vocab_size)``."""
    if ids.size and not (ids.min() >= 0 and ids.max() < vocab_size):
        return None, _first((ids < 0) | (ids >= vocab_size))
    return ids.astype(np.int64, copy=False), None


def _id_run(entries: Sequence[Any], lo: int, hi: int, vocab_size: int) -> tuple[np.ndarray | None, int | None]:
    """``entries[lo:hi]`` (Python or numpy ints) as int64, or the index of the first one outside
    ``[0, vocab_size)``."""
    if hi - lo <= _SHORT:
        run = entries[lo:hi]
        if all(0 <= v < vocab_size for v in run):
            return np.array(run, dtype=np.int64), None
        return None, lo + next(i for i, v in enumerate(run) if not 0 <= v < vocab_size)
    try:
        ids = np.fromiter(_run(entries, lo, hi), np.int64, hi - lo)
    except OverflowError:  # an id past 64 bits, refused: where is the first refused one?
        return None, _first_in_chunks(entries, lo, hi, np.int64, lambda a: (a < 0) | (a >= vocab_size),
                                      lambda v: not 0 <= v < vocab_size)
    checked, bad = _array_ids(ids, vocab_size)
    return checked, None if bad is None else lo + bad


def _run(entries: Sequence[Any], lo: int, hi: int) -> Iterable[Any]:
    return entries if lo == 0 and hi == len(entries) else itertools.islice(entries, lo, hi)


def _first_in_chunks(entries: Sequence[Any], lo: int, hi: int, dtype: type, refused: Callable[[np.ndarray], np.ndarray],
                     refuses: Callable[[Any], bool]) -> int:
    """The first index in ``[lo, hi)`` that ``refused`` (over converted values) or ``refuses``
    (over the entries of a chunk numpy cannot convert) marks; some index must be marked."""
    for start in range(lo, hi, _CHUNK):
        chunk = entries[start:min(start + _CHUNK, hi)]
        try:
            bad = _first(refused(np.fromiter(chunk, dtype, len(chunk))))
        except OverflowError:
            bad = next(i for i, v in enumerate(chunk) if refuses(v))
        if bad is not None:
            return start + bad
    raise AssertionError("a run numpy could not convert holds no refused entry")


def _positions(entries: Sequence[Any], types: set[type]) -> Iterator[int]:
    """The indices of the entries whose type is in ``types``, in order: per type, one C-level
    scan that goes on from its last find (the usual such entry, a float among ids, is also
    the last one needed)."""
    scans = {t: map(type, iter(entries)) for t in types}
    start = dict.fromkeys(types, 0)  # index of the entry each type's scan reads next
    nxt: dict[type, int] = {}

    def advance(t: type) -> None:
        try:
            nxt[t] = start[t] + operator.indexOf(scans[t], t)
        except ValueError:
            nxt.pop(t, None)
        else:
            start[t] = nxt[t] + 1

    for t in types:
        advance(t)
    while nxt:
        t, i = min(nxt.items(), key=itemgetter(1))
        yield i
        advance(t)


def _scan(entries: Sequence[Any], other_types: set[type], run: Callable[[int, int], tuple[Any, int | None]],
          dtype: type, rule: Callable[[Any], Any]) -> tuple[Any, int | None]:
    """``(values, None)`` when every entry passes, ``(None, i)`` for the first refused entry ``i``:
    each run of entries between those of ``other_types`` by ``run(lo, hi)`` (numpy), each entry
    of those types by ``rule`` (which returns its value or raises)."""
    n = len(entries)
    parts: list[np.ndarray] = []
    lo = 0
    for hi in itertools.chain(_positions(entries, other_types), [n]):
        if hi > lo:
            values, bad = run(lo, hi)
            if bad is not None:
                return None, bad
            parts.append(values)
        if hi == n:
            break
        try:
            parts.append(np.array([rule(entries[hi])], dtype))
        except Exception:  # noqa: BLE001 - the caller calls the rule again for its error
            return None, hi
        lo = hi + 1
    return (np.concatenate(parts) if len(parts) > 1 else parts[0] if parts else np.empty(0, dtype)), None


def bias_entries(logit_bias: Any, vocab_size: int) -> tuple[Ids, list[float] | np.ndarray]:
    """``logit_bias`` checked (``{token_id: bias}`` or ``(token_id, bias)`` pairs, at most
    ``max_logit_bias``, ids distinct): its ids and biases in order. Raises what an entry-by-entry
    loop raises for the first refused entry: the pair (:func:`_pair`), its id (:func:`token_id`,
    field ``logit_bias``), its bias (:func:`_bias`), a repeated id."""
    items = logit_bias.items() if isinstance(logit_bias, Mapping) else logit_bias
    if isinstance(items, (str, bytes)) or not isinstance(items, Iterable):
        raise field_error(
            TypeError,
            "logit_bias",
            f"logit_bias: expected a mapping or (token_id, bias) pairs, got {shown(logit_bias)}",
            "wrong_type",
        )
    entries = capped(items, "logit_bias", LIMITS["max_logit_bias"])
    n = len(entries)
    if n <= _SHORT:
        ids: list[int] = []
        biases: list[float] = []
        for item in entries:  # the rules as they read, entry by entry
            tid, val = _pair(item)
            tid = token_id(tid, "logit_bias", vocab_size)
            biases.append(_bias(val, tid))
            if tid in ids:  # at most _SHORT ids
                raise _repeated(tid)
            ids.append(tid)
        return ids, biases
    # The pairs up to the first entry that is not one (k), and why it is not.
    failure: Exception | None = None
    if set(map(type, entries)) <= {tuple, list}:
        k = _first(np.fromiter(map(len, entries), np.intp, n) != 2)
        k = n if k is None else k
        tids, vals = list(map(itemgetter(0), entries[:k])), list(map(itemgetter(1), entries[:k]))
    else:
        tids, vals = [], []
        for item in entries:
            try:
                tid, val = item
            except Exception as exc:  # noqa: BLE001 - raised below unless an earlier entry is refused
                failure = exc
                break
            tids.append(tid)
            vals.append(val)
        k = len(tids)

    def id_scan(m: int) -> tuple[Any, int | None]:
        return _scan(tids[:m], set(map(type, tids[:m])) - _INT_TYPES, lambda lo, hi: _id_run(tids, lo, hi, vocab_size),
                     np.int64, lambda v: token_id(v, "logit_bias", vocab_size))

    ids_a, bad_id = id_scan(k)
    first = k if bad_id is None else bad_id
    head = vals[:first]
    floats, bad_bias = _scan(head, set(map(type, head)) - _REAL_TYPES, lambda lo, hi: _bias_run(head, lo, hi),
                             np.float64, lambda v: _bias(v, 0))
    if bad_bias is not None:
        first = bad_bias
    if bad_id is not None or bad_bias is not None:
        ids_a, _ = id_scan(first)
    repeat = _first_repeat(ids_a[:first])
    if repeat is not None:
        first = repeat
    if first == n:
        return ids_a, floats
    if first == k:
        if failure is not None and not isinstance(failure, (TypeError, ValueError)):
            raise failure
        raise _not_a_pair(entries[k])
    tid = token_id(tids[first], "logit_bias", vocab_size)
    _bias(vals[first], tid)
    if first != repeat:
        _disagree("logit_bias", first)
    raise _repeated(tid)


def _pair(item: Any) -> tuple[Any, Any]:
    try:
        tid, val = item
    except (TypeError, ValueError):
        raise _not_a_pair(item) from None
    return tid, val


def _not_a_pair(item: Any) -> TypeError:
    return field_error(TypeError, "logit_bias", f"logit_bias: expected (token_id, bias) pairs, got {shown(item)}",
                       "wrong_type")


def _bias(value: Any, tid: int) -> float:
    """A ``logit_bias`` value as a float finite in float32, else a TypeError (not a real number)
    or ValueError naming ``logit_bias[tid]``."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise field_error(
            TypeError,
            f"logit_bias[{tid}]",
            f"logit_bias: bias for token {tid} is not a number: {shown(value)}",
            "wrong_type",
        )
    try:
        val = float(value)
    except OverflowError:
        val = math.inf  # shown as given below
    else:
        value = val
    if not math.isfinite(val) or not _fits_float32(val):
        raise field_error(
            ValueError,
            f"logit_bias[{tid}]",
            f"logit_bias: bias for token {tid} is not finite in float32: {shown(value)}",
            "invalid",
        )
    return val


def _fits_float32(x: float) -> bool:
    """Whether ``x`` rounds to a finite float32 (native ``struct`` casts as C does, as torch and numpy)."""
    return math.isfinite(struct.unpack("f", struct.pack("f", x))[0])


def _repeated(tid: int) -> ValueError:
    return field_error(ValueError, "logit_bias", f"logit_bias: token id {tid} appears twice", "invalid")


def _bias_run(vals: Sequence[Any], lo: int, hi: int) -> tuple[np.ndarray | None, int | None]:
    """``vals[lo:hi]`` (Python or numpy numbers) as float64, or the index of the first one that is
    not finite in float32 (or too large for a float at all)."""
    try:
        floats = np.fromiter(_run(vals, lo, hi), np.float64, hi - lo)
    except OverflowError:  # an int past float64's range, refused: where is the first refused one?
        return None, _first_in_chunks(vals, lo, hi, np.float64, _not_float32, _refused_bias)
    bad = _first(_not_float32(floats))
    return (floats, None) if bad is None else (None, lo + bad)


def _not_float32(floats: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):
        return ~(np.isfinite(floats) & np.isfinite(floats.astype(np.float32)))


def _refused_bias(value: Any) -> bool:
    try:
        _bias(value, 0)
    except (TypeError, ValueError):
        return True
    return False


def _first_repeat(ids: np.ndarray) -> int | None:
    """The index of the first id that an earlier one repeats."""
    if len(ids) < 2:
        return None
    _, first = np.unique(ids, return_index=True)
    if len(first) == len(ids):
        return None
    firsts = np.zeros(len(ids), dtype=bool)
    firsts[first] = True
    return _first(~firsts)


def bad_words_table(words: object, vocab_size: int) -> tuple[torch.Tensor, int, torch.Tensor, torch.Tensor, torch.Tensor]:
    """``bad_words`` validated and laid out by the core with the GIL released
    (``stopline._core._bad_words_table``): the distinct one-token words, the
    number of distinct multi-token words, their prefixes ``[multi, width]``
    padded with -1, prefix lengths and last tokens (int32 CPU tensors)."""
    if isinstance(words, (str, bytes, Mapping)) or not isinstance(words, Iterable):
        raise field_error(TypeError, "bad_words", f"bad_words: expected a sequence of token-id sequences, got {shown(words)}", "wrong_type")
    single, prefix, plen, last, width = _core._bad_words_table(
        words, vocab_size, LIMITS["max_bad_words"], LIMITS["max_bad_word_tokens"])
    n_multi = len(last) // 4
    return _int32s(single), n_multi, _int32s(prefix).view(n_multi, width), _int32s(plen), _int32s(last)


def _int32s(buf: bytearray) -> torch.Tensor:
    # torch.frombuffer refuses an empty buffer.
    return torch.frombuffer(buf, dtype=torch.int32) if buf else torch.empty(0, dtype=torch.int32)


class Request(NamedTuple):
    """A checked ``set`` request (ids in the order given: ``set`` merges repeats)."""

    min_tokens: int
    stops: Ids
    allowed: Ids | None
    single: torch.Tensor
    n_multi: int
    prefix: torch.Tensor
    prefix_len: torch.Tensor
    last: torch.Tensor
    bias_ids: Ids
    bias_vals: list[float] | np.ndarray


def checked_request(
    V: int,
    min_tokens: int,
    stop_token_ids: Sequence[int],
    allowed_token_ids: Sequence[int] | None,
    bad_words: Sequence[Sequence[int]],
    logit_bias: Mapping[int, float] | Iterable[tuple[int, float]] | None,
    restore: str,
) -> Request:
    """Every check of :meth:`LogitsConstraints.set` that needs no state, ids against ``[0, V)``."""
    if isinstance(min_tokens, bool) or not isinstance(min_tokens, numbers.Integral):
        raise field_error(TypeError, "min_tokens", f"min_tokens must be an int, got {shown(min_tokens)}", "wrong_type")
    if min_tokens < 0:
        raise field_error(ValueError, "min_tokens", f"min_tokens must be >= 0, got {min_tokens}", "below")
    if min_tokens >= 2**31:
        raise field_error(ValueError, "min_tokens", f"min_tokens {min_tokens} does not fit int32", "greater")
    if not isinstance(restore, str) or restore not in RESTORE_POLICIES:
        raise field_error(
            ValueError,
            "restore",
            f"restore must be one of {sorted(RESTORE_POLICIES)}, got {shown(restore)}",
            "not_one_of",
        )
    stops = token_ids(stop_token_ids, "stop_token_ids", V, LIMITS["max_stop_token_ids"])
    allowed = None
    if allowed_token_ids is not None:
        allowed = token_ids(allowed_token_ids, "allowed_token_ids", V, LIMITS["max_allowed_token_ids"])
        if not len(allowed):
            raise field_error(
                ValueError,
                "allowed_token_ids",
                "allowed_token_ids is empty: no token could ever be sampled",
                "invalid",
            )
    single, n_multi, prefix, prefix_len, last = bad_words_table(bad_words, V)
    bias_ids, bias_vals = ([], []) if logit_bias is None else bias_entries(logit_bias, V)
    return Request(int(min_tokens), stops, allowed, single, n_multi, prefix, prefix_len, last, bias_ids, bias_vals)


def check_request(
    vocab_size: int | None = None,
    *,
    min_tokens: int = 0,
    stop_token_ids: Sequence[int] = (),
    allowed_token_ids: Sequence[int] | None = None,
    bad_words: Sequence[Sequence[int]] = (),
    logit_bias: Mapping[int, float] | Iterable[tuple[int, float]] | None = None,
    restore: str = "structured",
) -> None:
    """Run the checks of :meth:`LogitsConstraints.set` on a request without a state
    (an engine's admission step, where no device or vocabulary is at hand).

    ``vocab_size``: ids must lie in ``[0, vocab_size)``; ``None`` checks them
    against the largest vocabulary a state supports (``2**31 - 65`` ids), so
    an id past the model's own vocabulary is refused only later, by ``set``.
    The table-size caps that depend on ``max_slots`` (``max_bad_words_table_bytes``)
    and the frozen-table check are ``set``'s alone. It holds the GIL: about 3 ms for
    4,194,304 ids in a NumPy array, a few times the cost of copying them for a
    Python list (docs/errors.md, "Caps", has the worst cases).

    Raises:
        TypeError / ValueError: as :meth:`LogitsConstraints.set`, the same
            messages, fields and kinds; a non-int ``vocab_size`` (TypeError) or one
            outside ``[1, 2**31 - 65]`` (ValueError).
    """
    V = MAX_VOCAB if vocab_size is None else vocab_size
    if isinstance(V, bool) or not isinstance(V, numbers.Integral):
        raise field_error(TypeError, "vocab_size", f"vocab_size must be an int, got {shown(V)}", "wrong_type")
    if not 0 < V <= MAX_VOCAB:
        raise field_error(ValueError, "vocab_size", f"vocab_size must be an int in [1, {MAX_VOCAB}], got {shown(V)}",
                          "out_of_range")
    checked_request(int(V), min_tokens, stop_token_ids, allowed_token_ids, bad_words, logit_bias, restore)
