//! Starting the config sources that feed an ingest loop.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use tokio::sync::mpsc;

use super::IngestEvent;
use crate::config::source::watch_config_dir;
use crate::mesh::{watch_mesh_config, MeshConfig, MeshConfigError};

/// Why the sources could not start.
#[derive(Debug, thiserror::Error)]
pub enum SourceError {
    /// The config directory could not be read.
    #[error("config directory {dir}: {source}")]
    ConfigDir {
        /// Directory.
        dir: String,
        /// Cause.
        source: std::io::Error,
    },
    /// The mesh config is unusable.
    #[error(transparent)]
    Mesh(#[from] MeshConfigError),
}

/// Loads the mesh config (defaults without a file) and the config directory, sends their initial
/// state to `events` (ending with `Synced`), and keeps watching both in the background.
pub async fn start(
    config_dir: &Path,
    mesh_config: Option<&PathBuf>,
    events: mpsc::Sender<IngestEvent>,
) -> Result<(), SourceError> {
    match mesh_config {
        Some(path) => watch_mesh_config(path.clone(), events.clone()).await?,
        None => {
            let _ = events.send(IngestEvent::Mesh(Arc::new(MeshConfig::default()))).await;
        }
    }
    watch_config_dir(config_dir.to_path_buf(), events)
        .await
        .map_err(|source| SourceError::ConfigDir { dir: config_dir.display().to_string(), source })
}
