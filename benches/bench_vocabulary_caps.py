"""Worst cases of the ``Vocabulary`` caps and of one decode call, for
docs/errors.md ("Caps"): each case runs in a fresh child interpreter, which
reports its wall time and its peak RSS growth during the call over what it
held after its setup (``VmHWM``; an id list the setup built counts in
neither). Files are written to a
temporary folder first (not timed).

Cases, each at its cap:

* ``file size``: a 127 MiB ``tokenizer.json`` that is all ``model.vocab``
  (8.4M short entries: the most table per file byte), one that is all
  ``merges`` (skipped unbuilt), one that is all ``added_tokens`` (special
  ones, the most per file byte), and one that is half ``model.vocab`` and
  half special ``added_tokens`` (the smaller side, the specials, is hashed
  to find the vocab entries with a special token's text);
* ``decoder rules``: 32 rules (``max_decoder_rules``) over 250k tokens (just
  under ``max_rule_output_bytes``);
* ``rule output``: Replace rules that grow every token by 60 KB and shrink it
  back, until ``max_rule_output_bytes`` (64 MiB) refuses the file;
* ``token bytes``: 900 tokens a Replace doubles to 64 KiB
  (``max_token_bytes``), just under ``max_rule_output_bytes``;
* ``decode``: ``Vocabulary.decode`` of 4,194,304 ids whose token text is just
  under ``max_decode_bytes`` (64 MiB), and of ids 1 byte over (refused).

    python benches/bench_vocabulary_caps.py [--json]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

CHILD = """
import json, sys, time
import stopline
from stopline import Vocabulary
def hwm():
    # VmHWM belongs to this image: ru_maxrss would carry the parent's peak
    # over the exec.
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmHWM:"))
{setup}
base = hwm()
t = time.perf_counter()
try:
    {call}
    outcome = "ok"
except Exception as e:
    outcome = type(e).__name__ + ": " + str(e)[:120]
dt = time.perf_counter() - t
peak = hwm() - base
print(json.dumps({{"s": dt, "peak_mib": peak / 1024, "outcome": outcome}}))
"""


def child(setup: str, call: str) -> dict[str, object]:
    code = CHILD.format(setup=textwrap.dedent(setup), call=call)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    if r.returncode:
        return {"s": float("nan"), "peak_mib": float("nan"), "outcome": f"child died ({r.returncode})"}
    out: dict[str, object] = json.loads(r.stdout.strip().splitlines()[-1])
    return out


def write_files(folder: Path) -> dict[str, Path]:
    cap = 127 << 20
    files = {}
    vocab = folder / "vocab.json"
    with open(vocab, "w") as f:
        f.write('{"model": {"type": "BPE", "vocab": {')
        size, i = 40, 0
        parts = []
        while size < cap:
            p = f'"{i:x}":{i},'
            parts.append(p)
            size += len(p)
            i += 1
        f.write("".join(parts)[:-1])
        f.write('}}, "decoder": {"type": "ByteLevel"}}')
    files["all vocab"] = vocab
    merges = folder / "merges.json"
    with open(merges, "w") as f:
        n = (cap - 100) // 6
        f.write('{"model": {"type": "BPE", "vocab": {"a": 0}, "merges": [')
        f.write(",".join(['"a b"'] * n))
        f.write(']}, "decoder": {"type": "ByteLevel"}}')
    files["all merges"] = merges

    def added_tokens(f: object, first: int, size: int) -> int:
        """Writes special added tokens from id ``first`` until ``size`` bytes;
        returns the next id."""
        i, parts, n = first, [], 0
        while n < size:
            p = '{"id":%d,"content":"%x","special":true},' % (i, i)
            parts.append(p)
            n += len(p)
            i += 1
        f.write("".join(parts)[:-1])  # type: ignore[attr-defined]
        return i

    added = folder / "added.json"
    with open(added, "w") as f:
        f.write('{"added_tokens": [')
        added_tokens(f, 0, cap - 100)
        f.write('], "model": {"type": "BPE", "vocab": {}}, "decoder": {"type": "ByteLevel"}}')
    files["all added_tokens"] = added
    half = folder / "half.json"
    with open(half, "w") as f:
        f.write('{"model": {"type": "BPE", "vocab": {')
        size, i, parts = 0, 0, []
        while size < cap // 2:
            p = f'"{i:x}":{i},'
            parts.append(p)
            size += len(p)
            i += 1
        f.write("".join(parts)[:-1])
        f.write('}}, "added_tokens": [')
        added_tokens(f, i, cap // 2 - 100)
        f.write('], "decoder": {"type": "ByteLevel"}}')
    files["half vocab, half special added_tokens"] = half
    return files


def rules(decoders: str) -> str:
    return f'{{"type": "Sequence", "decoders": {decoders}}}'


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as d:
        files = write_files(Path(d))
        for name, path in files.items():
            mib = path.stat().st_size / (1 << 20)
            r = child("", f"Vocabulary.from_file({str(path)!r})")
            rows.append((f"file size: {mib:.0f} MiB, {name}", r))
    replace = 'lambda p, c: {"type": "Replace", "pattern": {"String": p}, "content": c}'
    cases = [
        ("decoder rules: 32 never-matching x 250k tokens",
         f"R = {replace}\ntext = json.dumps({{'model': {{'vocab': {{'t%d' % i: i for i in range(250_000)}}}},"
         " 'decoder': {'type': 'Sequence', 'decoders': [R('\\x00', '')] * 32}})",
         "Vocabulary.from_str(text)"),
        ("rule output: 60 KB grow + shrink per token, to the cap",
         f"R = {replace}\ntext = json.dumps({{'model': {{'vocab': {{'a%d' % i: i for i in range(20_000)}}}},"
         " 'decoder': {'type': 'Sequence', 'decoders': [R('a', 'b' * 60_000), R('b', '')]}})",
         "Vocabulary.from_str(text)"),
        ("token bytes: 900 tokens doubled to 64 KiB",
         f"R = {replace}\ntext = json.dumps({{'model': {{'vocab': {{'%05d' % i + 'a' * 32763: i for i in range(900)}}}},"
         " 'decoder': {'type': 'Sequence', 'decoders': [R('a', 'aa')]}})",
         "Vocabulary.from_str(text)"),
        ("decode: 4,194,304 ids, 64 MiB - 16 B of token text",
         "v = Vocabulary.from_str(json.dumps({'model': {'vocab': {'x' * 15: 0}}}))\n"
         "ids = [0] * 4194303",
         "v.decode(ids)"),
        ("decode: 1 byte over max_decode_bytes (refused)",
         "v = Vocabulary.from_str(json.dumps({'model': {'vocab': {'x' * 15: 0, 'y' * 16: 1}}}))\n"
         "ids = [0] * 4194303 + [1]",
         "v.decode(ids)"),
    ]
    for name, setup, call in cases:
        rows.append((name, child(setup, call)))
    if args.json:
        print(json.dumps([{"case": n, **r} for n, r in rows], indent=1))
        return
    for name, r in rows:
        print(f"{name:55s} {r['s']:8.3f} s  peak +{r['peak_mib']:7.1f} MiB  {r['outcome']}")


if __name__ == "__main__":
    main()
