"""What both engines' modules share: reading a request's lists under the
core's caps, replaying a whole output history through a fresh tracker
(what the stateless helpers compute on every call), building a
:class:`~stopline.Vocabulary` for a tokenizer, and reading an engine's
reasoning configuration (:class:`Reasoning`, docs/semantics.md 11)."""

from __future__ import annotations

import itertools
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence, Sized
from collections.abc import Set as AbstractSet
from contextlib import contextmanager
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, NoReturn, Protocol, TypeAlias

from stopline._caps import (
    field_type_error,
    field_value_error,
    int_items,
    integer,
    items,
    shown,
    str_items,
    unknown_keys,
)
from stopline._core import LIMITS, FinishTracker, StopParams, Vocabulary


def output_ids(values: Any, field_name: str) -> list[int]:
    """Output token ids of a history or a step, at most
    ``LIMITS["max_step_tokens"]``."""
    return int_items(values, field_name, LIMITS["max_step_tokens"])


def texts(values: Any, field_name: str) -> list[str]:
    """One text piece per output token, at most ``LIMITS["max_step_tokens"]``."""
    return str_items(values, field_name, "a sequence of str (one piece per token)", LIMITS["max_step_tokens"])


def id_list(values: Any, field_name: str) -> list[int]:
    """A request's EOS or stop ids (``None``: none; a set, list or any
    iterable), at most ``LIMITS["max_stop_token_ids"]``, in the caller's
    order with any duplicate kept, so that the core's errors (an id out of
    range, outside ``vocab_size``, equal to a marker id) index the caller's
    list."""
    if values is None:
        return []
    return int_items(values, field_name, LIMITS["max_stop_token_ids"])


def stop_list(values: Any, field_name: str, cap_key: str = "max_stop_strings") -> list[str]:
    """Stop strings or patterns: ``None``, one str (vLLM and SGLang both wrap a
    bare str) or an iterable of str, at most ``LIMITS[cap_key]``."""
    if values is None:
        return []
    if isinstance(values, str):
        return [values]
    return str_items(values, field_name, "a str or a sequence of str", LIMITS[cap_key])


class FinishState(Protocol):
    """What a ``FinishTracker`` (or a :class:`Replay` of one) says about a finish."""

    @property
    def finished(self) -> bool: ...
    @property
    def finish_reason(self) -> str | None: ...
    @property
    def stop_reason(self) -> int | str | None: ...
    @property
    def matched(self) -> int | str | None: ...
    @property
    def num_tokens(self) -> int: ...


@dataclass(frozen=True)
class Replay:
    """The tracker's state after the history, and whether the tokens before
    the new ones had already decided it."""

    finished: bool
    finish_reason: str | None
    stop_reason: int | str | None
    matched: int | str | None
    num_tokens: int
    text: str
    reasoning: str
    content: str
    decided_before_new: bool


def reraise_for_caller(
    exc: Exception, names: Mapping[str, str], offset: int = 0, index: bool = False,
    exact: Mapping[str, str] = MappingProxyType({}),
) -> NoReturn:
    """Raise a failed core call's error addressed to the caller's fields: the
    core names the list it was given (``token_ids[1]``, ``texts[0]``), an
    adapter the list its caller passed (``output_token_ids[7]`` when the
    step began at ``offset=6``). ``names`` maps the core's list names to the
    caller's; ``index``: the core was given one id, not a list, at
    ``offset``; ``exact`` renames whole field names wherever the message
    shows them (``repetition["min_count"]``). Same class, ``kind`` and
    ``slot``; an error about another field is raised unchanged. Called from
    an ``except`` only, so a good call pays nothing."""
    where = getattr(exc, "field", None)
    where = where if isinstance(where, str) else ""
    message = str(exc)
    core, bracket, rest = where.partition("[")
    i, close, tail = rest.partition("]")
    if not message.startswith(where) or not where:
        raise exc
    if where in exact:
        field_name = exact[where]
    elif core not in names or (bracket and not (close and i.isdigit())):
        raise exc
    elif bracket:
        field_name = f"{names[core]}[{offset + int(i)}]{tail}"
    else:
        field_name = f"{names[core]}[{offset}]" if index else names[core]
    body = message[len(where):]
    for old, new in exact.items():
        body = body.replace(old, new)
    out: Any = type(exc)(field_name + body)
    out.field, out.slot, out.kind = field_name, getattr(exc, "slot", None), getattr(exc, "kind", None)
    raise out from None


@contextmanager
def caller_names(names: Mapping[str, str]) -> Iterator[None]:
    """Within the block, a core error about one of ``names``' lists is raised
    under the caller's name (:func:`reraise_for_caller`). For set-up code: a
    ``with`` costs about a microsecond, so per-step paths use ``try``."""
    try:
        yield
    except (ValueError, TypeError) as exc:
        reraise_for_caller(exc, names)


def split(count: int, new: int, field_name: str) -> int:
    """Index where the ``new`` last of ``count`` tokens start; ``new`` must be
    an int in ``[0, count]`` (errors name ``field_name``)."""
    new = integer(new, field_name)
    if not 0 <= new <= count:
        raise field_value_error(field_name, f"={new} is outside [0, {count}] (the number of output tokens given)")
    return count - new


def replay(
    params: StopParams | FinishTracker,
    ids: Sequence[int],
    texts: Sequence[str] | None,
    start: int,
    grammar_at_end: bool = False,
    feed: Callable[[FinishTracker, list[int], list[str] | None, int | None], Any] | None = None,
    *,
    names: Mapping[str, str],
) -> Replay:
    """Feeds ``ids[:start]`` as one step and ``ids[start:]`` as the next
    (``feed(tracker, ids, texts, grammar_terminated_at)`` instead of
    ``tracker.update`` for the new ones, when given).

    The finish machine is step invariant (semantics.md 6.10), so splitting
    the history anywhere gives the same answer; the split only tells whether
    the decision was already made by the tokens before the new ones.
    ``grammar_at_end``: the grammar ended at the last new token. ``params``
    may be a fresh tracker to use (one that read the prompt,
    :meth:`Reasoning.tracker`) instead of a plain one of those params.
    ``names`` maps the core's ``token_ids`` / ``texts`` to the caller's
    fields, so an error names the caller's list and index
    (:func:`reraise_for_caller`).
    """
    tracker = params if isinstance(params, FinishTracker) else FinishTracker(params)
    before = ids[:start]
    new = ids[start:]
    offset = 0
    try:
        if before:
            tracker.update(before, None if texts is None else texts[:start])
        decided_before_new = tracker.finished
        offset = start
        if new and not decided_before_new:
            grammar = len(new) - 1 if grammar_at_end else None
            new_texts = None if texts is None else list(texts[start:])
            if feed is None:
                tracker.update(new, new_texts, grammar)
            else:
                feed(tracker, list(new), new_texts, grammar)
    except (ValueError, TypeError) as exc:
        reraise_for_caller(exc, names, offset)
    return Replay(
        finished=tracker.finished,
        finish_reason=tracker.finish_reason,
        stop_reason=tracker.stop_reason,
        matched=tracker.matched,
        num_tokens=tracker.num_tokens,
        text=tracker.text,
        reasoning=tracker.reasoning,
        content=tracker.content,
        decided_before_new=decided_before_new,
    )


# ------------------------------------------------------------ vocabulary --

_VOCAB_CACHE_SIZE = 8
# id(backend) -> (backend kept alive so its id is never reused, its size with
# added tokens so a tokenizer that gained tokens is rebuilt, the vocabulary).
_vocab_cache: OrderedDict[int, tuple[Any, int, Vocabulary | None]] = OrderedDict()
_vocab_lock = threading.Lock()


def vocabulary_for(tokenizer: Any) -> Vocabulary | None:
    """stopline's :class:`~stopline.Vocabulary` for a fast tokenizer
    (``transformers``' ``PreTrainedTokenizerFast`` or a
    ``tokenizers.Tokenizer``), built from its ``tokenizer.json``
    (``to_str()``), or ``None`` when the core refuses its decoder
    (docs/semantics.md 10.1: ``BPEDecoder``, ``CTC``, a regex ``Replace``...)
    or the tokenizer has no ``tokenizer.json`` (a slow tokenizer). Built once
    per tokenizer object and size (tens to hundreds of ms for a 100k-256k
    vocabulary); the last 8 are kept.

    Raises:
        ValueError: the tokenizer's JSON breaks a ``Vocabulary`` cap
            (docs/errors.md), which a fallback decoder would not fix.
    """
    backend = getattr(tokenizer, "backend_tokenizer", tokenizer)
    to_str, size_of = getattr(backend, "to_str", None), getattr(backend, "get_vocab_size", None)
    if not callable(to_str):
        return None
    size = int(size_of(with_added_tokens=True)) if callable(size_of) else -1
    key = id(backend)
    with _vocab_lock:
        hit = _vocab_cache.get(key)
        if hit is not None and hit[0] is backend and hit[1] == size:
            _vocab_cache.move_to_end(key)
            return hit[2]
    try:
        vocab: Vocabulary | None = Vocabulary.from_str(to_str())
    except ValueError as exc:
        if "unsupported decoder" not in str(exc):
            raise
        vocab = None
    with _vocab_lock:
        _vocab_cache[key] = (backend, size, vocab)
        _vocab_cache.move_to_end(key)
        while len(_vocab_cache) > _VOCAB_CACHE_SIZE:
            _vocab_cache.popitem(last=False)
    return vocab


# ------------------------------------------------------------- reasoning --

#: The ``StopParams`` keywords an engine-wide reasoning configuration may set
#: (docs/semantics.md 11), tool-call spans (11.10) included;
#: ``max_reasoning_tokens`` comes per request.
REASONING_KEYS = (
    "reasoning_start",
    "reasoning_start_id",
    "reasoning_end",
    "reasoning_end_id",
    "reasoning_end_ids",
    "reasoning_starts_in",
    "keep_reasoning_markers",
    "token_aligned",
    "tool_call_markers",
    "tool_call_marker_ids",
)


@dataclass(frozen=True)
class Reasoning:
    """An engine's reasoning configuration, read once per engine: the
    ``StopParams`` reasoning keywords (:data:`REASONING_KEYS`) shared by every
    request, and the :class:`~stopline.Vocabulary` that lets an ids-only check
    match text markers and read the prompt (a prompt that ends inside
    ``<think>`` starts the output in reasoning, docs/semantics.md 11.1).

    Build it with :func:`reasoning_config` (a mapping, checked),
    :func:`reasoning_from_markers` (marker strings resolved against a
    tokenizer), or an engine's reader (``stopline.engines.vllm.vllm_reasoning``,
    ``stopline.engines.sglang.sglang_reasoning``).
    """

    options: Mapping[str, Any]
    vocabulary: Vocabulary | None = field(default=None, compare=False)

    def prompt_channel(self, prompt_ids: Sequence[int] | None) -> str | None:
        """The channel output starts in after ``prompt_ids``, by the core's
        rule (docs/semantics.md 11 rule 1: the configured
        ``reasoning_starts_in``, else an unclosed start marker in the
        prompt's tail, by id, and by text with a vocabulary); ``None`` when
        it cannot be read (no prompt, or text-only markers and no
        vocabulary): the params then decide (content). For a check fed
        texts, which has no vocabulary of its own to read the prompt with."""
        starts_in = self.options.get("reasoning_starts_in")
        if starts_in is not None:
            return str(starts_in)
        if prompt_ids is None:
            return None
        params = StopParams(**self.options)
        if self.vocabulary is None and not params.reads_prompt_by_ids:
            return None
        return self.tracker(params, prompt_ids).channel

    @property
    def has_block(self) -> bool:
        """Whether a reasoning block is configured (else tool-call spans
        alone, docs/semantics.md 11.10: no channels, no scopes)."""
        return bool(self.options.get("reasoning_end")) or self.options.get("reasoning_end_id") is not None

    def needs_decoding(self) -> bool:
        """Whether an ids-only check must decode its ids (with
        :attr:`vocabulary`) to see a marker: one is given only as text."""
        o = self.options
        text_only = (
            (o.get("reasoning_start") and o.get("reasoning_start_id") is None)
            or (o.get("reasoning_end") and o.get("reasoning_end_id") is None)
            or (o.get("tool_call_markers") and not o.get("tool_call_marker_ids"))
        )
        return bool(text_only) and self.vocabulary is not None

    def stop_kwargs(
        self,
        *,
        max_reasoning_tokens: int | None,
        ids_only: bool,
        starts_in: str | None = None,
        decode: bool | None = None,
    ) -> dict[str, Any]:
        """The ``StopParams`` keywords for one request.

        ``ids_only``: the check sees token ids and no text (vLLM's scheduler,
        a logits processor). Unless its tracker decodes them (``decode``,
        default :meth:`needs_decoding`; :meth:`tracker`), only the marker ids
        can be recognised: text markers are dropped, and a marker that has no
        id is an error naming it. ``starts_in``: where the output starts, for
        a check that does not read the prompt itself (:meth:`prompt_channel`).

        Raises:
            ValueError: ids only, no decoding, and a marker given only as text
                (naming ``reasoning_start`` / ``reasoning_end``).
        """
        kw = dict(self.options)
        if decode is None:
            decode = self.needs_decoding()
        if ids_only and not decode:
            for text_key, id_key in (("reasoning_start", "reasoning_start_id"), ("reasoning_end", "reasoning_end_id")):
                text = kw.pop(text_key, None)
                if text is not None and kw.get(id_key) is None:
                    raise field_value_error(
                        text_key,
                        f"={shown(text)} has no single token id, and this check sees ids only: give a "
                        f"{id_key} or a vocabulary to decode the ids with",
                    )
            spans = kw.pop("tool_call_markers", None)
            if spans and not kw.get("tool_call_marker_ids"):
                raise field_value_error(
                    "tool_call_markers",
                    " have no token ids, and this check sees ids only: give tool_call_marker_ids or a "
                    "vocabulary to decode the ids with",
                )
        if max_reasoning_tokens is not None:
            kw["max_reasoning_tokens"] = max_reasoning_tokens
        if starts_in is not None:
            kw["reasoning_starts_in"] = starts_in
        return kw

    def ids_check(self, prompt_ids: Sequence[int] | None, *, count_prompt: bool) -> tuple[str | None, bool]:
        """How an ids-only check follows the channels: ``(starts_in,
        decode)`` for :meth:`stop_kwargs`, and whether to build the tracker
        with :meth:`tracker` (``decode``) or plainly.

        A decoding tracker reads the prompt itself and counts its thinking
        for the budget (as vLLM); but it refuses an id past the tokenizer
        (``ValueError``; engines pad the embedding past it), so it is used
        only where it is needed: a marker given only as text, or
        ``count_prompt`` (a thinking budget). Otherwise the markers are
        matched by id and the prompt only says where the output starts.
        """
        decode = self.vocabulary is not None and (count_prompt or self.needs_decoding())
        return (None if decode else self.prompt_channel(prompt_ids)), decode

    def budget_counter(self, budget: int, prompt_ids: Sequence[int] | None) -> FinishTracker:
        """An ids-only tracker that counts one request's thinking for a
        logits processor: ``forced_token_id`` is the id to force next. With
        a vocabulary it reads the prompt and counts its thinking, as vLLM's
        budget does (docs/semantics.md 11.8). Feed it with :meth:`count`."""
        starts_in, decode = self.ids_check(prompt_ids, count_prompt=True)
        params = StopParams(
            **self.stop_kwargs(max_reasoning_tokens=budget, ids_only=True, starts_in=starts_in, decode=decode)
        )
        return self.tracker(params, prompt_ids) if decode else FinishTracker(params)

    def count(self, counter: FinishTracker, ids: list[int]) -> bool:
        """Feeds a :meth:`budget_counter` the new output ids; ``False`` (and
        nothing fed) when one lies past the vocabulary it decodes with (an
        engine's padded embedding row has no text): the caller then stops
        enforcing that budget rather than fail the step."""
        if ids and self.vocabulary is not None and max(ids) >= self.vocabulary.vocab_size:
            return False
        if ids:
            counter.update(ids)
        return True

    def tracker(self, params: StopParams, prompt_ids: Sequence[int] | None) -> FinishTracker:
        """An ids-only tracker for ``params``; with a vocabulary, or marker
        ids, it reads ``prompt_ids`` (prompt-opened thinking, the thinking
        budget's prompt count). Special tokens are kept: marker ids match by
        id either way."""
        prompt = None if prompt_ids is None else output_ids(prompt_ids, "prompt_token_ids")
        if self.vocabulary is None:
            return FinishTracker(params, prompt_token_ids=prompt if params.reads_prompt_by_ids else None)
        return FinishTracker(params, self.vocabulary, prompt_token_ids=prompt, skip_special_tokens=False)


#: What an adapter's ``reasoning=`` accepts (read by :func:`reasoning_config`).
ReasoningArg: TypeAlias = "Reasoning | Mapping[str, Any] | None"


def reasoning_config(value: Any, field_name: str = "reasoning", vocabulary: Vocabulary | None = None) -> Reasoning | None:
    """An adapter's ``reasoning=`` argument as a :class:`Reasoning`: ``None``
    (off), a :class:`Reasoning` (as is), or a mapping of :data:`REASONING_KEYS`
    (``{"reasoning_start": "<think>", "reasoning_end": "</think>"}``, or
    tool-call spans with or without a reasoning block:
    ``{"tool_call_marker_ids": [(151657, 151658)]}``), checked now by building
    a ``StopParams`` from it, so a bad configuration fails at engine start,
    not on the first request. Every adapter's ``reasoning=`` is read here.

    Raises:
        TypeError: not a mapping; a value of the wrong type (naming
            ``reasoning_start`` etc. as ``StopParams`` does).
        ValueError: an unknown key (the first few shown), a mapping without
            an end marker or spans, an empty marker, an id over ``2**32``, whatever
            ``StopParams`` refuses (naming the field).
    """
    if value is None or isinstance(value, Reasoning):
        return value
    if not isinstance(value, Mapping):
        raise field_type_error(field_name, "a mapping of StopParams reasoning keywords, a Reasoning or None", value)
    unknown = [k for k in value if k not in REASONING_KEYS]
    if unknown:
        raise unknown_keys(field_name, unknown, REASONING_KEYS)
    options = {k: v for k, v in value.items() if v is not None}
    if "reasoning_end_ids" in options:
        options["reasoning_end_ids"] = tuple(
            int_items(options["reasoning_end_ids"], "reasoning_end_ids", LIMITS["max_stop_token_ids"])
        )
    for key in ("tool_call_markers", "tool_call_marker_ids"):
        if key in options and not isinstance(options[key], (str, bytes)):
            # Kept as tuples: the configuration is shared by every request.
            options[key] = tuple(_pair(p, f"{key}[{i}]")
                                 for i, p in enumerate(items(options[key], key, "a sequence of (start, end) pairs",
                                                             LIMITS["max_tool_call_spans"])))
    spans = options.get("tool_call_markers") or options.get("tool_call_marker_ids")
    if not options.get("reasoning_end") and options.get("reasoning_end_id") is None and not spans:
        # StopParams would build a params without channels from {} (or from
        # only keep_reasoning_markers): a reasoning configuration needs its
        # end (or tool-call spans alone, docs/semantics.md 11.10).
        raise field_value_error("reasoning_end", " is required: a reasoning configuration needs an end marker "
                                "(reasoning_end text or reasoning_end_id) or tool-call spans")
    StopParams(**options)  # the core's checks, naming the field
    return Reasoning(options=options, vocabulary=vocabulary)


def _pair(value: Any, field_name: str) -> Any:
    """One span marker pair of a configuration as a tuple, read under a cap:
    an endless iterator is refused (``kind="count"``, as ``StopParams``
    names a pair of the wrong length), not read until memory runs out. A
    str, a set, a mapping or a non-iterable is left for ``StopParams`` to
    name."""
    if isinstance(value, (str, bytes, AbstractSet, Mapping)) or not isinstance(value, Iterable):
        return value  # an unordered pair too: StopParams refuses it
    two = list(itertools.islice(value, 3))
    if len(two) > 2:
        n = len(value) if isinstance(value, Sized) else None
        count = "more than 2" if n is None or n < 3 else str(n)
        raise field_value_error(field_name, f" has {count} items; a (start, end) pair has exactly 2", "count")
    return tuple(two)


def _encode(tokenizer: Any, text: str) -> list[int]:
    encoded = tokenizer.encode(text, add_special_tokens=False)
    # A tokenizers.Tokenizer gives an Encoding, a transformers tokenizer a list.
    return [int(i) for i in getattr(encoded, "ids", encoded)]


def reasoning_from_markers(
    start: str | None,
    end: str,
    tokenizer: Any,
    *,
    forced_end: str | None = None,
    field_name: str = "reasoning",
    **options: Any,
) -> Reasoning:
    """A :class:`Reasoning` from marker strings, their ids resolved against
    ``tokenizer`` as vLLM's ``ReasoningConfig.initialize_token_ids`` does
    (``tokenizer.encode(text, add_special_tokens=False)``): a marker that is
    one token gets its id too (recognised by id even when
    ``skip_special_tokens`` hides its text), a longer one is matched as text
    only. The thinking budget forces ``forced_end``'s ids (default ``end``'s),
    one per step. ``options``: more :data:`REASONING_KEYS`
    (``keep_reasoning_markers=True``, ...). The vocabulary comes from
    :func:`vocabulary_for`.

    Raises:
        TypeError / ValueError: a ``tokenizer`` without ``encode()``; a marker
            that is not a str, is empty, holds a lone surrogate or tokenizes
            to nothing (naming ``reasoning_start`` / ``reasoning_end`` /
            ``forced_end``), as :func:`reasoning_config`.
    """
    if isinstance(tokenizer, (str, bytes)) or not callable(getattr(tokenizer, "encode", None)):
        raise field_type_error("tokenizer", "a tokenizer with encode() (transformers or tokenizers)", tokenizer)
    kw: dict[str, Any] = dict(options)
    for key, text in (("reasoning_start", start), ("reasoning_end", end), ("reasoning_end_ids", forced_end)):
        if text is None:
            continue
        name = "forced_end" if key == "reasoning_end_ids" else key
        if not isinstance(text, str):
            raise field_type_error(name, "a str", text)
        if not text.isascii():
            try:
                text.encode()
            except UnicodeEncodeError:
                raise field_value_error(
                    name, " is not valid Unicode (it contains a lone surrogate)", "lone_surrogate"
                ) from None
        if not text and key != "reasoning_end_ids":
            kw[key] = text  # StopParams names the empty marker
            continue
        ids = _encode(tokenizer, text) if text else []
        if not ids:
            raise field_value_error(name, f"={shown(text)} gives no token ids with this tokenizer")
        if key == "reasoning_end_ids":
            kw[key] = ids
            continue
        kw[key] = text
        if len(ids) == 1:
            kw[f"{key}_id"] = ids[0]
        if key == "reasoning_end" and forced_end is None:
            kw["reasoning_end_ids"] = ids
    r = reasoning_config(kw, field_name, vocabulary_for(tokenizer))
    assert r is not None
    return r


def thinking_budget(value: Any, field_name: str) -> int | None:
    """A request's thinking budget in tokens: ``None`` or ``-1`` (vLLM's
    "unlimited") is none; else an int >= 0 (TypeError / ValueError naming
    ``field_name``)."""
    if value is None:
        return None
    budget = integer(value, field_name)
    if budget == -1:
        return None
    if budget < 0:
        raise field_value_error(field_name, f" must be >= 0 or -1 (unlimited), got {budget}")
    if budget >= 2**63:  # named here: StopParams (a 64-bit int) would name max_reasoning_tokens
        raise field_value_error(field_name, f"={budget} is out of range (at most 2**63 - 1)", "out_of_range")
    return budget
