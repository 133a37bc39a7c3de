"""vLLM V1's stop rules, in one place (vLLM 0.33.0).

What is written here and nowhere else:

- parameter mapping: :func:`scheduler_params` (the scheduler's
  ``check_stop``: EOS, stop token ids, the length caps, repetition) and
  :func:`detokenizer_params` (the detokenizer's stop strings) build the
  ``StopParams`` of a request;
- request reading: :func:`request_fields` and :func:`detokenizer_fields` read
  a ``Request`` / ``SamplingParams`` (duck-typed, nothing imported from vLLM);
- status translation: :func:`to_vllm_status` (``RequestStatus`` names).

Two pairs use them, each a stateless helper that replays the whole history
(O(output) per call, a drop-in for vLLM's own functions) and a per-request
object fed only what is new (O(new tokens) per call):

- :func:`vllm_check_stop` / :func:`vllm_check_stop_request` and
  :class:`RequestStop` (``vllm/v1/core/sched/utils.py::check_stop``);
- :func:`vllm_detokenizer_stop` and :class:`DetokenizerStop` (the stop-string
  step of ``vllm/v1/engine/detokenizer.py``).

``tests/test_engine_parity.py`` checks each pair gives the same answers on
the same random histories. The decision is always stopline's
(docs/semantics.md sections 2 and 3); where vLLM decides otherwise the
docstrings name the entry of docs/semantics.md section 6.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from stopline._caps import field_type_error, field_value_error, flag, integer, one_of, shown, token_id
from stopline._core import LIMITS, FinishTracker, StepResult, StopParams

from ._common import (
    FinishState,
    Reasoning,
    ReasoningArg,
    id_list,
    output_ids,
    reasoning_config,
    reasoning_from_markers,
    replay,
    reraise_for_caller,
    split,
    stop_list,
    thinking_budget,
    vocabulary_for,
)
from ._common import texts as read_texts

__all__ = [
    "DetokenizerStop",
    "RequestStop",
    "VllmStopResult",
    "VllmStopStringResult",
    "detokenizer_fields",
    "detokenizer_params",
    "request_fields",
    "scheduler_params",
    "to_vllm_status",
    "vllm_check_stop",
    "vllm_check_stop_request",
    "vllm_detokenizer_stop",
    "vllm_reasoning",
]

#: vLLM's ``RequestStatus`` member name for each stopline ``finish_reason``
#: (``vllm/v1/request.py``: ``RequestStatus`` and ``_FINISHED_REASON_MAP``); its
#: keys are ``stopline.FINISH_REASONS`` (tests/test_compat.py checks they agree).
VLLM_STATUS = {
    "stop": "FINISHED_STOPPED",
    "length": "FINISHED_LENGTH_CAPPED",
    "abort": "FINISHED_ABORTED",
    "error": "FINISHED_ERROR",
    "repetition": "FINISHED_REPETITION",
}


def to_vllm_status(finish_reason: str | None) -> str | None:
    """The name of vLLM's ``RequestStatus`` for a stopline ``finish_reason``.

    ``None`` (still running) maps to ``None``. The mapping is the inverse of
    vLLM's status-to-reason table in ``vllm/v1/request.py``: ``FINISHED_IGNORED``
    (a prompt longer than the model) never comes out of stopline, which
    rejects such a request when ``StopParams`` is built.

    Raises:
        ValueError: a str that is not a stopline finish reason (shown bounded).
        TypeError: a value that is not a str (a list, an int, ...).
    """
    if finish_reason is None:
        return None
    return one_of(finish_reason, "finish_reason", VLLM_STATUS)


# --------------------------------------------------------------- reasoning --


def _tokenizer_size(tokenizer: Any) -> int | None:
    """How many ids ``tokenizer`` decodes (added tokens included): ``len()``
    of a ``transformers`` tokenizer, ``get_vocab_size(with_added_tokens=True)``
    of a ``tokenizers.Tokenizer``; ``None`` when it tells neither."""
    try:
        return int(len(tokenizer))
    except TypeError:
        pass
    size_of = getattr(tokenizer, "get_vocab_size", None)
    return int(size_of(with_added_tokens=True)) if callable(size_of) else None


def _ids_of(value: Any, field_name: str, size: int | None) -> list[int]:
    """A ``ReasoningConfig`` id list, each id in ``[0, size)`` (``size``: the
    tokenizer's, else ``2**32``), checked before the tokenizer decodes them
    (its own errors name no field; an id past it decodes to ``""``)."""
    ids = output_ids(value, field_name) if value is not None else []
    limit = 2**32 if size is None else size
    for i in ids:
        if not 0 <= i < limit:
            where = "[0, 2**32)" if size is None else f"the tokenizer's {size} ids [0, {size})"
            raise field_value_error(field_name, f"={shown(ids)}: the id {i} is outside {where}", "id_outside")
    return ids


def vllm_reasoning(
    vllm_config: Any = None,
    *,
    reasoning_parser: str | None = None,
    tokenizer: Any = None,
    **options: Any,
) -> Reasoning | None:
    """The reasoning markers a vLLM engine is configured with, for the
    adapters' ``reasoning=`` (built once per engine).

    Read, in this order:

    * ``reasoning_parser`` (a ``--reasoning-parser`` name such as ``"qwen3"``
      or ``"deepseek_r1"``) with ``tokenizer``: the parser class from vLLM's
      ``ReasoningParserManager``, built on the tokenizer, gives
      ``reasoning_start_str`` / ``reasoning_end_str``; their ids are resolved
      as vLLM's ``ReasoningConfig.initialize_token_ids`` does
      (:func:`stopline.engines.reasoning_from_markers`). Needs vLLM.
    * else ``vllm_config.reasoning_config`` (or a ``ReasoningConfig`` itself),
      once vLLM has initialised it (``enabled``): its
      ``reasoning_start_token_ids``, ``natural_reasoning_end_token_ids`` (the
      end marker) and ``reasoning_end_token_ids`` (what the thinking budget
      forces, which may start with a transition phrase). A one-token marker is
      recognised by id; a longer one is matched as the text ``tokenizer``
      decodes it to (so ``tokenizer`` is then required). ``None`` when the
      config has no reasoning (vLLM without ``--reasoning-parser``).

    ``options``: more ``StopParams`` reasoning keywords
    (:data:`stopline.engines.REASONING_KEYS`, e.g.
    ``keep_reasoning_markers=True``). With ``tokenizer`` the result carries its
    :class:`~stopline.Vocabulary`, with which ids-only checks read the prompt.

    Raises:
        TypeError / ValueError: naming the field: an unknown parser name, or
            one vLLM cannot build on this tokenizer (vLLM's message, as
            ``reasoning_parser``; its ``<think>`` parsers need the markers to
            be single tokens: give other markers by
            :func:`~stopline.engines.reasoning_from_markers`), a
            multi-token marker without ``tokenizer``, an empty marker, an
            unknown option.
    """
    if reasoning_parser is not None:
        if not isinstance(reasoning_parser, str):
            raise field_type_error("reasoning_parser", "a str (a --reasoning-parser name)", reasoning_parser)
        if tokenizer is None:
            raise field_value_error("tokenizer", " is required with reasoning_parser (the markers' ids come from it)")
        from vllm.reasoning import ReasoningParserManager

        try:
            parser_cls = ReasoningParserManager.get_reasoning_parser(reasoning_parser)
        except KeyError as exc:
            raise field_value_error("reasoning_parser", f"={shown(reasoning_parser)}: {shown(str(exc))}") from None
        try:
            parser = parser_cls(tokenizer)
        except (RuntimeError, ValueError) as exc:  # e.g. the tokenizer lacks the parser's marker tokens
            raise field_value_error("reasoning_parser", f"={shown(reasoning_parser)}: {shown(str(exc))}") from None
        start, end = parser.reasoning_start_str, parser.reasoning_end_str
        if not end:
            raise field_value_error(
                "reasoning_parser", f"={shown(reasoning_parser)} names no end marker (reasoning_end_str)"
            )
        return reasoning_from_markers(start or None, end, tokenizer, field_name="reasoning_parser", **options)
    config = getattr(vllm_config, "reasoning_config", vllm_config)
    if config is None:
        return None
    if not hasattr(config, "enabled"):  # a parser name or any other object: not silently "off"
        raise field_type_error(
            "vllm_config", "a vLLM VllmConfig or ReasoningConfig (a parser name goes in reasoning_parser=)",
            vllm_config,
        )
    if not config.enabled:
        return None
    size = None if tokenizer is None else _tokenizer_size(tokenizer)
    kw: dict[str, Any] = dict(options)
    for key, attr in (("reasoning_start", "reasoning_start_token_ids"),
                      ("reasoning_end", "natural_reasoning_end_token_ids")):
        field_name = f"reasoning_config.{attr}"
        ids = _ids_of(getattr(config, attr, None), field_name, size)
        if len(ids) == 1:
            kw[f"{key}_id"] = ids[0]
        if tokenizer is not None and ids:
            kw[key] = tokenizer.decode(ids, skip_special_tokens=False)
        elif len(ids) > 1:
            raise field_value_error(
                field_name, f"={shown(ids)} is several tokens: pass tokenizer= to match the marker as text"
            )
    forced = _ids_of(getattr(config, "reasoning_end_token_ids", None), "reasoning_config.reasoning_end_token_ids",
                     size)
    if forced:
        kw["reasoning_end_ids"] = forced
    return reasoning_config(kw, "reasoning_config", vocabulary_for(tokenizer) if tokenizer is not None else None)


# ------------------------------------------------------- parameter mapping --


# Core field names as vLLM's request spells them: the repetition values, and
# the one EOS id (the core's list of one).
_SCHEDULER_NAMES = {
    "eos_token_ids[0]": "eos_token_id",
    **{f'repetition["{k}"]': f"repetition_detection.{k}" for k in ("max_pattern_size", "min_pattern_size", "min_count")},
}


def repetition_params(value: Any) -> dict[str, int] | None:
    """vLLM's ``RepetitionDetectionParams`` (object or mapping) as
    ``StopParams(repetition=...)``.

    vLLM treats ``max_pattern_size <= 0`` as "off" (``check_sequence_repetition``
    returns False); stopline has no off value, so that case maps to ``None``.
    """
    if value is None:
        return None
    if isinstance(value, Mapping):
        get = value.get
    else:
        def get(key: str, default: Any = None) -> Any:
            return getattr(value, key, default)

    def field(key: str) -> int:
        return integer(get(key, 0) or 0, f"repetition_detection.{key}")

    max_size = field("max_pattern_size")
    if max_size <= 0:
        return None
    return {
        "max_pattern_size": max_size,
        "min_pattern_size": field("min_pattern_size"),
        "min_count": field("min_count"),
    }


def scheduler_params(
    *,
    num_prompt_tokens: int,
    max_model_len: int,
    max_tokens: int | None,
    min_tokens: int,
    eos_token_id: int | None,
    stop_token_ids: Iterable[int] | None,
    ignore_eos: bool,
    all_stop_token_ids: Iterable[int] | None,
    repetition_detection: Any,
    thinking_token_budget: int | None = None,
    reasoning: Reasoning | None = None,
    starts_in: str | None = None,
    decode: bool | None = None,
) -> StopParams:
    """The ``StopParams`` of a request's scheduler-side checks (vLLM 0.33.0's
    ``check_stop``; the rules are listed in :func:`vllm_check_stop`).
    ``reasoning`` (:func:`vllm_reasoning`) turns the channels on: stop token
    ids then fire only in content, and ``thinking_token_budget`` (``None`` or
    -1: unlimited, as vLLM) becomes ``max_reasoning_tokens``; ``starts_in``
    and ``decode`` as :meth:`Reasoning.stop_kwargs` (:func:`scheduler_tracker`
    picks them).

    Raises:
        TypeError: a count that is not an int (``max_tokens="5"``), a list of
            ids holding a non-int, naming the field.
        ValueError: inconsistent ``all_stop_token_ids``; more ids than
            ``LIMITS["max_stop_token_ids"]``; a ``thinking_token_budget``
            without ``reasoning`` (vLLM refuses it without a reasoning
            config too); whatever ``StopParams`` refuses.
    """
    budget = thinking_budget(thinking_token_budget, "thinking_token_budget")
    if budget is not None and reasoning is None:
        raise field_value_error(
            "thinking_token_budget", f"={budget} needs reasoning markers (vLLM's --reasoning-parser; reasoning=)"
        )
    stop_ids = id_list(stop_token_ids, "stop_token_ids")
    eos_ids = [] if eos_token_id is None else [token_id(eos_token_id, "eos_token_id")]
    min_tokens = integer(min_tokens, "min_tokens")
    if max_tokens is not None:
        max_tokens = integer(max_tokens, "max_tokens")
        # vLLM 0.33.0's check_stop accepts max_tokens < min_tokens; the length
        # cap fires first, so lowering min_tokens changes no decision.
        min_tokens = min(min_tokens, max_tokens)
    if all_stop_token_ids is not None:
        declared = set(id_list(all_stop_token_ids, "all_stop_token_ids"))
        needed = set(stop_ids) | (set() if ignore_eos else set(eos_ids))
        missing = sorted(needed - declared)
        if missing:
            raise field_value_error(
                "all_stop_token_ids",
                f" lacks {missing[:8]}{' ...' if len(missing) > 8 else ''}; vLLM builds it from "
                "eos_token_id and stop_token_ids, so the params are inconsistent",
            )
    try:
        return StopParams(
            max_tokens=max_tokens,
            min_tokens=min_tokens,
            prompt_len=num_prompt_tokens,
            max_model_len=max_model_len,
            eos_token_ids=eos_ids,
            ignore_eos=ignore_eos,
            stop_token_ids=stop_ids,
            repetition=repetition_params(repetition_detection),
            **(reasoning.stop_kwargs(max_reasoning_tokens=budget, ids_only=True, starts_in=starts_in, decode=decode)
               if reasoning else {}),
        )
    except (ValueError, TypeError) as exc:
        reraise_for_caller(exc, {"prompt_len": "num_prompt_tokens"}, exact=_SCHEDULER_NAMES)


def scheduler_tracker(
    fields: Mapping[str, Any], max_model_len: int, reasoning: Reasoning | None, prompt_token_ids: Any
) -> FinishTracker:
    """A fresh tracker of a request's scheduler-side checks
    (:func:`scheduler_params` of ``fields``, :func:`request_fields`' keys).
    With ``reasoning`` it follows the channels from the ids
    (:meth:`Reasoning.ids_check`): marker ids are matched by id and the
    prompt (read with the reasoning's vocabulary) says where the output
    starts, so an id past the tokenizer (a padded embedding row) is just
    content; only a text-only marker makes it decode the ids. The thinking
    budget is counted from the output here (``tracker.forced_token_id`` is
    informative: the logits processors force it, counting the prompt's
    thinking too, as vLLM)."""
    if reasoning is None:
        return FinishTracker(scheduler_params(max_model_len=max_model_len, **fields))
    starts_in, decode = reasoning.ids_check(prompt_token_ids, count_prompt=False)
    params = scheduler_params(max_model_len=max_model_len, reasoning=reasoning, starts_in=starts_in, decode=decode,
                              **fields)
    return reasoning.tracker(params, prompt_token_ids) if decode else FinishTracker(params)


# Stop strings are matched on per-token text; the token ids are stand-ins
# unless the reasoning markers are ids (then the real ids are needed). The
# token that ends a stop-terminated update is sent as a stop token (in any
# channel: the scheduler decided it), so the core leaves its text out unless
# include_stop_str_in_output and flushes the text held back as a live
# stop-string prefix, as vLLM's detokenizer does.
_PLAIN_ID = 0
_TERMINATOR_ID = 2**32 - 1
_OUTPUT_IDS = {"token_ids": "output_token_ids"}  # the core's step list, as RequestStop's caller names it
_NEW_TEXTS = {"texts": "new_texts"}  # DetokenizerStop.update's pieces
# The detokenizer helpers name their lists as the core does; mapping them to
# themselves only moves an error's index by where the core's list began.
_SAME_NAMES = {"token_ids": "token_ids", "texts": "texts"}


def detokenizer_params(
    *,
    stop: Any,
    include_stop_str_in_output: bool,
    min_tokens: int,
    reasoning: Reasoning | None = None,
    starts_in: str | None = None,
) -> StopParams:
    """The ``StopParams`` of the detokenizer's stop-string step (the rules are
    listed in :func:`vllm_detokenizer_stop`). ``stop``: ``None``, one str or an
    iterable of str (as ``SamplingParams.stop``). ``reasoning``
    (:func:`vllm_reasoning`): stop strings then apply to content only;
    ``starts_in``: the channel the output starts in
    (:meth:`Reasoning.prompt_channel`).

    Raises:
        TypeError / ValueError: naming the field (``stop``, ``min_tokens``,
            ``include_stop_str_in_output``, a reasoning keyword).
    """
    stops = stop_list(stop, "stop")
    extra: dict[str, Any] = {}
    if reasoning is not None:
        extra = reasoning.stop_kwargs(max_reasoning_tokens=None, ids_only=False, starts_in=starts_in)
        if reasoning.has_block:  # the terminator id ends the update in either channel
            extra["stop_token_id_scopes"] = ["any"]
    return StopParams(
        stop=stops or None,
        include_stop_str_in_output=include_stop_str_in_output,
        min_tokens=integer(min_tokens, "min_tokens"),
        stop_token_ids=[_TERMINATOR_ID],
        **extra,
    )


def _needs_ids(params: StopParams) -> bool:
    """Whether the reasoning or tool-call span markers include ids, so the
    real token ids must be fed (stand-ins would never match them)."""
    r = params.reasoning
    by_id = r is not None and (r["reasoning_start_id"] is not None or r["reasoning_end_id"] is not None)
    return by_id or bool(params.tool_call_marker_ids)


def _has_spans(params: StopParams) -> bool:
    return bool(params.tool_call_markers or params.tool_call_marker_ids)


def _feed_detokenizer(
    tracker: FinishTracker,
    params: StopParams,
    ids: list[int],
    pieces: Sequence[str],
    stop_terminated: bool,
    real_last: int,
) -> list[StepResult]:
    """One detokenizer update of ``tracker`` (``ids`` from
    :func:`_detokenizer_ids`). A stop-terminated update's last token ends the
    request whatever the state, the scheduler having decided: inside a
    tool-call span, where no stop token id fires (docs/semantics.md 11.10),
    it is fed as an ordinary token (``real_last``; its text only with
    ``include_stop_str_in_output``, as vLLM's detokenizer) and the tracker is
    aborted, releasing what it holds."""
    if not (stop_terminated and _has_spans(params)):
        return [tracker.update(ids, list(pieces))]
    out = [tracker.update(ids[:-1], list(pieces[:-1]))] if len(ids) > 1 else []
    if tracker.finished:
        return out
    try:  # the last token alone: its errors are addressed at its place in the step
        if not tracker.in_tool_call:
            out.append(tracker.update(ids[-1:], list(pieces[-1:])))
            return out
        out.append(tracker.update([real_last], [pieces[-1] if params.include_stop_str_in_output else ""]))
    except (ValueError, TypeError) as exc:
        reraise_for_caller(exc, _SAME_NAMES, len(ids) - 1)
    if not tracker.finished:
        out.append(tracker.abort())
    return out


def _detokenizer_ids(count: int, stop_terminated: bool, token_ids: Any, needs_ids: bool) -> tuple[list[int], int]:
    """The ids to feed (stand-ins unless given; the last one the terminator
    when ``stop_terminated``) and the real last id (``_PLAIN_ID`` when none
    were given)."""
    if token_ids is None:
        if needs_ids:
            raise field_value_error(
                "token_ids", " is required: the reasoning or tool-call markers are token ids, recognised by id"
            )
        ids = [_PLAIN_ID] * count
    else:
        ids = list(output_ids(token_ids, "token_ids"))
        if len(ids) != count:
            raise field_value_error("token_ids", f" has {len(ids)} ids for {count} text pieces; pass one id per piece")
        if _TERMINATOR_ID in ids:  # no tokenizer comes near 2**32 ids
            raise field_value_error(
                "token_ids", f" holds {_TERMINATOR_ID}, which this adapter reserves for a stop-terminated update"
            )
    real_last = ids[-1] if ids else _PLAIN_ID
    if stop_terminated and ids:
        if token_ids is not None:  # replaced below, so the core never sees it
            token_id(real_last, f"token_ids[{count - 1}]")
        ids[-1] = _TERMINATOR_ID
    return ids, real_last


# --------------------------------------------------------- request reading --


def request_fields(request: Any) -> dict[str, Any]:
    """What vLLM's ``check_stop`` reads from a ``Request``, as
    :func:`scheduler_params`' keywords (all but ``max_model_len``).

    Read, duck-typed: ``request.num_prompt_tokens``, ``request.max_tokens``
    (falling back to ``sampling_params.max_tokens``), ``request.sampling_params``
    with ``min_tokens``, ``eos_token_id``, ``stop_token_ids``, ``ignore_eos``,
    ``all_stop_token_ids``, ``repetition_detection`` and
    ``thinking_token_budget`` where present, and
    ``request.eos_token_id`` when the sampling params carry none (older vLLM
    v1 kept the EOS id on the request).

    Raises:
        ValueError: a pooling request (``request.pooling_params`` set): pooling
            has no generation finish for stopline to decide; a request without
            sampling params.
    """
    if getattr(request, "pooling_params", None):
        raise field_value_error(
            "request.pooling_params", " is set: this is a pooling request; stopline decides generation finishes only"
        )
    sp = getattr(request, "sampling_params", None)
    if sp is None:
        raise field_value_error("request.sampling_params", " is None; nothing to decide")
    eos = getattr(sp, "eos_token_id", None)
    if eos is None:
        eos = getattr(request, "eos_token_id", None)
    max_tokens = getattr(request, "max_tokens", None)
    if max_tokens is None:
        max_tokens = getattr(sp, "max_tokens", None)
    return dict(
        num_prompt_tokens=request.num_prompt_tokens,
        max_tokens=max_tokens,
        min_tokens=getattr(sp, "min_tokens", 0) or 0,
        eos_token_id=eos,
        stop_token_ids=getattr(sp, "stop_token_ids", None),
        ignore_eos=flag(getattr(sp, "ignore_eos", False), "ignore_eos"),
        all_stop_token_ids=getattr(sp, "all_stop_token_ids", None),
        repetition_detection=getattr(sp, "repetition_detection", None),
        thinking_token_budget=getattr(sp, "thinking_token_budget", None),
    )


def detokenizer_fields(sampling_params: Any) -> dict[str, Any]:
    """What vLLM's incremental detokenizer reads from ``SamplingParams``, as
    :func:`detokenizer_params`' keywords: ``stop``, ``include_stop_str_in_output``
    and ``min_tokens``."""
    return dict(
        stop=sampling_params.stop,
        include_stop_str_in_output=flag(sampling_params.include_stop_str_in_output, "include_stop_str_in_output"),
        min_tokens=sampling_params.min_tokens or 0,
    )


# ------------------------------------------------------------ the scheduler --


@dataclass(frozen=True)
class VllmStopResult:
    """What vLLM's scheduler-side stop check decides, computed by stopline.

    Attributes:
        stopped: ``check_stop``'s return value.
        status: the ``RequestStatus`` name vLLM would set
            (``"FINISHED_STOPPED"``, ``"FINISHED_LENGTH_CAPPED"``,
            ``"FINISHED_REPETITION"``, ...), ``None`` while running.
        finish_reason: ``str(FinishReason)`` for that status: ``"stop"``,
            ``"length"``, ``"repetition"``, ...; ``None`` while running.
        stop_reason: ``Request.stop_reason``: the stop token id, the string
            ``"repetition_detected"``, or ``None`` (EOS, length, running).
        num_output_tokens: output tokens kept. vLLM's
            ``_update_request_with_output`` appends an accept run token by
            token and drops everything after the token that stopped it; this
            is the length of ``output_token_ids`` after that trim.
        new_token_ids: the part of the new tokens that is kept (what vLLM
            returns as ``new_token_ids`` from ``_update_request_with_output``).
        decided_before_new: ``True`` when the tokens before the new ones had
            already finished the sequence (the engine kept decoding a request
            stopline would have stopped earlier; see docs/semantics.md).
    """

    stopped: bool
    status: str | None
    finish_reason: str | None
    stop_reason: int | str | None
    num_output_tokens: int
    new_token_ids: tuple[int, ...]
    decided_before_new: bool


def _stop_result(state: FinishState, kept_new: Sequence[int], decided_before_new: bool) -> VllmStopResult:
    """The scheduler's view of a finish state: ``kept_new`` are the new ids kept."""
    return VllmStopResult(
        stopped=state.finished,
        status=to_vllm_status(state.finish_reason),
        finish_reason=state.finish_reason,
        stop_reason=state.stop_reason,
        num_output_tokens=state.num_tokens,
        new_token_ids=tuple(kept_new),
        decided_before_new=decided_before_new,
    )


def vllm_check_stop(
    output_token_ids: Sequence[int],
    *,
    num_prompt_tokens: int,
    max_model_len: int,
    max_tokens: int | None = None,
    min_tokens: int = 0,
    eos_token_id: int | None = None,
    stop_token_ids: Iterable[int] | None = None,
    ignore_eos: bool = False,
    all_stop_token_ids: Iterable[int] | None = None,
    repetition_detection: Any = None,
    num_new_tokens: int = 1,
    thinking_token_budget: int | None = None,
    reasoning: ReasoningArg = None,
    prompt_token_ids: Sequence[int] | None = None,
) -> VllmStopResult:
    """vLLM v1's ``check_stop(request, max_model_len)``, decided by stopline.

    Inputs are what vLLM's check reads from the request: every output token so
    far with the ``num_new_tokens`` tokens of this step last (1 for plain
    decoding, the accept run for speculative decoding), the prompt length,
    ``Request.max_tokens`` and the sampling params. vLLM calls its check once
    per appended token and trims the run at the first stop
    (``Scheduler._update_request_with_output``); this helper takes the whole
    run at once and reports the same trim, because stopline examines a run
    token by token (docs/semantics.md section 3). Replays the whole history:
    O(len(output_token_ids)) per call; :class:`RequestStop` is the
    per-request form.

    Rules and where they come from:

    * EOS (``eos_token_id``, unless ``ignore_eos``) -> ``FINISHED_STOPPED``,
      ``stop_reason`` None; a ``stop_token_ids`` hit -> ``FINISHED_STOPPED``,
      ``stop_reason`` = the id, and ``ignore_eos`` does not disable it. Same
      as vLLM's ``check_stop`` (``vllm/v1/core/sched/utils.py``).
    * EOS and stop tokens are checked before the length caps, so a stop
      token on the last budgeted token reports ``FINISHED_STOPPED``, as
      vLLM 0.33.0's ``check_stop`` (PR #27555 brought this order to v1).
    * ``num_prompt_tokens + n >= max_model_len`` or ``n >= max_tokens`` ->
      ``FINISHED_LENGTH_CAPPED``, also below ``min_tokens``.
    * A sampled EOS or stop token finishes the request even below
      ``min_tokens`` (docs/semantics.md section 3, check 3: ``min_tokens`` is
      enforced by masking the logits), as vLLM 0.33.0's ``check_stop``, which
      tests the stops and the length caps before its ``min_tokens`` gate
      (PR #26317 once made it ignore every stop below ``min_tokens``). See
      docs/semantics.md 6.4.
    * ``repetition_detection`` (vLLM's ``RepetitionDetectionParams`` or a
      mapping with ``max_pattern_size``, ``min_pattern_size``,
      ``min_count``) -> ``FINISHED_REPETITION`` with ``stop_reason``
      ``"repetition_detected"``, only from ``n >= min_tokens`` on.
    * ``max_tokens`` below ``min_tokens`` (vLLM 0.33.0's ``check_stop`` reads
      ``Request.max_tokens`` and accepts it) is accepted: ``min_tokens`` is
      lowered to ``max_tokens``, which changes no decision because the
      length cap fires first.

    ``all_stop_token_ids`` is vLLM's set of ids the ``min_tokens`` logits
    processor masks; ``check_stop`` does not read it and neither does this
    helper, except to check it is consistent: it must contain
    ``eos_token_id`` (unless ``ignore_eos``) and every stop token id.

    Stop strings are not part of vLLM's ``check_stop`` (its detokenizer
    handles them); use :func:`vllm_detokenizer_stop`.

    With ``reasoning`` (:func:`vllm_reasoning`; docs/semantics.md 11) a stop
    token id fires only in content; EOS and the length caps in either
    channel. ``prompt_token_ids`` tells, with the reasoning's vocabulary,
    whether the output starts inside ``<think>``. vLLM's ``check_stop`` has
    no channels: a stop token id met while thinking stops the request there.

    Raises:
        ValueError / TypeError: naming the field, for inputs stopline rejects
            (negative ids, a count that is not an int, ``num_prompt_tokens >=
            max_model_len``, ``num_new_tokens`` out of range, inconsistent
            ``all_stop_token_ids``, a list over its cap).
    """
    ids = output_ids(output_token_ids, "output_token_ids")
    start = split(len(ids), num_new_tokens, "num_new_tokens")
    fields = dict(
        num_prompt_tokens=num_prompt_tokens,
        max_tokens=max_tokens,
        min_tokens=min_tokens,
        eos_token_id=eos_token_id,
        stop_token_ids=stop_token_ids,
        ignore_eos=ignore_eos,
        all_stop_token_ids=all_stop_token_ids,
        repetition_detection=repetition_detection,
        thinking_token_budget=thinking_token_budget,
    )
    tracker = scheduler_tracker(fields, max_model_len, reasoning_config(reasoning), prompt_token_ids)
    r = replay(tracker, ids, None, start, names=_OUTPUT_IDS)
    return _stop_result(r, ids[start:r.num_tokens] if r.num_tokens > start else (), r.decided_before_new)


def vllm_check_stop_request(
    request: Any, max_model_len: int, *, num_new_tokens: int = 1, reasoning: ReasoningArg = None
) -> VllmStopResult:
    """:func:`vllm_check_stop` reading its inputs from a vLLM ``Request``
    (:func:`request_fields` says what is read).

    The call site ``check_stop(request, max_model_len)`` becomes
    ``vllm_check_stop_request(request, max_model_len, num_new_tokens=k)``.
    Nothing on the request is changed: setting ``status`` / ``stop_reason``
    and trimming the output stay with the engine.

    Raises:
        ValueError: a pooling request, one without sampling params; as
            :func:`vllm_check_stop`.
    """
    fields = request_fields(request)  # refuses pooling requests before reading their ids
    reasoning = reasoning_config(reasoning)
    prompt = getattr(request, "prompt_token_ids", None) if reasoning is not None else None
    return vllm_check_stop(
        request.output_token_ids,
        max_model_len=max_model_len,
        num_new_tokens=num_new_tokens,
        reasoning=reasoning,
        prompt_token_ids=prompt,
        **fields,
    )


class RequestStop:
    """Per-request replacement for vLLM V1's ``check_stop(request, max_model_len)``.

    One instance lives with one ``vllm.v1.request.Request``; each call feeds
    only the output tokens appended since the previous call to a
    :class:`stopline.FinishTracker`, so a step costs O(new tokens) whatever
    the length of the request (:func:`vllm_check_stop_request` replays the
    whole history instead; the two agree, tests/test_engine_parity.py).

    Read once, at construction, by :func:`request_fields` (as
    :func:`vllm_check_stop_request` reads them): ``request.num_prompt_tokens``,
    ``request.max_tokens``, and from ``request.sampling_params``:
    ``eos_token_id`` (vLLM leaves it None under ``ignore_eos``),
    ``stop_token_ids`` (vLLM adds the generation config's extra EOS ids there),
    ``min_tokens``, ``ignore_eos``, ``all_stop_token_ids`` (checked for
    consistency) and ``repetition_detection``.

    The decision is vLLM 0.33's order (docs/semantics.md section 3): EOS, then a
    stop token id (``stop_reason`` = the id), both even below ``min_tokens``;
    then the length caps (``num_tokens >= max_model_len`` or
    ``num_output_tokens >= max_tokens``); then repetition from ``min_tokens`` on.

    ``reasoning`` (:func:`vllm_reasoning`, once per engine): the output is
    split into reasoning and content (``tracker.reasoning_token_ids`` /
    ``content_token_ids``), a stop token id fires only in content, the
    request's ``prompt_token_ids`` tell (with the reasoning's vocabulary)
    whether the output starts inside ``<think>``, and
    ``sampling_params.thinking_token_budget`` sets ``max_reasoning_tokens``
    (``tracker.forced_token_id``; the logits processors force it).

    Raises:
        ValueError / TypeError: a pooling request, one without sampling params
            or with inconsistent ``all_stop_token_ids``, a field of the wrong
            type (at construction, naming the field).
    """

    def __init__(self, request: Any, max_model_len: int, *, reasoning: ReasoningArg = None):
        reasoning = reasoning_config(reasoning)
        prompt = getattr(request, "prompt_token_ids", None) if reasoning is not None else None
        self._tracker = scheduler_tracker(request_fields(request), max_model_len, reasoning, prompt)
        self._seen = 0
        self._fed_before = 0
        self._done = False
        self._decided_before = False

    @property
    def tracker(self) -> FinishTracker:
        """The underlying :class:`stopline.FinishTracker` (finish_reason, stop_reason, num_tokens)."""
        return self._tracker

    def check_stop(self, request: Any) -> bool:
        """vLLM's ``check_stop`` contract: True when the request finished, and then
        ``request.status`` (a ``vllm.v1.request.RequestStatus``, imported
        here) and ``request.stop_reason`` are set as vLLM sets them.

        Feeds the tokens appended to ``request.output_token_ids`` since the
        last call (one per call in plain decoding; a whole accept run when the
        engine calls once per step). After a stop inside a run,
        :meth:`result` gives ``num_output_tokens`` to trim the request to.
        """
        if not self.feed(request.output_token_ids):
            return False
        from vllm.v1.request import RequestStatus

        t = self._tracker
        request.status = RequestStatus[VLLM_STATUS[t.finish_reason or ""]]
        if t.stop_reason is not None:
            request.stop_reason = t.stop_reason
        return True

    def feed(self, output_token_ids: Sequence[int]) -> bool:
        """:meth:`check_stop` without touching a request: feeds the ids past
        those seen by earlier calls; True once the request has finished.

        Raises:
            TypeError / ValueError: an id that is not an int or not in
                ``[0, 2**32)`` (named ``output_token_ids[i]``, its index in
                the list); more new ids than ``LIMITS["max_step_tokens"]``; fewer ids
                than earlier calls fed (vLLM only appends to a running
                request's output; a streaming-input session's update clears
                it, moving it into the prompt: build a new RequestStop then.
                Feeding from the shorter list's end would count ids twice).
        """
        if isinstance(output_token_ids, dict):  # indexed below: a dict's values would be read by key
            raise field_type_error("output_token_ids", "a sequence of ints", output_token_ids)
        try:
            n = len(output_token_ids)
        except TypeError:
            raise field_type_error("output_token_ids", "a sequence of ints", output_token_ids) from None
        seen = self._seen
        self._decided_before = done = self._done
        if done:
            self._fed_before = self._tracker.num_tokens
            return True
        if n < seen:
            raise field_value_error(
                "output_token_ids",
                f" shrank from {seen} to {n} ids; a RequestStop follows one running request's growing output "
                "(a vLLM streaming session that moves its output into the prompt needs a new one)",
            )
        # Running: every id fed so far is kept, so `seen` is the kept count.
        self._fed_before = seen
        if n == seen:
            return False
        try:
            if n == seen + 1:  # plain decoding: one token, passed as an int
                tid = output_token_ids[seen]
                # Anything but an int goes through the list reader: the core
                # would take a list or bytes in its place for several ids.
                r = self._tracker.update(tid if type(tid) is int else output_ids([tid], "token_ids"))
            else:
                r = self._tracker.update(output_ids(output_token_ids[seen:n], "token_ids"))
        except (ValueError, TypeError) as exc:
            if getattr(exc, "kind", None) == "too_many":  # the cap is on the ids new since the last call
                cap = LIMITS["max_step_tokens"]
                raise field_value_error(
                    "output_token_ids", f" grew by {n - seen} ids in one call; at most {cap} are accepted", "too_many"
                ) from None
            reraise_for_caller(exc, _OUTPUT_IDS, seen, index=n == seen + 1)
        self._seen = n
        self._done = done = r.finished
        return done

    def result(self) -> VllmStopResult:
        """The last decision in full (:class:`VllmStopResult`): ``status``
        name, ``stop_reason``, ``num_output_tokens`` after vLLM's trim of an
        accept run at its first stop, ``new_token_ids`` kept from the last
        call's tokens, ``decided_before_new`` when the request had finished
        before the last call."""
        t = self._tracker
        return _stop_result(t, t.token_ids[self._fed_before:], self._decided_before)


# ---------------------------------------------------------- the detokenizer --


@dataclass(frozen=True)
class VllmStopStringResult:
    """What vLLM's detokenizer reports after a stop-string check.

    Attributes:
        stop_string: the stop string that finished the sequence (vLLM puts it
            in ``stop_reason``), or ``None``.
        output_text: the output text after the cut (the whole text while
            running).
        num_output_tokens: output tokens kept: the token in whose text the
            stop string completes is the last one. vLLM 0.33.0 drops the ids
            after it too (``BaseIncrementalDetokenizer.update``, since PR
            #47616); see docs/semantics.md 6.10.
        reasoning, content: ``output_text`` split as vLLM's reasoning parser
            splits it (``DeltaMessage.reasoning`` / ``content``), markers left
            out; without reasoning, ``""`` and ``output_text``.
    """

    stop_string: str | None
    output_text: str
    num_output_tokens: int
    reasoning: str = ""
    content: str = ""


def vllm_detokenizer_stop(
    texts: Sequence[str],
    *,
    stop: str | Sequence[str] | None,
    include_stop_str_in_output: bool = False,
    min_tokens: int = 0,
    num_new_tokens: int = 1,
    stop_terminated: bool = False,
    reasoning: ReasoningArg = None,
    token_ids: Sequence[int] | None = None,
    prompt_token_ids: Sequence[int] | None = None,
) -> VllmStopStringResult:
    """The stop-string step of vLLM v1's incremental detokenizer, by stopline.

    ``texts`` holds the text of every output token so far (what the
    detokenizer appended for each), the ``num_new_tokens`` of this step last.
    ``stop`` may be a single string, as ``SamplingParams`` accepts.
    ``stop_terminated`` is the argument of vLLM's
    ``BaseIncrementalDetokenizer.update``: the scheduler finished the request
    on the last token (EOS or a stop token id), whose text is then left out
    unless ``include_stop_str_in_output``. Replays the whole history
    (O(output)); :class:`DetokenizerStop` is the per-request form.

    Rules and where they come from:

    * A stop string counts only if it ends in the text of a token ``n`` with
      ``n > min_tokens``; it may start in earlier text. Same as vLLM 0.33.0's
      ``BaseIncrementalDetokenizer.update`` (since PR #22014).
    * The text is cut before the stop string, or after it with
      ``include_stop_str_in_output``; same as vLLM's ``check_stop_strings``.
    * When several stop strings complete in the same new text, the one
      that *ends first* wins, ties by list order: for ``" The user is a"``
      with the last 5 characters new and ``stop=["a", "is"]`` it is ``"is"``.
      vLLM 0.33.0's ``check_stop_strings`` agrees (since PR #49391; before
      it, list order decided). See docs/semantics.md 6.1.
    * Tokens after the one that completes the stop string are dropped
      (``num_output_tokens``), as in vLLM 0.33.0 (PR #47616).
    * With ``stop_terminated`` the last token's text is left out before
      matching unless ``include_stop_str_in_output`` (docs/semantics.md
      section 3, check 4); passing ``""`` as its piece does the same.

    * With ``reasoning`` (:func:`vllm_reasoning`) stop strings apply to
      content only (docs/semantics.md 11): one met inside ``<think>`` does
      not fire (vllm#52393, where vLLM 0.33 stops in the thinking). The
      output starts in reasoning when ``prompt_token_ids`` end inside the
      block (read with the reasoning's vocabulary). ``token_ids`` (one per
      piece) are required when the markers are token ids.

    Streaming hold-back is not reported here: vLLM 0.33.0 holds back
    ``max(len(stop)) - 1`` characters, stopline exactly the live prefix
    (``StopMatcher.holdback``, ``StepResult.text_delta``).

    Raises:
        TypeError / ValueError: naming the field (``texts``, ``stop``,
            ``min_tokens``, ``num_new_tokens``, ``token_ids``).
    """
    pieces = read_texts(texts, "texts")
    start = split(len(pieces), num_new_tokens, "num_new_tokens")
    reasoning = reasoning_config(reasoning)
    starts_in = reasoning.prompt_channel(prompt_token_ids) if reasoning is not None else None
    params = detokenizer_params(
        stop=stop, include_stop_str_in_output=include_stop_str_in_output, min_tokens=min_tokens,
        reasoning=reasoning, starts_in=starts_in,
    )
    terminated = flag(stop_terminated, "stop_terminated")
    ids, real_last = _detokenizer_ids(len(pieces), terminated, token_ids, _needs_ids(params))

    def feed(tracker: FinishTracker, new: list[int], new_texts: list[str] | None, grammar: int | None) -> None:
        _feed_detokenizer(tracker, params, new, new_texts or [], terminated, real_last)

    r = replay(params, ids, pieces, start, feed=feed, names=_SAME_NAMES)
    return VllmStopStringResult(
        stop_string=r.stop_reason if isinstance(r.stop_reason, str) else None,
        output_text=r.text,
        num_output_tokens=r.num_tokens,
        reasoning=r.reasoning,
        content=r.content,
    )


class DetokenizerStop:
    """Per-request replacement for the stop-string step of vLLM V1's incremental detokenizer.

    vLLM's ``BaseIncrementalDetokenizer.update`` appends each new token's text,
    then searches the new characters for the request's stop strings with
    ``check_stop_strings`` and cuts the text and the token ids. This class
    takes the same per-token texts and decides with stopline's incremental
    matcher: O(new characters) per call whatever the number of stop strings.
    Its ``StopParams`` come from :func:`detokenizer_params`, as
    :func:`vllm_detokenizer_stop`'s (the two agree, tests/test_engine_parity.py).

    Args:
        sampling_params: reads ``stop`` (a string or a list), ``min_tokens``
            and ``include_stop_str_in_output`` (:func:`detokenizer_fields`).
        reasoning: the engine's reasoning configuration (:func:`vllm_reasoning`,
            built once per engine), or ``None``. With it stop strings apply to
            content only, and the output is also reported per channel
            (:attr:`reasoning`, :attr:`content`,
            :meth:`get_next_output_channels`), as vLLM's reasoning parser
            would split it, markers left out.
        prompt_token_ids: the request's prompt ids: with the reasoning's
            vocabulary, a prompt that ends inside ``<think>`` (Qwen3's
            thinking templates, DeepSeek-R1) starts the output in reasoning.

    Rules (vLLM 0.33 agrees on each; docs/semantics.md sections 2 and 3): the
    stop string that ends first wins, ties by list order; a stop string counts
    only if it ends in the text of output token ``n > min_tokens``; tokens
    after the one completing it are dropped; with ``stop_terminated`` (the
    scheduler finished the request on EOS or a stop token id) that token's
    text is left out unless ``include_stop_str_in_output``, and the text held
    back as a live stop-string prefix is released, as vLLM's final output
    carries the whole ``output_text``.

    Streaming differs on purpose: :meth:`get_next_output_text` holds back only
    the suffix that can still become a stop string (vLLM holds back
    ``max(len(stop)) - 1`` characters).

    Raises:
        TypeError / ValueError: naming the field (at construction).
    """

    def __init__(
        self,
        sampling_params: Any,
        *,
        reasoning: ReasoningArg = None,
        prompt_token_ids: Sequence[int] | None = None,
    ):
        reasoning = reasoning_config(reasoning)
        starts_in = reasoning.prompt_channel(prompt_token_ids) if reasoning is not None else None
        params = detokenizer_params(**detokenizer_fields(sampling_params), reasoning=reasoning, starts_in=starts_in)
        self._tracker = FinishTracker(params)
        self._params = params
        self._needs_ids = _needs_ids(params)
        self._spans = _has_spans(params)
        self._released: list[str] = []
        self._channels: list[tuple[str, str]] = []
        self._done = False

    def update(
        self, new_texts: Sequence[str], stop_terminated: bool = False, token_ids: Sequence[int] | None = None
    ) -> str | None:
        """Append the text of each new output token; return the stop string that finished, or None.

        ``new_texts[i]`` is the decoded text of the i-th new token (``""``
        while a character is incomplete), as vLLM's ``decode_next`` returns it.
        ``token_ids``: the new tokens' ids (vLLM's ``new_token_ids``), one per
        piece, each in ``[0, 2**32 - 1)``; required when the reasoning
        markers are token ids.

        Raises:
            TypeError / ValueError: ``new_texts`` not a sequence of str, or
                longer than ``LIMITS["max_step_tokens"]``; ``token_ids``
                missing while required, not one per piece, or holding
                ``2**32 - 1`` (reserved for the stop-terminated token).
        """
        if self._done:
            return None
        pieces = read_texts(new_texts, "new_texts")
        if not pieces:
            return None
        if type(stop_terminated) is not bool:  # None is False; "no" is not (bool() said True)
            stop_terminated = flag(stop_terminated, "stop_terminated")
        try:
            if len(pieces) == 1 and token_ids is None and not self._needs_ids and not self._spans:
                # plain decoding, passed as an int
                results = [self._tracker.update(_TERMINATOR_ID if stop_terminated else _PLAIN_ID, pieces)]
            else:
                ids, real_last = _detokenizer_ids(len(pieces), stop_terminated, token_ids, self._needs_ids)
                results = _feed_detokenizer(self._tracker, self._params, ids, pieces, stop_terminated, real_last)
        except (ValueError, TypeError) as exc:
            reraise_for_caller(exc, _NEW_TEXTS)
        for r in results:
            if r.text_delta:
                self._released.append(r.text_delta)
                if r.channel is not None:
                    self._channels.append((r.reasoning_delta, r.content_delta))
        if not self._tracker.finished:
            return None
        self._done = True
        reason = self._tracker.stop_reason
        return reason if isinstance(reason, str) else None

    @property
    def output_text(self) -> str:
        """The output text so far, cut at the stop string (code points)."""
        return self._tracker.text

    @property
    def num_output_tokens(self) -> int:
        """Output tokens kept (vLLM's ``len(token_ids)`` after its trim)."""
        return self._tracker.num_tokens

    @property
    def stop_string(self) -> str | None:
        """The stop string that finished the request, or None."""
        reason = self._tracker.stop_reason
        return reason if isinstance(reason, str) else None

    @property
    def reasoning(self) -> str:
        """The reasoning kept, markers left out (``""`` without reasoning):
        what vLLM's reasoning parser returns as ``reasoning``."""
        return self._tracker.reasoning

    @property
    def content(self) -> str:
        """The content kept (``output_text`` without reasoning): what vLLM's
        reasoning parser returns as ``content``."""
        return self._tracker.content

    def get_next_output_channels(self) -> tuple[str, str]:
        """``(reasoning_delta, content_delta)`` released since the last call,
        as a streaming ``DeltaMessage(reasoning=..., content=...)`` carries
        them; a partial marker (``<thin``) is held back, never streamed cut.
        Without reasoning: ``("", get_next_output_text())``. Read one of this
        and :meth:`get_next_output_text` per step: each empties the same
        buffer."""
        if self._tracker.channel is None:
            return "", self.get_next_output_text()
        out = ("".join(r for r, _ in self._channels), "".join(c for _, c in self._channels))
        self._channels.clear()
        self._released.clear()
        return out

    def get_next_output_text(self) -> str:
        """The text released since the last call (exact hold-back; marker
        text included); after a finish, everything up to ``output_text``'s
        end."""
        out = "".join(self._released)
        self._released.clear()
        self._channels.clear()
        return out
