//! The difference between two consecutive snapshots of one term.

use std::collections::BTreeSet;
use std::sync::Arc;

use imbl::ordmap::DiffItem;

use crate::config::IgnoredObject;
use crate::config::{ConfigError, ConfigKey, ConfigObjects};
use crate::mesh::MeshConfig;
use crate::registry::kubernetes::{KubeKey, KubeObjects};
use crate::snapshot::{ChangeSet, ChangedKey, Snapshot, SnapshotBuilder, Version};

/// What turns the source state of `base` into that of `version`.
#[derive(Debug, Clone, PartialEq)]
pub struct Delta {
    /// Version the delta applies on.
    pub base: Version,
    /// Version it produces.
    pub version: Version,
    /// Objects added or changed.
    pub upserted: ConfigObjects,
    /// Objects removed.
    pub deleted: BTreeSet<ConfigKey>,
    /// Kubernetes registry objects added or changed.
    pub kube_upserted: KubeObjects,
    /// Kubernetes registry objects removed.
    pub kube_deleted: BTreeSet<KubeKey>,
    /// The new list of rejected documents, when it changed.
    pub errors: Option<Arc<Vec<ConfigError>>>,
    /// The new list of ignored documents, when it changed.
    pub ignored: Option<Arc<Vec<IgnoredObject>>>,
    /// The new mesh config, when it changed.
    pub mesh: Option<Arc<MeshConfig>>,
    /// The changes the snapshot of `version` carries relative to `base`.
    pub changes: ChangeSet,
}

impl Delta {
    /// The delta from `prev` to `next`. Objects shared by both (the common case: ingest keeps the
    /// `Arc` of untouched objects) are skipped without comparing their contents.
    pub fn between(prev: &Snapshot, next: &Snapshot) -> Delta {
        let (upserted, deleted) = diff(&prev.configs, &next.configs);
        let (kube_upserted, kube_deleted) = diff(&prev.kube, &next.kube);
        let mesh = changed(&prev.mesh, &next.mesh);
        // A skipped version (the reader saw only the latest of a burst) means `next.changes`
        // misses the skipped snapshot's keys: derive the changes from the diff instead.
        let changes = if next.version == prev.version.next() {
            next.changes.clone()
        } else {
            derived_changes(&upserted, &deleted, &kube_upserted, &kube_deleted, mesh.is_some())
        };
        Delta {
            base: prev.version,
            version: next.version,
            errors: changed(&prev.errors, &next.errors),
            ignored: changed(&prev.ignored, &next.ignored),
            mesh,
            upserted,
            deleted,
            kube_upserted,
            kube_deleted,
            changes,
        }
    }

    /// This delta followed by `later` (whose base must be this delta's version) as one delta.
    pub fn then(mut self, later: &Delta) -> Delta {
        debug_assert_eq!(later.base, self.version);
        for key in &later.deleted {
            self.upserted.remove(key);
            self.deleted.insert(key.clone());
        }
        for (key, obj) in &later.upserted {
            self.deleted.remove(key);
            self.upserted.insert(key.clone(), obj.clone());
        }
        for key in &later.kube_deleted {
            self.kube_upserted.remove(key);
            self.kube_deleted.insert(key.clone());
        }
        for (key, obj) in &later.kube_upserted {
            self.kube_deleted.remove(key);
            self.kube_upserted.insert(key.clone(), obj.clone());
        }
        self.errors = later.errors.clone().or(self.errors);
        self.ignored = later.ignored.clone().or(self.ignored);
        self.mesh = later.mesh.clone().or(self.mesh);
        self.changes.merge(later.changes.clone());
        self.version = later.version;
        self
    }

    /// Applies the delta to a builder holding the state of its base version, object by object:
    /// the builder's registry then rebuilds only what the changed objects reach.
    pub fn apply_to(&self, builder: &mut SnapshotBuilder) {
        for key in &self.deleted {
            builder.set_config(key.clone(), None);
        }
        for (key, obj) in &self.upserted {
            builder.set_config(key.clone(), Some(obj.clone()));
        }
        for key in &self.kube_deleted {
            builder.set_kube(key.clone(), None);
        }
        for (key, obj) in &self.kube_upserted {
            builder.set_kube(key.clone(), Some(obj.clone()));
        }
        if let Some(errors) = &self.errors {
            builder.set_errors(errors.clone());
        }
        if let Some(ignored) = &self.ignored {
            builder.set_ignored(ignored.clone());
        }
        if let Some(mesh) = &self.mesh {
            builder.set_mesh(mesh.clone());
        }
    }
}

/// What `new` upserts and deletes relative to `old`: the persistent maps' own diff, which skips
/// the subtrees both share (a snapshot shares all but the changed paths with its predecessor), so
/// a one-object change costs a path, not a walk over the mesh. An equal value under another `Arc`
/// is no change.
fn diff<K, V, Up>(old: &imbl::OrdMap<K, Arc<V>>, new: &imbl::OrdMap<K, Arc<V>>) -> (Up, BTreeSet<K>)
where
    K: Ord + Clone,
    V: PartialEq,
    Up: Default + Extend<(K, Arc<V>)>,
{
    let mut upserted = Up::default();
    let mut deleted = BTreeSet::new();
    for item in old.diff(new) {
        match item {
            // The diff reports an update only where the values differ.
            DiffItem::Add(k, v) | DiffItem::Update { new: (k, v), .. } => upserted.extend([(k.clone(), v.clone())]),
            DiffItem::Remove(k, _) => {
                deleted.insert(k.clone());
            }
        }
    }
    (upserted, deleted)
}

/// The new value when it differs from the old one.
fn changed<T: PartialEq>(old: &Arc<T>, new: &Arc<T>) -> Option<Arc<T>> {
    (!Arc::ptr_eq(old, new) && old != new).then(|| new.clone())
}

/// The changes implied by a config and Kubernetes object diff: every changed object's key;
/// everything when the mesh config changed. Coarser than the ingest's own classification (no
/// endpoint-only changes).
pub(crate) fn derived_changes(
    upserted: &ConfigObjects,
    deleted: &BTreeSet<ConfigKey>,
    kube_upserted: &KubeObjects,
    kube_deleted: &BTreeSet<KubeKey>,
    mesh_changed: bool,
) -> ChangeSet {
    let mut changes = ChangeSet::default();
    changes.keys.extend(upserted.keys().chain(deleted).cloned().map(ChangedKey::Config));
    changes.keys.extend(kube_upserted.keys().chain(kube_deleted).cloned().map(ChangedKey::Kube));
    if mesh_changed {
        changes.full = true;
        changes.keys.insert(ChangedKey::Mesh);
    }
    changes
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::replication::wire::payload::tests::{kube_objects, object, pod, state};
    use crate::snapshot::SourceState;

    fn build(v: Version, changes: ChangeSet, s: &SourceState) -> Snapshot {
        Snapshot::build(v, changes, s)
    }

    /// The persistent maps' diff finds every upsert and deletion across several tree levels
    /// (many Pods), and no change where an equal copy replaced an object.
    #[test]
    fn kube_diff_finds_changes_across_tree_levels() {
        let mut old = KubeObjects::new();
        for i in 0..3000 {
            let p = pod(&format!("p{i:04}"), &format!("10.0.{}.{}", i / 250, i % 250), "v1");
            old.insert(p.key(), Arc::new(p));
        }
        let mut new = old.clone();
        let mut changed = BTreeSet::new();
        for i in (0..3000).step_by(97) {
            let p = pod(&format!("p{i:04}"), "10.9.0.1", "v2");
            changed.insert(p.key());
            new.insert(p.key(), Arc::new(p));
        }
        let mut removed = BTreeSet::new();
        for i in (5..3000).step_by(331) {
            let p = pod(&format!("p{i:04}"), "", "");
            changed.remove(&p.key());
            removed.insert(p.key());
            new.remove(&p.key());
        }
        // An equal copy under a new `Arc` is no change; a new key is.
        let copy = pod("p0001", "10.0.0.1", "v1");
        new.insert(copy.key(), Arc::new(copy));
        let added = pod("q", "10.8.0.1", "v1");
        changed.insert(added.key());
        new.insert(added.key(), Arc::new(added));

        let (upserted, deleted): (KubeObjects, _) = diff(&old, &new);
        assert_eq!(upserted.keys().cloned().collect::<BTreeSet<_>>(), changed);
        assert_eq!(deleted, removed);
        assert_eq!((upserted.len(), deleted.len()), (32, 10));
        assert!(upserted.iter().all(|(k, v)| Arc::ptr_eq(v, &new[k])));
    }

    /// A builder holding `state`, as a frontend holds its base version's.
    fn builder_at(state: SourceState) -> SnapshotBuilder {
        let mut builder = SnapshotBuilder::default();
        builder.replace(state);
        builder
    }

    #[test]
    fn diff_finds_upserts_and_deletes_and_skips_shared_objects() {
        let mut s = state(&["a", "b", "c"]);
        let s1 = build(Version::new(1, 1), ChangeSet::full(), &s);
        s.configs.remove(&object("a").key);
        let b2 = object("b2");
        s.configs.insert(b2.key.clone(), Arc::new(b2.clone()));
        let s2 = build(Version::new(1, 2), ChangeSet::default(), &s);
        let d = Delta::between(&s1, &s2);
        assert_eq!(d.deleted.iter().map(|k| k.name.as_str()).collect::<Vec<_>>(), ["a"]);
        assert_eq!(d.upserted.keys().map(|k| k.name.as_str()).collect::<Vec<_>>(), ["b2"]);
        assert!(d.errors.is_none() && d.mesh.is_none() && d.ignored.is_none());

        let mut applied = builder_at(state(&["a", "b", "c"]));
        d.apply_to(&mut applied);
        assert_eq!(applied.state().configs, s.configs);
    }

    #[test]
    fn coalescing_keeps_the_last_word_per_key() {
        let mut s = state(&["a", "b"]);
        let s1 = build(Version::new(1, 1), ChangeSet::full(), &s);
        s.configs.remove(&object("a").key);
        let s2 = build(Version::new(1, 2), ChangeSet::default(), &s);
        s.configs.insert(object("a").key, Arc::new(object("a")));
        s.configs.remove(&object("b").key);
        let s3 = build(Version::new(1, 3), ChangeSet::default(), &s);
        let d = Delta::between(&s1, &s2).then(&Delta::between(&s2, &s3));
        assert_eq!((d.base, d.version), (Version::new(1, 1), Version::new(1, 3)));
        let mut applied = builder_at(state(&["a", "b"]));
        d.apply_to(&mut applied);
        assert_eq!(applied.state().configs, s.configs);
    }

    #[test]
    fn a_skipped_version_derives_changes_from_the_diff() {
        let mut s = state(&["a"]);
        let s1 = build(Version::new(1, 1), ChangeSet::full(), &s);
        s.configs.insert(object("b").key, Arc::new(object("b")));
        let s3 = build(Version::new(1, 3), ChangeSet::default(), &s);
        let d = Delta::between(&s1, &s3);
        assert!(d.changes.keys.contains(&ChangedKey::Config(object("b").key)));
    }

    #[test]
    fn kubernetes_objects_diff_coalesce_and_apply_like_configs() {
        let mut s = state(&["a"]);
        s.kube = kube_objects();
        let s1 = build(Version::new(1, 1), ChangeSet::full(), &s);
        let relabelled = pod("ratings-0", "10.1.0.1", "v2");
        let gone = pod("ratings-1", "", "").key();
        s.kube.insert(relabelled.key(), Arc::new(relabelled.clone()));
        s.kube.remove(&gone);
        // An equal copy under a new `Arc` is no change either.
        let node = s.kube.keys().find(|k| k.kind == crate::registry::kubernetes::KubeKind::Node).cloned();
        if let Some(node) = node {
            let copy = Arc::new((*s.kube[&node]).clone());
            s.kube.insert(node, copy);
        }
        let s2 = build(Version::new(1, 2), ChangeSet::default(), &s);
        let d12 = Delta::between(&s1, &s2);
        assert_eq!(d12.kube_upserted.keys().collect::<Vec<_>>(), [&relabelled.key()]);
        assert_eq!(d12.kube_deleted.iter().collect::<Vec<_>>(), [&gone]);
        assert!(d12.upserted.is_empty() && d12.deleted.is_empty());

        // Back again, then coalesced: the last word per key wins.
        let back = pod("ratings-1", "10.1.0.2", "v1");
        s.kube.insert(back.key(), Arc::new(back));
        let s3 = build(Version::new(1, 3), ChangeSet::default(), &s);
        let d = d12.then(&Delta::between(&s2, &s3));
        assert!(d.kube_deleted.is_empty());
        assert_eq!(d.kube_upserted.len(), 2);
        let mut applied = state(&["a"]);
        applied.kube = kube_objects();
        let mut applied = builder_at(applied);
        d.apply_to(&mut applied);
        assert_eq!(applied.state().kube, s.kube);

        // A skipped version names the Kubernetes keys in the derived changes.
        let d13 = Delta::between(&s1, &s3);
        assert!(d13.changes.keys.contains(&ChangedKey::Kube(relabelled.key())), "{:?}", d13.changes);
    }
}
