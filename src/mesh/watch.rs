//! Watching the mesh config file: every valid change becomes a new MeshConfig.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;
use tracing::{info, warn};

use super::MeshConfig;
use crate::fswatch;
use crate::ingest::IngestEvent;

/// Loads `path` and sends each new valid version to ingest; an invalid edit is logged and the
/// previous mesh config stays in force. Returns after the first load, watching in the background.
pub async fn watch_mesh_config(path: PathBuf, events: mpsc::Sender<IngestEvent>) -> Result<(), super::MeshConfigError> {
    let first = MeshConfig::load(&path)?;
    let mut current_hash = first.source_hash;
    let _ = events.send(IngestEvent::Mesh(Arc::new(first))).await;
    let (tx, mut rx) = mpsc::channel(1);
    // Watch the directory: editors replace files by renaming over them.
    let dir =
        path.parent().map(PathBuf::from).filter(|p| !p.as_os_str().is_empty()).unwrap_or_else(|| PathBuf::from("."));
    let watch = match fswatch::watch(&dir, tx.clone()) {
        Ok(w) => Some(w),
        Err(e) => {
            warn!(path = %path.display(), error = %e, "cannot watch mesh config; polling instead");
            None
        }
    };
    tokio::spawn(async move {
        let _watch = watch;
        loop {
            // Poll as a safety net for filesystems without notifications.
            let _ = tokio::time::timeout(Duration::from_secs(5), rx.recv()).await;
            match MeshConfig::load(&path) {
                Ok(mesh) if mesh.source_hash != current_hash => {
                    current_hash = mesh.source_hash;
                    let (span, cause) = crate::telemetry::trace::config_event("mesh", 1);
                    span.in_scope(|| info!(path = %path.display(), "mesh config changed"));
                    let _ = events.send(IngestEvent::Cause(cause)).await;
                    if events.send(IngestEvent::Mesh(Arc::new(mesh))).await.is_err() {
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
