//! The config directory source: each change of the files becomes keyed config events.
//!
//! Per key the last valid version is kept, whatever happens to the files:
//! - an invalid edit of an object is reported and the previous version keeps being served; a
//!   file that no longer parses at all keeps its previous objects;
//! - a changed file is used only once two reads [`SETTLE_INTERVAL`] apart agree, so a write in
//!   place (`cat new > file`: truncate, then write) is never seen half done; a file renamed into
//!   place (written elsewhere first, the atomic way) cannot be half done and is used at its first
//!   read, without waiting for a quiet period either; a file whose `stat` stamp is unchanged (and
//!   not racily recent, see [`STAMP_MARGIN`]) is not read again; a file that had
//!   objects and disappears must stay gone for a few reads (about 250 ms) before its objects are
//!   deleted;
//! - a file that had objects and turns blank (zero length, or only whitespace, comments and
//!   `---`) keeps serving every one of them until it is removed or written with content: an
//!   in-place writer (`cmd > file`) leaves the file blank for as long as the command takes, and
//!   policies must not vanish meanwhile (a DENY AuthorizationPolicy would fail open). Content
//!   that leaves an object out deletes it (an edit); `[]` or an empty List deletes them all;
//! - a file or directory that cannot be read keeps what it contributed and is reported (a config
//!   error with its path, in `/debug/configz`, and `meshpilot_config_source_errors`);
//! - the directory itself vanishing is an outage, not a deletion: everything stays served, it is
//!   reported, and it is polled fast and watched again once it is back;
//! - an object defined in several places is served from the first file in path order (the first
//!   document within a file); every other definition is reported naming both places.
//!
//! None of these problems makes `/ready` fail: one bad file must not take the mesh out of
//! service. They are visible in `/debug/configz` and the metrics instead.

mod state;

pub use state::{DirState, Rescan};

use std::path::PathBuf;
use std::time::Duration;

use tokio::sync::mpsc;
use tracing::{info, warn};

use super::files::SETTLE_INTERVAL;
#[cfg(doc)]
use super::files::STAMP_MARGIN;
use super::fswatch::Arrivals;
use super::metrics::SourceMetrics;
use super::{fswatch, SourceEvent, SourceId};
use crate::drain::DrainWatcher;

/// How often the directory is rescanned without a notification (they can be lost, e.g. on some
/// network filesystems).
const POLL_INTERVAL: Duration = Duration::from_secs(10);

/// How often the directory is rescanned while it is missing, a file keeps changing, or it is not
/// watched: the OS watch died with the directory, so polling is all there is until it is back.
const FAST_POLL_INTERVAL: Duration = Duration::from_millis(250);

/// Longest wait for a burst of notifications to end before rescanning (editors and `cp -r` write
/// in bursts; one scan after the burst is enough).
const QUIET_MAX: Duration = Duration::from_millis(500);

/// Scans `root` once, sends its state and `InitDone`, then watches it in a task that ends with
/// the drain. Reading and parsing run on the blocking pool, off the async workers.
pub async fn watch<E>(
    root: PathBuf,
    events: mpsc::Sender<E>,
    metrics: SourceMetrics,
    drain: DrainWatcher,
) -> std::io::Result<()>
where
    E: From<SourceEvent> + Send + 'static,
{
    if !root.is_dir() {
        return Err(std::io::Error::new(
            std::io::ErrorKind::NotFound,
            format!("config directory {} does not exist", root.display()),
        ));
    }
    // The sender stays here too, so the channel never closes and a new watch can be made.
    let (tx, mut rx) = mpsc::channel(1);
    let arrivals = Arrivals::default();
    let mut watch = Some(fswatch::watch_recording(&root, tx.clone(), arrivals.clone()).map_err(std::io::Error::other)?);
    let (state, first) = rescan_blocking(DirState::default(), root.clone(), arrivals.clone()).await;
    info!(dir = %root.display(), objects = state.merged.len(), errors = state.errors.len(), "config directory loaded");
    let mut watched = first.root;
    let mut poll = poll_interval(&first, watch.is_some());
    metrics.set_problems(SourceId::ConfigDir, &state.problem_counts());
    send(&events, first, &state).await;
    let _ = events.send(SourceEvent::InitDone(SourceId::ConfigDir).into()).await;
    tokio::spawn(async move {
        let mut state = state;
        loop {
            tokio::select! {
                _ = drain.draining() => return,
                _ = tokio::time::timeout(poll, rx.recv()) => {}
            }
            // Files renamed in whole are complete: no burst to wait out (the debounce still merges).
            if !arrivals.renames_only() {
                fswatch::quiet(&mut rx, SETTLE_INTERVAL, QUIET_MAX).await;
            }
            let (next, rescan) = rescan_blocking(state, root.clone(), arrivals.clone()).await;
            state = next;
            match rescan.root {
                // The OS watch died with the directory.
                None => watched = None,
                Some(id) if watched != Some(id) => {
                    // Back, or replaced by another directory: watch the new one.
                    match fswatch::watch_recording(&root, tx.clone(), arrivals.clone()) {
                        Ok(w) => {
                            info!(dir = %root.display(), "watching the config directory again");
                            watch = Some(w);
                            watched = Some(id);
                            // Changes between the scan and the new watch: one more scan finds them.
                            let _ = tx.try_send(());
                        }
                        Err(e) => {
                            warn!(dir = %root.display(), error = %e, "cannot watch the config directory; polling it");
                            watch = None;
                        }
                    }
                }
                Some(_) => {}
            }
            poll = poll_interval(&rescan, watch.is_some());
            metrics.set_problems(SourceId::ConfigDir, &state.problem_counts());
            if !send(&events, rescan, &state).await {
                return;
            }
        }
    });
    Ok(())
}

fn poll_interval(rescan: &Rescan, watching: bool) -> Duration {
    if rescan.root.is_none() || rescan.unsettled || !watching {
        FAST_POLL_INTERVAL
    } else {
        POLL_INTERVAL
    }
}

/// Runs one rescan on the blocking pool; the state travels there and back.
async fn rescan_blocking(mut state: DirState, root: PathBuf, arrivals: Arrivals) -> (DirState, Rescan) {
    let fallback = root.clone();
    match tokio::task::spawn_blocking(move || {
        let rescan = state.rescan_after(&root, &arrivals);
        (state, rescan)
    })
    .await
    {
        Ok(done) => done,
        Err(e) => {
            // The scan panicked: report it and start over from an empty state next time.
            warn!(dir = %fallback.display(), error = %e, "config directory scan failed");
            (DirState::default(), Rescan::default())
        }
    }
}

async fn send<E: From<SourceEvent>>(events: &mpsc::Sender<E>, rescan: Rescan, state: &DirState) -> bool {
    if rescan.status_changed {
        let status =
            SourceEvent::Status { source: SourceId::ConfigDir, errors: state.errors(), ignored: state.ignored() };
        if events.send(status.into()).await.is_err() {
            return false;
        }
    }
    if !rescan.changes.is_empty() {
        let (span, cause) = crate::telemetry::trace::config_event("file", rescan.changes.len());
        span.in_scope(|| info!(changed = rescan.changes.len(), "config changed"));
        if events.send(SourceEvent::Cause(cause).into()).await.is_err() {
            return false;
        }
        return events.send(SourceEvent::Config(rescan.changes).into()).await.is_ok();
    }
    true
}
