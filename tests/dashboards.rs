//! The Grafana dashboards in `dashboards/`: valid Grafana JSON (unique panel ids, a datasource
//! variable, no hard-coded datasource uid), and every PromQL expression of every panel parses and
//! returns data when a real Prometheus (Debian's `prometheus`, see `scripts/setup.sh`) evaluates it
//! after a few pushes through standalone meshpilot and through an ingest node and a frontend.

use crate::common;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::Duration;

use common::etcd::Etcd;
use common::files::{temp_dir_with, write_atomic};
use common::istio::service_entry_in;
use common::meshpilot::Meshpilot;
use common::poll::{poll, STARTUP_TIMEOUT};
use common::prometheus::{prometheus_path, Prometheus};
use meshpilot::sim::{SimProxy, SimProxySpec};
use meshpilot::xds::TypeUrl;
use serde_json::Value;

/// Convergence timeout.
const TIMEOUT: Duration = Duration::from_secs(60);

/// What Grafana's `$__rate_interval` and friends become in the test.
const WINDOW: &str = "30s";

fn dashboard_files() -> Vec<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("dashboards");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .expect("dashboards/")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .collect();
    files.sort();
    files
}

/// All panels, rows' nested panels included.
fn panels(dashboard: &Value) -> Vec<&Value> {
    let mut out = Vec::new();
    for p in dashboard["panels"].as_array().into_iter().flatten() {
        out.push(p);
        out.extend(p["panels"].as_array().into_iter().flatten());
    }
    out
}

/// Every `datasource` value anywhere in the document.
fn datasources<'a>(v: &'a Value, out: &mut Vec<(String, &'a Value)>, path: String) {
    match v {
        Value::Object(map) => {
            for (k, child) in map {
                if k == "datasource" {
                    out.push((format!("{path}.{k}"), child));
                }
                datasources(child, out, format!("{path}.{k}"));
            }
        }
        Value::Array(items) => {
            for (i, child) in items.iter().enumerate() {
                datasources(child, out, format!("{path}[{i}]"));
            }
        }
        _ => {}
    }
}

/// Checks Grafana's structure; returns the dashboard's template variable names.
fn check_dashboard(name: &str, d: &Value) -> Vec<String> {
    assert!(d["title"].as_str().is_some_and(|t| !t.is_empty()), "{name}: title");
    assert!(d["uid"].as_str().is_some_and(|t| !t.is_empty()), "{name}: uid");
    assert!(d["schemaVersion"].as_u64().is_some(), "{name}: schemaVersion");
    let vars = d["templating"]["list"].as_array().unwrap_or_else(|| panic!("{name}: templating.list"));
    let ds_var = vars
        .iter()
        .find(|v| v["type"] == "datasource")
        .unwrap_or_else(|| panic!("{name}: no datasource template variable"));
    assert_eq!(ds_var["query"], "prometheus", "{name}: the datasource variable selects Prometheus");
    let ds_name = ds_var["name"].as_str().expect("variable name");
    let ds_ref = format!("${{{ds_name}}}");

    let mut ids = BTreeSet::new();
    let all = panels(d);
    assert!(all.len() > 5, "{name}: {} panels", all.len());
    for p in &all {
        let id = p["id"].as_u64().unwrap_or_else(|| panic!("{name}: panel without id: {}", p["title"]));
        assert!(ids.insert(id), "{name}: panel id {id} used twice");
        assert!(
            p["gridPos"]["w"].as_u64().is_some() && p["gridPos"]["h"].as_u64().is_some(),
            "{name}: gridPos of {id}"
        );
        assert!(p["type"].as_str().is_some(), "{name}: type of panel {id}");
        if p["type"] == "row" {
            continue;
        }
        assert_eq!(p["datasource"]["uid"], ds_ref.as_str(), "{name}: panel {id} ({}) must use {ds_ref}", p["title"]);
        let targets = p["targets"].as_array().unwrap_or_else(|| panic!("{name}: panel {id} has no targets"));
        assert!(!targets.is_empty(), "{name}: panel {id} has no targets");
        let mut refs = BTreeSet::new();
        for t in targets {
            assert!(t["expr"].as_str().is_some_and(|e| !e.trim().is_empty()), "{name}: panel {id}: empty expr");
            assert!(refs.insert(t["refId"].as_str().unwrap_or_default().to_string()), "{name}: panel {id}: refIds");
            if !t["datasource"].is_null() {
                assert_eq!(t["datasource"]["uid"], ds_ref.as_str(), "{name}: panel {id} target datasource");
            }
        }
    }
    // No hard-coded datasource anywhere: every reference goes through the variable.
    let mut refs = Vec::new();
    datasources(d, &mut refs, String::new());
    for (path, v) in refs {
        let uid = v.get("uid").and_then(Value::as_str).or_else(|| v.as_str());
        assert!(
            uid.is_none_or(|u| u == ds_ref || u == format!("${ds_name}")),
            "{name}: hard-coded datasource at {path}: {v}"
        );
    }
    vars.iter().filter_map(|v| v["name"].as_str().map(str::to_string)).collect()
}

/// A panel expression as Prometheus gets it: Grafana's interval variables become [`WINDOW`], the
/// dashboard's own variables `.*`.
fn concrete(expr: &str, vars: &[String]) -> String {
    let mut e = expr.to_string();
    for builtin in ["$__rate_interval", "$__interval", "$__range"] {
        e = e.replace(&format!("${{{}}}", &builtin[1..]), WINDOW).replace(builtin, WINDOW);
    }
    for v in vars {
        e = e.replace(&format!("${{{v}}}"), ".*").replace(&format!("${v}"), ".*");
    }
    assert!(!e.contains('$'), "unknown variable left in {e}");
    e
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_dashboard_query_parses_and_returns_data() {
    let started = std::time::Instant::now();
    let files = dashboard_files();
    let names: Vec<String> = files.iter().filter_map(|f| f.file_name()?.to_str().map(str::to_string)).collect();
    assert!(
        names.contains(&"control-plane.json".to_string()) && names.contains(&"sharding.json".to_string()),
        "{names:?}"
    );
    let mut queries = Vec::new();
    for f in &files {
        let name = f.file_name().and_then(|n| n.to_str()).unwrap_or_default().to_string();
        let text = std::fs::read_to_string(f).expect("read dashboard");
        let d: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{name}: not JSON: {e}"));
        let vars = check_dashboard(&name, &d);
        for p in panels(&d) {
            for t in p["targets"].as_array().into_iter().flatten() {
                let expr = concrete(t["expr"].as_str().unwrap_or_default(), &vars);
                queries.push((
                    format!("{name} panel {} \"{}\" {}", p["id"], p["title"].as_str().unwrap_or(""), t["refId"]),
                    expr,
                ));
            }
        }
    }

    // Every role: standalone, and a leader ingest node with one frontend.
    let etcd = Etcd::start().await;
    let standalone_config = temp_dir_with(&[("reviews.yaml", &service_entry_in("default", "reviews", &["10.0.0.1"]))]);
    let split_config = temp_dir_with(&[("reviews.yaml", &service_entry_in("default", "reviews", &["10.0.0.1"]))]);
    let standalone = Meshpilot::standalone(standalone_config.path()).start();
    let ingest = Meshpilot::ingest(&etcd.endpoint(), split_config.path()).id("ingest-a").lease_ttl(2).start();
    standalone.wait_ready(STARTUP_TIMEOUT).await;
    ingest.wait_ready(STARTUP_TIMEOUT).await;
    let frontend = Meshpilot::frontend(&etcd.endpoint()).id("frontend-a").lease_ttl(2).start();
    frontend.wait_ready(STARTUP_TIMEOUT).await;
    let prometheus = Prometheus::start(&[standalone.admin_addr(), ingest.admin_addr(), frontend.admin_addr()]).await;

    let mut proxies = Vec::new();
    for (cp, name) in [(&standalone, "a"), (&standalone, "b"), (&frontend, "c"), (&frontend, "d")] {
        let mut spec = SimProxySpec::sidecar(&cp.xds_url(), "default", name, "10.1.0.1");
        if name == "b" {
            spec.reject = Some(TypeUrl::Listener);
        }
        let proxy = SimProxy::connect(spec).await.expect("sim proxy");
        assert!(proxy.wait_for(TIMEOUT, |s| s.types.len() == 4).await, "{:?}", proxy.state());
        proxies.push(proxy);
    }
    // A few pushes: a new service, then an endpoint change, on both sides.
    for dir in [standalone_config.path(), split_config.path()] {
        std::fs::write(dir.join("ratings.yaml"), service_entry_in("default", "ratings", &["10.0.0.2"])).unwrap();
    }
    let eds_responses = |p: &SimProxy| p.state().types.get(&TypeUrl::Endpoint).map(|t| t.responses).unwrap_or(0);
    for p in &proxies {
        let before = eds_responses(p);
        assert!(p.wait_for(TIMEOUT, |s| s.types[&TypeUrl::Cluster].names.len() >= 4).await, "{:?}", p.state());
        let _ = p.wait_for(Duration::from_secs(5), |_| eds_responses(p) > before).await;
    }
    for dir in [standalone_config.path(), split_config.path()] {
        write_atomic(dir, "ratings.yaml", &service_entry_in("default", "ratings", &["10.0.0.2", "10.0.0.3"]));
    }
    tokio::time::sleep(Duration::from_secs(1)).await;

    // Every query parses at once; each returns data once Prometheus has scraped the pushes.
    for (what, expr) in &queries {
        let answer = prometheus.query(expr).await;
        assert_eq!(answer["status"], "success", "{what}: {expr}: {answer}");
    }
    let mut failing: Vec<String> = Vec::new();
    let all_data = poll(Duration::from_secs(45), async || {
        failing.clear();
        for (what, expr) in &queries {
            let answer = prometheus.query(expr).await;
            let empty = answer["data"]["result"].as_array().is_none_or(Vec::is_empty);
            if answer["status"] != "success" || empty {
                failing.push(format!("{what}: {expr} → {answer}"));
            }
        }
        failing.is_empty().then_some(())
    })
    .await;
    assert!(all_data.is_some(), "queries without data:\n{}", failing.join("\n"));
    eprintln!("{} queries of {} dashboards checked in {:?}", queries.len(), files.len(), started.elapsed());
    drop(proxies);
}

fn observability(file: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/observability").join(file)
}

fn yaml(file: &str) -> Value {
    let text = std::fs::read_to_string(observability(file)).unwrap_or_else(|e| panic!("{file}: {e}"));
    serde_saphyr::from_str(&text).unwrap_or_else(|e| panic!("{file}: {e}"))
}

/// The configs in `deploy/observability/` that feed the dashboards hang together: Prometheus accepts
/// the local one, the collector's pipelines use only components it defines and keep meshpilot's
/// metric names, and Grafana's provisioning and the compose file point at files that exist.
#[test]
fn observability_configs_hang_together() {
    // Prometheus (Debian's promtool, next to the prometheus binary).
    let promtool = prometheus_path().with_file_name("promtool");
    let out = std::process::Command::new(&promtool)
        .args(["check", "config"])
        .arg(observability("prometheus.yml"))
        .output()
        .unwrap_or_else(|e| panic!("{}: {e}", promtool.display()));
    assert!(
        out.status.success(),
        "promtool: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    // The cluster config (Debian's build lacks Kubernetes discovery, so only its shape is checked).
    let k8s = yaml("prometheus-kubernetes.yml");
    let job = &k8s["scrape_configs"][0];
    assert_eq!(job["kubernetes_sd_configs"][0]["role"], "pod");
    let namespace = yaml("../kustomize/base/namespace.yaml");
    assert_eq!(job["kubernetes_sd_configs"][0]["namespaces"]["names"][0], namespace["metadata"]["name"]);

    // The collector.
    let otel = yaml("otel-collector.yaml");
    for (signal, pipeline) in otel["service"]["pipelines"].as_object().expect("pipelines") {
        for kind in ["receivers", "processors", "exporters"] {
            for component in pipeline[kind].as_array().into_iter().flatten() {
                let name = component.as_str().unwrap_or_default();
                assert!(otel[kind].get(name).is_some(), "{signal} pipeline uses undefined {kind} {name}");
            }
        }
    }
    assert!(otel["service"]["pipelines"]["traces"]["exporters"].as_array().is_some_and(|e| !e.is_empty()));
    let metrics_exporters = otel["service"]["pipelines"]["metrics"]["exporters"].as_array().expect("metrics exporters");
    assert!(!metrics_exporters.is_empty());
    for name in ["prometheus", "prometheusremotewrite"] {
        assert_eq!(otel["exporters"][name]["add_metric_suffixes"], false, "{name} must keep Istio's names");
    }
    assert!(otel["receivers"]["otlp"]["protocols"]["grpc"].is_object(), "OTLP/gRPC receiver");

    // Grafana provisioning and the compose file.
    let ds = yaml("grafana/provisioning/datasources/meshpilot.yaml");
    assert_eq!(ds["datasources"][0]["type"], "prometheus");
    let dashboards = yaml("grafana/provisioning/dashboards/meshpilot.yaml");
    assert_eq!(dashboards["providers"][0]["type"], "file");
    let compose = yaml("compose.yaml");
    for (service, def) in compose["services"].as_object().expect("services") {
        for volume in def["volumes"].as_array().into_iter().flatten() {
            let source = volume.as_str().and_then(|v| v.split(':').next()).unwrap_or_default();
            assert!(observability(source).exists(), "{service}: volume source {source} does not exist");
        }
    }
}
