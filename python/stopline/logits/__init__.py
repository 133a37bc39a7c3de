"""Logits constraints: keep a sampler from ever drawing from an empty row.

``LogitsConstraints`` holds per-slot constraint state on the logits' device (an
engine keeps one per model runner, one slot per running request) and applies,
once per engine step and in place on ``logits[rows, vocab]``, the pipeline of
docs/semantics.md section 8:

1. semantic masks: grammar bitmask (xgrammar layout), ``allowed_token_ids``,
   ``bad_words`` (single-token words: a static ban; multi-token words: ban the
   last token when the preceding tokens equal the tail of the output, as vLLM's
   bad-words processor does);
2. ``min_tokens``: while the row's output position is below ``min_tokens`` every
   stop id (EOS included) is set to ``-inf``, as vLLM's
   ``MinTokensLogitsProcessor`` does; if that leaves no finite logit in the
   row and the slot's restore policy allows it, the stop logits that were
   finite after step 1 are put back as they were (the
   grammar-only-allows-EOS conflict; vLLM 0.33 puts back only finite ones
   too, but treats a NaN or ``+inf`` elsewhere in the row as live:
   docs/semantics.md 6.17), the others stay ``-inf``;
3. ``logit_bias``: ``logit = dtype(float32(logit) + float32(bias))``;
4. the forced token (``LogitsConstraints.force``: a thinking budget's end
   marker), last and in place of steps 1-3 on the slot's rows: every column is
   ``-inf`` except the forced id, which keeps the row's input logit (``0.0`` if
   that is not finite), so neither the grammar bitmask nor the slot's other
   constraints reach a forced row. The reference overwrites what steps 1-3
   wrote; the kernel keeps only the forced id's bit in the step-1 pass and
   skips steps 2 and 3.

A row with no finite logit afterwards is reported in the returned
``infeasible[rows]`` so the engine can finish it with ``"error"`` instead of
sampling garbage (an argmax over all ``-inf`` silently returns token 0); a
forced row never is.

Two backends give bit-identical logits and flags: ``"torch"`` (the plain
reference, :mod:`stopline.logits.reference`, any device) and ``"triton"`` (one
fused kernel, :mod:`stopline.logits.triton_kernel`, on CUDA; on CPU only under
``TRITON_INTERPRET=1``).

Modules: :mod:`~stopline.logits.constraints` (``LogitsConstraints``:
``set``/``clear``/``apply``), :mod:`~stopline.logits.checks` (the checks of a
request that need no state: ``set`` runs them, and ``check_request`` runs them
alone, for an engine's admission step), :mod:`~stopline.logits.device_state`
(the device tables and when they grow, shrink or stay frozen for CUDA graphs),
:mod:`~stopline.logits.limits` (caps), :mod:`~stopline.logits.tuning` (the
kernel's launch knobs, and whether Triton interprets it), and the two backends.

This module needs torch (``pip install 'stopline[torch]'``); ``import stopline``
does not import it.
"""

from __future__ import annotations

try:
    import torch  # noqa: F401
except ImportError as exc:  # pragma: no cover - exercised only without torch
    raise ImportError(
        "stopline.logits needs torch (and triton for the GPU kernel): "
        "pip install 'stopline[torch]'"
    ) from exc

from .checks import check_request
from .constraints import LogitsConstraints
from .device_state import DeviceState  # noqa: F401  (the tables' layout, documented there)
from .limits import BACKENDS, LIMITS, RESTORE_POLICIES

__all__ = ["LogitsConstraints", "check_request", "RESTORE_POLICIES", "BACKENDS", "LIMITS"]
