//! Peer identity end to end: real Istio sidecars (pilot-agent + Envoy behind Istio's iptables)
//! get their workload certificates from meshpilot's CA over its secure port (each with its own
//! service account's TokenRequest token, as `tests/sidecar_secure.rs` does), talk mutual TLS
//! (auto mTLS, the server's namespace STRICT), and the server's sidecar enforces
//! AuthorizationPolicy by the client's SPIFFE principal and namespace.
//!
//! Every pod's traffic goes through its own sidecar: clients call Service `server` by its cluster
//! IP from inside their pod, so what a verdict depends on is the certificate the client's
//! sidecar presents, which meshpilot's CA issued for the pod's service account.

use crate::common;

use std::net::{Ipv4Addr, SocketAddr};

use common::http::HttpResponse;
use common::ingress::{backend_of, Ingress};
use common::kube::{apply, istio_token, KubeApi, ADMIN_TOKEN};
use common::mesh::wait_synced;
use common::meshpilot::Meshpilot;
use common::netns::{Forward, NetNs};
use common::poll::{poll, CONVERGE_TIMEOUT, STARTUP_TIMEOUT};
use common::sidecar::{server_service, SecureControlPlane, SidecarPod, SidecarPodBuilder, NODE_NAME};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::{Api, Client};
use serde_json::Value;

/// The server's namespace (and that of clients A and B).
const NS: &str = "authz";
/// Another namespace, with a client whose service account is named like client A's.
const OTHER_NS: &str = "authz-other";
/// Cluster IP and port of Service `server` (port `http`: the server's inbound chain is HTTP).
const SERVER_SVC: (Ipv4Addr, u16) = (Ipv4Addr::new(10, 96, 79, 10), 80);
const SERVER_HOST: &str = "server.authz.svc.cluster.local";
/// What Envoy's RBAC filter answers a denied request with.
const RBAC_DENIED: &str = "RBAC: access denied";

/// A client pod: name, namespace, service account.
type ClientSpec = (&'static str, &'static str, &'static str);
const CLIENT_A: ClientSpec = ("client-a-1", NS, "client-a");
const CLIENT_B: ClientSpec = ("client-b-1", NS, "client-b");
const CLIENT_OTHER: ClientSpec = ("client-a-1", OTHER_NS, "client-a");

fn spiffe(ns: &str, sa: &str) -> String {
    format!("spiffe://cluster.local/ns/{ns}/sa/{sa}")
}

struct Mesh {
    // Pods first: dropped (their sidecars stopped) before meshpilot and the API server.
    server: SidecarPod,
    clients: Vec<(SidecarPod, Forward, Ingress)>,
    root_pem: String,
    kube: Client,
    cp: Meshpilot,
    _xds_net: NetNs,
    _api: KubeApi,
}

fn server_objects(pod: &str, ip: Ipv4Addr, target: u16) -> [String; 3] {
    let [service, slice] = server_service(NS, SERVER_SVC, pod, ip, target);
    [
        service,
        slice,
        // Mutual TLS is required, not merely offered: a verdict by peer identity has a peer.
        format!(
            "apiVersion: security.istio.io/v1\nkind: PeerAuthentication\nmetadata: {{name: default, namespace: {NS}}}\n\
             spec: {{mtls: {{mode: STRICT}}}}\n"
        ),
    ]
}

/// An AuthorizationPolicy on the server pods with `action` and one `from` source.
fn server_policy(action: &str, source: &str) -> String {
    format!(
        "apiVersion: security.istio.io/v1\nkind: AuthorizationPolicy\nmetadata: {{name: server-access, namespace: {NS}}}\n\
         spec:\n  selector: {{matchLabels: {{app: server}}}}\n  action: {action}\n  rules:\n  - from:\n    - source: {source}\n"
    )
}

impl Mesh {
    /// meshpilot (secure port only, its CA on) on a real API server, the server pod and `clients`,
    /// all in secure mode; returns once every sidecar is ready and in sync.
    async fn start(clients: &[ClientSpec]) -> Option<Mesh> {
        let server = SidecarPod::builder("server-1", NS)?.label("app", "server").service_account("server");
        let mut builders: Vec<(SidecarPodBuilder, ClientSpec)> = Vec::new();
        for &(name, ns, sa) in clients {
            let builder = SidecarPod::builder(name, ns)?.label("app", sa).service_account(sa);
            builder.netns().link(server.netns());
            builders.push((builder, (name, ns, sa)));
        }
        let api = KubeApi::start().await?;
        let kube = api.admin().await;
        let mut objects = vec![
            "apiVersion: v1\nkind: Namespace\nmetadata: {name: istio-system}\n".to_string(),
            format!("apiVersion: v1\nkind: Namespace\nmetadata: {{name: {NS}}}\n"),
            format!("apiVersion: v1\nkind: Namespace\nmetadata: {{name: {OTHER_NS}}}\n"),
            format!("apiVersion: v1\nkind: Node\nmetadata: {{name: {NODE_NAME}}}\n"),
            format!("apiVersion: v1\nkind: ServiceAccount\nmetadata: {{name: server, namespace: {NS}}}\n"),
            server.pod_yaml(),
        ];
        for (builder, (_, ns, sa)) in &builders {
            objects.push(format!("apiVersion: v1\nkind: ServiceAccount\nmetadata: {{name: {sa}, namespace: {ns}}}\n"));
            objects.push(builder.pod_yaml());
        }
        objects.extend(server_objects("server-1", server.ip(), server.app_port()));
        for object in &objects {
            apply(&kube, object).await;
        }
        let kubeconfig = api.write_kubeconfig(api.dir(), "meshpilot.kubeconfig", &api.url(), ADMIN_TOKEN);
        // meshpilot listens on the host end of a namespace of its own (the linked pods route each
        // other's subnets over their links); its certificate names that address, which the pods dial.
        let xds_net = NetNs::create(0)?;
        let secure_addr = SocketAddr::from((xds_net.host_addr(), common::ports::free_port()));
        let cp = Meshpilot::standalone_on_kubernetes(kubeconfig)
            .secure_xds(secure_addr, &[secure_addr.ip().to_string()])
            .arg("--no-plaintext-xds")
            .debounce_after("50ms")
            .start();
        cp.wait_ready(STARTUP_TIMEOUT).await;
        let root_pem = published_root(&kube, &cp).await;

        let secure = async |ns: &str, sa: &str| SecureControlPlane {
            token: istio_token(&kube, ns, sa).await,
            root_pem: root_pem.clone(),
        };
        let server = server.secure_control_plane(secure(NS, "server").await).start(secure_addr).await;
        let mut pods = Vec::new();
        for (builder, (_, ns, sa)) in builders {
            let pod = builder.secure_control_plane(secure(ns, sa).await).start(secure_addr).await;
            let forward = pod.outbound(SocketAddr::from(SERVER_SVC)).await;
            let ingress = Ingress::new(forward.port(), SERVER_HOST);
            pods.push((pod, forward, ingress));
        }
        let mut ids = vec![server.node_id()];
        ids.extend(pods.iter().map(|(p, _, _)| p.node_id()));
        wait_synced(&cp, &ids).await;
        Some(Mesh { server, clients: pods, root_pem, kube, cp, _xds_net: xds_net, _api: api })
    }

    /// Client `i`'s pod and its way to Service `server` through its sidecar.
    fn client(&self, i: usize) -> (&SidecarPod, &Ingress) {
        let (pod, _, ingress) = &self.clients[i];
        (pod, ingress)
    }

    async fn assert_no_rejections(&self) {
        self.server.assert_no_rejections().await;
        for (pod, _, _) in &self.clients {
            pod.assert_no_rejections().await;
        }
    }
}

/// The root meshpilot publishes in the `istio-ca-root-cert` ConfigMap of [`NS`] (as istiod does),
/// and has published in [`OTHER_NS`] too.
async fn published_root(kube: &Client, cp: &Meshpilot) -> String {
    let mut roots: Vec<Option<String>> = vec![None, None];
    let published = poll(STARTUP_TIMEOUT, async || {
        for (i, ns) in [NS, OTHER_NS].iter().enumerate() {
            let configmaps: Api<ConfigMap> = Api::namespaced(kube.clone(), ns);
            roots[i] = configmaps
                .get_opt("istio-ca-root-cert")
                .await
                .ok()
                .flatten()
                .and_then(|cm| cm.data)
                .and_then(|d| d.get("root-cert.pem").cloned());
        }
        roots.iter().all(Option::is_some)
    })
    .await;
    assert!(published, "no istio-ca-root-cert ConfigMap in {NS} and {OTHER_NS}:\n{}", cp.logs());
    assert_eq!(roots[0], roots[1], "one mesh root in every namespace");
    roots[0].take().expect("a root")
}

fn is_denied(r: &HttpResponse) -> bool {
    r.status == 403 && r.body.contains(RBAC_DENIED)
}

/// Asserts one request through `client` is served by the server pod.
async fn assert_allowed(client: &Ingress, who: &str) {
    let r = client.get("/", &[]).await;
    assert_eq!(backend_of(&r).as_deref(), Some("server-1"), "{who} must be allowed: {r:?}");
}

/// Asserts one request through `client` is refused by the server's RBAC filter.
async fn assert_denied(client: &Ingress, who: &str) {
    let r = client.get("/", &[]).await;
    assert!(is_denied(&r), "{who} must be denied (403 {RBAC_DENIED:?}): {r:?}");
}

/// Waits until every client's answer is its expected verdict (true: served by the server pod,
/// false: RBAC's 403) three rounds in a row. A policy edit is a listener update: connections a
/// client's sidecar opened before keep the old filters until Envoy has drained them, so each
/// client converges on its own.
async fn wait_verdicts(expected: &[(&Ingress, bool, &str)]) {
    let mut streak = 0;
    let mut last = Vec::new();
    let converged = poll(CONVERGE_TIMEOUT, async || {
        last.clear();
        for (client, allowed, who) in expected {
            let r = client.try_get("/", &[]).await;
            let ok = match &r {
                Ok(r) if *allowed => backend_of(r).as_deref() == Some("server-1"),
                Ok(r) => is_denied(r),
                Err(_) => false,
            };
            if !ok {
                last.push(format!("{who} (expected {}): {r:?}", if *allowed { "allowed" } else { "denied" }));
            }
        }
        streak = if last.is_empty() { streak + 1 } else { 0 };
        streak >= 3
    })
    .await;
    assert!(converged, "verdicts did not converge within {CONVERGE_TIMEOUT:?}: {last:#?}");
}

#[tokio::test]
async fn authorization_policy_allows_and_denies_by_spiffe_principal_and_namespace_over_mesh_mtls() {
    let Some(mesh) = Mesh::start(&[CLIENT_A, CLIENT_B, CLIENT_OTHER]).await else { return };
    let ((_, a), (_, b), (_, other)) = (mesh.client(0), mesh.client(1), mesh.client(2));

    // No policy: every mesh client is served over STRICT mTLS.
    wait_verdicts(&[(a, true, "client A"), (b, true, "client B"), (other, true, "the other namespace's client")]).await;

    // ALLOW by principal: only client A's service account in the server's namespace. The other
    // namespace's client has a service account of the same name, and is not it.
    let principal_a = format!("{{principals: [\"cluster.local/ns/{NS}/sa/client-a\"]}}");
    apply(&mesh.kube, &server_policy("ALLOW", &principal_a)).await;
    wait_verdicts(&[(a, true, "client A"), (b, false, "client B"), (other, false, "the other namespace's client")])
        .await;
    assert_allowed(a, "client A (the allowed principal)").await;
    assert_denied(b, "client B (another service account)").await;
    assert_denied(other, "client A's namesake in another namespace").await;

    // A live edit of the principal flips both verdicts.
    let principal_b = format!("{{principals: [\"cluster.local/ns/{NS}/sa/client-b\"]}}");
    apply(&mesh.kube, &server_policy("ALLOW", &principal_b)).await;
    wait_verdicts(&[(a, false, "client A"), (b, true, "client B")]).await;
    assert_denied(a, "client A (no longer the allowed principal)").await;
    assert_allowed(b, "client B (now the allowed principal)").await;

    // DENY by namespace: the other namespace's client is refused, the same namespace's served.
    apply(&mesh.kube, &server_policy("DENY", &format!("{{namespaces: [\"{OTHER_NS}\"]}}"))).await;
    wait_verdicts(&[(a, true, "client A"), (b, true, "client B"), (other, false, "the other namespace's client")])
        .await;
    assert_denied(other, "the denied namespace's client").await;
    assert_allowed(a, "client A (the server's namespace)").await;
    assert_allowed(b, "client B (the server's namespace)").await;

    // A live edit of the namespace flips it: now the server's own namespace is denied.
    apply(&mesh.kube, &server_policy("DENY", &format!("{{namespaces: [\"{NS}\"]}}"))).await;
    wait_verdicts(&[(a, false, "client A"), (other, true, "the other namespace's client")]).await;
    assert_allowed(other, "the other namespace's client (its namespace no longer denied)").await;
    assert_denied(a, "client A (its namespace now denied)").await;

    mesh.assert_no_rejections().await;
}

/// `x` with leading zero digits and any `:` removed, lowercased: a certificate serial as Envoy's
/// `/certs` writes it, whatever notation it came in.
fn serial_hex(x: &str) -> String {
    x.replace(':', "").to_ascii_lowercase().trim_start_matches('0').to_string()
}

/// The URI SANs of every certificate chain in Envoy's `/certs`, and the serials of every CA
/// certificate there.
fn certs_summary(certs: &Value) -> (Vec<String>, Vec<String>) {
    let (mut uris, mut ca_serials) = (Vec::new(), Vec::new());
    for entry in certs["certificates"].as_array().into_iter().flatten() {
        for cert in entry["cert_chain"].as_array().into_iter().flatten() {
            for san in cert["subject_alt_names"].as_array().into_iter().flatten() {
                uris.extend(san["uri"].as_str().map(str::to_string));
            }
        }
        for ca in entry["ca_cert"].as_array().into_iter().flatten() {
            ca_serials.extend(ca["serial_number"].as_str().map(serial_hex));
        }
    }
    (uris, ca_serials)
}

#[tokio::test]
async fn sidecars_talk_mutual_tls_with_certificates_from_meshpilots_ca() {
    let Some(mesh) = Mesh::start(&[CLIENT_A]).await else { return };
    let (client, via_sidecar) = mesh.client(0);

    // Before the first request there was no handshake to the server; after it, there was one.
    let handshakes = format!("cluster.outbound|{}||{SERVER_HOST};.ssl.handshake", SERVER_SVC.1);
    let before = client.stat(&handshakes).await;
    via_sidecar.wait_backend("/", &[], "server-1").await;
    let after = client.stat(&handshakes).await;
    assert!(
        after > before,
        "{handshakes} did not rise ({before} -> {after}): the client's Envoy made no TLS handshake"
    );

    // The server's sidecar saw the identity of meshpilot's certificate for the client, and
    // presented its own.
    let echo = via_sidecar.echo("/", &[]).await;
    let xfcc = echo["headers"]["x-forwarded-client-cert"].as_str().unwrap_or_default().to_string();
    assert!(
        xfcc.contains(&format!("URI={}", spiffe(NS, "client-a"))),
        "the server's sidecar saw no client SPIFFE identity: {echo:#}"
    );
    assert!(xfcc.contains(&format!("By={}", spiffe(NS, "server"))), "the server presented another certificate: {xfcc}");
    // The certificate the client presented is the very one meshpilot's CA issued to its
    // pilot-agent: XFCC's `Hash` is the SHA-256 of its DER.
    let chain =
        client.workload_cert_chain().unwrap_or_else(|| panic!("no certificate from the CA:\n{}", client.logs()));
    let leaf = meshpilot::security::ca::material::parse_certs(&chain, "cert-chain.pem").expect("certificates");
    let digest = ring::digest::digest(&ring::digest::SHA256, &leaf[0]);
    let hash: String = digest.as_ref().iter().map(|b| format!("{b:02x}")).collect();
    assert!(
        xfcc.contains(&format!("Hash={hash}")),
        "the client presented another certificate than the CA's ({hash}): {xfcc}"
    );

    // Envoy's own view of the certificates it got over SDS from pilot-agent, which got them
    // from meshpilot's CA: its pod's SPIFFE id, and meshpilot's root as the CA.
    let root = meshpilot::security::ca::material::parse_certs(&mesh.root_pem, "root").expect("the root");
    let (_, root_cert) = x509_parser::parse_x509_certificate(&root[0]).expect("the root parses");
    let root_serial = serial_hex(&root_cert.raw_serial_as_string());
    for (pod, id) in [(client, spiffe(NS, "client-a")), (&mesh.server, spiffe(NS, "server"))] {
        let certs: Value = serde_json::from_str(&pod.admin_get("/certs").await).expect("/certs is JSON");
        let (uris, ca_serials) = certs_summary(&certs);
        assert!(uris.contains(&id), "{}: /certs has no certificate for {id}: {certs:#}", pod.node_id());
        assert!(uris.iter().all(|u| *u == id), "{}: /certs has another identity: {uris:?}", pod.node_id());
        assert!(
            ca_serials.contains(&root_serial),
            "{}: /certs does not trust meshpilot's root (serial {root_serial}): {certs:#}",
            pod.node_id()
        );
    }
    assert!(mesh.cp.logs().contains("CA: certificate issued"), "no issuance logged");
    mesh.assert_no_rejections().await;
}
