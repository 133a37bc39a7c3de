"""Hostile requests, each in a child interpreter under a memory limit.

An input that used to grow until an allocation failed (which aborts a Rust
process) or that held the GIL for minutes must now be refused with an
exception naming the field and the cap, or served within bounded memory.
Each case runs in a fresh interpreter whose address space is capped with
``RLIMIT_AS``, so a regression is a dead child (SIGABRT, SIGKILL) reported
here, never a dead pytest. The children import stopline and never torch.
Nothing here asserts a time; docs/errors.md has the measured costs.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from typing import Any

import pytest

import stopline

# Address space for a child on top of what the bare interpreter has mapped
# (a free-threaded build reserves 1 GiB for its allocator at start): stopline
# and the case's own data fit with room to spare; each refused input would
# need far more.
LIMIT_BYTES = 1 << 30


def set_limit(limit: int) -> str:
    """Child code that caps its address space at what it has mapped plus
    ``limit`` bytes."""
    return textwrap.dedent(f"""
        import resource
        with open("/proc/self/status") as _f:
            _mapped = next(int(line.split()[1]) << 10 for line in _f if line.startswith("VmSize:"))
        resource.setrlimit(resource.RLIMIT_AS, (_mapped + {limit}, _mapped + {limit}))
    """)


PRELUDE = """
import itertools, json, resource, sys
{set_limit}
import stopline
from stopline import FinishBatch, FinishTracker, StopParams, StopRegexes, StopStrings

def outcome(f):
    try:
        value = f()
    except BaseException as e:
        # The built-in class (stopline's errors are its subclasses of one).
        builtin = next(c for c in type(e).__mro__ if c.__module__ == "builtins")
        return {{"raised": builtin.__name__, "message": str(e)}}
    return {{"value": value}}
"""


def run_child(body: str, limit: int = LIMIT_BYTES) -> dict:
    code = PRELUDE.format(set_limit=set_limit(limit)) + textwrap.dedent(body)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, f"the child died ({r.returncode}): {r.stderr[-2000:]}"
    return json.loads(r.stdout.strip().splitlines()[-1])


CAPS: list[tuple[str, str, str, str]] = [
    # (case, expression, exception, text the message contains)
    ("stop list range(2**40)", "StopStrings(range(2**40))", "ValueError", "stop has 1099511627776 entries"),
    ("stop list endless", "StopStrings(itertools.repeat('a'))", "ValueError", "stop has more than 1024 entries"),
    ("one stop string of 50 MB", "StopStrings(['x' * 50_000_000])", "ValueError", "stop totals more than 65536 UTF-8 bytes"),
    ("200,000 copies of one stop string", "StopStrings(['abc'] * 200_000)", "ValueError", "stop has 200000 entries"),
    ("stop regexes endless", "StopRegexes(itertools.repeat('a'))", "ValueError", "stop_regex has more than 64 entries"),
    ("stop_token_ids endless", "StopParams(stop_token_ids=itertools.repeat(7))", "ValueError",
     "stop_token_ids has more than 65536 entries"),
    ("eos_token_ids range(2**62)", "StopParams(eos_token_ids=range(2**62))", "ValueError",
     "eos_token_ids has 4611686018427387904 entries"),
    ("eos_token_ids range(2**70)", "StopParams(eos_token_ids=range(2**70))", "ValueError",
     "eos_token_ids has more than 65536 entries"),
    ("update token_ids endless", "FinishTracker(StopParams()).update(itertools.repeat(1))", "ValueError",
     "token_ids has more than 4194304 entries"),
    ("update texts endless", "FinishTracker(StopParams()).update([1], itertools.repeat('a'))", "ValueError",
     "texts has more than 4194304 entries"),
    ("step slots endless", "FinishBatch(8).step(itertools.repeat(0), [1])", "ValueError",
     "slots has more than 8 entries"),
    ("step slots range(2**40)", "FinishBatch(8).step(range(2**40), [1])", "ValueError",
     "slots has 1099511627776 entries; at most 8 are accepted"),
    ("step token_ids range(2**40)", "FinishBatch(8).step([0], range(2**40))", "ValueError",
     "token_ids has 1099511627776 entries"),
    ("step grammar endless", "FinishBatch(8).step([0], [1], None, None, itertools.repeat(-1))", "ValueError",
     "grammar_terminated_at has more than 8 entries"),
    # Reasoning and span inputs, in the core and in the baseline (the oracle
    # grew until memory ran out on the endless lists) and the engines' reader.
    ("prompt_token_ids endless", "FinishTracker(StopParams(reasoning_start_id=1, reasoning_end_id=2), "
     "prompt_token_ids=itertools.repeat(1))", "ValueError", "prompt_token_ids has more than 4194304 entries"),
    ("stop_scopes endless", "StopParams(reasoning_end='x', stop=['a'], stop_scopes=itertools.repeat('any'))",
     "ValueError", "stop_scopes has more than 65536 entries"),
    ("baseline stop_scopes endless",
     "__import__('stopline.baseline', fromlist=['x']).StopParams(reasoning_end='x', stop=['a'], stop_scopes=itertools.repeat('any'))",
     "ValueError", "stop_scopes has more than 65536 entries"),
    ("baseline reasoning_end_ids endless",
     "__import__('stopline.baseline', fromlist=['x']).StopParams(reasoning_end_id=1, reasoning_end_ids=itertools.repeat(1))",
     "ValueError", "reasoning_end_ids has more than 65536 entries"),
    ("engine reasoning config, an endless pair",
     "__import__('stopline.engines', fromlist=['x']).reasoning_config({'tool_call_markers': [itertools.repeat('<a>')]})",
     "ValueError", "tool_call_markers[0] has more than 2 items"),
]


@pytest.mark.parametrize("case,expr,exc,says", CAPS, ids=[c[0] for c in CAPS])
def test_unbounded_inputs_are_refused_before_they_are_materialized(case: str, expr: str, exc: str, says: str) -> None:
    out = run_child(f"print(json.dumps(outcome(lambda: {expr})))")
    assert out.get("raised") == exc, out
    assert says in out["message"], out
    assert len(out["message"]) < 300


def test_a_numpy_buffer_over_the_cap_is_refused_without_a_copy() -> None:
    out = run_child("""
        import numpy as np
        ids = np.zeros(stopline.LIMITS["max_step_tokens"] + 1, dtype=np.int32)
        print(json.dumps(outcome(lambda: FinishTracker(StopParams()).update(ids))))
    """)
    assert out.get("raised") == "ValueError" and "token_ids has 4194305 entries" in out["message"], out


def test_finish_batch_at_the_slot_cap_costs_the_slots_in_use() -> None:
    # 2**24 slots of a few hundred bytes each would be GBs up front: far over
    # the limit. Trackers are boxed and the table (16 B a slot) follows the
    # highest slot in use: the last slot fits in 400 MiB and is released
    # when freed; under 200 MiB it is a MemoryError, and the batch keeps
    # working.
    body = """
        b = FinishBatch(stopline.LIMITS["max_slots"])
        p = StopParams(max_tokens=2)
        for s in range(256):
            b.add(s, p)
        n = len(b)
        b.step(range(0, 256, 16), [1] * 16)
        for s in range(128, 256):
            b.remove(s)
        high = outcome(lambda: b.add(2**24 - 1, p))
        last = 2**24 - 1 in b
        if last:
            b.remove(2**24 - 1)
        b.step([0], [1])
        print(json.dumps([n, len(b), b.result(0).num_tokens, high.get("raised"), last]))
    """
    assert run_child(body, limit=400 << 20) == [256, 128, 2, None, True]
    assert run_child(body, limit=200 << 20) == [256, 128, 2, "MemoryError", False]


def test_duplicate_stop_strings_at_the_cap_compile_and_match_the_first() -> None:
    out = run_child("""
        stops = ['x' * 64] * 1023 + ['y']
        s = StopStrings(stops)
        m = s.matcher()
        print(json.dumps(outcome(lambda: (len(s), m.feed('a' + 'x' * 64).index, m.feed('y').index))))
    """)
    assert out == {"value": [1024, 0, 1023]}, out


def test_regex_rejection_names_a_pattern_and_is_cached() -> None:
    # Each pattern alone fits; together they exceed the DFA size limit. The
    # culprit search bisects to the first prefix that fails, and the second
    # request is answered from the cache of rejections.
    out = run_child(r"""
        pats = [r'(?s).{0,11}END' + str(i) for i in range(64)]
        first = outcome(lambda: StopRegexes(pats))
        again = outcome(lambda: StopRegexes(pats))
        print(json.dumps([first, again]))
    """)
    first, again = out
    assert first.get("raised") == "ValueError", first
    assert "needs an automaton larger than" in first["message"], first
    index = int(first["message"].split("[", 1)[1].split("]", 1)[0])
    assert 0 < index < 64
    assert first == again
    # The prefix before the culprit compiles; with the culprit it does not.
    ok = run_child(f"pats = [r'(?s).{{0,11}}END' + str(i) for i in range(64)]\n"
                   f"print(json.dumps([outcome(lambda: len(StopRegexes(pats[:{index}]))),"
                   f" outcome(lambda: len(StopRegexes(pats[:{index + 1}])))]))")
    assert ok[0] == {"value": index} and ok[1].get("raised") == "ValueError", ok


def test_a_huge_pattern_gives_a_short_message() -> None:
    out = run_child(r"""
        print(json.dumps(outcome(lambda: StopRegexes(['(' + 'a' * 16_000]))))
    """)
    assert out.get("raised") == "ValueError", out
    assert "16001 bytes in all" in out["message"] and len(out["message"]) < 1000, out


class _WideStr(int):
    """An int whose str() is multi-byte text: what a message shows of it must
    be cut at a character boundary (a byte cut would panic in Rust)."""

    def __str__(self) -> str:
        return "\u65e5" * 100

    __repr__ = __str__


_HUGE_VALUES = {
    "a 1 MB single stop str": (lambda: stopline.StopParams(stop="s" * 1_000_000), TypeError),
    "a 1 MB single stop_regex str": (lambda: stopline.StopParams(stop_regex="s" * 1_000_000), TypeError),
    "a 1 MB finish_reason": (lambda: stopline.to_openai_finish_reason("r" * 1_000_000), ValueError),
    "a 1 MB repetition key": (
        lambda: stopline.StopParams(repetition={"k" * 1_000_000: 1, "max_pattern_size": 2}), ValueError),
    "a 5,000-digit max_tokens": (lambda: stopline.StopParams(max_tokens=10**5000), (ValueError, OverflowError)),
    "a 5,000-digit token id": (lambda: stopline.FinishTracker(stopline.StopParams()).update([10**5000]), ValueError),
    "an int subclass with a multi-byte str": (
        lambda: stopline.FinishTracker(stopline.StopParams()).update([_WideStr(2**70)]), ValueError),
}


@pytest.mark.parametrize("case", list(_HUGE_VALUES))
def test_messages_about_huge_values_stay_short(case: str) -> None:
    call, exc = _HUGE_VALUES[case]
    with pytest.raises(exc) as info:
        call()
    assert len(str(info.value)) < 1000, (case, len(str(info.value)))


def test_bad_words_with_huge_values_give_short_messages() -> None:
    pytest.importorskip("torch")
    from stopline.logits import LogitsConstraints

    lc = LogitsConstraints(max_slots=1, vocab_size=100)
    for words, exc in [
        ([[_WideStr(2**70)]], ValueError),
        ([[10**5000]], ValueError),
        ([["w" * 1_000_000]], TypeError),
        ([b"b" * 1_000_000], TypeError),
        ("s" * 1_000_000, TypeError),
    ]:
        with pytest.raises(exc) as info:
            lc.set(0, bad_words=words)
        assert len(str(info.value)) < 1000 and "bad_words" in str(info.value), str(info.value)[:300]


def test_compile_errors_keep_the_process_alive_under_a_tight_limit() -> None:
    # Patterns at the byte cap whose DFA is refused: bounded by the size
    # limits, never an allocation failure.
    out = run_child(r"""
        pats = [r'\w{1,100}z' + str(i) for i in range(64)]
        print(json.dumps(outcome(lambda: StopRegexes(pats))))
    """, limit=512 << 20)
    assert out.get("raised") == "ValueError", out


GIL_PROBE = r"""
import random, threading, time
sys.setswitchinterval(1000.0)  # no forced switch: a waiting thread runs only when the GIL is given up

class Observer:
    # A thread that counts how often it ran while the main thread was inside
    # a call. With no forced switch it can run then only when the call gives
    # the GIL up; how long the OS takes to schedule it (a loaded machine)
    # does not matter, as the call is repeated until it has been seen.
    def __init__(self):
        self.in_call = False
        self.seen = 0
        self.stop = False
        self.thread = threading.Thread(target=self.watch)
        self.thread.start()
    def watch(self):
        while not self.stop:
            if self.in_call:
                self.seen += 1
            time.sleep(0)  # gives the GIL back, so the main thread never waits on this one
    def calls_until_seen(self, make_call, max_calls):
        # How many calls ran before one was observed in progress (0: none of
        # max_calls was). make_call(i) gives a fresh call each time, so no
        # cache turns a later call into a lookup.
        for i in range(max_calls):
            call = make_call(i)
            self.seen = 0
            self.in_call = True
            call()
            self.in_call = False
            if self.seen:
                return i + 1
        return 0
    def close(self):
        self.stop = True
        self.thread.join()

rng = random.Random(7)
alphabet = [chr(c) for c in range(0x21, 0x7F)] + [chr(c) for c in range(0xA1, 0x180)]
def worst_stops(tag):
    out = []
    for i in range(stopline.LIMITS["max_stop_strings"]):
        s = f"{tag}{i}"
        while len(s.encode()) < 62:
            s += rng.choice(alphabet)
        out.append(s)
    return out
def worst_regexes(tag):
    return [r"(?s).*a.{4}b" + f"{tag}_{i}" for i in range(stopline.LIMITS["max_stop_regexes"])]
"""


@pytest.mark.skipif(not getattr(sys, "_is_gil_enabled", lambda: True)(), reason="measures GIL release; this interpreter runs without a GIL")
def test_the_worst_case_request_compiles_without_the_gil() -> None:
    # The request of benches/bench_worst_case.py (stop, stop_regex and
    # bad_words at their caps): another thread runs while the call is in
    # progress, which it can do only when the compiling thread gives the GIL
    # up (no forced switch). Load cannot break it: each call is fresh (new
    # lists, no cache hit) and repeated until the other thread has been seen
    # inside one; the bound on calls only turns a regression into a failure
    # instead of a hang. The control, a short list compiled with the GIL held,
    # is never seen in progress, however often it runs. bad_words go through
    # the core without torch; with torch the whole LogitsConstraints.set of
    # them is probed too.
    out = run_child(GIL_PROBE + r"""
from stopline import _core
stops = worst_stops("a")
assert sum(len(s.encode()) for s in stops) <= stopline.LIMITS["max_stop_bytes"]
V, N_WORDS, N_TOKENS = 151_936, 1024, 64
words = [[rng.randrange(V) for _ in range(N_TOKENS)] for _ in range(N_WORDS)]
try:
    from stopline.logits import LIMITS as LL, LogitsConstraints
    assert (LL["max_bad_words"], LL["max_bad_word_tokens"]) == (N_WORDS, N_TOKENS)
    lc = LogitsConstraints(256, V)
except ImportError:
    lc = None
def request(i):
    stops, regexes = worst_stops(f"w{i}_"), worst_regexes(f"w{i}_")
    def call():
        StopParams(stop=stops, stop_regex=regexes)
        if lc is not None:
            lc.set(0, bad_words=words)
    return call
obs = Observer()
try:
    N = 200
    whole = obs.calls_until_seen(request, N)
    stop_only = obs.calls_until_seen(lambda i: (lambda s=worst_stops(f"s{i}_"): StopStrings(s)), N)
    regex_only = obs.calls_until_seen(lambda i: (lambda r=worst_regexes(f"r{i}_"): StopRegexes(r)), N)
    bad_only = obs.calls_until_seen(lambda i: (lambda: _core._bad_words_table(words, V, N_WORDS, N_TOKENS)), N)
    set_only = None if lc is None else obs.calls_until_seen(lambda i: (lambda: lc.set(1, bad_words=words)), N)
    control = obs.calls_until_seen(lambda i: (lambda: StopStrings([f"short{i}", "list"])), N)
finally:
    obs.close()
p = StopParams(stop=stops, stop_regex=worst_regexes("a"))
n_multi = len(_core._bad_words_table(words, V, N_WORDS, N_TOKENS)[3]) // 4
print(json.dumps([whole, stop_only, regex_only, bad_only, set_only, control, len(p.stop), len(p.stop_regex), n_multi]))
""", limit=1 << 42)  # torch maps a large address space of its own
    whole, stop_only, regex_only, bad_only, set_only, control, n_stop, n_regex, n_multi = out
    assert (n_stop, n_regex, n_multi) == (1024, 64, 1024)
    assert whole > 0 and stop_only > 0 and regex_only > 0 and bad_only > 0, out
    assert set_only is None or set_only > 0, out
    assert control == 0, out


@pytest.mark.skipif(not getattr(sys, "_is_gil_enabled", lambda: True)(), reason="measures GIL release; this interpreter runs without a GIL")
def test_long_decodes_and_tokenizer_files_run_without_the_gil(tmp_path: Any) -> None:
    # Issue 22: `decode` of millions of ids and reading a large tokenizer
    # file held the GIL for seconds. The same load-proof probe as above: each
    # call is repeated until another thread is seen running inside one; the
    # control, a decode under 4,096 ids (kept under the GIL on purpose), never is.
    path = tmp_path / "tokenizer.json"
    path.write_text(json.dumps({"model": {"type": "BPE", "vocab": {f"t{i}": i for i in range(200_000)}}}))
    out = run_child(GIL_PROBE + r"""
from stopline import Vocabulary
v = Vocabulary.from_str(json.dumps({"model": {"vocab": {"ab": 0, "cd": 1}}}))
ids, short = [0, 1] * 200_000, [0, 1] * 100
obs = Observer()
try:
    N = 200
    decode = obs.calls_until_seen(lambda i: (lambda: v.decode(ids)), N)
    from_file = obs.calls_until_seen(lambda i: (lambda: Vocabulary.from_file(PATH)), N)
    # A tracker or batch slot primes its decoder with the whole prompt.
    prime = obs.calls_until_seen(lambda i: (lambda: FinishTracker(StopParams(), vocabulary=v, prompt_token_ids=ids)), N)
    batch = FinishBatch(4, vocabulary=v)
    def add(i):
        def call():
            batch.add(i % 4, StopParams(), prompt_token_ids=ids)
            batch.remove(i % 4)
        return call
    add_slot = obs.calls_until_seen(add, N)
    control = obs.calls_until_seen(lambda i: (lambda: v.decode(short)), N)
finally:
    obs.close()
print(json.dumps([decode, from_file, control, len(v.decode(ids)), prime, add_slot]))
""".replace("PATH", repr(str(path))))
    decode, from_file, control, n_chars, prime, add_slot = out
    assert n_chars == 3 * 400_000 - 1  # 400,000 two-letter tokens joined by spaces (no decoder)
    assert decode > 0 and from_file > 0 and prime > 0 and add_slot > 0, out
    assert control == 0, out


@pytest.mark.skipif(not getattr(sys, "_is_gil_enabled", lambda: True)(), reason="measures GIL release; this interpreter runs without a GIL")
def test_long_texts_are_scanned_without_the_gil() -> None:
    # A multi-megabyte text fed to a StopMatcher or FinishTracker.update (one
    # piece or many) is scanned without the GIL; the control, a decode step's
    # piece, keeps it. The same load-proof probe as above; fresh matchers and
    # trackers each call, so nothing is cached.
    out = run_child(GIL_PROBE + r"""
from stopline import FinishTracker, StopParams, StopStrings
stops = StopStrings(["never here", "nor this"])
text = ("lorem ipsum dolor sit amet, " * 150_000)[:4_000_000]
pieces = [text[i:i + 40_000] for i in range(0, len(text), 40_000)]
params = StopParams(stop=["never here"])
obs = Observer()
try:
    N = 200
    feed = obs.calls_until_seen(lambda i: (lambda m=stops.matcher(): m.feed(text)), N)
    one = obs.calls_until_seen(lambda i: (lambda t=FinishTracker(params): t.update([1], [text])), N)
    many = obs.calls_until_seen(lambda i: (lambda t=FinishTracker(params): t.update(list(range(100)), pieces)), N)
    control = obs.calls_until_seen(lambda i: (lambda m=stops.matcher(): m.feed("a short piece")), N)
finally:
    obs.close()
t = FinishTracker(params)
print(json.dumps([feed, one, many, control, len(t.update([1], [text]).text_delta)]))
""")
    feed, one, many, control, n_chars = out
    assert n_chars == 4_000_000, out  # nothing held back: the text ends with no prefix of a stop
    assert feed > 0 and one > 0 and many > 0, out
    assert control == 0, out


class _IndexInterrupts:
    def __index__(self) -> int:
        raise KeyboardInterrupt


class _LenInterrupts:
    def __len__(self) -> int:
        raise KeyboardInterrupt

    def __iter__(self):  # type: ignore[no-untyped-def]
        return iter([1])


class _GetItemInterrupts(dict):  # type: ignore[type-arg]
    def __getitem__(self, key: str) -> int:
        raise KeyboardInterrupt


def test_caller_exceptions_propagate_unchanged() -> None:
    import stopline

    b = stopline.FinishBatch(2)
    b.add(0, stopline.StopParams())
    t = stopline.FinishTracker(stopline.StopParams())
    with pytest.raises(KeyboardInterrupt):
        t.update(_IndexInterrupts())  # one int-like id
    with pytest.raises(KeyboardInterrupt):
        _IndexInterrupts() in b  # noqa: B015
    with pytest.raises(KeyboardInterrupt):
        t.update(_LenInterrupts())
    with pytest.raises(KeyboardInterrupt):
        stopline.StopStrings(_LenInterrupts())
    with pytest.raises(KeyboardInterrupt):
        stopline.StopParams(repetition=_GetItemInterrupts(max_pattern_size=2, min_count=2))
    assert t.num_tokens == 0 and len(b) == 1


def replay_child(path: str, limit: int = LIMIT_BYTES) -> subprocess.CompletedProcess:
    code = set_limit(limit) + textwrap.dedent(f"""
        import sys
        from stopline.cli import main
        sys.exit(main(["replay", {path!r}]))
    """)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)


def test_replay_reports_hostile_trace_lines_and_exits_non_zero(tmp_path: Any) -> None:
    good = {"id": "ok", "params": {"max_tokens": 2}, "steps": [{"ids": [1]}, {"ids": [2]}]}
    lines = [
        json.dumps(good),
        json.dumps({"id": "no-texts", "params": {"stop": ["x"]}, "steps": [{"ids": [1]}]}),
        '{"id": "\\ud800", "params": {}, "steps": [{"ids": [1]}]}',
        json.dumps({"id": "partial", "params": {"stop": ["a"]}, "steps": [{"ids": [1], "texts": ["b"]}, {"ids": [2]}]}),
    ]
    path = tmp_path / "hostile.jsonl"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    p = replay_child(str(path))
    assert p.returncode == 1, p.stderr
    assert "Traceback" not in p.stderr, p.stderr
    assert f"{path}:2: steps[0] has no texts, but the params have stop strings" in p.stderr
    assert f"{path}:3: 'id' '\\ud800' is not valid Unicode" in p.stderr
    assert f"{path}:4: steps[1] has no texts" in p.stderr
    assert "ok" in p.stdout


def test_replay_reads_an_oversized_file_line_by_line(tmp_path: Any) -> None:
    # 600 MB without a newline (a sparse file: no disk used) under a 512 MiB
    # address-space limit: reading it whole would fail; line by line it is
    # one malformed line, and reading stops at the file's cap (32 MiB: the
    # good request after it is left unread, and that is said).
    from stopline import replay

    path = tmp_path / "huge.jsonl"
    good = json.dumps({"id": "after", "params": {"max_tokens": 1}, "steps": [{"ids": [1]}]})
    with open(path, "wb") as f:
        f.truncate(600 << 20)
        f.seek(0, 2)
        f.write(b"\n" + good.encode() + b"\n")
    p = replay_child(str(path), limit=512 << 20)
    assert p.returncode == 1, p.stderr[-2000:]
    assert "Traceback" not in p.stderr, p.stderr[-2000:]
    assert f"{path}:1: line longer than {replay.MAX_LINE_BYTES} bytes" in p.stderr
    assert f"not read: a trace file holds at most {replay.MAX_TRACE_BYTES} bytes (decompressed)" in p.stderr
    assert "after" not in p.stdout and "holds malformed lines only" in " ".join(p.stdout.split())


@pytest.mark.parametrize("line", [b"\n", b" \t \r\n"], ids=["blank", "whitespace"])
def test_replay_skips_4_gib_of_blank_lines_in_bulk(tmp_path: Any, line: bytes) -> None:
    # A 4 MB .gz holding 4 GiB of blank (or whitespace-only) lines: once 18 s
    # of CPU, one bytes object per line until the file's cap. The cap still
    # ends the read, on the line that crosses it; docs/errors.md has the time.
    import gzip

    from stopline import replay

    member = gzip.compress(line * ((64 << 20) // len(line)), compresslevel=9)
    path = tmp_path / "blank.jsonl.gz"
    with open(path, "wb") as f:
        for _ in range(64):  # gzip members back to back are one stream to a reader
            f.write(member)
    assert path.stat().st_size < 8 << 20
    p = replay_child(str(path))
    assert p.returncode == 1, p.stderr[-2000:]
    assert "Traceback" not in p.stderr and len(p.stderr) < 500, p.stderr[-2000:]
    crossing = replay.MAX_TRACE_BYTES // len(line) + 1  # the line holding the cap's next byte
    assert p.stderr == (f"stopline replay: malformed: {path}:{crossing}: not read: a trace file holds at most "
                        f"{replay.MAX_TRACE_BYTES} bytes (decompressed)\n")
    assert "holds malformed lines only" in " ".join(p.stdout.split())


# ---------------------------------------------- Vocabulary and decoding


def tokenizer_json(vocab: dict[str, int], decoders: list[dict[str, Any]] | None = None) -> str:
    """A tokenizer.json with `vocab` and, when given, a decoder Sequence."""
    doc: dict[str, Any] = {"model": {"type": "BPE", "vocab": vocab}}
    if decoders is not None:
        doc["decoder"] = {"type": "Sequence", "decoders": decoders}
    return json.dumps(doc)


def replace(pattern: str, content: str) -> dict[str, Any]:
    return {"type": "Replace", "pattern": {"String": pattern}, "content": content}


VOCABULARIES: list[tuple[str, str, str]] = [
    # (case, the child's expression for the tokenizer.json text, text the message contains)
    ("40 chained a -> aa", "TJ({'a': 0}, [R('a', 'aa')] * 40)", "decoder.decoders has 40 entries; at most 32"),
    ("20 chained a -> aa on a 4096-byte token", "TJ({'a' * 4096: 0}, [R('a', 'aa')] * 20)",
     "decoder.decoders[4] (Replace \"a\" -> 2 bytes) makes token id 0 131072 bytes"),
    ("a -> 60 KB on a 4096-byte token", "TJ({'a' * 4096: 0}, [R('a', 'b' * 60_000)])",
     "makes token id 0 245760000 bytes, more than the supported 65536 (max_token_bytes)"),
    ("a -> 1 MiB", "TJ({'a': 0}, [R('a', 'b' * (1 << 20))])", "decoder is 1048674 bytes of JSON"),
    ("10,000 never-matching rules", "TJ({'t%d' % i: i for i in range(50_000)}, [R('\\x00', '')] * 10_000)",
     "decoder is 690034 bytes of JSON, more than the supported 65536"),
    ("a 70 KB token", "TJ({'a' * 70_000: 0})", "token id 0 is 70000 bytes"),
    ("rules that grow then shrink every token", "TJ({'a%d' % i: i for i in range(20_000)}, "
     "[R('a', 'b' * 60_000), R('b', '')])", "more than 67108864 bytes over the vocabulary (max_rule_output_bytes"),
    ("a 1 MB decoder type", "json.dumps({'model': {'vocab': {}}, 'decoder': {'type': 'x' * 1_000_000}})",
     "decoder is 1000012 bytes of JSON, more than the supported 65536"),
    ("a 50 KB decoder type", "json.dumps({'model': {'vocab': {}}, 'decoder': {'type': 'x' * 50_000}})",
     "decoder.type must be a string of at most 64 bytes"),
    ("a 60 KB Metaspace prepend_scheme",
     "json.dumps({'model': {'vocab': {}}, 'decoder': {'type': 'Metaspace', 'replacement': '_', "
     "'prepend_scheme': 'x' * 60_000}})", "(60000 bytes in all)"),
    ("32 decoders of 64-byte names", "TJ({}, [{'type': 'x' * 64}] * 32)", "... ("),
    ("a 1 MB vocab key that is no id", "json.dumps({'model': {'vocab': {'k' * 1_000_000: 'x'}}})",
     "is not a token id"),
    # A 100 MB string where an object, a list or an id belongs: the parser's
    # message quoted it whole (a 100,000,106-character ValueError).
    ("a 100 MB string for model.vocab", "'{\"model\": {\"vocab\": \"' + 'v' * 100_000_000 + '\"}}'",
     "tokenizer: model.vocab must be an object or a list, got a string"),
    ("a 100 MB string for model", "'{\"model\": \"' + 'v' * 100_000_000 + '\"}'",
     "tokenizer: model must be an object, got a string"),
    ("a 100 MB string for added_tokens", "'{\"model\": {\"vocab\": {}}, \"added_tokens\": \"' + 'v' * 100_000_000 + '\"}'",
     "tokenizer: added_tokens must be a list or null, got a string"),
    ("a 100 MB string for an added token",
     "'{\"model\": {\"vocab\": {}}, \"added_tokens\": [\"' + 'v' * 100_000_000 + '\"]}'",
     "tokenizer: added_tokens[0] must be an object, got a string"),
]

VOCAB_PRELUDE = """
from stopline import Vocabulary
def R(p, c):
    return {"type": "Replace", "pattern": {"String": p}, "content": c}
def TJ(vocab, decoders=None):
    doc = {"model": {"type": "BPE", "vocab": vocab}}
    if decoders is not None:
        doc["decoder"] = {"type": "Sequence", "decoders": decoders}
    return json.dumps(doc)
"""


@pytest.mark.parametrize("case,expr,says", VOCABULARIES, ids=[c[0] for c in VOCABULARIES])
def test_a_hostile_tokenizer_json_is_refused_naming_the_cap(case: str, expr: str, says: str) -> None:
    """Decoder rules that chain or expand, too many rules, oversized tokens
    and sections: a ValueError naming the cap, within the memory limit
    (these aborted the process or took minutes)."""
    out = run_child(VOCAB_PRELUDE + f"""
text = {expr}
def go():
    try:
        Vocabulary.from_str(text)
    except ValueError as e:
        raise ValueError(f"{{e.field}} | {{e}}") from None
print(json.dumps(outcome(go)))
""")
    assert out.get("raised") == "ValueError", out
    assert says in out["message"], out
    # One bounded line that names the path, in `field` too.
    field, message = out["message"].split(" | ", 1)
    assert field.startswith("tokenizer") and len(message) < 600 and "\n" not in message, out


def test_rules_at_the_cap_build_linearly() -> None:
    # 32 never-matching rules over 50,000 tokens: 32 passes of a string
    # search per token, no rules x tokens blow-up.
    out = run_child(VOCAB_PRELUDE + """
text = TJ({'t%d' % i: i for i in range(50_000)}, [R('\\x00', '')] * 32)
print(json.dumps(outcome(lambda: Vocabulary.from_str(text).vocab_size)))
""")
    assert out == {"value": 50_000}


def test_a_large_file_parses_in_a_small_multiple_of_its_size(tmp_path: Any) -> None:
    """Inside the 128 MiB cap, a file of ~100 MB of merges and ~30 MB of
    vocabulary parses under a 512 MiB limit (a JSON tree of it took ~17x its
    size): only model.vocab, added_tokens and decoder are read."""
    path = tmp_path / "tokenizer.json"
    with open(path, "w") as f:
        f.write('{"model": {"type": "BPE", "merges": [')
        f.write(",".join(['"a b"'] * 16_000_000))
        f.write('], "vocab": {')
        f.write(",".join(f'"t{i}": {i}' for i in range(2_000_000)))
        f.write('}}, "decoder": {"type": "ByteLevel"}}')
    assert path.stat().st_size > 100 << 20
    out = run_child(f"""
from stopline import Vocabulary
print(json.dumps(outcome(lambda: Vocabulary.from_file({str(path)!r}).vocab_size)))
""", limit=512 << 20)
    assert out == {"value": 2_000_000}


def test_two_million_added_tokens_load_in_a_small_multiple_of_the_file(tmp_path: Any) -> None:
    """2,000,000 added tokens (a 133 MB file, under the 128 MiB cap) are read
    as vocab entries are, one table entry each: under a 400 MiB limit (they
    took 4.1x the file when each went through a hash map and a list of
    their own)."""
    path = tmp_path / "tokenizer.json"
    n = 2_000_000
    with open(path, "w") as f:
        f.write('{"added_tokens": [')
        for start in range(0, n, 100_000):
            f.write(",".join('{"id":%d,"content":"<t%d>","special":true,"lstrip":false}' % (i + 1, i)
                             for i in range(start, min(n, start + 100_000))))
            f.write("," if start + 100_000 < n else "")
        f.write('], "model": {"type": "BPE", "vocab": {"a": 0}}, "decoder": {"type": "ByteLevel"}}')
    assert 120 << 20 < path.stat().st_size <= 128 << 20
    out = run_child(f"""
from stopline import Vocabulary
def go():
    v = Vocabulary.from_file({str(path)!r})
    return [v.vocab_size, v.decode([0, 1, 2_000_000], skip_special_tokens=False)]
print(json.dumps(outcome(go)))
""", limit=400 << 20)
    assert out == {"value": [2_000_001, "a<t0><t1999999>"]}


DECODES: list[tuple[str, str]] = [
    ("decode 65,536 ids of a 64 KiB token", "v.decode([0] * 65536)"),
    ("IncrementalDecoder.step 65,536 ids of a 64 KiB token", "v.decoder_for().step([0] * 65536)"),
    ("update 4,194,304 ids of a 1 KiB token",
     "FinishTracker(StopParams(), vocabulary=v).update([1] * 4194304)"),
    ("a prompt of 65,536 ids of a 64 KiB token", "v.decoder_for([0] * 65536)"),
    ("FinishBatch run of 4,194,304 ids of a 1 KiB token",
     "(b := FinishBatch(2, vocabulary=v), b.add(0, StopParams()), b.step([0], [1] * 4194304, [4194304]))"),
]


@pytest.mark.parametrize("case,expr", DECODES, ids=[c[0] for c in DECODES])
def test_decoding_long_tokens_is_refused_before_it_is_built(case: str, expr: str) -> None:
    """The token text of a call is summed before decoding: over
    max_decode_bytes (64 MiB) is a ValueError naming the cap, never an
    allocation failure (these needed 4 GiB and aborted)."""
    out = run_child(VOCAB_PRELUDE + f"""
v = Vocabulary.from_str(TJ({{'x' * 65535: 0, 'y' * 1023: 1}}))  # + the joining space
print(json.dumps(outcome(lambda: {expr})))
""")
    assert out.get("raised") == "ValueError", out
    assert "max_decode_bytes" in out["message"] and "token_ids" in out["message"], out


def test_finish_batch_with_a_vocabulary_allocates_nothing_up_front() -> None:
    # 2**24 decoder slots of 32 B were 512 MiB at construction; now the table
    # follows the highest slot in use, as the batch's own.
    out = run_child(VOCAB_PRELUDE + """
v = Vocabulary.from_str(TJ({'a': 0, 'b': 1}))
def go():
    b = FinishBatch(stopline.LIMITS["max_slots"], vocabulary=v)
    b.add(3, StopParams(max_tokens=2))
    r = b.step([3], [0])
    r = b.step([3], [1])
    return [r.text_deltas, r.finish_reasons]
print(json.dumps(outcome(go)))
""", limit=200 << 20)
    assert out == {"value": [[" b"], ["length"]]}
