//! Config sources: where Istio objects and the mesh config come from.
//!
//! Each source turns what it watches into a stream of [`SourceEvent`]s, as kube-runtime's watcher
//! does: its initial state, then [`SourceEvent::InitDone`], then changes. Sources know nothing of
//! their consumer: they send into any channel whose item type converts from a `SourceEvent`.

pub mod config_dir;
pub mod files;
pub mod fswatch;
pub mod mesh_config;
pub mod metrics;

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use tokio::sync::mpsc;

use crate::config::{ConfigError, ConfigKey, IgnoredObject, ValidConfig};
use crate::drain::DrainWatcher;
use crate::mesh::{MeshConfig, MeshConfigError, DEFAULT_DOMAIN};
use crate::registry::kubernetes::{KubeKey, KubeObject};
use crate::telemetry::trace::EventTrace;

pub use metrics::SourceMetrics;

/// Which source an event comes from; ingest publishes nothing until every started source is done
/// with its initial state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum SourceId {
    /// The watched config directory.
    ConfigDir,
    /// The watched mesh config file (or the defaults).
    MeshConfig,
    /// The Kubernetes API server's Services, EndpointSlices, Pods, Nodes and Namespaces.
    Kubernetes,
}

impl fmt::Display for SourceId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            SourceId::ConfigDir => "config-dir",
            SourceId::MeshConfig => "mesh-config",
            SourceId::Kubernetes => "kubernetes",
        })
    }
}

/// One thing a source reports.
#[derive(Debug, Clone)]
pub enum SourceEvent {
    /// Config objects changed: `Some` is the new valid version, `None` a deletion.
    Config(Vec<(ConfigKey, Option<ValidConfig>)>),
    /// Kubernetes registry objects changed: `Some` is the new version, `None` a deletion.
    Kube(Vec<(KubeKey, Option<Arc<KubeObject>>)>),
    /// The current list of rejected and ignored documents of a config source.
    Status {
        /// Rejected documents.
        errors: Arc<Vec<ConfigError>>,
        /// Documents of kinds meshpilot does not serve.
        ignored: Arc<Vec<IgnoredObject>>,
    },
    /// The mesh config changed.
    Mesh(Arc<MeshConfig>),
    /// The source has delivered its initial state.
    InitDone(SourceId),
    /// The trace of the change sent right after it: the snapshot it leads to joins its trace.
    Cause(EventTrace),
}

impl SourceEvent {
    /// How many of Istio's `pilot_inbound_updates{type="config"}` this event stands for (one per object).
    pub fn config_updates(&self) -> usize {
        match self {
            SourceEvent::Config(objects) => objects.len(),
            SourceEvent::Kube(objects) => objects.len(),
            SourceEvent::Mesh(_) => 1,
            SourceEvent::Status { .. } | SourceEvent::InitDone(_) | SourceEvent::Cause(_) => 0,
        }
    }
}

/// Why the sources could not start.
#[derive(Debug, thiserror::Error)]
pub enum SourceError {
    /// The config directory could not be read.
    #[error("config directory {dir}: {source}")]
    ConfigDir {
        /// Directory.
        dir: String,
        /// Cause.
        source: std::io::Error,
    },
    /// The mesh config is unusable.
    #[error(transparent)]
    Mesh(#[from] MeshConfigError),
}

/// The sources of one ingest node: a config directory and an optional mesh config file.
#[derive(Debug, Clone)]
pub struct SourceSettings {
    /// Directory of Istio YAML/JSON.
    pub config_dir: PathBuf,
    /// Mesh config file (defaults apply without one).
    pub mesh_config: Option<PathBuf>,
    /// DNS suffix of Kubernetes service names (pilot's `--domain`); every mesh config sent carries it.
    pub domain: String,
}

impl SourceSettings {
    /// Settings for `config_dir` and `mesh_config` with the default domain ([`DEFAULT_DOMAIN`]).
    pub fn new(config_dir: PathBuf, mesh_config: Option<PathBuf>) -> Self {
        SourceSettings { config_dir, mesh_config, domain: DEFAULT_DOMAIN.to_string() }
    }

    /// The sources [`start`] starts: ingest waits for each one's `InitDone` before it publishes.
    pub fn ids(&self) -> Vec<SourceId> {
        vec![SourceId::MeshConfig, SourceId::ConfigDir]
    }
}

/// Starts every configured source: each sends its initial state and `InitDone` to `events`, then
/// keeps watching in a task that ends when `drain` starts. Start the consumer first: the initial
/// state is sent before this returns. What the sources cannot read is counted in `metrics`.
///
/// Only a missing config directory or an unusable mesh config at start-up is an error: later
/// problems (a file that cannot be read, the directory vanishing) keep the last good config in
/// force and are reported as config errors and in `metrics`, not by failing readiness.
pub async fn start<E>(
    settings: &SourceSettings,
    events: mpsc::Sender<E>,
    metrics: SourceMetrics,
    drain: DrainWatcher,
) -> Result<(), SourceError>
where
    E: From<SourceEvent> + Send + 'static,
{
    match &settings.mesh_config {
        Some(path) => {
            mesh_config::watch(path.clone(), settings.domain.clone(), events.clone(), metrics.clone(), drain.clone())
                .await?
        }
        None => {
            let mesh = MeshConfig { domain: settings.domain.clone(), ..MeshConfig::default() };
            let _ = events.send(SourceEvent::Mesh(Arc::new(mesh)).into()).await;
            let _ = events.send(SourceEvent::InitDone(SourceId::MeshConfig).into()).await;
        }
    }
    config_dir::watch(settings.config_dir.clone(), events, metrics, drain)
        .await
        .map_err(|source| SourceError::ConfigDir { dir: display(&settings.config_dir), source })
}

fn display(path: &Path) -> String {
    path.display().to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::registry::kubernetes::{KubeKind, KubeNamespace};

    #[tokio::test]
    async fn the_default_mesh_config_carries_the_domain() {
        let dir = tempfile::tempdir().unwrap();
        let settings =
            SourceSettings { domain: "corp.internal".into(), ..SourceSettings::new(dir.path().into(), None) };
        let (events, mut rx) = mpsc::channel::<SourceEvent>(16);
        let (_trigger, drain) = crate::drain::new();
        start(&settings, events, SourceMetrics::default(), drain).await.unwrap();
        assert!(matches!(rx.recv().await, Some(SourceEvent::Mesh(m)) if m.domain == "corp.internal"));
    }

    #[test]
    fn kubernetes_objects_count_as_config_updates() {
        let ns = KubeObject::Namespace(KubeNamespace { name: "shop".into(), labels: Default::default() });
        let gone = KubeKey { kind: KubeKind::Namespace, namespace: String::new(), name: "old".into() };
        let event = SourceEvent::Kube(vec![(ns.key(), Some(Arc::new(ns))), (gone, None)]);
        assert_eq!(event.config_updates(), 2);
        assert_eq!(SourceId::Kubernetes.to_string(), "kubernetes");
    }
}
