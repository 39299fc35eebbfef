//! The Prometheus registry, periodically converted to OTLP and sent to a collector: one source of
//! truth, so OTLP carries exactly the names, labels and buckets `/metrics` shows.

use std::time::{Duration, SystemTime};

use opentelemetry::KeyValue;
use opentelemetry_proto::tonic::collector::metrics::v1::metrics_service_client::MetricsServiceClient;
use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest;
use opentelemetry_proto::tonic::common::v1::InstrumentationScope;
use opentelemetry_proto::tonic::metrics::v1::{
    metric, number_data_point, AggregationTemporality, Gauge, Histogram, HistogramDataPoint, Metric, NumberDataPoint,
    ResourceMetrics, ScopeMetrics, Sum,
};
use opentelemetry_proto::tonic::resource::v1::Resource as ProtoResource;
use opentelemetry_proto::transform::common::tonic::Attributes;
use prometheus::proto::{MetricFamily, MetricType};
use tokio::sync::watch;
use tonic::metadata::{MetadataKey, MetadataValue};
use tonic::transport::{Channel, Endpoint};
use tracing::{debug, warn};

use super::metrics::Registry;
use super::otlp::{process_start_nanos, unix_nanos, Identity, OtlpError, OtlpSettings, SCOPE};

/// Sends the registry to one OTLP/gRPC endpoint.
pub(super) struct MetricsExporter {
    client: MetricsServiceClient<Channel>,
    headers: Vec<(MetadataKey<tonic::metadata::Ascii>, MetadataValue<tonic::metadata::Ascii>)>,
    timeout: Duration,
    identity: Identity,
    endpoint: String,
    registry: Registry,
}

impl MetricsExporter {
    /// A lazily connecting client (call inside a Tokio runtime).
    pub(super) fn new(
        endpoint: &str,
        settings: &OtlpSettings,
        identity: Identity,
        registry: Registry,
    ) -> Result<Self, OtlpError> {
        let channel = Endpoint::from_shared(endpoint.to_string())
            .map_err(|source| OtlpError::MetricsEndpoint { endpoint: endpoint.to_string(), source })?
            .timeout(settings.metrics_timeout)
            .connect_lazy();
        let headers = settings
            .metrics_headers
            .iter()
            .filter_map(|(k, v)| Some((MetadataKey::from_bytes(k.as_bytes()).ok()?, MetadataValue::try_from(v).ok()?)))
            .collect();
        Ok(MetricsExporter {
            client: MetricsServiceClient::new(channel),
            headers,
            timeout: settings.metrics_timeout,
            identity,
            endpoint: endpoint.to_string(),
            registry,
        })
    }

    /// Exports every `interval` until `stop` turns true, then once more (the flush).
    pub(super) async fn run(mut self, interval: Duration, mut stop: watch::Receiver<bool>) {
        let mut ticks = tokio::time::interval(interval);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        ticks.tick().await;
        loop {
            tokio::select! {
                _ = ticks.tick() => self.export().await,
                _ = stop.changed() => break,
            }
        }
        self.export().await;
    }

    async fn export(&mut self) {
        let families = self.registry.gather();
        let resource = self.identity.resource(self.identity.current_term(&families));
        let request = to_request(&families, &resource, SystemTime::now());
        let mut request = tonic::Request::new(request);
        for (k, v) in &self.headers {
            request.metadata_mut().insert(k.clone(), v.clone());
        }
        match tokio::time::timeout(self.timeout, self.client.export(request)).await {
            Ok(Ok(_)) => debug!(endpoint = %self.endpoint, "metrics exported"),
            Ok(Err(status)) => warn!(endpoint = %self.endpoint, %status, "OTLP metrics export failed"),
            Err(_) => warn!(endpoint = %self.endpoint, timeout = ?self.timeout, "OTLP metrics export timed out"),
        }
    }
}

/// The OTLP request carrying `families` for `resource`, observed at `now`.
pub fn to_request(
    families: &[MetricFamily],
    resource: &opentelemetry_sdk::Resource,
    now: SystemTime,
) -> ExportMetricsServiceRequest {
    let attributes: Vec<KeyValue> = resource.iter().map(|(k, v)| KeyValue::new(k.clone(), v.clone())).collect();
    let (start, now) = (process_start_nanos(), unix_nanos(now));
    ExportMetricsServiceRequest {
        resource_metrics: vec![ResourceMetrics {
            resource: Some(ProtoResource { attributes: Attributes::from(attributes).0, ..Default::default() }),
            scope_metrics: vec![ScopeMetrics {
                scope: Some(InstrumentationScope {
                    name: SCOPE.to_string(),
                    version: env!("CARGO_PKG_VERSION").to_string(),
                    ..Default::default()
                }),
                metrics: families.iter().filter_map(|f| to_metric(f, start, now)).collect(),
                schema_url: String::new(),
            }],
            schema_url: resource.schema_url().unwrap_or_default().to_string(),
        }],
    }
}

/// One family in OTLP form; `None` for summaries and untyped families (meshpilot has none).
fn to_metric(family: &MetricFamily, start: u64, now: u64) -> Option<Metric> {
    let cumulative = AggregationTemporality::Cumulative as i32;
    let points = family.get_metric();
    let number = |value: f64, labels: &[prometheus::proto::LabelPair]| NumberDataPoint {
        attributes: attributes(labels),
        start_time_unix_nano: start,
        time_unix_nano: now,
        value: Some(number_data_point::Value::AsDouble(value)),
        ..Default::default()
    };
    let data = match family.get_field_type() {
        MetricType::COUNTER => metric::Data::Sum(Sum {
            data_points: points.iter().map(|m| number(m.get_counter().get_value(), m.get_label())).collect(),
            aggregation_temporality: cumulative,
            is_monotonic: true,
        }),
        MetricType::GAUGE => metric::Data::Gauge(Gauge {
            data_points: points
                .iter()
                .map(|m| NumberDataPoint {
                    start_time_unix_nano: 0,
                    ..number(m.get_gauge().get_value(), m.get_label())
                })
                .collect(),
        }),
        MetricType::HISTOGRAM => metric::Data::Histogram(Histogram {
            data_points: points
                .iter()
                .map(|m| {
                    let h = m.get_histogram();
                    let (explicit_bounds, bucket_counts) = buckets(h);
                    HistogramDataPoint {
                        attributes: attributes(m.get_label()),
                        start_time_unix_nano: start,
                        time_unix_nano: now,
                        count: h.get_sample_count(),
                        sum: Some(h.get_sample_sum()),
                        bucket_counts,
                        explicit_bounds,
                        ..Default::default()
                    }
                })
                .collect(),
            aggregation_temporality: cumulative,
        }),
        MetricType::SUMMARY | MetricType::UNTYPED => return None,
    };
    Some(Metric {
        name: family.name().to_string(),
        description: family.help().to_string(),
        unit: String::new(),
        data: Some(data),
        ..Default::default()
    })
}

/// Prometheus' cumulative buckets as OTLP's bounds and per-bucket counts (one more count than
/// bounds: the last is the `+Inf` bucket).
fn buckets(h: &prometheus::proto::Histogram) -> (Vec<f64>, Vec<u64>) {
    let mut bounds = Vec::new();
    let mut counts = Vec::new();
    let mut below = 0u64;
    for b in h.get_bucket().iter().filter(|b| b.upper_bound().is_finite()) {
        bounds.push(b.upper_bound());
        counts.push(b.cumulative_count().saturating_sub(below));
        below = b.cumulative_count();
    }
    counts.push(h.get_sample_count().saturating_sub(below));
    (bounds, counts)
}

fn attributes(labels: &[prometheus::proto::LabelPair]) -> Vec<opentelemetry_proto::tonic::common::v1::KeyValue> {
    Attributes::from(labels.iter().map(|l| KeyValue::new(l.name().to_string(), l.value().to_string()))).0
}

#[cfg(test)]
mod tests {
    use prometheus::{HistogramOpts, HistogramVec, IntCounterVec, Opts, Registry};

    use super::*;

    #[test]
    fn families_keep_names_labels_and_buckets() {
        let r = Registry::new();
        let pushes = IntCounterVec::new(Opts::new("pilot_xds_pushes", "h"), &["type"]).unwrap();
        let times =
            HistogramVec::new(HistogramOpts::new("pilot_xds_push_time", "h").buckets(vec![0.01, 0.1, 1.0]), &["type"])
                .unwrap();
        r.register(Box::new(pushes.clone())).unwrap();
        r.register(Box::new(times.clone())).unwrap();
        pushes.with_label_values(&["cds"]).inc_by(3);
        for v in [0.005, 0.05, 0.05, 5.0] {
            times.with_label_values(&["eds"]).observe(v);
        }
        let resource = opentelemetry_sdk::Resource::builder_empty().with_service_name("meshpilot").build();
        let req = to_request(&r.gather(), &resource, SystemTime::now());
        let metrics = &req.resource_metrics[0].scope_metrics[0].metrics;
        let by_name = |n: &str| metrics.iter().find(|m| m.name == n).unwrap().data.clone().unwrap();
        let metric::Data::Sum(sum) = by_name("pilot_xds_pushes") else { panic!("not a sum") };
        assert!(sum.is_monotonic);
        assert_eq!(sum.data_points[0].value, Some(number_data_point::Value::AsDouble(3.0)));
        assert_eq!(sum.data_points[0].attributes[0].key, "type");
        let metric::Data::Histogram(h) = by_name("pilot_xds_push_time") else { panic!("not a histogram") };
        let p = &h.data_points[0];
        assert_eq!(p.explicit_bounds, vec![0.01, 0.1, 1.0]);
        assert_eq!(p.bucket_counts, vec![1, 2, 0, 1]);
        assert_eq!(p.count, 4);
    }
}
