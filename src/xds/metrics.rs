//! The xDS server's metrics, with Istio's names, labels and buckets (as in Istio's
//! `pilot/pkg/xds/monitoring.go`), so Istio's dashboards and alerts keep working.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use prometheus::{Histogram, HistogramVec, IntCounter, IntCounterVec, IntGauge, IntGaugeVec};

use super::TypeUrl;
use crate::telemetry::metrics::{
    counter, counter_vec, gauge, gauge_vec, histogram, histogram_vec, Registry, CONVERGENCE_BUCKETS, PUSH_BUCKETS,
    SIZE_BUCKETS,
};

/// Metrics of ADS serving.
#[derive(Clone, Debug)]
pub struct XdsMetrics {
    /// `pilot_xds_pushes{type}`: responses sent, by xDS type (`*_senderr` on failed sends).
    pub xds_pushes: IntCounterVec,
    /// `pilot_xds_push_time{type}`: time to generate and send one response.
    pub xds_push_time: HistogramVec,
    /// `pilot_proxy_convergence_time`: snapshot built → pushed to a proxy.
    pub proxy_convergence_time: Histogram,
    /// `pilot_proxy_queue_time`: time a push waited in a connection's queue.
    pub proxy_queue_time: Histogram,
    /// `pilot_xds_send_time`: time to hand a response to the stream.
    pub xds_send_time: Histogram,
    /// `pilot_xds{version}`: connected proxies, by their Istio version (node metadata `ISTIO_VERSION`).
    pub xds_clients: IntGaugeVec,
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
    /// `meshpilot_xds_rejected_resources{type}`: resources connected proxies rejected, kept out
    /// of their updates while everything else still reaches them.
    pub rejected_resources: IntGaugeVec,
    /// `meshpilot_xds_cache_bytes`: bytes of generated resources the generation cache holds.
    pub cache_bytes: IntGauge,
    /// `meshpilot_xds_cache_entries`: (view, type) entries the generation cache holds.
    pub cache_entries: IntGauge,
    /// `meshpilot_xds_generated_bytes`: bytes of generated resources alive, in the cache or held
    /// by connections (what the memory budget bounds).
    pub generated_bytes: IntGauge,
    /// `meshpilot_xds_views_refused`: streams refused (RESOURCE_EXHAUSTED) because their proxy's
    /// configuration is one no connected proxy shares and generated config is at its budget.
    pub views_refused: IntCounter,
    /// `meshpilot_xds_secrets_withheld`: streams of gateways without a verified identity (the
    /// plaintext port) that asked for secrets and were sent none.
    pub secrets_withheld: IntCounter,
    /// `pilot_xds` version labels in use: clients choose them, so their number is bounded.
    versions: Arc<Mutex<BTreeSet<String>>>,
}

/// Most distinct `pilot_xds{version}` labels; proxies claiming further versions count as `other`.
pub const MAX_VERSION_LABELS: usize = 32;

/// The label of proxies whose claimed version is malformed or beyond [`MAX_VERSION_LABELS`].
pub const OTHER_VERSION: &str = "other";

impl XdsMetrics {
    /// Registers the xDS metrics in `r`, with the per-type series Istio's dashboards expect
    /// created at 0, so rates and ratios read 0 instead of "no data".
    pub fn register(r: &Registry) -> XdsMetrics {
        let m = XdsMetrics {
            xds_pushes: counter_vec(
                r,
                "pilot_xds_pushes",
                "Pilot build and send errors for lds, rds, cds and eds.",
                &["type"],
            ),
            xds_push_time: histogram_vec(
                r,
                "pilot_xds_push_time",
                "Total time in seconds Pilot takes to push lds, rds, cds and eds.",
                &["type"],
                PUSH_BUCKETS,
            ),
            proxy_convergence_time: histogram(
                r,
                "pilot_proxy_convergence_time",
                "Delay in seconds between config change and a proxy receiving all required configuration.",
                CONVERGENCE_BUCKETS,
            ),
            proxy_queue_time: histogram(
                r,
                "pilot_proxy_queue_time",
                "Time in seconds, a proxy is in the push queue before being dequeued.",
                CONVERGENCE_BUCKETS,
            ),
            xds_send_time: histogram(
                r,
                "pilot_xds_send_time",
                "Total time in seconds Pilot takes to send generated configuration.",
                PUSH_BUCKETS,
            ),
            xds_clients: gauge_vec(
                r,
                "pilot_xds",
                "Number of endpoints connected to this pilot using XDS.",
                &["version"],
            ),
            xds_rejects: counter_vec(
                r,
                "pilot_total_xds_rejects",
                "Total number of XDS responses from pilot rejected by proxy.",
                &["type"],
            ),
            xds_internal_errors: counter(
                r,
                "pilot_total_xds_internal_errors",
                "Total number of internal XDS errors in pilot.",
            ),
            xds_config_size_bytes: histogram_vec(
                r,
                "pilot_xds_config_size_bytes",
                "Distribution of configuration sizes pushed to clients",
                &["type"],
                SIZE_BUCKETS,
            ),
            xds_expired_nonce: counter_vec(
                r,
                "pilot_xds_expired_nonce",
                "Total number of XDS requests with an expired nonce.",
                &["type"],
            ),
            xds_write_timeout: counter(r, "pilot_xds_write_timeout", "Pilot XDS response write timeouts."),
            rejected_resources: gauge_vec(
                r,
                "meshpilot_xds_rejected_resources",
                "Resources connected proxies rejected (NACK), set aside while the rest of their config is served.",
                &["type"],
            ),
            cache_bytes: gauge(
                r,
                "meshpilot_xds_cache_bytes",
                "Bytes of generated resources held by the generation cache.",
            ),
            cache_entries: gauge(
                r,
                "meshpilot_xds_cache_entries",
                "Entries (proxy view and type) held by the generation cache.",
            ),
            generated_bytes: gauge(
                r,
                "meshpilot_xds_generated_bytes",
                "Bytes of generated resources alive, in the generation cache or held by connections.",
            ),
            views_refused: counter(
                r,
                "meshpilot_xds_views_refused",
                "Streams refused because their proxy's configuration is shared by no connected proxy and generated config is at its memory budget.",
            ),
            secrets_withheld: counter(
                r,
                "meshpilot_xds_secrets_withheld",
                "Gateway streams without a verified identity (plaintext port) that asked for secrets and were sent none.",
            ),
            versions: Arc::default(),
        };
        for t in TypeUrl::PUSH_ORDER {
            let short = t.short();
            m.xds_pushes.with_label_values(&[short]);
            m.xds_push_time.with_label_values(&[short]);
            m.xds_rejects.with_label_values(&[short]);
            m.xds_expired_nonce.with_label_values(&[short]);
            m.xds_config_size_bytes.with_label_values(&[t.as_str()]);
            m.rejected_resources.with_label_values(&[short]);
        }
        m
    }

    /// Counts a proxy connecting (`pilot_xds{version}`).
    pub fn proxy_connected(&self, istio_version: &str) {
        self.xds_clients.with_label_values(&[&self.version_label(istio_version)]).inc();
    }

    /// Counts a proxy disconnecting (`pilot_xds{version}`).
    pub fn proxy_disconnected(&self, istio_version: &str) {
        self.xds_clients.with_label_values(&[&self.version_label(istio_version)]).dec();
    }

    /// The label for a claimed version: itself when well formed (`1.27.3`, `1.28.0-dev`) and among
    /// the first [`MAX_VERSION_LABELS`] seen, else [`OTHER_VERSION`]. The set only grows, so a
    /// proxy's connect and disconnect always get the same label.
    fn version_label(&self, claimed: &str) -> String {
        let well_formed = claimed.len() <= 32
            && claimed.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '+' | '_'));
        if !well_formed {
            return OTHER_VERSION.to_string();
        }
        let mut seen = self.versions.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        if seen.contains(claimed) || seen.len() < MAX_VERSION_LABELS {
            seen.insert(claimed.to_string());
            claimed.to_string()
        } else {
            OTHER_VERSION.to_string()
        }
    }

    /// Records one response sent to a proxy (`pilot_xds_pushes`, `_push_time`, `_send_time`, `_config_size_bytes`).
    pub fn response_sent(&self, type_url: TypeUrl, bytes: usize, push_time: Duration, send_time: Duration) {
        let short = type_url.short();
        self.xds_send_time.observe(send_time.as_secs_f64());
        self.xds_pushes.with_label_values(&[short]).inc();
        self.xds_push_time.with_label_values(&[short]).observe(push_time.as_secs_f64());
        self.xds_config_size_bytes.with_label_values(&[type_url.as_str()]).observe(bytes as f64);
    }

    /// Records a response the stream did not take (Istio's `pilot_xds_pushes{type="cds_senderr"}`, ...).
    pub fn response_send_failed(&self, type_url: TypeUrl) {
        self.xds_pushes.with_label_values(&[&format!("{}_senderr", type_url.short())]).inc();
    }
}

impl Default for XdsMetrics {
    /// Metrics registered nowhere, for components built outside a process (tests, tools).
    fn default() -> Self {
        XdsMetrics::register(&Registry::new())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::telemetry::metrics::render;

    #[test]
    fn claimed_versions_make_a_bounded_number_of_series() {
        let registry = Registry::new();
        let m = XdsMetrics::register(&registry);
        for i in 0..1000 {
            m.proxy_connected(&format!("1.{i}.0"));
        }
        m.proxy_connected("1.2.3\nfake_metric 1");
        let text = render(&registry);
        let series = text.lines().filter(|l| l.starts_with("pilot_xds{")).count();
        assert_eq!(series, MAX_VERSION_LABELS + 1, "{text}");
        assert!(text.contains("pilot_xds{version=\"other\"} 969"), "{text}");
        m.proxy_disconnected("1.999.0");
        assert!(render(&registry).contains("pilot_xds{version=\"other\"} 968"));
    }

    #[test]
    fn istio_series_exist_before_first_use_with_istio_buckets() {
        let registry = Registry::new();
        let _m = XdsMetrics::register(&registry);
        let text = render(&registry);
        for t in ["cds", "eds", "lds", "rds"] {
            assert!(text.contains(&format!("pilot_xds_pushes{{type=\"{t}\"}}")), "{t}");
            assert!(text.contains(&format!("pilot_total_xds_rejects{{type=\"{t}\"}}")), "{t}");
            assert!(text.contains(&format!("pilot_xds_push_time_bucket{{type=\"{t}\",le=\"0.01\"}}")), "{t}");
        }
        assert!(text.contains(
            "pilot_xds_config_size_bytes_bucket{type=\"type.googleapis.com/envoy.config.cluster.v3.Cluster\",le=\"40000000\"}"
        ));
        assert!(text.contains("pilot_proxy_convergence_time_bucket{le=\"0.1\"}"));
        assert!(text.contains("# TYPE pilot_total_xds_internal_errors counter"));
    }
}
