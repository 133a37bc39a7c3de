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
without a finite logit.

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
    import torch
    from transformers import LogitsProcessor, StoppingCriteria
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ImportError(
        "stopline.integrations.hf needs transformers and torch: pip install 'stopline[hf]'"
    ) from exc

from .. import FinishBatch, StepResult, StopParams
from ..logits import LogitsConstraints

__all__ = ["FinishCriteria", "ConstraintsProcessor"]


def _per_row(value: Any, rows: int, field: str, kind: type) -> list[Any]:
    """One ``kind`` value for every row, or a sequence of exactly ``rows`` of them."""
    if isinstance(value, kind):
        return [value] * rows
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence):
        raise TypeError(f"{field} must be a {kind.__name__} or a sequence of them, got {type(value).__name__}")
    if len(value) != rows:
        raise ValueError(f"{field} has {len(value)} entries but the batch has {rows} rows")
    for i, v in enumerate(value):
        if not isinstance(v, kind):
            raise TypeError(f"{field}[{i}] must be a {kind.__name__}, got {type(v).__name__}")
    return list(value)


def _check_ids(input_ids: Any, field: str = "input_ids") -> tuple[int, int]:
    if not isinstance(input_ids, torch.Tensor) or input_ids.dim() != 2:
        raise ValueError(f"{field} must be a 2-D tensor [rows, positions], got {getattr(input_ids, 'shape', type(input_ids))}")
    rows, width = (int(d) for d in input_ids.shape)
    return rows, width


class _RowTracker:
    """The rows' layout across calls: prompt width, tokens seen, reorder check."""

    def __init__(self, prompt_len: int | None, owner: str):
        if prompt_len is not None and (isinstance(prompt_len, bool) or not isinstance(prompt_len, int) or prompt_len < 0):
            raise ValueError(f"prompt_len must be an int >= 0, got {prompt_len!r}")
        self.prompt_len = prompt_len
        self.owner = owner
        self.rows = -1
        self.seen = -1
        self.last: torch.Tensor | None = None

    def start(self, rows: int, width: int, already: int) -> None:
        if self.prompt_len is None:
            self.prompt_len = width - already
        if not 0 <= self.prompt_len <= width:
            raise ValueError(f"prompt_len {self.prompt_len} does not fit input_ids of width {width}")
        self.rows = rows
        self.seen = self.prompt_len

    def new_columns(self, input_ids: torch.Tensor) -> torch.Tensor:
        """The columns added since the last call, after checking the rows kept their order."""
        rows, width = _check_ids(input_ids)
        if rows != self.rows:
            raise ValueError(
                f"{self.owner}: input_ids has {rows} rows but had {self.rows}; one instance serves one "
                "generate call (beam search and row changes are not supported)"
            )
        if width < self.seen:
            raise ValueError(f"{self.owner}: input_ids shrank from {self.seen} to {width} positions")
        if self.last is not None and self.seen > 0:
            if not torch.equal(input_ids[:, self.seen - 1], self.last.to(input_ids.device)):
                raise ValueError(
                    f"{self.owner}: rows were reordered between calls (beam search); "
                    "use num_beams=1 or one generate call per beam"
                )
        new = input_ids[:, self.seen:]
        self.seen = width
        self.last = input_ids[:, width - 1].clone() if width > 0 else None
        return new


class FinishCriteria(StoppingCriteria):
    """``transformers`` stopping criteria driven by stopline's finish machine.

    Args:
        tokenizer: a fast ``transformers`` tokenizer (its ``backend_tokenizer``
            decodes each new token with ``tokenizers.decoders.DecodeStream``,
            primed with the prompt) or a ``tokenizers.Tokenizer``.
        params: one :class:`stopline.StopParams` for every row, or one per row.
            ``max_tokens`` counts output tokens (``max_new_tokens``); put the
            model's EOS ids in ``eos_token_ids`` so that a row ``generate``
            ends by EOS is finished here too (rows are not fed after they
            finish).
        prompt_len: the prompt width in positions of ``input_ids`` (padding
            included); default: the width at the first call minus one.
        skip_special_tokens: passed to the decoder (the text stop strings see).

    Calling it returns a bool tensor ``[rows]`` on ``input_ids``' device, True
    for rows that have finished. After ``generate``, :meth:`results` and
    :meth:`texts` report each row.

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
    ):
        self._tokenizer = getattr(tokenizer, "backend_tokenizer", tokenizer)
        if not hasattr(self._tokenizer, "decode") or not hasattr(self._tokenizer, "id_to_token"):
            raise TypeError(f"tokenizer must be a fast transformers tokenizer or a tokenizers.Tokenizer, got {type(tokenizer).__name__}")
        if not isinstance(params, (StopParams, Sequence)):
            raise TypeError(f"params must be a StopParams or a sequence of them, got {type(params).__name__}")
        self._params = params
        self._skip = bool(skip_special_tokens)
        self._rows = _RowTracker(prompt_len, "FinishCriteria")
        self._batch: FinishBatch | None = None
        self._streams: list[Any] = []
        self._done: list[bool] = []

    def _start(self, input_ids: torch.Tensor) -> None:
        from tokenizers.decoders import DecodeStream

        rows, width = _check_ids(input_ids)
        params = _per_row(self._params, rows, "params", StopParams)
        self._rows.start(rows, width, already=1)
        prompt_len = self._rows.prompt_len
        assert prompt_len is not None
        self._batch = FinishBatch(max_slots=max(rows, 1))
        prompts = input_ids[:, :prompt_len].tolist()
        for row in range(rows):
            self._batch.add(row, params[row])
            # Primed with the prompt's tail so the first output token decodes in context.
            self._streams.append(DecodeStream(ids=prompts[row][-8:], skip_special_tokens=self._skip))
        self._done = [False] * rows

    def __call__(self, input_ids: torch.Tensor, scores: Any = None, **kwargs: Any) -> torch.Tensor:
        if self._batch is None:
            self._start(input_ids)
        assert self._batch is not None
        new = self._rows.new_columns(input_ids).tolist()
        slots: list[int] = []
        token_ids: list[int] = []
        run_lengths: list[int] = []
        texts: list[str] = []
        for row, ids in enumerate(new):
            if self._done[row] or not ids:
                continue
            stream = self._streams[row]
            slots.append(row)
            run_lengths.append(len(ids))
            token_ids.extend(ids)
            texts.extend(stream.step(self._tokenizer, t) or "" for t in ids)
        if slots:
            res = self._batch.step(slots, token_ids, run_lengths, texts)
            for slot in res.finished_slots:
                self._done[slot] = True
        return torch.tensor(self._done, dtype=torch.bool, device=input_ids.device)

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
        at the stop string (kept when ``include_stop_str_in_output``)."""
        if self._batch is None:
            raise RuntimeError("FinishCriteria.texts: generate has not called the criteria yet")
        return [self._batch.text(row) for row in range(len(self._done))]


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

    Calling it masks ``scores`` (``[rows, vocab]`` float) in place and returns
    it. :attr:`infeasible` holds the last call's bool ``[rows]``: rows left
    with no finite logit (only possible with ``restore="never"`` or an
    ``allowed_token_ids`` set that bad words empty).

    Raises:
        TypeError / ValueError: bad constraints (named, at the first call when
            the vocabulary width is known), a changed row count, rows
            reordered by beam search.
    """

    def __init__(self, constraints: Mapping[str, Any] | Sequence[Mapping[str, Any]], *, prompt_len: int | None = None):
        if not isinstance(constraints, (Mapping, Sequence)) or isinstance(constraints, (str, bytes)):
            raise TypeError(f"constraints must be a mapping or a sequence of mappings, got {type(constraints).__name__}")
        self._constraints = constraints
        self._rows = _RowTracker(prompt_len, "ConstraintsProcessor")
        self._state: LogitsConstraints | None = None
        self.infeasible: torch.Tensor | None = None

    def _start(self, input_ids: torch.Tensor, scores: torch.Tensor) -> None:
        rows, width = _check_ids(input_ids)
        per_row = _per_row(self._constraints, rows, "constraints", Mapping)
        self._rows.start(rows, width, already=0)
        state = LogitsConstraints(max_slots=max(rows, 1), vocab_size=int(scores.shape[-1]), device=scores.device)
        for row, kw in enumerate(per_row):
            state.set(row, **dict(kw))
        self._state = state

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        if self._state is None:
            self._start(input_ids, scores)
        assert self._state is not None
        new = self._rows.new_columns(input_ids)
        if new.shape[1]:
            for row in range(new.shape[0]):
                self._state.append_tokens(row, new[row])
        rows = int(input_ids.shape[0])
        prompt_len = self._rows.prompt_len
        assert prompt_len is not None
        position = int(input_ids.shape[1]) - prompt_len
        self.infeasible = self._state.apply(scores, row_slots=list(range(rows)), row_positions=[position] * rows)
        return scores
