//! Mutual TLS between meshpilot's own processes (the ingest leader's snapshot stream to
//! frontends): both ends hold a certificate from the CA for a control-plane identity, renewed
//! at half its life. A server admits only the listed service accounts of its own namespace and
//! trust domain; a client accepts a server only if its certificate carries the identity it
//! expects (an address read from etcd proves nothing).

use std::future::Future;
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Instant;

use arc_swap::ArcSwap;
use hyper_util::rt::TokioIo;
use rustls::pki_types::{CertificateDer, ServerName};
use tokio::net::TcpStream;
use tracing::warn;

use super::ca::{CaError, CertificateAuthority};
use super::identity::Identity;
use super::serving::{serving_cert, ServingError, ServingNames};
use super::tls::{self, certificate_identities, ClientAuth, PeerFilter, TlsError};

/// The service accounts (SPIFFE names) ingest nodes and frontends link as (those of
/// deploy/kustomize/base/rbac.yaml).
pub const INGEST_SERVICE_ACCOUNT: &str = "meshpilot-ingest";
/// See [`INGEST_SERVICE_ACCOUNT`].
pub const FRONTEND_SERVICE_ACCOUNT: &str = "meshpilot-frontend";

/// Why a link's TLS could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum LinkError {
    /// The CA refused.
    #[error(transparent)]
    Ca(#[from] CaError),
    /// rustls refused.
    #[error(transparent)]
    Tls(#[from] TlsError),
    /// The serving certificate could not be made.
    #[error(transparent)]
    Serving(#[from] ServingError),
    /// The signing task failed.
    #[error("issuing a link certificate: {0}")]
    Task(String),
}

/// A control-plane process's credentials for its links.
pub struct LinkTls {
    ca: Arc<CertificateAuthority>,
    identity: Identity,
    roots: Vec<CertificateDer<'static>>,
    /// The client configuration and when its certificate was issued.
    client: ArcSwap<(Instant, Arc<rustls::ClientConfig>)>,
}

impl std::fmt::Debug for LinkTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LinkTls").field("identity", &self.identity.to_string()).finish_non_exhaustive()
    }
}

async fn issue_client(
    ca: &Arc<CertificateAuthority>,
    identity: &Identity,
    roots: &[CertificateDer<'static>],
) -> Result<Arc<rustls::ClientConfig>, LinkError> {
    let (ca, id) = (ca.clone(), identity.clone());
    let ttl = ca.settings().workload_ttl;
    let issued = tokio::task::spawn_blocking(move || ca.issue_workload(&id, ttl))
        .await
        .map_err(|e| LinkError::Task(e.to_string()))??;
    Ok(tls::client_config(roots, Some((&issued.chain_pem, &issued.key_pem)))?)
}

impl LinkTls {
    /// Credentials of `identity` (this process's control-plane identity) from `ca`.
    pub async fn new(ca: Arc<CertificateAuthority>, identity: Identity) -> Result<Arc<LinkTls>, LinkError> {
        let roots = ca.material().roots()?;
        let client = issue_client(&ca, &identity, &roots).await?;
        Ok(Arc::new(LinkTls { ca, identity, roots, client: ArcSwap::from_pointee((Instant::now(), client)) }))
    }

    /// The client configuration, with a certificate renewed once half its life has passed.
    pub async fn client_config(&self) -> Result<Arc<rustls::ClientConfig>, LinkError> {
        let current = self.client.load_full();
        if current.0.elapsed() < self.ca.settings().workload_ttl / 2 {
            return Ok(current.1.clone());
        }
        let fresh = issue_client(&self.ca, &self.identity, &self.roots).await?;
        self.client.store(Arc::new((Instant::now(), fresh.clone())));
        Ok(fresh)
    }

    /// This process's link identity.
    pub fn identity(&self) -> &Identity {
        &self.identity
    }

    /// The identity of `service_account` beside this process's own (same trust domain and
    /// namespace): what a peer must prove to be that control-plane role.
    pub fn peer_identity(&self, service_account: &str) -> Result<Identity, LinkError> {
        Identity::new(self.identity.trust_domain().clone(), self.identity.namespace(), service_account)
            .map_err(|e| LinkError::Tls(TlsError::Config(format!("service account {service_account:?}: {e}"))))
    }

    /// A server configuration for `names` that requires a client certificate from the CA; the
    /// certificate also carries this process's identity, so clients can tell which role serves.
    pub async fn server_config(
        &self,
        mut names: ServingNames,
        stop: impl Future<Output = ()> + Send + 'static,
    ) -> Result<Arc<rustls::ServerConfig>, LinkError> {
        names.identities.push(self.identity.clone());
        let cert = serving_cert(self.ca.clone(), names, stop).await?;
        Ok(tls::server_config(&self.roots, cert, ClientAuth::Required)?)
    }

    /// Admits only the identities of `service_accounts` in this process's own namespace (the
    /// control plane's) and trust domain: every workload of the mesh, the control plane's own
    /// gateways included, holds a certificate from the same CA, and snapshots hold every key.
    pub fn only_service_accounts(&self, service_accounts: &[String]) -> PeerFilter {
        let admitted: Vec<Identity> = service_accounts.iter().filter_map(|sa| self.peer_identity(sa).ok()).collect();
        Arc::new(move |ids: &[Identity]| ids.iter().any(|id| admitted.contains(id)))
    }

    /// A connector for tonic that dials `addr` (`HOST:PORT`) over mutual TLS, checking the
    /// server's certificate for HOST and that it carries `server` (the role it must prove).
    pub fn connector(self: &Arc<Self>, addr: &str, server: Identity) -> Result<LinkConnector, LinkError> {
        let host = addr.rsplit_once(':').map_or(addr, |(h, _)| h).trim_start_matches('[').trim_end_matches(']');
        let server_name = match host.parse::<IpAddr>() {
            Ok(ip) => ServerName::IpAddress(ip.into()),
            Err(_) => ServerName::try_from(host.to_string())
                .map_err(|e| LinkError::Tls(TlsError::Config(format!("server name {host:?}: {e}"))))?,
        };
        Ok(LinkConnector { addr: addr.to_string(), server_name, server: Arc::new(server), link: self.clone() })
    }
}

/// Dials one address over mutual TLS (see [`LinkTls::connector`]).
#[derive(Clone)]
pub struct LinkConnector {
    addr: String,
    server_name: ServerName<'static>,
    server: Arc<Identity>,
    link: Arc<LinkTls>,
}

impl tower_service::Service<http::Uri> for LinkConnector {
    type Response = TokioIo<tokio_rustls::client::TlsStream<TcpStream>>;
    type Error = std::io::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Self::Error>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, _uri: http::Uri) -> Self::Future {
        let this = self.clone();
        Box::pin(async move {
            let config = this.link.client_config().await.map_err(std::io::Error::other)?;
            let tcp = TcpStream::connect(&this.addr).await?;
            let _ = tcp.set_nodelay(true);
            let addr = &this.addr;
            let stream = match tokio_rustls::TlsConnector::from(config).connect(this.server_name, tcp).await {
                Ok(stream) => stream,
                Err(error) => {
                    warn!(%addr, %error, expected = %this.server, "refusing the peer: TLS handshake failed (no certificate from this CA, or not TLS)");
                    return Err(error);
                }
            };
            let presented = stream
                .get_ref()
                .1
                .peer_certificates()
                .and_then(|chain| chain.first())
                .map(|leaf| certificate_identities(leaf))
                .unwrap_or_default();
            if !presented.contains(&this.server) {
                let presented: Vec<String> = presented.iter().map(ToString::to_string).collect();
                warn!(%addr, ?presented, expected = %this.server, "refusing the peer: its certificate does not prove the expected identity");
                return Err(std::io::Error::new(
                    std::io::ErrorKind::PermissionDenied,
                    format!("{addr} is not {}: its certificate names {presented:?}", this.server),
                ));
            }
            Ok(TokioIo::new(stream))
        })
    }
}
