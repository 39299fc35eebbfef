#!/usr/bin/env bash
# Builds Istio's pilot-agent (the sidecar's agent: Envoy's bootstrap, the xDS proxy, and
# `pilot-agent istio-iptables`) from the Go module proxy, for the sidecar tests, and prints its path
# on stdout. Beside it goes Istio's Envoy bootstrap template (envoy_bootstrap_tmpl.json), which
# pilot-agent reads at run time and which istio-proxy images ship, taken from the same module.
#
# The version is scripts/istio-version (MESHPILOT_ISTIO_VERSION overrides it): a master
# pseudo-version, the only istio.io/istio version the module proxy here serves. It is built with
# the Go installed (GOTOOLCHAIN=local: no toolchain download) and only if that Go is at least the
# version Istio's go.mod asks for. Cached (MESHPILOT_TOOLS, default ~/.cache/meshpilot); a rebuild
# is a no-op. Exit 1 with a message on stderr where it cannot be built.
set -euo pipefail

log() { echo "pilot-agent: $*" >&2; }

VERSION="${MESHPILOT_ISTIO_VERSION:-$(tr -d '[:space:]' <"$(dirname "${BASH_SOURCE[0]}")/istio-version")}"
TOOLS="${MESHPILOT_TOOLS:-$HOME/.cache/meshpilot}"
DIR="$TOOLS/bin/istio-$VERSION"
BIN="$DIR/pilot-agent"
TEMPLATE="$DIR/envoy_bootstrap_tmpl.json"

if [[ -x "$BIN" && -f "$TEMPLATE" ]]; then
    echo "$BIN"
    exit 0
fi
if ! command -v go >/dev/null 2>&1; then
    log "Go is not installed: cannot build pilot-agent (the sidecar tests will skip)"
    exit 1
fi

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
dir="$(cd "$work" && GOFLAGS=-mod=mod go mod download -json "istio.io/istio@$VERSION" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')"
if [[ -z "$dir" || ! -f "$dir/go.mod" ]]; then
    log "could not download istio.io/istio@$VERSION"
    exit 1
fi
need="$(sed -n 's/^go \([0-9.]*\)$/\1/p' "$dir/go.mod")"
have="$(GOTOOLCHAIN=local go env GOVERSION)"
have="${have#go}"
if [[ "$(printf '%s\n%s\n' "$need" "$have" | sort -V | head -n 1)" != "$need" ]]; then
    log "Go $have is older than the Go $need istio.io/istio@$VERSION asks for: cannot build pilot-agent (the sidecar tests will skip)"
    exit 1
fi
log "building pilot-agent istio.io/istio@$VERSION from the Go module proxy (a few minutes the first time)"
# What Istio's own build stamps (VERSION-dev, the commit): pilot-agent sends it as ISTIO_VERSION.
revision="${VERSION##*-}"
ldflags="-X istio.io/istio/pkg/version.buildVersion=$(tr -d '[:space:]' <"$dir/VERSION")-dev"
ldflags+=" -X istio.io/istio/pkg/version.buildGitRevision=$revision"
(cd "$work" && GOTOOLCHAIN=local GOBIN="$work/bin" GOFLAGS=-mod=mod \
    go install -ldflags "$ldflags" "istio.io/istio/pilot/cmd/pilot-agent@$VERSION" >&2)
mkdir -p "$DIR"
cp "$dir/tools/packaging/common/envoy_bootstrap.json" "$TEMPLATE.tmp"
mv "$TEMPLATE.tmp" "$TEMPLATE"
mv "$work/bin/pilot-agent" "$BIN"
log "built $BIN"
echo "$BIN"
