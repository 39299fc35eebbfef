//! What the admin endpoints read: the process's snapshots, xDS state, readiness and metrics, and
//! who may read the debug endpoints.

use std::sync::Arc;

use crate::readiness::Ready;
use crate::snapshot::{SnapshotHistory, SnapshotReader};
use crate::telemetry::metrics::Registry;
use crate::xds::ConnectionRegistry;
use crate::xds::GenerationCache;

/// What the admin endpoints read.
#[derive(Clone)]
pub struct AdminState {
    /// Latest snapshot.
    pub snapshots: SnapshotReader,
    /// The xDS server's state, where this process serves proxies (not on an ingest node).
    pub xds: Option<XdsState>,
    /// Start-up conditions; `/ready` is 200 once none is pending.
    pub ready: Ready,
    /// The metrics every component of this process registered, for `/metrics`.
    pub metrics: Registry,
    /// Role and id of this process, shown in `/debug/push_status`.
    pub identity: String,
    /// Role-specific status for `/debug/node` (leadership, subscription, membership).
    pub node_status: Option<NodeStatus>,
    /// Debug renders running at once (see [`DEBUG_RENDERS`]).
    pub renders: Arc<tokio::sync::Semaphore>,
    /// Who beside loopback peers may read the debug endpoints; `None`: nobody.
    pub debug_access: Option<DebugAccess>,
    /// The last snapshots held, for `/debug/config_diff`.
    pub history: SnapshotHistory,
}

/// Callers from other addresses may read the debug endpoints with a service-account token
/// (`authorization: Bearer`, reviewed as the secure port does) of the control plane's namespace,
/// as istiod lets its own namespace debug it.
#[derive(Clone)]
pub struct DebugAccess {
    /// Authenticates the token.
    pub authn: Arc<crate::security::Authenticator>,
    /// The control plane's namespace.
    pub namespace: String,
}

/// Debug answers rendered at once; more wait their turn. One at a time leaves the other core free
/// for proxies even when a dashboard polls `/debug/config_dump` in a loop.
pub const DEBUG_RENDERS: usize = 1;

/// A history of the snapshots `reader` sees, kept by a task that ends with the snapshot writer.
pub fn follow_history(reader: SnapshotReader) -> SnapshotHistory {
    let history = SnapshotHistory::new();
    tokio::spawn(history.clone().follow(reader, crate::snapshot::DEFAULT_HISTORY_DEPTH));
    history
}

/// A fresh limit of [`DEBUG_RENDERS`] concurrent debug renders.
pub fn render_limit() -> Arc<tokio::sync::Semaphore> {
    Arc::new(tokio::sync::Semaphore::new(DEBUG_RENDERS))
}

/// The parts of an xDS server the debug endpoints show.
#[derive(Clone)]
pub struct XdsState {
    /// Live xDS connections.
    pub connections: Arc<ConnectionRegistry>,
    /// Generation cache of the xDS server.
    pub cache: Arc<GenerationCache>,
}

/// Produces the role-specific status shown at `/debug/node`.
pub type NodeStatus = Arc<dyn Fn() -> serde_json::Value + Send + Sync>;
