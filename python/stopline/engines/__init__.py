"""The engine layer: each engine's rules in one module.

- :mod:`stopline.engines.vllm`: vLLM V1 (0.33.0): ``SamplingParams`` and
  ``Request`` -> ``StopParams``, ``RequestStatus`` and ``stop_reason``; the
  stateless helpers (``vllm_check_stop``, ``vllm_detokenizer_stop``) and the
  per-request objects (``RequestStop``, ``DetokenizerStop``).
- :mod:`stopline.engines.sglang`: SGLang (0.5.23): ``SamplingParams`` ->
  ``StopParams``, the finish-reason objects; ``sglang_check_finished`` and
  ``ReqFinish``.

Each rule (parameter mapping, request reading, status and finish-reason
translation) is written once here; the stateless helper and the per-request
object of a pair both call it, and ``tests/test_engine_parity.py`` runs both
on the same histories. Reasoning channels (docs/semantics.md 11) are read
once, by :func:`reasoning_config` / :func:`reasoning_from_markers` into a
:class:`Reasoning` that both engines' readers (``vllm_reasoning``,
``sglang_reasoning``) return and every adapter takes as ``reasoning=``.
Nothing here imports an engine: the adapters in
:mod:`stopline.integrations` add the engines' own base classes, and
:mod:`stopline.compat` re-exports the helpers under their old names.
"""

from ._common import REASONING_KEYS, Reasoning, reasoning_config, reasoning_from_markers, vocabulary_for

__all__ = ["REASONING_KEYS", "Reasoning", "reasoning_config", "reasoning_from_markers", "vocabulary_for"]
