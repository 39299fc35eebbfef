//! The frontend's held state and the rules for applying an update to it.

use std::sync::Arc;

use crate::replication::wire::proto::UpdateKind;
use crate::replication::wire::{decode_delta, decode_full, EncodedUpdate, WireError};
use crate::snapshot::{ChangeSet, ChangedKey, Snapshot, SourceState, Version};

/// What the frontend holds: the version it serves, its source state, the highest term seen.
#[derive(Debug, Clone, Default)]
pub(super) struct Held {
    pub(super) version: Option<Version>,
    pub(super) state: SourceState,
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
    pub(super) fn from_snapshot(snapshot: Option<&Snapshot>) -> Held {
        let Some(s) = snapshot else { return Held::default() };
        Held {
            version: Some(s.version),
            state: SourceState {
                configs: s.configs.clone(),
                errors: s.errors.clone(),
                ignored: s.ignored.clone(),
                mesh: s.mesh.clone(),
                kube: s.kube.clone(),
            },
            highest_term: s.version.term,
        }
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

    /// Makes `version` with `state` the held one.
    pub(super) fn commit(&mut self, version: Version, state: SourceState) {
        self.version = Some(version);
        self.state = state;
        self.observe_term(version.term);
    }
}

/// Decodes an update, applies it to `state` (the held one) and builds the snapshot. CPU-heavy: run it
/// on the blocking pool. `had_state` says whether `state` belongs to a held version; `previous` is
/// the snapshot built from it, if still at hand (the new one then re-indexes only what changed).
pub(super) fn prepare(
    mut state: SourceState,
    had_state: bool,
    previous: Option<&Snapshot>,
    update: &EncodedUpdate,
) -> Result<(SourceState, Snapshot), WireError> {
    let changes = match update.kind {
        UpdateKind::Delta => {
            let base = update.base.ok_or(WireError::MissingBase(update.version))?;
            let delta = decode_delta(base, update.version, &update.payload)?;
            delta.apply_to(&mut state);
            delta.changes
        }
        _ => {
            let mut full = decode_full(&update.payload)?;
            if had_state {
                // The leader's change set relates to its previous snapshot, not to what this
                // frontend held (it may have been away for a while): compute ours.
                let changes = replace(&state, &mut full.state);
                state = full.state;
                changes
            } else {
                state = full.state;
                ChangeSet::full()
            }
        }
    };
    let snapshot = Snapshot::build_after(update.version, changes, &state, previous.filter(|_| had_state));
    Ok((state, snapshot))
}

/// The changes from `old` to `new`, keeping `old`'s shared values wherever they are equal so that
/// caches keyed by them stay warm (a failover to a leader with identical config changes nothing).
fn replace(old: &SourceState, new: &mut SourceState) -> ChangeSet {
    let mut changes = ChangeSet::default();
    new.configs = adopt(&old.configs, &new.configs, |k| {
        changes.keys.insert(ChangedKey::Config(k));
    });
    new.kube = adopt(&old.kube, &new.kube, |k| {
        changes.keys.insert(ChangedKey::Kube(k));
    });
    if old.mesh == new.mesh {
        new.mesh = old.mesh.clone();
    } else {
        changes.full = true;
        changes.keys.insert(ChangedKey::Mesh);
    }
    if old.errors == new.errors {
        new.errors = old.errors.clone();
    }
    if old.ignored == new.ignored {
        new.ignored = old.ignored.clone();
    }
    changes
}

/// `new`'s entries as a change of `old`'s persistent map: its structure and its equal values are
/// shared; `changed` is told each key added, changed or removed.
fn adopt<K: Ord + Clone, V: PartialEq>(
    old: &imbl::OrdMap<K, Arc<V>>,
    new: &imbl::OrdMap<K, Arc<V>>,
    mut changed: impl FnMut(K),
) -> imbl::OrdMap<K, Arc<V>> {
    let mut kept = old.clone();
    for (key, obj) in new.iter() {
        match old.get(key) {
            Some(held) if held == obj => {}
            _ => {
                kept.insert(key.clone(), obj.clone());
                changed(key.clone());
            }
        }
    }
    for key in old.keys().filter(|k| !new.contains_key(*k)) {
        kept.remove(key);
        changed(key.clone());
    }
    kept
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::replication::wire::encode_full;

    fn update(kind: UpdateKind, version: Version, base: Option<Version>) -> EncodedUpdate {
        EncodedUpdate { kind, version, base, payload: Default::default() }
    }

    #[test]
    fn rules_fence_order_and_base() {
        let mut held = Held::default();
        let v = Version::new;
        assert_eq!(held.check(&update(UpdateKind::Full, v(2, 3), None)), Verdict::Apply);
        assert_eq!(held.check(&update(UpdateKind::Delta, v(2, 3), Some(v(2, 2)))), Verdict::BaseMismatch);
        held.commit(v(2, 3), SourceState::default());
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
        let (new_state, snap) = prepare(state.clone(), true, None, &full).unwrap();
        assert!(snap.changes.is_empty(), "{:?}", snap.changes);
        assert_eq!(snap.configs, leader.configs);
        for (k, v) in &new_state.configs {
            assert!(Arc::ptr_eq(v, &state.configs[k]));
        }
        assert_eq!(snap.kube, leader.kube);
        for (k, v) in &new_state.kube {
            assert!(Arc::ptr_eq(v, &state.kube[k]));
        }
        let (_, fresh) = prepare(SourceState::default(), false, None, &full).unwrap();
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
        let (_, snap) = prepare(held, true, None, &full).unwrap();
        let expected = [ChangedKey::Kube(relabelled.key()), ChangedKey::Kube(gone)];
        assert_eq!(snap.changes.keys, expected.into_iter().collect());
        assert!(!snap.changes.full);
        assert_eq!(snap.kube, leader.kube);
    }
}
