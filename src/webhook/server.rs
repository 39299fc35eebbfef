//! The webhook's HTTPS endpoint: `POST /validate` (and `/validate/`, as istiod) with a JSON
//! AdmissionReview, answered with one. TLS with a certificate from meshpilot's CA, renewed at half
//! its life; no client certificate is asked for (the API server sends none).

use std::net::SocketAddr;
use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::Router;
use futures::StreamExt;
use tokio::net::TcpListener;
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::server::Connected;
use tracing::{debug, info};

use super::metrics::WebhookMetrics;
use super::review::{self, AdmissionReview};
use crate::security::ca::CertificateAuthority;
use crate::security::serving::{serving_cert, ServingError, ServingNames};
use crate::security::tls::{self, ClientAuth, SecureConn, TlsError};
use crate::telemetry::log_text::Untrusted;

/// The largest review accepted: the API server's own request limit (3 MiB objects) with room
/// for the old object of an update beside the new one.
pub const MAX_BODY_BYTES: usize = 8 * 1024 * 1024;

/// Why the webhook's TLS could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum WebhookTlsError {
    /// The serving certificate could not be issued.
    #[error("the webhook's serving certificate: {0}")]
    Serving(#[from] ServingError),
    /// The CA's roots or the TLS configuration were refused.
    #[error("the webhook's TLS: {0}")]
    Tls(#[from] TlsError),
    /// The CA's roots could not be read.
    #[error("the webhook's TLS: {0}")]
    Ca(#[from] crate::security::ca::CaError),
}

/// TLS for the webhook: a certificate from `ca` for `hosts`, renewed until `stop` resolves.
pub async fn tls_config(
    ca: Arc<CertificateAuthority>,
    hosts: &[String],
    stop: impl std::future::Future<Output = ()> + Send + 'static,
) -> Result<Arc<rustls::ServerConfig>, WebhookTlsError> {
    let roots = ca.material().roots()?;
    let cert = serving_cert(ca, ServingNames::hosts(hosts), stop).await?;
    let config = tls::server_config(&roots, cert, ClientAuth::Optional)?;
    let mut config = (*config).clone();
    // The API server speaks HTTP/1.1 to webhooks when offered it; the shared config offers only h2.
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

/// The webhook's routes.
pub fn router(metrics: WebhookMetrics) -> Router {
    Router::new()
        .route("/validate", post(validate))
        .route("/validate/", post(validate))
        .layer(DefaultBodyLimit::max(MAX_BODY_BYTES))
        .with_state(metrics)
}

/// Serves the webhook on `listener` with `tls` until `shutdown` resolves.
pub async fn serve(
    listener: TcpListener,
    tls: Arc<rustls::ServerConfig>,
    metrics: WebhookMetrics,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let addr = listener.local_addr()?;
    info!(%addr, "validating webhook listening (HTTPS, /validate)");
    let listener = TlsListener { addr, accepted: tls::accept(listener, tls) };
    axum::serve(listener, router(metrics)).with_graceful_shutdown(shutdown).await
}

/// Handshaken TLS connections, as axum's listener.
struct TlsListener {
    addr: SocketAddr,
    accepted: ReceiverStream<Result<SecureConn, std::io::Error>>,
}

impl axum::serve::Listener for TlsListener {
    type Io = SecureConn;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (SecureConn, SocketAddr) {
        loop {
            match self.accepted.next().await {
                Some(Ok(conn)) => {
                    let remote = conn.connect_info().remote.unwrap_or(self.addr);
                    return (conn, remote);
                }
                Some(Err(e)) => debug!(error = %e, "webhook connection"),
                // The acceptor stopped (its listener failed): nothing more will come.
                None => std::future::pending::<()>().await,
            }
        }
    }

    fn local_addr(&self) -> std::io::Result<SocketAddr> {
        Ok(self.addr)
    }
}

async fn validate(State(metrics): State<WebhookMetrics>, headers: HeaderMap, body: Bytes) -> Response {
    let refuse = |status: StatusCode, message: String| {
        metrics.record_http_error(status.as_u16());
        debug!(%status, message = %Untrusted(&message), "webhook request refused");
        (status, message).into_response()
    };
    if body.is_empty() {
        return refuse(StatusCode::BAD_REQUEST, "no body found".into());
    }
    let content_type = headers.get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok()).unwrap_or_default();
    // Parameters (`; charset=utf-8`) are fine; the media type must be JSON.
    if content_type.split(';').next().map(str::trim) != Some("application/json") {
        return refuse(StatusCode::UNSUPPORTED_MEDIA_TYPE, "invalid Content-Type, want `application/json`".into());
    }
    let review: AdmissionReview = match serde_json::from_slice(&body) {
        Ok(r) => r,
        Err(e) => return refuse(StatusCode::BAD_REQUEST, format!("could not decode body: {e}")),
    };
    let (answer, verdict) = review::respond(&review);
    if let Some(request) = &review.request {
        let r = &request.resource;
        let validated = matches!(request.operation.as_str(), "CREATE" | "UPDATE");
        match verdict.reason {
            None if validated => metrics.record_passed(r),
            // As istiod: operations it does not validate count as failures of their own kind.
            None => metrics.record_failed(r, "unsupported_operation"),
            Some(_) if request.dry_run == Some(true) => {}
            Some(reason) => metrics.record_failed(r, reason.label()),
        }
    }
    match serde_json::to_vec(&answer) {
        Ok(json) => ([(header::CONTENT_TYPE, "application/json")], json).into_response(),
        Err(e) => refuse(StatusCode::INTERNAL_SERVER_ERROR, format!("could not encode response: {e}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::telemetry::metrics::Registry;
    use axum::body::Body;
    use http_body_util::BodyExt;
    use tower_service::Service;

    async fn post(content_type: &str, body: &str) -> (StatusCode, String) {
        let mut app = router(WebhookMetrics::register(&Registry::new()));
        let request = axum::http::Request::post("/validate")
            .header(header::CONTENT_TYPE, content_type)
            .body(Body::from(body.to_string()))
            .expect("request");
        let response = app.call(request).await.expect("infallible");
        let status = response.status();
        let bytes = response.into_body().collect().await.expect("body").to_bytes();
        (status, String::from_utf8_lossy(&bytes).into_owned())
    }

    #[tokio::test]
    async fn malformed_requests_are_refused_with_a_clear_status() {
        assert_eq!(post("application/json", "").await, (StatusCode::BAD_REQUEST, "no body found".into()));
        let (status, text) = post("text/plain", "{}").await;
        assert_eq!(status, StatusCode::UNSUPPORTED_MEDIA_TYPE, "{text}");
        let (status, text) = post("application/json", "{not json").await;
        assert_eq!(status, StatusCode::BAD_REQUEST);
        assert!(text.starts_with("could not decode body: "), "{text}");
    }

    #[tokio::test]
    async fn a_body_over_the_limit_is_refused() {
        let (status, _) = post("application/json", &" ".repeat(MAX_BODY_BYTES + 1)).await;
        assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE);
    }

    #[tokio::test]
    async fn a_review_is_answered_with_a_review() {
        let body = r#"{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"u-1",
            "operation":"DELETE","namespace":"ns"}}"#;
        let (status, text) = post("application/json; charset=utf-8", body).await;
        assert_eq!(status, StatusCode::OK);
        let answer: serde_json::Value = serde_json::from_str(&text).expect("JSON");
        assert_eq!(answer["response"]["uid"], "u-1");
        assert_eq!(answer["response"]["allowed"], true);
    }
}
