"""Loads the shared test vectors from ``../shared/vectors/`` (project root relative).

The files are owned by the shared workspace and are never copied into the repo.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

PROJECT_ROOT = Path(__file__).resolve().parent.parent
VECTORS_DIR = PROJECT_ROOT.parent / "shared" / "vectors"


def load_vectors(name: str) -> Any:
    """Parsed contents of ``VECTORS_DIR/name``; fails loudly when missing."""
    path = VECTORS_DIR / name
    if not path.is_file():
        raise FileNotFoundError(
            f"shared test vector file {path} is missing; the tests expect the shared "
            f"vectors checked out next to the project ({VECTORS_DIR})"
        )
    with path.open(encoding="utf-8") as f:
        return json.load(f)
