"""The kernel's tuning knobs as one private, immutable configuration.

A :class:`KernelTuning` is read from the environment when a
``LogitsConstraints`` is built (not when a module is imported), held by it and
passed to the kernel on every ``apply``; tests and benchmarks build their own.
docs/logits.md, "Tuning", gives the measured defaults. :func:`interpreting`
says whether Triton runs the kernel in its interpreter.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from stopline._caps import field_error

#: Tile config per logits dtype: (DENSE_WORDS, SCAN_WORDS, NUM_WARPS,
#: PROGS_PER_SM, WAVE_PROGS, PREFETCH). DENSE_WORDS bitmask words x 32 logits
#: per iteration of the dense pass; SCAN_WORDS x 32 logits per block of the
#: early-exit count; PROGS_PER_SM: the grid aims at this many programs per
#: multiprocessor (0 = one program per row); WAVE_PROGS: at most this many
#: programs per multiprocessor in a one-wave grid (fewer when the compiled
#: specialization's registers or shared memory fit fewer): when that single
#: wave still gives every row >= 2 chunks, the grid is one wave instead (0 = never);
#: PREFETCH: load the next tile while masking this one. 64:32:4:32:10:1 won
#: the H200 sweeps for both 16-bit dtypes and float32 (docs/logits.md); 64
#: words keep the mask-word loads under one per thread, so they need no
#: shared memory.
DEFAULT_TILES: Mapping[str, tuple[int, ...]] = {
    "float32": (64, 32, 4, 32, 10, 1),
    "bfloat16": (64, 32, 4, 32, 10, 1),
    "float16": (64, 32, 4, 32, 10, 1),
}
ENV_TILES = "STOPLINE_LOGITS_TILE"


@dataclass(frozen=True)
class KernelTuning:
    """How the fused kernel is launched, and one layout threshold of ``set``.

    Attributes:
        tiles: tile config per logits dtype name (see ``DEFAULT_TILES``).
        chunk_words: bitmask words per chunk program of a dense row; ``None``
            picks it from rows, vocab, dtype and SM count (tests force small
            values to split small rows over several programs).
        sparse_ban_limit: a slot with more distinct one-token bad words than
            this gets them folded into its dense per-slot token mask (one pass
            over the row) instead of a sparse id list.
    """

    tiles: Mapping[str, tuple[int, ...]] = field(default_factory=lambda: dict(DEFAULT_TILES))
    chunk_words: int | None = None
    sparse_ban_limit: int = 64

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> KernelTuning:
        """The defaults, with ``STOPLINE_LOGITS_TILE`` applied when set:
        ``'DW:SW:NW[:PPS[:WAVE[:PREFETCH]]]'`` for every dtype, or
        ``'float32=...,bfloat16=...'``; fields left out keep the default.

        Raises:
            ValueError: a malformed value (naming the variable and the format).
        """
        env = os.environ if environ is None else environ
        text = env.get(ENV_TILES)
        return cls() if not text else cls().with_tiles(text)

    def with_tiles(self, text: str) -> KernelTuning:
        """A copy with tile configs parsed from ``text`` (``STOPLINE_LOGITS_TILE``'s format)."""
        tiles = dict(self.tiles)
        try:
            for part in text.split(","):
                name, _, cfg = part.strip().rpartition("=")
                vals = tuple(int(v) for v in cfg.split(":"))
                if not 3 <= len(vals) <= 6 or (name and name not in tiles) or min(vals[:3]) <= 0:
                    raise ValueError
                for dt in [name] if name else list(tiles):
                    tiles[dt] = vals + tuple(tiles[dt][len(vals):])
        except ValueError:
            raise field_error(
                ValueError,
                ENV_TILES,
                f"{ENV_TILES} must be 'DENSE_WORDS:SCAN_WORDS:NUM_WARPS[:PROGS_PER_SM[:WAVE_PROGS[:PREFETCH]]]' "
                f"or 'dtype=...,dtype=...', got {text!r}",
            ) from None
        return replace(self, tiles=tiles)


def interpreting() -> bool:
    """Whether ``TRITON_INTERPRET`` asks Triton for its interpreter (the kernel then runs on CPU
    tensors; read at each call, as Triton reads it when ``@triton.jit`` decorates the kernel)."""
    return os.environ.get("TRITON_INTERPRET", "0").lower() in ("1", "true", "on", "yes")
