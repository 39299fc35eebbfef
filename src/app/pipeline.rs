//! The snapshot pipeline both building roles run: sources → ingest → a snapshot channel.

use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use super::Process;
use crate::drain::DrainWatcher;
use crate::ingest::{self, DebounceSettings, IngestEvent, IngestMetrics, IngestSettings};
use crate::readiness::BlockReady;
use crate::snapshot::{self, SnapshotReader};
use crate::source::{self, SourceError, SourceSettings};

/// A running pipeline.
pub struct Pipeline {
    /// The snapshots ingest publishes.
    pub snapshots: SnapshotReader,
    /// Where more events (new leader terms) reach ingest.
    pub events: mpsc::Sender<IngestEvent>,
    /// The ingest loop; it ends with the drain.
    pub task: JoinHandle<()>,
}

/// Starts ingest with its first snapshot in `term`, then the sources feeding it; `first_snapshot`
/// is released when ingest publishes. On a source error nothing keeps running.
pub async fn start(
    sources: &SourceSettings,
    debounce: DebounceSettings,
    term: u64,
    first_snapshot: BlockReady,
    process: &Process,
    drain: &DrainWatcher,
) -> Result<Pipeline, SourceError> {
    let (events, events_rx) = mpsc::channel(ingest::EVENT_QUEUE);
    let (writer, snapshots) = snapshot::channel();
    let settings = IngestSettings { term, debounce, sources: sources.ids(), ready: first_snapshot };
    let metrics = IngestMetrics::register(&process.registry);
    // Ingest runs first: the sources send their initial state before `start` returns.
    let task = tokio::spawn(ingest::run(events_rx, writer, settings, metrics, process.metrics.clone(), drain.clone()));
    let source_metrics = source::SourceMetrics::register(&process.registry);
    if let Err(e) = source::start(sources, events.clone(), source_metrics, drain.clone()).await {
        task.abort();
        return Err(e);
    }
    Ok(Pipeline { snapshots, events, task })
}
