//! A pod with Istio's real sidecar: a network namespace with its own address holding the app (a
//! [`Backend`]), Istio's iptables rules (`pilot-agent istio-iptables`) and `pilot-agent proxy
//! sidecar` running as uid/gid 1337, which writes Envoy's bootstrap from Istio's own template,
//! starts Envoy and proxies Envoy's xDS stream to meshpilot. Everything the pod's identity is
//! (node id, metadata) comes from the environment an injected pod has (POD_NAME, INSTANCE_IP,
//! ISTIO_META_*, PROXY_CONFIG, ...) and the labels file of the downward API.
//!
//! By default no CA: `controlPlaneAuthPolicy: NONE` makes the xDS connection plaintext, and the
//! workload's certificate comes from files, as Istio's mounted-certificate mode reads them: a SPIFFE
//! leaf for the pod's service account and the test's mesh root ([`MeshRoot`]) in
//! `./var/run/secrets/workload-spiffe-credentials/` under pilot-agent's working directory make
//! it serve SDS `default` and `ROOTCA` without a CA client (`FILE_MOUNTED_CERTS=true` too, so
//! nothing ever dials a CA). Mesh mutual TLS between pods then works as with istiod's CA. In secure
//! mode ([`SidecarPodBuilder::secure_control_plane`]) the pod is as an injected one talking to
//! istiod: a service-account token and the root certificate mounted where pilot-agent reads them,
//! TLS to the secure port for xDS and the CA (`CA_ADDR`).
//!
//! ```ignore
//! let Some(builder) = SidecarPod::builder("productpage-1", NS) else { return };
//! let builder = builder.label("app", "productpage");
//! let cp = Meshpilot::standalone_on_kubernetes(kubeconfig).xds_addr(builder.xds_addr()).start();
//! let pod = builder.start(cp.xds_addr()).await;
//! ```

use std::collections::{BTreeMap, HashMap};
use std::net::{Ipv4Addr, SocketAddr};
use std::os::unix::fs::chown;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use serde_json::{json, Value};

use super::backend::Backend;
use super::certs::MeshRoot;
use super::envoy::{envoy_path, parse_stats};
use super::http::{http_client, http_request};
use super::mesh::rejection_problem;
use super::netns::{Forward, NetNs};
use super::poll::STARTUP_TIMEOUT;
use super::ports::free_port;
use super::process::{deref_to_process, temp_dir, Process, ProcessSpec};

/// The istio.io/istio version pilot-agent is built from (`scripts/istio-version`): a master
/// pseudo-version, the only one the Go module proxy here serves.
pub const ISTIO_VERSION: &str = include_str!("../../scripts/istio-version").trim_ascii();
/// The uid and gid Envoy and pilot-agent run as; Istio's iptables rules let them through.
pub const PROXY_UID: u32 = 1337;
/// Envoy's admin port (127.0.0.1 inside the pod).
pub const ADMIN_PORT: u16 = 15000;
/// Where iptables sends the app's outbound connections (`virtualOutbound`).
pub const OUTBOUND_CAPTURE_PORT: u16 = 15001;
/// Where iptables sends inbound connections (`virtualInbound`).
pub const INBOUND_CAPTURE_PORT: u16 = 15006;
/// pilot-agent's status port; with Envoy's 15021 and 15090 it is not captured.
pub const STATUS_PORT: u16 = 15020;
/// The Kubernetes node the pods of the sidecar tests run on.
pub const NODE_NAME: &str = "node-a";

/// Service `server` in `ns` at `cluster_ip:port` (port `http`, to `target`) and its EndpointSlice
/// holding pod `pod` at `ip` on [`NODE_NAME`]: what the API server holds for a one-pod service.
pub fn server_service(
    ns: &str,
    (cluster_ip, port): (Ipv4Addr, u16),
    pod: &str,
    ip: Ipv4Addr,
    target: u16,
) -> [String; 2] {
    [
        format!(
            "apiVersion: v1\nkind: Service\nmetadata: {{name: server, namespace: {ns}}}\nspec:\n  clusterIP: {cluster_ip}\n  \
             selector: {{app: server}}\n  ports: [{{name: http, port: {port}, targetPort: {target}}}]\n"
        ),
        format!(
            "apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata:\n  name: server-abcde\n  namespace: {ns}\n  \
             labels: {{kubernetes.io/service-name: server}}\naddressType: IPv4\nports: [{{name: http, port: {target}, \
             protocol: TCP}}]\nendpoints:\n- addresses: [\"{ip}\"]\n  conditions: {{ready: true, serving: true, \
             terminating: false}}\n  nodeName: {NODE_NAME}\n  targetRef: {{kind: Pod, name: {pod}, namespace: {ns}}}\n"
        ),
    ]
}

/// pilot-agent and the bootstrap template beside it (what `scripts/pilot-agent.sh` installs).
#[derive(Debug, Clone)]
pub struct PilotAgent {
    /// The binary.
    pub binary: PathBuf,
    /// Istio's Envoy bootstrap template (`envoy_bootstrap_tmpl.json` beside the binary).
    pub template: PathBuf,
}

/// pilot-agent: `$MESHPILOT_PILOT_AGENT`, else what `scripts/pilot-agent.sh` built. `None` (the
/// test skips, saying why) where neither exists or the iptables binaries `pilot-agent
/// istio-iptables` runs are missing, except in CI, where that is a failure.
pub fn pilot_agent() -> Option<PilotAgent> {
    let binary = match std::env::var_os("MESHPILOT_PILOT_AGENT").filter(|p| !p.is_empty()) {
        Some(p) => {
            let p = PathBuf::from(p);
            assert!(p.is_file(), "MESHPILOT_PILOT_AGENT={} does not exist", p.display());
            Some(p)
        }
        None => {
            let script = super::deploy::repo().join("scripts/pilot-agent.sh");
            let out = Command::new("bash").arg(script).output().ok();
            out.filter(|o| o.status.success()).map(|o| PathBuf::from(String::from_utf8_lossy(&o.stdout).trim()))
        }
    };
    let has_iptables = Command::new("iptables-restore").arg("--version").output().is_ok_and(|o| o.status.success());
    let why = match binary.filter(|b| b.is_file()) {
        Some(_) if !has_iptables => {
            "the iptables binaries are missing: `bash scripts/setup.sh` installs Debian's iptables package"
        }
        Some(binary) => {
            let template = binary.with_file_name("envoy_bootstrap_tmpl.json");
            assert!(template.is_file(), "{} is missing: `bash scripts/pilot-agent.sh` installs it", template.display());
            return Some(PilotAgent { binary, template });
        }
        None => {
            "pilot-agent is not available: `bash scripts/pilot-agent.sh` builds it where Go exists \
             (or set MESHPILOT_PILOT_AGENT)"
        }
    };
    assert!(std::env::var("CI").as_deref() != Ok("true"), "{why} (CI=true: this test must run)");
    eprintln!("SKIPPED: {why}");
    None
}

/// Which xDS protocol pilot-agent's bootstrap gives Envoy (and its proxy speaks to meshpilot).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum XdsMode {
    /// pilot-agent's default: delta ADS (`api_type: DELTA_GRPC`); ISTIO_DELTA_XDS is not set.
    Delta,
    /// State of the world (`ISTIO_DELTA_XDS=false`, `api_type: GRPC`).
    Sotw,
}

impl XdsMode {
    /// `MESHPILOT_SIDECAR_XDS=sotw|delta`, else pilot-agent's default ([`XdsMode::Delta`]).
    pub fn from_env() -> XdsMode {
        match std::env::var("MESHPILOT_SIDECAR_XDS").as_deref() {
            Ok("sotw") => XdsMode::Sotw,
            Ok("delta") | Ok("") | Err(_) => XdsMode::Delta,
            Ok(other) => panic!("MESHPILOT_SIDECAR_XDS={other}: expected sotw or delta"),
        }
    }
}

/// Options for a [`SidecarPod`]; its network namespace exists already (see [`SidecarPod::builder`]).
pub struct SidecarPodBuilder {
    agent: PilotAgent,
    netns: NetNs,
    name: String,
    namespace: String,
    service_account: String,
    labels: BTreeMap<String, String>,
    app_port: u16,
    xds_mode: XdsMode,
    proxy_log_level: String,
    env: Vec<(String, String)>,
    secure: Option<SecureControlPlane>,
}

/// What a pod needs to reach meshpilot's secure port as a stock injected pod reaches istiod's:
/// its service-account token (audience `istio-ca`) and the mesh's root certificate.
#[derive(Debug, Clone)]
pub struct SecureControlPlane {
    /// The token pilot-agent presents (third-party JWT, `./var/run/secrets/tokens/istio-token`).
    pub token: String,
    /// The root certificate it trusts (`./var/run/secrets/istio/root-cert.pem`, the
    /// `istio-ca-root-cert` ConfigMap's mount).
    pub root_pem: String,
}

/// Where pilot-agent writes the workload certificate it got (`OUTPUT_CERTS`), relative to its
/// working directory.
pub const OUTPUT_CERTS_DIR: &str = "etc/istio/workload-certs";

impl SidecarPodBuilder {
    /// The pod's IP.
    pub fn ip(&self) -> Ipv4Addr {
        self.netns.addr(0)
    }
    /// The pod's network namespace (e.g. to [`NetNs::link`] it to another).
    pub fn netns(&self) -> &NetNs {
        &self.netns
    }
    /// An address on the host the pod reaches (its veth's host end), port chosen now: where
    /// meshpilot's xDS server must listen.
    pub fn xds_addr(&self) -> SocketAddr {
        SocketAddr::from((self.netns.host_addr(), free_port()))
    }
    /// The app's container port.
    pub fn app_port(&self) -> u16 {
        self.app_port
    }
    /// Adds a pod label (written to the downward API's labels file and to [`Self::pod_yaml`]).
    pub fn label(mut self, key: &str, value: &str) -> Self {
        self.labels.insert(key.to_string(), value.to_string());
        self
    }
    /// The service account (default `default`).
    pub fn service_account(mut self, name: &str) -> Self {
        self.service_account = name.to_string();
        self
    }
    /// Delta (pilot-agent's default) or state-of-the-world xDS (default: [`XdsMode::from_env`]).
    pub fn xds_mode(mut self, mode: XdsMode) -> Self {
        self.xds_mode = mode;
        self
    }
    /// Envoy's log level, pilot-agent's `--proxyLogLevel` (default `warning`).
    pub fn proxy_log_level(mut self, level: &str) -> Self {
        self.proxy_log_level = level.to_string();
        self
    }
    /// Secure mode: pilot-agent dials the address given to [`Self::start`] with TLS
    /// (`controlPlaneAuthPolicy: MUTUAL_TLS`), gets its workload certificate from the CA there
    /// (`CA_ADDR`), and authenticates with `secure.token`. Without it (the default) the xDS
    /// connection is plaintext and pilot-agent runs no CA client.
    pub fn secure_control_plane(mut self, secure: SecureControlPlane) -> Self {
        self.secure = Some(secure);
        self
    }
    /// An extra environment variable of pilot-agent (e.g. `ISTIO_META_...`).
    pub fn env(mut self, key: &str, value: &str) -> Self {
        self.env.push((key.to_string(), value.to_string()));
        self
    }

    /// `sidecar~IP~NAME.NAMESPACE~NAMESPACE.svc.cluster.local`, the node id pilot-agent makes.
    pub fn node_id(&self) -> String {
        format!("sidecar~{}~{}.{ns}~{ns}.svc.cluster.local", self.ip(), self.name, ns = self.namespace)
    }

    /// The running Pod as the API server holds it once injected, scheduled and started: the app
    /// container (port `http`), the `istio-proxy` container, and the status the kubelet writes.
    pub fn pod_yaml(&self) -> String {
        let labels: Vec<String> = self.labels.iter().map(|(k, v)| format!("{k}: {v}")).collect();
        format!(
            "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\n  namespace: {ns}\n  labels: {{{labels}}}\n  \
             annotations: {{sidecar.istio.io/status: '{{\"containers\":[\"istio-proxy\"]}}'}}\nspec:\n  nodeName: \
             {NODE_NAME}\n  serviceAccountName: {sa}\n  containers:\n  - {{name: app, image: app, ports: [{{name: http, \
             containerPort: {port}}}]}}\n  - {{name: istio-proxy, image: proxyv2, ports: [{{name: http-envoy-prom, \
             containerPort: 15090}}]}}\nstatus:\n  phase: Running\n  podIP: \"{ip}\"\n  podIPs: [{{ip: \"{ip}\"}}]\n  \
             conditions: [{{type: Ready, status: \"True\"}}]\n",
            name = self.name,
            ns = self.namespace,
            labels = labels.join(", "),
            sa = self.service_account,
            port = self.app_port,
            ip = self.ip(),
        )
    }

    /// Starts the app, applies Istio's iptables rules in the pod, starts pilot-agent (and so
    /// Envoy) with meshpilot at `xds_addr` (its secure port in [`Self::secure_control_plane`] mode), and waits until Envoy is ready (has its listeners and
    /// clusters). Panics with pilot-agent's log (which holds Envoy's) on failure.
    pub async fn start(self, xds_addr: SocketAddr) -> SidecarPod {
        let app = Backend::builder(&self.name)
            .listener(self.netns.listen(SocketAddr::from((Ipv4Addr::UNSPECIFIED, self.app_port))))
            .start();
        self.apply_iptables();
        let dir = self.prepare_dir();
        let node_id = self.node_id();
        let spec = self.agent_spec(dir.path(), xds_addr);
        let process = Process::start(dir, spec);
        let admin = self.netns.forward(SocketAddr::from((Ipv4Addr::LOCALHOST, ADMIN_PORT))).await;
        let pod = SidecarPod {
            process,
            admin,
            client: http_client(),
            app,
            node_id,
            ip: self.netns.addr(0),
            app_port: self.app_port,
            xds_mode: self.xds_mode,
            netns: self.netns,
        };
        pod.wait_ready(STARTUP_TIMEOUT).await;
        pod
    }

    /// `pilot-agent istio-iptables` as an injected pod's init container runs it: TCP to any port
    /// goes to 15006 (but 15090, 15021, 15020), outbound TCP to 15001, uid/gid 1337 exempt.
    fn apply_iptables(&self) {
        let out = Command::new("ip")
            .args(["netns", "exec", self.netns.name()])
            .arg(&self.agent.binary)
            .args(["istio-iptables", "-p", &OUTBOUND_CAPTURE_PORT.to_string()])
            .args(["-z", &INBOUND_CAPTURE_PORT.to_string(), "-u", &PROXY_UID.to_string(), "-m", "REDIRECT"])
            .args(["-i", "*", "-x", "", "-b", "*", "-d", "15090,15021,15020"])
            .output()
            .expect("running pilot-agent istio-iptables");
        assert!(
            out.status.success(),
            "pilot-agent istio-iptables failed (are the iptables binaries installed? `bash scripts/setup.sh`):\n{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// pilot-agent's working directory, owned by 1337: the binaries (hard links, else copies, as
    /// uid 1337 cannot reach them under /root), the bootstrap template where the istio-proxy
    /// image has it, and the downward API's labels file. pilot-agent writes the rest
    /// (`etc/istio/proxy/envoy-rev.json`, the XDS and SDS sockets) relative to it.
    fn prepare_dir(&self) -> tempfile::TempDir {
        let dir = temp_dir("meshpilot-sidecar-");
        let d = dir.path();
        let own = |p: &Path| chown(p, Some(PROXY_UID), Some(PROXY_UID)).expect("chown to the proxy uid");
        own(d);
        link_or_copy(&self.agent.binary, &d.join("pilot-agent"));
        link_or_copy(&envoy_path(), &d.join("envoy"));
        for sub in ["var", "var/lib", "var/lib/istio", "var/lib/istio/envoy", "etc", "etc/istio", "etc/istio/pod"] {
            std::fs::create_dir(d.join(sub)).expect("creating pilot-agent's directories");
            own(&d.join(sub));
        }
        let template = d.join("var/lib/istio/envoy/envoy_bootstrap_tmpl.json");
        std::fs::copy(&self.agent.template, &template).expect("copying the bootstrap template");
        own(&template);
        // Istio's mounted workload certificate: pilot-agent serves it as `default`/`ROOTCA`. Not
        // in secure mode: pilot-agent finding these files runs no CA client at all, so the
        // certificate would not come from meshpilot's CA.
        if self.secure.is_none() {
            let creds = ["var/run", "var/run/secrets", "var/run/secrets/workload-spiffe-credentials"];
            for sub in creds {
                std::fs::create_dir(d.join(sub)).expect("creating the credentials directory");
                own(&d.join(sub));
            }
            let root = MeshRoot::get();
            let leaf = root.workload(&self.namespace, &self.service_account);
            let creds = d.join(creds[2]);
            for (file, pem) in [("cert-chain.pem", &leaf.cert), ("key.pem", &leaf.key), ("root-cert.pem", &root.pem())]
            {
                std::fs::write(creds.join(file), pem).expect("writing the workload certificate");
                own(&creds.join(file));
            }
        }
        let labels: String = self.labels.iter().map(|(k, v)| format!("{k}=\"{v}\"\n")).collect();
        let labels_file = d.join("etc/istio/pod/labels");
        std::fs::write(&labels_file, labels).expect("writing the labels file");
        own(&labels_file);
        if let Some(secure) = &self.secure {
            for sub in
                ["var/run", "var/run/secrets", "var/run/secrets/tokens", "var/run/secrets/istio", OUTPUT_CERTS_DIR]
            {
                std::fs::create_dir(d.join(sub)).expect("creating pilot-agent's secret directories");
                own(&d.join(sub));
            }
            for (file, text) in [
                ("var/run/secrets/tokens/istio-token", &secure.token),
                ("var/run/secrets/istio/root-cert.pem", &secure.root_pem),
            ] {
                std::fs::write(d.join(file), text).expect("writing a mounted secret");
                own(&d.join(file));
            }
        }
        dir
    }

    /// `ip netns exec POD setpriv (uid/gid 1337) pilot-agent proxy sidecar` with the environment
    /// Istio's injection gives the istio-proxy container.
    fn agent_spec(&self, dir: &Path, xds_addr: SocketAddr) -> ProcessSpec {
        let auth_policy = if self.secure.is_some() { "MUTUAL_TLS" } else { "NONE" };
        let proxy_config = json!({
            "discoveryAddress": xds_addr.to_string(),
            "controlPlaneAuthPolicy": auth_policy,
            "binaryPath": dir.join("envoy"),
            "concurrency": 1,
            "drainDuration": "1s",
            "terminationDrainDuration": "0s",
            // Istio's bootstrap keeps few stats; a user who wants these asks for them this way
            // (the `proxy.istio.io/config` annotation): per cluster and per route configuration.
            "proxyStatsMatcher": {"inclusionPrefixes": ["cluster.inbound|", "cluster.outbound|", "http."]},
        });
        let pod_ports = json!([{"name": "http", "containerPort": self.app_port, "protocol": "TCP"}]);
        let workload = self.labels.get("app").cloned().unwrap_or_else(|| self.name.clone());
        let mut spec = ProcessSpec::new(format!("pilot-agent {}", self.name), "ip")
            .args(["netns", "exec", self.netns.name(), "setpriv"])
            .args([format!("--reuid={PROXY_UID}"), format!("--regid={PROXY_UID}"), "--clear-groups".into()])
            .args(["./pilot-agent", "proxy", "sidecar", "--proxyLogLevel", &self.proxy_log_level])
            .current_dir(dir)
            .env("POD_NAME", &self.name)
            .env("POD_NAMESPACE", &self.namespace)
            .env("INSTANCE_IP", self.ip().to_string())
            .env("SERVICE_ACCOUNT", &self.service_account)
            .env("HOST_IP", self.netns.host_addr().to_string())
            .env("NODE_NAME", NODE_NAME)
            .env("PROXY_CONFIG", proxy_config.to_string())
            .env("ISTIO_META_POD_PORTS", pod_ports.to_string())
            .env("ISTIO_META_APP_CONTAINERS", "app")
            .env("ISTIO_META_CLUSTER_ID", "Kubernetes")
            .env("ISTIO_META_NODE_NAME", NODE_NAME)
            .env("ISTIO_META_INTERCEPTION_MODE", "REDIRECT")
            .env("ISTIO_META_WORKLOAD_NAME", &workload)
            .env(
                "ISTIO_META_OWNER",
                format!("kubernetes://apis/apps/v1/namespaces/{}/deployments/{workload}", self.namespace),
            )
            .env("ISTIO_META_MESH_ID", "cluster.local")
            .env("TRUST_DOMAIN", "cluster.local")
            .log_tail(150, 150);
        spec = match &self.secure {
            // The CA is the secure xDS address, as with istiod; the certificate is also written out.
            Some(_) => spec.env("CA_ADDR", xds_addr.to_string()).env("OUTPUT_CERTS", format!("./{OUTPUT_CERTS_DIR}")),
            None => spec.env("FILE_MOUNTED_CERTS", "true"),
        };
        if self.xds_mode == XdsMode::Sotw {
            spec = spec.env("ISTIO_DELTA_XDS", "false");
        }
        for (k, v) in &self.env {
            spec = spec.env(k, v);
        }
        spec
    }
}

/// A hard link to `from` at `to`, else a copy (another file system).
fn link_or_copy(from: &Path, to: &Path) {
    if std::fs::hard_link(from, to).is_err() {
        std::fs::copy(from, to).unwrap_or_else(|e| panic!("copying {} to {}: {e}", from.display(), to.display()));
    }
}

/// A running pod with its sidecar; see the module docs. Derefs to pilot-agent's [`Process`]
/// (whose log holds Envoy's). Dropping it kills pilot-agent, then whatever is left in the pod
/// (Envoy), then deletes the namespace (and with it the iptables rules).
pub struct SidecarPod {
    // Declared first: dropped (killed) before the namespace.
    process: Process,
    admin: Forward,
    client: reqwest::Client,
    app: Backend,
    node_id: String,
    ip: Ipv4Addr,
    app_port: u16,
    xds_mode: XdsMode,
    netns: NetNs,
}

deref_to_process!(SidecarPod);

impl SidecarPod {
    /// A builder for pod `name` in `namespace`, with a new network namespace and a free app port.
    /// `None` (the test skips, saying why) where pilot-agent is missing or namespaces cannot be
    /// made, except in CI, where that is a failure.
    pub fn builder(name: &str, namespace: &str) -> Option<SidecarPodBuilder> {
        let agent = pilot_agent()?;
        let netns = NetNs::create(1)?;
        Some(SidecarPodBuilder {
            agent,
            netns,
            name: name.to_string(),
            namespace: namespace.to_string(),
            service_account: "default".to_string(),
            // Injection labels every pod with a sidecar so: auto mTLS reads it from endpoints.
            labels: BTreeMap::from([("security.istio.io/tlsMode".to_string(), "istio".to_string())]),
            app_port: free_port(),
            xds_mode: XdsMode::from_env(),
            proxy_log_level: "warning".to_string(),
            env: Vec::new(),
            secure: None,
        })
    }

    /// The pod's IP.
    pub fn ip(&self) -> Ipv4Addr {
        self.ip
    }
    /// The app's port.
    pub fn app_port(&self) -> u16 {
        self.app_port
    }
    /// The app (a [`Backend`] named like the pod, listening on 0.0.0.0:app port in the pod).
    pub fn app(&self) -> &Backend {
        &self.app
    }
    /// The node id pilot-agent gives Envoy.
    pub fn node_id(&self) -> &str {
        &self.node_id
    }
    /// The xDS protocol Envoy and pilot-agent speak.
    pub fn xds_mode(&self) -> XdsMode {
        self.xds_mode
    }
    /// The pod's network namespace.
    pub fn netns(&self) -> &NetNs {
        &self.netns
    }

    /// pilot-agent's SDS socket (what Envoy asks for its certificates), under its working directory.
    pub fn sds_socket(&self) -> PathBuf {
        self.process.dir().join("var/run/secrets/workload-spiffe-uds/socket")
    }

    /// The workload certificate chain pilot-agent got from the CA (secure mode), once written.
    pub fn workload_cert_chain(&self) -> Option<String> {
        std::fs::read_to_string(self.process.dir().join(OUTPUT_CERTS_DIR).join("cert-chain.pem")).ok()
    }

    /// A relay from 127.0.0.1 on the host that connects to `target` from inside the pod as the
    /// app would (not as uid 1337): Istio's rules send it to Envoy's outbound side.
    pub async fn outbound(&self, target: SocketAddr) -> Forward {
        self.netns.forward(target).await
    }

    /// The pod's nat table (`iptables-save -t nat`).
    pub fn iptables_nat(&self) -> String {
        let out = Command::new("ip")
            .args(["netns", "exec", self.netns.name(), "iptables-save", "-t", "nat"])
            .output()
            .expect("running iptables-save");
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// GET a path of Envoy's admin API (127.0.0.1:15000 in the pod); None if unreachable.
    pub async fn try_admin_get(&self, path: &str) -> Option<(u16, String)> {
        let url = format!("http://{}{path}", self.admin.addr());
        http_request(&self.client, "GET", &url, "", &[], None).await.ok().map(|r| (r.status, r.body))
    }

    /// GET a path of Envoy's admin API; panics (with the log) unless 200.
    pub async fn admin_get(&self, path: &str) -> String {
        match self.try_admin_get(path).await {
            Some((200, body)) => body,
            other => self.fail(&format!("Envoy admin GET {path}: {other:?}")),
        }
    }

    /// Polls Envoy's `/ready` until 200; panics (with the log) on timeout or if pilot-agent exits.
    pub async fn wait_ready(&self, timeout: Duration) {
        let mut last = None;
        let ready = self
            .poll_while_running(timeout, async || {
                last = self.try_admin_get("/ready").await;
                matches!(last, Some((200, _)))
            })
            .await;
        if !ready {
            // The log's tail may be all retries; the last xDS stream error says why up front.
            let logs = self.logs();
            let xds_error = logs.lines().rev().find(|l| {
                l.contains("upstream terminated with unexpected error")
                    || l.contains("config stream to xds-grpc closed")
            });
            self.fail(&format!(
                "Envoy not ready after {timeout:?} (last /ready: {last:?}; last xDS stream error: {})",
                xds_error.unwrap_or("none")
            ));
        }
    }

    /// Envoy's `/config_dump?include_eds` as JSON.
    pub async fn config_dump(&self) -> Value {
        serde_json::from_str(&self.admin_get("/config_dump?include_eds").await).expect("config_dump is JSON")
    }

    /// The bootstrap pilot-agent generated, as Envoy holds it.
    pub async fn bootstrap(&self) -> Value {
        let dump = self.config_dump().await;
        super::config_dump::dump_section(&dump, "BootstrapConfigDump")
            .map(|s| s["bootstrap"].clone())
            .expect("a bootstrap in the config_dump")
    }

    /// Envoy's `/stats` as name → value (counters and gauges).
    pub async fn stats(&self) -> HashMap<String, u64> {
        parse_stats(&self.admin_get("/stats").await)
    }

    /// One counter or gauge, 0 if Envoy does not have it (yet).
    pub async fn stat(&self, name: &str) -> u64 {
        self.stats().await.get(name).copied().unwrap_or(0)
    }

    /// Asserts that Envoy rejected no xDS update (see [`rejection_problem`]).
    pub async fn assert_no_rejections(&self) {
        let (stats, dump) = (self.stats().await, self.config_dump().await);
        if let Some(problem) = rejection_problem(&stats, &dump) {
            self.fail(&format!("Envoy ({}) {problem}", self.node_id));
        }
    }
}

impl std::fmt::Debug for SidecarPod {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "SidecarPod({} {:?})", self.node_id, self.xds_mode)
    }
}
