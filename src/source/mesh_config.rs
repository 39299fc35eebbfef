//! The mesh config source: every valid change of the MeshConfig file becomes a new MeshConfig.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;
use tracing::{info, warn};

use super::{fswatch, SourceEvent, SourceId};
use crate::drain::DrainWatcher;
use crate::mesh::{MeshConfig, MeshConfigError};

/// How often the file is re-read without a notification (filesystems without notifications).
const POLL_INTERVAL: Duration = Duration::from_secs(5);

/// Loads `path`, sends it and `InitDone`, then sends each new valid version; an invalid edit is
/// logged and the previous mesh config stays in force. Watches in a task that ends with the drain.
pub async fn watch<E>(path: PathBuf, events: mpsc::Sender<E>, drain: DrainWatcher) -> Result<(), MeshConfigError>
where
    E: From<SourceEvent> + Send + 'static,
{
    let first = load_blocking(path.clone()).await?;
    let mut current_hash = first.source_hash;
    let _ = events.send(SourceEvent::Mesh(Arc::new(first)).into()).await;
    let _ = events.send(SourceEvent::InitDone(SourceId::MeshConfig).into()).await;
    let (tx, mut rx) = mpsc::channel(1);
    // Watch the directory: editors replace files by renaming over them.
    let dir =
        path.parent().map(PathBuf::from).filter(|p| !p.as_os_str().is_empty()).unwrap_or_else(|| PathBuf::from("."));
    let watch = match fswatch::watch(&dir, tx) {
        Ok(w) => Some(w),
        Err(e) => {
            warn!(path = %path.display(), error = %e, "cannot watch mesh config; polling instead");
            None
        }
    };
    tokio::spawn(async move {
        let _watch = watch;
        loop {
            tokio::select! {
                _ = drain.draining() => return,
                _ = tokio::time::timeout(POLL_INTERVAL, rx.recv()) => {}
            }
            match load_blocking(path.clone()).await {
                Ok(mesh) if mesh.source_hash != current_hash => {
                    current_hash = mesh.source_hash;
                    let (span, cause) = crate::telemetry::trace::config_event("mesh", 1);
                    span.in_scope(|| info!(path = %path.display(), "mesh config changed"));
                    let _ = events.send(SourceEvent::Cause(cause).into()).await;
                    if events.send(SourceEvent::Mesh(Arc::new(mesh)).into()).await.is_err() {
                        return;
                    }
                }
                Ok(_) => {}
                Err(e) => warn!(error = %e, "invalid mesh config ignored; previous one stays in force"),
            }
        }
    });
    Ok(())
}

/// Reads and parses the file on the blocking pool.
async fn load_blocking(path: PathBuf) -> Result<MeshConfig, MeshConfigError> {
    let shown = path.clone();
    tokio::task::spawn_blocking(move || MeshConfig::load(&path)).await.unwrap_or_else(|e| {
        Err(MeshConfigError::Read { path: shown.display().to_string(), source: std::io::Error::other(e) })
    })
}
