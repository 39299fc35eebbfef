//! The last snapshots a process held, newest last: what `meshpilot config diff` compares. Bounded,
//! because each snapshot is a whole mesh; snapshots published faster than they are followed are
//! skipped, as a proxy skips them.

use std::collections::VecDeque;
use std::sync::Arc;

use arc_swap::ArcSwap;

use super::{Snapshot, SnapshotReader, Version};

/// Snapshots kept by default.
pub const DEFAULT_DEPTH: usize = 8;

/// A bounded history of snapshots: one follower task writes, any number of readers read.
#[derive(Clone)]
pub struct SnapshotHistory {
    kept: Arc<ArcSwap<VecDeque<Arc<Snapshot>>>>,
}

impl SnapshotHistory {
    /// An empty history; [`SnapshotHistory::follow`] fills it.
    pub fn new() -> Self {
        SnapshotHistory { kept: Arc::new(ArcSwap::from_pointee(VecDeque::new())) }
    }

    /// Records every snapshot `reader` sees, keeping the last `depth`, until its writer is gone.
    pub async fn follow(self, mut reader: SnapshotReader, depth: usize) {
        let Some(first) = reader.first().await else { return };
        self.record(first, depth);
        while let Some(next) = reader.next().await {
            self.record(next, depth);
        }
    }

    fn record(&self, snapshot: Arc<Snapshot>, depth: usize) {
        let mut kept = VecDeque::clone(&self.kept.load());
        if kept.back().is_some_and(|last| last.version == snapshot.version) {
            return;
        }
        kept.push_back(snapshot);
        while kept.len() > depth.max(1) {
            kept.pop_front();
        }
        self.kept.store(Arc::new(kept));
    }

    /// The versions held, oldest first.
    pub fn versions(&self) -> Vec<Version> {
        self.kept.load().iter().map(|s| s.version).collect()
    }

    /// The snapshot of `version`, if still held.
    pub fn get(&self, version: Version) -> Option<Arc<Snapshot>> {
        self.kept.load().iter().find(|s| s.version == version).cloned()
    }

    /// The newest snapshot and the one before it, if two are held.
    pub fn last_two(&self) -> Option<(Arc<Snapshot>, Arc<Snapshot>)> {
        let kept = self.kept.load();
        let n = kept.len();
        (n >= 2).then(|| (kept[n - 2].clone(), kept[n - 1].clone()))
    }
}

impl Default for SnapshotHistory {
    fn default() -> Self {
        SnapshotHistory::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::snapshot::{channel, ChangeSet, SourceState};

    fn snap(seq: u64) -> Arc<Snapshot> {
        Arc::new(Snapshot::build(Version::new(1, seq), ChangeSet::full(), &SourceState::default()))
    }

    #[tokio::test]
    async fn keeps_the_last_snapshots_it_saw() {
        let (writer, reader) = channel();
        let history = SnapshotHistory::new();
        let task = tokio::spawn(history.clone().follow(reader, 3));
        for seq in 1..=5 {
            writer.publish(snap(seq)).expect("newer");
            // Let the follower see each one (a watch keeps only the latest).
            tokio::task::yield_now().await;
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
        drop(writer);
        task.await.expect("the follower ends with the writer");
        assert_eq!(history.versions(), [Version::new(1, 3), Version::new(1, 4), Version::new(1, 5)]);
        assert!(history.get(Version::new(1, 2)).is_none());
        let (before, after) = history.last_two().expect("two held");
        assert_eq!((before.version, after.version), (Version::new(1, 4), Version::new(1, 5)));
    }
}
