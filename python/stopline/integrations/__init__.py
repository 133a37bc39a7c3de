"""Drop-in adapters that put stopline behind an engine's own interfaces.

Each submodule imports its engine and is installed with the matching extra:

- :mod:`stopline.integrations.hf`: ``StoppingCriteria`` and ``LogitsProcessor``
  for ``transformers`` ``generate`` (``pip install 'stopline[hf]'``).

Nothing here is imported by ``import stopline``.
"""
