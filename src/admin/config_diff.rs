//! `/debug/config_diff?from=V&to=V[&proxyID=ID]`: what changed between two snapshots this
//! process still holds. With a proxy, its generated config resource by resource, each change down
//! to Envoy's field paths; without one, the Istio objects added, removed or changed.

use std::collections::HashMap;
use std::sync::Arc;

use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use envoy_types::pb::google::protobuf::Any;
use serde_json::{json, Value};

use super::debug::render;
use super::envoy_json::bytes_to_json;
use super::AdminState;
use crate::snapshot::{Snapshot, Version};
use crate::xds::TypeUrl;
use crate::xds::{config_diff as resource_diff, ResourceDiff};

/// Field changes listed per resource at most.
const MAX_FIELDS: usize = 50;

/// Why a request is refused: its status and message.
type Refusal = (StatusCode, String);

fn error(status: StatusCode, message: String) -> Response {
    (status, Json(json!({"error": message}))).into_response()
}

/// The two snapshots compared: `to` (default: the newest held) and `from` (default: the one
/// held before `to`).
fn pick(state: &AdminState, q: &HashMap<String, String>) -> Result<(Arc<Snapshot>, Arc<Snapshot>), Refusal> {
    let history = &state.history;
    let held = || history.versions().iter().map(ToString::to_string).collect::<Vec<_>>().join(", ");
    let parse = |key: &str| -> Result<Option<Version>, Refusal> {
        q.get(key)
            .filter(|v| !v.is_empty())
            .map(|v| v.parse::<Version>().map_err(|e| (StatusCode::BAD_REQUEST, format!("{key}: {e}"))))
            .transpose()
    };
    let (from, to) = (parse("from")?, parse("to")?);
    let versions = history.versions();
    let to = to.or_else(|| versions.last().copied());
    let Some(to) = to else { return Err((StatusCode::SERVICE_UNAVAILABLE, "no snapshot yet".into())) };
    let from = from.or_else(|| versions.iter().rev().find(|v| **v < to).copied());
    let Some(from) = from else {
        return Err((StatusCode::NOT_FOUND, format!("no snapshot held before {to} (held: {})", held())));
    };
    let get = |v: Version| {
        history
            .get(v)
            .ok_or_else(|| (StatusCode::NOT_FOUND, format!("snapshot {v} is not held here (held: {})", held())))
    };
    Ok((get(from)?, get(to)?))
}

/// The handler.
pub async fn config_diff(State(state): State<AdminState>, Query(q): Query<HashMap<String, String>>) -> Response {
    let (from, to) = match pick(&state, &q) {
        Ok(pair) => pair,
        Err((status, message)) => return error(status, message),
    };
    let Some(wanted) = q.get("proxyID").filter(|s| !s.is_empty()).cloned() else {
        return render(&state, move || Ok(objects_diff(&from, &to))).await;
    };
    let Some(xds) = &state.xds else {
        return error(StatusCode::NOT_FOUND, "this process serves no proxies".into());
    };
    let connections = xds.connections.snapshot();
    let Some(conn) = crate::xds::find_proxy(&connections, &wanted) else {
        return error(StatusCode::NOT_FOUND, format!("proxy {wanted} is not connected here"));
    };
    let (proxy, view) = (conn.proxy.id.clone(), conn.proxy.view());
    render(&state, move || {
        let changes: Vec<Value> = resource_diff(&from, &to, &view).iter().map(describe).collect();
        Ok(json!({"proxy": proxy, "from": from.version.to_string(), "to": to.version.to_string(), "resources": changes}))
    })
    .await
}

/// The Istio objects that differ between the snapshots.
fn objects_diff(from: &Snapshot, to: &Snapshot) -> Value {
    let mut objects = Vec::new();
    for (key, after) in &to.configs {
        match from.configs.get(key) {
            None => objects.push(json!({"object": key.to_string(), "change": "added"})),
            Some(before) if before != after => objects.push(json!({"object": key.to_string(), "change": "changed"})),
            Some(_) => {}
        }
    }
    for key in from.configs.keys().filter(|k| !to.configs.contains_key(*k)) {
        objects.push(json!({"object": key.to_string(), "change": "removed"}));
    }
    json!({"from": from.version.to_string(), "to": to.version.to_string(), "objects": objects})
}

/// One resource's change, with Envoy's field paths that differ (never a secret's contents).
fn describe(d: &ResourceDiff) -> Value {
    let change = match (&d.before, &d.after) {
        (None, _) => "added",
        (_, None) => "removed",
        _ => "changed",
    };
    let mut out = json!({"type": d.type_url.short(), "name": d.name, "change": change});
    if let (Some(before), Some(after), false) = (&d.before, &d.after, d.type_url == TypeUrl::Secret) {
        let mut fields = Vec::new();
        match (as_json(before), as_json(after)) {
            (Ok(a), Ok(b)) => field_diff(&a, &b, "", &mut fields),
            (Err(e), _) | (_, Err(e)) => fields.push(format!("(not comparable: {e})")),
        }
        out["fields"] = json!(fields);
    }
    out
}

fn as_json(any: &Any) -> Result<Value, String> {
    let name = any.type_url.rsplit('/').next().unwrap_or_default();
    bytes_to_json(name, &any.value).map_err(|e| e.to_string())
}

/// The paths where `a` and `b` differ, as `path: old -> new` (at most [`MAX_FIELDS`]).
fn field_diff(a: &Value, b: &Value, path: &str, out: &mut Vec<String>) {
    if out.len() >= MAX_FIELDS || a == b {
        return;
    }
    match (a, b) {
        (Value::Object(x), Value::Object(y)) => {
            let mut keys: Vec<&String> = x.keys().chain(y.keys()).collect();
            keys.sort();
            keys.dedup();
            for k in keys {
                let (p, q) = (x.get(k).unwrap_or(&Value::Null), y.get(k).unwrap_or(&Value::Null));
                field_diff(p, q, &format!("{path}.{k}"), out);
            }
        }
        (Value::Array(x), Value::Array(y)) if x.len() == y.len() => {
            for (i, (p, q)) in x.iter().zip(y).enumerate() {
                field_diff(p, q, &format!("{path}[{i}]"), out);
            }
        }
        _ => {
            let short = |v: &Value| v.to_string().chars().take(120).collect::<String>();
            out.push(format!("{path}: {} -> {}", short(a), short(b)));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn field_paths_name_what_changed() {
        let a = json!({"name": "c", "connect_timeout": "10s", "lb": [{"w": 1}, {"w": 2}]});
        let b = json!({"name": "c", "connect_timeout": "5s", "lb": [{"w": 1}, {"w": 3}], "extra": true});
        let mut out = Vec::new();
        field_diff(&a, &b, "", &mut out);
        assert_eq!(out, [".connect_timeout: \"10s\" -> \"5s\"", ".extra: null -> true", ".lb[1].w: 2 -> 3"]);
    }
}
