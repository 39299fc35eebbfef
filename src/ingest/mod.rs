//! Ingest: source events → debounce → snapshot build → publish.

mod builder;
mod debounce;
pub mod node;
pub mod sources;

use std::sync::Arc;

use tokio::sync::mpsc;
use tracing::{info, warn, Instrument};

pub use builder::SnapshotBuilder;
pub use debounce::{next_batch, DebounceSettings};

use crate::config::{ConfigError, ConfigKey, ValidConfig};
use crate::mesh::MeshConfig;
use crate::snapshot::{IgnoredObject, SnapshotWriter, Version};
use crate::telemetry::{metrics, trace};

/// Capacity of the source → ingest channel; sources wait (back-pressure) when ingest is behind.
pub const EVENT_QUEUE: usize = 1024;

/// A change reported by a source.
#[derive(Debug, Clone)]
pub enum IngestEvent {
    /// Config objects changed: `Some` is the new valid version, `None` a deletion.
    Config(Vec<(ConfigKey, Option<ValidConfig>)>),
    /// The current list of rejected and ignored documents of the config source.
    Status {
        /// Rejected documents.
        errors: Arc<Vec<ConfigError>>,
        /// Other kinds.
        ignored: Arc<Vec<IgnoredObject>>,
    },
    /// The mesh config changed.
    Mesh(Arc<MeshConfig>),
    /// The config source has delivered its initial state; snapshots may be published.
    Synced,
    /// A new leader term: the next snapshot starts it (version `(term, 1)`, a full snapshot).
    Term(u64),
    /// The trace of the source event sent right after it: the snapshot it leads to joins its trace.
    Cause(trace::EventTrace),
}

impl IngestEvent {
    /// How many of Istio's `pilot_inbound_updates{type="config"}` this event stands for (one per object).
    fn config_updates(&self) -> usize {
        match self {
            IngestEvent::Config(objects) => objects.len(),
            IngestEvent::Mesh(_) => 1,
            IngestEvent::Status { .. } | IngestEvent::Synced | IngestEvent::Term(_) | IngestEvent::Cause(_) => 0,
        }
    }
}

/// Runs the ingest loop: debounces events, builds snapshots and publishes them, starting in
/// `term`; an [`IngestEvent::Term`] starts a new term with a full snapshot. Nothing is published
/// before the config source reports `Synced` (the readiness gate).
pub async fn run(
    mut events: mpsc::Receiver<IngestEvent>,
    writer: SnapshotWriter,
    term: u64,
    debounce: DebounceSettings,
) {
    let mut builder = SnapshotBuilder::default();
    let mut synced = false;
    let mut version = Version::new(term, 0);
    let mut causes = Vec::new();
    // Term changes arrive as events so they are debounced and ordered with everything else.
    while let Some(batch) = next_batch(&mut events, debounce).await {
        let batch_closed = std::time::SystemTime::now();
        causes.extend(batch.iter().filter_map(|e| if let IngestEvent::Cause(c) = e { Some(c.clone()) } else { None }));
        metrics::inbound_config_updates(batch.iter().map(IngestEvent::config_updates).sum());
        synced |= batch.iter().any(|e| matches!(e, IngestEvent::Synced));
        let new_term = batch.iter().filter_map(|e| if let IngestEvent::Term(t) = e { Some(*t) } else { None }).max();
        let mut changes = builder.apply(batch);
        if let Some(t) = new_term.filter(|t| *t > version.term) {
            version = Version::new(t, 0);
            changes.full = true;
        }
        if !synced {
            continue;
        }
        version = version.next();
        let span = trace::snapshot_build(version, &std::mem::take(&mut causes), batch_closed);
        let started = std::time::Instant::now();
        let snapshot = span.in_scope(|| builder.build(version, changes));
        metrics::snapshot_built(&snapshot, started.elapsed());
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
    }
}
