//! The validating webhook of a role (ingest or standalone): its listener, bound at start with
//! the others; its TLS from the CA; and, with Kubernetes, the `caBundle` of its
//! ValidatingWebhookConfiguration, kept by the leader (a standalone process is its own).

use std::sync::Arc;

use tokio::net::TcpListener;
use tokio::sync::watch;

use super::servers::{self, ServeError};
use super::tasks::Tasks;
use crate::drain::DrainWatcher;
use crate::security::ca::CertificateAuthority;
use crate::telemetry::metrics::Registry;
use crate::webhook::metrics::WebhookMetrics;
use crate::webhook::server::{self, WebhookTlsError};
use crate::webhook::{ca_bundle, WebhookSettings};

/// A webhook ready to serve.
pub struct Webhook {
    listener: TcpListener,
    tls: Arc<rustls::ServerConfig>,
    metrics: WebhookMetrics,
}

/// Binds the webhook's address, when it is on.
pub async fn bind(settings: Option<&WebhookSettings>) -> Result<Option<TcpListener>, ServeError> {
    match settings {
        Some(s) => Ok(Some(servers::bind("validating webhook", s.addr).await?)),
        None => Ok(None),
    }
}

/// Issues the webhook's certificate from `ca` for its Service in `namespace`, and with `kube`
/// keeps its configuration's `caBundle` while `is_leader` (`None`: always, a standalone process).
#[allow(clippy::too_many_arguments)]
pub async fn start(
    settings: &WebhookSettings,
    listener: TcpListener,
    ca: Arc<CertificateAuthority>,
    namespace: &str,
    kube: Option<kube::Client>,
    is_leader: Option<watch::Receiver<bool>>,
    registry: &Registry,
    tasks: &mut Tasks,
) -> Result<Webhook, WebhookTlsError> {
    let w = tasks.drain().clone();
    let hosts = settings.serving_hosts(namespace);
    let tls = server::tls_config(ca.clone(), &hosts, async move { w.draining().await }).await?;
    if let Some(client) = kube {
        keep_ca_bundle(client, settings.config_name.clone(), ca.root_pem().to_string(), is_leader, tasks);
    }
    Ok(Webhook { listener, tls, metrics: WebhookMetrics::register(registry) })
}

/// Serves `webhook`, if any, until the drain starts.
pub async fn serve(webhook: Option<Webhook>, drain: DrainWatcher) -> Result<(), ServeError> {
    let Some(Webhook { listener, tls, metrics }) = webhook else { return Ok(()) };
    let addr = listener.local_addr().unwrap_or_else(|_| std::net::SocketAddr::from(([0, 0, 0, 0], 0)));
    server::serve(listener, tls, metrics, async move { drain.draining().await })
        .await
        .map_err(|source| ServeError::Webhook { addr, source })
}

/// Keeps the configuration `name`'s `caBundle` at `root_pem` while `is_leader` holds (always without it).
fn keep_ca_bundle(
    client: kube::Client,
    name: String,
    root_pem: String,
    is_leader: Option<watch::Receiver<bool>>,
    tasks: &mut Tasks,
) {
    let drain = tasks.drain().clone();
    let Some(is_leader) = is_leader else {
        let kept = async move { ca_bundle::run(client, name, root_pem, async move { drain.draining().await }).await };
        tasks.spawn_finishing("webhook caBundle", kept);
        return;
    };
    let kept = super::leadership::while_leading(is_leader, drain, move |stop| {
        ca_bundle::run(client.clone(), name.clone(), root_pem.clone(), stop)
    });
    tasks.spawn_finishing("webhook caBundle", kept);
}
