//! Ingest: source events → debounce → snapshot build → publish.
//!
//! One task owns the sources' state and the snapshot writer (the one writer of the snapshot
//! channel). Builds run on the blocking pool, so parsing-sized work never holds an async worker.

mod builder;
mod debounce;
pub mod metrics;

use std::collections::BTreeSet;

use tokio::sync::mpsc;
use tracing::{info, warn, Instrument};

pub use builder::IngestBuilder;
pub use debounce::{DebounceSettings, Debouncer};
pub use metrics::IngestMetrics;

use crate::drain::DrainWatcher;
use crate::readiness::BlockReady;
use crate::snapshot::{SnapshotWriter, Version};
use crate::source::{SourceEvent, SourceId};
use crate::telemetry::process::ProcessMetrics;
use crate::telemetry::trace;

/// Capacity of the source → ingest channel; sources wait (back-pressure) when ingest is behind.
pub const EVENT_QUEUE: usize = 1024;

/// What reaches the ingest loop: source events, and new leader terms from the election.
#[derive(Debug, Clone)]
pub enum IngestEvent {
    /// A source reported something.
    Source(SourceEvent),
    /// A new leader term: the next snapshot starts it (version `(term, 1)`, a full snapshot).
    Term(u64),
}

impl IngestEvent {
    /// Whether a source sends this just before the change it goes with (a trace, a status), so
    /// a leading-edge batch waits for that change rather than leaving it to the next batch.
    pub fn announces_more(&self) -> bool {
        matches!(self, IngestEvent::Source(SourceEvent::Cause(_) | SourceEvent::Status { .. }))
    }
}

impl From<SourceEvent> for IngestEvent {
    fn from(event: SourceEvent) -> Self {
        IngestEvent::Source(event)
    }
}

/// How the ingest loop starts.
pub struct IngestSettings {
    /// The term of the first snapshot (0 on a standby until it leads).
    pub term: u64,
    /// Debounce timing.
    pub debounce: DebounceSettings,
    /// Sources whose initial state must be in before the first snapshot is published.
    pub sources: Vec<SourceId>,
    /// Released when the first snapshot is published.
    pub ready: BlockReady,
}

/// Runs the ingest loop until the drain starts or every sender is gone: debounces events,
/// builds snapshots and publishes them. Nothing is published before every source in
/// `settings.sources` has reported `InitDone` (the readiness gate).
pub async fn run(
    mut events: mpsc::Receiver<IngestEvent>,
    writer: SnapshotWriter,
    settings: IngestSettings,
    metrics: IngestMetrics,
    process: ProcessMetrics,
    drain: DrainWatcher,
) {
    let mut builder = Some(IngestBuilder::default());
    let mut pending: BTreeSet<SourceId> = settings.sources.into_iter().collect();
    let mut ready = Some(settings.ready);
    let mut version = Version::new(settings.term, 0);
    let mut causes = Vec::new();
    let mut debouncer = Debouncer::new(settings.debounce);
    loop {
        let batch = tokio::select! {
            batch = debouncer.next_batch(&mut events, IngestEvent::announces_more) => match batch {
                Some(batch) => batch,
                None => return,
            },
            _ = drain.draining() => return,
        };
        let batch_closed = std::time::SystemTime::now();
        let mut new_term = None;
        let mut source_events = Vec::with_capacity(batch.len());
        for event in batch {
            match event {
                IngestEvent::Term(t) => new_term = new_term.max(Some(t)),
                IngestEvent::Source(SourceEvent::Cause(c)) => causes.push(c),
                IngestEvent::Source(SourceEvent::InitDone(id)) => {
                    pending.remove(&id);
                }
                IngestEvent::Source(e) => source_events.push(e),
            }
        }
        metrics.inbound_config_updates(source_events.iter().map(SourceEvent::config_updates).sum());
        let Some(mut b) = builder.take() else { return };
        let mut changes = b.apply(source_events);
        if let Some(t) = new_term.filter(|t| *t > version.term) {
            version = Version::new(t, 0);
            changes.full = true;
        }
        if !pending.is_empty() {
            builder = Some(b);
            continue;
        }
        version = version.next();
        let span = trace::snapshot_build(version, &std::mem::take(&mut causes), batch_closed);
        let started = std::time::Instant::now();
        let build_span = span.clone();
        // The builder travels to the blocking pool and back: one owner, no lock.
        let built = tokio::task::spawn_blocking(move || {
            let snapshot = build_span.in_scope(|| b.build(version, changes));
            (b, snapshot)
        })
        .await;
        let snapshot = match built {
            Ok((b, snapshot)) => {
                builder = Some(b);
                snapshot
            }
            Err(e) => {
                // A panic in a build is a bug; the state went with it, so stop rather than serve a guess.
                tracing::error!(error = %e, %version, "snapshot build failed; ingest stops");
                return;
            }
        };
        metrics.snapshot_built(&snapshot, started.elapsed());
        process.set_snapshot_version(snapshot.version.term, snapshot.version.seq);
        trace::register_snapshot(version, &span);
        async {
            info!(
                version = %snapshot.version,
                full = snapshot.changes.full,
                changed = snapshot.changes.keys.len(),
                services = snapshot.registry.services.len(),
                configs = snapshot.configs.len(),
                errors = snapshot.errors.len(),
                "snapshot built"
            );
            if let Err(e) = writer.publish(snapshot) {
                warn!(error = %e, "snapshot not published");
            }
        }
        .instrument(span)
        .await;
        // The first snapshot is out: this process can serve.
        ready.take();
    }
}
