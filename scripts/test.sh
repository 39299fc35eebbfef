#!/usr/bin/env bash
# CI entry point (.ci/run): install prerequisites, build, run the whole test suite.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

envoy_path="$(bash scripts/setup.sh)"
export MESHPILOT_ENVOY="$envoy_path"
echo "Envoy: $MESHPILOT_ENVOY"
if [[ -z "${PROTOC:-}" ]] && command -v protoc >/dev/null 2>&1; then
    export PROTOC="$(command -v protoc)"
fi

# Standards first: formatting and lints fail the run before any test starts.
cargo fmt --check
cargo clippy --all-targets --locked -- -D warnings

cargo build --locked --bins
cargo test --locked --all-targets -- --test-threads=2
