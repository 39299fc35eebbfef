//! The leader side: a gRPC `SnapshotService` that streams the ingest's snapshots to frontends.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};

use tokio::sync::{mpsc, watch};
use tokio_stream::Stream;
use tonic::{Request, Response, Status};
use tracing::{debug, info, info_span, warn, Instrument};

use super::history::History;
use super::metrics::ReplicationMetrics;
use crate::replication::wire::proto::snapshot_service_server::{SnapshotService, SnapshotServiceServer};
use crate::replication::wire::proto::{SnapshotChunk, SubscribeRequest};
use crate::replication::wire::version_from_wire;
use crate::snapshot::{SnapshotReader, Version};
use crate::telemetry::trace;

/// Message of the UNAVAILABLE status a deposed (or never elected) leader answers with.
pub const NOT_LEADER: &str = "not the leader";

/// Limits of the snapshot server.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ServerSettings {
    /// Deltas kept for resuming subscribers; one further behind gets a full snapshot.
    pub history: usize,
    /// Chunks buffered per subscriber; a slower subscriber is sent one coalesced update later.
    pub queue: usize,
}

impl Default for ServerSettings {
    fn default() -> Self {
        ServerSettings { history: 64, queue: 8 }
    }
}

/// Serves the snapshots of a `SnapshotReader` to subscribers while the "is leader" flag is true.
#[derive(Debug, Clone)]
pub struct SnapshotServer {
    shared: Arc<Shared>,
}

#[derive(Debug)]
struct Shared {
    history: watch::Receiver<Arc<History>>,
    is_leader: watch::Receiver<bool>,
    settings: ServerSettings,
    subscribers: AtomicUsize,
    metrics: ReplicationMetrics,
}

impl SnapshotServer {
    /// Follows `snapshots` (in a task, so call it inside a Tokio runtime). Streams are served only
    /// while `is_leader` is true; when it turns false (or its sender is dropped) every stream ends
    /// with UNAVAILABLE at once, buffered chunks included, and new subscriptions are refused.
    pub fn new(snapshots: SnapshotReader, is_leader: watch::Receiver<bool>, settings: ServerSettings) -> Self {
        SnapshotServer::with_metrics(snapshots, is_leader, settings, ReplicationMetrics::default())
    }

    /// As [`SnapshotServer::new`], recording the sizes of the updates it sends in `metrics`.
    pub fn with_metrics(
        snapshots: SnapshotReader,
        is_leader: watch::Receiver<bool>,
        settings: ServerSettings,
        metrics: ReplicationMetrics,
    ) -> Self {
        let initial = History::new(settings.history);
        let initial = match snapshots.current() {
            Some(s) => initial.push(s),
            None => initial,
        };
        let (tx, history) = watch::channel(Arc::new(initial));
        tokio::spawn(follow(snapshots, tx).instrument(info_span!("snapshot_server")));
        let subscribers = AtomicUsize::new(0);
        SnapshotServer { shared: Arc::new(Shared { history, is_leader, settings, subscribers, metrics }) }
    }

    /// The tonic service to add to a `tonic::transport::Server`.
    pub fn into_service(self) -> SnapshotServiceServer<Self> {
        SnapshotServiceServer::new(self)
    }

    /// Number of open subscriptions.
    pub fn subscribers(&self) -> usize {
        self.shared.subscribers.load(Ordering::Relaxed)
    }

    /// The latest version the server can send.
    pub fn latest(&self) -> Option<Version> {
        self.shared.history.borrow().latest_version()
    }
}

/// Records every published snapshot in the history until the ingest or the server is gone.
async fn follow(mut snapshots: SnapshotReader, tx: watch::Sender<Arc<History>>) {
    loop {
        let snapshot = tokio::select! {
            s = snapshots.next() => s,
            _ = tx.closed() => return,
        };
        let Some(snapshot) = snapshot else {
            info!("snapshot source closed; ending subscriptions");
            return;
        };
        let version = snapshot.version;
        let next = tx.borrow().push(snapshot);
        tx.send_replace(Arc::new(next));
        debug!(%version, "snapshot recorded");
    }
}

#[tonic::async_trait]
impl SnapshotService for SnapshotServer {
    type SubscribeStream = FencedStream;

    async fn subscribe(&self, request: Request<SubscribeRequest>) -> Result<Response<FencedStream>, Status> {
        if !*self.shared.is_leader.borrow() {
            return Err(Status::unavailable(NOT_LEADER));
        }
        let peer = request.remote_addr().map(|a| a.to_string()).unwrap_or_default();
        let req = request.into_inner();
        let held = version_from_wire(req.held.as_ref()).filter(|_| !req.require_full);
        let span = info_span!("snapshot_subscriber", frontend = %req.frontend_id, %peer);
        span.in_scope(|| info!(held = ?held, require_full = req.require_full, "subscribed"));
        let (tx, rx) = mpsc::channel(self.shared.settings.queue.max(1));
        tokio::spawn(feed(self.shared.clone(), held, tx).instrument(span));
        Ok(Response::new(FencedStream::new(rx, self.shared.is_leader.clone())))
    }
}

/// Sends one subscriber what it lacks, then every new snapshot. Never buffers more than the
/// channel holds: while the subscriber is slow, new snapshots only move the target version.
async fn feed(shared: Arc<Shared>, mut sent: Option<Version>, tx: mpsc::Sender<Result<SnapshotChunk, Status>>) {
    shared.subscribers.fetch_add(1, Ordering::Relaxed);
    let _count = Decrement(&shared.subscribers);
    let mut history = shared.history.clone();
    let mut is_leader = shared.is_leader.clone();
    loop {
        let current = history.borrow_and_update().clone();
        if let Some(plan) = current.plan(sent) {
            let update = match plan.encode(&shared.metrics).await {
                Ok(u) => u,
                Err(status) => {
                    warn!(%status, "cannot encode update");
                    let _ = tx.send(Err(status)).await;
                    return;
                }
            };
            let latest = current.latest_version().unwrap_or(update.version);
            debug!(version = %update.version, kind = ?update.kind, bytes = update.payload.len(), "sending update");
            // The build's W3C trace context, so the frontend's apply continues the push's trace.
            for chunk in update.chunks(latest, trace::inject(update.version)) {
                tokio::select! {
                    biased;
                    _ = deposed(&mut is_leader) => return,
                    r = tx.send(Ok(chunk)) => if r.is_err() { return },
                }
            }
            sent = Some(update.version);
        }
        tokio::select! {
            biased;
            _ = deposed(&mut is_leader) => return,
            r = history.changed() => if r.is_err() {
                let _ = tx.try_send(Err(Status::unavailable("snapshot source closed")));
                return;
            },
            _ = tx.closed() => return,
        }
    }
}

/// Resolves once this node is no longer the leader (or nobody can tell it any more).
async fn deposed(is_leader: &mut watch::Receiver<bool>) {
    let _ = is_leader.wait_for(|leader| !*leader).await;
}

struct Decrement<'a>(&'a AtomicUsize);

impl Drop for Decrement<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// The response stream of one subscription. Checks the leader flag before every item, so a
/// deposed leader cannot deliver even chunks already queued: it ends with UNAVAILABLE.
pub struct FencedStream {
    rx: mpsc::Receiver<Result<SnapshotChunk, Status>>,
    deposed: Pin<Box<dyn Future<Output = ()> + Send>>,
    done: bool,
}

impl FencedStream {
    fn new(rx: mpsc::Receiver<Result<SnapshotChunk, Status>>, mut is_leader: watch::Receiver<bool>) -> Self {
        FencedStream { rx, deposed: Box::pin(async move { deposed(&mut is_leader).await }), done: false }
    }
}

impl std::fmt::Debug for FencedStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FencedStream").field("done", &self.done).finish_non_exhaustive()
    }
}

impl Stream for FencedStream {
    type Item = Result<SnapshotChunk, Status>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        if self.done {
            return Poll::Ready(None);
        }
        if self.deposed.as_mut().poll(cx).is_ready() {
            self.done = true;
            info!("no longer the leader: ending subscription");
            return Poll::Ready(Some(Err(Status::unavailable(NOT_LEADER))));
        }
        match self.rx.poll_recv(cx) {
            Poll::Ready(None) => {
                self.done = true;
                Poll::Ready(None)
            }
            other => other,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::replication::wire::proto::UpdateKind;
    use crate::replication::wire::tests_support::state;
    use crate::snapshot::{channel, ChangeSet, Snapshot};

    /// A subscriber that does not read holds at most `queue` chunks; when it reads again it gets one
    /// update to the latest version, not every snapshot published meanwhile.
    #[tokio::test]
    async fn a_slow_subscriber_gets_one_coalesced_update() {
        let (writer, reader) = channel();
        let (_leader_tx, is_leader) = watch::channel(true);
        let server = SnapshotServer::new(reader, is_leader, ServerSettings { history: 4, queue: 1 });
        let publish = |seq: u64, names: &[&str]| {
            let s = Snapshot::build(Version::new(1, seq), ChangeSet::default(), &state(names));
            writer.publish(Arc::new(s)).unwrap();
        };
        publish(1, &["a"]);
        let (tx, mut rx) = mpsc::channel(1);
        let feeder = tokio::spawn(feed(server.shared.clone(), None, tx));
        let first = rx.recv().await.unwrap().unwrap();
        assert_eq!(first.kind, UpdateKind::Full as i32);
        let mut names = vec!["a".to_string()];
        for seq in 2..=40 {
            names.push(format!("n{seq}"));
            let refs: Vec<&str> = names.iter().map(String::as_str).collect();
            publish(seq, &refs);
            // Let the server record each one, as a real ingest's pace would.
            let mut history = server.shared.history.clone();
            let _ = history.wait_for(|h| h.latest_version() == Some(Version::new(1, seq))).await;
        }
        let mut received = Vec::new();
        while let Some(Ok(chunk)) = rx.recv().await {
            let version = version_from_wire(chunk.version.as_ref()).unwrap();
            received.push((chunk.kind, version));
            if version == Version::new(1, 40) {
                break;
            }
        }
        // At most one update was queued before the server noticed the subscriber was behind.
        assert!(received.len() <= 3, "{received:?}");
        // 38 snapshots behind with a history of 4: the catch-up is a full snapshot.
        assert_eq!(received.last(), Some(&(UpdateKind::Full as i32, Version::new(1, 40))), "{received:?}");
        feeder.abort();
    }
}
