//! A frontend: serves ADS to proxies and the admin endpoints from a stream of snapshots.

pub mod node;
mod ownership;

use std::net::SocketAddr;
use std::sync::Arc;

use tokio::sync::watch;
use tracing::info;

use crate::admin::{self, AdminState, NodeStatus};
use crate::snapshot::SnapshotReader;
use crate::xds::server::AdsServer;
use crate::xds::status::ConnectionRegistry;

/// Where a frontend listens.
#[derive(Debug, Clone)]
pub struct FrontendSettings {
    /// ADS (gRPC) address.
    pub xds_addr: SocketAddr,
    /// Admin (HTTP) address.
    pub admin_addr: SocketAddr,
    /// Role and id shown in debug output.
    pub identity: String,
}

/// Why a frontend stopped.
#[derive(Debug, thiserror::Error)]
pub enum FrontendError {
    /// The xDS listener failed.
    #[error("xDS server on {addr}: {source}")]
    Xds {
        /// Address.
        addr: SocketAddr,
        /// Cause.
        source: tonic::transport::Error,
    },
    /// A listener could not bind.
    #[error("binding {addr}: {source}")]
    Bind {
        /// Address.
        addr: SocketAddr,
        /// Cause.
        source: std::io::Error,
    },
    /// The admin listener failed.
    #[error("admin server on {addr}: {source}")]
    Admin {
        /// Address.
        addr: SocketAddr,
        /// Cause.
        source: std::io::Error,
    },
}

/// Serves until `shutdown` flips to true, with a fresh connection registry and no node status.
pub async fn run(
    settings: FrontendSettings,
    snapshots: SnapshotReader,
    shutdown: watch::Receiver<bool>,
) -> Result<(), FrontendError> {
    serve(settings, snapshots, Arc::new(ConnectionRegistry::default()), None, shutdown).await
}

/// Serves until `shutdown` flips to true; `node_status` feeds `/debug/node`.
pub async fn serve(
    settings: FrontendSettings,
    snapshots: SnapshotReader,
    connections: Arc<ConnectionRegistry>,
    node_status: Option<NodeStatus>,
    shutdown: watch::Receiver<bool>,
) -> Result<(), FrontendError> {
    let ads = AdsServer::new(snapshots.clone(), connections.clone(), shutdown.clone());
    let admin_state =
        AdminState { snapshots, connections, cache: ads.cache(), identity: settings.identity.clone(), node_status };
    let xds_addr = settings.xds_addr;
    let admin_addr = settings.admin_addr;
    let xds_listener = tokio::net::TcpListener::bind(xds_addr)
        .await
        .map_err(|source| FrontendError::Bind { addr: xds_addr, source })?;
    info!(addr = %xds_addr, "xDS server listening");
    let xds = tonic::transport::Server::builder()
        .http2_keepalive_interval(Some(std::time::Duration::from_secs(30)))
        .add_service(ads.into_service())
        .serve_with_incoming_shutdown(
            tokio_stream::wrappers::TcpListenerStream::new(xds_listener),
            wait_for(shutdown.clone()),
        );
    let admin = admin::serve(admin_addr, admin_state, wait_for(shutdown));
    let (xds_result, admin_result) = tokio::join!(xds, admin);
    xds_result.map_err(|source| FrontendError::Xds { addr: xds_addr, source })?;
    admin_result.map_err(|source| FrontendError::Admin { addr: admin_addr, source })?;
    Ok(())
}

/// Resolves when the shutdown flag becomes true (or its sender is dropped).
pub async fn wait_for(mut shutdown: watch::Receiver<bool>) {
    let _ = shutdown.wait_for(|stop| *stop).await;
}
