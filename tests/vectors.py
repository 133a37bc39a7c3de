"""Loads the engines' public test vectors vendored in ``tests/vectors/``.

The files are a copy of the shared vectors (``tests/vectors/README.md`` gives
their sources and how to refresh the copy), so the tests need nothing beside
the checkout.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

VECTORS_DIR = Path(__file__).resolve().parent / "vectors"


def load_vectors(name: str) -> Any:
    """Parsed contents of ``VECTORS_DIR/name``; fails loudly when missing."""
    path = VECTORS_DIR / name
    if not path.is_file():
        raise FileNotFoundError(f"test vector file {path} is missing from the checkout")
    with path.open(encoding="utf-8") as f:
        return json.load(f)
