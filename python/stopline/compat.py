"""Engine-shaped adapters over stopline's finish machine.

Each helper takes the inputs an engine already has at the point where it
decides whether a sequence stops, runs them through stopline's Rust core
(:class:`stopline.FinishTracker`), and hands the decision back in the
engine's own vocabulary. Swapping an engine's stop check for stopline is then
one call:

* vLLM v1, scheduler side: :func:`vllm_check_stop` (keyword inputs) or
  :func:`vllm_check_stop_request` (reads a ``vllm.v1.request.Request``-shaped
  object), in the shape of ``vllm/v1/core/sched/utils.py::check_stop``.
* vLLM v1, detokenizer side: :func:`vllm_detokenizer_stop`, the stop-string
  step of ``vllm/v1/engine/detokenizer.py``.
* SGLang: :func:`sglang_check_finished`, in the shape of
  ``Req.update_finish_state`` in
  ``python/sglang/srt/managers/schedule_batch.py``.

Engine versions named below are the releases whose source the statements
were checked against: vLLM 0.33.0 and SGLang 0.5.23 (docs/semantics.md,
"Engine versions").
* :func:`to_vllm_status` and :func:`to_sglang_finish_reason` translate a
  result of a long-lived ``FinishTracker`` or ``FinishBatch`` (the hot path)
  into the same shapes.

The decision is always stopline's (docs/semantics.md sections 2 and 3). Where an engine
decides differently the helper does *not* imitate it; every such case is
listed in ``docs/semantics.md`` and named in the docstring below.

The stateless helpers replay the whole output history through a fresh tracker
on every call, so a call costs O(len(output)). That keeps them drop-in (the
engine functions they replace also look at the whole request), but an engine
on the hot path should keep one ``FinishTracker`` per sequence, or a
``FinishBatch``, and translate its results with ``to_vllm_status`` /
``to_sglang_finish_reason``.
"""

from __future__ import annotations

import numbers
from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Optional, Sequence, Tuple, Union

from stopline._caps import capped
from stopline._core import FinishTracker, StopParams
from stopline._core import FINISH_REASONS, LIMITS

__all__ = [
    "SglangFinishReason",
    "SglangFinishResult",
    "VllmStopResult",
    "VllmStopStringResult",
    "sglang_check_finished",
    "to_sglang_finish_reason",
    "to_vllm_status",
    "vllm_check_stop",
    "vllm_check_stop_request",
    "vllm_detokenizer_stop",
]

# vLLM's RequestStatus member for each stopline finish_reason
# (vllm/v1/request.py: RequestStatus and _FINISHED_REASON_MAP); its keys are
# stopline.FINISH_REASONS (tests/test_compat.py checks they agree).
_VLLM_STATUS = {
    "stop": "FINISHED_STOPPED",
    "length": "FINISHED_LENGTH_CAPPED",
    "abort": "FINISHED_ABORTED",
    "error": "FINISHED_ERROR",
    "repetition": "FINISHED_REPETITION",
}


def to_vllm_status(finish_reason: Optional[str]) -> Optional[str]:
    """The name of vLLM's ``RequestStatus`` for a stopline ``finish_reason``.

    ``None`` (still running) maps to ``None``. The mapping is the inverse of
    vLLM's status-to-reason table in ``vllm/v1/request.py``: ``FINISHED_IGNORED``
    (a prompt longer than the model) never comes out of stopline, which
    rejects such a request when ``StopParams`` is built.

    Raises:
        ValueError: for a string that is not a stopline finish reason.
    """
    if finish_reason is None:
        return None
    try:
        return _VLLM_STATUS[finish_reason]
    except KeyError:
        raise _unknown_reason(finish_reason) from None


def _unknown_reason(finish_reason: object) -> ValueError:
    """The error for a string that is not in ``stopline.FINISH_REASONS``
    (worded as ``to_openai_finish_reason``'s)."""
    allowed = ", ".join(f"'{r}'" for r in FINISH_REASONS)
    return ValueError(f"finish_reason={finish_reason!r} is not one of {allowed}")


# ------------------------------------------------------------------ shared --


def _items(values: Any, field: str, what: str) -> list[Any]:
    """The items of a caller's iterable, validated as the core does: a bare
    str/bytes or a non-iterable is a TypeError naming ``field``; more than
    ``LIMITS["max_step_tokens"]`` items (by ``len()`` or a counted take) a
    ValueError naming the cap. Exceptions the iterable raises propagate."""
    if isinstance(values, (str, bytes)) or not isinstance(values, Iterable):
        raise TypeError(f"{field} must be {what}, got {type(values).__name__}")
    return capped(values, field, LIMITS["max_step_tokens"])


def _ids(values: Optional[Iterable[int]], field: str) -> Tuple[int, ...]:
    if values is None:
        return ()
    out = _items(values, field, "a sequence of ints")
    for i, v in enumerate(out):
        if isinstance(v, bool) or not isinstance(v, numbers.Integral):
            raise TypeError(f"{field}[{i}] must be an int, got {type(v).__name__}")
    return tuple(out)


def _texts(values: Any, field: str, what: str = "a sequence of str (one piece per token)") -> list[str]:
    out = _items(values, field, what)
    for i, v in enumerate(out):
        if not isinstance(v, str):
            raise TypeError(f"{field}[{i}] must be str, got {type(v).__name__}")
    return out


def _int(value: Any, field: str) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{field} must be an int, got {type(value).__name__}")
    return int(value)


def _split(count: int, new: int, field: str) -> int:
    """Index where the new tokens start; checks ``new`` against ``count``."""
    if isinstance(new, bool) or not isinstance(new, int):
        raise TypeError(f"{field} must be an int, got {type(new).__name__}")
    if not 0 <= new <= count:
        raise ValueError(
            f"{field}={new} is outside [0, {count}] (the number of output tokens given)"
        )
    return count - new


@dataclass(frozen=True)
class _Replay:
    finished: bool
    finish_reason: Optional[str]
    stop_reason: Union[int, str, None]
    matched: Union[int, str, None]
    num_tokens: int
    text: str
    decided_before_new: bool


def _replay(
    params: StopParams,
    ids: Sequence[int],
    texts: Optional[Sequence[str]],
    start: int,
    grammar_at_end: bool = False,
) -> _Replay:
    """Feeds ``ids[:start]`` as one step and ``ids[start:]`` as the next.

    The finish machine is step invariant, so splitting the history anywhere
    gives the same answer; the split only tells whether the decision was
    already made by the tokens before the new ones.
    """
    tracker = FinishTracker(params)
    before = ids[:start]
    new = ids[start:]
    if before:
        tracker.update(before, None if texts is None else texts[:start])
    decided_before_new = tracker.finished
    if new and not decided_before_new:
        grammar = len(new) - 1 if grammar_at_end else None
        tracker.update(new, None if texts is None else texts[start:], grammar)
    return _Replay(
        finished=tracker.finished,
        finish_reason=tracker.finish_reason,
        stop_reason=tracker.stop_reason,
        matched=tracker.matched,
        num_tokens=tracker.num_tokens,
        text=tracker.text,
        decided_before_new=decided_before_new,
    )


def _stops(stop: Union[str, Sequence[str], None]) -> Optional[list[str]]:
    # vLLM and SGLang both accept a single string for `stop` and wrap it.
    if stop is None:
        return None
    if isinstance(stop, str):
        return [stop]
    return _texts(stop, "stop", "a str or a sequence of str")


# -------------------------------------------------------------------- vLLM --


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
    status: Optional[str]
    finish_reason: Optional[str]
    stop_reason: Union[int, str, None]
    num_output_tokens: int
    new_token_ids: Tuple[int, ...]
    decided_before_new: bool


def _repetition(value: Any) -> Optional[Mapping[str, int]]:
    """vLLM's ``RepetitionDetectionParams`` (object or mapping) as a mapping.

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
        return _int(get(key, 0) or 0, f"repetition_detection.{key}")

    max_size = field("max_pattern_size")
    if max_size <= 0:
        return None
    return {
        "max_pattern_size": max_size,
        "min_pattern_size": field("min_pattern_size"),
        "min_count": field("min_count"),
    }


def _vllm_params(
    *,
    num_prompt_tokens: int,
    max_model_len: int,
    max_tokens: Optional[int],
    min_tokens: int,
    eos_token_id: Optional[int],
    stop_token_ids: Optional[Iterable[int]],
    ignore_eos: bool,
    all_stop_token_ids: Optional[Iterable[int]],
    repetition_detection: Any,
) -> StopParams:
    """The ``StopParams`` of a vLLM request's scheduler-side checks (the rules in
    :func:`vllm_check_stop`'s docstring)."""
    stop_ids = _ids(stop_token_ids, "stop_token_ids")
    eos_ids = () if eos_token_id is None else (eos_token_id,)
    if all_stop_token_ids is not None:
        declared = set(_ids(all_stop_token_ids, "all_stop_token_ids"))
        needed = set(stop_ids) | (set() if ignore_eos else set(eos_ids))
        missing = sorted(needed - declared)
        if missing:
            raise ValueError(
                f"all_stop_token_ids lacks {missing}; vLLM builds it from "
                f"eos_token_id and stop_token_ids, so the params are inconsistent"
            )
    if max_tokens is not None and min_tokens > max_tokens:
        min_tokens = max_tokens
    return StopParams(
        max_tokens=max_tokens,
        min_tokens=min_tokens,
        prompt_len=num_prompt_tokens,
        max_model_len=max_model_len,
        eos_token_ids=eos_ids,
        ignore_eos=ignore_eos,
        stop_token_ids=stop_ids,
        repetition=_repetition(repetition_detection),
    )


def vllm_check_stop(
    output_token_ids: Sequence[int],
    *,
    num_prompt_tokens: int,
    max_model_len: int,
    max_tokens: Optional[int] = None,
    min_tokens: int = 0,
    eos_token_id: Optional[int] = None,
    stop_token_ids: Optional[Iterable[int]] = None,
    ignore_eos: bool = False,
    all_stop_token_ids: Optional[Iterable[int]] = None,
    repetition_detection: Any = None,
    num_new_tokens: int = 1,
) -> VllmStopResult:
    """vLLM v1's ``check_stop(request, max_model_len)``, decided by stopline.

    Inputs are what vLLM's check reads from the request: every output token so
    far with the ``num_new_tokens`` tokens of this step last (1 for plain
    decoding, the accept run for speculative decoding), the prompt length,
    ``Request.max_tokens`` and the sampling params. vLLM calls its check once
    per appended token and trims the run at the first stop
    (``Scheduler._update_request_with_output``); this helper takes the whole
    run at once and reports the same trim, because stopline examines a run
    token by token (docs/semantics.md section 3).

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

    Raises:
        ValueError / TypeError: for inputs stopline rejects (negative ids,
            ``num_prompt_tokens >= max_model_len``, ``num_new_tokens`` out of
            range, inconsistent ``all_stop_token_ids``).
    """
    ids = _ids(output_token_ids, "output_token_ids")
    start = _split(len(ids), num_new_tokens, "num_new_tokens")
    params = _vllm_params(
        num_prompt_tokens=num_prompt_tokens,
        max_model_len=max_model_len,
        max_tokens=max_tokens,
        min_tokens=min_tokens,
        eos_token_id=eos_token_id,
        stop_token_ids=stop_token_ids,
        ignore_eos=ignore_eos,
        all_stop_token_ids=all_stop_token_ids,
        repetition_detection=repetition_detection,
    )
    r = _replay(params, ids, None, start)
    kept_new = ids[start:r.num_tokens] if r.num_tokens > start else ()
    return VllmStopResult(
        stopped=r.finished,
        status=to_vllm_status(r.finish_reason),
        finish_reason=r.finish_reason,
        stop_reason=r.stop_reason,
        num_output_tokens=r.num_tokens,
        new_token_ids=tuple(kept_new),
        decided_before_new=r.decided_before_new,
    )


def vllm_check_stop_request(
    request: Any, max_model_len: int, *, num_new_tokens: int = 1
) -> VllmStopResult:
    """:func:`vllm_check_stop` reading its inputs from a vLLM ``Request``.

    The call site ``check_stop(request, max_model_len)`` becomes
    ``vllm_check_stop_request(request, max_model_len, num_new_tokens=k)``.
    Read, duck-typed: ``request.output_token_ids``,
    ``request.num_prompt_tokens``, ``request.max_tokens`` (falling back to
    ``sampling_params.max_tokens``), ``request.sampling_params`` with
    ``min_tokens``, ``eos_token_id``, ``stop_token_ids``, ``ignore_eos``,
    ``all_stop_token_ids`` and ``repetition_detection`` where present, and
    ``request.eos_token_id`` when the sampling params carry none (older vLLM
    v1 kept the EOS id on the request). Nothing on the request is changed:
    setting ``status`` / ``stop_reason`` and trimming the output stay with the
    engine.

    Raises:
        ValueError: for a pooling request (``request.pooling_params`` set):
            pooling has no generation finish for stopline to decide.
    """
    fields = _vllm_request_fields(request)  # refuses pooling requests before reading their ids
    return vllm_check_stop(
        list(request.output_token_ids), max_model_len=max_model_len, num_new_tokens=num_new_tokens, **fields
    )


def _vllm_request_fields(request: Any) -> dict[str, Any]:
    """What vLLM's ``check_stop`` reads from a ``Request``, as :func:`_vllm_params`'
    keywords (all but ``max_model_len``); see :func:`vllm_check_stop_request`."""
    if getattr(request, "pooling_params", None):
        raise ValueError(
            "this is a pooling request; stopline decides generation finishes only"
        )
    sp = getattr(request, "sampling_params", None)
    if sp is None:
        raise ValueError("request.sampling_params is None; nothing to decide")
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
        ignore_eos=bool(getattr(sp, "ignore_eos", False)),
        all_stop_token_ids=getattr(sp, "all_stop_token_ids", None),
        repetition_detection=getattr(sp, "repetition_detection", None),
    )


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
    """

    stop_string: Optional[str]
    output_text: str
    num_output_tokens: int


def vllm_detokenizer_stop(
    texts: Sequence[str],
    *,
    stop: Union[str, Sequence[str], None],
    include_stop_str_in_output: bool = False,
    min_tokens: int = 0,
    num_new_tokens: int = 1,
) -> VllmStopStringResult:
    """The stop-string step of vLLM v1's incremental detokenizer, by stopline.

    ``texts`` holds the text of every output token so far (what the
    detokenizer appended for each), the ``num_new_tokens`` of this step last.
    ``stop`` may be a single string, as ``SamplingParams`` accepts.

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

    For an EOS or stop token that ends the step, pass an empty piece unless
    ``include_stop_str_in_output``: vLLM 0.33.0 keeps its id but leaves its
    text out before matching (docs/semantics.md section 3, check 4).

    Streaming hold-back is not reported here: vLLM 0.33.0 holds back
    ``max(len(stop)) - 1`` characters, stopline exactly the live prefix
    (``StopMatcher.holdback``, ``StepResult.text_delta``).
    """
    pieces = _texts(texts, "texts")
    start = _split(len(pieces), num_new_tokens, "num_new_tokens")
    stops = _stops(stop)
    params = StopParams(
        stop=stops or None,
        include_stop_str_in_output=include_stop_str_in_output,
        min_tokens=min_tokens,
    )
    r = _replay(params, [0] * len(pieces), pieces, start)
    return VllmStopStringResult(
        stop_string=r.stop_reason if isinstance(r.stop_reason, str) else None,
        output_text=r.text,
        num_output_tokens=r.num_tokens,
    )


# ------------------------------------------------------------------ SGLang --

_SGLANG_KINDS = {
    "FINISH_MATCHED_TOKEN",
    "FINISH_MATCHED_STR",
    "FINISHED_MATCHED_REGEX",
    "FINISH_LENGTH",
    "FINISH_ABORT",
}


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
    matched: Union[int, str, None] = None
    length: Optional[int] = None
    message: Optional[str] = None
    status_code: Optional[int] = None
    err_type: Optional[str] = None
    is_error: bool = False

    def __post_init__(self) -> None:
        if self.kind not in _SGLANG_KINDS:
            raise ValueError(f"kind={self.kind!r} is not one of {sorted(_SGLANG_KINDS)}")

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


def to_sglang_finish_reason(
    finish_reason: Optional[str],
    matched: Union[int, str, None] = None,
    *,
    max_new_tokens: Optional[int] = None,
    num_tokens: Optional[int] = None,
    message: Optional[str] = None,
    stop_reason: Union[int, str, None] = None,
    stop_regex: Iterable[str] = (),
) -> Optional[SglangFinishReason]:
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
            and for an unknown ``finish_reason``; for ``"stop"`` without a
            ``matched`` value.
    """
    if finish_reason is None:
        return None
    if finish_reason == "stop":
        if isinstance(matched, bool) or matched is None:
            raise ValueError("a 'stop' finish needs matched (a stop string or a token id)")
        if isinstance(stop_reason, str) and stop_reason in set(stop_regex):
            return SglangFinishReason(kind="FINISHED_MATCHED_REGEX", type="stop", matched=stop_reason)
        if isinstance(matched, str):
            return SglangFinishReason(kind="FINISH_MATCHED_STR", type="stop", matched=matched)
        return SglangFinishReason(kind="FINISH_MATCHED_TOKEN", type="stop", matched=int(matched))
    if finish_reason == "length":
        length = max_new_tokens if max_new_tokens is not None else num_tokens
        return SglangFinishReason(kind="FINISH_LENGTH", type="length", length=length)
    if finish_reason == "abort":
        return SglangFinishReason(
            kind="FINISH_ABORT", type="abort", message=message or "Aborted", is_error=True
        )
    if finish_reason == "error":
        return SglangFinishReason(
            kind="FINISH_ABORT",
            type="abort",
            message=message or "the sampled token id is outside the vocabulary",
            status_code=500,
            err_type="InternalServerError",
            is_error=True,
        )
    if finish_reason == "repetition":
        raise ValueError(
            "SGLang has no finish reason for repetition; map it in the engine"
        )
    raise _unknown_reason(finish_reason)


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
    finished_reason: Optional[SglangFinishReason]
    finished_len: Optional[int]
    decided_before_new: bool


def _sglang_prefill_only(
    ids: Sequence[int], output_texts: Optional[Sequence[str]], start: int, has_stops: bool
) -> SglangFinishResult:
    """``max_new_tokens=0``: SGLang finishes a prefill-only request with
    ``FINISH_LENGTH(length=0)`` and keeps no output id, whatever was sampled
    (``StopParams`` needs ``max_tokens >= 1``, so the core is not asked). The
    arguments are checked as on the general path."""
    if has_stops and output_texts is None:
        raise ValueError("output_texts is required: stop_strs are matched on text")
    if output_texts is not None and len(output_texts) != len(ids):
        raise ValueError(
            f"output_texts has {len(output_texts)} pieces for {len(ids)} output ids; "
            "pass one piece per id"
        )
    return SglangFinishResult(
        finished=True,
        finished_reason=SglangFinishReason(kind="FINISH_LENGTH", type="length", length=0),
        finished_len=0,
        decided_before_new=start > 0,
    )


def _sglang_ids(ids: Sequence[int], vocab_size: Optional[int]) -> list[int]:
    """SGLang marks a NaN row with a negative id; the core accepts only ids
    >= 0, so such an id is sent as one the vocabulary check rejects."""
    if vocab_size is None:
        return list(ids)
    return [vocab_size if i < 0 else i for i in ids]


def _sglang_params(
    *,
    max_new_tokens: int,
    min_new_tokens: int,
    eos_token_ids: Optional[Iterable[int]],
    ignore_eos: bool,
    stop_token_ids: Optional[Iterable[int]],
    stop_strs: Union[str, Sequence[str], None],
    stop_regex: Sequence[str],
    no_stop_trim: bool,
    vocab_size: Optional[int],
) -> StopParams:
    """The ``StopParams`` of an SGLang request (the rules in
    :func:`sglang_check_finished`'s docstring)."""
    return StopParams(
        max_tokens=max_new_tokens,
        min_tokens=min(min_new_tokens, max_new_tokens),
        eos_token_ids=_ids(eos_token_ids, "eos_token_ids"),
        ignore_eos=ignore_eos,
        stop_token_ids=_ids(stop_token_ids, "stop_token_ids"),
        stop=_stops(stop_strs) or None,
        stop_regex=list(stop_regex) or None,
        include_stop_str_in_output=no_stop_trim,
        vocab_size=vocab_size,
    )


def sglang_check_finished(
    output_ids: Sequence[int],
    *,
    max_new_tokens: int,
    new_accepted_len: int = 1,
    stop_strs: Union[str, Sequence[str], None] = None,
    stop_regex_strs: Union[str, Sequence[str], None] = None,
    output_texts: Optional[Sequence[str]] = None,
    stop_token_ids: Optional[Iterable[int]] = None,
    eos_token_ids: Optional[Iterable[int]] = None,
    ignore_eos: bool = False,
    min_new_tokens: int = 0,
    vocab_size: Optional[int] = None,
    no_stop_trim: bool = False,
    grammar_terminated: bool = False,
) -> SglangFinishResult:
    """SGLang's ``Req.update_finish_state(new_accepted_len)``, decided by stopline.

    ``output_ids`` are all output ids so far, the ``new_accepted_len`` ids
    accepted in this step last (more than one under speculative decoding).
    ``output_texts`` holds one text piece per output id and is required when
    ``stop_strs`` is set (SGLang decodes a tail window instead; stopline
    matches on per-token text, docs/semantics.md section 3). ``eos_token_ids`` should include the
    tokenizer's EOS and additional stop ids, which SGLang also checks
    (``_check_token_based_finish``).
    ``no_stop_trim`` is SGLang's name for keeping the stop string / token in
    the output (stopline's ``include_stop_str_in_output``); it only changes
    the text, which SGLang trims in its detokenizer.
    ``grammar_terminated`` says the grammar reached its end after this step's
    last id. ``max_new_tokens=0`` (SGLang's prefill-only requests) finishes
    with ``FINISH_LENGTH(length=0)`` and ``finished_len=0`` whatever the ids,
    as SGLang 0.5.23 (docs/semantics.md 6.16).

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

    Raises:
        ValueError: ``max_new_tokens`` negative, ``new_accepted_len`` out of
            range, ``output_texts`` missing or of the wrong length.
    """
    ids = list(_ids(output_ids, "output_ids"))
    start = _split(len(ids), new_accepted_len, "new_accepted_len")
    if isinstance(max_new_tokens, int) and max_new_tokens < 0:
        raise ValueError(f"max_new_tokens must be >= 0, got {max_new_tokens}")
    if max_new_tokens == 0 and not isinstance(max_new_tokens, bool):
        return _sglang_prefill_only(ids, output_texts, start, bool(_stops(stop_strs)))
    ids = _sglang_ids(ids, vocab_size)
    regexes = _stops(stop_regex_strs) or []
    texts = None if output_texts is None else _texts(output_texts, "output_texts")
    if texts is not None and len(texts) != len(ids):
        raise ValueError(
            f"output_texts has {len(texts)} pieces for {len(ids)} output ids; "
            "pass one piece per id"
        )
    params = _sglang_params(
        max_new_tokens=max_new_tokens,
        min_new_tokens=min_new_tokens,
        eos_token_ids=eos_token_ids,
        ignore_eos=ignore_eos,
        stop_token_ids=stop_token_ids,
        stop_strs=stop_strs,
        stop_regex=regexes,
        no_stop_trim=no_stop_trim,
        vocab_size=vocab_size,
    )
    r = _replay(params, ids, texts, start, grammar_at_end=grammar_terminated)
    reason = to_sglang_finish_reason(
        r.finish_reason,
        r.matched,
        max_new_tokens=max_new_tokens,
        num_tokens=r.num_tokens,
        stop_reason=r.stop_reason,
        stop_regex=regexes,
    )
    return SglangFinishResult(
        finished=r.finished,
        finished_reason=reason,
        finished_len=r.num_tokens if r.finished else None,
        decided_before_new=r.decided_before_new,
    )
