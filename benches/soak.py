"""Soak: millions of sequence-steps through one long-lived FinishBatch.

Sequences come and go the way they do in a server that runs for weeks: a
fixed pool of slots, each sequence added when a slot frees up, stepped once
per engine step (single tokens and speculative accept runs), finished by a
stop string, EOS, a stop token id, the length cap or an abort, then removed.
The text pieces are real: token pieces from the decode traces bundled with
stopline (``stopline/traces/*.jsonl.gz``, four tokenizers), each sequence reading
them from its own random offset, with the stop lists of those traces.

Resident memory (VmRSS) is sampled after warm-up and at regular intervals; a
server-grade library keeps it flat. Every finished sequence is also checked:
the code points streamed through its text deltas add up to its final
``text_len`` and its token deltas to ``num_tokens``.

Not a CI test (it runs for minutes). Run::

    python benches/soak.py                    # 10,000,000 steps, 10,000 sequences
    python benches/soak.py --steps 200000 --sequences 400   # a quick look

Exit status 1 when a streaming check fails or when RSS grew by more than
``--max-growth-mib`` between the first sample after warm-up and the end.
"""

from __future__ import annotations

import argparse
import gc
import gzip
import json
import random
import sys
import time
from importlib import resources
from typing import Any

import stopline


def rss_mib() -> float:
    """Resident set size of this process in MiB (Linux /proc)."""
    with open("/proc/self/status", encoding="ascii") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024.0
    raise RuntimeError("VmRSS not found in /proc/self/status")


def load_traces() -> tuple[list[int], list[str], list[list[str]], list[int]]:
    """Flat (token id, text piece) stream of every bundled trace, plus the
    stop lists and EOS ids those traces were recorded with."""
    ids: list[int] = []
    texts: list[str] = []
    stop_lists: list[list[str]] = []
    eos: set[int] = set()
    root = resources.files("stopline") / "traces"
    for entry in sorted(root.iterdir(), key=lambda p: p.name):
        if not entry.name.endswith(".jsonl.gz"):
            continue
        for line in gzip.decompress(entry.read_bytes()).decode("utf-8").splitlines():
            if not line.strip():
                continue
            req = json.loads(line)
            params = req.get("params", {})
            if params.get("stop"):
                stop_lists.append(list(params["stop"]))
            eos.update(params.get("eos_token_ids", []))
            for step in req.get("steps", []):
                ids.extend(step["ids"])
                texts.extend(step.get("texts") or [""] * len(step["ids"]))
    if not ids:
        raise SystemExit("no bundled traces found")
    return ids, texts, stop_lists, sorted(eos)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=10_000_000, help="sequence-steps in all")
    ap.add_argument("--sequences", type=int, default=10_000, help="sequences in all")
    ap.add_argument("--slots", type=int, default=256, help="FinishBatch slots (concurrent sequences)")
    ap.add_argument("--samples", type=int, default=10, help="RSS samples after warm-up")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--max-growth-mib", type=float, default=16.0)
    ap.add_argument("--json", action="store_true", help="print the summary as JSON")
    args = ap.parse_args(argv)

    rng = random.Random(args.seed)
    rss_start = rss_mib()
    tok_ids, pieces, stop_lists, eos_ids = load_traces()
    n_pieces = len(pieces)
    # The bundled traces record ids from several tokenizers; EOS and the stop
    # token ids are drawn from ids the stream really contains, at rates that
    # let most sequences run long.
    avg_len = max(1, args.steps // args.sequences)
    stop_token = max(tok_ids) + 1  # an id never in the stream ...
    rare_ids = sorted({i for i in tok_ids if i not in eos_ids})[-3:]  # ... and a few real ones

    batch = stopline.FinishBatch(args.slots)
    free = list(range(args.slots - 1, -1, -1))
    cursor: dict[int, int] = {}
    streamed: dict[int, list[int]] = {}  # slot -> [code points, tokens] streamed
    added = finished = aborted = steps = engine_steps = 0
    reasons: dict[str, int] = {}
    errors: list[str] = []

    def add_sequences() -> None:
        nonlocal added
        while free and added < args.sequences:
            slot = free.pop()
            # Early stops (strings, EOS, repetition, aborts) end about half the
            # sequences before their cap; caps of 1.2x-3.2x the average make
            # up for it, so the step budget and the sequences run out together.
            max_tokens = rng.randint(avg_len + avg_len // 5, 3 * avg_len + avg_len // 5)
            params = stopline.StopParams(
                max_tokens=max(1, max_tokens),
                min_tokens=rng.choice((0, 0, 4)),
                eos_token_ids=eos_ids if rng.random() < 0.3 else [],
                stop_token_ids=[stop_token] + (rare_ids if rng.random() < 0.05 else []),
                stop=rng.choice(stop_lists) if stop_lists and rng.random() < 0.3 else None,
                include_stop_str_in_output=rng.random() < 0.3,
                repetition=(
                    {"max_pattern_size": 8, "min_pattern_size": 2, "min_count": 6}
                    if rng.random() < 0.2 else None
                ),
            )
            batch.add(slot, params)
            cursor[slot] = rng.randrange(n_pieces)
            streamed[slot] = [0, 0]
            added += 1

    def retire(slot: int, res: Any) -> None:
        nonlocal finished
        got = streamed.pop(slot)
        if got != [res.text_len, res.num_tokens]:
            errors.append(
                f"slot {slot}: streamed {got[0]} code points / {got[1]} tokens, "
                f"final text_len={res.text_len} num_tokens={res.num_tokens}"
            )
        reasons[res.finish_reason] = reasons.get(res.finish_reason, 0) + 1
        batch.remove(slot)
        del cursor[slot]
        free.append(slot)
        finished += 1

    samples: list[dict[str, float]] = []
    every = max(1, args.steps // args.samples)
    next_sample = every // 4  # the first sample after warm-up
    t0 = time.perf_counter()
    add_sequences()
    while cursor and steps < args.steps:
        active = list(cursor)
        # About 1% of sequences per 100 steps are aborted by their client.
        if rng.random() < 0.01:
            victim = rng.choice(active)
            r = batch.abort(victim)
            streamed[victim][0] += len(r.text_delta)
            streamed[victim][1] += len(r.token_ids_delta)
            aborted += 1
            retire(victim, r)
            active.remove(victim)
        if not active:
            add_sequences()
            continue
        slots: list[int] = []
        ids: list[int] = []
        texts: list[str] = []
        runs: list[int] = []
        for slot in active:
            k = 1 if rng.random() < 0.8 else rng.randint(2, 4)  # speculative accept runs
            c = cursor[slot]
            for j in range(k):
                p = (c + j) % n_pieces
                ids.append(tok_ids[p])
                texts.append(pieces[p])
            cursor[slot] = (c + k) % n_pieces
            slots.append(slot)
            runs.append(k)
        res = batch.step(slots, ids, runs, texts)
        engine_steps += 1
        steps += len(slots)
        for slot, text, toks in zip(slots, res.text_deltas, res.token_ids_deltas):
            s = streamed[slot]
            s[0] += len(text)
            s[1] += len(toks)
        for slot in res.finished_slots:
            retire(slot, batch.result(slot))
        add_sequences()
        if steps >= next_sample:
            gc.collect()
            samples.append({
                "steps": steps,
                "sequences_done": finished,
                "rss_mib": round(rss_mib(), 1),
                "seconds": round(time.perf_counter() - t0, 1),
            })
            if not args.json:
                print(
                    f"steps={steps:>10,}  sequences_done={finished:>6,}  "
                    f"rss={samples[-1]['rss_mib']:7.1f} MiB  t={samples[-1]['seconds']:7.1f}s",
                    flush=True,
                )
            next_sample += every
    # Drain: abort whatever still runs so every sequence is checked.
    for slot in list(cursor):
        r = batch.abort(slot)
        streamed[slot][0] += len(r.text_delta)
        streamed[slot][1] += len(r.token_ids_delta)
        retire(slot, r)
    elapsed = time.perf_counter() - t0
    gc.collect()
    rss_end = rss_mib()
    growth = rss_end - samples[0]["rss_mib"] if samples else 0.0
    summary = {
        "sequence_steps": steps,
        "engine_steps": engine_steps,
        "sequences": added,
        "finished_by_reason": reasons,
        "client_aborts": aborted,
        "slots": args.slots,
        "seconds": round(elapsed, 1),
        "steps_per_second": round(steps / elapsed) if elapsed else None,
        "rss_start_mib": round(rss_start, 1),
        "rss_samples": samples,
        "rss_end_mib": round(rss_end, 1),
        "rss_growth_after_warmup_mib": round(growth, 1),
        "streaming_errors": errors[:10],
        "python": sys.version.split()[0],
        "stopline": stopline.__version__,
    }
    if args.json:
        print(json.dumps(summary, indent=2))
    else:
        print(json.dumps({k: v for k, v in summary.items() if k != "rss_samples"}, indent=2))
    ok = not errors and growth <= args.max_growth_mib
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
