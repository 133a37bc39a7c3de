#!/usr/bin/env bash
# The test suite on a free-threaded CPython (no GIL), as root, on a machine
# that reaches only Debian's archive, PyPI and crates.io.
#
# No free-threaded interpreter is packaged for Debian 12 or 13, and Debian's
# archive serves the source of CPython 3.13 (trixie) but not of 3.14. So:
#
# 1. debootstrap a minimal Debian 13 (trixie) into $FT_ROOT (this machine's
#    own packages are left alone) and build CPython 3.13 from trixie's
#    source with --disable-gil (python3.13t);
# 2. build stopline for python3.13t. The wheel is version-specific: maturin
#    and PyO3 drop the abi3 feature for a free-threaded interpreter. PyO3
#    0.30 refuses a free-threaded build older than 3.14 in pyo3-ffi's build
#    script only (its FFI layer still has the 3.13t definitions), so the
#    build uses a copy of pyo3-ffi with that floor lowered to 3.13, through
#    [patch.crates-io] in a copy of the source tree; the checkout is not
#    touched. When 3.14's source can be had, build that and drop the patch.
# 3. check that importing stopline leaves the GIL off (gil_used = false),
#    then run tests/test_threads.py and tests/test_hostile.py, then the rest
#    of the suite that installs there (no torch: its tests skip).
#
# The chroot and the interpreter are kept in $FT_ROOT and reused by the next
# run (about 9 of a fresh run's minutes); delete it to start over.
# Tracked files of the working tree are tested, changes included.
set -euo pipefail
cd "$(dirname "$0")/.."
FT_ROOT=${FT_ROOT:-/var/tmp/stopline-ft}
PY=/opt/py313t/bin/python3.13t
VENV=/opt/ft-venv
SRC=/build/stopline

phase() { echo "== free_threaded.sh: $1 (${SECONDS}s so far)"; }
# Exit 75 (EX_TEMPFAIL) when the interpreter or the packages could not be had
# (an archive or registry out of reach): .ci/run reports that and goes on. A
# failed stopline build or test exits non-zero otherwise, which fails CI.
unavailable() { echo "free_threaded.sh: $1 could not be set up; nothing was tested"; exit 75; }

if [ ! -x "$FT_ROOT/usr/bin/apt-get" ]; then
    phase "debootstrap trixie into $FT_ROOT"
    command -v debootstrap >/dev/null || { apt-get update -q && apt-get install -y -q debootstrap; } >/dev/null
    rm -rf "$FT_ROOT"
    debootstrap --variant=minbase --include=ca-certificates trixie "$FT_ROOT" http://deb.debian.org/debian >/dev/null \
        || { rm -rf "$FT_ROOT"; unavailable "the Debian 13 chroot"; }
fi

mounted=()
cleanup() {
    for m in "${mounted[@]}"; do umount "$m" || true; done
}
trap cleanup EXIT
for d in proc dev; do
    if ! mountpoint -q "$FT_ROOT/$d"; then
        mount --bind "/$d" "$FT_ROOT/$d"
        mounted+=("$FT_ROOT/$d")
    fi
done
cp /etc/resolv.conf "$FT_ROOT/etc/resolv.conf"
# Certificate authorities this machine added (an egress proxy's) for pip and cargo.
if compgen -G "/usr/local/share/ca-certificates/*.crt" >/dev/null; then
    cp /usr/local/share/ca-certificates/*.crt "$FT_ROOT/usr/local/share/ca-certificates/"
fi

in_root() {
    chroot "$FT_ROOT" env -i DEBIAN_FRONTEND=noninteractive PATH="$VENV/bin:/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin" HOME=/root LANG=C.UTF-8 "$@"
}

if [ ! -x "$FT_ROOT$PY" ]; then
    phase "build dependencies and CPython 3.13 --disable-gil"
    echo "deb-src http://deb.debian.org/debian trixie main" > "$FT_ROOT/etc/apt/sources.list.d/trixie-src.list"
    in_root bash -euc '
        update-ca-certificates >/dev/null
        apt-get update -q >/dev/null
        apt-get install -y -q --no-install-recommends build-essential dpkg-dev pkg-config \
            libssl-dev zlib1g-dev libffi-dev libbz2-dev liblzma-dev libsqlite3-dev \
            libexpat1-dev libmpdec-dev uuid-dev xz-utils rustc cargo >/dev/null
        rm -rf /build/cpython && mkdir -p /build/cpython && cd /build/cpython
        apt-get source --download-only python3.13 2>/dev/null | tail -1
        tar xf python3.13_*.orig.tar.xz
        cd Python-3.13*/
        ./configure -q --disable-gil --prefix=/opt/py313t --with-computed-gotos
        make -s -j"$(nproc)" >/build/cpython/make.log 2>&1 || { tail -50 /build/cpython/make.log; exit 1; }
        make -s altinstall >/build/cpython/install.log 2>&1
    ' || unavailable "CPython 3.13 with --disable-gil"
fi
in_root update-ca-certificates >/dev/null

phase "venv and test dependencies"
in_root bash -euc "
    [ -x $VENV/bin/python ] || $PY -m venv $VENV
    # hypothesis after 6.155.7 has a Rust part whose source needs a newer
    # rustc than trixie's, and no wheel for 3.13t.
    pip install -q --disable-pip-version-check --only-binary numpy,maturin \
        maturin==1.16.0 pytest 'hypothesis<=6.155.7' numpy
    python -c 'import sys; assert not sys._is_gil_enabled(), sys.version; print(sys.version)'
" || unavailable "the test dependencies"

phase "build stopline for python3.13t"
rm -rf "$FT_ROOT$SRC"
mkdir -p "$FT_ROOT$SRC"
git ls-files -z | tar --null --ignore-failed-read -T - -cf - | tar -xf - -C "$FT_ROOT$SRC"
in_root bash -euc "cd $SRC && cargo fetch -q" || unavailable "the crates"
in_root bash -euc "
    cd $SRC
    ver=\$(grep -A1 '^name = \"pyo3-ffi\"' Cargo.lock | sed -n 's/^version = \"\\(.*\\)\"/\\1/p')
    orig=\$(ls -d /root/.cargo/registry/src/*/pyo3-ffi-\$ver | head -1)
    rm -rf /build/pyo3-ffi && cp -r \"\$orig\" /build/pyo3-ffi
    sed -i 's/^const MIN_FREE_THREADED_VERSION: PythonVersion = PY_3_14;/const MIN_FREE_THREADED_VERSION: PythonVersion = PythonVersion { major: 3, minor: 13 };/' /build/pyo3-ffi/build.rs
    grep -q 'MIN_FREE_THREADED_VERSION: PythonVersion = PythonVersion { major: 3, minor: 13 }' /build/pyo3-ffi/build.rs \
        || { echo 'pyo3-ffi '\$ver': its free-threaded version floor was not found; update this script'; exit 1; }
    printf '\n[patch.crates-io]\npyo3-ffi = { path = \"/build/pyo3-ffi\" }\n' >> Cargo.toml
    # LTO off: this job tests behaviour, not speed.
    CARGO_TARGET_DIR=/build/target CARGO_PROFILE_RELEASE_LTO=off CARGO_PROFILE_RELEASE_CODEGEN_UNITS=16 \
        maturin build --release -i $VENV/bin/python -o /build/dist-\$\$ >/build/maturin.log 2>&1 \
        || { tail -40 /build/maturin.log; exit 1; }
    grep -E 'abi3|Built wheel' /build/maturin.log
    pip install -q --disable-pip-version-check --force-reinstall --no-deps /build/dist-\$\$/*.whl
    rm -rf /build/dist-\$\$
"

phase "the GIL stays off"
# Without PYTHON_GIL: a module that did not declare gil_used = false would
# turn the GIL on at import, with a RuntimeWarning (an error here).
in_root bash -euc "cd $SRC && python -W error::RuntimeWarning -c '
import sys, stopline
assert stopline.__file__.startswith(\"$VENV/\"), stopline.__file__
assert not sys._is_gil_enabled(), \"importing stopline turned the GIL on\"
print(\"stopline\", stopline.__file__, \"- GIL enabled:\", sys._is_gil_enabled())
'"

# PYTHON_GIL=0 keeps it off even if a test dependency would turn it on.
phase "thread and hostile-input tests"
in_root bash -euc "cd $SRC && PYTHON_GIL=0 python -m pytest -p no:cacheprovider -q -rs tests/test_threads.py tests/test_hostile.py"

phase "the rest of the suite (torch is not installed: its tests skip)"
# test_logits_real imports torch at module level; the README's blocks use it.
in_root bash -euc "cd $SRC && PYTHON_GIL=0 python -m pytest -p no:cacheprovider -q \
    --ignore=tests/test_threads.py --ignore=tests/test_hostile.py --ignore=tests/test_logits_real.py \
    --deselect tests/test_readme.py::test_readme_python_blocks_run tests"
phase "done"
