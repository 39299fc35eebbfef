//! The process's clients of external systems, one per system: a role connects each once at start
//! and hands clones (cheap handles over one connection pool) to every consumer.

use crate::source::kubernetes::{client, ClusterChoice, KubeError};

/// The process's one Kubernetes client when a cluster is configured; the source watcher, the CA,
/// token reviews, the root ConfigMap and caBundle publishers all get clones of it.
pub async fn kubernetes(cluster: Option<&ClusterChoice>) -> Result<Option<kube::Client>, KubeError> {
    match cluster {
        Some(choice) => client::connect(choice).await.map(Some),
        None => Ok(None),
    }
}
