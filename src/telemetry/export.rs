//! The running OTLP export of traces and metrics, started from the settings in [`super::otlp`].

use std::time::Duration;

use opentelemetry::trace::TracerProvider as _;
use opentelemetry_otlp::WithExportConfig;
use opentelemetry_sdk::trace::{SdkTracer, SdkTracerProvider};
use tokio::sync::watch;
use tracing::{info, warn};

use super::metrics::Registry;
use super::otlp::{process_start_nanos, Identity, OtlpError, OtlpSettings, SCOPE};
use super::otlp_metrics::MetricsExporter;
use super::Role;

/// Timeout of the final flush at exit.
const SHUTDOWN_TIMEOUT: Duration = Duration::from_secs(5);

/// Running telemetry export; flushes and stops on drop.
pub struct Telemetry {
    tracer_provider: SdkTracerProvider,
    traces_exported: bool,
    metrics: Option<(watch::Sender<bool>, tokio::task::JoinHandle<()>)>,
    runtime: Option<tokio::runtime::Runtime>,
    settings: OtlpSettings,
    errors: Vec<String>,
}

impl Telemetry {
    /// No export; spans still get ids.
    pub fn disabled() -> Telemetry {
        Telemetry {
            tracer_provider: SdkTracerProvider::builder().build(),
            traces_exported: false,
            metrics: None,
            runtime: None,
            settings: OtlpSettings::default(),
            errors: Vec::new(),
        }
    }

    /// Starts the exporters the environment asks for, on a small runtime of their own (so they work
    /// before and after the process's main runtime, and flush at exit).
    pub fn start(role: Role, id: &str, registry: Registry) -> Telemetry {
        process_start_nanos();
        let settings = OtlpSettings::from_env();
        let identity = Identity { role, id: id.to_string() };
        let static_term = (role == Role::Standalone).then_some(1);
        let mut telemetry = Telemetry::disabled();
        telemetry.settings = settings.clone();
        let runtime = if settings.traces_endpoint.is_some() || settings.metrics_endpoint.is_some() {
            match tokio::runtime::Builder::new_multi_thread()
                .worker_threads(1)
                .thread_name("meshpilot-otlp")
                .enable_all()
                .build()
            {
                Ok(rt) => Some(rt),
                Err(e) => {
                    telemetry.errors.push(OtlpError::Runtime(e).to_string());
                    None
                }
            }
        } else {
            None
        };
        let mut provider = SdkTracerProvider::builder().with_resource(identity.resource(static_term));
        if let (Some(rt), Some(endpoint)) = (&runtime, &settings.traces_endpoint) {
            // The tonic channel spawns its connection task on the runtime entered here.
            let _entered = rt.enter();
            match opentelemetry_otlp::SpanExporter::builder().with_tonic().with_endpoint(endpoint.clone()).build() {
                Ok(exporter) => {
                    provider = provider.with_batch_exporter(exporter);
                    telemetry.traces_exported = true;
                }
                Err(e) => telemetry.errors.push(format!("{endpoint}: {}", OtlpError::Traces(e))),
            }
        }
        telemetry.tracer_provider = provider.build();
        opentelemetry::global::set_tracer_provider(telemetry.tracer_provider.clone());
        if let (Some(rt), Some(endpoint)) = (&runtime, &settings.metrics_endpoint) {
            let _entered = rt.enter();
            match MetricsExporter::new(endpoint, &settings, identity, registry) {
                Ok(exporter) => {
                    let (stop_tx, stop_rx) = watch::channel(false);
                    let task = rt.spawn(exporter.run(settings.metrics_interval, stop_rx));
                    telemetry.metrics = Some((stop_tx, task));
                }
                Err(e) => telemetry.errors.push(e.to_string()),
            }
        }
        telemetry.runtime = runtime;
        telemetry
    }

    /// The tracer for the `tracing` bridge.
    pub fn tracer(&self) -> SdkTracer {
        self.tracer_provider.tracer(SCOPE)
    }

    /// Logs what is exported where, and any configuration problem (call once logging is up).
    pub fn log_configuration(&self) {
        for w in &self.settings.warnings {
            warn!("OpenTelemetry: {w}");
        }
        for e in &self.errors {
            warn!("OpenTelemetry export disabled: {e}");
        }
        info!(
            traces = self.traces_exported.then_some(self.settings.traces_endpoint.as_deref()).flatten().unwrap_or("off"),
            metrics = self
                .metrics
                .as_ref()
                .and(self.settings.metrics_endpoint.as_deref())
                .unwrap_or("off"),
            metrics_interval = ?self.settings.metrics_interval,
            "OpenTelemetry export"
        );
    }

    /// Flushes pending spans and sends a last metrics export, then stops the exporters.
    pub fn shutdown(&mut self) {
        if self.traces_exported {
            if let Err(e) = self.tracer_provider.shutdown_with_timeout(SHUTDOWN_TIMEOUT) {
                eprintln!("meshpilot: flushing spans: {e}");
            }
            self.traces_exported = false;
        }
        if let (Some((stop, task)), Some(rt)) = (self.metrics.take(), &self.runtime) {
            let _ = stop.send(true);
            let _ = rt.block_on(async { tokio::time::timeout(SHUTDOWN_TIMEOUT, task).await });
        }
        if let Some(rt) = self.runtime.take() {
            rt.shutdown_timeout(Duration::from_secs(1));
        }
    }
}

impl Drop for Telemetry {
    fn drop(&mut self) {
        self.shutdown();
    }
}

impl std::fmt::Debug for Telemetry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Telemetry")
            .field("traces", &self.traces_exported)
            .field("metrics", &self.metrics.is_some())
            .finish_non_exhaustive()
    }
}
