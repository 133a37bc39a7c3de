"""Benchmark of stopline.logits: fused Triton kernel vs torch reference vs clone().

For each (rows, vocab, dtype, scenario) the same logits tensor is processed by
``LogitsConstraints.apply(backend="triton")``, by the torch reference
(``backend="torch"``), and by clone()'s copy (``out.copy_(logits)`` into a tensor
allocated once: reads and writes every logit once, the memory roofline an
in-place pass over the row cannot beat, without the allocator). On a GPU the
kernel and the copy are timed as CUDA-graph replays (``time_gpu_graph``: a graph
of up to 1000 calls, median per call over 10 replays: device time, no Python
launch gaps); the torch reference syncs inside (boolean indexing), so it cannot be
captured and is timed with ``triton.testing.do_bench`` (median of single calls
between CUDA events, L2 flushed before each). On CPU: ``time.perf_counter`` medians.

Scenarios (every slot busy, one row per slot, all rows below min_tokens):
- ``min``: min_tokens with two stop ids (EOS and a second stop id) only;
- ``bitmask``: a grammar bitmask on every row (half the rows allow only EOS, so
  the restore fires; the rest allow ~1% of the vocabulary) + min_tokens +
  restore "structured";
- ``all``: ``bitmask`` plus allowed_token_ids (half the slots, 4096 ids), bad
  words (3 single-token, 3 multi-token with a history that makes one fire),
  logit_bias (16 ids).

The kernel runs in place on the same tensor every repetition; its work does not
depend on what an earlier repetition wrote (dense rows always make the full
pass, sparse rows find a finite logit in their first block either way).

Usage (with stopline importable: installed, or PYTHONPATH=python in a built checkout):
    python benches/bench_logits.py                  # GPU: the full table
    python benches/bench_logits.py --device cpu     # CPU: small sizes, torch backend
    python benches/bench_logits.py --markdown out.md --json out.json
    # tile / split sweep: time each DENSE_WORDS:SCAN_WORDS:NUM_WARPS:PROGS_PER_SM[:WAVE_PROGS[:PREFETCH]] and
    # write the best per dtype in STOPLINE_LOGITS_TILE's format
    python benches/bench_logits.py --rows 256 1024 --scenarios all --no-torch \
        --configs 64:32:4:32:10:1 128:32:4:16:0:0 --best-config-out best.txt
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from pathlib import Path

import torch

from stopline.logits import LogitsConstraints
from stopline.logits.triton_kernel import apply_triton

EOS, EOS2 = 2, 0
SCENARIOS = ("min", "bitmask", "all")


def pack_rows(keep: torch.Tensor) -> torch.Tensor:
    """bool [rows, V] -> int32 [rows, ceil(V/32)] in xgrammar layout."""
    R, V = keep.shape
    W = (V + 31) // 32
    padded = torch.zeros((R, W * 32), dtype=torch.bool, device=keep.device)
    padded[:, :V] = keep
    bits = padded.view(R, W, 32).to(torch.int64) << torch.arange(32, device=keep.device)
    words = bits.sum(-1)
    return torch.where(words >= 2**31, words - 2**32, words).to(torch.int32)


def setup(rows: int, V: int, dtype, scenario: str, device: str, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    gd = torch.Generator(device).manual_seed(seed)  # the large tensors are drawn where they live
    cons = LogitsConstraints(rows, V, device)
    for s in range(rows):
        kw = dict(min_tokens=16, stop_token_ids=[EOS, EOS2])
        if scenario == "all":
            if s % 2 == 0:
                ids = torch.randint(0, V, (4096,), generator=g).tolist()
                kw["allowed_token_ids"] = ids + [EOS]
            kw["bad_words"] = [[11], [12], [13], [21, 22], [23, 24, 25], [26, 27]]
            kw["logit_bias"] = {int(t): 0.5 for t in torch.randperm(V, generator=g)[:16]}
        cons.set(s, **kw)
        if scenario == "all":
            cons.append_tokens(s, [5, 23, 24])  # [23, 24, 25] fires
    logits = torch.randn(rows, V, generator=gd, device=device).to(dtype)
    slots = torch.arange(rows, device=device)
    pos = torch.full((rows,), 3, device=device)
    bitmask = None
    if scenario in ("bitmask", "all"):
        keep = torch.rand(rows, V, generator=gd, device=device) < 0.01
        keep[::2] = False
        keep[::2, EOS] = True  # grammar allows only EOS: min_tokens masks it, restore puts it back
        bitmask = pack_rows(keep)
    return cons, logits, slots, pos, bitmask


def time_gpu(fn) -> float:
    """Median of single calls between CUDA events, L2 flushed before each (includes host gaps)."""
    import triton.testing

    return triton.testing.do_bench(fn, warmup=5, rep=20, return_mode="median") * 1e3  # us


def time_gpu_graph(fn, target_ms: float = 5.0, max_calls: int = 1000, replays: int = 10) -> float:
    """Median per-call time of CUDA-graph replays: device time without Python launch gaps.

    Like triton's do_bench_cudagraph, but the graph holds at most ``max_calls``
    calls (capturing ~10k calls of a 2 us kernel costs seconds of host time).
    """
    fn()  # compile outside the capture
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    with torch.cuda.stream(torch.cuda.Stream()):
        fn()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            fn()
        torch.cuda.synchronize()
        start.record()
        g.replay()
        end.record()
        torch.cuda.synchronize()
        n = max(1, min(max_calls, int(target_ms / max(start.elapsed_time(end), 1e-3))))
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            for _ in range(n):
                fn()
        torch.cuda.synchronize()
        times = []
        for _ in range(replays):
            start.record()
            g.replay()
            end.record()
            torch.cuda.synchronize()
            times.append(start.elapsed_time(end) / n)
    return statistics.median(times) * 1e3  # us


def time_cpu(fn, reps: int = 7) -> float:
    fn()
    samples = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - t)
    return statistics.median(samples) * 1e6


def run(args) -> list[dict]:
    gpu = args.device.startswith("cuda")
    timer = time_gpu if gpu else time_cpu  # the torch reference syncs: it cannot be graph-captured
    graph_timer = time_gpu_graph if gpu else time_cpu
    results = []
    for dtype_name in args.dtypes:
        dtype = getattr(torch, dtype_name)
        for V in args.vocabs:
            for rows in args.rows:
                for scenario in args.scenarios:
                    cons, logits, slots, pos, bitmask = setup(rows, V, dtype, scenario, args.device)

                    def apply(backend, x=logits):
                        return cons.apply(x, slots, pos, bitmask=bitmask, backend=backend)

                    rec = dict(rows=rows, vocab=V, dtype=dtype_name, scenario=scenario)
                    dst = torch.empty_like(logits)
                    rec["clone_us"] = graph_timer(lambda: dst.copy_(logits))
                    del dst
                    rec["torch_us"] = float("nan") if args.no_torch else timer(lambda: apply("torch"))
                    if gpu:
                        # a check that the timed kernel computes what the reference does
                        a, b = logits.clone(), logits.clone()
                        ia, ib = apply("torch", a), apply("triton", b)
                        rec["identical"] = bool(torch.equal(a, b) and torch.equal(ia, ib))
                        rec["triton_us"] = graph_timer(lambda: apply("triton"))
                        nbytes = 2 * rows * V * logits.element_size()
                        rec["clone_gbps"] = nbytes / rec["clone_us"] / 1e3
                        rec["triton_gbps"] = nbytes / rec["triton_us"] / 1e3
                        rec["vs_clone"] = rec["clone_us"] / rec["triton_us"]
                        rec["vs_torch"] = rec["torch_us"] / rec["triton_us"]
                        for cfg in args.configs:
                            vals = [int(v) for v in cfg.split(":")]
                            kw = dict(zip(("dense_words", "scan_words", "num_warps", "progs_per_sm", "wave_progs",
                                           "prefetch"), vals))
                            rec[f"cfg {cfg} us"] = graph_timer(lambda: apply_triton(
                                cons.state, logits, slots, pos, bitmask, None, None, cons.max_slots, **kw))
                    results.append(rec)
                    print(_row(rec, gpu), flush=True)
                    del cons, logits, bitmask
    return results


HEADER_GPU = ("| dtype | vocab | rows | scenario | triton us | torch us | clone us | triton GB/s | "
              "clone GB/s | % of clone bw | x faster than torch | identical |\n"
              "|---|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---|")
HEADER_CPU = "| dtype | vocab | rows | scenario | torch us | clone us |\n|---|---:|---:|---|---:|---:|"


def _row(r: dict, gpu: bool) -> str:
    if gpu:
        extra = "".join(f" {k}={v:.1f}" for k, v in r.items() if k.startswith("cfg "))
        return (f"| {r['dtype']} | {r['vocab']} | {r['rows']} | {r['scenario']} | {r['triton_us']:.1f} | "
                f"{r['torch_us']:.1f} | {r['clone_us']:.1f} | {r['triton_gbps']:.0f} | {r['clone_gbps']:.0f} | "
                f"{100 * r['vs_clone']:.0f}% | {r['vs_torch']:.1f} | {'yes' if r['identical'] else 'NO'} |{extra}")
    return (f"| {r['dtype']} | {r['vocab']} | {r['rows']} | {r['scenario']} | {r['torch_us']:.1f} | "
            f"{r['clone_us']:.1f} |")


def main(argv=None) -> int:
    cuda = torch.cuda.is_available()
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cuda" if cuda else "cpu")
    p.add_argument("--rows", type=int, nargs="+")
    p.add_argument("--vocabs", type=int, nargs="+")
    p.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"])
    p.add_argument("--scenarios", nargs="+", default=list(SCENARIOS), choices=SCENARIOS)
    p.add_argument("--configs", nargs="*", default=[],
                   help="extra kernel configs DENSE_WORDS:SCAN_WORDS:NUM_WARPS:PROGS_PER_SM[:WAVE_PROGS[:PREFETCH]] "
                        "to time (GPU)")
    p.add_argument("--best-config-out", type=Path,
                   help="write, per dtype, the --configs entry with the lowest mean time relative to the "
                        "best config of each case, as a STOPLINE_LOGITS_TILE value")
    p.add_argument("--no-torch", action="store_true", help="skip timing the torch reference (sweeps)")
    p.add_argument("--json", type=Path)
    p.add_argument("--markdown", type=Path)
    args = p.parse_args(argv)
    gpu = args.device.startswith("cuda")
    args.rows = args.rows or ([1, 64, 256, 1024] if gpu else [1, 8])
    args.vocabs = args.vocabs or ([49152, 128256, 151936, 262144] if gpu else [4096, 49152])
    device_name = torch.cuda.get_device_name() if gpu else platform.processor() or platform.machine()
    import triton

    head = (f"device: {device_name}; torch {torch.__version__}; triton {triton.__version__}; "
            + ("triton/clone: CUDA-graph replay medians (clone = copy_ into a preallocated tensor); "
               "torch: do_bench medians" if gpu else "perf_counter medians"))
    print(head)
    print(HEADER_GPU if gpu else HEADER_CPU, flush=True)
    results = run(args)
    if args.best_config_out and args.configs:
        picks = []
        for dt in args.dtypes:
            rs = [r for r in results if r["dtype"] == dt]
            score = {c: sum(r[f"cfg {c} us"] / min(r[f"cfg {k} us"] for k in args.configs) for r in rs) / len(rs)
                     for c in args.configs}
            best = min(score, key=score.get)
            print(f"{dt}: mean time / best per case:", {c: round(v, 3) for c, v in score.items()}, "best:", best)
            picks.append(f"{dt}={best}")
            if dt == "bfloat16" and "float16" not in args.dtypes:
                picks.append(f"float16={best}")  # same element size
        args.best_config_out.write_text(",".join(picks))
    if args.json:
        args.json.write_text(json.dumps(dict(device=device_name, results=results), indent=1))
    if args.markdown:
        lines = [head, "", HEADER_GPU if gpu else HEADER_CPU] + [_row(r, gpu) for r in results]
        args.markdown.write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
