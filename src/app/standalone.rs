//! Standalone: an ingest node and an xDS frontend in one process, joined by the in-memory
//! snapshot channel instead of the network. The embedded default.

use std::net::SocketAddr;
use std::sync::Arc;

use tracing::info;

use super::servers;
use super::{pipeline, Process, RoleError};
use crate::admin::{AdminState, XdsState};
use crate::drain::DrainWatcher;
use crate::ingest::DebounceSettings;
use crate::readiness::Ready;
use crate::source::SourceSettings;
use crate::xds::admission::AdmissionSettings;
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
    /// New-stream rate, push concurrency and stream age of the xDS server.
    pub admission: AdmissionSettings,
}

/// Runs until the drain starts.
pub async fn run(settings: StandaloneSettings, process: Process, drain: DrainWatcher) -> Result<(), RoleError> {
    let ready = Ready::new();
    let first_snapshot = ready.register_task("first snapshot");
    let xds_bound = ready.register_task("xDS listener");
    let xds_listener = servers::bind("xDS server", settings.xds_addr).await?;
    let admin_listener = servers::bind("admin server", settings.admin_addr).await?;

    // Term 1: a standalone process is its own, permanent leader.
    let pipeline = pipeline::start(&settings.sources, settings.debounce, 1, first_snapshot, &process, &drain).await?;
    let (reader, ingest_task) = (pipeline.snapshots, pipeline.task);

    let xds_metrics = XdsMetrics::register(&process.registry);
    let connections = Arc::new(ConnectionRegistry::new(xds_metrics.clone()));
    let ads = AdsServer::new(reader.clone(), connections.clone(), xds_metrics, drain.clone(), settings.admission)
        .with_server_id("standalone");
    let admin_state = AdminState {
        snapshots: reader,
        xds: Some(XdsState { connections, cache: ads.cache() }),
        ready,
        metrics: process.registry.clone(),
        identity: "standalone".into(),
        node_status: None,
        renders: crate::admin::render_limit(),
    };
    info!(config_dir = ?settings.sources.config_dir, kubernetes = settings.sources.kubernetes.is_some(), "standalone meshpilot started");
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
