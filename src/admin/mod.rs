//! Admin HTTP server: readiness, metrics and debug endpoints.

mod config_diff;
mod debug;
pub mod envoy_json;
mod state;

use std::net::SocketAddr;

use axum::extract::{ConnectInfo, State};
use axum::http::StatusCode;
use axum::response::IntoResponse;
use axum::routing::get;
use axum::Router;

pub use state::{follow_history, render_limit, AdminState, DebugAccess, NodeStatus, XdsState, DEBUG_RENDERS};

/// The admin router. The debug endpoints reveal configuration (and every proxy's): they answer
/// only loopback peers, as istiod's do; `/ready`, `/healthz` and `/metrics` answer anyone.
pub fn router(state: AdminState) -> Router {
    let debug = Router::new()
        .route("/debug/configz", get(debug::configz))
        .route("/debug/registryz", get(debug::registryz))
        .route("/debug/syncz", get(debug::syncz))
        .route("/debug/push_status", get(debug::push_status))
        .route("/debug/config_dump", get(debug::config_dump))
        .route("/debug/config_diff", get(config_diff::config_diff))
        .route("/debug/node", get(node))
        .route_layer(axum::middleware::from_fn_with_state(state.clone(), loopback_or_control_plane));
    Router::new()
        .route("/ready", get(ready))
        .route("/healthz", get(healthz))
        .route("/metrics", get(metrics))
        .merge(debug)
        .with_state(state)
}

/// Lets loopback peers through, and callers with a token of the control plane's namespace; fails
/// closed (a request without a known peer is refused).
async fn loopback_or_control_plane(
    State(state): State<AdminState>,
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    let loopback = request
        .extensions()
        .get::<ConnectInfo<SocketAddr>>()
        .is_some_and(|ConnectInfo(addr)| addr.ip().to_canonical().is_loopback());
    if loopback {
        return next.run(request).await;
    }
    let refused = "debug endpoints reveal configuration: they answer loopback (127.0.0.1, ::1) peers, and \
                   service-account tokens of the control plane's namespace (authorization: Bearer)\n";
    let Some(access) = &state.debug_access else { return (StatusCode::FORBIDDEN, refused).into_response() };
    if !request.headers().contains_key(axum::http::header::AUTHORIZATION) {
        return (StatusCode::FORBIDDEN, refused).into_response();
    }
    match access.authn.authenticate(None, request.headers()).await {
        Ok(ids) if ids.iter().any(|id| id.namespace() == access.namespace) => next.run(request).await,
        Ok(_) => (StatusCode::FORBIDDEN, refused).into_response(),
        Err(e) => (StatusCode::FORBIDDEN, format!("{e}\n{refused}")).into_response(),
    }
}

/// 200 while the process runs (liveness; readiness is `/ready`).
async fn healthz() -> &'static str {
    "ok\n"
}

/// Serves the admin router on an already bound `listener` until `shutdown` resolves.
pub async fn serve(
    listener: tokio::net::TcpListener,
    state: AdminState,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    if let Ok(addr) = listener.local_addr() {
        tracing::info!(%addr, "admin server listening");
    }
    axum::serve(listener, router(state).into_make_service_with_connect_info::<SocketAddr>())
        .with_graceful_shutdown(shutdown)
        .await
}

/// 200 once every start-up condition is met (the first snapshot is in, listeners are bound), 503 before.
async fn ready(State(state): State<AdminState>) -> impl IntoResponse {
    let pending = state.ready.pending();
    match state.snapshots.current() {
        Some(s) if pending.is_empty() => (StatusCode::OK, format!("ready: snapshot {}\n", s.version)),
        _ if pending.is_empty() => (StatusCode::SERVICE_UNAVAILABLE, "not ready: no snapshot yet\n".to_string()),
        _ => (StatusCode::SERVICE_UNAVAILABLE, format!("not ready: waiting for {}\n", pending.join(", "))),
    }
}

/// Role-specific status (`{"role": ...}` for standalone).
async fn node(State(state): State<AdminState>) -> impl IntoResponse {
    let status = state.node_status.as_ref().map(|f| f()).unwrap_or_else(|| serde_json::json!({"role": state.identity}));
    axum::Json(status)
}

async fn metrics(State(state): State<AdminState>) -> impl IntoResponse {
    (
        [(axum::http::header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        crate::telemetry::metrics::render(&state.metrics),
    )
}

#[cfg(test)]
mod tests {
    use tower_service::Service;

    use super::*;
    use crate::readiness::Ready;
    use crate::snapshot::SnapshotHistory;
    use crate::telemetry::metrics::Registry;

    fn state() -> AdminState {
        let (_writer, snapshots) = crate::snapshot::channel();
        AdminState {
            snapshots,
            xds: None,
            ready: Ready::new(),
            metrics: Registry::new(),
            identity: "test".into(),
            node_status: None,
            renders: render_limit(),
            debug_access: None,
            history: SnapshotHistory::new(),
        }
    }

    async fn status(path: &str, peer: Option<SocketAddr>) -> StatusCode {
        status_with(state(), path, peer, None).await
    }

    async fn status_with(state: AdminState, path: &str, peer: Option<SocketAddr>, token: Option<&str>) -> StatusCode {
        let mut request = axum::http::Request::get(path).body(axum::body::Body::empty()).expect("request");
        if let Some(peer) = peer {
            request.extensions_mut().insert(ConnectInfo(peer));
        }
        if let Some(token) = token {
            let value = axum::http::HeaderValue::from_str(&format!("Bearer {token}")).expect("header");
            request.headers_mut().insert(axum::http::header::AUTHORIZATION, value);
        }
        let mut router = router(state);
        match router.call(request).await {
            Ok(response) => response.status(),
            Err(never) => match never {},
        }
    }

    #[tokio::test]
    async fn debug_endpoints_answer_loopback_peers_only() {
        let outside = SocketAddr::from(([10, 1, 2, 3], 40000));
        for (path, peer, want) in [
            ("/debug/node", Some(SocketAddr::from(([127, 0, 0, 1], 40000))), StatusCode::OK),
            ("/debug/node", Some("[::1]:40000".parse().expect("addr")), StatusCode::OK),
            ("/debug/node", Some("[::ffff:127.0.0.1]:40000".parse().expect("addr")), StatusCode::OK),
            ("/debug/node", Some(outside), StatusCode::FORBIDDEN),
            ("/debug/configz", Some(outside), StatusCode::FORBIDDEN),
            ("/debug/config_dump?proxyID=x", Some(outside), StatusCode::FORBIDDEN),
            ("/debug/node", None, StatusCode::FORBIDDEN),
            ("/metrics", Some(outside), StatusCode::OK),
            ("/healthz", Some(outside), StatusCode::OK),
            ("/ready", Some(outside), StatusCode::SERVICE_UNAVAILABLE),
        ] {
            assert_eq!(status(path, peer).await, want, "{path} from {peer:?}");
        }
    }

    #[tokio::test]
    async fn a_token_that_cannot_be_reviewed_opens_nothing() {
        use crate::security::{Authenticator, SharedTrustDomain};
        let outside = Some(SocketAddr::from(([10, 1, 2, 3], 40000)));
        // Without Kubernetes the token cannot be reviewed: refused, as without one.
        let authn = Authenticator::new(None, SharedTrustDomain::default());
        let state =
            AdminState { debug_access: Some(DebugAccess { authn, namespace: "istio-system".into() }), ..state() };
        assert_eq!(status_with(state.clone(), "/debug/node", outside, Some("t")).await, StatusCode::FORBIDDEN);
        assert_eq!(status_with(state.clone(), "/debug/node", outside, None).await, StatusCode::FORBIDDEN);
        let loopback = Some(SocketAddr::from(([127, 0, 0, 1], 40000)));
        assert_eq!(status_with(state, "/debug/node", loopback, None).await, StatusCode::OK);
    }
}
