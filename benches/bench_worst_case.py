"""The documented worst-case request: how long it compiles and how much of it
holds the GIL.

The request brings ``stop``, ``stop_regex`` and (with torch) ``bad_words`` at
their caps (``stopline.LIMITS`` and ``stopline.logits.LIMITS``), each list new
to the process-wide caches (a run-unique suffix), so every repetition pays the
full compile. Printed per part and for the whole request:

* ``miss``: the compile of a list the cache has not seen (median and max);
* ``hit``: the same call once cached, which is the part that runs with the
  GIL held (reading the Python objects, hashing, the cache lookup); the build
  itself runs after ``py.detach``;
* ``other thread``: iterations a pure-Python thread made *during* the miss
  with the switch interval raised to 1000 s, so that it runs only when the
  compiling thread gives the GIL up: zero would mean the GIL was held
  throughout.

``bad_words`` (1,024 words of 64 tokens) are read, validated and laid out by
the core (``_core._bad_words_table``: the lists are read with the GIL held,
the rest runs after ``py.detach``); ``LogitsConstraints.set`` then copies the
tables with torch. Both are reported (``set`` needs torch). They have no
cache, so ``hit`` is the same call again; their ``other thread`` probe makes
20 calls back to back (one GIL-free window of ~1 ms often ends before the
waiting thread wakes up).

    python benches/bench_worst_case.py [--reps 7] [--json]
"""

from __future__ import annotations

import argparse
import itertools
import json
import random
import statistics
import sys
import threading
import time
from typing import Any, Callable

import stopline

LIM = stopline.LIMITS
_run = itertools.count()


def worst_stops(tag: str) -> list[str]:
    """1,024 strings of 64 bytes (64 KiB, both caps) over ~190 distinct
    bytes: too large for the dense DFA, the crate's NFA with a full table."""
    rng = random.Random(7)
    alphabet = [chr(c) for c in range(0x21, 0x7F)] + [chr(c) for c in range(0xA1, 0x180)]
    out = []
    per = LIM["max_stop_bytes"] // LIM["max_stop_strings"]
    for i in range(LIM["max_stop_strings"]):
        s = f"{tag}{i}"
        while len((s + "x").encode()) <= per:
            c = rng.choice(alphabet)
            if len((s + c).encode()) <= per:
                s += c
            else:
                s += "x"
        out.append(s)
    return out


def worst_regexes(tag: str, family: str, n: int = LIM["max_stop_regexes"]) -> list[str]:
    """64 patterns (the count cap) of families that compile under the DFA
    limits; "any" is the slowest list found by a search over families,
    repetition counts and list lengths (docs/errors.md, "Caps")."""
    forms = {
        "window": r"(?s).{0,8}END",
        "counted": r"[ab]*a[ab]{8}x",
        "any": r"(?s).*a.{4}b",
        "any6": r"(?s).*a.{6}b",
        "chat": r"\n\n+(User|Human|Assistant|System):",
    }
    return [forms[family] + f"{tag}_{i}" for i in range(n)]


def worst_bad_words(vocab: int) -> list[list[int]]:
    """1,024 distinct words of 64 random ids (``stopline.logits.LIMITS``)."""
    rng = random.Random(3)
    n, k = 1024, 64
    return [[rng.randrange(vocab) for _ in range(k)] for _ in range(n)]


def other_thread_progress(f: Callable[[], Any]) -> int:
    """Iterations a pure-Python thread makes while ``f`` runs, when it can
    only get the GIL from ``f`` giving it up."""
    counter = [0]
    go, stop = threading.Event(), threading.Event()

    def spin() -> None:
        go.wait()
        while not stop.is_set():
            counter[0] += 1
            if counter[0] % 256 == 0:
                time.sleep(0)  # hands the GIL back (the compiler may want it)

    old = sys.getswitchinterval()
    sys.setswitchinterval(1000.0)
    t = threading.Thread(target=spin)
    t.start()
    try:
        go.set()
        before = counter[0]
        f()
        during = counter[0] - before
    finally:
        stop.set()
        sys.setswitchinterval(old)
        t.join()
    return during


def measure(name: str, make: Callable[[str], Callable[[], Any]], reps: int, probe_calls: int = 1) -> dict[str, Any]:
    """``probe_calls``: calls back to back in the other-thread probe (a GIL-free
    window of about a millisecond is often over before the waiting thread
    wakes up on a loaded machine)."""
    misses, progress = [], []
    for _ in range(reps):
        call = make(f"~{next(_run)}~")
        t0 = time.perf_counter()
        call()
        misses.append(time.perf_counter() - t0)
        probe = make(f"~{next(_run)}~")
        progress.append(other_thread_progress(lambda p=probe: [p() for _ in range(probe_calls)]))
    call = make(f"~{next(_run)}~")
    call()
    hits = []
    for _ in range(reps):
        t0 = time.perf_counter()
        call()
        hits.append(time.perf_counter() - t0)
    return {
        "part": name,
        "miss_ms_median": round(statistics.median(misses) * 1e3, 2),
        "miss_ms_max": round(max(misses) * 1e3, 2),
        "hit_ms_median": round(statistics.median(hits) * 1e3, 3),
        "other_thread_iterations_min": min(progress),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    SP = stopline.StopParams

    def stop_part(tag: str) -> Callable[[], Any]:
        stops = worst_stops(tag)
        return lambda: SP(stop=stops)

    def regex_part(fam: str, n: int = LIM["max_stop_regexes"]) -> Callable[[str], Callable[[], Any]]:
        def make(tag: str) -> Callable[[], Any]:
            regexes = worst_regexes(tag, fam, n)
            return lambda: SP(stop_regex=regexes)
        return make

    def request(tag: str) -> Callable[[], Any]:
        stops, regexes = worst_stops(tag), worst_regexes(tag, "any")
        return lambda: SP(stop=stops, stop_regex=regexes)

    rows = [measure("stop (1,024 x 64 B)", stop_part, args.reps)]
    for fam in ("window", "counted", "any", "chat"):
        rows.append(measure(f"stop_regex (64 x {fam})", regex_part(fam), args.reps))
    rows.append(measure("stop_regex (32 x any6: the slowest found)", regex_part("any6", 32), args.reps))
    rows.append(measure("request: stop + stop_regex (any)", request, args.reps))
    vocab = 151_936
    words = worst_bad_words(vocab)
    rows.append(measure("bad_words (1,024 x 64 tokens, core)",
                        lambda tag: (lambda: stopline._core._bad_words_table(words, vocab, 1024, 64)), args.reps, 20))
    try:
        from stopline.logits import LogitsConstraints
    except ImportError:
        LogitsConstraints = None  # type: ignore[assignment,misc]
    if LogitsConstraints is not None:
        lc = LogitsConstraints(256, vocab)
        rows.append(measure("bad_words (LogitsConstraints.set)",
                            lambda tag: (lambda: lc.set(0, bad_words=words)), args.reps, 20))
    if args.json:
        print(json.dumps(rows, indent=1))
        return
    print(f"{'part':<52} {'miss median':>12} {'miss max':>9} {'hit':>8} {'other thread':>13}")
    for r in rows:
        print(f"{r['part']:<52} {r['miss_ms_median']:>10} ms {r['miss_ms_max']:>6} ms "
              f"{r['hit_ms_median']:>5} ms {r['other_thread_iterations_min']:>13}")


if __name__ == "__main__":
    main()
