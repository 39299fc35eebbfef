//! Applying source events to the one snapshot builder (`snapshot::SnapshotBuilder`), with each
//! config source's rejected and ignored documents merged into the state's lists.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use crate::config::api::Labels;
use crate::config::{ConfigError, ConfigKey, IgnoredObject, Kind};
use crate::snapshot::{ChangeSet, ChangedKey, Snapshot, SnapshotBuilder, Version};
use crate::source::{SourceEvent, SourceId};

/// One config source's rejected and ignored documents.
type SourceStatus = (Arc<Vec<ConfigError>>, Arc<Vec<IgnoredObject>>);

/// The snapshot builder as ingest feeds it: source events in, snapshots out.
#[derive(Debug, Default)]
pub struct IngestBuilder {
    builder: SnapshotBuilder,
    /// Each config source's rejected and ignored documents; the builder's state holds them all.
    statuses: BTreeMap<SourceId, SourceStatus>,
}

impl IngestBuilder {
    /// Applies a batch of source events; returns what they changed (before registry comparison).
    pub fn apply(&mut self, events: Vec<SourceEvent>) -> ChangeSet {
        let mut changes = ChangeSet::default();
        for event in events {
            match event {
                SourceEvent::Config(objects) => {
                    for (key, object) in objects {
                        self.builder.set_config(key.clone(), object);
                        changes.keys.insert(ChangedKey::Config(key));
                    }
                }
                SourceEvent::Kube(objects) => {
                    for (key, object) in objects {
                        self.builder.set_kube(key.clone(), object);
                        changes.keys.insert(ChangedKey::Kube(key));
                    }
                }
                SourceEvent::Status { source, errors, ignored } => {
                    let before = rejected_policies(&self.builder.state().errors);
                    self.statuses.insert(source, (errors, ignored));
                    let lists = self.statuses.values();
                    self.builder.set_errors(Arc::new(lists.clone().flat_map(|(e, _)| e.iter().cloned()).collect()));
                    // A rejected AuthorizationPolicy keeps its scope denied: it coming or going
                    // changes proxy config, though no valid object changed.
                    let after = rejected_policies(&self.builder.state().errors);
                    let flipped = before.symmetric_difference(&after).map(|(k, _)| ChangedKey::Config(k.clone()));
                    changes.keys.extend(flipped);
                    self.builder.set_ignored(Arc::new(lists.flat_map(|(_, i)| i.iter().cloned()).collect()));
                }
                SourceEvent::Mesh(mesh) => {
                    if self.builder.set_mesh(mesh) {
                        changes.full = true;
                        changes.keys.insert(ChangedKey::Mesh);
                    }
                }
                SourceEvent::InitDone(_) | SourceEvent::Cause(_) => {}
            }
        }
        changes
    }

    /// Builds the snapshot `version` (see [`SnapshotBuilder::build`]).
    pub fn build(&mut self, version: Version, changes: ChangeSet) -> Arc<Snapshot> {
        self.builder.build(version, changes)
    }

    /// The last snapshot built.
    pub fn last(&self) -> Option<&Arc<Snapshot>> {
        self.builder.last()
    }
}

/// The rejected AuthorizationPolicies among `errors`, with the selector their denial covers.
fn rejected_policies(errors: &[ConfigError]) -> BTreeSet<(ConfigKey, Option<Labels>)> {
    errors
        .iter()
        .filter_map(|e| e.object.as_ref().filter(|k| k.kind == Kind::AuthorizationPolicy).map(|k| (k, e)))
        .map(|(k, e)| (k.clone(), e.policy_selector.clone()))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::parse::{parse_file, Document};
    use crate::config::ValidConfig;
    use crate::registry::kubernetes::{KubeNamespace, KubeObject};

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
        let mut b = IngestBuilder::default();
        let c = b.apply(vec![objects(SE)]);
        assert!(b.build(Version::new(1, 1), c).changes.full);

        let c = b.apply(vec![objects(&SE.replace("10.0.0.1}]", "10.0.0.1}, {address: 10.0.0.2}]"))]);
        let s = b.build(Version::new(1, 2), c);
        assert!(s.changes.endpoints_only(), "{:?}", s.changes);
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
        let mut b = IngestBuilder::default();
        let c = b.apply(vec![status(vec![error.clone()])]);
        assert!(c.keys.contains(&ChangedKey::Config(key.clone())), "{c:?}");
        assert!(b.apply(vec![status(vec![error])]).is_empty(), "the same rejection again changes nothing");
        let c = b.apply(vec![status(Vec::new())]);
        assert!(c.keys.contains(&ChangedKey::Config(key)), "{c:?}");
    }

    fn namespace(name: &str) -> KubeObject {
        KubeObject::Namespace(KubeNamespace { name: name.into(), labels: Default::default() })
    }

    #[test]
    fn kubernetes_objects_are_kept_and_deleted() {
        let mut b = IngestBuilder::default();
        let kube = |o: KubeObject| SourceEvent::Kube(vec![(o.key(), Some(Arc::new(o)))]);
        let (kept, gone) = (namespace("shop"), namespace("old"));
        let c = b.apply(vec![kube(kept.clone()), kube(gone.clone())]);
        assert_eq!(c.keys.len(), 2);
        assert!(c.keys.contains(&ChangedKey::Kube(gone.key())));
        let s = b.build(Version::new(1, 1), c);
        assert_eq!(s.kube.len(), 2);

        let c = b.apply(vec![SourceEvent::Kube(vec![(gone.key(), None)])]);
        assert_eq!(c.keys.iter().collect::<Vec<_>>(), [&ChangedKey::Kube(gone.key())]);
        let s2 = b.build(Version::new(1, 2), c);
        assert!(!s2.kube.contains_key(&gone.key()));
        // Untouched objects stay shared between snapshots (replication skips them by pointer).
        assert!(Arc::ptr_eq(&s.kube[&kept.key()], &s2.kube[&kept.key()]));
    }
}
