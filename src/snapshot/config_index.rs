//! The snapshot's indexes over config objects, kept by config key so that a change re-indexes only
//! the keys it names: the next snapshot's index is the last one with those keys replaced.

use std::collections::BTreeSet;
use std::marker::PhantomData;
use std::sync::Arc;

use super::delegation::merge_root;
use super::destination_rules::{DestinationRuleIndex, RuleInput};
use crate::config::api::{DestinationRule, VirtualService};
use crate::config::{ConfigKey, ConfigObject, ConfigObjects, Kind, Spec, ValidConfig};
use crate::mesh::MeshConfig;
use crate::registry::{Hostname, Visibility};

/// A config object with its resolved visibility and qualified hosts.
#[derive(Debug, Clone)]
pub struct Indexed<T> {
    /// The object, as translation reads it (a root VirtualService with its delegates merged in).
    pub config: ValidConfig,
    /// Namespaces it is visible to.
    pub visibility: Visibility,
    /// Hosts, qualified with the object's namespace.
    pub hosts: Vec<Hostname>,
    /// The delegate VirtualServices a root names (found or not), which `config` is merged from.
    pub delegates: Vec<ConfigKey>,
    _spec: PhantomData<T>,
}

/// One kind's indexed objects in config key order (kind, namespace, name): a namespace's objects
/// are one contiguous range.
pub(super) type ByKey<T> = imbl::OrdMap<ConfigKey, Arc<Indexed<T>>>;

/// The kinds whose objects some index here reads. A change of another kind leaves it as it was.
const INDEXED_KINDS: [Kind; 5] =
    [Kind::VirtualService, Kind::DestinationRule, Kind::Sidecar, Kind::Gateway, Kind::PeerAuthentication];

/// What a snapshot derives from its config objects, one entry per object.
#[derive(Debug, Clone, Default)]
pub(super) struct ConfigIndex {
    /// VirtualServices with their visibility and hosts.
    pub(super) virtual_services: ByKey<VirtualService>,
    /// DestinationRules with their visibility and hosts.
    pub(super) destination_rules: ByKey<DestinationRule>,
    /// The label keys each selecting object reads (objects reading none are absent).
    selector_keys: imbl::OrdMap<ConfigKey, Arc<[String]>>,
    /// The Secrets each Gateway or DestinationRule names as a credential (others are absent).
    credentials: imbl::OrdMap<ConfigKey, Arc<[String]>>,
    /// The DestinationRules merged and indexed for lookups, rebuilt when one changes.
    pub(super) destination_rule_lookup: Arc<DestinationRuleIndex>,
}

impl ConfigIndex {
    /// Indexes every object of `configs`.
    pub(super) fn full(configs: &ConfigObjects, mesh: &MeshConfig) -> ConfigIndex {
        let mut index = ConfigIndex::default();
        for kind in INDEXED_KINDS {
            for config in of_kind(configs, kind) {
                index.set(&config.key, configs, mesh);
            }
        }
        index.index_destination_rules(mesh);
        index
    }

    /// This index with the objects under `changed` re-indexed as `configs` now holds them
    /// (removed where it holds none). The mesh config must be the one this index was built with.
    pub(super) fn update<'a>(
        &self,
        configs: &ConfigObjects,
        changed: impl Iterator<Item = &'a ConfigKey>,
        mesh: &MeshConfig,
    ) -> ConfigIndex {
        let mut index = self.clone();
        let mut rules_changed = false;
        let mut routes_changed = BTreeSet::new();
        for key in changed.filter(|k| INDEXED_KINDS.contains(&k.kind)) {
            rules_changed |= key.kind == Kind::DestinationRule;
            if key.kind == Kind::VirtualService {
                routes_changed.insert(key.clone());
            }
            index.set(key, configs, mesh);
        }
        // A root merges its delegates' rules: a changed delegate merges its roots again. Builds
        // that change no VirtualService (most: endpoints) skip the scan.
        let roots: Vec<ConfigKey> = index
            .virtual_services
            .iter()
            .take_while(|_| !routes_changed.is_empty())
            .filter(|(key, ix)| {
                !routes_changed.contains(*key) && ix.delegates.iter().any(|d| routes_changed.contains(d))
            })
            .map(|(key, _)| key.clone())
            .collect();
        for root in &roots {
            index.set(root, configs, mesh);
        }
        if rules_changed {
            index.index_destination_rules(mesh);
        }
        index
    }

    /// Merges and indexes every DestinationRule again (a few microseconds per rule).
    fn index_destination_rules(&mut self, mesh: &MeshConfig) {
        let rules = self.destination_rules.iter().filter_map(|(key, ix)| match &ix.config.spec {
            Spec::DestinationRule(rule) => Some(RuleInput { key, host: ix.hosts.first()?, rule }),
            _ => None,
        });
        let index = DestinationRuleIndex::new(rules, &mesh.root_namespace, &mesh.default_destination_rule_export_to);
        self.destination_rule_lookup = Arc::new(index);
    }

    /// Replaces what is indexed under `key` by what `configs` holds there (nothing when absent).
    fn set(&mut self, key: &ConfigKey, configs: &ConfigObjects, mesh: &MeshConfig) {
        self.virtual_services.remove(key);
        self.destination_rules.remove(key);
        self.selector_keys.remove(key);
        self.credentials.remove(key);
        let Some(mut config) = configs.get(key).cloned() else { return };
        let ns = key.namespace.as_str();
        // Short hosts are Kubernetes service names: qualified with the DNS domain, not the trust domain.
        let domain = &mesh.domain;
        match &config.spec {
            // A delegate (no hosts) is read only through its roots.
            Spec::VirtualService(vs) if vs.hosts.is_empty() => {}
            Spec::VirtualService(vs) => {
                let hosts = vs.hosts.iter().map(|h| Hostname::qualify(h, ns, domain)).collect();
                let visibility = Visibility::from_export_to(&vs.export_to, ns, &mesh.default_virtual_service_export_to);
                let mut delegates = Vec::new();
                if let Some(merged) = merge_root(key, vs, configs, mesh) {
                    delegates = merged.delegates;
                    let object = ConfigObject { spec: Spec::VirtualService(merged.spec), ..(*config).clone() };
                    config = Arc::new(object);
                }
                let mut indexed = Indexed::new(&config, visibility, hosts);
                indexed.delegates = delegates;
                self.virtual_services.insert(key.clone(), Arc::new(indexed));
            }
            Spec::DestinationRule(dr) => {
                let hosts = vec![Hostname::qualify(&dr.host, ns, domain)];
                let visibility =
                    Visibility::from_export_to(&dr.export_to, ns, &mesh.default_destination_rule_export_to);
                self.destination_rules.insert(key.clone(), Arc::new(Indexed::new(&config, visibility, hosts)));
            }
            _ => {}
        }
        let keys = selector_keys_of(&config);
        if !keys.is_empty() {
            self.selector_keys.insert(key.clone(), keys.into_iter().collect());
        }
        let secrets = super::credentials::named_secrets(&config);
        if !secrets.is_empty() {
            self.credentials.insert(key.clone(), secrets.into());
        }
    }

    /// Every label key some indexed object's selector reads.
    pub(super) fn selector_keys(&self) -> BTreeSet<String> {
        self.selector_keys.values().flat_map(|keys| keys.iter().cloned()).collect()
    }

    /// The name of every Secret some Gateway or DestinationRule names as a credential.
    pub(super) fn named_secrets(&self) -> BTreeSet<&str> {
        self.credentials.values().flat_map(|names| names.iter().map(String::as_str)).collect()
    }
}

impl<T> Indexed<T> {
    fn new(config: &ValidConfig, visibility: Visibility, hosts: Vec<Hostname>) -> Indexed<T> {
        Indexed { config: config.clone(), visibility, hosts, delegates: Vec::new(), _spec: PhantomData }
    }
}

/// The objects of one kind, in key order: keys order by kind first, so they are one range.
pub(super) fn of_kind(configs: &ConfigObjects, kind: Kind) -> impl Iterator<Item = &ValidConfig> {
    let first = ConfigKey { kind, namespace: String::new(), name: String::new() };
    configs.range(first..).map(|(_, c)| c).take_while(move |c| c.key.kind == kind)
}

/// The label keys one object's selectors read: those of Sidecar workload selectors, Gateway
/// selectors, PeerAuthentication selectors, DestinationRule workload selectors and failover
/// priorities, and VirtualService `sourceLabels` matches (the other
/// security policies' come from the `SecurityIndex`, which also holds rejected policies). A kind
/// that starts selecting proxies by label must add its keys here, or proxies it tells apart would
/// share config.
fn selector_keys_of(config: &ValidConfig) -> BTreeSet<String> {
    let mut keys = BTreeSet::new();
    match &config.spec {
        Spec::Sidecar(s) => keys.extend(s.workload_selector.iter().flat_map(|w| w.match_labels.keys().cloned())),
        Spec::Gateway(g) => keys.extend(g.selector.keys().cloned()),
        Spec::DestinationRule(dr) => {
            keys.extend(dr.workload_selector.iter().flat_map(|w| w.match_labels.keys().cloned()));
            // Failover priorities compare the client's labels with the endpoints'.
            let priorities = dr.load_balancers().filter_map(|lb| lb.locality_lb_setting.as_ref());
            keys.extend(priorities.flat_map(|l| l.failover_priority_keys().map(str::to_string)));
        }
        Spec::PeerAuthentication(pa) => keys.extend(pa.selector_labels().into_iter().flat_map(|l| l.keys().cloned())),
        Spec::VirtualService(vs) => {
            let http = vs.http.iter().flat_map(|r| r.matches.iter().map(|m| &m.source_labels));
            let tls = vs.tls.iter().flat_map(|r| r.matches.iter().map(|m| &m.source_labels));
            let tcp = vs.tcp.iter().flat_map(|r| r.matches.iter().map(|m| &m.source_labels));
            keys.extend(http.chain(tls).chain(tcp).flat_map(|l| l.keys().cloned()));
        }
        _ => {}
    }
    keys
}
