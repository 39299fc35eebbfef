//! What an operator debugs with: meshpilot's `/debug/config_dump` in Envoy's own format, checked
//! against real Envoys' `/config_dump`.

mod common;

use common::backend::Backend;
use common::config_dump::*;
use common::files::temp_dir_with;
use common::istio::*;
use common::mesh::*;
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
}
