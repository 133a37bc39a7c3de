"""Stress check of the logits kernel's split rows on a real GPU.

Big shapes (512 x 65 536, 64 x 151 936, 256 x 262 144; float32 and bfloat16)
with the default split and with tiny tiles and chunks forced, so that a row is
finished by the last of up to ~128 concurrent chunk programs; every case must
equal the torch reference bit for bit and leave the per-row scratch at zero.
Then a CUDA-graph capture of ``apply`` is replayed on fresh inputs and
compared with the reference. Exits 1 on any difference.

    python benches/logits_stress.py        # on a CUDA machine; CPU: a tiny case

(The test suite covers the same logic in Triton's interpreter, where programs
run one after another; only a GPU runs the chunks concurrently.)
"""
import random
import sys
import time

import torch
import stopline.logits.triton_kernel as tk
from stopline.logits import LogitsConstraints
from stopline.logits.reference import apply_reference

dev = "cuda" if torch.cuda.is_available() else "cpu"
small = dev == "cpu"
NEG = float("-inf")
fails = 0


def pack(keep):
    R, V = keep.shape
    W = (V + 31) // 32
    p = torch.zeros((R, W * 32), dtype=torch.bool, device=keep.device)
    p[:, :V] = keep
    words = (p.view(R, W, 32).to(torch.int64) << torch.arange(32, device=keep.device)).sum(-1)
    return torch.where(words >= 2**31, words - 2**32, words).to(torch.int32)


def same(a, b):
    na, nb = torch.isnan(a.float()), torch.isnan(b.float())
    bits = {torch.float32: torch.int32, torch.bfloat16: torch.int16, torch.float16: torch.int16}[a.dtype]
    return torch.equal(na, nb) and bool(((a.view(bits) == b.view(bits)) | na).all())


def case(R, V, dtype, seed, **kw):
    global fails
    rng = random.Random(seed)
    S = 16
    cons = LogitsConstraints(S, V, dev)
    for s in range(S):
        stops = rng.sample(range(V), 2)
        c = dict(min_tokens=3, stop_token_ids=stops, restore=rng.choice(["structured", "always", "never"]),
                 bad_words=[[rng.randrange(V)], [1, rng.randrange(V)]], logit_bias={rng.randrange(V): 1.5})
        if s % 4 == 0:
            c["allowed_token_ids"] = stops + rng.sample(range(V), rng.randint(0, 2))
        cons.set(s, **c)
        cons.append_tokens(s, [1])
    g = torch.Generator(dev).manual_seed(seed)
    keep = torch.rand(R, V, generator=g, device=dev) < (3.0 / V)
    slots = torch.randint(0, S, (R,), generator=g, device=dev)
    st = cons.state.stop_ids[slots]
    half = torch.rand(R, generator=g, device=dev) < 0.3
    keep[torch.arange(R, device=dev)[half], st[half, 0].long()] = True
    bitmask = pack(keep)
    gr = torch.rand(R, generator=g, device=dev) < 0.6
    logits = torch.randn(R, V, generator=g, device=dev).to(dtype)
    logits[torch.rand(R, V, generator=g, device=dev) < 0.3] = NEG
    pos = torch.randint(0, 5, (R,), generator=g, device=dev)
    a, b = logits.clone(), logits.clone()
    ia = apply_reference(cons.state, a, slots, pos, bitmask, gr, None, S)
    ib = tk.apply_triton(cons.state, b, slots, pos, bitmask, gr, None, S, **kw)
    ok = same(a, b) and torch.equal(ia, ib)
    scratch = cons.state.extras.get("split_scratch")
    zero = scratch is None or not scratch.any()
    if not (ok and zero):
        fails += 1
    return ok, zero, int(ia.sum())


t0 = time.time()
shapes = [(16, 4000)] if small else [(512, 65536), (64, 151936), (256, 262144)]
for R, V in shapes:
    for dtype in (torch.float32, torch.bfloat16):
        for kw in ([{}, dict(dense_words=1, chunk_words=2)] if small else
                   [{}, dict(chunk_words=256), dict(dense_words=32, chunk_words=64), dict(dense_words=64, chunk_words=96)]):
            for seed in range(2 if small else 4):
                res = case(R, V, dtype, seed, **kw)
                print(R, V, str(dtype), kw, seed, "identical, scratch zero, infeasible rows:", res, flush=True)

# CUDA graph capture of apply(): replay on fresh inputs equals the reference.
if not small:
    R, V = 256, 151936
    cons = LogitsConstraints(R, V, dev)
    for s in range(R):
        cons.set(s, min_tokens=4, stop_token_ids=[2, 0], logit_bias={5: 1.0})
    buf = torch.randn(R, V, device=dev, dtype=torch.bfloat16)
    slots = torch.arange(R, device=dev)
    pos = torch.zeros(R, dtype=torch.int64, device=dev)
    bm = pack(torch.rand(R, V, device=dev) < 0.001)
    bm[::2] = 0
    bm[::2, 0] = 4
    out = cons.apply(buf, slots, pos, bitmask=bm)  # warm: compile + scratch
    torch.cuda.synchronize()
    gph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(gph):
        out = cons.apply(buf, slots, pos, bitmask=bm)
    for it in range(3):
        x = torch.randn(R, V, device=dev, dtype=torch.bfloat16)
        x[1::3] = NEG
        buf.copy_(x)
        gph.replay()
        ref = x.clone()
        ri = cons.apply(ref, slots, pos, bitmask=bm, backend="torch")
        good = same(buf, ref) and torch.equal(out, ri)
        fails += not good
        print("graph replay", it, "identical:", good, "infeasible:", int(ri.sum()), flush=True)
print("stress fails:", fails, "in", round(time.time() - t0, 1), "s")
sys.exit(1 if fails else 0)
