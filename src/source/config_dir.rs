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
//!   objects and turns empty (or disappears) must stay so for [`EMPTY_SETTLE_READS`] reads before
//!   its objects are deleted;
//! - a file or directory that cannot be read keeps what it contributed and is reported (a config
//!   error with its path, in `/debug/configz`, and `meshpilot_config_source_errors`);
//! - the directory itself vanishing is an outage, not a deletion: everything stays served, it is
//!   reported, and it is polled fast and watched again once it is back;
//! - an object defined in several places is served from the first file in path order (the first
//!   document within a file); every other definition is reported naming both places.
//!
//! None of these problems makes `/ready` fail: one bad file must not take the mesh out of
//! service. They are visible in `/debug/configz` and the metrics instead.

use std::collections::btree_map::Entry;
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;
use tracing::{debug, info, warn};

#[cfg(doc)]
use super::files::STAMP_MARGIN;
use super::files::{
    dir_identity, list_with, parse_documents, FileStamp, Fs, ReadError, RealFs, MAX_SETTLE_ROUNDS, SETTLE_INTERVAL,
};
use super::fswatch::Arrivals;
use super::metrics::SourceMetrics;
use super::{fswatch, SourceEvent, SourceId};
use crate::config::parse::Document;
use crate::config::{ConfigError, ConfigKey, FieldError, IgnoredObject, ValidConfig};
use crate::drain::DrainWatcher;

/// Equal reads a changed file needs before its content is used.
const SETTLE_READS: usize = 2;

/// Equal reads (about 250 ms) a file that had objects needs when it turns empty or disappears
/// before its objects are deleted: a truncate-then-write may pause between the two.
const EMPTY_SETTLE_READS: usize = 6;

/// How often the directory is rescanned without a notification (they can be lost, e.g. on some
/// network filesystems).
const POLL_INTERVAL: Duration = Duration::from_secs(10);

/// How often the directory is rescanned while it is missing, a file keeps changing, or it is not
/// watched: the OS watch died with the directory, so polling is all there is until it is back.
const FAST_POLL_INTERVAL: Duration = Duration::from_millis(250);

/// Longest wait for a burst of notifications to end before rescanning (editors and `cp -r` write
/// in bursts; one scan after the burst is enough).
const QUIET_MAX: Duration = Duration::from_millis(500);

/// One valid object of a file, and which document of the file it is.
#[derive(Debug, Clone)]
struct Placed {
    /// 1-based document index.
    document: usize,
    config: ValidConfig,
}

/// What one file contributed at its last successful read.
#[derive(Debug, Clone, Default)]
struct FileState {
    content_hash: u64,
    /// The file's stamp when the content was read, if it vouches for the content.
    stamp: Option<FileStamp>,
    objects: BTreeMap<ConfigKey, Placed>,
    errors: Vec<ConfigError>,
    ignored: Vec<IgnoredObject>,
}

/// A file or directory that could not be read at the last scan.
#[derive(Debug, Clone, PartialEq)]
struct Problem {
    /// [`ReadError::reason`].
    reason: &'static str,
    error: ConfigError,
}

impl Problem {
    fn new(path: &Path, error: &ReadError) -> Problem {
        Problem { reason: error.reason(), error: error.to_config_error(path) }
    }
}

/// The merged state of a config directory.
#[derive(Debug, Default)]
pub struct DirState {
    files: BTreeMap<PathBuf, FileState>,
    merged: BTreeMap<ConfigKey, ValidConfig>,
    problems: Vec<Problem>,
    root_missing: bool,
    errors: Arc<Vec<ConfigError>>,
    ignored: Arc<Vec<IgnoredObject>>,
}

/// Changes found by one rescan.
#[derive(Debug, Default)]
pub struct Rescan {
    /// Keyed changes (`None`: deleted).
    pub changes: Vec<(ConfigKey, Option<ValidConfig>)>,
    /// Whether the error or ignored lists changed.
    pub status_changed: bool,
    /// Some file kept changing and was not used yet: rescan soon.
    pub unsettled: bool,
    /// The directory's (device, inode), `None` while it is missing.
    pub root: Option<(u64, u64)>,
}

/// One read of a file, compared with the next one to tell whether it is still being written.
enum Read {
    Text {
        text: String,
        hash: u64,
    },
    Failed(ReadError),
    /// The same content as the last one used (the text is not kept: only changed files' are).
    Unchanged,
}

impl Read {
    fn new(result: Result<String, ReadError>) -> Read {
        match result {
            Ok(text) => {
                let hash = content_hash(&text);
                Read::Text { text, hash }
            }
            Err(e) => Read::Failed(e),
        }
    }

    fn same_as(&self, other: &Read) -> bool {
        match (self, other) {
            (Read::Text { hash: a, text: ta }, Read::Text { hash: b, text: tb }) => a == b && ta.len() == tb.len(),
            (Read::Failed(a), Read::Failed(b)) => a.to_string() == b.to_string(),
            (Read::Unchanged, Read::Unchanged) => true,
            _ => false,
        }
    }

    /// Whether using this read would delete objects the file has now (it is gone or blank).
    fn drops_objects_of(&self, previous: Option<&FileState>) -> bool {
        let had_objects = previous.is_some_and(|p| !p.objects.is_empty());
        had_objects
            && match self {
                Read::Text { text, .. } => text.trim().is_empty(),
                Read::Failed(e) => matches!(e, ReadError::Vanished),
                Read::Unchanged => false,
            }
    }
}

/// What settling the reads of the changed files came to.
enum Settled {
    /// Reads to use, and files that kept changing.
    Done { reads: Vec<(PathBuf, Read)>, unsettled: Vec<PathBuf> },
    /// The directory disappeared meanwhile.
    RootGone,
    /// The directory was replaced by another one meanwhile.
    RootReplaced((u64, u64)),
}

impl DirState {
    /// Re-reads changed files under `root` and returns what changed. Blocking: it reads files and
    /// waits for changing ones to settle (about a second at most); run it on the blocking pool.
    pub fn rescan(&mut self, root: &Path) -> Rescan {
        self.rescan_with(root, &RealFs)
    }

    /// [`DirState::rescan`] after the notifications recorded in `arrivals`: a file they say was
    /// renamed in whole is used at its first read.
    pub fn rescan_after(&mut self, root: &Path, arrivals: &Arrivals) -> Rescan {
        self.rescan_inner(root, &RealFs, Some(arrivals))
    }

    pub(crate) fn rescan_with(&mut self, root: &Path, fs: &dyn Fs) -> Rescan {
        self.rescan_inner(root, fs, None)
    }

    fn rescan_inner(&mut self, root: &Path, fs: &dyn Fs, arrivals: Option<&Arrivals>) -> Rescan {
        let Some(root_id) = dir_identity(root) else { return self.root_missing(root) };
        let listing = match list_with(root, fs) {
            Ok(listing) => listing,
            Err(_) => return self.root_missing(root),
        };
        let listed: BTreeSet<&PathBuf> = listing.files.iter().collect();
        let mut candidates = listing.files.clone();
        let mut kept = Vec::new();
        for path in self.files.keys().filter(|p| !listed.contains(p)) {
            // Not listed: gone, unless the listing could not see it (unreadable directory, limits).
            if listing.truncated || listing.incomplete.iter().any(|dir| path.starts_with(dir)) {
                kept.push(path.clone());
            } else {
                candidates.push(path.clone());
            }
        }
        let (reads, unsettled) = match settle(&self.files, root, root_id, fs, candidates, &listing.stamps, arrivals) {
            Settled::Done { reads, unsettled } => (reads, unsettled),
            Settled::RootGone => return self.root_missing(root),
            Settled::RootReplaced(id) => {
                debug!(dir = %root.display(), "config directory replaced during the scan; scanning again");
                return Rescan { unsettled: true, root: Some(id), ..Rescan::default() };
            }
        };
        if self.root_missing {
            info!(dir = %root.display(), "config directory is back");
        }
        let mut previous = std::mem::take(&mut self.files);
        let mut files = BTreeMap::new();
        let mut problems: Vec<Problem> = listing.problems.iter().map(|(path, e)| Problem::new(path, e)).collect();
        for path in &unsettled {
            warn!(file = %path.display(), "config file keeps changing; its last state stays until it settles");
        }
        for path in kept.into_iter().chain(unsettled.iter().cloned()) {
            if let Some(state) = previous.remove(&path) {
                files.insert(path, state);
            }
        }
        for (path, read) in reads {
            let prev = previous.remove(&path);
            // The stamp listed before the read: if the file changed since, the next one differs.
            let stamp = listing.stamps.get(&path).copied();
            match read {
                Read::Text { text, hash } => {
                    let mut state = match prev {
                        Some(prev) if prev.content_hash == hash => prev,
                        prev => parse(&path, &text, hash, prev.unwrap_or_default()),
                    };
                    state.stamp = stamp;
                    files.insert(path, state);
                }
                Read::Unchanged => {
                    if let Some(mut prev) = prev {
                        prev.stamp = stamp;
                        files.insert(path, prev);
                    }
                }
                Read::Failed(ReadError::Vanished) => {
                    if prev.is_some() {
                        info!(file = %path.display(), "config file removed");
                    }
                }
                Read::Failed(e) => {
                    // Unusable now: what it contributed before stays.
                    problems.push(Problem::new(&path, &e));
                    if let Some(prev) = prev {
                        files.insert(path, prev);
                    }
                }
            }
        }
        self.files = files;
        self.root_missing = false;
        self.set_problems(problems);
        let mut rescan = self.merge();
        rescan.unsettled = !unsettled.is_empty();
        rescan.root = Some(root_id);
        rescan
    }

    /// The directory is gone (or no longer a directory): an outage, not a deletion.
    fn root_missing(&mut self, root: &Path) -> Rescan {
        if !self.root_missing {
            warn!(dir = %root.display(), files = self.files.len(), objects = self.merged.len(), "config directory is missing; serving the last config read until it is back");
        }
        self.root_missing = true;
        self.set_problems(vec![Problem::new(root, &ReadError::RootMissing)]);
        let mut rescan = self.merge();
        rescan.root = None;
        rescan
    }

    /// Replaces the current read problems, logging each one once when it appears.
    fn set_problems(&mut self, problems: Vec<Problem>) {
        for problem in problems.iter().filter(|p| !self.problems.contains(p)) {
            warn!(file = %problem.error.file, reason = problem.reason, error = %problem.error.error.reason, "cannot use config file or directory; what it contributed before stays");
        }
        for problem in self.problems.iter().filter(|p| !problems.contains(p)) {
            info!(file = %problem.error.file, reason = problem.reason, "config file or directory readable again");
        }
        self.problems = problems;
    }

    fn merge(&mut self) -> Rescan {
        let mut merged: BTreeMap<ConfigKey, ValidConfig> = BTreeMap::new();
        let mut errors: Vec<ConfigError> = self.problems.iter().map(|p| p.error.clone()).collect();
        let mut ignored = Vec::new();
        // Files in path order: the first definition of a key wins, deterministically.
        let mut owner: BTreeMap<&ConfigKey, (&Path, usize)> = BTreeMap::new();
        for (path, state) in &self.files {
            errors.extend(state.errors.iter().cloned());
            ignored.extend(state.ignored.iter().cloned());
            for (key, placed) in &state.objects {
                if let Some((first, first_document)) = owner.get(key) {
                    let served = format!("{} document {first_document}", first.display());
                    errors.push(duplicate(&path.display().to_string(), placed.document, key, &served));
                    continue;
                }
                owner.insert(key, (path, placed.document));
                merged.insert(key.clone(), placed.config.clone());
            }
        }
        let mut changes = Vec::new();
        for (key, obj) in &merged {
            // Unchanged files keep their objects' `Arc`s: the pointer says "same" without a deep
            // comparison of every object on every scan.
            if self.merged.get(key).is_none_or(|old| !Arc::ptr_eq(old, obj) && old != obj) {
                changes.push((key.clone(), Some(obj.clone())));
            }
        }
        for key in self.merged.keys() {
            if !merged.contains_key(key) {
                changes.push((key.clone(), None));
            }
        }
        let status_changed = *self.errors != errors || *self.ignored != ignored;
        self.merged = merged;
        if status_changed {
            self.errors = Arc::new(errors);
            self.ignored = Arc::new(ignored);
        }
        Rescan { changes, status_changed, ..Rescan::default() }
    }

    /// Current rejected documents, and the files and directories that cannot be read.
    pub fn errors(&self) -> Arc<Vec<ConfigError>> {
        self.errors.clone()
    }

    /// Current ignored documents.
    pub fn ignored(&self) -> Arc<Vec<IgnoredObject>> {
        self.ignored.clone()
    }

    /// How many files and directories cannot be read now, by [`ReadError::reason`].
    pub fn problem_counts(&self) -> BTreeMap<&'static str, usize> {
        let mut counts = BTreeMap::new();
        for problem in &self.problems {
            *counts.entry(problem.reason).or_insert(0) += 1;
        }
        counts
    }
}

/// Reads each candidate until two reads [`SETTLE_INTERVAL`] apart agree ([`EMPTY_SETTLE_READS`]
/// when the read would delete objects), for at most [`MAX_SETTLE_ROUNDS`] rounds. A file whose
/// first read equals what was used before needs no second read; one whose stamp is the one its
/// content was read at is not read at all; one that `arrivals` says was renamed in whole (and
/// that deletes nothing) is used at its first read.
fn settle(
    previous: &BTreeMap<PathBuf, FileState>,
    root: &Path,
    root_id: (u64, u64),
    fs: &dyn Fs,
    candidates: Vec<PathBuf>,
    stamps: &HashMap<PathBuf, FileStamp>,
    arrivals: Option<&Arrivals>,
) -> Settled {
    let mut reads = Vec::new();
    // Per changing file: its last read and how many reads in a row were equal to it.
    let mut pending: BTreeMap<PathBuf, (Read, usize)> = BTreeMap::new();
    for path in candidates {
        let prev_stamp = previous.get(&path).and_then(|p| p.stamp);
        if prev_stamp.is_some() && prev_stamp.as_ref() == stamps.get(&path) {
            reads.push((path, Read::Unchanged));
            continue;
        }
        let read = Read::new(fs.read_file(&path));
        match (&read, previous.get(&path)) {
            (Read::Text { hash, .. }, Some(prev)) if prev.content_hash == *hash => reads.push((path, Read::Unchanged)),
            // Never seen and already gone: nothing to settle.
            (Read::Failed(ReadError::Vanished), None) => reads.push((path, read)),
            _ => {
                pending.insert(path, (read, 1));
            }
        }
    }
    // Taken after the first reads: a write in place notified before them disqualifies the file.
    let renamed: HashSet<PathBuf> = arrivals.map(Arrivals::take_renamed).unwrap_or_default();
    let whole: Vec<PathBuf> = pending
        .iter()
        .filter(|(path, (read, _))| {
            renamed.contains(*path) && matches!(read, Read::Text { .. }) && !read.drops_objects_of(previous.get(*path))
        })
        .map(|(path, _)| path.clone())
        .collect();
    for path in whole {
        if let Some((read, _)) = pending.remove(&path) {
            reads.push((path, read));
        }
    }
    let mut rounds = 0;
    while !pending.is_empty() && rounds < MAX_SETTLE_ROUNDS {
        std::thread::sleep(SETTLE_INTERVAL);
        rounds += 1;
        // Files vanishing because the whole directory is going away (`rm -rf`) are no deletion.
        match dir_identity(root) {
            None => return Settled::RootGone,
            Some(id) if id != root_id => return Settled::RootReplaced(id),
            Some(_) => {}
        }
        let mut done = Vec::new();
        for (path, (last, equal_reads)) in pending.iter_mut() {
            let read = Read::new(fs.read_file(path));
            *equal_reads = if read.same_as(last) { *equal_reads + 1 } else { 1 };
            *last = read;
            let needed = if last.drops_objects_of(previous.get(path)) { EMPTY_SETTLE_READS } else { SETTLE_READS };
            if *equal_reads >= needed {
                done.push(path.clone());
            }
        }
        for path in done {
            if let Some((read, _)) = pending.remove(&path) {
                reads.push((path, read));
            }
        }
    }
    Settled::Done { reads, unsettled: pending.into_keys().collect() }
}

/// An object defined again at `file` document `document`, ignored because `served` defines it.
fn duplicate(file: &str, document: usize, key: &ConfigKey, served: &str) -> ConfigError {
    ConfigError {
        file: file.to_string(),
        document,
        object: Some(key.clone()),
        error: FieldError::new(
            "metadata.name",
            format!("duplicate of {key}, which {served} defines and is served (the first in path order); ignored"),
        ),
        policy_selector: None,
    }
}

/// Parses a file's new text; invalid documents keep the previous valid version of their object.
fn parse(path: &Path, text: &str, hash: u64, previous: FileState) -> FileState {
    let shown = path.display().to_string();
    let mut state = FileState { content_hash: hash, ..Default::default() };
    let mut rejected = Vec::new();
    let mut unidentified_failure = false;
    for (document, doc) in parse_documents(&shown, text) {
        match doc {
            Document::Valid(obj) => match state.objects.entry(obj.key.clone()) {
                Entry::Occupied(first) => {
                    let served = format!("{shown} document {}", first.get().document);
                    state.errors.push(duplicate(&shown, document, &obj.key, &served));
                }
                Entry::Vacant(slot) => {
                    slot.insert(Placed { document, config: Arc::new(obj) });
                }
            },
            Document::Ignored { document, api_version, kind, name } => {
                debug!(file = %shown, document, kind = %kind, name = %name, "ignoring object of a kind meshpilot does not serve");
                state.ignored.push(IgnoredObject { file: shown.clone(), document, api_version, kind, name });
            }
            Document::Invalid(err) => {
                match &err.object {
                    Some(key) => rejected.push((err.document, key.clone())),
                    None => unidentified_failure = true,
                }
                state.errors.push(err);
            }
        }
    }
    for err in &state.errors {
        let Some(key) = &err.object else { continue };
        if !rejected.iter().any(|(document, k)| *document == err.document && k == key) {
            continue; // a duplicate, reported as such
        }
        let kept = match previous.objects.get(key) {
            Some(old) if !state.objects.contains_key(key) => {
                state.objects.insert(key.clone(), Placed { document: err.document, config: old.config.clone() });
                true
            }
            _ => false,
        };
        warn!(file = %err.file, document = err.document, object = %key, field = %err.error.field, reason = %err.error.reason, last_valid_version_kept = kept, "invalid config rejected");
    }
    if unidentified_failure {
        // A document we cannot even identify may be any of the file's previous objects: keep those
        // not accounted for by the rest of the file.
        for err in state.errors.iter().filter(|e| e.object.is_none()) {
            warn!(file = %err.file, document = err.document, field = %err.error.field, reason = %err.error.reason, "invalid config rejected; the file's previous objects not in it stay");
        }
        for (key, old) in previous.objects {
            state.objects.entry(key).or_insert(old);
        }
    }
    state
}

fn content_hash(text: &str) -> u64 {
    xxhash_rust::xxh64::xxh64(text.as_bytes(), 0)
}

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

#[cfg(test)]
mod tests {
    use std::io::Write;
    use std::os::unix::fs::symlink;
    use std::time::Instant;

    use super::*;
    use crate::source::files::tests::{mkfifo, within, UnreadableDir, VS};

    fn names(changes: &[(ConfigKey, Option<ValidConfig>)]) -> Vec<(String, bool)> {
        changes.iter().map(|(k, v)| (k.name.clone(), v.is_some())).collect()
    }

    fn reasons(state: &DirState) -> Vec<(String, String)> {
        state.errors().iter().map(|e| (e.file.clone(), e.error.reason.clone())).collect()
    }

    /// Truncates `file` now and writes `text` into it (in place, same inode) after `delay`, like
    /// `sleep 0.03; cat new > file` does, from another thread.
    fn write_in_place_later(file: &Path, text: &str, delay: Duration) -> std::thread::JoinHandle<()> {
        let mut f = std::fs::OpenOptions::new().write(true).truncate(true).open(file).unwrap();
        let text = text.to_string();
        std::thread::spawn(move || {
            std::thread::sleep(delay);
            f.write_all(text.as_bytes()).unwrap();
        })
    }

    #[test]
    fn invalid_edit_keeps_last_valid_version_and_delete_removes() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("vs.yaml");
        std::fs::write(&file, VS).unwrap();
        let mut state = DirState::default();
        let first = state.rescan(dir.path());
        assert_eq!(first.changes.len(), 1);

        std::fs::write(&file, VS.replace("hosts: [a]", "hosts: [\"a b\"]")).unwrap();
        let broken = state.rescan(dir.path());
        assert!(broken.changes.is_empty(), "the last valid version must stay: {:?}", broken.changes);
        assert_eq!(state.errors().len(), 1);
        assert!(broken.status_changed);

        std::fs::write(&file, "not: [valid").unwrap();
        assert!(state.rescan(dir.path()).changes.is_empty());

        std::fs::remove_file(&file).unwrap();
        let gone = state.rescan(dir.path());
        assert!(matches!(gone.changes.as_slice(), [(_, None)]));
        assert!(state.errors().is_empty());
    }

    #[test]
    fn invalid_edit_written_in_place_keeps_the_object() {
        // Reproduction: `cat bad > vs.yaml` was read while empty (object deleted), then the bad
        // content had no previous version to keep, although the log said it was kept.
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("vs.yaml");
        std::fs::write(&file, VS).unwrap();
        let mut state = DirState::default();
        state.rescan(dir.path());
        let writer = write_in_place_later(&file, &VS.replace("hosts: [a]", "hosts: 7"), Duration::from_millis(30));
        let rescan = state.rescan(dir.path());
        writer.join().unwrap();
        let rescan_after = state.rescan(dir.path());
        assert!(rescan.changes.is_empty() && rescan_after.changes.is_empty(), "{:?}", rescan.changes);
        assert_eq!(state.merged.len(), 1, "the last valid version is still served");
        assert_eq!(state.errors().len(), 1, "{:?}", state.errors());
        assert_eq!(state.errors()[0].document, 1);
    }

    #[test]
    fn truncate_then_write_never_withdraws_the_object() {
        // Reproduction: a truncate-then-write was read while empty and withdrew the routes briefly.
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("vs.yaml");
        std::fs::write(&file, VS).unwrap();
        let mut state = DirState::default();
        state.rescan(dir.path());
        let updated = VS.replace("hosts: [a]", "hosts: [a, b]");
        let writer = write_in_place_later(&file, &updated, Duration::from_millis(30));
        let rescan = state.rescan(dir.path());
        writer.join().unwrap();
        assert_eq!(names(&rescan.changes), vec![("r".to_string(), true)], "an update, never a deletion");
        assert!(state.errors().is_empty());
    }

    #[test]
    fn a_file_that_stays_empty_deletes_its_objects() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("vs.yaml");
        std::fs::write(&file, VS).unwrap();
        let mut state = DirState::default();
        state.rescan(dir.path());
        std::fs::write(&file, " \n\n").unwrap();
        let started = Instant::now();
        let rescan = state.rescan(dir.path());
        assert_eq!(names(&rescan.changes), vec![("r".to_string(), false)]);
        assert!(started.elapsed() >= SETTLE_INTERVAL * u32::try_from(EMPTY_SETTLE_READS - 1).unwrap());
    }

    #[test]
    fn the_directory_vanishing_is_an_outage_not_a_deletion() {
        // Reproduction: `rm -rf` of the config directory withdrew every object.
        let parent = tempfile::tempdir().unwrap();
        let root = parent.path().join("cfg");
        std::fs::create_dir(&root).unwrap();
        std::fs::write(root.join("vs.yaml"), VS).unwrap();
        let mut state = DirState::default();
        state.rescan(&root);

        std::fs::remove_dir_all(&root).unwrap();
        let outage = state.rescan(&root);
        assert!(outage.changes.is_empty(), "{:?}", outage.changes);
        assert_eq!(outage.root, None);
        assert!(outage.status_changed);
        assert_eq!(state.problem_counts(), BTreeMap::from([("missing", 1)]));
        let errors = state.errors();
        assert_eq!(errors.len(), 1);
        assert_eq!(errors[0].file, root.display().to_string());
        assert!(errors[0].error.reason.contains("missing"), "{}", errors[0].error.reason);

        // Back with a change: applied, and the outage is over.
        std::fs::create_dir(&root).unwrap();
        std::fs::write(root.join("vs.yaml"), VS.replace("hosts: [a]", "hosts: [b]")).unwrap();
        let back = state.rescan(&root);
        assert_eq!(names(&back.changes), vec![("r".to_string(), true)]);
        assert!(back.root.is_some());
        assert!(state.errors().is_empty());
    }

    #[test]
    fn files_vanishing_while_the_directory_goes_are_not_deleted() {
        // `rm -rf` deletes the files first: a scan that sees them gone must not delete their
        // objects before it knows whether the directory goes too.
        let parent = tempfile::tempdir().unwrap();
        let root = parent.path().join("cfg");
        std::fs::create_dir(&root).unwrap();
        std::fs::write(root.join("vs.yaml"), VS).unwrap();
        let mut state = DirState::default();
        state.rescan(&root);
        std::fs::remove_file(root.join("vs.yaml")).unwrap();
        let remover = {
            let root = root.clone();
            std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(30));
                std::fs::remove_dir(&root).unwrap();
            })
        };
        let rescan = state.rescan(&root);
        remover.join().unwrap();
        assert!(rescan.changes.is_empty(), "{:?}", rescan.changes);
        assert_eq!(rescan.root, None);
    }

    #[test]
    fn symlink_loops_give_no_duplicates() {
        // Reproduction: one `ln -s . loop` read every file 41 times and reported 480 duplicates.
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("vs.yaml"), VS).unwrap();
        symlink(".", dir.path().join("l1")).unwrap();
        symlink(".", dir.path().join("l2")).unwrap();
        let root = dir.path().to_path_buf();
        let (state, rescan) = within(Duration::from_secs(10), move || {
            let mut state = DirState::default();
            let rescan = state.rescan(&root);
            (state, rescan)
        });
        assert_eq!(names(&rescan.changes), vec![("r".to_string(), true)]);
        assert!(state.errors().is_empty(), "{:?}", state.errors());
    }

    #[test]
    fn duplicates_are_served_from_the_first_file_and_both_places_named() {
        // Reproduction: the error blamed the other file and said "document 0".
        let dir = tempfile::tempdir().unwrap();
        let other = VS.replace("name: r", "name: other");
        std::fs::write(dir.path().join("a.yaml"), format!("{other}---\n{VS}")).unwrap();
        let second = VS.replace("hosts: [a]", "hosts: [z]");
        std::fs::write(dir.path().join("b.yaml"), format!("{other}---\n{other}---\n{second}")).unwrap();
        let mut state = DirState::default();
        state.rescan(dir.path());
        let (key, served) = state.merged.iter().find(|(k, _)| k.name == "r").unwrap();
        assert!(Arc::ptr_eq(served, &state.files[&dir.path().join("a.yaml")].objects[key].config));
        let errors = state.errors();
        let a = dir.path().join("a.yaml").display().to_string();
        let b = dir.path().join("b.yaml").display().to_string();
        // b.yaml document 1 repeats "other" (a.yaml document 1), document 2 repeats it within
        // b.yaml, document 3 repeats "r" (a.yaml document 2).
        let found: Vec<(String, usize, String)> =
            errors.iter().map(|e| (e.file.clone(), e.document, e.object.as_ref().unwrap().name.clone())).collect();
        assert_eq!(
            found,
            vec![
                (b.clone(), 2, "other".to_string()),
                (b.clone(), 1, "other".to_string()),
                (b.clone(), 3, "r".to_string())
            ]
        );
        let r_error = errors.iter().find(|e| e.object.as_ref().unwrap().name == "r").unwrap();
        assert!(r_error.error.reason.contains(&format!("{a} document 2")), "{}", r_error.error.reason);
        let within_file = errors.iter().find(|e| e.document == 2).unwrap();
        assert!(within_file.error.reason.contains(&format!("{b} document 1")), "{}", within_file.error.reason);
        assert!(r_error.to_string().contains("document 3"), "{r_error}");
    }

    #[test]
    fn special_unreadable_and_oversized_files_are_reported_and_keep_their_objects() {
        // Reproduction: a FIFO blocked the watcher forever, `/dev/zero` was read without limit, and
        // non-UTF-8 files were only in the log.
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("vs.yaml"), VS).unwrap();
        let latin1 = dir.path().join("latin1.yaml");
        std::fs::write(&latin1, VS.replace("name: r", "name: l")).unwrap();
        let root = dir.path().to_path_buf();
        let mut state = DirState::default();
        state.rescan(&root);
        assert_eq!(state.merged.len(), 2);

        mkfifo(&dir.path().join("pipe.yaml"));
        symlink("/dev/zero", dir.path().join("zero.yaml")).unwrap();
        std::fs::File::create(dir.path().join("big.yaml"))
            .unwrap()
            .set_len(super::super::files::MAX_FILE_BYTES + 1)
            .unwrap();
        std::fs::write(&latin1, b"caf\xe9: 1\n").unwrap();
        let (state, rescan) = within(Duration::from_secs(10), move || {
            let rescan = state.rescan(&root);
            (state, rescan)
        });
        assert!(rescan.changes.is_empty(), "latin1.yaml keeps its object: {:?}", rescan.changes);
        assert_eq!(
            state.problem_counts(),
            BTreeMap::from([("not_regular_file", 2), ("not_utf8", 1), ("too_large", 1)])
        );
        let errors = reasons(&state);
        for (name, reason) in [
            ("pipe.yaml", "FIFO"),
            ("zero.yaml", "character device"),
            ("big.yaml", "larger than"),
            ("latin1.yaml", "UTF-8"),
        ] {
            assert!(
                errors.iter().any(|(f, r)| f == &dir.path().join(name).display().to_string() && r.contains(reason)),
                "{name}: {errors:?}"
            );
        }
    }

    #[test]
    fn an_unreadable_subdirectory_keeps_its_objects_and_does_not_freeze_the_rest() {
        // Reproduction: a `chmod 000` subdirectory failed every later scan, so no change applied.
        // As root (these tests run as root) permissions do not stop reads, so the directory is
        // made unreadable through an injected `read_dir` failure.
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("vs.yaml"), VS).unwrap();
        let locked = dir.path().join("locked");
        std::fs::create_dir(&locked).unwrap();
        std::fs::write(locked.join("other.yaml"), VS.replace("name: r", "name: other")).unwrap();
        let mut state = DirState::default();
        state.rescan(dir.path());
        assert_eq!(state.merged.len(), 2);

        std::fs::write(dir.path().join("vs.yaml"), VS.replace("hosts: [a]", "hosts: [b]")).unwrap();
        let rescan = state.rescan_with(dir.path(), &UnreadableDir(locked.clone()));
        assert_eq!(names(&rescan.changes), vec![("r".to_string(), true)], "the rest still updates");
        assert_eq!(state.merged.len(), 2, "the unreadable directory's objects stay");
        assert_eq!(state.problem_counts(), BTreeMap::from([("unreadable", 1)]));
        assert_eq!(state.errors()[0].file, locked.display().to_string());
        assert!(rescan.status_changed);

        let readable = state.rescan(dir.path());
        assert!(readable.changes.is_empty() && readable.status_changed);
        assert!(state.errors().is_empty());
    }

    /// The real filesystem, counting reads per file, with a clock `ahead` of the real one.
    #[derive(Default)]
    struct Counting {
        reads: std::sync::Mutex<HashMap<PathBuf, usize>>,
        ahead: Duration,
    }

    impl Counting {
        fn reads(&self, path: &Path) -> usize {
            self.reads.lock().unwrap().get(path).copied().unwrap_or(0)
        }

        fn total(&self) -> usize {
            self.reads.lock().unwrap().values().sum()
        }
    }

    impl Fs for Counting {
        fn read_dir(&self, dir: &Path, limit: usize) -> std::io::Result<Vec<std::io::Result<PathBuf>>> {
            RealFs.read_dir(dir, limit)
        }

        fn read_file(&self, path: &Path) -> Result<String, ReadError> {
            *self.reads.lock().unwrap().entry(path.to_path_buf()).or_default() += 1;
            RealFs.read_file(path)
        }

        fn now(&self) -> std::time::SystemTime {
            std::time::SystemTime::now() + self.ahead
        }
    }

    #[test]
    fn files_whose_stamp_did_not_change_are_not_read_again() {
        let dir = tempfile::tempdir().unwrap();
        for name in ["a", "b", "c"] {
            std::fs::write(dir.path().join(format!("{name}.yaml")), VS.replace("name: r", &format!("name: {name}")))
                .unwrap();
        }
        // Seen from an hour later, no file changed recently: their stamps vouch for them.
        let later = Counting { ahead: Duration::from_secs(3600), ..Counting::default() };
        let mut state = DirState::default();
        assert_eq!(state.rescan_with(dir.path(), &later).changes.len(), 3);
        assert_eq!(later.total(), 6, "each new file read until two reads agree");
        assert!(state.rescan_with(dir.path(), &later).changes.is_empty());
        assert_eq!(later.total(), 6, "nothing changed: nothing read");

        let b = dir.path().join("b.yaml");
        std::fs::write(&b, VS.replace("name: r", "name: b").replace("hosts: [a]", "hosts: [z]")).unwrap();
        let rescan = state.rescan_with(dir.path(), &later);
        assert_eq!(names(&rescan.changes), vec![("b".to_string(), true)]);
        assert_eq!((later.reads(&dir.path().join("a.yaml")), later.reads(&b)), (2, 4), "b read until settled");

        // Just written (within the stamp margin): a same-tick rewrite could keep the stamp, so
        // such files are read on every scan.
        let now = Counting::default();
        state.rescan_with(dir.path(), &now);
        state.rescan_with(dir.path(), &now);
        assert_eq!(now.total(), 6);
    }

    #[test]
    fn a_file_renamed_in_is_used_at_its_first_read() {
        let parent = tempfile::tempdir().unwrap();
        let root = parent.path().join("cfg");
        std::fs::create_dir(&root).unwrap();
        let file = root.join("vs.yaml");
        std::fs::write(&file, VS).unwrap();
        let mut state = DirState::default();
        state.rescan(&root);
        let arrivals = Arrivals::default();
        let (tx, _rx) = mpsc::channel(1);
        let _watch = fswatch::watch_recording(&root, tx, arrivals.clone()).unwrap();

        // Written beside the directory, then renamed in: complete the moment it appears.
        let staged = parent.path().join("vs.yaml.new");
        std::fs::write(&staged, VS.replace("hosts: [a]", "hosts: [b]")).unwrap();
        std::fs::rename(&staged, &file).unwrap();
        let notified = arrivals.clone();
        within(Duration::from_secs(10), move || {
            while !notified.renames_only() {
                std::thread::sleep(Duration::from_millis(5));
            }
        });
        let fs = Counting::default();
        let rescan = state.rescan_inner(&root, &fs, Some(&arrivals));
        assert_eq!(names(&rescan.changes), vec![("r".to_string(), true)]);
        assert_eq!(fs.reads(&file), 1, "no settle rounds for a file renamed in");

        // Written in place: read until two reads agree.
        std::fs::write(&file, VS.replace("hosts: [a]", "hosts: [c]")).unwrap();
        let rescan = state.rescan_inner(&root, &fs, Some(&arrivals));
        assert_eq!(names(&rescan.changes), vec![("r".to_string(), true)]);
        assert_eq!(fs.reads(&file), 3);
    }
}
