//! What an operator debugs with: meshpilot's `/debug/config_dump` in Envoy's own format, checked
//! against real Envoys' `/config_dump`.

use crate::common;

use common::backend::Backend;
use common::config_dump::*;
use common::envoy::{port_holder, Envoy};
use common::files::{temp_dir_with, write_files};
use common::istio::*;
use common::mesh::*;
use common::meshpilot::{operator_command, Meshpilot};
use common::poll::{poll, CONVERGE_TIMEOUT, STARTUP_TIMEOUT};
use common::ports::free_port;
use serde_json::Value;

/// Clusters, listeners and routes of `dump`: Envoy dumps them exactly as it received them.
/// (Its endpoint section is its own reconstruction, with health status and defaults filled in;
/// endpoints are compared by address instead.)
fn comparable(dump: &Value) -> Value {
    let mut resources = dynamic_resources(dump);
    if let Some(all) = resources.as_object_mut() {
        all.remove("endpoints");
    }
    resources
}

/// The clusters of `dump` whose endpoints come over EDS.
fn eds_clusters(dump: &Value) -> Vec<String> {
    let resources = dynamic_resources(dump);
    let clusters = resources["clusters"].as_array().cloned().unwrap_or_default();
    clusters.iter().filter(|c| c["type"] == "EDS").filter_map(|c| c["name"].as_str().map(str::to_string)).collect()
}

#[tokio::test]
async fn config_dump_equals_what_envoy_holds() {
    let reviews_v1 = Backend::new("reviews-v1");
    let reviews_v2 = Backend::new("reviews-v2");
    let port = free_port();
    let mesh = documents(&[
        service_entry("reviews", 80, &[(&reviews_v1, "v1"), (&reviews_v2, "v2")]),
        destination_rule("reviews", &["v1", "v2"], Some("{loadBalancer: {simple: LEAST_REQUEST}}")),
        reviews_alice_to_v2(),
        gateway(port),
    ]);
    let config = temp_dir_with(&[("mesh.yaml", mesh.as_str())]);
    let cp = start_meshpilot(config.path()).await;
    let gateway = start_gateway(&cp).await;
    let sidecar = start_sidecar(&cp).await;
    wait_synced(&cp, &[GATEWAY_NODE_ID, SIDECAR_NODE_ID]).await;

    for (envoy, node_id) in [(&gateway, GATEWAY_NODE_ID), (&sidecar, SIDECAR_NODE_ID)] {
        let ours = cp.admin_json(&format!("/debug/config_dump?proxyID={node_id}")).await;
        let theirs = envoy.config_dump().await;
        let eds = eds_clusters(&theirs);
        assert!(!eds.is_empty(), "{node_id} holds no EDS cluster");
        for cluster in &eds {
            assert_eq!(
                endpoint_addresses(&ours, cluster),
                endpoint_addresses(&theirs, cluster),
                "{node_id}: {cluster}"
            );
        }
        let (ours, theirs) = (comparable(&ours), comparable(&theirs));
        for part in ["clusters", "listeners", "routes"] {
            let held = theirs[part].as_array().map_or(0, Vec::len);
            assert!(held > 0, "{node_id} holds no {part}");
        }
        let mut diffs = Vec::new();
        json_diff(&ours, &theirs, "", &mut diffs, 30);
        assert!(
            diffs.is_empty(),
            "{node_id}: /debug/config_dump differs from Envoy's /config_dump:\n{}",
            diffs.join("\n")
        );
    }

    // Sections and versions as Envoy writes them: the version the proxy acknowledged.
    let ours = cp.admin_json(&format!("/debug/config_dump?proxyID={SIDECAR_NODE_ID}")).await;
    let theirs = sidecar.config_dump().await;
    for section in ["ClustersConfigDump", "ListenersConfigDump"] {
        let version = |d: &Value| dump_section(d, section).map(|s| s["version_info"].clone());
        assert_eq!(version(&ours), version(&theirs), "{section} version_info");
    }
    let updated =
        &dump_section(&ours, "ClustersConfigDump").expect("clusters")["dynamic_active_clusters"][0]["last_updated"];
    assert!(updated.as_str().is_some_and(|t| t.ends_with('Z')), "last_updated is an RFC 3339 time: {updated}");
}

#[tokio::test]
async fn config_dump_of_unknown_proxies_and_bad_requests_are_clear_errors() {
    let config = temp_dir_with(&[("mesh.yaml", gateway(free_port()).as_str())]);
    let cp = start_meshpilot(config.path()).await;
    let (code, body) = cp.admin_get("/debug/config_dump").await;
    assert_eq!(code, 400, "{body}");
    assert!(body.contains("proxyID"), "{body}");
    let (code, body) = cp.admin_get("/debug/config_dump?proxyID=nobody.nowhere").await;
    assert_eq!(code, 404, "{body}");
    assert!(body.contains("nobody.nowhere is not connected"), "{body}");

    // The commands: an unknown proxy, a type that does not exist, a node that does not answer.
    let (ok, _, err) = operator_command(&cp, &["proxy-config", "clusters", "nobody.nowhere"]).await;
    assert!(!ok && err.contains("nobody.nowhere is not connected"), "{err}");
    let (ok, _, err) = operator_command(&cp, &["proxy-config", "filters", "nobody.nowhere"]).await;
    assert!(!ok && err.contains("invalid value 'filters'") && err.contains("clusters"), "{err}");
    let (ok, _, err) = operator_command(&cp, &["proxy-config", "clusters", "x.y", "-o", "xml"]).await;
    assert!(!ok && err.contains("invalid value 'xml'"), "{err}");
    let mut command = std::process::Command::new(Meshpilot::binary());
    command.args(["proxy-status", "--admin-url", &format!("http://127.0.0.1:{}", free_port())]);
    let out = tokio::task::spawn_blocking(move || command.output()).await.expect("joined").expect("runs");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("127.0.0.1"), "an unreachable node is named: {err}");
}

/// `meshpilot proxy-status ARGS`.
async fn proxy_status(cp: &Meshpilot, args: &[&str]) -> (bool, String, String) {
    operator_command(cp, &[&["proxy-status"], args].concat()).await
}

/// The states `meshpilot proxy-status` shows for `node_id`: CDS, LDS, EDS, RDS, FRONTEND, VERSION.
async fn status_line(cp: &Meshpilot, node_id: &str) -> String {
    let (ok, out, err) = proxy_status(cp, &[]).await;
    assert!(ok, "meshpilot proxy-status failed:\n{out}\n{err}");
    out.lines().find(|l| l.starts_with(node_id)).map(str::to_string).unwrap_or_default()
}

fn gateway_with_servers(ports: &[u16]) -> String {
    let servers: String = ports
        .iter()
        .map(|p| format!("  - port: {{number: {p}, name: http-{p}, protocol: HTTP}}\n    hosts: [\"*\"]\n"))
        .collect();
    format!(
        "apiVersion: networking.istio.io/v1\nkind: Gateway\nmetadata:\n  name: gw\n  namespace: shop\nspec:\n  \
         selector:\n    istio: ingressgateway\n  servers:\n{servers}"
    )
}

#[tokio::test]
async fn proxy_status_shows_synced_then_stale_then_nack() {
    let (good, bad) = (free_port(), free_port());
    let ratings = Backend::new("ratings-v1");
    let config = temp_dir_with(&[
        ("services.yaml", service_entry("ratings", 80, &[(&ratings, "v1")]).as_str()),
        ("gateway.yaml", gateway_with_servers(&[good]).as_str()),
    ]);
    let cp = start_meshpilot(config.path()).await;
    // A static listener holds `bad`: a gateway server there is a listener Envoy must reject.
    let blocker = port_holder(bad);
    let envoy =
        Envoy::builder(GATEWAY_NODE_ID, cp.xds_addr()).metadata(gateway_metadata()).static_listener(blocker).start();
    envoy.wait_ready(STARTUP_TIMEOUT).await;
    wait_synced(&cp, &[GATEWAY_NODE_ID]).await;

    let line = status_line(&cp, GATEWAY_NODE_ID).await;
    let cells: Vec<&str> = line.split_whitespace().collect();
    assert_eq!(cells.get(1..6), Some(&["SYNCED", "SYNCED", "SYNCED", "SYNCED", "standalone"][..]), "{line}");
    let version = cp.admin_json("/debug/push_status").await["version"].as_str().unwrap_or_default().to_string();
    assert_eq!(cells.last(), Some(&version.as_str()), "{line}");
    let (ok, one, _) = proxy_status(&cp, &["gw-1.istio-system"]).await;
    assert!(ok && one.lines().count() == 2 && one.contains(GATEWAY_NODE_ID), "one proxy by pod.namespace:\n{one}");
    let (ok, _, err) = proxy_status(&cp, &["nobody.nowhere"]).await;
    assert!(!ok && err.contains("nobody.nowhere is not connected"), "unknown proxy: {err}");

    // Frozen, Envoy cannot acknowledge what meshpilot sends next.
    let pid = envoy.pid().expect("Envoy runs") as i32;
    // SAFETY: signals a child process this test started.
    unsafe { libc::kill(pid, libc::SIGSTOP) };
    write_files(
        config.path(),
        &[("vs.yaml", route_all("shop", "ratings.example.com", "gw", "ratings", None).as_str())],
    );
    let stale = poll(CONVERGE_TIMEOUT, async || status_line(&cp, GATEWAY_NODE_ID).await.contains("STALE")).await;
    let line = status_line(&cp, GATEWAY_NODE_ID).await;
    // SAFETY: as above.
    unsafe { libc::kill(pid, libc::SIGCONT) };
    assert!(stale, "a frozen proxy is not shown STALE: {line}");
    wait_synced(&cp, &[GATEWAY_NODE_ID]).await;

    // A listener Envoy rejects: LDS shows the NACK with Envoy's error.
    write_files(config.path(), &[("gateway.yaml", gateway_with_servers(&[good, bad]).as_str())]);
    let nacked = poll(CONVERGE_TIMEOUT, async || status_line(&cp, GATEWAY_NODE_ID).await.contains("NACK (")).await;
    let line = status_line(&cp, GATEWAY_NODE_ID).await;
    assert!(nacked, "the rejected push is not shown as NACK: {line}");
    let lds = line.split("     ").nth(2).unwrap_or_default();
    assert!(lds.starts_with("NACK (") && lds.contains(&format!("0.0.0.0_{bad}")), "LDS shows Envoy's error: {line}");
}

/// `meshpilot config diff ARGS`.
async fn config_diff(cp: &Meshpilot, args: &[&str]) -> (bool, String, String) {
    operator_command(cp, &[&["config", "diff"], args].concat()).await
}

#[tokio::test]
async fn config_diff_shows_what_an_edit_changed_for_a_proxy() {
    let (v1, v2) = (Backend::new("reviews-v1"), Backend::new("reviews-v2"));
    let config = temp_dir_with(&[
        ("reviews.yaml", service_entry("reviews", 80, &[(&v1, "v1"), (&v2, "v2")]).as_str()),
        ("dr.yaml", destination_rule("reviews", &["v1", "v2"], None).as_str()),
    ]);
    let cp = start_meshpilot(config.path()).await;
    let sidecar = start_sidecar(&cp).await;
    wait_synced(&cp, &[SIDECAR_NODE_ID]).await;
    let before = cp.admin_json("/debug/push_status").await["version"].as_str().unwrap_or_default().to_string();

    // The DestinationRule drops subset v2 and sets a load balancer.
    write_files(
        config.path(),
        &[("dr.yaml", destination_rule("reviews", &["v1"], Some("{loadBalancer: {simple: RANDOM}}")).as_str())],
    );
    let moved = poll(CONVERGE_TIMEOUT, async || {
        cp.admin_json("/debug/push_status").await["version"].as_str().is_some_and(|v| v != before)
    })
    .await;
    assert!(moved, "no new snapshot after the edit");
    wait_synced(&cp, &[SIDECAR_NODE_ID]).await;
    let after = cp.admin_json("/debug/push_status").await["version"].as_str().unwrap_or_default().to_string();

    let (ok, out, err) = config_diff(&cp, &["--proxy", "client-1.shop", "--from", &before, "--to", &after]).await;
    assert!(ok, "config diff failed:\n{out}\n{err}");
    assert!(out.starts_with(&format!("{SIDECAR_NODE_ID}: {before} -> {after}")), "{out}");
    let v2_cluster = cluster_name(80, "v2", "reviews");
    assert!(
        out.lines().any(|l| l.split_whitespace().collect::<Vec<_>>() == ["removed", "CDS", v2_cluster.as_str()]),
        "{out}"
    );
    let v1_cluster = cluster_name(80, "v1", "reviews");
    assert!(
        out.lines().any(|l| l.split_whitespace().collect::<Vec<_>>() == ["changed", "CDS", v1_cluster.as_str()]),
        "{out}"
    );
    assert!(out.contains(".lb_policy: \"LEAST_REQUEST\" -> \"RANDOM\""), "the changed field is named: {out}");
    // The same, as the Istio objects; and the defaults are the last two snapshots.
    let (ok, out, _) = config_diff(&cp, &[]).await;
    assert!(ok && out.contains("changed  DestinationRule shop/reviews"), "{out}");
    drop(sidecar);

    // Bad input: clear errors.
    let (ok, _, err) = config_diff(&cp, &["--from", "yesterday"]).await;
    assert!(!ok && err.contains("TERM.SEQ"), "{err}");
    let (ok, _, err) = config_diff(&cp, &["--from", "9.99"]).await;
    assert!(!ok && err.contains("snapshot 9.99 is not held here"), "{err}");
    let (ok, _, err) = config_diff(&cp, &["--proxy", "nobody.nowhere"]).await;
    assert!(!ok && err.contains("nobody.nowhere is not connected"), "{err}");
}
