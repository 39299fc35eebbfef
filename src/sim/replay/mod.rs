//! The replay server: the physical limit of serving a benchmark's config. It loads a capture
//! (see [`crate::sim::capture`]) and writes each workload's captured response bytes verbatim on
//! ADS — no generation, no encoding — so what remains is the cost of moving the bytes.
//!
//! A stream is keyed to a workload by its node's metadata `NAMESPACE` and `LABELS.app`
//! (`<ns>/<app>`); a workload the capture does not hold ends the stream with NOT_FOUND, so a
//! misconfigured run fails visibly instead of measuring another workload's config.

mod admin;
mod grpc;
mod streams;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use tokio::net::{TcpListener, TcpSocket};
use tracing::info;

use self::streams::Replay;
use crate::drain::DrainWatcher;
use crate::sim::capture::{Capture, CaptureError};
use crate::xds::accept_nodelay;

/// Listen backlog: every simulated proxy of a run connects at once.
const LISTEN_BACKLOG: u32 = 65_535;

/// What to serve, where.
#[derive(Debug, Clone)]
pub struct ReplaySettings {
    /// Capture directory (`index.json`, `blobs/`).
    pub capture: PathBuf,
    /// ADS listen address.
    pub xds_addr: SocketAddr,
    /// Admin HTTP listen address (`/ready`, `/phase/<name>`).
    pub admin_addr: SocketAddr,
}

/// Why the replay server stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum ReplayError {
    /// The capture could not be loaded.
    #[error("loading the capture: {0}")]
    Capture(#[from] CaptureError),
    /// A listener could not bind.
    #[error("binding the {what} on {addr}: {source}")]
    Bind {
        /// Which listener.
        what: &'static str,
        /// Address.
        addr: SocketAddr,
        /// Cause.
        source: std::io::Error,
    },
    /// The ADS server failed.
    #[error("ADS server: {0}")]
    Grpc(#[from] tonic::transport::Error),
    /// The admin server failed.
    #[error("admin server: {0}")]
    Admin(std::io::Error),
}

/// Serves the capture until the drain starts; every stream task has ended when this returns.
pub async fn run(settings: ReplaySettings, drain: DrainWatcher) -> Result<(), ReplayError> {
    let capture = Capture::load(&settings.capture)?;
    let mode = capture.mode;
    let replay = Arc::new(Replay::new(capture));
    let xds = bind("ADS server", settings.xds_addr).await?;
    let admin = bind("admin server", settings.admin_addr).await?;
    info!(xds = %settings.xds_addr, admin = %settings.admin_addr, mode = mode.as_str(), "replay server listening");
    let routes = tonic::service::Routes::from(streams::router(replay.clone(), drain.clone()));
    let grpc_drain = drain.clone();
    let grpc = tonic::transport::Server::builder()
        .add_routes(routes)
        .serve_with_incoming_shutdown(accept_nodelay(xds), async move { grpc_drain.draining().await });
    let admin_drain = drain.clone();
    let admin = axum::serve(admin, admin::router(replay.clone()))
        .with_graceful_shutdown(async move { admin_drain.draining().await });
    drop(drain);
    let (grpc, admin) = tokio::join!(grpc, async { admin.await.map_err(ReplayError::Admin) });
    replay.join_streams().await;
    grpc?;
    admin
}

async fn bind(what: &'static str, addr: SocketAddr) -> Result<TcpListener, ReplayError> {
    let error = |source| ReplayError::Bind { what, addr, source };
    let socket = if addr.is_ipv4() { TcpSocket::new_v4() } else { TcpSocket::new_v6() }.map_err(error)?;
    socket.set_reuseaddr(true).map_err(error)?;
    socket.bind(addr).map_err(error)?;
    socket.listen(LISTEN_BACKLOG).map_err(error)
}
