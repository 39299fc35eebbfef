//! OTLP/gRPC export of traces and metrics: its settings, read only from the standard
//! OpenTelemetry environment variables (off when no endpoint is set), and the resource it carries.
//! The exporters themselves run in [`super::export`].
//!
//! | variable | effect |
//! | --- | --- |
//! | `OTEL_EXPORTER_OTLP_ENDPOINT` | collector for both signals, e.g. `http://127.0.0.1:4317` (plaintext gRPC) |
//! | `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`, `..._METRICS_ENDPOINT` | per signal, override the above |
//! | `OTEL_EXPORTER_OTLP_HEADERS` (`..._TRACES_`/`..._METRICS_`) | `key=value,...` sent with every export |
//! | `OTEL_EXPORTER_OTLP_TIMEOUT` (`..._TRACES_`/`..._METRICS_`) | export timeout in ms (default 10000) |
//! | `OTEL_TRACES_EXPORTER`, `OTEL_METRICS_EXPORTER` | `none` turns that signal off; `otlp` is the only exporter |
//! | `OTEL_SDK_DISABLED` | `true` turns both off |
//! | `OTEL_SERVICE_NAME` | `service.name` (default `meshpilot`) |
//! | `OTEL_RESOURCE_ATTRIBUTES` | extra resource attributes; they win over meshpilot's own |
//! | `OTEL_TRACES_SAMPLER`, `OTEL_TRACES_SAMPLER_ARG` | sampler (default `parentbased_always_on`) |
//! | `OTEL_BSP_SCHEDULE_DELAY`, `OTEL_BSP_*` | span batching (default: every 5 s) |
//! | `OTEL_METRIC_EXPORT_INTERVAL` | metrics export interval in ms (default 60000) |
//!
//! **Resource.** `service.name`, `service.version`, `service.instance.id` (the node id),
//! `meshpilot.role` (`standalone`, `ingest` or `frontend`) and, where known, `meshpilot.term`.
//! An OpenTelemetry SDK resource never changes after start-up, and a term does (elections), so:
//! the traces' resource carries the term only when it is fixed at start (standalone: 1); every push
//! span carries the snapshot version (`meshpilot.version`, whose first part is the term); and the
//! metrics' resource is rebuilt at every export with the current term (the leader's term on an
//! ingest node while it leads, the followed term on a frontend).
//!
//! **Metrics.** The Prometheus registry behind `/metrics` is the only source: every export gathers
//! it and converts each family to its OTLP form (counter → monotonic cumulative sum, gauge → gauge,
//! histogram → cumulative explicit-bucket histogram with the same bounds), keeping names, labels and
//! buckets exactly as `/metrics` shows them; units are left empty so no exporter appends suffixes.
//! A collector that re-exposes them to Prometheus must not add suffixes either (see
//! `deploy/observability/`).

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime};

use opentelemetry::KeyValue;
use opentelemetry_sdk::resource::{EnvResourceDetector, TelemetryResourceDetector};
use opentelemetry_sdk::Resource;

use super::Role;

/// The `meshpilot.role` resource attribute.
pub const ROLE_ATTRIBUTE: &str = "meshpilot.role";
/// The `meshpilot.term` resource attribute.
pub const TERM_ATTRIBUTE: &str = "meshpilot.term";
/// The tracer (instrumentation scope) name of meshpilot's spans and metrics.
pub const SCOPE: &str = "meshpilot";

/// Why an exporter could not be set up (the process then runs without it).
#[derive(Debug, thiserror::Error)]
pub enum OtlpError {
    /// The exporter runtime could not start.
    #[error("starting the telemetry runtime: {0}")]
    Runtime(#[from] std::io::Error),
    /// The trace exporter could not be built.
    #[error("trace exporter: {0}")]
    Traces(#[from] opentelemetry_otlp::ExporterBuildError),
    /// The metrics endpoint is not a valid URI.
    #[error("metrics endpoint {endpoint:?}: {source}")]
    MetricsEndpoint {
        /// The endpoint.
        endpoint: String,
        /// Cause.
        source: tonic::transport::Error,
    },
}

/// Export settings read from the environment.
#[derive(Debug, Clone, Default)]
pub struct OtlpSettings {
    /// Where traces go (`None`: not exported).
    pub traces_endpoint: Option<String>,
    /// Where metrics go (`None`: not exported).
    pub metrics_endpoint: Option<String>,
    /// Headers sent with metrics exports.
    pub metrics_headers: Vec<(String, String)>,
    /// Metrics export interval.
    pub metrics_interval: Duration,
    /// Metrics export timeout.
    pub metrics_timeout: Duration,
    /// Problems found in the variables (logged once logging is up).
    pub warnings: Vec<String>,
}

impl OtlpSettings {
    /// Reads the standard OpenTelemetry variables.
    pub fn from_env() -> OtlpSettings {
        let mut warnings = Vec::new();
        let disabled = var("OTEL_SDK_DISABLED").is_some_and(|v| v.eq_ignore_ascii_case("true"));
        let mut signal = |name: &str, selector: &str| {
            let exporter = var(selector).unwrap_or_else(|| "otlp".into());
            if disabled || exporter == "none" {
                return None;
            }
            if exporter != "otlp" {
                warnings.push(format!("{selector}={exporter} is not supported; using otlp"));
            }
            let upper = name.to_ascii_uppercase();
            let protocol =
                var(&format!("OTEL_EXPORTER_OTLP_{upper}_PROTOCOL")).or_else(|| var("OTEL_EXPORTER_OTLP_PROTOCOL"));
            if let Some(p) = protocol.filter(|p| p != "grpc") {
                warnings.push(format!("OTLP protocol {p:?} for {name} is not supported; using grpc"));
            }
            var(&format!("OTEL_EXPORTER_OTLP_{upper}_ENDPOINT"))
                .or_else(|| var("OTEL_EXPORTER_OTLP_ENDPOINT"))
                .map(|e| with_scheme(&e))
        };
        let traces_endpoint = signal("traces", "OTEL_TRACES_EXPORTER");
        let metrics_endpoint = signal("metrics", "OTEL_METRICS_EXPORTER");
        let millis = |names: &[&str], default: u64, warnings: &mut Vec<String>| {
            let Some((name, text)) = names.iter().find_map(|n| var(n).map(|v| (*n, v))) else {
                return Duration::from_millis(default);
            };
            match text.parse::<u64>() {
                Ok(ms) if ms > 0 => Duration::from_millis(ms),
                _ => {
                    warnings.push(format!("{name}={text:?} is not a positive number of milliseconds; using {default}"));
                    Duration::from_millis(default)
                }
            }
        };
        let metrics_interval = millis(&["OTEL_METRIC_EXPORT_INTERVAL"], 60_000, &mut warnings);
        let metrics_timeout =
            millis(&["OTEL_EXPORTER_OTLP_METRICS_TIMEOUT", "OTEL_EXPORTER_OTLP_TIMEOUT"], 10_000, &mut warnings);
        let metrics_headers = var("OTEL_EXPORTER_OTLP_METRICS_HEADERS")
            .or_else(|| var("OTEL_EXPORTER_OTLP_HEADERS"))
            .map(|h| parse_headers(&h))
            .unwrap_or_default();
        OtlpSettings { traces_endpoint, metrics_endpoint, metrics_headers, metrics_interval, metrics_timeout, warnings }
    }
}

/// A non-empty environment variable.
fn var(name: &str) -> Option<String> {
    std::env::var(name).ok().map(|v| v.trim().to_string()).filter(|v| !v.is_empty())
}

/// An endpoint as tonic wants it: `host:port` gets `http://` (plaintext gRPC).
fn with_scheme(endpoint: &str) -> String {
    if endpoint.contains("://") {
        endpoint.to_string()
    } else {
        format!("http://{endpoint}")
    }
}

/// `key=value,key2=value2` (W3C baggage-like, as the OTLP exporter spec has it).
fn parse_headers(text: &str) -> Vec<(String, String)> {
    text.split(',')
        .filter_map(|pair| pair.split_once('='))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_string()))
        .filter(|(k, _)| !k.is_empty())
        .collect()
}

/// Who this process is, for the resource attributes.
#[derive(Debug, Clone)]
pub struct Identity {
    /// Role.
    pub role: Role,
    /// Node id (`service.instance.id`).
    pub id: String,
}

impl Identity {
    /// The resource of this process: meshpilot's attributes, then the SDK's and the environment's on
    /// top (so `OTEL_RESOURCE_ATTRIBUTES` and `OTEL_SERVICE_NAME` win), with `term` if given.
    pub fn resource(&self, term: Option<u64>) -> Resource {
        let mut own = vec![
            KeyValue::new("service.name", "meshpilot"),
            KeyValue::new("service.version", env!("CARGO_PKG_VERSION")),
            KeyValue::new("service.instance.id", self.id.clone()),
            KeyValue::new(ROLE_ATTRIBUTE, self.role.as_str()),
        ];
        if let Some(term) = term {
            own.push(KeyValue::new(TERM_ATTRIBUTE, i64::try_from(term).unwrap_or(i64::MAX)));
        }
        let builder = Resource::builder_empty()
            .with_attributes(own)
            .with_detector(Box::new(TelemetryResourceDetector))
            .with_detector(Box::new(EnvResourceDetector::new()));
        match var("OTEL_SERVICE_NAME") {
            Some(name) => builder.with_service_name(name).build(),
            None => builder.build(),
        }
    }

    /// The term this process is in now, as its metrics say: fixed 1 standalone, the term it
    /// leads on an ingest node (none while standby), the term it follows on a frontend. Read by
    /// name from the gathered families: telemetry knows no component's metrics struct.
    pub fn current_term(&self, families: &[prometheus::proto::MetricFamily]) -> Option<u64> {
        let gauge = |name: &str| {
            families
                .iter()
                .find(|f| f.name() == name)
                .and_then(|f| f.get_metric().first())
                .map(|m| m.get_gauge().get_value())
        };
        let positive = |v: Option<f64>| v.filter(|t| *t >= 1.0).map(|t| t as u64);
        match self.role {
            Role::Standalone => Some(1),
            Role::Ingest if gauge("meshpilot_is_leader") == Some(1.0) => positive(gauge("meshpilot_leader_term")),
            Role::Frontend => positive(gauge("meshpilot_snapshot_leader_term")),
            Role::Ingest | Role::Tool => None,
        }
    }
}

/// Nanoseconds since the epoch at which this process started (start of cumulative metrics).
pub(super) fn process_start_nanos() -> u64 {
    static START: AtomicU64 = AtomicU64::new(0);
    let now = unix_nanos(SystemTime::now());
    match START.compare_exchange(0, now, Ordering::Relaxed, Ordering::Relaxed) {
        Ok(_) => now,
        Err(earlier) => earlier,
    }
}

/// Nanoseconds since the epoch.
pub(super) fn unix_nanos(t: SystemTime) -> u64 {
    t.duration_since(SystemTime::UNIX_EPOCH).map(|d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn headers_parse() {
        assert_eq!(
            parse_headers("Authorization=Bearer x, x-tenant = a ,bogus,=v"),
            vec![("authorization".to_string(), "Bearer x".to_string()), ("x-tenant".to_string(), "a".to_string())]
        );
    }

    #[test]
    fn resource_names_the_process() {
        let r = Identity { role: Role::Frontend, id: "frontend-7".into() }.resource(Some(3));
        let get = |k: &'static str| r.get(&opentelemetry::Key::from_static_str(k)).map(|v| v.to_string());
        assert_eq!(get("service.instance.id").as_deref(), Some("frontend-7"));
        assert_eq!(get(ROLE_ATTRIBUTE).as_deref(), Some("frontend"));
        assert_eq!(get(TERM_ATTRIBUTE).as_deref(), Some("3"));
        assert!(get("service.name").is_some());
    }
}
