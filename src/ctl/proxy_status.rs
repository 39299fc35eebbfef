//! `meshpilot proxy-status`: a line per proxy with its CDS, LDS, EDS and RDS each SYNCED, NOT
//! SENT, STALE or NACK (with Envoy's error), the frontend serving it and the snapshot version its
//! config comes from. The node asked answers for its own proxies; the frontends its membership
//! lists answer over their xDS port, so any node of a split deployment covers them all.

use std::fmt;

use envoy_types::pb::envoy::service::status::v3::{ClientConfig, ConfigStatus};
use prost::Message;
use serde_json::Value;

use super::admin_client::{get_json, members, Member};
use super::{tables, xds_client, CtlError};
use crate::xds::{TypeUrl, SYNCZ};

/// The types shown, in istioctl's column order.
const COLUMNS: [TypeUrl; 4] = [TypeUrl::Cluster, TypeUrl::Listener, TypeUrl::Endpoint, TypeUrl::Route];

/// The sync state of one type of one proxy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SyncState {
    /// The proxy acknowledged the last response.
    Synced,
    /// Nothing was sent yet.
    NotSent,
    /// A response awaits the proxy's answer.
    Stale,
    /// The proxy rejected a response: Envoy's error.
    Nack(String),
    /// The proxy did not subscribe to the type.
    Ignored,
}

impl fmt::Display for SyncState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SyncState::Synced => f.write_str("SYNCED"),
            SyncState::NotSent => f.write_str("NOT SENT"),
            SyncState::Stale => f.write_str("STALE"),
            SyncState::Nack(error) => write!(f, "NACK ({})", error.lines().next().unwrap_or_default()),
            SyncState::Ignored => f.write_str("IGNORED"),
        }
    }
}

/// One proxy's line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProxyStatus {
    /// Node id.
    pub proxy: String,
    /// CDS, LDS, EDS and RDS.
    pub types: [SyncState; 4],
    /// The server holding its stream (`standalone`, `frontend/<id>`).
    pub frontend: String,
    /// The snapshot version its config was last computed from.
    pub version: String,
}

/// What `collect` found, and the frontends it could not ask.
#[derive(Debug, Default)]
pub struct Collected {
    /// Proxies, sorted by node id.
    pub proxies: Vec<ProxyStatus>,
    /// Frontends that did not answer, with why.
    pub unreachable: Vec<String>,
}

/// The status of every proxy the node at `admin_url` and the frontends it knows serve.
pub async fn collect(admin_url: &str) -> Result<Collected, CtlError> {
    let syncz = get_json(admin_url, "/debug/syncz").await?;
    let server = get_json(admin_url, "/debug/push_status")
        .await
        .ok()
        .and_then(|p| p["server"].as_str().map(str::to_string))
        .unwrap_or_else(|| "?".to_string());
    let mut out = Collected::default();
    for conn in syncz.as_array().into_iter().flatten() {
        out.proxies.push(from_syncz(conn, &server));
    }
    for Member { id, addr } in members(admin_url).await {
        let frontend = format!("frontend/{id}");
        if frontend == server {
            continue;
        }
        match xds_client::debug_request(&addr, SYNCZ, &[]).await {
            Ok(answer) => {
                for resource in answer.resources {
                    match ClientConfig::decode(resource.value.as_slice()) {
                        Ok(config) => out.proxies.push(from_client_config(&config, &frontend)),
                        Err(e) => out.unreachable.push(format!("{frontend} ({addr}): undecodable answer: {e}")),
                    }
                }
            }
            Err(e) => out.unreachable.push(format!("{frontend}: {e}")),
        }
    }
    out.proxies.sort_by(|a, b| a.proxy.cmp(&b.proxy));
    Ok(out)
}

/// Whether `name` (a node id, or `pod.namespace`) names the proxy `node_id`.
pub fn names_proxy(name: &str, node_id: &str) -> bool {
    node_id == name || node_id.split('~').nth(2) == Some(name)
}

/// The table of `proxies`.
pub fn render(proxies: &[ProxyStatus]) -> String {
    let rows: Vec<Vec<String>> = proxies
        .iter()
        .map(|p| {
            let mut row = vec![p.proxy.clone()];
            row.extend(p.types.iter().map(ToString::to_string));
            row.extend([p.frontend.clone(), p.version.clone()]);
            row
        })
        .collect();
    tables::render(&["NAME", "CDS", "LDS", "EDS", "RDS", "FRONTEND", "VERSION"], &rows, 5)
}

/// A line from one connection of `/debug/syncz`.
fn from_syncz(conn: &Value, frontend: &str) -> ProxyStatus {
    let state = |type_url: TypeUrl| {
        let t = &conn["types"][format!("{type_url:?}")];
        let text = |k: &str| t[k].as_str().unwrap_or_default().to_string();
        if t.is_null() {
            SyncState::Ignored
        } else if !t["last_nack"].is_null() {
            SyncState::Nack(t["last_nack"]["message"].as_str().unwrap_or_default().to_string())
        } else if text("sent_nonce").is_empty() {
            SyncState::NotSent
        } else if text("acked_nonce") == text("sent_nonce") {
            SyncState::Synced
        } else {
            SyncState::Stale
        }
    };
    ProxyStatus {
        proxy: conn["proxy"]["id"].as_str().unwrap_or_default().to_string(),
        types: COLUMNS.map(state),
        frontend: frontend.to_string(),
        version: conn["snapshot_version"].as_str().unwrap_or_default().to_string(),
    }
}

/// A line from a frontend's `istio.io/debug/syncz` answer.
fn from_client_config(config: &ClientConfig, frontend: &str) -> ProxyStatus {
    let entry = |type_url: TypeUrl| config.generic_xds_configs.iter().find(|g| g.type_url == type_url.as_str());
    let state = |type_url: TypeUrl| match entry(type_url) {
        None => SyncState::Ignored,
        Some(g) => match ConfigStatus::try_from(g.config_status) {
            Ok(ConfigStatus::Synced) => SyncState::Synced,
            Ok(ConfigStatus::NotSent) => SyncState::NotSent,
            Ok(ConfigStatus::Error) => {
                SyncState::Nack(g.error_state.as_ref().map(|e| e.details.clone()).unwrap_or_default())
            }
            _ => SyncState::Stale,
        },
    };
    ProxyStatus {
        proxy: config.node.as_ref().map(|n| n.id.clone()).unwrap_or_default(),
        types: COLUMNS.map(state),
        frontend: frontend.to_string(),
        version: entry(TypeUrl::Cluster).map(|g| g.version_info.clone()).unwrap_or_default(),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn syncz_states_become_istioctls_words() {
        let conn = json!({
            "proxy": {"id": "sidecar~10.0.0.1~a-1.ns~ns.svc.cluster.local"},
            "snapshot_version": "1.4",
            "types": {
                "Cluster": {"sent_nonce": "3", "acked_nonce": "3", "last_nack": null},
                "Listener": {"sent_nonce": "4", "acked_nonce": "2", "last_nack": null},
                "Endpoint": {"sent_nonce": "", "acked_nonce": "", "last_nack": null},
                "Route": {"sent_nonce": "5", "acked_nonce": "4", "last_nack": {"message": "route: bad regex\nmore"}},
            }
        });
        let status = from_syncz(&conn, "standalone");
        assert_eq!(
            status.types,
            [SyncState::Synced, SyncState::Stale, SyncState::NotSent, SyncState::Nack("route: bad regex\nmore".into())]
        );
        assert_eq!(
            render(&[status]),
            "NAME                                             CDS        LDS       EDS          RDS                         FRONTEND       VERSION\n\
             sidecar~10.0.0.1~a-1.ns~ns.svc.cluster.local     SYNCED     STALE     NOT SENT     NACK (route: bad regex)     standalone     1.4\n"
        );
    }

    #[test]
    fn proxies_are_named_by_node_id_or_pod_dot_namespace() {
        let id = "sidecar~10.0.0.1~a-1.ns~ns.svc.cluster.local";
        assert!(names_proxy(id, id) && names_proxy("a-1.ns", id));
        assert!(!names_proxy("a-1", id) && !names_proxy("a-1.other", id));
    }
}
