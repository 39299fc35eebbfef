//! Applying source events to the ingest state and building the next snapshot.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use imbl::ordmap::DiffItem;

use crate::config::api::Labels;
use crate::config::{ConfigError, ConfigKey, IgnoredObject, Kind};
use crate::registry::kubernetes::KubeKind;
use crate::registry::{IncrementalRegistry, Registry};
use crate::snapshot::{ChangeSet, ChangedKey, Snapshot, SourceState, Version};
use crate::source::{SourceEvent, SourceId};

/// One config source's rejected and ignored documents.
type SourceStatus = (Arc<Vec<ConfigError>>, Arc<Vec<IgnoredObject>>);

/// Holds the sources' current state and the last snapshot built from it.
#[derive(Debug, Default)]
pub struct SnapshotBuilder {
    state: SourceState,
    /// Each config source's rejected and ignored documents; `state` holds them all.
    statuses: BTreeMap<SourceId, SourceStatus>,
    last: Option<Arc<Snapshot>>,
    /// The registry's indexes across builds: an endpoint change rebuilds only what it reaches.
    registry: IncrementalRegistry,
}

impl SnapshotBuilder {
    /// Applies a batch of source events; returns what they changed (before registry comparison).
    pub fn apply(&mut self, events: Vec<SourceEvent>) -> ChangeSet {
        let mut changes = ChangeSet::default();
        for event in events {
            match event {
                SourceEvent::Config(objects) => {
                    for (key, object) in objects {
                        let old = match &object {
                            Some(obj) => self.state.configs.insert(key.clone(), obj.clone()),
                            None => self.state.configs.remove(&key),
                        };
                        self.registry.config_changed(key.kind, old.as_ref(), object.as_ref());
                        changes.keys.insert(ChangedKey::Config(key));
                    }
                }
                SourceEvent::Kube(objects) => {
                    for (key, object) in objects {
                        let old = match &object {
                            Some(obj) => self.state.kube.insert(key.clone(), obj.clone()),
                            None => self.state.kube.remove(&key),
                        };
                        self.registry.kube_changed(old.as_ref(), object.as_ref());
                        changes.keys.insert(ChangedKey::Kube(key));
                    }
                }
                SourceEvent::Status { source, errors, ignored } => {
                    let before = rejected_policies(&self.state.errors);
                    self.statuses.insert(source, (errors, ignored));
                    let lists = self.statuses.values();
                    self.state.errors = Arc::new(lists.clone().flat_map(|(e, _)| e.iter().cloned()).collect());
                    // A rejected AuthorizationPolicy keeps its scope denied: it coming or going
                    // changes proxy config, though no valid object changed.
                    let after = rejected_policies(&self.state.errors);
                    let flipped = before.symmetric_difference(&after).map(|(k, _)| ChangedKey::Config(k.clone()));
                    changes.keys.extend(flipped);
                    self.state.ignored = Arc::new(lists.flat_map(|(_, i)| i.iter().cloned()).collect());
                }
                SourceEvent::Mesh(mesh) => {
                    if *self.state.mesh != *mesh {
                        self.state.mesh = mesh;
                        self.registry.invalidate();
                        changes.full = true;
                        changes.keys.insert(ChangedKey::Mesh);
                    }
                }
                SourceEvent::InitDone(_) | SourceEvent::Cause(_) => {}
            }
        }
        changes
    }

    /// Builds the snapshot `version` from the current state, classifying `changes` against the
    /// last snapshot. The registry is built once and shared by the classification and the snapshot;
    /// when only EndpointSlices and Pods changed, it is the last one with those endpoints rebuilt.
    pub fn build(&mut self, version: Version, changes: ChangeSet) -> Arc<Snapshot> {
        if changes.full {
            // A new term or resync: rebuild from scratch rather than trust what came before.
            self.registry.invalidate();
        }
        let previous = self.last.as_ref().map(|s| &s.registry);
        let registry = self.registry.build(
            previous,
            self.state.configs.iter().map(|(_, c)| c),
            &self.state.kube,
            &self.state.mesh,
        );
        let changes = match &self.last {
            None => ChangeSet::full(),
            Some(last) => classify(last, changes, &registry),
        };
        let previous = self.last.as_deref();
        let snapshot = Arc::new(Snapshot::build_with_registry(version, changes, &self.state, registry, previous));
        self.last = Some(snapshot.clone());
        snapshot
    }

    /// The last snapshot built.
    pub fn last(&self) -> Option<&Arc<Snapshot>> {
        self.last.as_ref()
    }
}

/// Replaces registry-object changes that left every service definition unchanged by per-host
/// endpoint changes. The push is then counted as Istio's `endpoint` trigger; frontends still
/// regenerate every type, and send only the types whose bytes changed (EDS, here).
///
/// Registry objects are ServiceEntries, WorkloadEntries and every Kubernetes object: a Pod,
/// EndpointSlice, Node (locality) or Namespace (network) change may change endpoints only, and a
/// Service change that leaves the built services equal (an annotation the registry ignores) too.
/// The rejected AuthorizationPolicies among `errors`, with the selector their denial covers.
fn rejected_policies(errors: &[ConfigError]) -> BTreeSet<(ConfigKey, Option<Labels>)> {
    errors
        .iter()
        .filter_map(|e| e.object.as_ref().filter(|k| k.kind == Kind::AuthorizationPolicy).map(|k| (k, e)))
        .map(|(k, e)| (k.clone(), e.policy_selector.clone()))
        .collect()
}

fn classify(last: &Snapshot, mut changes: ChangeSet, new_registry: &Registry) -> ChangeSet {
    if changes.full {
        return changes;
    }
    let registry_keys: Vec<ChangedKey> = changes
        .keys
        .iter()
        .filter(|k| match k {
            ChangedKey::Config(c) => matches!(c.kind, Kind::ServiceEntry | Kind::WorkloadEntry),
            // A Secret (gateway credential) is no registry object: its change must reach SDS.
            ChangedKey::Kube(k) => k.kind != KubeKind::Secret,
            ChangedKey::Endpoints(_) | ChangedKey::Mesh => false,
        })
        .cloned()
        .collect();
    if registry_keys.is_empty() {
        return changes;
    }
    if new_registry.services != last.registry.services {
        return changes;
    }
    // A Pod key stays: the Pod may be a connected proxy's, whose labels and identity come from it
    // (an endpoints-level change all the same, see `ChangeSet::endpoints_only`).
    for key in registry_keys {
        if !matches!(&key, ChangedKey::Kube(k) if k.kind == KubeKind::Pod) {
            changes.keys.remove(&key);
        }
    }
    // The persistent maps' diff skips what both registries share: a one-service change costs its
    // path, not a lookup per service.
    for item in last.registry.endpoints.diff(&new_registry.endpoints) {
        // A removal too: a service's endpoints go with the service, which the comparison above found equal.
        let (DiffItem::Add(key, _) | DiffItem::Update { new: (key, _), .. } | DiffItem::Remove(key, _)) = item;
        changes.keys.insert(ChangedKey::Endpoints(key.hostname.clone()));
    }
    changes
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::parse::{parse_file, Document};
    use crate::config::ValidConfig;
    use crate::mesh::MeshConfig;
    use crate::registry::kubernetes::{
        KubeEndpointSlice, KubeNamespace, KubeObject, KubeObjects, KubePod, KubeService, KubeServicePort, ServiceType,
        SliceEndpoint,
    };
    use crate::registry::Hostname;

    fn objects(yaml: &str) -> SourceEvent {
        SourceEvent::Config(
            parse_file("t.yaml", yaml)
                .into_iter()
                .map(|d| match d {
                    Document::Valid(o) => (o.key.clone(), Some(Arc::new(o) as ValidConfig)),
                    other => panic!("{other:?}"),
                })
                .collect(),
        )
    }

    const SE: &str = "apiVersion: networking.istio.io/v1\nkind: ServiceEntry\nmetadata: {name: se}\nspec: {hosts: [a.example.com], location: MESH_INTERNAL, resolution: STATIC, ports: [{number: 80, name: http}], endpoints: [{address: 10.0.0.1}]}\n";

    #[test]
    fn endpoint_only_edits_are_incremental() {
        let mut b = SnapshotBuilder::default();
        let c = b.apply(vec![objects(SE)]);
        assert!(b.build(Version::new(1, 1), c).changes.full);

        let c = b.apply(vec![objects(&SE.replace("10.0.0.1}]", "10.0.0.1}, {address: 10.0.0.2}]"))]);
        let s = b.build(Version::new(1, 2), c);
        assert!(s.changes.endpoints_only(), "{:?}", s.changes);

        let c = b.apply(vec![objects(&SE.replace("number: 80", "number: 81"))]);
        let s = b.build(Version::new(1, 3), c);
        assert!(!s.changes.endpoints_only(), "{:?}", s.changes);
    }

    #[test]
    fn a_rejected_authorization_policy_coming_or_going_is_a_config_change() {
        let text = "apiVersion: security.istio.io/v1\nkind: AuthorizationPolicy\nmetadata: {name: p, namespace: shop}\nspec: {action: DENY}\n";
        let Some(Document::Invalid(error)) = parse_file("p.yaml", text).into_iter().next() else { panic!("invalid") };
        let key = error.object.clone().expect("key");
        let status = |errors: Vec<ConfigError>| SourceEvent::Status {
            source: crate::source::SourceId::ConfigDir,
            errors: Arc::new(errors),
            ignored: Arc::new(Vec::new()),
        };
        let mut b = SnapshotBuilder::default();
        let c = b.apply(vec![status(vec![error.clone()])]);
        assert!(c.keys.contains(&ChangedKey::Config(key.clone())), "{c:?}");
        assert!(b.apply(vec![status(vec![error])]).is_empty(), "the same rejection again changes nothing");
        let c = b.apply(vec![status(Vec::new())]);
        assert!(c.keys.contains(&ChangedKey::Config(key)), "{c:?}");
    }

    fn kube(object: KubeObject) -> SourceEvent {
        SourceEvent::Kube(vec![(object.key(), Some(Arc::new(object)))])
    }

    fn service(port: u16) -> KubeObject {
        KubeObject::Service(KubeService {
            name: "a".into(),
            namespace: "shop".into(),
            labels: Default::default(),
            selector: Some([("app".to_string(), "a".to_string())].into()),
            service_type: ServiceType::ClusterIp,
            cluster_ips: vec!["10.96.0.1".into()],
            headless: false,
            external_name: None,
            ports: vec![KubeServicePort {
                name: "http".into(),
                port,
                protocol: "TCP".into(),
                app_protocol: None,
                target_port: None,
            }],
            export_to: Vec::new(),
        })
    }

    fn slice(addresses: &[&str]) -> KubeObject {
        KubeObject::EndpointSlice(KubeEndpointSlice {
            name: "a-1".into(),
            namespace: "shop".into(),
            service_name: "a".into(),
            address_type: "IPv4".into(),
            ports: Vec::new(),
            endpoints: addresses
                .iter()
                .map(|a| SliceEndpoint {
                    addresses: vec![a.to_string()],
                    ready: Some(true),
                    serving: None,
                    terminating: None,
                    pod: None,
                    node_name: None,
                })
                .collect(),
        })
    }

    fn pod(version: &str) -> KubeObject {
        KubeObject::Pod(KubePod {
            name: "a-0".into(),
            namespace: "shop".into(),
            labels: Arc::new(
                [("app".to_string(), "a".to_string()), ("version".to_string(), version.to_string())].into(),
            ),
            service_account: "default".into(),
            ips: vec!["10.0.0.1".into()],
            node_name: "n1".into(),
            ready: true,
            terminating: false,
            named_ports: Default::default(),
        })
    }

    /// Stands in for the registry built from the Kubernetes objects (that code lives elsewhere):
    /// the same services and endpoints, expressed as a ServiceEntry.
    fn registry(se: &str) -> Registry {
        let SourceEvent::Config(objects) = objects(se) else { unreachable!() };
        let configs: Vec<ValidConfig> = objects.into_iter().filter_map(|(_, o)| o).collect();
        crate::registry::build_registry(configs.iter(), &KubeObjects::new(), &MeshConfig::default())
    }

    #[test]
    fn kubernetes_objects_are_kept_and_deleted() {
        let mut b = SnapshotBuilder::default();
        let c = b.apply(vec![kube(service(80)), kube(slice(&["10.0.0.1"])), kube(pod("v1"))]);
        assert_eq!(c.keys.len(), 3);
        assert!(c.keys.contains(&ChangedKey::Kube(pod("v1").key())));
        let s = b.build(Version::new(1, 1), c);
        assert_eq!(s.kube.len(), 3);
        assert_eq!(*s.kube[&service(80).key()], service(80));

        let c = b.apply(vec![SourceEvent::Kube(vec![(pod("v1").key(), None)])]);
        assert_eq!(c.keys.iter().collect::<Vec<_>>(), [&ChangedKey::Kube(pod("v1").key())]);
        let s2 = b.build(Version::new(1, 2), c);
        assert!(!s2.kube.contains_key(&pod("v1").key()));
        // Untouched objects stay shared between snapshots (replication skips them by pointer).
        assert!(Arc::ptr_eq(&s.kube[&service(80).key()], &s2.kube[&service(80).key()]));
    }

    #[test]
    fn kubernetes_changes_that_keep_services_equal_are_endpoints_only() {
        let mut b = SnapshotBuilder::default();
        let c = b.apply(vec![kube(service(80)), kube(slice(&["10.0.0.1"])), kube(pod("v1"))]);
        b.build(Version::new(1, 1), c);
        let last = Snapshot::build_with_registry(Version::new(1, 1), ChangeSet::full(), &b.state, registry(SE), None);
        let host = ChangedKey::Endpoints(Hostname::new("a.example.com"));
        let two_endpoints = registry(&SE.replace("10.0.0.1}]", "10.0.0.1}, {address: 10.0.0.2}]"));

        // A pod label change, a slice change, a namespace or node change (network, locality):
        // the services stay equal, the endpoints change.
        let namespace = KubeObject::Namespace(KubeNamespace { name: "shop".into(), labels: Default::default() });
        for event in [kube(pod("v2")), kube(slice(&["10.0.0.1", "10.0.0.2"])), kube(namespace)] {
            let c = b.apply(vec![event]);
            let classified = classify(&last, c, &two_endpoints);
            assert!(classified.endpoints_only(), "{classified:?}");
            let pods: Vec<&ChangedKey> = classified
                .keys
                .iter()
                .filter(|k| matches!(k, ChangedKey::Kube(k) if k.kind == KubeKind::Pod))
                .collect();
            assert!(classified.keys.contains(&host), "{classified:?}");
            assert_eq!(classified.keys.len(), 1 + pods.len(), "{classified:?}");
        }

        // A Service port change changes the service: the Kubernetes key stays.
        let c = b.apply(vec![kube(service(81))]);
        let classified = classify(&last, c.clone(), &registry(&SE.replace("number: 80", "number: 81")));
        assert!(!classified.endpoints_only(), "{classified:?}");
        assert_eq!(classified, c);
        assert!(c.keys.contains(&ChangedKey::Kube(service(81).key())));
    }
}
