//! meshpilot's secure port (istiod's 15012) without Kubernetes: TLS with a certificate from
//! meshpilot's CA for istiod's name; ADS only for callers that prove an identity (here: a client
//! certificate from the CA) and claim their own node; Istio's CreateCertificate for the caller's
//! own identity only; the plaintext port off.

use crate::common;

use common::files::temp_dir_with;
use common::meshpilot::Meshpilot;
use common::poll::STARTUP_TIMEOUT;
use common::ports::free_addr;
use common::secure::{ca_from_dir, channel, client_cert, cluster_names, csr, first_cds, node, open_stream};
use meshpilot::security::ca::service::pb::istio_certificate_service_client::IstioCertificateServiceClient;
use meshpilot::security::ca::service::pb::IstioCertificateRequest;
use meshpilot::security::tls::certificate_identities;

const CDS: &str = "type.googleapis.com/envoy.config.cluster.v3.Cluster";

/// A ServiceEntry visible only in its own namespace.
fn service_entry(ns: &str) -> String {
    format!(
        "apiVersion: networking.istio.io/v1\nkind: ServiceEntry\nmetadata: {{name: ext, namespace: {ns}}}\nspec:\n  \
         hosts: [{ns}.example.com]\n  exportTo: [\".\"]\n  location: MESH_EXTERNAL\n  resolution: DNS\n  ports: \
         [{{number: 80, name: http, protocol: HTTP}}]\n"
    )
}

struct Setup {
    cp: Meshpilot,
    root: String,
    ca: meshpilot::security::ca::CertificateAuthority,
    _dir: tempfile::TempDir,
}

async fn start() -> Setup {
    let dir = temp_dir_with(&[("ns-a.yaml", &service_entry("ns-a")), ("ns-b.yaml", &service_entry("ns-b"))]);
    let cp = Meshpilot::standalone(dir.path()).secure_xds(free_addr(), &[]).arg("--no-plaintext-xds").start();
    cp.wait_ready(STARTUP_TIMEOUT).await;
    let ca = ca_from_dir(&cp.ca_dir()).await;
    Setup { root: ca.root_pem().to_string(), ca, cp, _dir: dir }
}

#[tokio::test]
async fn only_an_authenticated_proxy_claiming_its_own_node_gets_config() {
    let s = start().await;
    let addr = s.cp.secure_xds_addr();

    // Anonymous: TLS, but neither a client certificate nor a token.
    let anonymous = channel(addr, &s.root, None).await.expect("TLS without a client certificate connects");
    let refused = first_cds(anonymous, None, node("ns-a", "sa-a")).await.expect_err("refused");
    assert_eq!(refused.code(), tonic::Code::Unauthenticated, "{refused:?}");

    // ns-a's certificate claiming a node of ns-b: the stream ends, nothing is sent.
    let (chain, key) = client_cert(&s.ca, "spiffe://cluster.local/ns/ns-a/sa/sa-a");
    let as_a = channel(addr, &s.root, Some((&chain, &key))).await.expect("mTLS connects");
    let refused = first_cds(as_a.clone(), None, node("ns-b", "sa-a")).await.expect_err("refused");
    assert_eq!(refused.code(), tonic::Code::PermissionDenied, "{refused:?}");
    // ... or another service account of its namespace.
    let refused = first_cds(as_a.clone(), None, node("ns-a", "sa-other")).await.expect_err("refused");
    assert_eq!(refused.code(), tonic::Code::PermissionDenied, "{refused:?}");

    // Its own node: its namespace's config.
    let cds = first_cds(as_a, None, node("ns-a", "sa-a")).await.expect("config for its own node");
    let names = cluster_names(&cds);
    assert!(names.iter().any(|n| n == "outbound|80||ns-a.example.com"), "{names:?}");
    assert!(!names.iter().any(|n| n.contains("ns-b.example.com")), "{names:?}");

    // A certificate from another CA does not get through the handshake.
    let other = meshpilot::security::ca::CertificateAuthority::new(
        meshpilot::security::ca::CertificateAuthority::self_signed_material(&Default::default()).expect("root"),
        Default::default(),
    )
    .expect("CA");
    let (chain, key) = client_cert(&other, "spiffe://cluster.local/ns/ns-b/sa/sa-b");
    let forged = match channel(addr, &s.root, Some((&chain, &key))).await {
        Ok(ch) => first_cds(ch, None, node("ns-b", "sa-b")).await.map(|_| ()),
        Err(_) => Err(tonic::Status::unavailable("handshake refused")),
    };
    assert!(forged.is_err(), "a foreign CA's certificate was accepted");
}

/// The node ids of `istio.io/debug/syncz` as the holder of `identity`'s certificate sees them.
async fn syncz_as(s: &Setup, identity: &str) -> Vec<String> {
    let (chain, key) = client_cert(&s.ca, identity);
    let ch = channel(s.cp.secure_xds_addr(), &s.root, Some((&chain, &key))).await.expect("mTLS connects");
    let debug = node("istio-system", "");
    let (_tx, mut answers) = open_stream(ch, debug, "istio.io/debug/syncz").await.expect("a debug stream");
    let answer = answers.message().await.expect("an answer").expect("not ended");
    let mut ids: Vec<String> = answer
        .resources
        .iter()
        .map(|r| {
            let config = <envoy_types::pb::envoy::service::status::v3::ClientConfig as prost::Message>::decode(
                r.value.as_slice(),
            )
            .expect("a ClientConfig");
            config.node.map(|n| n.id).unwrap_or_default()
        })
        .collect();
    ids.sort();
    ids
}

#[tokio::test]
async fn debug_answers_on_the_secure_port_cover_only_the_callers_namespace() {
    let s = start().await;
    let addr = s.cp.secure_xds_addr();
    let mut proxies = Vec::new();
    for ns in ["ns-a", "ns-b"] {
        let (chain, key) = client_cert(&s.ca, &format!("spiffe://cluster.local/ns/{ns}/sa/sa"));
        let ch = channel(addr, &s.root, Some((&chain, &key))).await.expect("mTLS connects");
        let (tx, mut responses) = open_stream(ch, node(ns, "sa"), CDS).await.expect("a proxy stream");
        responses.message().await.expect("CDS").expect("not ended");
        proxies.push((tx, responses));
    }
    let a = "sidecar~10.1.0.1~app-1.ns-a~ns-a.svc.cluster.local".to_string();
    let b = "sidecar~10.1.0.1~app-1.ns-b~ns-b.svc.cluster.local".to_string();
    // A workload of ns-a sees its namespace's proxies only; the control plane's namespace sees all.
    assert_eq!(syncz_as(&s, "spiffe://cluster.local/ns/ns-a/sa/debugger").await, std::slice::from_ref(&a));
    assert_eq!(syncz_as(&s, "spiffe://cluster.local/ns/istio-system/sa/istioctl").await, [a, b]);
}

#[tokio::test]
async fn create_certificate_issues_only_the_callers_own_identity() {
    let s = start().await;
    let addr = s.cp.secure_xds_addr();
    let own = "spiffe://cluster.local/ns/ns-a/sa/sa-a";
    let request = |uri: &str| IstioCertificateRequest { csr: csr(uri), validity_duration: 3600, metadata: None };

    // No credentials at all.
    let mut anonymous = IstioCertificateServiceClient::new(channel(addr, &s.root, None).await.expect("connects"));
    let err = anonymous.create_certificate(request(own)).await.expect_err("refused");
    assert_eq!(err.code(), tonic::Code::Unauthenticated, "{err:?}");
    // A token, but this meshpilot has no Kubernetes to review it with: it says so.
    let mut with_token = tonic::Request::new(request(own));
    with_token.metadata_mut().insert("authorization", "Bearer some-token".parse().expect("header"));
    let err = anonymous.create_certificate(with_token).await.expect_err("refused");
    assert_eq!(err.code(), tonic::Code::Unauthenticated, "{err:?}");
    assert!(err.message().contains("client certificate"), "{}", err.message());

    let (chain, key) = client_cert(&s.ca, own);
    let mut as_a =
        IstioCertificateServiceClient::new(channel(addr, &s.root, Some((&chain, &key))).await.expect("mTLS"));
    let err = as_a.create_certificate(request("spiffe://cluster.local/ns/ns-b/sa/sa-a")).await.expect_err("refused");
    assert_eq!(err.code(), tonic::Code::PermissionDenied, "{err:?}");

    let issued = as_a.create_certificate(request(own)).await.expect("issued").into_inner();
    assert_eq!(issued.cert_chain.last(), Some(&s.root), "the chain ends with the root");
    let leaf = meshpilot::security::ca::material::parse_certs(&issued.cert_chain[0], "leaf").expect("a certificate");
    let ids: Vec<String> = certificate_identities(&leaf[0]).iter().map(ToString::to_string).collect();
    assert_eq!(ids, [own]);

    // istiod's CA metrics count all of it.
    assert_eq!(s.cp.metric("citadel_server_csr_count").await, Some(4.0));
    assert_eq!(s.cp.metric("citadel_server_authentication_failure_count").await, Some(3.0));
    assert_eq!(s.cp.metric("citadel_server_success_cert_issuance_count").await, Some(1.0));
    assert!(s.cp.metric("citadel_server_root_cert_expiry_timestamp").await.is_some_and(|t| t > 1.0e9));
}

/// The admin server bound on a non-loopback address (the host end of a network namespace's
/// link): health and metrics answer anyone, the debug endpoints (which reveal every proxy's
/// config) refuse a caller that is not on loopback.
#[tokio::test]
async fn debug_endpoints_refuse_callers_that_are_not_on_loopback() {
    let Some(netns) = common::netns::NetNs::create(1) else { return };
    let dir = temp_dir_with(&[("ns-a.yaml", &service_entry("ns-a"))]);
    let admin = std::net::SocketAddr::from((netns.host_addr(), common::ports::free_port()));
    let cp = Meshpilot::standalone(dir.path()).admin_addr(admin).start();
    // The caller's address is the host's non-loopback one it dials from.
    cp.wait_ready(STARTUP_TIMEOUT).await;
    for path in ["/metrics", "/healthz", "/ready"] {
        assert_eq!(cp.admin_get(path).await.0, 200, "{path}");
    }
    for path in ["/debug/configz", "/debug/syncz", "/debug/config_dump?proxyID=x", "/debug/node"] {
        let (status, body) = cp.admin_get(path).await;
        assert_eq!(status, 403, "{path}: {body}");
        assert!(body.contains("loopback"), "{path}: {body}");
    }
    drop(netns);
}
