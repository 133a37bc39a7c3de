"""stopline behind SGLang's request finish check and custom logit processors.

:class:`ReqFinish` is the per-request counterpart of SGLang's
``Req.update_finish_state(new_accepted_len)`` (``check_finished`` in older
releases): stop strings, ``stop_regex``, EOS and stop token ids,
``max_new_tokens``, an out-of-vocabulary id, with ``no_stop_trim``; each call
feeds only the ids accepted in that step, so it costs O(new tokens) where
SGLang decodes a tail window per stop string and per regex.

:class:`StoplineLogitProcessor` is a ``CustomLogitProcessor`` that applies
:class:`stopline.logits.LogitsConstraints` to the rows that carry
``custom_params={"stopline": {...}}``.

SGLang imports are needed only for :class:`StoplineLogitProcessor` (its base
class); :class:`ReqFinish` reads SGLang's objects by attribute.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Sequence
from typing import Any

from .. import FinishTracker
from ..compat import SglangFinishResult, _sglang_ids, _sglang_params, to_sglang_finish_reason

__all__ = ["ReqFinish", "StoplineLogitProcessor"]


def _as_list(value: Any) -> list[Any]:
    if value is None:
        return []
    if isinstance(value, str):
        return [value]
    return list(value)


_RUNNING = SglangFinishResult(finished=False, finished_reason=None, finished_len=None, decided_before_new=False)


class ReqFinish:
    """Per-request finish state in SGLang's terms, decided by stopline.

    Args:
        sampling_params: SGLang's ``SamplingParams`` (after ``normalize``) or
            any object with ``max_new_tokens``, ``min_new_tokens``,
            ``stop_strs``, ``stop_regex_strs``, ``stop_token_ids``,
            ``ignore_eos`` and ``no_stop_trim``.
        eos_token_ids: the request's EOS ids (``Req.eos_token_ids``) plus the
            tokenizer's ``eos_token_id`` and ``additional_stop_token_ids``,
            which SGLang also checks.
        vocab_size: ids outside ``[0, vocab_size)`` finish the request as an
            error (SGLang: ``FINISH_MATCHED_STR("NaN happened")``).
        tokenizer: a fast tokenizer (``transformers`` or ``tokenizers``) to
            decode each accepted id with ``DecodeStream``, primed with
            ``prompt_ids``; or pass the texts to :meth:`update`.
        prompt_ids: the prompt's ids, to prime the decoder.

    Rules: docs/semantics.md sections 2 and 3; where SGLang 0.5.23 decides
    otherwise it is listed there and in docs/integrations.md.

    Raises:
        ValueError / TypeError: invalid parameters (named by stopline's
            ``StopParams``), a stop regex the Rust regex syntax rejects.
    """

    def __init__(
        self,
        sampling_params: Any,
        *,
        eos_token_ids: Iterable[int] = (),
        vocab_size: int | None = None,
        tokenizer: Any = None,
        prompt_ids: Sequence[int] = (),
    ):
        sp = sampling_params
        self._regexes = tuple(_as_list(getattr(sp, "stop_regex_strs", None)))
        self.max_new_tokens = int(sp.max_new_tokens)
        self._tracker = FinishTracker(
            _sglang_params(
                max_new_tokens=self.max_new_tokens,
                min_new_tokens=int(getattr(sp, "min_new_tokens", 0) or 0),
                eos_token_ids=sorted(set(eos_token_ids)),
                ignore_eos=bool(getattr(sp, "ignore_eos", False)),
                stop_token_ids=sorted(set(_as_list(getattr(sp, "stop_token_ids", None)))),
                stop_strs=_as_list(getattr(sp, "stop_strs", None)),
                stop_regex=self._regexes,
                no_stop_trim=bool(getattr(sp, "no_stop_trim", False)),
                vocab_size=vocab_size,
            )
        )
        self._vocab_size = vocab_size
        self._tokenizer = None if tokenizer is None else getattr(tokenizer, "backend_tokenizer", tokenizer)
        self._stream = None
        if self._tokenizer is not None:
            from tokenizers.decoders import DecodeStream

            self._stream = DecodeStream(ids=list(prompt_ids)[-8:], skip_special_tokens=False)

    @property
    def tracker(self) -> FinishTracker:
        """The underlying :class:`stopline.FinishTracker` (text, token ids kept, reasons)."""
        return self._tracker

    def update(self, new_accepted_ids: Sequence[int], texts: Sequence[str] | None = None) -> SglangFinishResult:
        """Feed the ids accepted in this step (one, or a speculative run).

        ``texts`` gives each id's decoded text; without it the tokenizer given
        at construction decodes them. Returns :class:`stopline.compat.SglangFinishResult`:
        ``finished``, ``finished_reason`` (``FINISH_MATCHED_STR``,
        ``FINISHED_MATCHED_REGEX`` with the pattern, ``FINISH_MATCHED_TOKEN``,
        ``FINISH_LENGTH``, ``FINISH_ABORT``) and ``finished_len`` (output ids
        kept through the stop, SGLang's ``finished_len``).
        """
        ids = _sglang_ids(new_accepted_ids, self._vocab_size)
        if texts is None and self._stream is not None:
            texts = [self._piece(i) for i in ids]
        decided_before = self._tracker.finished
        if not decided_before:
            r = self._tracker.update(ids, texts)
            if not r.finished:
                return _RUNNING
        t = self._tracker
        reason = to_sglang_finish_reason(
            t.finish_reason,
            t.matched,
            max_new_tokens=self.max_new_tokens,
            num_tokens=t.num_tokens,
            stop_reason=t.stop_reason,
            stop_regex=self._regexes,
        )
        return SglangFinishResult(
            finished=t.finished,
            finished_reason=reason,
            finished_len=t.num_tokens if t.finished else None,
            decided_before_new=decided_before,
        )

    def _piece(self, token_id: int) -> str:
        assert self._stream is not None and self._tokenizer is not None
        if self._vocab_size is not None and not 0 <= token_id < self._vocab_size:
            return ""
        return self._stream.step(self._tokenizer, token_id) or ""


try:
    from sglang.srt.sampling.custom_logit_processor import CustomLogitProcessor as _CustomLogitProcessor
except ImportError:  # pragma: no cover - SGLang not installed
    _CustomLogitProcessor = object


class _SharedConstraints:
    """One LogitsConstraints per (device, vocabulary width), its slots lent to requests by rid.

    SGLang rebuilds a custom processor from its serialized class for each
    batch, so per-request state lives here. Slots are recycled least recently
    used first; a request whose slot was recycled is set up again from its
    full output ids on its next row (correct, only slower).
    """

    def __init__(self, device: Any, vocab_size: int, max_slots: int):
        from ..logits import LogitsConstraints

        self.constraints = LogitsConstraints(max_slots, vocab_size, device)
        self.max_slots = max_slots
        self.by_rid: OrderedDict[Any, tuple[int, int]] = OrderedDict()  # rid -> (slot, ids fed)

    def slot_for(self, rid: Any, kw: dict[str, Any], output_ids: Sequence[int]) -> int:
        entry = self.by_rid.pop(rid, None)
        if entry is None:
            if len(self.by_rid) >= self.max_slots:
                _, (slot, _) = self.by_rid.popitem(last=False)
            else:
                slot = len(self.by_rid)  # slots 0..len-1 are all taken while none was recycled
            self.constraints.set(slot, **kw)
            fed = 0
        else:
            slot, fed = entry
        n = len(output_ids)
        if n > fed:
            self.constraints.append_tokens(slot, list(output_ids[fed:n]))
        self.by_rid[rid] = (slot, n)
        return slot


_SHARED: dict[tuple[str, int], _SharedConstraints] = {}


class StoplineLogitProcessor(_CustomLogitProcessor):
    """SGLang ``CustomLogitProcessor`` over :class:`stopline.logits.LogitsConstraints`.

    A request opts in with ``custom_logit_processor=StoplineLogitProcessor.to_str()``
    and ``custom_params={"stopline": {...}}``, the ``{...}`` being
    :meth:`LogitsConstraints.set` arguments (``min_tokens``,
    ``stop_token_ids``, ``allowed_token_ids``, ``bad_words`` as token ids,
    ``logit_bias``, ``restore``). SGLang adds ``"__req__"`` (the request) to
    each row's params; the output ids are read from it, and only the ids new
    since the last step are appended (O(new tokens)).

    Under speculative decoding SGLang passes one row per draft position with
    the same params; the k-th row of a request samples output position
    ``len(output_ids) + k``. Draft tokens are not visible to the processor, so
    a multi-token bad word is matched against the committed output only.

    Call: ``logits`` ``[rows, vocab]`` float (modified in place and returned),
    ``custom_param_list`` one dict (or None: row untouched) per row.

    Raises:
        ValueError / TypeError: invalid constraints, naming the field (at the
            first row of the request that carries them).
    """

    #: Slots per (device, vocabulary width); least recently used requests are recycled.
    max_slots = 4096

    def __call__(self, logits: Any, custom_param_list: list[dict[str, Any] | None] | None = None) -> Any:
        if not custom_param_list:
            return logits
        key = (str(logits.device), int(logits.shape[-1]))
        shared = _SHARED.get(key)
        if shared is None:
            shared = _SHARED[key] = _SharedConstraints(logits.device, key[1], self.max_slots)
        rows: list[int] = []
        slots: list[int] = []
        positions: list[int] = []
        last_rid: Any = object()
        offset = 0
        for row, params in enumerate(custom_param_list):
            if not params or "stopline" not in params:
                continue
            req = params.get("__req__")
            if req is None:
                raise ValueError("custom_params has no '__req__': SGLang passes the request with each row")
            kw = params["stopline"]
            if not isinstance(kw, dict):
                raise TypeError(f"custom_params['stopline'] must be a dict, got {type(kw).__name__}")
            rid = req.rid
            offset = offset + 1 if rid == last_rid else 0
            last_rid = rid
            output_ids = req.output_ids
            rows.append(row)
            slots.append(shared.slot_for(rid, kw, output_ids))
            positions.append(len(output_ids) + offset)
        if not rows:
            return logits
        if len(rows) == logits.shape[0]:
            shared.constraints.apply(logits, row_slots=slots, row_positions=positions)
            return logits
        import torch

        index = torch.tensor(rows, device=logits.device)
        sub = logits.index_select(0, index)
        shared.constraints.apply(sub, row_slots=slots, row_positions=positions)
        logits.index_copy_(0, index, sub)
        return logits
