//! Metrics with Istio's names, labels and buckets, so Istio dashboards and alerts keep working.

use std::sync::LazyLock;
use std::time::Duration;

use prometheus::{
    register_histogram_vec_with_registry, register_histogram_with_registry, register_int_counter_vec_with_registry,
    register_int_counter_with_registry, register_int_gauge_vec_with_registry, register_int_gauge_with_registry,
    Encoder, Histogram, HistogramVec, IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Registry, TextEncoder,
};

use crate::snapshot::{Snapshot, Version};
use crate::xds::TypeUrl;

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
    /// `pilot_xds{version}`: connected proxies, by their Istio version (node metadata `ISTIO_VERSION`).
    pub xds_clients: IntGaugeVec,
    /// `pilot_services`: services in the registry.
    pub services: IntGauge,
    /// `pilot_total_xds_rejects{type}`: NACKs received.
    pub xds_rejects: IntCounterVec,
    /// `pilot_total_xds_internal_errors`: failures to build or send a response.
    pub xds_internal_errors: IntCounter,
    /// `pilot_xds_config_size_bytes{type}`: encoded response sizes; `type` is the full type URL, as in Istio.
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
    pub snapshot_stream_reconnects: IntCounter,
    /// `meshpilot_snapshot_leader_term`: the leader term this frontend follows.
    pub followed_term: IntGauge,
    /// `meshpilot_snapshot_size_bytes{kind}`: encoded size of each snapshot update the leader sends (full or delta).
    pub snapshot_size_bytes: HistogramVec,
    /// `meshpilot_build_info{role,id,version}`: 1, identifying this process.
    pub build_info: IntGaugeVec,
}

/// `pilot_push_triggers` type of a config change (Istio's `config` trigger).
const TRIGGER_CONFIG: &str = "config";
/// `pilot_push_triggers` type of an endpoint-only change (Istio's `endpoint` trigger).
const TRIGGER_ENDPOINT: &str = "endpoint";
/// `pilot_push_triggers` type of a full push (mesh config, new term; Istio's `global` trigger).
const TRIGGER_GLOBAL: &str = "global";
/// `pilot_inbound_updates` type of config events (Istio's `config`).
const INBOUND_CONFIG: &str = "config";
/// `meshpilot_snapshot_size_bytes` kind of a full snapshot.
pub const SNAPSHOT_FULL: &str = "full";
/// `meshpilot_snapshot_size_bytes` kind of a delta.
pub const SNAPSHOT_DELTA: &str = "delta";

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
        let m = Metrics {
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
            xds_clients: reg!(register_int_gauge_vec_with_registry!(
                "pilot_xds",
                "Number of endpoints connected to this pilot using XDS.",
                &["version"],
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
            leader_elections: reg!(register_int_counter_with_registry!(
                "meshpilot_leader_elections_total",
                "Times this ingest node became leader.",
                r
            )),
            leader_term: reg!(register_int_gauge_with_registry!(
                "meshpilot_leader_term",
                "Term this ingest node last led.",
                r
            )),
            is_leader: reg!(register_int_gauge_with_registry!(
                "meshpilot_is_leader",
                "1 while this ingest node is the leader.",
                r
            )),
            proxies: reg!(register_int_gauge_vec_with_registry!(
                "meshpilot_proxies",
                "Connected proxies by ownership (owned by this frontend's hash range, or foreign).",
                &["ownership"],
                r
            )),
            members: reg!(register_int_gauge_with_registry!(
                "meshpilot_frontend_members",
                "Frontends registered in etcd.",
                r
            )),
            snapshot_lag_versions: reg!(register_int_gauge_with_registry!(
                "meshpilot_snapshot_lag_versions",
                "Snapshots this frontend is behind the leader.",
                r
            )),
            snapshot_lag_seconds: reg!(prometheus::register_gauge_with_registry!(
                "meshpilot_snapshot_lag_seconds",
                "Seconds since the leader's newest snapshot while this frontend lacks it.",
                r
            )),
            snapshot_stream_reconnects: reg!(register_int_counter_with_registry!(
                "meshpilot_snapshot_stream_reconnects_total",
                "Snapshot stream reconnects of this frontend.",
                r
            )),
            followed_term: reg!(register_int_gauge_with_registry!(
                "meshpilot_snapshot_leader_term",
                "Leader term this frontend follows.",
                r
            )),
            snapshot_size_bytes: reg!(register_histogram_vec_with_registry!(
                "meshpilot_snapshot_size_bytes",
                "Encoded size of the snapshot updates the leader sends to frontends, by kind (full, delta).",
                &["kind"],
                SIZE_BUCKETS.to_vec(),
                r
            )),
            build_info: reg!(register_int_gauge_vec_with_registry!(
                "meshpilot_build_info",
                "Always 1; identifies this process by role (standalone, ingest, frontend), id and version.",
                &["role", "id", "version"],
                r
            )),
            registry: r,
        };
        m.initialize();
        m
    }

    /// Creates the labelled series Istio's dashboards expect before the first event (per xDS type), so
    /// rates and ratios read 0 instead of "no data".
    fn initialize(&self) {
        for t in TypeUrl::PUSH_ORDER {
            let short = t.short();
            self.xds_pushes.with_label_values(&[short]);
            self.xds_push_time.with_label_values(&[short]);
            self.xds_rejects.with_label_values(&[short]);
            self.xds_expired_nonce.with_label_values(&[short]);
            self.xds_config_size_bytes.with_label_values(&[t.as_str()]);
        }
        for trigger in [TRIGGER_CONFIG, TRIGGER_ENDPOINT, TRIGGER_GLOBAL] {
            self.push_triggers.with_label_values(&[trigger]);
        }
        self.inbound_updates.with_label_values(&[INBOUND_CONFIG]);
        for kind in [SNAPSHOT_FULL, SNAPSHOT_DELTA] {
            self.snapshot_size_bytes.with_label_values(&[kind]);
        }
        for ownership in ["owned", "foreign"] {
            self.proxies.with_label_values(&[ownership]);
        }
    }

    /// Every metric family, as gathered for exposition (also the source of the OTLP metrics export).
    pub fn gather(&self) -> Vec<prometheus::proto::MetricFamily> {
        self.registry.gather()
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

/// Counts config updates received from a source (`pilot_inbound_updates{type="config"}`), one per object.
pub fn inbound_config_updates(count: usize) {
    METRICS.inbound_updates.with_label_values(&[INBOUND_CONFIG]).inc_by(u64::try_from(count).unwrap_or(u64::MAX));
}

/// Counts a proxy connecting (`pilot_xds{version}`).
pub fn proxy_connected(istio_version: &str) {
    METRICS.xds_clients.with_label_values(&[istio_version]).inc();
}

/// Counts a proxy disconnecting (`pilot_xds{version}`).
pub fn proxy_disconnected(istio_version: &str) {
    METRICS.xds_clients.with_label_values(&[istio_version]).dec();
}

/// Records one response sent to a proxy (`pilot_xds_pushes`, `_push_time`, `_send_time`, `_config_size_bytes`).
pub fn response_sent(type_url: TypeUrl, bytes: usize, push_time: Duration, send_time: Duration) {
    let m = &*METRICS;
    let short = type_url.short();
    m.xds_send_time.observe(send_time.as_secs_f64());
    m.xds_pushes.with_label_values(&[short]).inc();
    m.xds_push_time.with_label_values(&[short]).observe(push_time.as_secs_f64());
    m.xds_config_size_bytes.with_label_values(&[type_url.as_str()]).observe(bytes as f64);
}

/// Records a response the stream did not take (Istio's `pilot_xds_pushes{type="cds_senderr"}`, ...).
pub fn response_send_failed(type_url: TypeUrl) {
    METRICS.xds_pushes.with_label_values(&[&format!("{}_senderr", type_url.short())]).inc();
}

/// Records the encoded size of a snapshot update the leader sends (`meshpilot_snapshot_size_bytes{kind}`).
pub fn snapshot_encoded(kind: &'static str, bytes: usize) {
    METRICS.snapshot_size_bytes.with_label_values(&[kind]).observe(bytes as f64);
}

/// Sets `meshpilot_build_info{role,id,version}` to 1.
pub fn set_build_info(role: &str, id: &str) {
    METRICS.build_info.with_label_values(&[role, id, env!("CARGO_PKG_VERSION")]).set(1);
}

/// Sets `meshpilot_snapshot_version{part}` to the version this process holds.
pub fn set_snapshot_version(version: Version) {
    let v = |n: u64| i64::try_from(n).unwrap_or(i64::MAX);
    METRICS.snapshot_version.with_label_values(&["term"]).set(v(version.term));
    METRICS.snapshot_version.with_label_values(&["seq"]).set(v(version.seq));
}

/// Records a built snapshot.
pub fn snapshot_built(snapshot: &Snapshot, took: Duration) {
    let m = &*METRICS;
    m.pushcontext_init_seconds.observe(took.as_secs_f64());
    m.snapshot_build_seconds.observe(took.as_secs_f64());
    m.services.set(i64::try_from(snapshot.registry.services.len()).unwrap_or(i64::MAX));
    m.config_errors.set(i64::try_from(snapshot.errors.len()).unwrap_or(i64::MAX));
    set_snapshot_version(snapshot.version);
    let trigger = if snapshot.changes.full {
        TRIGGER_GLOBAL
    } else if snapshot.changes.endpoints_only() {
        TRIGGER_ENDPOINT
    } else {
        TRIGGER_CONFIG
    };
    m.push_triggers.with_label_values(&[trigger]).inc();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn istio_series_exist_before_first_use_with_istio_buckets() {
        let text = METRICS.render();
        for t in ["cds", "eds", "lds", "rds"] {
            assert!(text.contains(&format!("pilot_xds_pushes{{type=\"{t}\"}}")), "{t}");
            assert!(text.contains(&format!("pilot_total_xds_rejects{{type=\"{t}\"}}")), "{t}");
            assert!(text.contains(&format!("pilot_xds_push_time_bucket{{type=\"{t}\",le=\"0.01\"}}")), "{t}");
        }
        assert!(text.contains(
            "pilot_xds_config_size_bytes_bucket{type=\"type.googleapis.com/envoy.config.cluster.v3.Cluster\",le=\"40000000\"}"
        ));
        assert!(text.contains("pilot_proxy_convergence_time_bucket{le=\"0.1\"}"));
        assert!(text.contains("pilot_pushcontext_init_seconds_bucket{le=\"0.5\"}"));
        assert!(text.contains("# TYPE pilot_total_xds_internal_errors counter"));
        assert!(text.contains("# TYPE pilot_services gauge"));
    }
}
