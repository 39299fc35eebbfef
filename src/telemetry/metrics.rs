//! Metric plumbing: the registry every component registers its own metrics in, the process
//! metrics every role has, and Prometheus text rendering.
//!
//! Telemetry knows no component: `xds`, `ingest`, `replication` and `cluster` each own a metrics
//! struct with Istio's names, labels and buckets, registered in the [`Registry`] their
//! composition root gives them.

use prometheus::core::Collector;
use prometheus::{
    Encoder, Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Opts,
    TextEncoder,
};

pub use prometheus::Registry;

/// Buckets of Istio's push and send time histograms.
pub const PUSH_BUCKETS: &[f64] = &[0.01, 0.1, 1.0, 3.0, 5.0, 10.0, 20.0, 30.0];
/// Buckets of Istio's convergence and queue time histograms.
pub const CONVERGENCE_BUCKETS: &[f64] = &[0.1, 0.5, 1.0, 3.0, 5.0, 10.0, 20.0, 30.0];
/// Buckets of Istio's PushContext init time histogram.
pub const INIT_BUCKETS: &[f64] = &[0.01, 0.1, 0.5, 1.0, 3.0, 5.0];
/// Buckets of Istio's config size histogram.
pub const SIZE_BUCKETS: &[f64] = &[1.0, 10_000.0, 1_000_000.0, 4_000_000.0, 10_000_000.0, 40_000_000.0];

/// Registers `metric` in `registry` and returns it. A failure (a duplicate name: a programming
/// error) is logged and the metric still works, unexported, rather than stopping the process.
pub fn register<M: Collector + Clone + 'static>(registry: &Registry, metric: M) -> M {
    if let Err(e) = registry.register(Box::new(metric.clone())) {
        tracing::warn!(error = %e, "metric not registered");
    }
    metric
}

/// A registered counter.
pub fn counter(registry: &Registry, name: &str, help: &str) -> IntCounter {
    register(registry, IntCounter::with_opts(Opts::new(name, help)).unwrap_or_else(|_| invalid_name(name)))
}

/// A registered counter with labels.
pub fn counter_vec(registry: &Registry, name: &str, help: &str, labels: &[&str]) -> IntCounterVec {
    register(registry, IntCounterVec::new(Opts::new(name, help), labels).unwrap_or_else(|_| invalid_name(name)))
}

/// A registered gauge.
pub fn gauge(registry: &Registry, name: &str, help: &str) -> IntGauge {
    register(registry, IntGauge::with_opts(Opts::new(name, help)).unwrap_or_else(|_| invalid_name(name)))
}

/// A registered floating-point gauge.
pub fn float_gauge(registry: &Registry, name: &str, help: &str) -> prometheus::Gauge {
    register(registry, prometheus::Gauge::with_opts(Opts::new(name, help)).unwrap_or_else(|_| invalid_name(name)))
}

/// A registered gauge with labels.
pub fn gauge_vec(registry: &Registry, name: &str, help: &str, labels: &[&str]) -> IntGaugeVec {
    register(registry, IntGaugeVec::new(Opts::new(name, help), labels).unwrap_or_else(|_| invalid_name(name)))
}

/// A registered histogram.
pub fn histogram(registry: &Registry, name: &str, help: &str, buckets: &[f64]) -> Histogram {
    let opts = HistogramOpts::new(name, help).buckets(buckets.to_vec());
    register(registry, Histogram::with_opts(opts).unwrap_or_else(|_| invalid_name(name)))
}

/// A registered histogram with labels.
pub fn histogram_vec(registry: &Registry, name: &str, help: &str, labels: &[&str], buckets: &[f64]) -> HistogramVec {
    let opts = HistogramOpts::new(name, help).buckets(buckets.to_vec());
    register(registry, HistogramVec::new(opts, labels).unwrap_or_else(|_| invalid_name(name)))
}

/// Metric names and buckets are constants of this crate: an invalid one is a bug caught by the
/// first test that builds the metrics, never input from outside.
#[track_caller]
pub(crate) fn invalid_name(name: &str) -> ! {
    panic!("invalid metric definition {name:?}")
}

/// Clamps a count into a gauge value.
pub fn gauge_value(n: impl TryInto<i64>) -> i64 {
    n.try_into().unwrap_or(i64::MAX)
}

/// Bounds the series a labelled metric may create from values it does not choose itself: a
/// label set already seen, or one that fits under the cap, is kept; any other becomes the
/// overflow value in every label. The sets seen are kept, so a series never changes its labels.
#[derive(Debug, Clone)]
pub struct SeriesCap {
    max: usize,
    seen: std::sync::Arc<std::sync::Mutex<std::collections::HashSet<Vec<String>>>>,
}

impl SeriesCap {
    /// At most `max` distinct label sets (plus the overflow one).
    pub fn new(max: usize) -> SeriesCap {
        SeriesCap { max, seen: Default::default() }
    }

    /// `labels` when its series exists or there is room for it, else `overflow` for each label.
    pub fn admit<'a>(&self, labels: &[&'a str], overflow: &'a str) -> Vec<&'a str> {
        let key: Vec<String> = labels.iter().map(|l| l.to_string()).collect();
        let mut seen = self.seen.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        if seen.contains(&key) || seen.len() < self.max {
            seen.insert(key);
            labels.to_vec()
        } else {
            vec![overflow; labels.len()]
        }
    }
}

/// Metrics every meshpilot process has, whatever its role.
#[derive(Clone, Debug)]
pub struct ProcessMetrics {
    /// `meshpilot_build_info{role,id,version}`: 1, identifying this process.
    pub build_info: IntGaugeVec,
    /// `meshpilot_snapshot_version{part}`: term and seq of the snapshot held.
    pub snapshot_version: IntGaugeVec,
}

impl ProcessMetrics {
    /// Registers the process metrics in `registry`.
    pub fn register(registry: &Registry) -> ProcessMetrics {
        register(registry, super::heap::HeapCollector::new());
        ProcessMetrics {
            build_info: gauge_vec(
                registry,
                "meshpilot_build_info",
                "Always 1; identifies this process by role (standalone, ingest, frontend), id and version.",
                &["role", "id", "version"],
            ),
            snapshot_version: gauge_vec(
                registry,
                "meshpilot_snapshot_version",
                "Version of the snapshot this process holds, by part (term, seq).",
                &["part"],
            ),
        }
    }

    /// Sets `meshpilot_build_info{role,id,version}` to 1.
    pub fn set_build_info(&self, role: &str, id: &str) {
        self.build_info.with_label_values(&[role, id, env!("CARGO_PKG_VERSION")]).set(1);
    }

    /// Sets `meshpilot_snapshot_version{part}` to the version this process holds.
    pub fn set_snapshot_version(&self, term: u64, seq: u64) {
        self.snapshot_version.with_label_values(&["term"]).set(gauge_value(term));
        self.snapshot_version.with_label_values(&["seq"]).set(gauge_value(seq));
    }
}

/// Prometheus text exposition of every metric in `registry`.
pub fn render(registry: &Registry) -> String {
    let mut buf = Vec::new();
    // Encoding into a Vec cannot fail for well-formed metric families.
    if let Err(e) = TextEncoder::new().encode(&registry.gather(), &mut buf) {
        tracing::warn!(error = %e, "metrics encoding failed");
    }
    String::from_utf8(buf).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn process_metrics_render_with_their_labels() {
        let registry = Registry::new();
        let m = ProcessMetrics::register(&registry);
        m.set_build_info("standalone", "a");
        m.set_snapshot_version(3, 7);
        let text = render(&registry);
        assert!(text.contains("meshpilot_snapshot_version{part=\"term\"} 3"), "{text}");
        assert!(text.contains("meshpilot_snapshot_version{part=\"seq\"} 7"), "{text}");
        assert!(text.contains(&format!(
            "meshpilot_build_info{{id=\"a\",role=\"standalone\",version=\"{}\"}} 1",
            env!("CARGO_PKG_VERSION")
        )));
    }

    #[test]
    fn a_series_cap_keeps_seen_sets_and_folds_the_rest() {
        let cap = SeriesCap::new(2);
        assert_eq!(cap.admit(&["a", "1"], "other"), ["a", "1"]);
        assert_eq!(cap.admit(&["b", "1"], "other"), ["b", "1"]);
        assert_eq!(cap.admit(&["c", "1"], "other"), ["other", "other"]);
        assert_eq!(cap.admit(&["a", "1"], "other"), ["a", "1"]);
    }

    #[test]
    fn a_duplicate_registration_is_not_fatal() {
        let registry = Registry::new();
        let a = counter(&registry, "x_total", "x");
        let b = counter(&registry, "x_total", "x");
        a.inc();
        b.inc();
        assert!(render(&registry).contains("x_total 1"));
    }
}
