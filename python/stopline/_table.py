"""Plain-text tables for the command line: the same output on a terminal and
in a pipe (greppable, no colour codes), fitted to the terminal's width, 80
columns when there is no terminal (``$COLUMNS`` overrides both); and the
counts its messages print (``1 request``, ``2 requests``)."""

from __future__ import annotations

import shutil
import textwrap
from collections.abc import Sequence

__all__ = ["Column", "counted", "fit_width", "format_table", "wrap"]

_GAP = "  "
_MORE = "..."


class Column:
    """A column: ``name`` (the header), ``right`` aligned or left, and, for a
    column that may be cut to make the table fit, the ``shrink`` order
    (lower first) and the ``min_width`` it keeps. ``keep`` says which part of
    a cell too wide for its column is shown: ``"head"`` (``abc...``),
    ``"tail"`` (``...xyz``) or ``"ends"`` (``ab...yz``)."""

    __slots__ = ("keep", "min_width", "name", "right", "shrink")

    def __init__(self, name: str, *, right: bool = False, shrink: int | None = None, min_width: int = 8,
                 keep: str = "head") -> None:
        if keep not in ("head", "tail", "ends"):
            raise ValueError(f"keep must be 'head', 'tail' or 'ends', got {keep!r}")
        self.name = name
        self.right = right
        self.shrink = shrink
        self.min_width = max(min_width, len(_MORE) + 2)
        self.keep = keep


def counted(n: int, noun: str, plural: str | None = None) -> str:
    """``n`` and its noun, singular for exactly 1, else ``plural`` (by
    default the noun and an ``s``): ``counted(1, "file")`` is ``"1 file"``,
    ``counted(0, "match", "matches")`` is ``"0 matches"``."""
    return f"{n} {noun if n == 1 else plural or noun + 's'}"


def fit_width() -> int:
    """Characters per line: ``$COLUMNS``, else the terminal's width, else 80."""
    return shutil.get_terminal_size((80, 24)).columns


def _cut(cell: str, width: int, keep: str = "head") -> str:
    if len(cell) <= width:
        return cell
    room = width - len(_MORE)
    if keep == "tail":
        return _MORE + cell[len(cell) - room:]
    if keep == "ends":
        head = (room + 1) // 2
        return cell[:head] + _MORE + cell[len(cell) - (room - head):]
    return cell[:room] + _MORE


def format_table(columns: Sequence[Column], rows: Sequence[Sequence[str]], width: int | None = None) -> list[str]:
    """The header line and one line per row, columns separated by two spaces.

    Cells wider than their column end in ``...``. Columns that may shrink
    are narrowed in their ``shrink`` order, each down to its ``min_width``,
    until the lines fit ``width`` (default :func:`fit_width`); a table whose
    fixed columns alone are wider is printed wider.
    """
    width = fit_width() if width is None else width
    widths = [max([len(c.name), *(len(r[i]) for r in rows)]) for i, c in enumerate(columns)]
    excess = sum(widths) + len(_GAP) * (len(columns) - 1) - width
    order = sorted((c.shrink, i) for i, c in enumerate(columns) if c.shrink is not None)
    for _, i in order:
        if excess <= 0:
            break
        floor = max(columns[i].min_width, min(len(columns[i].name), widths[i]))
        take = min(excess, widths[i] - floor)
        if take > 0:
            widths[i] -= take
            excess -= take

    def line(cells: Sequence[str]) -> str:
        parts = []
        for c, w, cell in zip(columns, widths, cells):
            cell = _cut(cell, w, c.keep)
            parts.append(cell.rjust(w) if c.right else cell.ljust(w))
        return _GAP.join(parts).rstrip()

    return [line([c.name for c in columns]), *(line(r) for r in rows)]


def wrap(text: str, width: int | None = None, indent: str = "") -> list[str]:
    """``text`` wrapped to ``width`` (default :func:`fit_width`), later lines indented by ``indent``."""
    width = fit_width() if width is None else width
    return textwrap.wrap(text, width=width, subsequent_indent=indent, break_on_hyphens=False) or [""]
