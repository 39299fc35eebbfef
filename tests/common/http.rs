//! HTTP requests from tests: clients that ignore proxy variables, and a response read whole.

use std::collections::HashMap;
use std::time::Duration;

use serde_json::Value;

/// Timeout of a single HTTP request made by the helpers.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

/// A client builder that ignores proxy env vars (everything is on 127.0.0.1).
fn client_builder(timeout: Duration) -> reqwest::ClientBuilder {
    reqwest::Client::builder().no_proxy().timeout(timeout)
}

/// A client that ignores proxy env vars, follows redirects and gives up on a request after `timeout`.
pub fn http_client_with_timeout(timeout: Duration) -> reqwest::Client {
    client_builder(timeout).build().expect("build reqwest client")
}

/// A client that ignores proxy env vars and follows redirects.
pub fn http_client() -> reqwest::Client {
    http_client_with_timeout(REQUEST_TIMEOUT)
}

/// A client that ignores proxy env vars and does NOT follow redirects.
pub fn http_client_no_redirect() -> reqwest::Client {
    client_builder(REQUEST_TIMEOUT).redirect(reqwest::redirect::Policy::none()).build().expect("build reqwest client")
}

/// A response as read by [`http_request`].
#[derive(Debug, Clone)]
pub struct HttpResponse {
    /// The status code.
    pub status: u16,
    /// Lower-cased names; repeated headers joined with ", ".
    pub headers: HashMap<String, String>,
    /// The body as text.
    pub body: String,
}

impl HttpResponse {
    /// A header by (case-insensitive) name.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(&name.to_ascii_lowercase()).map(|s| s.as_str())
    }

    /// The body parsed as JSON (panics with the body if it is not JSON).
    pub fn json(&self) -> Value {
        serde_json::from_str(&self.body)
            .unwrap_or_else(|e| panic!("response ({}) is not JSON: {e}: {}", self.status, self.body))
    }
}

/// Sends one request. `host` overrides the Host header unless empty; `body` (if any) is sent
/// with a Content-Length.
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

/// GET `url` (following redirects) with Host `host` (unless empty) and extra headers. Transport
/// errors are returned, e.g. for polling a listener that may not be up yet.
pub async fn try_http_get(url: &str, host: &str, headers: &[(&str, &str)]) -> Result<(u16, String), reqwest::Error> {
    let r = http_request(&http_client(), "GET", url, host, headers, None).await?;
    Ok((r.status, r.body))
}

/// GET `url` (following redirects) with Host `host` (unless empty) and extra headers; panics on
/// a transport error.
pub async fn http_get(url: &str, host: &str, headers: &[(&str, &str)]) -> (u16, String) {
    try_http_get(url, host, headers).await.unwrap_or_else(|e| panic!("GET {url} (Host: {host}) failed: {e:?}"))
}

/// GET `url` without following redirects (to check 3xx and Location); panics on a transport error.
pub async fn http_get_no_redirect(url: &str, host: &str, headers: &[(&str, &str)]) -> HttpResponse {
    http_request(&http_client_no_redirect(), "GET", url, host, headers, None)
        .await
        .unwrap_or_else(|e| panic!("GET {url} (Host: {host}) failed: {e:?}"))
}
