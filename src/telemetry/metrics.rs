//! Metrics with Istio's names, labels and buckets, so Istio dashboards and alerts keep working.

use std::sync::LazyLock;
use std::time::Duration;

use prometheus::{
    register_histogram_vec_with_registry, register_histogram_with_registry, register_int_counter_vec_with_registry,
    register_int_counter_with_registry, register_int_gauge_vec_with_registry, register_int_gauge_with_registry,
    Encoder, Histogram, HistogramVec, IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Registry, TextEncoder,
};

use crate::snapshot::Snapshot;

/// All metrics of this process.
pub struct Metrics {
    registry: Registry,
    /// `pilot_xds_pushes{type}`: responses sent, by xDS type.
    pub xds_pushes: IntCounterVec,
    /// `pilot_xds_push_time{type}`: time to generate and send one response.
    pub xds_push_time: HistogramVec,
    /// `pilot_proxy_convergence_time`: snapshot built → pushed to a proxy.
    pub proxy_convergence_time: Histogram,
    /// `pilot_proxy_queue_time`: time a push waited in a connection's queue.
    pub proxy_queue_time: Histogram,
    /// `pilot_xds_send_time`: time to hand a response to the stream.
    pub xds_send_time: Histogram,
    /// `pilot_pushcontext_init_seconds`: snapshot build time.
    pub pushcontext_init_seconds: Histogram,
    /// `pilot_push_triggers{type}`: pushes by cause.
    pub push_triggers: IntCounterVec,
    /// `pilot_inbound_updates{type}`: source events received.
    pub inbound_updates: IntCounterVec,
    /// `pilot_xds`: connected proxies.
    pub xds_clients: IntGauge,
    /// `pilot_services`: services in the registry.
    pub services: IntGauge,
    /// `pilot_total_xds_rejects{type}`: NACKs received.
    pub xds_rejects: IntCounterVec,
    /// `pilot_total_xds_internal_errors`: failures to build or send a response.
    pub xds_internal_errors: IntCounter,
    /// `pilot_xds_config_size_bytes{type}`: encoded response sizes.
    pub xds_config_size_bytes: HistogramVec,
    /// `pilot_xds_expired_nonce{type}`: requests answering a nonce that is no longer current.
    pub xds_expired_nonce: IntCounterVec,
    /// `pilot_xds_write_timeout`: sends that timed out.
    pub xds_write_timeout: IntCounter,
    /// `meshpilot_snapshot_version{part}`: term and seq of the snapshot held.
    pub snapshot_version: IntGaugeVec,
    /// `meshpilot_snapshot_build_seconds`.
    pub snapshot_build_seconds: Histogram,
    /// `meshpilot_config_errors`: rejected documents currently reported.
    pub config_errors: IntGauge,
    /// `meshpilot_leader_elections_total`: times this node became leader.
    pub leader_elections: IntCounter,
    /// `meshpilot_leader_term`: the term this node last led.
    pub leader_term: IntGauge,
    /// `meshpilot_is_leader`: 1 while this node leads.
    pub is_leader: IntGauge,
    /// `meshpilot_proxies{ownership}`: connected proxies this frontend owns by the hash, or not.
    pub proxies: IntGaugeVec,
    /// `meshpilot_frontend_members`: frontends registered in etcd, as this process sees them.
    pub members: IntGauge,
    /// `meshpilot_snapshot_lag_versions`: how many snapshots this frontend is behind the leader.
    pub snapshot_lag_versions: IntGauge,
    /// `meshpilot_snapshot_lag_seconds`: age of the newest leader snapshot not yet applied (0 when current).
    pub snapshot_lag_seconds: prometheus::Gauge,
    /// `meshpilot_snapshot_stream_reconnects_total`: snapshot stream reconnects.
    pub snapshot_stream_reconnects: IntGauge,
    /// `meshpilot_snapshot_leader_term`: the leader term this frontend follows.
    pub followed_term: IntGauge,
}

const PUSH_BUCKETS: &[f64] = &[0.01, 0.1, 1.0, 3.0, 5.0, 10.0, 20.0, 30.0];
const CONVERGENCE_BUCKETS: &[f64] = &[0.1, 0.5, 1.0, 3.0, 5.0, 10.0, 20.0, 30.0];
const INIT_BUCKETS: &[f64] = &[0.01, 0.1, 0.5, 1.0, 3.0, 5.0];
const SIZE_BUCKETS: &[f64] = &[1.0, 10_000.0, 1_000_000.0, 4_000_000.0, 10_000_000.0, 40_000_000.0];

/// The process-wide metrics.
pub static METRICS: LazyLock<Metrics> = LazyLock::new(Metrics::new);

impl Metrics {
    fn new() -> Metrics {
        let r = Registry::new();
        // Registration only fails on duplicate names, which this constructor cannot produce.
        macro_rules! reg {
            ($e:expr) => {
                $e.unwrap_or_else(|e| panic!("metric registration: {e}"))
            };
        }
        Metrics {
            xds_pushes: reg!(register_int_counter_vec_with_registry!(
                "pilot_xds_pushes",
                "Pilot build and send errors for lds, rds, cds and eds.",
                &["type"],
                r
            )),
            xds_push_time: reg!(register_histogram_vec_with_registry!(
                "pilot_xds_push_time",
                "Total time in seconds Pilot takes to push lds, rds, cds and eds.",
                &["type"],
                PUSH_BUCKETS.to_vec(),
                r
            )),
            proxy_convergence_time: reg!(register_histogram_with_registry!(
                "pilot_proxy_convergence_time",
                "Delay in seconds between config change and a proxy receiving all required configuration.",
                CONVERGENCE_BUCKETS.to_vec(),
                r
            )),
            proxy_queue_time: reg!(register_histogram_with_registry!(
                "pilot_proxy_queue_time",
                "Time in seconds, a proxy is in the push queue before being dequeued.",
                CONVERGENCE_BUCKETS.to_vec(),
                r
            )),
            xds_send_time: reg!(register_histogram_with_registry!(
                "pilot_xds_send_time",
                "Total time in seconds Pilot takes to send generated configuration.",
                PUSH_BUCKETS.to_vec(),
                r
            )),
            pushcontext_init_seconds: reg!(register_histogram_with_registry!(
                "pilot_pushcontext_init_seconds",
                "Total time in seconds Pilot takes to init pushContext.",
                INIT_BUCKETS.to_vec(),
                r
            )),
            push_triggers: reg!(register_int_counter_vec_with_registry!(
                "pilot_push_triggers",
                "Total number of times a push was triggered, labeled by reason for the push.",
                &["type"],
                r
            )),
            inbound_updates: reg!(register_int_counter_vec_with_registry!(
                "pilot_inbound_updates",
                "Total number of updates received by pilot.",
                &["type"],
                r
            )),
            xds_clients: reg!(register_int_gauge_with_registry!(
                "pilot_xds",
                "Number of endpoints connected to this pilot using XDS.",
                r
            )),
            services: reg!(register_int_gauge_with_registry!("pilot_services", "Total services known to pilot.", r)),
            xds_rejects: reg!(register_int_counter_vec_with_registry!(
                "pilot_total_xds_rejects",
                "Total number of XDS responses from pilot rejected by proxy.",
                &["type"],
                r
            )),
            xds_internal_errors: reg!(register_int_counter_with_registry!(
                "pilot_total_xds_internal_errors",
                "Total number of internal XDS errors in pilot.",
                r
            )),
            xds_config_size_bytes: reg!(register_histogram_vec_with_registry!(
                "pilot_xds_config_size_bytes",
                "Distribution of configuration sizes pushed to clients",
                &["type"],
                SIZE_BUCKETS.to_vec(),
                r
            )),
            xds_expired_nonce: reg!(register_int_counter_vec_with_registry!(
                "pilot_xds_expired_nonce",
                "Total number of XDS requests with an expired nonce.",
                &["type"],
                r
            )),
            xds_write_timeout: reg!(register_int_counter_with_registry!(
                "pilot_xds_write_timeout",
                "Pilot XDS response write timeouts.",
                r
            )),
            snapshot_version: reg!(register_int_gauge_vec_with_registry!(
                "meshpilot_snapshot_version",
                "Version of the snapshot this process holds, by part (term, seq).",
                &["part"],
                r
            )),
            snapshot_build_seconds: reg!(register_histogram_with_registry!(
                "meshpilot_snapshot_build_seconds",
                "Time to build a snapshot from the sources' state.",
                INIT_BUCKETS.to_vec(),
                r
            )),
            config_errors: reg!(register_int_gauge_with_registry!(
                "meshpilot_config_errors",
                "Config documents currently rejected by validation.",
                r
            )),
            leader_elections: reg!(register_int_counter_with_registry!("meshpilot_leader_elections_total", "Times this ingest node became leader.", r)),
            leader_term: reg!(register_int_gauge_with_registry!("meshpilot_leader_term", "Term this ingest node last led.", r)),
            is_leader: reg!(register_int_gauge_with_registry!("meshpilot_is_leader", "1 while this ingest node is the leader.", r)),
            proxies: reg!(register_int_gauge_vec_with_registry!("meshpilot_proxies", "Connected proxies by ownership (owned by this frontend's hash range, or foreign).", &["ownership"], r)),
            members: reg!(register_int_gauge_with_registry!("meshpilot_frontend_members", "Frontends registered in etcd.", r)),
            snapshot_lag_versions: reg!(register_int_gauge_with_registry!("meshpilot_snapshot_lag_versions", "Snapshots this frontend is behind the leader.", r)),
            snapshot_lag_seconds: reg!(prometheus::register_gauge_with_registry!("meshpilot_snapshot_lag_seconds", "Seconds since the leader's newest snapshot while this frontend lacks it.", r)),
            snapshot_stream_reconnects: reg!(register_int_gauge_with_registry!("meshpilot_snapshot_stream_reconnects_total", "Snapshot stream reconnects of this frontend.", r)),
            followed_term: reg!(register_int_gauge_with_registry!("meshpilot_snapshot_leader_term", "Leader term this frontend follows.", r)),
            registry: r,
        }
    }

    /// Prometheus text exposition of every metric.
    pub fn render(&self) -> String {
        let mut buf = Vec::new();
        // Encoding into a Vec cannot fail for well-formed metric families.
        if let Err(e) = TextEncoder::new().encode(&self.registry.gather(), &mut buf) {
            tracing::warn!(error = %e, "metrics encoding failed");
        }
        String::from_utf8(buf).unwrap_or_default()
    }
}

/// Counts a source event (`pilot_inbound_updates`).
pub fn inbound_update(kind: &str) {
    METRICS.inbound_updates.with_label_values(&[kind]).inc();
}

/// Records a built snapshot.
pub fn snapshot_built(snapshot: &Snapshot, took: Duration) {
    let m = &*METRICS;
    m.pushcontext_init_seconds.observe(took.as_secs_f64());
    m.snapshot_build_seconds.observe(took.as_secs_f64());
    m.services.set(i64::try_from(snapshot.registry.services.len()).unwrap_or(i64::MAX));
    m.config_errors.set(i64::try_from(snapshot.errors.len()).unwrap_or(i64::MAX));
    m.snapshot_version.with_label_values(&["term"]).set(i64::try_from(snapshot.version.term).unwrap_or(i64::MAX));
    m.snapshot_version.with_label_values(&["seq"]).set(i64::try_from(snapshot.version.seq).unwrap_or(i64::MAX));
    let trigger = if snapshot.changes.full {
        "full"
    } else if snapshot.changes.endpoints_only() {
        "endpoint"
    } else {
        "config"
    };
    m.push_triggers.with_label_values(&[trigger]).inc();
}
