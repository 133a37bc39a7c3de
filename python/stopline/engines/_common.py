"""What both engines' modules share: reading a request's lists under the
core's caps, and replaying a whole output history through a fresh tracker
(what the stateless helpers compute on every call)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from typing import Any, Protocol

from stopline._caps import field_value_error, int_items, integer, str_items
from stopline._core import LIMITS, FinishTracker, StopParams


def output_ids(values: Any, field_name: str) -> list[int]:
    """Output token ids of a history or a step, at most
    ``LIMITS["max_step_tokens"]``."""
    return int_items(values, field_name, LIMITS["max_step_tokens"])


def texts(values: Any, field_name: str) -> list[str]:
    """One text piece per output token, at most ``LIMITS["max_step_tokens"]``."""
    return str_items(values, field_name, "a sequence of str (one piece per token)", LIMITS["max_step_tokens"])


def token_set(values: Any, field_name: str) -> list[int]:
    """A request's EOS or stop ids (``None``: none; a set, list or any
    iterable), at most ``LIMITS["max_stop_token_ids"]``, sorted without
    duplicates."""
    if values is None:
        return []
    return sorted(set(int_items(values, field_name, LIMITS["max_stop_token_ids"])))


def stop_list(values: Any, field_name: str, cap_key: str = "max_stop_strings") -> list[str]:
    """Stop strings or patterns: ``None``, one str (vLLM and SGLang both wrap a
    bare str) or an iterable of str, at most ``LIMITS[cap_key]``."""
    if values is None:
        return []
    if isinstance(values, str):
        return [values]
    return str_items(values, field_name, "a str or a sequence of str", LIMITS[cap_key])


class FinishState(Protocol):
    """What a ``FinishTracker`` (or a :class:`Replay` of one) says about a finish."""

    @property
    def finished(self) -> bool: ...
    @property
    def finish_reason(self) -> str | None: ...
    @property
    def stop_reason(self) -> int | str | None: ...
    @property
    def matched(self) -> int | str | None: ...
    @property
    def num_tokens(self) -> int: ...


@dataclass(frozen=True)
class Replay:
    """The tracker's state after the history, and whether the tokens before
    the new ones had already decided it."""

    finished: bool
    finish_reason: str | None
    stop_reason: int | str | None
    matched: int | str | None
    num_tokens: int
    text: str
    decided_before_new: bool


def split(count: int, new: int, field_name: str) -> int:
    """Index where the ``new`` last of ``count`` tokens start; ``new`` must be
    an int in ``[0, count]`` (errors name ``field_name``)."""
    new = integer(new, field_name)
    if not 0 <= new <= count:
        raise field_value_error(field_name, f"={new} is outside [0, {count}] (the number of output tokens given)")
    return count - new


def replay(
    params: StopParams,
    ids: Sequence[int],
    texts: Sequence[str] | None,
    start: int,
    grammar_at_end: bool = False,
) -> Replay:
    """Feeds ``ids[:start]`` as one step and ``ids[start:]`` as the next.

    The finish machine is step invariant (semantics.md 6.10), so splitting
    the history anywhere gives the same answer; the split only tells whether
    the decision was already made by the tokens before the new ones.
    ``grammar_at_end``: the grammar ended at the last new token.
    """
    tracker = FinishTracker(params)
    before = ids[:start]
    new = ids[start:]
    if before:
        tracker.update(before, None if texts is None else texts[:start])
    decided_before_new = tracker.finished
    if new and not decided_before_new:
        grammar = len(new) - 1 if grammar_at_end else None
        tracker.update(new, None if texts is None else texts[start:], grammar)
    return Replay(
        finished=tracker.finished,
        finish_reason=tracker.finish_reason,
        stop_reason=tracker.stop_reason,
        matched=tracker.matched,
        num_tokens=tracker.num_tokens,
        text=tracker.text,
        decided_before_new=decided_before_new,
    )
