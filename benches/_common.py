"""Shared pieces of the benchmark scripts, kept for scripts that import them;
the implementation lives in the package (``stopline.tools.bench``) so that
``stopline bench`` works from an installed wheel."""

from __future__ import annotations

from collections.abc import Sequence

from stopline.tools.bench import data
from stopline.tools.bench.data import stop_list
from stopline.tools.bench.timing import median_ns_per_op, time_side_by_side

__all__ = ["median_ns_per_op", "print_table", "stop_list", "text_pieces", "time_side_by_side"]


def text_pieces(limit: int = 200_000) -> tuple[list[str], str]:
    """Real text as one piece per token, and the splitter's name
    (see :func:`stopline.tools.bench.data.text_pieces`)."""
    pieces, splitter = data.text_pieces(limit)
    return list(pieces), splitter


def print_table(title: str, header: Sequence[str], rows: Sequence[Sequence[object]]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=title)
    for h in header:
        table.add_column(h, justify="right")
    for r in rows:
        table.add_row(*(str(c) for c in r))
    Console().print(table)
