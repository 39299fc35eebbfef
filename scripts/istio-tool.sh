#!/usr/bin/env bash
# Builds one of Istio's own binaries from the Go module proxy and prints its path on stdout:
#   pilot-agent  the sidecar's agent (Envoy's bootstrap, the xDS proxy, `istio-iptables`), for the
#                sidecar tests; beside it goes Istio's Envoy bootstrap template
#                (envoy_bootstrap_tmpl.json), which pilot-agent reads at run time and which
#                istio-proxy images ship, taken from the same module;
#   istioctl     the operator's client, for the tests of istioctl against meshpilot;
#   pilot-discovery  istiod's xDS server, for the differential judge (tests/differential.rs,
#                scripts/judge.sh), which compares what it and meshpilot send on the same inputs.
#
# The version is scripts/istio-version (MESHPILOT_ISTIO_VERSION overrides it): a master
# pseudo-version, the only istio.io/istio version the module proxy here serves. It is built with
# the Go installed (GOTOOLCHAIN=local: no toolchain download) and only if that Go is at least the
# version Istio's go.mod asks for. Cached (MESHPILOT_TOOLS, default ~/.cache/meshpilot); a rebuild
# is a no-op. Exit 1 with a message on stderr where it cannot be built.
set -euo pipefail

TOOL="${1:?usage: istio-tool.sh pilot-agent|istioctl|pilot-discovery}"
case "$TOOL" in
    pilot-agent) PACKAGE="istio.io/istio/pilot/cmd/pilot-agent" ;;
    istioctl) PACKAGE="istio.io/istio/istioctl/cmd/istioctl" ;;
    pilot-discovery) PACKAGE="istio.io/istio/pilot/cmd/pilot-discovery" ;;
    *) echo "istio-tool.sh: unknown tool $TOOL (pilot-agent, istioctl or pilot-discovery)" >&2; exit 1 ;;
esac
log() { echo "$TOOL: $*" >&2; }

VERSION="${MESHPILOT_ISTIO_VERSION:-$(tr -d '[:space:]' <"$(dirname "${BASH_SOURCE[0]}")/istio-version")}"
TOOLS="${MESHPILOT_TOOLS:-$HOME/.cache/meshpilot}"
DIR="$TOOLS/bin/istio-$VERSION"
BIN="$DIR/$TOOL"
TEMPLATE="$DIR/envoy_bootstrap_tmpl.json"

if [[ -x "$BIN" && ( "$TOOL" != pilot-agent || -f "$TEMPLATE" ) ]]; then
    echo "$BIN"
    exit 0
fi
if ! command -v go >/dev/null 2>&1; then
    log "Go is not installed: cannot build $TOOL (the tests needing it will skip)"
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
    log "Go $have is older than the Go $need istio.io/istio@$VERSION asks for: cannot build $TOOL (the tests needing it will skip)"
    exit 1
fi
log "building $TOOL istio.io/istio@$VERSION from the Go module proxy (a few minutes the first time)"
# What Istio's own build stamps (VERSION-dev, the commit): pilot-agent sends it as ISTIO_VERSION.
revision="${VERSION##*-}"
ldflags="-X istio.io/istio/pkg/version.buildVersion=$(tr -d '[:space:]' <"$dir/VERSION")-dev"
ldflags+=" -X istio.io/istio/pkg/version.buildGitRevision=$revision"
(cd "$work" && GOTOOLCHAIN=local GOBIN="$work/bin" GOFLAGS=-mod=mod \
    go install -ldflags "$ldflags" "$PACKAGE@$VERSION" >&2)
mkdir -p "$DIR"
if [[ "$TOOL" == pilot-agent ]]; then
    cp "$dir/tools/packaging/common/envoy_bootstrap.json" "$TEMPLATE.tmp"
    mv "$TEMPLATE.tmp" "$TEMPLATE"
fi
mv "$work/bin/$TOOL" "$BIN"
log "built $BIN"
echo "$BIN"
