"""stopline behind SGLang's request finish check and custom logit processors.

:class:`ReqFinish` (defined in :mod:`stopline.engines.sglang`, with the
stateless :func:`stopline.compat.sglang_check_finished` beside it) is the
per-request counterpart of SGLang's
``Req.update_finish_state(new_accepted_len)`` (``check_finished`` in older
releases): stop strings, ``stop_regex``, EOS and stop token ids,
``max_new_tokens``, an out-of-vocabulary id, with ``no_stop_trim``; each call
feeds only the ids accepted in that step, so it costs O(new tokens) where
SGLang decodes a tail window per stop string and per regex.

:class:`StoplineLogitProcessor` is a ``CustomLogitProcessor`` that applies
:class:`stopline.logits.LogitsConstraints` to the rows that carry
``custom_params={"stopline": {...}}``.

With ``reasoning=`` (:func:`stopline.engines.sglang.sglang_reasoning`, the
server's ``--reasoning-parser`` markers) :class:`ReqFinish` scopes stops to
content, reads a prompt-opened ``<think>`` and names the thinking budget's
forced id (``custom_params["thinking_budget"]``); docs/integrations.md,
"Reasoning models (SGLang)".

SGLang imports are needed only for :class:`StoplineLogitProcessor` (its base
class) and ``sglang_reasoning``; :class:`ReqFinish` reads SGLang's objects by
attribute.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

from .._caps import field_type_error, field_value_error
from ..engines.sglang import ReqFinish, sglang_reasoning

# ReqFinish lives in the engine layer (it needs no SGLang import) and is
# re-exported here, where it is documented.
__all__ = ["ReqFinish", "StoplineLogitProcessor", "sglang_reasoning"]


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
                raise field_value_error("custom_params", " has no '__req__': SGLang passes the request with each row")
            kw = params["stopline"]
            if not isinstance(kw, dict):
                raise field_type_error("custom_params['stopline']", "a dict", kw)
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
