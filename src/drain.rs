//! Graceful shutdown, after ztunnel's `drain.rs`: one [`DrainTrigger`] starts the drain, every
//! task holds a [`DrainWatcher`], and the trigger waits until all watchers (and the
//! [`DrainBlocker`]s they turned into) are gone.
//!
//! A task that must finish work on shutdown (an xDS stream telling its proxy to go elsewhere, an
//! ingest node resigning its lease) turns its watcher into a blocker with
//! [`DrainWatcher::signaled`] and drops it when done; a task with nothing to finish just drops its
//! watcher when the drain starts.

use std::convert::Infallible;

use tokio::sync::{mpsc, watch};

/// Starts a drain and waits for it. Not `Clone`: one owner decides when the process stops.
#[derive(Debug)]
pub struct DrainTrigger {
    signal: watch::Sender<bool>,
    released: mpsc::Receiver<Infallible>,
}

/// Held by every task that must be waited for. Cheap to clone.
#[derive(Debug, Clone)]
pub struct DrainWatcher {
    signal: watch::Receiver<bool>,
    _hold: mpsc::Sender<Infallible>,
}

/// Keeps the drain from completing until dropped.
#[derive(Debug)]
#[must_use = "the drain completes as soon as the blocker is dropped"]
pub struct DrainBlocker {
    _hold: mpsc::Sender<Infallible>,
}

/// A new trigger and the first watcher.
pub fn new() -> (DrainTrigger, DrainWatcher) {
    let (signal_tx, signal_rx) = watch::channel(false);
    let (hold_tx, hold_rx) = mpsc::channel(1);
    (DrainTrigger { signal: signal_tx, released: hold_rx }, DrainWatcher { signal: signal_rx, _hold: hold_tx })
}

impl DrainTrigger {
    /// Signals every watcher and waits until all watchers and blockers are dropped.
    pub async fn start_drain_and_wait(mut self) {
        self.signal.send_replace(true);
        // `recv` returns `None` once every sender (held by watchers and blockers) is gone.
        let _ = self.released.recv().await;
    }
}

impl DrainWatcher {
    /// Resolves when the drain starts, turning this watcher into a blocker to drop when done.
    pub async fn signaled(mut self) -> DrainBlocker {
        // A dropped trigger means nobody will ever wait: treat it as a drain too.
        let _ = self.signal.wait_for(|draining| *draining).await;
        DrainBlocker { _hold: self._hold }
    }

    /// Whether the drain has started.
    pub fn is_draining(&self) -> bool {
        *self.signal.borrow()
    }

    /// Resolves when the drain starts, without giving up the watcher (for `select!` loops).
    pub async fn draining(&self) {
        let mut signal = self.signal.clone();
        let _ = signal.wait_for(|draining| *draining).await;
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[tokio::test]
    async fn trigger_waits_for_every_watcher_and_blocker() {
        let (trigger, watcher) = new();
        let (done_tx, mut done_rx) = mpsc::unbounded_channel();
        let plain = watcher.clone();
        let t1 = done_tx.clone();
        tokio::spawn(async move {
            plain.draining().await;
            drop(plain);
            let _ = t1.send("plain");
        });
        tokio::spawn(async move {
            let blocker = watcher.signaled().await;
            tokio::time::sleep(Duration::from_millis(100)).await;
            let _ = done_tx.send("blocker");
            drop(blocker);
        });
        trigger.start_drain_and_wait().await;
        let mut finished = vec![done_rx.recv().await.unwrap(), done_rx.recv().await.unwrap()];
        finished.sort();
        assert_eq!(finished, ["blocker", "plain"]);
    }

    #[tokio::test]
    async fn no_watchers_left_completes_at_once() {
        let (trigger, watcher) = new();
        drop(watcher);
        tokio::time::timeout(Duration::from_secs(1), trigger.start_drain_and_wait()).await.unwrap();
    }
}
