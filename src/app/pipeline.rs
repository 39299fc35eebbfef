//! The snapshot pipeline both building roles run: sources → ingest → a snapshot channel.

use tokio::sync::mpsc;

use super::tasks::Tasks;
use super::Process;
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
}

/// Starts ingest with its first snapshot in `term`, then the sources feeding it (Kubernetes
/// through `kube`, the process's client); `first_snapshot` is released when ingest publishes. On
/// a source error nothing keeps running.
pub async fn start(
    sources: &SourceSettings,
    kube: Option<kube::Client>,
    debounce: DebounceSettings,
    term: u64,
    first_snapshot: BlockReady,
    process: &Process,
    tasks: &mut Tasks,
) -> Result<Pipeline, SourceError> {
    let drain = tasks.drain().clone();
    let (events, events_rx) = mpsc::channel(ingest::EVENT_QUEUE);
    let (writer, snapshots) = snapshot::channel();
    let settings = IngestSettings { term, debounce, sources: sources.ids(), ready: first_snapshot };
    let metrics = IngestMetrics::register(&process.registry);
    // Ingest runs first: the sources send their initial state before `start` returns.
    let ingest = ingest::run(events_rx, writer, settings, metrics, process.metrics.clone(), drain.clone());
    tasks.spawn_finishing("ingest", ingest);
    let source_metrics = source::SourceMetrics::register(&process.registry);
    // On an error the role ends, and its tasks (ingest among them) with it.
    source::start(sources, kube, events.clone(), source_metrics, drain).await?;
    Ok(Pipeline { snapshots, events })
}
