//! The cluster's metrics: leadership of ingest nodes, membership and ownership of frontends.

use prometheus::{IntCounter, IntGauge, IntGaugeVec};

use crate::telemetry::metrics::{counter, gauge, gauge_vec, Registry};

/// Metrics of election, membership and ownership.
#[derive(Clone, Debug)]
pub struct ClusterMetrics {
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
}

impl ClusterMetrics {
    /// Registers the cluster metrics in `r`, each labelled series created at 0.
    pub fn register(r: &Registry) -> ClusterMetrics {
        let m = ClusterMetrics {
            leader_elections: counter(r, "meshpilot_leader_elections_total", "Times this ingest node became leader."),
            leader_term: gauge(r, "meshpilot_leader_term", "Term this ingest node last led."),
            is_leader: gauge(r, "meshpilot_is_leader", "1 while this ingest node is the leader."),
            proxies: gauge_vec(
                r,
                "meshpilot_proxies",
                "Connected proxies by ownership (owned by this frontend's hash range, or foreign).",
                &["ownership"],
            ),
            members: gauge(r, "meshpilot_frontend_members", "Frontends registered in etcd."),
        };
        for ownership in ["owned", "foreign"] {
            m.proxies.with_label_values(&[ownership]);
        }
        m
    }
}
