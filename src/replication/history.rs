//! The leader's recent past: its latest snapshot and the deltas of the current term leading to it.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};

use tokio::sync::OnceCell;
use tonic::Status;

use super::metrics::{ReplicationMetrics, SNAPSHOT_DELTA, SNAPSHOT_FULL};
use crate::replication::wire::proto::UpdateKind;
use crate::replication::wire::{encode_delta, encode_full, Delta, EncodedUpdate, WireError};
use crate::snapshot::{Snapshot, Version};

/// A published snapshot and, once some subscriber needed them, its full encoding and the
/// coalesced deltas leading to it (by base version), each encoded once and shared by every
/// subscriber: subscribers hold references to one encoding, never copies of their own.
#[derive(Debug)]
pub(super) struct Published {
    snapshot: Arc<Snapshot>,
    full: OnceCell<Arc<EncodedUpdate>>,
    catch_up: Mutex<HashMap<Version, Arc<OnceCell<Arc<EncodedUpdate>>>>>,
}

impl Published {
    fn new(snapshot: Arc<Snapshot>) -> Published {
        Published { snapshot, full: OnceCell::new(), catch_up: Mutex::default() }
    }

    /// The cell of the coalesced delta from `base` to this snapshot (at most one per delta of
    /// the history, so bounded by its capacity).
    fn catch_up(&self, base: Version) -> Arc<OnceCell<Arc<EncodedUpdate>>> {
        let mut cells = self.catch_up.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        cells.entry(base).or_default().clone()
    }
}

/// One delta of the history and, once some subscriber needed it, its encoding (shared by all).
#[derive(Debug)]
pub(super) struct Step {
    delta: Delta,
    encoded: OnceCell<Arc<EncodedUpdate>>,
}

/// An immutable view of the history; the server swaps in a new one for every snapshot.
#[derive(Debug, Clone)]
pub(super) struct History {
    latest: Option<Arc<Published>>,
    steps: VecDeque<Arc<Step>>,
    capacity: usize,
}

/// What brings a subscriber from the version it holds to the latest.
#[derive(Debug)]
pub(super) enum Plan {
    /// The whole state.
    Full(Arc<Published>),
    /// The deltas since the held version, oldest first (never empty), to the latest snapshot.
    Deltas(Arc<Published>, Vec<Arc<Step>>),
}

impl History {
    /// An empty history keeping at most `capacity` deltas.
    pub(super) fn new(capacity: usize) -> Self {
        History { latest: None, steps: VecDeque::new(), capacity }
    }

    /// The history after `snapshot` was published. Deltas never cross a term: a new term starts
    /// an empty history.
    pub(super) fn push(&self, snapshot: Arc<Snapshot>) -> History {
        let mut steps = self.steps.clone();
        match &self.latest {
            Some(prev) if prev.snapshot.version >= snapshot.version => return self.clone(),
            Some(prev) if prev.snapshot.version.term == snapshot.version.term && self.capacity > 0 => {
                let delta = Delta::between(&prev.snapshot, &snapshot);
                steps.push_back(Arc::new(Step { delta, encoded: OnceCell::new() }));
                while steps.len() > self.capacity {
                    steps.pop_front();
                }
            }
            _ => steps.clear(),
        }
        let latest = Some(Arc::new(Published::new(snapshot)));
        History { latest, steps, capacity: self.capacity }
    }

    /// The latest version, if anything was published.
    pub(super) fn latest_version(&self) -> Option<Version> {
        self.latest.as_ref().map(|p| p.snapshot.version)
    }

    /// What a subscriber holding `held` needs; `None` when it is up to date or nothing was published.
    pub(super) fn plan(&self, held: Option<Version>) -> Option<Plan> {
        let latest = self.latest.as_ref()?;
        let current = latest.snapshot.version;
        let Some(held) = held else { return Some(Plan::Full(latest.clone())) };
        if held == current {
            return None;
        }
        if held.term == current.term && held < current {
            if let Some(start) = self.steps.iter().position(|s| s.delta.base == held) {
                return Some(Plan::Deltas(latest.clone(), self.steps.range(start..).cloned().collect()));
            }
        }
        Some(Plan::Full(latest.clone()))
    }
}

impl Plan {
    /// Encodes the update off the async threads; a single delta or a full snapshot is encoded once
    /// and shared by every subscriber that needs it.
    pub(super) async fn encode(self, metrics: &ReplicationMetrics) -> Result<Arc<EncodedUpdate>, Status> {
        let metrics = metrics.clone();
        match self {
            Plan::Full(published) => {
                let snapshot = published.snapshot.clone();
                published.full.get_or_try_init(|| blocking(move || full_update(&snapshot, &metrics))).await.cloned()
            }
            Plan::Deltas(_, steps) if steps.len() == 1 => {
                let step = steps[0].clone();
                let delta = step.delta.clone();
                step.encoded.get_or_try_init(|| blocking(move || delta_update(&delta, &metrics))).await.cloned()
            }
            Plan::Deltas(latest, steps) => {
                let Some(base) = steps.first().map(|s| s.delta.base) else {
                    return Err(Status::internal("empty delta plan"));
                };
                let cell = latest.catch_up(base);
                let coalesce = move || {
                    let mut iter = steps.iter();
                    let first = iter.next().map(|s| s.delta.clone());
                    let coalesced = iter.fold(first, |acc, s| acc.map(|d| d.then(&s.delta)));
                    match coalesced {
                        Some(delta) => delta_update(&delta, &metrics),
                        None => Err(Status::internal("empty delta plan")),
                    }
                };
                cell.get_or_try_init(|| blocking(coalesce)).await.cloned()
            }
        }
    }
}

fn full_update(snapshot: &Snapshot, metrics: &ReplicationMetrics) -> Result<Arc<EncodedUpdate>, Status> {
    let payload = encode_full(snapshot).map_err(internal)?;
    metrics.snapshot_encoded(SNAPSHOT_FULL, payload.len());
    Ok(Arc::new(EncodedUpdate { kind: UpdateKind::Full, version: snapshot.version, base: None, payload }))
}

fn delta_update(delta: &Delta, metrics: &ReplicationMetrics) -> Result<Arc<EncodedUpdate>, Status> {
    let payload = encode_delta(delta).map_err(internal)?;
    metrics.snapshot_encoded(SNAPSHOT_DELTA, payload.len());
    Ok(Arc::new(EncodedUpdate { kind: UpdateKind::Delta, version: delta.version, base: Some(delta.base), payload }))
}

fn internal(e: WireError) -> Status {
    Status::internal(e.to_string())
}

/// Runs CPU-heavy encoding on the blocking pool.
async fn blocking<F>(f: F) -> Result<Arc<EncodedUpdate>, Status>
where
    F: FnOnce() -> Result<Arc<EncodedUpdate>, Status> + Send + 'static,
{
    tokio::task::spawn_blocking(f).await.map_err(|e| Status::internal(format!("encoding task failed: {e}")))?
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::snapshot::{ChangeSet, SourceState};

    fn snap(term: u64, seq: u64) -> Arc<Snapshot> {
        Arc::new(Snapshot::build(Version::new(term, seq), ChangeSet::default(), &SourceState::default()))
    }

    fn plan_kind(h: &History, held: Option<Version>) -> Option<(bool, usize)> {
        h.plan(held).map(|p| match p {
            Plan::Full(_) => (true, 0),
            Plan::Deltas(_, d) => (false, d.len()),
        })
    }

    #[test]
    fn plans_deltas_within_history_and_full_otherwise() {
        let mut h = History::new(3);
        assert!(h.plan(None).is_none());
        for seq in 1..=5 {
            h = h.push(snap(1, seq));
        }
        assert_eq!(h.latest_version(), Some(Version::new(1, 5)));
        assert_eq!(plan_kind(&h, Some(Version::new(1, 5))), None);
        assert_eq!(plan_kind(&h, Some(Version::new(1, 4))), Some((false, 1)));
        assert_eq!(plan_kind(&h, Some(Version::new(1, 2))), Some((false, 3)));
        // Gone from the history (capacity 3), or never seen: a full snapshot.
        assert_eq!(plan_kind(&h, Some(Version::new(1, 1))), Some((true, 0)));
        assert_eq!(plan_kind(&h, None), Some((true, 0)));
        assert_eq!(plan_kind(&h, Some(Version::new(0, 9))), Some((true, 0)));

        // A new term starts over: no delta from the old term.
        h = h.push(snap(2, 1));
        assert_eq!(plan_kind(&h, Some(Version::new(1, 5))), Some((true, 0)));
        h = h.push(snap(2, 2));
        assert_eq!(plan_kind(&h, Some(Version::new(2, 1))), Some((false, 1)));
    }

    #[tokio::test]
    async fn coalesced_plans_encode_one_delta() {
        let mut h = History::new(8);
        for seq in 1..=4 {
            h = h.push(snap(1, seq));
        }
        let update = h.plan(Some(Version::new(1, 1))).unwrap().encode(&ReplicationMetrics::default()).await.unwrap();
        assert_eq!(
            (update.kind, update.base, update.version),
            (UpdateKind::Delta, Some(Version::new(1, 1)), Version::new(1, 4))
        );
        // A second subscriber as far behind shares the same encoding.
        let again = h.plan(Some(Version::new(1, 1))).unwrap().encode(&ReplicationMetrics::default()).await.unwrap();
        assert!(Arc::ptr_eq(&update, &again));
    }
}
