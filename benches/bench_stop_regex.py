"""Per-step cost of stop regexes: stopline's incremental matcher (one DFA for
the whole list, stepped over the new text only) vs what engines do today,
SGLang's ``re.search(regex, tail_str)`` for every pattern over a tail window
of the output (``Req._check_str_based_finish``; the window is the longest
pattern's maximum width + 1, or the whole output when a pattern is unbounded,
as ``get_max_seq_length`` sizes it).

Real text is fed one token piece per step; each sequence is ``--seq-len``
tokens long, then a new one starts. K = 1, 8, 32 patterns, built from
chat-style stop templates that do not occur in the text (so every step pays
the full check), in two families: as usually written (several unbounded, so
the engine searches the whole output) and with bounded repetitions (a short
window). Reports ns per step and the ratio; the ``FinishBatch`` columns are
the per-sequence-step cost of the whole finish check through the batch API
(batch of 64), with these regexes and with none.

The second table is the held-text case: ``stop_regex=["(?s).*zz"]`` holds
back everything fed (the match could still end later), and 20,000 updates of
50 characters go through ``FinishTracker.update`` and, on the same text,
``StopRegexMatcher.feed``. It prints the cost of the first and the last 2,000
updates side by side (the least of 7 runs each): a step that re-walks the held text grows with the
output (main at 41fc633 did: 5-14 s for the 20,000), an incremental one does
not.

    python benches/bench_stop_regex.py [--ks 1 8 32] [--families unbounded bounded]
                                       [--steps 4000] [--seq-len 256] [--held-updates 20000]
"""

from __future__ import annotations

import argparse
import re
import time
from collections.abc import Callable

from _common import print_table, text_pieces, time_side_by_side

import stopline
from stopline.baseline import _regex_width

# Chat-style stops; several are unbounded, so the engine's window is the
# whole output (as SGLang sizes it).
UNBOUNDED = [
    r"\n\n+(User|Human){k}:",
    r"(?i)final answer {k}: ?\d+",
    r"<\|end_{k}\|>",
    r"[A-Z][a-z]+ {k}[a-z]+ends\.",
    r"\d+\.\d+ qq{k}",
    r"\[\[stop {k}\]\]",
    r"Observation {k}:",
    r"#{{3}} ?Q{k}!",
]
# The same stops with bounded repetitions: the window is a few dozen chars.
BOUNDED = [
    r"\n\n{{1,3}}(User|Human){k}:",
    r"(?i)final answer {k}: ?\d{{1,6}}",
    r"<\|end_{k}\|>",
    r"[A-Z][a-z]{{1,12}} {k}[a-z]{{1,12}}ends\.",
    r"\d{{1,4}}\.\d{{1,4}} qq{k}",
    r"\[\[stop {k}\]\]",
    r"Observation {k}:",
    r"#{{3}} ?Q{k}!",
]
FAMILIES = {"unbounded": UNBOUNDED, "bounded": BOUNDED}


def patterns(k: int, templates: list[str]) -> list[str]:
    return [templates[i % len(templates)].format(k=9000 + i) for i in range(k)]


def run(k: int, family: str, steps: int, seq_len: int, pieces: list[str], repeats: int):
    pats = patterns(k, FAMILIES[family])
    compiled = [re.compile(p) for p in pats]
    widths = [_regex_width(p)[1] for p in pats]
    window = None if None in widths else max(widths) + 1
    stream = [pieces[i % len(pieces)] for i in range(steps)]
    rx = stopline.StopRegexes(pats)
    hits = {"rust": 0, "re": 0}

    def rust_matcher() -> int:
        m = rx.matcher()
        for i, p in enumerate(stream):
            if i % seq_len == 0:
                m.reset()
            if m.feed(p) is not None:
                hits["rust"] += 1
        return steps

    def python_re() -> int:
        text = ""
        for i, p in enumerate(stream):
            if i % seq_len == 0:
                text = ""
            text += p
            tail = text if window is None else text[-window:]
            for c in compiled:
                if c.search(tail):
                    hits["re"] += 1
                    break
        return steps

    batch_size = 64
    per_seq = max(1, steps // batch_size)
    slots = list(range(batch_size))
    ids = [100] * batch_size
    batch_steps = [[stream[(s * 997 + t) % steps] for s in slots] for t in range(per_seq)]

    def rust_batch(params: stopline.StopParams) -> int:
        done = 0
        b = stopline.FinishBatch(batch_size)
        for s in slots:
            b.add(s, params)
        for t, texts in enumerate(batch_steps):
            if t and t % seq_len == 0:
                for s in slots:
                    b.remove(s)
                    b.add(s, params)
            b.step(slots, ids, None, texts).text_deltas
            done += batch_size
        return done

    with_rx = stopline.StopParams(stop_regex=pats, max_tokens=seq_len * 4)
    without = stopline.StopParams(max_tokens=seq_len * 4)
    t = time_side_by_side({
        "rust": rust_matcher, "re": python_re,
        "batch": lambda: rust_batch(with_rx), "plain": lambda: rust_batch(without),
    }, repeats)
    return {name: t[name].median for name in t}, window


def held_text(updates: int, piece_len: int = 50, window: int = 2000) -> list[tuple[object, ...]]:
    """Seconds for the first and the last `window` updates while a stop regex
    holds back the whole output, for the finish machine and the matcher."""
    piece = "a" * piece_len

    def timed(feed: Callable[[], object]) -> list[float]:
        """Seconds of updates [0, window), [window, updates - window), the rest."""
        marks = []
        start = time.perf_counter()
        for i in range(updates):
            if i in (window, updates - window):
                marks.append(time.perf_counter() - start)
                start = time.perf_counter()
            feed()
        marks.append(time.perf_counter() - start)
        return marks

    def tracker() -> list[float]:
        t = stopline.FinishTracker(stopline.StopParams(stop_regex=["(?s).*zz"]))
        return timed(lambda: t.update([1], [piece]))

    def matcher() -> list[float]:
        m = stopline.StopRegexes(["(?s).*zz"]).matcher()
        return timed(lambda: m.feed(piece))

    rows: list[tuple[object, ...]] = []
    for name, run_it in (("FinishTracker.update", tracker), ("StopRegexMatcher.feed", matcher)):
        # The least of 7 runs per window: a busy machine adds whole
        # scheduler slices to windows of about a millisecond.
        runs = [run_it() for _ in range(7)]
        first, middle, last = (min(r[k] for r in runs) for k in range(3))
        rows.append((name, f"{first * 1e3:.1f}", f"{last * 1e3:.1f}", f"{last / first:.2f}",
                     f"{first + middle + last:.3f}"))
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ks", type=int, nargs="*", default=[1, 8, 32])
    ap.add_argument("--families", nargs="*", default=list(FAMILIES), choices=list(FAMILIES))
    ap.add_argument("--steps", type=int, default=4000)
    ap.add_argument("--seq-len", type=int, default=256)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--held-updates", type=int, default=20_000)
    args = ap.parse_args()
    pieces, splitter = text_pieces()
    rows = []
    for family in args.families:
        for k in args.ks:
            t, window = run(k, family, args.steps, args.seq_len, pieces, args.repeats)
            rows.append((family, k, "whole output" if window is None else window,
                         f"{t['rust']:.0f}", f"{t['re']:.0f}", f"{t['re'] / t['rust']:.1f}x",
                         f"{t['batch']:.0f}", f"{t['plain']:.0f}"))
    print_table(
        f"stop regex check per step ({splitter}; {args.steps} steps, sequences of {args.seq_len} tokens)",
        ["patterns", "regexes", "re window (chars)", "StopRegexMatcher.feed ns", "re.search over tail ns",
         "speed-up", "FinishBatch ns/seq-step", "same, no regexes"],
        rows,
    )
    print_table(
        f"held text: stop_regex=['(?s).*zz'], {args.held_updates} updates of 50 chars",
        ["call", "first 2000 ms", "last 2000 ms", "last / first", "all s"],
        held_text(args.held_updates),
    )


if __name__ == "__main__":
    main()
