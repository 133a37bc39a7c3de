"""Per-token data that travels with held-back text.

An engine streams a request's log-probabilities (or any per-token payload)
with its text. stopline holds back the tokens whose text may still become a
stop string and releases them, with their ids, when the text is known; at a
stop it releases exactly the kept tokens (everything after the token that
completes the stop is dropped). :class:`HeldPayloads` keeps each slot's
payloads in that same rhythm: push what a step produced, release as many
tokens as the step's ``BatchStepResult.released_counts`` says.

Payloads are kept as the chunks the engine pushed (a tensor of logprob rows,
a NumPy array, a list...) and only sliced, never iterated: a step costs
O(rows + chunks released), not O(tokens), in Python.
"""

from __future__ import annotations

import operator
from collections import deque
from collections.abc import Sequence
from typing import Any

from ._caps import field_error, shown, type_name
from ._core import LIMITS

__all__ = ["HeldPayloads"]

MAX_SLOTS = LIMITS["max_slots"]
"""The cap on ``max_slots``: ``FinishBatch``'s (``LIMITS["max_slots"]``, 2**24)."""


def _index(value: Any, field: str, slot: int | None = None) -> int:
    """``value`` as an int (anything with ``__index__``, as the core reads
    ints; a ``bool`` is refused): ``TypeError`` naming the field (and the
    slot it is about, when known) otherwise."""
    about = "" if slot is None else f"slot {slot}: "
    if isinstance(value, bool):
        raise field_error(TypeError, field, f"{about}{field} must be an int, got bool", "wrong_type", slot=slot)
    try:
        return operator.index(value)
    except TypeError:
        raise field_error(
            TypeError, field, f"{about}{field} must be an int, got {type_name(value)}", "wrong_type", slot=slot
        ) from None


class HeldPayloads:
    """Payload chunks per slot, released in step with ``FinishBatch``'s token ids.

    Args:
        max_slots: slots ``0..max_slots-1``, as in ``FinishBatch``: an int in
            ``[1, 2**24]`` (``LIMITS["max_slots"]``). Nothing is allocated up
            front: a slot's queue exists from its first ``push`` until
            ``clear`` (about 900 bytes per slot holding payloads, plus the
            chunks themselves).

    A chunk is any object with ``len()`` and slicing (``chunk[a:b]``) that
    covers ``len(chunk)`` consecutive output tokens of one slot.

    Raises:
        TypeError: ``max_slots``, a slot or a count that is not an int (a
            ``bool`` included); a chunk without ``len()``; a ``result``
            without ``slots`` / ``released_counts``.
        ValueError: naming the field: ``max_slots`` outside ``[1, 2**24]``;
            a slot outside ``[0, max_slots)``; a negative count; releasing
            more tokens than held (the engine pushed fewer payloads than it
            fed tokens); ``chunks`` not one per row. Messages show a value
            bounded (``_caps.shown``).
    """

    def __init__(self, max_slots: int):
        n = _index(max_slots, "max_slots")
        if not 1 <= n <= MAX_SLOTS:
            raise field_error(ValueError, "max_slots", f"max_slots must be in [1, {MAX_SLOTS}], got {shown(n)}", "out_of_range")
        self._max_slots = n
        self._queues: dict[int, deque[Any]] = {}
        self._held: dict[int, int] = {}

    @property
    def max_slots(self) -> int:
        """Number of slots, as given when built."""
        return self._max_slots

    def _slot(self, slot: Any, field: str = "slot") -> int:
        s = _index(slot, field)
        if not 0 <= s < self._max_slots:
            raise field_error(ValueError, field, f"{field} must be in [0, {self._max_slots}), got {shown(s)}", "out_of_range", slot=s)
        return s

    def push(self, slot: int, chunk: Any) -> None:
        """Hold ``chunk``: the payloads of the next ``len(chunk)`` output tokens of ``slot``."""
        s = self._slot(slot)
        try:
            n = len(chunk)
        except TypeError:
            raise field_error(
                TypeError,
                "chunk",
                f"slot {s}: chunk must have len() and slicing, got {type_name(chunk)}",
                "wrong_type",
                slot=s,
            ) from None
        if n:
            self._queues.setdefault(s, deque()).append(chunk)
            self._held[s] = self._held.get(s, 0) + n

    def held(self, slot: int) -> int:
        """Tokens whose payload is held for ``slot``."""
        return self._held.get(self._slot(slot), 0)

    def release(self, slot: int, count: int) -> list[Any]:
        """Take the payloads of the next ``count`` tokens of ``slot``, as chunks (the last one sliced)."""
        s = self._slot(slot)
        k = _index(count, "count", s)
        held = self._held.get(s, 0)
        if k < 0:
            raise field_error(ValueError, "count", f"slot {s}: count must be >= 0, got {shown(k)}", "below", slot=s)
        if k > held:
            raise field_error(ValueError, "count", f"slot {s}: releasing {shown(k)} tokens but only {held} are held", "greater", slot=s)
        if k == 0:
            return []
        queue = self._queues[s]
        out: list[Any] = []
        left = k
        while left:
            if not queue:  # a pushed chunk shrank afterwards (a list the engine changed)
                self.clear(s)
                raise field_error(
                    ValueError,
                    "chunk",
                    f"slot {s}: the held chunks cover fewer tokens than were pushed; a chunk changed length after push",
                    "invalid",
                    slot=s,
                )
            chunk = queue[0]
            n = len(chunk)
            if n <= left:
                out.append(queue.popleft())
                left -= n
            else:
                out.append(chunk[:left])
                queue[0] = chunk[left:]
                left = 0
        if k == held:
            self.clear(s)
        else:
            self._held[s] = held - k
        return out

    def step(self, result: Any, chunks: Sequence[Any] | None = None) -> list[list[Any]]:
        """Push one chunk per row (optional), then release per ``result.released_counts``.

        ``result`` is the ``BatchStepResult`` of the step that fed these tokens;
        ``chunks[i]`` covers the tokens fed for row ``i`` (its run). Returns, per
        row, the released chunks. Rows that finished are cleared afterwards:
        payloads of tokens past the stop are dropped with them.
        """
        try:
            slots, counts, finished = result.slots, result.released_counts, result.finished_slots
        except AttributeError:
            raise field_error(TypeError, "result", f"result must be a BatchStepResult, got {type_name(result)}", "wrong_type") from None
        if chunks is not None:
            if isinstance(chunks, (str, bytes)) or not isinstance(chunks, Sequence):
                raise field_error(TypeError, "chunks", f"chunks must be a sequence of chunks, got {type_name(chunks)}", "wrong_type")
            if len(chunks) != len(slots):
                raise field_error(ValueError, "chunks", f"chunks has {len(chunks)} entries but the step has {len(slots)} rows", "count")
            for slot, chunk in zip(slots, chunks):
                self.push(slot, chunk)
        out = [self.release(slot, n) for slot, n in zip(slots, counts)]
        for slot in finished:
            self.clear(slot)
        return out

    def clear(self, slot: int) -> None:
        """Drop everything held for ``slot`` (its sequence finished or was removed)."""
        s = self._slot(slot)
        self._queues.pop(s, None)
        self._held.pop(s, None)
