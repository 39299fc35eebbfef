//! GETs of a node's admin endpoints (`http://host:port/debug/...`) over HTTP/1.1.

use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use serde_json::Value;

use super::CtlError;

/// The JSON a GET of `base` + `path` answers; a non-2xx answer is an error carrying its body.
pub async fn get_json(base: &str, path: &str) -> Result<Value, CtlError> {
    let url = format!("{}{path}", base.trim_end_matches('/'));
    let fail = |why: String| CtlError::Admin { url: url.clone(), why };
    let (status, body) = get(&url).await.map_err(fail)?;
    if !status.is_success() {
        let detail = serde_json::from_slice::<Value>(&body)
            .ok()
            .and_then(|v| v["error"].as_str().map(str::to_string))
            .unwrap_or_else(|| String::from_utf8_lossy(&body).trim().to_string());
        return Err(fail(format!("answered {status}: {detail}")));
    }
    serde_json::from_slice(&body).map_err(|e| fail(format!("answer is not JSON: {e}")))
}

/// A frontend of the deployment the node at `base` belongs to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Member {
    /// Its id (`frontend/<id>` is how it names itself).
    pub id: String,
    /// Its xDS address (`host:port`).
    pub addr: String,
}

/// The frontends the node at `base` lists at `/debug/node`; none for a standalone node (which
/// has no membership: its `/debug/node` answers 404).
pub async fn members(base: &str) -> Vec<Member> {
    let node = get_json(base, "/debug/node").await.ok();
    let listed = node.as_ref().and_then(|n| n["members"].as_array().cloned()).unwrap_or_default();
    listed
        .iter()
        .filter_map(|m| Some(Member { id: m["id"].as_str()?.to_string(), addr: m["addr"].as_str()?.to_string() }))
        .collect()
}

/// The status and body of a GET of `url`.
async fn get(url: &str) -> Result<(hyper::StatusCode, Bytes), String> {
    let uri: hyper::Uri = url.parse().map_err(|e| format!("bad URL: {e}"))?;
    if uri.scheme_str() != Some("http") {
        return Err("only http:// admin URLs are supported".into());
    }
    let host = uri.host().ok_or("no host in the URL")?.trim_matches(['[', ']']).to_string();
    let port = uri.port_u16().unwrap_or(80);
    let stream = tokio::net::TcpStream::connect((host.as_str(), port)).await.map_err(|e| e.to_string())?;
    let (mut sender, conn) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream)).await.map_err(|e| e.to_string())?;
    let connection = tokio::spawn(conn);
    let authority = uri.authority().map(|a| a.to_string()).unwrap_or(host);
    let request = hyper::Request::get(uri)
        .header(hyper::header::HOST, authority)
        .body(Empty::<Bytes>::new())
        .map_err(|e| e.to_string())?;
    let result = async {
        let response = sender.send_request(request).await.map_err(|e| e.to_string())?;
        let status = response.status();
        let body = response.into_body().collect().await.map_err(|e| e.to_string())?.to_bytes();
        Ok((status, body))
    }
    .await;
    connection.abort();
    result
}
