//! What a source sends: [`SourceEvent`]s, each from one [`SourceId`].

use std::fmt;
use std::sync::Arc;

use crate::config::{ConfigError, ConfigKey, IgnoredObject, ValidConfig};
use crate::mesh::MeshConfig;
use crate::registry::kubernetes::{KubeKey, KubeObject};
use crate::telemetry::trace::EventTrace;

/// Which source an event comes from; ingest publishes nothing until every started source is done
/// with its initial state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum SourceId {
    /// The watched config directory.
    ConfigDir,
    /// The watched mesh config file, the `istio` ConfigMap, or the defaults.
    MeshConfig,
    /// The Kubernetes API server.
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
    /// The current list of rejected and ignored documents of one config source (sent before the
    /// changes found with it: ingest's leading edge waits for them).
    Status {
        /// The source whose lists these are (each source's replace only its own).
        source: SourceId,
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
