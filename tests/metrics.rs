//! `/metrics` after pushes through standalone meshpilot: every Istio metric meshpilot keeps, with
//! Istio's labels and types, and values that match what the simulated proxies saw.

use crate::common;

use std::collections::BTreeMap;
use std::time::Duration;

use common::files::{temp_dir_with, write_atomic};
use common::istio::service_entry_in;
use common::meshpilot::Meshpilot;
use common::poll::{poll, STARTUP_TIMEOUT};
use common::process::TERMINATE_GRACE;
use common::prometheus::Samples;
use meshpilot::sim::{SimProxy, SimProxySpec, SimState};
use meshpilot::xds::TypeUrl;

/// Convergence timeout.
const TIMEOUT: Duration = Duration::from_secs(60);

/// Sidecars that ACK everything.
const ACKING: usize = 5;

/// Istio's metrics (pilot/pkg/xds/monitoring.go, pkg/xds/monitoring.go) and their types.
const ISTIO_METRICS: &[(&str, &str)] = &[
    ("pilot_xds_pushes", "counter"),
    ("pilot_xds_push_time", "histogram"),
    ("pilot_proxy_convergence_time", "histogram"),
    ("pilot_proxy_queue_time", "histogram"),
    ("pilot_xds_send_time", "histogram"),
    ("pilot_pushcontext_init_seconds", "histogram"),
    ("pilot_push_triggers", "counter"),
    ("pilot_inbound_updates", "counter"),
    ("pilot_xds", "gauge"),
    ("pilot_services", "gauge"),
    ("pilot_total_xds_rejects", "counter"),
    ("pilot_total_xds_internal_errors", "counter"),
    ("pilot_xds_config_size_bytes", "histogram"),
    ("pilot_xds_expired_nonce", "counter"),
    ("pilot_xds_write_timeout", "counter"),
];

fn cluster_version(s: &SimState) -> String {
    s.types.get(&TypeUrl::Cluster).map(|t| t.version.clone()).unwrap_or_default()
}

/// Responses received per xDS type (short name) over all proxies.
fn responses_by_type(proxies: &[&SimProxy]) -> BTreeMap<&'static str, u64> {
    let mut out = BTreeMap::new();
    for p in proxies {
        for (t, s) in &p.state().types {
            *out.entry(t.short()).or_default() += s.responses;
        }
    }
    out
}

fn bucket_bounds(samples: &Samples, name: &str, labels: &[(&str, &str)]) -> Vec<String> {
    samples.find(&format!("{name}_bucket"), labels).iter().map(|s| s.labels["le"].clone()).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_match_the_pushes_the_proxies_received() {
    let started = std::time::Instant::now();
    let config = temp_dir_with(&[("reviews.yaml", &service_entry_in("default", "reviews", &["10.0.0.1"]))]);
    let mut cp = Meshpilot::standalone(config.path()).start();
    cp.wait_ready(STARTUP_TIMEOUT).await;

    let mut proxies = Vec::new();
    for i in 0..ACKING {
        let spec = SimProxySpec::sidecar(&cp.xds_url(), "default", &format!("app{i}"), &format!("10.1.0.{i}"));
        proxies.push(SimProxy::connect(spec).await.expect("sim proxy"));
    }
    let mut spec = SimProxySpec::sidecar(&cp.xds_url(), "default", "rejecter", "10.1.1.1");
    spec.reject = Some(TypeUrl::Listener);
    let rejecter = SimProxy::connect(spec).await.expect("sim proxy");
    let all = || proxies.iter().chain(std::iter::once(&rejecter)).collect::<Vec<_>>();
    for p in all() {
        assert!(p.wait_for(TIMEOUT, |s| s.types.len() == 4 && cluster_version(s) == "1.1").await, "{:?}", p.state());
    }

    // A config change (a new service: a "config" trigger), then an endpoint-only change ("endpoint").
    std::fs::write(config.path().join("ratings.yaml"), service_entry_in("default", "ratings", &["10.0.0.2"])).unwrap();
    // Each proxy has also asked for and received ratings' endpoints, so the endpoint change below
    // reaches every proxy as a push (not as the answer to a request still on its way).
    let has_ratings_eds =
        |s: &SimState| s.types.get(&TypeUrl::Endpoint).is_some_and(|t| t.names.iter().any(|n| n.contains("ratings")));
    for p in all() {
        assert!(p.wait_for(TIMEOUT, |s| cluster_version(s) == "1.2" && has_ratings_eds(s)).await, "{:?}", p.state());
    }
    write_atomic(config.path(), "ratings.yaml", &service_entry_in("default", "ratings", &["10.0.0.2", "10.0.0.3"]));
    let eds_version = |s: &SimState| s.types.get(&TypeUrl::Endpoint).map(|t| t.version.clone()).unwrap_or_default();
    for p in all() {
        assert!(p.wait_for(TIMEOUT, |s| eds_version(s) == "1.3").await, "{:?}", p.state());
    }

    // Counters follow the sends right after them, and a proxy's push is recorded once all its
    // types went out (a proxy may hold the new endpoints before its listeners are compared):
    // poll until they agree with what was received.
    let expected = responses_by_type(&all());
    let lds_rejected = rejecter.state().types[&TypeUrl::Listener].responses;
    let proxy_pushes = (2 * (ACKING + 1)) as f64;
    let metrics = poll(Duration::from_secs(10), async || {
        let m = cp.metrics().await;
        let agrees = expected.iter().all(|(t, n)| m.value("pilot_xds_pushes", &[("type", t)]) == *n as f64)
            && m.value("pilot_total_xds_rejects", &[("type", "lds")]) == lds_rejected as f64
            && m.value("pilot_proxy_convergence_time_count", &[]) == proxy_pushes;
        agrees.then_some(m)
    })
    .await;
    let m = match metrics {
        Some(m) => m,
        None => {
            let m = cp.metrics().await;
            let pushes: Vec<_> = m.find("pilot_xds_pushes", &[]).into_iter().cloned().collect();
            panic!("pilot_xds_pushes {pushes:?} (or the pushes recorded per proxy) never matched the responses received {expected:?}");
        }
    };

    // Every Istio metric, with its type.
    for (name, kind) in ISTIO_METRICS {
        assert_eq!(m.types.get(*name).map(String::as_str), Some(*kind), "{name}");
    }

    // Per-type families: cds/eds/lds/rds, values matching the responses the proxies got (these
    // proxies ask for no gateway credentials: no sds).
    let total: u64 = expected.values().sum();
    for t in TypeUrl::PUSH_ORDER.into_iter().filter(|t| *t != TypeUrl::Secret) {
        let (short, url) = (t.short(), t.as_str());
        let sent = expected.get(short).copied().unwrap_or_default() as f64;
        assert!(sent > 0.0, "no {short} responses received: {expected:?}");
        assert_eq!(m.value("pilot_xds_pushes", &[("type", short)]), sent, "{short}");
        assert_eq!(m.value("pilot_xds_push_time_count", &[("type", short)]), sent, "{short}");
        assert_eq!(m.value("pilot_xds_config_size_bytes_count", &[("type", url)]), sent, "{url}");
        assert!(m.value("pilot_xds_config_size_bytes_sum", &[("type", url)]) > 0.0, "{url}");
        assert_eq!(
            bucket_bounds(&m, "pilot_xds_config_size_bytes", &[("type", url)]),
            ["1", "10000", "1000000", "4000000", "10000000", "40000000", "+Inf"]
        );
        assert_eq!(
            bucket_bounds(&m, "pilot_xds_push_time", &[("type", short)]),
            ["0.01", "0.1", "1", "3", "5", "10", "20", "30", "+Inf"]
        );
        assert_eq!(m.find("pilot_xds_expired_nonce", &[("type", short)]).len(), 1, "{short}");
        let rejects = if t == TypeUrl::Listener { lds_rejected as f64 } else { 0.0 };
        assert_eq!(m.value("pilot_total_xds_rejects", &[("type", short)]), rejects, "{short}");
    }
    assert_eq!(m.value("pilot_xds_send_time_count", &[]), total as f64);
    assert_eq!(m.value("pilot_xds", &[("version", "")]), (ACKING + 1) as f64, "connected proxies");
    assert_eq!(m.value("pilot_services", &[]), 2.0);

    // Three snapshots: the first (global), a new service (config), new endpoints (endpoint).
    assert_eq!(m.value("pilot_pushcontext_init_seconds_count", &[]), 3.0);
    assert_eq!(bucket_bounds(&m, "pilot_pushcontext_init_seconds", &[]), ["0.01", "0.1", "0.5", "1", "3", "5", "+Inf"]);
    for trigger in ["global", "config", "endpoint"] {
        assert_eq!(m.value("pilot_push_triggers", &[("type", trigger)]), 1.0, "{trigger}");
    }
    // One per config object received (the mesh config, reviews, ratings twice).
    assert_eq!(m.value("pilot_inbound_updates", &[("type", "config")]), 4.0);

    // Two snapshot pushes reached every proxy: convergence and queue time observed for each.
    assert_eq!(m.value("pilot_proxy_convergence_time_count", &[]), proxy_pushes);
    assert_eq!(m.value("pilot_proxy_queue_time_count", &[]), proxy_pushes);
    assert_eq!(
        bucket_bounds(&m, "pilot_proxy_convergence_time", &[]),
        ["0.1", "0.5", "1", "3", "5", "10", "20", "30", "+Inf"]
    );
    assert_eq!(m.value("pilot_total_xds_internal_errors", &[]), 0.0);
    assert_eq!(m.value("pilot_xds_write_timeout", &[]), 0.0);

    // meshpilot's own.
    let id = format!("standalone-{}", cp.pid().expect("meshpilot runs"));
    assert_eq!(m.value("meshpilot_build_info", &[("role", "standalone"), ("id", &id)]), 1.0);
    assert_eq!(m.value("meshpilot_snapshot_version", &[("part", "term")]), 1.0);
    assert_eq!(m.value("meshpilot_snapshot_version", &[("part", "seq")]), 3.0);
    assert_eq!(m.value("meshpilot_snapshot_build_seconds_count", &[]), 3.0);

    // A proxy leaving is counted down.
    drop(rejecter);
    let left = poll(Duration::from_secs(10), async || {
        (cp.metrics().await.value("pilot_xds", &[("version", "")]) == ACKING as f64).then_some(())
    })
    .await;
    assert!(left.is_some(), "pilot_xds did not drop to {ACKING}");
    drop(proxies);
    cp.terminate(TERMINATE_GRACE).await;
    eprintln!("metrics test took {:?}", started.elapsed());
}
