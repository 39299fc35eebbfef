//! TLS for meshpilot's secure listeners: a serving certificate from the CA (renewed at half its
//! life), client certificates verified against the CA's roots (optional or required), and the
//! peer's verified identities handed to each request as a connection extension.

use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use arc_swap::ArcSwap;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::{ClientHello, ResolvesServerCert, WebPkiClientVerifier};
use rustls::sign::CertifiedKey;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio_rustls::server::TlsStream;
use tracing::{debug, warn};

use super::handshake::{HandshakeGate, HandshakeLimits};
use super::identity::Identity;
use crate::telemetry::log_text::{untrusted_list, Untrusted};

/// Accepted connections waiting for the server to take them.
const ACCEPTED_QUEUE: usize = 1024;

/// Why a TLS configuration could not be built.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// A certificate or key did not parse.
    #[error("{what}: {reason}")]
    Pem {
        /// Which input.
        what: &'static str,
        /// Why.
        reason: String,
    },
    /// rustls refused the configuration.
    #[error("TLS configuration: {0}")]
    Config(String),
}

/// The CA's ring provider (no aws-lc), installed as the process default once.
pub fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    Arc::new(rustls::crypto::ring::default_provider())
}

/// A certificate chain and key (PEM) as rustls signs with them.
pub fn certified_key(chain_pem: &str, key_pem: &str) -> Result<Arc<CertifiedKey>, TlsError> {
    let chain = CertificateDer::pem_slice_iter(chain_pem.as_bytes())
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| TlsError::Pem { what: "certificate chain", reason: e.to_string() })?;
    let key = PrivateKeyDer::from_pem_slice(key_pem.as_bytes())
        .map_err(|e| TlsError::Pem { what: "private key", reason: e.to_string() })?;
    let certified = CertifiedKey::from_der(chain, key, &provider()).map_err(|e| TlsError::Config(e.to_string()))?;
    Ok(Arc::new(certified))
}

/// The serving certificate, swapped when it is renewed.
#[derive(Debug)]
pub struct ServingCert(ArcSwap<CertifiedKey>);

impl ServingCert {
    /// Serves `key` until [`Self::replace`].
    pub fn new(key: Arc<CertifiedKey>) -> Arc<ServingCert> {
        Arc::new(ServingCert(ArcSwap::new(key)))
    }

    /// Serves `key` to new connections from now on.
    pub fn replace(&self, key: Arc<CertifiedKey>) {
        self.0.store(key);
    }

    /// The certificate served now.
    pub fn current(&self) -> Arc<CertifiedKey> {
        self.0.load_full()
    }
}

impl ResolvesServerCert for ServingCert {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.0.load_full())
    }
}

/// Whether a listener asks clients for a certificate and must get one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClientAuth {
    /// Asked for; clients without one authenticate otherwise (a token), or are refused later.
    Optional,
    /// A client without a certificate from the CA cannot connect.
    Required,
}

/// A server configuration for HTTP/2 (gRPC) serving `cert`, verifying client certificates
/// against `roots`.
pub fn server_config(
    roots: &[CertificateDer<'static>],
    cert: Arc<ServingCert>,
    client_auth: ClientAuth,
) -> Result<Arc<rustls::ServerConfig>, TlsError> {
    let provider = provider();
    let mut store = rustls::RootCertStore::empty();
    for root in roots {
        store.add(root.clone()).map_err(|e| TlsError::Config(format!("root certificate: {e}")))?;
    }
    let builder = WebPkiClientVerifier::builder_with_provider(Arc::new(store), provider.clone());
    let verifier = match client_auth {
        ClientAuth::Optional => builder.allow_unauthenticated().build(),
        ClientAuth::Required => builder.build(),
    }
    .map_err(|e| TlsError::Config(e.to_string()))?;
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| TlsError::Config(e.to_string()))?
        .with_client_cert_verifier(verifier)
        .with_cert_resolver(cert);
    // gRPC clients (Go's among them) insist on ALPN h2.
    config.alpn_protocols = vec![b"h2".to_vec()];
    Ok(Arc::new(config))
}

/// A client configuration trusting `roots`, presenting `client` when given.
pub fn client_config(
    roots: &[CertificateDer<'static>],
    client: Option<(&str, &str)>,
) -> Result<Arc<rustls::ClientConfig>, TlsError> {
    let mut store = rustls::RootCertStore::empty();
    for root in roots {
        store.add(root.clone()).map_err(|e| TlsError::Config(format!("root certificate: {e}")))?;
    }
    let builder = rustls::ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| TlsError::Config(e.to_string()))?
        .with_root_certificates(store);
    let mut config = match client {
        Some((chain_pem, key_pem)) => {
            let key = certified_key(chain_pem, key_pem)?;
            let key_der = PrivateKeyDer::from_pem_slice(key_pem.as_bytes())
                .map_err(|e| TlsError::Pem { what: "private key", reason: e.to_string() })?;
            builder.with_client_auth_cert(key.cert.clone(), key_der).map_err(|e| TlsError::Config(e.to_string()))?
        }
        None => builder.with_no_client_auth(),
    };
    config.alpn_protocols = vec![b"h2".to_vec()];
    Ok(Arc::new(config))
}

/// What a TLS connection established about its peer; every request on it carries this.
#[derive(Debug, Clone, Default)]
pub struct PeerInfo {
    /// The peer's address.
    pub remote: Option<SocketAddr>,
    /// Identities of the client certificate the handshake verified against the CA (none without one).
    pub identities: Arc<Vec<Identity>>,
}

/// The SPIFFE identities (URI SANs) of a certificate; other SANs are not identities.
pub fn certificate_identities(der: &[u8]) -> Vec<Identity> {
    let Ok((_, cert)) = x509_parser::parse_x509_certificate(der) else { return Vec::new() };
    let Ok(Some(san)) = cert.subject_alternative_name() else { return Vec::new() };
    san.value
        .general_names
        .iter()
        .filter_map(|name| match name {
            x509_parser::extensions::GeneralName::URI(uri) => Identity::parse(uri).ok(),
            _ => None,
        })
        .collect()
}

/// An accepted TLS connection with what its handshake established.
pub struct SecureConn {
    inner: TlsStream<TcpStream>,
    info: PeerInfo,
}

impl tonic::transport::server::Connected for SecureConn {
    type ConnectInfo = PeerInfo;

    fn connect_info(&self) -> PeerInfo {
        self.info.clone()
    }
}

impl AsyncRead for SecureConn {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl AsyncWrite for SecureConn {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }
    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}

/// Decides, from its verified identities, whether a peer may use a listener at all.
pub type PeerFilter = Arc<dyn Fn(&[Identity]) -> bool + Send + Sync>;

/// Accepts on `listener` and yields each connection once its handshake succeeded; handshakes
/// run concurrently (one slow client delays nobody) and failed ones are dropped.
pub fn accept(
    listener: TcpListener,
    config: Arc<rustls::ServerConfig>,
) -> tokio_stream::wrappers::ReceiverStream<Result<SecureConn, std::io::Error>> {
    accept_filtered(listener, config, None)
}

/// As [`accept`], dropping connections whose peer `filter` refuses.
pub fn accept_filtered(
    listener: TcpListener,
    config: Arc<rustls::ServerConfig>,
    filter: Option<PeerFilter>,
) -> tokio_stream::wrappers::ReceiverStream<Result<SecureConn, std::io::Error>> {
    accept_limited(listener, config, filter, HandshakeGate::new(HandshakeLimits::default()))
}

/// As [`accept_filtered`], with the handshake limits of `gate`: a connection must start its
/// handshake within a short deadline and finish it within another, idle connections hold no
/// handshake slot, one address holds few, and some are kept for peers known from a recent
/// handshake (see [`super::handshake`]).
pub fn accept_limited(
    listener: TcpListener,
    config: Arc<rustls::ServerConfig>,
    filter: Option<PeerFilter>,
    gate: HandshakeGate,
) -> tokio_stream::wrappers::ReceiverStream<Result<SecureConn, std::io::Error>> {
    let (tx, rx) = mpsc::channel(ACCEPTED_QUEUE);
    let acceptor = tokio_rustls::TlsAcceptor::from(config);
    tokio::spawn(async move {
        loop {
            // Accepting never waits for a handshake slot: a new connection always gets its turn,
            // and the gate closes the idle ones that hold nothing but a descriptor.
            let (tcp, remote) = tokio::select! {
                accepted = listener.accept() => match accepted {
                    Ok(a) => a,
                    Err(e) => {
                        // Out of descriptors and the like: wait a moment instead of spinning.
                        warn!(error = %e, "accepting a TLS connection");
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        continue;
                    }
                },
                _ = tx.closed() => return,
            };
            let (acceptor, tx, filter, gate) = (acceptor.clone(), tx.clone(), filter.clone(), gate.clone());
            tokio::spawn(async move {
                let accepted = std::time::Instant::now();
                let _ = tcp.set_nodelay(true);
                let slot = match gate.admit(&tcp, remote.ip(), accepted).await {
                    Ok(slot) => slot,
                    Err(refused) => {
                        debug!(%remote, ?refused, "connection closed before its TLS handshake");
                        return;
                    }
                };
                let rest = gate.limits().handshake.saturating_sub(accepted.elapsed());
                let handshake = tokio::time::timeout(rest, acceptor.accept(tcp)).await;
                drop(slot);
                match handshake {
                    Ok(Ok(stream)) => {
                        let identities = stream
                            .get_ref()
                            .1
                            .peer_certificates()
                            .and_then(|chain| chain.first())
                            .map(|leaf| certificate_identities(leaf))
                            .unwrap_or_default();
                        if filter.is_some_and(|allow| !allow(&identities)) {
                            warn!(%remote, identities = %untrusted_list(&identities), "TLS peer not allowed on this listener");
                            return;
                        }
                        gate.completed(remote.ip());
                        let info = PeerInfo { remote: Some(remote), identities: Arc::new(identities) };
                        let _ = tx.send(Ok(SecureConn { inner: stream, info })).await;
                    }
                    Ok(Err(e)) => debug!(%remote, error = %Untrusted(&e.to_string()), "TLS handshake failed"),
                    Err(_) => debug!(%remote, "TLS handshake timed out"),
                }
            });
        }
    });
    tokio_stream::wrappers::ReceiverStream::new(rx)
}
