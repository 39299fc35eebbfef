//! A push as one trace:
//!
//! ```text
//! config_event                      a source change (file or mesh config), root of the trace
//! ├── debounce                      first event of the batch → batch closed (other events: links)
//! └── snapshot_build                ingest builds version (term, seq)
//!     └── snapshot_apply            a frontend applies it (W3C traceparent in SnapshotChunk.trace_context)
//!         ├── xds_push              one proxy: events `sent` per response, `ack`/`nack` with latency
//!         └── xds_fanout            how many proxies were pushed, traced and not traced
//! ```
//!
//! In standalone mode there is no `snapshot_apply`: pushes hang off `snapshot_build`. Only the first
//! [`MAX_PUSH_SPANS`] proxies of a version get an `xds_push` span on each process (override with
//! `MESHPILOT_TRACE_PUSH_SPANS`); `xds_fanout` counts the rest.
//!
//! Contexts are found by snapshot version in a small table here, so snapshots need not carry them.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::{LazyLock, Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime};

use opentelemetry::propagation::TextMapPropagator;
use opentelemetry::trace::{Span as _, SpanContext, Status, TraceContextExt, Tracer as _};
use opentelemetry::{Context, KeyValue};
use opentelemetry_sdk::propagation::TraceContextPropagator;
use tracing::field::Empty;
use tracing::{info_span, Span};
use tracing_opentelemetry::OpenTelemetrySpanExt;

use super::otlp::SCOPE;

/// A snapshot version as traces name it (`TERM.SEQ`). Telemetry depends on nothing: the snapshot
/// model converts its versions into this.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TraceVersion {
    /// Leader term.
    pub term: u64,
    /// Sequence within the term.
    pub seq: u64,
}

impl std::fmt::Display for TraceVersion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}.{}", self.term, self.seq)
    }
}

/// `xds_push` spans per snapshot version and process, by default.
pub const MAX_PUSH_SPANS: usize = 16;

/// Snapshot versions whose context is remembered.
const REMEMBERED_VERSIONS: usize = 64;

/// How long after a version's first push its `xds_fanout` summary is recorded.
const FANOUT_WINDOW: Duration = Duration::from_secs(5);

/// The trace context of a source event, sent to ingest ahead of the event it caused.
#[derive(Debug, Clone)]
pub struct EventTrace {
    /// The `config_event` span.
    pub context: SpanContext,
    /// When the event was seen.
    pub at: SystemTime,
}

/// Starts the root span of a source event (`config_event`); `source` is `file` or `mesh`.
pub fn config_event(source: &'static str, changed: usize) -> (Span, EventTrace) {
    let span = info_span!(parent: None, "config_event", source, changed, trace_id = Empty);
    let context = start(&span, None);
    (span, EventTrace { context, at: SystemTime::now() })
}

/// Starts a `snapshot_build` span for `version`, child of the first event that caused it (the
/// others are links), and records the `debounce` span from that event until `batch_closed`.
pub fn snapshot_build(version: impl Into<TraceVersion>, causes: &[EventTrace], batch_closed: SystemTime) -> Span {
    let version: TraceVersion = version.into();
    let span = info_span!(parent: None, "snapshot_build", version = %version, events = causes.len(), trace_id = Empty);
    let first = causes.iter().min_by_key(|c| c.at);
    if let Some(first) = first {
        let tracer = opentelemetry::global::tracer(SCOPE);
        let parent = Context::new().with_remote_span_context(first.context.clone());
        let mut debounce = tracer
            .span_builder("debounce")
            .with_start_time(first.at)
            .with_attributes([
                KeyValue::new("events", i64::try_from(causes.len()).unwrap_or(i64::MAX)),
                KeyValue::new("version", version.to_string()),
            ])
            .start_with_context(&tracer, &parent);
        debounce.end_with_timestamp(batch_closed.max(first.at));
        for other in causes.iter().filter(|c| c.context != first.context) {
            span.add_link(other.context.clone());
        }
    }
    start(&span, first.map(|c| &c.context));
    span
}

/// Starts a `snapshot_apply` span for `version`, continuing the leader's trace from the W3C trace
/// context the update carried (a root span when it carried none).
pub fn snapshot_apply(version: impl Into<TraceVersion>, kind: &str, carrier: &HashMap<String, String>) -> Span {
    let version: TraceVersion = version.into();
    let span = info_span!(parent: None, "snapshot_apply", version = %version, kind, trace_id = Empty);
    start(&span, extract(carrier).as_ref());
    span
}

/// Sets `span`'s parent (if any), starts it and records its `trace_id` field; returns its context.
fn start(span: &Span, parent: Option<&SpanContext>) -> SpanContext {
    if let Some(parent) = parent.filter(|p| p.is_valid()) {
        let _ = span.set_parent(Context::new().with_remote_span_context(parent.clone()));
    }
    let context = span.context().span().span_context().clone();
    if context.is_valid() {
        span.record("trace_id", context.trace_id().to_string());
    }
    context
}

/// The trace id of `span`, if it has one.
pub fn trace_id(span: &Span) -> Option<String> {
    let context = span.context().span().span_context().clone();
    context.is_valid().then(|| context.trace_id().to_string())
}

/// Remembers the span that pushes of `version` descend from on this process (the build, or on a
/// frontend the apply). Call before publishing the snapshot.
pub fn register_snapshot(version: impl Into<TraceVersion>, span: &Span) {
    let version: TraceVersion = version.into();
    let context = span.context().span().span_context().clone();
    if !context.is_valid() {
        return;
    }
    let mut table = lock(&VERSIONS);
    table.retain(|(v, _)| *v != version);
    table.push_back((version, context));
    while table.len() > REMEMBERED_VERSIONS {
        table.pop_front();
    }
}

/// The context pushes of `version` descend from, if known.
pub fn snapshot_context(version: impl Into<TraceVersion>) -> Option<SpanContext> {
    let version: TraceVersion = version.into();
    lock(&VERSIONS).iter().rev().find(|(v, _)| *v == version).map(|(_, c)| c.clone())
}

/// The trace id of `version`'s push, if known (shown in `/debug/push_status` and push logs).
pub fn snapshot_trace_id(version: impl Into<TraceVersion>) -> Option<String> {
    let version: TraceVersion = version.into();
    snapshot_context(version).map(|c| c.trace_id().to_string())
}

/// The W3C trace context (`traceparent`, `tracestate`) of `version`, for the snapshot stream.
pub fn inject(version: impl Into<TraceVersion>) -> HashMap<String, String> {
    let version: TraceVersion = version.into();
    let mut carrier = HashMap::new();
    if let Some(context) = snapshot_context(version) {
        let cx = Context::new().with_remote_span_context(context);
        TraceContextPropagator::new().inject_context(&cx, &mut carrier);
    }
    carrier
}

/// The span context in a W3C carrier, if valid.
pub fn extract(carrier: &HashMap<String, String>) -> Option<SpanContext> {
    let cx = TraceContextPropagator::new().extract(carrier);
    let context = cx.span().span_context().clone();
    context.is_valid().then_some(context)
}

static VERSIONS: LazyLock<Mutex<VecDeque<(TraceVersion, SpanContext)>>> = LazyLock::new(Mutex::default);

static FANOUTS: LazyLock<Mutex<HashMap<TraceVersion, Fanout>>> = LazyLock::new(Mutex::default);

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    match m.lock() {
        Ok(g) => g,
        Err(poisoned) => poisoned.into_inner(),
    }
}

/// Pushes of one version on this process.
#[derive(Debug)]
struct Fanout {
    first: SystemTime,
    last: SystemTime,
    traced: usize,
    untraced: usize,
}

fn max_push_spans() -> usize {
    static MAX: LazyLock<usize> = LazyLock::new(|| {
        std::env::var("MESHPILOT_TRACE_PUSH_SPANS").ok().and_then(|v| v.parse().ok()).unwrap_or(MAX_PUSH_SPANS)
    });
    *MAX
}

/// The push tracing of one connection: decides once per snapshot whether its push is traced.
#[derive(Debug, Default)]
pub struct PushTrace {
    version: Option<TraceVersion>,
    span: Option<PushSpan>,
}

impl PushTrace {
    /// A new snapshot reached the connection: the previous push's span ends, answered or not.
    pub fn new_snapshot(&mut self) {
        self.version = None;
        self.span = None;
    }

    /// A response was sent; `snapshot_push` when a snapshot caused it (not a proxy's request). The
    /// first response of a snapshot push decides whether it gets a span. Call in a Tokio runtime.
    #[allow(clippy::too_many_arguments)]
    pub fn sent(
        &mut self,
        version: impl Into<TraceVersion>,
        proxy: &str,
        snapshot_push: bool,
        type_url: &'static str,
        nonce: &str,
        resources: usize,
        bytes: usize,
    ) {
        let version: TraceVersion = version.into();
        if snapshot_push && self.version != Some(version) {
            self.version = Some(version);
            self.span = PushSpan::start(version, proxy);
        }
        if let Some(span) = self.span.as_mut() {
            span.sent(type_url, nonce, resources, bytes);
        }
    }

    /// The proxy answered `nonce` (`error`: a NACK); the span ends once everything is answered.
    pub fn answered(&mut self, nonce: &str, error: Option<&str>) {
        if self.span.as_mut().is_some_and(|s| s.answered(nonce, error)) {
            self.span = None;
        }
    }
}

/// The `xds_push` span of one proxy for one snapshot: open from the first response until every
/// response sent under it was answered (ACK or NACK), a newer snapshot is pushed, or the stream ends.
#[derive(Debug)]
pub struct PushSpan {
    span: Span,
    pending: BTreeMap<String, (&'static str, Instant)>,
    types: Vec<&'static str>,
    sent: usize,
    nacked: bool,
}

impl PushSpan {
    /// A push of `version` to `proxy` starts; `None` when the version has no trace here or this
    /// process already traced enough pushes of it (counted for `xds_fanout`). Call in a Tokio runtime.
    pub fn start(version: impl Into<TraceVersion>, proxy: &str) -> Option<PushSpan> {
        let version: TraceVersion = version.into();
        let parent = snapshot_context(version)?;
        let traced = {
            let mut fanouts = lock(&FANOUTS);
            let now = SystemTime::now();
            let f = fanouts.entry(version).or_insert_with(|| {
                if let Ok(runtime) = tokio::runtime::Handle::try_current() {
                    runtime.spawn(record_fanout(version, parent.clone()));
                }
                Fanout { first: now, last: now, traced: 0, untraced: 0 }
            });
            f.last = now;
            let traced = f.traced < max_push_spans();
            if traced {
                f.traced += 1;
            } else {
                f.untraced += 1;
            }
            traced
        };
        if !traced {
            return None;
        }
        let span = info_span!(parent: None, "xds_push", proxy = %super::log_text::Untrusted(proxy), version = %version, types = Empty, trace_id = Empty);
        start(&span, Some(&parent));
        Some(PushSpan { span, pending: BTreeMap::new(), types: Vec::new(), sent: 0, nacked: false })
    }

    /// A response was sent under this push; `short` is the type's short name (`cds`, `eds`, ...).
    pub fn sent(&mut self, short: &'static str, nonce: &str, resources: usize, bytes: usize) {
        // A newer response of a type replaces the older one: that one will never be acked.
        self.pending.retain(|_, (t, _)| *t != short);
        self.pending.insert(nonce.to_string(), (short, Instant::now()));
        if !self.types.contains(&short) {
            self.types.push(short);
        }
        self.sent += 1;
        self.span.add_event(
            "sent",
            vec![
                KeyValue::new("type", short),
                KeyValue::new("nonce", nonce.to_string()),
                KeyValue::new("resources", i64::try_from(resources).unwrap_or(i64::MAX)),
                KeyValue::new("bytes", i64::try_from(bytes).unwrap_or(i64::MAX)),
            ],
        );
    }

    /// The proxy answered `nonce` (`error`: a NACK). Returns true when nothing is pending any more.
    pub fn answered(&mut self, nonce: &str, error: Option<&str>) -> bool {
        let Some((short, sent_at)) = self.pending.remove(nonce) else {
            return false;
        };
        let latency_ms = sent_at.elapsed().as_secs_f64() * 1000.0;
        let mut attributes = vec![
            KeyValue::new("type", short),
            KeyValue::new("nonce", nonce.to_string()),
            KeyValue::new("latency_ms", latency_ms),
        ];
        match error {
            None => self.span.add_event("ack", attributes),
            Some(message) => {
                self.nacked = true;
                attributes.push(KeyValue::new("error", message.to_string()));
                self.span.add_event("nack", attributes);
            }
        }
        self.pending.is_empty()
    }

    /// The trace id of this push.
    pub fn trace_id(&self) -> Option<String> {
        trace_id(&self.span)
    }
}

impl Drop for PushSpan {
    fn drop(&mut self) {
        self.span.record("types", self.types.join(","));
        self.span.set_attribute("responses", i64::try_from(self.sent).unwrap_or(i64::MAX));
        self.span.set_attribute("answered", self.pending.is_empty());
        if self.nacked {
            self.span.set_status(Status::error("proxy rejected the config (NACK)"));
        }
    }
}

/// Records `xds_fanout` for `version` once its push window has passed.
async fn record_fanout(version: TraceVersion, parent: SpanContext) {
    tokio::time::sleep(FANOUT_WINDOW).await;
    let Some(f) = lock(&FANOUTS).remove(&version) else { return };
    let tracer = opentelemetry::global::tracer(SCOPE);
    let count = |n: usize| i64::try_from(n).unwrap_or(i64::MAX);
    let mut span = tracer
        .span_builder("xds_fanout")
        .with_start_time(f.first)
        .with_attributes([
            KeyValue::new("version", version.to_string()),
            KeyValue::new("proxies", count(f.traced + f.untraced)),
            KeyValue::new("proxies.traced", count(f.traced)),
            KeyValue::new("proxies.untraced", count(f.untraced)),
        ])
        .start_with_context(&tracer, &Context::new().with_remote_span_context(parent));
    span.end_with_timestamp(f.last);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn w3c_round_trip_through_the_version_table() {
        let context = SpanContext::new(
            opentelemetry::trace::TraceId::from(0x0af7651916cd43dd8448eb211c80319c_u128),
            opentelemetry::trace::SpanId::from(0xb7ad6b7169203331_u64),
            opentelemetry::trace::TraceFlags::SAMPLED,
            true,
            Default::default(),
        );
        let version = TraceVersion { term: 77, seq: 5 };
        lock(&VERSIONS).push_back((version, context.clone()));
        let carrier = inject(version);
        assert_eq!(carrier["traceparent"], "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01");
        assert_eq!(
            extract(&carrier).map(|c| (c.trace_id(), c.span_id())),
            Some((context.trace_id(), context.span_id()))
        );
        assert_eq!(snapshot_trace_id(version).as_deref(), Some("0af7651916cd43dd8448eb211c80319c"));
        assert!(inject(TraceVersion { term: 77, seq: 6 }).is_empty());
        assert!(extract(&HashMap::new()).is_none());
    }
}
