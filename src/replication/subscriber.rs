//! The frontend side: follows the leader's snapshot stream and republishes it locally.

use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tonic::transport::{Channel, Endpoint};
use tracing::{debug, info, info_span, warn, Instrument};

use super::apply::{prepare, Held, Verdict};
use super::status::SubscriberStatus;
use crate::backoff::Backoff;
use crate::cluster::election::LeaderInfo;
use crate::drain::DrainWatcher;
use crate::replication::wire::proto::snapshot_service_client::SnapshotServiceClient;
use crate::replication::wire::proto::{SubscribeRequest, UpdateKind};
use crate::replication::wire::{version_to_wire, Assembler, EncodedUpdate, WireError};
use crate::security::link::{LinkTls, INGEST_SERVICE_ACCOUNT};
use crate::security::Identity;
use crate::snapshot::{SnapshotWriter, Version};
use crate::telemetry::trace;

/// How a subscriber identifies itself and retries.
#[derive(Debug, Clone)]
pub struct SubscriberSettings {
    /// Frontend id sent to the leader (logs).
    pub frontend_id: String,
    /// First reconnect delay.
    pub backoff_min: Duration,
    /// Longest reconnect delay.
    pub backoff_max: Duration,
    /// Connect timeout.
    pub connect_timeout: Duration,
    /// Mutual TLS to the leader (its certificate checked for the host it advertises); `None`:
    /// plaintext.
    pub tls: Option<Arc<LinkTls>>,
    /// With `tls`, the identity the leader's certificate must carry (an ingest node's); `None`:
    /// the ingest identity beside this process's own.
    pub leader_identity: Option<Identity>,
}

impl SubscriberSettings {
    /// Defaults: backoff 100 ms doubling to 2 s, 5 s connect timeout.
    pub fn new(frontend_id: impl Into<String>) -> Self {
        SubscriberSettings {
            frontend_id: frontend_id.into(),
            backoff_min: Duration::from_millis(100),
            backoff_max: Duration::from_secs(2),
            connect_timeout: Duration::from_secs(5),
            tls: None,
            leader_identity: None,
        }
    }
}

/// Why a subscription stream ended.
#[derive(Debug, thiserror::Error)]
pub enum SubscribeError {
    /// The leader could not be reached.
    #[error("connecting to {addr}: {source}")]
    Connect {
        /// Leader address.
        addr: String,
        /// Cause.
        source: tonic::transport::Error,
    },
    /// The leader refused or ended the stream with an error (UNAVAILABLE from a deposed leader).
    #[error("stream from {addr}: {status}")]
    Status {
        /// Leader address.
        addr: String,
        /// The gRPC status.
        status: Box<tonic::Status>,
    },
    /// The leader closed the stream.
    #[error("stream from {addr} ended")]
    Ended {
        /// Leader address.
        addr: String,
    },
    /// An update could not be decoded.
    #[error(transparent)]
    Wire(#[from] WireError),
    /// Mutual TLS to the leader could not be set up.
    #[error("TLS to the leader: {0}")]
    Tls(String),
    /// An update from a term below the highest seen: a deposed leader.
    #[error("refusing update {version}: term below the highest seen ({highest})")]
    Fenced {
        /// The refused version.
        version: Version,
        /// Highest term seen.
        highest: u64,
    },
    /// A delta that does not apply on the held version.
    #[error("delta {base:?} -> {version} does not apply on held {held:?}")]
    BaseMismatch {
        /// The delta's version.
        version: Version,
        /// Its base.
        base: Option<Version>,
        /// The held version.
        held: Option<Version>,
    },
    /// Applying an update failed unexpectedly.
    #[error("applying update {0}: task failed")]
    Apply(Version),
}

/// Follows the leader's snapshots and publishes them into a local snapshot channel. Keeps the last
/// good snapshot published while the leader is away.
#[derive(Debug)]
pub struct SnapshotSubscriber {
    settings: SubscriberSettings,
    leader: watch::Receiver<Option<LeaderInfo>>,
    writer: SnapshotWriter,
    status: watch::Sender<SubscriberStatus>,
}

impl SnapshotSubscriber {
    /// A subscriber that follows whatever leader `leader` names and publishes into `writer`.
    pub fn new(
        settings: SubscriberSettings,
        leader: watch::Receiver<Option<LeaderInfo>>,
        writer: SnapshotWriter,
    ) -> Self {
        let held = writer.current().map(|s| s.version);
        let status = watch::Sender::new(SubscriberStatus {
            held,
            highest_term: held.map_or(0, |v| v.term),
            ..Default::default()
        });
        SnapshotSubscriber { settings, leader, writer, status }
    }

    /// Its status, updated as it goes.
    pub fn status(&self) -> watch::Receiver<SubscriberStatus> {
        self.status.subscribe()
    }

    /// Runs until the drain starts.
    pub async fn run(self, drain: DrainWatcher) {
        let span = info_span!("snapshot_subscriber", frontend = %self.settings.frontend_id);
        tokio::select! {
            _ = drain.draining() => {}
            _ = self.follow().instrument(span) => {}
        }
    }

    async fn follow(mut self) {
        let mut held = Held::from_snapshot(self.writer.current());
        let mut backoff = Backoff::new(self.settings.backoff_min, self.settings.backoff_max);
        let mut require_full = false;
        let mut connected_before = false;
        loop {
            let Some(info) = wait_for_leader(&mut self.leader).await else {
                warn!("leader election gone; keeping the last snapshot");
                std::future::pending::<()>().await;
                return;
            };
            if std::mem::replace(&mut connected_before, true) {
                self.status.send_modify(|s| s.reconnects += 1);
            }
            held.observe_term(info.term);
            self.status.send_modify(|s| {
                s.leader = Some(info.clone());
                s.highest_term = held.highest_term;
            });
            let mut session = Session { sub: &self, held: &mut held, backoff: &mut backoff };
            let mut leader = self.leader.clone();
            let ended = tokio::select! {
                e = session.run(&info, require_full) => Some(e),
                _ = leader_changed(&mut leader, &info) => None,
            };
            let Some(Err(error)) = ended else {
                self.status.send_modify(|s| s.connected = false);
                info!(leader = %info.addr, "leader changed; reconnecting");
                continue;
            };
            self.status.send_modify(|s| {
                s.connected = false;
                s.last_error = Some(error.to_string());
            });
            require_full = matches!(error, SubscribeError::BaseMismatch { .. } | SubscribeError::Wire(_));
            let delay = backoff.next_delay();
            warn!(leader = %info.addr, %error, retry_in = ?delay, "snapshot subscription ended");
            tokio::select! {
                _ = tokio::time::sleep(delay) => {}
                _ = leader_changed(&mut leader, &info) => {}
            }
        }
    }
}

/// One subscription stream: connect, subscribe, apply updates until something ends it.
struct Session<'a> {
    sub: &'a SnapshotSubscriber,
    held: &'a mut Held,
    backoff: &'a mut Backoff,
}

impl Session<'_> {
    async fn run(&mut self, info: &LeaderInfo, require_full: bool) -> Result<Infallible, SubscribeError> {
        let addr = info.addr.clone();
        let mut client = connect(&addr, &self.sub.settings).await?;
        let request = SubscribeRequest {
            held: self.held.version.map(version_to_wire),
            frontend_id: self.sub.settings.frontend_id.clone(),
            trace_context: HashMap::new(),
            require_full,
        };
        let status_err =
            |addr: &str, status| SubscribeError::Status { addr: addr.to_string(), status: Box::new(status) };
        let mut stream = client.subscribe(request).await.map_err(|s| status_err(&addr, s))?.into_inner();
        info!(leader = %addr, held = ?self.held.version, require_full, "subscribed");
        self.sub.status.send_modify(|s| s.connected = true);
        let mut assembler = Assembler::default();
        loop {
            let chunk = match stream.message().await {
                Ok(Some(chunk)) => chunk,
                Ok(None) => return Err(SubscribeError::Ended { addr }),
                Err(status) => return Err(status_err(&addr, status)),
            };
            let Some(done) = assembler.push(chunk)? else { continue };
            if let Some(latest) = done.leader_latest {
                self.sub.status.send_modify(|s| s.leader_latest = Some(latest));
            }
            self.handle(done.update, &done.trace_context).await?;
        }
    }

    async fn handle(
        &mut self,
        update: EncodedUpdate,
        trace_context: &HashMap<String, String>,
    ) -> Result<(), SubscribeError> {
        let version = update.version;
        match self.held.check(&update) {
            Verdict::Apply => {}
            Verdict::NotNewer => {
                debug!(%version, held = ?self.held.version, "skipping update not newer than the held one");
                return Ok(());
            }
            Verdict::Fenced => {
                let highest = self.held.highest_term;
                self.sub.status.send_modify(|s| s.refused_lower_term += 1);
                return Err(SubscribeError::Fenced { version, highest });
            }
            Verdict::BaseMismatch => {
                self.sub.status.send_modify(|s| s.resyncs += 1);
                return Err(SubscribeError::BaseMismatch { version, base: update.base, held: self.held.version });
            }
        }
        let had_state = self.held.version.is_some();
        let kind = update.kind;
        let span = trace::snapshot_apply(version, kind.as_str_name(), trace_context);
        // The builder travels to the blocking pool and back: one owner, no lock.
        let mut builder = std::mem::take(&mut self.held.builder);
        let applied = tokio::task::spawn_blocking(move || {
            let snapshot = prepare(&mut builder, had_state, &update);
            (builder, snapshot)
        })
        .instrument(span.clone())
        .await;
        let snapshot = match applied {
            Ok((builder, snapshot)) => {
                self.held.builder = builder;
                snapshot?
            }
            Err(_) => {
                // The held state went with the failed build: only a full update can follow.
                self.held.version = None;
                return Err(SubscribeError::Apply(version));
            }
        };
        span.in_scope(|| {
            info!(%version, ?kind, full = snapshot.changes.full, changed = snapshot.changes.keys.len(), "snapshot applied");
            trace::register_snapshot(version, &span);
            if let Err(e) = self.sub.writer.publish(snapshot) {
                warn!(error = %e, "snapshot not published");
            }
        });
        self.held.commit(version);
        self.backoff.reset();
        let highest = self.held.highest_term;
        self.sub.status.send_modify(|s| {
            s.held = Some(version);
            s.highest_term = highest;
            match kind {
                UpdateKind::Delta => s.deltas_applied += 1,
                _ => s.fulls_applied += 1,
            }
        });
        Ok(())
    }
}

async fn connect(addr: &str, settings: &SubscriberSettings) -> Result<SnapshotServiceClient<Channel>, SubscribeError> {
    let timeout = settings.connect_timeout;
    let uri = if addr.contains("://") { addr.to_string() } else { format!("http://{addr}") };
    let err = |source| SubscribeError::Connect { addr: addr.to_string(), source };
    let endpoint = Endpoint::from_shared(uri)
        .map_err(err)?
        .connect_timeout(timeout)
        .tcp_nodelay(true)
        // Streams are idle between snapshots: keepalives notice a leader that vanished.
        .http2_keep_alive_interval(Duration::from_secs(10))
        .keep_alive_timeout(Duration::from_secs(10))
        .keep_alive_while_idle(true);
    let channel = match &settings.tls {
        // The connector does the TLS and checks the leader's identity; tonic sees plain HTTP/2.
        Some(link) => {
            let target = addr.split_once("://").map_or(addr, |(_, rest)| rest);
            let leader = match &settings.leader_identity {
                Some(id) => id.clone(),
                None => link.peer_identity(INGEST_SERVICE_ACCOUNT).map_err(|e| SubscribeError::Tls(e.to_string()))?,
            };
            let connector = link.connector(target, leader).map_err(|e| SubscribeError::Tls(e.to_string()))?;
            endpoint.connect_with_connector(connector).await.map_err(err)?
        }
        None => endpoint.connect().await.map_err(err)?,
    };
    Ok(SnapshotServiceClient::new(channel))
}

/// The current leader, waiting while there is none; `None` when the election's sender is gone.
async fn wait_for_leader(leader: &mut watch::Receiver<Option<LeaderInfo>>) -> Option<LeaderInfo> {
    leader.wait_for(Option::is_some).await.ok().and_then(|l| l.clone())
}

/// Resolves when the election names a different leader (or none); never if its sender is gone.
async fn leader_changed(leader: &mut watch::Receiver<Option<LeaderInfo>>, current: &LeaderInfo) {
    if leader.wait_for(|l| l.as_ref() != Some(current)).await.is_err() {
        std::future::pending::<()>().await;
    }
}
