#!/usr/bin/env bash
# Builds a real kube-apiserver (the Kubernetes version k8s-openapi is pinned to) from the Go
# module proxy, for the Kubernetes source's integration tests, and prints its path on stdout.
#
# k8s.io/kubernetes cannot be `go install`ed directly: its go.mod replaces the k8s.io/* staging
# modules with local directories that its module zip does not contain. A throwaway module that
# requires it and points each staging module at its published v0.x release builds the command.
# The binary is cached (MESHPILOT_TOOLS, default ~/.cache/meshpilot); a rebuild is a no-op.
set -euo pipefail

log() { echo "kube-apiserver: $*" >&2; }

VERSION="${MESHPILOT_KUBE_VERSION:-1.33.13}"
TOOLS="${MESHPILOT_TOOLS:-$HOME/.cache/meshpilot}"
BIN="$TOOLS/bin/kube-apiserver-v$VERSION"

if [[ -x "$BIN" ]]; then
    echo "$BIN"
    exit 0
fi
if ! command -v go >/dev/null 2>&1; then
    log "Go is not installed: cannot build kube-apiserver (the Kubernetes tests will skip)"
    exit 1
fi

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
log "building kube-apiserver v$VERSION from the Go module proxy (a few minutes the first time)"
dir="$(cd "$work" && go mod download -json "k8s.io/kubernetes@v$VERSION" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')"
if [[ -z "$dir" || ! -f "$dir/go.mod" ]]; then
    log "could not download k8s.io/kubernetes@v$VERSION"
    exit 1
fi
go_version="$(sed -n 's/^go \([0-9.]*\)$/\1/p' "$dir/go.mod")"
{
    echo "module meshpilot.local/kube-apiserver-build"
    echo
    echo "go $go_version"
    echo
    echo "require k8s.io/kubernetes v$VERSION"
    # Each staging module (k8s.io/api => ./staging/src/k8s.io/api) at its published release.
    sed -n 's/^[[:space:]]*\(k8s\.io\/[a-z0-9-]*\) => \.\/staging\/.*$/\1/p' "$dir/go.mod" |
        while read -r module; do echo "replace $module => $module v0.${VERSION#1.}"; done
} >"$work/go.mod"
printf '//go:build tools\n\npackage tools\n\nimport _ "k8s.io/kubernetes/cmd/kube-apiserver"\n' >"$work/tools.go"
(cd "$work" && GOFLAGS=-mod=mod go mod tidy >&2 && go build -o "$work/kube-apiserver" k8s.io/kubernetes/cmd/kube-apiserver >&2)
mkdir -p "$TOOLS/bin"
mv "$work/kube-apiserver" "$BIN"
log "built $BIN"
echo "$BIN"
