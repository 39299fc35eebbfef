#!/usr/bin/env bash
# Fuzzing (fuzz/, see fuzz/README.md), a heavy judge run apart from the test command: each target
# for MESHPILOT_FUZZ_SECONDS (default 300) under AddressSanitizer with debug assertions (so
# arithmetic overflow panics too), starting from the committed seeds (fuzz/corpus/<target>/seed-*)
# and whatever this machine found before. New inputs land in fuzz/corpus/<target>/, which git
# ignores apart from the seeds. A crash, a panic, an input taking over 10 s or an out-of-memory
# input fails the run; libFuzzer leaves it in fuzz/artifacts/<target>/, and
# `RUSTC_BOOTSTRAP=1 cargo fuzz run -s address -a <target> <file>` replays it.
# Writes docs/fuzz.md: per target, the time, executions, corpus growth and the verdict.
#   MESHPILOT_FUZZ_TARGETS="config wire" scripts/fuzz.sh   fuzzes only those targets.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

# cargo-fuzz drives libFuzzer through nightly-only compiler flags, which the stable toolchain
# accepts under RUSTC_BOOTSTRAP=1; the AddressSanitizer runtime ships with stable rust-std.
if ! cargo fuzz --version >/dev/null 2>&1; then
    echo "cargo install cargo-fuzz" >&2
    # --force: cargo skips a package it has on record even when its binary is gone.
    cargo install --locked --force cargo-fuzz >&2
fi
bash scripts/setup.sh >/dev/null
if [[ -z "${PROTOC:-}" ]] && command -v protoc >/dev/null 2>&1; then
    export PROTOC="$(command -v protoc)"
fi

seconds="${MESHPILOT_FUZZ_SECONDS:-300}"
targets="${MESHPILOT_FUZZ_TARGETS:-config ads wire}"
fuzz() { RUSTC_BOOTSTRAP=1 cargo fuzz "$@" --sanitizer address --release --debug-assertions; }

started=$SECONDS
fuzz build
build_seconds=$((SECONDS - started))
rows=""
failed=""
for target in $targets; do
    echo "== fuzz: $target for ${seconds}s" >&2
    log="$(mktemp)"
    before=$(find "fuzz/corpus/$target" -type f 2>/dev/null | wc -l)
    verdict="no crash, panic, hang or out-of-memory input"
    if ! RUSTC_BOOTSTRAP=1 cargo fuzz run --sanitizer address --release --debug-assertions "$target" -- \
        -max_total_time="$seconds" -timeout=10 -rss_limit_mb=4096 -print_final_stats=1 >"$log" 2>&1; then
        # The report (panic message or sanitizer trace, and the input's path) is at the end.
        tail -n 150 "$log"
        verdict="FAILED: the input is in fuzz/artifacts/$target/"
        failed="$failed $target"
    fi
    after=$(find "fuzz/corpus/$target" -type f 2>/dev/null | wc -l)
    runs=$(grep -E '^stat::number_of_executed_units' "$log" | awk '{print $2}' | tail -n 1)
    added=$(grep -E '^stat::new_units_added' "$log" | awk '{print $2}' | tail -n 1)
    echo "$target: ${runs:-?} executions, ${added:-?} new units; $verdict" >&2
    rows="$rows| \`$target\` | $seconds s | ${runs:-?} | ${added:-?} | $before → $after | $verdict |"$'\n'
    rm -f "$log"
done

{
    echo "# Fuzzing"
    echo
    echo "What \`bash scripts/fuzz.sh\` found on $(date -u +%Y-%m-%d) at $(git rev-parse --short HEAD), on this"
    echo "machine ($(nproc) cores): each target of \`fuzz/\` (see \`fuzz/README.md\`) under AddressSanitizer with"
    echo "debug assertions, from the committed seeds and this machine's earlier corpus. The instrumented"
    echo "build took ${build_seconds} s. The test command replays the committed seeds of \`config\` and"
    echo "\`wire\` through the same library calls (unit tests), not the fuzzing itself."
    echo
    echo "| target | time | executions | new units | corpus files | verdict |"
    echo "|---|---|---|---|---|---|"
    printf "%s" "$rows"
} > docs/fuzz.md
echo "report written to docs/fuzz.md" >&2
if [[ -n "$failed" ]]; then
    echo "fuzz:$failed FAILED" >&2
    exit 1
fi
