//! Load runs: many simulated proxies against a frontend, measuring how fast they converge.

use std::time::{Duration, Instant};

use serde::Serialize;

use super::{SimProxy, SimProxySpec, SimState};
use crate::snapshot::Version;

/// What to run.
#[derive(Debug, Clone)]
pub struct LoadSettings {
    /// ADS URL (`http://127.0.0.1:15010`).
    pub xds_url: String,
    /// Number of simulated proxies.
    pub proxies: usize,
    /// Namespaces the proxies are spread over (round robin).
    pub namespaces: Vec<String>,
    /// Wait until every proxy has acked at least this snapshot version.
    pub wait_version: Option<Version>,
    /// Give up after this long.
    pub timeout: Duration,
}

/// Result of a load run.
#[derive(Debug, Clone, Serialize)]
pub struct LoadReport {
    /// Proxies that connected.
    pub connected: usize,
    /// Proxies that converged.
    pub converged: usize,
    /// Seconds from each proxy's connect until it converged: median.
    pub p50_seconds: f64,
    /// 90th percentile.
    pub p90_seconds: f64,
    /// 99th percentile.
    pub p99_seconds: f64,
    /// Slowest.
    pub max_seconds: f64,
    /// The version waited for (or the highest seen).
    pub version: String,
}

/// Whether a proxy has acked everything it received, with some version at least `v`.
pub fn converged(state: &SimState, v: Option<Version>) -> bool {
    let all_acked = state.types.len() == 4 && state.types.values().all(|t| t.acked_version == t.version);
    let reached = match v {
        None => true,
        Some(v) => state.types.values().any(|t| t.acked_version.parse::<Version>().is_ok_and(|a| a >= v)),
    };
    all_acked && reached
}

/// Connects the proxies (concurrently), waits for each to converge, and reports.
pub async fn run(settings: &LoadSettings) -> LoadReport {
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..settings.proxies {
        let ns =
            settings.namespaces.get(i % settings.namespaces.len().max(1)).cloned().unwrap_or_else(|| "default".into());
        let ip = format!("10.{}.{}.{}", 128 + (i >> 16) % 64, (i >> 8) % 256, i % 256);
        let spec = SimProxySpec::sidecar(&settings.xds_url, &ns, &format!("load-{i}"), &ip);
        let (timeout, wait_version) = (settings.timeout, settings.wait_version);
        tasks.spawn(async move {
            let t0 = Instant::now();
            let proxy = match SimProxy::connect(spec).await {
                Ok(p) => p,
                Err(e) => {
                    tracing::warn!(proxy = i, error = %e, "simulated proxy could not connect");
                    return None;
                }
            };
            let ok = proxy.wait_for(timeout, |s| converged(s, wait_version)).await;
            Some((ok.then(|| t0.elapsed().as_secs_f64()), proxy))
        });
    }
    // Keep every stream open until all are measured, so late proxies see the same server load.
    let mut proxies = Vec::new();
    let mut done = Vec::new();
    while let Some(joined) = tasks.join_next().await {
        if let Ok(Some((time, proxy))) = joined {
            done.push(time);
            proxies.push(proxy);
        }
    }
    let mut times: Vec<f64> = done.iter().flatten().copied().collect();
    times.sort_by(f64::total_cmp);
    let pct = |q: f64| -> f64 {
        if times.is_empty() {
            return f64::NAN;
        }
        let idx = ((times.len() as f64 - 1.0) * q).round() as usize;
        times[idx.min(times.len() - 1)]
    };
    let version = proxies
        .iter()
        .flat_map(|p| {
            p.state().types.values().filter_map(|t| t.acked_version.parse::<Version>().ok()).collect::<Vec<_>>()
        })
        .max()
        .map(|v| v.to_string())
        .unwrap_or_default();
    LoadReport {
        connected: proxies.len(),
        converged: times.len(),
        p50_seconds: pct(0.5),
        p90_seconds: pct(0.9),
        p99_seconds: pct(0.99),
        max_seconds: times.last().copied().unwrap_or(f64::NAN),
        version: settings.wait_version.map(|v| v.to_string()).unwrap_or(version),
    }
}
