//! Snapshot distribution: one writer (ingest), many readers (frontends).

use std::sync::Arc;

use tokio::sync::watch;

use super::{Snapshot, Version};

/// The only handle that can publish snapshots. Not `Clone`: one writer per channel.
#[derive(Debug)]
pub struct SnapshotWriter {
    tx: watch::Sender<Option<Arc<Snapshot>>>,
}

/// A read handle; cheap to clone, sees the latest snapshot.
#[derive(Debug, Clone)]
pub struct SnapshotReader {
    rx: watch::Receiver<Option<Arc<Snapshot>>>,
}

/// A snapshot older than (or as old as) the one already published.
#[derive(Debug, thiserror::Error)]
#[error("snapshot {offered} is not newer than the published {current}")]
pub struct StaleSnapshot {
    /// The rejected version.
    pub offered: Version,
    /// The version already held.
    pub current: Version,
}

/// Creates a snapshot channel; readers see nothing until the first publish.
pub fn channel() -> (SnapshotWriter, SnapshotReader) {
    let (tx, rx) = watch::channel(None);
    (SnapshotWriter { tx }, SnapshotReader { rx })
}

impl SnapshotWriter {
    /// Publishes a snapshot; versions must only grow.
    pub fn publish(&self, snapshot: Arc<Snapshot>) -> Result<(), StaleSnapshot> {
        if let Some(current) = self.tx.borrow().as_ref().map(|s| s.version) {
            if snapshot.version <= current {
                return Err(StaleSnapshot { offered: snapshot.version, current });
            }
        }
        self.tx.send_replace(Some(snapshot));
        Ok(())
    }

    /// A new reader.
    pub fn reader(&self) -> SnapshotReader {
        SnapshotReader { rx: self.tx.subscribe() }
    }

    /// The latest published snapshot.
    pub fn current(&self) -> Option<Arc<Snapshot>> {
        self.tx.borrow().clone()
    }
}

impl SnapshotReader {
    /// The latest snapshot, if any was published.
    pub fn current(&self) -> Option<Arc<Snapshot>> {
        self.rx.borrow().clone()
    }

    /// Waits for a snapshot newer than the one last seen by this reader; `None` when the writer is gone.
    pub async fn next(&mut self) -> Option<Arc<Snapshot>> {
        loop {
            self.rx.changed().await.ok()?;
            if let Some(s) = self.rx.borrow_and_update().clone() {
                return Some(s);
            }
        }
    }

    /// Waits until a first snapshot exists (the readiness gate) and returns it.
    pub async fn first(&mut self) -> Option<Arc<Snapshot>> {
        if let Some(s) = self.rx.borrow_and_update().clone() {
            return Some(s);
        }
        self.next().await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::snapshot::{ChangeSet, SourceState};

    fn snap(term: u64, seq: u64) -> Arc<Snapshot> {
        Arc::new(Snapshot::build(Version::new(term, seq), ChangeSet::full(), &SourceState::default()))
    }

    #[tokio::test]
    async fn readers_wait_for_first_and_versions_only_grow() {
        let (w, mut r) = channel();
        assert!(r.current().is_none());
        w.publish(snap(1, 1)).unwrap();
        assert_eq!(r.first().await.unwrap().version, Version::new(1, 1));
        assert!(w.publish(snap(1, 1)).is_err());
        assert!(w.publish(snap(0, 9)).is_err());
        w.publish(snap(2, 1)).unwrap();
        assert_eq!(r.next().await.unwrap().version, Version::new(2, 1));
    }
}
