#!/usr/bin/env bash
# A short, bounded run of every fuzz target in fuzz/ (default 60 s each):
#   bash .ci/fuzz.sh [SECONDS_PER_TARGET]
#
# Builds the targets with libFuzzer's coverage instrumentation on the stable
# toolchain (the flags `cargo fuzz build -s none` passes; no sanitizer, so
# neither nightly nor cargo-fuzz is needed) and with debug assertions, which
# check the invariant of each of the core's `unsafe` blocks before it runs
# (docs/reliability.md, "The core's unsafe blocks"), then runs each one. A crash, a
# failed assertion or a timeout of one input exits non-zero, leaves the input
# in fuzz/artifacts/<target>/ and fails CI. Reproduce with
#   fuzz/target/ci/x86_64-unknown-linux-gnu/release/<target> fuzz/artifacts/<target>/<file>
# or, where nightly and cargo-fuzz are installed (the long runs in
# docs/reliability.md), `cd fuzz && cargo +nightly fuzz run -O <target> <file>`.
set -euo pipefail
cd "$(dirname "$0")/../fuzz"
PER_TARGET=${1:-60}
TRIPLE=$(rustc -vV | sed -n 's/^host: //p')
export RUSTFLAGS="-Cpasses=sancov-module -Cllvm-args=-sanitizer-coverage-level=4 \
-Cllvm-args=-sanitizer-coverage-inline-8bit-counters -Cllvm-args=-sanitizer-coverage-pc-table \
-Cllvm-args=-sanitizer-coverage-trace-compares --cfg fuzzing -Cdebug-assertions -Coverflow-checks"
# --target keeps RUSTFLAGS off build scripts (they must not need libFuzzer).
cargo build --release --locked --target "$TRIPLE" --target-dir target/ci --bins
for target in matcher finish detokenize snapshot; do
    mkdir -p "corpus/$target" "artifacts/$target"
    echo "fuzz: $target for ${PER_TARGET}s"
    rc=0
    "target/ci/$TRIPLE/release/$target" "corpus/$target" \
        -max_total_time="$PER_TARGET" -timeout=10 -rss_limit_mb=2048 \
        -artifact_prefix="artifacts/$target/" -print_final_stats=1 > "artifacts/$target.log" 2>&1 || rc=$?
    grep -E "^(Done|stat::number_of_executed_units|stat::average_exec_per_sec)|ERROR|panicked|SUMMARY" \
        "artifacts/$target.log" || true
    if [ "$rc" -ne 0 ] || [ -n "$(ls -A "artifacts/$target")" ]; then
        echo "fuzz: $target failed (exit status $rc); failing inputs:"; ls -l "artifacts/$target"
        tail -n 40 "artifacts/$target.log"
        exit 1
    fi
done
