//! The ingest leader's snapshot stream to frontends over mutual TLS from meshpilot's CA
//! (`--snapshot-mtls`, the CA shared as Istio plug-in files): a frontend of the control plane's
//! namespace gets snapshots; one with another CA, one without TLS, and one whose identity is in
//! another namespace (a workload of the mesh holds certificates from the same CA) get nothing.

mod common;

use std::path::Path;
use std::time::Duration;

use common::etcd::Etcd;
use common::files::temp_dir_with;
use common::meshpilot::Meshpilot;
use common::poll::STARTUP_TIMEOUT;
use meshpilot::security::ca::CertificateAuthority;
use meshpilot::security::TrustDomain;

const SERVICE_ENTRY: &str = "apiVersion: networking.istio.io/v1\nkind: ServiceEntry\nmetadata: {name: ext, namespace: \
                             default}\nspec:\n  hosts: [ext.example.com]\n  ports: [{number: 80, name: http, protocol: \
                             HTTP}]\n  resolution: DNS\n";

/// A fresh CA as Istio plug-in files in `dir`.
fn plugin_ca(dir: &Path) {
    let material = CertificateAuthority::self_signed_material(&TrustDomain::default()).expect("a root");
    material.write_dir(dir).expect("writing cacerts");
}

/// Whether `frontend` stays unready (no snapshot reached it) for a few seconds.
async fn stays_unready(frontend: &Meshpilot) -> bool {
    for _ in 0..20 {
        if matches!(frontend.try_admin_get("/ready").await, Ok((200, _))) {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    true
}

#[tokio::test]
async fn only_control_plane_peers_with_the_cas_certificates_follow_the_leader() {
    let etcd = Etcd::start().await;
    let config = temp_dir_with(&[("se.yaml", SERVICE_ENTRY)]);
    let cas = tempfile::tempdir().expect("tempdir");
    let (shared, other) = (cas.path().join("shared"), cas.path().join("other"));
    plugin_ca(&shared);
    plugin_ca(&other);
    let dir = |p: &Path| p.display().to_string();
    let mtls = |b: common::meshpilot::MeshpilotBuilder, ca: &Path| {
        b.arg("--snapshot-mtls").arg("--cacerts-dir").arg(&dir(ca)).arg("--namespace").arg("meshpilot-system")
    };

    let ingest = mtls(Meshpilot::ingest(&etcd.endpoint(), config.path()), &shared).start();
    ingest.wait_ready(STARTUP_TIMEOUT).await;
    let follower = mtls(Meshpilot::frontend(&etcd.endpoint()), &shared).start();
    follower.wait_ready(STARTUP_TIMEOUT).await;

    let foreign_ca = mtls(Meshpilot::frontend(&etcd.endpoint()), &other).start();
    let plaintext = Meshpilot::frontend(&etcd.endpoint()).start();
    let other_namespace = Meshpilot::frontend(&etcd.endpoint())
        .arg("--snapshot-mtls")
        .arg("--cacerts-dir")
        .arg(&dir(&shared))
        .arg("--namespace")
        .arg("workloads")
        .start();
    let (a, b, c) =
        tokio::join!(stays_unready(&foreign_ca), stays_unready(&plaintext), stays_unready(&other_namespace));
    assert!(a, "a frontend with another CA got a snapshot");
    assert!(b, "a frontend without TLS got a snapshot");
    assert!(c, "a frontend of another namespace got a snapshot");
    // The leader refused them at the handshake (the first two) or after it (the third).
    assert!(ingest.logs().contains("TLS peer not allowed"), "no refusal logged:\n{}", ingest.logs());
}
