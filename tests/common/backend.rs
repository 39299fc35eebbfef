//! Test backends: small axum HTTP/1.1 servers that say who they are and echo the request, so a
//! test can tell which backend a proxy sent a request to and what the proxy changed on the way.

use std::fmt;
use std::future::IntoFuture as _;
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpListener as StdTcpListener};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{header, HeaderMap, HeaderValue, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::serve::ListenerExt as _;
use axum::Router;
use serde_json::{json, Value};

/// How a [`Backend`] answers.
#[derive(Clone, Debug)]
enum Behavior {
    Ok,
    Status(u16),
    /// Odd-numbered requests (1st, 3rd, ...) get 503, even-numbered get 200.
    Flaky,
    Delay(Duration),
}

/// An HTTP/1.1 server on a loopback address that answers every request (any method and path)
/// with JSON `{"backend", "path" (with query), "method", "host", "headers" {lower-case name:
/// value, repeated ones joined with ", "}, "body"}` and an `x-backend: NAME` header. hyper does
/// the protocol: keep-alive, Content-Length and chunked request bodies, `Connection: close`,
/// `Expect: 100-continue`, HEAD. Runs on its own thread and runtime (so it serves while the
/// test's runtime is blocked) and stops, closing its connections, when dropped.
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
    port: Option<u16>,
    behavior: Behavior,
    listener: Option<StdTcpListener>,
}

impl BackendBuilder {
    /// Bind this loopback address (127.0.0.0/8) instead of 127.0.0.1.
    pub fn ip(mut self, ip: Ipv4Addr) -> Self {
        assert!(ip.is_loopback(), "backends bind loopback addresses only");
        self.ip = ip;
        self
    }
    /// Bind this port instead of one from [`super::ports::free_port`].
    pub fn port(mut self, port: u16) -> Self {
        self.port = Some(port);
        self
    }
    /// Serve on this listener (e.g. one opened inside a test's network namespace) instead of
    /// binding one.
    pub fn listener(mut self, listener: StdTcpListener) -> Self {
        self.listener = Some(listener);
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

    /// Binds the port and starts serving.
    pub fn start(self) -> Backend {
        let listener = match self.listener {
            Some(l) => l,
            None => {
                let port = self.port.unwrap_or_else(super::ports::free_port);
                StdTcpListener::bind((self.ip, port))
                    .unwrap_or_else(|e| panic!("backend {}: bind {}:{port}: {e}", self.name, self.ip))
            }
        };
        listener.set_nonblocking(true).expect("non-blocking listener");
        let addr = listener.local_addr().expect("backend address");
        let requests = Arc::new(AtomicU64::new(0));
        let state =
            Arc::new(BackendState { name: self.name.clone(), behavior: self.behavior, requests: requests.clone() });
        let router = Router::new().fallback(echo).with_state(state);
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let thread = std::thread::Builder::new()
            .name(format!("backend-{}", self.name))
            .spawn(move || {
                let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("backend runtime");
                rt.block_on(async move {
                    let listener = tokio::net::TcpListener::from_std(listener).expect("tokio listener");
                    let listener = listener.tap_io(|tcp| {
                        let _ = tcp.set_nodelay(true);
                    });
                    tokio::select! {
                        _ = rx => {}
                        _ = axum::serve(listener, router).into_future() => {}
                    }
                });
                // Dropping the runtime cancels every connection task: nothing is served after drop.
                drop(rt);
            })
            .expect("backend thread");
        Backend { name: self.name, addr, requests, shutdown: Some(tx), thread: Some(thread) }
    }
}

impl Backend {
    /// A builder for a backend named `name` (200 to everything, 127.0.0.1, a free port).
    pub fn builder(name: &str) -> BackendBuilder {
        BackendBuilder {
            name: name.to_string(),
            ip: Ipv4Addr::LOCALHOST,
            port: None,
            behavior: Behavior::Ok,
            listener: None,
        }
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
    /// The name it answers with.
    pub fn name(&self) -> &str {
        &self.name
    }
    /// The address it listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }
    /// The IP it listens on.
    pub fn ip(&self) -> IpAddr {
        self.addr.ip()
    }
    /// The port it listens on.
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

/// What the handler of one [`Backend`] knows.
struct BackendState {
    name: String,
    behavior: Behavior,
    requests: Arc<AtomicU64>,
}

/// The one handler: counts the request, applies the behaviour, echoes the request as JSON.
async fn echo(
    State(state): State<Arc<BackendState>>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let n = state.requests.fetch_add(1, Ordering::SeqCst) + 1;
    let status = match &state.behavior {
        Behavior::Ok => 200,
        Behavior::Status(code) => *code,
        Behavior::Flaky if n % 2 == 1 => 503,
        Behavior::Flaky => 200,
        Behavior::Delay(d) => {
            tokio::time::sleep(*d).await;
            200
        }
    };
    // An absolute-form target (`http://host/path`) counts as its path, its authority as the host
    // when there is no Host header.
    let path = uri.path_and_query().map_or_else(|| "/".to_string(), |p| p.as_str().to_string());
    let host = headers
        .get(header::HOST)
        .map(|h| String::from_utf8_lossy(h.as_bytes()).into_owned())
        .or_else(|| uri.authority().map(|a| a.to_string()))
        .unwrap_or_default();
    let mut echoed = serde_json::Map::new();
    for name in headers.keys() {
        let values: Vec<String> =
            headers.get_all(name).iter().map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned()).collect();
        echoed.insert(name.as_str().to_string(), Value::String(values.join(", ")));
    }
    let payload = json!({
        "backend": state.name,
        "path": path,
        "method": method.as_str(),
        "host": host,
        "headers": echoed,
        "body": String::from_utf8_lossy(&body),
    });
    let status = StatusCode::from_u16(status).expect("a valid status code");
    let name = HeaderValue::from_str(&state.name).expect("a backend name is a valid header value");
    let headers = [
        (header::CONTENT_TYPE, HeaderValue::from_static("application/json")),
        (header::HeaderName::from_static("x-backend"), name),
    ];
    (status, headers, payload.to_string()).into_response()
}
