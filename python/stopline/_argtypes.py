"""argparse types shared by the command line and the benchmark suite's options
(a module below both, so neither imports the other for them)."""

from __future__ import annotations

import argparse
from typing import Any

__all__ = ["int_arg", "float_arg", "positive_int", "nonneg_int"]

# Argument types raise ArgumentTypeError with the whole message: on a
# ValueError argparse would print the function's name ("invalid _x value").


def _parsed(v: str, kind: type[int] | type[float], what: str) -> Any:
    try:
        return kind(v)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected {what}, got {v!r}") from None


def int_arg(v: str) -> int:
    """An integer (argparse type)."""
    n: int = _parsed(v, int, "an integer")
    return n


def float_arg(v: str) -> float:
    """A number (argparse type)."""
    x: float = _parsed(v, float, "a number")
    return x


def positive_int(v: str) -> int:
    """An integer >= 1 (argparse type)."""
    n = int_arg(v)
    if n < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {n}")
    return n


def nonneg_int(v: str) -> int:
    """An integer >= 0 (argparse type)."""
    n = int_arg(v)
    if n < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {n}")
    return n
