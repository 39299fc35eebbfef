//! Filesystem change notification, coalesced into "something changed" signals.
//!
//! Signals are coalesced: the channel holds at most one pending signal, and the receiver
//! rescans, so a burst of events costs one rescan (editors write, rename and chmod in bursts).

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use notify::event::{ModifyKind, RenameMode};
use notify::{EventKind, RecommendedWatcher, RecursiveMode, Watcher};
use tokio::sync::mpsc;

use super::files::is_temp_file;

/// Keeps the OS watch alive; dropping it stops the notifications.
pub struct FsWatch {
    _watcher: RecommendedWatcher,
}

/// Paths [`Arrivals`] remembers at most between two takes; past that it knows nothing for sure.
const MAX_ARRIVALS: usize = 10_000;

/// How a path changed since the last [`Arrivals::take_renamed`], as the notifications tell it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Arrival {
    /// Renamed into place whole: written elsewhere first (an atomic replace), never half written.
    RenamedIn,
    /// Created, written or changed otherwise in place: it may be half written.
    Written,
}

/// What the notifications said about each path since it was last taken, shared by the watcher's
/// thread (which records) and the reader.
#[derive(Debug, Clone, Default)]
pub struct Arrivals(Arc<Mutex<ArrivalState>>);

#[derive(Debug, Default)]
struct ArrivalState {
    paths: HashMap<PathBuf, Arrival>,
    /// Some notification was lost or named no path (queue overflow, an error): anything may have
    /// happened to any path.
    unknown: bool,
}

impl ArrivalState {
    /// Something changed, and every change was a whole file renamed in.
    fn renames_only(&self) -> bool {
        !self.unknown && !self.paths.is_empty() && self.paths.values().all(|a| *a == Arrival::RenamedIn)
    }
}

impl Arrivals {
    fn lock(&self) -> MutexGuard<'_, ArrivalState> {
        self.0.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn record(&self, event: &notify::Result<notify::Event>) {
        let mut state = self.lock();
        let event = match event {
            Ok(e) if !e.need_rescan() => e,
            _ => {
                state.unknown = true;
                return;
            }
        };
        let renamed_in = match event.kind {
            EventKind::Modify(ModifyKind::Name(RenameMode::To)) => event.paths.first(),
            EventKind::Modify(ModifyKind::Name(RenameMode::Both)) => event.paths.get(1),
            _ => None,
        };
        // A writer's temp file beside the target (written, then renamed over it) is never read
        // as config and says nothing about the target.
        for path in event.paths.iter().filter(|p| !is_temp_file(p)) {
            let arrival = if Some(path) == renamed_in { Arrival::RenamedIn } else { Arrival::Written };
            let slot = state.paths.entry(path.clone()).or_insert(arrival);
            // Written wins: a file written to after it was renamed in may be half written.
            if arrival == Arrival::Written {
                *slot = Arrival::Written;
            }
        }
        if state.paths.len() > MAX_ARRIVALS {
            state.paths.clear();
            state.unknown = true;
        }
    }

    /// Whether something changed and every change since the last take was a whole file renamed
    /// in: then nothing can be half written, and there is no burst to wait out.
    pub fn renames_only(&self) -> bool {
        self.lock().renames_only()
    }

    /// When every change since the last take was a whole file renamed in: those paths (without
    /// forgetting them).
    pub fn renamed_only(&self) -> Option<Vec<PathBuf>> {
        let state = self.lock();
        state.renames_only().then(|| state.paths.keys().cloned().collect())
    }

    /// The paths renamed in whole, and not changed otherwise, since the last take; forgets
    /// everything recorded so far.
    pub fn take_renamed(&self) -> HashSet<PathBuf> {
        let mut state = self.lock();
        let unknown = std::mem::take(&mut state.unknown);
        let paths = std::mem::take(&mut state.paths);
        if unknown {
            return HashSet::new();
        }
        paths.into_iter().filter(|(_, a)| *a == Arrival::RenamedIn).map(|(p, _)| p).collect()
    }
}

/// Watches `path` (recursively for directories) and signals on `tx` after any change.
///
/// The recursive watch follows symlinked directories; notify's walk skips symlink loops.
pub fn watch(path: &Path, tx: mpsc::Sender<()>) -> notify::Result<FsWatch> {
    watch_with(path, RecursiveMode::Recursive, tx, None)
}

/// [`watch`], also recording in `arrivals` how each path changed.
pub fn watch_recording(path: &Path, tx: mpsc::Sender<()>, arrivals: Arrivals) -> notify::Result<FsWatch> {
    watch_with(path, RecursiveMode::Recursive, tx, Some(arrivals))
}

/// Watches only `dir` itself (its entries, not below them) and signals on `tx` after any change:
/// for a single file in a directory that may hold anything else.
pub fn watch_shallow(dir: &Path, tx: mpsc::Sender<()>) -> notify::Result<FsWatch> {
    watch_with(dir, RecursiveMode::NonRecursive, tx, None)
}

fn watch_with(
    path: &Path,
    mode: RecursiveMode,
    tx: mpsc::Sender<()>,
    arrivals: Option<Arrivals>,
) -> notify::Result<FsWatch> {
    let mut watcher = notify::recommended_watcher(move |event: notify::Result<notify::Event>| {
        let relevant = match &event {
            Ok(e) => !matches!(e.kind, notify::EventKind::Access(_)),
            Err(_) => true,
        };
        // A recording watch is not woken by temp files alone: the rename that follows them is the
        // change, and waking early would wait out a settle period for nothing.
        let temp_only = arrivals.is_some()
            && matches!(&event, Ok(e) if !e.paths.is_empty() && e.paths.iter().all(|p| is_temp_file(p)));
        if relevant && !temp_only {
            // Recorded before the signal, so the reader woken by it sees how the path changed.
            if let Some(arrivals) = &arrivals {
                arrivals.record(&event);
            }
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

#[cfg(test)]
mod tests {
    use notify::event::{CreateKind, DataChange};
    use notify::Event;

    use super::*;

    fn event(kind: EventKind, paths: &[&str]) -> notify::Result<Event> {
        Ok(paths.iter().fold(Event::new(kind), |e, p| e.add_path(PathBuf::from(p))))
    }

    #[test]
    fn only_paths_renamed_in_and_not_written_after_count_as_whole() {
        let arrivals = Arrivals::default();
        assert!(!arrivals.renames_only(), "nothing happened");
        arrivals.record(&event(EventKind::Modify(ModifyKind::Name(RenameMode::To)), &["/c/a.yaml"]));
        arrivals.record(&event(EventKind::Modify(ModifyKind::Name(RenameMode::Both)), &["/c/.b.tmp", "/c/b.yaml"]));
        assert!(arrivals.renames_only(), "a hidden temp file renamed over its target is not config");
        arrivals.record(&event(EventKind::Modify(ModifyKind::Name(RenameMode::Both)), &["/c/d.yaml", "/c/e.yaml"]));
        assert!(!arrivals.renames_only(), "the renamed-away config file counts as written");
        arrivals.record(&event(EventKind::Modify(ModifyKind::Name(RenameMode::Both)), &["/c/..data_tmp", "/c/..data"]));
        assert!(arrivals.lock().paths.contains_key(Path::new("/c/..data_tmp")), "a ConfigMap's swap is a change");
        let whole = arrivals.take_renamed();
        assert_eq!(whole, HashSet::from(["/c/a.yaml", "/c/b.yaml", "/c/e.yaml", "/c/..data"].map(PathBuf::from)));
        assert!(arrivals.take_renamed().is_empty(), "taken");

        arrivals.record(&event(EventKind::Modify(ModifyKind::Name(RenameMode::To)), &["/c/a.yaml"]));
        assert!(arrivals.renames_only());
        arrivals.record(&event(EventKind::Modify(ModifyKind::Data(DataChange::Any)), &["/c/a.yaml"]));
        arrivals.record(&event(EventKind::Modify(ModifyKind::Name(RenameMode::To)), &["/c/a.yaml"]));
        assert!(!arrivals.renames_only(), "written after the rename: maybe half written");
        assert!(arrivals.take_renamed().is_empty());

        arrivals.record(&event(EventKind::Create(CreateKind::File), &["/c/new.yaml"]));
        assert!(arrivals.take_renamed().is_empty(), "created in place");
        arrivals.record(&event(EventKind::Modify(ModifyKind::Name(RenameMode::To)), &["/c/a.yaml"]));
        arrivals.record(&Err(notify::Error::generic("queue overflow")));
        assert!(!arrivals.renames_only());
        assert!(arrivals.take_renamed().is_empty(), "a lost notification may have been a write");
    }
}
