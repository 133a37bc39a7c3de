"""stopline behind ``transformers.generate``: stopping criteria and a logits processor.

``FinishCriteria`` is a ``transformers.StoppingCriteria`` that runs every row of
a ``generate`` call through stopline's finish machine (:class:`stopline.FinishBatch`):
stop strings and regexes, EOS and stop token ids with ``min_tokens``,
``max_tokens``, repetition, in the order of docs/semantics.md section 3, and
afterwards reports per row what an engine would (``finish_reason``,
``stop_reason``, the kept text and token count).

``ConstraintsProcessor`` is a ``transformers.LogitsProcessor`` over
:class:`stopline.logits.LogitsConstraints`: ``min_tokens``, ``bad_words``,
``allowed_token_ids`` and ``logit_bias`` per row, masked so that no row is left
without a finite logit; given the ``FinishCriteria`` of the same call
(``finish=``), it also forces the end marker once a row's thinking budget
(``StopParams.max_reasoning_tokens``) is spent.

With reasoning markers in the ``StopParams`` (docs/semantics.md section 11)
stop strings apply to the content only, and ``FinishCriteria`` reports each
row's reasoning and content apart after ``generate``
(:meth:`FinishCriteria.reasoning_texts` / :meth:`FinishCriteria.content_texts`).

Both take the rows of ``input_ids`` as they are laid out by ``generate`` with
``num_beams=1`` (greedy or sampling, any batch size, assisted generation
included). Beam search reorders rows between calls; both detect that and raise
``ValueError`` rather than attribute tokens to the wrong sequence.

The prompt length is the width of ``input_ids`` at the first call (minus the
tokens it already carries for ``FinishCriteria``, which ``generate`` calls
after appending the first new token); pass ``prompt_len`` to state it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

try:
    import numpy as np
    import torch
    from transformers import LogitsProcessor, StoppingCriteria
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ImportError(
        "stopline.integrations.hf needs transformers and torch: pip install 'stopline[hf]'"
    ) from exc

from .. import FinishBatch, StepResult, StopParams, Vocabulary
from .._caps import field_error, integer
from ..engines._common import vocabulary_for as engines_vocabulary_for
from ..logits import LogitsConstraints

__all__ = ["FinishCriteria", "ConstraintsProcessor", "vocabulary_for"]


def _per_row(value: Any, rows: int, field: str, kind: type) -> list[Any]:
    """One ``kind`` value for every row, or a sequence of exactly ``rows`` of them."""
    if isinstance(value, kind):
        return [value] * rows
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence):
        raise field_error(
            TypeError,
            field,
            f"{field} must be a {kind.__name__} or a sequence of them, got {type(value).__name__}",
            "wrong_type",
        )
    if len(value) != rows:
        raise field_error(ValueError, field, f"{field} has {len(value)} entries but the batch has {rows} rows", "count")
    for i, v in enumerate(value):
        if not isinstance(v, kind):
            raise field_error(TypeError, f"{field}[{i}]", f"{field}[{i}] must be a {kind.__name__}, got {type(v).__name__}", "wrong_type")
    return list(value)


def _check_ids(input_ids: Any, field: str = "input_ids") -> tuple[int, int]:
    if not isinstance(input_ids, torch.Tensor) or len(input_ids.shape) != 2:
        raise field_error(
            ValueError,
            field,
            f"{field} must be a 2-D tensor [rows, positions], got {getattr(input_ids, 'shape', type(input_ids))}",
            "invalid",
        )
    rows, width = input_ids.shape
    return rows, width


class _RowTracker:
    """The rows' layout across calls: prompt width, tokens seen, reorder check.

    Works on a host NumPy view of the columns it needs (the last one seen and
    the new ones): one torch call, then NumPy slicing and ``tobytes``, because
    inside ``generate`` every further torch op or NumPy ufunc costs 10-30 us."""

    def __init__(self, prompt_len: int | None, owner: str):
        if prompt_len is not None:
            # A wrong type is a TypeError (it was a ValueError showing the whole value).
            prompt_len = integer(prompt_len, "prompt_len")
            if prompt_len < 0:
                raise field_error(ValueError, "prompt_len", f"prompt_len must be an int >= 0, got {prompt_len}", "below")
        self.prompt_len = prompt_len
        self.owner = owner
        self.rows = -1
        self.seen = -1
        self.last: bytes | None = None  # the last column seen, to detect reordered rows

    def start(self, rows: int, width: int, already: int) -> None:
        if self.prompt_len is None:
            self.prompt_len = width - already
        if not 0 <= self.prompt_len <= width:
            raise field_error(
                ValueError,
                "prompt_len",
                f"prompt_len {self.prompt_len} does not fit input_ids of width {width}",
                "out_of_range",
            )
        self.rows = rows
        self.seen = self.prompt_len

    def new_columns(self, input_ids: torch.Tensor) -> np.ndarray:
        """The ids added since the last call, ``[rows, new]`` on the host,
        after checking the rows kept their order."""
        rows, width = _check_ids(input_ids)
        if rows != self.rows:
            raise field_error(
                ValueError,
                "input_ids",
                f"{self.owner}: input_ids has {rows} rows but had {self.rows}; one instance serves one "
                "generate call (beam search and row changes are not supported)",
                "count",
            )
        if width < self.seen:
            raise field_error(ValueError, "input_ids", f"{self.owner}: input_ids shrank from {self.seen} to {width} positions", "invalid")
        first = max(self.seen - 1, 0)
        # Few and cheap calls: inside generate the forward pass leaves caches
        # cold, and every torch op or NumPy ufunc then costs 10-30 us per call.
        try:
            host = input_ids.numpy()[:, first:]  # zero-copy on the CPU
        except TypeError:  # on a device: only these columns are copied to the host
            host = input_ids[:, first:].cpu().numpy()
        new = host[:, self.seen - first:]
        if self.last is not None and self.seen > 0 and host[:, 0].tobytes() != self.last:
            raise field_error(
                ValueError,
                "input_ids",
                f"{self.owner}: rows were reordered between calls (beam search); "
                "use num_beams=1 or one generate call per beam",
                "invalid",
            )
        self.seen = width
        self.last = host[:, -1].tobytes() if width > 0 else None  # a copy: input_ids may be freed
        return new


def vocabulary_for(tokenizer: Any) -> Vocabulary | None:
    """The :class:`stopline.Vocabulary` of a ``tokenizers.Tokenizer`` (or a fast
    ``transformers`` tokenizer's ``backend_tokenizer``), built once and cached
    per tokenizer object (:func:`stopline.engines.vocabulary_for`); ``None``
    when the core refuses its decoder (semantics.md 10.1: ``BPEDecoder``,
    ``CTC``, a regex ``Replace``...).

    Raises:
        ValueError: the tokenizer's JSON breaks a ``Vocabulary`` cap (size,
            ids); ``TypeError``: not a fast tokenizer.
    """
    backend = getattr(tokenizer, "backend_tokenizer", tokenizer)
    if not hasattr(backend, "to_str") or not hasattr(backend, "get_vocab_size"):
        raise field_error(
            TypeError,
            "tokenizer",
            f"tokenizer must be a fast transformers tokenizer or a tokenizers.Tokenizer, got {type(tokenizer).__name__}",
            "wrong_type",
        )
    return engines_vocabulary_for(backend)


class _StreamDecoder:
    """The fallback for a decoder the core refuses: one ``tokenizers``
    ``DecodeStream`` per row, primed with the prompt's tail, and the U+FFFD
    flush of semantics.md 10.3 at a length finish (what the core does)."""

    def __init__(self, tokenizer: Any, prompts: list[list[int]], skip: bool):
        from tokenizers.decoders import DecodeStream

        self._tokenizer = tokenizer
        self._skip = skip
        self._streams = [DecodeStream(ids=p[-8:], skip_special_tokens=skip) for p in prompts]
        self._pending: list[list[int]] = [[] for _ in prompts]  # ids since the last released text

    def pieces(self, row: int, ids: list[int]) -> list[str]:
        stream, pending, out = self._streams[row], self._pending[row], []
        for t in ids:
            piece = stream.step(self._tokenizer, t)
            if piece:
                pending.clear()
            else:
                pending.append(t)
            out.append(piece or "")
        return out

    def flush(self, row: int) -> str:
        """What the held ids decode to on their own (U+FFFD for an unfinished
        character), as ``Tokenizer.decode`` ends such a text."""
        pending = self._pending[row]
        return str(self._tokenizer.decode(pending, skip_special_tokens=self._skip)) if pending else ""


class FinishCriteria(StoppingCriteria):
    """``transformers`` stopping criteria driven by stopline's finish machine.

    Each step hands the rows' new token ids to one :class:`stopline.FinishBatch`
    built with the tokenizer's :class:`stopline.Vocabulary`: the core decodes
    them (semantics.md 10) and runs the finish checks in one call, with no
    Python per token. A tokenizer whose decoder the core refuses is decoded
    with ``tokenizers.decoders.DecodeStream`` instead (same results, Python
    per token).

    Args:
        tokenizer: a fast ``transformers`` tokenizer or a ``tokenizers.Tokenizer``.
        params: one :class:`stopline.StopParams` for every row, or one per row.
            ``max_tokens`` counts output tokens (``max_new_tokens``); put the
            model's EOS ids in ``eos_token_ids`` so that a row ``generate``
            ends by EOS is finished here too (rows are not fed after they
            finish).
        prompt_len: the prompt width in positions of ``input_ids`` (padding
            included); default: the width at the first call minus one.
        skip_special_tokens: whether special tokens give text (the text stop
            strings see), as in ``Tokenizer.decode``.
        vocabulary: the tokenizer's ``Vocabulary`` when the caller already has
            one; default: :func:`vocabulary_for` (built once per tokenizer).

    Calling it returns a bool tensor ``[rows]`` on ``input_ids``' device, True
    for rows that have finished: the same tensor object from call to call
    until a row finishes (then a new one), so do not modify it in place.
    After ``generate``, :meth:`results` and :meth:`texts` report each row.

    With reasoning markers in a row's params (``reasoning_start`` /
    ``reasoning_end`` as text, or their ids; semantics.md 11) its stop
    strings, regexes and stop ids fire in their scope only (the content by
    default): a stop string met while the model thinks does not end the row.
    The row's start state is read from its prompt (a template that ends the
    prompt inside ``<think>`` starts it in reasoning) when the core decodes;
    the ``DecodeStream`` fallback reads no prompt, so state
    ``reasoning_starts_in`` there. :meth:`reasoning_texts` /
    :meth:`content_texts` give the split, ``results()[row].channel`` where
    the row ended. A thinking budget (``max_reasoning_tokens``) needs
    ``ConstraintsProcessor(finish=criteria)`` to force the end marker.

    Stop strings match the output only (as vLLM): one that starts in the
    prompt does not stop a row, where ``StopStringCriteria`` looks at the
    prompt's tail too. At a length finish (``max_tokens``) an unfinished
    last character is kept as U+FFFD (semantics.md 10.3).

    Raises:
        TypeError / ValueError: bad arguments (named), a batch whose row count
            changes between calls, rows reordered by beam search.
    """

    def __init__(
        self,
        tokenizer: Any,
        params: StopParams | Sequence[StopParams],
        *,
        prompt_len: int | None = None,
        skip_special_tokens: bool = False,
        vocabulary: Vocabulary | None = None,
    ):
        self._tokenizer = getattr(tokenizer, "backend_tokenizer", tokenizer)
        if not hasattr(self._tokenizer, "decode") or not hasattr(self._tokenizer, "id_to_token"):
            raise field_error(
                TypeError,
                "tokenizer",
                f"tokenizer must be a fast transformers tokenizer or a tokenizers.Tokenizer, got {type(tokenizer).__name__}",
                "wrong_type",
            )
        if not isinstance(params, (StopParams, Sequence)):
            raise field_error(
                TypeError,
                "params",
                f"params must be a StopParams or a sequence of them, got {type(params).__name__}",
                "wrong_type",
            )
        if vocabulary is not None and not isinstance(vocabulary, Vocabulary):
            raise field_error(
                TypeError,
                "vocabulary",
                f"vocabulary must be a stopline.Vocabulary, got {type(vocabulary).__name__}",
                "wrong_type",
            )
        self._params = params
        self._skip = bool(skip_special_tokens)
        self._vocabulary = vocabulary if vocabulary is not None else vocabulary_for(self._tokenizer)
        self._rows = _RowTracker(prompt_len, "FinishCriteria")
        self._batch: FinishBatch | None = None
        self._fallback: _StreamDecoder | None = None
        self._tails: dict[int, str] = {}  # the fallback's flush per length-finished row
        self._running: range | list[int] = []  # a range until a row finishes
        self._done: list[bool] = []
        self._done_t: torch.Tensor | None = None
        # Reasoning channels: per row the released reasoning / content pieces
        # (joined, the channels: semantics.md 11.5); None for a row without them.
        self._channels: list[tuple[list[str], list[str]] | None] = []
        self._reasoning_on = False
        self._budget = False  # any row with max_reasoning_tokens: read forced ids
        self._forced: dict[int, int] = {}  # row -> the id its next token must be (thinking budget)

    def _start(self, input_ids: torch.Tensor, already: int = 1) -> None:
        rows, width = _check_ids(input_ids)
        params = _per_row(self._params, rows, "params", StopParams)
        self._rows.start(rows, width, already=already)
        prompt_len = self._rows.prompt_len
        assert prompt_len is not None
        prompts = input_ids[:, :prompt_len].tolist()
        batch = FinishBatch(max_slots=max(rows, 1), vocabulary=self._vocabulary)
        for row in range(rows):
            if self._vocabulary is None:
                batch.add(row, params[row])
            else:
                batch.add(row, params[row], prompt_token_ids=prompts[row], skip_special_tokens=self._skip)
        if self._vocabulary is None:
            self._fallback = _StreamDecoder(self._tokenizer, prompts, self._skip)
        self._batch = batch
        self._running = range(rows)
        self._done = [False] * rows
        self._done_t = torch.zeros(rows, dtype=torch.bool, device=input_ids.device)
        self._channels = [([], []) if p.reasoning is not None else None for p in params]
        self._reasoning_on = any(c is not None for c in self._channels)
        self._budget = any(p.reasoning is not None and p.reasoning["max_reasoning_tokens"] is not None for p in params)
        if self._budget:  # a prompt that ends inside the block counts towards the budget
            self._note_forced(range(rows), [batch.result(row).forced_token_id for row in range(rows)])

    def _note_forced(self, rows: Any, forced: Sequence[int | None]) -> None:
        for row, tid in zip(rows, forced):
            if tid is None:
                self._forced.pop(row, None)
            else:
                self._forced[row] = tid

    def _collect_channels(self, res: Any) -> None:
        """Append one step's per-row channel deltas to each row's pieces."""
        channels = self._channels
        for row, r_delta, c_delta in zip(res.slots, res.reasoning_deltas, res.content_deltas):
            pieces = channels[row]
            if pieces is not None:
                if r_delta:
                    pieces[0].append(r_delta)
                if c_delta:
                    pieces[1].append(c_delta)

    def __call__(self, input_ids: torch.Tensor, scores: Any = None, **kwargs: Any) -> torch.Tensor:
        if self._batch is None:
            self._start(input_ids)
        assert self._batch is not None and self._done_t is not None
        new = self._rows.new_columns(input_ids)
        k = int(new.shape[1])
        running = self._running
        if k and running:
            if len(running) < len(self._done):
                new = new[running]
            ids = new.ravel()  # contiguous (a copy of the strided columns): the core's fast path
            run_lengths = None if k == 1 else [k] * len(running)
            if self._fallback is None:
                res = self._batch.step(running, ids, run_lengths)
            else:
                flat = ids.tolist()
                texts = [p for i, row in enumerate(running) for p in self._fallback.pieces(row, flat[i * k:(i + 1) * k])]
                res = self._batch.step(running, flat, run_lengths, texts)
            if self._reasoning_on:
                self._collect_channels(res)
            if self._budget:
                # Every running row was stepped: the forced ones are exactly these.
                self._forced = dict(res.forced_tokens)
            finished = res.finished_slots
            if finished:
                for row, reason in zip(res.slots, res.finish_reasons):
                    if self._fallback is not None and reason == "length":
                        self._tails[row] = self._fallback.flush(row)
                for row in finished:
                    self._done[row] = True
                    self._forced.pop(row, None)
                self._running = [row for row in running if not self._done[row]]
                # A new tensor, never an in-place update: tensors returned earlier keep their values.
                self._done_t = torch.tensor(self._done, dtype=torch.bool, device=input_ids.device)
        return self._done_t

    def results(self) -> list[StepResult]:
        """Each row's state: ``finished``, ``finish_reason`` (``"stop"``, ``"length"``...),
        ``stop_reason`` (the stop string or token id), ``num_tokens`` (output
        tokens kept, the stop token included as in vLLM). Rows that ``generate``
        ended without stopline (e.g. ``max_new_tokens`` reached first) show
        ``finished=False``."""
        if self._batch is None:
            raise RuntimeError("FinishCriteria.results: generate has not called the criteria yet")
        return [self._batch.result(row) for row in range(len(self._done))]

    def texts(self) -> list[str]:
        """Each row's kept output text (code points): the decoded output cut
        at the stop string (kept when ``include_stop_str_in_output``); a row
        that ended at ``max_tokens`` in the middle of a character ends in
        U+FFFD (semantics.md 10.3). A row ``generate`` ended on its own
        (``max_new_tokens`` below ``max_tokens``) is unfinished here and shows
        the text released so far, without held bytes. With reasoning
        markers this is the whole output, markers included; see
        :meth:`reasoning_texts` / :meth:`content_texts` for the split."""
        if self._batch is None:
            raise RuntimeError("FinishCriteria.texts: generate has not called the criteria yet")
        return [self._batch.text(row) + self._tails.get(row, "") for row in range(len(self._done))]

    def _row_channels(self, owner: str) -> list[tuple[str, str]]:
        if self._batch is None:
            raise RuntimeError(f"FinishCriteria.{owner}: generate has not called the criteria yet")
        texts = self.texts()
        out = []
        for row, pieces in enumerate(self._channels):
            if pieces is None:
                out.append(("", texts[row]))
                continue
            reasoning, content = "".join(pieces[0]), "".join(pieces[1])
            tail = self._tails.get(row, "")
            if tail:  # the DecodeStream fallback's U+FFFD flush, in the channel the row ended in
                if self._batch.result(row).channel == "reasoning":
                    reasoning += tail
                else:
                    content += tail
            out.append((reasoning, content))
        return out

    def forced_token_ids(self) -> dict[int, int]:
        """The rows whose next token the thinking budget forces, ``{row:
        token id}`` after the latest call (``StepResult.forced_token_id``,
        semantics.md 11.8), a new dict; what ``ConstraintsProcessor(finish=
        self)`` applies. Empty when no row has ``max_reasoning_tokens``."""
        return dict(self._forced)

    def _prime(self, input_ids: torch.Tensor) -> dict[int, int]:
        """For ``ConstraintsProcessor``: start on the prompt if ``generate``
        has not called the criteria yet (processors run first, on
        ``input_ids`` without the token they score), then the forced ids."""
        if self._batch is None:
            self._start(input_ids, already=0)
        return self._forced

    def reasoning_texts(self) -> list[str]:
        """Each row's reasoning (code points), markers excluded unless
        ``keep_reasoning_markers``; ``""`` for a row without reasoning markers
        or one that never opened the block (semantics.md 11). What the core
        released: a row ``generate`` ended on its own lacks its hold-back (a
        partial marker or stop prefix)."""
        return [r for r, _ in self._row_channels("reasoning_texts")]

    def content_texts(self) -> list[str]:
        """Each row's content (code points): ``texts()`` for a row without
        reasoning markers; ``""`` for a row that finished inside the block (a
        length cap mid-thinking: ``finish_reason="length"``,
        ``results()[row].channel == "reasoning"``, semantics.md 11.5)."""
        return [c for _, c in self._row_channels("content_texts")]

    @property
    def decodes_in_core(self) -> bool:
        """Whether the core decodes the ids (False: the ``DecodeStream`` fallback
        for a decoder the core refuses)."""
        return self._vocabulary is not None


class ConstraintsProcessor(LogitsProcessor):
    """``transformers`` logits processor over :class:`stopline.logits.LogitsConstraints`.

    Args:
        constraints: keyword arguments of :meth:`LogitsConstraints.set`
            (``min_tokens``, ``stop_token_ids``, ``allowed_token_ids``,
            ``bad_words``, ``logit_bias``, ``restore``), one mapping for every
            row or one per row. ``min_tokens`` counts output tokens;
            ``stop_token_ids`` must list the EOS ids it masks.
        prompt_len: the prompt width in positions; default: the width of
            ``input_ids`` at the first call (``generate`` calls processors
            before appending the token they score).
        finish: the ``FinishCriteria`` of the same ``generate`` call: each
            call first forces the rows whose thinking budget is spent
            (:meth:`FinishCriteria.forced_token_ids`) to their end-marker id
            with :meth:`LogitsConstraints.force` (every other column
            ``-inf``; the row's other constraints do not apply to it), one id
            per step, as vLLM's ``thinking_token_budget``. Without it no row
            is forced.

    Calling it masks ``scores`` (``[rows, vocab]`` float) in place and returns
    it. :attr:`infeasible` holds the last call's bool ``[rows]``: rows left
    with no finite logit (only possible with ``restore="never"`` or an
    ``allowed_token_ids`` set that bad words empty).

    Raises:
        TypeError / ValueError: bad constraints (named, at the first call when
            the vocabulary width is known), a changed row count, rows
            reordered by beam search.
    """

    def __init__(
        self,
        constraints: Mapping[str, Any] | Sequence[Mapping[str, Any]],
        *,
        prompt_len: int | None = None,
        finish: FinishCriteria | None = None,
    ):
        if finish is not None and not isinstance(finish, FinishCriteria):
            raise field_error(
                TypeError,
                "finish",
                f"finish must be the FinishCriteria of the same generate call, got {type(finish).__name__}",
                "wrong_type",
            )
        if not isinstance(constraints, (Mapping, Sequence)) or isinstance(constraints, (str, bytes)):
            raise field_error(
                TypeError,
                "constraints",
                f"constraints must be a mapping or a sequence of mappings, got {type(constraints).__name__}",
                "wrong_type",
            )
        self._constraints = constraints
        self._finish = finish
        self._forced: dict[int, int] = {}  # what LogitsConstraints.force holds now
        self._rows = _RowTracker(prompt_len, "ConstraintsProcessor")
        self._state: LogitsConstraints | None = None
        self._history_rows: list[int] = []
        self._row_slots = torch.zeros(0, dtype=torch.long)
        self.infeasible: torch.Tensor | None = None

    def _start(self, input_ids: torch.Tensor, scores: torch.Tensor) -> None:
        rows, width = _check_ids(input_ids)
        per_row = _per_row(self._constraints, rows, "constraints", Mapping)
        self._rows.start(rows, width, already=0)
        state = LogitsConstraints(max_slots=max(rows, 1), vocab_size=int(scores.shape[-1]), device=scores.device)
        for row, kw in enumerate(per_row):
            state.set(row, **dict(kw))
        self._state = state
        # Only rows with multi-token bad words read their output history;
        # the others need no append (positions are passed to apply).
        multi = (state.state.bad_prefix_len[:rows] > 0).any(dim=1).tolist() if rows else []
        self._history_rows = [row for row in range(rows) if multi[row]]
        self._row_slots = torch.arange(rows, device=scores.device)

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        if self._state is None:
            self._start(input_ids, scores)
        assert self._state is not None
        new = self._rows.new_columns(input_ids)
        if new.shape[1]:
            for row in self._history_rows:
                self._state.append_tokens(row, torch.from_numpy(np.ascontiguousarray(new[row])))
        if self._finish is not None:
            self._apply_forced(self._finish._prime(input_ids))
        prompt_len = self._rows.prompt_len
        assert prompt_len is not None
        positions = torch.full_like(self._row_slots, int(input_ids.shape[1]) - prompt_len)
        self.infeasible = self._state.apply(scores, row_slots=self._row_slots, row_positions=positions)
        return scores

    def _apply_forced(self, wanted: dict[int, int]) -> None:
        """Bring ``LogitsConstraints.force`` in line with the criteria's forced rows."""
        state, held = self._state, self._forced
        assert state is not None
        if wanted == held:
            return
        for row in [r for r in held if r not in wanted]:
            state.force(row, None)
            del held[row]
        for row, tid in wanted.items():
            if held.get(row) != tid:
                state.force(row, tid)
                held[row] = tid
