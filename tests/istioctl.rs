//! Istio's own `istioctl` against meshpilot: `proxy-status --xds-address` asks meshpilot's ADS
//! port for Istio's debug types (`istio.io/debug/syncz`, `istio.io/debug/config_dump`), as it
//! asks istiod.

use crate::common;

use common::backend::Backend;
use common::files::temp_dir_with;
use common::istio::*;
use common::istioctl::{istioctl, istioctl_xds};
use common::mesh::*;
use common::ports::free_port;

#[tokio::test]
async fn proxy_status_lists_meshpilots_proxies_as_synced() {
    let Some(istioctl) = istioctl() else { return };
    let reviews = Backend::new("reviews-v1");
    let mesh = documents(&[service_entry("reviews", 80, &[(&reviews, "v1")]), gateway(free_port())]);
    let config = temp_dir_with(&[("mesh.yaml", mesh.as_str())]);
    let cp = start_meshpilot(config.path()).await;
    let _gateway = start_gateway(&cp).await;
    let _sidecar = start_sidecar(&cp).await;
    wait_synced(&cp, &[GATEWAY_NODE_ID, SIDECAR_NODE_ID]).await;

    let xds = cp.xds_addr();
    let binary = istioctl.clone();
    let (ok, out, err) =
        tokio::task::spawn_blocking(move || istioctl_xds(&binary, xds, &["proxy-status"])).await.expect("istioctl ran");
    assert!(ok, "istioctl proxy-status failed:\n{out}\n{err}");
    for node_id in [GATEWAY_NODE_ID, SIDECAR_NODE_ID] {
        let line =
            out.lines().find(|l| l.starts_with(node_id)).unwrap_or_else(|| panic!("{node_id} not listed:\n{out}"));
        assert!(line.contains("4 (CDS,LDS,EDS,RDS)"), "{node_id} subscribed to the four types:\n{out}");
    }

    // The experimental command asks the same debug type.
    let binary = istioctl.clone();
    let (ok, out, err) = tokio::task::spawn_blocking(move || istioctl_xds(&binary, xds, &["x", "proxy-status"]))
        .await
        .expect("istioctl ran");
    assert!(ok, "istioctl x proxy-status failed:\n{out}\n{err}");
    for node_id in [GATEWAY_NODE_ID, SIDECAR_NODE_ID] {
        assert!(out.lines().any(|l| l.starts_with(node_id)), "x proxy-status does not list {node_id}:\n{out}");
    }

    // Verbose: a column per type, each SYNCED.
    let (ok, out, err) =
        tokio::task::spawn_blocking(move || istioctl_xds(&istioctl, xds, &["proxy-status", "--verbosity", "1"]))
            .await
            .expect("istioctl ran");
    assert!(ok, "istioctl proxy-status --verbosity 1 failed:\n{out}\n{err}");
    let header = out.lines().next().unwrap_or_default();
    for column in ["NAME", "CDS", "LDS", "EDS", "RDS", "ISTIOD"] {
        assert!(header.contains(column), "no {column} column:\n{out}");
    }
    for node_id in [GATEWAY_NODE_ID, SIDECAR_NODE_ID] {
        let line =
            out.lines().find(|l| l.starts_with(node_id)).unwrap_or_else(|| panic!("{node_id} not listed:\n{out}"));
        assert_eq!(line.matches("SYNCED").count(), 4, "{node_id} not synced on all four types:\n{out}");
        assert!(line.contains("standalone"), "the ISTIOD column names meshpilot's server:\n{out}");
    }
    // istioctl's own stream is a debug client, not a proxy.
    assert_eq!(out.lines().count(), 3, "only the two proxies are listed:\n{out}");
}

#[tokio::test]
async fn proxy_status_of_one_proxy_diffs_meshpilots_dump_against_envoys() {
    let Some(istioctl) = istioctl() else { return };
    let reviews = Backend::new("reviews-v1");
    let mesh = documents(&[
        service_entry("reviews", 80, &[(&reviews, "v1")]),
        destination_rule("reviews", &["v1", "v2"], None),
        reviews_alice_to_v2(),
    ]);
    let config = temp_dir_with(&[("mesh.yaml", mesh.as_str())]);
    let cp = start_meshpilot(config.path()).await;
    let sidecar = start_sidecar(&cp).await;
    wait_synced(&cp, &[SIDECAR_NODE_ID]).await;
    let dump = tempfile::NamedTempFile::new().expect("temp file");
    std::fs::write(dump.path(), sidecar.admin_get("/config_dump").await.1).expect("write Envoy's dump");

    let xds = cp.xds_addr();
    let file = dump.path().to_string_lossy().into_owned();
    let (ok, out, err) = tokio::task::spawn_blocking(move || {
        istioctl_xds(&istioctl, xds, &["proxy-status", "client-1.shop", "--file", &file])
    })
    .await
    .expect("istioctl ran");
    assert!(ok, "istioctl proxy-status client-1.shop failed:\n{out}\n{err}");
    for part in ["Clusters Match", "Listeners Match", "Routes Match"] {
        assert!(out.contains(part), "istioctl found a difference ({part} missing):\n{out}");
    }
}
