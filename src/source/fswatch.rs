//! Filesystem change notification, coalesced into "something changed" signals.
//!
//! Signals are coalesced: the channel holds at most one pending signal, and the receiver
//! rescans, so a burst of events costs one rescan (editors write, rename and chmod in bursts).

use std::path::Path;
use std::time::Duration;

use notify::{RecommendedWatcher, RecursiveMode, Watcher};
use tokio::sync::mpsc;

/// Keeps the OS watch alive; dropping it stops the notifications.
pub struct FsWatch {
    _watcher: RecommendedWatcher,
}

/// Watches `path` (recursively for directories) and signals on `tx` after any change.
///
/// The recursive watch follows symlinked directories; notify's walk skips symlink loops.
pub fn watch(path: &Path, tx: mpsc::Sender<()>) -> notify::Result<FsWatch> {
    watch_with(path, RecursiveMode::Recursive, tx)
}

/// Watches only `dir` itself (its entries, not below them) and signals on `tx` after any change:
/// for a single file in a directory that may hold anything else.
pub fn watch_shallow(dir: &Path, tx: mpsc::Sender<()>) -> notify::Result<FsWatch> {
    watch_with(dir, RecursiveMode::NonRecursive, tx)
}

fn watch_with(path: &Path, mode: RecursiveMode, tx: mpsc::Sender<()>) -> notify::Result<FsWatch> {
    let mut watcher = notify::recommended_watcher(move |event: notify::Result<notify::Event>| {
        let relevant = match &event {
            Ok(e) => !matches!(e.kind, notify::EventKind::Access(_)),
            Err(_) => true,
        };
        if relevant {
            // Full channel means a rescan is already pending: dropping the signal is the coalescing.
            let _ = tx.try_send(());
        }
    })?;
    watcher.watch(path, mode)?;
    Ok(FsWatch { _watcher: watcher })
}

/// Waits until `rx` got no signal for `quiet` (at most `max`): after the first signal of a burst,
/// one read once the burst is over is enough.
pub async fn quiet(rx: &mut mpsc::Receiver<()>, quiet: Duration, max: Duration) {
    let deadline = tokio::time::Instant::now() + max;
    loop {
        let until = (tokio::time::Instant::now() + quiet).min(deadline);
        match tokio::time::timeout_at(until, rx.recv()).await {
            Ok(Some(())) if tokio::time::Instant::now() < deadline => {}
            _ => return,
        }
    }
}
