"""The least a Triton launch shaped like ``LogitsConstraints.apply`` does, the
floors under the small-batch times of ``stopline bench --suite logits``:

- ``floor``: one program per row reads the row's slot and writes the row's
  flag (launch, one dependent load, one store);
- ``floor split``: the grid ``apply`` launches for the bitmask scenario (rows x
  chunks); each program reads its row's slot and adds to the row's arrival
  word, and the last arrival writes the flag and resets the word, as the
  kernel's chunk programs do with their counts. The difference between the two
  is what combining a split row's counts into one flag costs.

For splitting that difference (``benches/bench_logits_attribution.py``), the
same grid without the arrival (``grid_flag``: chunk 0 writes the flag, or
every program does) or with an add whose result nobody waits for, and
``arrival_to_flag(..., acq_rel=True)``, the ordering a launch with a tail read
uses.
"""

from __future__ import annotations

from typing import Any

import triton
import triton.language as tl


@triton.jit
def _slot_to_flag(slots_ptr, flag_ptr, max_slots):
    row = tl.program_id(0)
    slot = tl.load(slots_ptr + row)
    tl.store(flag_ptr + row, (slot < 0) | (slot >= max_slots))


@triton.jit
def _arrival_to_flag(slots_ptr, flag_ptr, scratch_ptr, max_slots, ACQ_REL: tl.constexpr):
    row = tl.program_id(0)
    slot = tl.load(slots_ptr + row).to(tl.int64)
    if ACQ_REL:
        old = tl.atomic_add(scratch_ptr + row, slot * 0 + 1, sem="acq_rel")
    else:
        old = tl.atomic_add(scratch_ptr + row, slot * 0 + 1, sem="relaxed")
    if old == tl.num_programs(1) - 1:
        tl.store(scratch_ptr + row, old * 0)
        tl.store(flag_ptr + row, (slot < 0) | (slot >= max_slots))


@triton.jit
def _grid_flag(slots_ptr, flag_ptr, scratch_ptr, max_slots, ADD: tl.constexpr, ALL_STORE: tl.constexpr):
    row = tl.program_id(0)
    slot = tl.load(slots_ptr + row).to(tl.int64)
    if ADD:
        tl.atomic_add(scratch_ptr + row, slot * 0 + 1, sem="relaxed")  # result unused: nothing waits
    if ALL_STORE:
        tl.store(flag_ptr + row, (slot < 0) | (slot >= max_slots))
    elif tl.program_id(1) == 0:
        tl.store(flag_ptr + row, (slot < 0) | (slot >= max_slots))


def slot_to_flag(slots: Any, flags: Any) -> None:
    """``flags[r] = slots[r]`` out of ``[0, len(slots))``, one program per row."""
    _slot_to_flag[(slots.shape[0],)](slots, flags, slots.shape[0])


def arrival_to_flag(slots: Any, flags: Any, scratch: Any, chunks: int, acq_rel: bool = False) -> None:
    """The same flags from a ``rows x chunks`` grid whose last arrival per row writes them;
    ``scratch`` is ``int64 [rows]``, zero before and after; ``acq_rel``: the add orders
    memory both ways (else relaxed, as the bitmask scenario's launch)."""
    _arrival_to_flag[(slots.shape[0], chunks)](slots, flags, scratch, slots.shape[0], ACQ_REL=acq_rel)


def grid_flag(slots: Any, flags: Any, scratch: Any, chunks: int, add: bool = False, all_store: bool = False) -> None:
    """The same flags from a ``rows x chunks`` grid with no arrival to wait for: chunk 0 of
    each row writes its flag (``all_store``: every program does); with ``add`` every
    program also adds 1 to the row's ``scratch`` word (``int64 [rows]``, never reset) and
    does not wait for the result."""
    _grid_flag[(slots.shape[0], chunks)](slots, flags, scratch, slots.shape[0], ADD=add, ALL_STORE=all_store)
