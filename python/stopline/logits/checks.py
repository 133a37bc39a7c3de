"""The checks of one ``set`` request that need no state, run by
:meth:`LogitsConstraints.set <stopline.logits.LogitsConstraints.set>` and by
:func:`check_request` (an engine's admission step), so both refuse the same
requests with the same errors.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Iterable, Mapping, Sequence
from typing import NamedTuple

import torch

from stopline import _core
from stopline._caps import capped, field_error, shown

from .limits import LIMITS, RESTORE_POLICIES


def token_id(value, field_name: str, vocab_size: int, shown_as: str | None = None) -> int:
    shown_as = shown_as or field_name
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise field_error(TypeError, field_name, f"{shown_as}: token id {shown(value)} is not an int", "id_not_int")
    value = int(value)
    if not 0 <= value < vocab_size:
        raise field_error(ValueError, field_name, f"{shown_as}: token id {value} is outside [0, vocab_size={vocab_size})", "id_outside")
    return value


def token_ids(values, field_name: str, vocab_size: int, cap: int = 1 << 22) -> list[int]:
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
    out = capped(values, field_name, cap)
    # Fast path: plain ints checked with C-level passes only (type set, min, max).
    if set(map(type, out)) <= {int} and (not out or (min(out) >= 0 and max(out) < vocab_size)):
        return out
    return [token_id(v, f"{field_name}[{i}]", vocab_size, shown_as=field_name) for i, v in enumerate(out)]


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


def dedupe(ids: Iterable[int]) -> list[int]:
    return list(dict.fromkeys(ids))


# The largest vocab_size a state takes (ids must fit int32 with room for the kernel's padding).
MAX_VOCAB = 2**31 - 65


class Request(NamedTuple):
    """A validated ``set`` request, as the device tables take it."""

    min_tokens: int
    stops: list[int]
    allowed: list[int] | None
    single: torch.Tensor
    n_multi: int
    prefix: torch.Tensor
    prefix_len: torch.Tensor
    last: torch.Tensor
    bias_ids: list[int]
    bias_vals: list[float]


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
    stops = dedupe(token_ids(stop_token_ids, "stop_token_ids", V, LIMITS["max_stop_token_ids"]))
    allowed = None
    if allowed_token_ids is not None:
        allowed = dedupe(token_ids(allowed_token_ids, "allowed_token_ids", V, LIMITS["max_allowed_token_ids"]))
        if not allowed:
            raise field_error(
                ValueError,
                "allowed_token_ids",
                "allowed_token_ids is empty: no token could ever be sampled",
                "invalid",
            )
    single, n_multi, prefix, prefix_len, last = bad_words_table(bad_words, V)
    bias_ids: list[int] = []
    bias_vals: list[float] = []
    if logit_bias is not None:
        items = logit_bias.items() if isinstance(logit_bias, Mapping) else logit_bias
        if isinstance(items, (str, bytes)) or not isinstance(items, Iterable):
            raise field_error(
                TypeError,
                "logit_bias",
                f"logit_bias: expected a mapping or (token_id, bias) pairs, got {shown(logit_bias)}",
                "wrong_type",
            )
        seen_ids: set[int] = set()
        for item in capped(items, "logit_bias", LIMITS["max_logit_bias"]):
            try:
                tid, val = item
            except (TypeError, ValueError):
                raise field_error(
                    TypeError,
                    "logit_bias",
                    f"logit_bias: expected (token_id, bias) pairs, got {shown(item)}",
                    "wrong_type",
                ) from None
            tid = token_id(tid, "logit_bias", V)
            if isinstance(val, bool) or not isinstance(val, numbers.Real):
                raise field_error(
                    TypeError,
                    f"logit_bias[{tid}]",
                    f"logit_bias: bias for token {tid} is not a number: {shown(val)}",
                    "wrong_type",
                )
            try:
                val = float(val)
            except OverflowError:
                raise field_error(
                    ValueError,
                    f"logit_bias[{tid}]",
                    f"logit_bias: bias for token {tid} is not finite in float32: {shown(val)}",
                    "invalid",
                ) from None
            if not math.isfinite(val) or not math.isfinite(float(torch.tensor(val, dtype=torch.float32))):
                raise field_error(
                    ValueError,
                    f"logit_bias[{tid}]",
                    f"logit_bias: bias for token {tid} is not finite in float32: {shown(val)}",
                    "invalid",
                )
            if tid in seen_ids:
                raise field_error(ValueError, "logit_bias", f"logit_bias: token id {tid} appears twice", "invalid")
            seen_ids.add(tid)
            bias_ids.append(tid)
            bias_vals.append(val)
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
    and the frozen-table check are ``set``'s alone.

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
