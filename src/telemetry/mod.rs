//! Logs, spans and metrics.

pub mod metrics;

use tracing_subscriber::EnvFilter;

/// Installs structured logging (`RUST_LOG` filter, default `info`; `MESHPILOT_LOG_FORMAT=json` for JSON lines).
pub fn init_logging() {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let json = std::env::var("MESHPILOT_LOG_FORMAT").is_ok_and(|v| v == "json");
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_target(false);
    let _ = if json { builder.json().try_init() } else { builder.try_init() };
}
