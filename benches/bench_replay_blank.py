"""What ``stopline replay`` costs on trace files that are mostly blank or
whitespace-only lines, for docs/errors.md ("Caps"): each case runs
``python -m stopline replay FILE`` (or reads the file on standard input) in a
child and reports the child's CPU time (user + system, from
``RUSAGE_CHILDREN``), its wall time, its exit status and the first line it
wrote to stderr. The files are written first (not timed).

Cases:

* ``blank 4 GiB .gz``: a 4 MB ``.gz`` holding 4 GiB of ``"\\n"`` (the file
  cap, 32 MiB decompressed, ends the read);
* ``whitespace 4 GiB .gz``: the same with ``" \\t \\r\\n"`` lines;
* ``blank 31 MiB, then a request``: a plain file under the cap whose last
  line is a request (it must still load, on the right line);
* ``blank 4 GiB .gz on stdin``: the first case piped into ``replay -``;
* ``bundled``: the bundled traces, the ordinary path, for comparison.

    python benches/bench_replay_blank.py [--dir FOLDER] [--json]

``--dir`` keeps the files there between runs (building the two 4 GiB
streams takes about 30 s).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
import zlib
from pathlib import Path

REQUEST = b'{"id": "after-the-blanks", "params": {"max_tokens": 1}, "steps": [{"ids": [1]}]}\n'


def gz_of(path: Path, line: bytes, total: int) -> Path:
    """A gzip file holding ``line`` repeated to ``total`` bytes, compressed as a stream."""
    if path.exists():
        return path
    chunk = line * ((64 << 20) // len(line))
    comp = zlib.compressobj(9, zlib.DEFLATED, 31)  # wbits 31: a gzip header and trailer
    part = path.with_suffix(".part")
    with open(part, "wb") as f:
        written = 0
        while written < total:
            piece = chunk[: total - written]
            f.write(comp.compress(piece))
            written += len(piece)
        f.write(comp.flush())
    part.rename(path)
    return path


def write_files(folder: Path) -> dict[str, tuple[list[str], Path | None]]:
    blank = gz_of(folder / "blank4g.jsonl.gz", b"\n", 4 << 30)
    spaces = gz_of(folder / "whitespace4g.jsonl.gz", b" \t \r\n", 4 << 30)
    under = folder / "blank31m.jsonl"
    if not under.exists():
        under.write_bytes(b"\n" * (31 << 20) + REQUEST)
    return {
        "blank 4 GiB .gz": ([str(blank)], None),
        "whitespace 4 GiB .gz": ([str(spaces)], None),
        "blank 31 MiB, then a request": ([str(under)], None),
        "blank 4 GiB .gz on stdin": (["-"], blank),
        "bundled": ([], None),
    }


def child(args: list[str], stdin: Path | None) -> dict[str, object]:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t = time.perf_counter()
    with open(stdin if stdin is not None else os.devnull, "rb") as inp:
        r = subprocess.run([sys.executable, "-m", "stopline", "replay", *args], stdin=inp,
                           capture_output=True, text=True, timeout=600)
    wall = time.perf_counter() - t
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    first = (r.stderr.strip().splitlines() or [""])[0]
    return {"cpu_s": round(cpu, 3), "wall_s": round(wall, 3), "exit": r.returncode, "stderr": first[:150]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", default=None, help="keep the files in this folder (default: a temporary one)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(args.dir or tmp)
        folder.mkdir(parents=True, exist_ok=True)
        rows = [(name, child(argv, stdin)) for name, (argv, stdin) in write_files(folder).items()]
    if args.json:
        print(json.dumps([{"case": n, **r} for n, r in rows], indent=1))
        return
    for name, r in rows:
        print(f"{name:30s} cpu {r['cpu_s']:7.2f} s  wall {r['wall_s']:7.2f} s  exit {r['exit']}  {r['stderr']}")


if __name__ == "__main__":
    main()
