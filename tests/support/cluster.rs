//! The scale-out system as processes for tests: ingest nodes and frontends (the meshpilot binary
//! against a real etcd), and the hashing load balancer in front of the frontends (a real Envoy).
//!
//! Every process listens on 127.0.0.1 ports chosen at run time, writes its log to a file in its
//! own temp dir, can be killed (`kill -9`), stopped gracefully (SIGTERM) and started again on the
//! same ports, and is killed on drop; if the test is panicking then, the tail of its log is
//! printed (see [`super::process`]).
//!
//! ```ignore
//! let etcd = Etcd::start().await;
//! let ingest = IngestNode::builder(&etcd.endpoint(), config.path()).id("ingest-0").lease_ttl(2).start();
//! let fe = FrontendNode::builder(&etcd.endpoint()).id("fe-a").start();
//! fe.wait_ready(STARTUP_TIMEOUT).await;
//! let lb = XdsLoadBalancer::builder().frontend(fe.id(), fe.xds_addr()).start().await;
//! let envoy = Envoy::builder(node_id, lb.addr()).bootstrap_patch(proxy_key_patch("shop/client")).start();
//! ```

use meshpilot::cluster::ownership::PROXY_KEY_HEADER;

use super::*;

/// Timeout of one admin request to a cluster process (short: processes are killed on purpose).
const ADMIN_REQUEST_TIMEOUT: Duration = Duration::from_secs(5);

/// Spawns `meshpilot KIND ARGS... EXTRA_ARGS...` (JSON logs, then `extra_env`) as a cluster node
/// labelled `KIND ID`; returns at once (see [`MeshpilotProcess::wait_ready`]).
fn spawn_node(
    kind: &str,
    id: &str,
    mut args: Vec<String>,
    extra_args: Vec<String>,
    extra_env: Vec<(String, String)>,
    admin_addr: SocketAddr,
) -> MeshpilotProcess {
    args.extend(extra_args);
    let mut env = vec![("MESHPILOT_LOG_FORMAT".to_string(), "json".to_string())];
    env.extend(extra_env);
    MeshpilotProcess::start(ProcessSpec {
        label: format!("{kind} {id}"),
        dir_prefix: "meshpilot-node-",
        args: args.into_iter().map(Into::into).collect(),
        env,
        admin_addr,
        request_timeout: ADMIN_REQUEST_TIMEOUT,
        log_tail: LogTailLines { failure: 150, on_drop: 60 },
    })
}

/// How long a SIGTERM'd process gets to exit before [`MeshpilotProcess::terminate`] gives up.
pub const TERMINATE_GRACE: Duration = Duration::from_secs(10);

/// The value of the unlabelled sample `name` in Prometheus text.
pub fn metric_value(text: &str, name: &str) -> Option<f64> {
    text.lines().filter(|l| !l.starts_with('#')).find_map(|l| {
        let (n, v) = l.split_once(' ')?;
        (n == name).then(|| v.trim().parse().ok()).flatten()
    })
}

/// Versions (`TERM.SEQ`) of the `snapshot applied` lines of a frontend's log, by run (a restart
/// starts a new list). The processes log JSON lines (`MESHPILOT_LOG_FORMAT=json`).
pub fn applied_versions(logs: &str) -> Vec<Vec<meshpilot::snapshot::Version>> {
    let mut runs = vec![Vec::new()];
    for line in logs.lines() {
        if line.starts_with("---- start #") {
            runs.push(Vec::new());
            continue;
        }
        let Ok(v) = serde_json::from_str::<Value>(line) else { continue };
        if v["fields"]["message"] != "snapshot applied" {
            continue;
        }
        if let Some(version) = v["fields"]["version"].as_str().and_then(|s| s.parse().ok()) {
            runs.last_mut().unwrap().push(version);
        }
    }
    runs
}

// ---------------------------------------------------------------------------
// Ingest nodes
// ---------------------------------------------------------------------------

/// Options for an [`IngestNode`]; see [`IngestNode::builder`].
pub struct IngestNodeBuilder {
    etcd_endpoints: String,
    config_dir: PathBuf,
    mesh_config: Option<PathBuf>,
    id: Option<String>,
    lease_ttl: Option<u64>,
    debounce_after: Option<String>,
    args: Vec<String>,
    env: Vec<(String, String)>,
}

impl IngestNodeBuilder {
    /// `--id` (default `ingest-<port>`).
    pub fn id(mut self, id: &str) -> Self {
        self.id = Some(id.to_string());
        self
    }
    /// `--lease-ttl SECS`.
    pub fn lease_ttl(mut self, secs: u64) -> Self {
        self.lease_ttl = Some(secs);
        self
    }
    /// `--debounce-after` (e.g. `100ms`).
    pub fn debounce_after(mut self, d: &str) -> Self {
        self.debounce_after = Some(d.to_string());
        self
    }
    /// `--mesh-config FILE`.
    pub fn mesh_config(mut self, path: impl AsRef<Path>) -> Self {
        self.mesh_config = Some(path.as_ref().to_path_buf());
        self
    }
    /// An extra argument.
    pub fn arg(mut self, arg: &str) -> Self {
        self.args.push(arg.to_string());
        self
    }
    /// An environment variable.
    pub fn env(mut self, key: &str, value: &str) -> Self {
        self.env.push((key.to_string(), value.to_string()));
        self
    }

    /// Spawns `meshpilot ingest ...` and returns at once (see [`MeshpilotProcess::wait_ready`]).
    pub fn start(self) -> IngestNode {
        let snapshot_addr = free_addr();
        let admin_addr = free_addr();
        let id = self.id.unwrap_or_else(|| format!("ingest-{}", admin_addr.port()));
        let mut args: Vec<String> = vec![
            "ingest".into(),
            "--etcd-endpoints".into(),
            self.etcd_endpoints,
            "--config-dir".into(),
            self.config_dir.display().to_string(),
            "--snapshot-addr".into(),
            snapshot_addr.to_string(),
            "--admin-addr".into(),
            admin_addr.to_string(),
            "--id".into(),
            id.clone(),
        ];
        if let Some(m) = self.mesh_config {
            args.extend(["--mesh-config".into(), m.display().to_string()]);
        }
        if let Some(ttl) = self.lease_ttl {
            args.extend(["--lease-ttl".into(), ttl.to_string()]);
        }
        if let Some(d) = self.debounce_after {
            args.extend(["--debounce-after".into(), d]);
        }
        let process = spawn_node("ingest", &id, args, self.args, self.env, admin_addr);
        IngestNode { process, id, snapshot_addr }
    }
}

/// A `meshpilot ingest` process (leader-elected through etcd; the leader serves snapshots).
pub struct IngestNode {
    process: MeshpilotProcess,
    id: String,
    snapshot_addr: SocketAddr,
}

impl IngestNode {
    /// `meshpilot ingest --etcd-endpoints ENDPOINTS --config-dir DIR` with free ports.
    pub fn builder(etcd_endpoints: &str, config_dir: impl AsRef<Path>) -> IngestNodeBuilder {
        IngestNodeBuilder {
            etcd_endpoints: etcd_endpoints.to_string(),
            config_dir: config_dir.as_ref().to_path_buf(),
            mesh_config: None,
            id: None,
            lease_ttl: None,
            debounce_after: None,
            args: Vec::new(),
            env: Vec::new(),
        }
    }

    pub fn id(&self) -> &str {
        &self.id
    }
    pub fn snapshot_addr(&self) -> SocketAddr {
        self.snapshot_addr
    }

    /// Whether `/debug/node` says `leader: true` (false if unreachable).
    pub async fn is_leader(&self) -> bool {
        self.try_node().await.is_some_and(|n| n["leader"] == true)
    }

    /// `term` of `/debug/node` while leader.
    pub async fn leader_term(&self) -> Option<u64> {
        self.try_node().await.filter(|n| n["leader"] == true).and_then(|n| n["term"].as_u64())
    }
}

impl Deref for IngestNode {
    type Target = MeshpilotProcess;
    fn deref(&self) -> &MeshpilotProcess {
        &self.process
    }
}

impl DerefMut for IngestNode {
    fn deref_mut(&mut self) -> &mut MeshpilotProcess {
        &mut self.process
    }
}

impl fmt::Debug for IngestNode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "IngestNode({} snapshot {} admin {})", self.id, self.snapshot_addr, self.admin_addr())
    }
}

/// The ingest node that says it leads, with its term, if exactly one does.
pub async fn current_leader(ingests: &[IngestNode]) -> Option<(usize, u64)> {
    let mut leaders = Vec::new();
    for (i, node) in ingests.iter().enumerate() {
        if !node.is_running() {
            continue;
        }
        if let Some(term) = node.leader_term().await {
            leaders.push((i, term));
        }
    }
    (leaders.len() == 1).then(|| leaders[0])
}

/// Polls until exactly one running ingest node leads with a term accepted by `term_ok`; panics
/// with every node's `/debug/node` after `timeout`. Returns (index, term).
pub async fn wait_leader(ingests: &[IngestNode], timeout: Duration, term_ok: impl Fn(u64) -> bool) -> (usize, u64) {
    let mut found = None;
    let ok = wait_until(timeout, async || {
        found = current_leader(ingests).await.filter(|&(_, t)| term_ok(t));
        found.is_some()
    })
    .await;
    if !ok {
        let mut states = Vec::new();
        for n in ingests {
            states.push(format!("{}: {:?}", n.id(), n.try_node().await));
        }
        panic!("no (single, acceptable) ingest leader after {timeout:?}:\n{}", states.join("\n"));
    }
    found.unwrap()
}

// ---------------------------------------------------------------------------
// Frontends
// ---------------------------------------------------------------------------

/// Options for a [`FrontendNode`]; see [`FrontendNode::builder`].
pub struct FrontendNodeBuilder {
    etcd_endpoints: String,
    id: Option<String>,
    lease_ttl: Option<u64>,
    proxy_key: Option<String>,
    args: Vec<String>,
    env: Vec<(String, String)>,
}

impl FrontendNodeBuilder {
    /// `--id`: the member id, also the load balancer's `hash_key` (default `frontend-<port>`).
    pub fn id(mut self, id: &str) -> Self {
        self.id = Some(id.to_string());
        self
    }
    /// `--lease-ttl SECS` (membership).
    pub fn lease_ttl(mut self, secs: u64) -> Self {
        self.lease_ttl = Some(secs);
        self
    }
    /// `--proxy-key namespace-service-account|node-id`.
    pub fn proxy_key(mut self, key: &str) -> Self {
        self.proxy_key = Some(key.to_string());
        self
    }
    /// An extra argument.
    pub fn arg(mut self, arg: &str) -> Self {
        self.args.push(arg.to_string());
        self
    }
    /// An environment variable.
    pub fn env(mut self, key: &str, value: &str) -> Self {
        self.env.push((key.to_string(), value.to_string()));
        self
    }

    /// Spawns `meshpilot frontend ...` and returns at once (see [`MeshpilotProcess::wait_ready`]).
    pub fn start(self) -> FrontendNode {
        let xds_addr = free_addr();
        let admin_addr = free_addr();
        let id = self.id.unwrap_or_else(|| format!("frontend-{}", xds_addr.port()));
        let mut args: Vec<String> = vec![
            "frontend".into(),
            "--etcd-endpoints".into(),
            self.etcd_endpoints,
            "--xds-addr".into(),
            xds_addr.to_string(),
            "--admin-addr".into(),
            admin_addr.to_string(),
            "--id".into(),
            id.clone(),
        ];
        if let Some(ttl) = self.lease_ttl {
            args.extend(["--lease-ttl".into(), ttl.to_string()]);
        }
        if let Some(k) = self.proxy_key {
            args.extend(["--proxy-key".into(), k]);
        }
        let process = spawn_node("frontend", &id, args, self.args, self.env, admin_addr);
        FrontendNode { process, id, xds_addr }
    }
}

/// A `meshpilot frontend` process (follows the leader's snapshots, registers as a member, serves ADS).
pub struct FrontendNode {
    process: MeshpilotProcess,
    id: String,
    xds_addr: SocketAddr,
}

impl FrontendNode {
    /// `meshpilot frontend --etcd-endpoints ENDPOINTS` with free ports.
    pub fn builder(etcd_endpoints: &str) -> FrontendNodeBuilder {
        FrontendNodeBuilder {
            etcd_endpoints: etcd_endpoints.to_string(),
            id: None,
            lease_ttl: None,
            proxy_key: None,
            args: Vec::new(),
            env: Vec::new(),
        }
    }

    pub fn id(&self) -> &str {
        &self.id
    }
    pub fn xds_addr(&self) -> SocketAddr {
        self.xds_addr
    }
    /// `http://127.0.0.1:PORT` of the ADS server (for a SimProxy connecting directly).
    pub fn xds_url(&self) -> String {
        format!("http://{}", self.xds_addr)
    }

    /// `/debug/syncz` (an array of connections); panics if unreachable.
    pub async fn syncz(&self) -> Value {
        self.admin_json("/debug/syncz").await
    }

    /// Node ids of the proxies connected here.
    pub async fn connected_proxies(&self) -> Vec<String> {
        let syncz = self.syncz().await;
        syncz.as_array().into_iter().flatten().filter_map(|c| c["proxy"]["id"].as_str().map(str::to_string)).collect()
    }

    /// The snapshot version held (`/debug/node` `held`), None if none or unreachable.
    pub async fn held(&self) -> Option<meshpilot::snapshot::Version> {
        self.try_node().await.and_then(|n| n["held"].as_str().and_then(|s| s.parse().ok()))
    }
}

impl Deref for FrontendNode {
    type Target = MeshpilotProcess;
    fn deref(&self) -> &MeshpilotProcess {
        &self.process
    }
}

impl DerefMut for FrontendNode {
    fn deref_mut(&mut self) -> &mut MeshpilotProcess {
        &mut self.process
    }
}

impl fmt::Debug for FrontendNode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "FrontendNode({} xds {} admin {})", self.id, self.xds_addr, self.admin_addr())
    }
}

// ---------------------------------------------------------------------------
// The load balancer in front of the frontends
// ---------------------------------------------------------------------------

/// Bootstrap patch for a proxy Envoy whose ADS goes through the [`XdsLoadBalancer`]: the `xds`
/// gRPC service sends `x-meshpilot-proxy-key: KEY` as initial metadata (the harness's retry
/// back-off kept). Use with [`EnvoyBuilder::bootstrap_patch`] and the LB's address.
pub fn proxy_key_patch(key: &str) -> Value {
    json!({"dynamic_resources": {"ads_config": {"grpc_services": [{
        "envoy_grpc": {
            "cluster_name": "xds",
            "retry_policy": {"retry_back_off": {"base_interval": "0.1s", "max_interval": "0.5s"}}
        },
        "initial_metadata": [{"key": PROXY_KEY_HEADER, "value": key}]
    }]}}})
}

/// The load balancing policy of the load balancer's `frontends` cluster; the frontends must
/// compute ownership with the same algorithm (`meshpilot::cluster::ownership::ProxyHashing`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum LbPolicy {
    /// `MAGLEV` with Envoy's default table size (the frontends' default).
    #[default]
    Maglev,
    /// `RING_HASH` with Envoy's default ring sizes.
    RingHash,
}

/// Options for an [`XdsLoadBalancer`]; see [`XdsLoadBalancer::builder`].
pub struct XdsLoadBalancerBuilder {
    frontends: Vec<(String, SocketAddr)>,
    keyed: Vec<String>,
    policy: LbPolicy,
}

impl XdsLoadBalancerBuilder {
    /// A frontend endpoint: its member id (the endpoint's `hash_key`) and xDS address.
    pub fn frontend(mut self, id: &str, xds_addr: SocketAddr) -> Self {
        self.frontends.push((id.to_string(), xds_addr));
        self
    }

    /// An extra listener that sets `x-meshpilot-proxy-key: KEY` on every request before routing,
    /// for ADS clients that cannot send gRPC metadata (the crate's `SimProxy`).
    pub fn keyed_listener(mut self, key: &str) -> Self {
        if !self.keyed.iter().any(|k| k == key) {
            self.keyed.push(key.to_string());
        }
        self
    }

    /// The load balancing policy (default `MAGLEV`).
    pub fn policy(mut self, policy: LbPolicy) -> Self {
        self.policy = policy;
        self
    }

    /// Starts the Envoy and waits until it is ready and every frontend is healthy.
    pub async fn start(mut self) -> XdsLoadBalancer {
        // Endpoints in member-id order, as the frontends list them (ring hash depends on it).
        self.frontends.sort();
        let port = free_port();
        let probe_port = free_port();
        let keyed: Vec<(String, u16)> = self.keyed.iter().map(|k| (k.clone(), free_port())).collect();
        let mut builder = Envoy::builder("router~127.0.0.1~xds-lb.meshpilot~meshpilot.svc.cluster.local", free_addr())
            .bootstrap_patch(json!({"dynamic_resources": null}))
            .static_cluster(lb_cluster(&self.frontends, self.policy))
            .static_listener(lb_listener("xds", port, LbListener::Plain))
            .static_listener(lb_listener("probe", probe_port, LbListener::Probe));
        for (i, (key, p)) in keyed.iter().enumerate() {
            builder = builder.static_listener(lb_listener(&format!("xds-keyed-{i}"), *p, LbListener::Keyed(key)));
        }
        let envoy = builder.start();
        envoy.wait_ready(STARTUP_TIMEOUT).await;
        let lb = XdsLoadBalancer { envoy, port, probe_port, keyed, frontends: self.frontends, client: http_client() };
        lb.wait_healthy(lb.frontends.len() as u64, STARTUP_TIMEOUT).await;
        lb
    }
}

/// The cluster `frontends`: MAGLEV (or RING_HASH) over the frontends' xDS addresses (HTTP/2), each
/// endpoint's `hash_key` its member id, TCP health checks every second (one failure marks a
/// frontend down, one success back up), no panic mode (an unhealthy frontend is never picked).
fn lb_cluster(frontends: &[(String, SocketAddr)], policy: LbPolicy) -> Value {
    let endpoints: Vec<Value> = frontends
        .iter()
        .map(|(id, addr)| {
            json!({
                "endpoint": {"address": {"socket_address": {"address": addr.ip().to_string(), "port_value": addr.port()}}},
                "metadata": {"filter_metadata": {"envoy.lb": {"hash_key": id}}}
            })
        })
        .collect();
    let mut cluster = json!({
        "name": "frontends",
        "type": "STATIC",
        "connect_timeout": "1s",
        "common_lb_config": {"healthy_panic_threshold": {"value": 0}},
        "typed_extension_protocol_options": {
            "envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
                "@type": "type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions",
                "explicit_http_config": {"http2_protocol_options": {}}
            }
        },
        "health_checks": [{
            "timeout": "1s",
            "interval": "1s",
            "no_traffic_interval": "1s",
            "unhealthy_interval": "1s",
            "unhealthy_threshold": 1,
            "healthy_threshold": 1,
            "tcp_health_check": {}
        }],
        "load_assignment": {"cluster_name": "frontends", "endpoints": [{"lb_endpoints": endpoints}]}
    });
    match policy {
        LbPolicy::RingHash => merge_patch(
            &mut cluster,
            &json!({
                "lb_policy": "RING_HASH",
                "ring_hash_lb_config": {"minimum_ring_size": 1024, "maximum_ring_size": 8388608}
            }),
        ),
        LbPolicy::Maglev => {
            merge_patch(&mut cluster, &json!({"lb_policy": "MAGLEV", "maglev_lb_config": {"table_size": 65537}}))
        }
    }
    cluster
}

/// What a load balancer listener does besides routing by the proxy-key header.
enum LbListener<'a> {
    /// Nothing: xDS clients send the header (HTTP/2 only).
    Plain,
    /// Sets the header to this key first (HTTP/2 only).
    Keyed(&'a str),
    /// Any HTTP version; answers carry `x-meshpilot-upstream: ADDRESS` of the frontend chosen.
    Probe,
}

/// A listener routing everything to `frontends` by the proxy-key header (see [`LbListener`]).
fn lb_listener(name: &str, port: u16, kind: LbListener) -> Value {
    let mut filters = Vec::new();
    if let LbListener::Keyed(key) = kind {
        filters.push(json!({
            "name": "envoy.filters.http.header_mutation",
            "typed_config": {
                "@type": "type.googleapis.com/envoy.extensions.filters.http.header_mutation.v3.HeaderMutation",
                "mutations": {"request_mutations": [{"append": {
                    "header": {"key": PROXY_KEY_HEADER, "value": key},
                    "append_action": "OVERWRITE_IF_EXISTS_OR_ADD"
                }}]}
            }
        }));
    }
    filters.push(json!({
        "name": "envoy.filters.http.router",
        "typed_config": {"@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"}
    }));
    let probe = matches!(kind, LbListener::Probe);
    let codec = if probe { "AUTO" } else { "HTTP2" };
    let response_headers = if probe {
        json!([{"header": {"key": "x-meshpilot-upstream", "value": "%UPSTREAM_REMOTE_ADDRESS%"}}])
    } else {
        json!([])
    };
    let route = json!({
        "match": {"prefix": "/"},
        "route": {
            "cluster": "frontends",
            // xDS streams are long-lived.
            "timeout": "0s",
            "hash_policy": [{"header": {"header_name": PROXY_KEY_HEADER}}],
            // A frontend that just died (not yet marked down by the health check): try the next
            // host.
            "retry_policy": {
                "retry_on": "connect-failure,refused-stream,unavailable",
                "num_retries": 3,
                "retry_host_predicate": [{
                    "name": "envoy.retry_host_predicates.previous_hosts",
                    "typed_config": {
                        "@type": "type.googleapis.com/envoy.extensions.retry.host.previous_hosts.v3.PreviousHostsPredicate"
                    }
                }],
                "host_selection_retry_max_attempts": 3
            }
        }
    });
    json!({
        "name": name,
        "address": {"socket_address": {"address": "127.0.0.1", "port_value": port}},
        "filter_chains": [{"filters": [{
            "name": "envoy.filters.network.http_connection_manager",
            "typed_config": {
                "@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
                "stat_prefix": name,
                "codec_type": codec,
                "http2_protocol_options": {},
                // xDS streams may be idle for long.
                "stream_idle_timeout": "0s",
                "route_config": {
                    "name": name,
                    "response_headers_to_add": response_headers,
                    "virtual_hosts": [{"name": "frontends", "domains": ["*"], "routes": [route]}]
                },
                "http_filters": filters
            }
        }]}]
    })
}

/// A real Envoy load-balancing xDS streams over the frontends by consistent hashing of the
/// `x-meshpilot-proxy-key` header (MAGLEV or RING_HASH, endpoints' `hash_key` = member ids, in
/// member-id order), as deployed in front of meshpilot's frontends: an HTTP/2 listener for
/// proxies that send the header as gRPC metadata, optional keyed listeners that set it, and a
/// probe listener ([`XdsLoadBalancer::route_of`]). Killed on drop.
pub struct XdsLoadBalancer {
    envoy: Envoy,
    port: u16,
    probe_port: u16,
    keyed: Vec<(String, u16)>,
    frontends: Vec<(String, SocketAddr)>,
    client: reqwest::Client,
}

impl XdsLoadBalancer {
    pub fn builder() -> XdsLoadBalancerBuilder {
        XdsLoadBalancerBuilder { frontends: Vec::new(), keyed: Vec::new(), policy: LbPolicy::default() }
    }

    /// The frontend id the load balancer routes proxy key `key` to right now (asked by a plain
    /// HTTP request through a probe listener with the same route; the chosen frontend's address
    /// comes back in a response header). None if no frontend answered.
    pub async fn route_of(&self, key: &str) -> Option<String> {
        let url = format!("http://127.0.0.1:{}/meshpilot-probe", self.probe_port);
        let r = http_request(&self.client, "GET", &url, "", &[(PROXY_KEY_HEADER, key)], None).await.ok()?;
        let upstream: SocketAddr = r.header("x-meshpilot-upstream")?.parse().ok()?;
        self.frontends.iter().find(|(_, a)| *a == upstream).map(|(id, _)| id.clone())
    }

    /// The main listener (proxies send the header themselves).
    pub fn addr(&self) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.port))
    }
    /// `http://127.0.0.1:PORT` of the main listener.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr())
    }
    /// `http://127.0.0.1:PORT` of the listener that sets the proxy key `key` (see
    /// [`XdsLoadBalancerBuilder::keyed_listener`]).
    pub fn keyed_url(&self, key: &str) -> String {
        let (_, port) = self
            .keyed
            .iter()
            .find(|(k, _)| k == key)
            .unwrap_or_else(|| panic!("no keyed listener for {key}; have {:?}", self.keyed));
        format!("http://127.0.0.1:{port}")
    }
    /// The frontends (id, xDS address) in endpoint order.
    pub fn frontends(&self) -> &[(String, SocketAddr)] {
        &self.frontends
    }
    /// The Envoy process.
    pub fn envoy(&self) -> &Envoy {
        &self.envoy
    }

    /// Frontends the health check currently passes (`cluster.frontends.membership_healthy`).
    pub async fn healthy(&self) -> u64 {
        self.envoy.stat("cluster.frontends.membership_healthy").await.unwrap_or(0)
    }

    /// Polls until exactly `n` frontends are healthy; panics on timeout.
    pub async fn wait_healthy(&self, n: u64, timeout: Duration) {
        let mut last = 0;
        let ok = self
            .envoy
            .wait_for(timeout, async |_| {
                last = self.healthy().await;
                last == n
            })
            .await;
        assert!(ok, "load balancer: {last} healthy frontends after {timeout:?}, expected {n}");
    }
}

impl fmt::Debug for XdsLoadBalancer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "XdsLoadBalancer(127.0.0.1:{} over {:?})", self.port, self.frontends)
    }
}
