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

from collections import deque
from collections.abc import Sequence
from typing import Any

__all__ = ["HeldPayloads"]


class HeldPayloads:
    """Payload chunks per slot, released in step with ``FinishBatch``'s token ids.

    Args:
        max_slots: slots ``0..max_slots-1``, as in ``FinishBatch``.

    A chunk is any object with ``len()`` and slicing (``chunk[a:b]``) that
    covers ``len(chunk)`` consecutive output tokens of one slot.

    Raises:
        ValueError: a slot out of range; releasing more tokens than held
            (the engine pushed fewer payloads than it fed tokens).
    """

    def __init__(self, max_slots: int):
        if isinstance(max_slots, bool) or not isinstance(max_slots, int) or max_slots <= 0:
            raise ValueError(f"max_slots must be a positive int, got {max_slots!r}")
        self._queues: list[deque[Any]] = [deque() for _ in range(max_slots)]
        self._held = [0] * max_slots

    def _slot(self, slot: int) -> int:
        if isinstance(slot, bool) or not isinstance(slot, int) or not 0 <= slot < len(self._queues):
            raise ValueError(f"slot must be an int in [0, {len(self._queues)}), got {slot!r}")
        return slot

    def push(self, slot: int, chunk: Any) -> None:
        """Hold ``chunk``: the payloads of the next ``len(chunk)`` output tokens of ``slot``."""
        s = self._slot(slot)
        n = len(chunk)
        if n:
            self._queues[s].append(chunk)
            self._held[s] += n

    def held(self, slot: int) -> int:
        """Tokens whose payload is held for ``slot``."""
        return self._held[self._slot(slot)]

    def release(self, slot: int, count: int) -> list[Any]:
        """Take the payloads of the next ``count`` tokens of ``slot``, as chunks (the last one sliced)."""
        s = self._slot(slot)
        if count > self._held[s]:
            raise ValueError(f"slot {slot}: releasing {count} tokens but only {self._held[s]} are held")
        queue = self._queues[s]
        out: list[Any] = []
        left = count
        while left:
            chunk = queue[0]
            n = len(chunk)
            if n <= left:
                out.append(queue.popleft())
                left -= n
            else:
                out.append(chunk[:left])
                queue[0] = chunk[left:]
                left = 0
        self._held[s] -= count
        return out

    def step(self, result: Any, chunks: Sequence[Any] | None = None) -> list[list[Any]]:
        """Push one chunk per row (optional), then release per ``result.released_counts``.

        ``result`` is the ``BatchStepResult`` of the step that fed these tokens;
        ``chunks[i]`` covers the tokens fed for row ``i`` (its run). Returns, per
        row, the released chunks. Rows that finished are cleared afterwards:
        payloads of tokens past the stop are dropped with them.
        """
        slots = result.slots
        if chunks is not None:
            if len(chunks) != len(slots):
                raise ValueError(f"chunks has {len(chunks)} entries but the step has {len(slots)} rows")
            for slot, chunk in zip(slots, chunks):
                self.push(slot, chunk)
        out = [self.release(slot, n) for slot, n in zip(slots, result.released_counts)]
        for slot in result.finished_slots:
            self.clear(slot)
        return out

    def clear(self, slot: int) -> None:
        """Drop everything held for ``slot`` (its sequence finished or was removed)."""
        s = self._slot(slot)
        self._queues[s].clear()
        self._held[s] = 0
