"""``LogitsConstraints``: the per-slot constraints object engines call.

It checks each request on the host (``set``, with the checks of
:mod:`~stopline.logits.checks`), keeps the device tables through
:class:`~stopline.logits.device_state.DeviceTables`, and applies the
pipeline of docs/semantics.md section 8 with one of the two backends
(``apply``). The package docstring (:mod:`stopline.logits`) describes the
pipeline.
"""

from __future__ import annotations

import numbers
from collections.abc import Iterable, Mapping, Sequence

import torch

from stopline._caps import at_slot, capped, field_error, shown

from . import checks
from .device_state import DeviceState, DeviceTables, SlotHost, pack_bits, reserve_widths
from .limits import BACKENDS, LIMITS, RESTORE_POLICIES
from .tuning import KernelTuning, interpreting

LOGITS_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
_INT_DTYPES = (torch.int32, torch.int64)


class LogitsConstraints:
    """Per-slot logits constraints, applied in place once per engine step.

    Args:
        max_slots: number of slots (concurrent sequences), slot ids are
            ``0..max_slots-1``.
        vocab_size: width of the logits rows this state applies to (the
            model's logits width, padding included); token ids must lie in
            ``[0, vocab_size)``.
        device: device of the logits; the state lives there.
        reserve: table capacities allocated up front and never shrunk below,
            for engines that capture ``apply`` in a CUDA graph (after a
            capture the tables cannot grow; docs/logits.md, "CUDA graphs"):
            ``{"stop_token_ids": n, "sparse_bans": n, "logit_bias": n,
            "bad_words": n, "bad_word_tokens": n, "allowed_token_ids": bool}``
            (entries per slot; ``bad_words`` counts multi-token words,
            ``bad_word_tokens`` their longest length; each bounded by its cap
            in ``LIMITS``, ``sparse_bans`` by 64). Rounded up to powers of two.
            ``"forced_token": False`` declares that no slot is forced while
            frozen (:meth:`force` then raises), so a captured graph leaves out
            the forced-token read (default True: a graph captured with no
            slot forced serves a later ``force``).

    The kernel's launch knobs are read from the environment here
    (``STOPLINE_LOGITS_TILE``, :class:`~stopline.logits.tuning.KernelTuning`),
    not at import.

    Raises:
        TypeError / ValueError: non-int or non-positive ``max_slots`` /
            ``vocab_size``, a dense mask table over ``max_dense_table_bytes``,
            a malformed ``reserve`` or one over the caps, a malformed
            ``STOPLINE_LOGITS_TILE``.
    """

    def __init__(self, max_slots: int, vocab_size: int, device: str | torch.device = "cpu", *,
                 reserve: Mapping[str, int | bool] | None = None, _tuning: KernelTuning | None = None):
        for name, value in (("max_slots", max_slots), ("vocab_size", vocab_size)):
            if isinstance(value, bool) or not isinstance(value, numbers.Integral):
                raise field_error(TypeError, name, f"{name} must be an int, got {shown(value)}", "wrong_type")
            if value <= 0:
                raise field_error(ValueError, name, f"{name} must be positive, got {value}", "below")
        if int(vocab_size) > checks.MAX_VOCAB:
            raise field_error(ValueError, "vocab_size", f"vocab_size {vocab_size} does not fit int32 token ids", "greater")
        if int(max_slots) > LIMITS["max_slots"]:
            raise field_error(ValueError, "max_slots", f"max_slots={max_slots} is more than the supported {LIMITS['max_slots']}", "greater")
        dense_bytes = int(max_slots) * ((int(vocab_size) + 31) // 32) * 4
        if dense_bytes > LIMITS["max_dense_table_bytes"]:
            raise field_error(
                ValueError,
                "max_slots",
                f"max_slots={max_slots} x vocab_size={vocab_size} needs a {dense_bytes}-byte token-mask table "
                f"(for allowed_token_ids); at most {LIMITS['max_dense_table_bytes']} bytes are supported",
                "too_many_bytes",
            )
        self._tuning = KernelTuning.from_env() if _tuning is None else _tuning
        widths, dense, self._force_when_frozen = reserve_widths(reserve, self._tuning.sparse_ban_limit)
        self.max_slots = int(max_slots)
        self.vocab_size = int(vocab_size)
        self.device = torch.device(device)
        self.num_words = (self.vocab_size + 31) // 32
        self._tables = DeviceTables(self.max_slots, self.vocab_size, self.device, widths, dense)
        self._forced: dict[int, int] = {}  # slot -> forced token id (host mirror of state.forced)

    @property
    def state(self) -> DeviceState:
        """The device tables both backends read (replaced when a table is resized)."""
        return self._tables.state

    @property
    def _slots(self) -> list[SlotHost]:
        return self._tables.slots

    # ------------------------------------------------------------ CUDA graphs
    @property
    def frozen(self) -> bool:
        """True while the tables may not be reallocated (see :meth:`freeze`)."""
        return self._tables.frozen

    def freeze(self) -> None:
        """Keep every table where and as wide as it is: from now on a ``set``
        that needs a wider table raises ``RuntimeError`` (state unchanged) and
        ``clear`` shrinks nothing. ``apply`` calls this itself when it runs
        inside a CUDA graph capture, since the graph holds the tables'
        addresses and widths. Reserve the capacities a graph must serve with
        the constructor's ``reserve``."""
        self._tables.frozen = True

    def unfreeze(self) -> None:
        """Let tables grow and shrink again; call it only once no graph that
        captured :meth:`apply` on this state is replayed any more (a graph
        captured with ``reserve={"forced_token": False}`` and no slot forced
        would not serve a ``force`` made after it)."""
        self._tables.frozen = False

    def _slot(self, slot) -> int:
        if isinstance(slot, bool) or not isinstance(slot, numbers.Integral):
            raise field_error(TypeError, "slot", f"slot must be an int, got {shown(slot)}", "wrong_type")
        if not 0 <= int(slot) < self.max_slots:
            raise field_error(ValueError, "slot", f"slot {slot} is outside [0, max_slots={self.max_slots})", "out_of_range", slot=int(slot))
        return int(slot)

    def set(
        self,
        slot: int,
        *,
        min_tokens: int = 0,
        stop_token_ids: Sequence[int] = (),
        allowed_token_ids: Sequence[int] | None = None,
        bad_words: Sequence[Sequence[int]] = (),
        logit_bias: Mapping[int, float] | Iterable[tuple[int, float]] | None = None,
        restore: str = "structured",
    ) -> None:
        """Start a sequence in ``slot`` with these constraints (replaces any old ones).

        Args:
            slot: slot id in ``[0, max_slots)``.
            min_tokens: output tokens that must be produced before a stop id may
                be sampled (vLLM/OpenAI ``min_tokens``); a row at output
                position ``p`` (0-based) masks stop ids while ``p < min_tokens``.
            stop_token_ids: *all* stop ids masked by ``min_tokens``, EOS ids
                included (vLLM's ``all_stop_token_ids``); duplicates are merged.
            allowed_token_ids: if given, only these tokens may be sampled
                (vLLM's ``allowed_token_ids``); must not be empty.
            bad_words: token sequences; a one-token word is always banned, a
                longer word bans its last token when the other tokens equal the
                tail of the output so far (vLLM's ``bad_words`` after
                tokenization). Each word must be non-empty: a list, tuple,
                1-D integer array or other iterable of ints (not ``str`` or
                ``bytes``); at most ``max_bad_words`` words of at most
                ``max_bad_word_tokens`` tokens. Duplicate words are merged.
                Read and laid out by the core with the GIL released after the
                lists are read.
            logit_bias: ``{token_id: bias}`` or ``(token_id, bias)`` pairs
                (OpenAI ``logit_bias``), added in float32 after the masks; ids
                must be distinct and biases finite.
            restore: ``"structured"`` (put masked stop ids back only on rows
                with a grammar, when masking left the row empty), ``"always"``
                or ``"never"``.

        The slot's output history is reset to empty; feed output tokens with
        :meth:`append_tokens`. All arguments are validated on the host before
        any device tensor is written.

        Raises:
            TypeError: a non-int id, slot or min_tokens; a malformed container.
            ValueError: an id outside ``[0, vocab_size)``, an empty
                ``allowed_token_ids`` or bad word, a duplicate ``logit_bias``
                id, a non-finite bias, negative ``min_tokens``, an unknown
                ``restore`` policy, a slot out of range, a list over its cap
                (``LIMITS``).
            RuntimeError: the tables are frozen (:meth:`freeze`; a CUDA
                graph captured :meth:`apply`) and this request needs a wider
                one than they hold; nothing was written.
        """
        s = self._slot(slot)
        with at_slot(s):  # every error of this request names the slot
            V = self.vocab_size
            (min_tokens, stops, allowed, single, n_multi, prefix, prefix_len, last, bias_ids,
             bias_vals) = checks.checked_request(V, min_tokens, stop_token_ids, allowed_token_ids, bad_words, logit_bias,
                                                 restore)
            stops = checks.distinct(stops)
            allowed = None if allowed is None else checks.distinct(allowed)
            dense_bans = allowed is not None or len(single) > self._tuning.sparse_ban_limit
            widths = (len(stops), 0 if dense_bans else len(single), len(bias_ids), n_multi, prefix.shape[1])
            if n_multi and not self._tables.frozen:
                self._tables.check_bad_words_table(widths[3], widths[4])
            # Validation done; the tables fit the request (or it is refused
            # while frozen), then only this slot's rows are written.
            self._tables.prepare(s, widths, dense_bans)
        st = self.state
        dev = self.device

        def row(values, width, fill=-1, dtype=torch.int32):
            out = torch.full((width,), fill, dtype=dtype)
            if len(values):
                out[: len(values)] = values if isinstance(values, torch.Tensor) else torch.tensor(values, dtype=dtype)
            return out.to(dev, non_blocking=True)

        st.min_tokens[s] = min_tokens
        st.restore[s] = RESTORE_POLICIES[restore]
        st.stop_ids[s] = row(stops, st.stop_ids.shape[1])
        if st.ban_ids.shape[1]:
            st.ban_ids[s] = row(single[:0] if dense_bans else single, st.ban_ids.shape[1])
        if dense_bans:
            keep = torch.zeros(self.num_words * 32, dtype=torch.bool)
            if allowed is None:
                keep[:V] = True
            else:
                keep[torch.tensor(allowed, dtype=torch.long)] = True
            if len(single):
                keep[single.long()] = False
            st.allowed[s] = pack_bits(keep).to(dev, non_blocking=True)
            st.has_allowed[s] = 1
        else:
            st.has_allowed[s] = 0
        if st.bad_prefix_len.shape[1]:
            C_bad, C_pfx = st.bad_prefix.shape[1:]
            pre = torch.full((C_bad, C_pfx), -1, dtype=torch.int32)
            pre[:n_multi, : prefix.shape[1]] = prefix
            plen = torch.zeros(C_bad, dtype=torch.int32)
            plen[:n_multi] = prefix_len
            last_row = torch.full((C_bad,), -1, dtype=torch.int32)
            last_row[:n_multi] = last
            st.bad_prefix[s] = pre.to(dev, non_blocking=True)
            st.bad_prefix_len[s] = plen.to(dev, non_blocking=True)
            st.bad_last[s] = last_row.to(dev, non_blocking=True)
            st.history[s] = -1
            st.history_len[s] = 0
        if st.bias_ids.shape[1]:
            st.bias_ids[s] = row(bias_ids, st.bias_ids.shape[1])
            st.bias_values[s] = row(bias_vals, st.bias_ids.shape[1], 0.0, torch.float32)
        self._slots[s] = SlotHost(active=True, has_bad_multi=bool(n_multi), num_tokens=0, widths=widths, dense=dense_bans)
        self._unforce(s)

    def clear(self, slot: int) -> None:
        """Remove the slot's constraints (its rows then get only a grammar bitmask).

        Writes only that slot's rows of the state. Raises ``TypeError`` /
        ``ValueError`` for a bad slot id.
        """
        s = self._slot(slot)
        st = self.state
        st.min_tokens[s] = 0
        st.restore[s] = RESTORE_POLICIES["structured"]
        st.stop_ids[s] = -1
        if st.ban_ids.shape[1]:
            st.ban_ids[s] = -1
        st.has_allowed[s] = 0
        if st.bad_prefix_len.shape[1]:
            st.bad_prefix_len[s] = 0
            st.bad_last[s] = -1
            st.history_len[s] = 0
        if st.bias_ids.shape[1]:
            st.bias_ids[s] = -1
        self._unforce(s)
        self._tables.release(s)

    def force(self, slot: int, token_id: int | None) -> None:
        """Force every row of ``slot`` to sample ``token_id`` (``None``: stop forcing).

        A forced row leaves ``apply`` with every column ``-inf`` except
        ``token_id``, which keeps the row's input logit (the value before any
        constraint), or 0.0 if that logit is not finite; so the row is never
        empty and never ``infeasible``. Forcing overrides the slot's other
        constraints and the grammar bitmask on that row (none of them is applied
        to it), as a thinking budget must emit its end marker whatever else is
        set (docs/logits.md, "Forced token"). It lasts until ``force(slot,
        None)``, ``set`` or ``clear``. The id is checked on the host here, so
        ``apply`` never writes outside the row; the device table is written
        without a sync and without reallocation (allowed while frozen, unless
        the constructor's ``reserve`` said ``"forced_token": False``).

        Raises:
            TypeError / ValueError: a bad slot; a non-int ``token_id`` or one
                outside ``[0, vocab_size)``.
            RuntimeError: the state is frozen and was built with
                ``reserve={"forced_token": False}`` (a captured graph does not
                read the forced ids); nothing is written.
        """
        s = self._slot(slot)
        if token_id is None:
            self._unforce(s)
            return
        with at_slot(s):
            tid = checks.token_id(token_id, "token_id", self.vocab_size, shown_as="force token_id")
        if self.frozen and not self._force_when_frozen:
            raise field_error(
                RuntimeError,
                "reserve.forced_token",
                f"LogitsConstraints.force: slot {s} cannot be forced while the tables are frozen: this state was "
                "built with reserve={'forced_token': False}, so graphs captured with no slot forced do not read "
                "forced ids",
                "unsupported",
                slot=s,
            )
        self.state.forced[s] = tid
        self._forced[s] = tid

    def forced_token(self, slot: int) -> int | None:
        """The token id ``slot`` is forced to (``force``), or ``None`` (host mirror, no sync)."""
        s = self._slot(slot)
        return self._forced.get(s)

    def _unforce(self, s: int) -> None:
        if self._forced.pop(s, None) is not None:
            self.state.forced[s] = -1

    def append_tokens(self, slot: int, token_ids) -> None:
        """Append sampled (accepted) output tokens of ``slot`` to its history.

        Args:
            slot: slot id.
            token_ids: a sequence of ints or a 1-D integer tensor (any device;
                a tensor is copied without a host sync and its values are not
                range-checked: history tokens are only compared, never used
                as addresses).

        Only slots with multi-token bad words keep device history (the last
        ``C_pfx`` tokens, enough for their longest prefix); for the others this
        only counts tokens on the host.

        Raises:
            TypeError / ValueError: a bad slot, a non-int id, an id outside
                ``[0, vocab_size)`` in a sequence, a tensor that is not 1-D int.
        """
        s = self._slot(slot)
        if isinstance(token_ids, torch.Tensor):
            if token_ids.dim() != 1 or token_ids.dtype not in _INT_DTYPES + (torch.int16, torch.uint8, torch.int8):
                raise field_error(
                    TypeError,
                    "token_ids",
                    f"token_ids tensor must be 1-D integer, got {token_ids.dtype} {tuple(token_ids.shape)}",
                    "wrong_type",
                    slot=s,
                )
            ids_t = token_ids.to(device=self.device, dtype=torch.int32)
        else:
            with at_slot(s):
                ids_t = torch.tensor(checks.token_ids(token_ids, "token_ids", self.vocab_size), dtype=torch.int32)
        k = int(ids_t.shape[0])
        host = self._slots[s]
        n = host.num_tokens
        host.num_tokens = n + k
        if not host.has_bad_multi or k == 0:
            return
        st = self.state
        H = st.history.shape[1]
        keep = min(k, H)
        pos = torch.arange(n + k - keep, n + k, dtype=torch.long) % H
        st.history[s, pos.to(self.device, non_blocking=True)] = ids_t[k - keep :].to(self.device, non_blocking=True)
        st.history_len[s] = n + k

    def load_history(self, slots: torch.Tensor, table: torch.Tensor, starts: torch.Tensor, ends: torch.Tensor) -> None:
        """Set the output history of several slots from an engine's token table on the device,
        without a host sync: slot ``slots[i]``'s output tokens are ``table[slots[i],
        starts[i]:ends[i]]`` (vLLM's model runner V2 keeps ``all_token_ids[slot, :total_len]``
        with the output from ``prompt_len`` on). The device form of :meth:`append_tokens`
        for engines whose history never reaches the host: it replaces the slot's history
        (the last ``C_pfx`` tokens are copied) rather than appending, and does not move the
        host count :meth:`num_tokens`.

        Args:
            slots: int ``[k]`` on this state's device, distinct slots in ``[0, max_slots)``
                (not range-checked: no sync; an engine's own slot indices).
            table: int ``[>= max slot + 1, L]`` on this state's device.
            starts, ends: int ``[k]``, ``0 <= starts[i] <= ends[i] <= L``.

        Raises:
            TypeError / ValueError: tensors of the wrong dtype, rank, length or device.
        """
        dev = self.device
        for name, t, rank in (("slots", slots, 1), ("table", table, 2), ("starts", starts, 1), ("ends", ends, 1)):
            _check_tensor(t, name, _INT_DTYPES, None, dev)
            if t.dim() != rank or (rank == 1 and t.shape[0] != slots.shape[0]):
                raise field_error(ValueError, name, f"{name} must be {rank}-D with one entry per slot, got "
                                  f"{tuple(t.shape)}", "invalid")
        st = self.state
        H = st.history.shape[1]
        if H == 0 or slots.shape[0] == 0:
            return
        s = slots.long()[:, None]
        n = (ends.long() - starts.long())[:, None]
        q = n - H + torch.arange(H, device=dev)  # the last H output positions, H distinct residues mod H
        col = (starts.long()[:, None] + q).clamp(0, max(table.shape[1] - 1, 0))
        ring = q.remainder(H)
        st.history[s, ring] = torch.where(q >= 0, table[s, col].to(st.history.dtype), st.history[s, ring])
        st.history_len[slots.long()] = n[:, 0].to(st.history_len.dtype)

    def num_tokens(self, slot: int) -> int:
        """Output tokens appended to ``slot`` since its ``set`` (host count, no sync)."""
        return self._slots[self._slot(slot)].num_tokens


    def apply(
        self,
        logits: torch.Tensor,
        row_slots,
        row_positions,
        bitmask: torch.Tensor | None = None,
        grammar_rows: torch.Tensor | None = None,
        backend: str = "auto",
        *,
        draft_token_ids: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Apply the constraints in place; return ``infeasible`` (bool ``[rows]``).

        Args:
            logits: ``[rows, vocab_size]`` float32/bfloat16/float16 on this
                state's device, last dimension contiguous; modified in place.
            row_slots: ``[rows]`` int32/int64 tensor on the same device (or a
                sequence of ints): the slot each row samples for. A row may
                repeat a slot (speculative decoding: one row per draft
                position). A device tensor is not range-checked on the host (no
                sync): a row whose slot is outside ``[0, max_slots)`` is left
                untouched and reported infeasible; a sequence or CPU tensor is
                checked here and raises ``ValueError``.
            row_positions: ``[rows]`` int32/int64: the 0-based output position
                the row samples (the number of output tokens before it). Decides
                ``min_tokens`` and where a multi-token bad word must match.
            bitmask: optional int32 ``[rows, ceil(vocab_size/32)]`` in
                xgrammar's ``apply_token_bitmask_inplace`` layout (bit j of word
                w set = token 32*w+j allowed); applied to grammar rows.
            grammar_rows: optional bool ``[rows]``: rows that have a grammar.
                Default: every row when ``bitmask`` is given, none otherwise.
                The bitmask is applied only to grammar rows, and only grammar
                rows may have stop logits restored under ``"structured"``
                (rows may be marked without a bitmask when the engine applied
                the grammar itself).
            backend: ``"torch"``, ``"triton"`` or ``"auto"`` (triton on CUDA,
                torch otherwise).
            draft_token_ids: optional int ``[rows, D]`` for speculative rows:
                ``draft_token_ids[r, i]`` is the output token at position
                ``n + i`` where ``n`` = tokens appended to the row's slot
                (:meth:`num_tokens`); pad with -1. A row at position ``p``
                matches multi-token bad words against the appended history
                followed by ``draft_token_ids[r, :p-n]``. Positions for which no
                token is known (not supplied, or dropped from the ring) never
                match.

        Returns:
            bool tensor ``[rows]`` on the logits' device: True where the row
            has no finite logit after the whole pipeline.

        Raises:
            TypeError: wrong tensor dtypes or non-tensor logits.
            ValueError: shape/device mismatches, an unknown backend, a slot
                out of range in host data, triton asked for on CPU without
                ``TRITON_INTERPRET=1``.
        """
        if backend not in BACKENDS:
            raise field_error(ValueError, "backend", f"backend must be one of {BACKENDS}, got {shown(backend)}", "not_one_of")
        if not isinstance(logits, torch.Tensor):
            raise field_error(TypeError, "logits", f"logits must be a torch.Tensor, got {type(logits).__name__}", "wrong_type")
        if logits.dtype not in LOGITS_DTYPES:
            raise field_error(TypeError, "logits", f"logits dtype must be float32, bfloat16 or float16, got {logits.dtype}", "wrong_type")
        if logits.dim() != 2 or logits.shape[1] != self.vocab_size:
            raise field_error(
                ValueError,
                "logits",
                f"logits must be [rows, vocab_size={self.vocab_size}], got {tuple(logits.shape)}",
                "invalid",
            )
        if logits.device != self.device and not _same_device(logits.device, self.device):
            raise field_error(ValueError, "logits", f"logits are on {logits.device} but the state is on {self.device}", "invalid")
        if logits.shape[1] > 1 and logits.stride(1) != 1:
            raise field_error(ValueError, "logits", "logits: the vocab dimension must be contiguous (stride 1)", "invalid")
        rows = logits.shape[0]
        dev = logits.device
        row_slots = self._row_tensor(row_slots, "row_slots", rows, dev, check_slots=True)
        row_positions = self._row_tensor(row_positions, "row_positions", rows, dev, check_slots=False)
        if bitmask is not None:
            _check_tensor(bitmask, "bitmask", (torch.int32,), (rows, self.num_words), dev)
            if self.num_words > 1 and bitmask.stride(1) != 1:
                raise field_error(ValueError, "bitmask", "bitmask: the word dimension must be contiguous (stride 1)", "invalid")
        if grammar_rows is not None:
            _check_tensor(grammar_rows, "grammar_rows", (torch.bool,), (rows,), dev)
        if draft_token_ids is not None:
            _check_tensor(draft_token_ids, "draft_token_ids", _INT_DTYPES, None, dev)
            if draft_token_ids.dim() != 2 or draft_token_ids.shape[0] != rows:
                raise field_error(
                    ValueError,
                    "draft_token_ids",
                    f"draft_token_ids must be [rows={rows}, D], got {tuple(draft_token_ids.shape)}",
                    "invalid",
                )
            if draft_token_ids.shape[1] > 1 and draft_token_ids.stride(1) != 1:
                raise field_error(ValueError, "draft_token_ids", "draft_token_ids: the last dimension must be contiguous", "invalid")
        if backend == "auto":
            backend = "triton" if dev.type == "cuda" else "torch"
        if backend == "triton" and dev.type != "cuda" and not interpreting():
            raise field_error(
                ValueError,
                "backend",
                "backend='triton' needs CUDA logits (or TRITON_INTERPRET=1 to run the kernel on CPU)",
                "unsupported",
            )
        if rows == 0:
            return torch.zeros(0, dtype=torch.bool, device=dev)
        if dev.type == "cuda" and torch.cuda.is_current_stream_capturing():
            self.freeze()  # the graph now holds the tables' addresses and widths
        if backend == "torch":
            from .reference import apply_reference

            return apply_reference(self.state, logits, row_slots, row_positions, bitmask, grammar_rows,
                                   draft_token_ids, self.max_slots)
        from .triton_kernel import apply_triton

        return apply_triton(self.state, logits, row_slots, row_positions, bitmask, grammar_rows, draft_token_ids,
                            self.max_slots, tuning=self._tuning, n_forced=len(self._forced),
                            may_force=bool(self._forced) or (self.frozen and self._force_when_frozen))

    def _row_tensor(self, value, name, rows, dev, check_slots):
        if isinstance(value, torch.Tensor):
            _check_tensor(value, name, _INT_DTYPES, (rows,), dev)
            if check_slots and value.device.type == "cpu":
                self._check_slot_values(value)
            return value
        if isinstance(value, (str, bytes, Mapping)) or not isinstance(value, Iterable):
            raise field_error(TypeError, name, f"{name} must be an int tensor or a sequence of ints, got {shown(value)}", "wrong_type")
        try:
            n = len(value)  # type: ignore[arg-type]
        except TypeError:
            n = None
        if n is not None and n != rows:
            raise field_error(ValueError, name, f"{name} must have one entry per logits row ({rows}), got {n}", "count")
        vals = capped(value, name, rows)
        for v in vals:
            if isinstance(v, bool) or not isinstance(v, numbers.Integral):
                raise field_error(TypeError, name, f"{name}: {shown(v)} is not an int", "wrong_type")
            if not -(2**31) <= int(v) < 2**31:
                what = "slot" if check_slots else "position"
                raise field_error(ValueError, name, f"{name}: {what} {v} is outside the int32 range", "out_of_range")
        t = torch.tensor(vals, dtype=torch.int64)
        if t.shape != (rows,):
            raise field_error(ValueError, name, f"{name} must have one entry per logits row ({rows}), got {len(vals)}", "count")
        if check_slots:
            self._check_slot_values(t)
        return t.to(dev, non_blocking=True)

    def _check_slot_values(self, t: torch.Tensor) -> None:
        if t.numel():
            lo, hi = int(t.min()), int(t.max())
            if lo < 0 or hi >= self.max_slots:
                bad = lo if lo < 0 else hi
                raise field_error(
                    ValueError,
                    "row_slots",
                    f"row_slots: slot {bad} is outside [0, max_slots={self.max_slots})",
                    "out_of_range",
                    slot=bad,
                )


def _same_device(a: torch.device, b: torch.device) -> bool:
    if a.type != b.type:
        return False
    if a.type == "cuda":
        ia = a.index if a.index is not None else torch.cuda.current_device()
        ib = b.index if b.index is not None else torch.cuda.current_device()
        return ia == ib
    return True


def _check_tensor(t, name, dtypes, shape, dev) -> None:
    if not isinstance(t, torch.Tensor):
        raise field_error(TypeError, name, f"{name} must be a torch.Tensor, got {type(t).__name__}", "wrong_type")
    if t.dtype not in dtypes:
        raise field_error(TypeError, name, f"{name} dtype must be one of {[str(d) for d in dtypes]}, got {t.dtype}", "wrong_type")
    if shape is not None and tuple(t.shape) != tuple(shape):
        raise field_error(ValueError, name, f"{name} must have shape {tuple(shape)}, got {tuple(t.shape)}", "invalid")
    if not _same_device(t.device, dev):
        raise field_error(ValueError, name, f"{name} is on {t.device} but logits are on {dev}", "invalid")
