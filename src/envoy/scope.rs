//! What one proxy view sees of the snapshot: services, VirtualServices, its Sidecar, its policy.

use std::cell::OnceCell;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use crate::config::api::sidecar::{IstioEgressListener, OutboundMode};
use crate::config::api::virtual_service::Destination;
use crate::config::api::{DestinationRule, Sidecar, VirtualService};
use crate::config::ConfigKey;
use envoy_types::pb::envoy::extensions::filters::network::http_connection_manager::v3::http_connection_manager::Tracing;

use super::http_tracing::hcm_tracing;
use super::network_filter::HttpCommon;
use crate::envoy::{ProxyKind, ProxyView};
use crate::registry::{host_matches, hosts_overlap, Hostname, Service};
use crate::snapshot::{Direction, Indexed, Snapshot};

/// A VirtualService with its index entry (qualified hosts, key).
pub(super) type VsRef<'a> = (&'a Indexed<VirtualService>, &'a VirtualService);

/// The `namespace/host` patterns an egress listener imports, or everything visible; a listener
/// with a port imports only services with that port, as istiod trims them (its HTTP_PROXY
/// listeners excepted).
#[derive(Debug, Clone, Copy)]
pub(super) struct Imports<'a> {
    hosts: Option<&'a [String]>,
    namespace: &'a str,
    port: Option<u16>,
}

impl<'a> Imports<'a> {
    /// Imports everything visible (no Sidecar, or gateways).
    pub(super) fn all(namespace: &'a str) -> Self {
        Imports { hosts: None, namespace, port: None }
    }

    /// Imports what an egress listener's `hosts` name; `.` is the proxy's namespace.
    pub(super) fn of(listener: &'a IstioEgressListener, namespace: &'a str) -> Self {
        let port = listener
            .port
            .as_ref()
            .filter(|p| !p.protocol.eq_ignore_ascii_case("HTTP_PROXY"))
            .and_then(|p| u16::try_from(p.number).ok())
            .filter(|n| *n != 0);
        Imports { hosts: Some(&listener.hosts), namespace, port }
    }

    /// Whether `service` is imported: its host, and the listener's port if it has one.
    pub(super) fn imports_service(&self, service: &Service) -> bool {
        self.port.is_none_or(|p| service.port(p).is_some()) && self.imports_host(&service.namespace, &service.hostname)
    }

    /// Whether a service declared in `service_ns` with `host` is imported.
    pub(super) fn imports_host(&self, service_ns: &str, host: &Hostname) -> bool {
        self.patterns()
            .into_iter()
            .any(|(ns, pattern)| self.ns_matches(ns, service_ns) && host_matches(pattern, host.as_str()))
    }

    /// Whether a VirtualService in `vs_ns` with `hosts` is imported.
    pub(super) fn imports_virtual_service(&self, vs_ns: &str, hosts: &[Hostname]) -> bool {
        self.patterns()
            .into_iter()
            .any(|(ns, pattern)| self.ns_matches(ns, vs_ns) && hosts.iter().any(|h| hosts_overlap(pattern, h.as_str())))
    }

    fn patterns(&self) -> Vec<(&'a str, &'a str)> {
        match self.hosts {
            None => vec![("*", "*")],
            Some(hosts) => hosts.iter().map(|h| h.split_once('/').unwrap_or(("*", h.as_str()))).collect(),
        }
    }

    fn ns_matches(&self, pattern: &str, namespace: &str) -> bool {
        match pattern {
            "*" => true,
            "~" => false,
            "." => namespace == self.namespace,
            other => other == namespace,
        }
    }
}

/// A proxy view resolved against a snapshot.
pub(super) struct Scope<'a> {
    /// The snapshot.
    pub snapshot: &'a Snapshot,
    /// The proxy view.
    pub view: &'a ProxyView,
    /// The Sidecar that applies to a sidecar proxy.
    pub sidecar: Option<&'a Sidecar>,
    /// That Sidecar's key.
    pub sidecar_key: Option<&'a ConfigKey>,
    /// REGISTRY_ONLY or ALLOW_ANY (the Sidecar's, else the mesh's).
    pub outbound_mode: OutboundMode,
    /// The tracing block of the proxy's HTTP connection managers, built on first use.
    tracing: OnceCell<Option<Tracing>>,
    visible: Vec<&'a Arc<Service>>,
}

impl<'a> Scope<'a> {
    /// Resolves a view.
    pub(super) fn new(snapshot: &'a Snapshot, view: &'a ProxyView) -> Self {
        let visible = snapshot.services_visible_to(&view.namespace);
        Scope { visible, ..Scope::without_services(snapshot, view) }
    }

    /// A scope that lists no services (walking the registry is most of a scope's cost): only
    /// for lookups that read none, such as which VirtualServices a view imports.
    pub(super) fn without_services(snapshot: &'a Snapshot, view: &'a ProxyView) -> Self {
        let found = match view.kind {
            ProxyKind::Sidecar => snapshot.sidecar_for(&view.namespace, &view.labels),
            ProxyKind::Router => None,
        };
        let (sidecar_key, sidecar) = (found.map(|(c, _)| &c.key), found.map(|(_, s)| s));
        let outbound_mode = sidecar
            .and_then(|s| s.outbound_traffic_policy.as_ref())
            .and_then(|p| p.mode)
            .unwrap_or(snapshot.mesh.outbound_traffic_policy.mode);
        Scope { snapshot, view, sidecar, sidecar_key, outbound_mode, tracing: OnceCell::new(), visible: Vec::new() }
    }

    /// What the proxy's HTTP connection managers share.
    pub(super) fn http_common(&self) -> HttpCommon<'_> {
        let tracing = self.tracing.get_or_init(|| hcm_tracing(&self.snapshot.mesh, self.view));
        HttpCommon { mesh: &self.snapshot.mesh, tracing: tracing.as_ref() }
    }

    /// The proxy's namespace.
    pub(super) fn namespace(&self) -> &'a str {
        &self.view.namespace
    }

    /// The DNS suffix short service names are qualified with (pilot's `--domain`, not the trust domain).
    pub(super) fn domain(&self) -> &'a str {
        &self.snapshot.mesh.domain
    }

    /// The Sidecar's egress listeners; a Sidecar without any imports everything.
    pub(super) fn egress_listeners(&self) -> &'a [IstioEgressListener] {
        self.sidecar.map(|s| s.egress.as_slice()).unwrap_or_default()
    }

    /// Imports of the catch-all egress listener (the one without port), if the proxy has one.
    pub(super) fn catch_all_imports(&self) -> Option<Imports<'a>> {
        let ns = self.namespace();
        match self.sidecar {
            None => Some(Imports::all(ns)),
            Some(s) if s.egress.is_empty() => Some(Imports::all(ns)),
            Some(s) => s.egress.iter().find(|e| e.port.is_none()).map(|e| Imports::of(e, ns)),
        }
    }

    /// Imports of every egress listener (or everything, without Sidecar).
    pub(super) fn all_imports(&self) -> Vec<Imports<'a>> {
        let ns = self.namespace();
        match self.sidecar {
            Some(s) if !s.egress.is_empty() => s.egress.iter().map(|e| Imports::of(e, ns)).collect(),
            _ => vec![Imports::all(ns)],
        }
    }

    /// Visible services an egress listener imports, in hostname order.
    pub(super) fn services_in(&self, imports: Imports<'_>) -> Vec<&'a Arc<Service>> {
        self.visible.iter().copied().filter(|s| imports.imports_service(s)).collect()
    }

    /// Services the proxy needs clusters for: everything its listeners import, plus what its
    /// imported VirtualServices route to (as Istio adds VirtualService destinations to the scope).
    pub(super) fn cluster_services(&self) -> Vec<&'a Arc<Service>> {
        self.imported_services().into_iter().map(|i| i.service).collect()
    }

    /// [`Scope::cluster_services`] with the ports each is imported with, in hostname order.
    pub(super) fn imported_services(&self) -> Vec<ImportedService<'a>> {
        self.collect_imports(|imp| self.visible.iter().copied().filter(|s| imp.imports_service(s)).collect(), |_| true)
    }

    /// [`Scope::imported_services`] among the services of `hosts`, found by host instead of by
    /// walking the registry (an endpoint change patches a few hosts of a thousand-service mesh).
    pub(super) fn imported_services_of(&self, hosts: &BTreeSet<Hostname>) -> Vec<ImportedService<'a>> {
        // The service a host names from here is the one `visible` lists for it, and the one a
        // VirtualService destination resolves to.
        let named: Vec<&'a Arc<Service>> = hosts.iter().filter_map(|h| self.service_for_host(h)).collect();
        self.collect_imports(
            |imp| named.iter().copied().filter(|s| imp.imports_service(s)).collect(),
            |host| hosts.contains(host),
        )
    }

    /// The services each listener imports (`explicit`) and the VirtualService destinations among
    /// `routed` hosts, with their ports merged by host.
    fn collect_imports(
        &self,
        explicit: impl Fn(&Imports<'_>) -> Vec<&'a Arc<Service>>,
        routed: impl Fn(&Hostname) -> bool,
    ) -> Vec<ImportedService<'a>> {
        let imports = self.all_imports();
        let mut by_host: BTreeMap<&Hostname, ImportedService<'a>> = BTreeMap::new();
        let mut add = |service: &'a Arc<Service>, ports: PortSet| match by_host.get_mut(&service.hostname) {
            Some(found) => found.ports.extend(ports),
            None => {
                by_host.insert(&service.hostname, ImportedService { service, ports });
            }
        };
        for imp in &imports {
            for svc in explicit(imp) {
                add(svc, imp.port.map_or(PortSet::All, PortSet::one));
            }
        }
        for imp in &imports {
            for (host, ports) in self.routed_destinations(*imp).into_iter().filter(|(h, _)| routed(h)) {
                let Some(svc) = self.service_for_host(&host) else { continue };
                if let Some(ports) = routed_ports(svc, imp.port, &ports) {
                    add(svc, ports);
                }
            }
        }
        by_host.into_values().collect()
    }

    /// The destinations of the `mesh` VirtualServices a sidecar's listener imports (none for
    /// gateways), each with the ports they name (0: a destination without port). They join the
    /// cluster services, as istiod adds them, leaving out HTTP rules whose `sourceNamespace`
    /// excludes the proxy's namespace.
    fn routed_destinations(&self, imports: Imports<'_>) -> BTreeMap<Hostname, BTreeSet<u32>> {
        let mut out: BTreeMap<Hostname, BTreeSet<u32>> = BTreeMap::new();
        if self.view.kind != ProxyKind::Sidecar {
            return out;
        }
        for (ix, vs) in self.mesh_virtual_services(imports) {
            for d in destinations_from(vs, Some(self.namespace())) {
                let host = Hostname::qualify(&d.host, &ix.config.key.namespace, self.domain());
                out.entry(host).or_default().insert(d.port.as_ref().map_or(0, |p| p.number));
            }
        }
        out
    }

    /// [`Scope::cluster_services`] among the services of `hosts`.
    pub(super) fn cluster_services_of(&self, hosts: &BTreeSet<Hostname>) -> Vec<&'a Arc<Service>> {
        self.imported_services_of(hosts).into_iter().map(|i| i.service).collect()
    }

    /// VirtualServices bound to `mesh` that the egress listener imports, in key order.
    pub(super) fn mesh_virtual_services(&self, imports: Imports<'_>) -> Vec<VsRef<'a>> {
        self.snapshot
            .virtual_services_for(self.namespace(), "mesh")
            .into_iter()
            .filter(|(ix, _)| imports.imports_virtual_service(&ix.config.key.namespace, &ix.hosts))
            .collect()
    }

    /// The service a host reaches from this proxy.
    pub(super) fn service_for_host(&self, host: &Hostname) -> Option<&'a Arc<Service>> {
        self.snapshot.service_for_host(self.namespace(), host)
    }

    /// The DestinationRule this proxy applies to traffic it sends to a service.
    pub(super) fn destination_rule(&self, service: &Service) -> Option<&'a DestinationRule> {
        self.snapshot.destination_rule_for(self.namespace(), &self.view.labels, service, Direction::Outbound)
    }

    /// The DestinationRule this proxy applies to traffic it receives for one of its services
    /// (workload selectors do not apply inbound).
    pub(super) fn inbound_destination_rule(&self, service: &Service) -> Option<&'a DestinationRule> {
        self.snapshot.destination_rule_for(self.namespace(), &self.view.labels, service, Direction::Inbound)
    }
}

/// A service the proxy builds clusters for, with the ports it imports.
#[derive(Debug, Clone)]
pub(super) struct ImportedService<'a> {
    /// The service.
    pub service: &'a Arc<Service>,
    /// The ports of it the proxy's listeners import.
    pub ports: PortSet,
}

/// Which ports of a service a proxy imports: all of them, or some (istiod trims a service to the
/// port of the egress listener importing it, or to the ports VirtualServices route to).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum PortSet {
    /// Every port.
    All,
    /// These ports only.
    Only(BTreeSet<u16>),
}

impl PortSet {
    fn one(port: u16) -> Self {
        PortSet::Only(BTreeSet::from([port]))
    }

    /// Whether `port` is imported.
    pub(super) fn contains(&self, port: u16) -> bool {
        match self {
            PortSet::All => true,
            PortSet::Only(ports) => ports.contains(&port),
        }
    }

    /// Adds `other`'s ports (istiod merges the partial services several listeners import).
    fn extend(&mut self, other: PortSet) {
        match (&mut *self, other) {
            (PortSet::All, _) => {}
            (_, PortSet::All) => *self = PortSet::All,
            (PortSet::Only(mine), PortSet::Only(theirs)) => mine.extend(theirs),
        }
    }
}

/// The ports of `svc` a VirtualService destination imports: the listener's port (a port egress
/// listener imports only it), else the ports the destinations name (any 0: all). `None` when the
/// service has none of them (istiod leaves it out: traffic could not route anyway).
fn routed_ports(svc: &Service, listener_port: Option<u16>, named: &BTreeSet<u32>) -> Option<PortSet> {
    if let Some(p) = listener_port {
        return svc.port(p).map(|_| PortSet::one(p));
    }
    if named.is_empty() || named.contains(&0) {
        return Some(PortSet::All);
    }
    let found: BTreeSet<u16> = svc.ports.iter().map(|p| p.number).filter(|n| named.contains(&u32::from(*n))).collect();
    (!found.is_empty()).then_some(PortSet::Only(found))
}

/// The destinations of a VirtualService's routes, mirrors and TCP/TLS routes. Given the client's
/// `namespace`, HTTP rules whose `sourceNamespace` matches exclude it are skipped (istiod's filter
/// of sidecar imports).
fn destinations_from<'v>(vs: &'v VirtualService, namespace: Option<&'v str>) -> impl Iterator<Item = &'v Destination> {
    let http = vs.http.iter().filter(move |r| {
        let named: Vec<&str> =
            r.matches.iter().map(|m| m.source_namespace.as_str()).filter(|n| !n.is_empty()).collect();
        namespace.is_none_or(|ns| named.is_empty() || named.contains(&ns))
    });
    let http = http.flat_map(|r| {
        let routes = r.route.iter().filter_map(|d| d.destination.as_ref());
        let mirrors = r.mirrors.iter().filter_map(|m| m.destination.as_ref());
        routes.chain(mirrors).chain(r.mirror.as_ref())
    });
    let tcp = vs.tcp.iter().flat_map(|r| r.route.iter().filter_map(|d| d.destination.as_ref()));
    let tls = vs.tls.iter().flat_map(|r| r.route.iter().filter_map(|d| d.destination.as_ref()));
    http.chain(tcp).chain(tls)
}

/// Hosts a VirtualService sends traffic to (routes and mirrors), qualified with its namespace.
pub(super) fn destination_hosts(vs: &VirtualService, vs_ns: &str, domain: &str) -> Vec<Hostname> {
    destinations_from(vs, None).map(|d| Hostname::qualify(&d.host, vs_ns, domain)).collect()
}

#[cfg(test)]
mod tests {
    use crate::envoy::testing::{names, service_entry as service, sidecar, snapshot};
    use crate::envoy::TypeUrl;

    const SIDECAR: &str = r#"
apiVersion: networking.istio.io/v1
kind: Sidecar
metadata: {name: default, namespace: app}
spec:
  egress:
  - hosts: ["./a.app.svc.cluster.local", "lib/*"]
---
apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {name: a, namespace: app}
spec:
  hosts: [a]
  http:
  - route: [{destination: {host: hidden.other.svc.cluster.local}}]
"#;

    #[test]
    fn sidecar_egress_hosts_restrict_clusters_and_add_virtual_service_destinations() {
        let yaml = [service("a", "app"), service("b", "app"), service("l", "lib"), service("hidden", "other")].concat();
        let s = snapshot(&format!("{yaml}{SIDECAR}"));
        let got = names(&s, &sidecar("app", &[]), TypeUrl::Cluster);
        assert_eq!(
            got,
            [
                "BlackHoleCluster",
                "InboundPassthroughCluster",
                "PassthroughCluster",
                "outbound|80||a.app.svc.cluster.local",
                "outbound|80||hidden.other.svc.cluster.local",
                "outbound|80||l.lib.svc.cluster.local"
            ]
        );
        // A namespace without Sidecar sees everything.
        assert_eq!(names(&s, &sidecar("elsewhere", &[]), TypeUrl::Cluster).len(), 7);
    }

    #[test]
    fn short_destinations_use_the_dns_domain_whatever_the_trust_domain() {
        use crate::mesh::MeshConfig;
        use crate::snapshot::{ChangeSet, Snapshot, SourceState, Version};
        use std::sync::Arc;

        let yaml = [service("reviews", "shop"), service("front", "shop")].concat()
            + "apiVersion: networking.istio.io/v1\nkind: Sidecar\nmetadata: {name: default, namespace: shop}\n\
               spec: {egress: [{hosts: [\"./front.shop.svc.cluster.local\"]}]}\n---\n\
               apiVersion: networking.istio.io/v1\nkind: VirtualService\nmetadata: {name: front, namespace: shop}\n\
               spec: {hosts: [front], http: [{route: [{destination: {host: reviews}}]}]}\n";
        let mut state = snapshot(&yaml).configs.clone();
        let state = SourceState {
            configs: std::mem::take(&mut state),
            mesh: Arc::new(MeshConfig { trust_domain: "example.org".into(), ..MeshConfig::default() }),
            ..Default::default()
        };
        let s = Snapshot::build(Version::new(1, 1), ChangeSet::full(), &state);
        let got = names(&s, &sidecar("shop", &[]), TypeUrl::Cluster);
        assert!(got.contains(&"outbound|80||reviews.shop.svc.cluster.local".to_string()), "{got:?}");
    }

    /// Two ports of each service, as ServiceEntries.
    fn two_port_service(name: &str, ns: &str) -> String {
        format!(
            "apiVersion: networking.istio.io/v1\nkind: ServiceEntry\nmetadata: {{name: {name}, namespace: {ns}}}\n\
             spec: {{hosts: [{name}.{ns}.svc.cluster.local], location: MESH_INTERNAL, resolution: STATIC,\n\
             ports: [{{number: 9080, name: http, protocol: HTTP}}, {{number: 9090, name: grpc, protocol: GRPC}}],\n\
             endpoints: [{{address: 10.0.0.1}}]}}\n---\n"
        )
    }

    #[test]
    fn port_egress_listeners_and_routed_ports_trim_a_services_clusters() {
        let yaml = [two_port_service("a", "app"), two_port_service("b", "lib"), two_port_service("c", "other")]
            .concat()
            + r#"apiVersion: networking.istio.io/v1
kind: Sidecar
metadata: {name: default, namespace: app}
spec:
  egress:
  - port: {number: 9080, protocol: HTTP, name: http}
    hosts: ["lib/*"]
  - hosts: ["./*"]
---
apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {name: a, namespace: app}
spec:
  hosts: [a]
  http:
  - route: [{destination: {host: c.other.svc.cluster.local, port: {number: 9090}}}]
  - match: [{sourceNamespace: elsewhere}]
    route: [{destination: {host: c.other.svc.cluster.local, port: {number: 9080}}}]
"#;
        let s = snapshot(&yaml);
        let got: Vec<String> = names(&s, &sidecar("app", &[]), TypeUrl::Cluster)
            .into_iter()
            .filter(|n| n.starts_with("outbound"))
            .collect();
        // a: imported whole by the catch-all listener. b: imported only by the 9080 listener, so its
        // other port has no cluster. c: reached only through the VirtualService, which routes this
        // proxy's namespace to 9090 only (the 9080 rule is for another source namespace).
        let want = ["9080||a.app", "9080||b.lib", "9090||a.app", "9090||c.other"];
        assert_eq!(got, want.map(|n| format!("outbound|{n}.svc.cluster.local")));
        // Its endpoints follow the clusters.
        let eds = names(&s, &sidecar("app", &[]), TypeUrl::Endpoint);
        assert!(!eds.iter().any(|n| n == "outbound|9090||b.lib.svc.cluster.local"), "{eds:?}");
        assert!(eds.iter().any(|n| n == "outbound|9080||b.lib.svc.cluster.local"), "{eds:?}");
    }
}
