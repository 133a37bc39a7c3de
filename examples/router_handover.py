"""Hand a live request from one router process to another, mid-stream.

A router (or a detokenizing front end) sits between the inference backend and
the client: it reads the token ids the backend samples, turns them into text,
applies the stop conditions and streams the text to the client. When that
process drains for a restart, rebalances, or is replaced after it dies, the
requests it is serving must carry on elsewhere without the client seeing a
glitch: no repeated or lost characters, a stop string still caught when it is
split across the hand-over, the same finish.

``FinishBatch.snapshot(slot)`` writes one request's whole stop/detokenize
state as bytes (held bytes of a half-decoded character, text not yet
released because it may start a stop string, token counts, ...), and
``FinishBatch.restore(slot, params, data)`` rebuilds it in another batch.
What crosses the process boundary is only the request's ``StopParams``
(they pickle) and the snapshot bytes. The tokenizer is not sent: a
``Vocabulary`` does not pickle, so each process loads ``tokenizer.json``
itself, and restore refuses a snapshot taken with another vocabulary or
other params.

Here the backend is a recorded trace bundled with stopline (SmolLM2 token
ids). The front process serves a few requests in one ids-only
``FinishBatch``; at engine step ``HANDOVER_STEP`` it hands every request
still running to a worker process and from then on forwards those requests'
token ids to it. The client's stream for each request is what a single
process would have streamed, byte for byte (tests/test_examples.py checks
it). When a request finishes, the process serving it says so, and the
caller can abort the backend request that is still generating.

Run: ``python examples/router_handover.py`` (``--json`` for one JSON line
per request; ``--tokenizer PATH`` to use that SmolLM2 tokenizer.json).
Standard library and stopline only.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import sys
from importlib import resources
from typing import Any, TextIO

import stopline
from stopline.replay import load_trace

TRACE = "text_smollm2.jsonl.gz"  # recorded with SmolLM2's tokenizer
REQUESTS = [
    "smollm2-00-stop_string",
    "smollm2-01-unicode_stop",
    "smollm2-02-stop_token",
    "smollm2-03-length",
    "smollm2-04-eos",
    "smollm2-07-error",
    "smollm2-15-repetition",
]
HANDOVER_STEP = 24


class Streams:
    """The requests one process serves: request id -> slot of an ids-only batch."""

    def __init__(self, vocab: stopline.Vocabulary, max_slots: int) -> None:
        self.batch = stopline.FinishBatch(max_slots, vocabulary=vocab)
        self.free = list(range(max_slots))
        self.slots: dict[str, int] = {}

    def take(self, rid: str, params: stopline.StopParams, data: bytes | None = None) -> None:
        """Starts a request, fresh or from a snapshot taken elsewhere."""
        slot = self.free.pop()
        if data is None:
            self.batch.add(slot, params)
        else:
            self.batch.restore(slot, params, data)
        self.slots[rid] = slot

    def hand_over(self, rid: str) -> bytes:
        """The request's snapshot; it is no longer served here."""
        slot = self.slots.pop(rid)
        data = self.batch.snapshot(slot)
        self.batch.remove(slot)
        self.free.append(slot)
        return data

    def step(self, runs: dict[str, list[int]]) -> list[tuple[str, str, str | None, str | int | None]]:
        """One engine step: each request's new token ids in, (id, text delta,
        finish reason, stop reason) out. Finished requests leave."""
        rids = list(runs)
        slots = [self.slots[r] for r in rids]
        ids = [t for r in rids for t in runs[r]]
        res = self.batch.step(slots, ids, run_lengths=[len(runs[r]) for r in rids])
        out = list(zip(rids, res.text_deltas, res.finish_reasons, res.stop_reasons))
        for rid, _, finish, _ in out:
            if finish is not None:
                self._drop(rid)
        return out

    def abort(self, rid: str) -> tuple[str, str, str | None, str | int | None]:
        """The backend stream ended without a finish: flush and close."""
        r = self.batch.abort(self.slots[rid])
        self._drop(rid)
        return rid, r.text_delta, r.finish_reason, r.stop_reason

    def _drop(self, rid: str) -> None:
        slot = self.slots.pop(rid)
        self.batch.remove(slot)
        self.free.append(slot)


def worker(conn: Any, tokenizer: str, max_slots: int) -> None:
    """The second process: loads the tokenizer itself, restores what it is
    handed and answers each step with its deltas."""
    streams = Streams(stopline.Vocabulary.from_file(tokenizer), max_slots)
    while (msg := conn.recv())[0] != "quit":
        if msg[0] == "take":  # ("take", id, StopParams, snapshot bytes)
            streams.take(msg[1], msg[2], msg[3])
        elif msg[0] == "step":  # ("step", {id: token ids})
            conn.send(streams.step(msg[1]))
        elif msg[0] == "abort":  # ("abort", id)
            conn.send([streams.abort(msg[1])])
    conn.close()


def serve(tokenizer: str, handover_step: int = HANDOVER_STEP, log: TextIO = sys.stdout) -> dict[str, dict[str, Any]]:
    """Replays the chosen requests of the trace with a hand-over at
    ``handover_step``; returns per request the client's stream and finish."""
    path = str(resources.files("stopline") / "traces" / TRACE)
    trace = {r.id: r for r in load_trace(path)[0]}
    reqs = [trace[rid] for rid in REQUESTS]

    ctx = mp.get_context("spawn")  # a fresh interpreter, as another replica would be
    conn, child_conn = ctx.Pipe()
    proc = ctx.Process(target=worker, args=(child_conn, tokenizer, len(reqs)))
    proc.start()
    child_conn.close()  # the worker's end: if the worker dies, recv() raises EOFError instead of waiting

    front = Streams(stopline.Vocabulary.from_file(tokenizer), len(reqs))
    params = {r.id: stopline.StopParams(**r.params) for r in reqs}
    client = {r.id: {"text": "", "served_by": "front", "finish_reason": None, "stop_reason": None} for r in reqs}
    for r in reqs:
        front.take(r.id, params[r.id])

    def deliver(results: list[Any], who: str) -> None:
        for rid, delta, finish, stop in results:
            client[rid]["text"] += delta  # streamed to the client as it comes
            if finish is not None:
                client[rid].update(finish_reason=finish, stop_reason=stop)
                print(f"[{who}] {rid} finished ({finish}, stop reason {stop!r}): abort the backend request", file=log)

    moved: set[str] = set()
    live = {r.id for r in reqs}
    for k in range(max(len(r.steps) for r in reqs)):
        if k == handover_step:
            for rid in sorted(live):
                conn.send(("take", rid, params[rid], front.hand_over(rid)))
                client[rid]["served_by"] = "worker"
                moved.add(rid)
        runs = {rid: trace[rid].steps[k].ids for rid in live if k < len(trace[rid].steps)}
        here = {rid: ids for rid, ids in runs.items() if rid not in moved}
        there = {rid: ids for rid, ids in runs.items() if rid in moved}
        if here:
            deliver(front.step(here), "front")
        if there:
            conn.send(("step", there))
            deliver(conn.recv(), "worker")
        for rid in sorted(live):
            if client[rid]["finish_reason"] is None and k + 1 >= len(trace[rid].steps):
                if rid in moved:
                    conn.send(("abort", rid))
                    deliver(conn.recv(), "worker")
                else:
                    deliver([front.abort(rid)], "front")
        live = {rid for rid in live if client[rid]["finish_reason"] is None}
        if not live:
            break
    conn.send(("quit",))
    proc.join()
    if proc.exitcode != 0:
        raise RuntimeError(f"exit status {proc.exitcode}")
    return client


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokenizer", help="SmolLM2 tokenizer.json (default: stopline's cached copy)")
    ap.add_argument("--json", action="store_true", help="one JSON line per request")
    ap.add_argument("--handover-step", type=int, default=HANDOVER_STEP)
    args = ap.parse_args(argv)
    tokenizer = args.tokenizer
    if tokenizer is None:
        from stopline.tools.models import ModelFileError
        from stopline.tools.vocab_files import tokenizer_json_path

        try:
            tokenizer = str(tokenizer_json_path("smollm2"))
        except ModelFileError as exc:
            print(f"no SmolLM2 tokenizer.json: {exc}", file=sys.stderr)
            return 2
    try:
        client = serve(tokenizer, args.handover_step, sys.stderr if args.json else sys.stdout)
    except (RuntimeError, EOFError) as exc:
        print(f"the worker failed: {exc!r}", file=sys.stderr)
        return 1
    for rid, c in client.items():
        if args.json:
            print(json.dumps({"id": rid, **c}))
        else:
            print(f"== {rid} (served by {c['served_by']} at the end; {c['finish_reason']}, {c['stop_reason']!r}) ==")
            print(c["text"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
