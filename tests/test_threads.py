"""stopline objects used from several threads at once.

* ``StopStrings`` is immutable and shared: 8 threads matching through one
  compiled list get exactly the single-threaded answers.
* ``FinishTracker``, ``FinishBatch`` and ``StopMatcher`` hold per-sequence
  state and are not meant to be shared. Used from two threads at once, the
  second call is refused with PyO3's borrow error (``RuntimeError: Already
  borrowed`` / ``Already mutably borrowed``) and the state stays exactly
  what the calls that succeeded made it: never torn or corrupted.

A call only overlaps another one when the first lets go of the interpreter
in the middle, which in CPython with the GIL happens when stopline iterates a
caller's Python iterable (a generator of token ids). The tests use such
generators to make the overlap certain instead of hoping for it. Every loop
is bounded by a count; nothing asserts a timing.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

import stopline

THREADS = 8
BORROW_MESSAGES = ("Already borrowed", "Already mutably borrowed")
WAIT_S = 30.0  # an upper bound for an Event that should fire at once


def run_threads(n: int, target: Callable[[int], Any]) -> list[Any]:
    """Runs target(i) in n threads started together; returns the results in
    thread order and re-raises the first exception."""
    barrier = threading.Barrier(n)
    results: list[Any] = [None] * n
    errors: list[BaseException] = []

    def body(i: int) -> None:
        try:
            barrier.wait(WAIT_S)
            results[i] = target(i)
        except BaseException as e:  # noqa: BLE001 - re-raised below
            errors.append(e)

    threads = [threading.Thread(target=body, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
        assert not t.is_alive(), "a worker thread did not finish"
    if errors:
        raise errors[0]
    return results


# ------------------------------------------------------ shared StopStrings --

STOPS = ["\n\nUser:", "<|im_end|>", "END", "ab", "b", "日本", "🙂!"]


def workload(seed: int) -> tuple[list[str], str]:
    rng = random.Random(seed)
    alphabet = ["a", "b", "c", "E", "N", "D", "\n", "User:", "日", "本", "🙂", "!", "<|im_", "end|>", " "]
    pieces = ["".join(rng.choice(alphabet) for _ in range(rng.randint(0, 4))) for _ in range(400)]
    return pieces, "".join(pieces)


def match_everything(stops: stopline.StopStrings, seed: int) -> list[Any]:
    """Every query the shared object answers, on one seeded workload."""
    pieces, text = workload(seed)
    out: list[Any] = []
    for include in (False, True):
        m = stops.matcher(include_in_output=include)
        for p in pieces:
            hit = m.feed(p)
            out.append((None if hit is None else (hit.index, hit.start, hit.end, hit.truncate_to), m.holdback))
    for new in range(0, len(text), 7):
        out.append(stops.check(text, new))
        out.append(stopline.check_stop_strings(text, new, STOPS, True))
    return out


def test_shared_stop_strings_from_8_threads_equal_single_threaded() -> None:
    shared = stopline.StopStrings(STOPS)
    expected = [match_everything(shared, seed) for seed in range(THREADS)]
    for _ in range(3):
        got = run_threads(THREADS, lambda i: match_everything(shared, i))
        assert got == expected


def test_compiling_the_same_list_from_8_threads() -> None:
    # The process-wide cache hands every thread an automaton that answers alike.
    # 1,024 strings (the cap), over 2 KiB: compiled with the GIL released.
    stops = [f"stop-{i}-{'x' * (i % 7)}" for i in range(1024)]
    text = "zz stop-1023-" + "x" * (1023 % 7) + " tail"
    results = run_threads(THREADS, lambda i: stopline.StopStrings(stops).matcher().feed(text))
    assert {(r.index, r.start, r.end) for r in results} == {(1023, 3, 3 + len(stops[1023]))}


# ------------------------------------------- per-sequence objects, overlap --


class Paused:
    """An iterable of token ids that stops after its first id until released,
    with the interpreter free for other threads (Event.wait drops the GIL)."""

    def __init__(self, ids: list[int]) -> None:
        self.ids = ids
        self.inside = threading.Event()
        self.release = threading.Event()

    def __iter__(self) -> Iterator[int]:
        for k, i in enumerate(self.ids):
            yield i
            if k == 0:
                self.inside.set()
                assert self.release.wait(WAIT_S)


def overlap(first: Callable[[Paused], Any], ids: list[int], second: Callable[[], Any]) -> tuple[Any, BaseException | None]:
    """Starts first(paused) in a thread, runs second() while the first is
    inside stopline, then lets the first finish. Returns the first call's
    result and the second call's exception (None if it succeeded)."""
    paused = Paused(ids)
    box: dict[str, Any] = {}

    def worker() -> None:
        try:
            box["result"] = first(paused)
        except BaseException as e:  # noqa: BLE001 - reported below
            box["error"] = e

    t = threading.Thread(target=worker)
    t.start()
    try:
        assert paused.inside.wait(WAIT_S), "the first call never started iterating"
        try:
            second()
            err: BaseException | None = None
        except BaseException as e:  # noqa: BLE001 - returned
            err = e
    finally:
        paused.release.set()
        t.join(WAIT_S)
    assert not t.is_alive()
    if "error" in box:
        raise box["error"]
    return box["result"], err


def assert_borrow_error(err: BaseException | None) -> None:
    assert isinstance(err, RuntimeError), repr(err)
    assert str(err) in BORROW_MESSAGES, repr(err)


def test_tracker_used_by_two_threads_at_once_raises_and_keeps_state() -> None:
    t = stopline.FinishTracker(stopline.StopParams(max_tokens=100))
    result, err = overlap(lambda ids: t.update(ids), [1, 2, 3], lambda: t.update([9]))
    assert_borrow_error(err)
    assert result.token_ids_delta == [1, 2, 3]
    assert (t.token_ids, t.num_tokens, t.finished) == ([1, 2, 3], 3, False)
    # Reads while another thread is inside update() are refused too.
    _, err = overlap(lambda ids: t.update(ids), [4, 5], lambda: t.token_ids)
    assert_borrow_error(err)
    assert t.token_ids == [1, 2, 3, 4, 5]


def test_batch_used_by_two_threads_at_once_raises_and_keeps_state() -> None:
    b = stopline.FinishBatch(4)
    for slot in range(4):
        b.add(slot, stopline.StopParams(max_tokens=100, stop=["END"]))
    first = lambda ids: b.step([0, 1], ids, [2, 1], ["a", "b", "c"])  # noqa: E731
    for second in (
        lambda: b.step([2], [7], None, ["x"]),
        lambda: b.add(3, stopline.StopParams()),
        lambda: b.remove(2),
        lambda: b.abort(2),
        lambda: b.result(2),
        lambda: len(b),
    ):
        before = [b.token_ids(s) for s in range(4)]
        res, err = overlap(first, [10, 11, 12], second)
        assert_borrow_error(err)
        assert res.slots == [0, 1]
        after = [b.token_ids(s) for s in range(4)]
        assert after == [before[0] + [10, 11], before[1] + [12], before[2], before[3]]
    assert len(b) == 4 and b.text(0) == "ab" * 6 and b.text(1) == "c" * 6


def test_matcher_hammered_from_8_threads_counts_every_feed_once() -> None:
    # feed() takes a str, so it never runs caller code mid-call and cannot be
    # paused like the calls above; under the GIL the calls then serialise.
    # Either way each feed is accepted or refused whole, never half-counted.
    m = stopline.StopStrings(["xyz"]).matcher()
    m.feed("xy")
    fed = run_threads(THREADS, lambda i: _hammer_matcher(m, 500))
    total = sum(ok for ok, _ in fed)
    refused = sum(no for _, no in fed)
    assert total + refused == THREADS * 500
    assert m.chars_fed == 2 + total


def _hammer_matcher(m: stopline.StopMatcher, count: int) -> tuple[int, int]:
    ok = refused = 0
    for _ in range(count):
        try:
            m.feed("q")
            ok += 1
        except RuntimeError as e:
            assert str(e) in BORROW_MESSAGES
            refused += 1
    return ok, refused


@pytest.mark.parametrize("kind", ["tracker", "batch"])
def test_hammered_from_8_threads_never_corrupts(kind: str) -> None:
    """8 threads step one object a bounded number of times, with iterables
    that let the interpreter switch threads mid-call. Every call either
    succeeds or is refused with the borrow error; the final state is exactly
    the sum of the successful calls."""
    per_thread = 300
    params = stopline.StopParams(max_tokens=10**9, stop=["never-matches"])
    tracker = stopline.FinishTracker(params)
    batch = stopline.FinishBatch(1)
    batch.add(0, params)

    def ids_gen(i: int) -> Iterator[int]:
        yield i
        time.sleep(0)  # drops the GIL: another thread runs while this call is inside stopline
        yield i

    def body(i: int) -> tuple[int, int, str]:
        ok = refused = 0
        streamed = ""
        for _ in range(per_thread):
            try:
                if kind == "tracker":
                    r = tracker.update(ids_gen(i), ["a", "b"])
                    streamed += r.text_delta
                else:
                    r = batch.step([0], ids_gen(i), [2], ["a", "b"])
                    streamed += r.text_deltas[0]
                ok += 1
            except RuntimeError as e:
                assert str(e) in BORROW_MESSAGES, repr(e)
                refused += 1
        return ok, refused, streamed

    results = run_threads(THREADS, body)
    accepted = sum(r[0] for r in results)
    assert accepted + sum(r[1] for r in results) == THREADS * per_thread
    assert accepted > 0
    ids = tracker.token_ids if kind == "tracker" else batch.token_ids(0)
    text = tracker.text if kind == "tracker" else batch.text(0)
    assert len(ids) == 2 * accepted
    assert text == "ab" * accepted
    # Each accepted call appended its thread's id twice, adjacently: no
    # interleaving inside a call.
    assert all(ids[k] == ids[k + 1] for k in range(0, len(ids), 2))
    for i, r in enumerate(results):
        assert ids.count(i) == 2 * r[0]
    # What was streamed (all but the hold-back, none here) is the text itself.
    assert sum(len(r[2]) for r in results) == len(text)


# --------------------------------- caller's lists changed mid-call --------

# Variant k of the tracker's lists: k + 1 ids and as many pieces, so equal
# lengths mean one variant. The batch's variants all have one entry per slot.
# Ints above 256 and strs of two or more chars are new objects on each
# build, freed when replaced: a list item read without the list held still
# would be read after it is freed.
BIG = 1_000_000
SLOTS = 4


def tracker_variant(k: int) -> tuple[list[int], list[str]]:
    return [BIG + k for _ in range(k + 1)], [chr(ord("a") + k) * 2 for _ in range(k + 1)]


def batch_variant(k: int) -> tuple[list[int], list[str]]:
    return [BIG + k for _ in range(SLOTS)], [chr(ord("p") + k) * 3 for _ in range(SLOTS)]


def test_lists_replaced_by_another_thread_while_read() -> None:
    """Two threads replace the items of the lists that six others pass to
    ``FinishTracker.update`` and ``FinishBatch.step`` (each reader with its own
    tracker and batch). Without the GIL this is a real race: the batch step
    reads one-piece-per-slot texts from a private copy, the other paths hold
    the list's critical section. Every call sees each list whole at one
    moment: its deltas are one variant of each list, or it is refused because
    the two lists' lengths disagree; never a mix, a crash or a freed item."""
    tids, ttexts = tracker_variant(0)
    bids, btexts = batch_variant(0)
    readers_done = threading.Event()
    calls = 3000

    def mutate(i: int) -> int:
        rng = random.Random(i)
        n = 0
        while not readers_done.is_set() and n < 10**6:
            if i == 0:
                tids[:], ttexts[:] = tracker_variant(rng.randrange(4))[0], tracker_variant(rng.randrange(4))[1]
            else:
                bids[:], btexts[:] = batch_variant(rng.randrange(4))
                bids[:] = batch_variant(rng.randrange(4))[0]
            n += 1
        return n

    def read(i: int) -> tuple[int, int]:
        tracker = stopline.FinishTracker(stopline.StopParams(max_tokens=10**9))
        batch = stopline.FinishBatch(SLOTS)
        for s in range(SLOTS):
            batch.add(s, stopline.StopParams(max_tokens=10**9))
        ok = refused = 0
        for c in range(calls):
            if c % 3 == 0:
                try:
                    r = tracker.update(tids, ttexts)
                except ValueError as e:
                    assert "pass one piece per token" in str(e), repr(e)
                    refused += 1
                    continue
                k = len(r.token_ids_delta) - 1
                ids, texts = tracker_variant(k)
                assert (r.token_ids_delta, r.text_delta) == (ids, "".join(texts))
            else:
                runs = None if c % 3 == 1 else [1] * SLOTS
                b = batch.step(list(range(SLOTS)), bids, runs, btexts)
                assert len({d[0] for d in b.token_ids_deltas}) == 1, b.token_ids_deltas
                assert len(set(b.text_deltas)) == 1, b.text_deltas
                assert b.token_ids_deltas[0][0] - BIG in range(4), b.token_ids_deltas
                assert b.text_deltas[0] in {batch_variant(k)[1][0] for k in range(4)}, b.text_deltas
            ok += 1
        return ok, refused

    def body(i: int) -> Any:
        if i < 2:
            return mutate(i)
        try:
            return read(i)
        finally:
            if i == THREADS - 1:
                readers_done.set()

    results = run_threads(THREADS, body)
    for ok, refused in results[2:]:
        assert ok + refused == calls
        assert ok >= 2 * calls // 3  # the batch calls, whose lengths never disagree
