//! Filesystem change notification, coalesced into "something changed" signals.

use std::path::Path;

use notify::{RecommendedWatcher, RecursiveMode, Watcher};
use tokio::sync::mpsc;

/// Keeps the OS watch alive; dropping it stops the notifications.
pub struct FsWatch {
    _watcher: RecommendedWatcher,
}

/// Watches `path` (recursively for directories) and signals on `tx` after any change.
///
/// Signals are coalesced: the channel holds at most one pending signal, and the receiver
/// rescans, so a burst of events costs one rescan (editors write, rename and chmod in bursts).
pub fn watch(path: &Path, tx: mpsc::Sender<()>) -> notify::Result<FsWatch> {
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
    watcher.watch(path, RecursiveMode::Recursive)?;
    Ok(FsWatch { _watcher: watcher })
}
