//! One ADS stream (state of the world): request/ACK/NACK bookkeeping and pushes on new snapshots.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use envoy_types::pb::envoy::service::discovery::v3::{DiscoveryRequest, DiscoveryResponse};
use futures::{Stream, StreamExt};
use tokio::sync::mpsc;
use tonic::Status;
use tracing::{debug, info, warn};

use super::cache::{GenerationCache, ViewLease};
use super::isolation::{Holding, Isolation, NackOutcome, Rejected};
use super::limits::{self, RequestRate};
use super::metrics::XdsMetrics;
use super::proxy::{Proxy, ProxyView};
use super::status::{ConnectionRegistry, Nack, Registration};
use super::TypeUrl;
use crate::drain::DrainWatcher;
use crate::snapshot::{Snapshot, SnapshotReader};
use crate::telemetry::metrics::gauge_value;
use crate::telemetry::trace::{self, PushTrace};

/// How long a single response may wait for the stream before the proxy counts as stuck.
const SEND_TIMEOUT: Duration = Duration::from_secs(30);

/// What a connection needs from its frontend.
#[derive(Clone)]
pub struct ConnectionContext {
    /// Latest snapshot.
    pub snapshots: SnapshotReader,
    /// Shared generation cache.
    pub cache: Arc<GenerationCache>,
    /// Live connections.
    pub registry: Arc<ConnectionRegistry>,
    /// Metrics of this server.
    pub metrics: XdsMetrics,
    /// Held by every stream; when the drain starts each ends, so proxies reconnect elsewhere.
    pub drain: DrainWatcher,
}

/// Per-type subscription state.
#[derive(Debug, Default)]
struct Watch {
    /// Names the proxy asked for (`None`: wildcard).
    names: Option<BTreeSet<String>>,
    /// Last response sent: nonce and content hash.
    sent: Option<Sent>,
    /// Resources this proxy rejected, kept out of its responses.
    isolation: Isolation,
}

#[derive(Debug)]
struct Sent {
    nonce: String,
    hash: u64,
    names: Option<BTreeSet<String>>,
    /// What the response carried.
    holding: Holding,
}

/// Why a stream ended.
#[derive(Debug, thiserror::Error)]
pub enum StreamEnd {
    /// The proxy closed it.
    #[error("closed by the proxy")]
    Closed,
    /// The proxy sent something unusable.
    #[error("{0}")]
    Invalid(String),
    /// The request broke a limit or did not decode; the client gets this status.
    #[error("refused: {}", limits::loggable(.0.message()))]
    Refused(Status),
    /// The response channel is gone.
    #[error("response stream dropped")]
    Dropped,
    /// The frontend is shutting down.
    #[error("frontend shutting down")]
    Draining,
}

struct Connection {
    ctx: ConnectionContext,
    /// The proxy as its node described it.
    node_proxy: Proxy,
    /// The proxy as the current snapshot's registry knows it (its Pod's labels, when known).
    proxy: Proxy,
    view: ProxyView,
    /// Keeps the view's cached generations while this connection uses it.
    view_lease: ViewLease,
    registration: Registration,
    watches: BTreeMap<TypeUrl, Watch>,
    snapshot: Option<Arc<Snapshot>>,
    nonce_seq: u64,
    tx: mpsc::Sender<Result<DiscoveryResponse, Status>>,
    /// The traced push of the latest snapshot, until the proxy answered all of it.
    push_trace: PushTrace,
    /// Rejected resources per type, as counted in `meshpilot_xds_rejected_resources`.
    rejected_counts: BTreeMap<TypeUrl, usize>,
}

/// Serves one ADS stream until it ends.
pub async fn serve<S>(
    ctx: ConnectionContext,
    mut requests: S,
    tx: mpsc::Sender<Result<DiscoveryResponse, Status>>,
) -> StreamEnd
where
    S: Stream<Item = Result<DiscoveryRequest, Status>> + Unpin,
{
    let first = match requests.next().await {
        Some(Ok(r)) => r,
        Some(Err(status)) => return refuse(&tx, status).await,
        None => return StreamEnd::Closed,
    };
    if let Some(node) = &first.node {
        if let Err(e) = limits::check_node(node) {
            return refuse(&tx, Status::resource_exhausted(e.to_string())).await;
        }
    }
    let proxy = match Proxy::from_node(first.node.as_ref()) {
        Ok(p) => p,
        Err(e) => return refuse(&tx, Status::invalid_argument(e.to_string())).await,
    };
    let registration = ctx.registry.register(proxy.clone());
    let view = proxy.view();
    let view_lease = ctx.cache.hold(&view);
    info!(proxy = %proxy.id, namespace = %proxy.namespace, "proxy connected");
    let mut conn = Connection {
        view,
        view_lease,
        node_proxy: proxy.clone(),
        proxy,
        registration,
        watches: BTreeMap::new(),
        snapshot: None,
        nonce_seq: 0,
        tx,
        push_trace: PushTrace::default(),
        rejected_counts: BTreeMap::new(),
        ctx: ctx.clone(),
    };
    let mut snapshots = ctx.snapshots.clone();
    let drain = ctx.drain.clone();
    let mut rate = RequestRate::default();
    // Readiness gate: nothing is served before the first full snapshot.
    conn.snapshot = ctx.snapshots.current();
    if let Some(snapshot) = conn.snapshot.clone() {
        conn.apply_registry(&snapshot);
    }
    let end = async {
        rate.acquire().await;
        conn.on_request(first).await?;
        loop {
            tokio::select! {
                req = requests.next() => match req {
                    Some(Ok(r)) => {
                        // A stream over its rate waits here; HTTP/2 flow control slows the client.
                        rate.acquire().await;
                        conn.on_request(r).await?
                    }
                    Some(Err(status)) => return Err(StreamEnd::Refused(status)),
                    None => return Err(StreamEnd::Closed),
                },
                snap = snapshots.next() => match snap {
                    Some(s) => conn.on_snapshot(s).await?,
                    // The snapshot writer is gone (shutdown): keep serving what we have until the proxy leaves.
                    None => std::future::pending::<()>().await,
                },
                _ = drain.draining() => return Err(StreamEnd::Draining),
            }
        }
    }
    .await;
    let end = match end {
        Ok(()) => StreamEnd::Closed,
        Err(e) => e,
    };
    match &end {
        // UNAVAILABLE makes Envoy reconnect at once (through the load balancer, to another frontend).
        StreamEnd::Draining => {
            let _ = conn.tx.try_send(Err(Status::unavailable("frontend shutting down")));
        }
        // The stream ends with the reason, never with OK.
        StreamEnd::Refused(status) => {
            let _ = conn.tx.try_send(Err(status.clone()));
        }
        _ => {}
    }
    for (type_url, count) in &conn.rejected_counts {
        conn.ctx.metrics.rejected_resources.with_label_values(&[type_url.short()]).sub(gauge_value(*count));
    }
    info!(proxy = %conn.proxy.id, reason = %end, "proxy disconnected");
    end
}

/// Ends a stream before it was registered: the client gets `status`, not OK.
async fn refuse(tx: &mpsc::Sender<Result<DiscoveryResponse, Status>>, status: Status) -> StreamEnd {
    warn!(code = ?status.code(), reason = %limits::loggable(status.message()), "xDS stream refused");
    let _ = tx.send(Err(status.clone())).await;
    StreamEnd::Refused(status)
}

impl Connection {
    /// Publishes the rejected resources of `type_url` to `/debug/syncz` and the metric.
    fn set_rejected(&mut self, type_url: TypeUrl, rejected: BTreeMap<String, Rejected>) {
        let before = self.rejected_counts.insert(type_url, rejected.len()).unwrap_or(0);
        let gauge = self.ctx.metrics.rejected_resources.with_label_values(&[type_url.short()]);
        gauge.add(gauge_value(rejected.len()) - gauge_value(before));
        self.registration.update(|s| s.types.entry(type_url).or_default().rejected = rejected);
    }

    async fn on_request(&mut self, req: DiscoveryRequest) -> Result<(), StreamEnd> {
        limits::check_names(req.resource_names.len())
            .map_err(|e| StreamEnd::Refused(Status::resource_exhausted(e.to_string())))?;
        let Some(type_url) = TypeUrl::parse(&req.type_url) else {
            debug!(proxy = %self.proxy.id, type_url = %limits::loggable(&req.type_url), "request for an unserved type ignored");
            return Ok(());
        };
        let requested_names = type_url.is_named().then(|| req.resource_names.iter().cloned().collect::<BTreeSet<_>>());
        let watch = self.watches.entry(type_url).or_default();
        if !req.response_nonce.is_empty() {
            let Some(sent) = &watch.sent else {
                // A nonce from a previous stream (reconnect): treat as a fresh subscription.
                watch.names = requested_names;
                return self.respond(type_url, true).await.map(|_| ());
            };
            if sent.nonce != req.response_nonce {
                self.ctx.metrics.xds_expired_nonce.with_label_values(&[type_url.short()]).inc();
                debug!(proxy = %self.proxy.id, %type_url, nonce = %req.response_nonce, "stale nonce ignored");
                return Ok(());
            }
            if let Some(err) = &req.error_detail {
                self.ctx.metrics.xds_rejects.with_label_values(&[type_url.short()]).inc();
                self.push_trace.answered(&req.response_nonce, Some(&err.message));
                warn!(proxy = %self.proxy.id, %type_url, version = %limits::loggable(&req.version_info), nonce = %limits::loggable(&req.response_nonce), error = %limits::loggable(&err.message), "proxy rejected config (NACK)");
                let nack = Nack {
                    version: sent.nonce_version(),
                    nonce: req.response_nonce.clone(),
                    message: capped(&err.message),
                    at: SystemTime::now(),
                };
                self.registration.update(|s| {
                    s.types.entry(type_url).or_default().last_nack = Some(nack);
                });
                let outcome = watch.isolation.on_nack(&sent.holding, &capped(&err.message));
                let rejected = watch.isolation.rejected().clone();
                watch.names = requested_names;
                self.set_rejected(type_url, rejected);
                return match outcome {
                    NackOutcome::Stuck => Ok(()),
                    NackOutcome::Isolated(names) => {
                        warn!(proxy = %self.proxy.id, %type_url, resources = ?names, "rejected resources set aside; sending the rest");
                        self.respond(type_url, false).await.map(|_| ())
                    }
                    NackOutcome::Bisecting => {
                        info!(proxy = %self.proxy.id, %type_url, "NACK names no resource; bisecting the changed ones");
                        self.respond(type_url, false).await.map(|_| ())
                    }
                };
            }
            let names_changed = type_url.is_named() && sent.names != requested_names;
            let next_test = watch.isolation.on_ack(&sent.holding);
            self.push_trace.answered(&req.response_nonce, None);
            watch.names = requested_names;
            let (version, nonce) = (req.version_info.clone(), req.response_nonce.clone());
            self.registration.update(|s| {
                let t = s.types.entry(type_url).or_default();
                t.acked_version = version;
                t.acked_nonce = nonce;
                t.last_nack = None;
            });
            if names_changed {
                return self.respond(type_url, true).await.map(|_| ());
            }
            if next_test {
                return self.respond(type_url, false).await.map(|_| ());
            }
            return Ok(());
        }
        // First request for this type on this stream (or Envoy re-requesting after a restart of the watch).
        watch.names = requested_names;
        self.respond(type_url, true).await.map(|_| ())
    }

    /// Takes the proxy's identity from the snapshot's registry (its Pod), moving to another view
    /// (and cache lease) when that changes what the proxy's config depends on.
    fn apply_registry(&mut self, snapshot: &Snapshot) {
        let pod = self.node_proxy.registry_pod(&snapshot.kube);
        // Most pushes leave a proxy without a Pod as it was: no copy of it per snapshot then.
        if pod.is_none() && self.proxy == self.node_proxy {
            return;
        }
        let proxy = self.node_proxy.with_pod(pod);
        if proxy == self.proxy {
            return;
        }
        let view = proxy.view();
        if view != self.view {
            // The new lease is taken before the old one drops, so a shared view is never released in between.
            self.view_lease = self.ctx.cache.hold(&view);
            self.view = view;
        }
        let published = proxy.clone();
        self.registration.update(|s| s.proxy = published);
        self.proxy = proxy;
    }

    async fn on_snapshot(&mut self, snapshot: Arc<Snapshot>) -> Result<(), StreamEnd> {
        let queued_at = Instant::now();
        self.apply_registry(&snapshot);
        self.snapshot = Some(snapshot.clone());
        self.push_trace.new_snapshot();
        for watch in self.watches.values_mut() {
            watch.isolation.on_new_snapshot();
        }
        let mut pushed = false;
        for type_url in TypeUrl::PUSH_ORDER {
            if self.watches.contains_key(&type_url) {
                pushed |= self.respond(type_url, false).await?;
            }
        }
        let version = snapshot.version.to_string();
        self.registration.update(|s| {
            s.snapshot_version = version;
            if pushed {
                s.pushes += 1;
            }
        });
        if pushed {
            self.ctx.metrics.proxy_queue_time.observe(queued_at.elapsed().as_secs_f64());
            if let Ok(age) = SystemTime::now().duration_since(snapshot.built_at) {
                self.ctx.metrics.proxy_convergence_time.observe(age.as_secs_f64());
            }
        }
        Ok(())
    }

    /// Sends the current resources of `type_url` unless the proxy already has exactly them
    /// (`force` answers a request even when nothing changed). Returns whether it sent.
    async fn respond(&mut self, type_url: TypeUrl, force: bool) -> Result<bool, StreamEnd> {
        let Some(snapshot) = self.snapshot.clone() else {
            return Ok(false);
        };
        let started = Instant::now();
        let generated = self.ctx.cache.get(&snapshot, &self.view, type_url).await;
        let Some(watch) = self.watches.get_mut(&type_url) else {
            return Ok(false);
        };
        let holding = watch.isolation.compose(&generated, watch.names.as_ref());
        let hash = holding.hash();
        if !force && watch.sent.as_ref().is_some_and(|s| s.hash == hash && s.names == watch.names) {
            return Ok(false);
        }
        self.nonce_seq += 1;
        let version = snapshot.version.to_string();
        let nonce = format!("{version}-{}", self.nonce_seq);
        let response = DiscoveryResponse {
            version_info: version.clone(),
            resources: holding.bodies(),
            type_url: type_url.as_str().to_string(),
            nonce: nonce.clone(),
            ..Default::default()
        };
        let size: usize = response.resources.iter().map(|r| r.value.len()).sum();
        let count = response.resources.len();
        watch.sent = Some(Sent { nonce: nonce.clone(), hash, names: watch.names.clone(), holding });
        let send_started = Instant::now();
        match tokio::time::timeout(SEND_TIMEOUT, self.tx.send(Ok(response))).await {
            Ok(Ok(())) => {}
            Ok(Err(_)) => {
                self.ctx.metrics.response_send_failed(type_url);
                return Err(StreamEnd::Dropped);
            }
            Err(_) => {
                self.ctx.metrics.xds_write_timeout.inc();
                self.ctx.metrics.response_send_failed(type_url);
                return Err(StreamEnd::Invalid(format!(
                    "{type_url} response not accepted by the stream within {SEND_TIMEOUT:?}"
                )));
            }
        }
        self.ctx.metrics.response_sent(type_url, size, started.elapsed(), send_started.elapsed());
        self.push_trace.sent(snapshot.version, &self.proxy.id, !force, type_url.short(), &nonce, count, size);
        debug!(proxy = %self.proxy.id, %type_url, %version, %nonce, resources = count, bytes = size, trace_id = trace::snapshot_trace_id(snapshot.version), "pushed");
        self.registration.update(|s| {
            let t = s.types.entry(type_url).or_default();
            t.sent_version = version;
            t.sent_nonce = nonce;
            t.sent_resources = count;
            t.responses += 1;
        });
        Ok(true)
    }
}

/// Longest NACK message kept for `/debug/syncz` (Envoy's are a line or two).
const MAX_NACK_MESSAGE: usize = 4096;

/// A client's message, cut to [`MAX_NACK_MESSAGE`] bytes at a character boundary.
fn capped(message: &str) -> String {
    let mut end = message.len().min(MAX_NACK_MESSAGE);
    while !message.is_char_boundary(end) {
        end -= 1;
    }
    message[..end].to_string()
}

impl Sent {
    /// The snapshot version a nonce was issued for (`VERSION-SEQ`).
    fn nonce_version(&self) -> String {
        self.nonce.rsplit_once('-').map(|(v, _)| v.to_string()).unwrap_or_default()
    }
}
