//! The ingest leader's snapshot stream to frontends is mutual TLS from meshpilot's CA by default
//! (the CA shared as Istio plug-in files here): a frontend of the control plane's namespace gets
//! snapshots; a raw gRPC `Subscribe` without a certificate, with a certificate of the CA for a
//! gateway of the control plane's namespace, or for a frontend's name in another trust domain,
//! gets nothing, and neither does a frontend with another CA or of another namespace.

use crate::common;

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use common::etcd::Etcd;
use common::files::temp_dir_with;
use common::meshpilot::Meshpilot;
use common::poll::STARTUP_TIMEOUT;
use common::secure::TlsConnector;
use meshpilot::replication::wire::proto::snapshot_service_client::SnapshotServiceClient;
use meshpilot::replication::wire::proto::SubscribeRequest;
use meshpilot::security::ca::{CaMaterial, CaSettings, CertificateAuthority};
use meshpilot::security::tls;
use meshpilot::security::{Identity, TrustDomain};

const SERVICE_ENTRY: &str = "apiVersion: networking.istio.io/v1\nkind: ServiceEntry\nmetadata: {name: ext, namespace: \
                             default}\nspec:\n  hosts: [ext.example.com]\n  ports: [{number: 80, name: http, protocol: \
                             HTTP}]\n  resolution: DNS\n";

/// The control plane's namespace in these tests.
const NAMESPACE: &str = "meshpilot-system";

/// A fresh CA as Istio plug-in files in `dir`.
fn plugin_ca(dir: &Path) {
    let material = CertificateAuthority::self_signed_material(&TrustDomain::default()).expect("a root");
    material.write_dir(dir).expect("writing cacerts");
}

/// The CA whose plug-in files are in `dir`.
fn ca_of(dir: &Path) -> CertificateAuthority {
    let material = CaMaterial::read_dir(dir).expect("reading cacerts").expect("a CA in the dir");
    CertificateAuthority::new(material, CaSettings::default()).expect("CA")
}

/// A client configuration trusting `ca`'s root and presenting a certificate of `ca` for
/// `spiffe://TRUST_DOMAIN/ns/NAMESPACE/sa/ACCOUNT` (none with `identity` `None`).
fn client_tls(ca: &CertificateAuthority, identity: Option<(&str, &str, &str)>) -> Arc<rustls::ClientConfig> {
    let roots = ca.material().roots().expect("roots");
    let Some((trust_domain, namespace, account)) = identity else {
        return tls::client_config(&roots, None).expect("client config");
    };
    let td = TrustDomain::new(trust_domain).expect("trust domain");
    let id = Identity::new(td, namespace, account).expect("identity");
    let issued = ca.issue_workload(&id, Duration::from_secs(3600)).expect("issued");
    tls::client_config(&roots, Some((&issued.chain_pem, &issued.key_pem))).expect("client config")
}

/// What a raw gRPC `Subscribe` to `addr` gets: `Ok(bytes)` of the first chunk of a snapshot, or
/// why it got none. `tls`: `None` for plaintext.
async fn subscribe(addr: SocketAddr, tls: Option<Arc<rustls::ClientConfig>>) -> Result<usize, String> {
    let attempt = async {
        let endpoint = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
            .map_err(|e| e.to_string())?
            .connect_timeout(Duration::from_secs(5));
        let channel = match tls {
            None => endpoint.connect().await,
            Some(config) => endpoint.connect_with_connector(TlsConnector::to_ip(addr, config)).await,
        }
        .map_err(|e| format!("connect: {e:?}"))?;
        let request = SubscribeRequest { frontend_id: "attacker".into(), ..Default::default() };
        let mut stream = SnapshotServiceClient::new(channel)
            .subscribe(request)
            .await
            .map_err(|s| format!("subscribe: {s:?}"))?
            .into_inner();
        match stream.message().await {
            Ok(Some(chunk)) => Ok(chunk.payload.len()),
            Ok(None) => Err("stream ended".to_string()),
            Err(s) => Err(format!("stream: {s:?}")),
        }
    };
    tokio::time::timeout(Duration::from_secs(10), attempt).await.unwrap_or_else(|_| Err("timed out".into()))
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

/// An ingest node with the CA of `cacerts` in [`NAMESPACE`], leading, with a snapshot to serve.
async fn leading_ingest(etcd: &Etcd, config: &Path, cacerts: &Path) -> Meshpilot {
    let ingest = Meshpilot::ingest(&etcd.endpoint(), config)
        .arg("--cacerts-dir")
        .arg(&cacerts.display().to_string())
        .arg("--namespace")
        .arg(NAMESPACE)
        .start();
    ingest.wait_ready(STARTUP_TIMEOUT).await;
    let leads = common::poll::poll(STARTUP_TIMEOUT, async || ingest.is_leader().await).await;
    assert!(leads, "the ingest node did not lead:\n{}", ingest.logs());
    ingest
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
    // No flag: mutual TLS is the default.
    let frontend = |ca: &Path, namespace: &str| {
        Meshpilot::frontend(&etcd.endpoint()).arg("--cacerts-dir").arg(&dir(ca)).arg("--namespace").arg(namespace)
    };

    let ingest = leading_ingest(&etcd, config.path(), &shared).await;
    let follower = frontend(&shared, NAMESPACE).start();
    follower.wait_ready(STARTUP_TIMEOUT).await;

    let foreign_ca = frontend(&other, NAMESPACE).start();
    let plaintext = frontend(&shared, NAMESPACE).arg("--insecure-snapshot-stream").start();
    let other_namespace = frontend(&shared, "workloads").start();
    let (a, b, c) =
        tokio::join!(stays_unready(&foreign_ca), stays_unready(&plaintext), stays_unready(&other_namespace));
    assert!(a, "a frontend with another CA got a snapshot");
    assert!(b, "a frontend without TLS got a snapshot");
    assert!(c, "a frontend of another namespace got a snapshot");
    // The leader refused them at the handshake (the first two) or after it (the third); the one
    // with another CA refused the leader too, and says why.
    assert!(ingest.logs().contains("TLS peer not allowed"), "no refusal logged:\n{}", ingest.logs());
    assert!(
        foreign_ca.logs().contains("refusing the peer: TLS handshake failed"),
        "the frontend with another CA logged no refusal:\n{}",
        foreign_ca.logs()
    );
    assert!(
        plaintext.logs().contains("--insecure-snapshot-stream"),
        "no warning about the insecure stream at start:\n{}",
        plaintext.logs()
    );
}

/// Attack: a raw gRPC `Subscribe` to the default ingest node's snapshot port, without any
/// certificate (plaintext, and TLS trusting the root but presenting none), gets nothing.
#[tokio::test]
async fn a_subscribe_without_a_client_certificate_gets_nothing_by_default() {
    let etcd = Etcd::start().await;
    let config = temp_dir_with(&[("se.yaml", SERVICE_ENTRY)]);
    let cas = tempfile::tempdir().expect("tempdir");
    plugin_ca(cas.path());
    let ingest = leading_ingest(&etcd, config.path(), cas.path()).await;
    let ca = ca_of(cas.path());
    let addr = ingest.snapshot_addr();

    let plaintext = subscribe(addr, None).await;
    assert!(plaintext.is_err(), "a plaintext Subscribe got a snapshot ({plaintext:?})");
    let no_cert = subscribe(addr, Some(client_tls(&ca, None))).await;
    assert!(no_cert.is_err(), "a TLS Subscribe without a client certificate got a snapshot ({no_cert:?})");
    // The same client with a frontend's certificate gets a snapshot: the refusals above are
    // the missing certificate's doing.
    let frontend = client_tls(&ca, Some(("cluster.local", NAMESPACE, "meshpilot-frontend")));
    let got = subscribe(addr, Some(frontend)).await;
    assert!(matches!(got, Ok(n) if n > 0), "a frontend's certificate got no snapshot: {got:?}");
}

/// Attack: certificates from the mesh's own CA that are not a frontend's or an ingest node's,
/// an ingress gateway's of the control plane's namespace and a frontend's name in another trust
/// domain, get nothing.
#[tokio::test]
async fn certificates_of_the_ca_for_other_identities_get_nothing() {
    let etcd = Etcd::start().await;
    let config = temp_dir_with(&[("se.yaml", SERVICE_ENTRY)]);
    let cas = tempfile::tempdir().expect("tempdir");
    plugin_ca(cas.path());
    let ingest = leading_ingest(&etcd, config.path(), cas.path()).await;
    let ca = ca_of(cas.path());
    let addr = ingest.snapshot_addr();

    let refused = [
        ("cluster.local", NAMESPACE, "istio-ingressgateway-service-account"),
        ("other.example", NAMESPACE, "meshpilot-frontend"),
        ("cluster.local", "default", "meshpilot-frontend"),
    ];
    for identity in refused {
        let got = subscribe(addr, Some(client_tls(&ca, Some(identity)))).await;
        assert!(got.is_err(), "{identity:?} got a snapshot ({got:?})");
    }
    assert!(ingest.logs().contains("TLS peer not allowed"), "no refusal logged:\n{}", ingest.logs());
    // Frontends and ingest nodes get in with the same client: the refusals are the identities' doing.
    let admitted =
        [("cluster.local", NAMESPACE, "meshpilot-frontend"), ("cluster.local", NAMESPACE, "meshpilot-ingest")];
    for identity in admitted {
        let got = subscribe(addr, Some(client_tls(&ca, Some(identity)))).await;
        assert!(matches!(got, Ok(n) if n > 0), "{identity:?} got no snapshot: {got:?}");
    }
}
