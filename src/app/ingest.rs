//! An ingest node: watches the sources, builds snapshots, campaigns for leadership through etcd,
//! and serves its snapshots to frontends while (and only while) it is the leader.
//!
//! Standbys build snapshots too (term 0 until they lead), so a failover starts warm. On shutdown
//! a leader resigns and revokes its lease before the process exits (the drain waits for it), so a
//! standby takes over at once instead of after the lease TTL.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use futures::TryFutureExt;
use serde_json::json;
use tokio::sync::{mpsc, watch};
use tracing::{info, warn};

use super::security::{self, SecuritySettings, SharedCa};
use super::servers;
use super::tasks::Tasks;
use super::upkeep::{self, Leading, Upkeep};
use super::{clients, pipeline, webhook, Process, RoleError};
use crate::admin::{AdminState, NodeStatus};
use crate::cluster::election::{Candidate, ElectionSettings, Leadership};
use crate::cluster::membership::{Members, MembersWatch, DEFAULT_PREFIX};
use crate::cluster::metrics::ClusterMetrics;
use crate::drain::DrainWatcher;
use crate::ingest::{DebounceSettings, IngestEvent};
use crate::readiness::Ready;
use crate::replication::metrics::ReplicationMetrics;
use crate::replication::{ServerSettings, SnapshotServer};
use crate::snapshot::{self, SnapshotReader, SnapshotWriter};
use crate::source::SourceSettings;
use crate::telemetry::metrics::gauge_value;
use crate::webhook::WebhookSettings;

/// Settings of an ingest node.
#[derive(Debug, Clone)]
pub struct IngestNodeSettings {
    /// etcd endpoints (`http://host:port`).
    pub etcd_endpoints: Vec<String>,
    /// TLS towards etcd.
    pub etcd_tls: crate::cluster::etcd::EtcdTls,
    /// Config directory and mesh config.
    pub sources: SourceSettings,
    /// Where the snapshot server listens.
    pub snapshot_addr: SocketAddr,
    /// The snapshot address frontends dial (advertised in etcd when leader).
    pub advertise_addr: String,
    /// Admin HTTP address.
    pub admin_addr: SocketAddr,
    /// Node id.
    pub id: String,
    /// Election lease TTL.
    pub lease_ttl: Duration,
    /// Debounce timing.
    pub debounce: DebounceSettings,
    /// Where the CA's key material comes from (its root is published while leading).
    pub security: SecuritySettings,
    /// Istio's validating webhook (every node serves it; the leader keeps its caBundle); `None`: off.
    pub webhook: Option<WebhookSettings>,
    /// Limits of the snapshot server (subscribers at once, queue, stall deadline).
    pub snapshot_server: ServerSettings,
}

/// Runs until the drain starts; a leader resigns before its task lets the drain complete.
pub async fn run(settings: IngestNodeSettings, process: Process, drain: DrainWatcher) -> Result<(), RoleError> {
    let ready = Ready::new();
    let mut tasks = Tasks::new(&drain);
    let first_snapshot = ready.register_task("first snapshot");
    let snapshot_listener = servers::bind("snapshot server", settings.snapshot_addr).await?;
    let admin_listener = servers::bind("admin server", settings.admin_addr).await?;
    let webhook_listener = webhook::bind(settings.webhook.as_ref()).await?;
    let client = crate::cluster::etcd::connect_with_tls(&settings.etcd_endpoints, &settings.etcd_tls).await?;
    let kube = clients::kubernetes(settings.sources.kubernetes.as_ref().map(|k| &k.cluster)).await?;

    // Standbys build snapshots too (term 0 until they lead), so a failover starts warm.
    let (sources, debounce) = (&settings.sources, settings.debounce);
    let pipeline = pipeline::start(sources, kube.clone(), debounce, 0, first_snapshot, &process, &mut tasks).await?;
    let (local, events_tx) = (pipeline.snapshots, pipeline.events);

    let cluster_metrics = ClusterMetrics::register(&process.registry);
    let mut election = ElectionSettings::new(settings.id.clone(), settings.advertise_addr.clone());
    election.ttl = settings.lease_ttl;
    let candidate = Candidate::new(client.clone(), election);
    let leadership = candidate.leadership();
    let campaign_drain = drain.clone();
    // The task holds its drain watcher until the candidate has resigned and revoked its lease.
    tasks.spawn_finishing("election campaign", async move { candidate.run(campaign_drain.draining()).await });

    let (is_leader_tx, is_leader) = watch::channel(false);
    let (published_writer, published) = snapshot::channel();
    tasks.spawn("leadership", follow_leadership(leadership.clone(), events_tx, is_leader_tx, cluster_metrics));
    tasks.spawn("leader's publisher", publish_when_leading(local.clone(), leadership.clone(), published_writer));

    // One CA for the snapshot stream's TLS, the webhook and the root the leader publishes.
    let ca = SharedCa::new(&settings.security, kube.as_ref(), &drain);
    // Mutual TLS unless explicitly turned off: snapshots carry every credentialName key.
    let snapshot_tls = match settings.security.insecure_snapshot_stream {
        false => Some(security::snapshot_server_tls(&settings.security, &ca, &settings.advertise_addr).await?),
        true => {
            security::warn_insecure_snapshot_stream("ingest");
            None
        }
    };
    // The leader keeps the CA's root (istio-ca-secret) published in every namespace.
    let webhook = settings.webhook.as_ref().zip(webhook_listener);
    let leading = Leading::While(is_leader.clone());
    let upkeep = Upkeep { ca: &ca, kube, publish_root: true, webhook, leading };
    let webhook = upkeep::start(upkeep, &process.registry, &mut tasks).await?;
    let replication_metrics = ReplicationMetrics::register(&process.registry);
    let server = SnapshotServer::with_metrics(published, is_leader, settings.snapshot_server, replication_metrics);
    // The frontends, shown at /debug/node: `meshpilot proxy-status` pointed here reaches them all.
    let members_watch = MembersWatch::new(client, DEFAULT_PREFIX);
    let members = members_watch.members();
    let w = drain.clone();
    tasks.spawn_finishing("members watch", async move { members_watch.run(w.draining()).await });
    let status = node_status(&settings, leadership, server.clone(), local.clone(), members);
    info!(id = %settings.id, advertise = %settings.advertise_addr, "ingest node started");
    let admin_state = AdminState {
        history: crate::admin::follow_history(local.clone()),
        snapshots: local,
        xds: None,
        ready,
        metrics: process.registry.clone(),
        identity: format!("ingest/{}", settings.id),
        node_status: Some(status),
        renders: crate::admin::render_limit(),
        debug_access: None,
    };
    tokio::try_join!(
        servers::serve_snapshots(snapshot_listener, server, snapshot_tls, drain.clone()).map_err(RoleError::from),
        servers::serve_admin(admin_listener, admin_state, drain.clone()).map_err(RoleError::from),
        webhook::serve(webhook, drain).map_err(RoleError::from),
        tasks.supervise().map_err(RoleError::from),
    )?;
    Ok(())
}

/// Turns leadership changes into a new term for the ingest loop and the "is leader" flag that
/// gates the snapshot server (flipped first on loss, so a deposed node stops serving at once).
async fn follow_leadership(
    mut leadership: watch::Receiver<Leadership>,
    events: mpsc::Sender<IngestEvent>,
    is_leader: watch::Sender<bool>,
    metrics: ClusterMetrics,
) {
    loop {
        let current = *leadership.borrow_and_update();
        match current {
            Leadership::Leader { term } => {
                info!(term, "elected leader");
                metrics.leader_elections.inc();
                metrics.leader_term.set(gauge_value(term));
                if events.send(IngestEvent::Term(term)).await.is_err() {
                    return;
                }
                is_leader.send_replace(true);
            }
            Leadership::Follower => {
                if is_leader.send_replace(false) {
                    warn!("lost leadership; stopped serving snapshots");
                }
            }
        }
        metrics.is_leader.set(i64::from(current.is_leader()));
        if leadership.changed().await.is_err() {
            is_leader.send_replace(false);
            return;
        }
    }
}

/// Forwards locally built snapshots to the snapshot server only when they belong to the term
/// this node currently leads: a standby's snapshots never leave the node.
async fn publish_when_leading(
    mut local: SnapshotReader,
    mut leadership: watch::Receiver<Leadership>,
    published: SnapshotWriter,
) {
    loop {
        let term = leadership.borrow_and_update().term();
        if let (Some(term), Some(snap)) = (term, local.current()) {
            if snap.version.term == term && published.current().is_none_or(|p| p.version < snap.version) {
                let _ = published.publish(snap);
            }
        }
        tokio::select! {
            next = local.next() => if next.is_none() { return },
            changed = leadership.changed() => if changed.is_err() { return },
        }
    }
}

fn node_status(
    settings: &IngestNodeSettings,
    leadership: watch::Receiver<Leadership>,
    server: SnapshotServer,
    local: SnapshotReader,
    members: watch::Receiver<Members>,
) -> NodeStatus {
    let id = settings.id.clone();
    let advertise = settings.advertise_addr.clone();
    Arc::new(move || {
        let l = *leadership.borrow();
        json!({
            "role": "ingest",
            "id": id,
            "advertise": advertise,
            "leader": l.is_leader(),
            "term": l.term(),
            "snapshot": local.current().map(|s| s.version.to_string()),
            "published": server.latest().map(|v| v.to_string()),
            "subscribers": server.subscribers(),
            "members": members.borrow().as_slice(),
        })
    })
}
