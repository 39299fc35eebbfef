//! An ingest node: watches the sources, builds snapshots, campaigns for leadership through etcd,
//! and serves its snapshots to frontends while (and only while) it is the leader.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use serde_json::json;
use tokio::sync::{mpsc, watch};
use tracing::{info, warn};

use super::{sources, DebounceSettings, IngestEvent, EVENT_QUEUE};
use crate::admin::{self, AdminState, NodeStatus};
use crate::election::{Candidate, ElectionSettings, Leadership};
use crate::snapshot::subscription::{ServerSettings, SnapshotServer};
use crate::snapshot::{self, SnapshotReader, SnapshotWriter};
use crate::telemetry::metrics::METRICS;
use crate::xds::cache::GenerationCache;
use crate::xds::status::ConnectionRegistry;

/// Settings of an ingest node.
#[derive(Debug, Clone)]
pub struct IngestNodeSettings {
    /// etcd endpoints (`http://host:port`).
    pub etcd_endpoints: Vec<String>,
    /// Directory of Istio config.
    pub config_dir: PathBuf,
    /// Mesh config file.
    pub mesh_config: Option<PathBuf>,
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
}

/// Why an ingest node stopped.
#[derive(Debug, thiserror::Error)]
pub enum IngestNodeError {
    /// etcd could not be used.
    #[error(transparent)]
    Etcd(#[from] crate::etcd::EtcdError),
    /// A source could not start.
    #[error(transparent)]
    Sources(#[from] sources::SourceError),
    /// A listener failed.
    #[error("{what} on {addr}: {reason}")]
    Listener {
        /// Which listener.
        what: &'static str,
        /// Address.
        addr: SocketAddr,
        /// Cause.
        reason: String,
    },
}

/// Runs until `shutdown` flips to true.
pub async fn run(settings: IngestNodeSettings, shutdown: watch::Receiver<bool>) -> Result<(), IngestNodeError> {
    let client = crate::etcd::connect(&settings.etcd_endpoints).await?;
    let (events_tx, events_rx) = mpsc::channel(EVENT_QUEUE);
    let (local_writer, local) = snapshot::channel();
    // Standbys build snapshots too (term 0 until they lead), so a failover starts warm.
    let ingest_task = tokio::spawn(super::run(events_rx, local_writer, 0, settings.debounce));
    sources::start(&settings.config_dir, settings.mesh_config.as_ref(), events_tx.clone()).await?;

    let mut election = ElectionSettings::new(settings.id.clone(), settings.advertise_addr.clone());
    election.ttl = settings.lease_ttl;
    let candidate = Candidate::new(client, election);
    let leadership = candidate.leadership();
    tokio::spawn(candidate.run(crate::frontend::wait_for(shutdown.clone())));

    let (is_leader_tx, is_leader) = watch::channel(false);
    let (published_writer, published) = snapshot::channel();
    tokio::spawn(follow_leadership(leadership.clone(), events_tx, is_leader_tx));
    tokio::spawn(publish_when_leading(local.clone(), leadership.clone(), published_writer));

    let server = SnapshotServer::new(published, is_leader, ServerSettings::default());
    let status = node_status(&settings, leadership, server.clone(), local.clone());
    let listener = tokio::net::TcpListener::bind(settings.snapshot_addr).await.map_err(|e| {
        IngestNodeError::Listener { what: "snapshot server", addr: settings.snapshot_addr, reason: e.to_string() }
    })?;
    info!(id = %settings.id, addr = %settings.snapshot_addr, advertise = %settings.advertise_addr, "snapshot server listening");
    let grpc = tonic::transport::Server::builder().add_service(server.into_service()).serve_with_incoming_shutdown(
        tokio_stream::wrappers::TcpListenerStream::new(listener),
        crate::frontend::wait_for(shutdown.clone()),
    );
    let admin_state = AdminState {
        snapshots: local,
        connections: Arc::new(ConnectionRegistry::default()),
        cache: Arc::new(GenerationCache::default()),
        identity: format!("ingest/{}", settings.id),
        node_status: Some(status),
    };
    let admin = admin::serve(settings.admin_addr, admin_state, crate::frontend::wait_for(shutdown));
    let (grpc, admin) = tokio::join!(grpc, admin);
    ingest_task.abort();
    grpc.map_err(|e| IngestNodeError::Listener {
        what: "snapshot server",
        addr: settings.snapshot_addr,
        reason: e.to_string(),
    })?;
    admin.map_err(|e| IngestNodeError::Listener {
        what: "admin server",
        addr: settings.admin_addr,
        reason: e.to_string(),
    })
}

/// Turns leadership changes into a new term for the ingest loop and the "is leader" flag that
/// gates the snapshot server (flipped first on loss, so a deposed node stops serving at once).
async fn follow_leadership(
    mut leadership: watch::Receiver<Leadership>,
    events: mpsc::Sender<IngestEvent>,
    is_leader: watch::Sender<bool>,
) {
    loop {
        let current = *leadership.borrow_and_update();
        match current {
            Leadership::Leader { term } => {
                info!(term, "elected leader");
                METRICS.leader_elections.inc();
                METRICS.leader_term.set(i64::try_from(term).unwrap_or(i64::MAX));
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
        METRICS.is_leader.set(i64::from(current.is_leader()));
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
        })
    })
}
