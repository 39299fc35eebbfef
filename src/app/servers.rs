//! The listeners a role serves on: ADS (gRPC), the admin HTTP server and the snapshot server
//! (the validating webhook's is in `webhook`).
//! Each binds first (a bind error stops the role at start-up, before readiness) and serves until
//! the drain starts.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::{TcpListener, TcpSocket};
use tracing::info;

use super::security::Security;
use crate::admin::{self, AdminState};
use crate::drain::DrainWatcher;
use crate::replication::SnapshotServer;
use crate::security::ca::service::CaService;
use crate::security::tls;
use crate::xds::{accept_nodelay, AdsServer};

/// Why a listener could not start or stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// The address could not be bound.
    #[error("binding the {what} on {addr}: {source}")]
    Bind {
        /// Which listener.
        what: &'static str,
        /// Address.
        addr: SocketAddr,
        /// Cause.
        source: std::io::Error,
    },
    /// A gRPC server failed.
    #[error("{what} on {addr}: {source}")]
    Grpc {
        /// Which listener.
        what: &'static str,
        /// Address.
        addr: SocketAddr,
        /// Cause.
        source: tonic::transport::Error,
    },
    /// The admin server failed.
    #[error("admin server on {addr}: {source}")]
    Admin {
        /// Address.
        addr: SocketAddr,
        /// Cause.
        source: std::io::Error,
    },
    /// The validating webhook failed.
    #[error("validating webhook on {addr}: {source}")]
    Webhook {
        /// Address.
        addr: SocketAddr,
        /// Cause.
        source: std::io::Error,
    },
}

/// Connections the kernel queues for a listener before it accepts them (it caps this at
/// `net.core.somaxconn`, as Go's listeners, istiod's among them, ask for). Every proxy of a
/// frontend that went away reconnects at once: tokio's default of 1,024 overflowed with 1,000
/// proxies connecting together, and the kernel reset the connections it dropped.
const LISTEN_BACKLOG: u32 = 65_535;

/// Binds the xDS ports a serving role (standalone, frontend) has: the plaintext one unless turned
/// off, and the secure one when configured. Returns (plaintext, secure).
pub async fn bind_xds(
    plaintext: bool,
    addr: SocketAddr,
    secure: Option<SocketAddr>,
) -> Result<(Option<TcpListener>, Option<TcpListener>), ServeError> {
    let plaintext = match plaintext {
        true => Some(bind("xDS server", addr).await?),
        false => None,
    };
    let secure = match secure {
        Some(addr) => Some(bind("secure xDS server", addr).await?),
        None => None,
    };
    Ok((plaintext, secure))
}

/// Binds `addr` for the listener named `what`.
pub async fn bind(what: &'static str, addr: SocketAddr) -> Result<TcpListener, ServeError> {
    let error = |source| ServeError::Bind { what, addr, source };
    let socket = if addr.is_ipv4() { TcpSocket::new_v4() } else { TcpSocket::new_v6() }.map_err(error)?;
    // As tokio's own bind does: a restarted process rebinds while old connections linger.
    socket.set_reuseaddr(true).map_err(error)?;
    socket.bind(addr).map_err(error)?;
    socket.listen(LISTEN_BACKLOG).map_err(error)
}

/// Serves ADS on `listener` until the drain starts (each stream then ends with UNAVAILABLE).
pub async fn serve_xds(listener: TcpListener, ads: AdsServer, drain: DrainWatcher) -> Result<(), ServeError> {
    let addr = local_addr(&listener);
    info!(%addr, "xDS server listening");
    tonic::transport::Server::builder()
        .http2_keepalive_interval(Some(Duration::from_secs(30)))
        .add_service(ads.into_service())
        .serve_with_incoming_shutdown(accept_nodelay(listener), async move { drain.draining().await })
        .await
        .map_err(|source| ServeError::Grpc { what: "xDS server", addr, source })
}

/// Serves the secure port on `listener` until the drain starts: TLS (`tls`), ADS for callers
/// that authenticate and claim their own node, and Istio's CA service, as istiod's 15012 does.
pub async fn serve_secure_xds(
    listener: TcpListener,
    ads: AdsServer,
    security: Security,
    drain: DrainWatcher,
) -> Result<(), ServeError> {
    let addr = local_addr(&listener);
    info!(%addr, "secure xDS server (TLS, ADS and CA) listening");
    let ca = CaService::new(security.ca.clone(), security.authn.clone(), security.metrics.clone());
    tonic::transport::Server::builder()
        .http2_keepalive_interval(Some(Duration::from_secs(30)))
        .add_service(ads.authenticated_service(security.authn.clone()))
        .add_service(ca.into_service())
        .serve_with_incoming_shutdown(
            tls::accept(listener, security.tls.clone()),
            async move { drain.draining().await },
        )
        .await
        .map_err(|source| ServeError::Grpc { what: "secure xDS server", addr, source })
}

/// Serves ADS on the plaintext listener and the secure one, those given, until the drain starts.
pub async fn serve_xds_ports(
    plaintext: Option<TcpListener>,
    secure: Option<(TcpListener, Security)>,
    ads: AdsServer,
    drain: DrainWatcher,
) -> Result<(), ServeError> {
    let plain = async {
        match plaintext {
            Some(listener) => serve_xds(listener, ads.clone(), drain.clone()).await,
            None => Ok(()),
        }
    };
    let tls = async {
        match secure {
            Some((listener, security)) => serve_secure_xds(listener, ads.clone(), security, drain.clone()).await,
            None => Ok(()),
        }
    };
    tokio::try_join!(plain, tls).map(|_| ())
}

/// Serves snapshots to frontends on `listener` until the drain starts.
/// With `tls` (a server configuration and the peers it admits), only control-plane peers with a
/// certificate from the CA may subscribe.
pub async fn serve_snapshots(
    listener: TcpListener,
    server: SnapshotServer,
    tls: Option<(Arc<rustls::ServerConfig>, tls::PeerFilter)>,
    drain: DrainWatcher,
) -> Result<(), ServeError> {
    let addr = local_addr(&listener);
    let builder = server.transport().add_service(server.into_service());
    let stop = async move { drain.draining().await };
    let served = match tls {
        Some((config, filter)) => {
            info!(%addr, "snapshot server listening (mutual TLS)");
            builder.serve_with_incoming_shutdown(tls::accept_filtered(listener, config, Some(filter)), stop).await
        }
        None => {
            info!(%addr, "snapshot server listening");
            builder.serve_with_incoming_shutdown(accept_nodelay(listener), stop).await
        }
    };
    served.map_err(|source| ServeError::Grpc { what: "snapshot server", addr, source })
}

/// Serves the admin endpoints on `listener` until the drain starts.
pub async fn serve_admin(listener: TcpListener, state: AdminState, drain: DrainWatcher) -> Result<(), ServeError> {
    let addr = local_addr(&listener);
    admin::serve(listener, state, async move { drain.draining().await })
        .await
        .map_err(|source| ServeError::Admin { addr, source })
}

fn local_addr(listener: &TcpListener) -> SocketAddr {
    listener.local_addr().unwrap_or_else(|_| SocketAddr::from(([0, 0, 0, 0], 0)))
}
