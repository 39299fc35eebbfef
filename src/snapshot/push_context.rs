//! The snapshot: an immutable, indexed view of the whole mesh at one version (Istio's PushContext).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, OnceLock};
use std::time::SystemTime;

use super::security::SecurityIndex;
use super::{ChangeSet, Version};
use crate::config::api::{DestinationRule, Gateway, Labels, Sidecar, VirtualService};
use crate::config::{ConfigError, ConfigKey, ConfigObjects, IgnoredObject, Kind, Spec, ValidConfig};
use crate::mesh::MeshConfig;
use crate::registry::kubernetes::KubeObjects;
use crate::registry::{
    host_matches, Endpoint, Endpoints, Hostname, InstanceIndex, NamespaceScope, Registry, Service, ServiceKey,
    Visibility,
};

/// Everything the sources currently hold, as ingest hands it to the snapshot builder.
#[derive(Debug, Clone, Default)]
pub struct SourceState {
    /// Valid config objects by key.
    pub configs: ConfigObjects,
    /// Rejected documents (their last valid version, if any, is still in `configs`).
    pub errors: Arc<Vec<ConfigError>>,
    /// Documents of kinds meshpilot does not serve.
    pub ignored: Arc<Vec<IgnoredObject>>,
    /// Mesh config.
    pub mesh: Arc<MeshConfig>,
    /// Kubernetes registry objects (Services, EndpointSlices, Pods, Nodes, Namespaces).
    pub kube: KubeObjects,
}

/// An immutable PushContext snapshot. Readers hold an `Arc<Snapshot>`; nobody mutates it.
#[derive(Debug)]
pub struct Snapshot {
    /// Version.
    pub version: Version,
    /// What changed since the previous snapshot.
    pub changes: ChangeSet,
    /// When it was built.
    pub built_at: SystemTime,
    /// Mesh config.
    pub mesh: Arc<MeshConfig>,
    /// Services and endpoints.
    pub registry: Registry,
    /// All valid config objects by key.
    pub configs: ConfigObjects,
    /// Rejected documents.
    pub errors: Arc<Vec<ConfigError>>,
    /// Documents of other kinds.
    pub ignored: Arc<Vec<IgnoredObject>>,
    /// Kubernetes registry objects the registry was built from.
    pub kube: KubeObjects,
    virtual_services: Vec<Indexed<VirtualService>>,
    destination_rules: Vec<Indexed<DestinationRule>>,
    /// Label keys some selector reads; a proxy's other labels cannot change its config.
    selector_keys: BTreeSet<String>,
    /// AuthorizationPolicies and RequestAuthentications by scope (rejected policies included).
    pub security: SecurityIndex,
    /// Endpoints by IP, built on the first inbound lookup (only frontends serving sidecars need it).
    instances: OnceLock<InstanceIndex>,
}

/// A config object with its resolved visibility and qualified hosts.
#[derive(Debug, Clone)]
pub struct Indexed<T> {
    /// The object.
    pub config: ValidConfig,
    /// Namespaces it is visible to.
    pub visibility: Visibility,
    /// Hosts, qualified with the object's namespace.
    pub hosts: Vec<Hostname>,
    _spec: std::marker::PhantomData<T>,
}

impl Snapshot {
    /// Builds a snapshot from the sources' state.
    pub fn build(version: Version, changes: ChangeSet, state: &SourceState) -> Snapshot {
        let registry = crate::registry::build_registry(state.configs.iter().map(|(_, c)| c), &state.kube, &state.mesh);
        Snapshot::build_with_registry(version, changes, state, registry)
    }

    /// Builds a snapshot from the sources' state and the registry already built from that state.
    pub fn build_with_registry(
        version: Version,
        changes: ChangeSet,
        state: &SourceState,
        registry: Registry,
    ) -> Snapshot {
        let mesh = state.mesh.clone();
        // Short hosts are Kubernetes service names: qualified with the DNS domain, not the trust domain.
        let domain = mesh.domain.clone();
        // Istio config outside the discovery selectors' namespaces is out of scope, as in Istio.
        let scope = NamespaceScope::new(&mesh, &state.kube);
        let configs = if scope.selects_all() {
            state.configs.clone()
        } else {
            state
                .configs
                .iter()
                .filter(|(k, _)| scope.contains(&k.namespace))
                .map(|(k, c)| (k.clone(), c.clone()))
                .collect()
        };
        let mut virtual_services = Vec::new();
        // Filled in config key order (kind, namespace, name): `destination_rules_in` relies on it.
        let mut destination_rules = Vec::new();
        for config in configs.values() {
            let ns = config.key.namespace.as_str();
            match &config.spec {
                Spec::VirtualService(vs) => virtual_services.push(Indexed {
                    config: config.clone(),
                    visibility: Visibility::from_export_to(&vs.export_to, ns, &mesh.default_virtual_service_export_to),
                    hosts: vs.hosts.iter().map(|h| Hostname::qualify(h, ns, &domain)).collect(),
                    _spec: Default::default(),
                }),
                Spec::DestinationRule(dr) => destination_rules.push(Indexed {
                    config: config.clone(),
                    visibility: Visibility::from_export_to(&dr.export_to, ns, &mesh.default_destination_rule_export_to),
                    hosts: vec![Hostname::qualify(&dr.host, ns, &domain)],
                    _spec: Default::default(),
                }),
                _ => {}
            }
        }
        let security =
            SecurityIndex::build(&mesh.root_namespace, configs.values(), &state.errors, |k| configs.contains_key(k));
        let mut selector_keys = selector_keys(configs.values());
        selector_keys.extend(security.selector_keys().cloned());
        let kube = super::credentials::keep_referenced(&state.kube, configs.values());
        // A frontend's state carries the leader's errors, these included: never twice.
        let mut credential_errors = super::credentials::credential_errors(&kube, configs.values());
        credential_errors.retain(|e| !state.errors.contains(e));
        let errors = if credential_errors.is_empty() {
            state.errors.clone()
        } else {
            Arc::new(state.errors.iter().cloned().chain(credential_errors).collect())
        };
        Snapshot {
            version,
            changes,
            built_at: SystemTime::now(),
            mesh,
            registry,
            configs,
            errors,
            ignored: state.ignored.clone(),
            kube,
            virtual_services,
            destination_rules,
            selector_keys,
            security,
            instances: OnceLock::new(),
        }
    }

    /// The part of a proxy's `labels` some selector of this snapshot reads. Proxies whose
    /// labels differ only elsewhere get identical config, so they share one generation.
    pub fn selected_labels(&self, labels: &Labels) -> Labels {
        labels.iter().filter(|(k, _)| self.selector_keys.contains(*k)).map(|(k, v)| (k.clone(), v.clone())).collect()
    }

    /// Whether `other`'s selectors read the same label keys (then a proxy's labels resolve alike in both).
    pub fn reads_same_labels(&self, other: &Snapshot) -> bool {
        self.selector_keys == other.selector_keys
    }

    /// Objects of one kind, in key order.
    pub fn configs_of(&self, kind: Kind) -> impl Iterator<Item = &ValidConfig> {
        // Keys order by kind first: one kind's objects are one contiguous range, found in
        // O(log n) (generators look kinds up per proxy and per cluster).
        let first = ConfigKey { kind, namespace: String::new(), name: String::new() };
        self.configs.range(first..).map(|(_, c)| c).take_while(move |c| c.key.kind == kind)
    }

    /// Services a proxy in `namespace` can see, one per hostname (its own namespace's declaration
    /// first, then the first exported one), in hostname order.
    pub fn services_visible_to(&self, namespace: &str) -> Vec<&Arc<Service>> {
        let mut by_host: BTreeMap<&Hostname, &Arc<Service>> = BTreeMap::new();
        for (key, svc) in &self.registry.services {
            if !svc.visibility.visible_to(namespace) && svc.namespace != namespace {
                continue;
            }
            let entry = by_host.entry(&key.hostname).or_insert(svc);
            if svc.namespace == namespace {
                *entry = svc;
            }
        }
        by_host.into_values().collect()
    }

    /// The service a proxy in `namespace` reaches under `host`.
    pub fn service_for_host(&self, namespace: &str, host: &Hostname) -> Option<&Arc<Service>> {
        let mut found = None;
        for (key, svc) in
            self.registry.services.range(ServiceKey { hostname: host.clone(), namespace: String::new() }..)
        {
            if &key.hostname != host {
                break;
            }
            if svc.namespace == namespace {
                return Some(svc);
            }
            if found.is_none() && svc.visibility.visible_to(namespace) {
                found = Some(svc);
            }
        }
        found
    }

    /// Endpoints of a service.
    pub fn endpoints(&self, service: &Service) -> Option<&Endpoints> {
        self.registry
            .endpoints
            .get(&ServiceKey { hostname: service.hostname.clone(), namespace: service.namespace.clone() })
    }

    /// The services with an endpoint at `ip` (a proxy's service instances), in key order.
    pub fn instances_at(&self, ip: &str) -> Vec<(&Arc<Service>, &Endpoint)> {
        self.instances.get_or_init(|| InstanceIndex::new(&self.registry)).at(ip)
    }

    /// VirtualServices visible to `namespace` that apply to `gateway` (`mesh` for sidecars, or
    /// `ns/name` of a Gateway), in key order.
    pub fn virtual_services_for(
        &self,
        namespace: &str,
        gateway: &str,
    ) -> Vec<(&Indexed<VirtualService>, &VirtualService)> {
        self.virtual_services
            .iter()
            .filter(|ix| ix.visibility.visible_to(namespace) || ix.config.key.namespace == namespace)
            .filter_map(|ix| match &ix.config.spec {
                Spec::VirtualService(vs) => Some((ix, vs)),
                _ => None,
            })
            .filter(|(ix, vs)| vs_applies_to_gateway(vs, &ix.config.key.namespace, gateway))
            .collect()
    }

    /// The DestinationRules of `namespace`: rules are kept in config key order, so a
    /// namespace's are one run of them, found by binary search rather than a scan per lookup.
    fn destination_rules_in(&self, namespace: &str) -> &[Indexed<DestinationRule>] {
        let rules = self.destination_rules.as_slice();
        let start = rules.partition_point(|ix| ix.config.key.namespace.as_str() < namespace);
        let len = rules[start..].partition_point(|ix| ix.config.key.namespace == namespace);
        &rules[start..start + len]
    }

    /// The qualified hosts of the DestinationRule `key`, if this snapshot holds it.
    pub fn destination_rule_hosts(&self, key: &ConfigKey) -> Option<&[Hostname]> {
        self.destination_rules.iter().find(|ix| ix.config.key == *key).map(|ix| ix.hosts.as_slice())
    }

    /// The DestinationRule that applies to `host` for a proxy in `namespace`, using Istio's
    /// lookup order: the proxy's namespace, then the service's namespace, then the root
    /// namespace; within one, the most specific host wins.
    pub fn destination_rule_for(&self, namespace: &str, service: &Service) -> Option<&DestinationRule> {
        let host = &service.hostname;
        let candidates = |ns: &str| {
            self.destination_rules_in(ns)
                .iter()
                .filter(|ix| ix.hosts.iter().any(|h| host_matches(h.as_str(), host.as_str())))
                .min_by_key(|ix| ix.hosts.first().map(|h| (h.is_wildcard(), usize::MAX - h.as_str().len())))
        };
        let order = [namespace, service.namespace.as_str(), self.mesh.root_namespace.as_str()];
        order
            .iter()
            .enumerate()
            .filter_map(|(i, ns)| {
                let ix = candidates(ns)?;
                // Rules outside the proxy's own namespace apply only where exported to it.
                (i == 0 || ix.visibility.visible_to(namespace)).then_some(ix)
            })
            .find_map(|ix| match &ix.config.spec {
                Spec::DestinationRule(dr) => Some(dr),
                _ => None,
            })
    }

    /// The Sidecar that applies to a workload: one in its namespace selecting its labels, else one
    /// in its namespace without selector, else one in the root namespace without selector.
    pub fn sidecar_for(&self, namespace: &str, labels: &Labels) -> Option<(&ValidConfig, &Sidecar)> {
        let sidecars: Vec<(&ValidConfig, &Sidecar)> = self
            .configs_of(Kind::Sidecar)
            .filter_map(|c| match &c.spec {
                Spec::Sidecar(s) => Some((c, s)),
                _ => None,
            })
            .collect();
        let selects = |s: &Sidecar| {
            s.workload_selector
                .as_ref()
                .is_some_and(|sel| sel.match_labels.iter().all(|(k, v)| labels.get(k) == Some(v)))
        };
        sidecars
            .iter()
            .find(|(c, s)| c.key.namespace == namespace && selects(s))
            .or_else(|| sidecars.iter().find(|(c, s)| c.key.namespace == namespace && s.workload_selector.is_none()))
            .or_else(|| {
                sidecars
                    .iter()
                    .find(|(c, s)| c.key.namespace == self.mesh.root_namespace && s.workload_selector.is_none())
            })
            .copied()
    }

    /// Gateways whose selector matches a gateway workload's labels, in key order.
    pub fn gateways_for(&self, labels: &Labels) -> Vec<(&ValidConfig, &Gateway)> {
        self.configs_of(Kind::Gateway)
            .filter_map(|c| match &c.spec {
                Spec::Gateway(g) => Some((c, g)),
                _ => None,
            })
            .filter(|(_, g)| !g.selector.is_empty() && g.selector.iter().all(|(k, v)| labels.get(k) == Some(v)))
            .collect()
    }
}

/// Every label key a proxy's config can depend on: those of Sidecar workload selectors, Gateway
/// selectors and VirtualService `sourceLabels` matches (security policies' are added from the
/// [`SecurityIndex`], which also holds rejected policies). A kind that starts selecting proxies by
/// label must add its keys here, or proxies it tells apart would share config.
fn selector_keys<'a>(configs: impl Iterator<Item = &'a ValidConfig>) -> BTreeSet<String> {
    let mut keys = BTreeSet::new();
    for config in configs {
        match &config.spec {
            Spec::Sidecar(s) => keys.extend(s.workload_selector.iter().flat_map(|w| w.match_labels.keys().cloned())),
            Spec::Gateway(g) => keys.extend(g.selector.keys().cloned()),
            Spec::PeerAuthentication(pa) => {
                keys.extend(pa.selector_labels().into_iter().flat_map(|l| l.keys().cloned()))
            }
            Spec::VirtualService(vs) => {
                let http = vs.http.iter().flat_map(|r| r.matches.iter().map(|m| &m.source_labels));
                let tls = vs.tls.iter().flat_map(|r| r.matches.iter().map(|m| &m.source_labels));
                let tcp = vs.tcp.iter().flat_map(|r| r.matches.iter().map(|m| &m.source_labels));
                keys.extend(http.chain(tls).chain(tcp).flat_map(|l| l.keys().cloned()));
            }
            _ => {}
        }
    }
    keys
}

/// Whether a VirtualService in `vs_ns` binds to `gateway` (`mesh` or `ns/name`).
pub fn vs_applies_to_gateway(vs: &VirtualService, vs_ns: &str, gateway: &str) -> bool {
    if vs.gateways.is_empty() {
        return gateway == "mesh";
    }
    vs.gateways.iter().any(|g| qualify_gateway(g, vs_ns) == gateway)
}

/// Qualifies a gateway reference (`name` → `ns/name`); `mesh` stays `mesh`.
pub fn qualify_gateway(reference: &str, namespace: &str) -> String {
    if reference == "mesh" || reference.contains('/') {
        reference.to_string()
    } else {
        format!("{namespace}/{reference}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::parse::{parse_file, Document};

    #[test]
    fn a_namespaces_destination_rules_are_found_among_others() {
        let rule = |ns: &str, name: &str| {
            format!("apiVersion: networking.istio.io/v1\nkind: DestinationRule\nmetadata: {{name: {name}, namespace: {ns}}}\nspec: {{host: {name}}}\n---\n")
        };
        let yaml: String = [("b", "r1"), ("a", "r2"), ("c", "r3"), ("b", "r4"), ("bb", "r5")]
            .iter()
            .map(|(ns, n)| rule(ns, n))
            .collect();
        let mut state = SourceState::default();
        for doc in parse_file("t.yaml", &yaml) {
            let Document::Valid(o) = doc else { panic!("{doc:?}") };
            state.configs.insert(o.key.clone(), Arc::new(o));
        }
        let snap = Snapshot::build(Version::new(1, 1), ChangeSet::full(), &state);
        let names =
            |ns: &str| snap.destination_rules_in(ns).iter().map(|ix| ix.config.key.name.clone()).collect::<Vec<_>>();
        assert_eq!(
            (names("a"), names("b"), names("bb"), names("c")),
            (
                vec!["r2".to_string()],
                vec!["r1".to_string(), "r4".to_string()],
                vec!["r5".to_string()],
                vec!["r3".to_string()]
            )
        );
        assert!(names("none").is_empty() && names("").is_empty());
    }

    #[test]
    fn short_hosts_are_qualified_with_the_dns_domain_not_the_trust_domain() {
        let yaml = "apiVersion: networking.istio.io/v1\nkind: VirtualService\nmetadata: {name: r, namespace: shop}\nspec: {hosts: [ratings], http: [{route: [{destination: {host: ratings}}]}]}\n";
        let mut state = SourceState::default();
        for doc in parse_file("t.yaml", yaml) {
            let Document::Valid(o) = doc else { panic!("{doc:?}") };
            state.configs.insert(o.key.clone(), Arc::new(o));
        }
        let mesh =
            MeshConfig { trust_domain: "example.org".into(), domain: "corp.internal".into(), ..Default::default() };
        state.mesh = Arc::new(mesh);
        let snap = Snapshot::build(Version::new(1, 1), ChangeSet::full(), &state);
        let vs = snap.virtual_services_for("shop", "mesh");
        assert_eq!(vs.len(), 1);
        assert_eq!(vs[0].0.hosts, [Hostname::new("ratings.shop.svc.corp.internal")]);
    }

    #[test]
    fn configs_of_yields_exactly_one_kind() {
        let yaml =
            "apiVersion: networking.istio.io/v1\nkind: Sidecar\nmetadata: {name: a, namespace: z}\nspec: {egress: [{hosts: ['./*']}]}\n---\n\
                    apiVersion: networking.istio.io/v1\nkind: Gateway\nmetadata: {name: g, namespace: a}\n\
                    spec: {servers: [{port: {number: 80, name: http, protocol: HTTP}, hosts: ['*']}]}\n---\n\
                    apiVersion: networking.istio.io/v1\nkind: Sidecar\nmetadata: {name: b, namespace: a}\nspec: {egress: [{hosts: ['./*']}]}\n";
        let mut state = SourceState::default();
        for doc in parse_file("t.yaml", yaml) {
            let Document::Valid(o) = doc else { panic!("{doc:?}") };
            state.configs.insert(o.key.clone(), Arc::new(o));
        }
        let snap = Snapshot::build(Version::new(1, 1), ChangeSet::full(), &state);
        let sidecars: Vec<String> = snap.configs_of(Kind::Sidecar).map(|c| c.key.to_string()).collect();
        assert_eq!(sidecars, ["Sidecar a/b", "Sidecar z/a"]);
        assert_eq!(snap.configs_of(Kind::Gateway).count(), 1);
        assert_eq!(snap.configs_of(Kind::VirtualService).count(), 0);
    }
}
