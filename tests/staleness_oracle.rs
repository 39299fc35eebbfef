//! The staleness oracle (issue 28): meshpilot pushes config incrementally, each snapshot change
//! invalidating only some generated resources. A dependency an invalidation rule misses leaves a
//! connected proxy with stale config, silently. This test applies seeded random changes of every
//! kind meshpilot reads to a real kube-apiserver, with simulated proxies (sidecars in several
//! namespaces, with and without Sidecar scoping, gateways; state of the world and delta)
//! connected throughout, and after every step checks that what each proxy holds equals, resource
//! for resource, what a new connection of the same node gets from a new meshpilot process
//! started from scratch on the same API server.
//!
//! `MESHPILOT_ORACLE_SEED` (a number or `random`; default: the one CI runs) and
//! `MESHPILOT_ORACLE_STEPS` (default: what CI runs, both modes in about a minute on 2 cores in a
//! debug build) choose the run; the seed is printed first, so a failure reproduces with it.
//! `MESHPILOT_ORACLE_KEEP_GOING=1` (long runs) reports a stale proxy, connects it again and goes
//! on, failing at the end.

use crate::common;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use base64::Engine as _;
use common::certs::MeshRoot;
use common::cluster::sims::connect_sim;
use common::kube::{apply, delete, KubeApi, ADMIN_TOKEN};
use common::meshpilot::{wait_leader, Meshpilot, MeshpilotBuilder};
use common::oracle::{describe, held, mismatches, settled_view, Held};
use common::poll::STARTUP_TIMEOUT;
use common::ports::free_addr;
use common::secure::{ca_from_dir, channel, client_cert};
use kube::Client;
use meshpilot::security::ca::CertificateAuthority;
use meshpilot::security::TrustDomain;
use meshpilot::sim::{SimProxy, SimProxySpec};
use meshpilot::xds::TypeUrl;
use serde_json::{json, Value};
use std::path::Path;

/// The seed when `MESHPILOT_ORACLE_SEED` is unset: CI runs one fixed sequence, so the suite
/// does not fail by the luck of the draw; long runs choose seeds (or `random`).
const CI_SEED: u64 = 1;
/// Steps per mode when `MESHPILOT_ORACLE_STEPS` is unset (what CI runs).
const CI_STEPS: u64 = 30;
/// How long the proxies connected all along may take to catch up with a step.
const CATCH_UP: Duration = Duration::from_secs(20);
/// How long new connections must stay quiet to count as complete.
const QUIET: Duration = Duration::from_millis(400);

/// The namespaces of workloads (the gateway's is `istio-system`).
const NAMESPACES: [&str; 2] = ["ns-a", "ns-b"];
/// App labels: of pods, Services' selectors, WorkloadEntries, selectors of policies.
const APPS: [&str; 3] = ["alpha", "beta", "gamma"];
/// Version labels: of pods and WorkloadEntries, and the DestinationRules' subsets.
const VERSIONS: [&str; 2] = ["v1", "v2"];
/// Kubernetes Services: (namespace, name).
const SERVICES: [(&str, &str); 3] = [("ns-a", "alpha"), ("ns-b", "beta"), ("ns-a", "gamma")];
/// Hosts VirtualServices, DestinationRules and ServiceEntries name: the Services' and two others.
const HOSTS: [&str; 5] = [
    "alpha.ns-a.svc.cluster.local",
    "beta.ns-b.svc.cluster.local",
    "gamma.ns-a.svc.cluster.local",
    "ext.example.com",
    "www.example.com",
];
/// Pods per namespace; sidecars run at the addresses of some of them.
const PODS: usize = 3;
/// The gateway credentials (Secrets in `istio-system`).
const CREDENTIALS: [&str; 2] = ["gw-cred-1", "gw-cred-2"];
/// A P-256 public key as a JWKS (RequestAuthentication's inline `jwks`).
const JWKS: &str = r#"{"keys":[{"kty":"EC","crv":"P-256","alg":"ES256","kid":"k1","x":"efsVA8EPdIwGWmJLxpwBP8W2APhN2qzr5LQK5zlPC6c","y":"Qsg_WWtiX1hGenmZG3hankkOohlzW7lfH1BnwkYz3i4"}]}"#;

/// A small seeded generator (splitmix64): the same seed, the same run.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
    fn chance(&mut self, percent: u64) -> bool {
        self.next() % 100 < percent
    }
    fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len())]
    }
    /// A non-empty random subset of `items`, in their order.
    fn some<T: Clone>(&mut self, items: &[T]) -> Vec<T> {
        let first = self.below(items.len());
        items.iter().enumerate().filter(|(i, _)| *i == first || self.chance(35)).map(|(_, t)| t.clone()).collect()
    }
}

/// The kinds a step changes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    VirtualService,
    DestinationRule,
    Gateway,
    ServiceEntry,
    WorkloadEntry,
    Sidecar,
    PeerAuthentication,
    RequestAuthentication,
    AuthorizationPolicy,
    Service,
    EndpointSlice,
    Pod,
    NamespaceLabels,
    MeshConfig,
    Secret,
}

const KINDS: [Kind; 15] = [
    Kind::VirtualService,
    Kind::DestinationRule,
    Kind::Gateway,
    Kind::ServiceEntry,
    Kind::WorkloadEntry,
    Kind::Sidecar,
    Kind::PeerAuthentication,
    Kind::RequestAuthentication,
    Kind::AuthorizationPolicy,
    Kind::Service,
    Kind::EndpointSlice,
    Kind::Pod,
    Kind::NamespaceLabels,
    Kind::MeshConfig,
    Kind::Secret,
];

/// One object's identity: apiVersion, kind, namespace, name.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct ObjectKey {
    api_version: &'static str,
    kind: &'static str,
    namespace: Option<String>,
    name: String,
}

/// What a step did.
#[derive(Debug, Clone)]
enum Change {
    Apply(ObjectKey, Value),
    Delete(ObjectKey),
}

impl std::fmt::Display for Change {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Change::Apply(k, v) => write!(f, "apply {} {:?}/{}: {v}", k.kind, k.namespace, k.name),
            Change::Delete(k) => write!(f, "delete {} {:?}/{}", k.kind, k.namespace, k.name),
        }
    }
}

/// The objects the test made, and the next changes it makes.
struct World {
    rng: Rng,
    objects: BTreeMap<ObjectKey, Value>,
    credentials: Vec<(String, String)>,
}

fn pod_ip(ns: usize, i: usize) -> String {
    format!("10.1.{}.{}", ns + 1, i + 10)
}

fn meta(name: &str, ns: &str) -> Value {
    json!({"name": name, "namespace": ns})
}

impl World {
    fn new(seed: u64) -> World {
        let root = MeshRoot::get();
        let credentials = [["shop.example.com"], ["www.example.com"]]
            .iter()
            .map(|names| {
                let leaf = root.server(names);
                (leaf.cert, leaf.key)
            })
            .collect();
        World { rng: Rng(seed), objects: BTreeMap::new(), credentials }
    }

    /// The objects every run starts with: namespaces, Services, pods.
    fn initial(&mut self) -> Vec<Change> {
        let mut changes = Vec::new();
        for ns in NAMESPACES.iter().chain(&["istio-system"]) {
            changes.push(self.namespace(ns));
        }
        for i in 0..SERVICES.len() {
            changes.push(self.service(i));
        }
        for ns in 0..NAMESPACES.len() {
            for i in 0..PODS {
                changes.push(self.pod(ns, i));
            }
        }
        for i in 0..SERVICES.len() {
            changes.push(self.endpoint_slice(i));
        }
        // The gateway serves HTTPS from the start, with both credentials there.
        for name in CREDENTIALS {
            changes.push(self.secret(name));
        }
        changes.push(self.gateway(true));
        for change in &changes {
            if let Change::Apply(key, value) = change {
                self.objects.insert(key.clone(), value.clone());
            }
        }
        changes
    }

    /// The next random change: endpoints, pods and routing more often, as in a real mesh.
    fn step(&mut self) -> Change {
        let weights = |k: &Kind| match k {
            Kind::EndpointSlice => 4,
            Kind::VirtualService => 3,
            Kind::Pod | Kind::DestinationRule | Kind::Gateway => 2,
            _ => 1,
        };
        let mut at = self.rng.below(KINDS.iter().map(weights).sum());
        let mut kind = Kind::Pod;
        for k in KINDS {
            if at < weights(&k) {
                kind = k;
                break;
            }
            at -= weights(&k);
        }
        let change = match kind {
            Kind::VirtualService => self.virtual_service(),
            Kind::DestinationRule => self.destination_rule(),
            Kind::Gateway => self.gateway(false),
            Kind::ServiceEntry => self.service_entry(),
            Kind::WorkloadEntry => self.workload_entry(),
            Kind::Sidecar => self.sidecar(),
            Kind::PeerAuthentication => self.peer_authentication(),
            Kind::RequestAuthentication => self.request_authentication(),
            Kind::AuthorizationPolicy => self.authorization_policy(),
            Kind::Service => {
                let i = self.rng.below(SERVICES.len());
                self.service(i)
            }
            Kind::EndpointSlice => {
                let i = self.rng.below(SERVICES.len());
                self.endpoint_slice(i)
            }
            Kind::Pod => {
                let (ns, i) = (self.rng.below(NAMESPACES.len()), self.rng.below(PODS));
                self.pod(ns, i)
            }
            Kind::NamespaceLabels => {
                let ns = *self.rng.pick(&["ns-a", "ns-b", "istio-system"]);
                self.namespace(ns)
            }
            Kind::MeshConfig => self.mesh_config(),
            Kind::Secret => {
                let name = *self.rng.pick(&CREDENTIALS);
                self.secret(name)
            }
        };
        // A quarter of the changes to an existing object (but a namespace) delete it instead.
        match change {
            Change::Apply(key, _)
                if key.kind != "Namespace" && self.objects.contains_key(&key) && self.rng.chance(25) =>
            {
                self.objects.remove(&key);
                Change::Delete(key)
            }
            change => {
                if let Change::Apply(key, value) = &change {
                    self.objects.insert(key.clone(), value.clone());
                }
                change
            }
        }
    }

    fn key(api_version: &'static str, kind: &'static str, ns: Option<&str>, name: &str) -> ObjectKey {
        ObjectKey { api_version, kind, namespace: ns.map(String::from), name: name.to_string() }
    }

    fn istio(&mut self, api_version: &'static str, kind: &'static str, ns: &str, name: &str, spec: Value) -> Change {
        let key = Self::key(api_version, kind, Some(ns), name);
        let value = json!({"apiVersion": api_version, "kind": kind, "metadata": meta(name, ns), "spec": spec});
        // Only objects meshpilot accepts: while the API server holds an invalid update, a running
        // server keeps the object's last valid version in force, which a server started from
        // scratch cannot know. The two would differ by history, not by a missed invalidation.
        let checked = meshpilot::config::parse::parse_object("oracle", value.clone());
        assert!(
            matches!(checked, meshpilot::config::parse::Document::Valid(_)),
            "the oracle made an object meshpilot rejects: {checked:?}"
        );
        Change::Apply(key, value)
    }

    /// Workload labels: an app, mostly a version, and mostly the label of an injected sidecar
    /// (which auto mTLS reads).
    fn labels(&mut self) -> Value {
        let mut labels = serde_json::Map::new();
        labels.insert("app".into(), json!(self.rng.pick(&APPS)));
        if self.rng.chance(70) {
            labels.insert("version".into(), json!(self.rng.pick(&VERSIONS)));
        }
        if self.rng.chance(80) {
            labels.insert("security.istio.io/tlsMode".into(), json!("istio"));
        }
        Value::Object(labels)
    }

    fn selector(&mut self) -> Option<Value> {
        self.rng.chance(50).then(|| json!({"matchLabels": {"app": self.rng.pick(&APPS)}}))
    }

    fn namespace(&mut self, ns: &str) -> Change {
        let mut labels = serde_json::Map::new();
        if self.rng.chance(60) {
            labels.insert("team".into(), json!(self.rng.pick(&["red", "blue"])));
        }
        if self.rng.chance(30) {
            labels.insert("topology.istio.io/network".into(), json!(self.rng.pick(&["net-1", "net-2"])));
        }
        let key = Self::key("v1", "Namespace", None, ns);
        Change::Apply(key, json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns, "labels": labels}}))
    }

    fn service(&mut self, i: usize) -> Change {
        let (ns, name) = SERVICES[i];
        let mut ports = vec![json!({"name": "http-web", "port": 80, "targetPort": 8080})];
        if self.rng.chance(50) {
            ports.push(json!({"name": "grpc", "port": 9090, "targetPort": 9090}));
        }
        if self.rng.chance(if name == "gamma" { 70 } else { 30 }) {
            ports.push(json!({"name": "tcp-db", "port": 5432}));
        }
        let key = Self::key("v1", "Service", Some(ns), name);
        let mut spec = json!({"selector": {"app": self.rng.pick(&APPS)}, "ports": ports});
        // gamma is headless (always: Kubernetes keeps a Service's clusterIP for its life), so its
        // non-HTTP ports get a listener per endpoint address, which endpoint changes must reach.
        if name == "gamma" {
            spec["clusterIP"] = json!("None");
        }
        let value = json!({"apiVersion": "v1", "kind": "Service", "metadata": meta(name, ns), "spec": spec});
        Change::Apply(key, value)
    }

    fn endpoint_slice(&mut self, i: usize) -> Change {
        let (ns, service) = SERVICES[i];
        let ns_index = NAMESPACES.iter().position(|n| *n == ns).unwrap_or(0);
        let pods: Vec<usize> = (0..PODS).filter(|_| self.rng.chance(60)).collect();
        let endpoints: Vec<Value> = pods
            .iter()
            .map(|&i| {
                json!({"addresses": [pod_ip(ns_index, i)],
                    "conditions": {"ready": self.rng.chance(85), "serving": true, "terminating": false},
                    "targetRef": {"kind": "Pod", "name": format!("pod-{i}"), "namespace": ns}})
            })
            .collect();
        let mut ports = vec![json!({"name": "http-web", "port": 8080, "protocol": "TCP"})];
        if self.rng.chance(50) {
            ports.push(json!({"name": "grpc", "port": 9090, "protocol": "TCP"}));
        }
        if self.rng.chance(50) {
            ports.push(json!({"name": "tcp-db", "port": 5432, "protocol": "TCP"}));
        }
        let name = format!("{service}-slice");
        let key = Self::key("discovery.k8s.io/v1", "EndpointSlice", Some(ns), &name);
        let value = json!({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
            "metadata": {"name": name, "namespace": ns, "labels": {"kubernetes.io/service-name": service}},
            "addressType": "IPv4", "ports": ports, "endpoints": endpoints});
        Change::Apply(key, value)
    }

    /// Pod `pod-I` of namespace number `ns`: its address never changes, its labels do.
    fn pod(&mut self, ns: usize, i: usize) -> Change {
        let namespace = NAMESPACES[ns];
        let name = format!("pod-{i}");
        let ip = pod_ip(ns, i);
        let key = Self::key("v1", "Pod", Some(namespace), &name);
        let value = json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": namespace, "labels": self.labels()},
            "spec": {"serviceAccountName": format!("sa-{i}"),
                "containers": [{"name": "app", "image": "app", "ports": [{"name": "web", "containerPort": 8080}]}]},
            "status": {"phase": "Running", "podIP": ip, "podIPs": [{"ip": ip}],
                "conditions": [{"type": "Ready", "status": if self.rng.chance(85) { "True" } else { "False" }}]}});
        Change::Apply(key, value)
    }

    fn virtual_service(&mut self) -> Change {
        // A delegate (no hosts) now and then: its edits reach only through the roots naming it.
        if self.rng.chance(35) {
            return self.delegate_virtual_service();
        }
        let name = format!("vs-{}", self.rng.below(3));
        let ns = *self.rng.pick(&NAMESPACES);
        let gateways =
            self.rng.pick(&[json!(["mesh"]), json!(["istio-system/gw"]), json!(["mesh", "istio-system/gw"])]).clone();
        let mut route = json!({"destination": {"host": self.rng.pick(&HOSTS)}});
        if self.rng.chance(50) {
            route["destination"]["subset"] = json!(self.rng.pick(&VERSIONS));
        }
        if self.rng.chance(40) {
            route["destination"]["port"] = json!({"number": 80});
        }
        let mut http = json!({"route": [route]});
        if self.rng.chance(40) {
            // A root: the rule hands its matches to a delegate, which may not exist (yet).
            let namespace = *self.rng.pick(&NAMESPACES);
            http = json!({"delegate": {"name": format!("dl-{}", self.rng.below(2)), "namespace": namespace}});
        }
        if self.rng.chance(50) {
            http["match"] = json!([{"uri": {"prefix": self.rng.pick(&["/api", "/v2", "/"])}}]);
        }
        if self.rng.chance(40) {
            http["timeout"] = json!(self.rng.pick(&["1s", "5s", "30s"]));
        }
        if self.rng.chance(30) {
            http["retries"] = json!({"attempts": self.rng.below(4) + 1, "perTryTimeout": "2s"});
        }
        let mut spec = json!({"hosts": self.rng.some(&HOSTS[..4]), "gateways": gateways, "http": [http]});
        if self.rng.chance(25) {
            spec["exportTo"] = json!(["."]);
        }
        self.istio("networking.istio.io/v1", "VirtualService", ns, &name, spec)
    }

    /// A delegate VirtualService `dl-N`: HTTP rules only, no hosts, sometimes exported to its
    /// own namespace only.
    fn delegate_virtual_service(&mut self) -> Change {
        let name = format!("dl-{}", self.rng.below(2));
        let ns = *self.rng.pick(&NAMESPACES);
        let mut route = json!({"destination": {"host": self.rng.pick(&HOSTS)}});
        if self.rng.chance(50) {
            route["destination"]["subset"] = json!(self.rng.pick(&VERSIONS));
        }
        let mut http = json!({"route": [route]});
        if self.rng.chance(60) {
            http["match"] = json!([{"uri": {"prefix": self.rng.pick(&["/api/v1", "/v2", "/other"])}}]);
        }
        if self.rng.chance(40) {
            http["timeout"] = json!(self.rng.pick(&["1s", "5s"]));
        }
        let mut spec = json!({"http": [http]});
        if self.rng.chance(30) {
            spec["exportTo"] = json!(["."]);
        }
        self.istio("networking.istio.io/v1", "VirtualService", ns, &name, spec)
    }

    fn destination_rule(&mut self) -> Change {
        let name = format!("dr-{}", self.rng.below(3));
        let ns = *self.rng.pick(&NAMESPACES);
        let subsets: Vec<Value> =
            self.rng.some(&VERSIONS).iter().map(|v| json!({"name": v, "labels": {"version": v}})).collect();
        let mut policy = json!({});
        if self.rng.chance(50) {
            policy["loadBalancer"] = json!({"simple": self.rng.pick(&["ROUND_ROBIN", "LEAST_REQUEST", "RANDOM"])});
        }
        if self.rng.chance(40) {
            policy["connectionPool"] = json!({"tcp": {"maxConnections": self.rng.below(100) + 1}});
        }
        if self.rng.chance(40) {
            policy["tls"] = json!({"mode": self.rng.pick(&["ISTIO_MUTUAL", "DISABLE", "SIMPLE"])});
        }
        if self.rng.chance(30) {
            policy["outlierDetection"] = json!({"consecutive5xxErrors": self.rng.below(9) + 1, "interval": "10s"});
        }
        let mut spec = json!({"host": self.rng.pick(&HOSTS), "subsets": subsets});
        // An empty `trafficPolicy` is invalid (as in Istio): none at all then.
        if policy.as_object().is_some_and(|p| !p.is_empty()) {
            spec["trafficPolicy"] = policy;
        }
        if self.rng.chance(25) {
            spec["exportTo"] = json!(["."]);
        }
        self.istio("networking.istio.io/v1", "DestinationRule", ns, &name, spec)
    }

    /// The gateway `istio-system/gw`, with an HTTPS server if `https` (else at random).
    fn gateway(&mut self, https: bool) -> Change {
        let mut servers = vec![json!({"port": {"number": 8080, "name": "http", "protocol": "HTTP"},
            "hosts": self.rng.some(&["*/ext.example.com", "*/www.example.com", "ns-a/*", "*/*"])})];
        if https || self.rng.chance(60) {
            servers.push(json!({"port": {"number": 8443, "name": "https", "protocol": "HTTPS"},
                "hosts": ["*/www.example.com"],
                "tls": {"mode": "SIMPLE", "credentialName": self.rng.pick(&CREDENTIALS)}}));
        }
        if self.rng.chance(30) {
            // East-west: Istio's SNI to SNI-DNAT clusters, whose EDS keeps mutual-TLS endpoints only.
            servers.push(json!({"port": {"number": 15443, "name": "tls", "protocol": "TLS"},
                "hosts": [self.rng.pick(&["*.local", "*.ns-a.svc.cluster.local"])], "tls": {"mode": "AUTO_PASSTHROUGH"}}));
        }
        let selectors = [json!({"istio": "ingressgateway"}), json!({"app": "alpha"})];
        let selector = if https { selectors[0].clone() } else { self.rng.pick(&selectors).clone() };
        self.istio(
            "networking.istio.io/v1",
            "Gateway",
            "istio-system",
            "gw",
            json!({"selector": selector, "servers": servers}),
        )
    }

    fn service_entry(&mut self) -> Change {
        let name = format!("se-{}", self.rng.below(2));
        let ns = *self.rng.pick(&NAMESPACES);
        let host = *self.rng.pick(&["ext.example.com", "www.example.com"]);
        let mut spec = json!({"hosts": [host], "location": self.rng.pick(&["MESH_EXTERNAL", "MESH_INTERNAL"]),
            "resolution": "STATIC",
            "ports": [{"number": 80, "name": "http", "protocol": "HTTP", "targetPort": 8080}]});
        if self.rng.chance(50) {
            spec["workloadSelector"] = json!({"labels": {"app": self.rng.pick(&APPS)}});
        } else {
            let n = self.rng.below(3) + 1;
            spec["endpoints"] = (0..n)
                .map(|i| json!({"address": format!("10.3.{}.{i}", self.rng.below(2)), "labels": {"version": self.rng.pick(&VERSIONS)}}))
                .collect();
        }
        if self.rng.chance(25) {
            spec["exportTo"] = json!(["."]);
        }
        self.istio("networking.istio.io/v1", "ServiceEntry", ns, &name, spec)
    }

    fn workload_entry(&mut self) -> Change {
        let i = self.rng.below(3);
        let ns = *self.rng.pick(&NAMESPACES);
        let spec = json!({"address": format!("10.2.0.{}", i + 1), "labels": self.labels(),
            "ports": {"http": 8080}, "serviceAccount": "workload"});
        self.istio("networking.istio.io/v1", "WorkloadEntry", ns, &format!("we-{i}"), spec)
    }

    fn sidecar(&mut self) -> Change {
        // `default` scopes its namespace; `scoped` only the workloads it selects.
        let (ns, name) =
            *self.rng.pick(&[("ns-a", "default"), ("ns-b", "default"), ("ns-a", "scoped"), ("ns-b", "scoped")]);
        let hosts = self.rng.some(&["./*", "istio-system/*", "ns-a/*", "ns-b/*", "*/ext.example.com"]);
        let mut spec = json!({"egress": [{"hosts": hosts}]});
        if name == "scoped" {
            spec["workloadSelector"] = json!({"labels": {"app": self.rng.pick(&APPS)}});
        }
        if self.rng.chance(30) {
            spec["outboundTrafficPolicy"] = json!({"mode": self.rng.pick(&["REGISTRY_ONLY", "ALLOW_ANY"])});
        }
        self.istio("networking.istio.io/v1", "Sidecar", ns, name, spec)
    }

    fn peer_authentication(&mut self) -> Change {
        let ns = *self.rng.pick(&["istio-system", "ns-a", "ns-b"]);
        let mode = *self.rng.pick(&["STRICT", "PERMISSIVE", "DISABLE"]);
        let (name, spec) = match self.selector().filter(|_| ns != "istio-system") {
            Some(selector) => {
                let port_mode = *self.rng.pick(&["STRICT", "PERMISSIVE", "DISABLE"]);
                (
                    "by-app",
                    json!({"selector": selector, "mtls": {"mode": mode}, "portLevelMtls": {"8080": {"mode": port_mode}}}),
                )
            }
            None => ("default", json!({"mtls": {"mode": mode}})),
        };
        self.istio("security.istio.io/v1", "PeerAuthentication", ns, name, spec)
    }

    fn request_authentication(&mut self) -> Change {
        let ns = *self.rng.pick(&NAMESPACES);
        let mut spec = json!({"jwtRules": [{"issuer": self.rng.pick(&["https://issuer-1.test", "https://issuer-2.test"]), "jwks": JWKS}]});
        if let Some(selector) = self.selector() {
            spec["selector"] = selector;
        }
        self.istio("security.istio.io/v1", "RequestAuthentication", ns, "jwt", spec)
    }

    fn authorization_policy(&mut self) -> Change {
        let ns = *self.rng.pick(&["istio-system", "ns-a", "ns-b"]);
        let name = format!("ap-{}", self.rng.below(2));
        let action = *self.rng.pick(&["ALLOW", "DENY"]);
        let mut rule = json!({});
        if self.rng.chance(60) {
            rule["from"] = json!([{"source": {"namespaces": self.rng.some(&NAMESPACES)}}]);
        }
        if self.rng.chance(60) {
            rule["to"] = json!([{"operation": {"paths": [self.rng.pick(&["/admin", "/api/*"])], "methods": ["GET"]}}]);
        }
        let mut spec = json!({"action": action, "rules": [rule]});
        if let Some(selector) = self.selector() {
            spec["selector"] = selector;
        }
        self.istio("security.istio.io/v1", "AuthorizationPolicy", ns, &name, spec)
    }

    fn mesh_config(&mut self) -> Change {
        let mut mesh = serde_json::Map::new();
        if self.rng.chance(50) {
            mesh.insert(
                "outboundTrafficPolicy".into(),
                json!({"mode": self.rng.pick(&["ALLOW_ANY", "REGISTRY_ONLY"])}),
            );
        }
        if self.rng.chance(40) {
            mesh.insert("enableAutoMtls".into(), json!(self.rng.chance(50)));
        }
        if self.rng.chance(40) {
            mesh.insert("accessLogFile".into(), json!(self.rng.pick(&["", "/dev/stdout"])));
        }
        if self.rng.chance(30) {
            mesh.insert("connectTimeout".into(), json!(self.rng.pick(&["1s", "10s"])));
        }
        if self.rng.chance(25) {
            mesh.insert("defaultServiceExportTo".into(), json!(self.rng.pick(&[json!(["."]), json!(["*"])])));
        }
        if self.rng.chance(15) {
            mesh.insert(
                "discoverySelectors".into(),
                json!([{"matchLabels": {"team": self.rng.pick(&["red", "blue"])}}]),
            );
        }
        let text = serde_json::to_string(&Value::Object(mesh)).unwrap_or_default();
        // Only a valid mesh config, for the reason `istio` gives: an invalid one keeps the previous.
        if let Err(e) = meshpilot::mesh::MeshConfig::parse("oracle", &text) {
            panic!("the oracle made a mesh config meshpilot rejects: {e}\n{text}");
        }
        let key = Self::key("v1", "ConfigMap", Some("istio-system"), "istio");
        let value = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta("istio", "istio-system"),
            "data": {"mesh": text}});
        Change::Apply(key, value)
    }

    fn secret(&mut self, name: &str) -> Change {
        let (cert, key) = self.rng.pick(&self.credentials).clone();
        let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
        let object = Self::key("v1", "Secret", Some("istio-system"), name);
        let value = json!({"apiVersion": "v1", "kind": "Secret", "metadata": meta(name, "istio-system"),
            "type": "kubernetes.io/tls", "data": {"tls.crt": b64(&cert), "tls.key": b64(&key)}});
        Change::Apply(object, value)
    }
}

/// Applies `change` to the API server.
async fn make(client: &Client, change: &Change) {
    match change {
        Change::Apply(_, value) => apply(client, &value.to_string()).await,
        Change::Delete(k) => delete(client, k.api_version, k.kind, k.namespace.as_deref(), &k.name).await,
    }
}

/// One simulated proxy of the oracle.
#[derive(Clone)]
struct ProxySpec {
    spec: SimProxySpec,
    /// Connects to the secure port with a client certificate of its namespace (a gateway that
    /// gets its `credentialName` secrets), else to the plaintext port.
    secure: bool,
}

/// The proxies connected throughout: sidecars at pod addresses (whose labels steps change) and
/// at none, in both namespaces (every other one over delta), and three gateways: two verified
/// on the secure port (one over delta), one on the plaintext port.
fn proxy_specs() -> Vec<ProxySpec> {
    // The address is the server's, set when connecting.
    let xds_url = "";
    let mut specs = Vec::new();
    for (n, ns) in NAMESPACES.iter().enumerate() {
        for i in 0..2 {
            let mut spec = SimProxySpec::sidecar(xds_url, ns, &format!("pod-{i}"), &pod_ip(n, i));
            spec.labels = [("app", APPS[(n + i) % APPS.len()]), ("version", VERSIONS[i % 2])]
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect();
            specs.push(spec);
        }
        let mut loose = SimProxySpec::sidecar(xds_url, ns, "vm-0", &format!("10.9.{n}.1"));
        loose.labels = [("app".to_string(), APPS[2].to_string())].into_iter().collect();
        specs.push(loose);
    }
    for spec in specs.iter_mut().enumerate().filter(|(i, _)| i % 2 == 1).map(|(_, s)| s) {
        spec.delta = true;
    }
    // Gateways: (name, labels, on the secure port, over delta).
    let gateways = [
        ("gw-0", ("istio", "ingressgateway"), true, false),
        ("gw-1", ("app", "alpha"), false, true),
        ("gw-2", ("istio", "ingressgateway"), true, true),
    ];
    let mut secure = vec![false; specs.len()];
    for (name, labels, on_secure_port, delta) in gateways {
        let mut gw = SimProxySpec::sidecar(xds_url, "istio-system", name, "10.9.9.9");
        gw.node_id = format!("router~10.9.9.{}~{name}.istio-system~istio-system.svc.cluster.local", specs.len());
        gw.labels = [(labels.0.to_string(), labels.1.to_string())].into_iter().collect();
        gw.delta = delta;
        specs.push(gw);
        secure.push(on_secure_port);
    }
    let mut proxies = Vec::new();
    for (i, (mut spec, secure)) in specs.into_iter().zip(secure).enumerate() {
        spec.keep_resources = true;
        // Most run with pilot-agent (SDS certificates: auto mTLS applies), one in three without.
        if i % 3 != 2 {
            spec.metadata.insert("ISTIO_VERSION".into(), "1.24.0".into());
        }
        proxies.push(ProxySpec { spec, secure });
    }
    proxies
}

/// Where the proxies connect, and as whom on the secure port.
struct Ports {
    plaintext: String,
    secure: std::net::SocketAddr,
}

/// Connects `proxy` (over delta or state of the world as its spec says, unless `sotw`).
async fn connect(proxy: &ProxySpec, ports: &Ports, ca: &CertificateAuthority, sotw: bool) -> SimProxy {
    let mut spec = SimProxySpec { xds_url: ports.plaintext.clone(), ..proxy.spec.clone() };
    spec.delta &= !sotw;
    if !proxy.secure {
        return connect_sim(spec).await;
    }
    let identity = format!("spiffe://cluster.local/ns/{}/sa/gateway", spec.namespace);
    let (chain, key) = client_cert(ca, &identity);
    let channel = channel(ports.secure, ca.root_pem(), Some((&chain, &key))).await.expect("a TLS channel");
    SimProxy::connect_over(spec, channel).await.expect("a stream on the secure port")
}

/// The server under test.
struct Deployment {
    /// The process the proxies connect to: standalone, or the frontend.
    serving: Meshpilot,
    /// The ingest node of split mode.
    _ingest: Option<Meshpilot>,
}

impl Deployment {
    fn ports(&self) -> Ports {
        Ports { plaintext: self.serving.xds_url(), secure: self.serving.secure_xds_addr() }
    }
}

/// A standalone meshpilot on the API server, with the secure port and the test's CA.
fn standalone(kubeconfig: &Path, cacerts: &Path) -> MeshpilotBuilder {
    Meshpilot::standalone_on_kubernetes(kubeconfig).cacerts_dir(cacerts).secure_xds(free_addr(), &[])
}

/// `MESHPILOT_ORACLE_SEED`: a number, or `random` (from the clock); unset, [`CI_SEED`].
fn seed() -> u64 {
    match std::env::var("MESHPILOT_ORACLE_SEED").as_deref() {
        Ok("random") => {
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos() as u64).unwrap_or(1)
        }
        Ok(s) => s.parse().unwrap_or_else(|e| panic!("MESHPILOT_ORACLE_SEED={s}: {e}")),
        Err(_) => CI_SEED,
    }
}

fn steps() -> u64 {
    match std::env::var("MESHPILOT_ORACLE_STEPS") {
        Ok(s) => s.parse().unwrap_or_else(|e| panic!("MESHPILOT_ORACLE_STEPS={s}: {e}")),
        Err(_) => CI_STEPS,
    }
}

/// The oracle in one deployment: `split` runs an ingest node and a frontend on the API server's
/// etcd, else one standalone process.
async fn oracle(split: bool) {
    oracle_run(split, seed(), steps()).await;
}

/// The oracle in one deployment for `steps` steps of the sequence of `seed`.
async fn oracle_run(split: bool, seed: u64, steps: u64) {
    let mode = if split { "split" } else { "standalone" };
    println!("staleness oracle ({mode}): MESHPILOT_ORACLE_SEED={seed} MESHPILOT_ORACLE_STEPS={steps}");
    let Some(api) = KubeApi::start().await else { return };
    let client = api.admin().await;
    let mut world = World::new(seed);
    for change in world.initial() {
        println!("initial: {change}");
        make(&client, &change).await;
    }
    let dir = api.dir().to_path_buf();
    let kubeconfig = api.write_kubeconfig(&dir, "meshpilot.kubeconfig", &api.url(), ADMIN_TOKEN);
    // One CA for every process (the snapshot stream's mutual TLS, the secure port's clients).
    let cacerts = dir.join("cacerts");
    CertificateAuthority::self_signed_material(&TrustDomain::default())
        .expect("a root")
        .write_dir(&cacerts)
        .expect("writing the CA");
    let ca = ca_from_dir(&cacerts).await;
    let deployment = if split {
        let etcd = api.etcd_endpoint();
        let frontend = Meshpilot::frontend(&etcd).id("fe-0").cacerts_dir(&cacerts).secure_xds(free_addr(), &[]).start();
        let ingest = Meshpilot::ingest_on_kubernetes(&etcd, &kubeconfig)
            .id("ingest-0")
            .debounce_after("50ms")
            .cacerts_dir(&cacerts)
            .start();
        ingest.wait_ready(STARTUP_TIMEOUT).await;
        wait_leader(std::slice::from_ref(&ingest), STARTUP_TIMEOUT, |_| true).await;
        frontend.wait_ready(STARTUP_TIMEOUT).await;
        Deployment { serving: frontend, _ingest: Some(ingest) }
    } else {
        let cp = standalone(&kubeconfig, &cacerts).debounce_after("50ms").start();
        cp.wait_ready(STARTUP_TIMEOUT).await;
        Deployment { serving: cp, _ingest: None }
    };
    let specs = proxy_specs();
    let ports = deployment.ports();
    let mut proxies = Vec::new();
    for spec in &specs {
        proxies.push(connect(spec, &ports, &ca, false).await);
    }
    let env = Env { kubeconfig: &kubeconfig, cacerts: &cacerts, ca: &ca, specs: &specs, seed };
    let started = Instant::now();
    let mut history: Vec<String> = Vec::new();
    let mut stale_steps = Vec::new();
    let (mut reference, _) = check(&env, &proxies, 0, "(the initial objects)", &history).await;
    let mut effective = 0;
    for step in 1..=steps {
        let change = world.step();
        make(&client, &change).await;
        let said = change.to_string();
        println!("step {step}: {said}");
        let (next, stale) = check(&env, &proxies, step, &said, &history).await;
        // Going on (MESHPILOT_ORACLE_KEEP_GOING): the stale proxies connect again, afresh.
        for i in &stale {
            proxies[*i] = connect(&specs[*i], &ports, &ca, false).await;
        }
        if !stale.is_empty() {
            stale_steps.push(step);
        }
        let changed: usize = reference.iter().zip(&next).map(|(a, b)| mismatches(a, b).len()).sum();
        println!("  step {step} changed {changed} resources of the proxies");
        effective += usize::from(changed > 0);
        reference = next;
        history.push(format!("step {step}: {said}"));
    }
    println!(
        "staleness oracle ({mode}): seed {seed}, {steps} steps ({effective} changed some proxy's config), stale proxies after steps {stale_steps:?}, {:?}",
        started.elapsed()
    );
    assert!(stale_steps.is_empty(), "stale proxies after steps {stale_steps:?} (seed {seed}): see the reports above");
}

/// What every check reads.
struct Env<'a> {
    kubeconfig: &'a Path,
    cacerts: &'a Path,
    ca: &'a CertificateAuthority,
    specs: &'a [ProxySpec],
    seed: u64,
}

/// Compares every proxy with a new connection of its node (state of the world) to a new
/// standalone meshpilot on the same API server, and returns what the new connections hold. If
/// some proxy does not catch up, panics with the differences; with `MESHPILOT_ORACLE_KEEP_GOING`
/// set (long runs, to find more than the first bug), prints them and returns the stale proxies too.
async fn check(
    env: &Env<'_>,
    proxies: &[SimProxy],
    step: u64,
    change: &str,
    history: &[String],
) -> (Vec<Held>, Vec<usize>) {
    let Env { specs, seed, .. } = *env;
    let fresh = standalone(env.kubeconfig, env.cacerts).start();
    fresh.wait_ready(STARTUP_TIMEOUT).await;
    let ports = Ports { plaintext: fresh.xds_url(), secure: fresh.secure_xds_addr() };
    let mut connections = Vec::new();
    for spec in specs {
        connections.push(connect(spec, &ports, env.ca, true).await);
    }
    let reference: Vec<Held> = settled_view(&connections, QUIET, CATCH_UP).await;
    drop(connections);
    drop(fresh);
    let deadline = Instant::now() + CATCH_UP;
    loop {
        let states: Vec<Held> = proxies.iter().map(|p| held(&p.state())).collect();
        let wrong: Vec<(usize, Vec<common::oracle::Mismatch>)> = states
            .iter()
            .zip(&reference)
            .enumerate()
            .map(|(i, (h, r))| (i, mismatches(h, r)))
            .filter(|(_, m)| !m.is_empty())
            .collect();
        if wrong.is_empty() {
            let count = |t: TypeUrl| states.iter().map(|h| h.get(&t).map_or(0, BTreeMap::len)).sum::<usize>();
            println!(
                "  step {step}: {} proxies hold what new connections get ({} clusters, {} endpoints, {} listeners, {} routes, {} secrets)",
                states.len(),
                count(TypeUrl::Cluster),
                count(TypeUrl::Endpoint),
                count(TypeUrl::Listener),
                count(TypeUrl::Route),
                count(TypeUrl::Secret)
            );
            return (reference, Vec::new());
        }
        if Instant::now() >= deadline {
            let mut report = format!(
                "STALE PROXY: seed {seed}, step {step} (reproduce: MESHPILOT_ORACLE_SEED={seed} MESHPILOT_ORACLE_STEPS={step})\nchange: {change}\nearlier steps:\n{}\n",
                history.join("\n")
            );
            for (i, list) in &wrong {
                let spec = &specs[*i].spec;
                let transport = if spec.delta { "delta" } else { "state of the world" };
                report.push_str(&format!("\nproxy {} ({transport}), {} resources differ:\n", spec.node_id, list.len()));
                for m in list.iter().take(4) {
                    report.push_str(&describe(m));
                    report.push('\n');
                }
            }
            if std::env::var_os("MESHPILOT_ORACLE_KEEP_GOING").is_none() {
                panic!("{report}");
            }
            println!("{report}");
            return (reference, wrong.iter().map(|(i, _)| *i).collect());
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn standalone_proxies_hold_what_a_server_built_from_scratch_serves() {
    oracle(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn split_mode_proxies_hold_what_a_server_built_from_scratch_serves() {
    oracle(true).await;
}

/// Every object the oracle applies is one meshpilot accepts (`World::istio` checks), over many
/// sequences and without servers. Seed 4007 made an empty `trafficPolicy` at step 145: the
/// running server kept the rule's last valid version, a new one had none, and the oracle
/// reported a stale proxy where nothing was stale.
#[test]
fn the_oracle_makes_only_objects_meshpilot_accepts() {
    for seed in (1..=50).chain(4000..=4010) {
        let mut world = World::new(seed);
        world.initial();
        for _ in 0..150 {
            world.step();
        }
    }
}

/// The first long run's bug A, kept as a fixed sequence: at step 40 of seed 4007 a Pod's labels
/// change, and its own proxy (delta) kept its old view's clusters, scope and policies, because
/// the snapshot did not concern the view it moved to.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relabelled_pods_proxy_gets_its_new_views_config() {
    oracle_run(false, 4007, 40).await;
}
