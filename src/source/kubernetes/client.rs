//! Connecting to the API server: a kubeconfig file, or the cluster inferred as kubectl does.

use std::path::PathBuf;

use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, Config};

/// Why the Kubernetes source cannot start.
#[derive(Debug, thiserror::Error)]
pub enum KubeError {
    /// No usable cluster configuration.
    #[error("kubernetes client configuration: {0}")]
    Config(String),
}

/// Which cluster to watch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClusterChoice {
    /// In-cluster service account, else `KUBECONFIG`, else `~/.kube/config` (`--kubernetes`).
    Infer,
    /// This kubeconfig file, at its current context (`--kubeconfig FILE`).
    Kubeconfig(PathBuf),
}

/// Builds a client for `choice`. A kubeconfig whose server is `http://` works: local test clusters
/// serve plain HTTP with a bearer token.
pub async fn connect(choice: &ClusterChoice) -> Result<Client, KubeError> {
    let config = match choice {
        ClusterChoice::Infer => Config::infer().await.map_err(|e| KubeError::Config(e.to_string()))?,
        ClusterChoice::Kubeconfig(path) => {
            let file = Kubeconfig::read_from(path)
                .map_err(|e| KubeError::Config(format!("kubeconfig {}: {e}", path.display())))?;
            Config::from_custom_kubeconfig(file, &KubeConfigOptions::default())
                .await
                .map_err(|e| KubeError::Config(format!("kubeconfig {}: {e}", path.display())))?
        }
    };
    Client::try_from(config).map_err(|e| KubeError::Config(e.to_string()))
}
