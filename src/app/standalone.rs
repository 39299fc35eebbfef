//! Standalone: an ingest node and an xDS frontend in one process, joined by the in-memory
//! snapshot channel instead of the network. The embedded default.

use std::net::SocketAddr;
use std::sync::Arc;

use futures::TryFutureExt;
use tracing::info;

use super::security::{self, SecuritySettings, SharedCa};
use super::servers;
use super::tasks::Tasks;
use super::upkeep::{self, Leading, Upkeep};
use super::{clients, pipeline, webhook, Process, RoleError};
use crate::admin::{AdminState, DebugAccess, XdsState};
use crate::drain::DrainWatcher;
use crate::ingest::DebounceSettings;
use crate::readiness::Ready;
use crate::source::SourceSettings;
use crate::webhook::WebhookSettings;
use crate::xds::AdmissionSettings;
use crate::xds::AdsServer;
use crate::xds::ConnectionRegistry;
use crate::xds::XdsMetrics;

/// Settings of a standalone process.
#[derive(Debug, Clone)]
pub struct StandaloneSettings {
    /// Config directory and mesh config.
    pub sources: SourceSettings,
    /// Debounce timing.
    pub debounce: DebounceSettings,
    /// ADS (gRPC) address.
    pub xds_addr: SocketAddr,
    /// Admin (HTTP) address.
    pub admin_addr: SocketAddr,
    /// New-stream rate, push concurrency and stream age of the xDS server.
    pub admission: AdmissionSettings,
    /// Whether the plaintext xDS port (`xds_addr`) is served.
    pub plaintext_xds: bool,
    /// The CA and the secure xDS port.
    pub security: SecuritySettings,
    /// Istio's validating webhook; `None`: off.
    pub webhook: Option<WebhookSettings>,
}

/// Runs until the drain starts.
pub async fn run(settings: StandaloneSettings, process: Process, drain: DrainWatcher) -> Result<(), RoleError> {
    let ready = Ready::new();
    let mut tasks = Tasks::new(&drain);
    let first_snapshot = ready.register_task("first snapshot");
    let xds_bound = ready.register_task("xDS listener");
    let (xds_listener, secure_listener) =
        servers::bind_xds(settings.plaintext_xds, settings.xds_addr, settings.security.secure_xds_addr).await?;
    let admin_listener = servers::bind("admin server", settings.admin_addr).await?;
    let webhook_listener = webhook::bind(settings.webhook.as_ref()).await?;
    let kube = clients::kubernetes(settings.sources.kubernetes.as_ref().map(|k| &k.cluster)).await?;

    // Term 1: a standalone process is its own, permanent leader.
    let (sources, debounce) = (&settings.sources, settings.debounce);
    let pipeline = pipeline::start(sources, kube.clone(), debounce, 1, first_snapshot, &process, &mut tasks).await?;
    let reader = pipeline.snapshots;

    let xds_metrics = XdsMetrics::register(&process.registry);
    let connections = Arc::new(ConnectionRegistry::new(xds_metrics.clone()));
    let ads = AdsServer::new(reader.clone(), connections.clone(), xds_metrics, drain.clone(), settings.admission)
        .with_server_id("standalone");
    let ca = SharedCa::new(&settings.security, kube.as_ref(), &drain);
    let secure = match secure_listener {
        Some(listener) => {
            let authority = ca.get().await?;
            let (security, registry) = (&settings.security, &process.registry);
            Some((
                listener,
                security::start(security, authority, kube.clone(), reader.clone(), registry, &mut tasks).await?,
            ))
        }
        None => None,
    };
    let publish_root = secure.is_some() || settings.webhook.is_some();
    let webhook = settings.webhook.as_ref().zip(webhook_listener);
    let upkeep = Upkeep { ca: &ca, kube, publish_root, webhook, leading: Leading::Always };
    let webhook = upkeep::start(upkeep, &process.registry, &mut tasks).await?;
    let admin_state = AdminState {
        history: crate::admin::follow_history(reader.clone()),
        snapshots: reader,
        xds: Some(XdsState { connections, cache: ads.cache() }),
        ready,
        metrics: process.registry.clone(),
        identity: "standalone".into(),
        node_status: None,
        renders: crate::admin::render_limit(),
        debug_access: secure.as_ref().map(|(_, security)| DebugAccess {
            authn: security.authn.clone(),
            namespace: settings.security.namespace.clone(),
        }),
    };
    info!(config_dir = ?settings.sources.config_dir, kubernetes = settings.sources.kubernetes.is_some(), "standalone meshpilot started");
    drop(xds_bound);
    // The servers stop once the drain started, and the tasks with them; a failed server or task
    // ends the role, and the rest are dropped.
    tokio::try_join!(
        servers::serve_xds_ports(xds_listener, secure, ads, drain.clone()).map_err(RoleError::from),
        servers::serve_admin(admin_listener, admin_state, drain.clone()).map_err(RoleError::from),
        webhook::serve(webhook, drain).map_err(RoleError::from),
        tasks.supervise().map_err(RoleError::from),
    )?;
    Ok(())
}
