//! An HTTPS client of meshpilot's validating webhook: HTTP/1.1 over TLS trusting the CA's roots,
//! one connection per request, as the API server talks to it.

use std::net::SocketAddr;
use std::sync::Arc;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use rustls::pki_types::{CertificateDer, ServerName};
use serde_json::{json, Value};

/// A webhook client trusting `roots`.
pub struct WebhookClient {
    addr: SocketAddr,
    tls: tokio_rustls::TlsConnector,
}

impl WebhookClient {
    /// A client of the webhook at `addr`.
    pub fn new(addr: SocketAddr, roots: &[CertificateDer<'static>]) -> WebhookClient {
        let config = meshpilot::security::tls::client_config(roots, None).expect("client TLS");
        let mut config = (*config).clone();
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        WebhookClient { addr, tls: tokio_rustls::TlsConnector::from(Arc::new(config)) }
    }

    /// POSTs `review` (JSON) to `/validate`: the status and the body.
    pub async fn post(&self, review: &Value) -> Result<(u16, String), String> {
        let tcp = tokio::net::TcpStream::connect(self.addr).await.map_err(|e| e.to_string())?;
        let name = ServerName::try_from(self.addr.ip().to_string()).map_err(|e| e.to_string())?;
        let tls = self.tls.connect(name, tcp).await.map_err(|e| format!("TLS: {e}"))?;
        let (mut sender, conn) =
            hyper::client::conn::http1::handshake(TokioIo::new(tls)).await.map_err(|e| e.to_string())?;
        tokio::spawn(conn);
        let request = http::Request::post("/validate")
            .header(http::header::HOST, self.addr.to_string())
            .header(http::header::CONTENT_TYPE, "application/json")
            .body(Full::new(Bytes::from(review.to_string())))
            .map_err(|e| e.to_string())?;
        let response = sender.send_request(request).await.map_err(|e| e.to_string())?;
        let status = response.status().as_u16();
        let bytes = response.into_body().collect().await.map_err(|e| e.to_string())?.to_bytes();
        Ok((status, String::from_utf8_lossy(&bytes).into_owned()))
    }
}

/// An AdmissionReview of a CREATE of `object` in `default`, naming `resource` (group, version,
/// plural) as the API server resolved it.
pub fn admission_review(uid: &str, resource: (&str, &str, &str), object: &Value) -> Value {
    let (group, version, plural) = resource;
    json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": uid,
            "kind": {"group": group, "version": version, "kind": object["kind"]},
            "resource": {"group": group, "version": version, "resource": plural},
            "namespace": "default",
            "name": object["metadata"]["name"],
            "operation": "CREATE",
            "object": object,
        },
    })
}

/// A valid VirtualService named `name`.
pub fn virtual_service(name: &str) -> Value {
    json!({
        "apiVersion": "networking.istio.io/v1", "kind": "VirtualService", "metadata": {"name": name},
        "spec": {"hosts": [name], "http": [{"route": [{"destination": {"host": name}}]}]},
    })
}
