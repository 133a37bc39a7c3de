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

from collections import Counter, OrderedDict
from collections.abc import Callable, Mapping, Sequence
from typing import Any, ClassVar

from .._caps import field_type_error, field_value_error
from .._core import FinishTracker
from ..engines._common import Reasoning, reasoning_config, thinking_budget, vocabulary_for
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
        # rid -> (the markers, the thinking-budget counter) of requests with a budget
        self.counters: dict[Any, tuple[Reasoning, FinishTracker]] = {}

    def slot_for(
        self,
        rid: Any,
        kw: dict[str, Any],
        output_ids: Sequence[int],
        counter: Callable[[], tuple[Reasoning, FinishTracker]] | None = None,
    ) -> int:
        entry = self.by_rid.pop(rid, None)
        if entry is None:
            if len(self.by_rid) >= self.max_slots:
                old, (slot, _) = self.by_rid.popitem(last=False)
                self.counters.pop(old, None)
            else:
                slot = len(self.by_rid)  # slots 0..len-1 are all taken while none was recycled
            self.constraints.set(slot, **kw)
            fed = 0
            if counter is not None:
                self.counters[rid] = counter()
        else:
            slot, fed = entry
        n = len(output_ids)
        if n > fed:
            new = list(output_ids[fed:n])
            self.constraints.append_tokens(slot, new)
            held = self.counters.get(rid)
            if held is not None and not held[1].finished and not held[0].count(held[1], new):
                del self.counters[rid]  # an id past the vocabulary: the budget is no longer enforced
        self.by_rid[rid] = (slot, n)
        held = self.counters.get(rid)
        forced = None if held is None else held[1].forced_token_id
        if self.constraints.forced_token(slot) != forced:
            self.constraints.force(slot, forced)
        return slot


_SHARED: dict[tuple[str, int], _SharedConstraints] = {}


def _token_ahead(req: Any, n_out: int) -> bool:
    """Whether SGLang has sampled a token for ``req`` that ``req.output_ids`` (``n_out`` ids) lacks yet.

    SGLang's overlap loop (its default) launches decode batch N, sampling and
    custom processors included, before it appends batch N-1's token to
    ``output_ids``; the KV length is advanced when a batch is allocated, so
    ``req.kv.kv_committed_len - len(req.origin_input_ids)`` counts the tokens
    sampled before this row (docs/integrations.md, "SGLang's overlap
    scheduler"). Any other difference (a truncated prompt, a prefill chunk, an
    SGLang without that field) reads as False.
    """
    committed = getattr(getattr(req, "kv", None), "kv_committed_len", None)
    prompt = getattr(req, "origin_input_ids", None)
    return type(committed) is int and prompt is not None and committed - len(prompt) == n_out + 1


class StoplineLogitProcessor(_CustomLogitProcessor):
    """SGLang ``CustomLogitProcessor`` over :class:`stopline.logits.LogitsConstraints`.

    A request opts in with ``custom_logit_processor=StoplineLogitProcessor.to_str()``
    and ``custom_params={"stopline": {...}}``, the ``{...}`` being
    :meth:`LogitsConstraints.set` arguments (``min_tokens``,
    ``stop_token_ids``, ``allowed_token_ids``, ``bad_words`` as token ids,
    ``logit_bias``, ``restore``). SGLang adds ``"__req__"`` (the request) to
    each row's params; the output ids are read from it, and only the ids new
    since the last step are appended (O(new tokens)).

    Thinking budget: a subclass that sets :attr:`reasoning_markers` (as
    SGLang's ``Qwen3ThinkingBudgetLogitProcessor`` hard-codes Qwen3's ids)
    also enforces ``custom_params["thinking_budget"]`` (what SGLang sets from
    ``max_thinking_tokens``): once the request has thought that many tokens
    after the start marker (the prompt's included, read with the vocabulary
    of ``Req.tokenizer``), its rows are forced to the end marker's ids, one
    per step (:meth:`LogitsConstraints.force`; counted as vLLM's budget,
    docs/semantics.md 11.8, where SGLang's processor forces a newline first).
    Without markers the key is left to SGLang (its reasoner grammar backend).

    Under speculative decoding SGLang passes one row per draft position with
    the same params; the k-th row of a request samples output position
    ``len(output_ids) + k``. Draft tokens are not visible to the processor, so
    a multi-token bad word is matched against the committed output only.

    Under SGLang's overlap scheduler (its default) a decode batch is sampled
    before the previous batch's token reaches ``output_ids``; a one-row
    request then samples position ``len(output_ids) + 1`` (read from
    ``req.kv.kv_committed_len``). The unseen id is unknown, so multi-token bad
    words do not fire on that row and the thinking budget is forced a token
    late, as SGLang's own processor; ``SGLANG_ENABLE_DELAY_SAMPLE=1`` or
    ``--disable-overlap-schedule`` make both exact (docs/integrations.md,
    "SGLang's overlap scheduler").

    Call: ``logits`` ``[rows, vocab]`` float (modified in place and returned),
    ``custom_param_list`` one dict (or None: row untouched) per row.

    Raises:
        ValueError / TypeError: invalid constraints, naming the field (at the
            first row of the request that carries them).
    """

    #: Slots per (device, vocabulary width); least recently used requests are recycled.
    max_slots = 4096
    #: The reasoning markers for ``custom_params["thinking_budget"]``: a
    #: mapping of :data:`stopline.engines.REASONING_KEYS` (plain data: SGLang
    #: pickles the class with ``dill``), e.g. ``{"reasoning_start_id": 151667,
    #: "reasoning_end_id": 151668}``; ``None``: budgets are not enforced here.
    reasoning_markers: ClassVar[Mapping[str, Any] | None] = None

    def _counter(self, req: Any, budget: int) -> tuple[Reasoning, FinishTracker]:
        tokenizer = getattr(req, "tokenizer", None)
        vocabulary = None if tokenizer is None else vocabulary_for(tokenizer)
        reasoning = reasoning_config(self.reasoning_markers, "reasoning_markers", vocabulary)
        if reasoning is None:
            raise field_value_error("reasoning_markers", " is None: this class enforces no thinking budget")
        prompt = list(getattr(req, "origin_input_ids", ()) or ())
        return reasoning, reasoning.budget_counter(budget, prompt)

    def __call__(self, logits: Any, custom_param_list: list[dict[str, Any] | None] | None = None) -> Any:
        if not custom_param_list:
            return logits
        key = (str(logits.device), int(logits.shape[-1]))
        shared = _SHARED.get(key)
        if shared is None:
            shared = _SHARED[key] = _SharedConstraints(logits.device, key[1], self.max_slots)
        # (row, rid, request, constraints, budget) of each row this processor handles
        todo: list[tuple[int, Any, Any, dict[str, Any], int | None]] = []
        for row, params in enumerate(custom_param_list):
            if not params:
                continue
            budget = None
            if self.reasoning_markers is not None:
                budget = thinking_budget(params.get("thinking_budget"), "custom_params['thinking_budget']")
            if "stopline" not in params and budget is None:
                continue
            req = params.get("__req__")
            if req is None:
                raise field_value_error("custom_params", " has no '__req__': SGLang passes the request with each row")
            kw = params.get("stopline", {})
            if not isinstance(kw, dict):
                raise field_type_error("custom_params['stopline']", "a dict", kw)
            todo.append((row, req.rid, req, kw, budget))
        if not todo:
            return logits
        rows_of = Counter(rid for _, rid, _, _, _ in todo)
        rows: list[int] = []
        slots: list[int] = []
        positions: list[int] = []
        last_rid: Any = object()
        offset = 0
        for row, rid, req, kw, budget in todo:
            offset = offset + 1 if rid == last_rid else 0
            last_rid = rid
            output_ids = req.output_ids
            # A request with one row (no speculative decoding) may be a token
            # ahead of its output ids under SGLang's overlap loop.
            ahead = rows_of[rid] == 1 and _token_ahead(req, len(output_ids))
            counter = None if budget is None else (lambda req=req, budget=budget: self._counter(req, budget))
            rows.append(row)
            slots.append(shared.slot_for(rid, kw, output_ids, counter))
            positions.append(len(output_ids) + offset + int(ahead))
        if len(rows) == logits.shape[0]:
            shared.constraints.apply(logits, row_slots=slots, row_positions=positions)
            return logits
        import torch

        index = torch.tensor(rows, device=logits.device)
        sub = logits.index_select(0, index)
        shared.constraints.apply(sub, row_slots=slots, row_positions=positions)
        logits.index_copy_(0, index, sub)
        return logits
