"""The benchmark's mesh as Istio YAML files (read alike by `meshpilot --config-dir` and istiod's
`--configDir`), and its edit phases, each a rewrite of exactly one file.

One file per object, all in one flat directory (istiod's file watcher watches one directory):
`NS--KIND--NAME.yaml`."""

import os
from dataclasses import dataclass, field

DOMAIN = "svc.cluster.local"

#: The edit phases, in the order the load client runs them (each round, see `--repeat`).
PHASES = ("vs-edit", "dr-edit", "endpoint-change", "new-service")


def phase_name(base, round_):
    """The name of round round_ (from 1) of edit phase base: base itself in round 1."""
    return base if round_ == 1 else f"{base}@{round_}"


def parse_phase(name):
    """(base phase, round) of a phase name."""
    base, _, round_ = name.partition("@")
    return base, int(round_) if round_.isdigit() else 1


def phase_names(rounds):
    """Every edit phase of `rounds` rounds, in the order they run."""
    return [phase_name(base, r) for r in range(1, rounds + 1) for base in PHASES]


@dataclass
class MeshSettings:
    """Sizes and switches of the generated mesh."""

    services: int = 1000
    endpoints: int = 10
    namespaces: int = 20
    vs_every: int = 10
    dr_every: int = 5
    sidecar_scoping: bool = True

    def ns_of(self, i):
        """Namespace of service i."""
        return f"ns-{i % self.namespaces}"

    def host_of(self, i):
        """Host name of service i."""
        return f"svc-{i}.{self.ns_of(i)}.{DOMAIN}"

    def has_vs(self, i):
        """Whether service i has a VirtualService."""
        return self.vs_every > 0 and i % self.vs_every == 0

    def has_dr(self, i):
        """Whether service i has a DestinationRule."""
        return self.dr_every > 0 and i % self.dr_every == 0


@dataclass
class Mesh:
    """A generated mesh: its directory, object counts, and the edits (name -> (path, content))."""

    dir: str
    settings: MeshSettings
    counts: dict = field(default_factory=dict)
    edits: dict = field(default_factory=dict)


def endpoint_ip(n):
    """The n-th endpoint address (n >= 1): 10.x.y.z below 10.128.0.0 (proxies use 10.128+)."""
    if not 0 < n < (1 << 23):
        raise ValueError(f"endpoint index {n} out of 10.0.0.1-10.127.255.255")
    return f"10.{n >> 16}.{(n >> 8) & 255}.{n & 255}"


def service_entry(s, i, changed_ip=None):
    """ServiceEntry svc-i: STATIC, MESH_INTERNAL, port 80 http, s.endpoints addresses with
    version v1/v2 alternating; changed_ip replaces the first address."""
    lines = [
        "apiVersion: networking.istio.io/v1",
        "kind: ServiceEntry",
        "metadata:",
        f"  name: svc-{i}",
        f"  namespace: {s.ns_of(i)}",
        "spec:",
        f"  hosts: [{s.host_of(i)}]",
        "  location: MESH_INTERNAL",
        "  resolution: STATIC",
        "  ports:",
        "  - {number: 80, name: http, protocol: HTTP}",
        "  endpoints:",
    ]
    for j in range(s.endpoints):
        ip = endpoint_ip(i * s.endpoints + j + 1)
        if j == 0 and changed_ip:
            ip = changed_ip
        lines.append(f"  - address: {ip}")
        lines.append(f"    labels: {{version: v{1 + j % 2}}}")
    return "\n".join(lines) + "\n"


def virtual_service(s, i, weights=(90, 10)):
    """VirtualService for svc-i: weights between subsets v1/v2 when it has a DestinationRule,
    else a route to the host."""
    host = s.host_of(i)
    lines = [
        "apiVersion: networking.istio.io/v1",
        "kind: VirtualService",
        "metadata:",
        f"  name: svc-{i}",
        f"  namespace: {s.ns_of(i)}",
        "spec:",
        f"  hosts: [{host}]",
        "  http:",
        "  - route:",
    ]
    if s.has_dr(i):
        lines += [
            f"    - destination: {{host: {host}, subset: v1}}",
            f"      weight: {weights[0]}",
            f"    - destination: {{host: {host}, subset: v2}}",
            f"      weight: {weights[1]}",
        ]
    else:
        lines.append(f"    - destination: {{host: {host}}}")
    return "\n".join(lines) + "\n"


def destination_rule(s, i, max_connections=100):
    """DestinationRule for svc-i: subsets v1/v2 and a connectionPool traffic policy."""
    return "\n".join(
        [
            "apiVersion: networking.istio.io/v1",
            "kind: DestinationRule",
            "metadata:",
            f"  name: svc-{i}",
            f"  namespace: {s.ns_of(i)}",
            "spec:",
            f"  host: {s.host_of(i)}",
            "  trafficPolicy:",
            "    connectionPool:",
            f"      tcp: {{maxConnections: {max_connections}}}",
            "  subsets:",
            "  - {name: v1, labels: {version: v1}}",
            "  - {name: v2, labels: {version: v2}}",
        ]
    ) + "\n"


def sidecar(s, k):
    """Sidecar `default` of namespace ns-k: egress to its own namespace and the next two."""
    n = s.namespaces
    others = sorted({(k + 1) % n, (k + 2) % n} - {k})
    hosts = ", ".join(['"./*"'] + [f'"ns-{o}/*"' for o in others])
    return "\n".join(
        [
            "apiVersion: networking.istio.io/v1",
            "kind: Sidecar",
            "metadata:",
            "  name: default",
            f"  namespace: ns-{k}",
            "spec:",
            "  egress:",
            f"  - hosts: [{hosts}]",
        ]
    ) + "\n"


def file_path(root, ns, kind, name):
    """Where one object lives."""
    return os.path.join(root, f"{ns}--{kind}--{name}.yaml")


def generate(root, s, rounds=1):
    """Writes the mesh into root (created; must be empty) and returns the Mesh with its edits,
    `rounds` rounds of them."""
    os.makedirs(root, exist_ok=True)
    if os.listdir(root):
        raise ValueError(f"mesh directory {root} is not empty")
    if s.services < 2:
        raise ValueError("--services must be at least 2")
    counts = {"ServiceEntry": 0, "VirtualService": 0, "DestinationRule": 0, "Sidecar": 0}

    def write(path, text):
        with open(path, "w") as f:
            f.write(text)

    for i in range(s.services):
        ns = s.ns_of(i)
        write(file_path(root, ns, "serviceentry", f"svc-{i}"), service_entry(s, i))
        counts["ServiceEntry"] += 1
        if s.has_vs(i):
            write(file_path(root, ns, "virtualservice", f"svc-{i}"), virtual_service(s, i))
            counts["VirtualService"] += 1
        if s.has_dr(i):
            write(file_path(root, ns, "destinationrule", f"svc-{i}"), destination_rule(s, i))
            counts["DestinationRule"] += 1
    if s.sidecar_scoping:
        for k in range(s.namespaces):
            write(file_path(root, f"ns-{k}", "sidecar", "default"), sidecar(s, k))
            counts["Sidecar"] += 1
    return Mesh(dir=root, settings=s, counts=counts, edits=edits(root, s, rounds))


def edits(root, s, rounds=1):
    """The edit phases: name -> (absolute path, new content), each one file. Each round edits
    the same objects again to new content (and adds one more service)."""
    vs = next((i for i in range(s.services) if s.has_vs(i)), None)
    dr = next((i for i in range(s.services) if s.has_dr(i)), None)
    out = {}
    for r in range(1, rounds + 1):
        if vs is not None:
            path = file_path(root, s.ns_of(vs), "virtualservice", f"svc-{vs}")
            out[phase_name("vs-edit", r)] = (path, virtual_service(s, vs, (49 + r, 51 - r)))
        if dr is not None:
            path = file_path(root, s.ns_of(dr), "destinationrule", f"svc-{dr}")
            out[phase_name("dr-edit", r)] = (path, destination_rule(s, dr, max_connections=199 + r))
        # Service 1: not the one edited above; its first endpoint moves to a fresh address, above
        # those of every service the rounds add.
        fresh = endpoint_ip((s.services + rounds) * s.endpoints + r)
        path = file_path(root, s.ns_of(1), "serviceentry", "svc-1")
        out[phase_name("endpoint-change", r)] = (path, service_entry(s, 1, fresh))
        new = s.services + r - 1
        path = file_path(root, s.ns_of(new), "serviceentry", f"svc-{new}")
        out[phase_name("new-service", r)] = (path, service_entry(s, new))
    return {name: out[name] for name in phase_names(rounds) if name in out}


def edited_namespace(s, phase):
    """Index of the namespace of the object an edit phase changes."""
    base, round_ = parse_phase(phase)
    vs = next((i for i in range(s.services) if s.has_vs(i)), 0)
    dr = next((i for i in range(s.services) if s.has_dr(i)), 0)
    service = {"vs-edit": vs, "dr-edit": dr, "endpoint-change": 1, "new-service": s.services + round_ - 1}[base]
    return service % s.namespaces


def importing_proxies(s, phase, proxies, workloads):
    """How many of the load client's proxies import what `phase` edits: those whose namespace's
    Sidecar lists the edited object's namespace (its own and the next two), or all of them
    without Sidecar scoping. Proxy i is workload i % W, in namespace (i % W) % NS."""
    k = edited_namespace(s, phase)
    importers = {(k - d) % s.namespaces for d in range(3)} if s.sidecar_scoping else set(range(s.namespaces))
    return sum(1 for i in range(proxies) if (i % max(workloads, 1)) % s.namespaces in importers)


def write_atomically(path, content):
    """Replaces path's content in one rename, so that no watcher reads a half-written file (the
    temporary file is in a sibling directory, so that no watcher sees it)."""
    tmpdir = os.path.join(os.path.dirname(os.path.dirname(path)), ".bench-tmp")
    os.makedirs(tmpdir, exist_ok=True)
    tmp = os.path.join(tmpdir, os.path.basename(path))
    with open(tmp, "w") as f:
        f.write(content)
    os.replace(tmp, path)

