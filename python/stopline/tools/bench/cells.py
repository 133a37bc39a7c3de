"""A benchmark table and the formatting of its cells, shared by the report
and the suites that lay out their own tables (below both in the import graph)."""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["Table", "fmt_ns", "fmt_ratio"]


@dataclass
class Table:
    title: str
    header: list[str]
    rows: list[list[str]]
    notes: list[str] = field(default_factory=list)


def fmt_ns(v: float | None) -> str:
    if v is None:
        return "-"
    return f"{v:,.0f}" if v >= 100 else f"{v:.1f}"


def fmt_ratio(num: float | None, den: float | None, places: int = 1) -> str:
    """``num / den`` as ``1.3x`` (``places`` decimals below 100x)."""
    if num is None or den is None or den == 0:
        return "-"
    r = num / den
    return f"{r:,.0f}x" if r >= 100 else f"{r:.{places}f}x"
