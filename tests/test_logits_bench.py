"""The GPU suite's CPU-testable parts: the bitmask packing, the vLLM-source
loader, the CUDA check, and the scenarios and their check at tiny sizes (the
Triton kernel under TRITON_INTERPRET=1 without CUDA)."""

from __future__ import annotations

import sys

import pytest
from triton_cpu import interpret_without_cuda

torch = pytest.importorskip("torch")

CUDA = torch.cuda.is_available()
interpret_without_cuda(CUDA)

from stopline.logits.reference import unpack_bitmask  # noqa: E402
from stopline.tools.bench import logits as suite  # noqa: E402


def test_pack_is_xgrammar_layout_and_round_trips():
    g = torch.Generator().manual_seed(0)
    for V in (1, 31, 32, 33, 100):
        keep = torch.rand(3, V, generator=g) < 0.5
        words = suite._pack(keep)
        assert words.dtype == torch.int32 and words.shape == (3, (V + 31) // 32)
        assert torch.equal(unpack_bitmask(words, V), keep)
    assert suite._pack(torch.tensor([[False] * 31 + [True]])).tolist() == [[-(2**31)]]


def test_vllm_loader_names_what_is_missing(tmp_path, monkeypatch):
    monkeypatch.setenv(suite.ENV_VLLM_SRC, str(tmp_path))
    chain, note = suite.load_vllm_chain()
    if note.endswith("(installed)"):
        pytest.skip("vLLM is installed here: the loader takes it")
    assert chain is None and "lacks" in note and "bad_words.py" in note


def test_vllm_loader_runs_the_files_with_stand_ins_only_for_their_imports(tmp_path, monkeypatch):
    """Files shaped like vLLM's (their imports of vllm names) load, and no stand-in module
    stays in sys.modules afterwards."""
    files = {
        "v1/sample/logits_processor/interface.py":
            "from vllm import SamplingParams\nclass BatchUpdate:\n    pass\n",
        "v1/sample/logits_processor/builtin.py":
            "from vllm import SamplingParams\nfrom vllm.utils.torch_utils import async_tensor_h2d\n"
            "from vllm.v1.sample.logits_processor.interface import BatchUpdate\n"
            "def h2d(x):\n    return async_tensor_h2d(x, device='cpu', dtype=None)\n",
        "v1/sample/ops/bad_words.py": "import torch\ndef apply_bad_words(logits, words, past):\n    return None\n",
        "version.txt": "0.33.0\n",
    }
    for rel, text in files.items():
        path = tmp_path / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    monkeypatch.setenv(suite.ENV_VLLM_SRC, str(tmp_path))
    before = {k for k in sys.modules if k == "vllm" or k.startswith("vllm.")}
    chain, note = suite.load_vllm_chain()
    if note.endswith("(installed)"):
        pytest.skip("vLLM is installed here: the loader takes it")
    assert chain is not None and "0.33.0" in note, note
    assert chain["builtin"].h2d([1, 2]).tolist() == [1, 2]
    assert hasattr(chain["interface"], "BatchUpdate") and callable(chain["bad_words"].apply_bad_words)
    assert {k for k in sys.modules if k == "vllm" or k.startswith("vllm.")} == before


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only error")
def test_logits_suite_says_it_needs_cuda():
    with pytest.raises(RuntimeError, match="needs a CUDA GPU"):
        suite.run_grid([1], [64], ["float32"], [0.5])


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_forced_scenario_runs_and_checks_at_tiny_sizes(dtype):
    """The 'forced' scenario (every fourth slot forced with LogitsConstraints.force,
    issue 21) runs through the Triton kernel beside 'all' and passes the suite's
    check: triton == torch reference for both, each forced row finite at the
    forced id only, the others as under 'all'; its row gets a 'forced vs all' cell."""
    case = suite.Case(6, 160, dtype, 0.5, device="cuda" if CUDA else "cpu", backend="triton")
    assert [s for s in range(6) if case.forced.forced_token(s) is not None] == [1, 5]
    for which in ("all", "forced", "bitmask", "min"):
        case.stopline(which)()
    assert suite._check(case, {}) == "ok"
    out = case.base.clone()
    case.forced.apply(out, case.slots, case.pos, bitmask=case.bitmask, backend="triton")
    ref = case.base.clone()
    case.all.apply(ref, case.slots, case.pos, bitmask=case.bitmask, backend="triton")
    for row in range(6):
        if row % suite.FORCED_EVERY == 1:
            assert torch.isfinite(out[row]).nonzero().flatten().tolist() == [suite.FORCED_ID]
        else:
            assert torch.equal(out[row], ref[row])
    rec = dict(dtype=dtype, vocab=160, rows=6, frac=0.5, copy=1.0, bitmask=2.0, all=4.0, forced=4.2, checked="ok")
    line = suite.format_row(rec)
    assert line.count("|") == suite.header().splitlines()[0].count("|") and "| 1.05x | ok |" in line


def test_floor_kernel_flags_rows_whose_slot_is_out_of_range():
    """The 'floor' column's kernel does the least an apply-shaped launch does: each row reads
    its slot and writes its flag (True when the slot is outside [0, rows))."""
    from stopline.tools.bench.floor_kernel import slot_to_flag

    dev = "cuda" if CUDA else "cpu"
    slots = torch.tensor([0, 3, -1, 5, 2], device=dev)
    flags = torch.ones(5, dtype=torch.bool, device=dev)
    slot_to_flag(slots, flags)
    assert flags.tolist() == [False, False, True, True, False]


@pytest.mark.parametrize("chunks", [1, 3])
def test_floor_split_kernel_writes_the_flags_once_per_row_and_resets_its_words(chunks):
    """'floor split': rows x chunks programs, the last arrival per row writes the flag and
    leaves the row's arrival word at zero for the next launch."""
    from stopline.tools.bench.floor_kernel import arrival_to_flag

    dev = "cuda" if CUDA else "cpu"
    slots = torch.tensor([0, 7, 2, -3], device=dev)
    scratch = torch.zeros(4, dtype=torch.int64, device=dev)
    for _ in range(2):
        flags = torch.ones(4, dtype=torch.bool, device=dev)
        arrival_to_flag(slots, flags, scratch, chunks)
        assert flags.tolist() == [False, True, False, True] and scratch.tolist() == [0, 0, 0, 0]


@pytest.mark.parametrize("chunks", [1, 3])
def test_attribution_floors_write_the_same_flags(chunks):
    """The attribution's floors (no arrival, every program storing, an add nobody waits
    for, an acquire-release arrival) write the flags the plain floor writes; the
    arrival leaves its words at zero, the unawaited add counts every program."""
    from stopline.tools.bench.floor_kernel import arrival_to_flag, grid_flag

    dev = "cuda" if CUDA else "cpu"
    slots = torch.tensor([0, 7, 2, -3], device=dev)
    zeroed = torch.zeros(4, dtype=torch.int64, device=dev)
    growing = torch.zeros(4, dtype=torch.int64, device=dev)
    for kw in ({}, {"all_store": True}, {"add": True}, {"acq_rel": True}):
        flags = torch.ones(4, dtype=torch.bool, device=dev)
        if "acq_rel" in kw:
            arrival_to_flag(slots, flags, zeroed, chunks, acq_rel=True)
        else:
            grid_flag(slots, flags, growing, chunks, **kw)
        assert flags.tolist() == [False, True, False, True], kw
    assert zeroed.tolist() == [0] * 4 and growing.tolist() == [chunks] * 4


def test_attribution_states_each_hold_one_kind_of_the_all_constraints():
    """Each variant state applies one kind of the 'all' scenario's constraints, and the
    Triton kernel agrees with the torch reference on it."""
    from stopline.tools.bench import logits_attribution as attribution

    case = suite.Case(4, 160, "float32", 0.5, device="cuda" if CUDA else "cpu", backend="triton")
    case.bitmask.fill_(-1)  # every token kept: what each constraint changes does not depend on the draw
    states = attribution.variant_states(case)
    assert list(states) == list(attribution.VARIANTS)
    changed = {}
    plain = case.base.clone()
    case.plain.apply(plain, case.slots, case.pos, bitmask=case.bitmask, backend="torch")
    for name, cons in states.items():
        a, b = case.base.clone(), case.base.clone()
        ia = cons.apply(a, case.slots, case.pos, bitmask=case.bitmask, backend="triton")
        ib = cons.apply(b, case.slots, case.pos, bitmask=case.bitmask, backend="torch")
        assert torch.equal(a, b) and torch.equal(ia, ib), name
        changed[name] = not torch.equal(a, plain)
    # min_tokens masks the stop ids, the bias moves logits, the bans and the firing
    # multi-token word mask ids; with
    # min_tokens reached the stop ids change nothing. The allowed ids (4096 random draws)
    # cover all 160 tokens here: the dense mask is set on half the slots but keeps every token.
    assert changed == {"+min": True, "+min_off": False, "+bias": True, "+ban1": True, "+badmulti": True,
                       "+allowed": False}
    assert states["+allowed"].state.any_allowed and not states["+bias"].state.any_allowed


def test_chunks_per_row_is_the_grid_apply_launches():
    from stopline.logits.triton_kernel import chunks_per_row, split_words
    from stopline.logits.tuning import DEFAULT_TILES

    dw, _, _, pps, wave, _ = DEFAULT_TILES["float32"]
    dev = torch.device("cuda" if CUDA else "cpu")
    sms = torch.cuda.get_device_properties(0).multi_processor_count if CUDA else 1
    for rows, V in [(1, 128256), (256, 151936), (4096, 32000)]:
        W = (V + 31) // 32
        assert chunks_per_row(rows, V, torch.float32, dev) == -(-W // split_words(rows, W, dw, pps, sms, wave))
