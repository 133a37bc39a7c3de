"""The least a Triton launch shaped like ``LogitsConstraints.apply`` does: one
program per row reads the row's slot and writes the row's flag. Its time is
the floor for small batches (launch, one dependent load, one store), the
``floor`` column of ``stopline bench --suite logits``."""

from __future__ import annotations

from typing import Any

import triton
import triton.language as tl


@triton.jit
def _slot_to_flag(slots_ptr, flag_ptr, max_slots):
    row = tl.program_id(0)
    slot = tl.load(slots_ptr + row)
    tl.store(flag_ptr + row, (slot < 0) | (slot >= max_slots))


def slot_to_flag(slots: Any, flags: Any) -> None:
    """``flags[r] = slots[r]`` out of ``[0, len(slots))``, one program per row."""
    _slot_to_flag[(slots.shape[0],)](slots, flags, slots.shape[0])
