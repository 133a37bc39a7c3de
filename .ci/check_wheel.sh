#!/usr/bin/env bash
# Packaging check: `maturin build --release` makes a wheel that installs into a
# fresh virtual environment and passes the test suite as the installed package,
# not the source tree.
#
# The venv sees the system site-packages for the test extras (torch,
# transformers, hypothesis, ... installed by `pip install ".[test]"`), but its
# own site-packages comes first on sys.path, so `import stopline` is the wheel;
# the script checks that before running pytest, and pytest runs from the
# checkout only for the data files the tests read (README.md, docs/, traces).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
WORK=$(mktemp -d /tmp/stopline-wheel.XXXXXX)
trap 'rm -rf "$WORK"' EXIT

python3 -m pip install -q "maturin>=1.7,<2"
maturin build --release --out "$WORK/dist"
WHEEL=$(ls "$WORK"/dist/stopline-*.whl)
echo "check_wheel: built $(basename "$WHEEL")"
# Every bundled data file the CLI needs is in the wheel.
python3 - "$WHEEL" <<'PY'
import sys, zipfile
names = zipfile.ZipFile(sys.argv[1]).namelist()
need = ["stopline/_core.abi3.so", "stopline/_core.pyi", "stopline/py.typed", "stopline/traces/smollm2_chat.jsonl.gz"]
missing = [n for n in need if n not in names]
assert not missing, f"wheel lacks {missing}"
PY

python3 -m venv --system-site-packages "$WORK/venv"
# --ignore-installed: a stopline of the same version in the system
# site-packages (CI installs one) would otherwise count as "already satisfied".
"$WORK/venv/bin/python" -m pip install -q --no-deps --no-index --ignore-installed "$WHEEL"
export PATH="$WORK/venv/bin:$PATH"   # the `stopline` script, too, is the wheel's
"$WORK/venv/bin/python" - "$WORK/venv" <<'PY'
import sys, stopline, stopline._core
venv = sys.argv[1]
for mod in (stopline, stopline._core):
    assert mod.__file__.startswith(venv), f"{mod.__name__} imported from {mod.__file__}, not the wheel"
print("check_wheel: stopline", stopline.__version__, "from", stopline.__file__)
PY
command -v stopline | grep -q "^$WORK/venv/" || { echo "check_wheel: stopline script is not the wheel's"; exit 1; }
stopline replay > /dev/null
# The suite, with the installed package. -p no:cacheprovider: nothing written
# into the checkout.
"$WORK/venv/bin/python" -m pytest -q -p no:cacheprovider "$ROOT/tests"
