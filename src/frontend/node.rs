//! A distributed frontend: follows the leader's snapshots (found through etcd), registers itself
//! as a member, and serves ADS to the proxies that reach it.

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::json;
use tokio::sync::watch;
use tracing::info;

use super::ownership::{self, OwnershipSummary};
use super::{serve, wait_for, FrontendError, FrontendSettings};
use crate::admin::NodeStatus;
use crate::election::{LeaderWatch, DEFAULT_ELECTION_NAME};
use crate::membership::{MembersWatch, MembershipSettings, Registration, DEFAULT_PREFIX};
use crate::ownership::ProxyKey;
use crate::snapshot::subscription::{LeaderInfo, SnapshotSubscriber, SubscriberSettings, SubscriberStatus};
use crate::snapshot::{self};
use crate::telemetry::metrics::METRICS;
use crate::xds::status::ConnectionRegistry;

/// Settings of a frontend node.
#[derive(Debug, Clone)]
pub struct FrontendNodeSettings {
    /// etcd endpoints.
    pub etcd_endpoints: Vec<String>,
    /// Listeners and identity.
    pub frontend: FrontendSettings,
    /// Member id (unique among frontends).
    pub id: String,
    /// The xDS address registered for this frontend.
    pub advertise_addr: String,
    /// How proxies are keyed for the consistent hash.
    pub proxy_key: ProxyKey,
    /// Membership lease TTL.
    pub lease_ttl: Duration,
}

/// Why a frontend node stopped.
#[derive(Debug, thiserror::Error)]
pub enum FrontendNodeError {
    /// etcd could not be used.
    #[error(transparent)]
    Etcd(#[from] crate::etcd::EtcdError),
    /// A listener failed.
    #[error(transparent)]
    Frontend(#[from] FrontendError),
}

/// Runs until `shutdown` flips to true.
pub async fn run(settings: FrontendNodeSettings, shutdown: watch::Receiver<bool>) -> Result<(), FrontendNodeError> {
    let client = crate::etcd::connect(&settings.etcd_endpoints).await?;

    let leader_watch = LeaderWatch::new(client.clone(), DEFAULT_ELECTION_NAME);
    let leader = leader_watch.leader();
    tokio::spawn(leader_watch.run(wait_for(shutdown.clone())));
    let (leader_tx, leader_rx) = watch::channel(None);
    tokio::spawn(forward_leader(leader, leader_tx));

    let (writer, reader) = snapshot::channel();
    let subscriber = SnapshotSubscriber::new(SubscriberSettings::new(settings.id.clone()), leader_rx, writer);
    let sub_status = subscriber.status();
    tokio::spawn(subscriber.run(shutdown.clone()));
    tokio::spawn(export_subscriber_metrics(sub_status.clone()));

    let mut membership = MembershipSettings::new(settings.id.clone(), settings.advertise_addr.clone());
    membership.ttl = settings.lease_ttl;
    let registration = Registration::new(client.clone(), membership);
    let registered = registration.registered();
    tokio::spawn(registration.run(wait_for(shutdown.clone())));
    let members_watch = MembersWatch::new(client, DEFAULT_PREFIX);
    let members = members_watch.members();
    tokio::spawn(members_watch.run(wait_for(shutdown.clone())));

    let connections = Arc::new(ConnectionRegistry::default());
    let (summary_tx, summary) = watch::channel(OwnershipSummary::default());
    tokio::spawn(ownership::track(settings.id.clone(), settings.proxy_key, members, connections.clone(), summary_tx));

    info!(id = %settings.id, advertise = %settings.advertise_addr, "frontend started");
    let status = node_status(settings.id.clone(), sub_status, registered, summary);
    serve(settings.frontend, reader, connections, Some(status), shutdown).await?;
    Ok(())
}

/// Adapts the election's view of the leader to what the subscriber follows.
async fn forward_leader(
    mut from: watch::Receiver<Option<crate::election::LeaderInfo>>,
    to: watch::Sender<Option<LeaderInfo>>,
) {
    loop {
        let info = from.borrow_and_update().clone().map(|l| LeaderInfo { addr: l.addr, term: l.term });
        to.send_replace(info);
        if from.changed().await.is_err() {
            return;
        }
    }
}

async fn export_subscriber_metrics(mut status: watch::Receiver<SubscriberStatus>) {
    let mut behind_since: Option<Instant> = None;
    loop {
        let s = status.borrow_and_update().clone();
        let lag = s.lag();
        METRICS.snapshot_lag_versions.set(i64::try_from(lag).unwrap_or(i64::MAX));
        // The status counts reconnects; the counter catches up with it.
        METRICS
            .snapshot_stream_reconnects
            .inc_by(s.reconnects.saturating_sub(METRICS.snapshot_stream_reconnects.get()));
        METRICS.followed_term.set(i64::try_from(s.highest_term).unwrap_or(i64::MAX));
        if let Some(held) = s.held {
            crate::telemetry::metrics::set_snapshot_version(held);
        }
        behind_since = if lag > 0 { behind_since.or(Some(Instant::now())) } else { None };
        METRICS.snapshot_lag_seconds.set(behind_since.map_or(0.0, |t| t.elapsed().as_secs_f64()));
        tokio::select! {
            changed = status.changed() => if changed.is_err() { return },
            _ = tokio::time::sleep(Duration::from_secs(1)) => {}
        }
    }
}

fn node_status(
    id: String,
    sub: watch::Receiver<SubscriberStatus>,
    registered: watch::Receiver<bool>,
    ownership: watch::Receiver<OwnershipSummary>,
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
        })
    })
}
