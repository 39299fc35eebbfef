//! Istio's real sidecar on meshpilot's secure port, as an injected pod talks to istiod:
//! pilot-agent presents its service account's token (minted by the API server with the
//! TokenRequest API for the audience `istio-ca`), trusts the root from the `istio-ca-root-cert`
//! ConfigMap meshpilot keeps in its namespace, gets its workload certificate from meshpilot's
//! CA over TLS (`CA_ADDR`), and proxies Envoy's xDS over the same TLS port; the plaintext port
//! is off. meshpilot validates the token with a TokenReview and serves only the pod's own node.

use crate::common;

use common::kube::{apply, istio_token, KubeApi, ADMIN_TOKEN};
use common::meshpilot::Meshpilot;
use common::poll::{poll, STARTUP_TIMEOUT};
use common::secure::{channel, first_cds, node};
use common::sidecar::{SecureControlPlane, SidecarPod, NODE_NAME};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::Api;
use meshpilot::security::ca::material::parse_certs;
use meshpilot::security::tls::certificate_identities;

const NS: &str = "secure";
const SA: &str = "productpage";
const POD: &str = "productpage-v1-5c7d9-abcde";

#[tokio::test]
async fn pilot_agent_gets_its_workload_certificate_and_config_over_the_secure_port_with_its_token() {
    let Some(builder) = SidecarPod::builder(POD, NS) else { return };
    let builder = builder.label("app", "productpage").service_account(SA);
    let Some(api) = KubeApi::start().await else { return };
    let client = api.admin().await;
    for object in [
        "apiVersion: v1\nkind: Namespace\nmetadata: {name: istio-system}\n".to_string(),
        format!("apiVersion: v1\nkind: Namespace\nmetadata: {{name: {NS}}}\n"),
        format!("apiVersion: v1\nkind: Node\nmetadata: {{name: {NODE_NAME}}}\n"),
        format!("apiVersion: v1\nkind: ServiceAccount\nmetadata: {{name: {SA}, namespace: {NS}}}\n"),
        format!("apiVersion: v1\nkind: ServiceAccount\nmetadata: {{name: other, namespace: {NS}}}\n"),
        "apiVersion: v1\nkind: ServiceAccount\nmetadata: {name: operator, namespace: istio-system}\n".to_string(),
        builder.pod_yaml(),
    ] {
        apply(&client, &object).await;
    }
    let kubeconfig = api.write_kubeconfig(api.dir(), "meshpilot.kubeconfig", &api.url(), ADMIN_TOKEN);
    // The pod dials the host end of its veth: the certificate must name that address.
    let secure_addr = builder.xds_addr();
    // The admin port too, so that the test calls it from a non-loopback address.
    let admin_addr = builder.xds_addr();
    let cp = Meshpilot::standalone_on_kubernetes(kubeconfig)
        .admin_addr(admin_addr)
        .secure_xds(secure_addr, &[secure_addr.ip().to_string()])
        .arg("--no-plaintext-xds")
        .debounce_after("50ms")
        .start();
    cp.wait_ready(STARTUP_TIMEOUT).await;

    // meshpilot publishes its root to every namespace, as istiod does.
    let configmaps: Api<ConfigMap> = Api::namespaced(client.clone(), NS);
    let mut root = None;
    let published = poll(STARTUP_TIMEOUT, async || {
        root = configmaps
            .get_opt("istio-ca-root-cert")
            .await
            .ok()
            .flatten()
            .and_then(|cm| cm.data)
            .and_then(|d| d.get("root-cert.pem").cloned());
        root.is_some()
    })
    .await;
    assert!(published, "no istio-ca-root-cert ConfigMap in {NS}:\n{}", cp.logs());
    let root = root.expect("root");

    // The pod's own token; `start` waits until Envoy is ready.
    let token = istio_token(&client, NS, SA).await;
    let pod =
        builder.secure_control_plane(SecureControlPlane { token, root_pem: root.clone() }).start(secure_addr).await;

    // The workload certificate pilot-agent got names the pod's SPIFFE id and chains to the root.
    let chain =
        pod.workload_cert_chain().unwrap_or_else(|| panic!("pilot-agent wrote no certificate:\n{}", pod.logs()));
    let certs = parse_certs(&chain, "cert-chain.pem").expect("certificates");
    let ids: Vec<String> = certificate_identities(&certs[0]).iter().map(ToString::to_string).collect();
    assert_eq!(ids, [format!("spiffe://cluster.local/ns/{NS}/sa/{SA}")]);
    let (_, leaf) = x509_parser::parse_x509_certificate(&certs[0]).expect("the leaf parses");
    let roots = parse_certs(&root, "root").expect("root");
    let (_, root_cert) = x509_parser::parse_x509_certificate(&roots[0]).expect("the root parses");
    assert_eq!(leaf.issuer(), root_cert.subject(), "issued by meshpilot's root");
    leaf.verify_signature(Some(root_cert.public_key())).expect("signed by meshpilot's root");

    // What pilot-agent's SDS serves Envoy (Envoy's /certs once its config references the
    // `default` secret): the same identity, chained to the same root.
    let served = common::secure::sds_certificate_chain(&pod.sds_socket())
        .await
        .unwrap_or_else(|e| panic!("SDS from pilot-agent: {e}\n{}", pod.logs()));
    let served = parse_certs(&served, "SDS certificate chain").expect("certificates");
    let served_ids: Vec<String> = certificate_identities(&served[0]).iter().map(ToString::to_string).collect();
    assert_eq!(served_ids, ids, "SDS serves another certificate");
    let (_, served_leaf) = x509_parser::parse_x509_certificate(&served[0]).expect("the served leaf parses");
    served_leaf.verify_signature(Some(root_cert.public_key())).expect("the served certificate is signed by the root");

    // Envoy is ready: its listeners and clusters came over the secure port (the only one).
    assert!(pod.admin_get("/listeners").await.contains("virtualOutbound::0.0.0.0:15001"), "no virtualOutbound");
    assert!(cp.logs().contains("CA: certificate issued"), "no issuance logged");

    // Token-authenticated xDS decides on the token's service account, not on the node's claim:
    // another service account's token claiming this pod's node gets nothing.
    let other = istio_token(&client, NS, "other").await;
    let channel = || channel(secure_addr, &root, None);
    let refused = first_cds(channel().await.expect("TLS"), Some(&other), node(NS, SA)).await.expect_err("refused");
    assert_eq!(refused.code(), tonic::Code::PermissionDenied, "{refused:?}");
    let own = istio_token(&client, NS, SA).await;
    first_cds(channel().await.expect("TLS"), Some(&own), node(NS, SA)).await.expect("its own node's config");
    // Debug endpoints from a non-loopback address: only with a token of the control plane's
    // namespace (istio-system); a workload's token does not open them.
    let debug = |token: Option<String>| {
        let url = format!("http://{admin_addr}/debug/syncz");
        async move {
            let client = reqwest::Client::builder().no_proxy().build().expect("client");
            let request = match token {
                Some(t) => client.get(&url).bearer_auth(t),
                None => client.get(&url),
            };
            let response = request.send().await.expect("admin answers");
            (response.status().as_u16(), response.text().await.unwrap_or_default())
        }
    };
    assert_eq!(debug(None).await.0, 403);
    assert_eq!(debug(Some(istio_token(&client, NS, SA).await)).await.0, 403);
    let (status, syncz) = debug(Some(istio_token(&client, "istio-system", "operator").await)).await;
    assert_eq!(status, 200, "{syncz}");
    // The proxy is connected (over the secure port, the only one).
    assert!(syncz.contains(pod.node_id()), "{syncz}");

    // A token the API server did not mint is refused by the TokenReview.
    let refused =
        first_cds(channel().await.expect("TLS"), Some("not-a-token"), node(NS, SA)).await.expect_err("refused");
    assert_eq!(refused.code(), tonic::Code::Unauthenticated, "{refused:?}");
}
