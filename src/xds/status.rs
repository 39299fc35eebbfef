//! Per-proxy sync status (what was sent, acked and rejected), for `/debug/syncz` and tests.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use serde::Serialize;

use super::isolation::Rejected;
use super::metrics::XdsMetrics;
use super::proxy::Proxy;
use super::TypeUrl;

/// Sync state of one xDS type on one connection.
#[derive(Debug, Clone, Default, Serialize)]
pub struct TypeStatus {
    /// Version of the last response sent.
    pub sent_version: String,
    /// Nonce of the last response sent.
    pub sent_nonce: String,
    /// Number of resources in the last response.
    pub sent_resources: usize,
    /// When the last response was sent.
    pub sent_at: Option<SystemTime>,
    /// Last version the proxy acknowledged.
    pub acked_version: String,
    /// Nonce of the last acknowledged response.
    pub acked_nonce: String,
    /// When the proxy last acknowledged a response.
    pub acked_at: Option<SystemTime>,
    /// Last rejection, while the proxy's latest answer was a NACK or resources it rejected are
    /// still held back.
    pub last_nack: Option<Nack>,
    /// Responses of this type sent on this connection.
    pub responses: u64,
    /// Resources this proxy rejected, by name: kept out of its updates (it keeps the version it
    /// holds) until they change, while every other change still reaches it.
    pub rejected: BTreeMap<String, Rejected>,
}

/// A rejected response.
#[derive(Debug, Clone, Serialize)]
pub struct Nack {
    /// Version rejected.
    pub version: String,
    /// Nonce rejected.
    pub nonce: String,
    /// Envoy's error message.
    pub message: String,
    /// When.
    pub at: SystemTime,
}

/// The ADS protocol a stream speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum Transport {
    /// State of the world (`StreamAggregatedResources`).
    StateOfTheWorld,
    /// Incremental (`DeltaAggregatedResources`).
    Delta,
}

/// Sync state of one connection.
#[derive(Debug, Clone, Serialize)]
pub struct ConnectionStatus {
    /// Connection id (unique within this process).
    pub connection_id: String,
    /// The proxy (shared with the copies debug readers take).
    pub proxy: Arc<Proxy>,
    /// When it connected.
    pub connected_at: SystemTime,
    /// Snapshot version the proxy's config was last computed from.
    pub snapshot_version: String,
    /// Pushes (snapshots that led to at least one response) on this connection.
    pub pushes: u64,
    /// The ADS protocol of the stream.
    pub transport: Transport,
    /// Per type (shared with the copies debug readers take; copied on write only while one does).
    pub types: Arc<BTreeMap<TypeUrl, TypeStatus>>,
}

impl ConnectionStatus {
    /// The status of `type_url`, to change (the shared map is copied first if another status holds it).
    pub fn type_mut(&mut self, type_url: TypeUrl) -> &mut TypeStatus {
        Arc::make_mut(&mut self.types).entry(type_url).or_default()
    }
}

/// One connection's status: written in place by its stream alone, copied out by debug readers.
type SharedStatus = Arc<Mutex<ConnectionStatus>>;

/// Registry of live connections. The registry's lock is taken on connect and disconnect only;
/// each connection updates its own status in place under its own lock (a copy per update, with
/// its strings, was a tenth of the CPU of a push to a thousand streams).
#[derive(Default)]
pub struct ConnectionRegistry {
    next_id: AtomicU64,
    live: Mutex<HashMap<u64, SharedStatus>>,
    metrics: XdsMetrics,
}

impl std::fmt::Debug for ConnectionRegistry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConnectionRegistry").field("live", &self.lock().len()).finish()
    }
}

/// A connection's entry; removes itself from the registry when dropped.
pub struct Registration {
    id: u64,
    status: SharedStatus,
    registry: Arc<ConnectionRegistry>,
}

impl ConnectionRegistry {
    /// An empty registry counting connections in `metrics` (`pilot_xds{version}`).
    pub fn new(metrics: XdsMetrics) -> ConnectionRegistry {
        ConnectionRegistry { next_id: AtomicU64::new(0), live: Mutex::default(), metrics }
    }

    /// Registers a new connection of `proxy`.
    pub fn register(self: &Arc<Self>, proxy: Proxy) -> Registration {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed) + 1;
        self.metrics.proxy_connected(&proxy.istio_version);
        let status = Arc::new(Mutex::new(ConnectionStatus {
            connection_id: format!("{}-{id}", proxy.id),
            proxy: Arc::new(proxy),
            connected_at: SystemTime::now(),
            snapshot_version: String::new(),
            pushes: 0,
            transport: Transport::StateOfTheWorld,
            types: Arc::default(),
        }));
        self.lock().insert(id, status.clone());
        Registration { id, status, registry: self.clone() }
    }

    /// Current status of every connection, sorted by proxy id.
    pub fn snapshot(&self) -> Vec<Arc<ConnectionStatus>> {
        let live: Vec<SharedStatus> = self.lock().values().cloned().collect();
        // Copied one at a time, outside the registry's lock: a stream waits for its own only.
        let mut all: Vec<_> = live.iter().map(|s| Arc::new(lock_status(s).clone())).collect();
        all.sort_by(|a, b| a.proxy.id.cmp(&b.proxy.id).then(a.connection_id.cmp(&b.connection_id)));
        all
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<u64, SharedStatus>> {
        match self.live.lock() {
            Ok(g) => g,
            Err(poisoned) => poisoned.into_inner(),
        }
    }
}

/// A connection's status, locked (a panic while it was held leaves a status worth reading).
fn lock_status(status: &Mutex<ConnectionStatus>) -> std::sync::MutexGuard<'_, ConnectionStatus> {
    status.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl Registration {
    /// Updates the status in place; readers see each update whole.
    pub fn update(&self, f: impl FnOnce(&mut ConnectionStatus)) {
        f(&mut lock_status(&self.status));
    }
}

impl Drop for Registration {
    fn drop(&mut self) {
        self.registry.lock().remove(&self.id);
        let proxy = lock_status(&self.status).proxy.clone();
        self.registry.metrics.proxy_disconnected(&proxy.istio_version);
    }
}

#[cfg(test)]
mod tests {
    use envoy_types::pb::envoy::config::core::v3::Node;

    use super::*;

    fn proxy(id: &str) -> Proxy {
        Proxy::from_node(Some(&Node { id: id.into(), ..Default::default() })).expect("a proxy")
    }

    #[test]
    fn updates_are_seen_by_later_copies_and_leave_earlier_ones_as_they_were() {
        let registry = Arc::new(ConnectionRegistry::default());
        let a = registry.register(proxy("sidecar~10.0.0.1~a-1.ns~ns.svc.cluster.local"));
        let _b = registry.register(proxy("sidecar~10.0.0.2~b-1.ns~ns.svc.cluster.local"));
        a.update(|s| {
            s.snapshot_version = "1.2".into();
            s.type_mut(TypeUrl::Cluster).sent_nonce = "n-1".into();
        });
        let before = registry.snapshot();
        assert_eq!(before.len(), 2);
        assert_eq!(before[0].snapshot_version, "1.2");
        assert_eq!(before[0].types[&TypeUrl::Cluster].sent_nonce, "n-1");

        a.update(|s| {
            s.snapshot_version = "1.3".into();
            s.type_mut(TypeUrl::Cluster).acked_nonce = "n-1".into();
        });
        assert_eq!(before[0].snapshot_version, "1.2", "a copy taken earlier does not change");
        assert_eq!(before[0].types[&TypeUrl::Cluster].acked_nonce, "");
        let after = registry.snapshot();
        assert_eq!(after[0].snapshot_version, "1.3");
        assert_eq!(after[0].types[&TypeUrl::Cluster].acked_nonce, "n-1");

        drop(a);
        let left: Vec<_> = registry.snapshot().iter().map(|s| s.proxy.id.clone()).collect();
        assert_eq!(left, ["sidecar~10.0.0.2~b-1.ns~ns.svc.cluster.local"]);
    }
}
