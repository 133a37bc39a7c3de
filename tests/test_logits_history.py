"""``LogitsConstraints.load_history``: an engine's device token table as the output history.

vLLM's model runner V2 keeps each request's tokens on the device
(``all_token_ids[slot, :total_len]``, the output from ``prompt_len`` on) and never hands
the output to the host; ``load_history`` copies the last ``C_pfx`` of them into the
multi-token bad words' history ring. Whatever the table and offsets, the masks must equal
those of a state fed the same outputs through ``append_tokens``.
"""

from __future__ import annotations

import random

import pytest

torch = pytest.importorskip("torch")

from stopline.logits import LogitsConstraints  # noqa: E402

V, SLOTS = 48, 6
DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("seed", range(20))
def test_load_history_equals_append_tokens(device, seed):
    rng = random.Random(seed)
    words = [[rng.randrange(4) for _ in range(rng.randint(2, 5))] for _ in range(4)]
    by_table, by_append = LogitsConstraints(SLOTS, V, device), LogitsConstraints(SLOTS, V, device)
    table = torch.full((SLOTS, 40), 3, dtype=torch.int32)
    starts, ends, outputs = [], [], {}
    for slot in range(SLOTS):
        kw = {"bad_words": words[: rng.randint(1, 4)], "logit_bias": {1: 0.5}}
        by_table.set(slot, **kw)
        by_append.set(slot, **kw)
        start = rng.randint(0, 6)
        out = [rng.randrange(4) for _ in range(rng.randint(0, 12))]
        table[slot, start : start + len(out)] = torch.tensor(out, dtype=torch.int32)
        starts.append(start)
        ends.append(start + len(out))
        outputs[slot] = out
        by_append.append_tokens(slot, out)
    batch = rng.sample(range(SLOTS), rng.randint(1, SLOTS))
    idx = torch.tensor(batch, device=device)
    by_table.load_history(idx, table.to(device), torch.tensor(starts, device=device)[idx],
                          torch.tensor(ends, device=device)[idx])
    positions = torch.tensor([len(outputs[s]) for s in batch], device=device)
    logits = torch.randn(len(batch), V, device=device)
    a, b = logits.clone(), logits.clone()
    by_table.apply(a, idx, positions)
    by_append.apply(b, idx, positions)
    assert torch.equal(a, b)
    # Loading again (the next step, one more token each) replaces rather than appends.
    for slot in batch:
        outputs[slot].append(rng.randrange(4))
        table[slot, ends[slot]] = outputs[slot][-1]
        ends[slot] += 1
        by_append.append_tokens(slot, outputs[slot][-1:])
    by_table.load_history(idx, table.to(device), torch.tensor(starts, device=device)[idx],
                          torch.tensor(ends, device=device)[idx])
    a, b = logits.clone(), logits.clone()
    by_table.apply(a, idx, positions + 1)
    by_append.apply(b, idx, positions + 1)
    assert torch.equal(a, b)


def test_load_history_refuses_bad_tensors():
    cons = LogitsConstraints(2, V)
    cons.set(0, bad_words=[[1, 2]])
    ok = torch.zeros(1, dtype=torch.int64)
    with pytest.raises(TypeError, match="table"):
        cons.load_history(ok, torch.zeros(2, 4), ok, ok)
    with pytest.raises(ValueError, match="starts must be 1-D with one entry per slot") as info:
        cons.load_history(ok, torch.zeros(2, 4, dtype=torch.int32), torch.zeros(2, dtype=torch.int64), ok)
    assert info.value.field == "starts"
    cons.load_history(ok[:0], torch.zeros(2, 4, dtype=torch.int32), ok[:0], ok[:0])  # an empty batch: nothing
