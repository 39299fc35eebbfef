#!/usr/bin/env bash
# Makes the certificates meshpilot's etcd runs with (deploy/kustomize/base/etcd.yaml: TLS on the
# client and peer ports, --client-cert-auth) and the two Secrets that carry them:
#   meshpilot-etcd-server-tls  ca.crt, tls.crt, tls.key: etcd's serving and peer certificate
#                              (mounted by the etcd pods only)
#   meshpilot-etcd-client-tls  ca.crt, tls.crt, tls.key: the client certificate etcd accepts
#                              (mounted by the ingest and frontend pods only)
# Whoever holds the client certificate can write etcd, so it decides which leader frontends
# follow: it lives only in that Secret. The CA's key stays in OUT_DIR, in no Secret: keep it
# offline (it is needed again only to issue new certificates), or delete it.
#
# Usage: bash deploy/etcd-certs.sh OUT_DIR [NAMESPACE]
#   then: kubectl apply -f OUT_DIR/etcd-tls-secrets.yaml   (before kubectl apply -k ...)
# NAMESPACE defaults to meshpilot-system. Certificates last DAYS days (default 365): run again
# and apply the new Secrets, then restart etcd, ingest and frontends, before they expire.
# Also used by deploy/local/run-local.sh (etcd on 127.0.0.1).
set -euo pipefail

die() { echo "etcd-certs: $*" >&2; exit 1; }

OUT="${1:-}"
NAMESPACE="${2:-meshpilot-system}"
DAYS="${DAYS:-365}"
[[ -n "$OUT" ]] || die "usage: bash deploy/etcd-certs.sh OUT_DIR [NAMESPACE]"
[[ "$NAMESPACE" =~ ^[a-z0-9]([-a-z0-9]*[a-z0-9])?$ ]] || die "not a namespace name: $NAMESPACE"
[[ "$DAYS" =~ ^[0-9]+$ ]] || die "DAYS is not a number: $DAYS"
command -v openssl >/dev/null 2>&1 || die "openssl not found"
mkdir -p "$OUT"
chmod 700 "$OUT"
cd "$OUT"
umask 077

key() { openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$1" 2>/dev/null; }

# The CA: signs etcd's certificate and the client certificate, and nothing else.
key ca.key
openssl req -x509 -new -key ca.key -sha256 -days $((DAYS * 10)) -subj "/O=meshpilot/CN=meshpilot etcd CA" \
    -addext "basicConstraints=critical,CA:TRUE,pathlen:0" \
    -addext "keyUsage=critical,keyCertSign,cRLSign" -out ca.crt

# sign NAME SUBJECT EXTENSIONS: NAME.key and NAME.crt signed by the CA.
sign() {
    local name="$1" subject="$2" extensions="$3"
    key "$name.key"
    openssl req -new -key "$name.key" -subj "$subject" -out "$name.csr"
    printf '%s\n' "$extensions" >"$name.ext"
    openssl x509 -req -in "$name.csr" -CA ca.crt -CAkey ca.key -CAcreateserial -sha256 -days "$DAYS" \
        -extfile "$name.ext" -out "$name.crt" 2>/dev/null
    rm -f "$name.csr" "$name.ext"
}

# etcd's names: the client Service, every member through the headless peer Service (clients and
# peers), and 127.0.0.1/localhost (etcdctl inside the pod, deploy/local/run-local.sh). etcd also
# dials itself and its peers with it, hence clientAuth.
svc="$NAMESPACE.svc"
sans="DNS:meshpilot-etcd,DNS:meshpilot-etcd.$NAMESPACE,DNS:meshpilot-etcd.$svc,DNS:meshpilot-etcd.$svc.cluster.local"
sans+=",DNS:*.meshpilot-etcd-peer.$svc,DNS:*.meshpilot-etcd-peer.$svc.cluster.local,DNS:localhost,IP:127.0.0.1"
sign server "/O=meshpilot/CN=meshpilot-etcd" "basicConstraints=critical,CA:FALSE
keyUsage=critical,digitalSignature,keyEncipherment
extendedKeyUsage=serverAuth,clientAuth
subjectAltName=$sans"
sign client "/O=meshpilot/CN=meshpilot" "basicConstraints=critical,CA:FALSE
keyUsage=critical,digitalSignature,keyEncipherment
extendedKeyUsage=clientAuth"
rm -f ca.srl

b64() { base64 <"$1" | tr -d '\n'; }
# secret NAME COMPONENT CERT: a kubernetes.io/tls Secret with the CA, CERT.crt and CERT.key.
secret() {
    cat <<EOF
apiVersion: v1
kind: Secret
metadata:
  name: $1
  namespace: $NAMESPACE
  labels:
    app.kubernetes.io/name: meshpilot
    app.kubernetes.io/component: $2
type: kubernetes.io/tls
data:
  ca.crt: $(b64 ca.crt)
  tls.crt: $(b64 "$3.crt")
  tls.key: $(b64 "$3.key")
EOF
}
{
    echo "# Made by deploy/etcd-certs.sh: etcd's TLS (see deploy/README.md). Holds private keys."
    secret meshpilot-etcd-server-tls etcd server
    echo "---"
    secret meshpilot-etcd-client-tls etcd-client client
} >etcd-tls-secrets.yaml
echo "etcd-certs: wrote ca.crt, ca.key, server.{crt,key}, client.{crt,key} and etcd-tls-secrets.yaml to $OUT" >&2
