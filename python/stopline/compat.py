"""Engine-shaped stateless helpers over stopline's finish machine (the names
existing callers import; they live in :mod:`stopline.engines`).

Each helper takes the inputs an engine already has at the point where it
decides whether a sequence stops, runs them through stopline's Rust core, and
hands the decision back in the engine's own vocabulary:

* vLLM v1, scheduler side: :func:`vllm_check_stop` (keyword inputs) or
  :func:`vllm_check_stop_request` (reads a ``vllm.v1.request.Request``-shaped
  object), in the shape of ``vllm/v1/core/sched/utils.py::check_stop``.
* vLLM v1, detokenizer side: :func:`vllm_detokenizer_stop`, the stop-string
  step of ``vllm/v1/engine/detokenizer.py``.
* SGLang: :func:`sglang_check_finished`, in the shape of
  ``Req.update_finish_state`` in
  ``python/sglang/srt/managers/schedule_batch.py``.
* Reasoning models: :func:`reasoning_config` (explicit markers) or
  :func:`vllm_reasoning` / :func:`sglang_reasoning` (an engine's
  ``--reasoning-parser``) give the ``stopline.engines.Reasoning`` that the
  helpers take as ``reasoning=`` (or the mapping itself; anything else is a
  ``TypeError`` naming ``reasoning``): stops then fire only in content
  (docs/semantics.md 11).
* :func:`to_vllm_status` and :func:`to_sglang_finish_reason` translate a
  result of a long-lived ``FinishTracker`` or ``FinishBatch`` (the hot path)
  into the same shapes.

The stateless helpers replay the whole output history on every call, so a
call costs O(len(output)); an engine on the hot path keeps one per-request
object (``stopline.engines.vllm.RequestStop`` / ``DetokenizerStop``,
``stopline.engines.sglang.ReqFinish``), a ``FinishTracker`` or a
``FinishBatch``. Each helper and its per-request object build their
``StopParams`` through the same function of :mod:`stopline.engines`
(docs/semantics.md section 7 lists the pairs).
"""

from __future__ import annotations

from stopline.engines._common import reasoning_config
from stopline.engines.sglang import (
    SglangFinishReason,
    SglangFinishResult,
    sglang_check_finished,
    sglang_reasoning,
    to_sglang_finish_reason,
)
from stopline.engines.vllm import (
    VllmStopResult,
    VllmStopStringResult,
    to_vllm_status,
    vllm_check_stop,
    vllm_check_stop_request,
    vllm_detokenizer_stop,
    vllm_reasoning,
)

__all__ = [
    "SglangFinishReason",
    "SglangFinishResult",
    "VllmStopResult",
    "VllmStopStringResult",
    "reasoning_config",
    "sglang_check_finished",
    "sglang_reasoning",
    "to_sglang_finish_reason",
    "to_vllm_status",
    "vllm_check_stop",
    "vllm_check_stop_request",
    "vllm_detokenizer_stop",
    "vllm_reasoning",
]
