# Hand-maintained stubs for the Rust extension; checked with mypy.stubtest.
"""The Rust core of stopline: stop-string and stop-regex matchers, the finish
state machine of one sequence and of a batch.

The contract is docs/semantics.md; the docstrings below cite its sections.

Units (semantics.md 1): text offsets and lengths are Python code points of the
cumulative *output* text (never bytes, never UTF-16 units); token counts are
output tokens (``max_model_len`` alone counts prompt plus output positions);
token ids are ints in ``[0, 2**32)``.

Errors (the full matrix is docs/errors.md): ``TypeError`` for a value of the
wrong type, ``ValueError`` for a value of the right type that is out of range,
empty, inconsistent with another argument or not valid Unicode (a lone
surrogate), ``SequenceFinishedError`` (a ``RuntimeError``) for updating a
finished sequence, ``RuntimeError`` for another call the object's state
forbids. Messages
name the field, the element (``stop[1]``, ``token_ids[3] (slot 2)``) and the
value. The exceptions stopline raises itself are subclasses of those
built-ins (``StoplineValueError``, ``StoplineTypeError``, ...) that carry
``field``, ``slot`` (the batch slot at fault, so an engine can abort that
request alone) and ``kind``. ``slot``, ``max_slots``, ``new_char_count`` and a ``BatchStepResult``
index raise ``OverflowError`` at 2**63 and above; the others raise
``ValueError``. Ints may be any object with ``__index__`` (NumPy integers);
a ``bool`` where an int is expected is a ``TypeError`` (docs/errors.md). Exceptions raised by the
caller's own objects (an ``__iter__`` or ``__index__`` that raises,
``MemoryError`` or ``KeyboardInterrupt`` included) propagate unchanged.
Sizes stopline caps (``max_slots``, a regex DFA) are checked before anything
is allocated, so an oversized argument is a ``ValueError``, not an abort. A
call that raises changes no state.

Matchers, trackers and batches are not thread-safe: a second thread using the
same object while a call is in progress gets PyO3's borrow error, a
``RuntimeError`` (``Already borrowed``), and the state is unchanged.
Compiled ``StopStrings`` / ``StopRegexes`` and ``StopParams`` are immutable
and shared freely.
"""

import os
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Literal, TypeAlias, final

__all__ = [
    "StopStrings",
    "StopMatcher",
    "StopMatch",
    "StopRegexes",
    "StopRegexMatcher",
    "StopParams",
    "StepResult",
    "FinishTracker",
    "BatchStepResult",
    "FinishBatch",
    "Vocabulary",
    "IncrementalDecoder",
    "check_stop_strings",
    "to_openai_finish_reason",
    "__version__",
    "LIMITS",
    "LOGITS_LIMITS",
    "SequenceFinishedError",
    "StoplineValueError",
    "StoplineTypeError",
    "StoplineRuntimeError",
    "StoplineMemoryError",
    "StoplineOverflowError",
    "FINISH_REASONS",
    "_bad_words_table",
    "_problem",  # PyO3 lists every added function in the runtime __all__
]

class _ErrorData:
    # ``field``: the argument or element at fault as the message names it
    # (``"token_ids[3]"``, ``"stop[0]"``, ``"max_tokens"``), or None.
    # ``slot``: the ``FinishBatch`` slot whose arguments or state are at
    # fault, or None. ``kind``: what went wrong, the core's snake-case name
    # (``"below"``, ``"not_in_vocabulary"``, ``"slot_finished"``; the list is
    # in docs/errors.md). None on the class itself.
    field: str | None
    slot: int | None
    kind: str | None

class StoplineValueError(_ErrorData, ValueError):
    """A value of the right type that is out of range, empty, inconsistent
    with another argument or not valid Unicode. A ``ValueError`` subclass
    with ``field``, ``slot`` and ``kind`` (docs/errors.md)."""

class StoplineTypeError(_ErrorData, TypeError):
    """A value of the wrong type. A ``TypeError`` subclass with ``field``,
    ``slot`` and ``kind`` (docs/errors.md)."""

class StoplineRuntimeError(_ErrorData, RuntimeError):
    """A call that the object's state forbids. A ``RuntimeError`` subclass
    with ``field``, ``slot`` and ``kind`` (docs/errors.md)."""

class StoplineMemoryError(_ErrorData, MemoryError):
    """A table that could not be allocated. A ``MemoryError`` subclass with
    ``field``, ``slot`` and ``kind``."""

class StoplineOverflowError(_ErrorData, OverflowError):
    """An integer argument too large for 64 bits. An ``OverflowError``
    subclass with ``field``, ``slot`` and ``kind``."""

class SequenceFinishedError(StoplineRuntimeError):
    """Raised by ``FinishTracker.update`` and ``FinishBatch.step`` for a
    sequence that already finished (the message names its ``finish_reason``,
    and the slot for a batch; ``slot`` holds it). A ``RuntimeError``
    subclass, so ``except RuntimeError`` still catches it; engines that race
    a late step against a finish catch this type alone (docs/errors.md).
    Nothing changes when it is raised."""

def _problem(kind: str, field: str, *, slot: int | None = None, **values: object) -> Exception:
    """Not API: the exception the core raises for ``kind`` about ``field``
    (its class, message and attributes), for the Python modules' own checks
    (``stopline._caps``). ``values`` are the core ``Problem``'s fields."""

# Type-only names (not attributes of the runtime module, hence private):
# import them under `if TYPE_CHECKING:`.
_FinishReason: TypeAlias = Literal["stop", "length", "abort", "error", "repetition"]
"""Every ``finish_reason`` the core reports, as ``FINISH_REASONS`` lists them
(``FinishReason::ALL`` in rust/finish.rs; vLLM's names, semantics.md 1;
tests/test_compat.py checks the two agree). ``None`` where a
``finish_reason`` is optional means still running."""

FINISH_REASONS: tuple[_FinishReason, ...]
"""Every ``finish_reason`` the core reports, in a fixed order: ``("stop",
"length", "abort", "error", "repetition")``. ``compat`` and
``to_openai_finish_reason`` check reasons against it."""

_OpenAIFinishReason: TypeAlias = Literal["stop", "tool_calls", "length", "abort", "error", "repetition"]
"""What ``to_openai_finish_reason`` returns for a finished sequence."""

_Scope: TypeAlias = Literal["content", "reasoning", "any"]
"""Where a stop fires once reasoning channels are on (semantics.md 11)."""

__version__: str
"""The package version (``Cargo.toml``'s, the same as the wheel's)."""

# The caps on every input from a request, by name (docs/errors.md, "Caps").
LIMITS: dict[str, int]
# The caps of ``stopline.logits.LogitsConstraints`` (``stopline.logits.LIMITS``
# is a copy); both tables are the core's ``rust/limits.rs``.
LOGITS_LIMITS: dict[str, int]

@final
class StopMatch:
    """One stop-string (or stop-regex) match; offsets are code points of the
    cumulative text fed to the matcher (semantics.md 1, 2).

    Immutable; equal when all five fields are equal (not hashable).
    """

    @property
    def index(self) -> int:
        """Position of the stop in its list (``StopStrings.stops`` or
        ``StopRegexes.patterns``)."""
    @property
    def stop(self) -> str:
        """The stop string; for a ``StopRegexMatcher``, the pattern (not the
        matched text, which is ``text[start:end]``)."""
    @property
    def start(self) -> int:
        """Code-point offset of the first character of the match; it may lie
        in text fed by earlier ``feed`` calls."""
    @property
    def end(self) -> int:
        """Code-point offset just past the match (exclusive); always inside
        the ``delta`` of the ``feed`` that returned it."""
    @property
    def truncate_to(self) -> int:
        """Code-point length to cut the output text to: ``end`` when the
        matcher includes the stop in the output, else ``start``
        (semantics.md 2, 6.8)."""
    def __eq__(self, other: object, /) -> bool: ...
    def __ne__(self, other: object, /) -> bool: ...

@final
class StopMatcher:
    """One sequence's incremental stop-string state over a ``StopStrings``
    (from ``StopStrings.matcher``; semantics.md 2).

    Each ``feed`` scans only the new text: O(len(delta)) whatever the number
    of stop strings. Not thread-safe (see the module docstring).
    """

    def feed(self, delta: str) -> StopMatch | None:
        """Appends the next text piece and reports the first stop string that
        completes inside it.

        Args:
            delta: the new text (any length, ``""`` included). A match may
                start in earlier text but must end inside ``delta``.

        Returns:
            The match that ends earliest in ``delta`` (a tie at the same end
            goes to the lowest list index; semantics.md 2, 6.1), or ``None``.
            The first match is the same for any chunking of the text (step
            invariance). The matcher keeps consuming after a match, so later
            text can match again.

        Raises:
            TypeError: ``delta`` is not a ``str`` ("delta must be str, got
                int"); the state is unchanged.
            ValueError: ``delta`` contains a lone surrogate; the state is
                unchanged.
        """
    @property
    def holdback(self) -> int:
        """Code points at the end of the text fed so far that must not be
        streamed yet: the longest suffix that is a proper prefix of some stop
        string (exact, not ``max(len(stop)) - 1``); 0 when the matcher
        includes stops in the output (semantics.md 2, 6.9)."""
    @property
    def chars_fed(self) -> int:
        """Code points fed since the matcher was made or last ``reset``."""
    @property
    def include_in_output(self) -> bool:
        """Whether matches keep the stop string (``truncate_to == end``, no
        hold-back); fixed when the matcher is made."""
    def reset(self) -> None:
        """Forgets all text fed, as a fresh matcher from the same
        ``StopStrings`` with the same ``include_in_output``."""

@final
class StopStrings:
    """A compiled, immutable list of stop strings (Aho-Corasick, standard
    match semantics), shared between sequences and threads (semantics.md 2).

    Identical lists share one automaton through a process-wide cache (at most
    1024 lists and 256 MiB, least recently used first out). Compile time and
    memory are linear in the total length of the strings.
    """

    def __new__(cls, stops: Iterable[str]) -> StopStrings:
        """Compiles ``stops``.

        Args:
            stops: the stop strings, in priority order for ties: a list, tuple
                or any iterable of non-empty ``str``; an empty list never
                matches. A bare ``str`` is refused rather than read as a list
                of characters.

        Raises:
            TypeError: ``stops`` is a bare ``str``, is not iterable, or an
                entry is not a ``str`` (``stop[1] must be str, got int``).
            ValueError: an entry is empty (``stop[1] is an empty string``) or
                contains a lone surrogate; the automaton cannot be built
                (``cannot compile the stop strings``, not expected in
                practice).
        """
    def matcher(self, include_in_output: bool = False) -> StopMatcher:
        """A fresh incremental matcher for one sequence.

        Args:
            include_in_output: keep the stop string in the output
                (``include_stop_str_in_output``): matches report
                ``truncate_to == end`` and nothing is held back.

        Raises:
            TypeError: ``include_in_output`` is not a ``bool``.
        """
    def check(
        self, output_text: str, new_char_count: int, include_in_output: bool = False
    ) -> tuple[str, int] | None:
        """Stateless check in the shape of vLLM's ``check_stop_strings``
        (semantics.md 2): the earliest-ending stop string that ends in the
        last ``new_char_count`` code points of ``output_text``.

        Args:
            output_text: the whole output text so far.
            new_char_count: how many code points at the end of
                ``output_text`` are new, in ``[0, len(output_text)]``. A match
                may start before them.
            include_in_output: keep the stop string in the output.

        Returns:
            ``None`` when no stop string ends in the new text, else
            ``(stop, truncate_to)``: ``truncate_to`` is the code-point length
            to cut ``output_text`` to (the match start, or its end with
            ``include_in_output``), or ``-1`` when nothing is to be cut (with
            ``include_in_output`` and the match ending at the end of the
            text), as vLLM returns it.

        Raises:
            TypeError: ``output_text`` is not a ``str``; ``new_char_count``
                is not an int; ``include_in_output`` is not a ``bool``.
            ValueError: ``new_char_count`` is outside
                ``[0, len(output_text)]``; ``output_text`` contains a lone
                surrogate.
            OverflowError: ``new_char_count`` is 2**63 or more.
        """
    @property
    def stops(self) -> tuple[str, ...]:
        """The stop strings, in list order."""
    @property
    def max_stop_len(self) -> int:
        """Length of the longest stop string, in code points."""
    def __len__(self) -> int:
        """Number of stop strings."""
    def __getnewargs__(self) -> tuple[tuple[str, ...]]:
        """Pickling (protocol 2 and up) and ``copy``: the entries, compiled again when unpickled."""

@final
class StopRegexMatcher:
    """One sequence's incremental stop-regex state over a ``StopRegexes``
    (from ``StopRegexes.matcher``; semantics.md 2.1).

    Per ``feed``: O(len(delta) x (1 + T)), T the partial matches alive with
    distinct DFA states; no text is kept or re-scanned. Not thread-safe (see
    the module docstring).
    """

    def feed(self, delta: str) -> StopMatch | None:
        """Appends the next text piece and reports the first pattern that
        completes a match inside it.

        Args:
            delta: the new text. A match may start in earlier text but must
                end inside ``delta``; ``$``, ``\\z`` and ``\\b`` see only the
                text fed so far (semantics.md 2.1).

        Returns:
            The match that ends earliest in ``delta`` (ties: the lowest list
            index), reported with the leftmost start among that pattern's
            matches ending there; ``StopMatch.stop`` is the pattern. ``None``
            when nothing completes.

        Raises:
            TypeError: ``delta`` is not a ``str``; the state is unchanged.
            ValueError: ``delta`` contains a lone surrogate; the state is
                unchanged.
        """
    @property
    def holdback(self) -> int:
        """Code points at the end of the text fed so far that must not be
        streamed yet: from the earliest start of a partial match that can
        still complete later; unbounded for a pattern such as
        ``<think>.*?</think>`` until it completes (semantics.md 2.1). 0 when
        the matcher includes stops in the output."""
    @property
    def chars_fed(self) -> int:
        """Code points fed since the matcher was made or last ``reset``."""
    @property
    def include_in_output(self) -> bool:
        """Whether matches keep the matched text (``truncate_to == end``, no
        hold-back); fixed when the matcher is made."""
    def reset(self) -> None:
        """Forgets all text fed, as a fresh matcher from the same
        ``StopRegexes`` with the same ``include_in_output``."""

@final
class StopRegexes:
    """A compiled, immutable list of stop regexes in Rust ``regex`` syntax
    (Unicode-aware), one DFA for the list, shared between sequences and
    threads; identical lists share it through a process-wide cache
    (semantics.md 2.1)."""

    def __new__(cls, patterns: Iterable[str]) -> StopRegexes:
        """Compiles ``patterns`` into one DFA.

        Args:
            patterns: the patterns, in priority order for ties: any iterable
                of ``str`` (a bare ``str`` is refused).

        Raises:
            TypeError: ``patterns`` is a bare ``str`` or not iterable, or an
                entry is not a ``str`` (``stop_regex[0] must be str, got
                int``).
            ValueError: naming ``stop_regex[i]`` and the pattern: a syntax
                error, look-around or back-references; a pattern that can
                match the empty string (``a*``, ``^``); a Unicode ``\\b``
                (write ``(?-u:\\b)``); a list whose DFA would pass 4 MiB; a
                lone surrogate.
        """
    def matcher(self, include_in_output: bool = False) -> StopRegexMatcher:
        """A fresh incremental matcher for one sequence.

        Args:
            include_in_output: keep the matched text in the output
                (``include_stop_str_in_output``).

        Raises:
            TypeError: ``include_in_output`` is not a ``bool``.
        """
    @property
    def patterns(self) -> tuple[str, ...]:
        """The patterns, in list order."""
    @property
    def memory_usage(self) -> int:
        """Heap bytes of the compiled DFA (a list whose DFA would pass 4 MiB is
        refused when built)."""
    def __len__(self) -> int:
        """Number of patterns."""
    def __getnewargs__(self) -> tuple[tuple[str, ...]]:
        """Pickling (protocol 2 and up) and ``copy``: the entries, compiled again when unpickled."""

def check_stop_strings(
    output_text: str, new_char_count: int, stop: Iterable[str] | StopStrings, include_in_output: bool
) -> tuple[str, int] | None:
    """Drop-in for vLLM's ``check_stop_strings``: ``StopStrings(stop).check(...)``
    with the list compiled through the cache (semantics.md 2, 6.1).

    Args:
        output_text: the whole output text so far.
        new_char_count: how many code points at the end of ``output_text``
            are new, in ``[0, len(output_text)]``.
        stop: the stop strings (any iterable of non-empty ``str``, not a bare
            ``str``) or a compiled ``StopStrings``.
        include_in_output: keep the stop string in the output (required, as
            in vLLM).

    Returns:
        ``None``, or ``(stop, truncate_to)`` with ``truncate_to`` in code
        points, ``-1`` when nothing is to be cut (see ``StopStrings.check``).

    Raises:
        TypeError: as ``StopStrings(stop)`` and ``StopStrings.check``;
            ``include_in_output`` missing or not a ``bool``.
        ValueError: as ``StopStrings(stop)`` and ``StopStrings.check``.
        OverflowError: ``new_char_count`` is 2**63 or more.
    """

def to_openai_finish_reason(finish_reason: str | None, has_tool_calls: bool = False) -> _OpenAIFinishReason | None:
    """Maps a stopline ``finish_reason`` to the OpenAI API's (semantics.md
    3.2, 6.13).

    Args:
        finish_reason: one of ``"stop"``, ``"length"``, ``"abort"``,
            ``"error"``, ``"repetition"``, or ``None`` (still running).
        has_tool_calls: whether the response carries parsed tool calls. Pass
            ``False`` when the client forced one named tool (OpenAI then
            reports ``"stop"``).

    Returns:
        ``"tool_calls"`` for ``"stop"`` with ``has_tool_calls``; otherwise the
        reason unchanged (``"length"`` is never replaced); ``None`` for
        ``None``.

    Raises:
        ValueError: ``finish_reason`` is any other ``str`` (``""``
            included); a lone surrogate raises ``UnicodeEncodeError``, a
            ``ValueError`` subclass.
        TypeError: ``finish_reason`` is not a ``str`` or ``None``;
            ``has_tool_calls`` is not a ``bool``.
    """

@final
class StopParams:
    """One request's stop parameters, validated when built, immutable and
    shareable between trackers (names as vLLM's ``SamplingParams``;
    semantics.md 1, 3, 5)."""

    def __new__(
        cls,
        *,
        max_tokens: int | None = None,
        min_tokens: int | None = None,
        prompt_len: int | None = None,
        max_model_len: int | None = None,
        eos_token_ids: Iterable[int] | None = None,
        ignore_eos: bool = False,
        stop_token_ids: Iterable[int] | None = None,
        stop: Iterable[str] | StopStrings | None = None,
        include_stop_str_in_output: bool = False,
        vocab_size: int | None = None,
        repetition: Mapping[str, int] | None = None,
        stop_regex: Iterable[str] | None = None,
        reasoning_start: str | None = None,
        reasoning_start_id: int | None = None,
        reasoning_end: str | None = None,
        reasoning_end_id: int | None = None,
        reasoning_end_ids: Iterable[int] | None = None,
        reasoning_starts_in: Literal["reasoning", "content"] | None = None,
        keep_reasoning_markers: bool = False,
        max_reasoning_tokens: int | None = None,
        stop_scopes: _Scope | Iterable[_Scope] | None = None,
        stop_regex_scopes: _Scope | Iterable[_Scope] | None = None,
        stop_token_id_scopes: _Scope | Iterable[_Scope] | None = None,
        token_aligned: bool = False,
        tool_call_markers: Iterable[tuple[str, str]] | None = None,
        tool_call_marker_ids: Iterable[tuple[int, int]] | None = None,
    ) -> StopParams:
        """Builds and validates the parameters; all arguments are
        keyword-only, ``None`` meaning "not set".

        Args:
            max_tokens: output-token budget, >= 1: ``"length"`` once ``n >=
                max_tokens`` output tokens (semantics.md 3, check 6). ``None``:
                no cap.
            min_tokens: output-token gate: stop strings and regexes fire
                only once ``n > min_tokens``, repetition once ``n >=
                min_tokens``; EOS, stop tokens, grammar ends and the length
                caps are not gated (semantics.md 5, 6.4, 6.5). Default 0.
            prompt_len: prompt tokens, counted only against
                ``max_model_len``. Default 0.
            max_model_len: context cap in positions (prompt plus output):
                ``"length"`` once ``prompt_len + n >= max_model_len``
                (semantics.md 6.11).
            eos_token_ids: EOS ids (a sequence of ints, or one int): ``"stop"``
                with ``stop_reason`` ``None`` and ``matched`` the id, below
                ``min_tokens`` too (semantics.md 3, check 3).
            ignore_eos: disables the EOS check; stop token ids still apply
                (semantics.md 6.6).
            stop_token_ids: ids (a sequence of ints, or one int) that finish
                with ``"stop"``, ``stop_reason`` the id (check 4).
            stop: stop strings (any iterable of non-empty ``str``, not a bare
                ``str``) or a compiled ``StopStrings`` (reused as is).
            include_stop_str_in_output: keep the matched stop text, and an
                ending token's text, in the output (semantics.md 3, check 4;
                6.7, 6.8).
            vocab_size: ids outside ``[0, vocab_size)`` in an update finish
                with ``"error"`` and are not kept (check 1, 6.12); the EOS and
                stop ids must lie inside it. 1 to 2**32 - 1.
            repetition: vLLM's repetition detection, a mapping with
                ``"max_pattern_size"`` (>= 1, required), ``"min_count"``
                (>= 2, required) and ``"min_pattern_size"`` (optional, 0 means
                1, at most ``max_pattern_size``), all in tokens; no other keys
                (check 7).
            stop_regex: stop regexes in Rust syntax (any iterable of ``str``,
                not a bare ``str``), compiled as ``StopRegexes``
                (semantics.md 2.1).
            reasoning_start, reasoning_end: the reasoning block's markers as
                text (``"<think>"``, ``"</think>"``), matched on the output
                text across tokens (semantics.md 11). Giving any reasoning
                argument turns the channels on; an end marker is required. A
                start marker met again inside the open block is a marker too.
            reasoning_start_id, reasoning_end_id: the markers as single token
                ids (Qwen3's 151667 / 151668), recognised by id even when
                ``skip_special_tokens`` hides their text.
            reasoning_end_ids: the end marker as the ids ``max_reasoning_tokens``
                forces, one per step (default ``[reasoning_end_id]``).
            reasoning_starts_in: where output starts; ``None``: content, or
                reasoning when a tracker's prompt ends inside an open block.
            keep_reasoning_markers: marker text and ids go to the reasoning
                channel instead of to neither.
            max_reasoning_tokens: the thinking budget in tokens after the start
                marker, counted as vLLM's ``thinking_token_budget``; once spent,
                ``StepResult.forced_token_id`` names the id to force.
            stop_scopes, stop_regex_scopes, stop_token_id_scopes: per entry of
                ``stop`` / ``stop_regex`` / ``stop_token_ids``, the channel it
                fires in: ``"content"`` (the default), ``"reasoning"`` or
                ``"any"``; one name for all, or one per entry. EOS and the
                length caps finish in either channel.
            token_aligned: release text only in whole tokens: while running,
                ``text_delta`` is exactly the text of ``token_ids_delta``.
            tool_call_markers: tool-call span marker pairs as text, e.g.
                ``[("<tool_call>", "</tool_call>")]`` (at most 8 pairs, each
                marker non-empty, at most ``max_marker_bytes``): inside a span
                (in content only) no stop string, stop regex or stop token id
                fires; span text and markers stay in the content
                (semantics.md 11.10). Spans alone need no reasoning markers.
            tool_call_marker_ids: the same pairs as single token ids, e.g.
                ``[(151657, 151658)]``; with both lists, pair i of each is the
                same markers (same length). An end marker given by id is not
                closed by its text spelled in ordinary tokens (vllm#45167).

        Raises:
            TypeError: a positional argument or unknown keyword; a count or id
                that is not an int (a float, NaN or ``str``:
                ``max_tokens must be an int, got float``); ``stop`` /
                ``stop_regex`` given a bare ``str``, a non-iterable or a
                non-``str`` entry; ``repetition`` not a mapping;
                ``ignore_eos`` / ``include_stop_str_in_output`` not a
                ``bool``.
            ValueError: naming the field and value: a negative count or id;
                an int of 2**63 or more; ``max_tokens`` < 1, ``max_model_len``
                < 1 or ``vocab_size`` < 1; ``min_tokens > max_tokens``;
                ``prompt_len >= max_model_len``; an id >= 2**32 or outside
                ``vocab_size``; an empty stop string; a stop regex refused as
                by ``StopRegexes``; a missing, unknown or out-of-range
                ``repetition`` key; a lone surrogate; an empty marker, a
                missing end marker, a start and end marker text of which one
                contains the other, a stop string that contains a marker, a
                marker id that is a stop or EOS id or lies
                outside ``vocab_size``, a scope list of the wrong length or an
                unknown scope name; ``tool_call_markers`` /
                ``tool_call_marker_ids`` with an empty marker, more than 8
                pairs, lists of different lengths, start texts that contain
                each other or a reasoning marker, an id shared with a
                reasoning marker or another pair's start, a stop string that
                contains a span marker, a span id that is a stop or EOS id or
                lies outside ``vocab_size``.
        """
    @property
    def reasoning(self) -> dict[str, Any] | None:
        """The reasoning arguments as accepted (scopes one per entry), a new
        dict on every read; ``None`` without reasoning channels."""
    @property
    def reads_prompt_by_ids(self) -> bool:
        """Whether a tracker reads a prompt for an open reasoning block
        without a vocabulary: both block markers are token ids
        (docs/semantics.md 11, rule 1); otherwise ``prompt_token_ids``
        needs a ``vocabulary``."""
    @property
    def token_aligned(self) -> bool:
        """Whether text is released only in whole tokens."""
    @property
    def tool_call_markers(self) -> list[tuple[str, str]]:
        """Tool-call span marker texts as ``(start, end)`` pairs, a new list
        on every read (empty when not set)."""
    @property
    def tool_call_marker_ids(self) -> list[tuple[int, int]]:
        """Tool-call span marker ids as ``(start, end)`` pairs, a new list on
        every read (empty when not set)."""
    def __getnewargs_ex__(self) -> tuple[tuple[()], dict[str, Any]]:
        """Pickling (protocol 2 and up) and ``copy``: the keyword arguments that
        build an equal ``StopParams``, validated again when unpickled."""
    @property
    def max_tokens(self) -> int | None:
        """Output-token budget; ``None`` for no cap."""
    @property
    def min_tokens(self) -> int:
        """Output tokens gating stop strings, regexes and repetition (0 when
        not set)."""
    @property
    def prompt_len(self) -> int:
        """Prompt tokens (0 when not set)."""
    @property
    def max_model_len(self) -> int | None:
        """Context cap in prompt-plus-output positions; ``None`` for none."""
    @property
    def eos_token_ids(self) -> list[int]:
        """EOS ids, a new list on every read (empty when not set)."""
    @property
    def ignore_eos(self) -> bool:
        """Whether the EOS check is disabled."""
    @property
    def stop_token_ids(self) -> list[int]:
        """Stop token ids, a new list on every read (empty when not set)."""
    @property
    def stop(self) -> list[str]:
        """Stop strings in list order, a new list on every read (empty when
        not set)."""
    @property
    def stop_regex(self) -> list[str]:
        """Stop regex patterns in list order, a new list on every read (empty
        when not set)."""
    @property
    def include_stop_str_in_output(self) -> bool:
        """Whether stop text and an ending token's text are kept."""
    @property
    def vocab_size(self) -> int | None:
        """Vocabulary size; ``None`` when ids are not range-checked."""
    @property
    def repetition(self) -> dict[str, int] | None:
        """``{"max_pattern_size", "min_pattern_size", "min_count"}`` as
        accepted (``min_pattern_size`` 0 when not given), a new dict on every
        read; ``None`` when repetition detection is off."""

@final
class StepResult:
    """The state of a sequence after one update, and what that update
    released for streaming (semantics.md 3, 4). Immutable."""

    @property
    def finished(self) -> bool:
        """Whether the sequence has finished (in this or an earlier call)."""
    @property
    def finish_reason(self) -> _FinishReason | None:
        """Why it finished (semantics.md 1, 3); ``None`` while running."""
    @property
    def stop_reason(self) -> str | int | None:
        """The stop string, the stop regex's pattern, the stop token id, or
        ``"repetition_detected"``; ``None`` for EOS, grammar end, length,
        abort, error, or while running (semantics.md 1)."""
    @property
    def matched(self) -> str | int | None:
        """The stop string, the text a stop regex matched, or the id of the
        deciding token (EOS, stop token, grammar end); ``None`` otherwise
        (semantics.md 1)."""
    @property
    def num_tokens(self) -> int:
        """Output tokens kept so far (tokens after the deciding one are not
        kept)."""
    @property
    def text_len(self) -> int:
        """Output text kept so far, in code points."""
    @property
    def text_delta(self) -> str:
        """Text released by this update for streaming; the hold-back stays
        until it is decided, and a finish flushes what is kept
        (semantics.md 4). Joined, the deltas are the kept text."""
    @property
    def token_ids_delta(self) -> list[int]:
        """Output token ids released by this update, a new list on every
        read; a token is released only once all of its text is
        (semantics.md 5). Joined, the deltas are the kept ids."""
    @property
    def channel(self) -> Literal["reasoning", "content"] | None:
        """With reasoning channels, the channel after this update (at finish,
        the one the sequence finished in); ``None`` without them
        (semantics.md 11)."""
    @property
    def reasoning_delta(self) -> str:
        """The reasoning part of ``text_delta`` (markers excluded unless
        kept); ``""`` without reasoning channels."""
    @property
    def content_delta(self) -> str:
        """The content part of ``text_delta``; ``text_delta`` itself without
        reasoning channels."""
    @property
    def reasoning_token_ids_delta(self) -> list[int]:
        """The reasoning ids of ``token_ids_delta``, a new list on every
        read."""
    @property
    def content_token_ids_delta(self) -> list[int]:
        """The content ids of ``token_ids_delta`` (all of them without
        reasoning channels), a new list on every read."""
    @property
    def forced_token_id(self) -> int | None:
        """The token id the engine must sample next because the thinking
        budget is spent (the end marker's ids, one per step); else ``None``."""

@final
class FinishTracker:
    """The finish state of one sequence: advanced by ``update`` once per
    decoding step (semantics.md 3). Not thread-safe (see the module
    docstring)."""

    def __new__(
        cls,
        params: StopParams,
        vocabulary: Vocabulary | None = None,
        prompt_token_ids: Iterable[int] | None = None,
        skip_special_tokens: bool = True,
        spaces_between_special_tokens: bool = True,
    ) -> FinishTracker:
        """A running sequence with no output yet.

        Args:
            params: the request's stop parameters.
            vocabulary: with a ``Vocabulary``, ``update`` takes token ids only
                (``texts`` must be None) and stopline decodes them
                (semantics.md 10).
            prompt_token_ids: the prompt's ids, to prime the decoder (with
                ``vocabulary``) and to read a reasoning block the prompt opened
                (semantics.md 11 rule 1; without ``vocabulary`` only when both
                reasoning markers have ids, read by id).
            skip_special_tokens, spaces_between_special_tokens: as vLLM's
                sampling parameters of the same names (only with ``vocabulary``).

        Raises:
            TypeError: ``params`` is not a ``StopParams``; ``vocabulary`` is
                not a ``Vocabulary``.
            ValueError: a prompt id outside the vocabulary.
        """
    def snapshot(self) -> bytes:
        """Everything the next step and the getters depend on, as bytes
        (semantics.md 12): the finish, the kept ids and text, what was
        released, the decoder's held bytes. Restore with ``restore`` and the
        same params (and vocabulary). ``pickle`` (protocol 2 and up) and
        ``copy`` go through it for a tracker without a vocabulary.

        Raises:
            ValueError: the snapshot would be over ``max_snapshot_bytes``
                (kind ``snapshot_too_large``).
        """
    @classmethod
    def restore(cls, params: StopParams, data: bytes, *, vocabulary: Vocabulary | None = None) -> FinishTracker:
        """A tracker in the state ``data`` (a ``snapshot()`` of a tracker or
        a ``FinishBatch`` slot) holds. Feeding it the rest of the stream
        gives exactly the deltas, finish and stop reason of an uninterrupted
        run.

        Args:
            params: the params the snapshot was taken with.
            data: the snapshot.
            vocabulary: the vocabulary it was taken with, if any.

        Raises:
            TypeError: ``data`` is not bytes; ``params`` is not a
                ``StopParams``; ``vocabulary`` is not a ``Vocabulary``.
            ValueError: ``data`` is not a snapshot of this format version, was
                taken with other params or another (or no) vocabulary, or is
                truncated, altered or inconsistent (``field`` names the part,
                ``kind`` is a ``snapshot_*`` kind; errors.md).
        """
    def update(
        self,
        token_ids: Iterable[int] | int,
        texts: Sequence[str] | None = None,
        grammar_terminated_at: int | None = None,
    ) -> StepResult:
        """Appends one decoding step: one token or a speculative accept run.

        The run is examined token by token in the order of semantics.md 3, so
        a run of k tokens gives exactly what k one-token updates give
        (6.10); tokens after the deciding one are dropped, ids and text
        alike. An id outside ``vocab_size`` is not an exception: it finishes
        with ``"error"`` and is not kept (check 1).

        Args:
            token_ids: the run's output token ids, in order: one int, a list,
                tuple, any iterable of ints, or a 1-D contiguous integer
                buffer (a NumPy int32/int64 array, read without a Python
                object per id). Each in ``[0, 2**32)``.
            texts: one ``str`` piece per token, as a streaming detokenizer
                produced it (``""`` while a multi-byte character is
                incomplete). Required when the params have stop strings or
                stop regexes (semantics.md 5).
            grammar_terminated_at: index into the run (0-based, a position
                in this run, not in the output) of the token that ended the
                grammar; ``None`` for none (check 5).

        Returns:
            A ``StepResult`` with the state after the step and the deltas to
            stream now.

        Raises:
            SequenceFinishedError: the sequence already finished (the message names
                its ``finish_reason``; semantics.md 5).
            TypeError: ``token_ids`` is not an int or an iterable of ints
                (``token_ids[0] must be an int, got str``); ``texts`` is a
                bare ``str`` or holds a non-``str``;
                ``grammar_terminated_at`` is not an int.
            ValueError: an id is negative or >= 2**32 (``token_ids[0]=-1 is
                not a valid token id``); ``texts`` has a different length
                than the run or is missing while required; a piece contains
                a lone surrogate; ``grammar_terminated_at`` is negative or
                not inside the run.
        """
    def abort(self) -> StepResult:
        """Finishes a running sequence with ``"abort"`` and flushes everything
        kept (hold-back included). On a finished sequence a no-op with empty
        deltas: the first finish stands (semantics.md 5)."""
    @property
    def finished(self) -> bool:
        """Whether the sequence has finished."""
    @property
    def finish_reason(self) -> _FinishReason | None:
        """Why it finished (semantics.md 1, 3); ``None`` while running."""
    @property
    def stop_reason(self) -> str | int | None:
        """As ``StepResult.stop_reason``."""
    @property
    def matched(self) -> str | int | None:
        """As ``StepResult.matched``."""
    @property
    def num_tokens(self) -> int:
        """Output tokens kept."""
    @property
    def text_len(self) -> int:
        """Output text kept, in code points."""
    @property
    def token_ids(self) -> list[int]:
        """Output token ids kept, a new list on every read."""
    @property
    def text(self) -> str:
        """Output text kept; after a stop-string or stop-regex finish, cut at
        the match's ``truncate_to``."""
    @property
    def emitted_len(self) -> int:
        """Code points released through ``text_delta`` so far; ``text_len -
        emitted_len`` is the hold-back."""
    @property
    def channel(self) -> Literal["reasoning", "content"] | None:
        """The channel output is in now (at finish, the one it finished in);
        ``None`` without reasoning channels."""
    @property
    def in_tool_call(self) -> bool:
        """Whether a tool-call span is open now, after the last step (at
        finish: whether the sequence finished inside one, the call cut);
        ``False`` without tool-call markers (semantics.md 11.10)."""
    @property
    def reasoning(self) -> str:
        """The reasoning kept (markers excluded unless kept)."""
    @property
    def content(self) -> str:
        """The content kept; ``text`` without reasoning channels."""
    @property
    def reasoning_token_ids(self) -> list[int]:
        """The reasoning ids kept, a new list on every read."""
    @property
    def content_token_ids(self) -> list[int]:
        """The content ids kept, a new list on every read."""
    @property
    def reasoning_tokens(self) -> int:
        """Tokens after the start marker while the block is open (the
        thinking budget's count); 0 otherwise."""
    @property
    def forced_token_id(self) -> int | None:
        """As ``StepResult.forced_token_id``, for the state now."""

@final
class BatchStepResult:
    """Per-row results of one ``FinishBatch.step``, row i for ``slots[i]``
    (semantics.md 3.1). Immutable.

    Each list attribute is a new list on every read, with one entry per row,
    named in the plural of the ``StepResult`` field it lists: ``finished`` ->
    ``finished_flags``, ``finish_reason`` -> ``finish_reasons``,
    ``stop_reason`` -> ``stop_reasons``, ``matched`` -> ``matches``,
    ``num_tokens`` -> ``token_counts``, ``text_len`` -> ``text_lengths``,
    ``text_delta`` -> ``text_deltas``, ``token_ids_delta`` ->
    ``token_ids_deltas``. ``text_deltas[i]`` is the very ``str`` passed in as row i's piece when the
    delta is exactly that piece (the common case); otherwise a new ``str``.
    """

    def __len__(self) -> int:
        """Number of rows (``len(slots)`` of the step)."""
    def __getitem__(self, index: int, /) -> StepResult:
        """Row ``index`` (negative counts from the end) as a ``StepResult``.

        Raises:
            IndexError: ``index`` is outside ``[-len, len)``.
            TypeError: ``index`` is not an int.
        """
    @property
    def slots(self) -> list[int]:
        """The slot of each row, as passed to ``step``."""
    @property
    def finished_flags(self) -> list[bool]:
        """Per row: whether the sequence finished in this step."""
    @property
    def finished_slots(self) -> list[int]:
        """The slots that finished in this step, in row order."""
    @property
    def finish_reasons(self) -> list[_FinishReason | None]:
        """Per row: the ``finish_reason``, ``None`` for rows still running."""
    @property
    def stop_reasons(self) -> list[str | int | None]:
        """Per row: the ``stop_reason`` (see ``StepResult.stop_reason``)."""
    @property
    def matches(self) -> list[str | int | None]:
        """Per row: what matched (see ``StepResult.matched``)."""
    @property
    def token_counts(self) -> list[int]:
        """Per row: output tokens kept after the step."""
    @property
    def text_lengths(self) -> list[int]:
        """Per row: output text kept after the step, in code points."""
    @property
    def text_deltas(self) -> list[str]:
        """Per row: the text released by this step."""
    @property
    def token_ids_deltas(self) -> list[list[int]]:
        """Per row: the output token ids released by this step."""
    @property
    def released_counts(self) -> list[int]:
        """Per row: ``len(token_ids_deltas[i])``, without building the
        lists."""
    @property
    def channels(self) -> list[Literal["reasoning", "content"] | None]:
        """Per row: ``StepResult.channel``."""
    @property
    def forced_token_ids(self) -> list[int | None]:
        """Per row: ``StepResult.forced_token_id``."""
    @property
    def forced_tokens(self) -> list[tuple[int, int]]:
        """``(slot, token id)`` for each row whose next token is forced (its
        thinking budget spent), in row order: the rows of
        ``forced_token_ids`` that are not ``None``, without an entry for the
        others, so reading it every step costs only the forced rows."""
    @property
    def reasoning_deltas(self) -> list[str | None]:
        """Per row: ``StepResult.reasoning_delta``; ``None`` for rows without
        reasoning channels."""
    @property
    def content_deltas(self) -> list[str | None]:
        """Per row: ``StepResult.content_delta``; ``None`` for rows without
        reasoning channels."""
    @property
    def reasoning_token_ids_deltas(self) -> list[list[int] | None]:
        """Per row: ``StepResult.reasoning_token_ids_delta``; ``None`` for rows
        without reasoning channels."""
    @property
    def content_token_ids_deltas(self) -> list[list[int] | None]:
        """Per row: ``StepResult.content_token_ids_delta``; ``None`` for rows
        without reasoning channels."""

@final
class FinishBatch:
    """Many finish trackers addressed by slot (an int in ``[0, max_slots)``),
    advanced by one ``step`` call per engine step (semantics.md 3.1): the hot
    path engines use. Each slot behaves exactly as its own
    ``FinishTracker``. Not thread-safe (see the module docstring).

    A slot holds its sequence, finished or not, until ``remove``.
    """

    def __new__(cls, max_slots: int, vocabulary: Vocabulary | None = None) -> FinishBatch:
        """An empty batch.

        Args:
            max_slots: number of slots, 0 to 2**24 (16,777,216).
            vocabulary: with a ``Vocabulary``, ``step`` takes token ids only
                (``texts`` must be None) and stopline decodes them
                (semantics.md 10).

        Raises:
            ValueError: ``max_slots`` is negative or above 2**24.
            TypeError: ``max_slots`` is not an int.
            OverflowError: ``max_slots`` is 2**63 or more.
        """
    def add(
        self,
        slot: int,
        params: StopParams,
        prompt_token_ids: Iterable[int] | None = None,
        skip_special_tokens: bool = True,
        spaces_between_special_tokens: bool = True,
    ) -> None:
        """Starts a new sequence in an empty slot.

        ``prompt_token_ids`` primes the slot's decoder and is read for a
        reasoning block the prompt opened (semantics.md 11 rule 1); the two
        flags (as vLLM's sampling parameters) apply only to a batch built with
        a ``vocabulary``, and so does a prompt unless both reasoning markers
        have ids.

        Raises:
            ValueError: ``slot`` is outside ``[0, max_slots)`` or already in
                use (``slot 0: is already in use; remove() it first``); a
                prompt id outside the vocabulary.
            TypeError: ``slot`` is not an int; ``params`` is not a
                ``StopParams``; a flag is not a bool (or NumPy's bool).
            OverflowError: ``slot`` is 2**63 or more.

        Every error once ``slot`` is read has it in ``slot`` (the engine
        refuses that one request); the slot stays empty.
        """
    def snapshot(self, slot: int) -> bytes:
        """A slot's snapshot, as ``FinishTracker.snapshot`` (with the slot's
        decoder in a batch with a vocabulary).

        Raises:
            ValueError: ``slot`` is outside ``[0, max_slots)`` or empty; the
                snapshot would be over ``max_snapshot_bytes``.
            TypeError: ``slot`` is not an int.
            OverflowError: ``slot`` is 2**63 or more.
        """
    def restore(self, slot: int, params: StopParams, data: bytes) -> None:
        """Starts an empty slot in the state ``data`` holds: a snapshot of a
        slot of any batch, or of a tracker, taken with ``params`` (and this
        batch's vocabulary, if it has one). Nothing changes on error.

        Raises:
            ValueError: ``slot`` is outside ``[0, max_slots)`` or in use; the
                bytes are refused as by ``FinishTracker.restore`` (with
                ``slot`` set on the exception).
            TypeError: ``slot`` is not an int; ``params`` is not a
                ``StopParams``; ``data`` is not bytes.
            OverflowError: ``slot`` is 2**63 or more.
        """
    def remove(self, slot: int) -> None:
        """Frees a slot, finished or not; its state is dropped.

        Raises:
            ValueError: ``slot`` is outside ``[0, max_slots)`` or empty.
            TypeError: ``slot`` is not an int.
            OverflowError: ``slot`` is 2**63 or more.
        """
    def abort(self, slot: int) -> StepResult:
        """Aborts the sequence in a slot, as ``FinishTracker.abort``: returns
        what it flushed; a no-op with empty deltas once finished. The slot
        stays occupied until ``remove``.

        Raises:
            ValueError: ``slot`` is outside ``[0, max_slots)`` or empty.
            TypeError: ``slot`` is not an int.
            OverflowError: ``slot`` is 2**63 or more.
        """
    def result(self, slot: int) -> StepResult:
        """The current state of a slot, with empty deltas.

        Raises:
            ValueError: ``slot`` is outside ``[0, max_slots)`` or empty.
            TypeError: ``slot`` is not an int.
            OverflowError: ``slot`` is 2**63 or more.
        """
    def text(self, slot: int) -> str:
        """Output text kept in a slot (as ``FinishTracker.text``).

        Raises:
            ValueError: ``slot`` is outside ``[0, max_slots)`` or empty.
            TypeError: ``slot`` is not an int.
            OverflowError: ``slot`` is 2**63 or more.
        """
    def in_tool_call(self, slot: int) -> bool:
        """Whether a slot's sequence is inside a tool-call span now (as
        ``FinishTracker.in_tool_call``).

        Raises:
            ValueError: ``slot`` is outside ``[0, max_slots)`` or empty.
            TypeError: ``slot`` is not an int.
            OverflowError: ``slot`` is 2**63 or more.
        """
    def token_ids(self, slot: int) -> list[int]:
        """Output token ids kept in a slot, a new list.

        Raises:
            ValueError: ``slot`` is outside ``[0, max_slots)`` or empty.
            TypeError: ``slot`` is not an int.
            OverflowError: ``slot`` is 2**63 or more.
        """
    @property
    def max_slots(self) -> int:
        """Number of slots, as given when built."""
    def __len__(self) -> int:
        """Number of occupied slots (running or finished, not yet removed)."""
    def __contains__(self, slot: object, /) -> bool:
        """Whether ``slot`` holds a sequence; never raises (anything that is
        not an in-range int is simply not there)."""
    def __repr__(self) -> str:
        """``FinishBatch(max_slots=8, occupied=2, finished=1)``: ``occupied``
        is ``len(batch)``, ``finished`` the occupied slots whose sequence
        finished and awaits ``remove``. O(max_slots)."""
    def step(
        self,
        slots: Iterable[int],
        token_ids: Iterable[int],
        run_lengths: Iterable[int] | None = None,
        texts: Sequence[str] | None = None,
        grammar_terminated_at: Iterable[int] | None = None,
    ) -> BatchStepResult:
        """Advances every listed slot by one engine step; each slot advances
        exactly as ``FinishTracker.update`` would (semantics.md 3.1).

        Fast path (what the hot loop should pass): ``slots`` a ``list`` of
        ints or a ``range``, ``token_ids`` a ``list`` of ints or, fastest, a
        1-D contiguous buffer of native-order integers (a NumPy int32/int64
        array as the sampler returns it), ``texts`` a plain ``list`` of
        ``str``. Other iterables and int-likes go through a slower general
        path with the same results.

        Every argument is checked before any slot changes, so after an error
        the whole batch is as it was.

        Args:
            slots: the occupied, running slots to advance, each at most once.
            token_ids: the flat output token ids of all rows, in the order of
                ``slots``; each in ``[0, 2**32)``.
            run_lengths: tokens per slot (speculative accept runs; 0 allowed),
                one entry per slot, adding up to ``len(token_ids)``; ``None``
                for exactly one token per slot.
            texts: the flat text pieces, one per token, aligned with
                ``token_ids``. Required when a listed slot has stop strings or
                regexes.
            grammar_terminated_at: one entry per slot, an index into that
                slot's run of the token that ended its grammar, or -1 for
                none; ``None`` for none at all.

        Returns:
            A ``BatchStepResult``, row i for ``slots[i]``.

        Raises:
            ValueError: naming the field, element and slot: a slot outside
                ``[0, max_slots)``, empty or listed twice; a ``range`` longer
                than ``max_slots``; ``run_lengths`` / ``grammar_terminated_at``
                not one entry per slot; runs that do not add up to
                ``len(token_ids)``; ``texts`` not one piece per token or
                missing while required; a negative run length; an id that is
                negative or >= 2**32; a ``grammar_terminated_at`` below -1 or
                past its run; an int of 2**63 or more; a lone surrogate.
            TypeError: an argument that is not an iterable of ints
                (``slots[0] must be an int, got str``); ``texts`` a bare
                ``str`` or holding a non-``str``.
            SequenceFinishedError: a listed slot already finished (remove it first).

            Each is stopline's subclass of the built-in (``StoplineValueError``,
            ``StoplineTypeError``) whose ``slot`` names the slot at fault when
            one is (its element, its run, its state), ``field`` the argument
            or flat element (``"token_ids[3]"``) and ``kind`` the problem: the
            step changed nothing, so an engine aborts that request alone and
            steps the rest (docs/errors.md).
        """

@final
class Vocabulary:
    """A tokenizer's decoding table built from a Hugging Face tokenizer.json
    (ByteLevel, ByteFallback/SentencePiece, Metaspace, WordPiece decoders)."""

    @staticmethod
    def from_file(path: str | os.PathLike[str]) -> Vocabulary:
        """Reads a tokenizer.json of at most 128 MiB (a regular file).

        Raises:
            OSError: the file cannot be read.
            ValueError: (``kind="tokenizer"``) the file is not what stopline
                reads; ``field`` is ``"tokenizer."`` and the JSON path of the
                value at fault (``"tokenizer.added_tokens[3].content"``),
                which the message names too, or ``"tokenizer"`` for the file
                as a whole. No message quotes a value whole.
            MemoryError: a table cannot be allocated.
        """
    @staticmethod
    def from_str(json: str) -> Vocabulary:
        """Builds the vocabulary from the text of a tokenizer.json; raises as
        ``from_file`` (``field="json"`` for a lone surrogate)."""
    @property
    def vocab_size(self) -> int: ...
    @property
    def decoder(self) -> str: ...
    def memory_usage(self) -> int: ...
    def decode(
        self,
        token_ids: Iterable[int] | int,
        skip_special_tokens: bool = True,
        spaces_between_special_tokens: bool = True,
    ) -> str: ...
    def decoder_for(
        self,
        prompt_token_ids: Iterable[int] | None = None,
        skip_special_tokens: bool = True,
        spaces_between_special_tokens: bool = True,
    ) -> IncrementalDecoder: ...

@final
class IncrementalDecoder:
    """One sequence's streaming decoder: ids in, completed text out."""

    def step(self, token_ids: Iterable[int] | int) -> str: ...
    def flush(self) -> str: ...
    @property
    def pending(self) -> bytes: ...

def _bad_words_table(
    words: Iterable[Iterable[int]], vocab_size: int, max_words: int, max_word_tokens: int
) -> tuple[bytearray, bytearray, bytearray, bytearray, int]:
    """Internal to ``stopline.logits``: validates a request's ``bad_words``
    and lays them out, with the GIL released for all but reading the lists.

    Args:
        words: token-id sequences (lists, tuples, 1-D integer buffers such as
            NumPy arrays, any iterable of ints; not ``str``/``bytes``).
        vocab_size: ids must lie in ``[0, vocab_size)``.
        max_words / max_word_tokens: the caps (``stopline.logits.LIMITS``).

    Returns:
        ``(single, prefix, prefix_len, last, width)``: native-order int32
        arrays as ``bytearray``: the distinct one-token words (first
        occurrence first); the distinct multi-token words' prefixes,
        ``[multi, width]`` row-major padded with -1; their prefix lengths;
        their last tokens. ``width`` is the longest prefix (0 without
        multi-token words).

    Raises:
        TypeError: a non-int id (``bool`` included) or a word that is no
            sequence, naming ``bad_words``.
        ValueError: an id outside ``[0, vocab_size)``, an empty word, a word
            of more than ``max_word_tokens`` tokens, more than ``max_words``
            words; the first bad word in order is reported. What the
            caller's objects raise propagates unchanged.
    """
