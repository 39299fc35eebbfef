//! Config sources: where Istio objects and the mesh config come from.
//!
//! Each source turns what it watches into a stream of [`SourceEvent`]s, as kube-runtime's watcher
//! does: its initial state, then [`SourceEvent::InitDone`], then changes. Sources know nothing of
//! their consumer: they send into any channel whose item type converts from a `SourceEvent`.

pub mod config_dir;
mod event;
pub mod files;
pub mod fswatch;
pub mod kubernetes;
pub mod mesh_config;
pub mod metrics;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use tokio::sync::mpsc;

use crate::drain::DrainWatcher;
pub use crate::mesh::DEFAULT_DOMAIN;
use crate::mesh::{MeshConfig, MeshConfigError};

pub use event::{SourceEvent, SourceId};
pub use kubernetes::{KubeError, KubeSettings};
pub use metrics::SourceMetrics;

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
    /// Kubernetes is configured, but no client was handed over to watch it with (a bug of the caller).
    #[error("the Kubernetes source is configured but has no client")]
    NoKubernetesClient,
}

/// The sources of one ingest node: a config directory, the Kubernetes API server, or both, and
/// the mesh config from a file, the `istio` ConfigMap, or the defaults.
#[derive(Debug, Clone)]
pub struct SourceSettings {
    /// Directory of Istio YAML/JSON.
    pub config_dir: Option<PathBuf>,
    /// Mesh config file; without one the `istio` ConfigMap (with Kubernetes) or the defaults apply.
    pub mesh_config: Option<PathBuf>,
    /// The Kubernetes API server to watch.
    pub kubernetes: Option<KubeSettings>,
    /// DNS suffix of Kubernetes service names (pilot's `--domain`).
    pub domain: String,
}

impl SourceSettings {
    /// Settings for a config directory alone, with the default domain.
    pub fn config_dir(dir: impl Into<PathBuf>) -> SourceSettings {
        SourceSettings {
            config_dir: Some(dir.into()),
            mesh_config: None,
            kubernetes: None,
            domain: DEFAULT_DOMAIN.into(),
        }
    }

    /// The sources [`start`] starts: ingest waits for each one's `InitDone` before it publishes.
    pub fn ids(&self) -> Vec<SourceId> {
        let mut ids = vec![SourceId::MeshConfig];
        if self.config_dir.is_some() {
            ids.push(SourceId::ConfigDir);
        }
        if self.kubernetes.is_some() {
            ids.push(SourceId::Kubernetes);
        }
        ids
    }
}

/// Starts every configured source (Kubernetes through `kube`, the process's client, which must be
/// there when `settings.kubernetes` is): each sends its initial state and `InitDone` to `events`, then
/// keeps watching in a task that ends when `drain` starts. Start the consumer first: a file
/// source's initial state is sent before this returns; Kubernetes sends its own when every kind
/// has listed. What the sources cannot read is counted in `metrics`.
///
/// Only a missing config directory or an unusable mesh config file at start-up is an error: later problems (a file that cannot be read, the
/// directory vanishing, the API server unreachable) keep the last good config in force and are
/// reported as config errors and in `metrics`, not by failing readiness.
pub async fn start<E>(
    settings: &SourceSettings,
    kube: Option<kube::Client>,
    events: mpsc::Sender<E>,
    metrics: SourceMetrics,
    drain: DrainWatcher,
) -> Result<(), SourceError>
where
    E: From<SourceEvent> + Send + 'static,
{
    // Checked before anything starts: on an error nothing keeps running.
    let kube = match (&settings.kubernetes, kube) {
        (Some(kube_settings), Some(client)) => Some((kube_settings, client)),
        (Some(_), None) => return Err(SourceError::NoKubernetesClient),
        (None, _) => None,
    };
    let domain = settings.domain.clone();
    match (&settings.mesh_config, &settings.kubernetes) {
        (Some(path), _) => {
            mesh_config::watch(path.clone(), domain.clone(), events.clone(), metrics.clone(), drain.clone()).await?
        }
        // The `istio` ConfigMap: the Kubernetes source sends the mesh config and its InitDone.
        (None, Some(_)) => {}
        (None, None) => {
            let mesh = MeshConfig { domain: domain.clone(), ..MeshConfig::default() };
            let _ = events.send(SourceEvent::Mesh(Arc::new(mesh)).into()).await;
            let _ = events.send(SourceEvent::InitDone(SourceId::MeshConfig).into()).await;
        }
    }
    if let Some((kube_settings, client)) = kube {
        let owns_mesh = settings.mesh_config.is_none();
        kubernetes::watch(client, kube_settings, owns_mesh, domain, events.clone(), metrics.clone(), drain.clone());
    }
    if let Some(dir) = &settings.config_dir {
        config_dir::watch(dir.clone(), events, metrics, drain)
            .await
            .map_err(|source| SourceError::ConfigDir { dir: display(dir), source })?;
    }
    Ok(())
}

fn display(path: &Path) -> String {
    path.display().to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::registry::kubernetes::{KubeKey, KubeKind, KubeNamespace, KubeObject};

    #[tokio::test]
    async fn the_default_mesh_config_carries_the_domain() {
        let dir = tempfile::tempdir().unwrap();
        let settings = SourceSettings { domain: "corp.internal".into(), ..SourceSettings::config_dir(dir.path()) };
        let (events, mut rx) = mpsc::channel::<SourceEvent>(16);
        let (_trigger, drain) = crate::drain::new();
        start(&settings, None, events, SourceMetrics::default(), drain).await.unwrap();
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
