//! The benchmark's load client: N simulated sidecars on real gRPC ADS streams against any xDS
//! server (meshpilot, istiod, the replay server), in one thread, measuring the initial
//! convergence and the push after each phase's change. Per proxy it keeps only counters and
//! shared name lists, so 10,000 proxies fit in one process.

mod board;
mod delta;
pub mod identity;
pub(crate) mod names;
pub mod phases;
pub mod report;
mod sotw;
mod stream;
mod wire;

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::task::JoinSet;
use tracing::{info, warn};

use self::board::SharedBoard;
use self::identity::ProxyIdentity;
use self::names::NameCache;
use self::phases::{PhaseError, PhaseFile};
use self::report::{ErrorReport, LoadReport};
use self::stream::ProxyContext;
use crate::sim::capture::{CaptureError, CaptureWriter, Mode};

/// How often the run looks at the board while waiting.
const POLL: Duration = Duration::from_millis(20);

/// What to run.
#[derive(Debug, Clone)]
pub struct LoadSettings {
    /// ADS URL (`http://127.0.0.1:15010`).
    pub xds_url: String,
    /// Number of simulated proxies.
    pub proxies: usize,
    /// Number of workloads (proxy `i` belongs to workload `i % workloads`).
    pub workloads: usize,
    /// Namespaces workloads are spread over (workload `w` in `namespaces[w % len]`).
    pub namespaces: Vec<String>,
    /// SotW or delta ADS.
    pub mode: Mode,
    /// Phases file.
    pub phases: Option<PathBuf>,
    /// Quiet time that ends a phase.
    pub settle: Duration,
    /// Longest wait for the initial convergence and for each phase.
    pub timeout: Duration,
    /// New streams per second (0: all at once).
    pub connect_rate: f64,
    /// Where to write the capture.
    pub capture: Option<PathBuf>,
}

/// Why a load run could not run (failures of proxies are in the report instead).
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    /// The settings cannot work.
    #[error("{0}")]
    Settings(&'static str),
    /// The phases file is unusable.
    #[error(transparent)]
    Phases(#[from] PhaseError),
    /// The capture could not be written.
    #[error("writing the capture: {0}")]
    Capture(#[from] CaptureError),
}

/// Runs the proxies through the initial phase and every phase of the file, and reports.
pub async fn run(settings: &LoadSettings) -> Result<LoadReport, LoadError> {
    if settings.proxies == 0 || settings.workloads == 0 || settings.namespaces.is_empty() {
        return Err(LoadError::Settings("--proxies, --workloads and --namespaces must not be empty or 0"));
    }
    if !(settings.connect_rate >= 0.0 && settings.connect_rate.is_finite()) {
        return Err(LoadError::Settings("--connect-rate must be a finite number >= 0"));
    }
    let phases = match &settings.phases {
        Some(path) => PhaseFile::read(path)?.phases,
        None => Vec::new(),
    };
    raise_open_files_limit();
    let capture = settings.capture.as_ref().map(|_| CaptureWriter::new(settings.mode));
    let board = SharedBoard::new(settings.proxies, capture);
    let ctx = Arc::new(ProxyContext {
        xds_url: settings.xds_url.clone(),
        board: board.clone(),
        cache: Mutex::new(NameCache::default()),
        capture_below: if settings.capture.is_some() { settings.workloads } else { 0 },
        assembly: tokio::sync::Semaphore::new(stream::CONCURRENT_MESSAGES),
    });

    let start = Instant::now();
    let deadline = start + settings.timeout;
    let mut tasks = JoinSet::new();
    for i in 0..settings.proxies {
        if settings.connect_rate > 0.0 {
            tokio::time::sleep_until((start + Duration::from_secs_f64(i as f64 / settings.connect_rate)).into()).await;
        }
        let id = ProxyIdentity::new(i, settings.workloads, &settings.namespaces);
        board.connecting(i);
        match settings.mode {
            Mode::Sotw => tasks.spawn(sotw::run(ctx.clone(), id)),
            Mode::Delta => tasks.spawn(delta::run(ctx.clone(), id)),
        };
    }
    info!(proxies = settings.proxies, mode = settings.mode.as_str(), "proxies connecting");
    let initial_timed_out = loop {
        // Proxies whose stream ended will never converge: stop waiting once only they are left.
        let waiting = board.lock().proxies.iter().any(|p| p.converged_at.is_none() && !p.ended);
        if !waiting {
            break false;
        }
        if Instant::now() >= deadline {
            break true;
        }
        tokio::time::sleep(POLL).await;
    };
    settle(&board, Instant::now(), settings.settle, Instant::now() + settings.timeout).await;
    let (initial, connected, converged) = {
        let b = board.lock();
        (
            report::initial(&b.proxies, start, initial_timed_out),
            b.proxies.iter().filter(|p| p.connected).count(),
            b.proxies.iter().filter(|p| p.converged_at.is_some()).count(),
        )
    };
    let client_heap_bytes = crate::allocator::allocated_bytes();
    info!(seconds = initial.seconds, converged, "initial phase done");

    let mut phase_reports = Vec::new();
    for phase in &phases {
        let prepared = phase.prepare().await;
        board.begin_phase(&phase.name);
        // Logged with its time, to line up with the server's logs.
        info!(phase = %phase.name, "phase started");
        let t0 = Instant::now();
        let performed = match prepared {
            Ok(()) => phase.action.perform().await,
            Err(e) => Err(e),
        };
        let error = performed.err().map(|e| {
            warn!(phase = %phase.name, error = %e, "phase action failed");
            e.to_string()
        });
        let timed_out = !settle(&board, t0, settings.settle, t0 + settings.timeout).await;
        let r = report::phase(&phase.name, &board.lock().proxies, t0, timed_out, error);
        info!(phase = %r.name, pushed = r.pushed, max = r.max, "phase done");
        phase_reports.push(r);
    }

    board.lock().closing = true;
    tasks.shutdown().await;
    let (errors, capture) = {
        let mut b = board.lock();
        (ErrorReport { count: b.errors, messages: b.error_messages.clone() }, b.capture.take())
    };
    if let (Some(dir), Some(capture)) = (&settings.capture, capture) {
        capture.write(dir)?;
    }
    Ok(LoadReport {
        mode: settings.mode.as_str().to_string(),
        proxies: settings.proxies,
        connected,
        converged,
        initial,
        phases: phase_reports,
        errors,
        client_heap_bytes,
    })
}

/// Waits until no response arrived for `quiet` and at least `quiet` passed since `t0`; false if
/// `deadline` came first.
async fn settle(board: &SharedBoard, t0: Instant, quiet: Duration, deadline: Instant) -> bool {
    loop {
        let now = Instant::now();
        let last = board.lock().last_response.map_or(t0, |l| l.max(t0));
        if now.saturating_duration_since(last) >= quiet {
            return true;
        }
        if now >= deadline {
            return false;
        }
        tokio::time::sleep(POLL.min(quiet)).await;
    }
}

/// Raises the soft open-files limit to the hard one: every simulated proxy holds a socket, and
/// the usual soft limit of 1,024 is far below 10,000.
fn raise_open_files_limit() {
    let mut limit = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit/setrlimit only read and write the struct passed.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) == 0 && limit.rlim_cur < limit.rlim_max {
            limit.rlim_cur = limit.rlim_max;
            if libc::setrlimit(libc::RLIMIT_NOFILE, &limit) != 0 {
                warn!("could not raise the open-files limit");
            }
        }
    }
}
