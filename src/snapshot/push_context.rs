//! The snapshot: an immutable, indexed view of the whole mesh at one version (Istio's PushContext).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, OnceLock};
use std::time::SystemTime;

use super::config_index::{of_kind, ConfigIndex, Indexed};
use super::credentials::{credential_problem, secret_key};
use super::destination_rules::Direction;
use super::ext_authz::ResolvedProvider;
use super::security::SecurityIndex;
use super::{ChangeSet, ChangedKey, Version};
use crate::config::api::gateway::ServerTlsSettings;
use crate::config::api::{DestinationRule, Gateway, Labels, Sidecar, VirtualService};
use crate::config::{ConfigError, ConfigKey, ConfigObjects, IgnoredObject, Kind, Spec, ValidConfig};
use crate::mesh::MeshConfig;
use crate::registry::kubernetes::{KubeKind, KubeObject, KubeObjects, KubeSecret};
use crate::registry::{
    Endpoint, Endpoints, Hostname, InstanceIndex, NamespaceScope, Registry, Resolution, Service, ServiceKey,
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
    /// The namespaces in discovery scope: config outside them is left out.
    scope: NamespaceScope,
    /// VirtualServices, DestinationRules, selectors and credentials by config key.
    index: ConfigIndex,
    /// Label keys some selector reads; a proxy's other labels cannot change its config.
    selector_keys: BTreeSet<String>,
    /// AuthorizationPolicies and RequestAuthentications by scope (rejected policies included).
    pub security: Arc<SecurityIndex>,
    /// Endpoints by IP, built on the first inbound lookup (only frontends serving sidecars need it).
    instances: OnceLock<InstanceIndex>,
    /// Aliases (ExternalName Services) by the concrete host they resolve to, built on first use.
    aliases: OnceLock<BTreeMap<Hostname, Vec<Hostname>>>,
}

impl Snapshot {
    /// Builds a snapshot from the sources' state, from scratch: the reference build that
    /// `SnapshotBuilder`'s incremental one must equal.
    pub fn build(version: Version, changes: ChangeSet, state: &SourceState) -> Snapshot {
        let registry = crate::registry::build_registry(state.configs.iter().map(|(_, c)| c), &state.kube, &state.mesh);
        Snapshot::build_with_registry(version, changes, state, registry, None)
    }

    /// Builds a snapshot from the sources' state and the registry already built from that state.
    /// With `previous`, the snapshot `changes` are relative to, only the config objects `changes`
    /// names are indexed again (unless the mesh config or the discovery scope changed).
    pub fn build_with_registry(
        version: Version,
        changes: ChangeSet,
        state: &SourceState,
        registry: Registry,
        previous: Option<&Snapshot>,
    ) -> Snapshot {
        let mesh = state.mesh.clone();
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
        let same_mesh = |p: &Snapshot| Arc::ptr_eq(&p.mesh, &mesh) || *p.mesh == *mesh;
        let previous = previous.filter(|p| !changes.full && same_mesh(p) && p.scope == scope);
        let changed_configs = || {
            changes.keys.iter().filter_map(|k| match k {
                ChangedKey::Config(c) => Some(c),
                _ => None,
            })
        };
        let index = match previous {
            Some(p) => p.index.update(&configs, changed_configs(), &mesh),
            None => ConfigIndex::full(&configs, &mesh),
        };
        let security_kinds = [Kind::AuthorizationPolicy, Kind::RequestAuthentication];
        let security = match previous {
            Some(p)
                if !changed_configs().any(|k| security_kinds.contains(&k.kind))
                    && rejected_authorization(&p.errors).eq(rejected_authorization(&state.errors)) =>
            {
                p.security.clone()
            }
            _ => {
                let policies = security_kinds.into_iter().flat_map(|kind| of_kind(&configs, kind));
                let in_force = |k: &ConfigKey| configs.contains_key(k);
                Arc::new(SecurityIndex::build(&mesh.root_namespace, policies, &state.errors, in_force))
            }
        };
        let mut selector_keys = index.selector_keys();
        selector_keys.extend(security.selector_keys().cloned());
        let mesh_priorities = mesh.locality_lb_setting.iter().flat_map(|l| l.failover_priority_keys());
        selector_keys.extend(mesh_priorities.map(str::to_string));
        let kube = super::credentials::keep_referenced(&state.kube, &index.named_secrets());
        // A frontend's state carries the leader's errors, these included: never twice.
        let mut derived_errors = super::credentials::credential_errors(&kube, of_kind(&configs, Kind::Gateway));
        derived_errors.extend(super::ext_authz::provider_errors(
            of_kind(&configs, Kind::AuthorizationPolicy),
            &mesh,
            &registry,
        ));
        derived_errors.retain(|e| !state.errors.contains(e));
        let errors = if derived_errors.is_empty() {
            state.errors.clone()
        } else {
            Arc::new(state.errors.iter().cloned().chain(derived_errors).collect())
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
            scope,
            index,
            selector_keys,
            security,
            instances: OnceLock::new(),
            aliases: OnceLock::new(),
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
        // One contiguous range, found in O(log n) (generators look kinds up per proxy and per cluster).
        of_kind(&self.configs, kind)
    }

    /// Services a proxy in `namespace` can see, one per hostname (its own namespace's declaration
    /// first, then the first exported one), in hostname order.
    pub fn services_visible_to(&self, namespace: &str) -> Vec<&Arc<Service>> {
        let mut by_host: BTreeMap<&Hostname, &Arc<Service>> = BTreeMap::new();
        for (key, svc) in &self.registry.services {
            if !svc.visibility.visible_to(namespace) && svc.namespace != namespace {
                continue;
            }
            // An alias gets no listener, cluster or virtual host of its own: its names join the
            // concrete service's virtual hosts (`aliases_of`).
            if svc.resolution == Resolution::Alias {
                continue;
            }
            let entry = by_host.entry(&key.hostname).or_insert(svc);
            if svc.namespace == namespace {
                *entry = svc;
            }
        }
        by_host.into_values().collect()
    }

    /// The aliases that resolve to `host`, through chains of aliases (a loop resolves to
    /// nothing, as DNS would answer it), sorted.
    pub fn aliases_of(&self, host: &Hostname) -> &[Hostname] {
        let aliases = self.aliases.get_or_init(|| {
            let targets: BTreeMap<&Hostname, &Hostname> = self
                .registry
                .services
                .iter()
                .filter_map(|(key, s)| Some((&key.hostname, s.alias_of.as_ref()?)))
                .collect();
            let mut out: BTreeMap<Hostname, Vec<Hostname>> = BTreeMap::new();
            for (alias, first) in &targets {
                let mut concrete = *first;
                let mut seen = BTreeSet::from([*alias]);
                while let Some(next) = targets.get(concrete) {
                    if !seen.insert(concrete) {
                        break;
                    }
                    concrete = next;
                }
                if !targets.contains_key(concrete) {
                    out.entry(concrete.clone()).or_default().push((*alias).clone());
                }
            }
            out
        });
        aliases.get(host).map(Vec::as_slice).unwrap_or_default()
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
        self.index
            .virtual_services
            .values()
            .map(|ix| &**ix)
            .filter(|ix| ix.visibility.visible_to(namespace) || ix.config.key.namespace == namespace)
            .filter_map(|ix| match &ix.config.spec {
                Spec::VirtualService(vs) => Some((ix, vs)),
                _ => None,
            })
            .filter(|(ix, vs)| vs_applies_to_gateway(vs, &ix.config.key.namespace, gateway))
            .collect()
    }

    /// The VirtualService `key` as translation reads it: a root with its delegates merged in, a
    /// delegate as written.
    pub fn virtual_service(&self, key: &ConfigKey) -> Option<&VirtualService> {
        let config = match self.index.virtual_services.get(key) {
            Some(ix) => &ix.config,
            None => self.configs.get(key)?,
        };
        match &config.spec {
            Spec::VirtualService(vs) => Some(vs),
            _ => None,
        }
    }

    /// The qualified hosts of the DestinationRule `key`, if this snapshot holds it.
    pub fn destination_rule_hosts(&self, key: &ConfigKey) -> Option<&[Hostname]> {
        self.index.destination_rules.get(key).map(|ix| ix.hosts.as_slice())
    }

    /// The DestinationRule a proxy in `namespace` with `labels` applies to `service`'s traffic in
    /// `direction`, as istiod picks it (see `destination_rules`): the rules for its host merged, the
    /// proxy's namespace first, then the service's, then the root namespace.
    pub fn destination_rule_for(
        &self,
        namespace: &str,
        labels: &Labels,
        service: &Service,
        direction: Direction,
    ) -> Option<&DestinationRule> {
        let merged = self.index.destination_rule_lookup.rule_for(namespace, labels, service, direction)?;
        Some(&merged.rule)
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

/// The rejected AuthorizationPolicies among `errors` (the security index denies their scope).
/// Unresolved providers are left out: they are derived from the snapshot itself (translation
/// denies those policies' scopes), so comparing them would rebuild the index at every snapshot.
fn rejected_authorization(errors: &[ConfigError]) -> impl Iterator<Item = &ConfigError> {
    errors.iter().filter(|e| {
        e.file != super::ext_authz::SOURCE && e.object.as_ref().is_some_and(|k| k.kind == Kind::AuthorizationPolicy)
    })
}

/// The extension providers of CUSTOM AuthorizationPolicies (the rules are in [`super::ext_authz`]).
impl Snapshot {
    /// The provider `name` of a CUSTOM policy resolved against the mesh config and the registry;
    /// the error says why it cannot be used.
    pub fn ext_authz_provider(&self, name: &str) -> Result<ResolvedProvider<'_>, String> {
        super::ext_authz::resolve(&self.mesh, &self.registry, name)
    }
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

/// The gateway credentials a snapshot holds (the rules are in [`super::credentials`]).
impl Snapshot {
    /// Whether a Gateway server's `credentialName` can be served to gateways of `namespace`.
    pub fn credential_ready(&self, namespace: &str, tls: &ServerTlsSettings) -> bool {
        credential_problem(&self.kube, namespace, tls).is_none()
    }

    /// The credential Secrets of `namespace` (what gateway proxies there may be sent).
    pub fn credentials_in<'a>(&'a self, namespace: &'a str) -> impl Iterator<Item = &'a KubeSecret> + 'a {
        let first = secret_key(namespace, "");
        self.kube
            .range(first..)
            .take_while(move |(k, _)| k.kind == KubeKind::Secret && k.namespace == namespace)
            .filter_map(|(_, o)| match &**o {
                KubeObject::Secret(s) => Some(s),
                _ => None,
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::parse::{parse_file, Document};

    /// A snapshot of `yaml`'s valid objects.
    fn snapshot_of(yaml: &str) -> Snapshot {
        let mut state = SourceState::default();
        for doc in parse_file("t.yaml", yaml) {
            let Document::Valid(o) = doc else { panic!("{doc:?}") };
            state.configs.insert(o.key.clone(), Arc::new(o));
        }
        Snapshot::build(Version::new(1, 1), ChangeSet::full(), &state)
    }

    fn rule(ns: &str, name: &str, spec: &str) -> String {
        format!("apiVersion: networking.istio.io/v1\nkind: DestinationRule\nmetadata: {{name: {name}, namespace: {ns}}}\nspec: {spec}\n---\n")
    }

    const SERVICE: &str = "apiVersion: networking.istio.io/v1\nkind: ServiceEntry\nmetadata: {name: svc, namespace: shop}\nspec: {hosts: [svc.shop.svc.cluster.local], ports: [{number: 80, name: http}], resolution: STATIC, endpoints: [{address: 10.0.0.1}]}\n---\n";

    /// The subset names and load balancer of the rule a proxy in `ns` with `labels` applies.
    fn applied(s: &Snapshot, ns: &str, labels: &[(&str, &str)], direction: Direction) -> Option<(Vec<String>, String)> {
        let service = s.registry.services.values().find(|svc| svc.hostname.as_str() == "svc.shop.svc.cluster.local")?;
        let labels: Labels = labels.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        let rule = s.destination_rule_for(ns, &labels, service, direction)?;
        let subsets = rule.subsets.iter().map(|s| s.name.clone()).collect();
        let lb =
            rule.traffic_policy.as_ref().and_then(|p| p.load_balancer.as_ref()).map(|lb| format!("{:?}", lb.simple));
        Some((subsets, lb.unwrap_or_default()))
    }

    #[test]
    fn rules_of_one_host_in_one_namespace_merge_subsets_and_keep_the_first_traffic_policy() {
        let yaml = [
            SERVICE,
            &rule("shop", "a", "{host: svc, subsets: [{name: v1, labels: {v: '1'}}]}"),
            &rule("shop", "b", "{host: svc, trafficPolicy: {loadBalancer: {simple: RANDOM}}, subsets: [{name: v2, labels: {v: '2'}}, {name: v1, labels: {v: x}}]}"),
            &rule("shop", "c", "{host: svc, trafficPolicy: {loadBalancer: {simple: ROUND_ROBIN}}}"),
        ]
        .concat();
        let s = snapshot_of(&yaml);
        let (subsets, lb) = applied(&s, "shop", &[], Direction::Outbound).expect("a merged rule");
        assert_eq!(subsets, ["v1", "v2"], "b's v1 is a duplicate");
        assert!(lb.contains("Random"), "the first rule with a policy (by name): {lb}");
        assert!(applied(&s, "elsewhere", &[], Direction::Outbound).is_some(), "exported to every namespace");
    }

    #[test]
    fn a_root_namespace_proxy_looks_in_the_services_namespace_before_the_root_namespaces_public_rules() {
        let yaml = [
            SERVICE,
            &rule("istio-system", "root", "{host: '*.local', trafficPolicy: {loadBalancer: {simple: RANDOM}}}"),
            &rule("shop", "own", "{host: svc, trafficPolicy: {loadBalancer: {simple: ROUND_ROBIN}}}"),
        ]
        .concat();
        let s = snapshot_of(&yaml);
        let (_, lb) = applied(&s, "istio-system", &[], Direction::Outbound).expect("a rule");
        assert!(lb.contains("RoundRobin"), "the service's namespace first: {lb}");
        // A private rule in the root namespace is that namespace's own, and comes first there.
        let private = rule(
            "istio-system",
            "mine",
            "{host: '*.local', exportTo: ['.'], trafficPolicy: {loadBalancer: {simple: LEAST_REQUEST}}}",
        );
        let s = snapshot_of(&format!("{yaml}{private}"));
        let (_, lb) = applied(&s, "istio-system", &[], Direction::Outbound).expect("a rule");
        assert!(lb.contains("LeastRequest"), "{lb}");
        let (_, lb) = applied(&s, "web", &[], Direction::Outbound).expect("a rule");
        assert!(lb.contains("RoundRobin"), "{lb}");
    }

    #[test]
    fn a_private_rule_hides_nothing_from_other_namespaces_which_fall_back_to_the_root() {
        let yaml = [
            SERVICE,
            &rule("istio-system", "root", "{host: '*.local', trafficPolicy: {loadBalancer: {simple: RANDOM}}}"),
            &rule("shop", "own", "{host: svc, exportTo: ['.'], trafficPolicy: {loadBalancer: {simple: ROUND_ROBIN}}}"),
        ]
        .concat();
        let s = snapshot_of(&yaml);
        assert!(applied(&s, "shop", &[], Direction::Outbound).expect("own").1.contains("RoundRobin"));
        assert!(applied(&s, "web", &[], Direction::Outbound).expect("root").1.contains("Random"));
    }

    #[test]
    fn a_rule_with_a_workload_selector_applies_to_its_workloads_outbound_only() {
        let yaml = [
            SERVICE,
            &rule("web", "all", "{host: svc.shop.svc.cluster.local, trafficPolicy: {loadBalancer: {simple: RANDOM}}}"),
            &rule("web", "canary", "{host: svc.shop.svc.cluster.local, workloadSelector: {matchLabels: {app: canary}}, trafficPolicy: {loadBalancer: {simple: ROUND_ROBIN}}}"),
        ]
        .concat();
        let s = snapshot_of(&yaml);
        let canary = [("app", "canary"), ("v", "2")];
        assert!(applied(&s, "web", &canary, Direction::Outbound).expect("selected").1.contains("RoundRobin"));
        assert!(applied(&s, "web", &[("app", "web")], Direction::Outbound).expect("catch-all").1.contains("Random"));
        assert!(applied(&s, "web", &canary, Direction::Inbound).expect("catch-all").1.contains("Random"));
        // Rules of a namespace that is neither the proxy's, the service's nor the root reach nobody.
        assert!(applied(&s, "other", &canary, Direction::Outbound).is_none());
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

    /// A build after `previous` that re-indexes only the changed keys gives what a build from
    /// scratch gives, and shares the entries of the objects no change named.
    #[test]
    fn re_indexing_only_the_changed_keys_gives_what_a_full_build_gives() {
        fn doc(kind: &str, ns: &str, name: &str, spec: &str) -> String {
            let api = if kind == "AuthorizationPolicy" { "security.istio.io/v1" } else { "networking.istio.io/v1" };
            format!("apiVersion: {api}\nkind: {kind}\nmetadata: {{name: {name}, namespace: {ns}}}\nspec: {spec}\n")
        }
        fn vs(name: &str, weight: u32, source: &str) -> String {
            let route = format!(
                "[{{destination: {{host: {name}}}, weight: {weight}}}, {{destination: {{host: other}}, weight: {}}}]",
                100 - weight
            );
            doc(
                "VirtualService",
                "shop",
                name,
                &format!("{{hosts: [{name}], http: [{{match: [{{sourceLabels: {{{source}: x}}}}], route: {route}}}]}}"),
            )
        }
        fn gateway(credential: &str) -> String {
            let tls = format!("{{mode: SIMPLE, credentialName: {credential}}}");
            doc("Gateway", "shop", "gw", &format!("{{selector: {{istio: ingressgateway}}, servers: [{{port: {{number: 443, name: https, protocol: HTTPS}}, hosts: ['*'], tls: {tls}}}]}}"))
        }
        fn put(state: &mut SourceState, yaml: &str) -> ConfigKey {
            let Some(Document::Valid(o)) = parse_file("t.yaml", yaml).into_iter().next() else { panic!("{yaml}") };
            let key = o.key.clone();
            state.configs.insert(key.clone(), Arc::new(o));
            key
        }
        let mut state = SourceState::default();
        for name in ["a", "b", "c"] {
            put(&mut state, &vs(name, 90, "app"));
        }
        let rule = put(
            &mut state,
            &doc("DestinationRule", "shop", "r", "{host: a, subsets: [{name: v1, labels: {version: v1}}]}"),
        );
        // A root whose rule delegates to `d` (not there yet): the delegate's edits merge it again.
        put(
            &mut state,
            &doc(
                "VirtualService",
                "shop",
                "root",
                "{hosts: [root], http: [{match: [{uri: {prefix: /r}}], delegate: {name: d}}]}",
            ),
        );
        let delegate = |source: &str| {
            doc("VirtualService", "shop", "d", &format!("{{http: [{{match: [{{uri: {{prefix: /r/x}}, sourceLabels: {{{source}: z1}}}}], route: [{{destination: {{host: b}}}}]}}]}}"))
        };
        put(&mut state, &gateway("cert-1"));
        put(
            &mut state,
            &doc("Sidecar", "shop", "s", "{workloadSelector: {labels: {tier: web}}, egress: [{hosts: ['./*']}]}"),
        );
        let derived =
            |s: &Snapshot| format!("{:?} {:?} {:?} {:?} {:?}", s.index, s.selector_keys, s.security, s.kube, s.errors);
        let mut previous = Snapshot::build(Version::new(1, 1), ChangeSet::full(), &state);

        type Edit = Box<dyn Fn(&mut SourceState) -> ConfigKey>;
        let edits: Vec<Edit> = vec![
            Box::new(move |s| put(s, &vs("b", 50, "app"))),
            Box::new(move |s| put(s, &vs("c", 90, "team"))),
            // The rule leaves host a for b: a must not keep it.
            Box::new(move |s| {
                put(s, &doc("DestinationRule", "shop", "r", "{host: b, subsets: [{name: v1, labels: {version: v1}}]}"))
            }),
            Box::new(move |s| {
                s.configs.remove(&rule);
                rule.clone()
            }),
            Box::new(move |s| put(s, &gateway("cert-2"))),
            Box::new(move |s| put(s, &delegate("role"))),
            Box::new(move |s| put(s, &delegate("rack"))),
            Box::new(move |s| {
                let key = put(s, &delegate("rack"));
                s.configs.remove(&key);
                key
            }),
            Box::new(move |s| {
                put(
                    s,
                    &doc(
                        "AuthorizationPolicy",
                        "shop",
                        "p",
                        "{selector: {matchLabels: {role: db}}, action: DENY, rules: [{}]}",
                    ),
                )
            }),
        ];
        for (i, edit) in edits.iter().enumerate() {
            let key = edit(&mut state);
            let version = Version::new(1, i as u64 + 2);
            let changes = ChangeSet { full: false, keys: [ChangedKey::Config(key.clone())].into() };
            let registry =
                crate::registry::build_registry(state.configs.iter().map(|(_, c)| c), &state.kube, &state.mesh);
            let next = Snapshot::build_with_registry(version, changes, &state, registry, Some(&previous));
            let full = Snapshot::build(version, ChangeSet::full(), &state);
            assert_eq!(derived(&next), derived(&full), "edit of {key}");
            let untouched = ConfigKey { kind: Kind::VirtualService, namespace: "shop".into(), name: "a".into() };
            assert!(Arc::ptr_eq(
                &previous.index.virtual_services[&untouched],
                &next.index.virtual_services[&untouched]
            ));
            previous = next;
        }
        let keys = ["app", "istio", "role", "team", "tier"].map(String::from);
        assert_eq!(previous.selector_keys, keys.into());
        assert_eq!(previous.index.named_secrets(), ["cert-2", "cert-2-cacert"].into());
    }
}
