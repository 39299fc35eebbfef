//! `meshpilot load` against a standalone meshpilot, capturing what the proxies received, then
//! `meshpilot replay` of that capture under the same load: every proxy converges on both, a
//! VirtualService edit reaches only the namespace it is exported to, and the replay server writes
//! exactly the bytes meshpilot wrote (same bytes per proxy, initially and in the phase).

use crate::common;

use std::path::Path;
use std::time::Duration;

use common::files::temp_dir_with;
use common::http::{http_client, http_request};
use common::istio::{dedent, service_entry_in};
use common::meshpilot::Meshpilot;
use common::poll::STARTUP_TIMEOUT;
use common::ports::free_addr;
use common::process::{temp_dir, Process, ProcessSpec};
use serde_json::{json, Value};

/// Simulated proxies: one per workload, so every proxy is captured and replayed byte for byte.
const PROXIES: usize = 10;
/// Workloads alternate between the two namespaces.
const NAMESPACES: [&str; 2] = ["ns-a", "ns-b"];
/// Proxies in ns-a, the namespace the VirtualService is exported to.
const IN_NS_A: usize = PROXIES / 2;
/// Longest a load run may take.
const LOAD_TIMEOUT: Duration = Duration::from_secs(60);

/// A VirtualService of `svc-0.ns-a` visible only in ns-a (`exportTo: ["."]`).
fn virtual_service(timeout: &str) -> String {
    dedent(&format!(
        r#"
        apiVersion: networking.istio.io/v1
        kind: VirtualService
        metadata: {{name: svc-0, namespace: ns-a}}
        spec:
          hosts: [svc-0.ns-a.svc.cluster.local]
          exportTo: ["."]
          http:
          - timeout: {timeout}
            route:
            - destination: {{host: svc-0.ns-a.svc.cluster.local}}
        "#
    ))
}

/// 20 ServiceEntries (10 per namespace) and the VirtualService.
fn config() -> tempfile::TempDir {
    let mut entries = Vec::new();
    for ns in NAMESPACES {
        for i in 0..10 {
            entries.push(service_entry_in(ns, &format!("svc-{i}"), &[&format!("10.0.{i}.1"), &format!("10.0.{i}.2")]));
        }
    }
    temp_dir_with(&[("services.yaml", &entries.join("---\n")), ("vs.yaml", &virtual_service("5s"))])
}

/// Runs `meshpilot load` to its end; the JSON report, after asserting a successful exit.
async fn load(xds_url: &str, mode: &str, phases: &Value, dir: &Path, capture: Option<&Path>) -> Value {
    let (ok, report, text) = try_load(xds_url, mode, &NAMESPACES.join(","), phases, dir, capture).await;
    assert!(ok, "meshpilot load {mode} against {xds_url} failed:\n{text}");
    report
}

/// Runs `meshpilot load` to its end: whether it exited 0, its JSON report, and its output.
async fn try_load(
    xds_url: &str,
    mode: &str,
    namespaces: &str,
    phases: &Value,
    dir: &Path,
    capture: Option<&Path>,
) -> (bool, Value, String) {
    let phases_file = dir.join(format!("phases-{mode}.json"));
    std::fs::write(&phases_file, phases.to_string()).expect("write phases");
    let report_file = dir.join(format!("report-{mode}.json"));
    let _ = std::fs::remove_file(&report_file);
    let mut cmd = tokio::process::Command::new(Meshpilot::binary());
    cmd.args(["load", "--xds-url", xds_url, "--proxies", &PROXIES.to_string(), "--workloads", &PROXIES.to_string()])
        .args(["--namespaces", namespaces, "--mode", mode, "--settle", "1s", "--timeout", "20s"])
        .arg("--phases")
        .arg(&phases_file)
        .arg("--json")
        .arg(&report_file)
        .env("RUST_LOG", "info")
        .kill_on_drop(true);
    if let Some(c) = capture {
        cmd.arg("--capture").arg(c);
    }
    let out =
        tokio::time::timeout(LOAD_TIMEOUT, cmd.output()).await.expect("meshpilot load finishes").expect("run load");
    let text = String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    let report = std::fs::read(&report_file).unwrap_or_else(|e| panic!("no report ({e}):\n{text}"));
    (out.status.success(), serde_json::from_slice(&report).expect("report is JSON"), text)
}

fn assert_all_converged(report: &Value, what: &str) {
    assert_eq!(report["connected"], PROXIES, "{what}: {report:#}");
    assert_eq!(report["converged"], PROXIES, "{what}: {report:#}");
    assert_eq!(report["errors"]["count"], 0, "{what}: {report:#}");
    assert!(report["initial"]["bytes_per_proxy"].as_f64().unwrap_or(0.0) > 0.0, "{what}: {report:#}");
}

async fn load_then_replay(mode: &str) {
    let config = config();
    let cp = Meshpilot::standalone(config.path()).start();
    cp.wait_ready(STARTUP_TIMEOUT).await;
    let work = temp_dir("meshpilot-load-");
    let capture = work.path().join("capture");

    let edit = json!({"phases": [{"name": "vs-edit", "action": {"write": [
        {"path": config.path().join("vs.yaml"), "content": virtual_service("7s")}
    ]}}]});
    let live = load(&cp.xds_url(), mode, &edit, work.path(), Some(&capture)).await;
    assert_all_converged(&live, "meshpilot");
    assert_eq!(live["mode"], mode);
    let phase = &live["phases"][0];
    assert_eq!(phase["name"], "vs-edit");
    assert_eq!(phase["pushed"], IN_NS_A, "only ns-a imports the VirtualService: {live:#}");
    let index: Value =
        serde_json::from_slice(&std::fs::read(capture.join("index.json")).expect("capture index")).expect("index JSON");
    assert_eq!(index["mode"], mode);
    assert_eq!(index["workloads"].as_object().map(|w| w.len()), Some(PROXIES), "{index:#}");
    drop(cp);

    let (xds_addr, admin_addr) = (free_addr(), free_addr());
    let spec = ProcessSpec::new(format!("replay {mode}"), Meshpilot::binary())
        .args(["replay", "--capture", &capture.display().to_string()])
        .args(["--xds-addr", &xds_addr.to_string(), "--admin-addr", &admin_addr.to_string()])
        .env("RUST_LOG", "info");
    let mut replay = Process::start(temp_dir("meshpilot-replay-"), spec);
    let admin = format!("http://{admin_addr}");
    let client = http_client();
    replay.wait_http_ready(&client, &format!("{admin}/ready"), STARTUP_TIMEOUT).await;
    let unknown = http_request(&client, "POST", &format!("{admin}/phase/nope"), "", &[], None).await.expect("POST");
    assert_eq!(unknown.status, 404, "a phase the capture lacks: {}", unknown.body);
    let push = json!({"phases": [{"name": "vs-edit", "action": {"post": format!("{admin}/phase/vs-edit")}}]});
    let replayed = load(&format!("http://{xds_addr}"), mode, &push, work.path(), None).await;
    assert_all_converged(&replayed, "replay");
    assert_eq!(replayed["initial"]["bytes_total"], live["initial"]["bytes_total"], "same bytes: {replayed:#}");
    let again = &replayed["phases"][0];
    assert_eq!(again["pushed"], IN_NS_A, "{replayed:#}");
    for key in ["bytes_total", "bytes_per_proxy", "bytes_per_proxy_max", "responses"] {
        assert_eq!(again[key], phase[key], "{key}: replay {again:#} vs meshpilot {phase:#}");
    }
    // Proxies of workloads the capture lacks are refused, and the client says so.
    let (ok, refused, text) =
        try_load(&format!("http://{xds_addr}"), mode, "ns-x", &json!({"phases": []}), work.path(), None).await;
    assert!(!ok, "{text}");
    assert_eq!(refused["converged"], 0, "{refused:#}");
    assert_eq!(refused["errors"]["count"], PROXIES, "{refused:#}");
    assert!(refused["errors"]["messages"][0].as_str().is_some_and(|m| m.contains("no workload")), "{refused:#}");
    assert!(replay.terminate(Duration::from_secs(10)).await, "replay exits on SIGTERM");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sotw_load_captures_and_replays_the_same_bytes() {
    load_then_replay("sotw").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delta_load_captures_and_replays_the_same_bytes() {
    load_then_replay("delta").await;
}
