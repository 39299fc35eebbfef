#!/usr/bin/env bash
# CI entry point (.ci/run): install prerequisites, build, run the whole test suite.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

# Each stage prints how long the run has taken so far, so a slow CI run shows where the time went.
stage() { echo "== [$(date -u +%H:%M:%S), ${SECONDS}s] $*" >&2; }
stage "set-up"

envoy_path="$(bash scripts/setup.sh)"
export MESHPILOT_ENVOY="$envoy_path"
echo "Envoy: $MESHPILOT_ENVOY"
if [[ -z "${PROTOC:-}" ]] && command -v protoc >/dev/null 2>&1; then
    export PROTOC="$(command -v protoc)"
fi

# A real kube-apiserver for the Kubernetes source's tests, built from the Go module proxy (a few
# minutes the first time, then cached). Without Go the Kubernetes tests skip, except under CI=true.
stage "kube-apiserver"
if kube_apiserver="$(bash scripts/kube-apiserver.sh)"; then
    export MESHPILOT_KUBE_APISERVER="$kube_apiserver"
    echo "kube-apiserver: $MESHPILOT_KUBE_APISERVER"
fi

# Istio's pilot-agent for the sidecar tests, at the version of scripts/istio-version (built from
# the Go module proxy where Go is new enough, a few minutes the first time, then cached; the test
# command only, so the example's command does not wait for it). Without it the sidecar tests
# skip, except under CI=true; scripts/pilot-agent.sh says why it could not build.
stage "pilot-agent"
if pilot_agent="$(bash scripts/pilot-agent.sh)"; then
    export MESHPILOT_PILOT_AGENT="$pilot_agent"
    echo "pilot-agent: $MESHPILOT_PILOT_AGENT"
else
    echo "pilot-agent not installed: the sidecar tests (tests/sidecar_istio.rs) will skip" >&2
fi
# istioctl, the same way, for the tests of istioctl against meshpilot (tests/istioctl.rs).
stage "istioctl"
if istioctl="$(bash scripts/istio-tool.sh istioctl)"; then
    export MESHPILOT_ISTIOCTL="$istioctl"
    echo "istioctl: $MESHPILOT_ISTIOCTL"
else
    echo "istioctl not installed: the istioctl tests (tests/istioctl.rs) will skip" >&2
fi
# Istio's pilot-discovery (istiod), the same way, for the differential judge (tests/differential.rs).
stage "pilot-discovery"
if pilot_discovery="$(bash scripts/istio-tool.sh pilot-discovery)"; then
    export MESHPILOT_PILOT_DISCOVERY="$pilot_discovery"
    echo "pilot-discovery: $MESHPILOT_PILOT_DISCOVERY"
else
    echo "pilot-discovery not installed: the differential judge (tests/differential.rs) will skip" >&2
fi

# A suite run builds everything once, from a clean clone in CI: incremental compilation state
# would only take disk (gigabytes of it, which a CI machine ran out of), never save time.
export CARGO_INCREMENTAL="${CARGO_INCREMENTAL:-0}"

# Standards first: formatting and lints fail the run before any test starts.
stage "fmt and clippy"
cargo fmt --check
cargo clippy --all-targets --locked -- -D warnings

stage "build"
cargo build --locked --bins
stage "tests"
cargo test --locked --all-targets -- --test-threads=2

# Fuzzing (fuzz/, see fuzz/README.md): each target for MESHPILOT_FUZZ_SECONDS (default 60) under
# AddressSanitizer with debug assertions (so arithmetic overflow panics too), starting from the
# committed seeds (fuzz/corpus/<target>/seed-*) and whatever this machine found before. New inputs
# land in fuzz/corpus/<target>/, which git ignores apart from the seeds: the work tree stays clean
# and a developer's corpus keeps growing from run to run. A crash, a panic, an input taking over
# 10 s or an out-of-memory input fails the run; libFuzzer leaves it in fuzz/artifacts/<target>/,
# and `RUSTC_BOOTSTRAP=1 cargo fuzz run -s address -a <target> <file>` replays it.
# cargo-fuzz passes nightly-only flags; RUSTC_BOOTSTRAP=1 lets the stable toolchain take them.
fuzz_seconds="${MESHPILOT_FUZZ_SECONDS:-60}"
for target in config ads wire; do
    stage "fuzz: $target for ${fuzz_seconds}s"
    fuzz_log="$(mktemp)"
    if ! RUSTC_BOOTSTRAP=1 cargo fuzz run --sanitizer address --release --debug-assertions "$target" -- \
        -max_total_time="$fuzz_seconds" -timeout=10 -rss_limit_mb=4096 -print_final_stats=1 >"$fuzz_log" 2>&1; then
        # The report (panic message or sanitizer trace, and the input's path) is at the end.
        tail -n 150 "$fuzz_log"
        echo "fuzz: $target FAILED; the input is in fuzz/artifacts/$target/" >&2
        exit 1
    fi
    grep -E '^(Done |stat::number_of_executed_units|stat::new_units_added)' "$fuzz_log" || tail -n 3 "$fuzz_log"
    rm -f "$fuzz_log"
done
stage "done"
