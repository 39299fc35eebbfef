//! Composition roots, after ztunnel's `app.rs`: one per role builds its components, wires them
//! together, and hands every task the process's drain and readiness.
//!
//! - [`standalone`]: sources → ingest → snapshot channel → xDS, in one process.
//! - [`ingest`]: sources → ingest, leader election, and the snapshot server while leading.
//! - [`frontend`]: leader watch → snapshot subscriber → xDS, membership and ownership.
//!
//! [`run`] owns the runtime and the signals: on SIGINT/SIGTERM it starts the drain and waits for
//! every task (ADS streams end with UNAVAILABLE, a leader resigns its lease) up to
//! [`DRAIN_DEADLINE`].

mod clients;
pub mod frontend;
pub mod ingest;
mod leadership;
mod pipeline;
pub mod security;
mod servers;
pub mod standalone;
mod tasks;
mod upkeep;
pub mod webhook;

use std::future::Future;
use std::time::Duration;

use tracing::{info, warn};

use crate::drain::{self, DrainWatcher};
use crate::telemetry::metrics::Registry;
use crate::telemetry::process::ProcessMetrics;

pub use servers::ServeError;

/// Why a role could not start or stopped.
#[derive(Debug, thiserror::Error)]
pub enum RoleError {
    /// etcd could not be used.
    #[error(transparent)]
    Etcd(#[from] crate::cluster::etcd::EtcdError),
    /// The Kubernetes client could not be configured.
    #[error(transparent)]
    Kubernetes(#[from] crate::source::KubeError),
    /// A config source could not start.
    #[error(transparent)]
    Sources(#[from] crate::source::SourceError),
    /// A listener failed.
    #[error(transparent)]
    Serve(#[from] ServeError),
    /// The CA or the secure port could not start.
    #[error(transparent)]
    Security(#[from] security::SecurityError),
    /// The validating webhook's TLS could not be set up.
    #[error(transparent)]
    Webhook(#[from] crate::webhook::server::WebhookTlsError),
    /// A task of the role ended before the drain, or panicked.
    #[error(transparent)]
    Task(#[from] tasks::TaskError),
}

/// How long a terminating process drains before it exits regardless: Kubernetes would SIGKILL it
/// anyway, and peers that keep connections open must not hold it.
pub const DRAIN_DEADLINE: Duration = Duration::from_secs(5);

/// What a role's composition root gets from the process.
#[derive(Clone)]
pub struct Process {
    /// Where every component registers its metrics (served at `/metrics`, exported over OTLP).
    pub registry: Registry,
    /// The metrics every role has.
    pub metrics: ProcessMetrics,
}

impl Process {
    /// A process whose components register in `registry`, with `meshpilot_build_info` set.
    pub fn new(registry: Registry, role: &str, id: &str) -> Process {
        let metrics = ProcessMetrics::register(&registry);
        metrics.set_build_info(role, id);
        Process { registry, metrics }
    }
}

/// Why the runtime could not run a role.
#[derive(Debug, thiserror::Error)]
pub enum RunError<E: std::error::Error + 'static> {
    /// The async runtime could not start.
    #[error("starting the async runtime: {0}")]
    Runtime(#[source] std::io::Error),
    /// The role failed.
    #[error(transparent)]
    Role(E),
    /// The role's task panicked (a bug).
    #[error("role task failed: {0}")]
    Panicked(String),
}

/// Threads for blocking work (snapshot builds, config conversion, xDS generation): two per core,
/// at least four. Each such thread's allocator heap keeps its own partly used pages, so tokio's
/// default of 512, reached in a burst, holds far more memory than the work needs.
fn blocking_threads() -> usize {
    std::thread::available_parallelism().map_or(4, |n| (n.get() * 2).max(4))
}

/// Runs `role` (given the drain watcher every task holds) on a new runtime until it stops by
/// itself or a signal arrives; then drains for at most [`DRAIN_DEADLINE`].
pub fn run<F, Fut, E>(role: F) -> Result<(), RunError<E>>
where
    F: FnOnce(DrainWatcher) -> Fut,
    Fut: Future<Output = Result<(), E>> + Send + 'static,
    E: std::error::Error + Send + 'static,
{
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .max_blocking_threads(blocking_threads())
        .build()
        .map_err(RunError::Runtime)?;
    let result = runtime.block_on(async {
        let (trigger, watcher) = drain::new();
        let mut task = tokio::spawn(role(watcher));
        let stopped_by_itself = tokio::select! {
            result = &mut task => Some(result),
            _ = shutdown_signal() => None,
        };
        if let Some(result) = stopped_by_itself {
            return joined(result);
        }
        info!(deadline = ?DRAIN_DEADLINE, "shutting down");
        if tokio::time::timeout(DRAIN_DEADLINE, trigger.start_drain_and_wait()).await.is_err() {
            warn!("drain deadline passed; exiting with tasks still running");
            return Ok(());
        }
        // Every watcher is gone, so the role's own future is at its end.
        match tokio::time::timeout(Duration::from_secs(1), task).await {
            Ok(result) => joined(result),
            Err(_) => Ok(()),
        }
    });
    // Tasks still holding connections are dropped here instead of waited for.
    runtime.shutdown_timeout(Duration::from_secs(1));
    result
}

fn joined<E: std::error::Error + 'static>(
    result: Result<Result<(), E>, tokio::task::JoinError>,
) -> Result<(), RunError<E>> {
    match result {
        Ok(r) => r.map_err(RunError::Role),
        Err(e) => Err(RunError::Panicked(e.to_string())),
    }
}

async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut term = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(t) => t,
            Err(_) => {
                let _ = ctrl_c.await;
                return;
            }
        };
        tokio::select! {
            _ = ctrl_c => {}
            _ = term.recv() => {}
        }
    }
    #[cfg(not(unix))]
    let _ = ctrl_c.await;
}
