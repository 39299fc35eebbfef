//! Applying source events to the ingest state and building the next snapshot.

use std::collections::BTreeMap;
use std::sync::Arc;

use crate::config::{ConfigError, IgnoredObject, Kind};
use crate::registry::Registry;
use crate::snapshot::{ChangeSet, ChangedKey, Snapshot, SourceState, Version};
use crate::source::{SourceEvent, SourceId};

/// Holds the sources' current state and the last snapshot built from it.
#[derive(Debug, Default)]
pub struct SnapshotBuilder {
    state: SourceState,
    /// Each config source's rejected and ignored documents; `state` holds them all.
    statuses: BTreeMap<SourceId, (Arc<Vec<ConfigError>>, Arc<Vec<IgnoredObject>>)>,
    last: Option<Arc<Snapshot>>,
}

impl SnapshotBuilder {
    /// Applies a batch of source events; returns what they changed (before registry comparison).
    pub fn apply(&mut self, events: Vec<SourceEvent>) -> ChangeSet {
        let mut changes = ChangeSet::default();
        for event in events {
            match event {
                SourceEvent::Config(objects) => {
                    for (key, object) in objects {
                        match object {
                            Some(obj) => {
                                self.state.configs.insert(key.clone(), obj);
                            }
                            None => {
                                self.state.configs.remove(&key);
                            }
                        }
                        changes.keys.insert(ChangedKey::Config(key));
                    }
                }
                SourceEvent::Kube(objects) => {
                    for (key, object) in objects {
                        match object {
                            Some(obj) => self.state.kube.insert(key, obj),
                            None => self.state.kube.remove(&key),
                        };
                    }
                    changes.full = true;
                }
                SourceEvent::Status { source, errors, ignored } => {
                    self.statuses.insert(source, (errors, ignored));
                    let lists = self.statuses.values();
                    self.state.errors = Arc::new(lists.clone().flat_map(|(e, _)| e.iter().cloned()).collect());
                    self.state.ignored = Arc::new(lists.flat_map(|(_, i)| i.iter().cloned()).collect());
                }
                SourceEvent::Mesh(mesh) => {
                    if *self.state.mesh != *mesh {
                        self.state.mesh = mesh;
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
    /// last snapshot. The registry is built once and shared by the classification and the snapshot.
    pub fn build(&mut self, version: Version, changes: ChangeSet) -> Arc<Snapshot> {
        let registry = crate::registry::build_registry(self.state.configs.values(), &self.state.kube, &self.state.mesh);
        let changes = match &self.last {
            None => ChangeSet::full(),
            Some(last) => classify(last, changes, &registry),
        };
        let snapshot = Arc::new(Snapshot::build_with_registry(version, changes, &self.state, registry));
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
fn classify(last: &Snapshot, mut changes: ChangeSet, new_registry: &Registry) -> ChangeSet {
    if changes.full {
        return changes;
    }
    let registry_keys: Vec<ChangedKey> = changes
        .keys
        .iter()
        .filter(|k| matches!(k, ChangedKey::Config(c) if matches!(c.kind, Kind::ServiceEntry | Kind::WorkloadEntry)))
        .cloned()
        .collect();
    if registry_keys.is_empty() {
        return changes;
    }
    if new_registry.services != last.registry.services {
        return changes;
    }
    for key in registry_keys {
        changes.keys.remove(&key);
    }
    for (key, endpoints) in &new_registry.endpoints {
        if last.registry.endpoints.get(key) != Some(endpoints) {
            changes.keys.insert(ChangedKey::Endpoints(key.hostname.clone()));
        }
    }
    changes
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::parse::{parse_file, Document};
    use crate::config::ValidConfig;

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
}
