//! What every simulated proxy reports as responses arrive, read by the run to decide when a phase
//! is over and to build the report. One board for the whole run: the runtime has one thread, so
//! its lock is never contended and never held across an await.

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

use bytes::Bytes;

use crate::sim::capture::{CaptureWriter, INITIAL_PHASE};

/// At most this many stream error messages are kept for the report (all are counted).
const KEPT_ERRORS: usize = 10;

/// One proxy's progress.
#[derive(Debug, Clone, Default)]
pub struct ProxyRecord {
    /// When it started connecting.
    pub connect_start: Option<Instant>,
    /// Whether its stream opened.
    pub connected: bool,
    /// When its last response before convergence arrived.
    pub converged_at: Option<Instant>,
    /// Responses in the current phase.
    pub responses: u64,
    /// Bytes received in the current phase.
    pub bytes: u64,
    /// Arrival of its last response in the current phase.
    pub last: Option<Instant>,
    /// Whether its stream ended (it will not converge any more).
    pub ended: bool,
}

/// The shared state of a run.
#[derive(Debug)]
pub struct Board {
    /// By proxy index.
    pub proxies: Vec<ProxyRecord>,
    /// The current phase's name (capture tag).
    pub phase: Arc<str>,
    /// Arrival of the last response on any stream.
    pub last_response: Option<Instant>,
    /// Stream errors (failed connects, closed streams, bad messages).
    pub errors: u64,
    /// The first few error messages.
    pub error_messages: Vec<String>,
    /// Set when the run ends streams itself: closes after that are not errors.
    pub closing: bool,
    /// The capture, when asked for.
    pub capture: Option<CaptureWriter>,
}

/// A handle on the board shared by the proxies and the run.
#[derive(Debug, Clone)]
pub struct SharedBoard(Arc<Mutex<Board>>);

impl SharedBoard {
    /// A board for `proxies` proxies, capturing when `capture` is given.
    pub fn new(proxies: usize, capture: Option<CaptureWriter>) -> SharedBoard {
        SharedBoard(Arc::new(Mutex::new(Board {
            proxies: vec![ProxyRecord::default(); proxies],
            phase: Arc::from(INITIAL_PHASE),
            last_response: None,
            errors: 0,
            error_messages: Vec::new(),
            closing: false,
            capture,
        })))
    }

    /// The board, locked; a poisoned lock (a panicking proxy) still gives the data.
    pub fn lock(&self) -> MutexGuard<'_, Board> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Records a response of `len` bytes to proxy `i`; `capture` names its workload when this
    /// proxy's responses are captured.
    pub fn response(&self, i: usize, len: usize, capture: Option<(&str, &str, &Bytes)>) -> Instant {
        let now = Instant::now();
        let mut b = self.lock();
        b.last_response = Some(now);
        if let Some(p) = b.proxies.get_mut(i) {
            p.responses += 1;
            p.bytes += len as u64;
            p.last = Some(now);
        }
        if let Some((workload, type_url, bytes)) = capture {
            let phase = b.phase.clone();
            if let Some(c) = b.capture.as_mut() {
                c.record(workload, &phase, type_url, bytes);
            }
        }
        now
    }

    /// Records that proxy `i` started connecting now.
    pub fn connecting(&self, i: usize) -> Instant {
        let now = Instant::now();
        if let Some(p) = self.lock().proxies.get_mut(i) {
            p.connect_start = Some(now);
        }
        now
    }

    /// Records that proxy `i`'s stream opened.
    pub fn connected(&self, i: usize) {
        if let Some(p) = self.lock().proxies.get_mut(i) {
            p.connected = true;
        }
    }

    /// Records that proxy `i` converged with the response that arrived at `at`.
    pub fn converged(&self, i: usize, at: Instant) {
        if let Some(p) = self.lock().proxies.get_mut(i) {
            p.converged_at.get_or_insert(at);
        }
    }

    /// Records a stream error of proxy `i` unless the run is ending the streams itself.
    pub fn error(&self, i: usize, message: impl std::fmt::Display) {
        let mut b = self.lock();
        if let Some(p) = b.proxies.get_mut(i) {
            p.ended = true;
        }
        if b.closing {
            return;
        }
        b.errors += 1;
        if b.error_messages.len() < KEPT_ERRORS {
            b.error_messages.push(format!("proxy {i}: {message}"));
        }
        tracing::debug!(proxy = i, error = %crate::telemetry::log_text::Untrusted(&message.to_string()), "stream error");
    }

    /// Starts phase `name`: per-proxy counters restart.
    pub fn begin_phase(&self, name: &str) {
        let mut b = self.lock();
        b.phase = Arc::from(name);
        for p in &mut b.proxies {
            p.responses = 0;
            p.bytes = 0;
            p.last = None;
        }
    }
}
