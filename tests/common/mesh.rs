//! A standalone meshpilot with Envoys of the `shop` mesh: the ingress gateway and a `client`
//! sidecar with the node identities meshpilot expects, and checks that they took every update.

use std::collections::HashMap;
use std::path::Path;

use serde_json::{json, Value};

use super::config_dump::dynamic_route_config_names;
use super::envoy::Envoy;
use super::istio::NS;
use super::meshpilot::Meshpilot;
use super::poll::{CONVERGE_TIMEOUT, STARTUP_TIMEOUT};

/// Istio ingress gateway node id (namespace `istio-system`).
pub const GATEWAY_NODE_ID: &str = "router~127.0.0.1~gw-1.istio-system~istio-system.svc.cluster.local";
/// Sidecar node id of a `client` workload in `shop`.
pub const SIDECAR_NODE_ID: &str = "sidecar~127.0.0.1~client-1.shop~shop.svc.cluster.local";

/// Node metadata of the ingress gateway: namespace `istio-system`, labels `istio: ingressgateway`.
pub fn gateway_metadata() -> Value {
    json!({"NAMESPACE": "istio-system", "LABELS": {"istio": "ingressgateway"}})
}

/// Node metadata of the `client` sidecar in `shop`, without interception (its egress listener
/// binds 127.0.0.1).
pub fn sidecar_metadata() -> Value {
    json!({"NAMESPACE": NS, "LABELS": {"app": "client"}, "INTERCEPTION_MODE": "NONE"})
}

/// Starts a standalone meshpilot on `config_dir` and waits until it is ready.
pub async fn start_meshpilot(config_dir: &Path) -> Meshpilot {
    let cp = Meshpilot::standalone(config_dir).start();
    cp.wait_ready(STARTUP_TIMEOUT).await;
    cp
}

/// Starts the ingress gateway Envoy, waits until it is ready and checks it rejected nothing.
pub async fn start_gateway(cp: &Meshpilot) -> Envoy {
    let envoy = Envoy::builder(GATEWAY_NODE_ID, cp.xds_addr()).metadata(gateway_metadata()).start();
    envoy.wait_ready(STARTUP_TIMEOUT).await;
    assert_no_rejections(&envoy).await;
    envoy
}

/// Starts the `client` sidecar Envoy, waits until it is ready and checks it rejected nothing.
pub async fn start_sidecar(cp: &Meshpilot) -> Envoy {
    let envoy = Envoy::builder(SIDECAR_NODE_ID, cp.xds_addr()).metadata(sidecar_metadata()).start();
    envoy.wait_ready(STARTUP_TIMEOUT).await;
    assert_no_rejections(&envoy).await;
    envoy
}

/// Asserts that Envoy rejected no xDS update (see [`rejection_problem`]). Panics with the problem
/// and Envoy's log lines about rejections.
pub async fn assert_no_rejections(envoy: &Envoy) {
    let (stats, dump) = (envoy.stats().await, envoy.config_dump().await);
    if let Some(problem) = rejection_problem(&stats, &dump) {
        let logs = envoy.logs();
        let lines: Vec<&str> = logs.lines().filter(|l| l.contains("rejected") || l.contains("error")).collect();
        panic!("Envoy ({}) {problem}\nlog lines:\n{}", envoy.node_id(), lines.join("\n"));
    }
}

/// What is wrong, if anything, with Envoy's `/stats` and `/config_dump` as far as rejected xDS
/// updates go: every stat ending in `update_rejected` (CDS, LDS, each RDS route configuration's
/// `http.<stat_prefix>.rds.<name>.update_rejected`, EDS per cluster) must be 0, and the CDS and
/// LDS counters and one RDS counter per dynamic route configuration must exist, so a renamed stat
/// cannot make this pass vacuously.
pub fn rejection_problem(stats: &HashMap<String, u64>, dump: &Value) -> Option<String> {
    let mut checked: Vec<&String> = stats.keys().filter(|k| k.ends_with("update_rejected")).collect();
    checked.sort();
    for required in ["cluster_manager.cds.update_rejected", "listener_manager.lds.update_rejected"] {
        if !stats.contains_key(required) {
            return Some(format!("has no stat {required}; has: {checked:?}"));
        }
    }
    for rc in dynamic_route_config_names(dump) {
        // Envoy writes `:` in stat names as `_` (a sniffed service's `HOST:PORT` route config).
        let suffix = format!(".rds.{}.update_rejected", rc.replace(':', "_"));
        if !checked.iter().any(|k| k.starts_with("http.") && k.ends_with(&suffix)) {
            return Some(format!("holds route config {rc} but has no http.*{suffix} stat; has: {checked:?}"));
        }
    }
    let rejected: Vec<String> =
        checked.iter().filter(|k| stats[k.as_str()] != 0).map(|k| format!("{k}: {}", stats[k.as_str()])).collect();
    (!rejected.is_empty()).then(|| format!("rejected xDS updates:\n  {}", rejected.join("\n  ")))
}

/// The four xDS types as `/debug/syncz` names them.
pub const XDS_TYPES: [&str; 4] = ["Cluster", "Endpoint", "Listener", "Route"];

/// Why the `/debug/syncz` entry of `node_id` is not fully in sync (None when it is: all four types
/// sent, acked version == sent version, acked nonce == sent nonce, no `last_nack`).
pub fn sync_problem(syncz: &Value, node_id: &str) -> Option<String> {
    let Some(conn) = syncz.as_array().and_then(|a| a.iter().find(|c| c["proxy"]["id"] == node_id)) else {
        return Some(format!("{node_id} not listed"));
    };
    for t in XDS_TYPES {
        let s = &conn["types"][t];
        if s.is_null() {
            return Some(format!("{node_id}: no {t} entry"));
        }
        let sent = s["sent_version"].as_str().unwrap_or_default();
        if sent.is_empty() {
            return Some(format!("{node_id}: nothing sent for {t}"));
        }
        if s["acked_version"] != s["sent_version"] || s["acked_nonce"] != s["sent_nonce"] {
            return Some(format!(
                "{node_id}: {t} sent {} ({}), acked {} ({})",
                sent, s["sent_nonce"], s["acked_version"], s["acked_nonce"]
            ));
        }
        if !s["last_nack"].is_null() {
            return Some(format!("{node_id}: {t} NACKed: {}", s["last_nack"]));
        }
    }
    None
}

/// Polls `/debug/syncz` until every proxy in `node_ids` is fully in sync (see [`sync_problem`]);
/// panics with the last problem and the syncz body on timeout. Returns the last `/debug/syncz`.
pub async fn wait_synced(cp: &Meshpilot, node_ids: &[&str]) -> Value {
    let mut last = (String::new(), Value::Null);
    let ok = cp
        .wait_for(CONVERGE_TIMEOUT, async |cp| {
            let syncz = cp.syncz().await;
            let problem = node_ids.iter().find_map(|id| sync_problem(&syncz, id));
            let done = problem.is_none();
            last = (problem.unwrap_or_default(), syncz);
            done
        })
        .await;
    assert!(ok, "proxies not in sync after {CONVERGE_TIMEOUT:?}: {}\n/debug/syncz: {:#}", last.0, last.1);
    last.1
}
