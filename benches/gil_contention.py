"""Does FinishBatch.step holding the GIL slow down the engine's other threads?

Thread A runs FinishBatch.step for a batch of --slots sequences (real text
pieces from the bundled traces, stop strings on every sequence) as fast as it
can; thread B does pure-Python work (the tokenizer/scheduler of an engine
stand-in) and counts iterations. Printed: A's steps/s and B's iterations/s,
each alone and both together. If the core's part of step() ran without the GIL
(PyO3 ``py.detach``), B would keep more of its solo rate while A runs.

Used for the GIL decision in docs/reliability.md: run it against two builds
(with and without the detach) and compare.
"""

from __future__ import annotations

import argparse
import gzip
import json
import threading
import time
from importlib import resources

import stopline


def pieces() -> tuple[list[int], list[str], list[str]]:
    ids: list[int] = []
    texts: list[str] = []
    stops: list[str] = []
    root = resources.files("stopline") / "traces"
    for entry in sorted(root.iterdir(), key=lambda p: p.name):
        if entry.name.endswith(".jsonl.gz"):
            for line in gzip.decompress(entry.read_bytes()).decode("utf-8").splitlines():
                if line.strip():
                    req = json.loads(line)
                    stops = stops or req.get("params", {}).get("stop", [])
                    for st in req.get("steps", []):
                        ids.extend(st["ids"])
                        texts.extend(st.get("texts") or [""] * len(st["ids"]))
    return ids, texts, stops


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--slots", type=int, default=256)
    ap.add_argument("--run", type=int, default=1, help="tokens per slot per step (speculative accept run)")
    ap.add_argument("--seconds", type=float, default=3.0)
    args = ap.parse_args()
    ids, texts, stops = pieces()
    n = len(ids)
    # Stop strings that never complete: every slot runs for the whole measurement.
    params = stopline.StopParams(max_tokens=10**9, stop=["\x00never\x00", "<|never|>", "\n\nUser:\x00"])
    k = args.slots * args.run
    steps_in = [(ids[(s * k) % (n - k):][:k], texts[(s * k) % (n - k):][:k]) for s in range(64)]
    slots = list(range(args.slots))
    runs = [args.run] * args.slots

    def stepper(stop: threading.Event, out: list[int]) -> None:
        b = stopline.FinishBatch(args.slots)
        for s in slots:
            b.add(s, params)
        done = 0
        while not stop.is_set():
            i, t = steps_in[done % 64]
            b.step(slots, i, runs, t)
            done += 1
            if done % 2000 == 0:  # keep texts bounded
                for s in slots:
                    b.remove(s)
                    b.add(s, params)
        out.append(done)

    def python_work(stop: threading.Event, out: list[int]) -> None:
        count = 0
        d: dict[int, int] = {}
        while not stop.is_set():
            for j in range(100):
                d[j] = d.get(j, 0) + j
            count += 1
        out.append(count)

    def measure(workers: list) -> list[float]:
        stop = threading.Event()
        outs: list[list[int]] = [[] for _ in workers]
        threads = [threading.Thread(target=w, args=(stop, o)) for w, o in zip(workers, outs)]
        t0 = time.perf_counter()
        for t in threads:
            t.start()
        time.sleep(args.seconds)
        stop.set()
        for t in threads:
            t.join()
        dt = time.perf_counter() - t0
        return [o[0] / dt for o in outs]

    (a_alone,) = measure([stepper])
    (b_alone,) = measure([python_work])
    a_both, b_both = measure([stepper, python_work])
    print(json.dumps({
        "slots": args.slots, "run": args.run,
        "step_per_s_alone": round(a_alone), "python_iter_per_s_alone": round(b_alone),
        "step_per_s_with_python_thread": round(a_both), "python_iter_per_s_with_step_thread": round(b_both),
        "python_thread_keeps": round(b_both / b_alone, 3), "step_thread_keeps": round(a_both / a_alone, 3),
    }))


if __name__ == "__main__":
    main()
