//! The run's report: JSON for the benchmark's orchestrator, and a human summary.

use std::fmt::Write as _;
use std::time::Instant;

use serde::{Deserialize, Serialize};

use super::board::ProxyRecord;

/// Everything a load run measured.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct LoadReport {
    /// `sotw` or `delta`.
    pub mode: String,
    /// Proxies simulated.
    pub proxies: usize,
    /// Proxies whose stream opened.
    pub connected: usize,
    /// Proxies that converged initially.
    pub converged: usize,
    /// Initial connection and convergence.
    pub initial: InitialReport,
    /// The phases, in order.
    pub phases: Vec<PhaseReport>,
    /// Stream errors.
    pub errors: ErrorReport,
    /// Heap bytes the client held once the initial phase settled (its own cost per proxy).
    pub client_heap_bytes: Option<usize>,
}

/// The initial phase.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct InitialReport {
    /// Last proxy's convergence − first connect start.
    pub seconds: f64,
    /// Per-proxy seconds from connect start to the last response before convergence: median.
    pub p50: f64,
    /// 99th percentile.
    pub p99: f64,
    /// Slowest.
    pub max: f64,
    /// Bytes received by all proxies until the first phase.
    pub bytes_total: u64,
    /// `bytes_total` / proxies.
    pub bytes_per_proxy: f64,
    /// Whether the timeout passed before every proxy converged.
    pub timed_out: bool,
}

/// One phase.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PhaseReport {
    /// Its name.
    pub name: String,
    /// Proxies that received at least one response after its start.
    pub pushed: usize,
    /// Over pushed proxies, seconds from the start to their last response: median.
    pub p50: f64,
    /// 99th percentile.
    pub p99: f64,
    /// Slowest.
    pub max: f64,
    /// Bytes received by all proxies.
    pub bytes_total: u64,
    /// Bytes per pushed proxy: mean.
    pub bytes_per_proxy: f64,
    /// Bytes per pushed proxy: largest.
    pub bytes_per_proxy_max: u64,
    /// Responses received by all proxies.
    pub responses: u64,
    /// Whether the streams never went quiet within the timeout.
    pub timed_out: bool,
    /// Why the action failed, if it did.
    pub error: Option<String>,
}

/// Stream errors.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct ErrorReport {
    /// How many.
    pub count: u64,
    /// The first few.
    pub messages: Vec<String>,
}

/// The value at quantile `q` of sorted `values` (nearest rank); 0 when empty.
pub fn quantile(sorted: &[f64], q: f64) -> f64 {
    match sorted.len() {
        0 => 0.0,
        n => sorted[(((n as f64) * q).ceil() as usize).clamp(1, n) - 1],
    }
}

fn sorted(mut values: Vec<f64>) -> Vec<f64> {
    values.sort_by(f64::total_cmp);
    values
}

/// The initial phase's figures from the proxies' records; `start` is the first connect start.
pub fn initial(records: &[ProxyRecord], start: Instant, timed_out: bool) -> InitialReport {
    let times = sorted(
        records
            .iter()
            .filter_map(|p| Some(p.converged_at?.saturating_duration_since(p.connect_start?).as_secs_f64()))
            .collect(),
    );
    let last = records.iter().filter_map(|p| p.converged_at).max();
    let bytes_total: u64 = records.iter().map(|p| p.bytes).sum();
    InitialReport {
        seconds: last.map_or(0.0, |l| l.saturating_duration_since(start).as_secs_f64()),
        p50: quantile(&times, 0.5),
        p99: quantile(&times, 0.99),
        max: times.last().copied().unwrap_or(0.0),
        bytes_total,
        bytes_per_proxy: bytes_total as f64 / records.len().max(1) as f64,
        timed_out,
    }
}

/// A phase's figures from the proxies' records; `t0` is its start.
pub fn phase(name: &str, records: &[ProxyRecord], t0: Instant, timed_out: bool, error: Option<String>) -> PhaseReport {
    let pushed: Vec<&ProxyRecord> = records.iter().filter(|p| p.responses > 0).collect();
    let times =
        sorted(pushed.iter().filter_map(|p| p.last).map(|l| l.saturating_duration_since(t0).as_secs_f64()).collect());
    let bytes_total: u64 = records.iter().map(|p| p.bytes).sum();
    PhaseReport {
        name: name.to_string(),
        pushed: pushed.len(),
        p50: quantile(&times, 0.5),
        p99: quantile(&times, 0.99),
        max: times.last().copied().unwrap_or(0.0),
        bytes_total,
        bytes_per_proxy: if pushed.is_empty() { 0.0 } else { bytes_total as f64 / pushed.len() as f64 },
        bytes_per_proxy_max: pushed.iter().map(|p| p.bytes).max().unwrap_or(0),
        responses: records.iter().map(|p| p.responses).sum(),
        timed_out,
        error,
    }
}

impl LoadReport {
    /// Whether the run succeeded: every proxy connected and converged, every phase went quiet.
    pub fn success(&self) -> bool {
        self.connected == self.proxies
            && self.converged == self.proxies
            && !self.initial.timed_out
            && self.phases.iter().all(|p| !p.timed_out && p.error.is_none())
    }

    /// A few lines for a person.
    pub fn summary(&self) -> String {
        let mut out = String::new();
        let i = &self.initial;
        let _ = writeln!(
            out,
            "{} proxies ({}): {} connected, {} converged in {:.3}s (per proxy p50 {:.3}s p99 {:.3}s max {:.3}s), {} bytes/proxy{}",
            self.proxies,
            self.mode,
            self.connected,
            self.converged,
            i.seconds,
            i.p50,
            i.p99,
            i.max,
            i.bytes_per_proxy.round(),
            if i.timed_out { " TIMED OUT" } else { "" },
        );
        for p in &self.phases {
            let _ = writeln!(
                out,
                "phase {}: {} pushed, p50 {:.3}s p99 {:.3}s max {:.3}s, {} responses, {} bytes ({} /proxy, max {}){}{}",
                p.name,
                p.pushed,
                p.p50,
                p.p99,
                p.max,
                p.responses,
                p.bytes_total,
                p.bytes_per_proxy.round(),
                p.bytes_per_proxy_max,
                if p.timed_out { " TIMED OUT" } else { "" },
                p.error.as_deref().map(|e| format!(" ERROR: {e}")).unwrap_or_default(),
            );
        }
        if let Some(heap) = self.client_heap_bytes {
            let _ = writeln!(out, "client heap: {} bytes ({} /proxy)", heap, heap / self.proxies.max(1));
        }
        if self.errors.count > 0 {
            let _ = writeln!(out, "{} stream errors, first: {}", self.errors.count, self.errors.messages.join("; "));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn quantiles_are_nearest_rank() {
        let v: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(quantile(&v, 0.5), 50.0);
        assert_eq!(quantile(&v, 0.99), 99.0);
        assert_eq!(quantile(&[3.0], 0.99), 3.0);
        assert_eq!(quantile(&[], 0.5), 0.0);
    }

    #[test]
    fn a_phase_counts_only_pushed_proxies() {
        let t0 = Instant::now();
        let pushed =
            ProxyRecord { responses: 2, bytes: 300, last: Some(t0 + Duration::from_millis(500)), ..Default::default() };
        let report = phase("p", &[pushed, ProxyRecord::default()], t0, false, None);
        assert_eq!((report.pushed, report.bytes_total, report.bytes_per_proxy_max), (1, 300, 300));
        assert_eq!(report.bytes_per_proxy, 300.0);
        assert!((report.max - 0.5).abs() < 1e-9);
    }
}
