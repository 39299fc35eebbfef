//! A distributed frontend: follows the leader's snapshots (found through etcd), registers itself
//! as a member, and serves ADS to the proxies that reach it.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::TryFutureExt;
use serde::Serialize;
use serde_json::json;
use tokio::sync::watch;
use tracing::info;

use super::security::{self, SecuritySettings};
use super::servers;
use super::tasks::Tasks;
use super::{clients, Process, RoleError};
use crate::admin::{AdminState, DebugAccess, NodeStatus, XdsState};
use crate::cluster::election::{LeaderWatch, DEFAULT_ELECTION_NAME};
use crate::cluster::membership::{Members, MembersWatch, MembershipSettings, Registration, DEFAULT_PREFIX};
use crate::cluster::metrics::ClusterMetrics;
use crate::cluster::ownership::{Ownership, ProxyHashing, ProxyKey};
use crate::drain::DrainWatcher;
use crate::readiness::Ready;
use crate::replication::metrics::ReplicationMetrics;
use crate::replication::{SnapshotSubscriber, SubscriberSettings, SubscriberStatus};
use crate::snapshot;
use crate::source::kubernetes::ClusterChoice;
use crate::telemetry::metrics::gauge_value;
use crate::telemetry::process::ProcessMetrics;
use crate::xds::AdmissionSettings;
use crate::xds::AdsServer;
use crate::xds::ConnectionRegistry;
use crate::xds::XdsMetrics;

/// Settings of a frontend node.
#[derive(Debug, Clone)]
pub struct FrontendNodeSettings {
    /// etcd endpoints.
    pub etcd_endpoints: Vec<String>,
    /// TLS towards etcd.
    pub etcd_tls: crate::cluster::etcd::EtcdTls,
    /// ADS (gRPC) address.
    pub xds_addr: SocketAddr,
    /// Admin (HTTP) address.
    pub admin_addr: SocketAddr,
    /// Member id (unique among frontends).
    pub id: String,
    /// The xDS address registered for this frontend.
    pub advertise_addr: String,
    /// How proxies are keyed for the consistent hash.
    pub proxy_key: ProxyKey,
    /// Membership lease TTL.
    pub lease_ttl: Duration,
    /// New-stream rate, push concurrency and stream age of the xDS server.
    pub admission: AdmissionSettings,
    /// Whether the plaintext xDS port (`xds_addr`) is served.
    pub plaintext_xds: bool,
    /// The CA and the secure xDS port.
    pub security: SecuritySettings,
    /// The API server tokens are reviewed with (and the CA Secret read from).
    pub kubernetes: Option<ClusterChoice>,
}

/// Owned and foreign proxy counts at one moment.
#[derive(Debug, Clone, Default, Serialize, PartialEq, Eq)]
pub struct OwnershipSummary {
    /// Frontends in the ring.
    pub members: usize,
    /// Connected proxies this frontend owns.
    pub owned: usize,
    /// Connected proxies another frontend owns (they still get correct config here).
    pub foreign: usize,
    /// Up to 20 foreign proxies with their owner, for debugging the load balancer.
    pub foreign_sample: Vec<(String, String)>,
}

/// Runs until the drain starts; the membership is revoked before the process exits.
pub async fn run(settings: FrontendNodeSettings, process: Process, drain: DrainWatcher) -> Result<(), RoleError> {
    let ready = Ready::new();
    let mut tasks = Tasks::new(&drain);
    let first_snapshot = ready.register_task("first snapshot from the leader");
    let (xds_listener, secure_listener) =
        servers::bind_xds(settings.plaintext_xds, settings.xds_addr, settings.security.secure_xds_addr).await?;
    let admin_listener = servers::bind("admin server", settings.admin_addr).await?;
    let client = crate::cluster::etcd::connect_with_tls(&settings.etcd_endpoints, &settings.etcd_tls).await?;

    let leader_watch = LeaderWatch::new(client.clone(), DEFAULT_ELECTION_NAME);
    let leader = leader_watch.leader();
    let w = drain.clone();
    tasks.spawn_finishing("leader watch", async move { leader_watch.run(w.draining()).await });

    let link_mtls = !settings.security.insecure_snapshot_stream;
    if !link_mtls {
        security::warn_insecure_snapshot_stream("frontend");
    }
    let needs_ca = settings.security.secure_xds_addr.is_some() || link_mtls;
    // Only the CA and token reviews use Kubernetes here: without them no client is made.
    let kube = match needs_ca {
        true => clients::kubernetes(settings.kubernetes.as_ref()).await?,
        false => None,
    };
    // One CA for the secure port and the link to the leader.
    let ca = match needs_ca {
        true => Some(security::load_ca(&settings.security, kube.as_ref(), &drain).await?),
        false => None,
    };
    let mut subscriber_settings = SubscriberSettings::new(settings.id.clone());
    if let (true, Some(ca)) = (link_mtls, &ca) {
        // The leader must prove it is an ingest node: etcd only names an address.
        let (link, leader) = security::frontend_link(ca.clone(), &settings.security.namespace).await?;
        subscriber_settings.tls = Some(link);
        subscriber_settings.leader_identity = Some(leader);
    }
    let (writer, reader) = snapshot::channel();
    let subscriber = SnapshotSubscriber::new(subscriber_settings, leader, writer);
    let sub_status = subscriber.status();
    tasks.spawn_finishing("snapshot subscriber", subscriber.run(drain.clone()));
    let replication_metrics = ReplicationMetrics::register(&process.registry);
    let exported = export_subscriber_metrics(sub_status.clone(), replication_metrics, process.metrics.clone());
    tasks.spawn("subscriber metrics", exported);
    let mut first = reader.clone();
    tasks.spawn_once("first snapshot", async move {
        first.first().await;
        drop(first_snapshot);
    });

    let mut membership = MembershipSettings::new(settings.id.clone(), settings.advertise_addr.clone());
    membership.ttl = settings.lease_ttl;
    let registration = Registration::new(client.clone(), membership);
    let registered = registration.registered();
    let w = drain.clone();
    // Held until the registration is revoked: the member leaves the ring before the process exits.
    tasks.spawn_finishing("membership registration", async move { registration.run(w.draining()).await });
    let members_watch = MembersWatch::new(client, DEFAULT_PREFIX);
    let members = members_watch.members();
    let w = drain.clone();
    tasks.spawn_finishing("members watch", async move { members_watch.run(w.draining()).await });

    let xds_metrics = XdsMetrics::register(&process.registry);
    let connections = Arc::new(ConnectionRegistry::new(xds_metrics.clone()));
    let cluster_metrics = ClusterMetrics::register(&process.registry);
    let (summary_tx, summary) = watch::channel(OwnershipSummary::default());
    let tracking = track_ownership(
        settings.id.clone(),
        settings.proxy_key,
        members.clone(),
        connections.clone(),
        summary_tx,
        cluster_metrics,
    );
    tasks.spawn("ownership tracking", tracking);

    let ads = AdsServer::new(reader.clone(), connections.clone(), xds_metrics, drain.clone(), settings.admission)
        .with_server_id(&format!("frontend/{}", settings.id));
    let secure = match (secure_listener, ca) {
        (Some(listener), Some(ca)) => Some((
            listener,
            security::start(&settings.security, ca, kube, reader.clone(), &process.registry, &mut tasks).await?,
        )),
        _ => None,
    };
    let admin_state = AdminState {
        history: crate::admin::follow_history(reader.clone()),
        snapshots: reader,
        xds: Some(XdsState { connections, cache: ads.cache() }),
        ready,
        metrics: process.registry.clone(),
        identity: format!("frontend/{}", settings.id),
        node_status: Some(node_status(settings.id.clone(), sub_status, registered, summary, members)),
        renders: crate::admin::render_limit(),
        debug_access: secure.as_ref().map(|(_, security)| DebugAccess {
            authn: security.authn.clone(),
            namespace: settings.security.namespace.clone(),
        }),
    };
    info!(id = %settings.id, advertise = %settings.advertise_addr, "frontend started");
    tokio::try_join!(
        servers::serve_xds_ports(xds_listener, secure, ads, drain.clone()).map_err(RoleError::from),
        servers::serve_admin(admin_listener, admin_state, drain).map_err(RoleError::from),
        tasks.supervise().map_err(RoleError::from),
    )?;
    Ok(())
}

/// Publishes the subscriber's lag, term and reconnects as metrics, every second and on change.
async fn export_subscriber_metrics(
    mut status: watch::Receiver<SubscriberStatus>,
    metrics: ReplicationMetrics,
    process: ProcessMetrics,
) {
    let mut behind_since: Option<Instant> = None;
    loop {
        let s = status.borrow_and_update().clone();
        let lag = s.lag();
        metrics.snapshot_lag_versions.set(gauge_value(lag));
        // The status counts reconnects; the counter catches up with it.
        metrics
            .snapshot_stream_reconnects
            .inc_by(s.reconnects.saturating_sub(metrics.snapshot_stream_reconnects.get()));
        metrics.set_followed_term(s.highest_term);
        if let Some(held) = s.held {
            process.set_snapshot_version(held.term, held.seq);
        }
        behind_since = if lag > 0 { behind_since.or(Some(Instant::now())) } else { None };
        metrics.snapshot_lag_seconds.set(behind_since.map_or(0.0, |t| t.elapsed().as_secs_f64()));
        tokio::select! {
            changed = status.changed() => if changed.is_err() { return },
            _ = tokio::time::sleep(Duration::from_secs(1)) => {}
        }
    }
}

/// Recomputes which connected proxies this frontend owns every second and on membership
/// changes, publishing the counts to metrics and `summary`.
async fn track_ownership(
    my_id: String,
    proxy_key: ProxyKey,
    mut members: watch::Receiver<Members>,
    connections: Arc<ConnectionRegistry>,
    summary: watch::Sender<OwnershipSummary>,
    metrics: ClusterMetrics,
) {
    loop {
        let current = members.borrow_and_update().clone();
        metrics.members.set(gauge_value(current.len()));
        let ring = Ownership::new(current.ids().map(str::to_string), ProxyHashing::default()).ok();
        let mut s = OwnershipSummary { members: current.len(), ..Default::default() };
        for conn in connections.snapshot() {
            let key = proxy_key.of(&conn.proxy.identity());
            match ring.as_ref().and_then(|r| r.owner(&key)) {
                Some(owner) if owner != my_id => {
                    s.foreign += 1;
                    if s.foreign_sample.len() < 20 {
                        s.foreign_sample.push((conn.proxy.id.clone(), owner.to_string()));
                    }
                }
                // No ring yet (etcd unreachable at start): every proxy here counts as owned.
                _ => s.owned += 1,
            }
        }
        metrics.proxies.with_label_values(&["owned"]).set(gauge_value(s.owned));
        metrics.proxies.with_label_values(&["foreign"]).set(gauge_value(s.foreign));
        summary.send_replace(s);
        tokio::select! {
            changed = members.changed() => if changed.is_err() { return },
            _ = tokio::time::sleep(Duration::from_secs(1)) => {}
        }
    }
}

fn node_status(
    id: String,
    sub: watch::Receiver<SubscriberStatus>,
    registered: watch::Receiver<bool>,
    ownership: watch::Receiver<OwnershipSummary>,
    members: watch::Receiver<Members>,
) -> NodeStatus {
    Arc::new(move || {
        let s = sub.borrow().clone();
        json!({
            "role": "frontend",
            "id": id,
            "registered": *registered.borrow(),
            "leader": s.leader.as_ref().map(|l| json!({"addr": l.addr, "term": l.term})),
            "connected": s.connected,
            "held": s.held.map(|v| v.to_string()),
            "leader_latest": s.leader_latest.map(|v| v.to_string()),
            "lag": s.lag(),
            "highest_term": s.highest_term,
            "reconnects": s.reconnects,
            "fulls_applied": s.fulls_applied,
            "deltas_applied": s.deltas_applied,
            "refused_lower_term": s.refused_lower_term,
            "resyncs": s.resyncs,
            "ownership": *ownership.borrow(),
            "members": members.borrow().as_slice(),
        })
    })
}
