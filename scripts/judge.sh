#!/usr/bin/env bash
# The differential judge over its full corpora: istiod (pilot-discovery) and meshpilot on the
# same inputs — the examples, the hand-made cases of tests/testdata/differential/, and Istio's own
# inputs (tests/testdata/config, pilot/pkg/xds/testdata/benchmarks) read from the istio.io/istio
# module in the Go module cache — compared resource by resource. Writes docs/fidelity.md and
# docs/fidelity/report.json. Fails, after writing them, when a resource the baseline
# (tests/testdata/differential/baseline.json) has agreeing no longer agrees.
#   MESHPILOT_JUDGE_UPDATE=1 scripts/judge.sh   also records this run's agreements as the baseline.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

if [[ -z "${MESHPILOT_KUBE_APISERVER:-}" ]]; then
    MESHPILOT_KUBE_APISERVER="$(bash scripts/kube-apiserver.sh)"
    export MESHPILOT_KUBE_APISERVER
fi
if [[ -z "${MESHPILOT_PILOT_DISCOVERY:-}" ]]; then
    MESHPILOT_PILOT_DISCOVERY="$(bash scripts/istio-tool.sh pilot-discovery)"
    export MESHPILOT_PILOT_DISCOVERY
fi
if [[ -z "${PROTOC:-}" ]] && command -v protoc >/dev/null 2>&1; then
    export PROTOC="$(command -v protoc)"
fi
export MESHPILOT_JUDGE=full
cargo test --test integration differential:: -- --nocapture
