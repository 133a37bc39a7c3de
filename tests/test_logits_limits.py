"""LogitsConstraints under hostile requests: capped inputs, tables that follow
the live requests (and shrink when a large one is cleared), clear errors.

Runs on CPU with the torch reference backend (the Triton kernel reads the same
tables; the GPU check after merging runs tests/test_logits.py on CUDA). Not in
memory-limited children: torch needs a large address space of its own; the
caps are checked before any table is allocated, which is what is tested.
"""

from __future__ import annotations

import enum
import itertools
import numbers
import os
from collections.abc import Mapping
from decimal import Decimal
from fractions import Fraction
from typing import Any
from unittest import mock

import pytest
from hypothesis import given, reject, settings
from hypothesis import strategies as st

torch = pytest.importorskip("torch")
np = pytest.importorskip("numpy")

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


# ------------------------------------------- bad_words read by the core


def _table(words: Any, vocab: int = V) -> tuple[list[int], list[tuple[tuple[int, ...], int]]]:
    """The core's layout, back as (one-token words, (prefix, last) pairs)."""
    from stopline import _core

    single, prefix, plen, last, width = _core._bad_words_table(
        words, vocab, LIMITS["max_bad_words"], LIMITS["max_bad_word_tokens"])
    ints = [memoryview(b).cast("i").tolist() for b in (single, prefix, plen, last)]
    rows = [ints[1][i * width:(i + 1) * width] for i in range(len(ints[3]))]
    assert all(r[n:] == [-1] * (width - n) for r, n in zip(rows, ints[2]))
    return ints[0], [(tuple(r[:n]), t) for r, n, t in zip(rows, ints[2], ints[3])]


def test_the_core_lays_out_bad_words_as_the_python_reader_did() -> None:
    # The rule the Python code applied before the core took it over: one-token
    # words and (prefix, last) of the longer ones, each deduplicated keeping
    # the first occurrence.
    import random

    rng = random.Random(5)
    for _ in range(200):
        words = [[rng.randrange(6) for _ in range(rng.choice([1, 1, 2, 3, 5]))] for _ in range(rng.randrange(40))]
        single = list(dict.fromkeys(w[0] for w in words if len(w) == 1))
        multi = list(dict.fromkeys((tuple(w[:-1]), w[-1]) for w in words if len(w) > 1))
        assert _table(words) == (single, multi)
        assert _table([tuple(w) for w in words]) == (single, multi)


def test_bad_words_of_every_container_kind() -> None:
    np = pytest.importorskip("numpy")
    words = [[1], (2, 3), np.array([4, 5, 6], dtype=np.int32), bytearray(b"\x07\x08"), iter([9, 9]), [np.int64(3)]]
    assert _table(words) == ([1, 3], [((2,), 3), ((4, 5), 6), ((7,), 8), ((9,), 9)])


@pytest.mark.parametrize(
    "words,exc,says",
    [
        # The first bad word in order is reported, whatever kind of error a later one has.
        ([[1], [2, V], ["x"]], ValueError, f"bad_words: token id {V} is outside"),
        ([[1], ["x"], [V]], TypeError, "bad_words: token id 'x' is not an int"),
        ([[3, V, "x"]], ValueError, f"bad_words: token id {V} is outside"),
        ([[], [V]], ValueError, "bad_words: an empty word bans nothing"),
        ([[V], list(range(65))], ValueError, f"bad_words: token id {V} is outside"),
        ([list(range(65)), [V]], ValueError, "bad_words has 65 entries; at most 64"),
        ([[0, True]], TypeError, "bad_words: token id True is not an int"),
        ([[2**70]], ValueError, "bad_words: token id 1180591620717411303424 is outside"),
        ([[10**500]], ValueError, r"bad_words: token id 1000000000\d+\.\.\. \(501 bytes in all\) is outside"),
        (["ab"], TypeError, "bad_words: expected a sequence of token ids, got 'ab'"),
        ([b"\x01"], TypeError, "bad_words: expected a sequence of token ids, got b"),
        ([5], TypeError, "bad_words: expected a sequence of token ids, got 5"),
        ([torch.tensor(5)], TypeError, "bad_words: expected a 1-D sequence of token ids, got a 0-d Tensor"),
        ([torch.tensor([1, 2])], TypeError, r"bad_words: token id tensor\(1\) is not an int"),
    ],
)
def test_bad_words_errors_come_in_request_order(words: list[Any], exc: type, says: str) -> None:
    with pytest.raises(exc, match=says):
        _table(words)
    with pytest.raises(exc, match=says):
        lc().set(0, bad_words=words)


def test_a_bad_word_id_whose_index_raises_propagates() -> None:
    import numbers

    class Interrupts:
        def __index__(self) -> int:
            raise KeyboardInterrupt

    numbers.Integral.register(Interrupts)

    class Iterates:
        def __iter__(self) -> Any:
            raise KeyboardInterrupt

    for words in ([[1, Interrupts()]], [(Interrupts(),)], [[1], Iterates()]):
        with pytest.raises(KeyboardInterrupt):
            lc().set(0, bad_words=words)


# ------------------------------------------- CUDA-graph safety: reserve and freeze


def _shapes(c: LogitsConstraints) -> tuple[Any, ...]:
    st = c.state
    return (st.stop_ids.shape[1], st.ban_ids.shape[1], st.bias_ids.shape[1], tuple(st.bad_prefix.shape[1:]),
            st.allowed.shape[0], st.any_allowed, tuple(t.data_ptr() for t in (st.stop_ids, st.bad_prefix)))


def test_a_frozen_state_refuses_a_set_that_would_grow_a_table() -> None:
    c = lc()
    c.set(0, stop_token_ids=[1, 2], bad_words=[[3, 4]])
    c.freeze()
    before = _shapes(c)
    for kwargs, says in [
        ({"stop_token_ids": list(range(10))}, "10 stop_token_ids \\(the tables hold 4\\)"),
        ({"bad_words": [[5, 6, 7]]}, "2 bad_word_prefix \\(the tables hold 1\\)"),
        ({"logit_bias": {5: 1.0}}, "1 logit_bias \\(the tables hold 0\\)"),
        ({"allowed_token_ids": [5]}, "a dense token mask"),
    ]:
        with pytest.raises(RuntimeError, match=f"slot 1 needs {says}.*frozen.*reserve="):
            c.set(1, **kwargs)
        assert not c._slots[1].active and _shapes(c) == before
    c.set(1, stop_token_ids=[7, 8, 9], bad_words=[[5, 6]])  # fits: allowed while frozen
    c.clear(0)
    c.clear(1)
    assert _shapes(c) == before  # nothing shrinks while frozen
    c.unfreeze()
    c.set(1, stop_token_ids=list(range(10)))
    assert c.state.stop_ids.shape[1] == 16


def test_reserved_tables_serve_requests_frozen_and_answer_as_grown_ones() -> None:
    reserve = {"stop_token_ids": 12, "sparse_bans": 8, "logit_bias": 5, "bad_words": 3, "bad_word_tokens": 4,
               "allowed_token_ids": True}
    c = LogitsConstraints(4, V, reserve=reserve)
    st = c.state
    assert (st.stop_ids.shape[1], st.ban_ids.shape[1], st.bias_ids.shape[1], tuple(st.bad_prefix.shape[1:]),
            st.history.shape[1], st.allowed.shape[0], st.any_allowed) == (16, 8, 8, (4, 4), 4, 4, True)
    c.freeze()
    grown = lc()
    requests = [
        dict(min_tokens=2, stop_token_ids=list(range(20, 32)), bad_words=[[1], [2], [3, 4, 5, 6], [7, 8]],
             logit_bias={i: 0.5 for i in range(40, 45)}),
        dict(allowed_token_ids=list(range(100, 200)), bad_words=[[150]]),
    ]
    for s, kwargs in enumerate(requests):
        for x in (c, grown):
            x.set(s, **kwargs)
            x.append_tokens(s, [3, 4, 5])
    assert masked(c, [0, 1, 0], [3, 3, 0]) == masked(grown, [0, 1, 0], [3, 3, 0])
    c.clear(0)
    c.clear(1)
    c.unfreeze()
    c.set(0, stop_token_ids=[1])
    c.clear(0)  # reserved widths are the floor: nothing shrinks below them
    assert c.state.stop_ids.shape[1] == 16 and c.state.any_allowed


@pytest.mark.parametrize(
    "reserve,exc,says",
    [
        ({"stop_token_ids": LIMITS["max_stop_token_ids"] + 1}, ValueError, "reserve\\['stop_token_ids'\\]=65537 is outside"),
        ({"sparse_bans": 65}, ValueError, "reserve\\['sparse_bans'\\]=65 is outside \\[0, 64\\]"),
        ({"bad_word_tokens": 65, "bad_words": 1}, ValueError, "reserve\\['bad_word_tokens'\\]=65"),
        ({"bad_word_tokens": 8}, ValueError, "'bad_word_tokens' needs 'bad_words'"),
        ({"stops": 4}, ValueError, "reserve: unknown table 'stops'"),
        ({"logit_bias": 2.0}, TypeError, "reserve\\['logit_bias'\\] must be an int"),
        ({"allowed_token_ids": 1}, TypeError, "reserve\\['allowed_token_ids'\\] must be a bool"),
        ({"forced_token": "no"}, TypeError, "reserve\\['forced_token'\\] must be a bool"),
        ([("logit_bias", 4)], TypeError, "reserve must be a mapping"),
    ],
)
def test_reserve_is_validated(reserve: Any, exc: type, says: str) -> None:
    with pytest.raises(exc, match=says):
        LogitsConstraints(4, V, reserve=reserve)


def test_a_state_reserved_without_forced_tokens_refuses_force_only_while_frozen() -> None:
    c = LogitsConstraints(4, V, reserve={"forced_token": False})
    c.force(0, 7)  # not frozen: allowed, and a graph captured now would keep the read
    c.freeze()
    c.force(0, None)  # ending a forcing is always allowed
    with pytest.raises(RuntimeError, match="slot 2 cannot be forced while the tables are frozen") as info:
        c.force(2, 9)
    assert _data(info) == ("StoplineRuntimeError", "reserve.forced_token", 2, "unsupported")
    assert c.forced_token(2) is None and int(c.state.forced[2]) == -1  # nothing written
    with pytest.raises(ValueError, match="force token_id: token id 1000 is outside"):
        c.force(2, 1000)  # the id is still checked first
    c.unfreeze()
    c.force(2, 9)
    assert c.forced_token(2) == 9 and masked(c, [2], [0]) == [[t for t in range(V) if t != 9]]
    default = lc()
    default.freeze()
    default.force(1, 5)  # the default reserve serves force while frozen
    assert default.forced_token(1) == 5


def test_a_reserved_bad_words_table_is_capped() -> None:
    with pytest.raises(ValueError, match="bad-words table .* at most 268435456 bytes"):
        LogitsConstraints(LIMITS["max_slots"], V, reserve={"bad_words": 1024, "bad_word_tokens": 64})


def test_kernel_tuning_is_read_when_the_state_is_built_not_at_import(monkeypatch: pytest.MonkeyPatch) -> None:
    from stopline.logits.tuning import DEFAULT_TILES, KernelTuning

    monkeypatch.setenv("STOPLINE_LOGITS_TILE", "bfloat16=32:16:8")
    c = lc()
    assert c._tuning.tiles["bfloat16"] == (32, 16, 8) + DEFAULT_TILES["bfloat16"][3:]
    assert c._tuning.tiles["float32"] == DEFAULT_TILES["float32"]
    monkeypatch.setenv("STOPLINE_LOGITS_TILE", "64:32")
    with pytest.raises(ValueError, match="STOPLINE_LOGITS_TILE must be 'DENSE_WORDS:SCAN_WORDS:NUM_WARPS"):
        lc()
    monkeypatch.delenv("STOPLINE_LOGITS_TILE")
    assert lc()._tuning == KernelTuning()
    with pytest.raises(AttributeError):
        KernelTuning().chunk_words = 4  # type: ignore[misc]


def _data(info: pytest.ExceptionInfo[BaseException]) -> tuple[str, Any, Any, Any]:
    e = info.value
    return type(e).__name__, getattr(e, "field", None), getattr(e, "slot", None), getattr(e, "kind", None)


def test_set_errors_carry_field_kind_and_slot() -> None:
    """Issue 24: LogitsConstraints.set's checks raise the core's classes
    (``stopline.StoplineValueError``, ...) naming the element, the problem
    and the slot whose request is at fault; the messages are unchanged."""
    c = lc()
    with pytest.raises(ValueError, match="stop_token_ids: token id 1000 is outside") as info:
        c.set(2, stop_token_ids=[1, 1000])
    assert _data(info) == ("StoplineValueError", "stop_token_ids[1]", 2, "id_outside")
    with pytest.raises(TypeError, match="min_tokens must be an int, got '3'") as info:
        c.set(1, min_tokens="3")
    assert _data(info) == ("StoplineTypeError", "min_tokens", 1, "wrong_type")
    with pytest.raises(ValueError, match="logit_bias: bias for token 5 is not finite in float32") as info:
        c.set(3, logit_bias={5: float("inf")})
    assert _data(info) == ("StoplineValueError", "logit_bias[5]", 3, "invalid")
    with pytest.raises(ValueError, match="logit_bias: token id 5 appears twice") as info:
        c.set(0, logit_bias=[(5, 1.0), (5, 2.0)])
    assert _data(info) == ("StoplineValueError", "logit_bias", 0, "invalid")
    with pytest.raises(ValueError, match="restore must be one of") as info:
        c.set(0, restore="sometimes")
    assert _data(info) == ("StoplineValueError", "restore", 0, "not_one_of")
    with pytest.raises(ValueError, match="allowed_token_ids is empty") as info:
        c.set(1, allowed_token_ids=[])
    assert _data(info) == ("StoplineValueError", "allowed_token_ids", 1, "invalid")
    # A list over its cap, checked by the core's own reader, also names the slot.
    with pytest.raises(ValueError) as info:
        c.set(2, stop_token_ids=[1] * (LIMITS["max_stop_token_ids"] + 1))
    assert _data(info)[1:] == ("stop_token_ids", 2, "too_many")


def test_slot_force_and_constructor_errors_carry_field_and_kind() -> None:
    c = lc()
    with pytest.raises(ValueError, match=r"slot 4 is outside \[0, max_slots=4\)") as info:
        c.set(4)
    assert _data(info) == ("StoplineValueError", "slot", 4, "out_of_range")
    with pytest.raises(TypeError, match="slot must be an int") as info:
        c.clear("0")
    assert _data(info) == ("StoplineTypeError", "slot", None, "wrong_type")
    with pytest.raises(ValueError, match="force token_id: token id 1000 is outside") as info:
        c.force(3, 1000)
    assert _data(info) == ("StoplineValueError", "token_id", 3, "id_outside")
    with pytest.raises(TypeError, match="force token_id: token id 1.5 is not an int") as info:
        c.force(1, 1.5)
    assert _data(info) == ("StoplineTypeError", "token_id", 1, "id_not_int")
    with pytest.raises(ValueError, match="token_ids: token id -1 is outside") as info:
        c.append_tokens(2, [4, -1])
    assert _data(info) == ("StoplineValueError", "token_ids[1]", 2, "id_outside")
    with pytest.raises(ValueError, match="max_slots must be positive, got 0") as info:
        LogitsConstraints(0, V)
    assert _data(info) == ("StoplineValueError", "max_slots", None, "below")
    with pytest.raises(ValueError, match="more than the supported") as info:
        LogitsConstraints(LIMITS["max_slots"] + 1, V)
    assert _data(info) == ("StoplineValueError", "max_slots", None, "greater")
    with pytest.raises(ValueError, match="reserve: unknown table 'stops'") as info:
        LogitsConstraints(2, V, reserve={"stops": 1})
    assert _data(info) == ("StoplineValueError", "reserve", None, "unknown_key")


def test_apply_errors_carry_field_kind_and_slot() -> None:
    c = lc()
    with pytest.raises(ValueError, match="row_slots must have one entry per logits row") as info:
        c.apply(torch.zeros(2, V), [0], [0, 0], backend="torch")
    assert _data(info) == ("StoplineValueError", "row_slots", None, "count")
    with pytest.raises(ValueError, match=r"row_slots: slot 9 is outside \[0, max_slots=4\)") as info:
        c.apply(torch.zeros(2, V), [0, 9], [0, 0], backend="torch")
    assert _data(info) == ("StoplineValueError", "row_slots", 9, "out_of_range")
    with pytest.raises(TypeError, match="logits must be a torch.Tensor, got list") as info:
        c.apply([[0.0] * V], [0], [0], backend="torch")
    assert _data(info) == ("StoplineTypeError", "logits", None, "wrong_type")
    with pytest.raises(ValueError, match="backend must be one of") as info:
        c.apply(torch.zeros(1, V), [0], [0], backend="cuda")
    assert _data(info) == ("StoplineValueError", "backend", None, "not_one_of")


def test_frozen_tables_refusal_names_the_slot() -> None:
    c = lc()
    c.freeze()
    with pytest.raises(RuntimeError, match="LogitsConstraints.set: slot 2 needs") as info:
        c.set(2, stop_token_ids=list(range(40)))
    assert _data(info) == ("StoplineRuntimeError", "reserve", 2, "no_room")


# Values for each set() argument, good and bad, for the check_request property below.
_REQUEST_VALUES: dict[str, list[Any]] = {
    "min_tokens": [0, 3, -1, "3", 2.0, True, 2**31, None],
    "stop_token_ids": [(), [2, 7], [2, 2], [-1], [V], [1.5], "ab", [True], None, [2**40]],
    "allowed_token_ids": [None, [1, 2], [], [V + 1], ["1"], 5],
    "bad_words": [(), [[1, 2], [3]], [[]], [[1.5]], "abc", [[V]], [5], [[1] * 65]],
    "logit_bias": [None, {5: 1.5}, {5: float("nan")}, {"a": 1.0}, {5: "x"}, [(5, 1.0), (5, 2.0)], [(1, 2, 3)],
                   {5: 1e39}, 7],
    "restore": ["structured", "always", "sometimes", 1],
}


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(st.sampled_from(sorted(_REQUEST_VALUES)), st.integers(0, 9), max_size=6))
def test_check_request_refuses_exactly_what_set_refuses(picks: dict[str, int]) -> None:
    """check_request (an engine's admission step, no state) accepts a request iff set() does on a
    state of the same vocabulary, and refuses it with the same class, field and kind."""
    from stopline.logits import check_request

    kw = {k: _REQUEST_VALUES[k][i % len(_REQUEST_VALUES[k])] for k, i in picks.items()}
    outcomes = []
    for run in (lambda: check_request(V, **kw), lambda: lc().set(0, **kw)):
        try:
            run()
            outcomes.append(None)
        except (TypeError, ValueError) as e:
            outcomes.append((type(e).__name__, getattr(e, "field", None), getattr(e, "kind", None)))
    assert outcomes[0] == outcomes[1], kw


def test_check_request_without_a_vocabulary_bounds_ids_by_the_largest_one() -> None:
    from stopline.logits import check_request

    check_request(stop_token_ids=[V + 5], min_tokens=2)  # past this state's vocabulary, not past any
    with pytest.raises(ValueError, match="stop_token_ids: token id 2147483583 is outside") as info:
        check_request(stop_token_ids=[2**31 - 65])
    assert _data(info)[1:] == ("stop_token_ids[0]", None, "id_outside")
    for bad in (0, -3, 2**31):
        with pytest.raises(ValueError, match="vocab_size must be an int in") as info:
            check_request(bad)
        assert _data(info)[1:] == ("vocab_size", None, "out_of_range")
    for bad in (True, "100", 1.0):
        with pytest.raises(TypeError, match="vocab_size must be an int, got") as info:
            check_request(bad)  # type: ignore[arg-type]
        assert _data(info)[1:] == ("vocab_size", None, "wrong_type")


def test_a_deep_or_huge_container_in_a_request_is_shown_bounded() -> None:
    """The core shows a container it refuses through reprlib's bounds, as the Python side
    does: its own repr() recursed with the depth (a RecursionError past ~1000 levels, not the
    field's error) and built the whole text of a huge list before cutting it."""
    from stopline.logits import check_request

    deep: Any = [1]
    for _ in range(5000):
        deep = [deep]
    with pytest.raises(TypeError, match=r"bad_words: token id \[\[\[\.\.\.\]\]\] is not an int") as info:
        check_request(bad_words=[deep])
    assert _data(info)[1:] == ("bad_words", None, "id_not_int")
    with pytest.raises(TypeError, match=r"token id \[0, 1, 2, 3, 4, 5, \.\.\.\] is not an int") as info:
        lc().set(0, bad_words=[[list(range(1_000_000))]])
    assert len(str(info.value)) < 200


# --- The list checks against an entry-by-entry loop --------------------------------------
# stopline.logits.checks finds the first refused entry of a long list with whole-list passes
# (types, then numpy) and lets the one-value rule raise for it. These tests run those passes
# on short lists too (_SHORT and _CHUNK made small) and compare every outcome (values, or the
# error's class, field, kind and message) with the loop the checks replaced.


class _Tok(enum.IntEnum):  # an Integral the whole-list passes do not know: checked one by one
    A = 3
    B = V + 1


class _NoPairs:  # unpacking it raises what the checks must pass on as it is
    def __iter__(self) -> Any:
        raise LookupError("no pairs here")


_ID_ENTRIES = st.one_of(
    st.integers(0, V - 1), st.integers(0, V - 1), st.integers(0, V - 1),
    st.integers(-3, V + 3), st.sampled_from([-1, 0, V - 1, V, V + 1]),
    st.sampled_from([2**63, 2**64 + 1, -(2**70), 2**31, 10**400]),
    st.builds(np.int32, st.integers(-3, V + 3)),
    st.builds(np.uint64, st.integers(0, V + 3)),
    st.sampled_from([np.uint64(2**64 - 1), np.int8(-1), True, False, np.bool_(True), 1.0, 2.5, float("nan"),
                     np.float64(2.0), "3", None, [1], _Tok.A, _Tok.B]),
)
# (_SHORT, _CHUNK): the entry-by-entry and numpy passes as shipped; numpy on every list, with
# numpy's failures (ints past 64 bits) resolved in chunks of 2 or 3 entries.
_PASSES = [(256, 4096), (0, 3), (2, 2)]


def _outcome(call: Any) -> Any:
    try:
        return ("ok", [int(v) if isinstance(v, (int, np.integer)) else float(v) for v in call()])
    except Exception as e:  # noqa: BLE001 - any error is part of the outcome
        return (type(e).__name__, getattr(e, "field", None), getattr(e, "kind", None), str(e))


def _each_pass(call: Any) -> list[Any]:
    from stopline.logits import checks

    outcomes = []
    for short, chunk in _PASSES:
        with mock.patch.object(checks, "_SHORT", short), mock.patch.object(checks, "_CHUNK", chunk):
            outcomes.append(_outcome(call))
    return outcomes


def _ids_one_by_one(values: Any, field: str) -> list[int]:
    from stopline.logits.checks import token_id

    return [token_id(v, f"{field}[{i}]", V, shown_as=field) for i, v in enumerate(values)]


@settings(max_examples=400, deadline=None)
@given(st.lists(_ID_ENTRIES, max_size=24), st.sampled_from(["list", "tuple", "iterator"]))
def test_id_lists_are_refused_as_entry_by_entry(entries: list[Any], kind: str) -> None:
    from stopline.logits.checks import token_ids

    make = {"list": list, "tuple": tuple, "iterator": iter}[kind]
    expected = _outcome(lambda: _ids_one_by_one(entries, "ids"))
    assert _each_pass(lambda: token_ids(make(entries), "ids", V)) == [expected] * len(_PASSES), entries


@settings(max_examples=200, deadline=None)
@given(st.lists(st.one_of(st.integers(-3, V + 3), st.sampled_from([0, V - 1, V])), max_size=24),
       st.sampled_from([np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint64, np.float32, np.bool_, object]),
       st.sampled_from([1, 2]))
def test_id_arrays_are_refused_as_entry_by_entry(values: list[int], dtype: Any, ndim: int) -> None:
    """Numpy arrays of every kind (and a tensor) against a loop over what iterating them yields."""
    from stopline.logits.checks import token_ids

    if dtype in (np.uint8, np.uint64):
        values = [abs(v) for v in values]
    array = np.array(values).astype(dtype)
    if ndim == 2:
        array = array.reshape(len(values), 1)
    for given_ids in (array, torch.from_numpy(np.array(values, dtype=np.int64))):
        expected = _outcome(lambda ids=given_ids: _ids_one_by_one(list(ids), "ids"))
        assert _each_pass(lambda ids=given_ids: token_ids(ids, "ids", V)) == [expected] * len(_PASSES), given_ids


def _bias_one_by_one(logit_bias: Any) -> tuple[list[int], list[float]]:
    """The logit_bias loop the whole-list checks replaced, as it was."""
    import math

    from stopline._caps import capped, field_error, shown
    from stopline.logits.checks import token_id

    items = logit_bias.items() if isinstance(logit_bias, Mapping) else logit_bias
    ids: list[int] = []
    vals: list[float] = []
    seen: set[int] = set()
    for item in capped(items, "logit_bias", LIMITS["max_logit_bias"]):
        try:
            tid, val = item
        except (TypeError, ValueError):
            raise field_error(TypeError, "logit_bias", f"logit_bias: expected (token_id, bias) pairs, got {shown(item)}",
                              "wrong_type") from None
        tid = token_id(tid, "logit_bias", V)
        if isinstance(val, bool) or not isinstance(val, numbers.Real):
            raise field_error(TypeError, f"logit_bias[{tid}]", f"logit_bias: bias for token {tid} is not a number: "
                              f"{shown(val)}", "wrong_type")
        try:
            val = float(val)
        except OverflowError:
            raise field_error(ValueError, f"logit_bias[{tid}]", f"logit_bias: bias for token {tid} is not finite in "
                              f"float32: {shown(val)}", "invalid") from None
        if not math.isfinite(val) or not math.isfinite(float(torch.tensor(val, dtype=torch.float32))):
            raise field_error(ValueError, f"logit_bias[{tid}]", f"logit_bias: bias for token {tid} is not finite in "
                              f"float32: {shown(val)}", "invalid")
        if tid in seen:
            raise field_error(ValueError, "logit_bias", f"logit_bias: token id {tid} appears twice", "invalid")
        seen.add(tid)
        ids.append(tid)
        vals.append(val)
    return ids, vals


_BIASES = st.one_of(
    st.floats(-100, 100), st.floats(-100, 100), st.integers(-5, 5),
    st.sampled_from([float("nan"), float("inf"), 1e39, -3.4028235677973366e38, 3.4028234663852886e38, 10**400,
                     2**1023, np.float32(1.5), np.float64(-2.0), np.float64(1e300), np.int64(3), np.uint64(2**64 - 1),
                     True, "1.5", None, Fraction(1, 3), Decimal("1e50"), Decimal("NaN")]),
)
_BIAS_ENTRIES = st.one_of(
    st.tuples(st.integers(0, 60), _BIASES), st.tuples(st.integers(0, 60), _BIASES),
    st.builds(lambda t, b: [t, b], _ID_ENTRIES, _BIASES),
    st.sampled_from([(1, 2.0, 3), (4,), 7, "ab", None, {5: 1.0}, _NoPairs()]),
)


@settings(max_examples=400, deadline=None)
@given(st.lists(_BIAS_ENTRIES, max_size=24), st.sampled_from(["pairs", "iterator", "dict"]))
def test_logit_bias_is_refused_as_entry_by_entry(entries: list[Any], kind: str) -> None:
    from stopline.logits.checks import bias_entries

    if kind == "dict":
        try:
            given_bias: Any = dict(entries)
        except Exception:  # noqa: BLE001 - not a dict's items: drawn again
            reject()
    else:
        given_bias = entries
    fresh = (lambda: iter(given_bias)) if kind == "iterator" else (lambda: given_bias)
    expected = _outcome(lambda: _flat(_bias_one_by_one(fresh())))
    assert _each_pass(lambda: _flat(bias_entries(fresh(), V))) == [expected] * len(_PASSES), given_bias


def _flat(pair: tuple[Any, Any]) -> list[Any]:
    ids, vals = pair
    return [*map(int, ids), *map(float, vals)]


def test_long_requests_set_the_same_tables_from_every_container() -> None:
    """Past the short-list path, ``set`` still merges repeated ids where they first appear and
    writes the same tables from a list, a tuple, an iterator and an array."""
    import random

    rng = random.Random(5)
    stops = [rng.randrange(V) for _ in range(600)]
    allowed = [rng.randrange(V) for _ in range(3000)]
    bias = {rng.randrange(V): rng.uniform(-5, 5) for _ in range(400)}
    tables = []
    for make in (list, tuple, iter, np.array):
        c = lc()
        c.set(1, stop_token_ids=make(stops), allowed_token_ids=make(allowed), min_tokens=2,
              logit_bias=list(bias.items()) if make is list else bias)
        st_ = c.state
        tables.append((st_.stop_ids[1].tolist(), st_.allowed[1].tolist(), st_.bias_ids[1].tolist(),
                       st_.bias_values[1].tolist()))
    assert all(t == tables[0] for t in tables)
    distinct_stops = list(dict.fromkeys(stops))
    assert tables[0][0][: len(distinct_stops)] == distinct_stops
    assert set(tables[0][0][len(distinct_stops):]) <= {-1}
    assert tables[0][2][: len(bias)] == list(bias)
    assert tables[0][3][: len(bias)] == [float(torch.tensor(b, dtype=torch.float32)) for b in bias.values()]
    logits = torch.zeros(1, V)
    c.apply(logits, [1], [5], backend="torch")
    kept = set(torch.nonzero(torch.isfinite(logits[0])).flatten().tolist())
    assert kept == set(allowed)
