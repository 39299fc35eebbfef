//! The leader side: a gRPC `SnapshotService` that streams the ingest's snapshots to frontends.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::sync::watch;
use tokio_stream::Stream;
use tonic::{Request, Response, Status};
use tracing::{debug, info, info_span, warn, Instrument};

use super::history::History;
use super::metrics::ReplicationMetrics;
use super::send_queue::{send_queue, Item, QueueReceiver, QueueSender, SendError};
use crate::replication::wire::proto::snapshot_service_server::{SnapshotService, SnapshotServiceServer};
use crate::replication::wire::proto::SubscribeRequest;
use crate::replication::wire::version_from_wire;
use crate::snapshot::{SnapshotReader, Version};
use crate::telemetry::log_text::Untrusted;
use crate::telemetry::trace;

/// Message of the UNAVAILABLE status a deposed (or never elected) leader answers with.
pub const NOT_LEADER: &str = "not the leader";

/// Message of the RESOURCE_EXHAUSTED status a subscription beyond the limit is refused with.
pub const TOO_MANY_SUBSCRIBERS: &str = "too many snapshot subscribers";

/// Message of the RESOURCE_EXHAUSTED status a subscriber that stopped reading is cut off with.
pub const TOO_SLOW: &str = "snapshot subscriber too slow: resubscribe";

/// Limits of the snapshot server.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ServerSettings {
    /// Deltas kept for resuming subscribers; one further behind gets a full snapshot.
    pub history: usize,
    /// Chunks queued per subscriber; while it is full, new snapshots only move the version the
    /// subscriber is sent next (one coalesced update).
    pub queue: usize,
    /// A subscriber whose queue stays full this long is cut off with RESOURCE_EXHAUSTED (it
    /// resubscribes, and gets a full snapshot or deltas as any subscriber).
    pub stall: Duration,
    /// Subscriptions open at once; more are refused with RESOURCE_EXHAUSTED. Each one that stops
    /// reading still holds what the gRPC layer copied for it (about a chunk), so this bounds that.
    pub max_subscribers: usize,
    /// HTTP/2 pings on every subscriber's connection this often; one unanswered this long closes
    /// the connection (a peer that reads nothing answers nothing), freeing its subscriptions.
    pub keepalive: Duration,
}

impl Default for ServerSettings {
    fn default() -> Self {
        ServerSettings {
            history: 64,
            queue: 8,
            stall: Duration::from_secs(30),
            max_subscribers: 256,
            keepalive: Duration::from_secs(10),
        }
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

    /// The gRPC transport to serve [`Self::into_service`] on, with the keepalive of the settings.
    pub fn transport(&self) -> tonic::transport::Server {
        let keepalive = self.shared.settings.keepalive;
        tonic::transport::Server::builder()
            .http2_keepalive_interval(Some(keepalive))
            .http2_keepalive_timeout(Some(keepalive))
    }

    /// The tonic service to add to a `tonic::transport::Server` (see [`Self::transport`]).
    pub fn into_service(self) -> SnapshotServiceServer<Self> {
        SnapshotServiceServer::new(self)
    }

    /// Number of open subscriptions.
    pub fn subscribers(&self) -> usize {
        self.shared.subscribers.load(Ordering::Relaxed)
    }

    /// Takes a subscription slot, if one is free (given back when the guard is dropped).
    fn reserve(&self) -> Option<Decrement> {
        let max = self.shared.settings.max_subscribers;
        self.shared
            .subscribers
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| (n < max).then_some(n + 1))
            .ok()
            .map(|_| Decrement(self.shared.clone()))
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
        let Some(slot) = self.reserve() else {
            warn!(%peer, max = self.shared.settings.max_subscribers, "snapshot subscription refused: too many");
            return Err(Status::resource_exhausted(TOO_MANY_SUBSCRIBERS));
        };
        let req = request.into_inner();
        let held = version_from_wire(req.held.as_ref()).filter(|_| !req.require_full);
        let span = info_span!("snapshot_subscriber", frontend = %Untrusted(&req.frontend_id), %peer);
        span.in_scope(|| info!(held = ?held, require_full = req.require_full, "subscribed"));
        let (tx, rx) = send_queue(self.shared.settings.queue);
        tokio::spawn(feed(self.shared.clone(), held, tx).instrument(span));
        Ok(Response::new(FencedStream::new(rx, self.shared.is_leader.clone(), slot)))
    }
}

/// Sends one subscriber what it lacks, then every new snapshot. Never buffers more than the
/// queue holds: while the subscriber is slow, new snapshots only move the target version; when
/// it takes nothing for the stall deadline it is cut off, and what it did not read is released.
async fn feed(shared: Arc<Shared>, mut sent: Option<Version>, tx: QueueSender) {
    let stall = shared.settings.stall;
    let mut history = shared.history.clone();
    let mut is_leader = shared.is_leader.clone();
    loop {
        let current = history.borrow_and_update().clone();
        if let Some(plan) = current.plan(sent) {
            let update = match plan.encode(&shared.metrics).await {
                Ok(u) => u,
                Err(status) => {
                    warn!(%status, "cannot encode update");
                    tx.finish(status);
                    return;
                }
            };
            let latest = current.latest_version().unwrap_or(update.version);
            debug!(version = %update.version, kind = ?update.kind, bytes = update.payload.len(), "sending update");
            // The build's W3C trace context, so the frontend's apply continues the push's trace.
            for chunk in update.chunks(latest, trace::inject(update.version)) {
                let sent = tokio::select! {
                    biased;
                    _ = deposed(&mut is_leader) => return,
                    r = tx.send(Ok(chunk), stall) => r,
                };
                match sent {
                    Ok(()) => {}
                    Err(SendError::Gone) => return,
                    Err(SendError::Stalled) => {
                        warn!(?stall, "snapshot subscriber read nothing within the stall deadline: cut off");
                        tx.cut_off(Status::resource_exhausted(TOO_SLOW));
                        return;
                    }
                }
            }
            sent = Some(update.version);
        }
        tokio::select! {
            biased;
            _ = deposed(&mut is_leader) => return,
            r = history.changed() => if r.is_err() {
                tx.finish(Status::unavailable("snapshot source closed"));
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

/// A subscription slot; the response stream holds it, since the stream (and what the gRPC layer
/// buffered for it) lives until the subscriber reads it or its connection goes.
struct Decrement(Arc<Shared>);

impl Drop for Decrement {
    fn drop(&mut self) {
        self.0.subscribers.fetch_sub(1, Ordering::AcqRel);
    }
}

/// The response stream of one subscription. Checks the leader flag before every item, so a
/// deposed leader cannot deliver even chunks already queued: it ends with UNAVAILABLE.
pub struct FencedStream {
    rx: QueueReceiver,
    deposed: Pin<Box<dyn Future<Output = ()> + Send>>,
    done: bool,
    _slot: Decrement,
}

impl FencedStream {
    fn new(rx: QueueReceiver, mut is_leader: watch::Receiver<bool>, slot: Decrement) -> Self {
        let deposed = Box::pin(async move { deposed(&mut is_leader).await });
        FencedStream { rx, deposed, done: false, _slot: slot }
    }
}

impl std::fmt::Debug for FencedStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FencedStream").field("done", &self.done).finish_non_exhaustive()
    }
}

impl Stream for FencedStream {
    type Item = Item;

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
    use crate::snapshot::{channel, ChangeSet, Snapshot, SnapshotWriter};
    use futures::future::poll_fn;

    fn publisher(writer: &SnapshotWriter) -> impl Fn(u64, &[&str]) + '_ {
        move |seq, names| {
            let s = Snapshot::build(Version::new(1, seq), ChangeSet::default(), &state(names));
            writer.publish(Arc::new(s)).unwrap();
        }
    }

    async fn recv(rx: &mut QueueReceiver) -> Option<Item> {
        poll_fn(|cx| rx.poll_recv(cx)).await
    }

    /// A subscriber that does not read holds at most `queue` chunks; when it reads again (within
    /// the stall deadline) it gets one update to the latest version, not every snapshot since.
    #[tokio::test]
    async fn a_slow_subscriber_gets_one_coalesced_update() {
        let (writer, reader) = channel();
        let (_leader_tx, is_leader) = watch::channel(true);
        let settings = ServerSettings { history: 4, queue: 1, ..Default::default() };
        let server = SnapshotServer::new(reader, is_leader, settings);
        let publish = publisher(&writer);
        publish(1, &["a"]);
        let (tx, mut rx) = send_queue(1);
        let feeder = tokio::spawn(feed(server.shared.clone(), None, tx));
        let first = recv(&mut rx).await.unwrap().unwrap();
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
        while let Some(Ok(chunk)) = recv(&mut rx).await {
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

    /// A subscriber that reads nothing for the stall deadline is cut off: what it had queued is
    /// released and its stream ends with RESOURCE_EXHAUSTED; its slot is freed with the stream.
    #[tokio::test]
    async fn a_stalled_subscriber_is_cut_off_and_releases_its_queue() {
        let (writer, reader) = channel();
        let (_leader_tx, is_leader) = watch::channel(true);
        let settings =
            ServerSettings { queue: 2, stall: Duration::from_millis(100), max_subscribers: 1, ..Default::default() };
        let server = SnapshotServer::new(reader, is_leader, settings);
        let publish = publisher(&writer);
        publish(1, &["a"]);
        let slot = server.reserve().expect("a free slot");
        assert!(server.reserve().is_none(), "one subscriber at most");
        let (tx, rx) = send_queue(settings.queue);
        let mut stream = FencedStream::new(rx, server.shared.is_leader.clone(), slot);
        let feeder = tokio::spawn(feed(server.shared.clone(), None, tx));
        for seq in 2..=6 {
            publish(seq, &["a", &format!("n{seq}")]);
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        tokio::time::timeout(Duration::from_secs(5), feeder).await.expect("the feeder ends").expect("task");
        let items: Vec<_> = tokio_stream::StreamExt::collect(&mut stream).await;
        assert_eq!(items.len(), 1, "only the cut-off is left: {items:?}");
        assert_eq!(items[0].as_ref().map(|_| ()).unwrap_err().code(), tonic::Code::ResourceExhausted);
        assert_eq!(server.subscribers(), 1);
        drop(stream);
        assert_eq!(server.subscribers(), 0);
        assert!(server.reserve().is_some());
    }
}
