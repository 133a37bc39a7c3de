"""stopline.logits: torch reference == Triton kernel, bit for bit, and both == the spec.

On a machine without CUDA the kernel runs under Triton's interpreter
(TRITON_INTERPRET=1, set below before the kernel module is decorated); with
CUDA the same tests run the compiled kernel on the GPU. A slow per-row oracle
written straight from docs/semantics.md section 8 checks the reference itself.
"""

from __future__ import annotations

import random
import sys

import pytest
from triton_cpu import interpret_without_cuda

torch = pytest.importorskip("torch")  # the [torch] extra; CI installs it

CUDA = torch.cuda.is_available()
interpret_without_cuda(CUDA)  # before @triton.jit decorates the kernel module

from stopline.logits import LogitsConstraints  # noqa: E402
from stopline.logits.reference import apply_reference, unpack_bitmask  # noqa: E402
from stopline.logits.triton_kernel import apply_triton  # noqa: E402
from stopline.logits.tuning import DEFAULT_TILES, KernelTuning  # noqa: E402

DEVICE = "cuda" if CUDA else "cpu"
# The interpreter's float16 cast warns when a bias overflows to inf, which tests do on purpose.
pytestmark = pytest.mark.filterwarnings("ignore:overflow encountered in cast:RuntimeWarning")
DTYPES = [torch.float32, torch.bfloat16, torch.float16]
NEG = float("-inf")


# ---------------------------------------------------------------- helpers
def bits_of(t: torch.Tensor) -> torch.Tensor:
    return t.view({torch.float32: torch.int32, torch.bfloat16: torch.int16, torch.float16: torch.int16}[t.dtype])


def assert_bit_identical(a: torch.Tensor, b: torch.Tensor) -> None:
    """Same bits everywhere, except that any NaN equals any NaN (payloads differ by device)."""
    nan = torch.isnan(a.float())
    assert torch.equal(nan, torch.isnan(b.float())), "NaN positions differ"
    diff = (bits_of(a) != bits_of(b)) & ~nan
    if diff.any():
        r, c = diff.nonzero()[0].tolist()
        raise AssertionError(f"logits differ at row {r}, token {c}: {a[r, c].item()} vs {b[r, c].item()}")


def pack(allowed_rows: list[set[int]], V: int) -> torch.Tensor:
    """xgrammar layout: int32 [rows, ceil(V/32)], bit j of word w = token 32*w+j allowed."""
    W = (V + 31) // 32
    out = torch.zeros((len(allowed_rows), W), dtype=torch.int64)
    for r, toks in enumerate(allowed_rows):
        for t in toks:
            out[r, t // 32] |= 1 << (t % 32)
    return torch.where(out >= 2**31, out - 2**32, out).to(torch.int32)


def run_both(cons, logits, slots, pos, **kw):
    """apply() through both backends on copies; assert bit-identical; return (logits, infeasible)."""
    a, b = logits.clone(), logits.clone()
    inf_a = cons.apply(a, slots, pos, backend="torch", **kw)
    inf_b = cons.apply(b, slots, pos, backend="triton", **kw)
    assert_bit_identical(a, b)
    assert torch.equal(inf_a, inf_b), (inf_a, inf_b)
    return a, inf_a


# ---------------------------------------------------------------- oracle
def oracle_row(row, V, cfg, seq, position, allowed_bits, is_grammar):
    """docs/semantics.md section 8 for one row, written as plainly as possible.

    cfg: the kwargs given to set() (None = no constraints); seq: the output
    tokens at positions 0..position-1 (None where unknown); allowed_bits: the
    grammar's allowed set for this row or None.
    """
    row = row.clone()
    cfg = cfg or {}
    if cfg.get("force") is not None:
        # LogitsConstraints.force: only the forced id stays, with its input logit (0 if not finite).
        f = cfg["force"]
        out = torch.full_like(row, NEG)
        out[f] = row[f] if torch.isfinite(row[f]) else 0.0
        return out, False
    # 1. semantic masks
    for allowed in (allowed_bits, cfg.get("allowed_token_ids")):
        if allowed is not None:
            banned = [t for t in range(V) if t not in set(allowed)]
            row[banned] = NEG
    for word in cfg.get("bad_words", ()):
        prefix = list(word[:-1])
        if len(seq) >= len(prefix) and seq[len(seq) - len(prefix):] == prefix:
            row[word[-1]] = NEG
    after_semantic = row.clone()
    # 2. min_tokens with restore-when-all-masked
    stops = list(cfg.get("stop_token_ids", ()))
    if position < cfg.get("min_tokens", 0) and stops:
        for t in stops:
            row[t] = NEG
        # "All masked" means every logit is -inf: a NaN or +inf left keeps the row
        # live, and only finite stop logits come back (vLLM 0.33's restore agrees).
        if not (row != NEG).any():
            policy = cfg.get("restore", "structured")
            if policy == "always" or (policy == "structured" and is_grammar):
                for t in stops:
                    if torch.isfinite(after_semantic[t]):
                        row[t] = after_semantic[t]
    # 3. logit_bias
    for t, bias in (cfg.get("logit_bias") or {}).items():
        row[t] = (row[t].float() + torch.tensor(bias, dtype=torch.float32)).to(row.dtype)
    return row, not bool(torch.isfinite(row).any())


# ---------------------------------------------------------------- random cases
def random_case(rng: random.Random, V: int, dtype, n_slots: int = 5, n_rows: int = 8, drop: tuple[str, ...] = ()):
    alphabet = list(range(min(V, 6)))  # bad words and history from a small alphabet, so words fire
    cfgs, histories = {}, {}
    for slot in range(n_slots):
        if rng.random() < 0.15:
            continue
        cfg = {}
        stops = rng.sample(range(V), rng.choice([0, 1, 1, 2, 3]))
        if rng.random() < 0.3:
            stops += rng.sample(alphabet, 1)  # a stop id that is also a bad word / allowed candidate
        cfg["stop_token_ids"] = stops
        cfg["min_tokens"] = rng.choice([0, 1, 3, 5, 8, 1000])
        cfg["restore"] = rng.choice(["structured", "always", "never"])
        r = rng.random()
        if r < 0.15:
            cfg["allowed_token_ids"] = list(stops) or [rng.randrange(V)]  # only stops allowed
        elif r < 0.35:
            cfg["allowed_token_ids"] = rng.sample(range(V), rng.randint(1, min(V, 12)))
        if rng.random() < 0.5:
            words = []
            for _ in range(rng.randint(1, 5)):
                length = rng.choice([1, 1, 2, 2, 3, 4])
                words.append([rng.choice(alphabet) for _ in range(length)])
            if rng.random() < 0.2:
                words.append([rng.randrange(V)])
            cfg["bad_words"] = words
        if rng.random() < 0.45:
            ids = rng.sample(range(V), rng.randint(1, min(V, 6)))
            cfg["logit_bias"] = {
                t: rng.choice([rng.uniform(-5, 5), 100.0, -100.0, 7e4, 0.0]) for t in ids
            }
        if rng.random() < 0.12:
            cfg["force"] = rng.choice([rng.randrange(V), *stops[:1]])  # a thinking budget's end marker
        cfgs[slot] = {k: v for k, v in cfg.items() if k not in drop}
        histories[slot] = [rng.choice(alphabet) for _ in range(rng.randint(0, 6))]

    rows = []
    for _ in range(n_rows):
        slot = rng.randrange(n_slots)
        n = len(histories.get(slot, []))
        rows.append((slot, n + rng.choice([0, 0, 0, 1, 2, 3])))  # offsets > 0: speculative draft rows
    D = 3
    draft = [[rng.choice(alphabet + [-1]) for _ in range(D)] for _ in rows]

    logits = torch.randn(n_rows, V) * rng.choice([1.0, 4.0])
    for r in range(n_rows):
        u = rng.random()
        if u < 0.08:
            logits[r] = NEG  # arrives empty
        elif u < 0.12:
            logits[r] = float("nan")  # a broken model row
        elif u < 0.25:
            # finite only at a few tokens, possibly far from the first scan block
            keep = rng.sample(range(V), rng.randint(1, 3))
            row = torch.full((V,), NEG)
            row[keep] = logits[r, keep]
            logits[r] = row
        elif u < 0.3:
            logits[r, rng.randrange(V)] = float("inf")
    logits = logits.to(dtype)

    bitmask = grammar_rows = None
    grammar_sets = [None] * n_rows
    if rng.random() < 0.6:
        for r, (slot, _) in enumerate(rows):
            u = rng.random()
            stops = cfgs.get(slot, {}).get("stop_token_ids", [])
            if u < 0.3:
                grammar_sets[r] = set(stops) or {rng.randrange(V)}  # grammar allows only stop ids
            elif u < 0.4:
                grammar_sets[r] = set()  # a dead grammar state
            elif u < 0.6:
                grammar_sets[r] = set(range(V))
            else:
                grammar_sets[r] = set(rng.sample(range(V), rng.randint(1, V)))
        bitmask = pack(grammar_sets, V)
        if rng.random() < 0.5:
            grammar_rows = torch.tensor([rng.random() < 0.6 for _ in rows], dtype=torch.bool)
    return cfgs, histories, rows, draft, logits, bitmask, grammar_rows, grammar_sets


def build(cfgs, histories, n_slots, V, device):
    cons = LogitsConstraints(n_slots, V, device)
    for slot, cfg in cfgs.items():
        cons.set(slot, **{k: v for k, v in cfg.items() if k != "force"})
        if cfg.get("force") is not None:
            cons.force(slot, cfg["force"])
        cons.append_tokens(slot, histories[slot])
    return cons


def check_case(seed: int, V: int, dtype, with_oracle: bool, drop: tuple[str, ...] = ()) -> None:
    rng = random.Random(seed)
    cfgs, hist, rows, draft, logits, bitmask, grammar_rows, gsets = random_case(rng, V, dtype, drop=drop)
    cons = build(cfgs, hist, 5, V, DEVICE)
    dev = torch.device(DEVICE)
    slots = torch.tensor([s for s, _ in rows], device=dev)
    pos = torch.tensor([p for _, p in rows], device=dev, dtype=torch.int32)
    draft_t = torch.tensor(draft, device=dev)
    kw = dict(
        bitmask=None if bitmask is None else bitmask.to(dev),
        grammar_rows=None if grammar_rows is None else grammar_rows.to(dev),
        draft_token_ids=draft_t,
    )
    out, infeasible = run_both(cons, logits.to(dev), slots, pos, **kw)
    if CUDA:  # the CPU reference agrees with the GPU too
        cpu = build(cfgs, hist, 5, V, "cpu")
        ref = logits.clone()
        ref_inf = cpu.apply(ref, slots.cpu(), pos.cpu(), backend="torch",
                            bitmask=bitmask, grammar_rows=grammar_rows, draft_token_ids=draft_t.cpu())
        assert_bit_identical(out.cpu(), ref)
        assert torch.equal(infeasible.cpu(), ref_inf)
    if not with_oracle:
        return
    for r, (slot, p) in enumerate(rows):
        n = len(hist.get(slot, []))
        seq = list(hist.get(slot, [])) + list(draft[r][: p - n])
        is_grammar = bitmask is not None and (grammar_rows is None or bool(grammar_rows[r]))
        want, want_inf = oracle_row(logits[r], V, cfgs.get(slot), seq, p,
                                    gsets[r] if is_grammar else None, is_grammar)
        assert_bit_identical(out[r : r + 1].cpu(), want[None])
        assert bool(infeasible[r]) == want_inf, (r, slot, p)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("V", [37, 100])
def test_random_cases_match_oracle(V, dtype):
    # Breadth comes from the interpreter run; on a GPU each case compiles a kernel variant.
    for seed in range(25 if not CUDA else 8):
        check_case(seed * 1000 + V, V, dtype, with_oracle=True)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_random_cases_multi_block(dtype):
    # V spans several scan blocks (1024), not a multiple of 32.
    for seed in range(6):
        check_case(seed, 4133, dtype, with_oracle=False)


# ---------------------------------------------------------------- rows split over several programs
def _kernel_module():
    return sys.modules["stopline.logits.triton_kernel"]


@pytest.fixture
def split(monkeypatch):
    """force(dense_words, chunk_words[, scan_words]): tiny tiles so small rows span several chunk programs."""

    def force(dense_words, chunk_words, scan_words=32, prefetch=1):
        # Every LogitsConstraints built from here on gets this tuning.
        tiles = {dt: (dense_words, scan_words, 4, 8, 0, prefetch) for dt in DEFAULT_TILES}
        forced = KernelTuning(tiles=tiles, chunk_words=chunk_words)
        monkeypatch.setattr(KernelTuning, "from_env", classmethod(lambda cls, environ=None: forced))

    return force


# (vocab, dense words per tile, words per chunk, prefetch): one tile per chunk, and chunks that end
# inside a tile (the tile's words past the chunk belong to the next program).
SPLITS = [(100, 1, 1, 1), (100, 2, 3, 0), (100, 2, 5, 1), (4133, 8, 20, 1)]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("V, dense_words, chunk_words, prefetch", SPLITS)
def test_random_cases_split_rows_match_oracle(split, V, dense_words, chunk_words, prefetch, dtype):
    # 32-logit scan blocks: early exit over several blocks too
    split(dense_words, chunk_words, scan_words=1, prefetch=prefetch)
    for seed in range(3 if V > 100 else 8 if not CUDA else 3):
        check_case(seed * 1000 + V, V, dtype, with_oracle=V <= 100)


# Without bans and bad words the kernel loads a grammar row's first tile before the slot is known;
# without stop and bias ids too, a chunk's arrival does not release its stores.
WITHOUT_SPARSE = [("bad_words",), ("bad_words", "stop_token_ids", "logit_bias")]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("drop", WITHOUT_SPARSE, ids=len)
@pytest.mark.parametrize("V, dense_words, chunk_words, prefetch", [(100, 1, 1, 0), (100, 2, 5, 1), (37, 1, 1000, 1)])
def test_random_cases_without_sparse_entries_match_oracle(split, V, dense_words, chunk_words, prefetch, dtype, drop):
    split(dense_words, chunk_words, scan_words=1, prefetch=prefetch)
    for seed in range(10 if not CUDA else 3):
        check_case(seed * 1000 + V, V, dtype, with_oracle=True, drop=drop)


def test_split_row_decides_on_the_count_of_all_chunks(split):
    """Each chunk sees only part of the row; restore and infeasible must use the row's total."""
    split(1, 1)  # V=200: 7 chunks of 32 tokens
    V = 200
    cons = LogitsConstraints(4, V, DEVICE)
    cons.set(0, min_tokens=5, stop_token_ids=[EOS])                     # grammar rows, structured restore
    cons.set(1, min_tokens=5, stop_token_ids=[EOS, 150], restore="always")
    cons.set(2, allowed_token_ids=[70, 190], bad_words=[[190], [3, 70]])
    cons.set(3, allowed_token_ids=[100], logit_bias={100: 6e4})
    cons.append_tokens(2, [3])
    logits = torch.randn(6, V, device=DEVICE).to(torch.float16)
    logits[4, 100] = 3e4
    grammar = [
        {EOS, 190},   # row 0: EOS in chunk 0, 190 in chunk 5: left = 1 -> EOS masked, no restore
        {EOS},        # row 1: only EOS -> masked, left = 0 -> restored
        set(),        # row 2: no grammar row (grammar_rows False); allowed {70, 190} both banned -> infeasible
        {EOS, 150},   # row 3 (slot 1): both stop ids, in chunks 0 and 4 -> all masked -> restored ("always")
        set(range(V)),  # row 4 (slot 3): allowed only 100 (chunk 3), bias overflows fp16 -> infeasible
        {199},        # row 5 (slot 0): the last chunk's only token, finite -> feasible, EOS masked
    ]
    bitmask = pack(grammar, V).to(DEVICE)
    grammar_rows = torch.tensor([True, True, False, True, True, True], device=DEVICE)
    rows = ([0, 0, 2, 1, 3, 0], [0, 0, 1, 0, 0, 0])  # row 2 at position 1: [3, 70] fires after [3]
    out, infeasible = run_both(cons, logits, *rows, bitmask=bitmask, grammar_rows=grammar_rows)
    assert infeasible.tolist() == [False, False, True, False, True, False]
    assert out[0, EOS] == NEG and out[0, 190] == logits[0, 190]
    assert out[1, EOS] == logits[1, EOS] and torch.isfinite(out[1]).sum() == 1
    assert out[3, EOS] == logits[3, EOS] and out[3, 150] == logits[3, 150]
    assert out[4, 100] == float("inf")
    assert out[5, 199] == logits[5, 199] and torch.isfinite(out[5]).sum() == 1
    # the per-row scratch words are back to zero for the next launch
    assert not _kernel_module()._scratch(cons.state, 6, DEVICE).any()
    out2, infeasible2 = run_both(cons, logits, *rows, bitmask=bitmask, grammar_rows=grammar_rows)
    assert_bit_identical(out, out2)
    assert torch.equal(infeasible, infeasible2)


def test_bans_in_every_tile_and_chunk_of_a_grammar_row(split):
    """Bans (static, or a firing bad word's last token from history or draft) in a chunk's first
    tile, a later tile and another chunk all end -inf and uncounted; a banned grammar row's only
    token leaves it infeasible, and min_tokens restores a row whose only other token is banned."""
    split(2, 5)  # V=320: chunks of 5 words (160 tokens), tiles of 2 words (64 tokens)
    V = 320
    cons = LogitsConstraints(3, V, DEVICE)
    # 3 and 40: chunk 0's first tile; 70: its second tile; 161 and 170: chunk 1's first tile.
    cons.set(0, bad_words=[[3], [40], [70], [161], [9, 170]])
    cons.set(1, bad_words=[[5], [9, 12, 200]], min_tokens=2, stop_token_ids=[EOS])
    cons.set(2, bad_words=[[7]], allowed_token_ids=[7, 8])
    cons.append_tokens(0, [9])
    cons.append_tokens(1, [9])
    logits = torch.randn(4, V, device=DEVICE)
    rows = ([0, 1, 1, 2], [1, 2, 1, 0])
    draft = torch.tensor([[0], [12], [0], [0]], device=DEVICE)  # row 1: history 9 + draft 12: 200 fires
    keep = [set(range(V)), set(range(V)), {5, EOS}, {7}]  # row 2: banned 5, and EOS below min_tokens
    bitmask = pack(keep, V).to(DEVICE)
    out, infeasible = run_both(cons, logits, *rows, bitmask=bitmask, draft_token_ids=draft)
    assert [bool(torch.isneginf(out[0, t])) for t in (3, 40, 70, 161, 170)] == [True] * 5
    assert torch.isfinite(out[0]).sum() == V - 5
    assert torch.isneginf(out[1, 5]) and torch.isneginf(out[1, 200]) and torch.isfinite(out[1]).sum() == V - 2
    assert out[2, EOS] == logits[2, EOS] and torch.isfinite(out[2]).sum() == 1  # restored
    assert infeasible.tolist() == [False, False, False, True]  # row 3: its one allowed id is banned


def test_split_rows_mixed_with_sparse_rows_many_rows(split):
    """Dense rows split over chunks beside sparse rows (chunk 0 only), repeated calls on one state."""
    split(*((2, 2) if CUDA else (4, 8)))  # 16 / 4 chunks a row
    rng = random.Random(7)
    V, R, S = 1000, 256 if CUDA else 16, 8
    cons = LogitsConstraints(S, V, DEVICE)
    for s in range(S):
        stops = rng.sample(range(V), 2)
        kw = dict(min_tokens=3, stop_token_ids=stops, restore=rng.choice(["structured", "always", "never"]),
                  bad_words=[[rng.randrange(V)], [1, rng.randrange(V)]], logit_bias={rng.randrange(V): 1.5})
        if s % 3 == 0:
            kw["allowed_token_ids"] = stops + rng.sample(range(V), rng.randint(0, 2))
        cons.set(s, **kw)
        cons.append_tokens(s, [1])
    for _ in range(3):
        sets = [set(rng.sample(range(V), rng.randint(0, 3))) for _ in range(R)]
        slots = [rng.randrange(S) for _ in range(R)]
        for r in range(R):
            if rng.random() < 0.3:
                sets[r] |= set(cons_stop for cons_stop in cons.state.stop_ids[slots[r]].tolist() if cons_stop >= 0)
        bitmask = pack(sets, V).to(DEVICE)
        grammar_rows = torch.tensor([rng.random() < 0.5 for _ in range(R)], device=DEVICE)
        logits = torch.randn(R, V, device=DEVICE)
        logits[torch.rand(R, V, device=DEVICE) < 0.2] = NEG
        run_both(cons, logits, slots, [rng.randrange(5) for _ in range(R)], bitmask=bitmask,
                 grammar_rows=grammar_rows)


def test_split_heuristic_fills_the_gpu_and_uses_whole_tiles():
    mod = _kernel_module()
    # 256 rows x 151936 (4748 words, 19 tiles of 256 words), 132 SMs, 8 programs per SM: 5 chunks a row.
    words = mod.split_words(256, 4748, 256, 8, 132)
    assert words % 256 == 0 and -(-4748 // words) == 5
    assert mod.split_words(1024, 4748, 256, 8, 132) == 10 * 256  # 2 chunks
    assert mod.split_words(4096, 4748, 256, 8, 132) >= 4748  # enough rows: one program per row
    assert mod.split_words(1, 4748, 256, 8, 132) == 256  # at most one chunk per tile
    assert mod.split_words(8, 4748, 256, 0, 132) >= 4748  # 0 programs per SM: never split
    # One wave of 10 programs per SM when it gives every row >= 2 chunks, else ~32 programs per SM.
    assert -(-4748 // mod.split_words(256, 4748, 64, 32, 132, 10)) == 5  # 1280 programs <= 1320
    assert -(-4748 // mod.split_words(1024, 4748, 64, 32, 132, 10)) == 5  # ceil(32 * 132 / 1024)
    assert mod.split_words(4, 1 << 26, 64, 32, 132, 10) <= 16383 * 64  # pair counters stay in 16 bits


def test_resident_programs_follow_cudas_occupancy_rule():
    """The one-wave grid uses what the compiled kernel fits on an SM (H200: 65536 registers,
    2048 threads, 228 KiB shared memory), not the tuning's WAVE_PROGS: these register counts
    are the bfloat16 'bitmask' (48) and 'all' (55) kernels and the float32 one (62), as ncu
    reported them."""
    mod = _kernel_module()
    h200 = dict(regs_per_sm=65536, threads_per_sm=2048, shared_per_sm=233472)
    assert [mod.resident_programs(r, 0, 4, **h200) for r in (48, 55, 62, 72)] == [10, 9, 8, 7]
    assert mod.resident_programs(16, 0, 16, **h200) == 4  # 2048 threads / 512
    assert mod.resident_programs(16, 50_000, 4, **h200) == 4  # 228 KiB / (50,000 + 1 KiB reserved)
    assert mod.resident_programs(16, 50_000, 4, 65536, 2048, 0) == 16  # shared memory not given
    assert mod.resident_programs(255, 0, 32, **h200) == 1  # never 0
    # 256 rows x 151936 on 132 SMs: 9 resident programs give 4 chunks a row (1024 programs,
    # one wave) where the static 10 gives 5 (1280, over the 1188 that fit: a tail wave).
    assert -(-4748 // mod.split_words(256, 4748, 64, 32, 132, 9)) == 4


def test_split_heuristic_on_a_large_vocab_matches_reference():
    # Default tiles and split heuristic (on the CPU it counts one "SM"): 2 rows get several chunks each.
    V = 151936
    cons = LogitsConstraints(2, V, DEVICE)
    cons.set(0, min_tokens=4, stop_token_ids=[EOS, V - 1], bad_words=[[V - 2]], logit_bias={V - 3: -1.0})
    cons.set(1, min_tokens=4, stop_token_ids=[EOS], allowed_token_ids=[EOS, 77777])
    logits = torch.randn(2, V, device=DEVICE).to(torch.bfloat16)
    bitmask = pack([{EOS, V - 1, V - 2, V - 3}, {EOS, 77777}], V).to(DEVICE)
    out, infeasible = run_both(cons, logits, [0, 1], [0, 0], bitmask=bitmask)
    assert infeasible.tolist() == [False, False]
    assert out[0, V - 3] == (logits[0, V - 3].float() - 1.0).to(torch.bfloat16)  # only the biased id left
    assert out[0, EOS] == NEG and out[0, V - 1] == NEG and out[0, V - 2] == NEG
    assert out[1, EOS] == NEG and out[1, 77777] == logits[1, 77777]


def test_16_bit_pairs_and_per_logit_paths_agree():
    """Even-length 16-bit rows are masked as int32 pairs; an odd row stride forces the per-logit path."""
    mod = _kernel_module()
    V = 4134
    cons = LogitsConstraints(3, V, DEVICE)
    cons.set(0, min_tokens=4, stop_token_ids=[EOS, V - 1], bad_words=[[V - 2]], logit_bias={V - 3: -1.0})
    cons.set(1, allowed_token_ids=[7, 4000, V - 1], logit_bias={7: 2.0})
    for dtype in (torch.bfloat16, torch.float16):
        wide = torch.randn(3, V + 1, device=DEVICE).to(dtype)
        wide[1, 4000] = float("nan")
        wide[2, :64] = NEG
        odd = wide[:, :V]  # row stride V + 1: not 4-byte aligned rows
        assert mod._pairs_ok(odd.contiguous()) and not mod._pairs_ok(odd)
        bitmask = pack([{EOS, V - 1, V - 2, V - 3, 33}, set(range(V)), set(range(0, V, 3))], V).to(DEVICE)
        a, b = odd.contiguous(), odd.clone()
        ia = cons.apply(a, [0, 1, 2], [0, 0, 0], bitmask=bitmask, backend="triton")
        ib = cons.apply(b, [0, 1, 2], [0, 0, 0], bitmask=bitmask, backend="triton")
        assert_bit_identical(a, b)
        assert torch.equal(ia, ib)
        run_both(cons, odd.contiguous(), [0, 1, 2], [0, 0, 0], bitmask=bitmask)


def test_many_stop_and_bias_ids_take_the_sequential_tail():
    """Past 2048 stop x bias pairs the last program gathers stop and bias logits one after the other."""
    V = 5000
    rng = random.Random(3)
    cons = LogitsConstraints(2, V, DEVICE)
    stops = rng.sample(range(V), 40)
    bias = {t: rng.choice([1.0, -2.5, 6e4]) for t in rng.sample(range(V), 60) + stops[:5]}
    cons.set(0, min_tokens=3, stop_token_ids=stops, logit_bias=bias, restore="always")
    cons.set(1, min_tokens=3, stop_token_ids=stops[:3], logit_bias={stops[0]: 1.0, 11: 2.0})
    assert cons.state.stop_ids.shape[1] * cons.state.bias_ids.shape[1] > 2048
    for dtype in DTYPES:
        logits = torch.randn(4, V, device=DEVICE).to(dtype)
        grammar = [set(stops), set(stops[:3]) | {11}, set(range(V)), {stops[0]}]
        bitmask = pack(grammar, V).to(DEVICE)
        run_both(cons, logits, [0, 1, 0, 1], [0, 0, 5, 0], bitmask=bitmask)


# ---------------------------------------------------------------- named engine failures
EOS = 2


def test_grammar_allows_only_eos_below_min_tokens_is_restored():
    """xgrammar says only EOS; min_tokens masks it; 'structured' restores it and the row stops."""
    from stopline import FinishTracker, StopParams

    V = 64
    cons = LogitsConstraints(2, V, DEVICE)
    cons.set(0, min_tokens=5, stop_token_ids=[EOS])
    logits = torch.randn(1, V, device=DEVICE)
    bitmask = pack([{EOS}], V).to(DEVICE)
    out, infeasible = run_both(cons, logits, [0], [1], bitmask=bitmask)
    assert not infeasible[0]
    assert out[0, EOS] == logits[0, EOS]
    assert torch.isinf(out[0]).sum() == V - 1
    token = int(out[0].argmax())
    assert token == EOS
    tracker = FinishTracker(StopParams(min_tokens=5, eos_token_ids=[EOS], max_tokens=100))
    tracker.update([9])
    result = tracker.update([token])
    assert result.finished and result.finish_reason == "stop"


def test_plain_min_tokens_without_grammar_keeps_eos_masked():
    V = 64
    cons = LogitsConstraints(1, V, DEVICE)
    cons.set(0, min_tokens=3, stop_token_ids=[EOS])
    logits = torch.zeros(2, V, device=DEVICE)
    logits[:, EOS] = 50.0  # the model wants to stop
    out, infeasible = run_both(cons, logits, [0, 0], [2, 3])
    assert out[0, EOS] == NEG and int(out[0].argmax()) != EOS  # position 2 < 3
    assert out[1, EOS] == 50.0 and int(out[1].argmax()) == EOS  # position 3: allowed again
    assert not infeasible.any()


def test_structured_policy_does_not_restore_non_grammar_rows():
    # allowed_token_ids is not a grammar: below min_tokens the row is empty and reported.
    V = 64
    cons = LogitsConstraints(1, V, DEVICE)
    cons.set(0, min_tokens=3, stop_token_ids=[EOS], allowed_token_ids=[EOS])
    out, infeasible = run_both(cons, torch.randn(1, V, device=DEVICE), [0], [0])
    assert infeasible.tolist() == [True]
    assert torch.isinf(out).all()
    cons.set(0, min_tokens=3, stop_token_ids=[EOS], allowed_token_ids=[EOS], restore="always")
    logits = torch.randn(1, V, device=DEVICE)
    out, infeasible = run_both(cons, logits, [0], [0])
    assert infeasible.tolist() == [False] and out[0, EOS] == logits[0, EOS]


# docs/semantics.md 8.2: "all masked" means every logit -inf, and a restore puts
# back only finite stop logits. vLLM 0.33's MinTokensLogitsProcessor restore
# (PR #54218: isneginf(...).all() and finite values only) agrees.
@pytest.mark.parametrize("bad", [float("nan"), float("inf")], ids=["nan", "+inf"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_nan_or_inf_outside_the_stops_does_not_block_the_restore(bad, dtype):
    """stopline's "nothing left" is "no finite logit": a NaN or +inf elsewhere in the row
    does not stop the restore (vLLM 0.33 treats it as live and restores nothing: 6.17)."""
    V = 64
    cons = LogitsConstraints(1, V, DEVICE)
    cons.set(0, min_tokens=5, stop_token_ids=[EOS], restore="always")
    logits = torch.randn(2, V, device=DEVICE).to(dtype)
    logits[0, 9] = bad                      # row 0: the grammar allows EOS and a broken 9
    bitmask = pack([{EOS, 9}, {EOS}], V).to(DEVICE)
    out, infeasible = run_both(cons, logits, [0, 0], [1, 1], bitmask=bitmask)
    assert out[0, EOS] == logits[0, EOS]       # restored: nothing finite was left
    assert_bit_identical(out[0, 9:10], logits[0, 9:10])  # the fault is left as it was
    assert infeasible.tolist() == [False, False]
    assert out[1, EOS] == logits[1, EOS]         # the clean row is restored too


@pytest.mark.parametrize("bad", [float("nan"), float("inf")], ids=["nan", "+inf"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_restore_puts_back_only_finite_stop_logits(bad, dtype):
    V = 64
    cons = LogitsConstraints(1, V, DEVICE)
    cons.set(0, min_tokens=5, stop_token_ids=[EOS, 7], logit_bias={7: 1.0, EOS: 0.5})
    logits = torch.randn(2, V, device=DEVICE).to(dtype)
    logits[:, 7] = bad
    bitmask = pack([{EOS, 7}, {7}], V).to(DEVICE)
    out, infeasible = run_both(cons, logits, [0, 0], [0, 0], bitmask=bitmask)
    # Row 0: EOS comes back (plus its bias), the broken stop logit stays -inf.
    want = (logits[0, EOS].float() + 0.5).to(dtype)
    assert out[0, EOS] == want and out[0, 7] == NEG and int(out[0].argmax()) == EOS
    # Row 1: the only allowed stop is not finite, so nothing comes back.
    assert out[1, 7] == NEG and infeasible.tolist() == [False, True]


def test_split_row_nan_in_another_chunk_does_not_block_the_restore(split):
    split(1, 1)  # V=200: 7 chunks of 32 tokens; the NaN is in chunk 5, EOS in chunk 0
    V = 200
    cons = LogitsConstraints(1, V, DEVICE)
    cons.set(0, min_tokens=5, stop_token_ids=[EOS])
    logits = torch.randn(2, V, device=DEVICE)
    logits[0, 190] = float("nan")
    out, infeasible = run_both(cons, logits, [0, 0], [0, 0], bitmask=pack([{EOS, 190}, {EOS, 191}], V).to(DEVICE))
    assert out[0, EOS] == logits[0, EOS] and infeasible.tolist() == [False, False]
    assert out[1, EOS] == NEG and out[1, 191] == logits[1, 191]


def test_never_policy_reports_the_conflict():
    V = 64
    cons = LogitsConstraints(1, V, DEVICE)
    cons.set(0, min_tokens=5, stop_token_ids=[EOS], restore="never")
    out, infeasible = run_both(cons, torch.randn(1, V, device=DEVICE), [0], [0], bitmask=pack([{EOS}], V).to(DEVICE))
    assert infeasible.tolist() == [True]


def test_allowed_equals_single_bad_word_is_infeasible_not_token_zero():
    V = 64
    cons = LogitsConstraints(1, V, DEVICE)
    cons.set(0, allowed_token_ids=[17], bad_words=[[17]])
    logits = torch.randn(3, V, device=DEVICE)
    out, infeasible = run_both(cons, logits, [0, 0, 0], [0, 1, 2])
    assert infeasible.tolist() == [True, True, True]
    assert torch.isinf(out).all()  # argmax would silently say 0; the flag says "error"


def test_several_eos_ids_all_masked_below_min_tokens():
    # SmolLM2: <|endoftext|>=0 and <|im_end|>=2 both end a sequence.
    V = 64
    cons = LogitsConstraints(1, V, DEVICE)
    cons.set(0, min_tokens=4, stop_token_ids=[0, 2, 2, 0])
    logits = torch.randn(2, V, device=DEVICE)
    out, infeasible = run_both(cons, logits, [0, 0], [3, 4])
    assert out[0, 0] == NEG and out[0, 2] == NEG
    assert torch.isfinite(out[0]).sum() == V - 2
    assert torch.equal(out[1], logits[1])
    assert not infeasible.any()


# ---------------------------------------------------------------- forced token (thinking budget)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_forced_token_row_keeps_only_the_forced_logit(dtype):
    """force(): every column -inf but the forced id, which keeps its input logit; the grammar,
    allowed ids, bans, min_tokens and bias of the slot do not apply to it; other slots are untouched."""
    V = 100
    END = 68  # e.g. </think>: not allowed by the grammar, banned, and a stop id below min_tokens
    cons = LogitsConstraints(3, V, DEVICE)
    cons.set(0, min_tokens=5, stop_token_ids=[END, EOS], allowed_token_ids=[1, 2, 3], bad_words=[[END]],
             logit_bias={END: -50.0, 1: 3.0})
    cons.set(1, min_tokens=5, stop_token_ids=[EOS])
    cons.force(0, END)
    assert cons.forced_token(0) == END and cons.forced_token(1) is None
    logits = torch.randn(3, V, device=DEVICE).to(dtype)
    bitmask = pack([{1, 2}, {2, 3}, {EOS}], V).to(DEVICE)
    out, infeasible = run_both(cons, logits, [0, 1, 0], [0, 0, 9], bitmask=bitmask)
    for r in (0, 2):
        assert out[r, END] == logits[r, END]
        assert torch.isinf(out[r, :END]).all() and torch.isinf(out[r, END + 1:]).all()
    assert torch.isfinite(out[1]).sum() == 1  # slot 1 as without any forcing: {2, 3} less EOS
    assert infeasible.tolist() == [False, False, False]
    cons.force(0, None)
    out, _ = run_both(cons, logits[:1], [0], [0], bitmask=bitmask[:1])
    assert out[0, END] == NEG and torch.isfinite(out[0]).sum() == 1  # back to the slot's constraints


@pytest.mark.parametrize("bad", [float("nan"), NEG, float("inf")], ids=["nan", "-inf", "+inf"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_forced_token_with_a_non_finite_logit_is_never_empty(bad, dtype):
    V = 70
    cons = LogitsConstraints(1, V, DEVICE)
    cons.force(0, 69)  # the last column, in a partial last mask word
    logits = torch.full((2, V), bad, device=DEVICE).to(dtype)
    logits[1, 69] = 1.5
    out, infeasible = run_both(cons, logits, [0, 0], [0, 0], bitmask=pack([set(), set()], V).to(DEVICE))
    assert out[0, 69] == 0.0 and out[1, 69] == 1.5
    assert torch.isinf(out[:, :69]).all() and (out[:, :69] < 0).all()
    assert not infeasible.any()


def test_forced_token_split_row_and_lifecycle(split):
    split(1, 1)  # one 32-token chunk per program: the forced id is owned by one chunk of seven
    V = 200
    cons = LogitsConstraints(2, V, DEVICE)
    cons.set(0, min_tokens=3, stop_token_ids=[150])
    cons.force(0, 150)
    cons.force(1, 5)
    logits = torch.randn(2, V, device=DEVICE)
    out, infeasible = run_both(cons, logits, [0, 1], [0, 0])
    assert torch.isfinite(out).sum(dim=1).tolist() == [1, 1]
    assert out[0, 150] == logits[0, 150] and out[1, 5] == logits[1, 5]
    cons.set(1)  # set() and clear() end the forcing
    cons.clear(0)
    assert cons.forced_token(0) is None and cons.forced_token(1) is None
    out, _ = run_both(cons, logits, [0, 1], [0, 0])
    assert torch.equal(out, logits)


@pytest.mark.parametrize("bad, exc", [(-1, ValueError), (64, ValueError), (2.0, TypeError), (True, TypeError)])
def test_forced_token_is_validated_before_any_launch(bad, exc):
    cons = LogitsConstraints(2, 64, DEVICE)
    with pytest.raises(exc, match="force token_id"):
        cons.force(0, bad)
    with pytest.raises(ValueError, match="slot"):
        cons.force(2, 1)
    assert cons.forced_token(0) is None and (cons.state.forced == -1).all()


def test_out_of_vocab_logit_bias_raises_before_any_launch():
    V = 64
    cons = LogitsConstraints(2, V, DEVICE)
    cons.set(0, logit_bias={5: 2.0})
    before = [t.clone() for t in (cons.state.bias_ids, cons.state.bias_values)]
    with pytest.raises(ValueError, match=r"logit_bias.*64"):
        cons.set(0, logit_bias={5: 1.0, 64: 3.0})
    with pytest.raises(ValueError, match=r"logit_bias.*-1"):
        cons.set(1, logit_bias={-1: 3.0})
    assert torch.equal(before[0], cons.state.bias_ids) and torch.equal(before[1], cons.state.bias_values)
    logits = torch.zeros(1, V, device=DEVICE)
    out, _ = run_both(cons, logits, [0], [0])
    assert out[0, 5] == 2.0 and (out[0, :5] == 0).all()


# ---------------------------------------------------------------- semantics details
def test_multi_token_bad_word_uses_history_and_draft_tokens():
    V = 32
    cons = LogitsConstraints(2, V, DEVICE)
    cons.set(0, bad_words=[[4, 5, 6], [9]])
    cons.append_tokens(0, [1, 4])
    logits = torch.zeros(4, V, device=DEVICE)
    # row 0: position 2 after [1, 4] -> no; row 1: draft [5] at position 3 -> [4, 5] matches -> ban 6;
    # row 2: draft [7] -> no; row 3: draft row without a supplied token -> unknown -> no.
    draft = torch.tensor([[-1], [5], [7], [-1]], device=DEVICE)
    out, _ = run_both(cons, logits, [0, 0, 0, 0], [2, 3, 3, 3], draft_token_ids=draft)
    assert (out[:, 9] == NEG).all()
    assert out[:, 6].tolist() == [0.0, NEG, 0.0, 0.0]
    cons.append_tokens(0, torch.tensor([5], device=DEVICE))  # committed: [1, 4, 5]
    out, _ = run_both(cons, torch.zeros(1, V, device=DEVICE), [0], [3])
    assert out[0, 6] == NEG


def test_bias_is_added_in_float32_and_rounded_once():
    V = 8
    cons = LogitsConstraints(1, V, DEVICE)
    cons.set(0, logit_bias={1: 0.1, 2: 1e-3})
    for dtype in DTYPES:
        logits = torch.full((1, V), 1.0, device=DEVICE).to(dtype)
        out, _ = run_both(cons, logits, [0], [0])
        assert out[0, 1] == (torch.tensor(1.0) + torch.tensor(0.1, dtype=torch.float32)).to(dtype)
        assert out[0, 2] == (torch.tensor(1.0) + torch.tensor(1e-3, dtype=torch.float32)).to(dtype)


def test_bias_overflow_to_inf_is_infeasible():
    # fp16 max is 65504: a finite logit plus a finite bias can become +inf, which is not finite.
    V = 4
    cons = LogitsConstraints(1, V, DEVICE)
    cons.set(0, allowed_token_ids=[1], logit_bias={1: 6e4})
    logits = torch.full((1, V), 3e4, device=DEVICE).to(torch.float16)
    out, infeasible = run_both(cons, logits, [0], [0])
    assert out[0, 1] == float("inf") and infeasible.tolist() == [True]


def test_rows_that_arrive_empty_or_nan_are_infeasible():
    V = 3000  # the early-exit count must walk several blocks
    cons = LogitsConstraints(1, V, DEVICE)
    cons.set(0, min_tokens=2, stop_token_ids=[7], restore="always")
    logits = torch.full((3, V), NEG, device=DEVICE)
    logits[1] = float("nan")
    logits[2, 7] = 1.0  # only the stop id is finite: masked, then restored
    out, infeasible = run_both(cons, logits, [0, 0, 0], [0, 0, 0])
    assert infeasible.tolist() == [True, True, False]
    assert out[2, 7] == 1.0


def test_grammar_rows_select_where_the_bitmask_applies():
    V = 40
    cons = LogitsConstraints(1, V, DEVICE)
    cons.set(0, min_tokens=9, stop_token_ids=[EOS])
    bitmask = pack([{EOS}, {EOS}], V).to(DEVICE)
    grammar_rows = torch.tensor([True, False], device=DEVICE)
    logits = torch.randn(2, V, device=DEVICE)
    out, infeasible = run_both(cons, logits, [0, 0], [0, 0], bitmask=bitmask, grammar_rows=grammar_rows)
    assert out[0, EOS] == logits[0, EOS] and torch.isinf(out[0]).sum() == V - 1  # restored
    assert out[1, EOS] == NEG and torch.isfinite(out[1]).sum() == V - 1  # no grammar: untouched but EOS
    assert not infeasible.any()


def test_bitmask_matches_xgrammar_layout_bits():
    V = 70
    words = torch.tensor([[-(2**31) | 1, 0b101, 1 << 5]], dtype=torch.int32)  # tokens 0, 31, 32, 34, 69
    assert unpack_bitmask(words, V).nonzero()[:, 1].tolist() == [0, 31, 32, 34, 69]
    cons = LogitsConstraints(1, V, DEVICE)
    out, _ = run_both(cons, torch.zeros(1, V, device=DEVICE), [0], [0], bitmask=words.to(DEVICE))
    assert torch.isfinite(out[0]).nonzero()[:, 0].tolist() == [0, 31, 32, 34, 69]


def test_out_of_range_slot_on_device_is_left_alone_and_reported():
    # Device row_slots are not synced to the host for a range check; the kernel guards instead.
    V = 16
    cons = LogitsConstraints(2, V, DEVICE)
    cons.set(0, min_tokens=5, stop_token_ids=[1])
    logits = torch.randn(3, V, device=DEVICE)
    dev_slots = torch.tensor([0, 2, -1], device=DEVICE)
    pos = torch.zeros(3, dtype=torch.int64, device=DEVICE)
    a, b = logits.clone(), logits.clone()
    ia = apply_reference(cons.state, a, dev_slots, pos, None, None, None, cons.max_slots)
    ib = apply_triton(cons.state, b, dev_slots, pos, None, None, None, cons.max_slots)
    assert_bit_identical(a, b)
    assert ia.tolist() == ib.tolist() == [False, True, True]
    assert torch.equal(a[1:], logits[1:])


def test_corrupted_state_ids_never_write_out_of_bounds():
    V = 16
    cons = LogitsConstraints(1, V, DEVICE)
    cons.set(0, min_tokens=5, stop_token_ids=[1], bad_words=[[3], [4]], logit_bias={2: 1.0, 6: 0.5})
    st = cons.state
    st.stop_ids[0, 1] = V + 3
    st.ban_ids[0, 1] = V
    st.bias_ids[0, 1] = 10 * V
    buf = torch.zeros(5, V, device=DEVICE)
    for backend in ("torch", "triton"):
        buf.zero_()
        cons.apply(buf[1:3], [0, 0], [0, 0], backend=backend)
        assert (buf[0] == 0).all() and (buf[3:] == 0).all(), backend
        assert buf[1, 1] == NEG and buf[1, 3] == NEG and buf[1, 2] == 1.0


@pytest.mark.parametrize("bad", [16, 1 << 30, -7])
def test_corrupted_forced_id_is_not_forced_and_never_written_out_of_bounds(bad):
    """force() validates on the host; a forced-token table corrupted behind its back is read
    by both backends as "not forced", never as an address."""
    V = 16
    cons = LogitsConstraints(1, V, DEVICE)
    cons.set(0, logit_bias={2: 1.0})
    cons.state.forced[0] = bad
    buf = torch.zeros(5, V, device=DEVICE)
    for backend in ("torch", "triton"):
        buf.zero_()
        inf = cons.apply(buf[1:3], [0, 0], [0, 0], backend=backend, bitmask=pack([{1, 2}, {2}], V).to(DEVICE))
        assert (buf[0] == 0).all() and (buf[3:] == 0).all(), backend
        assert buf[1, 2] == 1.0 and buf[1, 1] == 0.0 and torch.isfinite(buf[1:3]).sum() == 3, backend
        assert not inf.any()


# ---------------------------------------------------------------- state management
def test_set_and_clear_touch_only_their_slot():
    V = 50
    cons = LogitsConstraints(4, V, DEVICE)
    cons.set(1, min_tokens=3, stop_token_ids=[2, 3], logit_bias={4: 1.0}, bad_words=[[5, 6]])
    cons.set(2, allowed_token_ids=[1, 2, 3])
    tables = {k: v for k, v in vars(cons.state).items() if isinstance(v, torch.Tensor)}
    snapshot = {k: (v.data_ptr(), v.clone()) for k, v in tables.items()}
    cons.set(3, min_tokens=1, stop_token_ids=[7], logit_bias={8: -1.0}, bad_words=[[9, 10]])
    cons.clear(1)
    for k, v in vars(cons.state).items():
        if not isinstance(v, torch.Tensor):
            continue
        ptr, old = snapshot[k]
        assert v.data_ptr() == ptr, f"{k} was reallocated"
        others = [i for i in range(4) if i not in (1, 3)]
        if v.dim() and v.shape[0] == 4:
            assert torch.equal(v[others], old[others]), k
    logits = torch.zeros(3, V, device=DEVICE)
    out, _ = run_both(cons, logits, [1, 2, 3], [0, 0, 0])
    assert torch.isfinite(out[0]).all()  # cleared
    assert torch.isfinite(out[1]).sum() == 3
    assert out[2, 7] == NEG and out[2, 8] == -1.0


def test_growing_a_table_keeps_other_slots_and_history():
    V = 30
    cons = LogitsConstraints(3, V, DEVICE)
    cons.set(0, bad_words=[[1, 2]], stop_token_ids=[3], min_tokens=9)
    cons.append_tokens(0, [5, 5, 5, 1])
    # slot 1 needs wider tables: more stop ids, a longer bad word (history ring grows)
    cons.set(1, bad_words=[[1, 2, 3, 4, 7]], stop_token_ids=list(range(10, 19)), min_tokens=9)
    cons.append_tokens(1, [1, 2, 3])
    cons.append_tokens(0, [9, 1])
    cons.append_tokens(1, [4])
    out, _ = run_both(cons, torch.zeros(2, V, device=DEVICE), [0, 1], [6, 4])
    assert out[0, 2] == NEG and out[0, 3] == NEG and torch.isfinite(out[0]).sum() == V - 2
    assert out[1, 7] == NEG and (out[1, 10:19] == NEG).all()


# ---------------------------------------------------------------- validation
@pytest.mark.parametrize(
    "kwargs, exc, pattern",
    [
        (dict(stop_token_ids=[5, 99]), ValueError, r"stop_token_ids.*99"),
        (dict(stop_token_ids=[-1]), ValueError, r"stop_token_ids.*-1"),
        (dict(stop_token_ids=[1.5]), TypeError, r"stop_token_ids.*1.5"),
        (dict(allowed_token_ids=[]), ValueError, r"allowed_token_ids.*empty"),
        (dict(allowed_token_ids=[3, 64]), ValueError, r"allowed_token_ids.*64"),
        (dict(bad_words=[[1, 2], []]), ValueError, r"bad_words.*empty"),
        (dict(bad_words=[[1, 70]]), ValueError, r"bad_words.*70"),
        (dict(bad_words="abc"), TypeError, r"bad_words"),
        (dict(logit_bias={1: float("nan")}), ValueError, r"logit_bias.*1.*nan"),
        (dict(logit_bias={1: float("inf")}), ValueError, r"logit_bias.*inf"),
        (dict(logit_bias={1: 1e39}), ValueError, r"logit_bias.*float32"),
        (dict(logit_bias=[(1, 1.0), (1, 2.0)]), ValueError, r"logit_bias.*twice"),
        (dict(logit_bias={"1": 1.0}), TypeError, r"logit_bias"),
        (dict(restore="sometimes"), ValueError, r"restore.*sometimes"),
        (dict(min_tokens=-1), ValueError, r"min_tokens.*-1"),
        (dict(min_tokens=2.0), TypeError, r"min_tokens"),
    ],
)
def test_set_validation(kwargs, exc, pattern):
    cons = LogitsConstraints(2, 64, DEVICE)
    with pytest.raises(exc, match=pattern):
        cons.set(0, **kwargs)


def test_slot_validation():
    cons = LogitsConstraints(2, 64, DEVICE)
    for call in (lambda: cons.set(2), lambda: cons.clear(-1), lambda: cons.append_tokens(5, [1])):
        with pytest.raises(ValueError, match="slot"):
            call()
    with pytest.raises(TypeError, match="slot"):
        cons.set("0")
    with pytest.raises(ValueError, match="token_ids.*64"):
        cons.append_tokens(0, [64])
    with pytest.raises(ValueError, match="max_slots"):
        LogitsConstraints(0, 10)


def test_apply_validation():
    V = 64
    cons = LogitsConstraints(2, V, DEVICE)
    good = torch.zeros(2, V, device=DEVICE)
    s = torch.tensor([0, 1], device=DEVICE)
    p = torch.tensor([0, 0], device=DEVICE)
    cases = [
        (lambda: cons.apply(good.to(torch.float64), s, p), TypeError, "dtype"),
        (lambda: cons.apply(torch.zeros(2, V - 1, device=DEVICE), s, p), ValueError, "vocab_size"),
        (lambda: cons.apply(torch.zeros(2, 2 * V, device=DEVICE)[:, ::2], s, p), ValueError, "contiguous"),
        (lambda: cons.apply(torch.zeros(2, V, device="meta"), s, p), ValueError, "state is on"),
        (lambda: cons.apply(good, s.float(), p), TypeError, "row_slots"),
        (lambda: cons.apply(good, s[:1], p), ValueError, "row_slots"),
        (lambda: cons.apply(good, [0, 2], p), ValueError, r"row_slots.*2"),
        (lambda: cons.apply(good, s, p, bitmask=torch.zeros(2, 1, dtype=torch.int32, device=DEVICE)),
         ValueError, "bitmask"),  # narrower than the logits: xgrammar would leave columns unmasked
        (lambda: cons.apply(good, s, p, bitmask=torch.zeros(2, 2, dtype=torch.int64, device=DEVICE)),
         TypeError, "bitmask"),
        (lambda: cons.apply(good, s, p, grammar_rows=torch.ones(2, dtype=torch.int32, device=DEVICE)),
         TypeError, "grammar_rows"),
        (lambda: cons.apply(good, s, p, backend="cuda"), ValueError, "backend"),
        (lambda: cons.apply(good, s, p, draft_token_ids=torch.zeros(3, 2, dtype=torch.int64, device=DEVICE)),
         ValueError, "draft_token_ids"),
    ]
    if not CUDA:
        # a CPU tensor costs nothing to range-check on the host
        cases.append((lambda: cons.apply(good, torch.tensor([0, 3]), p), ValueError, r"row_slots.*3"))
    for call, exc, pattern in cases:
        before = good.clone()
        with pytest.raises(exc, match=pattern):
            call()
        assert torch.equal(good, before)


def test_no_rows_is_a_no_op():
    cons = LogitsConstraints(1, 8, DEVICE)
    out = cons.apply(torch.zeros(0, 8, device=DEVICE), torch.zeros(0, dtype=torch.int64, device=DEVICE),
                     torch.zeros(0, dtype=torch.int64, device=DEVICE))
    assert out.shape == (0,) and out.dtype == torch.bool


def test_import_stopline_does_not_import_torch():
    import subprocess

    code = "import sys, stopline; assert 'torch' not in sys.modules, 'torch imported'; print('ok')"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and "ok" in done.stdout, done.stderr


@pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU")
def test_triton_path_does_not_sync_the_host():
    V = 65536  # 8 dense tiles: 8 rows are split over chunks (scratch counters, atomics)
    cons = LogitsConstraints(8, V, "cuda")
    cons.set(0, min_tokens=5, stop_token_ids=[2], bad_words=[[1, 2], [3]], logit_bias={5: 1.0})
    logits = torch.randn(8, V, device="cuda")
    slots = torch.zeros(8, dtype=torch.int64, device="cuda")
    pos = torch.arange(8, device="cuda")
    bitmask = torch.full((8, V // 32), -1, dtype=torch.int32, device="cuda")
    cons.apply(logits, slots, pos, bitmask=bitmask)  # compile outside the guard
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        cons.apply(logits, slots, pos, bitmask=bitmask)
    finally:
        torch.cuda.set_sync_debug_mode("default")


def test_the_forced_read_is_left_out_only_where_no_force_can_reach_the_launch(monkeypatch):
    """may_force, the kernel's forced-id read, per state: kept while a slot is forced and on a
    frozen default state (a graph serves a later force); left out on a frozen state reserved
    without forced tokens once no slot is forced. A slot forced before the freeze stays
    forced (one-hot row) through the Triton kernel."""
    import stopline.logits.triton_kernel as tk

    seen = []
    real = tk.apply_triton

    def spy(*args, **kwargs):
        seen.append(kwargs["may_force"])
        return real(*args, **kwargs)

    monkeypatch.setattr(tk, "apply_triton", spy)
    V = 96
    base = torch.randn(2, V, device=DEVICE)

    def run(cons):
        out = base.clone()
        infeasible = cons.apply(out, [0, 1], [0, 0], backend="triton")
        return out, infeasible

    unforced = LogitsConstraints(2, V, DEVICE, reserve={"forced_token": False})
    unforced.force(0, 7)
    unforced.freeze()
    out, infeasible = run(unforced)
    assert torch.isfinite(out[0]).nonzero().flatten().tolist() == [7] and not infeasible.any()
    assert_bit_identical(out[1], base[1])
    unforced.force(0, None)
    run(unforced)
    default = LogitsConstraints(2, V, DEVICE)
    run(default)
    default.freeze()
    run(default)
    assert seen == [True, False, False, True]


@pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU")
def test_cuda_graph_without_the_forced_read_replays_as_eager(monkeypatch):
    """reserve={"forced_token": False}: a graph captured with no slot forced leaves out the
    forced-id read; its replays equal eager applies, split rows and bitmask included, and a
    force() while frozen is refused (the graph could not serve it)."""
    V = 65536
    cons = LogitsConstraints(4, V, "cuda", reserve={"forced_token": False, "stop_token_ids": 4})
    cons.set(0, min_tokens=3, stop_token_ids=[1, 2])
    base = torch.randn(4, V, device="cuda")
    base[2, : V // 2] = float("-inf")
    work = base.clone()
    slots = torch.arange(4, device="cuda")
    pos = torch.zeros(4, dtype=torch.int64, device="cuda")
    rng = random.Random(23)
    sets = [set(rng.sample(range(V), 655)) for _ in range(3)] + [set()]  # row 3: an empty grammar row
    bitmask = pack(sets, V).to("cuda")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        cons.apply(work, slots, pos, bitmask=bitmask)
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    import stopline.logits.triton_kernel as tk

    seen = []
    real = tk.apply_triton
    monkeypatch.setattr(tk, "apply_triton", lambda *a, **k: seen.append(k["may_force"]) or real(*a, **k))
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        infeasible = cons.apply(work, slots, pos, bitmask=bitmask)
    monkeypatch.undo()
    assert seen == [False]  # the captured launch has no forced-id read
    with pytest.raises(RuntimeError, match="cannot be forced while the tables are frozen"):
        cons.force(1, 77)
    cons.set(1, min_tokens=1, stop_token_ids=[5])
    work.copy_(base)
    graph.replay()
    torch.cuda.synchronize()
    eager = base.clone()
    eager_inf = cons.apply(eager, slots, pos, bitmask=bitmask)
    ref = base.clone()
    ref_inf = cons.apply(ref, slots, pos, bitmask=bitmask, backend="torch")
    assert_bit_identical(work, eager)
    assert_bit_identical(work, ref)
    assert torch.equal(infeasible, eager_inf) and torch.equal(infeasible, ref_inf)
    assert infeasible.tolist() == [False, False, False, True]


@pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU")
def test_cuda_graph_replays_requests_set_after_capture():
    """A graph of apply() captured on a reserved state keeps serving requests set after the
    capture that are wider than any before it (tables fit the reserve, never reallocated), and a
    set() beyond the reserve is refused without touching the tables the graph reads."""
    V = 4096
    reserve = {"stop_token_ids": 16, "sparse_bans": 8, "logit_bias": 8, "bad_words": 4, "bad_word_tokens": 5}
    cons = LogitsConstraints(4, V, "cuda", reserve=reserve)
    cons.set(0, min_tokens=2, stop_token_ids=[1], bad_words=[[3]])
    base = torch.randn(4, V, device="cuda")
    work = base.clone()
    slots = torch.arange(4, device="cuda")
    pos = torch.zeros(4, dtype=torch.int64, device="cuda")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # compile and warm up outside the capture
        cons.apply(work, slots, pos)
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    ptrs = [t.data_ptr() for t in (cons.state.stop_ids, cons.state.bad_prefix, cons.state.bias_ids)]
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        infeasible = cons.apply(work, slots, pos)
    assert cons.frozen  # the capture froze the tables
    # Wider than anything set before the capture: 12 stop ids, 3 multi-token words of up to 5
    # tokens, 6 sparse bans, 7 bias ids.
    cons.set(1, min_tokens=8, stop_token_ids=list(range(10, 22)),
             bad_words=[[5, 6, 7, 8, 9], [5, 6, 7], [40, 41], [30], [31], [32], [33], [34], [35]],
             logit_bias={i: 0.5 for i in range(50, 57)})
    cons.append_tokens(1, [5, 6, 7, 8])
    pos.copy_(torch.tensor([0, 4, 0, 1], device="cuda"))
    work.copy_(base)
    graph.replay()
    torch.cuda.synchronize()
    got, got_inf = work.clone(), infeasible.clone()
    eager = base.clone()
    eager_inf = cons.apply(eager, slots, pos)
    assert_bit_identical(got, eager)
    assert torch.equal(got_inf, eager_inf)
    assert got[1, 9] == NEG and (got[1, 10:22] == NEG).all() and (got[1, 30:36] == NEG).all()
    assert torch.equal(got[1, 50:57], base[1, 50:57] + 0.5)
    assert [t.data_ptr() for t in (cons.state.stop_ids, cons.state.bad_prefix, cons.state.bias_ids)] == ptrs
    with pytest.raises(RuntimeError, match="frozen"):
        cons.set(2, stop_token_ids=list(range(100, 140)))
    with pytest.raises(RuntimeError, match="dense token mask"):
        cons.set(2, allowed_token_ids=[100, 200])
    work.copy_(base)
    graph.replay()
    torch.cuda.synchronize()
    assert_bit_identical(work, eager)
    # No slot was forced at the capture: a force() after it is still served by the graph.
    cons.force(3, 77)
    work.copy_(base)
    graph.replay()
    torch.cuda.synchronize()
    assert work[3, 77] == base[3, 77] and torch.isfinite(work[3]).sum() == 1
    eager = base.clone()
    assert torch.equal(infeasible, cons.apply(eager, slots, pos))
    assert_bit_identical(work, eager)
