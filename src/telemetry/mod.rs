//! Logs, spans and metrics.
//!
//! - **Logs and spans**: `tracing`, printed as text or JSON lines (`MESHPILOT_LOG_FORMAT=json`),
//!   filtered by `RUST_LOG` (default `info`).
//! - **Traces**: every `meshpilot` span at INFO and above is also an OpenTelemetry span (so trace
//!   ids exist, and show in logs and `/debug/push_status`, even when nothing is exported). They are
//!   exported over OTLP/gRPC when `OTEL_EXPORTER_OTLP_ENDPOINT` (or `..._TRACES_ENDPOINT`) is set.
//! - **Metrics**: Prometheus text at the admin port's `/metrics` always ([`metrics`]); the same
//!   values over OTLP/gRPC when `OTEL_EXPORTER_OTLP_ENDPOINT` (or `..._METRICS_ENDPOINT`) is set.
//!
//! See [`otlp`] for the environment variables and the resource attributes.

pub mod export;
pub mod heap;
pub mod log_text;
pub mod metrics;
pub mod otlp;
mod otlp_metrics;
pub mod process;
mod role;
pub mod trace;

use tracing::Level;
use tracing_subscriber::filter::Targets;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{EnvFilter, Layer};

pub use export::Telemetry;
pub use role::Role;

/// Installs logging and, for the serving roles, OpenTelemetry (see the module docs). Keep the
/// returned guard alive while the process runs: dropping it flushes and stops the exporters.
pub fn init_logging(role: Role, id: &str, registry: &metrics::Registry) -> Telemetry {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let json = std::env::var("MESHPILOT_LOG_FORMAT").is_ok_and(|v| v == "json");
    let fmt = if json {
        tracing_subscriber::fmt::layer().json().with_target(false).boxed()
    } else {
        tracing_subscriber::fmt::layer().with_target(false).boxed()
    };
    if role == Role::Tool {
        let _ = tracing_subscriber::registry().with(fmt.with_filter(filter)).try_init();
        return Telemetry::disabled();
    }
    let telemetry = Telemetry::start(role, id, registry.clone());
    // Spans of meshpilot itself become OpenTelemetry spans whatever RUST_LOG says.
    let otel = tracing_opentelemetry::layer()
        .with_tracer(telemetry.tracer())
        .with_filter(Targets::new().with_target("meshpilot", Level::INFO));
    let _ = tracing_subscriber::registry().with(fmt.with_filter(filter)).with(otel).try_init();
    telemetry.log_configuration();
    telemetry
}
