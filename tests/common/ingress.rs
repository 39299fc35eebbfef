//! An HTTP client aimed at one proxy listener (a gateway's or a sidecar's) with one Host header,
//! and waits for where its requests land.

use serde_json::Value;

use super::http::{http_client_no_redirect, http_request, HttpResponse};
use super::poll::{poll, CONVERGE_TIMEOUT};

/// The `backend` field of a 200 answer from a [`Backend`](super::backend::Backend) (None otherwise).
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

    /// The Host header sent.
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
    /// [`Backend`](super::backend::Backend).
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
        let ok = poll(CONVERGE_TIMEOUT, async || {
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
        let ok = poll(CONVERGE_TIMEOUT, async || {
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
