//! `/debug/*` endpoints (Istio's debug interface, JSON).

use std::collections::HashMap;

use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::{json, Value};

use super::envoy_json::to_json;
use super::AdminState;
use crate::snapshot::Snapshot;
use crate::xds::TypeUrl;
use crate::xds::{self, DumpedType};

fn no_snapshot() -> Response {
    (StatusCode::SERVICE_UNAVAILABLE, Json(json!({"error": "no snapshot yet"}))).into_response()
}

/// Seconds since the Unix epoch, as a float (what Istio's debug JSON uses for times).
fn unix_seconds(t: std::time::SystemTime) -> f64 {
    t.duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs_f64()).unwrap_or_default()
}

/// Config objects being served, rejected documents and ignored ones.
pub async fn configz(State(state): State<AdminState>) -> Response {
    let Some(snap) = state.snapshots.current() else { return no_snapshot() };
    let rejected = rejected_resources(&connections(&state));
    render(&state, move || Ok(configz_json(&snap, rejected))).await
}

/// Resources connected proxies rejected (NACK) and that are kept out of their config.
fn rejected_resources(connections: &[std::sync::Arc<crate::xds::ConnectionStatus>]) -> Vec<Value> {
    let mut out = Vec::new();
    for c in connections {
        for (type_url, status) in c.types.iter() {
            for (name, r) in &status.rejected {
                out.push(json!({"proxy": c.proxy.id, "type": type_url.short(), "name": name, "message": r.message}));
            }
        }
    }
    out
}

fn configz_json(snap: &Snapshot, rejected_by_proxies: Vec<Value>) -> Value {
    let configs: Vec<Value> = snap
        .configs
        .values()
        .map(|c| {
            json!({
                "kind": c.key.kind,
                "namespace": c.key.namespace,
                "name": c.key.name,
                "apiVersion": c.meta.api_version,
                "labels": c.meta.labels,
                "spec": c.spec,
            })
        })
        .collect();
    json!({
        "version": snap.version.to_string(),
        "configs": configs,
        "errors": snap.errors.iter().map(|e| json!({
            "file": e.file,
            "document": e.document,
            "kind": e.object.as_ref().map(|k| k.kind.name()),
            "namespace": e.object.as_ref().map(|k| k.namespace.clone()),
            "name": e.object.as_ref().map(|k| k.name.clone()),
            "field": e.error.field,
            "reason": e.error.reason,
            "message": e.to_string(),
        })).collect::<Vec<_>>(),
        "ignored": *snap.ignored,
        "kubernetes": kube_counts(snap),
        "rejected_by_proxies": rejected_by_proxies,
    })
}

/// How many Kubernetes objects the snapshot holds, per kind present (the objects themselves are
/// too many to list in a large cluster).
fn kube_counts(snap: &Snapshot) -> std::collections::BTreeMap<&'static str, usize> {
    let mut counts = std::collections::BTreeMap::new();
    for key in snap.kube.keys() {
        *counts.entry(key.kind.name()).or_insert(0) += 1;
    }
    counts
}

/// Services and their endpoints.
pub async fn registryz(State(state): State<AdminState>) -> Response {
    let Some(snap) = state.snapshots.current() else { return no_snapshot() };
    render(&state, move || Ok(registryz_json(&snap))).await
}

fn registryz_json(snap: &Snapshot) -> Value {
    let services: Vec<Value> = snap
        .registry
        .services
        .iter()
        .map(|(key, svc)| {
            json!({
                "hostname": key.hostname,
                "namespace": key.namespace,
                "service": **svc,
                "endpoints": snap.registry.endpoints.get(key).map(|e| e.as_slice().to_vec()).unwrap_or_default(),
            })
        })
        .collect();
    json!({"version": snap.version.to_string(), "services": services})
}

/// The live connections, none where this process serves no proxies.
fn connections(state: &AdminState) -> Vec<std::sync::Arc<crate::xds::ConnectionStatus>> {
    state.xds.as_ref().map(|x| x.connections.snapshot()).unwrap_or_default()
}

/// Per proxy and type: sent version and nonce, acked version, last NACK.
pub async fn syncz(State(state): State<AdminState>) -> Response {
    let connections = connections(&state);
    render(&state, move || Ok(json!(connections.iter().map(|c| json!(**c)).collect::<Vec<_>>()))).await
}

/// The latest push: version, what changed, and how many proxies are on it.
pub async fn push_status(State(state): State<AdminState>) -> Response {
    let Some(snap) = state.snapshots.current() else { return no_snapshot() };
    let connections = connections(&state);
    let current = snap.version.to_string();
    let synced = connections.iter().filter(|c| c.snapshot_version == current).count();
    Json(json!({
        "server": state.identity,
        "version": current,
        "trace_id": crate::telemetry::trace::snapshot_trace_id(snap.version),
        "built_at": unix_seconds(snap.built_at),
        "full": snap.changes.full,
        "endpoints_only": snap.changes.endpoints_only(),
        "changed": snap.changes.keys,
        "services": snap.registry.services.len(),
        "configs": snap.configs.len(),
        "config_errors": snap.errors.len(),
        "proxies": connections.len(),
        "proxies_on_version": synced,
    }))
    .into_response()
}

/// The config meshpilot generates for a connected proxy (`?proxyID=` node id, or `pod.namespace`).
pub async fn config_dump(State(state): State<AdminState>, Query(q): Query<HashMap<String, String>>) -> Response {
    let Some(snap) = state.snapshots.current() else { return no_snapshot() };
    let Some(wanted) = q.get("proxyID").filter(|s| !s.is_empty()) else {
        return (StatusCode::BAD_REQUEST, Json(json!({"error": "proxyID query parameter required"}))).into_response();
    };
    let Some(xds) = &state.xds else {
        return (StatusCode::NOT_FOUND, Json(json!({"error": "this process serves no proxies"}))).into_response();
    };
    let connections = xds.connections.snapshot();
    let Some(conn) = crate::xds::find_proxy(&connections, wanted) else {
        return (StatusCode::NOT_FOUND, Json(json!({"error": format!("proxy {wanted} is not connected here")})))
            .into_response();
    };
    let view = crate::envoy::SharedView::new(conn.proxy.view());
    let mut generated = Vec::new();
    for type_url in TypeUrl::PUSH_ORDER {
        generated.push((type_url, xds.cache.get(&snap, &view, type_url).await));
    }
    let conn = conn.clone();
    render(&state, move || {
        let types: Vec<DumpedType<'_>> = generated
            .iter()
            .map(|(type_url, g)| DumpedType { type_url: *type_url, generated: g, status: conn.types.get(type_url) })
            .collect();
        to_json(&xds::config_dump(&types)).map_err(|e| e.to_string())
    })
    .await
}

/// Builds and encodes a debug answer on the blocking pool, at most `DEBUG_RENDERS` at once, so
/// rendering a large mesh never delays `/ready` or `/metrics` on the async workers.
pub(super) async fn render(
    state: &AdminState,
    build: impl FnOnce() -> Result<Value, String> + Send + 'static,
) -> Response {
    let Ok(_permit) = state.renders.clone().acquire_owned().await else {
        return (StatusCode::SERVICE_UNAVAILABLE, Json(json!({"error": "shutting down"}))).into_response();
    };
    let encoded =
        tokio::task::spawn_blocking(move || build().and_then(|v| serde_json::to_vec(&v).map_err(|e| e.to_string())));
    match encoded.await {
        Ok(Ok(body)) => ([(axum::http::header::CONTENT_TYPE, "application/json")], body).into_response(),
        Ok(Err(e)) => (StatusCode::INTERNAL_SERVER_ERROR, Json(json!({"error": e}))).into_response(),
        Err(e) => (StatusCode::INTERNAL_SERVER_ERROR, Json(json!({"error": e.to_string()}))).into_response(),
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::registry::kubernetes::{KubeNamespace, KubeNode, KubeObject};
    use crate::snapshot::{ChangeSet, SourceState, Version};

    #[test]
    fn configz_counts_kubernetes_objects_per_kind() {
        let mut state = SourceState::default();
        let ns = |name: &str| KubeObject::Namespace(KubeNamespace { name: name.into(), labels: Default::default() });
        let node = KubeObject::Node(KubeNode {
            name: "n".into(),
            region: String::new(),
            zone: String::new(),
            subzone: String::new(),
        });
        for o in [ns("a"), ns("b"), node] {
            state.kube.insert(o.key(), Arc::new(o));
        }
        let snap = Snapshot::build(Version::new(1, 1), ChangeSet::full(), &state);
        assert_eq!(configz_json(&snap, Vec::new())["kubernetes"], json!({"Namespace": 2, "Node": 1}));
    }
}
