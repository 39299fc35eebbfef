//! Standalone: an ingest node and an xDS frontend in one process, joined by the in-memory
//! snapshot channel instead of the network. The embedded default.

use std::net::SocketAddr;
use std::sync::Arc;

use tokio::sync::mpsc;
use tracing::info;

use super::servers::{self, ServeError};
use super::Process;
use crate::admin::{AdminState, XdsState};
use crate::drain::DrainWatcher;
use crate::ingest::{self, DebounceSettings, IngestMetrics, IngestSettings};
use crate::readiness::Ready;
use crate::snapshot;
use crate::source::{self, SourceError, SourceSettings};
use crate::xds::metrics::XdsMetrics;
use crate::xds::server::AdsServer;
use crate::xds::status::ConnectionRegistry;

/// Settings of a standalone process.
#[derive(Debug, Clone)]
pub struct StandaloneSettings {
    /// Config directory and mesh config.
    pub sources: SourceSettings,
    /// Debounce timing.
    pub debounce: DebounceSettings,
    /// ADS (gRPC) address.
    pub xds_addr: SocketAddr,
    /// Admin (HTTP) address.
    pub admin_addr: SocketAddr,
}

/// Why standalone mode could not start or stopped.
#[derive(Debug, thiserror::Error)]
pub enum StandaloneError {
    /// A config source could not start.
    #[error(transparent)]
    Sources(#[from] SourceError),
    /// A listener failed.
    #[error(transparent)]
    Serve(#[from] ServeError),
}

/// Runs until the drain starts.
pub async fn run(settings: StandaloneSettings, process: Process, drain: DrainWatcher) -> Result<(), StandaloneError> {
    let ready = Ready::new();
    let first_snapshot = ready.register_task("first snapshot");
    let xds_bound = ready.register_task("xDS listener");
    let xds_listener = servers::bind("xDS server", settings.xds_addr).await?;
    let admin_listener = servers::bind("admin server", settings.admin_addr).await?;

    let (events_tx, events_rx) = mpsc::channel(ingest::EVENT_QUEUE);
    let (writer, reader) = snapshot::channel();
    // Term 1: a standalone process is its own, permanent leader.
    let sources = settings.sources.ids();
    let ingest_settings = IngestSettings { term: 1, debounce: settings.debounce, sources, ready: first_snapshot };
    let ingest_metrics = IngestMetrics::register(&process.registry);
    let ingest_task = tokio::spawn(ingest::run(
        events_rx,
        writer,
        ingest_settings,
        ingest_metrics,
        process.metrics.clone(),
        drain.clone(),
    ));
    if let Err(e) = source::start(&settings.sources, events_tx, drain.clone()).await {
        ingest_task.abort();
        return Err(e.into());
    }

    let xds_metrics = XdsMetrics::register(&process.registry);
    let connections = Arc::new(ConnectionRegistry::new(xds_metrics.clone()));
    let ads = AdsServer::new(reader.clone(), connections.clone(), xds_metrics, drain.clone());
    let admin_state = AdminState {
        snapshots: reader,
        xds: Some(XdsState { connections, cache: ads.cache() }),
        ready,
        metrics: process.registry.clone(),
        identity: "standalone".into(),
        node_status: None,
    };
    info!(config_dir = %settings.sources.config_dir.display(), "standalone meshpilot started");
    drop(xds_bound);
    let served = tokio::try_join!(
        servers::serve_xds(xds_listener, ads, drain.clone()),
        servers::serve_admin(admin_listener, admin_state, drain),
    );
    // The servers stop once the drain started, and ingest with them; a failed server stops it here.
    if served.is_err() {
        ingest_task.abort();
    }
    let _ = ingest_task.await;
    served?;
    Ok(())
}
