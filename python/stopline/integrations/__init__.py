"""Drop-in adapters that put stopline behind an engine's own interfaces.

Each submodule imports its engine and is installed with the matching extra:

- :mod:`stopline.integrations.hf`: ``StoppingCriteria`` and ``LogitsProcessor``
  for ``transformers`` ``generate`` (``pip install 'stopline[hf]'``).
- :mod:`stopline.integrations.vllm`: vLLM V1 logits processors, and the
  per-request ``RequestStop`` / ``DetokenizerStop`` (``pip install 'stopline[vllm]'``).
- :mod:`stopline.integrations.sglang`: ``ReqFinish`` and a
  ``CustomLogitProcessor`` (``pip install 'stopline[sglang]'``).

The engines' rules themselves (parameter mapping, request reading, status and
finish-reason translation) live in :mod:`stopline.engines`, which imports no
engine. Nothing here is imported by ``import stopline``.
"""
