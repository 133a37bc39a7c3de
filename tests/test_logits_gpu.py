"""The compiled kernel on real vocab sizes against the torch reference on the CPU.

Random constraint sets (stop ids, min_tokens and every restore policy, allowed
ids at 1% and 50%, one-token and multi-token bad words with draft rows,
logit_bias up to overflow, forced tokens) on vocabularies of real models, all
three logits dtypes, with NaN and +-inf logits, rows that arrive empty or
all-NaN, and grammar bitmasks from empty to full. The Triton output on the GPU
must equal the torch reference run on the CPU, bit for bit, flags included.
Needs CUDA (the interpreter would take hours at these sizes); runs on the H200.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

pytestmark = [
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
    pytest.mark.filterwarnings("ignore:overflow encountered in cast:RuntimeWarning"),
]

from stopline.logits import LogitsConstraints  # noqa: E402
from test_logits import DTYPES, assert_bit_identical  # noqa: E402

NEG = float("-inf")
SLOTS, ROWS = 16, 48
RESERVE = {"stop_token_ids": 8, "sparse_bans": 8, "logit_bias": 16, "bad_words": 4, "bad_word_tokens": 4,
           "allowed_token_ids": True}  # fixed table widths: one kernel variant per launch shape


def _ids(g: torch.Generator, V: int, n: int) -> list[int]:
    ids = torch.randint(0, V, (n,), generator=g).tolist()
    return ids + [V - 1] if torch.rand((), generator=g) < 0.2 else ids  # the last column too


def _random_state(g: torch.Generator, V: int):
    """Per-slot set() kwargs, forced ids and histories, drawn with torch (fast at any V)."""
    u = lambda: float(torch.rand((), generator=g))  # noqa: E731
    alphabet = [3, 4, 5, V - 2]
    cfgs, forced, hist = {}, {}, {}
    for s in range(SLOTS):
        if u() < 0.1:
            continue
        cfg: dict = {"stop_token_ids": _ids(g, V, int(torch.randint(0, 4, (), generator=g))),
                     "min_tokens": [0, 2, 6, 1000][int(torch.randint(0, 4, (), generator=g))],
                     "restore": ["structured", "always", "never"][int(torch.randint(0, 3, (), generator=g))]}
        r = u()
        if r < 0.15:
            cfg["allowed_token_ids"] = cfg["stop_token_ids"] or [int(torch.randint(0, V, (), generator=g))]
        elif r < 0.45:
            frac = 0.01 if u() < 0.5 else 0.5
            cfg["allowed_token_ids"] = torch.nonzero(torch.rand(V, generator=g) < frac)[:, 0].tolist() or [0]
        if u() < 0.5:
            words = [[i] for i in _ids(g, V, 3)]
            words += [[alphabet[int(torch.randint(0, 4, (), generator=g))] for _ in range(k)] for k in (2, 3, 4)]
            cfg["bad_words"] = words
        if u() < 0.5:
            vals = [2.5, -7.0, 100.0, 7e4, 3e38, 0.0]
            cfg["logit_bias"] = {t: vals[i % len(vals)] for i, t in enumerate(dict.fromkeys(_ids(g, V, 12)))}
        cfgs[s] = cfg
        if u() < 0.15:
            forced[s] = (cfg["stop_token_ids"] or _ids(g, V, 1))[0]
        hist[s] = [alphabet[int(torch.randint(0, 4, (), generator=g))] for _ in range(int(torch.randint(0, 5, (), generator=g)))]
    return cfgs, forced, hist


def _build(cfgs, forced, hist, V: int, device: str) -> LogitsConstraints:
    cons = LogitsConstraints(SLOTS, V, device, reserve=RESERVE)
    for s, cfg in cfgs.items():
        cons.set(s, **cfg)
        cons.append_tokens(s, hist[s])
    for s, t in forced.items():
        cons.force(s, t)
    return cons


def _random_logits(g: torch.Generator, V: int, dtype) -> torch.Tensor:
    x = torch.randn(ROWS, V, generator=g) * 4
    spots = torch.rand(ROWS, V, generator=g)
    x[spots < 1e-4] = float("nan")
    x[(spots >= 1e-4) & (spots < 2e-4)] = float("inf")
    x[(spots >= 2e-4) & (spots < 1e-2)] = NEG
    x[0] = NEG  # arrives empty
    x[1] = float("nan")
    x[2] = NEG
    x[2, torch.randint(0, V, (2,), generator=g)] = 1.0  # finite at two places only
    return x.to(dtype)  # float16 turns large values into +-inf too


def _random_bitmask(g: torch.Generator, V: int, stops: list[list[int]]) -> torch.Tensor:
    W = (V + 31) // 32
    fracs = torch.tensor([0.0, 0.01, 0.5, 1.0])[torch.randint(0, 4, (ROWS,), generator=g)]
    keep = torch.rand(ROWS, W * 32, generator=g) < fracs[:, None]
    for r in range(0, ROWS, 5):  # the grammar allows only the row's stop ids
        keep[r] = False
        keep[r, stops[r] or [0]] = True
    keep[:, V:] = False
    words = (keep.view(ROWS, W, 32).to(torch.int64) << torch.arange(32)).sum(-1)
    return torch.where(words >= 2**31, words - 2**32, words).to(torch.int32)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("V", [32000, 128256, 151936, 262144])
def test_random_constraints_on_real_vocab_match_cpu_reference(V, dtype):
    for seed in range(3):
        g = torch.Generator().manual_seed(seed * 7919 + V)
        cfgs, forced, hist = _random_state(g, V)
        slots = torch.randint(0, SLOTS, (ROWS,), generator=g)
        pos = torch.tensor([len(hist.get(int(s), [])) for s in slots]) + torch.randint(0, 3, (ROWS,), generator=g)
        draft = torch.tensor([3, 4, 5, V - 2])[torch.randint(0, 4, (ROWS, 3), generator=g)]
        logits = _random_logits(g, V, dtype)
        kw: dict = {"draft_token_ids": draft}
        if seed != 1:
            stops = [cfgs.get(int(s), {}).get("stop_token_ids", []) for s in slots]
            kw["bitmask"] = _random_bitmask(g, V, stops)
            if seed == 2:
                kw["grammar_rows"] = torch.rand(ROWS, generator=g) < 0.7
        gpu = _build(cfgs, forced, hist, V, "cuda")
        out = logits.cuda()
        inf_gpu = gpu.apply(out, slots.cuda(), pos.cuda(), backend="triton", **{k: v.cuda() for k, v in kw.items()})
        cpu = _build(cfgs, forced, hist, V, "cpu")
        ref = logits.clone()
        inf_ref = cpu.apply(ref, slots, pos, backend="torch", **kw)
        assert_bit_identical(out.cpu(), ref)
        assert torch.equal(inf_gpu.cpu(), inf_ref), (seed, inf_gpu.cpu(), inf_ref)
        assert not inf_ref[[r for r in range(ROWS) if int(slots[r]) in forced]].any()
