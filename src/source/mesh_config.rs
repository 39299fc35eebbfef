//! The mesh config source: every valid change of the MeshConfig file becomes a new MeshConfig.
//!
//! The file is read like the config directory's files: only a regular file, at most
//! [`MAX_FILE_BYTES`](super::files::MAX_FILE_BYTES), and re-read until two reads agree, so a write
//! in place is not seen half done. Once a mesh config is in force only a valid new one replaces
//! it: an invalid, unreadable, missing or empty file is reported (log and
//! `meshpilot_config_source_errors{source="mesh-config"}`) and the previous one stays. An empty
//! file is far more likely a write in progress or a mistake than a wish for the defaults (`{}`
//! asks for those); at start-up, with nothing to keep, it means the defaults, with a warning.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;
use tracing::{info, warn};

use super::files::{read_config_file, ReadError, MAX_SETTLE_ROUNDS, SETTLE_INTERVAL};
use super::metrics::SourceMetrics;
use super::{fswatch, SourceEvent, SourceId};
use crate::drain::DrainWatcher;
use crate::mesh::{MeshConfig, MeshConfigError};

/// How often the file is re-read without a notification (filesystems without notifications).
const POLL_INTERVAL: Duration = Duration::from_secs(5);

/// How soon a file that kept changing is read again.
const RETRY_INTERVAL: Duration = Duration::from_millis(250);

/// Longest wait for a burst of notifications to end before reading.
const QUIET_MAX: Duration = Duration::from_millis(500);

/// Why the mesh config file was not used.
#[derive(Debug, thiserror::Error)]
enum LoadError {
    /// It could not be read.
    #[error("reading mesh config {path}: {source}")]
    Read { path: String, source: ReadError },
    /// It is empty or whitespace only.
    #[error("mesh config {path} is empty")]
    Empty { path: String },
    /// It kept changing while being read.
    #[error("mesh config {path} kept changing while being read")]
    Unsettled { path: String },
    /// It is not a valid MeshConfig.
    #[error(transparent)]
    Invalid(MeshConfigError),
}

impl LoadError {
    /// The `meshpilot_config_source_errors` reason; `None` for a passing state not worth one.
    fn reason(&self) -> Option<&'static str> {
        match self {
            LoadError::Read { source, .. } => Some(source.reason()),
            LoadError::Empty { .. } => Some("empty"),
            LoadError::Invalid(_) => Some("invalid"),
            LoadError::Unsettled { .. } => None,
        }
    }

    /// The error with which start-up fails.
    fn into_start_error(self) -> MeshConfigError {
        match self {
            LoadError::Invalid(e) => e,
            LoadError::Read { path, source } => MeshConfigError::Read { path, source: std::io::Error::other(source) },
            LoadError::Empty { path } => MeshConfigError::Invalid { path, reason: "empty file".into() },
            LoadError::Unsettled { path } => {
                MeshConfigError::Invalid { path, reason: "kept changing while being read".into() }
            }
        }
    }
}

/// Loads `path`, sends it and `InitDone`, then sends each new valid version; anything else is
/// reported and the previous mesh config stays in force. Watches in a task that ends with the drain.
/// Every mesh config sent carries `domain` (a flag of the process, not a field of the file).
pub async fn watch<E>(
    path: PathBuf,
    domain: String,
    events: mpsc::Sender<E>,
    metrics: SourceMetrics,
    drain: DrainWatcher,
) -> Result<(), MeshConfigError>
where
    E: From<SourceEvent> + Send + 'static,
{
    let mut problem = None;
    let first = match load_blocking(path.clone(), true).await {
        Ok(mesh) => mesh,
        Err(e @ LoadError::Empty { .. }) => {
            warn!(path = %path.display(), "mesh config file is empty; using the defaults");
            let defaults = MeshConfig::parse(&path.display().to_string(), "")?;
            report(&metrics, &mut problem, Some(e));
            defaults
        }
        Err(e) => return Err(e.into_start_error()),
    };
    let first = MeshConfig { domain: domain.clone(), ..first };
    let mut current_hash = first.source_hash;
    let _ = events.send(SourceEvent::Mesh(Arc::new(first)).into()).await;
    let _ = events.send(SourceEvent::InitDone(SourceId::MeshConfig).into()).await;
    let (tx, mut rx) = mpsc::channel(1);
    // Watch the directory (editors replace files by renaming over them), but not below it: it may
    // hold anything.
    let dir =
        path.parent().map(PathBuf::from).filter(|p| !p.as_os_str().is_empty()).unwrap_or_else(|| PathBuf::from("."));
    let watch = match fswatch::watch_shallow(&dir, tx) {
        Ok(w) => Some(w),
        Err(e) => {
            warn!(path = %path.display(), error = %e, "cannot watch mesh config; polling instead");
            None
        }
    };
    tokio::spawn(async move {
        let _watch = watch;
        let mut poll = POLL_INTERVAL;
        loop {
            tokio::select! {
                _ = drain.draining() => return,
                _ = tokio::time::timeout(poll, rx.recv()) => {}
            }
            fswatch::quiet(&mut rx, SETTLE_INTERVAL, QUIET_MAX).await;
            let loaded = load_blocking(path.clone(), false).await;
            poll = if matches!(loaded, Err(LoadError::Unsettled { .. })) { RETRY_INTERVAL } else { POLL_INTERVAL };
            match loaded {
                Ok(mesh) => {
                    report(&metrics, &mut problem, None);
                    if mesh.source_hash == current_hash {
                        continue;
                    }
                    current_hash = mesh.source_hash;
                    let (span, cause) = crate::telemetry::trace::config_event("mesh", 1);
                    span.in_scope(|| info!(path = %path.display(), "mesh config changed"));
                    let _ = events.send(SourceEvent::Cause(cause).into()).await;
                    let mesh = MeshConfig { domain: domain.clone(), ..mesh };
                    if events.send(SourceEvent::Mesh(Arc::new(mesh)).into()).await.is_err() {
                        return;
                    }
                }
                Err(e) => report(&metrics, &mut problem, Some(e)),
            }
        }
    });
    Ok(())
}

/// Logs a new problem once (and its end), and sets the metric.
fn report(metrics: &SourceMetrics, current: &mut Option<String>, problem: Option<LoadError>) {
    let message = problem.as_ref().map(ToString::to_string);
    if message != *current {
        match &problem {
            Some(e) => {
                warn!(error = %e, reason = e.reason().unwrap_or("unsettled"), "mesh config not used; the previous one stays in force (an empty file does not mean the defaults: write `{{}}` for those)");
            }
            None => info!("mesh config readable and valid again"),
        }
    }
    // A file caught mid-write is retried soon: no metric, no change of the one reported.
    if matches!(problem, Some(LoadError::Unsettled { .. })) {
        return;
    }
    *current = message;
    let counts: BTreeMap<&'static str, usize> =
        problem.as_ref().and_then(LoadError::reason).map(|reason| (reason, 1)).into_iter().collect();
    metrics.set_problems(SourceId::MeshConfig, &counts);
}

/// Reads and parses the file. Blocking: it waits for a changing file to settle.
/// `initial`: at start-up a file that never settles is used as last read (nothing to keep).
fn load(path: &Path, initial: bool) -> Result<MeshConfig, LoadError> {
    let shown = path.display().to_string();
    let (text, settled) = read_settled(path);
    if !settled && !initial {
        return Err(LoadError::Unsettled { path: shown });
    }
    let text = text.map_err(|source| LoadError::Read { path: shown.clone(), source })?;
    if text.trim().is_empty() {
        return Err(LoadError::Empty { path: shown });
    }
    MeshConfig::parse(&shown, &text).map_err(LoadError::Invalid)
}

/// Reads `path` until two reads [`SETTLE_INTERVAL`] apart agree (at most [`MAX_SETTLE_ROUNDS`]);
/// the last read, and whether it settled.
fn read_settled(path: &Path) -> (Result<String, ReadError>, bool) {
    let mut last = read_config_file(path);
    for _ in 0..MAX_SETTLE_ROUNDS {
        std::thread::sleep(SETTLE_INTERVAL);
        let next = read_config_file(path);
        let same = match (&last, &next) {
            (Ok(a), Ok(b)) => a == b,
            (Err(a), Err(b)) => a.to_string() == b.to_string(),
            _ => false,
        };
        last = next;
        if same {
            return (last, true);
        }
    }
    (last, false)
}

/// [`load`] on the blocking pool.
async fn load_blocking(path: PathBuf, initial: bool) -> Result<MeshConfig, LoadError> {
    let shown = path.display().to_string();
    tokio::task::spawn_blocking(move || load(&path, initial))
        .await
        .unwrap_or_else(|e| Err(LoadError::Read { path: shown, source: ReadError::Io(std::io::Error::other(e)) }))
}

#[cfg(test)]
mod tests {
    use std::io::Write;

    use super::*;
    use crate::source::files::tests::mkfifo;

    #[test]
    fn empty_special_and_changing_files_are_not_used() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("mesh.yaml");
        std::fs::write(&file, " \n").unwrap();
        assert!(matches!(load(&file, false), Err(LoadError::Empty { .. })));
        std::fs::write(&file, "trustDomain: example.org\n").unwrap();
        assert_eq!(load(&file, false).unwrap().trust_domain, "example.org");
        std::fs::write(&file, "{}").unwrap();
        assert_eq!(load(&file, false).unwrap().trust_domain, "cluster.local");
        let fifo = dir.path().join("fifo.yaml");
        mkfifo(&fifo);
        let err = load(&fifo, true).unwrap_err();
        assert_eq!(err.reason(), Some("not_regular_file"), "{err}");
    }

    #[tokio::test]
    async fn an_emptied_mesh_config_keeps_the_previous_one() {
        // Reproduction: an empty mesh config file pushed the default mesh config.
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("mesh.yaml");
        std::fs::write(&file, "trustDomain: example.org\n").unwrap();
        let registry = crate::telemetry::metrics::Registry::new();
        let metrics = SourceMetrics::register(&registry);
        let (events, mut rx) = mpsc::channel::<SourceEvent>(16);
        let (_trigger, drain) = crate::drain::new();
        watch(file.clone(), "corp.internal".into(), events, metrics.clone(), drain).await.unwrap();
        assert!(matches!(rx.recv().await,
            Some(SourceEvent::Mesh(m)) if m.trust_domain == "example.org" && m.domain == "corp.internal"));
        assert!(matches!(rx.recv().await, Some(SourceEvent::InitDone(SourceId::MeshConfig))));

        // Truncated in place, and left empty.
        std::fs::OpenOptions::new().write(true).truncate(true).open(&file).unwrap().flush().unwrap();
        let nothing = tokio::time::timeout(Duration::from_millis(1500), rx.recv()).await;
        assert!(nothing.is_err(), "no new mesh config: {nothing:?}");
        assert_eq!(metrics.source_errors.with_label_values(&["mesh-config", "empty"]).get(), 1);

        std::fs::write(&file, "trustDomain: other.org\n").unwrap();
        let changed = tokio::time::timeout(Duration::from_secs(5), async {
            loop {
                match rx.recv().await {
                    Some(SourceEvent::Mesh(m)) => return m,
                    Some(_) => {}
                    None => panic!("source ended"),
                }
            }
        })
        .await
        .unwrap();
        assert_eq!(changed.trust_domain, "other.org");
        assert_eq!(changed.domain, "corp.internal", "a reloaded mesh config keeps the domain");
        assert_eq!(metrics.source_errors.with_label_values(&["mesh-config", "empty"]).get(), 0);
    }
}
