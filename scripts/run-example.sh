#!/usr/bin/env bash
# Runs meshpilot standalone on the bookinfo example. Extra arguments are passed on.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

envoy_path="$(bash scripts/setup.sh)"
echo "Envoy: $envoy_path" >&2
if [[ -z "${PROTOC:-}" ]] && command -v protoc >/dev/null 2>&1; then
    export PROTOC="$(command -v protoc)"
fi

exec cargo run --release -- standalone \
    --config-dir examples/bookinfo \
    --mesh-config examples/mesh.yaml \
    "$@"
