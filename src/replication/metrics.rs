//! Replication's metrics: snapshot updates the leader sends, and how far a frontend lags.

use prometheus::{Gauge, HistogramVec, IntCounter, IntGauge};

use crate::telemetry::metrics::{counter, float_gauge, gauge, gauge_value, histogram_vec, Registry, SIZE_BUCKETS};

/// `meshpilot_snapshot_size_bytes` kind of a full snapshot.
pub const SNAPSHOT_FULL: &str = "full";
/// `meshpilot_snapshot_size_bytes` kind of a delta.
pub const SNAPSHOT_DELTA: &str = "delta";

/// Metrics of the snapshot stream, on both ends.
#[derive(Clone, Debug)]
pub struct ReplicationMetrics {
    /// `meshpilot_snapshot_size_bytes{kind}`: encoded size of each snapshot update the leader sends (full or delta).
    pub snapshot_size_bytes: HistogramVec,
    /// `meshpilot_snapshot_lag_versions`: how many snapshots this frontend is behind the leader.
    pub snapshot_lag_versions: IntGauge,
    /// `meshpilot_snapshot_lag_seconds`: age of the newest leader snapshot not yet applied (0 when current).
    pub snapshot_lag_seconds: Gauge,
    /// `meshpilot_snapshot_stream_reconnects_total`: snapshot stream reconnects.
    pub snapshot_stream_reconnects: IntCounter,
    /// `meshpilot_snapshot_leader_term`: the leader term this frontend follows.
    pub followed_term: IntGauge,
}

impl ReplicationMetrics {
    /// Registers the replication metrics in `r`, each labelled series created at 0.
    pub fn register(r: &Registry) -> ReplicationMetrics {
        let m = ReplicationMetrics {
            snapshot_size_bytes: histogram_vec(
                r,
                "meshpilot_snapshot_size_bytes",
                "Encoded size of the snapshot updates the leader sends to frontends, by kind (full, delta).",
                &["kind"],
                SIZE_BUCKETS,
            ),
            snapshot_lag_versions: gauge(
                r,
                "meshpilot_snapshot_lag_versions",
                "Snapshots this frontend is behind the leader.",
            ),
            snapshot_lag_seconds: float_gauge(
                r,
                "meshpilot_snapshot_lag_seconds",
                "Seconds since the leader's newest snapshot while this frontend lacks it.",
            ),
            snapshot_stream_reconnects: counter(
                r,
                "meshpilot_snapshot_stream_reconnects_total",
                "Snapshot stream reconnects of this frontend.",
            ),
            followed_term: gauge(r, "meshpilot_snapshot_leader_term", "Leader term this frontend follows."),
        };
        for kind in [SNAPSHOT_FULL, SNAPSHOT_DELTA] {
            m.snapshot_size_bytes.with_label_values(&[kind]);
        }
        m
    }

    /// Records the encoded size of a snapshot update the leader sends (`meshpilot_snapshot_size_bytes{kind}`).
    pub fn snapshot_encoded(&self, kind: &'static str, bytes: usize) {
        self.snapshot_size_bytes.with_label_values(&[kind]).observe(bytes as f64);
    }

    /// Sets the term this frontend follows.
    pub fn set_followed_term(&self, term: u64) {
        self.followed_term.set(gauge_value(term));
    }
}

impl Default for ReplicationMetrics {
    /// Metrics registered nowhere, for components built outside a process (tests, tools).
    fn default() -> Self {
        ReplicationMetrics::register(&Registry::new())
    }
}
