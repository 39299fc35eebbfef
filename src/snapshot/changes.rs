//! What changed between two snapshots.

use std::collections::BTreeSet;

use serde::{Deserialize, Serialize};

use crate::config::ConfigKey;
use crate::registry::kubernetes::{KubeKey, KubeKind};
use crate::registry::Hostname;

/// One changed thing.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum ChangedKey {
    /// A config object was added, changed or removed.
    Config(ConfigKey),
    /// A Kubernetes registry object was added, changed or removed.
    Kube(KubeKey),
    /// Only the endpoints of this host changed.
    Endpoints(Hostname),
    /// The mesh config changed.
    Mesh,
}

/// The changes a snapshot carries relative to its predecessor.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChangeSet {
    /// Everything may have changed (first snapshot, mesh config change, resync).
    pub full: bool,
    /// The changed keys.
    pub keys: BTreeSet<ChangedKey>,
}

impl ChangeSet {
    /// A change set that affects everything.
    pub fn full() -> Self {
        ChangeSet { full: true, keys: BTreeSet::new() }
    }

    /// Whether only endpoints changed (Istio's `endpoint` push trigger).
    /// A Pod key counts as endpoints-level: ingest keeps one only when services stayed equal (the
    /// Pod may identify a connected proxy).
    pub fn endpoints_only(&self) -> bool {
        let endpoint_level = |k: &ChangedKey| match k {
            ChangedKey::Endpoints(_) => true,
            ChangedKey::Kube(key) => key.kind == KubeKind::Pod,
            ChangedKey::Config(_) | ChangedKey::Mesh => false,
        };
        !self.full && !self.keys.is_empty() && self.keys.iter().all(endpoint_level)
    }

    /// Merges another change set into this one (debouncing several into one push).
    pub fn merge(&mut self, other: ChangeSet) {
        self.full |= other.full;
        self.keys.extend(other.keys);
    }

    /// Whether nothing changed.
    pub fn is_empty(&self) -> bool {
        !self.full && self.keys.is_empty()
    }
}
