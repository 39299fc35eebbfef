//! The directory's state between scans: per file what it held, per key the version served, and
//! what is wrong; one rescan turns a new listing into keyed changes.

use std::collections::btree_map::Entry;
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use tracing::{debug, info, warn};

use crate::config::parse::Document;
use crate::config::{ConfigError, ConfigKey, FieldError, IgnoredObject, ValidConfig};
use crate::source::files::{
    dir_identity, is_config_file, list_with, parse_documents, FileStamp, Fs, ReadError, RealFs, MAX_ENTRIES,
    MAX_SETTLE_ROUNDS, SETTLE_INTERVAL,
};
use crate::source::fswatch::Arrivals;

/// Equal reads a changed file needs before its content is used.
const SETTLE_READS: usize = 2;

/// Equal reads (about 250 ms) a file that had objects needs when it disappears before its objects
/// are deleted: a delete-then-create (`rm f; cp new f`) pauses between the two. (A file that turns
/// blank deletes nothing at all, see [`is_blank`].)
const EMPTY_SETTLE_READS: usize = 6;

/// One valid object of a file, and which document of the file it is.
#[derive(Debug, Clone)]
struct Placed {
    /// 1-based document index.
    document: usize,
    config: ValidConfig,
}

/// What the merge reads of a file besides its objects' contents: the keys and documents of
/// its objects, and its errors and ignored documents.
#[derive(Debug, PartialEq)]
struct FileShape {
    documents: Vec<(ConfigKey, usize)>,
    errors: Vec<ConfigError>,
    ignored: Vec<IgnoredObject>,
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

impl FileState {
    fn shape(&self) -> FileShape {
        FileShape {
            documents: self.objects.iter().map(|(key, placed)| (key.clone(), placed.document)).collect(),
            errors: self.errors.clone(),
            ignored: self.ignored.clone(),
        }
    }
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
    pub(super) merged: BTreeMap<ConfigKey, ValidConfig>,
    problems: Vec<Problem>,
    root_missing: bool,
    pub(super) errors: Arc<Vec<ConfigError>>,
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

    /// Whether using this read would delete every object the file has now (it is gone). A blank
    /// file deletes none (see [`is_blank`]).
    fn drops_objects_of(&self, previous: Option<&FileState>) -> bool {
        let had_objects = previous.is_some_and(|p| !p.objects.is_empty());
        had_objects && matches!(self, Read::Failed(ReadError::Vanished))
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
        match self.rescan_renamed(root, &RealFs, arrivals) {
            Some(rescan) => rescan,
            None => self.rescan_inner(root, &RealFs, Some(arrivals)),
        }
    }

    /// When only whole files were renamed in, each a file already read or a config file directly
    /// in `root`: reads just those, without listing the tree (a thousand-file directory costs a
    /// thousand `stat`s per listing). `None`, with nothing read into the state, where a full
    /// rescan is needed.
    fn rescan_renamed(&mut self, root: &Path, fs: &dyn Fs, arrivals: &Arrivals) -> Option<Rescan> {
        let paths = arrivals.renamed_only()?;
        let listed = |p: &PathBuf| {
            self.files.contains_key(p)
                || (p.parent() == Some(root) && is_config_file(p) && self.files.len() < MAX_ENTRIES / 2)
        };
        if self.root_missing || !paths.iter().all(listed) {
            return None;
        }
        let root_id = dir_identity(root)?;
        let mut reads = Vec::new();
        for path in paths {
            match Read::new(fs.read_file(&path)) {
                // A blank or vanished file would delete objects: the full rescan settles those.
                read @ Read::Text { .. } if !read.drops_objects_of(self.files.get(&path)) => reads.push((path, read)),
                _ => return None,
            }
        }
        // Taken after the reads, as `settle` does: a write in place since disqualifies a file.
        let renamed = arrivals.take_renamed();
        if !reads.iter().all(|(path, _)| renamed.contains(path)) {
            return Some(self.rescan_inner(root, fs, None));
        }
        let read_now: HashSet<String> = reads.iter().map(|(path, _)| path.display().to_string()).collect();
        let problems: Vec<Problem> =
            self.problems.iter().filter(|p| !read_now.contains(&p.error.file)).cloned().collect();
        // The errors start with the problems: with one gone, the whole merge is redone.
        let mut in_place = problems.len() == self.problems.len();
        self.set_problems(problems);
        let mut edited = Vec::new();
        for (path, read) in reads {
            let Read::Text { text, hash } = read else { continue };
            let prev = self.files.remove(&path);
            let before = prev.as_ref().filter(|p| self.serves_all_of(p)).map(FileState::shape);
            // No stamp: the next full rescan reads the file once more to vouch for it.
            let state = FileState { stamp: None, ..reparsed(&path, &text, hash, prev) };
            in_place &= before.is_some_and(|shape| shape == state.shape());
            edited.push(path.clone());
            self.files.insert(path, state);
        }
        let mut rescan = if in_place { self.merge_contents(&edited) } else { self.merge() };
        rescan.root = Some(root_id);
        Some(rescan)
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
                    let state = FileState { stamp, ..reparsed(&path, &text, hash, prev) };
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

    /// Whether the merge serves every object of `file` from it: no other file's definition of
    /// any of its keys came first.
    fn serves_all_of(&self, file: &FileState) -> bool {
        let served = |key, placed: &Placed| self.merged.get(key).is_some_and(|m| Arc::ptr_eq(m, &placed.config));
        file.objects.iter().all(|(key, placed)| served(key, placed))
    }

    /// The merge after some files were read again, each still served in whole and of the same
    /// shape (see [`FileState::shape`]): their objects replace the served ones, and nothing else
    /// of the merge can have changed. A thousand-file directory is not merged again per edit.
    fn merge_contents(&mut self, edited: &[PathBuf]) -> Rescan {
        let mut changes = Vec::new();
        for file in edited.iter().filter_map(|path| self.files.get(path)) {
            for (key, placed) in &file.objects {
                let Some(served) = self.merged.get_mut(key) else { continue };
                if !Arc::ptr_eq(served, &placed.config) && *served != placed.config {
                    changes.push((key.clone(), Some(placed.config.clone())));
                }
                *served = placed.config.clone();
            }
        }
        changes.sort_by(|a, b| a.0.cmp(&b.0));
        Rescan { changes, ..Rescan::default() }
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

/// The file's state for content `text`: the previous one when the content is the same, else parsed.
fn reparsed(path: &Path, text: &str, hash: u64, previous: Option<FileState>) -> FileState {
    match previous {
        Some(previous) if previous.content_hash == hash => previous,
        previous => parse(path, text, hash, previous.unwrap_or_default()),
    }
}

/// Whether `text` holds no document at all: only blank lines, comments and document markers.
///
/// A file that had objects and turns blank keeps serving them until it is removed or written
/// with content (an empty List or `[]` counts as content: it deletes them). A blank file is
/// what every in-place writer (`cmd > file`) leaves until its first bytes arrive, however long
/// the command takes; dropping its objects then would withdraw policies (a DENY
/// AuthorizationPolicy among them) for that long, failing open.
fn is_blank(text: &str) -> bool {
    text.lines().all(|line| {
        let content = line.split('#').next().unwrap_or_default().trim();
        matches!(content, "" | "---" | "...")
    })
}

/// The state of a file that turned blank while it had objects: they stay, with a config error
/// saying why, so the state shows in `/debug/configz`.
fn blank_keeping(path: &Path, hash: u64, previous: FileState) -> FileState {
    let shown = path.display().to_string();
    warn!(file = %shown, objects = previous.objects.len(), "config file is empty; the objects it held stay served until it is removed or written with content");
    let error = ConfigError {
        file: shown,
        document: 0,
        object: None,
        error: FieldError::new(
            "",
            format!(
                "file is empty; the {} objects it held stay served until it is removed or written with content",
                previous.objects.len()
            ),
        ),
        policy_selector: None,
    };
    FileState {
        content_hash: hash,
        stamp: None,
        objects: previous.objects,
        errors: vec![error],
        ignored: previous.ignored,
    }
}

/// Parses a file's new text; invalid documents keep the previous valid version of their object,
/// and a blank file keeps all of them (see [`is_blank`]).
fn parse(path: &Path, text: &str, hash: u64, previous: FileState) -> FileState {
    if !previous.objects.is_empty() && is_blank(text) {
        return blank_keeping(path, hash, previous);
    }
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

#[cfg(test)]
#[path = "tests.rs"]
mod tests;
