"""The per-slot constraint tables on the logits' device, and their sizes.

:class:`DeviceState` is what both backends read. :class:`DeviceTables` owns
it together with the host mirror of every slot, and decides when a table is
grown (a ``set`` needs a wider row than any live request), shrunk (the request
that made it wide is cleared) or must stay as it is (``frozen``: a CUDA graph
captured ``apply`` and holds the tables' addresses and widths;
docs/logits.md, "CUDA graphs").
"""

from __future__ import annotations

import numbers
from collections.abc import Mapping
from dataclasses import dataclass, field

import torch

from stopline._caps import field_error, shown

from .limits import LIMITS

#: The table widths a request needs, in the order of ``SlotHost.widths``.
WIDTHS = ("stop_token_ids", "sparse_bans", "logit_bias", "bad_words", "bad_word_prefix")


def next_pow2(n: int) -> int:
    return 1 if n <= 1 else 1 << (n - 1).bit_length()


def pack_bits(keep: torch.Tensor) -> torch.Tensor:
    """bool [32*W] -> int32 [W], bit j of word w = keep[32*w + j] (xgrammar layout)."""
    bits = keep.view(-1, 32).to(torch.int64) << torch.arange(32, dtype=torch.int64)
    words = bits.sum(dim=1)
    return torch.where(words >= 2**31, words - 2**32, words).to(torch.int32)


@dataclass
class SlotHost:
    """Host mirror of one slot, for bookkeeping that must not touch the device."""

    active: bool = False
    has_bad_multi: bool = False
    num_tokens: int = 0  # output tokens appended so far (history length)
    # Table widths this slot needs (what a shrink must keep), in WIDTHS order.
    widths: tuple[int, int, int, int, int] = (0, 0, 0, 0, 0)
    dense: bool = False


@dataclass
class DeviceState:
    """Per-slot constraint tables on the logits' device; read by both backends.

    Shapes (S = max_slots, W = ceil(vocab_size / 32)); id tables are int32,
    padded with -1; every stored id was checked to lie in [0, vocab_size):

    - ``min_tokens[S]``, ``restore[S]`` (codes of ``RESTORE_POLICIES``)
    - ``stop_ids[S, C_stop]``: distinct stop ids (EOS included)
    - ``ban_ids[S, C_ban]``: distinct single-token bad words kept sparse
    - ``has_allowed[S]``, ``allowed[S, W]``: per-slot dense token mask, bit j of
      word w = token 32*w+j allowed (allowed_token_ids minus folded bans)
    - ``bad_prefix[S, C_bad, C_pfx]``, ``bad_prefix_len[S, C_bad]`` (0 = unused),
      ``bad_last[S, C_bad]``: multi-token bad words
    - ``history[S, C_pfx]``: ring of the last C_pfx output tokens, token at output
      position q stored at ``q % C_pfx``; ``history_len[S]``: output tokens so far
    - ``bias_ids[S, C_bias]`` (distinct), ``bias_values[S, C_bias]`` (float32)
    - ``forced[S]``: the token id the slot's rows are forced to, -1 for none
      (``LogitsConstraints.force``)

    Capacities (C_*) are powers of two, grown (doubled or more) only when a
    ``set`` needs a wider row than any before; ``set``/``clear`` otherwise
    write only that slot's rows.
    """

    min_tokens: torch.Tensor
    restore: torch.Tensor
    stop_ids: torch.Tensor
    ban_ids: torch.Tensor
    has_allowed: torch.Tensor
    allowed: torch.Tensor
    bad_prefix: torch.Tensor
    bad_prefix_len: torch.Tensor
    bad_last: torch.Tensor
    history: torch.Tensor
    history_len: torch.Tensor
    bias_ids: torch.Tensor
    bias_values: torch.Tensor
    forced: torch.Tensor
    any_allowed: bool = False  # some slot uses the dense mask (kernel specialisation)
    extras: dict = field(default_factory=dict)


def reserve_widths(reserve: Mapping[str, object] | None,
                   sparse_ban_limit: int) -> tuple[tuple[int, ...], bool, bool]:
    """The constructor's ``reserve`` as table widths (WIDTHS order), whether
    the dense token mask is allocated up front, and whether a frozen state
    serves ``force``.

    Keys: ``stop_token_ids``, ``sparse_bans`` (one-token bad words kept as
    ids, at most ``sparse_ban_limit``), ``logit_bias``, ``bad_words``
    (multi-token words per slot), ``bad_word_tokens`` (tokens of the longest
    such word), ``allowed_token_ids`` (bool: the dense mask) and
    ``forced_token`` (bool, default True: a graph captured with no slot forced
    still serves a later ``force``). Each count is bounded by its cap in
    ``LIMITS``.

    Raises:
        TypeError / ValueError: an unknown key, a non-int or negative count, a
            count over its cap, ``bad_word_tokens`` without ``bad_words``.
    """
    if reserve is None:
        return (0, 0, 0, 0, 0), False, True
    if not isinstance(reserve, Mapping):
        raise field_error(TypeError, "reserve", f"reserve must be a mapping of table name to capacity, got {shown(reserve)}", "wrong_type")
    caps = {
        "stop_token_ids": LIMITS["max_stop_token_ids"],
        "sparse_bans": sparse_ban_limit,
        "logit_bias": LIMITS["max_logit_bias"],
        "bad_words": LIMITS["max_bad_words"],
        "bad_word_tokens": LIMITS["max_bad_word_tokens"],
    }
    counts = {}
    flags = ("allowed_token_ids", "forced_token")
    for key, value in reserve.items():
        if key in flags:
            if not isinstance(value, bool):
                raise field_error(
                    TypeError,
                    f"reserve.{key}",
                    f"reserve[{key!r}] must be a bool, got {shown(value)}",
                    "wrong_type",
                )
            continue
        if key not in caps:
            raise field_error(
                ValueError,
                "reserve",
                f"reserve: unknown table {shown(key)}; known: {sorted([*caps, *flags])}",
                "unknown_key",
            )
        if isinstance(value, bool) or not isinstance(value, numbers.Integral):
            raise field_error(TypeError, f"reserve.{key}", f"reserve[{shown(key)}] must be an int, got {shown(value)}", "wrong_type")
        if not 0 <= int(value) <= caps[key]:
            raise field_error(ValueError, f"reserve.{key}", f"reserve[{shown(key)}]={value} is outside [0, {caps[key]}]", "out_of_range")
        counts[key] = int(value)
    if counts.get("bad_word_tokens", 0) > 1 and not counts.get("bad_words"):
        raise field_error(
            ValueError,
            "reserve.bad_word_tokens",
            "reserve: 'bad_word_tokens' needs 'bad_words' (the multi-token words per slot)",
            "required",
        )
    n_bad = counts.get("bad_words", 0)
    prefix = max(counts.get("bad_word_tokens", 2), 2) - 1 if n_bad else 0
    widths = (counts.get("stop_token_ids", 0), counts.get("sparse_bans", 0), counts.get("logit_bias", 0), n_bad, prefix)
    return widths, bool(reserve.get("allowed_token_ids", False)), bool(reserve.get("forced_token", True))


class DeviceTables:
    """The device state of ``max_slots`` slots and the host record of each.

    ``reserved`` widths (WIDTHS order) are allocated up front and never shrunk
    below; ``frozen`` (set by ``freeze`` or when ``apply`` runs inside a CUDA
    graph capture) keeps every table where it is: a ``set`` that would need a
    larger one is refused, and a ``clear`` shrinks nothing.
    """

    def __init__(self, max_slots: int, vocab_size: int, device: torch.device,
                 reserved: tuple[int, ...] = (0, 0, 0, 0, 0), reserve_dense: bool = False):
        self.max_slots, self.vocab_size, self.device = max_slots, vocab_size, device
        self.num_words = (vocab_size + 31) // 32
        self.frozen = False
        self.reserve_dense = reserve_dense
        # The narrowest each table may become: stop_ids keeps 4 columns.
        self.floor = tuple(max(4 if i == 0 else 0, next_pow2(w) if w else 0) for i, w in enumerate(reserved))
        if reserved[3]:
            self.check_bad_words_table(reserved[3], reserved[4], current=(0, 0))
        S, dev = max_slots, device
        n_bad, n_pfx = self.floor[3], self.floor[4]

        def ids(cols: int) -> torch.Tensor:
            return torch.full((S, cols), -1, dtype=torch.int32, device=dev)

        self.state = DeviceState(
            min_tokens=torch.zeros(S, dtype=torch.int32, device=dev),
            restore=torch.full((S,), 1, dtype=torch.int32, device=dev),  # "structured"
            stop_ids=ids(self.floor[0]),
            ban_ids=ids(self.floor[1]),
            has_allowed=torch.zeros(S, dtype=torch.int32, device=dev),
            allowed=torch.zeros((S if reserve_dense else 0, self.num_words), dtype=torch.int32, device=dev),
            bad_prefix=torch.full((S, n_bad, n_pfx), -1, dtype=torch.int32, device=dev),
            bad_prefix_len=torch.zeros((S, n_bad), dtype=torch.int32, device=dev),
            bad_last=ids(n_bad),
            history=ids(n_pfx),
            history_len=torch.zeros(S, dtype=torch.int32, device=dev),
            bias_ids=ids(self.floor[2]),
            bias_values=torch.zeros((S, self.floor[2]), dtype=torch.float32, device=dev),
            forced=torch.full((S,), -1, dtype=torch.int32, device=dev),
            any_allowed=reserve_dense,
        )
        self.slots = [SlotHost() for _ in range(S)]

    def capacities(self) -> tuple[int, int, int, int, int]:
        st = self.state
        return (st.stop_ids.shape[1], st.ban_ids.shape[1], st.bias_ids.shape[1],
                st.bad_prefix.shape[1], st.bad_prefix.shape[2])

    # ------------------------------------------------------------ set / clear
    def prepare(self, s: int, widths: tuple[int, int, int, int, int], dense: bool) -> None:
        """Make every table wide enough for slot ``s``'s new request (after
        forgetting its old one), or refuse while frozen. Validation of the
        request is done; this is the last step that may raise."""
        if self.frozen:
            short = [f"{w} {name} (the tables hold {c})"
                     for name, w, c in zip(WIDTHS, widths, self.capacities()) if w > c]
            if dense and self.state.allowed.shape[0] == 0:
                short.append("a dense token mask (allowed_token_ids, or many one-token bad words)")
            if short:
                raise field_error(
                    RuntimeError,
                    "reserve",
                    f"LogitsConstraints.set: slot {s} needs {', '.join(short)}, but the tables are frozen "
                    "(a CUDA graph captured apply(), or freeze() was called) and growing them would leave the "
                    "graph reading freed memory; size them up front with LogitsConstraints(..., reserve={...}), "
                    "or unfreeze() once no captured graph is replayed",
                    "no_room",
                    slot=s,
                )
            self.slots[s] = SlotHost()
            return
        self.release(s, keep=widths)
        self.ensure_width("stop_ids", widths[0])
        self.ensure_width("ban_ids", widths[1])
        self.ensure_width("bias_ids", widths[2])
        if widths[3]:
            self.ensure_bad_words(widths[3], widths[4])
        if dense and self.state.allowed.shape[0] == 0:
            self.state.allowed = torch.zeros((self.max_slots, self.num_words), dtype=torch.int32, device=self.device)
        if dense:
            self.state.any_allowed = True

    def release(self, s: int, keep: tuple[int, ...] = (0, 0, 0, 0, 0)) -> None:
        """Forget slot ``s``'s host record; when it was the one that made a
        table wide (more than 4x what every other live slot needs), shrink
        that table (not below the reserve, and not while frozen), so one
        large request does not make every later ``apply`` pay for it.
        O(max_slots) only when such a slot goes."""
        old = self.slots[s]
        self.slots[s] = SlotHost()
        if not old.active or self.frozen:
            return
        st = self.state
        current = self.capacities()
        if not old.dense and all(4 * w <= c or c <= max(4, f) for w, c, f in zip(old.widths, current, self.floor)):
            return
        live = [h for h in self.slots if h.active]
        need = [max(max((h.widths[i] for h in live), default=0), keep[i]) for i in range(5)]
        for i, name in enumerate(("stop_ids", "ban_ids", "bias_ids")):
            width = max(self.floor[i], next_pow2(need[i]) if need[i] else 0)
            if current[i] > 4 * max(need[i], 1) and current[i] > width:
                self.shrink_width(name, width)
        nb = max(self.floor[3], next_pow2(need[3]) if need[3] else 0)
        npfx = max(self.floor[4], next_pow2(need[4]) if need[4] else 0)
        if (current[3] > 4 * max(need[3], 1) or current[4] > 4 * max(need[4], 1)) and (nb, npfx) != current[3:]:
            self.resize_bad_words(nb, npfx)
        if old.dense and st.any_allowed and not self.reserve_dense and not any(h.dense for h in live):
            st.allowed = torch.zeros((0, self.num_words), dtype=torch.int32, device=self.device)
            st.any_allowed = False

    # --------------------------------------------------------------- capacity
    def shrink_width(self, name: str, width: int) -> None:
        st = self.state
        old = getattr(st, name)
        setattr(st, name, old[:, :width].clone())
        if name == "bias_ids":
            st.bias_values = st.bias_values[:, :width].clone()

    def check_bad_words_table(self, count: int, prefix_len: int, current: tuple[int, int] | None = None) -> None:
        """Refuse (ValueError) a multi-token table over ``max_bad_words_table_bytes``."""
        S = self.max_slots
        C_bad, C_pfx = self.capacities()[3:] if current is None else current
        nb = max(C_bad, next_pow2(count))
        npfx = max(C_pfx, next_pow2(prefix_len))
        need = S * nb * npfx * 4
        if need > LIMITS["max_bad_words_table_bytes"]:
            raise field_error(
                ValueError,
                "bad_words",
                f"bad_words: {count} multi-token words of up to {prefix_len + 1} tokens would make the batch's "
                f"bad-words table {need} bytes ({S} slots x {nb} words x {npfx} tokens); at most "
                f"{LIMITS['max_bad_words_table_bytes']} bytes are supported",
                "too_many_bytes",
            )

    def ensure_width(self, name: str, width: int) -> None:
        st = self.state
        old = getattr(st, name)
        if width <= old.shape[1]:
            return
        new_w = max(next_pow2(width), 2 * old.shape[1])
        new = torch.full((old.shape[0], new_w), -1, dtype=old.dtype, device=old.device)
        new[:, : old.shape[1]] = old
        setattr(st, name, new)
        if name == "bias_ids":
            vals = torch.zeros((old.shape[0], new_w), dtype=torch.float32, device=old.device)
            vals[:, : old.shape[1]] = st.bias_values
            st.bias_values = vals

    def ensure_bad_words(self, count: int, prefix_len: int) -> None:
        C_bad, C_pfx = self.capacities()[3:]
        if count <= C_bad and prefix_len <= C_pfx:
            return
        self.resize_bad_words(max(C_bad, next_pow2(count)), max(C_pfx, next_pow2(prefix_len)))

    def resize_bad_words(self, nb: int, npfx: int) -> None:
        """Grow or shrink the multi-token tables to ``nb`` words of ``npfx``
        prefix tokens; every live slot's words and history still fit."""
        st = self.state
        S, C_bad, C_pfx = st.bad_prefix.shape
        kb, kp = min(nb, C_bad), min(npfx, C_pfx)
        dev = self.device
        pre = torch.full((S, nb, npfx), -1, dtype=torch.int32, device=dev)
        pre[:, :kb, :kp] = st.bad_prefix[:, :kb, :kp]
        plen = torch.zeros((S, nb), dtype=torch.int32, device=dev)
        plen[:, :kb] = st.bad_prefix_len[:, :kb]
        last = torch.full((S, nb), -1, dtype=torch.int32, device=dev)
        last[:, :kb] = st.bad_last[:, :kb]
        hist = torch.full((S, npfx), -1, dtype=torch.int32, device=dev)
        if npfx != C_pfx and kp:
            # Re-seat each live ring at the new modulus (its last kp positions).
            for s, host in enumerate(self.slots):
                if host.has_bad_multi and host.num_tokens:
                    q = torch.arange(max(0, host.num_tokens - kp), host.num_tokens)
                    hist[s, (q % npfx).to(dev)] = st.history[s, (q % C_pfx).to(dev)]
        elif kp:
            hist[:, :kp] = st.history[:, :kp]
        st.bad_prefix, st.bad_prefix_len, st.bad_last, st.history = pre, plen, last, hist
