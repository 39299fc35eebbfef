//! What a leading role keeps in the cluster and serves for it, written once for a standalone
//! process (always its own leader) and an ingest node (while elected): the CA's root in every
//! namespace's `istio-ca-root-cert`, and the validating webhook with its configuration's
//! `caBundle`. Every ingest node serves the webhook; only the leader writes to the cluster.

use tokio::net::TcpListener;
use tokio::sync::watch;

use super::security::{self, SharedCa};
use super::tasks::Tasks;
use super::webhook::{self, Webhook};
use super::RoleError;
use crate::telemetry::metrics::Registry;
use crate::webhook::WebhookSettings;

/// When this process writes to the cluster.
pub enum Leading {
    /// Always: a standalone process is its own, permanent leader.
    Always,
    /// While the flag holds: an ingest node, while elected.
    While(watch::Receiver<bool>),
}

impl Leading {
    fn flag(&self) -> Option<watch::Receiver<bool>> {
        match self {
            Leading::Always => None,
            Leading::While(flag) => Some(flag.clone()),
        }
    }
}

/// What the upkeep covers.
pub struct Upkeep<'a> {
    /// The process's CA.
    pub ca: &'a SharedCa,
    /// The process's Kubernetes client; `None`: nothing is written to a cluster.
    pub kube: Option<kube::Client>,
    /// Whether the CA's root is published (with `kube`).
    pub publish_root: bool,
    /// The webhook's settings and its bound listener, when it is on.
    pub webhook: Option<(&'a WebhookSettings, TcpListener)>,
    /// When this process writes to the cluster.
    pub leading: Leading,
}

/// Starts the root publisher and the webhook (its certificate from the CA, loaded now if the
/// webhook is on); the webhook is returned ready to serve.
pub async fn start(upkeep: Upkeep<'_>, registry: &Registry, tasks: &mut Tasks) -> Result<Option<Webhook>, RoleError> {
    let Upkeep { ca, kube, publish_root, webhook, leading } = upkeep;
    if let (true, Some(client)) = (publish_root, kube.clone()) {
        security::keep_root_published(client, ca.clone(), leading.flag(), tasks);
    }
    let Some((settings, listener)) = webhook else { return Ok(None) };
    let authority = ca.get().await?;
    let webhook =
        webhook::start(settings, listener, authority, ca.namespace(), kube, leading.flag(), registry, tasks).await?;
    Ok(Some(webhook))
}
