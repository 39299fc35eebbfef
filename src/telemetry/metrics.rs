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
