//! Applying source events to the ingest state and building the next snapshot.

use std::sync::Arc;

use crate::config::Kind;
use crate::snapshot::{ChangeSet, ChangedKey, Snapshot, SourceState, Version};

use super::IngestEvent;

/// Holds the sources' current state and the last snapshot built from it.
#[derive(Debug, Default)]
pub struct SnapshotBuilder {
    state: SourceState,
    last: Option<Arc<Snapshot>>,
}

impl SnapshotBuilder {
    /// Applies a batch of events; returns what they changed (before registry comparison).
    pub fn apply(&mut self, events: Vec<IngestEvent>) -> ChangeSet {
        let mut changes = ChangeSet::default();
        for event in events {
            match event {
                IngestEvent::Config(objects) => {
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
                IngestEvent::Status { errors, ignored } => {
                    self.state.errors = errors;
                    self.state.ignored = ignored;
                }
                IngestEvent::Mesh(mesh) => {
                    if *self.state.mesh != *mesh {
                        self.state.mesh = mesh;
                        changes.full = true;
                        changes.keys.insert(ChangedKey::Mesh);
                    }
                }
                IngestEvent::Synced | IngestEvent::Term(_) | IngestEvent::Cause(_) => {}
            }
        }
        changes
    }

    /// Whether a batch with these changes needs a new snapshot (status-only batches still do,
    /// so `/debug/configz` shows new errors).
    pub fn build(&mut self, version: Version, changes: ChangeSet) -> Arc<Snapshot> {
        let changes = match &self.last {
            None => ChangeSet::full(),
            Some(last) => classify(last, changes, &self.state),
        };
        let snapshot = Arc::new(Snapshot::build(version, changes, &self.state));
        self.last = Some(snapshot.clone());
        snapshot
    }

    /// The last snapshot built.
    pub fn last(&self) -> Option<&Arc<Snapshot>> {
        self.last.as_ref()
    }
}

/// Replaces registry-object changes that left every service definition unchanged by
/// per-host endpoint changes, so frontends can answer them with EDS-only pushes.
fn classify(last: &Snapshot, mut changes: ChangeSet, state: &SourceState) -> ChangeSet {
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
    let new_registry = crate::registry::build_registry(state.configs.values(), &state.mesh);
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

    fn objects(yaml: &str) -> IngestEvent {
        IngestEvent::Config(
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
