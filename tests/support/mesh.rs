//! Helpers for the Envoy routing tests (`envoy_routing`, `envoy_live_changes`): Istio YAML for a
//! `shop` namespace whose services are [`Backend`]s on 127.0.0.1, a gateway and a sidecar Envoy with
//! the node identities meshpilot expects, readers for Envoy's `/config_dump` and meshpilot's
//! `/debug/*`, an HTTP client aimed at a proxy listener, and config-file edits (atomic or in place).

use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};

use serde_json::{json, Value};

use super::*;

/// Namespace of every test object except the gateway proxy's.
pub const NS: &str = "shop";
/// Istio ingress gateway node id (namespace `istio-system`).
pub const GATEWAY_NODE_ID: &str = "router~127.0.0.1~gw-1.istio-system~istio-system.svc.cluster.local";
/// Sidecar node id of a `client` workload in `shop`.
pub const SIDECAR_NODE_ID: &str = "sidecar~127.0.0.1~client-1.shop~shop.svc.cluster.local";

// ---------------------------------------------------------------------------
// Istio YAML
// ---------------------------------------------------------------------------

/// Removes the common leading indentation of the non-blank lines and a leading newline, so YAML
/// can be written indented in a raw string.
pub fn dedent(text: &str) -> String {
    let text = text.strip_prefix('\n').unwrap_or(text);
    let indent =
        text.lines().filter(|l| !l.trim().is_empty()).map(|l| l.len() - l.trim_start().len()).min().unwrap_or(0);
    let mut out = String::with_capacity(text.len());
    for line in text.lines() {
        out.push_str(line.get(indent..).unwrap_or("").trim_end());
        out.push('\n');
    }
    out
}

/// Joins YAML documents into one multi-document file.
pub fn documents(docs: &[String]) -> String {
    docs.iter().map(|d| d.trim_end().to_string()).collect::<Vec<_>>().join("\n---\n") + "\n"
}

/// `NAME.shop.svc.cluster.local`.
pub fn fqdn(name: &str) -> String {
    format!("{name}.{NS}.svc.cluster.local")
}

/// Istio's outbound cluster name for service `NAME` in `shop`: `outbound|PORT|SUBSET|NAME.shop.svc.cluster.local`.
pub fn cluster_name(port: u16, subset: &str, name: &str) -> String {
    format!("outbound|{port}|{subset}|{}", fqdn(name))
}

/// A ServiceEntry for `NAME.shop.svc.cluster.local` on `port` (HTTP, port name `http`) with STATIC
/// endpoints at the given backends (`ports: {http: BACKEND_PORT}`), labelled
/// `{app: NAME, version: VERSION}`.
pub fn service_entry(name: &str, port: u16, endpoints: &[(&Backend, &str)]) -> String {
    let mut eps = String::new();
    for (backend, version) in endpoints {
        eps.push_str(&format!(
            "  - address: {}\n    ports: {{http: {}}}\n    labels: {{app: {name}, version: {version}}}\n",
            backend.ip(),
            backend.port()
        ));
    }
    if eps.is_empty() {
        eps = "  []\n".to_string();
    }
    format!(
        "apiVersion: networking.istio.io/v1\nkind: ServiceEntry\nmetadata:\n  name: {name}\n  namespace: {NS}\nspec:\n  \
         hosts: [{host}]\n  location: MESH_INTERNAL\n  resolution: STATIC\n  ports:\n  - {{number: {port}, name: http, \
         protocol: HTTP}}\n  endpoints:\n{eps}",
        host = fqdn(name)
    )
}

/// A ServiceEntry for `NAME.shop.svc.cluster.local` on `port` whose endpoints are the
/// WorkloadEntries labelled `app: NAME`.
pub fn service_entry_selecting(name: &str, port: u16) -> String {
    format!(
        "apiVersion: networking.istio.io/v1\nkind: ServiceEntry\nmetadata:\n  name: {name}\n  namespace: {NS}\nspec:\n  \
         hosts: [{host}]\n  location: MESH_INTERNAL\n  resolution: STATIC\n  ports:\n  - {{number: {port}, name: http, \
         protocol: HTTP}}\n  workloadSelector:\n    labels: {{app: {name}}}\n",
        host = fqdn(name)
    )
}

/// A WorkloadEntry `ENTRY` at a backend, labelled `{app: APP, version: VERSION}`.
pub fn workload_entry(entry: &str, app: &str, version: &str, backend: &Backend) -> String {
    format!(
        "apiVersion: networking.istio.io/v1\nkind: WorkloadEntry\nmetadata:\n  name: {entry}\n  namespace: {NS}\nspec:\n  \
         address: {}\n  ports: {{http: {}}}\n  labels: {{app: {app}, version: {version}}}\n",
        backend.ip(),
        backend.port()
    )
}

/// A DestinationRule for service `NAME` with subsets selecting `version: SUBSET`, and optionally a
/// `trafficPolicy` given as a one-line YAML flow mapping (e.g. `{loadBalancer: {simple: ROUND_ROBIN}}`).
pub fn destination_rule(name: &str, subsets: &[&str], traffic_policy: Option<&str>) -> String {
    let mut out = format!(
        "apiVersion: networking.istio.io/v1\nkind: DestinationRule\nmetadata:\n  name: {name}\n  namespace: {NS}\nspec:\n  \
         host: {}\n",
        fqdn(name)
    );
    if let Some(tp) = traffic_policy {
        out.push_str(&format!("  trafficPolicy: {tp}\n"));
    }
    if !subsets.is_empty() {
        out.push_str("  subsets:\n");
        for s in subsets {
            out.push_str(&format!("  - {{name: {s}, labels: {{version: {s}}}}}\n"));
        }
    }
    out
}

/// Gateway `shop/gw` selecting `istio: ingressgateway`, one plain HTTP server on `port` for all hosts.
pub fn gateway(port: u16) -> String {
    format!(
        "apiVersion: networking.istio.io/v1\nkind: Gateway\nmetadata:\n  name: gw\n  namespace: {NS}\nspec:\n  \
         selector:\n    istio: ingressgateway\n  servers:\n  - port: {{number: {port}, name: http, protocol: HTTP}}\n    \
         hosts: [\"*\"]\n"
    )
}

/// Sidecar `shop/default`: one egress listener bound to 127.0.0.1:`port` (HTTP, no capture)
/// importing the namespace's own hosts.
pub fn sidecar_resource(port: u16) -> String {
    format!(
        "apiVersion: networking.istio.io/v1\nkind: Sidecar\nmetadata:\n  name: default\n  namespace: {NS}\nspec:\n  \
         egress:\n  - port: {{number: {port}, name: http, protocol: HTTP}}\n    bind: 127.0.0.1\n    captureMode: NONE\n    \
         hosts: [\"./*\"]\n"
    )
}

// ---------------------------------------------------------------------------
// Config files
// ---------------------------------------------------------------------------

/// Replaces `dir/name` atomically: writes a hidden temp file in the same directory (meshpilot
/// skips hidden files) and renames it over the target, so the watcher never sees half a file.
pub fn write_atomic(dir: &Path, name: &str, contents: &str) {
    static SEQ: AtomicU64 = AtomicU64::new(0);
    let target = dir.join(name);
    let tmp = dir.join(format!(".{name}.{}.tmp", SEQ.fetch_add(1, Ordering::Relaxed)));
    std::fs::write(&tmp, contents).unwrap_or_else(|e| panic!("write {}: {e}", tmp.display()));
    std::fs::rename(&tmp, &target).unwrap_or_else(|e| panic!("rename {} -> {}: {e}", tmp.display(), target.display()));
}

/// Writes `dir/name` in place as editors and `cat >` do: truncate, then write the text in two
/// parts (split at a line in the middle), so the watcher may see an empty or half-written file.
pub fn write_in_place(dir: &Path, name: &str, contents: &str) {
    use std::io::Write as _;
    let path = dir.join(name);
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .write(true)
        .truncate(true)
        .open(&path)
        .unwrap_or_else(|e| panic!("open {}: {e}", path.display()));
    let middle = contents[..contents.len() / 2].rfind('\n').map_or(0, |i| i + 1);
    for part in [&contents[..middle], &contents[middle..]] {
        f.write_all(part.as_bytes()).unwrap_or_else(|e| panic!("write {}: {e}", path.display()));
        f.flush().unwrap();
    }
}

// ---------------------------------------------------------------------------
// Proxies
// ---------------------------------------------------------------------------

/// Starts meshpilot on `config_dir` and waits until it is ready.
pub async fn start_meshpilot(config_dir: &Path) -> Meshpilot {
    let cp = Meshpilot::start(config_dir, None);
    cp.wait_ready(STARTUP_TIMEOUT).await;
    cp
}

/// Starts the ingress gateway Envoy (`router~...`, namespace `istio-system`, labels
/// `istio: ingressgateway`), waits until it is ready and checks it rejected nothing.
pub async fn start_gateway(cp: &Meshpilot) -> Envoy {
    let envoy = Envoy::builder(GATEWAY_NODE_ID, cp.xds_addr())
        .metadata(json!({"NAMESPACE": "istio-system", "LABELS": {"istio": "ingressgateway"}}))
        .start();
    envoy.wait_ready(STARTUP_TIMEOUT).await;
    assert_no_rejections(&envoy).await;
    envoy
}

/// Starts a sidecar Envoy of `client` in `shop` without interception (`INTERCEPTION_MODE: NONE`),
/// waits until it is ready and checks it rejected nothing.
pub async fn start_sidecar(cp: &Meshpilot) -> Envoy {
    let envoy = Envoy::builder(SIDECAR_NODE_ID, cp.xds_addr())
        .metadata(json!({"NAMESPACE": NS, "LABELS": {"app": "client"}, "INTERCEPTION_MODE": "NONE"}))
        .start();
    envoy.wait_ready(STARTUP_TIMEOUT).await;
    assert_no_rejections(&envoy).await;
    envoy
}

/// Asserts that Envoy rejected no xDS update: every stat ending in `update_rejected` (CDS, LDS,
/// each RDS route configuration's `http.<stat_prefix>.rds.<name>.update_rejected`, EDS per
/// cluster) is 0. Also checks that the CDS and LDS counters and one RDS counter per dynamic route
/// configuration exist, so a renamed stat cannot make this pass vacuously. Panics with the
/// non-zero stats and Envoy's log lines about rejections.
pub async fn assert_no_rejections(envoy: &Envoy) {
    let stats = envoy.stats().await;
    let mut checked: Vec<&String> = stats.keys().filter(|k| k.ends_with("update_rejected")).collect();
    checked.sort();
    for required in ["cluster_manager.cds.update_rejected", "listener_manager.lds.update_rejected"] {
        assert!(stats.contains_key(required), "Envoy ({}) has no stat {required}; has: {checked:?}", envoy.node_id());
    }
    let dump = envoy.config_dump().await;
    for rc in dynamic_route_config_names(&dump) {
        let suffix = format!(".rds.{rc}.update_rejected");
        assert!(
            checked.iter().any(|k| k.starts_with("http.") && k.ends_with(&suffix)),
            "Envoy ({}) holds route config {rc} but has no http.*{suffix} stat; has: {checked:?}",
            envoy.node_id()
        );
    }
    let rejected: Vec<String> =
        checked.iter().filter(|k| stats[k.as_str()] != 0).map(|k| format!("{k}: {}", stats[k.as_str()])).collect();
    if !rejected.is_empty() {
        let logs = envoy.logs();
        let lines: Vec<&str> = logs.lines().filter(|l| l.contains("rejected") || l.contains("error")).collect();
        panic!(
            "Envoy ({}) rejected xDS updates:\n  {}\nlog lines:\n{}",
            envoy.node_id(),
            rejected.join("\n  "),
            lines.join("\n")
        );
    }
}

// ---------------------------------------------------------------------------
// Envoy /config_dump
// ---------------------------------------------------------------------------

fn section_list<'a>(dump: &'a Value, section: &str, list: &str) -> Vec<&'a Value> {
    dump_section(dump, section).and_then(|s| s[list].as_array()).map(|a| a.iter().collect()).unwrap_or_default()
}

/// Names of the dynamic route configurations.
pub fn dynamic_route_config_names(dump: &Value) -> Vec<String> {
    section_list(dump, "RoutesConfigDump", "dynamic_route_configs")
        .into_iter()
        .filter_map(|r| r["route_config"]["name"].as_str().map(str::to_string))
        .collect()
}

/// The `dynamic_route_configs` entry (`version_info`, `route_config`) of route configuration `name`.
pub fn dynamic_route_config<'a>(dump: &'a Value, name: &str) -> Option<&'a Value> {
    section_list(dump, "RoutesConfigDump", "dynamic_route_configs")
        .into_iter()
        .find(|r| r["route_config"]["name"] == name)
}

/// Names of the dynamic listeners.
pub fn dynamic_listener_names(dump: &Value) -> Vec<String> {
    section_list(dump, "ListenersConfigDump", "dynamic_listeners")
        .into_iter()
        .filter_map(|l| l["name"].as_str().map(str::to_string))
        .collect()
}

/// The `dynamic_listeners` entry of listener `name`.
pub fn dynamic_listener<'a>(dump: &'a Value, name: &str) -> Option<&'a Value> {
    section_list(dump, "ListenersConfigDump", "dynamic_listeners").into_iter().find(|l| l["name"] == name)
}

/// Names of the dynamic active clusters.
pub fn dynamic_cluster_names(dump: &Value) -> Vec<String> {
    section_list(dump, "ClustersConfigDump", "dynamic_active_clusters")
        .into_iter()
        .filter_map(|c| c["cluster"]["name"].as_str().map(str::to_string))
        .collect()
}

/// Ports of the endpoints Envoy holds for EDS cluster `cluster`, sorted (None if it has no
/// assignment for it).
pub fn endpoint_ports(dump: &Value, cluster: &str) -> Option<Vec<u64>> {
    let cla = section_list(dump, "EndpointsConfigDump", "dynamic_endpoint_configs")
        .into_iter()
        .find(|e| e["endpoint_config"]["cluster_name"] == cluster)?;
    let mut ports: Vec<u64> = cla["endpoint_config"]["endpoints"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|l| l["lb_endpoints"].as_array().into_iter().flatten())
        .filter_map(|e| e["endpoint"]["address"]["socket_address"]["port_value"].as_u64())
        .collect();
    ports.sort();
    Some(ports)
}

/// The `version_info` of the last accepted CDS, LDS and route configuration `route` responses.
pub fn xds_versions(dump: &Value, route: &str) -> (String, String, String) {
    let v = |x: &Value| x.as_str().unwrap_or_default().to_string();
    let cds = dump_section(dump, "ClustersConfigDump").map(|s| v(&s["version_info"])).unwrap_or_default();
    let lds = dump_section(dump, "ListenersConfigDump").map(|s| v(&s["version_info"])).unwrap_or_default();
    let rds = dynamic_route_config(dump, route).map(|r| v(&r["version_info"])).unwrap_or_default();
    (cds, lds, rds)
}

// ---------------------------------------------------------------------------
// meshpilot /debug
// ---------------------------------------------------------------------------

/// GET a meshpilot admin path that answers JSON; panics unless 200.
pub async fn admin_json(cp: &Meshpilot, path: &str) -> Value {
    let (status, body) = cp.admin_get(path).await;
    assert_eq!(status, 200, "meshpilot {path}: {body}");
    serde_json::from_str(&body).unwrap_or_else(|e| panic!("meshpilot {path} is not JSON: {e}: {body}"))
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
            let syncz = admin_json(cp, "/debug/syncz").await;
            let problem = node_ids.iter().find_map(|id| sync_problem(&syncz, id));
            let done = problem.is_none();
            last = (problem.unwrap_or_default(), syncz);
            done
        })
        .await;
    assert!(ok, "proxies not in sync after {CONVERGE_TIMEOUT:?}: {}\n/debug/syncz: {:#}", last.0, last.1);
    last.1
}

// ---------------------------------------------------------------------------
// HTTP through a proxy listener
// ---------------------------------------------------------------------------

/// The `backend` field of a 200 answer from a [`Backend`] (None otherwise).
pub fn backend_of(r: &HttpResponse) -> Option<String> {
    if r.status != 200 {
        return None;
    }
    let v: Value = serde_json::from_str(&r.body).ok()?;
    v["backend"].as_str().map(str::to_string)
}

/// An HTTP client for one proxy listener on 127.0.0.1 and one Host header (keep-alive, no
/// redirects followed).
pub struct Ingress {
    client: reqwest::Client,
    base: String,
    host: String,
}

impl Ingress {
    /// Requests go to `http://127.0.0.1:PORT` with `Host: HOST`.
    pub fn new(port: u16, host: &str) -> Ingress {
        Ingress { client: http_client_no_redirect(), base: format!("http://127.0.0.1:{port}"), host: host.to_string() }
    }

    /// The same listener with another Host header.
    pub fn with_host(&self, host: &str) -> Ingress {
        Ingress { client: self.client.clone(), base: self.base.clone(), host: host.to_string() }
    }

    pub fn host(&self) -> &str {
        &self.host
    }

    /// GET `path`; transport errors are returned.
    pub async fn try_get(&self, path: &str, headers: &[(&str, &str)]) -> Result<HttpResponse, reqwest::Error> {
        http_request(&self.client, "GET", &format!("{}{path}", self.base), &self.host, headers, None).await
    }

    /// GET `path`; panics on a transport error.
    pub async fn get(&self, path: &str, headers: &[(&str, &str)]) -> HttpResponse {
        self.try_get(path, headers)
            .await
            .unwrap_or_else(|e| panic!("GET {}{path} (Host: {}) failed: {e:?}", self.base, self.host))
    }

    /// GET `path` and return the answering backend; panics unless the answer is a 200 from a
    /// [`Backend`].
    pub async fn backend(&self, path: &str, headers: &[(&str, &str)]) -> String {
        let r = self.get(path, headers).await;
        backend_of(&r).unwrap_or_else(|| {
            panic!("GET {path} (Host: {}, headers {headers:?}): expected a backend's 200, got {r:?}", self.host)
        })
    }

    /// GET `path` and return the parsed JSON echo of a backend; panics unless 200.
    pub async fn echo(&self, path: &str, headers: &[(&str, &str)]) -> Value {
        let r = self.get(path, headers).await;
        assert_eq!(r.status, 200, "GET {path} (Host: {}): {r:?}", self.host);
        r.json()
    }

    /// Polls GET `path` until `pred` accepts the answer; panics with the last answer after
    /// [`CONVERGE_TIMEOUT`]. Returns the accepted answer.
    pub async fn wait_answer(
        &self,
        path: &str,
        headers: &[(&str, &str)],
        what: &str,
        pred: impl Fn(&HttpResponse) -> bool,
    ) -> HttpResponse {
        let mut last = None;
        let ok = wait_until(CONVERGE_TIMEOUT, async || {
            let r = self.try_get(path, headers).await;
            let done = matches!(&r, Ok(resp) if pred(resp));
            last = Some(r);
            done
        })
        .await;
        match last {
            Some(Ok(r)) if ok => r,
            other => panic!(
                "waiting for {what}: GET {}{path} (Host: {}, headers {headers:?}) did not give it within \
                 {CONVERGE_TIMEOUT:?}; last answer: {other:?}",
                self.base, self.host
            ),
        }
    }

    /// Polls until a GET of `path` is answered (200) by `backend`.
    pub async fn wait_backend(&self, path: &str, headers: &[(&str, &str)], backend: &str) {
        self.wait_answer(path, headers, &format!("an answer from {backend}"), |r| {
            backend_of(r).as_deref() == Some(backend)
        })
        .await;
    }

    /// Polls until `n` consecutive GETs of `path` are all answered (200) by `backend`; panics with
    /// the last round's answers after [`CONVERGE_TIMEOUT`].
    pub async fn wait_all_from(&self, path: &str, headers: &[(&str, &str)], backend: &str, n: usize) {
        let mut last_round: Vec<String> = Vec::new();
        let ok = wait_until(CONVERGE_TIMEOUT, async || {
            last_round.clear();
            for _ in 0..n {
                let seen = match self.try_get(path, headers).await {
                    Ok(r) => backend_of(&r).unwrap_or_else(|| format!("status {} body {}", r.status, r.body)),
                    Err(e) => format!("error {e}"),
                };
                let good = seen == backend;
                last_round.push(seen);
                if !good {
                    return false;
                }
            }
            true
        })
        .await;
        assert!(
            ok,
            "{n} consecutive GET {path} (Host: {}) were not all answered by {backend} within {CONVERGE_TIMEOUT:?}; \
             last round: {last_round:?}",
            self.host
        );
    }
}
