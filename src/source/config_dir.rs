//! The config directory source: each change of the files becomes keyed config events.
//!
//! Per key the last valid version is kept: an invalid edit of an object is reported and the
//! previous version keeps being served; a file that no longer parses at all keeps its previous
//! objects; deleting a file deletes its objects.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;
use tracing::{debug, info, warn};

use super::files::list_config_files;
use super::{fswatch, SourceEvent, SourceId};
use crate::config::parse::{parse_file, Document};
use crate::config::{ConfigError, ConfigKey, FieldError, IgnoredObject, ValidConfig};
use crate::drain::DrainWatcher;

/// What one file contributed at its last successful read.
#[derive(Debug, Clone, Default)]
struct FileState {
    content_hash: u64,
    objects: BTreeMap<ConfigKey, ValidConfig>,
    errors: Vec<ConfigError>,
    ignored: Vec<IgnoredObject>,
}

/// The merged state of a config directory.
#[derive(Debug, Default)]
pub struct DirState {
    files: BTreeMap<PathBuf, FileState>,
    merged: BTreeMap<ConfigKey, ValidConfig>,
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
}

impl DirState {
    /// Re-reads changed files under `root` and returns what changed.
    pub fn rescan(&mut self, root: &Path) -> Rescan {
        let paths = match list_config_files(root) {
            Ok(p) => p,
            Err(e) => {
                warn!(dir = %root.display(), error = %e, "cannot list config directory; keeping current config");
                return Rescan::default();
            }
        };
        let mut files = BTreeMap::new();
        for path in paths {
            let previous = self.files.remove(&path);
            match std::fs::read_to_string(&path) {
                Ok(text) => {
                    let hash = content_hash(&text);
                    let state = match previous {
                        Some(prev) if prev.content_hash == hash => prev,
                        prev => read_file(&path, &text, hash, prev.unwrap_or_default()),
                    };
                    files.insert(path, state);
                }
                // Vanished between listing and reading: treat as deleted. Other errors keep the last state.
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => {
                    warn!(file = %path.display(), error = %e, "cannot read config file; keeping its last state");
                    if let Some(prev) = previous {
                        files.insert(path, prev);
                    }
                }
            }
        }
        for removed in self.files.keys() {
            info!(file = %removed.display(), "config file removed");
        }
        self.files = files;
        self.merge()
    }

    fn merge(&mut self) -> Rescan {
        let mut merged: BTreeMap<ConfigKey, ValidConfig> = BTreeMap::new();
        let mut errors = Vec::new();
        let mut ignored = Vec::new();
        let mut owner: BTreeMap<ConfigKey, &Path> = BTreeMap::new();
        for (path, state) in &self.files {
            errors.extend(state.errors.iter().cloned());
            ignored.extend(state.ignored.iter().cloned());
            for (key, obj) in &state.objects {
                if let Some(first) = owner.get(key) {
                    errors.push(ConfigError {
                        file: path.display().to_string(),
                        document: 0,
                        object: Some(key.clone()),
                        error: FieldError::new(
                            "metadata.name",
                            format!("duplicate of the object in {}; ignored", first.display()),
                        ),
                    });
                    continue;
                }
                owner.insert(key.clone(), path);
                merged.insert(key.clone(), obj.clone());
            }
        }
        let mut changes = Vec::new();
        for (key, obj) in &merged {
            if self.merged.get(key).is_none_or(|old| old != obj) {
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
        Rescan { changes, status_changed }
    }

    /// Current rejected documents.
    pub fn errors(&self) -> Arc<Vec<ConfigError>> {
        self.errors.clone()
    }

    /// Current ignored documents.
    pub fn ignored(&self) -> Arc<Vec<IgnoredObject>> {
        self.ignored.clone()
    }
}

fn read_file(path: &Path, text: &str, hash: u64, previous: FileState) -> FileState {
    let shown = path.display().to_string();
    let mut state = FileState { content_hash: hash, ..Default::default() };
    let mut unidentified_failure = false;
    for doc in parse_file(&shown, text) {
        match doc {
            Document::Valid(obj) => {
                state.objects.insert(obj.key.clone(), Arc::new(obj));
            }
            Document::Ignored { document, api_version, kind, name } => {
                debug!(file = %shown, document, kind = %kind, name = %name, "ignoring object of a kind meshpilot does not serve");
                state.ignored.push(IgnoredObject { file: shown.clone(), document, api_version, kind, name });
            }
            Document::Invalid(err) => {
                warn!(file = %err.file, document = err.document, object = ?err.object.as_ref().map(ToString::to_string), field = %err.error.field, reason = %err.error.reason, "invalid config rejected; last valid version kept");
                match &err.object {
                    Some(key) => {
                        if let Some(old) = previous.objects.get(key) {
                            state.objects.insert(key.clone(), old.clone());
                        }
                    }
                    None => unidentified_failure = true,
                }
                state.errors.push(err);
            }
        }
    }
    if unidentified_failure {
        // A document we cannot even identify may be any of the file's previous objects: keep those
        // not accounted for by the rest of the file.
        for (key, old) in previous.objects {
            state.objects.entry(key).or_insert(old);
        }
    }
    state
}

fn content_hash(text: &str) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    text.hash(&mut h);
    h.finish()
}

/// How often the directory is rescanned without a notification (they can be lost, e.g. on some
/// network filesystems).
const POLL_INTERVAL: Duration = Duration::from_secs(10);

/// Scans `root` once, sends its state and `InitDone`, then watches it in a task that ends with
/// the drain. Reading and parsing run on the blocking pool, off the async workers.
pub async fn watch<E>(root: PathBuf, events: mpsc::Sender<E>, drain: DrainWatcher) -> std::io::Result<()>
where
    E: From<SourceEvent> + Send + 'static,
{
    if !root.is_dir() {
        return Err(std::io::Error::new(
            std::io::ErrorKind::NotFound,
            format!("config directory {} does not exist", root.display()),
        ));
    }
    let (tx, mut rx) = mpsc::channel(1);
    let watch = fswatch::watch(&root, tx).map_err(std::io::Error::other)?;
    let (state, first) = rescan_blocking(DirState::default(), root.clone()).await;
    info!(dir = %root.display(), objects = state.merged.len(), errors = state.errors.len(), "config directory loaded");
    send(&events, first, &state).await;
    let _ = events.send(SourceEvent::InitDone(SourceId::ConfigDir).into()).await;
    tokio::spawn(async move {
        let _watch = watch;
        let mut state = state;
        loop {
            tokio::select! {
                _ = drain.draining() => return,
                _ = tokio::time::timeout(POLL_INTERVAL, rx.recv()) => {}
            }
            let (next, rescan) = rescan_blocking(state, root.clone()).await;
            state = next;
            if !send(&events, rescan, &state).await {
                return;
            }
        }
    });
    Ok(())
}

/// Runs one rescan on the blocking pool; the state travels there and back.
async fn rescan_blocking(mut state: DirState, root: PathBuf) -> (DirState, Rescan) {
    let fallback = root.clone();
    match tokio::task::spawn_blocking(move || {
        let rescan = state.rescan(&root);
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
        let status = SourceEvent::Status { errors: state.errors(), ignored: state.ignored() };
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
    use super::*;

    const VS: &str = "apiVersion: networking.istio.io/v1\nkind: VirtualService\nmetadata: {name: r}\nspec: {hosts: [a], http: [{route: [{destination: {host: a}}]}]}\n";

    #[test]
    fn invalid_edit_keeps_last_valid_version_and_delete_removes() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("vs.yaml");
        std::fs::write(&file, VS).unwrap();
        let mut state = DirState::default();
        let first = state.rescan(dir.path());
        assert_eq!(first.changes.len(), 1);

        std::fs::write(&file, VS.replace("hosts: [a]", "hosts: [a], bogus: 1")).unwrap();
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
}
