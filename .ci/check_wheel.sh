#!/usr/bin/env bash
# Packaging check: the release artefacts a user would download.
#
# 1. The x86-64 wheel, built with `maturin --zig` against glibc 2.17
#    (manylinux2014 = manylinux_2_17), so it installs on any Linux with
#    glibc >= 2.17 whatever glibc this machine has; `auditwheel show` must
#    agree with the tag. The sdist; a wheel builds from it.
# 2. The wheel holds the license and the bundled traces, and neither the
#    tests nor the benches.
# 3. In a bare venv (no system site-packages, no extras) on every CPython
#    the classifiers advertise (missing one fails the check) and a newer one
#    found here: `import stopline`, `stopline replay --check` on the
#    bundled traces, and the extras' commands say what to install.
# 4. In a venv that sees the system site-packages (the test extras), the test
#    suite runs against the installed wheel, not the source tree.
#
# aarch64 wheels are not built here: no aarch64 Rust target is installed on
# the CI machine (see README, "Wheels").
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
WORK=$(mktemp -d /tmp/stopline-wheel.XXXXXX)
trap 'rm -rf "$WORK"' EXIT

python3 -m pip install -q "maturin>=1.9,<2" "ziglang" "auditwheel>=6"
# maturin finds zig on PATH (its `python -m ziglang` fallback misses new ziglang layouts).
ZIG_DIR=$(python3 -c 'import os, ziglang; print(os.path.dirname(ziglang.__file__))')
export PATH="$ZIG_DIR:$PATH"

maturin build --release --zig --compatibility manylinux2014 --out "$WORK/dist"
maturin sdist --out "$WORK/dist"
WHEEL=$(ls "$WORK"/dist/stopline-*.whl)
SDIST=$(ls "$WORK"/dist/stopline-*.tar.gz)
echo "check_wheel: built $(basename "$WHEEL") ($(du -k "$WHEEL" | cut -f1) kB) and $(basename "$SDIST")"
# .ci/run passes the wheel on to the engine job (.ci/engines.sh).
if [ -n "${STOPLINE_KEEP_WHEEL:-}" ]; then cp "$WHEEL" "$STOPLINE_KEEP_WHEEL/"; fi
case "$WHEEL" in
    *manylinux_2_17_x86_64*) ;;
    *) echo "check_wheel: $WHEEL is not tagged manylinux_2_17_x86_64"; exit 1 ;;
esac
auditwheel show "$WHEEL" | tee "$WORK/auditwheel.txt"
grep -q '"manylinux_2_17_x86_64"' "$WORK/auditwheel.txt" \
    || { echo "check_wheel: auditwheel does not confirm manylinux_2_17_x86_64"; exit 1; }

python3 - "$WHEEL" "$SDIST" <<'PY'
import sys, tarfile, zipfile
whl = zipfile.ZipFile(sys.argv[1])
names = whl.namelist()
need = ["stopline/_core.abi3.so", "stopline/_core.pyi", "stopline/py.typed", "stopline/cli.py",
        "stopline/traces/smollm2_chat.jsonl.gz", "stopline/tools/generate.py",
        "stopline-0.1.0.dist-info/licenses/LICENSE"]
missing = [n for n in need if n not in names]
assert not missing, f"wheel lacks {missing}"
stray = [n for n in names if n.startswith(("tests/", "benches/", "docs/"))]
assert not stray, f"wheel holds {stray}"
meta = whl.read("stopline-0.1.0.dist-info/METADATA").decode()
for line in ("License-Expression: Apache-2.0", "License-File: LICENSE", "Requires-Python: >=3.11",
             "Classifier: Programming Language :: Python :: 3.11"):
    assert line in meta.splitlines(), f"METADATA lacks {line!r}"
traces = sum(whl.getinfo(n).file_size for n in names if n.startswith("stopline/traces/"))
assert traces < 300_000, f"bundled traces are {traces} bytes"
sd = tarfile.open(sys.argv[2]).getnames()
for n in ("LICENSE", "Cargo.toml", "Cargo.lock", "pyproject.toml", "rust/lib.rs", "python/stopline/__init__.py"):
    assert f"stopline-0.1.0/{n}" in sd, f"sdist lacks {n}"
print(f"check_wheel: contents and metadata ok ({traces} bytes of traces)")
PY

# The sdist builds (what pip does on a platform without a wheel).
python3 -m pip wheel -q --no-deps --no-build-isolation -w "$WORK/from-sdist" "$SDIST"
echo "check_wheel: sdist builds $(basename "$(ls "$WORK"/from-sdist/stopline-*.whl)")"

# 3. Bare venvs: the wheel alone, nothing from the system. Every CPython
# that pyproject.toml advertises (its "Programming Language :: Python :: 3.x"
# classifiers) must be found, or the check fails: a wheel never tried on an
# advertised version is not a pass. A newer one found here is tried too.
advertised=$(python3 - <<'PY'
import re, tomllib
with open("pyproject.toml", "rb") as f:
    classifiers = tomllib.load(f)["project"]["classifiers"]
print(" ".join(m.group(1) for c in classifiers
               if (m := re.fullmatch(r"Programming Language :: Python :: 3\.(\d+)", c))))
PY
)
[ -n "$advertised" ] || { echo "check_wheel: pyproject.toml advertises no CPython 3.x version"; exit 1; }
find_python() {
    # python3.1x on PATH, else a pyenv install of it (pyenv's shims answer
    # only for the selected versions).
    local c
    for c in "python3.$1" "${PYENV_ROOT:-$HOME/.pyenv}"/versions/3."$1".*/bin/python3; do
        if "$c" -c "import sys; assert sys.version_info[:2] == (3, $1)" >/dev/null 2>&1; then
            echo "$c"; return 0
        fi
    done
    return 1
}
pythons=()
missing=()
for v in $advertised; do
    if py=$(find_python "$v"); then pythons+=("$py"); else missing+=("3.$v"); fi
done
if [ "${#missing[@]}" -gt 0 ]; then
    echo "check_wheel: FAIL: pyproject.toml advertises CPython ${missing[*]}, not installed here"
    echo "check_wheel: (install it, e.g. 'pyenv install 3.X', or drop its classifier)"
    exit 1
fi
last=${advertised##* }
if py=$(find_python $((last + 1))); then pythons+=("$py"); fi
echo "check_wheel: bare venvs on ${pythons[*]}"
for py in "${pythons[@]}"; do
    V="$WORK/bare-$("$py" -c 'import sys; print("%d.%d" % sys.version_info[:2])')"
    "$py" -m venv "$V"
    "$V/bin/python" -m pip install -q --no-deps --no-index "$WHEEL"
    "$V/bin/python" -c 'import stopline; print("check_wheel:", stopline.__version__, "on", __import__("sys").version.split()[0])'
    "$V/bin/stopline" replay --check > "$WORK/replay.txt"
    grep -q "check against stopline.baseline: all agree" "$WORK/replay.txt"
    # Without the extras, each subcommand names its extra and exits 2.
    set +e
    "$V/bin/stopline" generate --prompt hi 2> "$WORK/gen.err"; gen=$?
    "$V/bin/stopline" bench --quick 2> "$WORK/bench.err"; bench=$?
    set -e
    [ "$gen" -eq 2 ] && grep -q "pip install 'stopline\[demo\]'" "$WORK/gen.err"
    [ "$bench" -eq 2 ] && grep -q "pip install 'stopline\[bench\]'" "$WORK/bench.err"
done

# 4. The suite against the installed wheel, with the test extras from the
# system site-packages. --ignore-installed: a stopline of the same version in
# the system site-packages (CI installs one) would count as "already satisfied".
python3 -m venv --system-site-packages "$WORK/venv"
"$WORK/venv/bin/python" -m pip install -q --no-deps --no-index --ignore-installed "$WHEEL"
export PATH="$WORK/venv/bin:$PATH"   # the `stopline` script, too, is the wheel's
"$WORK/venv/bin/python" - "$WORK/venv" <<'PY'
import sys, stopline, stopline._core
venv = sys.argv[1]
for mod in (stopline, stopline._core):
    assert mod.__file__.startswith(venv), f"{mod.__name__} imported from {mod.__file__}, not the wheel"
assert not hasattr(stopline._core, "_panic_for_tests"), "the release wheel has the test hooks"
print("check_wheel: stopline", stopline.__version__, "from", stopline.__file__)
PY
command -v stopline | grep -q "^$WORK/venv/" || { echo "check_wheel: stopline script is not the wheel's"; exit 1; }
# -p no:cacheprovider: nothing written into the checkout.
"$WORK/venv/bin/python" -m pytest -q -p no:cacheprovider "$ROOT/tests"
