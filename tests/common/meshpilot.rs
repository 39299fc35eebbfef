//! The meshpilot binary under test, in any mode (`standalone`, `ingest`, `frontend`), on
//! 127.0.0.1 ports from [`super::ports`], with its admin API (`/ready`, `/debug/*`, `/metrics`).
//!
//! ```ignore
//! let cp = Meshpilot::standalone(config.path()).start();
//! cp.wait_ready(STARTUP_TIMEOUT).await;
//! let ingest = Meshpilot::ingest(&etcd.endpoint(), config.path()).id("ingest-0").lease_ttl(2).start();
//! let fe = Meshpilot::frontend(&etcd.endpoint()).id("fe-a").start();
//! ```

use std::collections::BTreeMap;
use std::fmt;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use serde_json::Value;

use super::etcd::EtcdEndpoint;
use super::http::{http_client_with_timeout, http_request, REQUEST_TIMEOUT};
use super::poll::{poll, Outcome};
use super::ports::free_addr;
use super::process::{deref_to_process, temp_dir, Process, ProcessSpec};
use super::prometheus::{metric_value, Samples};

/// Timeout of one admin request to an ingest node or frontend (short: they are killed on purpose).
const NODE_REQUEST_TIMEOUT: Duration = Duration::from_secs(5);

/// OpenTelemetry variables a test's environment must not pass on: only tests that ask for
/// telemetry export it.
const OTEL_VARIABLES: [&str; 4] =
    ["OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_SERVICE_NAME", "OTEL_RESOURCE_ATTRIBUTES", "OTEL_TRACES_SAMPLER"];

/// What a [`Meshpilot`] runs as: the subcommand.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// `meshpilot standalone`: ingest and an xDS frontend in one process.
    Standalone,
    /// `meshpilot ingest`: leader-elected through etcd; the leader serves snapshots.
    Ingest,
    /// `meshpilot frontend`: follows the leader's snapshots, registers as a member, serves ADS.
    Frontend,
}

/// The etcd a [`Meshpilot`] ingest node or frontend uses: a harness [`EtcdEndpoint`] (URL and
/// the flags its TLS or plaintext needs), or a bare `--etcd-endpoints` value (no other flag).
pub trait EtcdTarget {
    /// `--etcd-endpoints`' value.
    fn endpoints(&self) -> String;
    /// The flags reaching it besides `--etcd-endpoints`.
    fn etcd_args(&self) -> Vec<String>;
}

impl EtcdTarget for EtcdEndpoint {
    fn endpoints(&self) -> String {
        self.url.clone()
    }
    fn etcd_args(&self) -> Vec<String> {
        self.meshpilot_args()
    }
}

impl EtcdTarget for str {
    fn endpoints(&self) -> String {
        self.to_string()
    }
    fn etcd_args(&self) -> Vec<String> {
        Vec::new()
    }
}

impl EtcdTarget for String {
    fn endpoints(&self) -> String {
        self.clone()
    }
    fn etcd_args(&self) -> Vec<String> {
        Vec::new()
    }
}

/// Options for a [`Meshpilot`]; see [`Meshpilot::standalone`], [`Meshpilot::ingest`] and
/// [`Meshpilot::frontend`].
pub struct MeshpilotBuilder {
    mode: Mode,
    etcd_endpoints: Option<String>,
    etcd_args: Vec<String>,
    config_dir: Option<PathBuf>,
    mesh_config: Option<PathBuf>,
    id: Option<String>,
    lease_ttl: Option<u64>,
    debounce_after: Option<String>,
    proxy_key: Option<String>,
    xds_addr: Option<SocketAddr>,
    secure_xds: Option<SecureXds>,
    webhook: Option<SecureXds>,
    admin_addr: Option<SocketAddr>,
    cacerts_dir: Option<PathBuf>,
    args: Vec<String>,
    env: Vec<(String, String)>,
}

/// The secure xDS port of a process started with [`MeshpilotBuilder::secure_xds`].
#[derive(Debug, Clone)]
struct SecureXds {
    addr: SocketAddr,
    sans: Vec<String>,
}

impl MeshpilotBuilder {
    fn new(mode: Mode, etcd: Option<&(impl EtcdTarget + ?Sized)>, config_dir: Option<&Path>) -> MeshpilotBuilder {
        MeshpilotBuilder {
            mode,
            etcd_endpoints: etcd.map(EtcdTarget::endpoints),
            etcd_args: etcd.map(EtcdTarget::etcd_args).unwrap_or_default(),
            config_dir: config_dir.map(Path::to_path_buf),
            mesh_config: None,
            id: None,
            lease_ttl: None,
            debounce_after: None,
            proxy_key: None,
            xds_addr: None,
            secure_xds: None,
            webhook: None,
            admin_addr: None,
            cacerts_dir: None,
            args: Vec::new(),
            env: Vec::new(),
        }
    }

    /// Panics unless the mode is one of `modes` (the flag exists only there).
    fn only(&self, flag: &str, modes: &[Mode]) {
        assert!(modes.contains(&self.mode), "meshpilot {:?} has no {flag}", self.mode);
    }

    /// `--kubeconfig FILE` (standalone, ingest): watch that cluster, beside any config dir.
    pub fn kubeconfig(mut self, path: impl AsRef<Path>) -> Self {
        self.only("--kubeconfig", &[Mode::Standalone, Mode::Ingest]);
        self.args.extend(["--kubeconfig".to_string(), path.as_ref().display().to_string()]);
        self
    }
    /// `--mesh-config FILE` (standalone, ingest).
    pub fn mesh_config(mut self, path: impl AsRef<Path>) -> Self {
        self.only("--mesh-config", &[Mode::Standalone, Mode::Ingest]);
        self.mesh_config = Some(path.as_ref().to_path_buf());
        self
    }
    /// `--id` (ingest: default `ingest-<admin port>`; frontend: the member id, also the load
    /// balancer's `hash_key`, default `frontend-<xds port>`).
    pub fn id(mut self, id: &str) -> Self {
        self.only("--id", &[Mode::Ingest, Mode::Frontend]);
        self.id = Some(id.to_string());
        self
    }
    /// `--lease-ttl SECS` (ingest: leadership; frontend: membership).
    pub fn lease_ttl(mut self, secs: u64) -> Self {
        self.only("--lease-ttl", &[Mode::Ingest, Mode::Frontend]);
        self.lease_ttl = Some(secs);
        self
    }
    /// `--debounce-after` (e.g. `100ms`; standalone, ingest).
    pub fn debounce_after(mut self, d: &str) -> Self {
        self.only("--debounce-after", &[Mode::Standalone, Mode::Ingest]);
        self.debounce_after = Some(d.to_string());
        self
    }
    /// `--proxy-key namespace-service-account|node-id` (frontend).
    pub fn proxy_key(mut self, key: &str) -> Self {
        self.only("--proxy-key", &[Mode::Frontend]);
        self.proxy_key = Some(key.to_string());
        self
    }
    /// `--xds-addr` (standalone, frontend; default 127.0.0.1 and a free port): e.g. the host end
    /// of a test network namespace's veth, for proxies inside it.
    pub fn xds_addr(mut self, addr: SocketAddr) -> Self {
        self.only("--xds-addr", &[Mode::Standalone, Mode::Frontend]);
        self.xds_addr = Some(addr);
        self
    }
    /// An extra command-line argument (after the standard ones).
    pub fn arg(mut self, arg: &str) -> Self {
        self.args.push(arg.to_string());
        self
    }
    /// An environment variable (e.g. `RUST_LOG`, default `info`).
    pub fn env(mut self, key: &str, value: &str) -> Self {
        self.env.push((key.to_string(), value.to_string()));
        self
    }
    /// Several environment variables.
    pub fn envs(mut self, vars: &[(&str, String)]) -> Self {
        self.env.extend(vars.iter().map(|(k, v)| (k.to_string(), v.clone())));
        self
    }

    /// The admin server's address (default: a free 127.0.0.1 port).
    pub fn admin_addr(mut self, addr: SocketAddr) -> Self {
        self.admin_addr = Some(addr);
        self
    }

    /// `--cacerts-dir DIR`: sign with the CA (Istio plug-in files) in `dir`, which the test
    /// shares between processes (e.g. a server and one built from scratch beside it), instead
    /// of the CA the process or its etcd would get.
    pub fn cacerts_dir(mut self, dir: impl AsRef<Path>) -> Self {
        self.cacerts_dir = Some(dir.as_ref().to_path_buf());
        self
    }

    /// Serves the secure xDS port (TLS, authenticated ADS and the CA) on `addr` with extra
    /// certificate names `sans`; the CA keeps its files in the process's directory (with
    /// Kubernetes: the istio-ca-secret). Without this option the process runs no secure port.
    pub fn secure_xds(mut self, addr: SocketAddr, sans: &[String]) -> Self {
        self.only("--secure-xds-addr", &[Mode::Standalone, Mode::Frontend]);
        self.secure_xds = Some(SecureXds { addr, sans: sans.to_vec() });
        self
    }

    /// Serves Istio's validating webhook (HTTPS, `/validate`) on `addr` with extra certificate
    /// names `sans`; the CA keeps its files in the process's directory, as with
    /// [`Self::secure_xds`] (with Kubernetes: the istio-ca-secret).
    pub fn webhook(mut self, addr: SocketAddr, sans: &[String]) -> Self {
        self.only("--webhook-addr", &[Mode::Standalone, Mode::Ingest]);
        self.webhook = Some(SecureXds { addr, sans: sans.to_vec() });
        self
    }

    /// Spawns `meshpilot MODE ...` and returns at once; see [`Meshpilot::wait_ready`].
    pub fn start(self) -> Meshpilot {
        let admin_addr = self.admin_addr.unwrap_or_else(free_addr);
        // Split mode runs the secure default (a mutual-TLS snapshot stream): every ingest node
        // and frontend of one etcd shares one CA unless the test names its own.
        let shared_ca = self.shared_ca_wanted().then(|| shared_ca(self.etcd_endpoints.as_deref().unwrap_or("")));
        let (subcommand, xds_addr, snapshot_addr) = match self.mode {
            Mode::Standalone => ("standalone", Some(self.xds_addr.unwrap_or_else(free_addr)), None),
            Mode::Ingest => ("ingest", None, Some(free_addr())),
            Mode::Frontend => ("frontend", Some(self.xds_addr.unwrap_or_else(free_addr)), None),
        };
        let id = match self.mode {
            Mode::Standalone => None,
            Mode::Ingest => Some(self.id.unwrap_or_else(|| format!("ingest-{}", admin_addr.port()))),
            Mode::Frontend => {
                Some(self.id.unwrap_or_else(|| format!("frontend-{}", xds_addr.expect("an xDS address").port())))
            }
        };
        let mut args: Vec<String> = vec![subcommand.into()];
        let mut flag = |name: &str, value: Option<String>| {
            if let Some(v) = value {
                args.extend([name.to_string(), v]);
            }
        };
        flag("--etcd-endpoints", self.etcd_endpoints);
        flag("--config-dir", self.config_dir.map(|d| d.display().to_string()));
        flag("--mesh-config", self.mesh_config.map(|m| m.display().to_string()));
        flag("--xds-addr", xds_addr.map(|a| a.to_string()));
        flag("--snapshot-addr", snapshot_addr.map(|a| a.to_string()));
        flag("--admin-addr", Some(admin_addr.to_string()));
        flag("--id", id.clone());
        flag("--lease-ttl", self.lease_ttl.map(|t| t.to_string()));
        flag("--debounce-after", self.debounce_after);
        flag("--proxy-key", self.proxy_key);
        let (label, dir_prefix, request_timeout) = match &id {
            None => ("meshpilot".to_string(), "meshpilot-cp-", REQUEST_TIMEOUT),
            Some(id) => (format!("{subcommand} {id}"), "meshpilot-node-", NODE_REQUEST_TIMEOUT),
        };
        let dir = temp_dir(dir_prefix);
        if let Some(shared) = shared_ca.as_ref().map(|s| s.path()).or(self.cacerts_dir.as_deref()) {
            flag("--cacerts-dir", Some(shared.display().to_string()));
            flag("--ca-dir", Some(dir.path().join("ca").display().to_string()));
        }
        let own_ca = shared_ca.is_none() && self.cacerts_dir.is_none();
        let secure_xds_addr = self.secure_xds.as_ref().map(|s| s.addr);
        let webhook_addr = self.webhook.as_ref().map(|w| w.addr);
        if let Some(webhook) = &self.webhook {
            flag("--webhook-addr", Some(webhook.addr.to_string()));
            if !webhook.sans.is_empty() {
                flag("--webhook-tls-san", Some(webhook.sans.join(",")));
            }
            // The CA's files stay in the process's directory, not the working directory.
            if self.secure_xds.is_none() && own_ca {
                flag("--ca-dir", Some(dir.path().join("ca").display().to_string()));
                flag("--cacerts-dir", Some(dir.path().join("cacerts").display().to_string()));
            }
        }
        match (&self.secure_xds, self.mode) {
            (Some(secure), _) => {
                flag("--secure-xds-addr", Some(secure.addr.to_string()));
                if own_ca {
                    flag("--ca-dir", Some(dir.path().join("ca").display().to_string()));
                    flag("--cacerts-dir", Some(dir.path().join("cacerts").display().to_string()));
                }
                if !secure.sans.is_empty() {
                    flag("--xds-tls-san", Some(secure.sans.join(",")));
                }
            }
            // Parallel tests must not all bind 15012 (nor keep a CA in the working directory).
            (None, Mode::Standalone | Mode::Frontend) => args.push("--no-secure-xds".into()),
            (None, Mode::Ingest) => {}
        }
        args.extend(self.etcd_args);
        args.extend(self.args);

        let mut spec = ProcessSpec::new(label, Meshpilot::binary())
            .args(args)
            .env("RUST_LOG", "info")
            .env("NO_COLOR", "1")
            .current_dir(env!("CARGO_MANIFEST_DIR"));
        for key in OTEL_VARIABLES {
            spec = spec.env_remove(key);
        }
        spec = if id.is_some() {
            // Cluster nodes log JSON lines: [`applied_versions`] reads them.
            spec.env("MESHPILOT_LOG_FORMAT", "json").log_tail(150, 60)
        } else {
            spec.log_tail(200, 100)
        };
        for (k, v) in self.env {
            spec = spec.env(k, v);
        }
        Meshpilot {
            process: Process::start(dir, spec),
            mode: self.mode,
            id,
            admin_addr,
            xds_addr,
            secure_xds_addr,
            webhook_addr,
            snapshot_addr,
            client: http_client_with_timeout(request_timeout),
            shared_ca,
        }
    }

    /// Whether this process gets its etcd's shared CA: an ingest node or frontend that names no
    /// CA of its own and has no Kubernetes (there the istio-ca-secret is the shared CA).
    fn shared_ca_wanted(&self) -> bool {
        let named = |flags: &[&str]| self.args.iter().any(|a| flags.contains(&a.as_str()));
        matches!(self.mode, Mode::Ingest | Mode::Frontend)
            && self.cacerts_dir.is_none()
            && !named(&["--cacerts-dir", "--ca-dir", "--kubeconfig", "--kubernetes"])
    }
}

/// The CA (Istio plug-in files) every split-mode process of the etcd at `endpoint` shares,
/// made before the first of them starts (so no two ingest nodes create roots of their own) and
/// removed with the last of them.
fn shared_ca(endpoint: &str) -> Arc<tempfile::TempDir> {
    static SHARED: Mutex<BTreeMap<String, Weak<tempfile::TempDir>>> = Mutex::new(BTreeMap::new());
    let mut shared = SHARED.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(dir) = shared.get(endpoint).and_then(Weak::upgrade) {
        return dir;
    }
    let dir = Arc::new(temp_dir("meshpilot-shared-ca-"));
    let material = meshpilot::security::ca::CertificateAuthority::self_signed_material(
        &meshpilot::security::TrustDomain::default(),
    )
    .expect("a root for the shared CA");
    material.write_dir(dir.path()).expect("writing the shared CA");
    shared.insert(endpoint.to_string(), Arc::downgrade(&dir));
    dir
}

/// One meshpilot process (standalone, ingest node or frontend) on 127.0.0.1 ports chosen at run
/// time. Killed and waited for on drop; derefs to its [`Process`] (`kill`, `terminate`,
/// `restart` on the same ports, `logs`, `pid`, ...).
pub struct Meshpilot {
    process: Process,
    mode: Mode,
    id: Option<String>,
    admin_addr: SocketAddr,
    xds_addr: Option<SocketAddr>,
    secure_xds_addr: Option<SocketAddr>,
    webhook_addr: Option<SocketAddr>,
    snapshot_addr: Option<SocketAddr>,
    client: reqwest::Client,
    /// The CA shared by the ingest nodes and frontends of its etcd (dropped after the process).
    shared_ca: Option<Arc<tempfile::TempDir>>,
}

impl Meshpilot {
    /// The binary under test.
    pub fn binary() -> PathBuf {
        PathBuf::from(env!("CARGO_BIN_EXE_meshpilot"))
    }

    /// `meshpilot standalone --config-dir DIR`.
    pub fn standalone(config_dir: impl AsRef<Path>) -> MeshpilotBuilder {
        MeshpilotBuilder::new(Mode::Standalone, None::<&str>, Some(config_dir.as_ref()))
    }

    /// `meshpilot ingest --etcd-endpoints ENDPOINTS --config-dir DIR`.
    /// `meshpilot standalone --kubeconfig FILE` (no config dir).
    pub fn standalone_on_kubernetes(kubeconfig: impl AsRef<Path>) -> MeshpilotBuilder {
        MeshpilotBuilder::new(Mode::Standalone, None::<&str>, None).kubeconfig(kubeconfig)
    }

    pub fn ingest(etcd: &(impl EtcdTarget + ?Sized), config_dir: impl AsRef<Path>) -> MeshpilotBuilder {
        MeshpilotBuilder::new(Mode::Ingest, Some(etcd), Some(config_dir.as_ref()))
    }

    /// `meshpilot ingest --etcd-endpoints ENDPOINTS --kubeconfig FILE` (no config dir).
    pub fn ingest_on_kubernetes(etcd: &(impl EtcdTarget + ?Sized), kubeconfig: impl AsRef<Path>) -> MeshpilotBuilder {
        MeshpilotBuilder::new(Mode::Ingest, Some(etcd), None).kubeconfig(kubeconfig)
    }

    /// `meshpilot frontend --etcd-endpoints ENDPOINTS`.
    pub fn frontend(etcd: &(impl EtcdTarget + ?Sized)) -> MeshpilotBuilder {
        MeshpilotBuilder::new(Mode::Frontend, Some(etcd), None)
    }

    /// What it runs as.
    pub fn mode(&self) -> Mode {
        self.mode
    }
    /// `--id` of an ingest node or frontend.
    pub fn id(&self) -> &str {
        self.id.as_deref().expect("a standalone meshpilot has no id")
    }
    /// The admin/metrics server's address.
    pub fn admin_addr(&self) -> SocketAddr {
        self.admin_addr
    }
    /// `http://127.0.0.1:PORT` of the admin/metrics server.
    pub fn admin_url(&self) -> String {
        format!("http://{}", self.admin_addr)
    }
    /// The ADS server's address (standalone, frontend).
    pub fn xds_addr(&self) -> SocketAddr {
        self.xds_addr.unwrap_or_else(|| panic!("{} serves no xDS", self.label()))
    }
    /// `http://127.0.0.1:PORT` of the ADS server (for a SimProxy connecting directly).
    pub fn xds_url(&self) -> String {
        format!("http://{}", self.xds_addr())
    }
    /// The secure xDS port's address (see [`MeshpilotBuilder::secure_xds`]).
    pub fn secure_xds_addr(&self) -> SocketAddr {
        self.secure_xds_addr.expect("started with secure_xds")
    }

    /// The validating webhook's address (see [`MeshpilotBuilder::webhook`]).
    pub fn webhook_addr(&self) -> SocketAddr {
        self.webhook_addr.expect("started with webhook")
    }

    /// The CA's directory (self-signed root without Kubernetes) of a process with a secure port
    /// or a webhook.
    pub fn ca_dir(&self) -> PathBuf {
        self.process.dir().join("ca")
    }

    /// The CA files (Istio plug-in layout) an ingest node or frontend shares with the others of
    /// its etcd (see [`MeshpilotBuilder::start`]); `None` when the test named a CA itself.
    pub fn shared_ca_dir(&self) -> Option<PathBuf> {
        self.shared_ca.as_ref().map(|d| d.path().to_path_buf())
    }

    /// The snapshot address (ingest).
    pub fn snapshot_addr(&self) -> SocketAddr {
        self.snapshot_addr.unwrap_or_else(|| panic!("{} serves no snapshots", self.label()))
    }

    /// GET an admin path.
    pub async fn try_admin_get(&self, path: &str) -> Result<(u16, String), reqwest::Error> {
        let url = format!("{}{path}", self.admin_url());
        http_request(&self.client, "GET", &url, "", &[], None).await.map(|r| (r.status, r.body))
    }

    /// GET an admin path; panics (with the log) if the process cannot be reached.
    pub async fn admin_get(&self, path: &str) -> (u16, String) {
        self.try_admin_get(path).await.unwrap_or_else(|e| self.fail(&format!("admin GET {path}: {e:?}")))
    }

    /// GET an admin path answering JSON; None unless reachable, 200 and JSON.
    pub async fn try_admin_json(&self, path: &str) -> Option<Value> {
        match self.try_admin_get(path).await {
            Ok((200, body)) => serde_json::from_str(&body).ok(),
            _ => None,
        }
    }

    /// GET an admin path answering JSON; panics unless 200.
    pub async fn admin_json(&self, path: &str) -> Value {
        let (status, body) = self.admin_get(path).await;
        assert_eq!(status, 200, "{} {path}: {body}", self.label());
        serde_json::from_str(&body).unwrap_or_else(|e| panic!("{} {path} is not JSON: {e}: {body}", self.label()))
    }

    /// `/debug/node`; panics if unreachable.
    pub async fn node(&self) -> Value {
        self.admin_json("/debug/node").await
    }

    /// `/debug/node`, None if unreachable.
    pub async fn try_node(&self) -> Option<Value> {
        self.try_admin_json("/debug/node").await
    }

    /// `/metrics` text, None if unreachable.
    pub async fn try_metrics(&self) -> Option<String> {
        match self.try_admin_get("/metrics").await {
            Ok((200, body)) => Some(body),
            _ => None,
        }
    }

    /// `/metrics`, parsed; panics unless 200.
    pub async fn metrics(&self) -> Samples {
        let (status, body) = self.admin_get("/metrics").await;
        assert_eq!(status, 200, "{} /metrics: {body}", self.label());
        Samples::parse(&body)
    }

    /// One unlabelled sample of `/metrics` (`name value`), None if absent or unreachable.
    pub async fn metric(&self, name: &str) -> Option<f64> {
        metric_value(&self.try_metrics().await?, name)
    }

    /// Polls `/ready` until 200; panics (with the log) on timeout or exit.
    pub async fn wait_ready(&self, timeout: Duration) {
        self.process.wait_http_ready(&self.client, &format!("{}/ready", self.admin_url()), timeout).await;
    }

    /// Polls `f` until it returns true / Some (→ that) or `timeout` passes (→ false / None);
    /// panics (with the log) if the process exits.
    pub async fn wait_for<T: Outcome>(&self, timeout: Duration, mut f: impl AsyncFnMut(&Meshpilot) -> T) -> T {
        self.process.poll_while_running(timeout, async || f(self).await).await
    }

    /// Whether an ingest node's `/debug/node` says `leader: true` (false if unreachable).
    pub async fn is_leader(&self) -> bool {
        self.try_node().await.is_some_and(|n| n["leader"] == true)
    }

    /// `term` of an ingest node's `/debug/node` while it leads.
    pub async fn leader_term(&self) -> Option<u64> {
        self.try_node().await.filter(|n| n["leader"] == true).and_then(|n| n["term"].as_u64())
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

    /// The snapshot version a frontend holds (`/debug/node` `held`), None if none or unreachable.
    pub async fn held(&self) -> Option<meshpilot::snapshot::Version> {
        self.try_node().await.and_then(|n| n["held"].as_str().and_then(|s| s.parse().ok()))
    }
}

deref_to_process!(Meshpilot);

impl fmt::Debug for Meshpilot {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}(admin {}, xds {:?})", self.label(), self.admin_addr, self.xds_addr)
    }
}

/// The ingest node that says it leads, with its term, if exactly one (running) does.
pub async fn current_leader(ingests: &[Meshpilot]) -> Option<(usize, u64)> {
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
pub async fn wait_leader(ingests: &[Meshpilot], timeout: Duration, term_ok: impl Fn(u64) -> bool) -> (usize, u64) {
    let found = poll(timeout, async || current_leader(ingests).await.filter(|&(_, t)| term_ok(t))).await;
    if let Some(found) = found {
        return found;
    }
    let mut states = Vec::new();
    for n in ingests {
        states.push(format!("{}: {:?}", n.id(), n.try_node().await));
    }
    panic!("no (single, acceptable) ingest leader after {timeout:?}:\n{}", states.join("\n"));
}

/// Versions (`TERM.SEQ`) of the `snapshot applied` lines of a frontend's log, by run (a restart
/// starts a new list). Cluster nodes log JSON lines (`MESHPILOT_LOG_FORMAT=json`).
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
            runs.last_mut().expect("a run").push(version);
        }
    }
    runs
}

/// `meshpilot ARGS --admin-url URL` (an operator command against `cp`): success, stdout, stderr.
pub async fn operator_command(cp: &Meshpilot, args: &[&str]) -> (bool, String, String) {
    let mut command = std::process::Command::new(Meshpilot::binary());
    command.args(args).args(["--admin-url", &cp.admin_url()]);
    let out = tokio::task::spawn_blocking(move || command.output()).await.expect("joined").expect("runs");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}
