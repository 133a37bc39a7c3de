"""The ```python blocks of a documentation page, run as tests (one helper for every page)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def run_python_blocks(page: str, containing: str | None = None) -> int:
    """Executes each ```python block of ``page`` (relative to the repository root)
    that contains ``containing`` (every block when None), each in a fresh namespace;
    returns how many ran and fails when none did."""
    path = ROOT / page
    blocks = re.findall(r"```python\n(.*?)```", path.read_text(encoding="utf-8"), re.S)
    chosen = [b for b in blocks if containing is None or containing in b]
    assert chosen, f"{page} has no python example{'' if containing is None else ' with ' + containing}"
    for block in chosen:
        exec(compile(block, str(path), "exec"), {})
    return len(chosen)
