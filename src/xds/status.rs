//! Per-proxy sync status (what was sent, acked and rejected), for `/debug/syncz` and tests.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use arc_swap::ArcSwap;
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
    /// The proxy (shared: every push publishes a new status, which must not copy it).
    pub proxy: Arc<Proxy>,
    /// When it connected.
    pub connected_at: SystemTime,
    /// Snapshot version the proxy's config was last computed from.
    pub snapshot_version: String,
    /// Pushes (snapshots that led to at least one response) on this connection.
    pub pushes: u64,
    /// The ADS protocol of the stream.
    pub transport: Transport,
    /// Per type (shared, copied only when a type's status changes, not on every push).
    pub types: Arc<BTreeMap<TypeUrl, TypeStatus>>,
}

impl ConnectionStatus {
    /// The status of `type_url`, to change (the shared map is copied first if another status holds it).
    pub fn type_mut(&mut self, type_url: TypeUrl) -> &mut TypeStatus {
        Arc::make_mut(&mut self.types).entry(type_url).or_default()
    }
}

/// Registry of live connections. The lock is taken on connect and disconnect only; each
/// connection publishes its own status through an `ArcSwap`.
#[derive(Default)]
pub struct ConnectionRegistry {
    next_id: AtomicU64,
    live: Mutex<HashMap<u64, Arc<ArcSwap<ConnectionStatus>>>>,
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
    status: Arc<ArcSwap<ConnectionStatus>>,
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
        let status = Arc::new(ArcSwap::from_pointee(ConnectionStatus {
            connection_id: format!("{}-{id}", proxy.id),
            proxy: Arc::new(proxy),
            connected_at: SystemTime::now(),
            snapshot_version: String::new(),
            pushes: 0,
            transport: Transport::StateOfTheWorld,
            types: Arc::default(),
        }));
        self.metrics.proxy_connected(&status.load().proxy.istio_version);
        self.lock().insert(id, status.clone());
        Registration { id, status, registry: self.clone() }
    }

    /// Current status of every connection, sorted by proxy id.
    pub fn snapshot(&self) -> Vec<Arc<ConnectionStatus>> {
        let mut all: Vec<_> = self.lock().values().map(|s| s.load_full()).collect();
        all.sort_by(|a, b| a.proxy.id.cmp(&b.proxy.id).then(a.connection_id.cmp(&b.connection_id)));
        all
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Arc<ArcSwap<ConnectionStatus>>>> {
        match self.live.lock() {
            Ok(g) => g,
            Err(poisoned) => poisoned.into_inner(),
        }
    }
}

impl Registration {
    /// Publishes an updated status.
    pub fn update(&self, f: impl FnOnce(&mut ConnectionStatus)) {
        let mut next = ConnectionStatus::clone(&self.status.load());
        f(&mut next);
        self.status.store(Arc::new(next));
    }
}

impl Drop for Registration {
    fn drop(&mut self) {
        self.registry.lock().remove(&self.id);
        self.registry.metrics.proxy_disconnected(&self.status.load().proxy.istio_version);
    }
}
