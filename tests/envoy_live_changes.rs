//! Config edits while meshpilot and a gateway Envoy (1.40) run: weights, new routes, deleted
//! services, new endpoints (EDS-only), broken edits, and `meshpilot validate`.
//!
//! Edits are atomic (temp file + rename) except in `new_files_written_in_place_add_routes`, which
//! writes the way users do and only polls for the final outcome. Nothing is restarted: each test
//! checks the meshpilot and Envoy processes it started are the same ones at the end.

use crate::common;

use std::path::Path;
use std::process::Command;

use common::backend::Backend;
use common::config_dump::*;
use common::envoy::Envoy;
use common::files::{temp_dir_with, write_atomic, write_in_place};
use common::ingress::Ingress;
use common::istio::*;
use common::mesh::*;
use common::meshpilot::Meshpilot;
use common::poll::CONVERGE_TIMEOUT;
use common::ports::free_port;
use serde_json::Value;

/// The host the gateway VirtualServices serve.
const HOST: &str = "shop.example.com";

/// One meshpilot, one gateway Envoy, and a client for the gateway listener.
struct Live {
    port: u16,
    config: tempfile::TempDir,
    cp: Meshpilot,
    envoy: Envoy,
    ingress: Ingress,
    pids: (Option<u32>, Option<u32>),
}

impl Live {
    /// Writes `files` (atomically) plus `gateway.yaml` into a fresh config dir, starts meshpilot
    /// and the gateway Envoy (ready, nothing rejected).
    async fn start(files: &[(&str, String)]) -> Live {
        let port = free_port();
        let config = temp_dir_with(&[]);
        write_atomic(config.path(), "gateway.yaml", &gateway(port));
        for (name, text) in files {
            write_atomic(config.path(), name, text);
        }
        let cp = start_meshpilot(config.path()).await;
        let envoy = start_gateway(&cp).await;
        let pids = (cp.pid(), envoy.pid());
        Live { port, config, cp, envoy, ingress: Ingress::new(port, HOST), pids }
    }

    fn dir(&self) -> &Path {
        self.config.path()
    }

    /// Asserts nothing was restarted and Envoy rejected nothing.
    async fn assert_same_processes_no_rejections(&self) {
        assert!(self.cp.is_running(), "meshpilot exited");
        assert!(self.envoy.is_running(), "Envoy exited");
        assert_eq!((self.cp.pid(), self.envoy.pid()), self.pids, "a process was restarted");
        assert_no_rejections(&self.envoy).await;
    }

    /// Versions (CDS, LDS, RDS `http.PORT`) Envoy last accepted.
    async fn envoy_versions(&self) -> (String, String, String) {
        xds_versions(&self.envoy.config_dump().await, &format!("http.{}", self.port))
    }
}

/// A VirtualService `NAME` for `hosts` bound to `gateways`, with `http` (YAML list items as under
/// `spec.http`, starting with `- `; indented freely).
fn vs(name: &str, hosts: &str, gateways: &str, http: &str) -> String {
    format!(
        "apiVersion: networking.istio.io/v1\nkind: VirtualService\nmetadata:\n  name: {name}\n  namespace: shop\nspec:\n  \
         hosts: [{hosts}]\n  gateways: [{gateways}]\n  http:\n{}",
        dedent(http)
            .lines()
            .map(|l| if l.is_empty() { String::new() } else { format!("  {l}") })
            .collect::<Vec<_>>()
            .join("\n")
            + "\n"
    )
}

/// reviews split between subsets v1 and v2 with the given weights.
fn weighted_vs(w1: i64, w2: i64) -> String {
    vs(
        "shop",
        HOST,
        "shop/gw",
        &format!(
            "- name: split\n  route:\n  - destination: {{host: reviews, subset: v1}}\n    weight: {w1}\n  \
             - destination: {{host: reviews, subset: v2}}\n    weight: {w2}\n"
        ),
    )
}

fn reviews_v1_v2(v1: &Backend, v2: &Backend) -> String {
    documents(&[
        service_entry("reviews", 80, &[(v1, "v1"), (v2, "v2")]),
        destination_rule("reviews", &["v1", "v2"], None),
    ])
}

#[tokio::test]
async fn weight_edit_moves_traffic() {
    let v1 = Backend::new("reviews-v1");
    let v2 = Backend::new("reviews-v2");
    let live = Live::start(&[("services.yaml", reviews_v1_v2(&v1, &v2)), ("routes.yaml", weighted_vs(100, 0))]).await;
    live.ingress.wait_all_from("/", &[], "reviews-v1", 20).await;
    let (_, _, rds_before) = live.envoy_versions().await;

    write_atomic(live.dir(), "routes.yaml", &weighted_vs(0, 100));
    live.ingress.wait_all_from("/", &[], "reviews-v2", 20).await;
    let (_, _, rds_after) = live.envoy_versions().await;
    assert_ne!(rds_before, rds_after, "the route configuration was updated in place");

    // And back.
    write_atomic(live.dir(), "routes.yaml", &weighted_vs(100, 0));
    live.ingress.wait_all_from("/", &[], "reviews-v1", 20).await;
    live.assert_same_processes_no_rejections().await;
}

#[tokio::test]
async fn new_files_written_in_place_add_routes() {
    let reviews = Backend::new("reviews-v1");
    let ratings = Backend::new("ratings-v1");
    let services = documents(&[
        service_entry("reviews", 80, &[(&reviews, "v1")]),
        service_entry("ratings", 80, &[(&ratings, "v1")]),
    ]);
    let routes = vs(
        "shop",
        HOST,
        "shop/gw",
        "- match:\n  - uri: {prefix: /reviews}\n  route:\n  - destination: {host: reviews}\n",
    );
    let live = Live::start(&[("services.yaml", services), ("routes.yaml", routes)]).await;
    let gw = &live.ingress;
    gw.wait_backend("/reviews/1", &[], "reviews-v1").await;
    assert_eq!(gw.get("/ratings/1", &[]).await.status, 404);
    let catalog = gw.with_host("catalog.example.com");
    assert_eq!(catalog.get("/", &[]).await.status, 404);

    // A new file with a VirtualService for a new host (gateway named without namespace).
    write_in_place(
        live.dir(),
        "catalog.yaml",
        &vs("catalog", "catalog.example.com", "gw", "- route:\n  - destination: {host: ratings}\n"),
    );
    catalog.wait_all_from("/anything", &[], "ratings-v1", 10).await;

    // A new file with a VirtualService adding a prefix to the existing host (merged on the gateway).
    write_in_place(
        live.dir(),
        "more-routes.yaml",
        &vs(
            "shop-ratings",
            HOST,
            "shop/gw",
            "- match:\n  - uri: {prefix: /ratings}\n  route:\n  - destination: {host: ratings}\n",
        ),
    );
    gw.wait_all_from("/ratings/1", &[], "ratings-v1", 10).await;
    assert_eq!(gw.backend("/reviews/1", &[]).await, "reviews-v1", "existing routes stay");

    // An in-place edit of an existing file: /reviews now goes to ratings too.
    write_in_place(
        live.dir(),
        "routes.yaml",
        &vs(
            "shop",
            HOST,
            "shop/gw",
            "- match:\n  - uri: {prefix: /reviews}\n  route:\n  - destination: {host: ratings}\n",
        ),
    );
    gw.wait_all_from("/reviews/1", &[], "ratings-v1", 10).await;
    live.assert_same_processes_no_rejections().await;
    let configz = live.cp.admin_json("/debug/configz").await;
    assert_eq!(configz["errors"], Value::Array(vec![]), "final state has no errors: {:#}", configz["errors"]);
}

#[tokio::test]
async fn deleting_a_service_entry_removes_its_cluster() {
    let reviews = Backend::new("reviews-v1");
    let ratings = Backend::new("ratings-v1");
    let routes = vs(
        "shop",
        HOST,
        "shop/gw",
        r#"
        - match:
          - uri: {prefix: /ratings}
          route:
          - destination: {host: ratings}
        - match:
          - uri: {prefix: /reviews}
          route:
          - destination: {host: reviews}
        "#,
    );
    let live = Live::start(&[
        ("reviews.yaml", service_entry("reviews", 80, &[(&reviews, "v1")])),
        ("ratings.yaml", service_entry("ratings", 80, &[(&ratings, "v1")])),
        ("routes.yaml", routes),
    ])
    .await;
    let gw = &live.ingress;
    gw.wait_backend("/ratings/1", &[], "ratings-v1").await;
    let ratings_cluster = cluster_name(80, "", "ratings");
    assert!(dynamic_cluster_names(&live.envoy.config_dump().await).contains(&ratings_cluster));

    std::fs::remove_file(live.dir().join("ratings.yaml")).unwrap();
    let mut last = Vec::new();
    let gone = live
        .envoy
        .wait_for(CONVERGE_TIMEOUT, async |e| {
            last = dynamic_cluster_names(&e.config_dump().await);
            !last.contains(&ratings_cluster)
        })
        .await;
    assert!(gone, "{ratings_cluster} still in Envoy's clusters after deleting ratings.yaml: {last:?}");
    gw.wait_answer("/ratings/1", &[], "404 or 503", |r| matches!(r.status, 404 | 503)).await;
    ratings.reset_requests();
    for i in 0..10 {
        let r = gw.get(&format!("/ratings/{i}"), &[]).await;
        assert!(matches!(r.status, 404 | 503), "request to a deleted service answered: {r:?}");
    }
    assert_eq!(ratings.requests(), 0, "the deleted service's backend still gets traffic");
    assert_eq!(gw.backend("/reviews/1", &[]).await, "reviews-v1", "other services are unaffected");
    assert!(dynamic_cluster_names(&live.envoy.config_dump().await).contains(&cluster_name(80, "", "reviews")));
    let registry = live.cp.admin_json("/debug/registryz").await;
    assert!(!registry.to_string().contains(&fqdn("ratings")), "registryz still lists ratings: {registry:#}");
    live.assert_same_processes_no_rejections().await;
}

#[tokio::test]
async fn new_workload_entry_is_an_eds_only_push() {
    let r1 = Backend::new("reviews-1");
    let r2 = Backend::new("reviews-2");
    let routes = vs("shop", HOST, "shop/gw", "- route:\n  - destination: {host: reviews}\n");
    let live = Live::start(&[
        ("reviews.yaml", service_entry_selecting("reviews", 80)),
        ("reviews-1.yaml", workload_entry("reviews-1", "reviews", "v1", &r1)),
        ("routes.yaml", routes),
    ])
    .await;
    let gw = &live.ingress;
    gw.wait_all_from("/", &[], "reviews-1", 10).await;
    let cluster = cluster_name(80, "", "reviews");
    assert_eq!(endpoint_ports(&live.envoy.config_dump().await, &cluster), Some(vec![u64::from(r1.port())]));
    let (cds_before, lds_before, rds_before) = live.envoy_versions().await;
    let before = live.cp.admin_json("/debug/push_status").await;

    write_atomic(live.dir(), "reviews-2.yaml", &workload_entry("reviews-2", "reviews", "v1", &r2));
    gw.wait_backend("/", &[], "reviews-2").await;
    let mut both = vec![u64::from(r1.port()), u64::from(r2.port())];
    both.sort();
    assert_eq!(endpoint_ports(&live.envoy.config_dump().await, &cluster), Some(both));
    // Both endpoints take traffic now.
    r1.reset_requests();
    r2.reset_requests();
    for i in 0..40 {
        gw.backend(&format!("/{i}"), &[]).await;
    }
    assert!(r1.requests() > 0 && r2.requests() > 0, "r1 {} r2 {}", r1.requests(), r2.requests());

    let push = live.cp.admin_json("/debug/push_status").await;
    assert_ne!(push["version"], before["version"], "a new snapshot was pushed: {push:#}");
    assert_eq!(push["endpoints_only"], true, "adding a WorkloadEntry is an endpoints-only push: {push:#}");
    assert_eq!(push["full"], false, "{push:#}");
    assert!(push["changed"].to_string().contains(&fqdn("reviews")), "changed names reviews: {push:#}");
    // Only EDS reached Envoy: clusters, listeners and routes were not re-sent.
    assert_eq!(live.envoy_versions().await, (cds_before, lds_before, rds_before));
    live.assert_same_processes_no_rejections().await;
}

/// The `/debug/configz` errors about files whose name ends with `file`.
fn errors_for(configz: &Value, file: &str) -> Vec<Value> {
    configz["errors"]
        .as_array()
        .map(|a| a.iter().filter(|e| e["file"].as_str().is_some_and(|f| f.ends_with(file))).cloned().collect())
        .unwrap_or_default()
}

/// Polls `/debug/configz` until it reports errors for `file`; returns them.
async fn wait_errors_for(cp: &Meshpilot, file: &str) -> Vec<Value> {
    let mut last = Value::Null;
    let ok = cp
        .wait_for(CONVERGE_TIMEOUT, async |cp| {
            last = cp.admin_json("/debug/configz").await;
            !errors_for(&last, file).is_empty()
        })
        .await;
    assert!(ok, "no error reported for {file} within {CONVERGE_TIMEOUT:?}; configz errors: {:#}", last["errors"]);
    errors_for(&last, file)
}

/// Polls `/debug/configz` until it reports no error; panics naming `after` otherwise.
async fn wait_errors_cleared(cp: &Meshpilot, after: &str) {
    let mut last = Value::Null;
    let cleared = cp
        .wait_for(CONVERGE_TIMEOUT, async |cp| {
            last = cp.admin_json("/debug/configz").await;
            last["errors"].as_array().is_some_and(|a| a.is_empty())
        })
        .await;
    assert!(cleared, "errors not cleared after {after}: {:#}", last["errors"]);
}

/// The served VirtualService `shop/shop` from `/debug/configz`.
fn served_vs(configz: &Value) -> Value {
    configz["configs"]
        .as_array()
        .and_then(|a| {
            a.iter().find(|c| c["kind"] == "VirtualService" && c["namespace"] == "shop" && c["name"] == "shop")
        })
        .cloned()
        .unwrap_or_else(|| panic!("VirtualService shop/shop not served: {configz:#}"))
}

#[tokio::test]
async fn broken_edits_are_reported_and_the_last_good_config_kept() {
    let v1 = Backend::new("reviews-v1");
    let v2 = Backend::new("reviews-v2");
    // routes.yaml: document 1 the DestinationRule, document 2 the VirtualService.
    let routes = |vs_text: &str| documents(&[destination_rule("reviews", &["v1", "v2"], None), vs_text.to_string()]);
    let live = Live::start(&[
        ("services.yaml", service_entry("reviews", 80, &[(&v1, "v1"), (&v2, "v2")])),
        ("routes.yaml", routes(&weighted_vs(100, 0))),
    ])
    .await;
    let gw = &live.ingress;
    gw.wait_all_from("/", &[], "reviews-v1", 20).await;
    let configz = live.cp.admin_json("/debug/configz").await;
    assert_eq!(configz["errors"], Value::Array(vec![]), "{:#}", configz["errors"]);
    let good_spec = served_vs(&configz)["spec"].clone();
    let versions = live.envoy_versions().await;

    // 1. Invalid value: weight -1 (would send everything to v2 if it were accepted).
    write_atomic(live.dir(), "routes.yaml", &routes(&weighted_vs(-1, 100)));
    let errors = wait_errors_for(&live.cp, "routes.yaml").await;
    assert_eq!(errors.len(), 1, "{errors:#?}");
    let e = &errors[0];
    assert!(e["file"].as_str().unwrap().ends_with("routes.yaml"), "{e:#}");
    assert_eq!(e["document"], 2, "{e:#}");
    assert_eq!(
        (e["kind"].as_str(), e["namespace"].as_str(), e["name"].as_str()),
        (Some("VirtualService"), Some("shop"), Some("shop")),
        "{e:#}"
    );
    assert_eq!(e["field"], "spec.http[0].route[0].weight", "{e:#}");
    assert!(!e["reason"].as_str().unwrap_or_default().is_empty(), "{e:#}");
    let configz = live.cp.admin_json("/debug/configz").await;
    assert_eq!(served_vs(&configz)["spec"], good_spec, "the last valid VirtualService keeps being served");
    for _ in 0..20 {
        assert_eq!(gw.backend("/", &[]).await, "reviews-v1", "the broken edit must not reach Envoy");
    }
    assert_eq!(live.envoy_versions().await, versions, "Envoy got no new config from a rejected edit");

    // 2. Fixing the file applies the fix.
    write_atomic(live.dir(), "routes.yaml", &routes(&weighted_vs(0, 100)));
    gw.wait_all_from("/", &[], "reviews-v2", 20).await;
    wait_errors_cleared(&live.cp, "the fix").await;
    let versions = live.envoy_versions().await;

    // 3. YAML syntax error in the VirtualService document.
    let broken = routes(&weighted_vs(100, 0)).replace("hosts: [shop.example.com]", "hosts: [shop.example.com");
    write_atomic(live.dir(), "routes.yaml", &broken);
    let errors = wait_errors_for(&live.cp, "routes.yaml").await;
    assert_eq!(errors.len(), 1, "{errors:#?}");
    assert_eq!(errors[0]["document"], 2, "{:#}", errors[0]);
    assert!(!errors[0]["reason"].as_str().unwrap_or_default().is_empty(), "{:#}", errors[0]);
    for _ in 0..20 {
        assert_eq!(gw.backend("/", &[]).await, "reviews-v2", "a file that does not parse keeps its last objects");
    }
    assert_eq!(live.envoy_versions().await, versions, "Envoy got no new config from a syntax error");

    // 4. Fixed again.
    write_atomic(live.dir(), "routes.yaml", &routes(&weighted_vs(100, 0)));
    gw.wait_all_from("/", &[], "reviews-v1", 20).await;
    wait_errors_cleared(&live.cp, "the second fix").await;
    live.assert_same_processes_no_rejections().await;
}

/// Runs `meshpilot validate -f PATH`; returns (exit code, stdout + stderr).
fn validate(path: &Path) -> (Option<i32>, String) {
    let out = Command::new(Meshpilot::binary())
        .arg("validate")
        .arg("-f")
        .arg(path)
        .env("NO_COLOR", "1")
        .output()
        .expect("run meshpilot validate");
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    (out.status.code(), text)
}

#[tokio::test]
async fn validate_command_reports_broken_files() {
    let bookinfo = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/bookinfo");
    let (code, out) = validate(&bookinfo);
    assert_eq!(code, Some(0), "examples/bookinfo must validate:\n{out}");

    let backend = Backend::new("reviews-v1");
    let bad_vs = vs(
        "bad-weights",
        "reviews.shop.svc.cluster.local",
        "mesh",
        "- route:\n  - destination: {host: reviews, subset: v1}\n    weight: -1\n  - destination: {host: reviews, subset: v2}\n    weight: 100\n",
    );
    let dir = temp_dir_with(&[]);
    write_atomic(dir.path(), "good.yaml", &service_entry("reviews", 80, &[(&backend, "v1")]));
    write_atomic(dir.path(), "broken.yaml", &documents(&[destination_rule("reviews", &["v1", "v2"], None), bad_vs]));
    let (code, out) = validate(dir.path());
    assert_ne!(code, Some(0), "a broken file must fail validation:\n{out}");
    assert!(code.is_some(), "validate was killed:\n{out}");
    let line =
        out.lines().find(|l| l.contains("broken.yaml")).unwrap_or_else(|| panic!("no line names broken.yaml:\n{out}"));
    for want in ["document 2", "VirtualService", "shop/bad-weights", "spec.http[0].route[0].weight"] {
        assert!(line.contains(want), "error line lacks {want:?}: {line}\nfull output:\n{out}");
    }
    assert!(!out.lines().any(|l| l.contains("good.yaml") && l.contains("error")), "good.yaml reported:\n{out}");

    // A YAML syntax error fails too, naming file and document.
    let dir = temp_dir_with(&[]);
    write_atomic(
        dir.path(),
        "syntax.yaml",
        "apiVersion: networking.istio.io/v1\nkind: VirtualService\nmetadata: {name: x\n",
    );
    let (code, out) = validate(dir.path());
    assert!(matches!(code, Some(c) if c != 0), "a syntax error must fail validation:\n{out}");
    let line =
        out.lines().find(|l| l.contains("syntax.yaml")).unwrap_or_else(|| panic!("no line names syntax.yaml:\n{out}"));
    assert!(line.contains("document 1"), "{line}");
}
