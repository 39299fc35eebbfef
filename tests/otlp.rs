//! OTLP export: an in-test OTLP/gRPC receiver gets the trace of a real push — through standalone
//! meshpilot, and through an ingest node and a frontend (with etcd) — with the right parent/child
//! links and attributes, and gets the metrics `/metrics` shows.

use crate::common;

use std::collections::BTreeMap;
use std::time::Duration;

use common::etcd::Etcd;
use common::files::temp_dir_with;
use common::istio::service_entry_in;
use common::meshpilot::Meshpilot;
use common::otlp::{attributes, OtlpReceiver, Received, ReceivedSpan};
use common::poll::{poll, STARTUP_TIMEOUT};
use common::process::TERMINATE_GRACE;
use meshpilot::sim::{SimProxy, SimProxySpec};
use opentelemetry_proto::tonic::metrics::v1::metric;

/// Convergence timeout.
const TIMEOUT: Duration = Duration::from_secs(60);

fn otel_env(receiver: &OtlpReceiver) -> Vec<(&'static str, String)> {
    vec![
        ("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.endpoint.clone()),
        ("OTEL_METRIC_EXPORT_INTERVAL", "300".into()),
        ("OTEL_BSP_SCHEDULE_DELAY", "100".into()),
        ("OTEL_RESOURCE_ATTRIBUTES", "deployment.environment=otlp-test".into()),
    ]
}

/// Spans of one trace, by name (several of a name are kept in arrival order).
fn by_name(spans: &[ReceivedSpan], trace_id: &str) -> BTreeMap<String, Vec<ReceivedSpan>> {
    let mut out: BTreeMap<String, Vec<ReceivedSpan>> = BTreeMap::new();
    for s in spans.iter().filter(|s| s.trace_id() == trace_id) {
        out.entry(s.span.name.clone()).or_default().push(s.clone());
    }
    out
}

/// The `xds_push` span of `proxy` for `version`, once it arrived.
async fn wait_push_span(received: &Received, proxy: &str, version: &str) -> ReceivedSpan {
    poll(TIMEOUT, async || {
        received.spans().into_iter().find(|s| {
            s.span.name == "xds_push"
                && s.attr("proxy").as_deref() == Some(proxy)
                && s.attr("version").as_deref() == Some(version)
        })
    })
    .await
    .unwrap_or_else(|| {
        let names: Vec<(String, Option<String>)> =
            received.spans().iter().map(|s| (s.span.name.clone(), s.attr("version"))).collect();
        panic!("no xds_push span for {proxy} at {version}; spans: {names:?}")
    })
}

/// Asserts the `xds_push` span's own content: attributes and the send/ACK events.
fn assert_push_span(push: &ReceivedSpan, proxy: &str, version: &str) {
    assert_eq!(push.attr("proxy").as_deref(), Some(proxy));
    assert_eq!(push.attr("version").as_deref(), Some(version));
    let types = push.attr("types").unwrap_or_default();
    assert!(!types.is_empty(), "xds_push without types: {:?}", push.span.attributes);
    assert_eq!(push.attr("answered").as_deref(), Some("true"), "{:?}", push.span.attributes);
    let events: Vec<(String, BTreeMap<String, String>)> =
        push.span.events.iter().map(|e| (e.name.clone(), attributes(&e.attributes))).collect();
    let sent: Vec<_> = events.iter().filter(|(n, _)| n == "sent").collect();
    let acks: Vec<_> = events.iter().filter(|(n, _)| n == "ack").collect();
    assert!(!sent.is_empty(), "no sent events: {events:?}");
    assert_eq!(acks.len(), sent.len(), "every response acked: {events:?}");
    for (_, attrs) in sent.iter().chain(acks.iter()) {
        let t = attrs.get("type").map(String::as_str).unwrap_or_default();
        assert!(["cds", "eds", "lds", "rds"].contains(&t) && types.contains(t), "{attrs:?} vs types {types}");
    }
    for (_, attrs) in &acks {
        let ms: f64 = attrs.get("latency_ms").and_then(|v| v.parse().ok()).unwrap_or(-1.0);
        assert!(ms >= 0.0, "ack latency: {attrs:?}");
    }
}

/// Waits until the receiver has a metrics export from a process of `role` with `pilot_xds_pushes`
/// summing to at least `min_pushes`; returns that export's metrics by name.
async fn wait_metrics(received: &Received, role: &str, min_pushes: f64) -> BTreeMap<String, metric::Data> {
    poll(TIMEOUT, async || {
        let exports = received.metrics();
        let latest = exports.iter().rev().find(|rm| {
            attributes(&rm.resource.clone().unwrap_or_default().attributes).get("meshpilot.role").map(String::as_str)
                == Some(role)
        })?;
        let metrics: BTreeMap<String, metric::Data> = latest
            .scope_metrics
            .iter()
            .flat_map(|s| s.metrics.iter())
            .filter_map(|m| Some((m.name.clone(), m.data.clone()?)))
            .collect();
        let Some(metric::Data::Sum(pushes)) = metrics.get("pilot_xds_pushes") else { return None };
        let total: f64 = pushes
            .data_points
            .iter()
            .filter_map(|p| match p.value {
                Some(opentelemetry_proto::tonic::metrics::v1::number_data_point::Value::AsDouble(v)) => Some(v),
                _ => None,
            })
            .sum();
        (total >= min_pushes).then_some(metrics)
    })
    .await
    .unwrap_or_else(|| panic!("no metrics export from a {role} with pilot_xds_pushes >= {min_pushes}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_standalone_push_is_one_trace_and_metrics_arrive() {
    let started = std::time::Instant::now();
    let receiver = OtlpReceiver::start().await;
    let config = temp_dir_with(&[("reviews.yaml", &service_entry_in("default", "reviews", &["10.0.0.1"]))]);
    let mut cp = Meshpilot::standalone(config.path()).envs(&otel_env(&receiver)).start();
    cp.wait_ready(STARTUP_TIMEOUT).await;

    let spec = SimProxySpec::sidecar(&cp.xds_url(), "default", "productpage", "10.1.0.1");
    let node = spec.node_id.clone();
    let proxy = SimProxy::connect(spec).await.expect("sim proxy");
    assert!(proxy.wait_for(TIMEOUT, |s| s.acked("1.1") && s.types.len() == 4).await, "{:?}", proxy.state());

    // A config change: a new service (clusters, endpoints, routes change).
    std::fs::write(config.path().join("ratings.yaml"), service_entry_in("default", "ratings", &["10.0.0.2"])).unwrap();
    let clusters_acked = |s: &meshpilot::sim::SimState, v: &str| {
        s.types.get(&meshpilot::xds::TypeUrl::Cluster).is_some_and(|t| t.acked_version == v)
    };
    assert!(proxy.wait_for(TIMEOUT, |s| clusters_acked(s, "1.2")).await, "{:?}", proxy.state());

    let push = wait_push_span(&receiver.received, &node, "1.2").await;
    assert_push_span(&push, &node, "1.2");
    let trace_id = push.trace_id();
    let spans = by_name(&receiver.received.spans(), &trace_id);
    let one = |name: &str| -> ReceivedSpan {
        match spans.get(name).map(Vec::as_slice) {
            Some([s]) => s.clone(),
            other => panic!("expected one {name} span in trace {trace_id}, got {other:?}; names {:?}", spans.keys()),
        }
    };
    let event = one("config_event");
    let debounce = one("debounce");
    let build = one("snapshot_build");
    assert_eq!(event.parent_id(), "", "config_event is the root");
    assert_eq!(event.attr("source").as_deref(), Some("file"));
    assert_eq!(debounce.parent_id(), event.span_id(), "debounce under config_event");
    assert_eq!(build.parent_id(), event.span_id(), "snapshot_build under config_event");
    assert_eq!(build.attr("version").as_deref(), Some("1.2"));
    assert_eq!(push.parent_id(), build.span_id(), "xds_push under snapshot_build");
    assert!(event.span.start_time_unix_nano <= build.span.start_time_unix_nano);
    assert!(build.span.start_time_unix_nano <= push.span.start_time_unix_nano);

    // Who sent it: the resource names the process.
    let r = &push.resource;
    assert_eq!(r.get("service.name").map(String::as_str), Some("meshpilot"));
    assert_eq!(r.get("meshpilot.role").map(String::as_str), Some("standalone"));
    assert_eq!(r.get("meshpilot.term").map(String::as_str), Some("1"));
    assert_eq!(r.get("service.instance.id"), Some(&format!("standalone-{}", cp.pid().expect("meshpilot runs"))));
    assert_eq!(r.get("deployment.environment").map(String::as_str), Some("otlp-test"));

    // The trace id is in /debug/push_status and in the log lines of the push.
    let status = cp.admin_json("/debug/push_status").await;
    assert_eq!(status["version"], "1.2");
    assert_eq!(status["trace_id"], trace_id.as_str(), "{status}");
    assert!(cp.logs().lines().any(|l| l.contains("snapshot built") && l.contains(&trace_id)), "{}", cp.logs());

    // Metrics: the OTLP export carries what /metrics shows, with Istio's names and buckets.
    let local = cp.metrics().await;
    let pushes: f64 = local.sum("pilot_xds_pushes", &[]);
    let metrics = wait_metrics(&receiver.received, "standalone", pushes).await;
    let Some(metric::Data::Histogram(push_time)) = metrics.get("pilot_xds_push_time") else {
        panic!("pilot_xds_push_time missing: {:?}", metrics.keys())
    };
    assert_eq!(push_time.data_points[0].explicit_bounds, vec![0.01, 0.1, 1.0, 3.0, 5.0, 10.0, 20.0, 30.0]);
    assert!(matches!(metrics.get("pilot_xds"), Some(metric::Data::Gauge(_))));
    assert!(matches!(metrics.get("pilot_proxy_convergence_time"), Some(metric::Data::Histogram(_))));
    assert!(matches!(metrics.get("meshpilot_build_info"), Some(metric::Data::Gauge(_))));
    for name in local.types.keys() {
        assert!(metrics.contains_key(name), "{name} is on /metrics but not in the OTLP export");
    }
    drop(proxy);
    cp.terminate(TERMINATE_GRACE).await;
    eprintln!("standalone OTLP test took {:?}", started.elapsed());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ingest_to_frontend_push_is_one_trace() {
    let started = std::time::Instant::now();
    let receiver = OtlpReceiver::start().await;
    let etcd = Etcd::start().await;
    let config = temp_dir_with(&[("reviews.yaml", &service_entry_in("default", "reviews", &["10.0.0.1"]))]);
    let mut ingest = Meshpilot::ingest(&etcd.endpoint(), config.path())
        .id("ingest-a")
        .lease_ttl(2)
        .envs(&otel_env(&receiver))
        .start();
    ingest.wait_ready(STARTUP_TIMEOUT).await;
    let mut frontend =
        Meshpilot::frontend(&etcd.endpoint()).id("frontend-a").lease_ttl(2).envs(&otel_env(&receiver)).start();
    frontend.wait_ready(STARTUP_TIMEOUT).await;

    let spec = SimProxySpec::sidecar(&frontend.xds_url(), "default", "productpage", "10.1.0.1");
    let node = spec.node_id.clone();
    let proxy = SimProxy::connect(spec).await.expect("sim proxy");
    assert!(
        proxy.wait_for(TIMEOUT, |s| s.types.len() == 4 && s.acked(&s.types.values().next().unwrap().version)).await
    );
    let before = proxy.state().types.values().next().map(|t| t.version.clone()).unwrap_or_default();

    std::fs::write(config.path().join("ratings.yaml"), service_entry_in("default", "ratings", &["10.0.0.2"])).unwrap();
    let version = poll(TIMEOUT, async || {
        let v = proxy.state().types.get(&meshpilot::xds::TypeUrl::Cluster).map(|t| t.acked_version.clone())?;
        (v != before && !v.is_empty()).then_some(v)
    })
    .await
    .expect("the frontend pushed the change");

    let push = wait_push_span(&receiver.received, &node, &version).await;
    assert_push_span(&push, &node, &version);
    assert_eq!(push.resource.get("meshpilot.role").map(String::as_str), Some("frontend"));
    assert_eq!(push.resource.get("service.instance.id").map(String::as_str), Some("frontend-a"));
    let trace_id = push.trace_id();
    let find = async |name: &str| -> ReceivedSpan {
        // Spans of the other process may arrive a batch later.
        poll(Duration::from_secs(10), async || {
            by_name(&receiver.received.spans(), &trace_id).get(name).and_then(|v| v.first().cloned())
        })
        .await
        .unwrap_or_else(|| panic!("no {name} span in trace {trace_id}"))
    };
    let apply = find("snapshot_apply").await;
    let build = find("snapshot_build").await;
    let event = find("config_event").await;
    assert_eq!(apply.resource.get("meshpilot.role").map(String::as_str), Some("frontend"));
    assert_eq!(build.resource.get("meshpilot.role").map(String::as_str), Some("ingest"));
    assert_eq!(event.resource.get("meshpilot.role").map(String::as_str), Some("ingest"));
    assert_eq!(push.parent_id(), apply.span_id(), "xds_push under snapshot_apply");
    assert_eq!(apply.parent_id(), build.span_id(), "snapshot_apply under the leader's snapshot_build");
    assert_eq!(build.parent_id(), event.span_id(), "snapshot_build under config_event");
    assert_eq!(apply.attr("version").as_deref(), Some(version.as_str()));
    assert_eq!(build.attr("version").as_deref(), Some(version.as_str()));

    let status = frontend.admin_json("/debug/push_status").await;
    assert_eq!(status["trace_id"], trace_id.as_str(), "{status}");
    drop(proxy);
    frontend.terminate(TERMINATE_GRACE).await;
    ingest.terminate(TERMINATE_GRACE).await;
    eprintln!("ingest → frontend OTLP test took {:?}", started.elapsed());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_fanouts_trace_a_sample_and_count_the_rest() {
    let started = std::time::Instant::now();
    let receiver = OtlpReceiver::start().await;
    let config = temp_dir_with(&[("reviews.yaml", &service_entry_in("default", "reviews", &["10.0.0.1"]))]);
    let mut env = otel_env(&receiver);
    env.push(("MESHPILOT_TRACE_PUSH_SPANS", "2".into()));
    let mut cp = Meshpilot::standalone(config.path()).envs(&env).start();
    cp.wait_ready(STARTUP_TIMEOUT).await;
    let mut proxies = Vec::new();
    for i in 0..5 {
        let spec = SimProxySpec::sidecar(&cp.xds_url(), "default", &format!("app{i}"), &format!("10.1.0.{i}"));
        let proxy = SimProxy::connect(spec).await.expect("sim proxy");
        assert!(proxy.wait_for(TIMEOUT, |s| s.types.len() == 4).await);
        proxies.push(proxy);
    }
    std::fs::write(config.path().join("ratings.yaml"), service_entry_in("default", "ratings", &["10.0.0.2"])).unwrap();

    // The summary comes once the version's push window (5 s) has passed.
    let fanout = poll(Duration::from_secs(30), async || {
        receiver
            .received
            .spans()
            .into_iter()
            .find(|s| s.span.name == "xds_fanout" && s.attr("version").as_deref() == Some("1.2"))
    })
    .await
    .expect("xds_fanout span for 1.2");
    assert_eq!(fanout.attr("proxies").as_deref(), Some("5"));
    assert_eq!(fanout.attr("proxies.traced").as_deref(), Some("2"));
    assert_eq!(fanout.attr("proxies.untraced").as_deref(), Some("3"));
    let spans = by_name(&receiver.received.spans(), &fanout.trace_id());
    let build = &spans["snapshot_build"][0];
    assert_eq!(fanout.parent_id(), build.span_id(), "xds_fanout under snapshot_build");
    let pushes = spans.get("xds_push").map(Vec::len).unwrap_or(0);
    assert_eq!(pushes, 2, "only the sample has xds_push spans");
    drop(proxies);
    cp.terminate(TERMINATE_GRACE).await;
    eprintln!("fan-out sampling test took {:?}", started.elapsed());
}
