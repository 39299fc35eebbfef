//! The view of the mesh a proxy's config depends on, and its resolution against a snapshot: the
//! proxy's IPs become the inbound ports of its service instances, so replicas of one workload
//! (different IPs, same services) and proxies without instances keep sharing one generation.

use std::fmt;
use std::hash::{Hash, Hasher};
use std::net::IpAddr;
use std::sync::Arc;

use serde::Serialize;

use super::kind::ProxyKind;
use super::metadata::Interception;
use super::trace_identity::TraceIdentity;
use crate::config::api::sidecar::IstioIngressListener;
use crate::config::api::{Labels, Protocol};
use crate::registry::ServiceKey;
use crate::snapshot::Snapshot;

/// Port of the virtual inbound listener; traffic to it is never a service instance's.
const VIRTUAL_INBOUND_PORT: u16 = 15006;

/// One inbound port of a proxy: a port of a service whose endpoint is the proxy.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub struct InboundPort {
    /// The port the workload receives on (the endpoint's port: the service's targetPort).
    pub target_port: u16,
    /// The service port.
    pub port: u16,
    /// The service port's protocol.
    pub protocol: Protocol,
    /// The service (its DestinationRule's connection pool applies to the inbound cluster).
    pub service: ServiceKey,
}

/// Everything about a proxy that its generated config depends on. Proxies with equal views get
/// identical config, so config is generated and encoded once per view, not once per proxy.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub struct ProxyView {
    /// Role.
    pub kind: ProxyKind,
    /// Namespace (visibility, Sidecar lookup).
    pub namespace: String,
    /// Labels (Sidecar and Gateway selection, sourceLabels matches).
    pub labels: Labels,
    /// Interception mode.
    pub interception: Interception,
    /// The proxy's IPs. [`ProxyView::resolve`] turns them into `inbound` and drops them unless
    /// the config names them (a Sidecar ingress `defaultEndpoint` of `0.0.0.0:PORT`).
    pub ips: Vec<String>,
    /// Inbound ports of the proxy's service instances, by target port (filled by `resolve`).
    pub inbound: Vec<InboundPort>,
    /// Whether pilot-agent runs beside the proxy (metadata ISTIO_VERSION), serving its workload
    /// certificate over SDS: only then are optional mutual TLS shapes (PERMISSIVE inbound TLS,
    /// auto mTLS) generated. Required ones (STRICT, ISTIO_MUTUAL) are generated regardless.
    pub agent_sds: bool,
    /// Whether this is a gateway whose caller proved an identity of its namespace: only such a
    /// view holds the namespace's `credentialName` secrets (and the servers that use them). Part
    /// of the view, so a verified and an unverified gateway never share a cached generation.
    pub credentials: bool,
    /// Locality (`region/zone/subzone`), which orders or weighs endpoints when locality load
    /// balancing applies: the node's, until [`ProxyView::resolve`] finds the workload's.
    pub locality: String,
    /// What its spans are tagged with, and its ProxyConfig's tracing; dropped by
    /// [`ProxyView::resolve`] when the mesh does not trace (so views stay shared).
    pub trace: Option<TraceIdentity>,
}

impl ProxyView {
    /// A stable 64-bit key for caches and metrics.
    pub fn key(&self) -> u64 {
        let mut h = std::collections::hash_map::DefaultHasher::new();
        self.hash(&mut h);
        h.finish()
    }

    /// The view as `snapshot` determines it: the inbound ports of the services whose endpoints
    /// carry one of the proxy's IPs, for sidecars whose inbound traffic is redirected and whose
    /// Sidecar declares no ingress listeners (those replace the services' ports, as in Istio).
    /// Labels no selector reads are dropped, so workloads that differ only there share config.
    pub fn resolve(&self, snapshot: &Snapshot) -> ProxyView {
        let labels = snapshot.selected_labels(&self.labels);
        let locality = self.locality_in(snapshot);
        let trace = self.trace.clone().filter(|_| snapshot.mesh.enable_tracing);
        if self.ips.is_empty() {
            return ProxyView { labels, locality, trace, ..self.clone() };
        }
        let mut view = ProxyView { ips: Vec::new(), inbound: Vec::new(), labels, locality, trace, ..self.clone() };
        if self.kind != ProxyKind::Sidecar {
            return view;
        }
        let ingress =
            snapshot.sidecar_for(&self.namespace, &self.labels).map(|(_, s)| s.ingress_listeners()).unwrap_or_default();
        if ingress.is_empty() {
            if self.interception.intercepts() {
                view.inbound = inbound_ports(snapshot, &self.ips);
            }
        } else if ingress.iter().any(|l| endpoint_is_workload_ip(l) || l.bind.is_empty()) {
            // The workload's address: where `0.0.0.0` endpoints send, and what ingress listeners
            // without a bind are named after.
            view.ips = self.ips.clone();
        }
        // An endpoint of a headless service gets no listener at its own address for it (see
        // `outbound_plan`): its view keeps that address.
        if view.ips.is_empty() && self.interception.intercepts() {
            let first = self.ips.first().filter(|ip| snapshot.instances_at(ip).iter().any(|(s, _)| s.is_headless()));
            if let Some(ip) = first {
                view.ips = vec![ip.clone()];
            }
        }
        view
    }
}

impl ProxyView {
    /// The proxy's locality as istiod picks it: the registry's for its workload (its endpoint at
    /// one of its IPs, whose locality the Pod's node gives), else its topology labels, else its
    /// `istio-locality` label, else what its node says.
    fn locality_in(&self, snapshot: &Snapshot) -> String {
        let ips = self.ips.iter().filter(|ip| ip.parse::<IpAddr>().is_ok());
        let registry = ips.flat_map(|ip| snapshot.instances_at(ip)).map(|(_, e)| &*e.locality).find(|l| !l.is_empty());
        if let Some(locality) = registry {
            return locality.to_string();
        }
        let topology = TOPOLOGY_LABELS.map(|key| self.labels.get(key).map(String::as_str));
        if topology.iter().any(Option::is_some) {
            let text = topology.map(Option::unwrap_or_default).join("/");
            return text.trim_end_matches('/').to_string();
        }
        match self.labels.get(LOCALITY_LABEL) {
            Some(label) => label.replace('.', "/"),
            None => self.locality.clone(),
        }
    }
}

/// The labels that give a workload's region, zone and subzone.
pub const TOPOLOGY_LABELS: [&str; 3] =
    ["topology.kubernetes.io/region", "topology.kubernetes.io/zone", "topology.istio.io/subzone"];

/// Istio's label overriding a workload's locality (`region.zone.subzone`: labels allow no `/`).
const LOCALITY_LABEL: &str = "istio-locality";

/// `0.0.0.0:PORT` / `[::]:PORT`: Istio sends to the workload's own IP.
fn endpoint_is_workload_ip(l: &IstioIngressListener) -> bool {
    l.default_endpoint.starts_with("0.0.0.0:") || l.default_endpoint.starts_with("[::]:")
}

/// Service ports served at `ips`, one per target port (the first service in key order wins a
/// target port two services share, as the oldest does in Istio).
fn inbound_ports(snapshot: &Snapshot, ips: &[String]) -> Vec<InboundPort> {
    let mut out: Vec<InboundPort> = Vec::new();
    for ip in ips.iter().filter(|ip| ip.parse::<IpAddr>().is_ok()) {
        for (service, endpoint) in snapshot.instances_at(ip) {
            for port in service.ports.iter().filter(|p| p.number != 0) {
                let Some(target_port) = endpoint.port_for(port).filter(|t| *t != 0 && *t != VIRTUAL_INBOUND_PORT)
                else {
                    continue;
                };
                if out.iter().any(|p| p.target_port == target_port) {
                    continue;
                }
                let service = ServiceKey { hostname: service.hostname.clone(), namespace: service.namespace.clone() };
                out.push(InboundPort { target_port, port: port.number, protocol: port.protocol, service });
            }
        }
    }
    out.sort();
    out
}

impl fmt::Display for ProxyView {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}/{}/{:016x}", self.kind, self.namespace, self.key())
    }
}

/// A view shared by pointer and hashed once, for the cache's keys: every stream looks its view
/// up on every snapshot, nearly always with the very `Arc` it was keyed by, so lookups compare
/// pointers rather than labels and IPs, and a key costs a reference count, not a copy.
#[derive(Debug, Clone)]
pub struct SharedView {
    view: Arc<ProxyView>,
    hash: u64,
}

impl SharedView {
    /// `view`, shared.
    pub fn new(view: ProxyView) -> SharedView {
        let hash = view.key();
        SharedView { view: Arc::new(view), hash }
    }
}

impl std::ops::Deref for SharedView {
    type Target = ProxyView;

    fn deref(&self) -> &ProxyView {
        &self.view
    }
}

impl PartialEq for SharedView {
    fn eq(&self, other: &SharedView) -> bool {
        Arc::ptr_eq(&self.view, &other.view) || (self.hash == other.hash && self.view == other.view)
    }
}

impl Eq for SharedView {}

impl fmt::Display for SharedView {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.view.fmt(f)
    }
}

impl Hash for SharedView {
    fn hash<H: Hasher>(&self, state: &mut H) {
        state.write_u64(self.hash);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::envoy::testing::{kube_snapshot, sidecar, sidecar_at, snapshot};

    fn mesh() -> Snapshot {
        let yaml = std::fs::read_to_string(
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src/envoy/testdata/inbound.yaml"),
        )
        .expect("read inbound.yaml");
        snapshot(&yaml)
    }

    #[test]
    fn replicas_share_a_view_and_proxies_without_instances_share_the_plain_one() {
        let s = mesh();
        let a = sidecar_at("shop", &[("app", "orders")], &["10.2.0.5"]).resolve(&s);
        let b = sidecar_at("shop", &[("app", "orders")], &["10.2.0.6"]).resolve(&s);
        assert_eq!(a, b, "two replicas of one workload");
        assert!(a.ips.is_empty());
        let ports: Vec<(u16, u16, Protocol)> = a.inbound.iter().map(|p| (p.target_port, p.port, p.protocol)).collect();
        assert_eq!(
            ports,
            [
                (5432, 5432, Protocol::Tcp),
                (8080, 80, Protocol::Http),
                (9000, 9000, Protocol::Unsupported),
                (9090, 9090, Protocol::Grpc)
            ],
            "by target port"
        );
        let nobody = sidecar_at("shop", &[("app", "orders")], &["10.9.9.9"]).resolve(&s);
        assert_eq!(nobody, sidecar("shop", &[("app", "orders")]), "no instance: the view of any such proxy");
        let garbage = sidecar_at("shop", &[("app", "orders")], &["not-an-ip"]).resolve(&s);
        assert_eq!(garbage, nobody);
    }

    #[test]
    fn labels_no_selector_reads_do_not_split_views() {
        let plain = snapshot(
            "apiVersion: networking.istio.io/v1\nkind: ServiceEntry\nmetadata: {name: a, namespace: shop}\nspec:\n  hosts: [a.example.com]\n  ports: [{number: 80, name: http, protocol: HTTP}]\n  resolution: DNS\n",
        );
        let web = sidecar("shop", &[("app", "web"), ("version", "v1")]).resolve(&plain);
        let orders = sidecar("shop", &[("app", "orders"), ("version", "v2")]).resolve(&plain);
        assert_eq!(web, orders, "nothing selects by label: one view for the namespace");
        assert!(web.labels.is_empty());

        let selecting = snapshot(
            "apiVersion: networking.istio.io/v1\nkind: Sidecar\nmetadata: {name: web, namespace: shop}\nspec:\n  workloadSelector: {labels: {app: web}}\n  egress: [{hosts: [./*]}]\n---\napiVersion: networking.istio.io/v1\nkind: VirtualService\nmetadata: {name: r, namespace: shop}\nspec:\n  hosts: [a.example.com]\n  http:\n  - match: [{sourceLabels: {track: canary}}]\n    route: [{destination: {host: a.example.com}}]\n",
        );
        let web = sidecar("shop", &[("app", "web"), ("version", "v1"), ("track", "canary")]).resolve(&selecting);
        let orders = sidecar("shop", &[("app", "orders"), ("version", "v1")]).resolve(&selecting);
        assert_ne!(web, orders);
        let kept: Vec<&str> = web.labels.keys().map(String::as_str).collect();
        assert_eq!(kept, ["app", "track"], "the keys a Sidecar selector and a sourceLabels match read");
        let other_version = sidecar("shop", &[("app", "orders"), ("version", "v9")]).resolve(&selecting);
        assert_eq!(orders, other_version);
    }

    #[test]
    fn no_inbound_without_interception_or_for_gateways() {
        let s = mesh();
        let mut plain = sidecar_at("shop", &[("app", "orders")], &["10.2.0.5"]);
        plain.interception = Interception::None;
        assert!(plain.resolve(&s).inbound.is_empty());
        let mut gateway = sidecar_at("shop", &[("app", "orders")], &["10.2.0.5"]);
        gateway.kind = ProxyKind::Router;
        assert!(gateway.resolve(&s).inbound.is_empty());
    }

    #[test]
    fn sidecar_ingress_replaces_instances_and_keeps_the_ip_it_names() {
        let s = mesh();
        let legacy = sidecar_at("shop", &[("app", "legacy")], &["10.2.0.7"]).resolve(&s);
        assert!(legacy.inbound.is_empty(), "ingress listeners replace the service's ports");
        assert_eq!(legacy.ips, ["10.2.0.7"], "defaultEndpoint 0.0.0.0:9443 is this workload's IP");
        assert_eq!(legacy.resolve(&s), legacy, "resolving is idempotent");
    }

    #[test]
    fn kubernetes_endpoints_give_pods_their_service_ports() {
        let s = kube_snapshot("");
        let ports = |ip: &str| {
            let v = sidecar_at("shop", &[], &[ip]).resolve(&s);
            v.inbound.iter().map(|p| (p.target_port, p.port, p.protocol)).collect::<Vec<_>>()
        };
        // The EndpointSlice's ports are the target ports; `admin` is of unknown protocol.
        assert_eq!(ports("10.0.0.1"), [(8080, 80, Protocol::Http), (8081, 81, Protocol::Unsupported)]);
        assert_eq!(ports("10.0.0.2"), ports("10.0.0.1"), "a pod that is not ready yet has its inbound side");
        assert_eq!(ports("10.0.0.4"), [(8080, 80, Protocol::Http)], "its slice lists only `http`");
    }
}
