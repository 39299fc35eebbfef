//! The one snapshot builder. The ingest leader feeds it source events, a frontend the objects a
//! replicated update carries; both build through the same incremental path, so they agree by
//! construction: an endpoint change rebuilds only the services it reaches, on either side.

use std::sync::Arc;

use imbl::ordmap::DiffItem;

use super::changes::{ChangeSet, ChangedKey};
use super::push_context::{Snapshot, SourceState};
use super::version::Version;
use crate::config::{ConfigError, ConfigKey, IgnoredObject, Kind, ValidConfig};
use crate::mesh::MeshConfig;
use crate::registry::kubernetes::{KubeKey, KubeKind, KubeObject};
use crate::registry::{IncrementalRegistry, Registry};

/// The sources' state, the last snapshot built from it, and the registry's indexes across builds.
/// One owner: it moves to the blocking pool for a build and back.
#[derive(Debug, Default)]
pub struct SnapshotBuilder {
    state: SourceState,
    last: Option<Arc<Snapshot>>,
    registry: IncrementalRegistry,
}

impl SnapshotBuilder {
    /// A builder that goes on from `snapshot` (the one a frontend serves): its state, and its
    /// registry as the base of the next build (a full registry build, which indexes it again).
    pub fn resume(snapshot: Arc<Snapshot>) -> SnapshotBuilder {
        let mut registry = IncrementalRegistry::default();
        for object in snapshot.kube.values() {
            registry.kube_changed(None, Some(object));
        }
        registry.invalidate();
        let state = SourceState {
            configs: snapshot.configs.clone(),
            errors: snapshot.errors.clone(),
            ignored: snapshot.ignored.clone(),
            mesh: snapshot.mesh.clone(),
            kube: snapshot.kube.clone(),
        };
        SnapshotBuilder { state, last: Some(snapshot), registry }
    }

    /// The sources' state as applied so far.
    pub fn state(&self) -> &SourceState {
        &self.state
    }

    /// The last snapshot built (or resumed from).
    pub fn last(&self) -> Option<&Arc<Snapshot>> {
        self.last.as_ref()
    }

    /// Sets (`Some`) or removes (`None`) a config object.
    pub fn set_config(&mut self, key: ConfigKey, object: Option<ValidConfig>) {
        let old = match &object {
            Some(obj) => self.state.configs.insert(key.clone(), obj.clone()),
            None => self.state.configs.remove(&key),
        };
        self.registry.config_changed(key.kind, old.as_ref(), object.as_ref());
    }

    /// Sets (`Some`) or removes (`None`) a Kubernetes registry object.
    pub fn set_kube(&mut self, key: KubeKey, object: Option<Arc<KubeObject>>) {
        let old = match &object {
            Some(obj) => self.state.kube.insert(key, obj.clone()),
            None => self.state.kube.remove(&key),
        };
        self.registry.kube_changed(old.as_ref(), object.as_ref());
    }

    /// Sets the mesh config; whether it changed (then every service is built again).
    pub fn set_mesh(&mut self, mesh: Arc<MeshConfig>) -> bool {
        if *self.state.mesh == *mesh {
            return false;
        }
        self.state.mesh = mesh;
        self.registry.invalidate();
        true
    }

    /// Sets the rejected documents.
    pub fn set_errors(&mut self, errors: Arc<Vec<ConfigError>>) {
        self.state.errors = errors;
    }

    /// Sets the documents of kinds meshpilot does not serve.
    pub fn set_ignored(&mut self, ignored: Arc<Vec<IgnoredObject>>) {
        self.state.ignored = ignored;
    }

    /// Replaces the whole state with `new` (a full update), object by object; returns what
    /// changed. Equal values keep the held `Arc`s, so caches keyed by them stay warm (a failover
    /// to a leader with identical config changes nothing).
    pub fn replace(&mut self, new: SourceState) -> ChangeSet {
        let mut changes = ChangeSet::default();
        for (key, object) in changed_entries(&self.state.configs, &new.configs) {
            self.set_config(key.clone(), object);
            changes.keys.insert(ChangedKey::Config(key));
        }
        for (key, object) in changed_entries(&self.state.kube, &new.kube) {
            self.set_kube(key.clone(), object);
            changes.keys.insert(ChangedKey::Kube(key));
        }
        if self.set_mesh(new.mesh) {
            changes.full = true;
            changes.keys.insert(ChangedKey::Mesh);
        }
        if self.state.errors != new.errors {
            self.state.errors = new.errors;
        }
        if self.state.ignored != new.ignored {
            self.state.ignored = new.ignored;
        }
        changes
    }

    /// Builds the snapshot `version` from the current state, classifying `changes` against the
    /// last snapshot. The registry is built once and shared by the classification and the
    /// snapshot; when only EndpointSlices, Pods and self-contained entries changed, it is the
    /// last one with what they reach rebuilt.
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
}

/// The entries of `new` that differ from `old`'s (`Some`: added or changed), and `old`'s keys
/// `new` lacks (`None`). The persistent maps' diff skips the subtrees both share.
fn changed_entries<K: Ord + Clone, V: PartialEq>(
    old: &imbl::OrdMap<K, Arc<V>>,
    new: &imbl::OrdMap<K, Arc<V>>,
) -> Vec<(K, Option<Arc<V>>)> {
    let mut changed = Vec::new();
    for item in old.diff(new) {
        match item {
            DiffItem::Add(key, obj) => changed.push((key.clone(), Some(obj.clone()))),
            DiffItem::Update { old: (_, held), new: (key, obj) } if held != obj => {
                changed.push((key.clone(), Some(obj.clone())))
            }
            DiffItem::Update { .. } => {}
            DiffItem::Remove(key, _) => changed.push((key.clone(), None)),
        }
    }
    changed
}

/// Replaces registry-object changes that left every service definition unchanged by per-host
/// endpoint changes. The push is then counted as Istio's `endpoint` trigger.
///
/// Registry objects are ServiceEntries, WorkloadEntries and every Kubernetes object: a Pod,
/// EndpointSlice, Node (locality) or Namespace (network) change may change endpoints only, and a
/// Service change that leaves the built services equal (an annotation the registry ignores) too.
/// Applied to a change set it produced, it gives the same set: a frontend classifying what the
/// leader classified agrees with it.
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
    use crate::registry::kubernetes::{
        KubeEndpointSlice, KubeNamespace, KubeObjects, KubePod, KubeService, KubeServicePort, ServiceType,
        SliceEndpoint,
    };
    use crate::registry::Hostname;

    const SE: &str = "apiVersion: networking.istio.io/v1\nkind: ServiceEntry\nmetadata: {name: se}\nspec: {hosts: [a.example.com], location: MESH_INTERNAL, resolution: STATIC, ports: [{number: 80, name: http}], endpoints: [{address: 10.0.0.1}]}\n";

    fn configs(yaml: &str) -> Vec<ValidConfig> {
        let valid = parse_file("t.yaml", yaml).into_iter().map(|d| match d {
            Document::Valid(o) => Arc::new(o) as ValidConfig,
            other => panic!("{other:?}"),
        });
        valid.collect()
    }

    fn set_configs(b: &mut SnapshotBuilder, yaml: &str) -> ChangeSet {
        let mut changes = ChangeSet::default();
        for c in configs(yaml) {
            changes.keys.insert(ChangedKey::Config(c.key.clone()));
            b.set_config(c.key.clone(), Some(c));
        }
        changes
    }

    fn set_kube(b: &mut SnapshotBuilder, objects: Vec<KubeObject>) -> ChangeSet {
        let mut changes = ChangeSet::default();
        for object in objects {
            changes.keys.insert(ChangedKey::Kube(object.key()));
            b.set_kube(object.key(), Some(Arc::new(object)));
        }
        changes
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

    /// Stands in for the registry built from the Kubernetes objects: the same services and
    /// endpoints, expressed as a ServiceEntry.
    fn registry(se: &str) -> Registry {
        crate::registry::build_registry(configs(se).iter(), &KubeObjects::new(), &MeshConfig::default())
    }

    #[test]
    fn endpoint_only_edits_are_incremental() {
        let mut b = SnapshotBuilder::default();
        let c = set_configs(&mut b, SE);
        assert!(b.build(Version::new(1, 1), c).changes.full);
        let c = set_configs(&mut b, &SE.replace("10.0.0.1}]", "10.0.0.1}, {address: 10.0.0.2}]"));
        let s = b.build(Version::new(1, 2), c);
        assert!(s.changes.endpoints_only(), "{:?}", s.changes);
        let c = set_configs(&mut b, &SE.replace("number: 80", "number: 81"));
        let s = b.build(Version::new(1, 3), c);
        assert!(!s.changes.endpoints_only(), "{:?}", s.changes);
    }

    #[test]
    fn kubernetes_changes_that_keep_services_equal_are_endpoints_only() {
        let mut b = SnapshotBuilder::default();
        let c = set_kube(&mut b, vec![service(80), slice(&["10.0.0.1"]), pod("v1")]);
        b.build(Version::new(1, 1), c);
        let last = Snapshot::build_with_registry(Version::new(1, 1), ChangeSet::full(), &b.state, registry(SE), None);
        let host = ChangedKey::Endpoints(Hostname::new("a.example.com"));
        let two_endpoints = registry(&SE.replace("10.0.0.1}]", "10.0.0.1}, {address: 10.0.0.2}]"));

        // A pod label change, a slice change, a namespace or node change (network, locality):
        // the services stay equal, the endpoints change.
        let namespace = KubeObject::Namespace(KubeNamespace { name: "shop".into(), labels: Default::default() });
        for object in [pod("v2"), slice(&["10.0.0.1", "10.0.0.2"]), namespace] {
            let c = set_kube(&mut b, vec![object]);
            let classified = classify(&last, c, &two_endpoints);
            assert!(classified.endpoints_only(), "{classified:?}");
            let pods = classified.keys.iter().filter(|k| matches!(k, ChangedKey::Kube(k) if k.kind == KubeKind::Pod));
            assert!(classified.keys.contains(&host), "{classified:?}");
            assert_eq!(classified.keys.len(), 1 + pods.count(), "{classified:?}");
            // What a frontend does with the leader's classified set: the same set again.
            assert_eq!(classify(&last, classified.clone(), &two_endpoints), classified);
        }

        // A Service port change changes the service: the Kubernetes key stays.
        let c = set_kube(&mut b, vec![service(81)]);
        let classified = classify(&last, c.clone(), &registry(&SE.replace("number: 80", "number: 81")));
        assert!(!classified.endpoints_only(), "{classified:?}");
        assert_eq!(classified, c);
    }

    #[test]
    fn a_replaced_state_names_what_changed_and_keeps_equal_objects_shared() {
        let mut leader = SnapshotBuilder::default();
        let mut c = set_kube(&mut leader, vec![service(80), slice(&["10.0.0.1"]), pod("v1")]);
        c.merge(set_configs(&mut leader, SE));
        let first = leader.build(Version::new(1, 1), c);
        let mut frontend = SnapshotBuilder::default();
        assert!(frontend.replace(leader.state().clone()).keys.len() == 4);
        let served = frontend.build(Version::new(1, 1), ChangeSet::full());

        // The leader moves on: one slice changes, a pod goes.
        let mut c = set_kube(&mut leader, vec![slice(&["10.0.0.1", "10.0.0.2"])]);
        leader.set_kube(pod("v1").key(), None);
        c.keys.insert(ChangedKey::Kube(pod("v1").key()));
        let next = leader.build(Version::new(1, 2), c);

        // A full update of the new state: the frontend finds the same two changes, classifies them
        // as the leader did, and builds the same registry incrementally.
        let mut state = leader.state().clone();
        // An equal Service under another `Arc`, as a decoded full update has it.
        state.kube.insert(service(80).key(), Arc::new(service(80)));
        let changes = frontend.replace(state);
        let expected: std::collections::BTreeSet<_> =
            [ChangedKey::Kube(slice(&[]).key()), ChangedKey::Kube(pod("v1").key())].into();
        assert_eq!(changes.keys, expected);
        let rebuilt = frontend.build(Version::new(1, 2), changes);
        assert_eq!(rebuilt.changes, next.changes);
        assert!(rebuilt.changes.endpoints_only(), "{:?}", rebuilt.changes);
        assert_eq!(rebuilt.registry, next.registry);
        // The equal copy was not taken: the Service is still the one the frontend served.
        assert!(Arc::ptr_eq(&rebuilt.kube[&service(80).key()], &served.kube[&service(80).key()]));
        assert!(Arc::ptr_eq(&first.kube[&service(80).key()], &served.kube[&service(80).key()]));
    }

    #[test]
    fn a_resumed_builder_builds_on_the_snapshot_it_resumed() {
        let mut leader = SnapshotBuilder::default();
        let c = set_kube(&mut leader, vec![service(80), slice(&["10.0.0.1"])]);
        let first = leader.build(Version::new(1, 1), c);
        let mut resumed = SnapshotBuilder::resume(first.clone());
        assert_eq!(resumed.state().kube, first.kube);
        let c = set_kube(&mut leader, vec![slice(&["10.0.0.2"])]);
        let next = leader.build(Version::new(1, 2), c.clone());
        resumed.set_kube(slice(&[]).key(), Some(Arc::new(slice(&["10.0.0.2"]))));
        let rebuilt = resumed.build(Version::new(1, 2), c);
        assert_eq!(rebuilt.registry, next.registry);
        assert_eq!(rebuilt.changes, next.changes);
    }
}
