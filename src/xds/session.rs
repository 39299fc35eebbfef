//! What every ADS stream keeps for its proxy, whatever the protocol (state of the world or
//! delta): identity and view, the snapshot it is served from, its `/debug/syncz` registration,
//! and the ACK, NACK and send bookkeeping both protocols record alike.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use tokio::sync::mpsc;
use tonic::Status;
use tracing::{debug, info, warn};

use super::cache::{Generated, OverBudget, ViewLease};
use super::isolation::{Holding, Isolation, NackOutcome, Rejected};
use super::limits;
use super::proxy::Proxy;
use super::status::{Nack, Registration, Transport};
use super::stream::{ConnectionContext, StreamEnd};
use super::TypeUrl;
use crate::envoy::{may_change_identities, ProxyKind, SharedView};
use crate::snapshot::Snapshot;
use crate::telemetry::log_text::{self, untrusted_list, Untrusted};
use crate::telemetry::metrics::gauge_value;
use crate::telemetry::trace::{self, PushTrace};

/// How long a single response may wait for the stream before the proxy counts as stuck.
const SEND_TIMEOUT: Duration = Duration::from_secs(30);

/// One proxy's stream state shared by both protocols; `R` is the protocol's response message.
pub struct Session<R> {
    /// The frontend's shared parts.
    pub ctx: ConnectionContext,
    /// The proxy as its node described it.
    node_proxy: Proxy,
    /// The proxy as the current snapshot's registry knows it (its Pod's labels, when known).
    pub proxy: Proxy,
    view: SharedView,
    /// Keeps the view's cached generations while this connection uses it.
    view_lease: ViewLease,
    registration: Registration,
    /// The snapshot served; `None` until the first one exists (nothing is served before).
    pub snapshot: Option<Arc<Snapshot>>,
    nonce_seq: u64,
    tx: mpsc::Sender<Result<R, Status>>,
    /// The traced push of the latest snapshot, until the proxy answered all of it.
    push_trace: PushTrace,
    /// Rejected resources per type, as counted in `meshpilot_xds_rejected_resources`.
    rejected_counts: BTreeMap<TypeUrl, usize>,
    /// Whether the refusal of secrets to this unverified gateway was logged (once per stream).
    secrets_withheld: AtomicBool,
    /// Whether the proxy moved to another view (its Pod changed) since its last push: what it
    /// holds is then the old view's, whatever the snapshot changed for the new one.
    moved: bool,
}

/// What a response being sent carried, for metrics, traces and `/debug/syncz`.
pub struct Outgoing {
    /// Its type.
    pub type_url: TypeUrl,
    /// Snapshot version it was computed from.
    pub version: String,
    /// Its nonce.
    pub nonce: String,
    /// Resources carried.
    pub count: usize,
    /// Encoded bytes of the resources.
    pub bytes: usize,
    /// When building it started.
    pub started: Instant,
    /// Whether a snapshot push (not a request) caused it.
    pub push: bool,
}

impl<R> Session<R> {
    /// A registered session of `proxy` answering on `tx`.
    pub fn new(
        ctx: ConnectionContext,
        proxy: Proxy,
        transport: Transport,
        tx: mpsc::Sender<Result<R, Status>>,
    ) -> Result<Self, OverBudget> {
        let view = SharedView::new(proxy.view());
        let current = ctx.snapshots.current();
        let view_lease = ctx.cache.admit(current.as_ref(), &view)?;
        let registration = ctx.registry.register(proxy.clone());
        registration.update(|s| s.transport = transport);
        info!(proxy = %Untrusted(&proxy.id), namespace = %Untrusted(&proxy.namespace), cluster = %Untrusted(&proxy.cluster_id), ?transport, "proxy connected");
        let mut session = Session {
            view,
            view_lease,
            node_proxy: proxy.clone(),
            proxy,
            registration,
            snapshot: None,
            nonce_seq: 0,
            tx,
            push_trace: PushTrace::default(),
            rejected_counts: BTreeMap::new(),
            secrets_withheld: AtomicBool::new(false),
            moved: false,
            ctx: ctx.clone(),
        };
        // Readiness gate: nothing is served before the first full snapshot.
        if let Some(snapshot) = current {
            session.use_snapshot(snapshot);
        }
        Ok(session)
    }

    /// Serves from `snapshot` from now on, with the proxy's identity as its registry knows it.
    pub fn use_snapshot(&mut self, snapshot: Arc<Snapshot>) {
        self.apply_registry(&snapshot);
        self.snapshot = Some(snapshot);
        self.push_trace.new_snapshot();
    }

    /// Takes the proxy's identity from the snapshot's registry (its Pod), moving to another view
    /// (and cache lease) when that changes what the proxy's config depends on.
    fn apply_registry(&mut self, snapshot: &Snapshot) {
        // Right after the snapshot last applied, a change of no Pod leaves the proxy as it was.
        let follows = self.snapshot.as_ref().is_some_and(|last| last.version.next() == snapshot.version);
        if follows && !may_change_identities(&snapshot.changes) {
            return;
        }
        let pod = self.node_proxy.registry_pod(&snapshot.kube);
        // Most pushes leave a proxy without a Pod as it was: no copy of it per snapshot then.
        if pod.is_none() && self.proxy == self.node_proxy {
            return;
        }
        let proxy = self.node_proxy.with_pod(pod);
        if proxy == self.proxy {
            return;
        }
        let view = SharedView::new(proxy.view());
        if view != self.view {
            // The new lease is taken before the old one drops, so a shared view is never released in
            // between. A connected proxy whose Pod changed is not refused: it moves, leaving its old view.
            self.view_lease = self.ctx.cache.hold(&view);
            self.view = view;
            self.moved = true;
        }
        let published = proxy.clone();
        self.registration.update(|s| s.proxy = Arc::new(published));
        self.proxy = proxy;
    }

    /// Whether the session's snapshot may change any resource of its view (see
    /// [`super::cache::GenerationCache::concerns`]).
    pub fn concerned(&self) -> bool {
        self.moved || self.snapshot.as_ref().is_none_or(|s| self.ctx.cache.concerns(s, &self.view))
    }

    /// The resources of `type_url` for this proxy in the current snapshot (`None` before the first).
    pub async fn generated(&self, type_url: TypeUrl) -> Option<(Arc<Snapshot>, Arc<Generated>)> {
        if type_url == TypeUrl::Secret && self.proxy.kind == ProxyKind::Router && !self.proxy.verified {
            self.withhold_secrets();
        }
        let snapshot = self.snapshot.clone()?;
        let generated = self.ctx.cache.get(&snapshot, &self.view, type_url).await;
        Some((snapshot, generated))
    }

    /// Says once per stream why an unverified gateway gets no secret: its view generates none
    /// (and leaves out the servers needing one), so the answer is empty whatever it asks for.
    fn withhold_secrets(&self) {
        if self.secrets_withheld.swap(true, Ordering::Relaxed) {
            return;
        }
        self.ctx.metrics.secrets_withheld.inc();
        warn!(
            proxy = %Untrusted(&self.proxy.id),
            namespace = %Untrusted(&self.proxy.namespace),
            "gateway asked for secrets without a verified identity: none sent; credentialName secrets are served only on the secure xDS port to a caller proving an identity of the gateway's namespace"
        );
    }

    /// A fresh nonce for a response computed from `snapshot` (`VERSION-SEQ`).
    pub fn next_nonce(&mut self, snapshot: &Snapshot) -> String {
        self.nonce_seq += 1;
        format!("{}-{}", snapshot.version, self.nonce_seq)
    }

    /// Counts an answer to a nonce that is no longer current.
    pub fn expired_nonce(&self, type_url: TypeUrl, nonce: &str) {
        self.ctx.metrics.xds_expired_nonce.with_label_values(&[type_url.short()]).inc();
        debug!(proxy = %Untrusted(&self.proxy.id), %type_url, nonce = %Untrusted(nonce), "stale nonce ignored");
    }

    /// Records a NACK of the response `nonce` that carried `sent`, and what `isolation` makes of
    /// it. Returns whether a new response is due (something was set aside or is being bisected).
    pub fn nack(
        &mut self,
        type_url: TypeUrl,
        nonce: &str,
        message: &str,
        isolation: &mut Isolation,
        sent: &Holding,
    ) -> bool {
        self.ctx.metrics.xds_rejects.with_label_values(&[type_url.short()]).inc();
        // What is kept and shown is bounded; the names of rejected resources are searched further.
        let kept = log_text::truncated(message, limits::MAX_NACK_DETAIL_CHARS);
        self.push_trace.answered(nonce, Some(kept));
        warn!(proxy = %Untrusted(&self.proxy.id), %type_url, nonce = %Untrusted(nonce), error = %Untrusted(message), "proxy rejected config (NACK)");
        let nonce = log_text::truncated(nonce, limits::MAX_NACK_DETAIL_CHARS);
        let nack = Nack {
            version: nonce_version(nonce),
            nonce: nonce.to_string(),
            message: kept.to_string(),
            at: SystemTime::now(),
        };
        self.registration.update(|s| s.type_mut(type_url).last_nack = Some(nack));
        let outcome = isolation.on_nack(sent, log_text::truncated(message, limits::MAX_NACK_SCANNED_CHARS));
        self.set_rejected(type_url, isolation.rejected().clone());
        match outcome {
            NackOutcome::Stuck => false,
            NackOutcome::Isolated(names) => {
                warn!(proxy = %Untrusted(&self.proxy.id), %type_url, resources = %untrusted_list(&names), "rejected resources set aside; sending the rest");
                true
            }
            NackOutcome::Bisecting => {
                info!(proxy = %Untrusted(&self.proxy.id), %type_url, "NACK names no resource; bisecting the changed ones");
                true
            }
        }
    }

    /// Records an ACK of the response `nonce` (snapshot `version`) that carried `sent`. Returns
    /// whether a new response is due (the next step of a bisection).
    pub fn ack(
        &mut self,
        type_url: TypeUrl,
        version: String,
        nonce: &str,
        isolation: &mut Isolation,
        sent: &Holding,
    ) -> bool {
        let next_test = isolation.on_ack(sent);
        self.push_trace.answered(nonce, None);
        let nonce = nonce.to_string();
        // The rejection stays on show while resources it named are still held back.
        let settled = isolation.rejected().is_empty();
        self.registration.update(|s| {
            let t = s.type_mut(type_url);
            t.acked_version = version;
            t.acked_nonce = nonce;
            t.acked_at = Some(SystemTime::now());
            if settled {
                t.last_nack = None;
            }
        });
        next_test
    }

    /// Publishes the rejected resources of `type_url` to `/debug/syncz` and the metric.
    fn set_rejected(&mut self, type_url: TypeUrl, rejected: BTreeMap<String, Rejected>) {
        let before = self.rejected_counts.insert(type_url, rejected.len()).unwrap_or(0);
        let gauge = self.ctx.metrics.rejected_resources.with_label_values(&[type_url.short()]);
        gauge.add(gauge_value(rejected.len()) - gauge_value(before));
        self.registration.update(|s| s.type_mut(type_url).rejected = rejected);
    }

    /// Sends `response`, described by `out`, and records it.
    pub async fn send(&mut self, response: R, out: Outgoing) -> Result<(), StreamEnd> {
        let type_url = out.type_url;
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
        self.ctx.metrics.response_sent(type_url, out.bytes, out.started.elapsed(), send_started.elapsed());
        if let Some(snapshot) = &self.snapshot {
            let trace_id = trace::snapshot_trace_id(snapshot.version);
            self.push_trace.sent(
                snapshot.version,
                &self.proxy.id,
                out.push,
                type_url.short(),
                &out.nonce,
                out.count,
                out.bytes,
            );
            debug!(proxy = %Untrusted(&self.proxy.id), %type_url, version = %out.version, nonce = %out.nonce, resources = out.count, bytes = out.bytes, trace_id, "pushed");
        }
        self.registration.update(|s| {
            let t = s.type_mut(type_url);
            t.sent_version = out.version;
            t.sent_nonce = out.nonce;
            t.sent_at = Some(SystemTime::now());
            t.sent_resources = out.count;
            t.responses += 1;
        });
        Ok(())
    }

    /// Records the end of a snapshot's push (`pushed`: whether any response went out).
    pub fn pushed(&mut self, snapshot: &Snapshot, pushed: bool, queued_at: Instant) {
        self.moved = false;
        let version = snapshot.version.to_string();
        self.registration.update(|s| {
            s.snapshot_version = version;
            if pushed {
                s.pushes += 1;
            }
        });
        // Only evaluated with debug logs on: every stream passes here on every snapshot.
        debug!(version = %snapshot.version, pushed, queued_us = queued_at.elapsed().as_micros() as u64, "snapshot handled");
        if pushed {
            self.ctx.metrics.proxy_queue_time.observe(queued_at.elapsed().as_secs_f64());
            if let Ok(age) = SystemTime::now().duration_since(snapshot.built_at) {
                self.ctx.metrics.proxy_convergence_time.observe(age.as_secs_f64());
            }
        }
    }

    /// Ends the session: the client gets the reason as a status (never OK) and the rejected
    /// resources leave the metric.
    pub fn close(&mut self, end: &StreamEnd) {
        match end {
            // UNAVAILABLE makes Envoy reconnect at once (through the load balancer, to another frontend).
            StreamEnd::Draining => {
                let _ = self.tx.try_send(Err(Status::unavailable("frontend shutting down")));
            }
            StreamEnd::MaxAge => {
                let _ = self.tx.try_send(Err(Status::unavailable("maximum stream age reached; reconnect")));
            }
            StreamEnd::Refused(status) => {
                let _ = self.tx.try_send(Err(status.clone()));
            }
            _ => {}
        }
        for (type_url, count) in &self.rejected_counts {
            self.ctx.metrics.rejected_resources.with_label_values(&[type_url.short()]).sub(gauge_value(*count));
        }
        self.rejected_counts.clear();
        info!(proxy = %Untrusted(&self.proxy.id), reason = %end, "proxy disconnected");
    }
}

/// The snapshot version a nonce was issued for (`VERSION-SEQ`).
pub fn nonce_version(nonce: &str) -> String {
    nonce.rsplit_once('-').map(|(v, _)| v.to_string()).unwrap_or_default()
}
