//! gRPC channels to meshpilot's secure port (TLS; with or without a client certificate), the
//! CA's material as a test reads it, and CSRs.

use std::future::Future;
use std::net::SocketAddr;
use std::path::Path;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use hyper_util::rt::TokioIo;
use meshpilot::security::ca::{CaMaterial, CaSettings, CertificateAuthority};
use meshpilot::security::tls::client_config;
use meshpilot::security::Identity;
use rustls::pki_types::ServerName;
use tokio::net::TcpStream;
use tonic::transport::{Channel, Endpoint};

use super::poll::{poll, STARTUP_TIMEOUT};

/// The name the secure port's certificate carries for the default namespace.
pub const ISTIOD_NAME: &str = "istiod.istio-system.svc";

/// The CA of a process whose root is kept in `ca_dir` (waits until it has been written).
pub async fn ca_from_dir(ca_dir: &Path) -> CertificateAuthority {
    let written = poll(STARTUP_TIMEOUT, async || matches!(CaMaterial::read_dir(ca_dir), Ok(Some(_)))).await;
    assert!(written, "no CA in {}", ca_dir.display());
    let material = CaMaterial::read_dir(ca_dir).expect("CA files").expect("a CA");
    CertificateAuthority::new(material, CaSettings::default()).expect("the CA loads")
}

/// A client certificate chain and key (PEM) for `identity` from `ca`.
pub fn client_cert(ca: &CertificateAuthority, identity: &str) -> (String, String) {
    let id = Identity::parse(identity).expect("a SPIFFE id");
    let issued = ca.issue_workload(&id, std::time::Duration::from_secs(3600)).expect("issued");
    (issued.chain_pem, issued.key_pem)
}

/// A CSR (PEM) naming `uri` as its SAN.
pub fn csr(uri: &str) -> String {
    let key = rcgen::KeyPair::generate().expect("key");
    let mut params = rcgen::CertificateParams::default();
    params.distinguished_name = rcgen::DistinguishedName::new();
    params.subject_alt_names = vec![rcgen::SanType::URI(uri.to_string().try_into().expect("ia5"))];
    params.serialize_request(&key).expect("csr").pem().expect("pem")
}

/// Connects over TLS to `addr`, checking its certificate for `server_name` against `root_pem`
/// and presenting `client` (chain, key) when given.
#[derive(Clone)]
struct TlsConnector {
    addr: SocketAddr,
    server_name: ServerName<'static>,
    config: Arc<rustls::ClientConfig>,
}

impl tower_service::Service<http::Uri> for TlsConnector {
    type Response = TokioIo<tokio_rustls::client::TlsStream<TcpStream>>;
    type Error = std::io::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Self::Error>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, _uri: http::Uri) -> Self::Future {
        let this = self.clone();
        Box::pin(async move {
            let tcp = TcpStream::connect(this.addr).await?;
            let tls = tokio_rustls::TlsConnector::from(this.config).connect(this.server_name, tcp).await?;
            Ok(TokioIo::new(tls))
        })
    }
}

/// A gRPC channel to the secure port at `addr` (server name [`ISTIOD_NAME`]), trusting
/// `root_pem`, with `client` (chain, key) as its client certificate when given.
pub async fn channel(
    addr: SocketAddr,
    root_pem: &str,
    client: Option<(&str, &str)>,
) -> Result<Channel, tonic::transport::Error> {
    let roots = meshpilot::security::ca::material::parse_certs(root_pem, "root").expect("root");
    let config = client_config(&roots, client).expect("TLS client config");
    let connector = TlsConnector { addr, server_name: ServerName::try_from(ISTIOD_NAME).expect("name"), config };
    // The connector does TLS; tonic sees plain HTTP/2.
    Endpoint::from_shared(format!("http://{ISTIOD_NAME}:{}", addr.port()))
        .expect("endpoint")
        .connect_with_connector(connector)
        .await
}
