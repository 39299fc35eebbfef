//! Registry builds that reuse the previous registry when only EndpointSlices, Pods,
//! WorkloadEntries and ServiceEntries without a `workloadSelector` changed (in place keeping
//! their hosts, or added with hosts nobody declares): the services and endpoints those changes
//! can reach are rebuilt, every other service and endpoint list keeps its `Arc`. Anything else (a
//! Service, Node, Namespace or mesh config change, a ServiceEntry removed, selecting workloads,
//! changing its hosts or added on a declared host) falls back to [`build_registry`], the
//! reference build.
//!
//! Reached services: for a slice, the Service it belongs to (before and after); for a Pod, the
//! Services whose slices refer to it (by `targetRef` name or IP) and the ServiceEntries of its
//! namespace whose `workloadSelector` matches its labels before or after; for a WorkloadEntry,
//! the Services and ServiceEntries of its namespace whose selector matches its labels before or
//! after.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

use super::build::build_registry;
use super::discovery::NamespaceScope;
use super::kube_endpoints::service_endpoints;
use super::kube_service::kube_hostname;
use super::kube_store::{endpoint_kind, KubeStore};
use super::kubernetes::{KubeObject, KubeObjects};
use super::service::{Endpoint, Service, ServiceKey, ServiceOrigin};
use super::service_entry::{endpoints_of, inline_endpoints, service_for};
use super::workload::WorkloadEntries;
use super::{Hostname, Registry};
use crate::config::api::Labels;
use crate::config::{Kind, Spec, ValidConfig};
use crate::mesh::MeshConfig;

/// The registry's inputs indexed across builds, and what changed since the last build.
#[derive(Debug, Default)]
pub struct IncrementalRegistry {
    store: KubeStore,
    /// Whether the last build was this one's and nothing since needs a full build.
    synced: bool,
    /// Kubernetes Services (namespace, name) whose endpoints the pending changes may change.
    services: BTreeSet<(String, String)>,
    /// Labels (before and after) of the changed Pods and WorkloadEntries, by namespace:
    /// ServiceEntries select on them.
    pod_labels: BTreeMap<String, Vec<Arc<Labels>>>,
    /// Of the last full build: the discovery scope, and the in-scope WorkloadEntries and
    /// Pod-selecting ServiceEntries by namespace, in key order.
    scope: NamespaceScope,
    workload_entries: HashMap<String, Vec<ValidConfig>>,
    selecting_entries: HashMap<String, Vec<ValidConfig>>,
    /// ServiceEntries changed in place or added since the last build (their new version): each
    /// one's services and endpoints depend on nothing but itself and the mesh config.
    entries: Vec<EntryChange>,
}

/// A ServiceEntry without a `workloadSelector` that changed since the last build.
#[derive(Debug)]
enum EntryChange {
    /// Changed in place, declaring the same hosts.
    Updated(ValidConfig),
    /// New.
    Added(ValidConfig),
}

impl IncrementalRegistry {
    /// Records that a Kubernetes object changed from `old` to `new` (`None`: absent).
    pub fn kube_changed(&mut self, old: Option<&Arc<KubeObject>>, new: Option<&Arc<KubeObject>>) {
        self.store.update(old, new);
        for object in old.into_iter().chain(new) {
            if !endpoint_kind(object.key().kind) {
                self.synced = false;
                continue;
            }
            match object.as_ref() {
                KubeObject::EndpointSlice(s) => {
                    self.services.insert((s.namespace.clone(), s.service_name.clone()));
                }
                KubeObject::Pod(p) => {
                    let referring = self.store.services_referring_to(&p.namespace, &p.name, &p.ips);
                    self.services.extend(referring.into_iter().map(|s| (p.namespace.to_string(), s)));
                    self.pod_labels.entry(p.namespace.to_string()).or_default().push(p.labels.clone());
                }
                _ => {}
            }
        }
    }

    /// Records that a config object changed from `old` to `new` (`None`: absent): ServiceEntries
    /// and WorkloadEntries feed the registry.
    pub fn config_changed(&mut self, kind: Kind, old: Option<&ValidConfig>, new: Option<&ValidConfig>) {
        match (kind, old, new) {
            (Kind::ServiceEntry, Some(old), Some(new)) if self_contained_update(old, new) => {
                self.entries.push(EntryChange::Updated(new.clone()));
            }
            (Kind::ServiceEntry, None, Some(new)) if selects_nothing(new) => {
                self.entries.push(EntryChange::Added(new.clone()));
            }
            (Kind::WorkloadEntry, _, _) => self.workload_entry_changed(old, new),
            (Kind::ServiceEntry, _, _) => self.synced = false,
            _ => {}
        }
    }

    /// Records a WorkloadEntry change: the services selecting it before or after are reached,
    /// and the in-scope entries of its namespace (kept in key order) follow.
    fn workload_entry_changed(&mut self, old: Option<&ValidConfig>, new: Option<&ValidConfig>) {
        for config in old.into_iter().chain(new) {
            let Spec::WorkloadEntry(we) = &config.spec else { continue };
            let namespace = &config.key.namespace;
            let labels = Arc::new(we.labels.clone());
            let services = self.store.services_selecting(namespace, &labels);
            self.services.extend(services.into_iter().map(|s| (namespace.clone(), s)));
            self.pod_labels.entry(namespace.clone()).or_default().push(labels);
        }
        let Some(config) = new.or(old) else { return };
        let namespace = &config.key.namespace;
        if !self.synced || !self.scope.contains(namespace) {
            // A full build comes (and fills the entries), or the namespace is out of scope.
            return;
        }
        let entries = self.workload_entries.entry(namespace.clone()).or_default();
        entries.retain(|c| c.key != config.key);
        if let Some(new) = new {
            let at = entries.partition_point(|c| c.key < new.key);
            entries.insert(at, new.clone());
        }
    }

    /// Makes the next build a full one (mesh config change, new term).
    pub fn invalidate(&mut self) {
        self.synced = false;
    }

    /// The registry of the current state: `previous` (the last registry this built) with the
    /// pending endpoint changes applied, or a full build when something else changed.
    pub fn build<'a>(
        &mut self,
        previous: Option<&Registry>,
        configs: impl Iterator<Item = &'a ValidConfig> + Clone,
        kube: &KubeObjects,
        mesh: &MeshConfig,
    ) -> Registry {
        let services = std::mem::take(&mut self.services);
        let pod_labels = std::mem::take(&mut self.pod_labels);
        let entries = std::mem::take(&mut self.entries);
        match previous.filter(|_| self.synced) {
            Some(previous) => {
                let mut registry = self.update(previous, services, pod_labels, mesh);
                for change in &entries {
                    let applied = match change {
                        EntryChange::Updated(config) => {
                            update_entry(&mut registry, config, mesh);
                            true
                        }
                        EntryChange::Added(config) => add_entry(&mut registry, config, &self.scope, mesh),
                    };
                    if !applied {
                        return self.full(configs, kube, mesh);
                    }
                }
                registry
            }
            None => self.full(configs, kube, mesh),
        }
    }

    fn full<'a>(
        &mut self,
        configs: impl Iterator<Item = &'a ValidConfig> + Clone,
        kube: &KubeObjects,
        mesh: &MeshConfig,
    ) -> Registry {
        self.scope = NamespaceScope::new(mesh, kube);
        self.workload_entries.clear();
        self.selecting_entries.clear();
        for config in configs.clone().filter(|c| self.scope.contains(&c.key.namespace)) {
            let by_namespace = match &config.spec {
                Spec::WorkloadEntry(_) => &mut self.workload_entries,
                Spec::ServiceEntry(se) if se.workload_selector.is_some() => &mut self.selecting_entries,
                _ => continue,
            };
            by_namespace.entry(config.key.namespace.clone()).or_default().push(config.clone());
        }
        self.synced = true;
        build_registry(configs, kube, mesh)
    }

    fn update(
        &self,
        previous: &Registry,
        services: BTreeSet<(String, String)>,
        pod_labels: BTreeMap<String, Vec<Arc<Labels>>>,
        mesh: &MeshConfig,
    ) -> Registry {
        let mut registry = previous.clone();
        let namespaces = services.iter().map(|(ns, _)| ns).chain(pod_labels.keys());
        let workload_entries: WorkloadEntries<'_> = namespaces
            .filter_map(|ns| {
                let (ns, entries) = self.workload_entries.get_key_value(ns)?;
                let entries = entries.iter().filter_map(|c| match &c.spec {
                    Spec::WorkloadEntry(we) => Some(we),
                    _ => None,
                });
                Some((ns.as_str(), entries.collect()))
            })
            .collect();
        for (namespace, name) in &services {
            if !self.scope.contains(namespace) {
                continue;
            }
            let Some(svc) = self.store.service(namespace, name) else { continue };
            let key =
                ServiceKey { hostname: kube_hostname(name, namespace, &mesh.domain), namespace: namespace.clone() };
            // The Service itself did not change, so its registry service is the previous one.
            let Some(service) = registry.services.get(&key) else { continue };
            let endpoints = service_endpoints(svc, service, &self.store, &workload_entries);
            set_endpoints(&mut registry, key, endpoints);
        }
        for (namespace, labels) in &pod_labels {
            for config in self.selecting_entries.get(namespace).into_iter().flatten() {
                let Spec::ServiceEntry(se) = &config.spec else { continue };
                let Some(selector) = &se.workload_selector else { continue };
                let selects = |l: &Arc<Labels>| selector.labels.iter().all(|(k, v)| l.get(k) == Some(v));
                if !labels.iter().any(selects) {
                    continue;
                }
                let endpoints = endpoints_of(se, namespace, &self.store, &workload_entries);
                let origin = ServiceOrigin::Config(config.key.clone());
                for host in &se.hosts {
                    let key = ServiceKey { hostname: Hostname::new(host), namespace: namespace.clone() };
                    // A host declared first by another object keeps that object's endpoints.
                    if registry.services.get(&key).is_some_and(|s| s.origin == origin) {
                        set_endpoints(&mut registry, key, endpoints.clone());
                    }
                }
            }
        }
        registry
    }
}

/// Whether a ServiceEntry changing from `old` to `new` changes nothing but its own services and
/// endpoints: it selects no workloads (before or after), and declares the same hosts in the same
/// order, so which object declares each host first stays as it was.
fn self_contained_update(old: &ValidConfig, new: &ValidConfig) -> bool {
    match (&old.spec, &new.spec) {
        (Spec::ServiceEntry(a), Spec::ServiceEntry(b)) => {
            a.workload_selector.is_none() && b.workload_selector.is_none() && a.hosts == b.hosts
        }
        _ => false,
    }
}

/// Whether `config` is a ServiceEntry without a `workloadSelector`.
fn selects_nothing(config: &ValidConfig) -> bool {
    matches!(&config.spec, Spec::ServiceEntry(se) if se.workload_selector.is_none())
}

/// Adds the services and endpoints of `config`, a new ServiceEntry without a `workloadSelector`;
/// `false` (nothing added) when some host of it is declared already: which declaration wins
/// then depends on the others, which only a full build knows.
fn add_entry(registry: &mut Registry, config: &ValidConfig, scope: &NamespaceScope, mesh: &MeshConfig) -> bool {
    let Spec::ServiceEntry(se) = &config.spec else { return false };
    if !scope.contains(&config.key.namespace) {
        return true;
    }
    let services: Vec<Service> = se.hosts.iter().map(|host| service_for(config, se, host, mesh)).collect();
    let key = |s: &Service| ServiceKey { hostname: s.hostname.clone(), namespace: s.namespace.clone() };
    let mut keys: Vec<ServiceKey> = services.iter().map(key).collect();
    keys.sort();
    keys.dedup();
    if keys.len() != services.len() || keys.iter().any(|k| registry.services.contains_key(k)) {
        return false;
    }
    let endpoints = Arc::new(inline_endpoints(se));
    for service in services {
        let key = key(&service);
        registry.endpoints.insert(key.clone(), endpoints.clone());
        registry.services.insert(key, Arc::new(service));
    }
    true
}

/// Replaces the services and endpoints `config` (a ServiceEntry changed in place, see
/// [`self_contained_update`]) declares first; a host another object declared first stays theirs.
fn update_entry(registry: &mut Registry, config: &ValidConfig, mesh: &MeshConfig) {
    let Spec::ServiceEntry(se) = &config.spec else { return };
    let origin = ServiceOrigin::Config(config.key.clone());
    let endpoints = Arc::new(inline_endpoints(se));
    for host in &se.hosts {
        let service = service_for(config, se, host, mesh);
        let key = ServiceKey { hostname: service.hostname.clone(), namespace: service.namespace.clone() };
        // Absent: out of discovery scope. Another origin: declared first by another object.
        let Some(old) = registry.services.get(&key).filter(|s| s.origin == origin) else { continue };
        if **old != service {
            registry.services.insert(key.clone(), Arc::new(service));
        }
        match registry.endpoints.get(&key) {
            Some(old) if *old == endpoints => {}
            _ => {
                registry.endpoints.insert(key, endpoints.clone());
            }
        }
    }
}

/// Sets a service's endpoints, keeping the previous `Arc` when they are equal (snapshots then
/// share it, and comparisons stop at the pointer).
fn set_endpoints(registry: &mut Registry, key: ServiceKey, endpoints: Vec<Endpoint>) {
    match registry.endpoints.get(&key) {
        Some(old) if **old == endpoints => {}
        _ => {
            registry.endpoints.insert(key, Arc::new(endpoints));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::parse::{parse_file, Document};
    use crate::registry::kubernetes::{
        KubeEndpointSlice, KubeKey, KubeKind, KubeNamespace, KubeNode, KubePod, KubeService, KubeServicePort,
        ServiceType, SliceEndpoint, SlicePort, TargetPort,
    };

    /// A tiny deterministic generator (xorshift), so failures replay.
    struct Rng(u64);

    impl Rng {
        fn below(&mut self, n: usize) -> usize {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            (self.0 % n as u64) as usize
        }
    }

    const NAMESPACES: [&str; 2] = ["a", "b"];
    const SERVICES: usize = 4;
    const PODS: usize = 12;

    fn labels(app: usize, version: usize) -> Labels {
        [("app".to_string(), format!("s{app}")), ("version".to_string(), format!("v{version}"))].into()
    }

    fn service(ns: &str, i: usize) -> KubeObject {
        // Even services resolve their target port by name through the Pod.
        let target_port = if i.is_multiple_of(2) { TargetPort::Name("http".into()) } else { TargetPort::Number(8080) };
        KubeObject::Service(KubeService {
            name: format!("s{i}"),
            namespace: ns.into(),
            labels: Labels::new(),
            selector: Some([("app".to_string(), format!("s{i}"))].into()),
            service_type: ServiceType::ClusterIp,
            cluster_ips: vec![format!("10.96.0.{i}")],
            headless: false,
            external_name: None,
            ports: vec![KubeServicePort {
                name: "http".into(),
                port: 80,
                protocol: "TCP".into(),
                app_protocol: None,
                target_port: Some(target_port),
            }],
            export_to: Vec::new(),
        })
    }

    fn pod(rng: &mut Rng, ns: &str, i: usize) -> KubeObject {
        KubeObject::Pod(KubePod {
            name: format!("p{i}"),
            namespace: ns.into(),
            labels: Arc::new(labels(rng.below(SERVICES), rng.below(2))),
            service_account: "default".into(),
            // IPs collide across pods now and then, as host-network pods' do.
            ips: vec![format!("10.0.0.{}", rng.below(PODS + 4))],
            node_name: format!("n{}", rng.below(3)).into(),
            ready: rng.below(4) != 0,
            terminating: rng.below(8) == 0,
            named_ports: if rng.below(3) == 0 {
                Arc::from(vec![])
            } else {
                Arc::from(vec![("http".to_string(), 9000)])
            },
        })
    }

    fn slice(rng: &mut Rng, ns: &str, i: usize) -> KubeObject {
        let endpoints = (0..rng.below(5))
            .map(|_| {
                let p = rng.below(PODS + 2);
                SliceEndpoint {
                    addresses: vec![format!("10.0.0.{}", rng.below(PODS + 4))],
                    ready: [Some(true), Some(false), None][rng.below(3)],
                    serving: None,
                    terminating: None,
                    // Some endpoints name a Pod (maybe one that does not exist), others join by IP.
                    pod: (rng.below(3) != 0).then(|| format!("p{p}")),
                    node_name: Some("n0".into()),
                }
            })
            .collect();
        KubeObject::EndpointSlice(KubeEndpointSlice {
            name: format!("slice-{i}"),
            namespace: ns.into(),
            service_name: format!("s{}", rng.below(SERVICES + 1)),
            address_type: "IPv4".into(),
            ports: vec![SlicePort {
                name: "http".into(),
                port: (rng.below(2) == 0).then_some(8080),
                protocol: "TCP".into(),
            }],
            endpoints,
        })
    }

    const CONFIGS: &str = r#"
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: by-pods, namespace: a}
spec:
  hosts: [pods.example.com, s3.a.svc.cluster.local]
  location: MESH_INTERNAL
  resolution: STATIC
  ports: [{number: 80, name: http, protocol: HTTP}]
  workloadSelector: {labels: {app: s1}}
---
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: by-version, namespace: b}
spec:
  hosts: [v1.example.com]
  location: MESH_INTERNAL
  resolution: STATIC
  ports: [{number: 80, name: http, protocol: HTTP}]
  workloadSelector: {labels: {version: v1}}
---
apiVersion: networking.istio.io/v1
kind: WorkloadEntry
metadata: {name: vm, namespace: a}
spec: {address: 10.1.0.1, labels: {app: s2}, ports: {http: 7000}}
"#;

    /// Random slice and Pod changes, a few per build: each incremental registry equals a full
    /// build of the same state.
    #[test]
    fn incremental_registry_equals_a_full_build() {
        let configs: Vec<ValidConfig> = parse_file("t.yaml", CONFIGS)
            .into_iter()
            .map(|d| match d {
                Document::Valid(o) => Arc::new(o),
                other => panic!("{other:?}"),
            })
            .collect();
        let mesh = MeshConfig::default();
        let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
        let mut kube = KubeObjects::new();
        let mut inc = IncrementalRegistry::default();
        let set = |kube: &mut KubeObjects, inc: &mut IncrementalRegistry, key, object: Option<KubeObject>| {
            let new = object.map(Arc::new);
            let old = match &new {
                Some(o) => kube.insert(key, o.clone()),
                None => kube.remove(&key),
            };
            inc.kube_changed(old.as_ref(), new.as_ref());
        };
        let mut initial = Vec::new();
        for n in 0..3 {
            initial.push(KubeObject::Node(KubeNode {
                name: format!("n{n}"),
                region: "r".into(),
                zone: format!("z{n}"),
                subzone: String::new(),
            }));
        }
        for ns in NAMESPACES {
            let network = [("topology.istio.io/network".to_string(), format!("net-{ns}"))].into();
            initial.push(KubeObject::Namespace(KubeNamespace { name: ns.into(), labels: network }));
            initial.extend((0..SERVICES).map(|i| service(ns, i)));
            initial.extend((0..PODS).map(|i| pod(&mut rng, ns, i)));
            initial.extend((0..SERVICES + 2).map(|i| slice(&mut rng, ns, i)));
        }
        for object in initial {
            set(&mut kube, &mut inc, object.key(), Some(object));
        }
        let mut registry = inc.build(None, configs.iter(), &kube, &mesh);
        assert_eq!(registry, build_registry(configs.iter(), &kube, &mesh));
        let mut changed_endpoints = 0;
        for round in 0..300 {
            for _ in 0..1 + rng.below(3) {
                let ns = NAMESPACES[rng.below(2)];
                let object = if rng.below(2) == 0 {
                    let i = rng.below(PODS + 2);
                    (rng.below(6) != 0).then(|| pod(&mut rng, ns, i)).ok_or_else(|| (ns, format!("p{i}")))
                } else {
                    let i = rng.below(SERVICES + 3);
                    (rng.below(6) != 0).then(|| slice(&mut rng, ns, i)).ok_or_else(|| (ns, format!("slice-{i}")))
                };
                match object {
                    Ok(o) => set(&mut kube, &mut inc, o.key(), Some(o)),
                    Err((ns, name)) => {
                        let kind = if name.starts_with('p') { KubeKind::Pod } else { KubeKind::EndpointSlice };
                        set(&mut kube, &mut inc, KubeKey { kind, namespace: ns.into(), name }, None);
                    }
                }
            }
            let next = inc.build(Some(&registry), configs.iter(), &kube, &mesh);
            assert_eq!(next, build_registry(configs.iter(), &kube, &mesh), "round {round}");
            assert!(inc.synced, "slice and Pod changes stay incremental");
            changed_endpoints += usize::from(next.endpoints != registry.endpoints);
            registry = next;
        }
        assert!(changed_endpoints > 100, "the changes reach endpoints: {changed_endpoints}");
    }

    #[test]
    fn other_changes_fall_back_to_a_full_build() {
        let mesh = MeshConfig::default();
        let mut kube = KubeObjects::new();
        let mut inc = IncrementalRegistry::default();
        let svc = Arc::new(service("a", 0));
        kube.insert(svc.key(), svc.clone());
        inc.kube_changed(None, Some(&svc));
        let registry = inc.build(None, std::iter::empty(), &kube, &mesh);
        assert!(inc.synced);
        inc.config_changed(Kind::VirtualService, None, None);
        assert!(inc.synced, "VirtualServices do not feed the registry");
        inc.config_changed(Kind::ServiceEntry, None, None);
        assert!(!inc.synced);
        inc.build(Some(&registry), std::iter::empty(), &kube, &mesh);
        assert!(inc.synced);
        inc.kube_changed(Some(&svc), None);
        kube.clear();
        assert!(!inc.synced, "a Service change is a full build");
        assert!(inc.build(Some(&registry), std::iter::empty(), &kube, &mesh).services.is_empty());
    }

    fn entry(name: &str, ns: &str, hosts: &str, addresses: &[&str], extra: &str) -> ValidConfig {
        let endpoints: Vec<String> = addresses.iter().map(|a| format!("{{address: {a}}}")).collect();
        let yaml = format!(
            "apiVersion: networking.istio.io/v1\nkind: ServiceEntry\nmetadata: {{name: {name}, namespace: {ns}}}\nspec: {{hosts: [{hosts}], location: MESH_INTERNAL, resolution: STATIC, ports: [{{number: 80, name: http, protocol: HTTP}}], endpoints: [{}]{extra}}}\n",
            endpoints.join(", ")
        );
        match parse_file("t.yaml", &yaml).into_iter().next() {
            Some(Document::Valid(o)) => Arc::new(o),
            other => panic!("{other:?}"),
        }
    }

    /// Random endpoint edits of ServiceEntries (two of them declaring the same host, one of those
    /// shadowed): each incremental registry equals a full build, and untouched services keep
    /// their `Arc`s.
    #[test]
    fn service_entry_endpoint_edits_are_incremental_and_equal_a_full_build() {
        let mesh = MeshConfig::default();
        let kube = KubeObjects::new();
        let hosts = ["a.example.com", "b.example.com, shared.example.com", "shared.example.com", "c.example.com"];
        let names = ["a", "b", "c", "d"];
        let mut configs: BTreeMap<String, ValidConfig> = BTreeMap::new();
        for (name, host) in names.iter().zip(hosts) {
            configs.insert(name.to_string(), entry(name, "ns", host, &["10.0.0.1"], ""));
        }
        let mut inc = IncrementalRegistry::default();
        let mut registry = inc.build(None, configs.values(), &kube, &mesh);
        let mut rng = Rng(0x2545_f491_4f6c_dd1d);
        for round in 0..100 {
            let i = rng.below(names.len());
            let addresses: Vec<String> = (0..rng.below(4)).map(|_| format!("10.0.0.{}", rng.below(6))).collect();
            let addresses: Vec<&str> = addresses.iter().map(String::as_str).collect();
            let new = entry(names[i], "ns", hosts[i], &addresses, "");
            let old = configs.insert(names[i].to_string(), new.clone());
            inc.config_changed(Kind::ServiceEntry, old.as_ref(), Some(&new));
            let next = inc.build(Some(&registry), configs.values(), &kube, &mesh);
            assert!(inc.synced, "round {round}: an endpoint edit stays incremental");
            assert_eq!(next, build_registry(configs.values(), &kube, &mesh), "round {round}");
            let touched: Vec<&str> = hosts[i].split(", ").collect();
            for (key, endpoints) in &registry.endpoints {
                if !touched.contains(&key.hostname.as_str()) {
                    assert!(Arc::ptr_eq(endpoints, &next.endpoints[key]), "round {round}: {key:?} kept");
                }
            }
            registry = next;
        }
        // A new ServiceEntry on new hosts is added in place; on a declared host (which
        // declaration wins depends on the others) it takes a full build.
        for (name, host, incremental) in [("e", "e.example.com", true), ("ab", "c.example.com", false)] {
            let new = entry(name, "ns", host, &["10.0.0.7"], "");
            configs.insert(name.to_string(), new.clone());
            inc.config_changed(Kind::ServiceEntry, None, Some(&new));
            assert!(inc.synced);
            let next = inc.build(Some(&registry), configs.values(), &kube, &mesh);
            assert_eq!(next, build_registry(configs.values(), &kube, &mesh), "{name}");
            let kept = ServiceKey { hostname: Hostname::new("a.example.com"), namespace: "ns".into() };
            assert_eq!(Arc::ptr_eq(&registry.services[&kept], &next.services[&kept]), incremental, "{name}");
            registry = next;
        }
        // New hosts, a selector, a removal: a full build.
        for (old, new) in [
            (Some(entry("a", "ns", "a.example.com", &[], "")), Some(entry("a", "ns", "z.example.com", &[], ""))),
            (
                Some(entry("a", "ns", "a.example.com", &[], "")),
                Some(entry("a", "ns", "a.example.com", &[], ", workloadSelector: {labels: {app: a}}")),
            ),
            (None, Some(entry("f", "ns", "f.example.com", &[], ", workloadSelector: {labels: {app: a}}"))),
            (Some(entry("a", "ns", "a.example.com", &[], "")), None),
        ] {
            inc.build(Some(&registry), configs.values(), &kube, &mesh);
            assert!(inc.synced);
            inc.config_changed(Kind::ServiceEntry, old.as_ref(), new.as_ref());
            assert!(!inc.synced, "{new:?}");
        }
    }

    /// Random WorkloadEntry additions, label and port changes and removals (with Services and
    /// ServiceEntries selecting them by label): each incremental registry equals a full build.
    #[test]
    fn workload_entry_changes_are_incremental_and_equal_a_full_build() {
        let mesh = MeshConfig::default();
        let mut rng = Rng(0x51_7cc1_b727_220a);
        let mut kube = KubeObjects::new();
        let mut inc = IncrementalRegistry::default();
        for ns in NAMESPACES {
            for object in (0..SERVICES).map(|i| service(ns, i)).chain((0..PODS).map(|i| pod(&mut rng, ns, i))) {
                let object = Arc::new(object);
                kube.insert(object.key(), object.clone());
                inc.kube_changed(None, Some(&object));
            }
        }
        let mut configs: BTreeMap<crate::config::ConfigKey, ValidConfig> = parse_file("t.yaml", CONFIGS)
            .into_iter()
            .map(|d| match d {
                Document::Valid(o) => (o.key.clone(), Arc::new(o)),
                other => panic!("{other:?}"),
            })
            .collect();
        let mut registry = inc.build(None, configs.values(), &kube, &mesh);
        let mut changed_endpoints = 0;
        for round in 0..300 {
            let (ns, i) = (NAMESPACES[rng.below(2)], rng.below(6));
            let new = (rng.below(5) != 0).then(|| {
                let labels = match rng.below(4) {
                    0 => String::new(),
                    _ => format!("app: s{}, version: v{}", rng.below(SERVICES), rng.below(2)),
                };
                let yaml = format!(
                    "apiVersion: networking.istio.io/v1\nkind: WorkloadEntry\nmetadata: {{name: we-{i}, namespace: {ns}}}\nspec: {{address: 10.1.0.{i}, labels: {{{labels}}}, ports: {{http: {}}}}}\n",
                    7000 + rng.below(2)
                );
                match parse_file("t.yaml", &yaml).into_iter().next() {
                    Some(Document::Valid(o)) => Arc::new(o),
                    other => panic!("{other:?}"),
                }
            });
            let key = crate::config::ConfigKey {
                kind: Kind::WorkloadEntry,
                namespace: ns.to_string(),
                name: format!("we-{i}"),
            };
            let old = match &new {
                Some(n) => configs.insert(key, n.clone()),
                None => configs.remove(&key),
            };
            inc.config_changed(Kind::WorkloadEntry, old.as_ref(), new.as_ref());
            let next = inc.build(Some(&registry), configs.values(), &kube, &mesh);
            assert!(inc.synced, "round {round}: WorkloadEntry changes stay incremental");
            assert_eq!(next, build_registry(configs.values(), &kube, &mesh), "round {round}");
            changed_endpoints += usize::from(next.endpoints != registry.endpoints);
            registry = next;
        }
        assert!(changed_endpoints > 100, "the changes reach endpoints: {changed_endpoints}");
    }
}
