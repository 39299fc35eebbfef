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
use std::time::Duration;
use tokio::net::TcpStream;

use envoy_types::pb::envoy::config::core::v3::Node;
use envoy_types::pb::envoy::service::discovery::v3::aggregated_discovery_service_client::AggregatedDiscoveryServiceClient;
use envoy_types::pb::envoy::service::discovery::v3::{DiscoveryRequest, DiscoveryResponse};
use envoy_types::pb::google::protobuf::{value::Kind, Struct, Value};
use tonic::transport::{Channel, Endpoint};

const CDS: &str = "type.googleapis.com/envoy.config.cluster.v3.Cluster";

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

/// Connects over TLS to `addr` with `config`, checking the server's certificate for
/// `server_name`: a connector for tonic's `connect_with_connector` (tonic sees plain HTTP/2).
#[derive(Clone)]
pub struct TlsConnector {
    addr: SocketAddr,
    server_name: ServerName<'static>,
    config: Arc<rustls::ClientConfig>,
}

impl TlsConnector {
    /// Dials `addr`, expecting a certificate for its IP address.
    pub fn to_ip(addr: SocketAddr, config: Arc<rustls::ClientConfig>) -> TlsConnector {
        TlsConnector { addr, server_name: ServerName::IpAddress(addr.ip().into()), config }
    }
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

/// A sidecar node in `ns` with service account `sa`, as pilot-agent describes it.
pub fn node(ns: &str, sa: &str) -> Node {
    let text = |s: &str| Value { kind: Some(Kind::StringValue(s.to_string())) };
    let fields =
        [("NAMESPACE", text(ns)), ("SERVICE_ACCOUNT", text(sa))].into_iter().map(|(k, v)| (k.to_string(), v)).collect();
    Node {
        id: format!("sidecar~10.1.0.1~app-1.{ns}~{ns}.svc.cluster.local"),
        metadata: Some(Struct { fields }),
        ..Default::default()
    }
}

/// Opens a state-of-the-world stream asking for CDS as `node` (with `token` as its bearer
/// token when given); the first response, or the status the stream ended with.
pub async fn first_cds(channel: Channel, token: Option<&str>, node: Node) -> Result<DiscoveryResponse, tonic::Status> {
    let mut client = AggregatedDiscoveryServiceClient::new(channel);
    let request = DiscoveryRequest { node: Some(node), type_url: CDS.into(), ..Default::default() };
    let (tx, rx) = tokio::sync::mpsc::channel(4);
    tx.send(request).await.expect("queued");
    let mut streaming = tonic::Request::new(tokio_stream::wrappers::ReceiverStream::new(rx));
    if let Some(token) = token {
        let value = format!("Bearer {token}").parse().expect("a header value");
        streaming.metadata_mut().insert("authorization", value);
    }
    let mut responses = client.stream_aggregated_resources(streaming).await?.into_inner();
    let next = tokio::time::timeout(Duration::from_secs(20), responses.message()).await.expect("an answer in time");
    drop(tx);
    next?.ok_or_else(|| tonic::Status::unknown("the stream ended without a response"))
}

/// Asks for `type_url` as `node` over `channel` and keeps the stream open (a connected proxy,
/// or a debug client awaiting answers): the request sender and the responses.
pub async fn open_stream(
    channel: Channel,
    node: Node,
    type_url: &str,
) -> Result<(tokio::sync::mpsc::Sender<DiscoveryRequest>, tonic::Streaming<DiscoveryResponse>), tonic::Status> {
    let mut client = AggregatedDiscoveryServiceClient::new(channel);
    let request = DiscoveryRequest { node: Some(node), type_url: type_url.into(), ..Default::default() };
    let (tx, rx) = tokio::sync::mpsc::channel(4);
    tx.send(request).await.expect("queued");
    let responses =
        client.stream_aggregated_resources(tokio_stream::wrappers::ReceiverStream::new(rx)).await?.into_inner();
    Ok((tx, responses))
}

/// The names of the clusters of a CDS response.
pub fn cluster_names(response: &DiscoveryResponse) -> Vec<String> {
    use prost::Message;
    response
        .resources
        .iter()
        .filter_map(|any| envoy_types::pb::envoy::config::cluster::v3::Cluster::decode(any.value.as_slice()).ok())
        .map(|c| c.name)
        .collect()
}

/// The certificate chain (PEM) of the SDS secret `default` that an SDS server on the Unix socket
/// `socket` (pilot-agent's, which Envoy asks) serves, as Envoy would get it.
pub async fn sds_certificate_chain(socket: &Path) -> Result<String, String> {
    use envoy_types::pb::envoy::extensions::transport_sockets::tls::v3::{secret, Secret};
    use envoy_types::pb::envoy::service::secret::v3::secret_discovery_service_client::SecretDiscoveryServiceClient;
    use prost::Message;
    let path = socket.to_path_buf();
    let connector = tower_service_fn(move || {
        let path = path.clone();
        async move { tokio::net::UnixStream::connect(path).await.map(TokioIo::new) }
    });
    let channel = Endpoint::from_static("http://sds.local")
        .connect_with_connector(connector)
        .await
        .map_err(|e| format!("connecting to {}: {e}", socket.display()))?;
    let mut client = SecretDiscoveryServiceClient::new(channel);
    let request = DiscoveryRequest {
        node: Some(Node { id: "sds-test".into(), ..Default::default() }),
        type_url: "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.Secret".into(),
        resource_names: vec!["default".into()],
        ..Default::default()
    };
    let (tx, rx) = tokio::sync::mpsc::channel(1);
    tx.send(request).await.map_err(|e| e.to_string())?;
    let mut responses = client
        .stream_secrets(tokio_stream::wrappers::ReceiverStream::new(rx))
        .await
        .map_err(|e| e.to_string())?
        .into_inner();
    let response = tokio::time::timeout(Duration::from_secs(20), responses.message())
        .await
        .map_err(|_| "no SDS response in time".to_string())?
        .map_err(|e| e.to_string())?
        .ok_or("the SDS stream ended")?;
    drop(tx);
    for any in &response.resources {
        let secret = Secret::decode(any.value.as_slice()).map_err(|e| e.to_string())?;
        if let Some(secret::Type::TlsCertificate(cert)) = secret.r#type {
            let chain = cert.certificate_chain.and_then(|d| d.specifier).ok_or("no certificate chain")?;
            return match chain {
                envoy_types::pb::envoy::config::core::v3::data_source::Specifier::InlineBytes(b) => {
                    String::from_utf8(b).map_err(|e| e.to_string())
                }
                envoy_types::pb::envoy::config::core::v3::data_source::Specifier::InlineString(s) => Ok(s),
                other => Err(format!("certificate chain not inline: {other:?}")),
            };
        }
    }
    Err(format!("no TLS certificate among {} resources", response.resources.len()))
}

/// A connector for tonic from a closure making the connection.
fn tower_service_fn<F, Fut, T>(make: F) -> FnConnector<F>
where
    F: Fn() -> Fut + Clone,
    Fut: Future<Output = std::io::Result<T>>,
{
    FnConnector(make)
}

/// See [`tower_service_fn`].
#[derive(Clone)]
struct FnConnector<F>(F);

impl<F, Fut, T> tower_service::Service<http::Uri> for FnConnector<F>
where
    F: Fn() -> Fut + Clone,
    Fut: Future<Output = std::io::Result<T>> + Send + 'static,
{
    type Response = T;
    type Error = std::io::Error;
    type Future = Pin<Box<dyn Future<Output = std::io::Result<T>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, _uri: http::Uri) -> Self::Future {
        Box::pin((self.0)())
    }
}
