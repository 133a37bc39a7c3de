"""Suite ``detokenize``: the whole per-token CPU step of an engine, token ids
in, text deltas and finish flags out, for B sequences decoding real text.

Three ways, timed side by side on the same id streams:

- ``stopline ids only``: ``FinishBatch(B, vocabulary=...)``, one
  ``step(slots, ids)`` per engine step (stopline decodes the ids).
- ``DecodeStream + vLLM stop check``: one ``tokenizers`` ``DecodeStream.step``
  per sequence, then in Python what vLLM's detokenizer does per sequence:
  append the piece, the windowed stop-string check (vLLM's
  ``StopChecker.check_stop_strings``), the EOS and max_tokens checks.
- ``DecodeStream + FinishBatch pieces``: the same ``DecodeStream.step`` loop,
  then one ``FinishBatch.step`` with the pieces.

Every sequence has 4 stop strings that never occur, an EOS id and a
max_tokens far away, and starts from a 4-token prompt (each way primes its
decoder with it); the ids come from ``pydoc_data.topics`` plus a multilingual
paragraph, encoded by each real tokenizer (:mod:`stopline.tools.vocab_files`).
Times are thread CPU time per sequence-step, set-up (batch and decoders)
included, over ``seq_steps`` sequence-steps per run.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import stopline
from stopline.tools.bench.cells import Table, fmt_ns, fmt_ratio
from stopline.tools.bench.suites import Row, Tick
from stopline.tools.bench.timing import time_side_by_side

SUITE = "detokenize"
IDS = "stopline ids only"
DS_PY = "DecodeStream + vLLM stop check"
DS_FB = "DecodeStream + FinishBatch pieces"
IMPLS = (IDS, DS_PY, DS_FB)
VOCABS = ("smollm2", "deepseek-v3", "mistral-v1")
DEFAULT_BATCHES = (256, 1024)
PROMPT = 4
STOPS = ["@@@@", "~~~~STOP", "<<END>>", "%%%%"]
MULTILINGUAL = (
    "Grüße aus Köln — naïve café, “quotes”. 日本語のテキストを生成します。한국어 문장입니다. "
    "Привет, мир! Ελληνικά κείμενα. 😀🎉 العربية "
)


def _check_stop_strings(text: str, new_chars: int, stop: Sequence[str]) -> tuple[str, int] | None:
    """vLLM's windowed stop check (StopChecker.check_stop_strings, stop
    string excluded from the output): search only where a match can end in
    the new characters; the first stop in list order that is found wins."""
    if not new_chars:
        return None
    for s in stop:
        i = text.find(s, 1 - new_chars - len(s))
        if i != -1:
            return s, i
    return None


def _streams(name: str, batch: int, steps: int) -> tuple[Any, Any, list[list[int]]]:
    import pydoc_data.topics as topics
    from tokenizers import Tokenizer

    from stopline.tools.vocab_files import tokenizer_json_path

    path = tokenizer_json_path(name)
    tok = Tokenizer.from_file(str(path))
    vocab = stopline.Vocabulary.from_file(path)
    body = list(topics.topics.values())
    text = "".join(MULTILINGUAL + t for t in body[:80])
    ids = tok.encode(text).ids
    need = steps + PROMPT
    span = len(ids) - need
    return tok, vocab, [ids[(s * 7919) % span:][:need] for s in range(batch)]


def run(
    batches: Sequence[int],
    seq_steps: int,
    repeats: int,
    vocabs: Sequence[str] = VOCABS,
    tick: Tick | None = None,
) -> list[Row]:
    """ns per sequence-step of the three ways, per tokenizer and batch size.
    Raises ``stopline.models.ModelFileError`` when a tokenizer cannot be
    fetched."""
    rows = []
    for name in vocabs:
        for batch in batches:
            steps = max(seq_steps // batch, 8)
            tok, vocab, streams = _streams(name, batch, steps)
            fns = _fns(tok, vocab, streams, batch, steps)
            for impl, t in time_side_by_side(fns, repeats, tick).items():
                rows.append(Row(SUITE, name, batch, impl, t, "ns/seq-step",
                                {"steps": steps, "vocab_size": vocab.vocab_size, "decoder": vocab.decoder}))
    return rows


def _fns(tok: Any, vocab: Any, streams: list[list[int]], batch: int, steps: int) -> dict[str, Callable[[], int]]:
    """The three timed runs of one tokenizer and batch size; each reads every
    finished flag and text delta, as an engine does."""
    from tokenizers.decoders import DecodeStream

    eos = min(tok.get_added_tokens_decoder())
    slots = list(range(batch))
    per_step = [[streams[s][PROMPT + k] for s in slots] for k in range(steps)]
    params = stopline.StopParams(stop=STOPS, eos_token_ids=[eos], max_tokens=1 << 30)

    def ids_only() -> int:
        b = stopline.FinishBatch(batch, vocabulary=vocab)
        for s in slots:
            b.add(s, params, prompt_token_ids=streams[s][:PROMPT])
        done = 0
        for ids in per_step:
            r = b.step(slots, ids)
            done += len(r.finished_slots) + len(r.text_deltas)
        return batch * steps

    def primed() -> list[Any]:
        out = []
        for s in slots:
            ds = DecodeStream(skip_special_tokens=True)
            for i in streams[s][:PROMPT]:
                ds.step(tok, i)
            out.append(ds)
        return out

    def ds_python() -> int:
        streams_ = primed()
        texts = [""] * batch
        sent = [0] * batch
        counts = [0] * batch
        finished = [False] * batch
        hold = max(map(len, STOPS)) - 1
        for ids in per_step:
            deltas = []
            for s, ds, i in zip(slots, streams_, ids):
                piece = ds.step(tok, i) or ""
                text = texts[s] + piece
                counts[s] += 1
                hit = _check_stop_strings(text, len(piece), STOPS)
                if hit is not None:
                    text = text[:hit[1]]
                    finished[s] = True
                elif i == eos or counts[s] >= 1 << 30:
                    finished[s] = True
                texts[s] = text
                # The streamed delta holds back len(longest stop) - 1 chars,
                # as vLLM's get_next_output_text.
                end = len(text) if finished[s] else len(text) - hold
                deltas.append(text[sent[s]:end] if end > sent[s] else "")
                sent[s] = max(sent[s], end)
        return batch * steps

    def ds_finish_batch() -> int:
        streams_ = primed()
        b = stopline.FinishBatch(batch)
        for s in slots:
            b.add(s, params)
        done = 0
        for ids in per_step:
            pieces = [ds.step(tok, i) or "" for ds, i in zip(streams_, ids)]
            r = b.step(slots, ids, texts=pieces)
            done += len(r.finished_slots) + len(r.text_deltas)
        return batch * steps

    _agree(vocab, tok, streams, slots, per_step, params)
    return {IDS: ids_only, DS_PY: ds_python, DS_FB: ds_finish_batch}


def _agree(vocab: Any, tok: Any, streams: list[list[int]], slots: list[int], per_step: list[list[int]],
           params: stopline.StopParams) -> None:
    """The ids-only texts must be DecodeStream's (up to the text it still
    holds at the end, where the decoded ids end in U+FFFD): a benchmark of
    different outputs means nothing."""
    from tokenizers.decoders import DecodeStream

    b = stopline.FinishBatch(len(slots), vocabulary=vocab)
    for s in slots[:32]:
        b.add(s, params, prompt_token_ids=streams[s][:PROMPT])
    for ids in per_step:
        b.step(slots[:32], ids[:32])
    for s in slots[:32]:
        ds = DecodeStream(skip_special_tokens=True)
        for i in streams[s][:PROMPT]:
            ds.step(tok, i)
        ref = "".join(ds.step(tok, i) or "" for i in streams[s][PROMPT:])
        got = b.text(s)
        if not (got == ref or (got.startswith(ref) and tok.decode(streams[s]).endswith("\ufffd"))):
            raise AssertionError(f"slot {s}: stopline's text differs from DecodeStream's: {got[-40:]!r} vs {ref[-40:]!r}")


def tables(res: Any) -> list[Any]:
    """The suite's table: ns per sequence-step of the three ways and the ratios."""
    cases = res.cases(SUITE)
    if not cases:
        return []
    header = ["tokenizer", "batch", "ids", "DS+py", "DS+FB", "vs DS+py", "vs DS+FB"]
    rows = []
    for case in cases:
        for b in res.sizes(SUITE, case):
            own, py, fb = (res.get(SUITE, case, b, i) for i in IMPLS)
            rows.append([case, str(b), fmt_ns(own), fmt_ns(py), fmt_ns(fb), fmt_ratio(py, own), fmt_ratio(fb, own)])
    return [
        Table("Detokenize + finish, token ids in, one token per sequence per step: ns per sequence-step "
              "(set-up included)", header, rows, [
                  "ids = FinishBatch with a Vocabulary, ids only; DS+py = DecodeStream per sequence "
                  "and vLLM-style stop checks in Python; DS+FB = DecodeStream per sequence, then "
                  "FinishBatch.step with the pieces. vs X: X's time over the ids-only step."]),
    ]


def plot(res: Any, path: str) -> bool:
    """Bar chart of the three ways per tokenizer at each batch size."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    cases = res.cases(SUITE)
    if not cases:
        return False
    labels = [f"{c}\nB={b}" for c in cases for b in res.sizes(SUITE, c)]
    fig, ax = plt.subplots(figsize=(max(6, 1.6 * len(labels)), 4.6))
    width = 0.27
    for k, impl in enumerate(IMPLS):
        vals = [res.get(SUITE, c, b, impl) or 0 for c in cases for b in res.sizes(SUITE, c)]
        ax.bar([x + (k - 1) * width for x in range(len(labels))], vals, width, label=impl)
    ax.set_xticks(range(len(labels)), labels)
    ax.set_yscale("log")
    ax.set_ylabel("ns per sequence-step (log)")
    ax.set_title("Token ids to text deltas + finish, per sequence-step")
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=3, frameon=False)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True
