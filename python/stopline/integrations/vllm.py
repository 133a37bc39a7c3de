"""stopline behind vLLM's V1 logits-processor interface.

:class:`StoplineLogitsProcessor` is a ``vllm.v1.sample.logits_processor.LogitsProcessor``
that applies, for every request of the persistent batch, the masks of
:class:`stopline.logits.LogitsConstraints` in one pass: ``allowed_token_ids``,
``bad_words``, ``min_tokens`` over the stop ids with vLLM's restore rule for
structured-output requests, and ``logit_bias``; one kernel launch on CUDA (the
torch reference elsewhere).

Two classes, differing only in where a request's constraints come from:

- :class:`StoplineLogitsProcessor` reads ``SamplingParams.extra_args["stopline"]``,
  a mapping of :meth:`LogitsConstraints.set` arguments (the way vLLM passes
  arguments to custom processors). Requests without it are untouched, so it is
  safe to load everywhere: the ``vllm.logits_processors`` entry point installed
  with stopline names it.
- :class:`StoplineBuiltinsProcessor` reads the ordinary fields
  (``min_tokens``/``all_stop_token_ids``, ``allowed_token_ids``,
  ``bad_words_token_ids``, ``logit_bias``): what vLLM's built-in
  ``MinTokens``/``LogitBias`` processors and its sampler's allowed-ids and
  bad-words steps do, in one pass. vLLM still runs its built-ins on those
  fields, so use it where they are taken out (it is not registered by default:
  a ``logit_bias`` would otherwise be added twice).

Pass either as ``LLM(..., logits_processors=[cls])``.

Each class implements both of vLLM's logits-processor interfaces, and vLLM
picks by how it constructs it: the V1 model runner calls
``cls(vllm_config, device, is_pin_memory)`` then ``update_state(BatchUpdate)``
and ``apply(logits)``; the model-runner-V2 calls ``cls(vllm_config, req_states)``
then ``add_request(req_idx, params)`` and ``apply(logits, ctx)``, with the
persistent request slot as the stopline slot. vLLM's V2 loader refuses a
V1-only class found under the entry point, which is why the registered class
must be both. Under V2 the processor does not see the committed tokens on the
host, so multi-token ``bad_words`` are refused there (``ValueError`` naming
the field); one-token bad words, ``allowed_token_ids``, ``min_tokens`` and
``logit_bias`` apply.

Batch rows move as vLLM condenses its persistent batch; the processor keeps a
row -> slot map (a move or swap rewrites two map entries, never device state)
and feeds each slot's new output tokens from the request's live
``output_tok_ids`` list once per step (O(new tokens)).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

try:
    import numpy as np
    import torch
    from vllm.v1.sample.logits_processor import BatchUpdate, LogitsProcessor, MoveDirectionality
    from vllm.v1.worker.gpu.sample.logits_processor.interface import LogitsProcessor as V2LogitsProcessor
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ImportError("stopline.integrations.vllm needs vLLM (>= 0.33): pip install 'stopline[vllm]'") from exc

from .. import FinishTracker, StopParams
from ..compat import _VLLM_STATUS, VllmStopResult, _vllm_params, _vllm_request_fields, to_vllm_status
from ..logits import LogitsConstraints

if TYPE_CHECKING:
    from vllm import SamplingParams

__all__ = ["StoplineLogitsProcessor", "StoplineBuiltinsProcessor", "constraints_from_params"]

EXTRA_ARGS_KEY = "stopline"


def constraints_from_extra_args(params: SamplingParams) -> dict[str, Any] | None:
    """``extra_args["stopline"]`` as :meth:`LogitsConstraints.set` arguments, or None."""
    extra = params.extra_args or {}
    if EXTRA_ARGS_KEY not in extra:
        return None
    kw = extra[EXTRA_ARGS_KEY]
    if not isinstance(kw, dict):
        raise ValueError(f"extra_args[{EXTRA_ARGS_KEY!r}] must be a dict of LogitsConstraints.set arguments, got {type(kw).__name__}")
    allowed = {"min_tokens", "stop_token_ids", "allowed_token_ids", "bad_words", "logit_bias", "restore"}
    unknown = sorted(set(kw) - allowed)
    if unknown:
        raise ValueError(f"extra_args[{EXTRA_ARGS_KEY!r}] has unknown keys {unknown}; expected some of {sorted(allowed)}")
    return dict(kw) or None


def constraints_from_params(params: SamplingParams) -> dict[str, Any] | None:
    """The :meth:`LogitsConstraints.set` arguments for a vLLM request, or None if it has none.

    ``min_tokens`` masks ``all_stop_token_ids`` (EOS included, as vLLM's
    ``MinTokensLogitsProcessor``); masked stop tokens come back only on
    structured-output requests whose row is otherwise empty (``restore="always"``
    for them, ``"never"`` otherwise, which is vLLM's rule). ``bad_words`` are
    the tokenized ``bad_words_token_ids`` (vLLM fills them in the frontend).
    """
    kw: dict[str, Any] = {}
    if params.min_tokens:
        kw["min_tokens"] = int(params.min_tokens)
        kw["stop_token_ids"] = sorted(params.all_stop_token_ids)
        kw["restore"] = "always" if params.structured_outputs is not None else "never"
    if params.allowed_token_ids:
        kw["allowed_token_ids"] = list(params.allowed_token_ids)
    if params.bad_words_token_ids:
        kw["bad_words"] = [list(w) for w in params.bad_words_token_ids]
    if params.logit_bias:
        kw["logit_bias"] = {int(t): float(b) for t, b in params.logit_bias.items()}
    return kw or None


class StoplineLogitsProcessor(LogitsProcessor, V2LogitsProcessor):
    """vLLM V1 logits processor over :class:`stopline.logits.LogitsConstraints`,
    for requests that carry ``extra_args["stopline"]``.

    Args (vLLM's constructor):
        vllm_config: reads ``scheduler_config.max_num_seqs`` (slots) and
            ``model_config.get_vocab_size()`` (logits width).
        device: the logits' device.
        is_pin_memory: unused (the constraints keep their own host staging).

    Raises:
        ValueError: from :meth:`update_state` for a request whose constraints
            are invalid for this model (an id outside the vocabulary, ...),
            naming the field; :meth:`validate_params` catches the
            model-independent ones at admission.
    """

    #: Where a request's constraints come from (None: the request has none).
    constraints_for = staticmethod(constraints_from_extra_args)

    def __init__(self, vllm_config: Any, device: Any, is_pin_memory: bool = False):
        if not isinstance(device, (torch.device, str)):
            self._init_v2(device)
            return
        self._req_states: Any = None
        max_slots = int(vllm_config.scheduler_config.max_num_seqs)
        vocab_size = int(vllm_config.model_config.get_vocab_size())
        # One extra slot that is never set: rows without constraints point at it.
        self._blank = max_slots
        self.constraints = LogitsConstraints(max_slots + 1, vocab_size, device)
        self._free = list(range(max_slots - 1, -1, -1))
        self._row_slot: dict[int, int] = {}
        self._outputs: dict[int, list[int]] = {}  # slot -> the request's live output list
        self._fed: dict[int, int] = {}  # slot -> output tokens appended to the constraints
        self._batch_size = 0
        self._rows: list[int] = []
        self._positions: list[int] = []

    @classmethod
    def validate_params(cls, sampling_params: SamplingParams) -> None:
        """Refuse, at admission, constraints no model could take (vLLM calls this in the frontend)."""
        kw = cls.constraints_for(sampling_params) or {}
        bias = kw.get("logit_bias") or {}
        if not isinstance(bias, dict):
            raise ValueError(f"logit_bias must be a dict of token id -> bias, got {type(bias).__name__}")
        for token, value in bias.items():
            if not isinstance(value, (int, float)) or value != value or value in (float("inf"), float("-inf")):
                raise ValueError(f"logit_bias[{token!r}] must be a finite number, got {value!r}")
        if "allowed_token_ids" in kw and kw["allowed_token_ids"] is not None and not kw["allowed_token_ids"]:
            raise ValueError("allowed_token_ids must not be empty")

    def is_argmax_invariant(self) -> bool:
        """Masks and biases change the argmax."""
        return False

    def _release(self, slot: int) -> None:
        self.constraints.clear(slot)
        self._outputs.pop(slot, None)
        self._fed.pop(slot, None)
        self._free.append(slot)

    def update_state(self, batch_update: BatchUpdate | None) -> None:
        """Apply vLLM's removed, added, moved lists (in that order), then feed new output tokens."""
        if batch_update is not None:
            for index in batch_update.removed:
                slot = self._row_slot.pop(index, None)
                if slot is not None:
                    self._release(slot)
            for index, params, _prompt, output_ids in batch_update.added:
                old = self._row_slot.pop(index, None)
                if old is not None:
                    self._release(old)
                kw = self.constraints_for(params)
                if kw is None:
                    continue
                slot = self._free.pop()
                try:
                    self.constraints.set(slot, **kw)
                except (TypeError, ValueError):
                    self._free.append(slot)
                    raise
                self._row_slot[index] = slot
                self._outputs[slot] = output_ids
                self._fed[slot] = 0
            for a, b, direction in batch_update.moved:
                slot_a = self._row_slot.pop(a, None)
                slot_b = self._row_slot.pop(b, None)
                if slot_a is not None:
                    self._row_slot[b] = slot_a
                if slot_b is not None:
                    if direction == MoveDirectionality.SWAP:
                        self._row_slot[a] = slot_b
                    else:  # b was overwritten by a
                        self._release(slot_b)
            self._batch_size = batch_update.batch_size
        for slot, output_ids in self._outputs.items():
            n, fed = len(output_ids), self._fed[slot]
            if n > fed:
                self.constraints.append_tokens(slot, output_ids[fed:n])
                self._fed[slot] = n
        rows = [self._blank] * self._batch_size
        positions = [0] * self._batch_size
        for index, slot in self._row_slot.items():
            if index < self._batch_size:
                rows[index] = slot
                positions[index] = self._fed[slot]
        self._rows, self._positions = rows, positions

    # -- model runner V2 --------------------------------------------------

    def _init_v2(self, req_states: Any) -> None:
        self._req_states = req_states
        self.constraints = LogitsConstraints(int(req_states.max_num_reqs), int(req_states.vocab_size), req_states.device)
        self._active = np.zeros(int(req_states.max_num_reqs), dtype=bool)
        self._row_slot = {}

    def add_request(self, req_idx: int, sampling_params: SamplingParams) -> bool:
        """V2: (re)initialize slot ``req_idx``; True if this request has constraints."""
        kw = self.constraints_for(sampling_params)
        if kw is None:
            if self._active[req_idx]:
                self.constraints.clear(req_idx)
                self._active[req_idx] = False
            return False
        if any(len(w) > 1 for w in kw.get("bad_words") or ()):
            raise ValueError(
                "bad_words: multi-token words need the committed tokens on the host, which vLLM's "
                "model runner V2 does not give logits processors; use one-token words or the V1 runner"
            )
        self.constraints.set(req_idx, **kw)
        self._active[req_idx] = True
        return True

    def apply_staged_writes(self) -> None:
        """V2: nothing is staged (``set`` writes the slot's rows at once)."""

    def _apply_v2(self, logits: torch.Tensor, ctx: Any) -> torch.Tensor:
        if not self._active[ctx.idx_mapping_np].any():
            return logits
        slots = ctx.expanded_idx_mapping
        prompt_len = self._req_states.prompt_len.gpu.to(slots.device)[slots.long()]
        # pos is the input position of the row; the token it samples has pos + 1 - prompt_len outputs before it.
        positions = ctx.pos.to(torch.int64) + 1 - prompt_len.to(torch.int64)
        self.constraints.apply(logits, row_slots=slots, row_positions=positions)
        return logits

    def apply(self, logits: torch.Tensor, ctx: Any = None) -> torch.Tensor:
        """V1: mask ``logits[:batch_size]`` in place; V2 (with ``ctx``): every row of ``logits``.
        ``logits`` is ``[rows, vocab]`` float; returns it."""
        if ctx is not None:
            return self._apply_v2(logits, ctx)
        if not self._row_slot:
            return logits
        n = len(self._rows)
        self.constraints.apply(logits[:n], row_slots=self._rows, row_positions=self._positions)
        return logits


class StoplineBuiltinsProcessor(StoplineLogitsProcessor):
    """The same processor over the ordinary ``SamplingParams`` fields
    (:func:`constraints_from_params`): vLLM's built-in min-tokens, logit-bias,
    allowed-ids and bad-words steps in one pass."""

    constraints_for = staticmethod(constraints_from_params)


class RequestStop:
    """Per-request replacement for vLLM V1's ``check_stop(request, max_model_len)``.

    One instance lives with one ``vllm.v1.request.Request``; each call feeds
    only the output tokens appended since the previous call to a
    :class:`stopline.FinishTracker`, so a step costs O(new tokens) whatever
    the length of the request (``stopline.compat.vllm_check_stop_request``
    replays the whole history instead).

    Read once, at construction, as :func:`stopline.compat.vllm_check_stop_request`
    reads them: ``request.num_prompt_tokens``, ``request.max_tokens``, and from
    ``request.sampling_params``: ``eos_token_id`` (vLLM leaves it None under
    ``ignore_eos``), ``stop_token_ids`` (vLLM adds the generation config's extra
    EOS ids there), ``min_tokens``, ``ignore_eos``, ``all_stop_token_ids`` (checked
    for consistency) and ``repetition_detection``.

    The decision is vLLM 0.33's order (docs/semantics.md section 3): EOS, then a
    stop token id (``stop_reason`` = the id), both even below ``min_tokens``;
    then the length caps (``num_tokens >= max_model_len`` or
    ``num_output_tokens >= max_tokens``); then repetition from ``min_tokens`` on.

    Raises:
        ValueError: a pooling request, one without sampling params or with
            inconsistent ``all_stop_token_ids`` (at construction).
    """

    def __init__(self, request: Any, max_model_len: int):
        self._tracker = FinishTracker(_vllm_params(max_model_len=max_model_len, **_vllm_request_fields(request)))
        self._seen = 0
        self._fed_before = 0
        self._done = False

    @property
    def tracker(self) -> FinishTracker:
        """The underlying :class:`stopline.FinishTracker` (finish_reason, stop_reason, num_tokens)."""
        return self._tracker

    def check_stop(self, request: Any) -> bool:
        """vLLM's ``check_stop`` contract: True when the request finished, and then
        ``request.status`` and ``request.stop_reason`` are set as vLLM sets them.

        Feeds the tokens appended to ``request.output_token_ids`` since the
        last call (one per call in plain decoding; a whole accept run when the
        engine calls once per step). After a stop inside a run,
        :meth:`result` gives ``num_output_tokens`` to trim the request to.
        """
        ids = request.output_token_ids
        n = len(ids)
        seen = self._seen
        if n == seen or self._done:
            return self._done
        self._seen = n
        if n == seen + 1:  # plain decoding: one token, passed as an int
            self._fed_before = seen
            r = self._tracker.update(ids[seen])
        else:
            self._fed_before = self._tracker.num_tokens
            r = self._tracker.update(list(ids[seen:n]))
        if not r.finished:
            return False
        self._done = True
        from vllm.v1.request import RequestStatus

        request.status = RequestStatus[_VLLM_STATUS[r.finish_reason or ""]]
        if r.stop_reason is not None:
            request.stop_reason = r.stop_reason
        return True

    def result(self) -> VllmStopResult:
        """The last decision in full (:class:`stopline.compat.VllmStopResult`):
        ``status`` name, ``stop_reason``, ``num_output_tokens`` after vLLM's
        trim of an accept run at its first stop, ``new_token_ids`` kept from the
        last call's tokens."""
        t = self._tracker
        kept = t.token_ids[self._fed_before:]
        return VllmStopResult(
            stopped=t.finished,
            status=to_vllm_status(t.finish_reason),
            finish_reason=t.finish_reason,
            stop_reason=t.stop_reason,
            num_output_tokens=t.num_tokens,
            new_token_ids=tuple(kept),
            decided_before_new=False,
        )


class DetokenizerStop:
    """Per-request replacement for the stop-string step of vLLM V1's incremental detokenizer.

    vLLM's ``BaseIncrementalDetokenizer.update`` appends each new token's text,
    then searches the new characters for the request's stop strings with
    ``check_stop_strings`` and cuts the text and the token ids. This class
    takes the same per-token texts and decides with stopline's incremental
    matcher: O(new characters) per call whatever the number of stop strings.

    Args:
        sampling_params: reads ``stop`` (a string or a list), ``min_tokens``
            and ``include_stop_str_in_output``.

    Rules (vLLM 0.33 agrees on each; docs/semantics.md sections 2 and 3): the
    stop string that ends first wins, ties by list order; a stop string counts
    only if it ends in the text of output token ``n > min_tokens``; tokens
    after the one completing it are dropped; with ``stop_terminated`` (the
    scheduler finished the request on EOS or a stop token id) that token's
    text is left out unless ``include_stop_str_in_output``.

    Streaming differs on purpose: :meth:`get_next_output_text` holds back only
    the suffix that can still become a stop string (vLLM holds back
    ``max(len(stop)) - 1`` characters).
    """

    def __init__(self, sampling_params: Any):
        stop = sampling_params.stop
        stops = [stop] if isinstance(stop, str) else list(stop or ())
        self._include = bool(sampling_params.include_stop_str_in_output)
        self._tracker = FinishTracker(
            StopParams(
                stop=stops or None,
                min_tokens=sampling_params.min_tokens or 0,
                include_stop_str_in_output=self._include,
            )
        )
        self._released: list[str] = []

    def update(self, new_texts: list[str], stop_terminated: bool = False) -> str | None:
        """Append the text of each new output token; return the stop string that finished, or None.

        ``new_texts[i]`` is the decoded text of the i-th new token (``""``
        while a character is incomplete), as vLLM's ``decode_next`` returns it.
        """
        if not new_texts or self._tracker.finished:
            return None
        texts = list(new_texts)
        if stop_terminated and not self._include:
            texts[-1] = ""
        r = self._tracker.update([0] * len(texts), texts)
        if r.text_delta:
            self._released.append(r.text_delta)
        return r.stop_reason if isinstance(r.stop_reason, str) else None

    @property
    def output_text(self) -> str:
        """The output text so far, cut at the stop string (code points)."""
        return self._tracker.text

    @property
    def num_output_tokens(self) -> int:
        """Output tokens kept (vLLM's ``len(token_ids)`` after its trim)."""
        return self._tracker.num_tokens

    def get_next_output_text(self) -> str:
        """The text released since the last call (exact hold-back)."""
        out = "".join(self._released)
        self._released.clear()
        return out
