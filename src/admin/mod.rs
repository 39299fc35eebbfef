//! Admin HTTP server: readiness, metrics and debug endpoints.

mod debug;

use std::net::SocketAddr;
use std::sync::Arc;

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::IntoResponse;
use axum::routing::get;
use axum::Router;

use crate::snapshot::SnapshotReader;
use crate::xds::cache::GenerationCache;
use crate::xds::status::ConnectionRegistry;

/// What the admin endpoints read.
#[derive(Clone)]
pub struct AdminState {
    /// Latest snapshot.
    pub snapshots: SnapshotReader,
    /// Live xDS connections.
    pub connections: Arc<ConnectionRegistry>,
    /// Generation cache of the xDS server.
    pub cache: Arc<GenerationCache>,
    /// Role and id of this process, shown in `/debug/push_status`.
    pub identity: String,
    /// Role-specific status for `/debug/node` (leadership, subscription, membership).
    pub node_status: Option<NodeStatus>,
}

/// Produces the role-specific status shown at `/debug/node`.
pub type NodeStatus = Arc<dyn Fn() -> serde_json::Value + Send + Sync>;

/// The admin router.
pub fn router(state: AdminState) -> Router {
    Router::new()
        .route("/ready", get(ready))
        .route("/metrics", get(metrics))
        .route("/debug/configz", get(debug::configz))
        .route("/debug/registryz", get(debug::registryz))
        .route("/debug/syncz", get(debug::syncz))
        .route("/debug/push_status", get(debug::push_status))
        .route("/debug/config_dump", get(debug::config_dump))
        .route("/debug/node", get(node))
        .with_state(state)
}

/// Serves the admin router on `addr` until `shutdown` resolves.
pub async fn serve(
    addr: SocketAddr,
    state: AdminState,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let listener = tokio::net::TcpListener::bind(addr).await?;
    tracing::info!(%addr, "admin server listening");
    axum::serve(listener, router(state)).with_graceful_shutdown(shutdown).await
}

/// 200 once the first snapshot is in (proxies can be served), 503 before.
async fn ready(State(state): State<AdminState>) -> impl IntoResponse {
    match state.snapshots.current() {
        Some(s) => (StatusCode::OK, format!("ready: snapshot {}\n", s.version)),
        None => (StatusCode::SERVICE_UNAVAILABLE, "not ready: no snapshot yet\n".to_string()),
    }
}

/// Role-specific status (`{}` for standalone).
async fn node(State(state): State<AdminState>) -> impl IntoResponse {
    let status = state.node_status.as_ref().map(|f| f()).unwrap_or_else(|| serde_json::json!({"role": state.identity}));
    axum::Json(status)
}

async fn metrics() -> impl IntoResponse {
    ([(axum::http::header::CONTENT_TYPE, "text/plain; version=0.0.4")], crate::telemetry::metrics::METRICS.render())
}
