"""Replay recorded decode traces through :class:`stopline.FinishBatch`.

A trace file is JSONL, one request per line (format: ``docs/traces.md``).
All requests of one file share one ``FinishBatch`` and are advanced one
engine step at a time, as an engine's scheduler does: every running request
contributes its next recorded run (one token, or a speculative accept run) to
the step, finished requests leave the batch and free their slot, and waiting
requests are admitted into free slots at their ``arrival`` step. A request
whose recorded steps run out before any finish condition fires is aborted
(``finish_reason="abort"``), as an engine aborts a request whose client left.

This module imports only the standard library and stopline itself, so
``stopline replay`` works right after ``pip install stopline``.
"""

from __future__ import annotations

import gzip
import json
import os
import re
import sys
import time
import zlib
from collections import Counter, deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from importlib import resources
from typing import Any, cast

import stopline
from stopline._caps import shown
from stopline._table import Column, counted, fit_width, format_table, wrap

__all__ = [
    "PARAM_FIELDS",
    "Outcome",
    "Request",
    "TraceFileError",
    "bundled_traces",
    "cause_of",
    "check_against_reference",
    "load_trace",
    "replay_requests",
]

# StopParams keyword arguments a trace's "params" object may carry.
PARAM_FIELDS = (
    "max_tokens", "min_tokens", "prompt_len", "max_model_len", "eos_token_ids",
    "ignore_eos", "stop_token_ids", "stop", "include_stop_str_in_output",
    "vocab_size", "repetition",
    # reasoning channels (docs/semantics.md section 11); a trace carries no
    # prompt ids, so a prompt that opens the block is stated with
    # reasoning_starts_in="reasoning"
    "reasoning_start", "reasoning_start_id", "reasoning_end", "reasoning_end_id",
    "reasoning_end_ids", "reasoning_starts_in", "keep_reasoning_markers",
    "max_reasoning_tokens", "stop_scopes", "stop_token_id_scopes", "token_aligned",
    # tool-call spans (section 11.10): pairs as two-element lists
    "tool_call_markers", "tool_call_marker_ids",
)
_BOOL_FIELDS = ("ignore_eos", "include_stop_str_in_output", "keep_reasoning_markers", "token_aligned")
_REQUEST_KEYS = {"id", "params", "steps", "arrival", "source"}
_STEP_KEYS = {"ids", "texts", "grammar_terminated_at"}
_MAX_ID = 2**32 - 1


class TraceFileError(Exception):
    """A trace file that cannot be read at all (missing, a directory, no permission)."""


@dataclass(slots=True)
class Step:
    ids: list[int]
    texts: list[str] | None
    grammar_terminated_at: int | None  # index into ids


@dataclass
class Request:
    """One request of a trace: its stop parameters and its recorded runs."""

    id: str
    file: str
    line: int  # 1-based line number in its file
    params: dict[str, Any]
    steps: list[Step]
    arrival: int = 0  # engine step at which it may join the batch
    source: dict[str, Any] = field(default_factory=dict)


@dataclass
class Outcome:
    """What one request reported once it left the batch.

    ``num_tokens`` counts output tokens kept; ``text`` is the kept text
    (``len(text)`` is in code points); ``deltas`` holds one
    ``(engine_step, text_delta, token_ids_delta)`` per update that reported
    anything, the final abort included.

    With reasoning channels (docs/semantics.md section 11) ``channel`` is the
    one the request finished in and ``reasoning`` / ``content`` (and their
    token ids) the joined per-channel deltas; without them ``channel`` is
    ``None``, ``reasoning`` empty and ``content`` the kept text.
    """

    id: str
    finish_reason: str | None
    stop_reason: str | int | None
    matched: str | int | None
    num_tokens: int
    text_len: int
    text: str
    token_ids: list[int]
    deltas: list[tuple[int, str, list[int]]]
    steps_replayed: int
    cause: str
    # The engine step of the request's first update (deltas count from it).
    first_step: int = 0
    channel: str | None = None
    reasoning: str = ""
    content: str = ""
    reasoning_token_ids: list[int] = field(default_factory=list)
    content_token_ids: list[int] = field(default_factory=list)

    def streamed_text(self) -> str:
        return "".join(d[1] for d in self.deltas)

    def streamed_ids(self) -> list[int]:
        return [t for d in self.deltas for t in d[2]]

    def as_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "finish_reason": self.finish_reason,
            "stop_reason": self.stop_reason,
            "matched": self.matched,
            "cause": self.cause,
            "num_tokens": self.num_tokens,
            "text_len": self.text_len,
            "text": self.text,
            "token_ids": self.token_ids,
            "steps_replayed": self.steps_replayed,
            "channel": self.channel,
            "reasoning": self.reasoning,
            "content": self.content,
            "reasoning_token_ids": self.reasoning_token_ids,
            "content_token_ids": self.content_token_ids,
        }


def bundled_traces() -> list[str]:
    """Paths of the traces shipped inside the package (gzip-compressed JSONL),
    sorted by name."""
    root = resources.files("stopline") / "traces"
    return sorted(str(p) for p in root.iterdir() if p.name.endswith((".jsonl", ".jsonl.gz")))


def _open_trace(name: str) -> Any:
    """A trace file opened for reading bytes; ``.gz`` files are decompressed
    as they are read (the bundled traces are stored that way: 1.2 MB of JSONL
    is 155 kB)."""
    return gzip.open(name, "rb") if name.endswith(".gz") else open(name, "rb")


# The argument that names standard input, and the name it goes by in messages.
_STDIN = "-"
_STDIN_NAME = "<stdin>"
_GZIP_MAGIC = b"\x1f\x8b"


def _open_stdin() -> Any:
    """Standard input for reading bytes, decompressed when it starts with
    gzip's magic bytes: there is no name to go by, and no JSONL line can
    start with byte 0x1f."""
    stream: Any = getattr(sys.stdin, "buffer", sys.stdin)
    if stream is None:  # the interpreter was started without one
        raise OSError("no standard input")
    head = b""
    while len(head) < 2:  # a pipe may hand out one byte at a time
        piece = stream.read(2 - len(head))
        if not piece:
            break
        head += piece
    rest = _Lines(stream, head=head)
    if head != _GZIP_MAGIC:
        return rest
    # GzipFile reads it front to back; the seek that typeshed also asks for is used only to seek back.
    return gzip.GzipFile(fileobj=cast(Any, rest), mode="rb")


# What bytes.strip() strips: a line of only these is blank, as before.
_BLANK_RUN = re.compile(rb"[ \t\n\r\x0b\x0c]*")
_READ_SIZE = 1 << 20


class _Lines:
    """A binary stream read 1 MiB at a time and handed out as lines.

    ``readline(limit)`` and ``read(n)`` behave as a binary file's.
    ``skip_blank`` passes over whole whitespace-only lines with a few C-level
    scans per megabyte instead of one bytes object per line: a file of
    millions of blank lines costs little more than its decompression. At
    most ``limit`` bytes are taken from the stream, so nothing past a
    trace's cap is read (or decompressed).
    """

    def __init__(self, stream: Any, limit: int = sys.maxsize, head: bytes = b"") -> None:
        self._stream = stream
        self._left = limit - len(head)  # bytes the stream may still give
        self._buf = head
        self._pos = 0
        self._ended = False  # a terminal's stdin would wait again after an end

    def __enter__(self) -> _Lines:
        return self

    def __exit__(self, *exc: object) -> None:
        pass  # the stream is its opener's to close (standard input is never closed here)

    def _more(self) -> bool:
        """Appends the next piece of the stream to the unread bytes; False at
        the end of the stream or of ``limit``."""
        want = min(_READ_SIZE, self._left)
        data = b"" if self._ended or want <= 0 else self._stream.read(want)
        if not data:
            self._ended = True
            return False
        self._left -= len(data)
        self._buf = self._buf[self._pos:] + data
        self._pos = 0
        return True

    def read(self, n: int = -1) -> bytes:
        """Up to ``n`` bytes (all that is left for a negative ``n``)."""
        while (n < 0 or len(self._buf) - self._pos < n) and self._more():
            pass
        end = len(self._buf) if n < 0 else self._pos + n
        data = self._buf[self._pos:end]
        self._pos += len(data)
        return data

    def readline(self, limit: int) -> bytes:
        """Up to ``limit`` bytes, through the first newline."""
        searched = 0  # bytes of this line already searched for a newline
        while True:
            start = self._pos
            end = min(len(self._buf), start + limit)
            newline = self._buf.find(b"\n", start + searched, end)
            if newline >= 0:
                end = newline + 1
                break
            if end - start >= limit or not self._more():
                break
            searched = end - start
        line = self._buf[start:end]
        self._pos = end
        if end > _READ_SIZE:  # a long line: drop it from the buffer, so that the caller's `del` frees it
            self._buf, self._pos = self._buf[end:], 0
        return line

    def skip_blank(self, budget: int, max_line: int) -> tuple[int, int]:
        """Passes over whole lines that hold only whitespace, at most
        ``budget`` bytes in all and each at most ``max_line`` bytes before
        its newline; returns how many lines and bytes it passed over. It
        stops at the start of a line that holds anything else, that would
        cross a bound, or that has no newline yet: ``readline`` takes that
        line, so the bounds are reported as before."""
        lines = done = 0
        while done < budget:
            start = self._pos
            end = min(len(self._buf), start + budget - done, start + max_line + 1)
            blank = _BLANK_RUN.match(self._buf, start, end)
            stop = blank.end() if blank else start
            newline = self._buf.rfind(b"\n", start, stop)
            if newline >= 0:
                lines += self._buf.count(b"\n", start, newline + 1)
                done += newline + 1 - start
                self._pos = newline + 1
            elif stop < len(self._buf) or not self._more():
                break
        return lines, done


# ------------------------------------------------------------------ loading


def _int(v: Any, what: str, lo: int = 0, hi: int | None = None) -> int:
    if isinstance(v, bool) or not isinstance(v, int):
        raise ValueError(f"{what} must be an integer, got {shown(v)}")
    if v < lo or (hi is not None and v > hi):
        raise ValueError(f"{what}={shown(v)} is outside [{lo}, {hi if hi is not None else 'inf'}]")
    return v


def _unknown(what: str, names: set[str]) -> ValueError:
    """The error for keys a trace may not carry: a few of them, each shown bounded, and how many."""
    few = sorted(names, key=lambda k: (len(k), k))[:4]
    more = f" ({len(names)} in all)" if len(names) > len(few) else ""
    return ValueError(f"{what} {', '.join(shown(k) for k in few)}{more}")


def _check_object(obj: Any, keys: set[str], what: str) -> None:
    if not isinstance(obj, dict):
        raise ValueError(f"{what} must be a JSON object, got {type(obj).__name__}")
    unknown = set(obj) - keys
    if unknown:
        raise _unknown(f"{what} has unknown keys", unknown)


def _parse_step(obj: Any, k: int) -> Step:
    where = f"steps[{k}]"
    _check_object(obj, _STEP_KEYS, where)
    ids = obj.get("ids")
    if not isinstance(ids, list):
        raise ValueError(f"{where}.ids must be a list of token ids")
    ids = [_int(t, f"{where}.ids[{i}]", 0, _MAX_ID) for i, t in enumerate(ids)]
    texts = obj.get("texts")
    if texts is not None:
        if not isinstance(texts, list) or not all(isinstance(t, str) for t in texts):
            raise ValueError(f"{where}.texts must be a list of strings")
        if len(texts) != len(ids):
            raise ValueError(f"{where} has {len(ids)} ids but {len(texts)} texts")
        for i, t in enumerate(texts):
            try:
                t.encode("utf-8")
            except UnicodeEncodeError:
                raise ValueError(f"{where}.texts[{i}] is not valid Unicode (lone surrogate)") from None
    g = obj.get("grammar_terminated_at")
    if g is not None:
        g = _int(g, f"{where}.grammar_terminated_at", 0, max(len(ids) - 1, 0))
        if not ids:
            raise ValueError(f"{where}.grammar_terminated_at given for an empty run")
    return Step(ids, texts, g)


def _parse_request(obj: Any, file: str, line: int, impl: Any) -> Request:
    _check_object(obj, _REQUEST_KEYS, "the request")
    rid = obj.get("id")
    if not isinstance(rid, str) or not rid:
        raise ValueError("'id' must be a non-empty string")
    params = obj.get("params", {})
    if not isinstance(params, dict):
        raise ValueError("'params' must be an object")
    bad = set(params) - set(PARAM_FIELDS)
    if bad:
        raise _unknown("params has unknown fields", bad)
    for key in _BOOL_FIELDS:  # StopParams' own error for these names no field
        if key in params and not isinstance(params[key], bool):
            raise ValueError(f"invalid params: {key} must be true or false, got {shown(params[key])}")
    try:
        impl.StopParams(**params)  # validate now, so one bad request cannot stop a batch step
    except (TypeError, ValueError, OverflowError) as e:
        # The error names the field; the message adds the params key's value.
        key = str(getattr(e, "field", None) or "").split("[")[0].split(".")[0]
        value = f" ({key}={shown(params[key])})" if key in params else ""
        raise ValueError(f"invalid params: {e}{value}") from None
    steps = obj.get("steps")
    if not isinstance(steps, list):
        raise ValueError("'steps' must be a list")
    source = obj.get("source", {})
    if not isinstance(source, dict):
        raise ValueError("'source' must be an object")
    return Request(
        id=rid,
        file=file,
        line=line,
        params=params,
        steps=[_parse_step(s, k) for k, s in enumerate(steps)],
        arrival=_int(obj.get("arrival", 0), "arrival"),
        source=source,
    )


def load_trace(path: str | os.PathLike[str], impl: Any = stopline) -> tuple[list[Request], list[str]]:
    """Read one JSONL trace file, line by line.

    A name ending in ``.gz`` is read as gzip-compressed JSONL, decompressed
    as it is read.

    Returns ``(requests, problems)``: each malformed line (bad JSON, invalid
    UTF-8, a missing or ill-typed field, params that ``StopParams`` rejects,
    a duplicate id, an id that is not valid Unicode, a step without texts
    when the params have stop strings or regexes, a line over
    ``MAX_LINE_BYTES``) becomes one ``"FILE:LINE: message"`` entry of
    ``problems`` (values shown bounded, so a message stays short whatever
    the line holds) and is left out; the other lines still load. Blank and
    whitespace-only lines are skipped, in bulk (no object per line). The
    file is never read whole: at most one line of ``MAX_LINE_BYTES`` (and
    1 MiB read ahead) is in memory at a time, and past ``MAX_TRACE_BYTES``
    (decompressed), ``MAX_REQUESTS`` requests or ``MAX_PROBLEMS`` problems
    the rest of the file is left unread and that is one more problem.

    Raises :class:`TraceFileError` when the file cannot be read at all
    (missing, unreadable, not gzip, corrupt or truncated gzip data).
    """
    name = os.fspath(path)
    try:
        with _open_trace(name) as stream:
            return _read_trace(stream, name, impl)
    except (OSError, EOFError, zlib.error) as e:
        # The operator's own path, bounded by the OS (PATH_MAX): shown whole, as the per-line problems show it.
        raise _unreadable(f"trace file {name!r}", e) from None


def _load_stdin(impl: Any = stopline) -> tuple[list[Request], list[str]]:
    """:func:`load_trace` for standard input (``stopline replay -``), whose
    problems are named ``<stdin>:LINE``. It is read as gzip-compressed JSONL
    when it starts with gzip's magic bytes (``1f 8b``), as plain JSONL
    otherwise; files go by their name alone.

    Raises :class:`TraceFileError` as :func:`load_trace` does.
    """
    try:
        with _open_stdin() as stream:
            return _read_trace(stream, _STDIN_NAME, impl)
    except (OSError, EOFError, zlib.error) as e:
        raise _unreadable("standard input", e) from None


def _unreadable(what: str, e: BaseException) -> TraceFileError:
    """The one-line error for a trace that cannot be read at all."""
    why = getattr(e, "strerror", None) or str(e)
    if isinstance(e, (EOFError, zlib.error, gzip.BadGzipFile)):  # a truncated .gz; corrupt data
        why = f"not a complete, valid gzip file ({shown(why)})"
    return TraceFileError(f"cannot read {what}: {why}")


def _read_trace(stream: Any, name: str, impl: Any) -> tuple[list[Request], list[str]]:
    """The lines of one trace (an open binary stream), as :func:`load_trace` returns them."""
    requests: list[Request] = []
    problems: list[str] = []
    seen: dict[str, int] = {}
    total = 0  # decompressed bytes read

    def refuse(lineno: int, why: str) -> None:
        problems.append(f"{name}:{lineno}: not read: {why}")

    f = _Lines(stream, MAX_TRACE_BYTES + 1)
    lineno = 0
    while True:
        bline = f.readline(min(MAX_LINE_BYTES, MAX_TRACE_BYTES - total) + 1)
        if not bline:
            break
        lineno += 1
        total += len(bline)
        if total > MAX_TRACE_BYTES:
            refuse(lineno, f"a trace file holds at most {MAX_TRACE_BYTES} bytes (decompressed)")
            break
        if len(bline) > MAX_LINE_BYTES and not bline.endswith(b"\n"):
            while bline and not bline.endswith(b"\n") and total <= MAX_TRACE_BYTES:
                bline = f.readline(1 << 20)  # skip to the end of the line, counting it
                total += len(bline)
            problems.append(f"{name}:{lineno}: line longer than {MAX_LINE_BYTES} bytes")
            if total > MAX_TRACE_BYTES:
                refuse(lineno, f"a trace file holds at most {MAX_TRACE_BYTES} bytes (decompressed)")
                break
        elif bline.strip():
            try:
                obj = json.loads(bline.decode("utf-8"))
                del bline  # the parsed line, not its text too
                req = _parse_request(obj, name, lineno, impl)
                del obj
                _check_loaded(req, impl)
                if req.id in seen:
                    raise ValueError(f"duplicate id {shown(req.id)} (first on line {seen[req.id]})")
            except UnicodeDecodeError as e:
                problems.append(f"{name}:{lineno}: not valid UTF-8 ({e.reason} at byte {e.start})")
            except json.JSONDecodeError as e:
                # json's messages such as "Unterminated string starting at" expect the position next
                msg = e.msg.removesuffix(" at")
                problems.append(f"{name}:{lineno}: not valid JSON: {msg} at column {e.colno}")
            except (ValueError, RecursionError) as e:
                problems.append(f"{name}:{lineno}: {e}")
            except MemoryError:
                refuse(lineno, "out of memory parsing this line; the requests read so far are kept")
                break
            else:
                seen[req.id] = lineno
                requests.append(req)
        else:  # a blank line: the blank lines after it go in bulk
            lines, size = f.skip_blank(MAX_TRACE_BYTES - total, MAX_LINE_BYTES)
            lineno += lines
            total += size
        if len(requests) >= MAX_REQUESTS or len(problems) >= MAX_PROBLEMS:
            if f.read(1):
                refuse(lineno + 1, f"a trace file holds at most {MAX_REQUESTS} requests and "
                                   f"{MAX_PROBLEMS} malformed lines")
            break
    return requests, problems


#: Bounds on one trace file (untrusted input, like the requests it records):
#: a line (one request) and the whole file, in decompressed bytes, and the
#: number of requests and of malformed lines reported.
MAX_LINE_BYTES = 8 << 20
MAX_TRACE_BYTES = 32 << 20
MAX_REQUESTS = 100_000
MAX_PROBLEMS = 1_000


def _check_loaded(req: Request, impl: Any) -> None:
    """What a parsed request must also satisfy to replay without an error:
    an id that can be printed, and texts on every step when stop strings or
    regexes (matched on text) are set."""
    try:
        req.id.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError(f"'id' {shown(req.id)} is not valid Unicode (lone surrogate)") from None
    if req.params.get("stop") or req.params.get("reasoning_start") or req.params.get("reasoning_end") \
            or req.params.get("tool_call_markers"):
        for k, st in enumerate(req.steps):
            if st.texts is None and st.ids:
                raise ValueError(f"steps[{k}] has no texts, but the params have stop strings, text "
                                 "reasoning markers or text tool-call markers, which are matched on text")


# ------------------------------------------------------------------ replaying


def cause_of(params: dict[str, Any], finish_reason: str | None, stop_reason: Any, matched: Any) -> str:
    """Which check finished a request; finer than finish_reason.

    ``"stop"`` splits into ``stop_string``, ``stop_token``, ``eos`` and
    ``grammar`` (EOS and grammar termination both report ``stop_reason``
    None; an id in ``eos_token_ids`` without ``ignore_eos`` can only have
    finished by the EOS check, since it comes first).
    """
    if finish_reason != "stop":
        return finish_reason or "running"
    if isinstance(stop_reason, str):
        return "stop_string"
    if stop_reason is not None:
        return "stop_token"
    eos = () if params.get("ignore_eos") else params.get("eos_token_ids") or ()
    return "eos" if matched in eos else "grammar"


@dataclass
class ReplayStats:
    engine_steps: int = 0
    tokens_fed: int = 0
    finish_seconds: float = 0.0  # time spent inside FinishBatch calls


def replay_requests(
    requests: Sequence[Request],
    *,
    max_slots: int | None = None,
    on_step: Callable[[int, Request, Any], None] | None = None,
    vocabulary: stopline.Vocabulary | None = None,
) -> tuple[dict[str, Outcome], ReplayStats]:
    """Run the requests through one :class:`stopline.FinishBatch`.

    With ``vocabulary`` the batch decodes the recorded ids itself (ids only,
    docs/semantics.md section 10) and the recorded texts are not passed.

    ``max_slots`` (default: all requests at once) bounds the batch; waiting
    requests take free slots in order of ``arrival`` then file order.
    ``on_step(engine_step, request, step_result)`` is called for every update,
    aborts included. Returns the outcomes by request id and step counts.
    """
    n_slots = len(requests) or 1
    if max_slots:
        n_slots = min(n_slots, max_slots)
    batch = stopline.FinishBatch(n_slots, vocabulary=vocabulary)
    params = {r.id: stopline.StopParams(**r.params) for r in requests}
    waiting = deque(sorted(requests, key=lambda r: r.arrival))  # sort is stable: file order
    free = list(range(n_slots - 1, -1, -1))
    # slot -> [request, next step index, deltas, first engine step, channel pieces]; the pieces
    # (reasoning text, content text, reasoning ids, content ids) are None without reasoning
    active: dict[int, list[Any]] = {}
    outcomes: dict[str, Outcome] = {}
    stats = ReplayStats()
    clock = time.perf_counter
    step_no = 0

    def leave(slot: int, result: Any) -> None:
        req, used, deltas, first, chan = active.pop(slot)
        text, ids = batch.text(slot), batch.token_ids(slot)
        batch.remove(slot)
        free.append(slot)
        outcomes[req.id] = Outcome(
            req.id, result.finish_reason, result.stop_reason, result.matched,
            result.num_tokens, result.text_len, text, list(ids), deltas, used,
            cause_of(req.params, result.finish_reason, result.stop_reason, result.matched), first,
            *(_no_channels(text, ids) if chan is None else
              (result.channel, "".join(chan[0]), "".join(chan[1]), chan[2], chan[3])),
        )

    def report(slot: int, res: Any) -> None:
        entry = active[slot]
        if res.text_delta or res.token_ids_delta:
            entry[2].append((step_no, res.text_delta, list(res.token_ids_delta)))
            chan = entry[4]
            if chan is not None:
                chan[0].append(res.reasoning_delta)
                chan[1].append(res.content_delta)
                chan[2].extend(res.reasoning_token_ids_delta)
                chan[3].extend(res.content_token_ids_delta)
        if on_step:
            on_step(step_no, entry[0], res)
        if res.finished:
            leave(slot, res)

    while waiting or active:
        while free and waiting and waiting[0].arrival <= step_no:
            req = waiting.popleft()
            slot = free.pop()
            batch.add(slot, params[req.id])
            chan: tuple[list[str], list[str], list[int], list[int]] | None = (
                ([], [], [], []) if params[req.id].reasoning is not None else None)
            active[slot] = [req, 0, [], step_no, chan]
        if not active:
            step_no = waiting[0].arrival  # idle engine: jump to the next arrival
            continue
        # Requests whose recording ended unfinished are aborted before the step.
        for slot in [s for s, a in active.items() if a[1] == len(a[0].steps)]:
            t0 = clock()
            res = batch.abort(slot)
            stats.finish_seconds += clock() - t0
            report(slot, res)
        if not active:
            continue
        slots: list[int] = []
        ids: list[int] = []
        runs: list[int] = []
        texts: list[str] = []
        grammar: list[int] = []
        with_text = with_grammar = False
        for slot, (req, k, *_) in active.items():
            st = req.steps[k]
            slots.append(slot)
            ids.extend(st.ids)
            runs.append(len(st.ids))
            if st.texts is None:
                texts.extend("" for _ in st.ids)  # no text: empty pieces, as texts=None
            else:
                texts.extend(st.texts)
                with_text = True
            if st.grammar_terminated_at is None:
                grammar.append(-1)
            else:
                grammar.append(st.grammar_terminated_at)
                with_grammar = True
        t0 = clock()
        results = batch.step(
            slots, ids, runs, texts if with_text and vocabulary is None else None,
            grammar if with_grammar else None,
        )
        stats.finish_seconds += clock() - t0
        stats.engine_steps += 1
        stats.tokens_fed += len(ids)
        for i, slot in enumerate(slots):
            active[slot][1] += 1
            report(slot, results[i])
        step_no += 1
    return outcomes, stats


def _reference_outcome(req: Request, ref: Any) -> Outcome:
    """One request through the pure-Python reference tracker, step by step."""
    tr = ref.FinishTracker(ref.StopParams(**req.params))
    deltas: list[tuple[int, str, list[int]]] = []
    used = 0
    r = None
    for k, st in enumerate(req.steps):
        r = tr.update(st.ids, st.texts, st.grammar_terminated_at)
        used += 1
        if r.text_delta or r.token_ids_delta:
            deltas.append((k, r.text_delta, list(r.token_ids_delta)))
        if r.finished:
            break
    if r is None or not r.finished:
        r = tr.abort()
        if r.text_delta or r.token_ids_delta:
            deltas.append((len(req.steps), r.text_delta, list(r.token_ids_delta)))
    return Outcome(
        req.id, r.finish_reason, r.stop_reason, r.matched, r.num_tokens, r.text_len,
        tr.text, list(tr.token_ids), deltas, used,
        cause_of(req.params, r.finish_reason, r.stop_reason, r.matched), 0,
        tr.channel, tr.reasoning, tr.content, list(tr.reasoning_token_ids), list(tr.content_token_ids),
    )


def _no_channels(text: str, ids: Sequence[int]) -> tuple[None, str, str, list[int], list[int]]:
    """The channel fields of an outcome without reasoning channels: all content."""
    return None, "", text, [], list(ids)


def check_against_reference(req: Request, got: Outcome, ref: Any = None, early_text: bool = False) -> list[str]:
    """Differences between ``got`` (from the batch) and the reference.

    Compares finish_reason, stop_reason, matched, kept tokens, kept text and
    the streamed deltas (per update, and joined == final text / tokens on
    both sides). An empty list means they agree. ``early_text`` (``got``
    decoded the ids itself): per update, the reference's streamed text and
    tokens so far need only be a prefix of ``got``'s, since stopline
    releases the complete characters of a token that ends in an incomplete
    one, where the recorded DecodeStream pieces wait (docs/semantics.md 10.2).
    """
    if ref is None:
        from stopline import baseline as ref
    want = _reference_outcome(req, ref)
    diffs = []
    for name in ("finish_reason", "stop_reason", "matched", "num_tokens", "text_len",
                 "token_ids", "text", "steps_replayed", "channel", "reasoning", "content",
                 "reasoning_token_ids", "content_token_ids"):
        a, b = getattr(got, name), getattr(want, name)
        # 3 == 3.0 or True == 1 would hide a type mix-up in stop_reason/matched
        if a != b or type(a) is not type(b):
            diffs.append(f"{name}: stopline {_short(a)} != reference {_short(b)}")
    for who, o in (("stopline", got), ("reference", want)):
        if o.streamed_text() != o.text:
            diffs.append(f"{who}: joined text deltas {_short(o.streamed_text())} != final text {_short(o.text)}")
        if o.streamed_ids() != o.token_ids:
            diffs.append(f"{who}: joined token deltas != kept tokens")
        if len(o.text) != o.text_len or len(o.token_ids) != o.num_tokens:
            diffs.append(f"{who}: text_len/num_tokens disagree with the kept text/tokens")
    a_stream = [(d[1], d[2]) for d in got.deltas]
    b_stream = [(d[1], d[2]) for d in want.deltas]
    if early_text:
        late = _first_late_step([(d[0] - got.first_step, *d[1:]) for d in got.deltas], want.deltas)
        if late is not None:
            diffs.append(f"streamed text at update {late}: the reference is ahead of stopline")
    elif a_stream != b_stream:
        k = next((i for i, (x, y) in enumerate(zip(a_stream, b_stream)) if x != y),
                 min(len(a_stream), len(b_stream)))
        diffs.append(f"streamed deltas differ from update {k}: stopline "
                     f"{_short(a_stream[k:k + 1])} vs reference {_short(b_stream[k:k + 1])}")
    return diffs


def _first_late_step(got: list[tuple[int, str, list[int]]], want: list[tuple[int, str, list[int]]]) -> int | None:
    """The first update after which ``want``'s joined text or tokens are not
    a prefix of ``got``'s, or None."""
    text_a = text_b = ""
    ids_a: list[int] = []
    ids_b: list[int] = []
    ga, gb = iter(got), iter(want)
    da, db = next(ga, None), next(gb, None)
    for step in sorted({d[0] for d in got} | {d[0] for d in want}):
        while da is not None and da[0] == step:
            text_a, ids_a, da = text_a + da[1], ids_a + list(da[2]), next(ga, None)
        while db is not None and db[0] == step:
            text_b, ids_b, db = text_b + db[1], ids_b + list(db[2]), next(gb, None)
        if not text_a.startswith(text_b) or ids_a[:len(ids_b)] != ids_b:
            return step
    return None


# ------------------------------------------------------------------ printing


def _short(v: Any, width: int = 60) -> str:
    s = repr(v)
    return s if len(s) <= width else s[: width - 3] + "..."


# The table: `cause` stands for finish_reason (stop_string, stop_token, eos and
# grammar all report "stop"), which keeps a row within 80 columns. Requests of
# one prompt share an id prefix and the start of their text, and differ at the
# ends: a cut id keeps both ends, the text its end (where each was cut).
_COLUMNS = (
    Column("id", shrink=2, min_width=18, keep="ends"),
    Column("cause"),
    Column("stop_reason", shrink=0, min_width=10),
    Column("tokens", right=True),
    Column("text", shrink=1, min_width=16, keep="tail"),
)
_TEXT_SHOWN = 72  # code points of a kept text's end put in its cell, before the column cuts it
_LEGEND = ('cause: the finish check that fired; stop_string, stop_token, eos and grammar report '
           'finish_reason "stop", the others their own name. text: the end of the kept text.')


# The channel table, for the requests of a file with reasoning markers: the
# channel each finished in and the ends of its reasoning and content (markers
# left out unless keep_reasoning_markers).
_CHANNEL_COLUMNS = (
    Column("id", shrink=2, min_width=18, keep="ends"),
    Column("channel"),
    Column("r.tok", right=True),
    Column("c.tok", right=True),
    Column("reasoning", shrink=0, min_width=12, keep="tail"),
    Column("content", shrink=1, min_width=12, keep="tail"),
)
_CHANNEL_LEGEND = ("channel: where the request finished; r.tok / c.tok: reasoning / content tokens kept; "
                   "reasoning, content: the end of each (markers left out unless kept).")


def _tail(text: str) -> str:
    end = text[-_TEXT_SHOWN:]
    return ("..." if len(end) < len(text) else "") + repr(end)


def _channel_rows(reqs: Iterable[Request], outcomes: dict[str, Outcome], prefix: str = "") -> list[list[str]]:
    return [
        [o.id[len(prefix):], o.channel or "", str(len(o.reasoning_token_ids)), str(len(o.content_token_ids)),
         _tail(o.reasoning), _tail(o.content)]
        for o in (outcomes[r.id] for r in reqs)
        if o.channel is not None  # None: no reasoning markers
    ]


def _id_prefix(reqs: Sequence[Request]) -> str:
    """The start all ids of a file share (shown once, in the title), when it
    is long enough to be worth the room; each id keeps at least one character."""
    if len(reqs) < 2:
        return ""
    prefix = os.path.commonprefix([r.id for r in reqs])[: min(len(r.id) for r in reqs) - 1]
    prefix = prefix[: max(prefix.rfind(c) for c in "-_/.: ") + 1]  # whole words only
    return prefix if len(prefix) >= 4 else ""


def _rows(reqs: Iterable[Request], outcomes: dict[str, Outcome], prefix: str = "") -> list[list[str]]:
    rows = []
    for r in reqs:
        o = outcomes[r.id]
        rows.append([
            o.id[len(prefix):], o.cause, "" if o.stop_reason is None else _short(o.stop_reason, 24),
            str(o.num_tokens), _tail(o.text),
        ])
    return rows


def _print_table(title: str, rows: list[list[str]], out: Any, width: int,
                 columns: Sequence[Column] = _COLUMNS) -> None:
    for line in wrap(title, width, "    "):
        print(line, file=out)
    for line in format_table(columns, rows, width):
        print(line, file=out)


def _display_name(path: str, bundled: bool) -> str:
    return f"{os.path.basename(path)} (bundled)" if bundled else path


def _emit(out: Any, obj: dict[str, Any]) -> None:
    """One JSON line, flushed so a reader sees it at once."""
    out.write(json.dumps(obj, ensure_ascii=False) + "\n")
    out.flush()


def run(
    paths: Sequence[str],
    *,
    as_json: bool = False,
    stream: bool = False,
    check: bool = False,
    max_slots: int | None = None,
    tokenizer: str | None = None,
    out: Any = None,
    err: Any = None,
) -> int:
    """The ``stopline replay`` command. Returns the exit status.

    ``paths``: trace files, ``"-"`` for standard input (named ``<stdin>``
    in the output); none for the bundled traces. ``tokenizer``: a ``tokenizer.json`` whose decoder turns the recorded ids
    into text inside stopline (the recorded texts are then not passed).

    0: every request replayed (and, with ``check``, agreed with the
    reference); 1: malformed lines or differences; 2: a trace file could
    not be read (nothing is replayed then).

    Tables fit the terminal (80 columns when ``out`` is not one). With
    ``as_json`` the output is JSON lines, written as they are known: with
    ``stream`` one ``{"type": "delta"}`` per update that reported
    anything, then per file one ``{"type": "request"}`` per request and one
    ``{"type": "file"}``, and last one ``{"type": "summary"}``.
    """
    out = out or sys.stdout
    err = err or sys.stderr
    width = fit_width() if out is sys.stdout else 80
    ref: Any = None
    if check:
        from stopline import baseline as ref
    bundled = not paths
    vocabulary = None
    if tokenizer is not None:
        try:
            vocabulary = stopline.Vocabulary.from_file(tokenizer)
        except (OSError, ValueError) as e:
            print(f"stopline replay: error: --tokenizer {tokenizer}: {e}", file=err)
            return 2
    files = list(paths) or bundled_traces()
    if not files:
        print("stopline replay: no trace files given and none bundled", file=err)
        return 2
    loaded = []
    for p in files:
        try:
            loaded.append((_STDIN_NAME, *_load_stdin()) if p == _STDIN else (p, *load_trace(p)))
        except TraceFileError as e:
            print(f"stopline replay: error: {e}", file=err)
            return 2

    status = 0
    reasons: Counter[str] = Counter()
    causes: Counter[str] = Counter()
    total_steps = total_tokens = n_requests = n_diffs = 0
    finish_seconds = 0.0
    t_start = time.perf_counter()
    if not as_json:
        for line in wrap(_LEGEND, width):
            print(line, file=out)
    for path, reqs, problems in loaded:
        name = _display_name(path, bundled)
        for msg in problems:
            print(f"stopline replay: malformed: {msg}", file=err)
            status = 1

        def show(step_no: int, req: Request, r: Any, path: str = path) -> None:
            if not (r.text_delta or r.token_ids_delta or r.finished):
                return
            if as_json:
                _emit(out, {"type": "delta", "file": path, "id": req.id, "step": step_no,
                            "text": r.text_delta, "token_ids": list(r.token_ids_delta),
                            "finish_reason": r.finish_reason, "channel": r.channel,
                            "reasoning": r.reasoning_delta, "content": r.content_delta})
                return
            end = f"  [{r.finish_reason}]" if r.finished else ""
            split = "" if r.channel is None else f"  reasoning {r.reasoning_delta!r} content {r.content_delta!r}"
            print(f"  step {step_no:4d}  {req.id}  +{len(r.token_ids_delta)} tok  "
                  f"{r.text_delta!r}{split}{end}", file=out)

        if stream and not as_json:
            print(f"== {name} (streamed deltas)", file=out)
        try:
            outcomes, stats = replay_requests(reqs, max_slots=max_slots,
                                              on_step=show if stream else None,
                                              vocabulary=vocabulary)
        except ValueError as e:  # only ids outside --tokenizer's vocabulary get here
            print(f"stopline replay: error: {path}: {e} (was this trace recorded with {tokenizer}?)", file=err)
            return 2
        total_steps += stats.engine_steps
        total_tokens += stats.tokens_fed
        finish_seconds += stats.finish_seconds
        n_requests += len(reqs)
        for r in reqs:
            o = outcomes[r.id]
            reasons[str(o.finish_reason)] += 1
            causes[o.cause] += 1
            diffs: list[str] = []
            if ref is not None:
                diffs = check_against_reference(r, o, ref, early_text=vocabulary is not None)
                if diffs:
                    n_diffs += 1
                    status = 1
                    for msg in diffs:
                        print(f"stopline replay: DIFF {r.file}:{r.line} {r.id}: {msg}", file=err)
            if as_json:
                item = {"type": "request", "file": path, **o.as_dict(), "line": r.line}
                if ref is not None:
                    item["check"] = diffs
                _emit(out, item)
        if as_json:
            _emit(out, {"type": "file", "file": path, "requests": len(reqs), "malformed": problems,
                        "engine_steps": stats.engine_steps, "tokens": stats.tokens_fed})
        elif not reqs:
            print(file=out)
            what = "malformed lines only" if problems else "no request (empty or blank lines only)"
            for line in wrap(f"{name}: holds {what}", width, "    "):
                print(line, file=out)
        else:
            print(file=out)
            prefix = _id_prefix(reqs)
            shared = f"; every id starts with {_short(prefix, 40)}, left out below" if prefix else ""
            _print_table(f"{name}: {counted(len(reqs), 'request')}, {counted(stats.engine_steps, 'engine step')}{shared}",
                         _rows(reqs, outcomes, prefix), out, width)
            channel_rows = _channel_rows(reqs, outcomes, prefix)
            if channel_rows:
                print(file=out)
                _print_table(f"{name}: reasoning channels of {counted(len(channel_rows), 'request')}. {_CHANNEL_LEGEND}",
                             channel_rows, out, width, _CHANNEL_COLUMNS)
    wall = time.perf_counter() - t_start
    finish_reasons = dict(sorted(reasons.items()))
    by_cause = dict(sorted(causes.items()))
    malformed = sum(len(p) for _, _, p in loaded)
    summary: dict[str, Any] = {
        "type": "summary",
        "files": len(loaded),
        "requests": n_requests,
        "finish_reasons": finish_reasons,
        "causes": by_cause,
        "engine_steps": total_steps,
        "tokens": total_tokens,
        "malformed_lines": malformed,
        "wall_seconds": round(wall, 4),
        "finish_batch_seconds": round(finish_seconds, 4),
    }
    if ref is not None:
        summary["check"] = {"reference": "stopline.baseline", "requests_differing": n_diffs}
    if as_json:
        _emit(out, summary)
        return status
    lines = [
        f"{counted(n_requests, 'request')} in {counted(len(loaded), 'file')}; finish_reason: "
        + (", ".join(f"{k} {v}" for k, v in finish_reasons.items()) or "-"),
        "by cause: " + (", ".join(f"{k} {v}" for k, v in by_cause.items()) or "-"),
        f"{counted(total_steps, 'engine step')}, {counted(total_tokens, 'token')}; wall time {wall * 1e3:.1f} ms "
        f"({finish_seconds * 1e3:.1f} ms inside FinishBatch)",
    ]
    if malformed:
        lines.append(f"{counted(malformed, 'malformed line')} skipped (see stderr)")
    if ref is not None:
        verdict = "all agree" if n_diffs == 0 else f"{counted(n_diffs, 'request')} DIFFER"
        lines.append(f"--check against stopline.baseline: {verdict}")
    print(file=out)
    for i, text in enumerate(lines):
        for line in wrap(text, width - (0 if i == 0 else 2), "  "):
            print(line if i == 0 else "  " + line, file=out)
    return status
