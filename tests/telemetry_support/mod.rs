//! Shared by the telemetry tests (`otlp`, `metrics`, `dashboards`): meshpilot processes (standalone,
//! ingest, frontend) on 127.0.0.1 ports chosen at run time, a Prometheus text parser, an in-test
//! OTLP/gRPC receiver and a real Prometheus server. Everything started is stopped on drop; the tail
//! of each log is printed when the test is failing.
#![allow(dead_code)]

pub use crate::common::ports::free_addr;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use opentelemetry_proto::tonic::collector::metrics::v1::metrics_service_server::{
    MetricsService, MetricsServiceServer,
};
use opentelemetry_proto::tonic::collector::metrics::v1::{ExportMetricsServiceRequest, ExportMetricsServiceResponse};
use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{TraceService, TraceServiceServer};
use opentelemetry_proto::tonic::collector::trace::v1::{ExportTraceServiceRequest, ExportTraceServiceResponse};
use opentelemetry_proto::tonic::common::v1::{any_value, KeyValue};
use opentelemetry_proto::tonic::metrics::v1::ResourceMetrics;
use opentelemetry_proto::tonic::trace::v1::Span;

/// Start-up and convergence timeout.
pub const TIMEOUT: Duration = Duration::from_secs(60);

/// Polls `f` every 100 ms until it returns `Some` (→ it) or `timeout` passes (→ `None`).
pub async fn poll<T>(timeout: Duration, mut f: impl AsyncFnMut() -> Option<T>) -> Option<T> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = f().await {
            return Some(v);
        }
        if Instant::now() >= deadline {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The tail of a text.
pub fn tail(text: &str, lines: usize) -> String {
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

// ---------------------------------------------------------------------------------------------
// meshpilot processes
// ---------------------------------------------------------------------------------------------

/// A running `meshpilot` process; stopped with SIGTERM (so it flushes its exporters), then killed.
pub struct Meshpilot {
    name: String,
    child: Option<Child>,
    dir: tempfile::TempDir,
    /// Admin address.
    pub admin: SocketAddr,
    /// xDS address (standalone and frontend).
    pub xds: Option<SocketAddr>,
    http: reqwest::Client,
}

impl Meshpilot {
    /// `meshpilot standalone` on `config_dir` with extra environment.
    pub fn standalone(config_dir: &Path, env: &[(&str, String)]) -> Meshpilot {
        let (xds, admin) = (free_addr(), free_addr());
        let args = vec![
            "standalone".into(),
            "--config-dir".into(),
            config_dir.display().to_string(),
            "--xds-addr".into(),
            xds.to_string(),
            "--admin-addr".into(),
            admin.to_string(),
        ];
        Meshpilot::spawn("standalone", args, env, admin, Some(xds))
    }

    /// `meshpilot ingest` named `id` on `config_dir`, electing through `etcd`.
    pub fn ingest(etcd: &str, config_dir: &Path, id: &str, env: &[(&str, String)]) -> Meshpilot {
        let (snapshot, admin) = (free_addr(), free_addr());
        let args = vec![
            "ingest".into(),
            "--etcd-endpoints".into(),
            etcd.into(),
            "--config-dir".into(),
            config_dir.display().to_string(),
            "--snapshot-addr".into(),
            snapshot.to_string(),
            "--admin-addr".into(),
            admin.to_string(),
            "--id".into(),
            id.into(),
            "--lease-ttl".into(),
            "2".into(),
        ];
        Meshpilot::spawn(id, args, env, admin, None)
    }

    /// `meshpilot frontend` named `id`, following the leader found through `etcd`.
    pub fn frontend(etcd: &str, id: &str, env: &[(&str, String)]) -> Meshpilot {
        let (xds, admin) = (free_addr(), free_addr());
        let args = vec![
            "frontend".into(),
            "--etcd-endpoints".into(),
            etcd.into(),
            "--xds-addr".into(),
            xds.to_string(),
            "--admin-addr".into(),
            admin.to_string(),
            "--id".into(),
            id.into(),
            "--lease-ttl".into(),
            "2".into(),
        ];
        Meshpilot::spawn(id, args, env, admin, Some(xds))
    }

    fn spawn(
        name: &str,
        args: Vec<String>,
        env: &[(&str, String)],
        admin: SocketAddr,
        xds: Option<SocketAddr>,
    ) -> Meshpilot {
        let dir = tempfile::Builder::new().prefix("meshpilot-telemetry-").tempdir().expect("temp dir");
        let log = std::fs::File::create(dir.path().join("log")).expect("log file");
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_meshpilot"));
        cmd.args(&args).env("RUST_LOG", "info").env("NO_COLOR", "1");
        for key in
            ["OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_SERVICE_NAME", "OTEL_RESOURCE_ATTRIBUTES", "OTEL_TRACES_SAMPLER"]
        {
            cmd.env_remove(key);
        }
        for (k, v) in env {
            cmd.env(k, v);
        }
        let child = cmd
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log file"))
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("spawn meshpilot {args:?}: {e}"));
        let http = reqwest::Client::builder().no_proxy().timeout(Duration::from_secs(10)).build().expect("client");
        Meshpilot { name: name.to_string(), child: Some(child), dir, admin, xds, http }
    }

    /// `http://` + the xDS address.
    pub fn xds_url(&self) -> String {
        format!("http://{}", self.xds.expect("this process serves no xDS"))
    }

    /// The process id.
    pub fn pid(&self) -> u32 {
        self.child.as_ref().map(Child::id).unwrap_or_default()
    }

    /// Its log so far.
    pub fn logs(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("log")).unwrap_or_default()
    }

    /// GET an admin path: status and body (`None` while unreachable).
    pub async fn try_get(&self, path: &str) -> Option<(u16, String)> {
        let resp = self.http.get(format!("http://{}{path}", self.admin)).send().await.ok()?;
        let status = resp.status().as_u16();
        Some((status, resp.text().await.ok()?))
    }

    /// GET an admin path that must answer 200.
    pub async fn get(&self, path: &str) -> String {
        match self.try_get(path).await {
            Some((200, body)) => body,
            other => panic!("{} GET {path}: {other:?}\n{}", self.name, tail(&self.logs(), 80)),
        }
    }

    /// GET an admin path as JSON.
    pub async fn get_json(&self, path: &str) -> serde_json::Value {
        let body = self.get(path).await;
        serde_json::from_str(&body).unwrap_or_else(|e| panic!("{path}: {e}: {body}"))
    }

    /// Waits until `/ready` answers 200.
    pub async fn wait_ready(&mut self) {
        let ready = poll(TIMEOUT, async || {
            if let Some(status) = self.child.as_mut().and_then(|c| c.try_wait().ok().flatten()) {
                panic!("{} exited with {status}:\n{}", self.name, tail(&self.logs(), 80));
            }
            matches!(self.try_get("/ready").await, Some((200, _))).then_some(())
        })
        .await;
        assert!(ready.is_some(), "{} not ready:\n{}", self.name, tail(&self.logs(), 80));
    }

    /// The parsed `/metrics`.
    pub async fn metrics(&self) -> Samples {
        Samples::parse(&self.get("/metrics").await)
    }

    /// Stops the process: SIGTERM, up to 10 s to exit (flushing telemetry), then SIGKILL.
    pub fn stop(&mut self) {
        let Some(mut child) = self.child.take() else { return };
        let _ = Command::new("kill").args(["-TERM", &child.id().to_string()]).status();
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = child.kill();
        let _ = child.wait();
    }
}

impl Drop for Meshpilot {
    fn drop(&mut self) {
        self.stop();
        if std::thread::panicking() {
            eprintln!("---- {} log ----\n{}\n----", self.name, tail(&self.logs(), 120));
        }
    }
}

/// A temp dir holding `files` (name, contents).
pub fn config_dir(files: &[(&str, &str)]) -> tempfile::TempDir {
    let dir = tempfile::Builder::new().prefix("meshpilot-config-").tempdir().expect("temp dir");
    for (name, text) in files {
        std::fs::write(dir.path().join(name), text).expect("write config");
    }
    dir
}

/// A ServiceEntry `name` in `ns` with static endpoints.
pub fn service_entry(ns: &str, name: &str, endpoints: &[&str]) -> String {
    let eps: Vec<String> = endpoints.iter().map(|a| format!("{{address: {a}}}")).collect();
    format!(
        "apiVersion: networking.istio.io/v1\nkind: ServiceEntry\nmetadata: {{name: {name}, namespace: {ns}}}\nspec:\n  hosts: [{name}.{ns}.svc.cluster.local]\n  location: MESH_INTERNAL\n  resolution: STATIC\n  ports: [{{number: 80, name: http, protocol: HTTP}}]\n  endpoints: [{}]\n",
        eps.join(", ")
    )
}

/// Replaces a file in place atomically (write + rename), as editors do.
pub fn rewrite(path: &Path, text: &str) {
    let tmp = path.with_extension("tmp-write");
    std::fs::write(&tmp, text).expect("write");
    std::fs::rename(&tmp, path).expect("rename");
}

// ---------------------------------------------------------------------------------------------
// Prometheus text
// ---------------------------------------------------------------------------------------------

/// One sample of the Prometheus text format.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    /// Series name (`..._bucket`, `..._sum`, `..._count` for histograms).
    pub name: String,
    /// Labels.
    pub labels: BTreeMap<String, String>,
    /// Value.
    pub value: f64,
}

/// Parsed `/metrics`: samples and `# TYPE` lines.
#[derive(Debug, Clone, Default)]
pub struct Samples {
    /// All samples in order.
    pub samples: Vec<Sample>,
    /// Family name → type (`counter`, `gauge`, `histogram`).
    pub types: BTreeMap<String, String>,
}

impl Samples {
    /// Parses the text exposition format (as the `prometheus` crate writes it).
    pub fn parse(text: &str) -> Samples {
        let mut out = Samples::default();
        for line in text.lines() {
            if let Some(rest) = line.strip_prefix("# TYPE ") {
                if let Some((name, kind)) = rest.split_once(' ') {
                    out.types.insert(name.to_string(), kind.trim().to_string());
                }
                continue;
            }
            if line.starts_with('#') || line.trim().is_empty() {
                continue;
            }
            let (series, value) = line.rsplit_once(' ').unwrap_or_else(|| panic!("bad sample line {line:?}"));
            let value: f64 = value.parse().unwrap_or_else(|_| panic!("bad value in {line:?}"));
            let (name, labels) = match series.split_once('{') {
                None => (series.to_string(), BTreeMap::new()),
                Some((name, rest)) => (name.to_string(), parse_labels(rest.trim_end_matches('}'))),
            };
            out.samples.push(Sample { name, labels, value });
        }
        out
    }

    /// Samples of series `name` whose labels include `labels`.
    pub fn find(&self, name: &str, labels: &[(&str, &str)]) -> Vec<&Sample> {
        self.samples
            .iter()
            .filter(|s| s.name == name && labels.iter().all(|(k, v)| s.labels.get(*k).map(String::as_str) == Some(*v)))
            .collect()
    }

    /// The value of the one sample of `name` with `labels` (panics if absent).
    pub fn value(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        match self.find(name, labels).as_slice() {
            [one] => one.value,
            other => panic!("expected one sample of {name}{labels:?}, found {other:?}"),
        }
    }

    /// Sum of `name` over all label sets matching `labels`.
    pub fn sum(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        self.find(name, labels).iter().map(|s| s.value).sum()
    }
}

fn parse_labels(text: &str) -> BTreeMap<String, String> {
    let mut labels = BTreeMap::new();
    let mut rest = text;
    while let Some((key, after)) = rest.split_once("=\"") {
        let mut value = String::new();
        let mut chars = after.char_indices();
        let mut end = after.len();
        while let Some((i, c)) = chars.next() {
            match c {
                '\\' => {
                    if let Some((_, n)) = chars.next() {
                        value.push(if n == 'n' { '\n' } else { n });
                    }
                }
                '"' => {
                    end = i + 1;
                    break;
                }
                c => value.push(c),
            }
        }
        labels.insert(key.trim_start_matches(',').trim().to_string(), value);
        rest = &after[end..];
    }
    labels
}

// ---------------------------------------------------------------------------------------------
// OTLP receiver
// ---------------------------------------------------------------------------------------------

/// A received span with its resource attributes.
#[derive(Debug, Clone)]
pub struct ReceivedSpan {
    /// Resource attributes (as strings).
    pub resource: BTreeMap<String, String>,
    /// The span.
    pub span: Span,
}

impl ReceivedSpan {
    /// Hex trace id.
    pub fn trace_id(&self) -> String {
        hex(&self.span.trace_id)
    }

    /// Hex span id.
    pub fn span_id(&self) -> String {
        hex(&self.span.span_id)
    }

    /// Hex parent span id (empty for a root).
    pub fn parent_id(&self) -> String {
        hex(&self.span.parent_span_id)
    }

    /// A span attribute as a string.
    pub fn attr(&self, key: &str) -> Option<String> {
        attributes(&self.span.attributes).remove(key)
    }
}

/// Lowercase hex.
pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Attributes as strings.
pub fn attributes(kvs: &[KeyValue]) -> BTreeMap<String, String> {
    kvs.iter()
        .map(|kv| {
            let value = match kv.value.as_ref().and_then(|v| v.value.as_ref()) {
                Some(any_value::Value::StringValue(s)) => s.clone(),
                Some(any_value::Value::IntValue(i)) => i.to_string(),
                Some(any_value::Value::DoubleValue(d)) => d.to_string(),
                Some(any_value::Value::BoolValue(b)) => b.to_string(),
                other => format!("{other:?}"),
            };
            (kv.key.clone(), value)
        })
        .collect()
}

/// What an [`OtlpReceiver`] got.
#[derive(Debug, Clone, Default)]
pub struct Received {
    spans: Arc<Mutex<Vec<ReceivedSpan>>>,
    metrics: Arc<Mutex<Vec<ResourceMetrics>>>,
}

impl Received {
    /// Every span so far.
    pub fn spans(&self) -> Vec<ReceivedSpan> {
        self.spans.lock().unwrap().clone()
    }

    /// Every metrics export so far.
    pub fn metrics(&self) -> Vec<ResourceMetrics> {
        self.metrics.lock().unwrap().clone()
    }
}

#[tonic::async_trait]
impl TraceService for Received {
    async fn export(
        &self,
        request: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        let mut spans = self.spans.lock().unwrap();
        for rs in request.into_inner().resource_spans {
            let resource = attributes(&rs.resource.map(|r| r.attributes).unwrap_or_default());
            for ss in rs.scope_spans {
                for span in ss.spans {
                    spans.push(ReceivedSpan { resource: resource.clone(), span });
                }
            }
        }
        Ok(tonic::Response::new(ExportTraceServiceResponse::default()))
    }
}

#[tonic::async_trait]
impl MetricsService for Received {
    async fn export(
        &self,
        request: tonic::Request<ExportMetricsServiceRequest>,
    ) -> Result<tonic::Response<ExportMetricsServiceResponse>, tonic::Status> {
        self.metrics.lock().unwrap().extend(request.into_inner().resource_metrics);
        Ok(tonic::Response::new(ExportMetricsServiceResponse::default()))
    }
}

/// An OTLP/gRPC trace and metrics receiver on 127.0.0.1 (stops on drop).
pub struct OtlpReceiver {
    /// `http://127.0.0.1:PORT`, for `OTEL_EXPORTER_OTLP_ENDPOINT`.
    pub endpoint: String,
    /// What arrived.
    pub received: Received,
    task: tokio::task::JoinHandle<()>,
}

impl OtlpReceiver {
    /// Listens on a free port.
    pub async fn start() -> OtlpReceiver {
        let listener = tokio::net::TcpListener::bind(free_addr()).await.expect("bind");
        let addr = listener.local_addr().expect("local addr");
        let received = Received::default();
        let server = tonic::transport::Server::builder()
            .add_service(TraceServiceServer::new(received.clone()))
            .add_service(MetricsServiceServer::new(received.clone()))
            .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener));
        let task = tokio::spawn(async move {
            let _ = server.await;
        });
        OtlpReceiver { endpoint: format!("http://{addr}"), received, task }
    }
}

impl Drop for OtlpReceiver {
    fn drop(&mut self) {
        self.task.abort();
    }
}

// ---------------------------------------------------------------------------------------------
// Prometheus
// ---------------------------------------------------------------------------------------------

/// The Prometheus binary: `$MESHPILOT_PROMETHEUS`, else `/usr/bin/prometheus` (Debian's package,
/// installed by `scripts/setup.sh`), else `prometheus` on the PATH.
pub fn prometheus_path() -> PathBuf {
    if let Some(p) = std::env::var_os("MESHPILOT_PROMETHEUS").filter(|p| !p.is_empty()) {
        return PathBuf::from(p);
    }
    let debian = PathBuf::from("/usr/bin/prometheus");
    if debian.is_file() {
        return debian;
    }
    PathBuf::from("prometheus")
}

/// A real Prometheus scraping the given admin addresses every second (stopped on drop).
pub struct Prometheus {
    child: Option<Child>,
    dir: tempfile::TempDir,
    /// `http://127.0.0.1:PORT`.
    pub url: String,
    http: reqwest::Client,
}

impl Prometheus {
    /// Starts Prometheus with a temp config and storage, scraping `targets` (job `meshpilot`).
    pub async fn start(targets: &[SocketAddr]) -> Prometheus {
        let dir = tempfile::Builder::new().prefix("meshpilot-prometheus-").tempdir().expect("temp dir");
        let list: Vec<String> = targets.iter().map(|t| format!("\"{t}\"")).collect();
        let config = format!(
            "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nscrape_configs:\n  - job_name: meshpilot\n    scrape_interval: 1s\n    static_configs:\n      - targets: [{}]\n",
            list.join(", ")
        );
        let config_path = dir.path().join("prometheus.yml");
        std::fs::write(&config_path, config).expect("write prometheus.yml");
        let addr = free_addr();
        let log = std::fs::File::create(dir.path().join("log")).expect("log");
        let child = Command::new(prometheus_path())
            .arg(format!("--config.file={}", config_path.display()))
            .arg(format!("--storage.tsdb.path={}", dir.path().join("data").display()))
            .arg(format!("--web.listen-address={addr}"))
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log"))
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| {
                panic!("spawn {} (install it with scripts/setup.sh): {e}", prometheus_path().display())
            });
        let http = reqwest::Client::builder().no_proxy().timeout(Duration::from_secs(10)).build().expect("client");
        let mut p = Prometheus { child: Some(child), dir, url: format!("http://{addr}"), http };
        let ready = poll(TIMEOUT, async || {
            if let Some(status) = p.child.as_mut().and_then(|c| c.try_wait().ok().flatten()) {
                panic!("prometheus exited with {status}:\n{}", p.logs());
            }
            let r = p.http.get(format!("{}/-/ready", p.url)).send().await.ok()?;
            r.status().is_success().then_some(())
        })
        .await;
        assert!(ready.is_some(), "prometheus not ready:\n{}", p.logs());
        p
    }

    /// Its log.
    pub fn logs(&self) -> String {
        tail(&std::fs::read_to_string(self.dir.path().join("log")).unwrap_or_default(), 60)
    }

    /// An instant query through the HTTP API: the whole JSON answer.
    pub async fn query(&self, expr: &str) -> serde_json::Value {
        let resp = self
            .http
            .get(format!("{}/api/v1/query", self.url))
            .query(&[("query", expr)])
            .send()
            .await
            .unwrap_or_else(|e| panic!("query {expr}: {e}"));
        let body = resp.text().await.unwrap_or_default();
        serde_json::from_str(&body).unwrap_or_else(|e| panic!("query {expr}: {e}: {body}"))
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
        if std::thread::panicking() {
            eprintln!("---- prometheus log ----\n{}\n----", self.logs());
        }
    }
}
