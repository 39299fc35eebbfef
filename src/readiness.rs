//! Readiness built from registered tasks, after ztunnel's `readiness.rs`: the process is ready
//! when every task registered as a start-up condition has dropped its [`BlockReady`] guard.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex, MutexGuard};

/// The start-up conditions still pending. Cheap to clone.
#[derive(Debug, Clone, Default)]
pub struct Ready(Arc<Mutex<BTreeSet<String>>>);

/// A pending condition; the process is not ready while it exists.
#[derive(Debug)]
#[must_use = "readiness is released as soon as the guard is dropped"]
pub struct BlockReady {
    parent: Ready,
    name: String,
}

impl Ready {
    /// A readiness with nothing pending.
    pub fn new() -> Ready {
        Ready::default()
    }

    /// Registers a condition that blocks readiness until the returned guard is dropped.
    pub fn register_task(&self, name: &str) -> BlockReady {
        self.lock().insert(name.to_string());
        BlockReady { parent: self.clone(), name: name.to_string() }
    }

    /// The conditions still pending, in name order.
    pub fn pending(&self) -> Vec<String> {
        self.lock().iter().cloned().collect()
    }

    /// Whether nothing is pending.
    pub fn is_ready(&self) -> bool {
        self.lock().is_empty()
    }

    fn lock(&self) -> MutexGuard<'_, BTreeSet<String>> {
        // The set stays consistent even if a holder panicked: inserts and removes are single calls.
        self.0.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

impl Drop for BlockReady {
    fn drop(&mut self) {
        self.parent.lock().remove(&self.name);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ready_once_every_guard_is_dropped() {
        let ready = Ready::new();
        assert!(ready.is_ready());
        let sources = ready.register_task("sources synced");
        let listener = ready.register_task("xds listener");
        assert_eq!(ready.pending(), ["sources synced", "xds listener"]);
        drop(listener);
        assert!(!ready.is_ready());
        drop(sources);
        assert!(ready.is_ready());
    }
}
