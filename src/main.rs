//! The `meshpilot` command.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;
use clap::{Parser, Subcommand};
use meshpilot::allocator::Counting;
use meshpilot::app::{self, Process};
use meshpilot::config::parse::Document;
use meshpilot::ingest::DebounceSettings;
use meshpilot::source::files::parse_tree;
use meshpilot::source::kubernetes::ClusterChoice;
use meshpilot::source::{KubeSettings, SourceSettings};
use meshpilot::telemetry::metrics::Registry;
use meshpilot::telemetry::{init_logging, Role};

/// mimalloc instead of glibc's malloc: memory freed after a burst of connections (the generation
/// cache dropping a view, a closed stream's buffers) goes back to the OS instead of staying in
/// per-thread arenas (measured: 1.17 GB kept idle after 200 distinct views with glibc).
/// Counted, for `meshpilot_heap_allocated_bytes`.
#[global_allocator]
static GLOBAL: Counting<mimalloc::MiMalloc> = Counting(mimalloc::MiMalloc);

/// meshpilot: an Istio-compatible, horizontally scalable xDS control plane.
#[derive(Parser)]
#[command(name = "meshpilot", version)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run ingest and an xDS frontend in one process, from a directory of Istio YAML and/or Kubernetes.
    Standalone(StandaloneArgs),
    /// Run an ingest node: watch the config, build snapshots, and serve them to frontends while leader.
    Ingest(IngestArgs),
    /// Run an xDS frontend that follows the leader's snapshots and serves proxies.
    Frontend(FrontendArgs),
    /// Validate Istio YAML/JSON files; exit code 1 if any document is invalid.
    Validate {
        /// File or directory to validate.
        #[arg(short = 'f', long = "filename")]
        path: PathBuf,
    },
    /// Drive N simulated sidecars over ADS (one thread), measure convergence and phases, report.
    Load(LoadArgs),
    /// Serve a capture of `meshpilot load --capture` verbatim over ADS (the physical limit).
    Replay(ReplayArgs),
    /// Show each proxy's CDS/LDS/EDS/RDS sync state (SYNCED, NOT SENT, STALE, NACK), frontend and version.
    ProxyStatus(ProxyStatusArgs),
    /// Show the config meshpilot generated for a proxy, as istioctl's tables or Envoy's JSON/YAML.
    ProxyConfig(ProxyConfigArgs),
    /// Compare the config of snapshots a node holds.
    #[command(subcommand)]
    Config(ConfigCommand),
    /// Print the version.
    Version,
}

/// The admin URL operator commands ask by default (a local standalone meshpilot).
const DEFAULT_ADMIN_URL: &str = "http://127.0.0.1:15014";

#[derive(Parser)]
struct ProxyStatusArgs {
    /// Only this proxy: node id or pod.namespace.
    proxy: Option<String>,
    /// Admin URL of any meshpilot node (a frontend or ingest node covers every frontend through membership).
    #[arg(long, default_value = DEFAULT_ADMIN_URL)]
    admin_url: String,
}

#[derive(Subcommand)]
enum ConfigCommand {
    /// What changed between two snapshots: a proxy's generated config resource by resource, or the Istio objects.
    Diff(ConfigDiffArgs),
}

#[derive(Parser)]
struct ConfigDiffArgs {
    /// The older snapshot version (TERM.SEQ); default: the one before --to.
    #[arg(long)]
    from: Option<String>,
    /// The newer snapshot version; default: the newest the node holds.
    #[arg(long)]
    to: Option<String>,
    /// A proxy (node id or pod.namespace): its generated config; without it, the Istio objects.
    #[arg(long)]
    proxy: Option<String>,
    /// Admin URL of the node holding the snapshots (and the proxy's stream).
    #[arg(long, default_value = DEFAULT_ADMIN_URL)]
    admin_url: String,
}

#[derive(Parser)]
struct ProxyConfigArgs {
    /// What to show.
    #[arg(value_enum)]
    kind: meshpilot::ctl::proxy_config::ConfigKind,
    /// The proxy: node id or pod.namespace.
    proxy: String,
    /// Admin URL of any meshpilot node.
    #[arg(long, default_value = DEFAULT_ADMIN_URL)]
    admin_url: String,
    /// Output format.
    #[arg(short = 'o', long, value_enum, default_value = "short")]
    output: meshpilot::ctl::proxy_config::Output,
    /// Only clusters (and endpoints) of services whose host contains this.
    #[arg(long)]
    fqdn: Option<String>,
    /// Only this port (cluster service port, listener port, endpoint port).
    #[arg(long)]
    port: Option<u32>,
    /// Only clusters of this subset.
    #[arg(long)]
    subset: Option<String>,
    /// Only clusters of this direction (inbound or outbound).
    #[arg(long)]
    direction: Option<String>,
}

#[derive(Parser)]
struct LoadArgs {
    /// ADS URL of the xDS server (meshpilot, istiod, the replay server, a load balancer).
    #[arg(long)]
    xds_url: String,
    /// Number of simulated proxies.
    #[arg(long)]
    proxies: usize,
    /// Number of workloads: proxy i is pod wl-{i%W}-{i} of workload wl-{i%W}.
    #[arg(long)]
    workloads: usize,
    /// Namespaces (comma separated): workload w lives in namespaces[w % len].
    #[arg(long, value_delimiter = ',', required = true)]
    namespaces: Vec<String>,
    /// ADS flavour.
    #[arg(long, value_enum)]
    mode: meshpilot::sim::capture::Mode,
    /// Phases file (JSON): changes made after the initial convergence, each measured.
    #[arg(long)]
    phases: Option<PathBuf>,
    /// Quiet time (no response on any stream) that ends a phase.
    #[arg(long, default_value = "2s", value_parser = parse_duration)]
    settle: Duration,
    /// Longest wait for the initial convergence and for each phase.
    #[arg(long, default_value = "300s", value_parser = parse_duration)]
    timeout: Duration,
    /// New streams per second (0: all at once).
    #[arg(long, default_value_t = 0.0)]
    connect_rate: f64,
    /// Write the JSON report here.
    #[arg(long)]
    json: Option<PathBuf>,
    /// Capture the responses of the first proxy of each workload into this directory.
    #[arg(long)]
    capture: Option<PathBuf>,
}

#[derive(Parser)]
struct ReplayArgs {
    /// Capture directory written by `meshpilot load --capture`.
    #[arg(long)]
    capture: PathBuf,
    /// ADS (gRPC) listen address.
    #[arg(long, default_value = "127.0.0.1:15010")]
    xds_addr: SocketAddr,
    /// Admin HTTP listen address (`GET /ready`, `POST /phase/<name>`).
    #[arg(long, default_value = "127.0.0.1:15014")]
    admin_addr: SocketAddr,
}

#[derive(Parser)]
struct StandaloneArgs {
    /// Where the config comes from.
    #[command(flatten)]
    sources: SourceArgs,
    /// ADS (gRPC) listen address.
    #[arg(long, default_value = "127.0.0.1:15010")]
    xds_addr: SocketAddr,
    /// Admin HTTP listen address.
    #[arg(long, default_value = "127.0.0.1:15014")]
    admin_addr: SocketAddr,
    /// Quiet period before a push (Istio's PILOT_DEBOUNCE_AFTER).
    #[arg(long, default_value = "100ms", value_parser = parse_duration)]
    debounce_after: Duration,
    /// Longest debounce delay (Istio's PILOT_DEBOUNCE_MAX).
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    debounce_max: Duration,
    /// Push a change that follows a quiet period of --debounce-after at once; bursts are still
    /// debounced (`=false`: Istio's trailing edge only).
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    debounce_leading_edge: bool,
    /// What the xDS server admits at once.
    #[command(flatten)]
    admission: AdmissionArgs,
    /// The CA and the secure xDS port.
    #[command(flatten)]
    security: SecurityArgs,
    /// Istio's validating webhook.
    #[command(flatten)]
    webhook: WebhookArgs,
}

/// Istio's validating admission webhook (istiod's 15017, `/validate`).
#[derive(clap::Args)]
struct WebhookArgs {
    /// HTTPS listen address of the validating webhook (deploy/ uses 0.0.0.0:15017, as istiod);
    /// without it the webhook is off.
    #[arg(long)]
    webhook_addr: Option<SocketAddr>,
    /// The Service the API server calls the webhook through: its certificate is for
    /// <service>.<namespace>.svc[.cluster.local].
    #[arg(long, default_value = meshpilot::webhook::DEFAULT_SERVICE)]
    webhook_service: String,
    /// Extra DNS names or IP addresses of the webhook's certificate (comma separated).
    #[arg(long, value_delimiter = ',')]
    webhook_tls_san: Vec<String>,
    /// The ValidatingWebhookConfiguration whose webhooks' caBundle is kept at the CA's root
    /// (with Kubernetes; by the ingest leader).
    #[arg(long, default_value = meshpilot::webhook::DEFAULT_CONFIG_NAME)]
    webhook_config_name: String,
}

impl WebhookArgs {
    fn settings(&self) -> Option<meshpilot::webhook::WebhookSettings> {
        self.webhook_addr.map(|addr| meshpilot::webhook::WebhookSettings {
            addr,
            service: self.webhook_service.clone(),
            extra_sans: self.webhook_tls_san.clone(),
            config_name: self.webhook_config_name.clone(),
        })
    }
}

/// The CA and the secure xDS port (istiod's 15012: TLS, authenticated ADS and the CA service).
#[derive(clap::Args)]
struct SecurityArgs {
    /// Secure xDS listen address: TLS with a certificate from meshpilot's CA, ADS for
    /// authenticated proxies (client certificate or service-account token) and Istio's CA service.
    #[arg(long, default_value = "127.0.0.1:15012")]
    secure_xds_addr: SocketAddr,
    /// Serve no secure port (and run no CA).
    #[arg(long)]
    no_secure_xds: bool,
    /// Serve no plaintext xDS port (`--xds-addr`): proxies must use the secure port.
    #[arg(long)]
    no_plaintext_xds: bool,
    /// Extra DNS names or IP addresses of the secure port's certificate (comma separated), beside
    /// istiod.<namespace>.svc[.cluster.local]: the address proxies dial.
    #[arg(long, value_delimiter = ',')]
    xds_tls_san: Vec<String>,
    /// Lifetime of workload certificates when the request names none.
    #[arg(long, default_value = "24h", value_parser = parse_duration)]
    workload_cert_ttl: Duration,
    /// Longest workload certificate lifetime issued; longer requests are capped to it.
    #[arg(long, default_value = "2160h", value_parser = parse_duration)]
    max_workload_cert_ttl: Duration,
    /// Istio's plug-in CA directory (ca-cert.pem, ca-key.pem, cert-chain.pem, root-cert.pem):
    /// when it holds a CA, meshpilot signs with it (an intermediate of your root).
    #[arg(long, default_value = meshpilot::app::security::DEFAULT_PLUGIN_DIR)]
    cacerts_dir: PathBuf,
    /// Where the self-signed root is kept without Kubernetes (with Kubernetes: the Secret
    /// istio-ca-secret in --namespace).
    #[arg(long, default_value = meshpilot::app::security::DEFAULT_ROOT_DIR)]
    ca_dir: PathBuf,
}

impl SecurityArgs {
    fn settings(&self, namespace: &str) -> meshpilot::app::security::SecuritySettings {
        meshpilot::app::security::SecuritySettings {
            secure_xds_addr: (!self.no_secure_xds).then_some(self.secure_xds_addr),
            extra_sans: self.xds_tls_san.clone(),
            ca: meshpilot::security::ca::CaSettings {
                workload_ttl: self.workload_cert_ttl,
                max_workload_ttl: self.max_workload_cert_ttl,
            },
            plugin_dir: self.cacerts_dir.clone(),
            root_dir: self.ca_dir.clone(),
            namespace: namespace.to_string(),
            create_root: true,
            ..Default::default()
        }
    }

    /// Refuses a process serving xDS on no port at all.
    fn check(&self) -> anyhow::Result<()> {
        if self.no_secure_xds && self.no_plaintext_xds {
            anyhow::bail!("--no-secure-xds and --no-plaintext-xds together leave no xDS port");
        }
        Ok(())
    }
}

/// The snapshot stream between the ingest leader and frontends: mutual TLS from the CA unless
/// turned off explicitly.
#[derive(clap::Args)]
struct SnapshotStreamArgs {
    /// Serve (ingest) or follow (frontend) snapshots in plaintext, unauthenticated: anyone who
    /// reaches the snapshot port reads every key, and frontends follow whatever address etcd
    /// names. Default: mutual TLS from the CA, which both roles must share.
    #[arg(long)]
    insecure_snapshot_stream: bool,
    /// Accepted for compatibility and ignored: mutual TLS is the default.
    #[arg(long, hide = true, conflicts_with = "insecure_snapshot_stream")]
    snapshot_mtls: bool,
}

impl SnapshotStreamArgs {
    /// Whether the stream is plaintext (`--snapshot-mtls`, the old opt-in, asks for the default).
    fn insecure(&self) -> bool {
        self.insecure_snapshot_stream && !self.snapshot_mtls
    }
}

/// What an xDS server admits at once (Istio's PILOT_MAX_REQUESTS_PER_SECOND, PILOT_PUSH_THROTTLE
/// and keepaliveMaxServerConnectionAge).
#[derive(clap::Args)]
struct AdmissionArgs {
    /// New xDS streams admitted per second, and at once in a burst; more wait their turn.
    #[arg(long, default_value_t = meshpilot::xds::DEFAULT_NEW_STREAMS_PER_SECOND)]
    max_new_streams_per_second: f64,
    /// Pushes of a new snapshot running at once.
    #[arg(long, default_value_t = meshpilot::xds::DEFAULT_PUSH_CONCURRENCY)]
    push_concurrency: usize,
    /// A stream ends after this long (plus up to 10% jitter) and the proxy reconnects, so
    /// proxies spread over frontends added since; `0s`: never.
    #[arg(long, default_value = "30m", value_parser = parse_duration)]
    max_stream_age: Duration,
    /// Bytes the generated Envoy config may take, cached or held by connected proxies; past
    /// them, a proxy whose configuration no connected proxy shares is refused (RESOURCE_EXHAUSTED)
    /// and retries, here or through another frontend.
    #[arg(long, default_value_t = meshpilot::xds::DEFAULT_BUDGET_BYTES)]
    max_config_memory_bytes: usize,
}

impl AdmissionArgs {
    fn settings(&self) -> meshpilot::xds::AdmissionSettings {
        meshpilot::xds::AdmissionSettings {
            new_streams_per_second: self.max_new_streams_per_second,
            push_concurrency: self.push_concurrency,
            max_stream_age: (!self.max_stream_age.is_zero()).then_some(self.max_stream_age),
            config_memory_bytes: self.max_config_memory_bytes,
        }
    }
}

/// The config sources of a building role: a directory, Kubernetes, or both.
#[derive(clap::Args)]
#[command(group(clap::ArgGroup::new("config").required(true).multiple(true).args(["config_dir", "kubernetes", "kubeconfig"])))]
struct SourceArgs {
    /// Directory of Istio config (YAML or JSON, watched).
    #[arg(long)]
    config_dir: Option<PathBuf>,
    /// MeshConfig file (watched); default: the `istio` ConfigMap with Kubernetes, else the defaults.
    #[arg(long)]
    mesh_config: Option<PathBuf>,
    /// Watch the Kubernetes cluster found as kubectl finds it: in-cluster service account, then
    /// KUBECONFIG, then ~/.kube/config.
    #[arg(long, conflicts_with = "kubeconfig")]
    kubernetes: bool,
    /// Watch the Kubernetes cluster of this kubeconfig file (its current context).
    #[arg(long)]
    kubeconfig: Option<PathBuf>,
    /// meshpilot's namespace, whose `istio` ConfigMap holds the mesh config.
    #[arg(long, env = "POD_NAMESPACE", default_value = "istio-system")]
    namespace: String,
    /// DNS suffix of Kubernetes services: NAME.NAMESPACE.svc.DOMAIN.
    #[arg(long, default_value = meshpilot::source::DEFAULT_DOMAIN)]
    domain: String,
}

impl SourceArgs {
    fn settings(self) -> SourceSettings {
        let cluster = match (self.kubeconfig, self.kubernetes) {
            (Some(file), _) => Some(ClusterChoice::Kubeconfig(file)),
            (None, true) => Some(ClusterChoice::Infer),
            (None, false) => None,
        };
        SourceSettings {
            config_dir: self.config_dir,
            mesh_config: self.mesh_config,
            kubernetes: cluster.map(|cluster| KubeSettings { cluster, namespace: self.namespace }),
            domain: self.domain,
        }
    }
}

/// TLS towards etcd (https:// endpoints), as etcdctl's --cacert, --cert and --key.
#[derive(clap::Args)]
struct EtcdTlsArgs {
    /// CA bundle (PEM) etcd's serving certificate must chain to.
    #[arg(long)]
    etcd_cacert: Option<PathBuf>,
    /// Client certificate (PEM) for etcd's --client-cert-auth (with --etcd-key).
    #[arg(long, requires = "etcd_key")]
    etcd_cert: Option<PathBuf>,
    /// Client key (PEM) of --etcd-cert.
    #[arg(long, requires = "etcd_cert")]
    etcd_key: Option<PathBuf>,
    /// Accept etcd without TLS (http:// endpoints) or without a client certificate: whoever can
    /// write etcd then chooses the leader frontends follow. Logs a warning at start.
    #[arg(long)]
    insecure_etcd: bool,
}

impl EtcdTlsArgs {
    fn settings(&self) -> meshpilot::cluster::etcd::EtcdTls {
        meshpilot::cluster::etcd::EtcdTls {
            ca: self.etcd_cacert.clone(),
            cert: self.etcd_cert.clone(),
            key: self.etcd_key.clone(),
            insecure: self.insecure_etcd,
        }
    }
}

#[derive(Parser)]
struct IngestArgs {
    /// etcd endpoints (comma separated URLs).
    #[arg(long, value_delimiter = ',', required = true)]
    etcd_endpoints: Vec<String>,
    /// TLS towards etcd.
    #[command(flatten)]
    etcd_tls: EtcdTlsArgs,
    /// Where the config comes from.
    #[command(flatten)]
    sources: SourceArgs,
    /// Snapshot server listen address.
    #[arg(long, default_value = "127.0.0.1:15020")]
    snapshot_addr: SocketAddr,
    /// Snapshot address frontends dial (default: the listen address).
    #[arg(long)]
    advertise_addr: Option<String>,
    /// Admin HTTP listen address.
    #[arg(long, default_value = "127.0.0.1:15014")]
    admin_addr: SocketAddr,
    /// Node id (default: ingest-<pid>).
    #[arg(long)]
    id: Option<String>,
    /// Leader lease TTL in seconds.
    #[arg(long, default_value_t = 5)]
    lease_ttl: u64,
    /// Istio's plug-in CA directory: with Kubernetes, the leader publishes its root-cert.pem (else
    /// the istio-ca-secret's root, created if missing) in every namespace's istio-ca-root-cert.
    #[arg(long, default_value = meshpilot::app::security::DEFAULT_PLUGIN_DIR)]
    cacerts_dir: PathBuf,
    /// Where the self-signed root is kept without Kubernetes (the snapshot stream's CA; frontends
    /// without Kubernetes read it from the same directory or --cacerts-dir).
    #[arg(long, default_value = meshpilot::app::security::DEFAULT_ROOT_DIR)]
    ca_dir: PathBuf,
    /// Mutual TLS (the default) or plaintext of the snapshot stream.
    #[command(flatten)]
    snapshot_stream: SnapshotStreamArgs,
    /// Service accounts (of --namespace, in the mesh's trust domain) whose certificates from the
    /// CA may subscribe to snapshots (comma separated).
    #[arg(long, value_delimiter = ',', default_value = "meshpilot-frontend,meshpilot-ingest")]
    snapshot_peer_service_accounts: Vec<String>,
    /// Snapshot subscriptions served at once; more are refused with RESOURCE_EXHAUSTED.
    #[arg(long, default_value_t = meshpilot::replication::ServerSettings::default().max_subscribers)]
    snapshot_max_subscribers: usize,
    /// Quiet period before a push.
    #[arg(long, default_value = "100ms", value_parser = parse_duration)]
    debounce_after: Duration,
    /// Longest debounce delay.
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    debounce_max: Duration,
    /// Push a change that follows a quiet period of --debounce-after at once (`=false`: trailing edge only).
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    debounce_leading_edge: bool,
    /// Istio's validating webhook (every node serves it; the leader keeps its caBundle).
    #[command(flatten)]
    webhook: WebhookArgs,
}

#[derive(Parser)]
struct FrontendArgs {
    /// etcd endpoints (comma separated URLs).
    #[arg(long, value_delimiter = ',', required = true)]
    etcd_endpoints: Vec<String>,
    /// TLS towards etcd.
    #[command(flatten)]
    etcd_tls: EtcdTlsArgs,
    /// ADS (gRPC) listen address.
    #[arg(long, default_value = "127.0.0.1:15010")]
    xds_addr: SocketAddr,
    /// xDS address registered for this frontend (default: the listen address).
    #[arg(long)]
    advertise_addr: Option<String>,
    /// Admin HTTP listen address.
    #[arg(long, default_value = "127.0.0.1:15014")]
    admin_addr: SocketAddr,
    /// Member id, unique among frontends (default: frontend-<pid>).
    #[arg(long)]
    id: Option<String>,
    /// How proxies are keyed for the consistent hash.
    #[arg(long, value_enum, default_value = "namespace-service-account")]
    proxy_key: ProxyKeyArg,
    /// Membership lease TTL in seconds.
    #[arg(long, default_value_t = 5)]
    lease_ttl: u64,
    /// What the xDS server admits at once.
    #[command(flatten)]
    admission: AdmissionArgs,
    /// The CA and the secure xDS port.
    #[command(flatten)]
    security: SecurityArgs,
    /// Mutual TLS (the default) or plaintext of the snapshot stream.
    #[command(flatten)]
    snapshot_stream: SnapshotStreamArgs,
    /// Kubernetes API server (its kubeconfig) the secure port reviews service-account tokens
    /// with and reads the CA's istio-ca-secret from; without it only client certificates
    /// authenticate.
    #[arg(long)]
    kubeconfig: Option<PathBuf>,
    /// As --kubeconfig, found as kubectl finds it (in-cluster service account first).
    #[arg(long, conflicts_with = "kubeconfig")]
    kubernetes: bool,
    /// meshpilot's namespace (istiod's service names, the istio-ca-secret).
    #[arg(long, env = "POD_NAMESPACE", default_value = "istio-system")]
    namespace: String,
}

#[derive(Clone, Copy, clap::ValueEnum)]
enum ProxyKeyArg {
    /// namespace/serviceAccount (namespace/app without one).
    NamespaceServiceAccount,
    /// The full node id.
    NodeId,
}

fn parse_duration(text: &str) -> Result<Duration, String> {
    meshpilot::config::api::Duration::parse(text).map(|d| d.as_std())
}

fn main() -> ExitCode {
    meshpilot::allocator::purge_freed_pages_at_once();
    meshpilot::allocator::no_transparent_huge_pages();
    // One TLS provider for every rustls user (the CA's ports, kube, etcd): ring, never aws-lc.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let cli = Cli::parse();
    // The serving commands set up telemetry themselves, once they know their id.
    let serving = matches!(cli.command, Command::Standalone(_) | Command::Ingest(_) | Command::Frontend(_));
    let _telemetry = (!serving).then(|| init_logging(Role::Tool, "meshpilot", &Registry::new()));
    match cli.command {
        Command::Version => {
            println!("meshpilot {}", env!("CARGO_PKG_VERSION"));
            ExitCode::SUCCESS
        }
        Command::Validate { path } => validate(&path),
        Command::Load(args) => match load(args) {
            Ok(true) => ExitCode::SUCCESS,
            Ok(false) => ExitCode::FAILURE,
            Err(e) => {
                eprintln!("meshpilot load: {e:#}");
                ExitCode::from(2)
            }
        },
        Command::Replay(args) => exit(run_replay(args)),
        Command::ProxyStatus(args) => exit(proxy_status(args)),
        Command::ProxyConfig(args) => exit(proxy_config(args)),
        Command::Config(ConfigCommand::Diff(args)) => exit(config_diff(args)),
        Command::Standalone(args) => exit(run_standalone(args)),
        Command::Ingest(args) => exit(run_ingest(args)),
        Command::Frontend(args) => exit(run_frontend(args)),
    }
}

fn exit(result: anyhow::Result<()>) -> ExitCode {
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("meshpilot: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn default_id(role: &str) -> String {
    format!("{role}-{}", std::process::id())
}

/// Logging, telemetry and the process's metrics registry for a serving role.
fn serving_process(role: Role, id: &str) -> (Process, meshpilot::telemetry::Telemetry) {
    let registry = Registry::new();
    let telemetry = init_logging(role, id, &registry);
    (Process::new(registry, role.as_str(), id), telemetry)
}

fn run_ingest(args: IngestArgs) -> anyhow::Result<()> {
    args.etcd_tls.settings().check_authenticated(&args.etcd_endpoints)?;
    let namespace = args.sources.namespace.clone();
    let id = args.id.unwrap_or_else(|| default_id("ingest"));
    let (process, _telemetry) = serving_process(Role::Ingest, &id);
    let settings = app::ingest::IngestNodeSettings {
        etcd_endpoints: args.etcd_endpoints,
        etcd_tls: args.etcd_tls.settings(),
        sources: args.sources.settings(),
        snapshot_addr: args.snapshot_addr,
        advertise_addr: args.advertise_addr.unwrap_or_else(|| args.snapshot_addr.to_string()),
        admin_addr: args.admin_addr,
        id,
        lease_ttl: Duration::from_secs(args.lease_ttl.max(2)),
        debounce: DebounceSettings {
            after: args.debounce_after,
            max: args.debounce_max,
            leading_edge: args.debounce_leading_edge,
        },
        security: meshpilot::app::security::SecuritySettings {
            plugin_dir: args.cacerts_dir,
            root_dir: args.ca_dir,
            insecure_snapshot_stream: args.snapshot_stream.insecure(),
            snapshot_peers: args.snapshot_peer_service_accounts,
            namespace,
            ..Default::default()
        },
        webhook: args.webhook.settings(),
        snapshot_server: meshpilot::replication::ServerSettings {
            max_subscribers: args.snapshot_max_subscribers,
            ..Default::default()
        },
    };
    app::run(|drain| app::ingest::run(settings, process, drain)).context("ingest node")
}

fn run_frontend(args: FrontendArgs) -> anyhow::Result<()> {
    args.etcd_tls.settings().check_authenticated(&args.etcd_endpoints)?;
    args.security.check()?;
    let id = args.id.unwrap_or_else(|| default_id("frontend"));
    let (process, _telemetry) = serving_process(Role::Frontend, &id);
    let settings = app::frontend::FrontendNodeSettings {
        etcd_endpoints: args.etcd_endpoints,
        etcd_tls: args.etcd_tls.settings(),
        xds_addr: args.xds_addr,
        admin_addr: args.admin_addr,
        advertise_addr: args.advertise_addr.unwrap_or_else(|| args.xds_addr.to_string()),
        id,
        proxy_key: match args.proxy_key {
            ProxyKeyArg::NamespaceServiceAccount => meshpilot::cluster::ownership::ProxyKey::ServiceAccount,
            ProxyKeyArg::NodeId => meshpilot::cluster::ownership::ProxyKey::NodeId,
        },
        lease_ttl: Duration::from_secs(args.lease_ttl.max(2)),
        admission: args.admission.settings(),
        plaintext_xds: !args.security.no_plaintext_xds,
        // The ingest leader creates the istio-ca-secret; frontends wait for it.
        security: meshpilot::app::security::SecuritySettings {
            create_root: false,
            insecure_snapshot_stream: args.snapshot_stream.insecure(),
            ..args.security.settings(&args.namespace)
        },
        kubernetes: match (args.kubeconfig, args.kubernetes) {
            (Some(file), _) => Some(ClusterChoice::Kubeconfig(file)),
            (None, true) => Some(ClusterChoice::Infer),
            (None, false) => None,
        },
    };
    app::run(|drain| app::frontend::run(settings, process, drain)).context("frontend")
}

fn run_standalone(args: StandaloneArgs) -> anyhow::Result<()> {
    args.security.check()?;
    let (process, _telemetry) = serving_process(Role::Standalone, &default_id("standalone"));
    let security = args.security.settings(&args.sources.namespace);
    let settings = app::standalone::StandaloneSettings {
        plaintext_xds: !args.security.no_plaintext_xds,
        security,
        sources: args.sources.settings(),
        debounce: DebounceSettings {
            after: args.debounce_after,
            max: args.debounce_max,
            leading_edge: args.debounce_leading_edge,
        },
        xds_addr: args.xds_addr,
        admin_addr: args.admin_addr,
        admission: args.admission.settings(),
        webhook: args.webhook.settings(),
    };
    app::run(|drain| app::standalone::run(settings, process, drain)).context("standalone meshpilot")
}

/// Runs a load test on one thread; `Ok(false)` when a proxy did not connect or converge or a
/// phase did not finish.
fn load(args: LoadArgs) -> anyhow::Result<bool> {
    let settings = meshpilot::sim::load::LoadSettings {
        xds_url: args.xds_url,
        proxies: args.proxies,
        workloads: args.workloads,
        namespaces: args.namespaces,
        mode: args.mode,
        phases: args.phases,
        settle: args.settle,
        timeout: args.timeout,
        connect_rate: args.connect_rate,
        capture: args.capture,
    };
    // One thread: the client's own cost stays bounded and comparable between runs.
    let runtime =
        tokio::runtime::Builder::new_current_thread().enable_all().build().context("starting the async runtime")?;
    let report = runtime.block_on(meshpilot::sim::load::run(&settings))?;
    print!("{}", report.summary());
    if let Some(path) = &args.json {
        let text = serde_json::to_vec_pretty(&report).context("encoding the report")?;
        std::fs::write(path, text).with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(report.success())
}

fn tool_runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_current_thread().enable_all().build().context("starting the async runtime")
}

fn proxy_status(args: ProxyStatusArgs) -> anyhow::Result<()> {
    use meshpilot::ctl::proxy_status::{collect, names_proxy, render};
    let mut collected = tool_runtime()?.block_on(collect(&args.admin_url))?;
    if let Some(wanted) = &args.proxy {
        collected.proxies.retain(|p| names_proxy(wanted, &p.proxy));
        if collected.proxies.is_empty() {
            anyhow::bail!(meshpilot::ctl::CtlError::UnknownProxy(wanted.clone()));
        }
    }
    print!("{}", render(&collected.proxies));
    for why in &collected.unreachable {
        eprintln!("warning: not listed: {why}");
    }
    Ok(())
}

fn proxy_config(args: ProxyConfigArgs) -> anyhow::Result<()> {
    use meshpilot::ctl::proxy_config::{fetch, render};
    let dump = tool_runtime()?.block_on(fetch(&args.admin_url, &args.proxy))?;
    let filters = meshpilot::ctl::config_tables::Filters {
        fqdn: args.fqdn,
        port: args.port,
        subset: args.subset,
        direction: args.direction,
    };
    print!("{}", render(&dump, args.kind, &filters, args.output)?);
    Ok(())
}

fn config_diff(args: ConfigDiffArgs) -> anyhow::Result<()> {
    use meshpilot::ctl::config_diff::{fetch, render};
    let diff = tool_runtime()?.block_on(fetch(
        &args.admin_url,
        args.from.as_deref(),
        args.to.as_deref(),
        args.proxy.as_deref(),
    ))?;
    print!("{}", render(&diff));
    Ok(())
}

fn run_replay(args: ReplayArgs) -> anyhow::Result<()> {
    let settings = meshpilot::sim::replay::ReplaySettings {
        capture: args.capture,
        xds_addr: args.xds_addr,
        admin_addr: args.admin_addr,
    };
    app::run(|drain| meshpilot::sim::replay::run(settings, drain)).context("replay server")
}

fn validate(path: &std::path::Path) -> ExitCode {
    let files = match parse_tree(path) {
        Ok(f) => f,
        Err(e) => {
            eprintln!("meshpilot validate: {}: {e}", path.display());
            return ExitCode::from(2);
        }
    };
    let (mut valid, mut invalid, mut ignored, mut warned) = (0, 0, 0, 0);
    for (_, docs) in &files {
        for checked in docs {
            for warning in &checked.warnings {
                warned += 1;
                eprintln!("warning: {warning}");
            }
            match &checked.document {
                Document::Valid(obj) => {
                    valid += 1;
                    println!("ok: {}", obj.key);
                }
                Document::Ignored { document, kind, name, .. } => {
                    ignored += 1;
                    println!("ignored: document {document}: {kind} {name} (not a kind meshpilot serves)");
                }
                Document::Invalid(err) => {
                    invalid += 1;
                    eprintln!("error: {err}");
                }
            }
        }
    }
    println!("{valid} valid, {invalid} invalid, {ignored} ignored, {warned} warning(s) in {} file(s)", files.len());
    if invalid > 0 {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}
