"""Worst cases of ``stopline.logits.check_request`` (vLLM's admission check, run in
its frontend) at the caps of ``stopline.logits.LIMITS``, for docs/errors.md ("Caps").

Each case builds its request first (not timed), then times one ``check_request(None,
**request)``; median and max of ``--reps`` runs. The cases: every list at its cap
(4,194,304 allowed ids, 65,536 stop ids, 65,536 bias entries, 1,024 bad words of 64
ids); the allowed ids alone as a list, a tuple, a generator, a list of numpy scalars,
a NumPy array and a tensor; lists refused at their last entry (an id out of range, a
float, an int past 64 bits) and at the first; ``logit_bias`` as a dict and as pairs,
refused at the last entry. The ``floor`` row copies the 4,194,304-id list
(``list(ids)``): what any check that reads the list in Python costs at least, measured
in the same run.

    python benches/bench_check_request.py [--reps 7] [--json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from stopline.logits import LIMITS, check_request

N_ALLOWED = LIMITS["max_allowed_token_ids"]
N_STOP = LIMITS["max_stop_token_ids"]
N_BIAS = LIMITS["max_logit_bias"]


def cases() -> dict[str, Callable[[], dict[str, Any]]]:
    ids = list(range(1, N_ALLOWED + 1))
    words = [[(i * 64 + j) % 151936 for j in range(64)] for i in range(LIMITS["max_bad_words"])]
    pairs = [[i, 0.5] for i in range(N_BIAS - 1)]
    return {
        "every list at its cap": lambda: dict(min_tokens=5, stop_token_ids=list(range(N_STOP)), allowed_token_ids=ids,
                                              bad_words=words, logit_bias={i: 0.5 for i in range(N_BIAS)}),
        "allowed: list": lambda: dict(allowed_token_ids=ids),
        "allowed: tuple": lambda: dict(allowed_token_ids=tuple(ids)),
        "allowed: generator": lambda: dict(allowed_token_ids=iter(ids)),
        "allowed: list of numpy ints": lambda: dict(allowed_token_ids=list(np.arange(N_ALLOWED))),
        "allowed: numpy int64": lambda: dict(allowed_token_ids=np.arange(N_ALLOWED)),
        "allowed: numpy int32, last refused": lambda: dict(
            allowed_token_ids=np.r_[np.arange(N_ALLOWED - 1), -1].astype(np.int32)),
        "allowed: tensor (refused)": lambda: dict(allowed_token_ids=torch.arange(N_ALLOWED)),
        "allowed: list, last -1": lambda: dict(allowed_token_ids=ids[:-1] + [-1]),
        "allowed: list, last a float": lambda: dict(allowed_token_ids=ids[:-1] + [1.5]),
        "allowed: list, last 2**70": lambda: dict(allowed_token_ids=ids[:-1] + [2**70]),
        "allowed: list, first 2**70": lambda: dict(allowed_token_ids=[2**70] + ids[1:]),
        "stop ids: list": lambda: dict(stop_token_ids=list(range(N_STOP))),
        "logit_bias: dict": lambda: dict(logit_bias={i: 0.5 for i in range(N_BIAS)}),
        "logit_bias: pairs, last repeats": lambda: dict(logit_bias=pairs + [[0, 1.0]]),
        "logit_bias: pairs, last 10**400": lambda: dict(logit_bias=pairs + [[N_BIAS, 10**400]]),
        "bad_words at the caps": lambda: dict(bad_words=words),
    }


def measure(make: Callable[[], dict[str, Any]], reps: int) -> dict[str, Any]:
    times = []
    outcome = "accepted"
    for _ in range(reps):
        request = make()
        t0 = time.perf_counter()
        try:
            check_request(None, **request)
        except (TypeError, ValueError) as exc:
            outcome = f"{type(exc).__name__} {getattr(exc, 'field', None)} {getattr(exc, 'kind', None)}"
        times.append(time.perf_counter() - t0)
    return {"median_ms": statistics.median(times) * 1e3, "max_ms": max(times) * 1e3, "outcome": outcome}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=7)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    ids = list(range(N_ALLOWED))
    floor = []
    for _ in range(args.reps):
        t0 = time.perf_counter()
        list(ids)
        floor.append(time.perf_counter() - t0)
    results = {"floor: list(ids)": {"median_ms": statistics.median(floor) * 1e3, "max_ms": max(floor) * 1e3,
                                    "outcome": "-"}}
    for name, make in cases().items():
        results[name] = measure(make, args.reps)
    if args.json:
        print(json.dumps(results, indent=1))
        return
    base = results["floor: list(ids)"]["median_ms"]
    print(f"{'case':36s} {'median ms':>10s} {'max ms':>8s} {'x floor':>8s}  outcome")
    for name, r in results.items():
        print(f"{name:36s} {r['median_ms']:10.1f} {r['max_ms']:8.1f} {r['median_ms'] / base:8.2f}  {r['outcome']}")


if __name__ == "__main__":
    main()
