//! ADS stream behaviour with simulated proxies (the crate's own ADS client, which subscribes
//! and ACKs like Envoy): fan-out, NACK handling, bad nodes.
//!
//! Fan-out: 200 simulated sidecars (the crate's own ADS client, which subscribes and ACKs like Envoy) in
//! two namespaces whose services are private to them. An endpoint change in one namespace must
//! give each of its proxies exactly one push (EDS only) and the other namespace none; a service
//! change in the other namespace the reverse.

use crate::common;

use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use common::envoy::Envoy;
use common::files::write_atomic;
use common::http::{http_client, http_request};
use common::poll::{poll, poll_every};
use common::ports::free_addr;
use meshpilot::app::standalone::{self, StandaloneSettings};
use meshpilot::app::Process;
use meshpilot::ingest::DebounceSettings;
use meshpilot::sim::{SimProxy, SimProxySpec, SimState};
use meshpilot::source::SourceSettings;
use meshpilot::xds::TypeUrl;
use serde_json::Value;

const PER_NAMESPACE: usize = 100;
const TIMEOUT: Duration = Duration::from_secs(60);

fn service(ns: &str, port: u32, endpoints: &[&str]) -> String {
    let eps: Vec<String> = endpoints.iter().map(|a| format!("{{address: {a}}}")).collect();
    format!(
        "apiVersion: networking.istio.io/v1\nkind: ServiceEntry\nmetadata: {{name: svc, namespace: {ns}}}\nspec:\n  hosts: [svc.{ns}.svc.cluster.local]\n  exportTo: [\".\"]\n  location: MESH_INTERNAL\n  resolution: STATIC\n  ports: [{{number: {port}, name: http, protocol: HTTP}}]\n  endpoints: [{}]\n",
        eps.join(", ")
    )
}

/// A Sidecar giving `ns`'s workloads an egress listener on 127.0.0.1:`port` (no iptables here).
/// A Sidecar scoping `ns`'s proxies to their namespace's services.
fn sidecar(ns: &str) -> String {
    format!(
        "apiVersion: networking.istio.io/v1\nkind: Sidecar\nmetadata: {{name: default, namespace: {ns}}}\nspec:\n  egress:\n  - hosts: [\"./*\"]\n"
    )
}

async fn start_envoy(server: &Server, ns: &str) -> Envoy {
    let node = format!("sidecar~127.0.0.1~envoy.{ns}~{ns}.svc.cluster.local");
    let envoy = Envoy::builder(&node, server.xds)
        .metadata(serde_json::json!({"NAMESPACE": ns, "LABELS": {"app": "envoy"}}))
        .start();
    envoy.wait_ready(TIMEOUT).await;
    envoy
}

/// Envoy's xDS update counters (CDS, LDS, RDS and per-cluster EDS attempts).
async fn update_attempts(envoy: &Envoy) -> std::collections::BTreeMap<String, u64> {
    envoy.stats().await.into_iter().filter(|(k, _)| k.ends_with("update_attempt")).collect()
}

async fn admin_json(admin: SocketAddr, path: &str) -> Value {
    let url = format!("http://{admin}{path}");
    let body = http_request(&http_client(), "GET", &url, "", &[], None).await.unwrap().body;
    serde_json::from_str(&body).unwrap_or_else(|e| panic!("{path}: {e}: {body}"))
}

/// Waits until every connection has processed the snapshot `version` (pushed or not).
async fn wait_all_on(admin: SocketAddr, version: &str, count: usize) {
    let mut on = 0;
    let all = poll_every(Duration::from_millis(50), TIMEOUT, async || {
        let syncz = admin_json(admin, "/debug/syncz").await;
        on = syncz.as_array().map(|a| a.iter().filter(|c| c["snapshot_version"] == version).count()).unwrap_or(0);
        on == count
    })
    .await;
    assert!(all, "only {on}/{count} connections reached {version}");
}

async fn current_version(admin: SocketAddr) -> String {
    admin_json(admin, "/debug/push_status").await["version"].as_str().unwrap().to_string()
}

async fn wait_new_version(admin: SocketAddr, old: &str) -> String {
    poll_every(Duration::from_millis(20), TIMEOUT, async || Some(current_version(admin).await).filter(|v| v != old))
        .await
        .unwrap_or_else(|| panic!("no new snapshot after {old}"))
}

fn counts(proxies: &[SimProxy]) -> Vec<SimState> {
    proxies.iter().map(|p| SimState::clone(&p.state())).collect()
}

/// An in-process standalone meshpilot on free ports; stopped on drop.
struct Server {
    xds: SocketAddr,
    admin: SocketAddr,
    stop: Option<meshpilot::drain::DrainTrigger>,
}

impl Server {
    fn start(dir: &Path) -> Server {
        let (xds, admin) = (free_addr(), free_addr());
        let settings = StandaloneSettings {
            sources: SourceSettings::config_dir(dir),
            debounce: DebounceSettings {
                after: Duration::from_millis(50),
                max: Duration::from_secs(1),
                leading_edge: true,
            },
            xds_addr: xds,
            admin_addr: admin,
            admission: Default::default(),
            plaintext_xds: true,
            security: Default::default(),
            webhook: None,
        };
        // Dropping the trigger drains the server.
        let (stop, drain) = meshpilot::drain::new();
        let process = Process::new(meshpilot::telemetry::metrics::Registry::new(), "standalone", "test");
        tokio::spawn(standalone::run(settings, process, drain));
        Server { xds, admin, stop: Some(stop) }
    }

    fn url(&self) -> String {
        format!("http://{}", self.xds)
    }

    async fn connect(&self, spec: SimProxySpec) -> SimProxy {
        // Listeners are bound before the first snapshot: wait for readiness, as a user would.
        let ready = poll(Duration::from_secs(30), async || {
            let url = format!("http://{}/ready", self.admin);
            let status = reqwest::Client::builder().no_proxy().build().ok()?.get(url).send().await.ok()?.status();
            (status.as_u16() == 200).then_some(())
        })
        .await;
        assert!(ready.is_some(), "server not ready");
        poll(Duration::from_secs(10), async || SimProxy::connect(spec.clone()).await.ok())
            .await
            .unwrap_or_else(|| panic!("cannot connect to {}", spec.xds_url))
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop.take();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_change_pushes_once_to_affected_proxies_only() {
    let dir = tempfile::tempdir().unwrap();
    write_atomic(dir.path(), "a.yaml", &service("team-a", 80, &["10.0.0.1"]));
    write_atomic(dir.path(), "b.yaml", &service("team-b", 80, &["10.0.1.1"]));
    write_atomic(dir.path(), "sidecar-a.yaml", &sidecar("team-a"));
    write_atomic(dir.path(), "sidecar-b.yaml", &sidecar("team-b"));
    let server = Server::start(dir.path());
    let admin = server.admin;
    let url = server.url();
    // Real Envoys in each namespace beside the simulated proxies.
    let envoy_a = start_envoy(&server, "team-a").await;
    let envoy_b = start_envoy(&server, "team-b").await;
    let mut team_a = Vec::new();
    let mut team_b = Vec::new();
    for i in 0..PER_NAMESPACE {
        for (ns, list) in [("team-a", &mut team_a), ("team-b", &mut team_b)] {
            let spec = SimProxySpec::sidecar(&url, ns, &format!("app-{i}"), &format!("10.9.{}.{}", i / 200, i % 200));
            list.push(server.connect(spec).await);
        }
    }
    let v1 = current_version(admin).await;
    for p in team_a.iter().chain(&team_b) {
        assert!(
            p.wait_for(TIMEOUT, |s| s.acked(&v1) && s.types.len() == 4).await,
            "proxy never converged: {:?}",
            p.state()
        );
    }
    // Each proxy sees its own namespace's service only.
    let clusters = &team_a[0].state().types[&TypeUrl::Cluster].names;
    assert!(clusters.contains("outbound|80||svc.team-a.svc.cluster.local"), "{clusters:?}");
    assert!(!clusters.iter().any(|c| c.contains("team-b")), "{clusters:?}");

    // 1. Endpoint-only change in team-b.
    let before_a = counts(&team_a);
    let before_b = counts(&team_b);
    let envoy_a_before = update_attempts(&envoy_a).await;
    let envoy_b_before = update_attempts(&envoy_b).await;
    write_atomic(dir.path(), "b.yaml", &service("team-b", 80, &["10.0.1.1", "10.0.1.2"]));
    let v2 = wait_new_version(admin, &v1).await;
    let push = admin_json(admin, "/debug/push_status").await;
    assert_eq!(push["endpoints_only"], true, "{push}");
    wait_all_on(admin, &v2, 2 * PER_NAMESPACE + 2).await;
    for (p, before) in team_b.iter().zip(&before_b) {
        assert!(p.wait_for(TIMEOUT, |s| s.types[&TypeUrl::Endpoint].acked_version == v2).await);
        let now = p.state();
        // Every type the proxy watches (sidecars ask for no gateway credentials).
        for t in TypeUrl::PUSH_ORDER.into_iter().filter(|t| before.types.contains_key(t)) {
            let expected = before.types[&t].responses + u64::from(t == TypeUrl::Endpoint);
            assert_eq!(now.types[&t].responses, expected, "team-b proxy, {t}: exactly one EDS push expected");
        }
    }
    for (p, before) in team_a.iter().zip(&before_a) {
        assert_eq!(p.state().responses(), before.responses(), "team-a proxies must get no push");
    }
    // The team-b Envoy gets exactly one EDS update for its service and nothing else; team-a's Envoy nothing.
    let eds_stat = "cluster.outbound|80||svc.team-b.svc.cluster.local;.update_attempt";
    assert!(
        envoy_b.wait_for(TIMEOUT, async |e| e.stat(eds_stat).await > envoy_b_before.get(eds_stat).copied()).await,
        "team-b Envoy got no EDS update"
    );
    let mut expected_b = envoy_b_before.clone();
    *expected_b.entry(eds_stat.to_string()).or_default() += 1;
    assert_eq!(update_attempts(&envoy_b).await, expected_b, "team-b Envoy: exactly one EDS update");
    assert_eq!(update_attempts(&envoy_a).await, envoy_a_before, "team-a Envoy must get no update");
    let syncz = admin_json(admin, "/debug/syncz").await;
    for conn in syncz.as_array().unwrap() {
        let ns = conn["proxy"]["namespace"].as_str().unwrap();
        let pushes = conn["pushes"].as_u64().unwrap();
        if conn["proxy"]["labels"]["app"] == "envoy" {
            continue; // Envoys are checked through their own counters above.
        }
        // Initial config answers requests and is not a push; team-b got exactly one push since.
        let expected = if ns == "team-b" { 1 } else { 0 };
        assert_eq!(pushes, expected, "push count of {}", conn["proxy"]["id"]);
    }

    // 2. A service change in team-a (new port): team-a proxies get one push, team-b none.
    let before_a = counts(&team_a);
    let before_b = counts(&team_b);
    write_atomic(dir.path(), "a.yaml", &service("team-a", 8080, &["10.0.0.1"]));
    let v3 = wait_new_version(admin, &v2).await;
    wait_all_on(admin, &v3, 2 * PER_NAMESPACE + 2).await;
    for (p, before) in team_a.iter().zip(&before_a) {
        assert!(p.wait_for(TIMEOUT, |s| s.types[&TypeUrl::Cluster].acked_version == v3).await);
        let now = p.state();
        assert_eq!(now.types[&TypeUrl::Cluster].responses, before.types[&TypeUrl::Cluster].responses + 1);
        assert!(now.types[&TypeUrl::Cluster].names.contains("outbound|8080||svc.team-a.svc.cluster.local"));
    }
    for (p, before) in team_b.iter().zip(&before_b) {
        assert_eq!(p.state().responses(), before.responses(), "team-b proxies must get no push");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_nacked_version_is_recorded_and_not_resent_until_config_changes() {
    let dir = tempfile::tempdir().unwrap();
    write_atomic(dir.path(), "a.yaml", &service("team-a", 80, &["10.0.0.1"]));
    let server = Server::start(dir.path());
    let mut spec = SimProxySpec::sidecar(&server.url(), "team-a", "app", "10.9.0.1");
    spec.reject = Some(TypeUrl::Cluster);
    let proxy = server.connect(spec).await;
    let v1 = current_version(server.admin).await;
    assert!(proxy.wait_for(TIMEOUT, |s| s.types.get(&TypeUrl::Listener).is_some_and(|t| t.acked_version == v1)).await);
    // A proxy that rejects everything: each cluster is tried alone and set aside, then nothing more is sent.
    wait_cds_settled(&proxy).await;

    let syncz = admin_json(server.admin, "/debug/syncz").await;
    let cds = &syncz[0]["types"]["Cluster"];
    assert_eq!(cds["sent_version"], v1.as_str(), "{syncz}");
    assert_eq!(cds["acked_version"], "", "a NACK must not count as an ACK: {syncz}");
    assert_eq!(cds["last_nack"]["message"], "simulated rejection", "{syncz}");
    assert_eq!(syncz[0]["types"]["Listener"]["acked_version"], v1.as_str());

    // A change that leaves this proxy's clusters as they were: the rejected CDS is not resent.
    let cds_before = proxy.state().types[&TypeUrl::Cluster].responses;
    write_atomic(dir.path(), "other.yaml", &service("team-z", 80, &["10.0.9.1"]));
    let v2 = wait_new_version(server.admin, &v1).await;
    wait_all_on(server.admin, &v2, 1).await;
    assert_eq!(proxy.state().types[&TypeUrl::Cluster].responses, cds_before);

    // A change to its clusters is sent (and rejected again): the new cluster, then once more
    // without it, after which nothing is left to try.
    write_atomic(dir.path(), "a.yaml", &service("team-a", 81, &["10.0.0.1"]));
    let v3 = wait_new_version(server.admin, &v2).await;
    assert!(proxy.wait_for(TIMEOUT, |s| s.types[&TypeUrl::Cluster].version == v3).await);
    wait_cds_settled(&proxy).await;
    assert_eq!(proxy.state().types[&TypeUrl::Cluster].responses, cds_before + 2);
}

/// Waits until the proxy's CDS response count stays the same for 500 ms.
async fn wait_cds_settled(proxy: &SimProxy) {
    let count = || proxy.state().types.get(&TypeUrl::Cluster).map_or(0, |t| t.responses);
    let deadline = tokio::time::Instant::now() + TIMEOUT;
    let mut last = count();
    loop {
        tokio::time::sleep(Duration::from_millis(500)).await;
        let now = count();
        if now == last {
            return;
        }
        assert!(tokio::time::Instant::now() < deadline, "CDS responses never settle");
        last = now;
    }
}

/// Three services in `ns`, one of which a proxy will reject.
fn services(ns: &str, hosts: &[&str]) -> String {
    hosts
        .iter()
        .enumerate()
        .map(|(i, h)| {
            format!(
                "apiVersion: networking.istio.io/v1\nkind: ServiceEntry\nmetadata: {{name: {h}, namespace: {ns}}}\nspec:\n  hosts: [{h}.{ns}.svc.cluster.local]\n  location: MESH_INTERNAL\n  resolution: STATIC\n  ports: [{{number: 80, name: http, protocol: HTTP}}]\n  endpoints: [{{address: 10.1.0.{}}}]\n",
                i + 1
            )
        })
        .collect::<Vec<_>>()
        .join("---\n")
}

fn cluster(ns: &str, host: &str) -> String {
    format!("outbound|80||{host}.{ns}.svc.cluster.local")
}

/// One cluster a proxy rejects never blocks the rest: it is set aside (named by the NACK, or
/// found by bisection when the NACK names nothing), reported, and later changes still arrive.
async fn one_rejected_cluster_is_set_aside(name_rejected: bool) {
    let dir = tempfile::tempdir().unwrap();
    write_atomic(dir.path(), "a.yaml", &services("team-a", &["good"]));
    let server = Server::start(dir.path());
    let mut spec = SimProxySpec::sidecar(&server.url(), "team-a", "app", "10.9.0.1");
    spec.reject_resources = [cluster("team-a", "bad")].into_iter().collect();
    spec.name_rejected = name_rejected;
    let proxy = server.connect(spec).await;
    let has = |names: &[String]| {
        let names = names.to_vec();
        move |s: &SimState| {
            s.types.get(&TypeUrl::Cluster).is_some_and(|t| names.iter().all(|n| t.acked_names.contains(n)))
        }
    };
    assert!(proxy.wait_for(TIMEOUT, has(&[cluster("team-a", "good")])).await);

    // One change adds a cluster the proxy rejects beside five it accepts.
    let added = ["bad", "c1", "c2", "c3", "c4", "c5"];
    write_atomic(dir.path(), "a.yaml", &services("team-a", &[&["good"][..], &added[..]].concat()));
    let fine: Vec<String> = ["good", "c1", "c2", "c3", "c4", "c5"].iter().map(|h| cluster("team-a", h)).collect();
    assert!(
        proxy.wait_for(TIMEOUT, has(&fine)).await,
        "the accepted clusters arrive: {:?}",
        proxy.state().types.get(&TypeUrl::Cluster)
    );
    let state = proxy.state();
    assert!(!state.types[&TypeUrl::Cluster].acked_names.contains(&cluster("team-a", "bad")));

    // Reported in /debug/syncz and the metric.
    let syncz = admin_json(server.admin, "/debug/syncz").await;
    let rejected = &syncz[0]["types"]["Cluster"]["rejected"];
    assert!(rejected.get(cluster("team-a", "bad")).is_some(), "{syncz}");
    assert_eq!(rejected.as_object().map(|o| o.len()), Some(1), "only the bad cluster is set aside: {syncz}");
    let metrics = reqwest::Client::builder().no_proxy().build().unwrap();
    let text = metrics.get(format!("http://{}/metrics", server.admin)).send().await.unwrap().text().await.unwrap();
    assert!(text.contains("meshpilot_xds_rejected_resources{type=\"cds\"} 1"), "{text}");

    // A later change still reaches the proxy, the bad cluster still held out.
    write_atomic(dir.path(), "b.yaml", &services("team-a", &["later"]).replace("10.1.0.1", "10.2.0.1"));
    assert!(proxy.wait_for(TIMEOUT, has(&[cluster("team-a", "later")])).await, "a later change is blocked");
    assert!(!proxy.state().types[&TypeUrl::Cluster].acked_names.contains(&cluster("team-a", "bad")));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_the_nack_names_is_set_aside_and_the_rest_is_served() {
    one_rejected_cluster_is_set_aside(true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_the_nack_does_not_name_is_found_by_bisection() {
    one_rejected_cluster_is_set_aside(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_that_is_not_an_istio_proxy_is_refused_with_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    write_atomic(dir.path(), "a.yaml", &service("team-a", 80, &["10.0.0.1"]));
    let server = Server::start(dir.path());
    let mut spec = SimProxySpec::sidecar(&server.url(), "team-a", "app", "10.9.0.1");
    spec.node_id = "just-an-envoy".into();
    let proxy = server.connect(spec).await;
    assert!(proxy.wait_for(TIMEOUT, |s| !s.connected).await);
    let error = proxy.state().error.clone().unwrap_or_default();
    assert!(error.contains("TYPE~IP~POD.NAMESPACE"), "{error}");
    // The server keeps serving others.
    let ok = server.connect(SimProxySpec::sidecar(&server.url(), "team-a", "app", "10.9.0.2")).await;
    assert!(ok.wait_for(TIMEOUT, |s| s.types.len() == 4).await);
}
