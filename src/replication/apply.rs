//! The frontend's held state and the rules for applying an update to it.

use std::sync::Arc;

use crate::replication::wire::proto::UpdateKind;
use crate::replication::wire::{decode_delta, decode_full, EncodedUpdate, WireError};
use crate::snapshot::{ChangeSet, Snapshot, SnapshotBuilder, Version};

/// What the frontend holds: the version it serves, the builder holding that version's source
/// state, the highest term seen.
#[derive(Debug, Default)]
pub(super) struct Held {
    pub(super) version: Option<Version>,
    pub(super) builder: SnapshotBuilder,
    pub(super) highest_term: u64,
}

/// Whether an update may be applied on what is held.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Verdict {
    /// Apply it.
    Apply,
    /// Not newer than the held version: skip it.
    NotNewer,
    /// Its term is below the highest seen: a deposed leader's update.
    Fenced,
    /// A delta whose base is not the held version.
    BaseMismatch,
}

impl Held {
    /// Resumes from the snapshot a frontend already serves, if any.
    pub(super) fn from_snapshot(snapshot: Option<Arc<Snapshot>>) -> Held {
        let Some(s) = snapshot else { return Held::default() };
        Held { version: Some(s.version), highest_term: s.version.term, builder: SnapshotBuilder::resume(s) }
    }

    /// Records a term learned from the election.
    pub(super) fn observe_term(&mut self, term: u64) {
        self.highest_term = self.highest_term.max(term);
    }

    /// The rules, in order: fence lower terms, skip what is not newer, deltas apply only on their base.
    pub(super) fn check(&self, update: &EncodedUpdate) -> Verdict {
        if update.version.term < self.highest_term {
            return Verdict::Fenced;
        }
        if self.version.is_some_and(|held| update.version <= held) {
            return Verdict::NotNewer;
        }
        if update.kind == UpdateKind::Delta && update.base != self.version {
            return Verdict::BaseMismatch;
        }
        Verdict::Apply
    }

    /// Makes `version` (built by the held builder) the held one.
    pub(super) fn commit(&mut self, version: Version) {
        self.version = Some(version);
        self.observe_term(version.term);
    }
}

/// Decodes an update, applies it to `builder` (holding the held version's state when `had_state`)
/// and builds the snapshot, through the same incremental path the leader built it with. The
/// update is decoded whole before anything is applied: on an error the builder is as it was.
/// CPU-heavy: run it on the blocking pool.
pub(super) fn prepare(
    builder: &mut SnapshotBuilder,
    had_state: bool,
    update: &EncodedUpdate,
) -> Result<Arc<Snapshot>, WireError> {
    let changes = match update.kind {
        UpdateKind::Delta => {
            let base = update.base.ok_or(WireError::MissingBase(update.version))?;
            let delta = decode_delta(base, update.version, &update.payload)?;
            delta.apply_to(builder);
            delta.changes
        }
        _ => {
            let full = decode_full(&update.payload)?;
            if had_state {
                // The leader's change set relates to its previous snapshot, not to what this
                // frontend held (it may have been away for a while): compute ours.
                builder.replace(full.state)
            } else {
                *builder = SnapshotBuilder::default();
                builder.replace(full.state);
                ChangeSet::full()
            }
        }
    };
    Ok(builder.build(update.version, changes))
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::replication::wire::encode_full;
    use crate::snapshot::{ChangedKey, SourceState};

    fn update(kind: UpdateKind, version: Version, base: Option<Version>) -> EncodedUpdate {
        EncodedUpdate { kind, version, base, payload: Default::default() }
    }

    #[test]
    fn rules_fence_order_and_base() {
        let mut held = Held::default();
        let v = Version::new;
        assert_eq!(held.check(&update(UpdateKind::Full, v(2, 3), None)), Verdict::Apply);
        assert_eq!(held.check(&update(UpdateKind::Delta, v(2, 3), Some(v(2, 2)))), Verdict::BaseMismatch);
        held.commit(v(2, 3));
        assert_eq!(held.check(&update(UpdateKind::Full, v(2, 3), None)), Verdict::NotNewer);
        assert_eq!(held.check(&update(UpdateKind::Delta, v(2, 4), Some(v(2, 3)))), Verdict::Apply);
        assert_eq!(held.check(&update(UpdateKind::Delta, v(2, 5), Some(v(2, 4)))), Verdict::BaseMismatch);
        assert_eq!(held.check(&update(UpdateKind::Full, v(1, 9), None)), Verdict::Fenced);
        held.observe_term(5);
        assert_eq!(held.check(&update(UpdateKind::Full, v(4, 1), None)), Verdict::Fenced);
        assert_eq!(held.check(&update(UpdateKind::Full, v(5, 1), None)), Verdict::Apply);
    }

    #[test]
    fn a_full_with_identical_config_changes_nothing_and_keeps_objects() {
        let mut state = crate::replication::wire::tests_support::state(&["a", "b"]);
        state.kube = crate::replication::wire::tests_support::kube_objects();
        let leader = Snapshot::build(Version::new(1, 4), ChangeSet::full(), &state);
        let full = EncodedUpdate {
            kind: UpdateKind::Full,
            version: Version::new(2, 1),
            base: None,
            payload: encode_full(&leader).unwrap(),
        };
        let mut builder = SnapshotBuilder::default();
        builder.replace(state.clone());
        builder.build(Version::new(1, 4), ChangeSet::full());
        let snap = prepare(&mut builder, true, &full).unwrap();
        assert!(snap.changes.is_empty(), "{:?}", snap.changes);
        assert_eq!(snap.configs, leader.configs);
        for (k, v) in &builder.state().configs {
            assert!(Arc::ptr_eq(v, &state.configs[k]));
        }
        assert_eq!(snap.kube, leader.kube);
        for (k, v) in &builder.state().kube {
            assert!(Arc::ptr_eq(v, &state.kube[k]));
        }
        let fresh = prepare(&mut SnapshotBuilder::default(), false, &full).unwrap();
        assert!(fresh.changes.full);
    }

    #[test]
    fn a_full_after_an_absence_names_the_changed_kubernetes_objects() {
        use crate::replication::wire::tests_support::{kube_objects, pod};
        let held = SourceState { kube: kube_objects(), ..Default::default() };
        let mut leader_state = held.clone();
        let relabelled = pod("ratings-0", "10.1.0.1", "v2");
        let gone = pod("ratings-1", "", "").key();
        leader_state.kube.insert(relabelled.key(), Arc::new(relabelled.clone()));
        leader_state.kube.remove(&gone);
        let leader = Snapshot::build(Version::new(2, 9), ChangeSet::full(), &leader_state);
        let full = EncodedUpdate {
            kind: UpdateKind::Full,
            version: Version::new(2, 9),
            base: None,
            payload: encode_full(&leader).unwrap(),
        };
        let mut builder = SnapshotBuilder::default();
        builder.replace(held);
        builder.build(Version::new(2, 1), ChangeSet::full());
        let snap = prepare(&mut builder, true, &full).unwrap();
        // Both Pods are named (a Pod may be a connected proxy's); the rest of the change is the
        // endpoints they moved, as the leader classifies it.
        let pods = [ChangedKey::Kube(relabelled.key()), ChangedKey::Kube(gone)];
        assert!(pods.iter().all(|k| snap.changes.keys.contains(k)), "{:?}", snap.changes);
        let others = snap.changes.keys.iter().filter(|k| !pods.contains(k));
        assert!(others.clone().all(|k| matches!(k, ChangedKey::Endpoints(_))), "{:?}", snap.changes);
        assert!(!snap.changes.full && snap.changes.endpoints_only());
        assert_eq!(snap.kube, leader.kube);
        assert_eq!(snap.registry, leader.registry);
    }
}
