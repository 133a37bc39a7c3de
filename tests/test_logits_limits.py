"""LogitsConstraints under hostile requests: capped inputs, tables that follow
the live requests (and shrink when a large one is cleared), clear errors.

Runs on CPU with the torch reference backend (the Triton kernel reads the same
tables; the GPU check after merging runs tests/test_logits.py on CUDA). Not in
memory-limited children: torch needs a large address space of its own; the
caps are checked before any table is allocated, which is what is tested.
"""

from __future__ import annotations

import itertools
import os
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from stopline.logits import LIMITS, LogitsConstraints  # noqa: E402

V = 1000


def lc(slots: int = 4) -> LogitsConstraints:
    return LogitsConstraints(slots, V)


def masked(c: LogitsConstraints, slots: list[int], positions: list[int], backend: str = "torch") -> list[list[int]]:
    logits = torch.zeros(len(slots), V)
    c.apply(logits, slots, positions, backend=backend)
    return [torch.nonzero(torch.isinf(row)).flatten().tolist() for row in logits]


def test_max_slots_and_the_dense_table_are_capped() -> None:
    with pytest.raises(ValueError, match=f"max_slots=16385 is more than the supported {LIMITS['max_slots']}"):
        LogitsConstraints(LIMITS["max_slots"] + 1, V)
    with pytest.raises(ValueError, match="token-mask table"):
        LogitsConstraints(LIMITS["max_slots"], 2**30)
    with pytest.raises(ValueError, match="max_slots=1099511627776 is more than the supported"):
        LogitsConstraints(2**40, V)


@pytest.mark.parametrize(
    "kwargs,says",
    [
        ({"bad_words": [[1]] * (LIMITS["max_bad_words"] + 1)}, "bad_words has 1025 entries; at most 1024"),
        ({"bad_words": itertools.repeat([1, 2])}, "bad_words has more than 1024 entries"),
        ({"bad_words": [list(range(LIMITS["max_bad_word_tokens"] + 1))]}, "bad_words has 65 entries; at most 64"),
        ({"bad_words": [itertools.repeat(1)]}, "bad_words has more than 64 entries"),
        ({"stop_token_ids": range(2**40)}, "stop_token_ids has 1099511627776 entries; at most 65536"),
        ({"stop_token_ids": itertools.repeat(1)}, "stop_token_ids has more than 65536 entries"),
        ({"allowed_token_ids": range(2**62)}, "allowed_token_ids has 4611686018427387904 entries"),
        ({"logit_bias": ((i, 1.0) for i in itertools.count())}, "logit_bias has more than 65536 entries"),
        ({"logit_bias": {1: 10**400}}, "logit_bias: bias for token 1 is not finite in float32"),
        ({"logit_bias": {1: -(10**400)}}, "logit_bias: bias for token 1 is not finite in float32"),
    ],
)
def test_set_refuses_inputs_over_the_caps(kwargs: dict[str, Any], says: str) -> None:
    c = lc()
    with pytest.raises(ValueError, match=says.replace("*", r"\*")):
        c.set(0, **kwargs)
    assert not c._slots[0].active


def test_clear_errors_for_tensors_and_huge_ints() -> None:
    c = lc()
    with pytest.raises(TypeError, match="stop_token_ids: expected a 1-D sequence of token ids, got a 0-d tensor"):
        c.set(0, stop_token_ids=torch.tensor(5))
    with pytest.raises(ValueError, match="row_slots: slot 1180591620717411303424 is outside the int32 range"):
        c.apply(torch.zeros(1, V), [2**70], [0], backend="torch")
    with pytest.raises(ValueError, match="row_positions: position -9223372036854775809 is outside the int32 range"):
        c.apply(torch.zeros(1, V), [0], [-(2**63) - 1], backend="torch")
    with pytest.raises(ValueError, match="row_slots has more than 1 entries"):
        c.apply(torch.zeros(1, V), itertools.repeat(0), [0], backend="torch")


def test_a_mapping_that_raises_propagates() -> None:
    class Broken(dict):  # type: ignore[type-arg]
        def items(self) -> Any:
            raise LookupError("the caller's items() failed")

    with pytest.raises(LookupError, match="the caller's items"):
        lc().set(0, logit_bias=Broken({1: 1.0}))


def test_many_distinct_bias_ids_are_checked_in_linear_time() -> None:
    c = LogitsConstraints(2, 1 << 17)
    c.set(0, logit_bias={i: 0.5 for i in range(LIMITS["max_logit_bias"])})
    logits = torch.zeros(1, 1 << 17)
    c.apply(logits, [0], [0], backend="torch")
    assert float(logits[0, 7]) == 0.5 and float(logits[0, LIMITS["max_logit_bias"]]) == 0.0


def test_two_requests_cannot_multiply_the_bad_words_table_past_its_cap() -> None:
    c = LogitsConstraints(LIMITS["max_slots"], V)
    c.set(0, bad_words=[[1, i % V] for i in range(1024)])  # many short words
    with pytest.raises(ValueError, match="bad_words: .* would make the batch's bad-words table"):
        c.set(1, bad_words=[list(range(64))])  # one long word: 16384 x 1024 x 64 x 4 B
    assert not c._slots[1].active
    c.clear(0)  # the wide table goes with its request
    c.set(1, bad_words=[list(range(64))])
    assert tuple(c.state.bad_prefix.shape) == (LIMITS["max_slots"], 1, 64)


BACKENDS = ["torch"] + (["triton"] if os.environ.get("TRITON_INTERPRET") == "1" else [])


@pytest.mark.parametrize("backend", BACKENDS)
def test_tables_shrink_when_the_large_request_is_cleared(backend: str) -> None:
    c = lc()
    c.set(1, bad_words=[[5, 6]], stop_token_ids=[3])
    c.append_tokens(1, [9, 5])
    big_words = [[7] * 40 + [i] for i in range(512)]
    c.set(0, bad_words=big_words, stop_token_ids=list(range(300)), logit_bias={i: 1.0 for i in range(200)},
          allowed_token_ids=list(range(500)), min_tokens=5)
    wide = (c.state.stop_ids.shape[1], c.state.bias_ids.shape[1], tuple(c.state.bad_prefix.shape[1:]))
    assert wide == (512, 256, (512, 64)) and c.state.any_allowed
    c.clear(0)
    st = c.state
    assert (st.stop_ids.shape[1], st.bias_ids.shape[1], tuple(st.bad_prefix.shape[1:])) == (4, 0, (1, 1))
    assert not st.any_allowed and st.allowed.shape[0] == 0
    # Slot 1 answers exactly as in a state that never saw the large request.
    fresh = lc()
    fresh.set(1, bad_words=[[5, 6]], stop_token_ids=[3])
    fresh.append_tokens(1, [9, 5])
    for c_ in (c, fresh):
        c_.append_tokens(1, [5])
    got = masked(c, [1, 1], [3, 0], backend)
    assert got == masked(fresh, [1, 1], [3, 0], backend) and got[0] == [6]
