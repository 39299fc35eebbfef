//! Standalone mode: an ingest node and a frontend in one process, joined by an in-memory channel.

use std::path::PathBuf;

use tokio::sync::{mpsc, watch};
use tracing::info;

use crate::frontend::{self, FrontendSettings};
use crate::ingest::{self, sources, DebounceSettings};
use crate::snapshot;

/// Settings of a standalone process.
#[derive(Debug, Clone)]
pub struct StandaloneSettings {
    /// Directory of Istio YAML/JSON.
    pub config_dir: PathBuf,
    /// Mesh config file (defaults apply without one).
    pub mesh_config: Option<PathBuf>,
    /// Debounce timing.
    pub debounce: DebounceSettings,
    /// Listeners.
    pub frontend: FrontendSettings,
}

/// Why standalone mode could not start or stopped.
#[derive(Debug, thiserror::Error)]
pub enum StandaloneError {
    /// A config source could not start.
    #[error(transparent)]
    Sources(#[from] sources::SourceError),
    /// A listener failed.
    #[error(transparent)]
    Frontend(#[from] frontend::FrontendError),
}

/// Runs until `shutdown` flips to true.
pub async fn run(settings: StandaloneSettings, shutdown: watch::Receiver<bool>) -> Result<(), StandaloneError> {
    let (events_tx, events_rx) = mpsc::channel(ingest::EVENT_QUEUE);
    let (writer, reader) = snapshot::channel();
    // Term 1: a standalone process is its own, permanent leader.
    let ingest_task = tokio::spawn(ingest::run(events_rx, writer, 1, settings.debounce));
    sources::start(&settings.config_dir, settings.mesh_config.as_ref(), events_tx).await?;
    info!(config_dir = %settings.config_dir.display(), "standalone meshpilot started");
    let result = frontend::run(settings.frontend, reader, shutdown).await;
    ingest_task.abort();
    result.map_err(StandaloneError::from)
}
