"""SGLang's finish rules, in one place (SGLang 0.5.23).

What is written here and nowhere else:

- parameter mapping: :func:`finish_request` turns SGLang's sampling
  parameters into an :class:`SglangRequest` (the ``StopParams``, or the
  prefill-only case of ``max_new_tokens=0``, docs/semantics.md 6.16);
- request reading: :func:`request_fields` reads SGLang's ``SamplingParams``
  (duck-typed, nothing imported from SGLang);
- finish-reason translation: :func:`to_sglang_finish_reason` (SGLang's
  ``FINISH_*`` objects) and the ``finished_len`` SGLang leaves on a request.

Two users share them: :func:`sglang_check_finished`, the stateless form of
``Req.update_finish_state`` that replays the whole history (O(output) per
call), and :class:`ReqFinish`, the per-request object fed only the ids
accepted in a step (O(new tokens)); ``tests/test_engine_parity.py`` checks
the two agree on the same random histories.

:class:`ReqFinish` decodes ids with stopline's core when given a tokenizer
whose ``tokenizer.json`` the core reads (:class:`stopline.Vocabulary`), and
with ``tokenizers.decoders.DecodeStream`` only for a decoder the core
refuses.
"""

from __future__ import annotations

import numbers
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from stopline._caps import field_type_error, field_value_error, flag, integer, one_of, shown
from stopline._core import FINISH_REASONS, FinishTracker, StopParams, Vocabulary

from ._common import output_ids as read_ids
from ._common import thinking_budget as thinking_budget_of
from ._common import (
    FinishState,
    Reasoning,
    ReasoningArg,
    caller_names,
    id_list,
    reasoning_config,
    reasoning_from_markers,
    replay,
    reraise_for_caller,
    split,
    stop_list,
    texts,
    vocabulary_for,
)

__all__ = [
    "ReqFinish",
    "SglangFinishReason",
    "SglangFinishResult",
    "SglangRequest",
    "finish_request",
    "request_fields",
    "sglang_check_finished",
    "sglang_reasoning",
    "to_sglang_finish_reason",
    "vocabulary_for",
]

# SGLang's finish-reason classes (schedule_batch.py), as a table for one_of.
_SGLANG_KINDS = {k: k for k in ("FINISH_ABORT", "FINISH_LENGTH", "FINISH_MATCHED_STR", "FINISH_MATCHED_TOKEN",
                                "FINISHED_MATCHED_REGEX")}


@dataclass(frozen=True)
class SglangFinishReason:
    """The content of one of SGLang's finish-reason objects.

    ``kind`` names SGLang's class (``FINISH_MATCHED_TOKEN``,
    ``FINISH_MATCHED_STR``, ``FINISHED_MATCHED_REGEX``, ``FINISH_LENGTH``,
    ``FINISH_ABORT``); the other
    fields are that class's attributes, and :meth:`to_json` gives the dict its
    ``to_json()`` returns (``python/sglang/srt/managers/schedule_batch.py``,
    SGLang 0.5.23). ``is_error`` is stopline's flag for an abort or error
    finish; SGLang 0.5.23's finish classes have no such attribute (older
    releases had one on ``BaseFinishReason``), and it is not in ``to_json``.
    """

    kind: str
    type: str
    matched: int | str | None = None
    length: int | None = None
    message: str | None = None
    status_code: int | None = None
    err_type: str | None = None
    is_error: bool = False

    def __post_init__(self) -> None:
        one_of(self.kind, "kind", _SGLANG_KINDS)

    def to_json(self) -> dict[str, Any]:
        if self.type == "stop":
            return {"type": "stop", "matched": self.matched}
        if self.type == "length":
            return {"type": "length", "length": self.length}
        return {
            "type": "abort",
            "message": self.message,
            "status_code": self.status_code,
            "err_type": self.err_type,
        }


_REASONS: dict[str, str] = {r: r for r in FINISH_REASONS}


def to_sglang_finish_reason(
    finish_reason: str | None,
    matched: int | str | None = None,
    *,
    max_new_tokens: int | None = None,
    num_tokens: int | None = None,
    message: str | None = None,
    stop_reason: int | str | None = None,
    stop_regex: Iterable[str] = (),
) -> SglangFinishReason | None:
    """SGLang's finish-reason object for a stopline finish.

    Pass ``finish_reason`` and ``matched`` of a ``StepResult`` /
    ``FinishTracker``. ``None`` (running) maps to ``None``.

    * ``"stop"`` whose ``stop_reason`` is one of the request's ``stop_regex``
      patterns -> ``FINISHED_MATCHED_REGEX(matched=pattern)``, as SGLang
      reports a regex stop (the pattern, not the matched text). Pass the
      ``stop_reason`` and the request's patterns to get it; a pattern that is
      also a literal stop string of the request is reported as the regex.
    * ``"stop"`` with a ``str`` match -> ``FINISH_MATCHED_STR(matched=...)``;
      with an ``int`` match (EOS, stop token, grammar end) ->
      ``FINISH_MATCHED_TOKEN(matched=id)``.
    * ``"length"`` -> ``FINISH_LENGTH(length=max_new_tokens)``, as SGLang
      0.5.23 fills it; ``num_tokens`` is used when ``max_new_tokens`` is not given
      (a stopline length finish from ``max_model_len``).
    * ``"abort"`` -> ``FINISH_ABORT(message="Aborted")``, SGLang 0.5.23's
      default message, unless ``message`` is given.
    * ``"error"`` (a token id outside the vocabulary) -> ``FINISH_ABORT``
      with status 500 and ``err_type="InternalServerError"``. **Difference**:
      SGLang 0.5.23 reports ``FINISH_MATCHED_STR(matched="NaN happened")`` and
      keeps a substituted token; see docs/semantics.md 6.12.

    Raises:
        ValueError: for ``"repetition"`` (SGLang has no such finish reason)
            and for an unknown ``finish_reason`` (shown bounded); for
            ``"stop"`` without a ``matched`` value.
        TypeError: ``finish_reason`` not a str; ``matched`` neither a str nor
            an int (a float is not silently turned into an id);
            ``max_new_tokens`` / ``num_tokens`` not an int.
    """
    if finish_reason is None:
        return None
    reason = one_of(finish_reason, "finish_reason", _REASONS)
    if reason == "stop":
        if matched is None:
            raise field_value_error("matched", ": a 'stop' finish needs matched (a stop string or a token id)")
        if not isinstance(matched, str) and (isinstance(matched, bool) or not isinstance(matched, numbers.Integral)):
            raise field_type_error("matched", "a stop string or a token id", matched)
        if isinstance(stop_reason, str) and stop_reason in stop_list(stop_regex, "stop_regex", "max_stop_regexes"):
            return SglangFinishReason(kind="FINISHED_MATCHED_REGEX", type="stop", matched=stop_reason)
        if isinstance(matched, str):
            return SglangFinishReason(kind="FINISH_MATCHED_STR", type="stop", matched=matched)
        return SglangFinishReason(kind="FINISH_MATCHED_TOKEN", type="stop", matched=int(matched))
    if reason == "length":
        if max_new_tokens is not None:
            length: int | None = integer(max_new_tokens, "max_new_tokens")
        else:
            length = None if num_tokens is None else integer(num_tokens, "num_tokens")
        return SglangFinishReason(kind="FINISH_LENGTH", type="length", length=length)
    if reason == "abort":
        return SglangFinishReason(kind="FINISH_ABORT", type="abort", message=message or "Aborted", is_error=True)
    if reason == "error":
        return SglangFinishReason(
            kind="FINISH_ABORT",
            type="abort",
            message=message or "the sampled token id is outside the vocabulary",
            status_code=500,
            err_type="InternalServerError",
            is_error=True,
        )
    raise field_value_error("finish_reason", "='repetition': SGLang has no finish reason for repetition; map it in the engine")


@dataclass(frozen=True)
class SglangFinishResult:
    """What SGLang's ``Req.update_finish_state`` leaves on the request.

    Attributes:
        finished: ``Req.finished()``.
        finished_reason: the finish-reason object's content, ``None`` while
            running.
        finished_len: ``Req.finished_len``: how many output ids are kept
            through the stop (``output_ids_through_stop``); ``None`` while
            running.
        decided_before_new: ``True`` when the ids before this step's accepted
            ones had already finished the sequence under stopline's rules.
    """

    finished: bool
    finished_reason: SglangFinishReason | None
    finished_len: int | None
    decided_before_new: bool


_RUNNING = SglangFinishResult(finished=False, finished_reason=None, finished_len=None, decided_before_new=False)


# ------------------------------------------------------- parameter mapping --


@dataclass(frozen=True)
class SglangRequest:
    """One SGLang request's finish parameters, validated.

    ``params`` is ``None`` for a prefill-only request (``max_new_tokens=0``):
    SGLang finishes it with ``FINISH_LENGTH(length=0)`` and keeps no output
    id whatever was sampled (docs/semantics.md 6.16), and ``StopParams``
    needs ``max_tokens >= 1``, so the core is not asked.
    """

    params: StopParams | None
    max_new_tokens: int
    stop_regex: tuple[str, ...]
    has_text_stops: bool
    vocab_size: int | None

    def engine_ids(self, ids: list[int]) -> list[int]:
        """SGLang marks a NaN row with a negative id; the core accepts only ids
        >= 0, so such an id is sent as one the vocabulary check rejects."""
        v = self.vocab_size
        if v is None or not ids or min(ids) >= 0:
            return ids
        return [v if i < 0 else i for i in ids]

    def result(self, tracker: FinishState | None, decided_before_new: bool) -> SglangFinishResult:
        """The finish state SGLang leaves on the request, from a tracker's
        state (``None`` for a prefill-only request)."""
        if tracker is None:
            return SglangFinishResult(
                finished=True,
                finished_reason=SglangFinishReason(kind="FINISH_LENGTH", type="length", length=0),
                finished_len=0,
                decided_before_new=decided_before_new,
            )
        if not tracker.finished:
            return _RUNNING
        return SglangFinishResult(
            finished=True,
            finished_reason=to_sglang_finish_reason(
                tracker.finish_reason,
                tracker.matched,
                max_new_tokens=self.max_new_tokens,
                num_tokens=tracker.num_tokens,
                stop_reason=tracker.stop_reason,
                stop_regex=self.stop_regex,
            ),
            finished_len=tracker.num_tokens,
            decided_before_new=decided_before_new,
        )


# Where SGLang keeps the thinking budget (ReqFinish reads it there).
_BUDGET = "custom_params['thinking_budget']"


def finish_request(
    *,
    max_new_tokens: int,
    min_new_tokens: int = 0,
    eos_token_ids: Iterable[int] | None = None,
    ignore_eos: bool = False,
    stop_token_ids: Iterable[int] | None = None,
    stop_strs: str | Sequence[str] | None = None,
    stop_regex_strs: str | Sequence[str] | None = None,
    no_stop_trim: bool = False,
    vocab_size: int | None = None,
    reasoning: Reasoning | None = None,
    thinking_budget: int | None = None,
    starts_in: str | None = None,
    ids_only: bool = False,
    decode: bool | None = None,
    budget_field: str = _BUDGET,
) -> SglangRequest:
    """Validates an SGLang request's finish parameters and builds its
    ``StopParams`` (the rules are listed in :func:`sglang_check_finished`).

    ``reasoning`` (:func:`sglang_reasoning`) turns the channels on
    (docs/semantics.md 11): stop strings, regexes and stop token ids then fire
    only in content; ``thinking_budget`` (SGLang's
    ``custom_params["thinking_budget"]``) becomes ``max_reasoning_tokens``;
    ``starts_in`` is the channel a check fed texts starts in; ``ids_only``:
    the check has the ids but no text, and ``decode`` whether its tracker
    decodes them (:meth:`Reasoning.stop_kwargs`).

    Every list is read under its cap before anything else is built
    (``LIMITS["max_stop_token_ids"]`` ids, ``"max_stop_strings"`` strings,
    ``"max_stop_regexes"`` patterns), so a ``range(10**8)`` or an endless
    iterator costs at most the cap.

    Raises:
        TypeError: ``max_new_tokens`` / ``min_new_tokens`` not an int (None,
            NaN, a str); an id that is not an int (``stop_token_ids[1] must
            be an int, got str``); a stop entry that is not a str.
        ValueError: ``max_new_tokens < 0``; a list over its cap; whatever
            ``StopParams`` refuses (an id outside ``vocab_size``, a regex the
            Rust syntax rejects, ...), naming the field.
    """
    max_new = integer(max_new_tokens, "max_new_tokens")
    if max_new < 0:
        raise field_value_error("max_new_tokens", f" must be >= 0, got {max_new}")
    min_new = integer(min_new_tokens, "min_new_tokens")
    if min_new < 0:
        raise field_value_error("min_new_tokens", f" must be >= 0, got {min_new}")
    if vocab_size is not None:
        vocab_size = integer(vocab_size, "vocab_size")
    eos = id_list(eos_token_ids, "eos_token_ids")
    stop_ids = id_list(stop_token_ids, "stop_token_ids")
    stops = stop_list(stop_strs, "stop_strs")
    regexes = stop_list(stop_regex_strs, "stop_regex_strs", "max_stop_regexes")
    budget = thinking_budget_of(thinking_budget, budget_field)
    extra: dict[str, Any] = {}
    if reasoning is not None:
        extra = reasoning.stop_kwargs(max_reasoning_tokens=budget, ids_only=ids_only, starts_in=starts_in,
                                      decode=decode)
    elif budget is not None:
        raise field_value_error(
            budget_field,
            f"={budget} needs reasoning markers (SGLang's --reasoning-parser; reasoning=)",
        )
    params = None
    if max_new > 0:
        try:
            params = StopParams(
                max_tokens=max_new,
                min_tokens=min(min_new, max_new),
                eos_token_ids=eos,
                ignore_eos=ignore_eos,
                stop_token_ids=stop_ids,
                stop=stops or None,
                stop_regex=regexes or None,
                include_stop_str_in_output=no_stop_trim,
                vocab_size=vocab_size,
                **extra,
            )
        except (ValueError, TypeError) as exc:
            reraise_for_caller(exc, _SGLANG_NAMES)
    return SglangRequest(
        params=params,
        max_new_tokens=max_new,
        stop_regex=tuple(regexes),
        has_text_stops=bool(stops or regexes),
        vocab_size=vocab_size,
    )


# The core's prompt list as SGLang's helpers name it.
_PROMPT_IDS = {"prompt_token_ids": "prompt_ids"}

# The core's StopParams fields as SGLang's SamplingParams names them.
_SGLANG_NAMES = {"max_tokens": "max_new_tokens", "min_tokens": "min_new_tokens", "stop": "stop_strs",
                 "stop_regex": "stop_regex_strs", "include_stop_str_in_output": "no_stop_trim"}


def sglang_reasoning(reasoning_parser: str, tokenizer: Any, **options: Any) -> Reasoning:
    """The reasoning markers of SGLang's ``--reasoning-parser`` ``name``, for
    :class:`ReqFinish`'s ``reasoning=`` (built once per engine).

    The parser's detector (``ReasoningParser(model_type=name).detector``,
    ``python/sglang/srt/parser/reasoning_parser.py``) gives
    ``think_start_token`` / ``think_end_token``; their ids come from
    ``tokenizer`` (:func:`stopline.engines.reasoning_from_markers`: a one-token
    marker is recognised by id, a longer one as text). The detector's
    ``force_reasoning`` (DeepSeek-R1's: output starts in reasoning whatever
    the prompt) is not copied: stopline reads the prompt (a template that ends
    with ``<think>`` starts the output in reasoning) unless ``options`` give
    ``reasoning_starts_in``. ``options``: more
    :data:`stopline.engines.REASONING_KEYS`. Needs SGLang.

    Raises:
        ValueError: an unknown parser name (SGLang's message, as
            ``reasoning_parser``); as :func:`~stopline.engines.reasoning_from_markers`.
    """
    if not isinstance(reasoning_parser, str):
        raise field_type_error("reasoning_parser", "a str (a --reasoning-parser name)", reasoning_parser)
    from sglang.srt.parser.reasoning_parser import ReasoningParser

    try:
        detector = ReasoningParser(model_type=reasoning_parser, tokenizer=tokenizer).detector
    except ValueError as exc:
        raise field_value_error("reasoning_parser", f"={shown(reasoning_parser)}: {shown(str(exc))}") from None
    start = getattr(detector, "think_start_token", None) or None
    end = getattr(detector, "think_end_token", None)
    if not end:
        raise field_value_error("reasoning_parser", f"={shown(reasoning_parser)} names no end marker (think_end_token)")
    return reasoning_from_markers(start, end, tokenizer, field_name="reasoning_parser", **options)


# --------------------------------------------------------- request reading --


def request_fields(sampling_params: Any) -> dict[str, Any]:
    """What ``Req.update_finish_state`` reads from SGLang's ``SamplingParams``
    (after ``normalize``), as :func:`finish_request`'s keywords (all but
    ``eos_token_ids`` and ``vocab_size``, which live on the request):
    ``max_new_tokens``, ``min_new_tokens``, ``stop_strs``, ``stop_regex_strs``,
    ``stop_token_ids``, ``ignore_eos``, ``no_stop_trim``, and the thinking
    budget SGLang keeps in ``custom_params["thinking_budget"]`` (set from the
    request's ``max_thinking_tokens``)."""
    sp = sampling_params
    custom = getattr(sp, "custom_params", None)
    return dict(
        max_new_tokens=sp.max_new_tokens,
        min_new_tokens=getattr(sp, "min_new_tokens", 0) or 0,
        stop_strs=getattr(sp, "stop_strs", None),
        stop_regex_strs=getattr(sp, "stop_regex_strs", None),
        stop_token_ids=getattr(sp, "stop_token_ids", None),
        ignore_eos=flag(getattr(sp, "ignore_eos", False), "ignore_eos"),
        no_stop_trim=flag(getattr(sp, "no_stop_trim", False), "no_stop_trim"),
        thinking_budget=custom.get("thinking_budget") if isinstance(custom, dict) else None,
    )


# ------------------------------------------------------------- the helper --


def sglang_check_finished(
    output_ids: Sequence[int],
    *,
    max_new_tokens: int,
    new_accepted_len: int = 1,
    stop_strs: str | Sequence[str] | None = None,
    stop_regex_strs: str | Sequence[str] | None = None,
    output_texts: Sequence[str] | None = None,
    stop_token_ids: Iterable[int] | None = None,
    eos_token_ids: Iterable[int] | None = None,
    ignore_eos: bool = False,
    min_new_tokens: int = 0,
    vocab_size: int | None = None,
    no_stop_trim: bool = False,
    grammar_terminated: bool = False,
    reasoning: ReasoningArg = None,
    thinking_budget: int | None = None,
    prompt_ids: Sequence[int] | None = None,
) -> SglangFinishResult:
    """SGLang's ``Req.update_finish_state(new_accepted_len)``, decided by stopline.

    ``output_ids`` are all output ids so far, the ``new_accepted_len`` ids
    accepted in this step last (more than one under speculative decoding).
    ``output_texts`` holds one text piece per output id and is required when
    ``stop_strs`` or ``stop_regex_strs`` is set (SGLang decodes a tail window
    instead; stopline matches on per-token text, docs/semantics.md section 3).
    ``eos_token_ids`` should include the tokenizer's EOS and additional stop
    ids, which SGLang also checks (``_check_token_based_finish``).
    ``no_stop_trim`` is SGLang's name for keeping the stop string / token in
    the output (stopline's ``include_stop_str_in_output``); it only changes
    the text, which SGLang trims in its detokenizer.
    ``grammar_terminated`` says the grammar reached its end after this step's
    last id. ``max_new_tokens=0`` (SGLang's prefill-only requests) finishes
    with ``FINISH_LENGTH(length=0)`` and ``finished_len=0`` whatever the ids,
    as SGLang 0.5.23 (docs/semantics.md 6.16). Replays the whole history:
    O(len(output_ids)) per call; :class:`ReqFinish` is the per-request form.

    Rules (stopline's, docs/semantics.md section 3) and where SGLang 0.5.23's
    ``update_finish_state`` (``python/sglang/srt/managers/schedule_batch.py``)
    agrees:

    * Stop strings, EOS and stop token ids, token by token through the
      accepted ids: the first id at which one fires decides and
      ``finished_len`` ends at it -> ``FINISH_MATCHED_STR`` /
      ``FINISH_MATCHED_TOKEN``. A stop inside the budget beats the
      ``max_new_tokens`` cap even when the accept run crosses it, and a stop
      past the budget is a length finish at the cap: SGLang 0.5.23 agrees
      (``_cap_finished_len_at_max_new_tokens``, PR #33758).
    * ``len(output) >= max_new_tokens`` -> ``FINISH_LENGTH(max_new_tokens)``;
      a grammar end past the budget is a length finish at the cap, as in
      SGLang 0.5.23.
    * ``grammar_terminated`` -> ``FINISH_MATCHED_TOKEN(matched=last id)``
      inside the budget, as SGLang 0.5.23, and also on the last budgeted id,
      where SGLang differs (below).

    **Differences** from SGLang 0.5.23 (each in docs/semantics.md section 6):

    * A grammar end on the last budgeted id: SGLang tests
      ``max_new_tokens`` before ``grammar.is_terminated()`` and reports
      ``FINISH_LENGTH``; stopline reports the grammar finish (6.3).
    * A stop string and a token id in one accept run: SGLang checks stop
      strings over the whole run before any id, so a string *after* an EOS
      in the run wins and the EOS stays in the output; stopline stops at the
      EOS (6.10).
    * ``ignore_eos``: SGLang skips stop token ids too; stopline keeps them
      (6.6).
    * Several stop strings: SGLang takes the first in list order that
      appears in the decoded tail; stopline the one that ends first (6.1).
    * ``min_new_tokens``: SGLang enforces it only by masking stop ids; a
      stop string below it still finishes there. stopline does not finish on
      a stop string while ``n <= min_new_tokens`` (6.5).
    * A stop id's own text: SGLang decodes it into the text its stop strings
      are matched on; stopline matches it only with ``no_stop_trim`` (6.7).
    * An id outside ``[0, vocab_size)``: SGLang replaces it and reports
      ``FINISH_MATCHED_STR("NaN happened")``; stopline drops it and reports an
      error, rendered as ``FINISH_ABORT`` (status 500). A negative id (how
      SGLang marks NaN logits) is passed to the core as an out-of-range id
      (6.12).
    * ``stop_regex_strs`` are matched with Rust regex syntax, incrementally
      like stop strings (SGLang uses Python's ``re`` on a decoded tail); a
      regex stop reports ``FINISHED_MATCHED_REGEX(matched=pattern)``, as
      SGLang 0.5.23 does.
    * With ``reasoning`` (:func:`sglang_reasoning`) stop strings, regexes and
      stop token ids fire only in content (docs/semantics.md 11); SGLang
      0.5.23 matches them in the thinking too (sglang#40529).
      ``prompt_ids`` tell whether the output starts inside ``<think>``;
      ``thinking_budget`` is counted as vLLM's (11.8), not as SGLang's
      ``ThinkingBudgetLogitProcessor`` (which forces a newline before the
      end marker).

    Raises:
        ValueError / TypeError: naming the field: ``max_new_tokens`` negative
            or not an int, ``new_accepted_len`` out of range, ``output_texts``
            missing or of the wrong length, an id that is not an int, a list
            over its cap (:func:`finish_request`).
    """
    ids = read_ids(output_ids, "output_ids")
    start = split(len(ids), new_accepted_len, "new_accepted_len")
    grammar_at_end = flag(grammar_terminated, "grammar_terminated")
    reasoning = reasoning_config(reasoning)
    # Without texts the reasoning's vocabulary decodes the ids and reads the
    # prompt; with texts the prompt only says where the output starts.
    fed_texts = output_texts is not None
    starts_in, decode = None, False
    if reasoning is not None:
        with caller_names(_PROMPT_IDS):
            if fed_texts:
                starts_in = reasoning.prompt_channel(prompt_ids)
            else:
                budget = thinking_budget_of(thinking_budget, "thinking_budget")
                starts_in, decode = reasoning.ids_check(prompt_ids, count_prompt=budget is not None)
    request = finish_request(
        max_new_tokens=max_new_tokens,
        min_new_tokens=min_new_tokens,
        eos_token_ids=eos_token_ids,
        ignore_eos=ignore_eos,
        stop_token_ids=stop_token_ids,
        stop_strs=stop_strs,
        stop_regex_strs=stop_regex_strs,
        no_stop_trim=no_stop_trim,
        vocab_size=vocab_size,
        reasoning=reasoning,
        thinking_budget=thinking_budget,
        starts_in=starts_in,
        ids_only=not fed_texts,
        decode=decode,
        budget_field="thinking_budget",
    )
    pieces = _pieces(output_texts, len(ids), "output_texts", "output ids", required=request.has_text_stops)
    if request.params is None:
        return request.result(None, decided_before_new=start > 0)
    source: StopParams | FinishTracker = request.params
    if reasoning is not None and decode:
        with caller_names(_PROMPT_IDS):
            source = reasoning.tracker(request.params, prompt_ids)
    r = replay(source, request.engine_ids(ids), pieces, start, grammar_at_end=grammar_at_end,
               names={"token_ids": "output_ids", "texts": "output_texts"})
    return request.result(r, r.decided_before_new)


def _pieces(values: Any, count: int, field_name: str, what: str, *, required: bool) -> list[str] | None:
    """One text piece per id, or None; required when the request has stop
    strings or regexes."""
    if values is None:
        if required:
            raise field_value_error(field_name, " is required: stop_strs / stop_regex_strs are matched on text")
        return None
    pieces = texts(values, field_name)
    if len(pieces) != count:
        raise field_value_error(field_name, f" has {len(pieces)} pieces for {count} {what}; pass one piece per id")
    return pieces


# -------------------------------------------------------- the per-request --

class ReqFinish:
    """Per-request finish state in SGLang's terms, decided by stopline.

    Args:
        sampling_params: SGLang's ``SamplingParams`` (after ``normalize``) or
            any object with ``max_new_tokens``, ``min_new_tokens``,
            ``stop_strs``, ``stop_regex_strs``, ``stop_token_ids``,
            ``ignore_eos`` and ``no_stop_trim`` (:func:`request_fields`).
        eos_token_ids: the request's EOS ids (``Req.eos_token_ids``) plus the
            tokenizer's ``eos_token_id`` and ``additional_stop_token_ids``,
            which SGLang also checks.
        vocab_size: ids outside ``[0, vocab_size)`` finish the request as an
            error (SGLang: ``FINISH_MATCHED_STR("NaN happened")``).
        tokenizer: a fast tokenizer (``transformers`` or ``tokenizers``): the
            ids are decoded by stopline's core from its ``tokenizer.json``
            (:func:`vocabulary_for`; special tokens kept, as SGLang's
            ``tokenizer.decode``), or by ``tokenizers``' ``DecodeStream``
            when the core refuses its decoder. Without it, pass the texts to
            :meth:`update`.
        prompt_ids: the prompt's ids, to prime the decoder (semantics.md 10.3).
        vocabulary: a :class:`stopline.Vocabulary` to decode with, instead of
            building one from ``tokenizer``.
        reasoning: the engine's reasoning markers (:func:`sglang_reasoning`,
            built once per engine), or ``None``. With them stop strings,
            regexes and stop token ids fire only in content (a stop met inside
            ``<think>`` does not end the request, where SGLang 0.5.23 stops
            there, sglang#40529); a prompt that ends inside ``<think>`` starts
            the output in reasoning (read from ``prompt_ids`` with the
            vocabulary); ``tracker.reasoning`` / ``tracker.content`` hold the
            split SGLang's reasoning parser would make, markers left out; and
            ``custom_params["thinking_budget"]`` sets the thinking budget,
            whose next forced id is :attr:`forced_token_id`.

    Rules: docs/semantics.md sections 2 and 3, as :func:`sglang_check_finished`
    (the same :func:`finish_request`); where SGLang 0.5.23 decides otherwise it
    is listed there and in docs/integrations.md.

    Raises:
        ValueError / TypeError: invalid parameters, naming the field
            (:func:`finish_request`), a stop regex the Rust regex syntax
            rejects.
    """

    def __init__(
        self,
        sampling_params: Any,
        *,
        eos_token_ids: Iterable[int] = (),
        vocab_size: int | None = None,
        tokenizer: Any = None,
        prompt_ids: Sequence[int] = (),
        vocabulary: Vocabulary | None = None,
        reasoning: ReasoningArg = None,
    ):
        reasoning = reasoning_config(reasoning)
        prompt = read_ids(prompt_ids, "prompt_ids")
        if vocabulary is None and tokenizer is not None:
            vocabulary = vocabulary_for(tokenizer)
        v = None if vocab_size is None else integer(vocab_size, "vocab_size")
        core_decodes = vocabulary is not None and v is not None and v <= vocabulary.vocab_size
        # A tracker that decodes reads the prompt itself (and counts its
        # thinking for the budget); one fed texts is told where output starts.
        with caller_names(_PROMPT_IDS):
            starts_in = None if reasoning is None or core_decodes else reasoning.prompt_channel(prompt)
        self._request = request = finish_request(
            **request_fields(sampling_params), eos_token_ids=eos_token_ids, vocab_size=v,
            reasoning=reasoning, starts_in=starts_in,
        )
        self.max_new_tokens = request.max_new_tokens
        self._fed = 0
        self._done = False
        # How each id's text is found: the core decodes the ids inside the
        # tracker ("ids"), or per id through an IncrementalDecoder when the
        # engine's vocabulary is wider than the tokenizer's ("decoder": the
        # ids past the tokenizer have no text, as DecodeStream gives them);
        # DecodeStream for a decoder the core refuses ("stream"); or the
        # caller passes the texts ("texts").
        self._decoder: Any = None
        self._backend: Any = None
        self._decoded_ids = 0  # ids below this have a text (the rest decode to "")
        if vocabulary is None and tokenizer is not None:  # the core refuses this decoder
            from tokenizers.decoders import DecodeStream

            self._backend = getattr(tokenizer, "backend_tokenizer", tokenizer)
            self._decoder = DecodeStream(ids=prompt[-8:], skip_special_tokens=False)
        params = request.params
        self._tracker: FinishTracker | None = None
        if vocabulary is not None:
            self._decoded_ids = vocabulary.vocab_size
            if core_decodes:
                self._mode = "ids"
                if params is not None:
                    with caller_names(_PROMPT_IDS):
                        self._tracker = FinishTracker(params, vocabulary, prompt_token_ids=prompt,
                                                      skip_special_tokens=False)
                return
            self._mode = "decoder"
            with caller_names(_PROMPT_IDS):
                self._decoder = vocabulary.decoder_for(prompt, skip_special_tokens=False)
        elif self._decoder is not None:
            self._mode = "stream"
            self._decoded_ids = request.vocab_size if request.vocab_size is not None else 2**32
        else:
            self._mode = "texts"
        if params is not None:
            self._tracker = FinishTracker(params)

    @property
    def tracker(self) -> FinishTracker:
        """The underlying :class:`stopline.FinishTracker` (text, token ids
        kept, reasons). A prefill-only request (``max_new_tokens=0``) has none:
        ValueError."""
        if self._tracker is None:
            raise field_value_error("max_new_tokens", "=0: a prefill-only request has no tracker")
        return self._tracker

    @property
    def forced_token_id(self) -> int | None:
        """The id the thinking budget forces next (``tracker.forced_token_id``;
        docs/semantics.md 11.8), ``None`` without a budget, outside the block,
        or for a prefill-only request. Force it with
        :meth:`stopline.logits.LogitsConstraints.force`."""
        return None if self._tracker is None else self._tracker.forced_token_id

    def update(self, new_accepted_ids: Iterable[int], texts: Sequence[str] | None = None) -> SglangFinishResult:
        """Feed the ids accepted in this step (one, or a speculative run).

        ``texts`` gives each id's decoded text, and is only for a
        ``ReqFinish`` built without a tokenizer (it is required then when the
        request has stop strings or regexes). Returns :class:`SglangFinishResult`:
        ``finished``, ``finished_reason`` (``FINISH_MATCHED_STR``,
        ``FINISHED_MATCHED_REGEX`` with the pattern, ``FINISH_MATCHED_TOKEN``,
        ``FINISH_LENGTH``, ``FINISH_ABORT``) and ``finished_len`` (output ids
        kept through the stop, SGLang's ``finished_len``). After a finish the
        same finish is returned, with ``decided_before_new``.

        Raises:
            TypeError / ValueError: an id that is not an int, more ids than
                ``LIMITS["max_step_tokens"]``, ``texts`` of the wrong length
                or given to a ``ReqFinish`` that decodes.
        """
        request = self._request
        ids = read_ids(new_accepted_ids, "new_accepted_ids")
        if ids and request.vocab_size is not None and min(ids) < 0:
            ids = request.engine_ids(ids)
        mode = self._mode
        if texts is not None and mode != "texts":
            raise field_value_error("texts", ": this ReqFinish decodes the ids itself (a tokenizer was given)")
        tracker = self._tracker
        if tracker is None or self._done:  # prefill-only, or finished before this call
            decided_before = self._fed > 0 if tracker is None else True
            self._fed += len(ids)
            return request.result(tracker, decided_before)
        try:
            if mode == "ids":
                r = tracker.update(ids)
            elif mode == "texts":
                # The core checks the pieces (str, one per id, required with stop strings or regexes).
                r = tracker.update(ids, texts)
            else:
                r = tracker.update(ids, [self._piece(i) for i in ids])
        except (ValueError, TypeError) as exc:
            reraise_for_caller(exc, {"token_ids": "new_accepted_ids"})
        self._fed += len(ids)
        if not r.finished:
            return _RUNNING
        self._done = True
        return request.result(tracker, False)

    def _piece(self, token_id: int) -> str:
        if not 0 <= token_id < self._decoded_ids:
            return ""
        if self._mode == "decoder":
            return str(self._decoder.step(token_id))
        piece = self._decoder.step(self._backend, token_id)
        return piece if isinstance(piece, str) else ""
