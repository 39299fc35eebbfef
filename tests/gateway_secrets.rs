//! Gateway credentials (`credentialName` Secrets, SDS over ADS) reach only a gateway that proved
//! an identity of its namespace on the secure port. The attack: a client of the plaintext port
//! claims a `router~` node of a namespace and asks for `kubernetes://NAME`, by name, by wildcard,
//! over state of the world and delta; it must get no private key, and no listener waiting for
//! one. On the secure port, a gateway of namespace A gets A's secret, never B's.

use crate::common;

use std::time::Duration;

use common::ads::{state, InProcessAds};
use common::backend::Backend;
use common::certs::MeshRoot;
use common::config_dump::{dump_section, dynamic_listener_names};
use common::envoy::Envoy;
use common::ingress::Ingress;
use common::istio::{service_entry, NS};
use common::mesh::{assert_no_rejections, gateway_metadata, GATEWAY_NODE_ID};
use common::poll::{poll, CONVERGE_TIMEOUT, STARTUP_TIMEOUT};
use common::ports::free_port;
use common::secure::{client_cert, ISTIOD_NAME};
use envoy_types::pb::envoy::config::core::v3::Node;
use envoy_types::pb::envoy::config::listener::v3::Listener;
use envoy_types::pb::envoy::service::discovery::v3::aggregated_discovery_service_client::AggregatedDiscoveryServiceClient;
use envoy_types::pb::envoy::service::discovery::v3::{
    DeltaDiscoveryRequest, DeltaDiscoveryResponse, DiscoveryRequest, DiscoveryResponse,
};
use envoy_types::pb::google::protobuf::{value::Kind, Struct, Value};
use meshpilot::registry::kubernetes::{KubeObject, KubeSecret, PrivateKey};
use prost::Message;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::Channel;

const SDS: &str = "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.Secret";
const LDS: &str = "type.googleapis.com/envoy.config.listener.v3.Listener";
/// What the attacker hopes to read, per namespace.
const KEY_A: &str = "-----BEGIN PRIVATE KEY-----\nns-a-private-key-material\n-----END PRIVATE KEY-----\n";
const KEY_B: &str = "-----BEGIN PRIVATE KEY-----\nns-b-private-key-material\n-----END PRIVATE KEY-----\n";
/// How long a client waits to be sure nothing more comes.
const QUIET: Duration = Duration::from_millis(1500);

/// A Gateway selecting `istio: ingressgateway` with HTTP on 8080 and HTTPS (credential `web-cert`) on 8443.
const GATEWAY: &str = "apiVersion: networking.istio.io/v1\nkind: Gateway\nmetadata: {name: gw, namespace: ns-a}\n\
spec:\n  selector: {istio: ingressgateway}\n  servers:\n  - port: {number: 8080, name: http, protocol: HTTP}\n    \
hosts: [\"*\"]\n  - port: {number: 8443, name: https, protocol: HTTPS}\n    hosts: [web.example.com]\n    \
tls: {mode: SIMPLE, credentialName: web-cert}\n";

fn secret(ns: &str, key: &str) -> KubeObject {
    KubeObject::Secret(KubeSecret {
        name: "web-cert".into(),
        namespace: ns.into(),
        cert_chain: format!("-----BEGIN CERTIFICATE-----\n{ns}-certificate\n-----END CERTIFICATE-----\n"),
        private_key: PrivateKey(key.into()),
        ca: String::new(),
    })
}

async fn server() -> InProcessAds {
    InProcessAds::start(&state(GATEWAY, vec![secret("ns-a", KEY_A), secret("ns-b", KEY_B)])).await
}

/// A gateway node of `ns` (service account `gw`), as pilot-agent describes one.
fn gateway_node(ns: &str) -> Node {
    let text = |s: &str| Value { kind: Some(Kind::StringValue(s.to_string())) };
    let labels = Value {
        kind: Some(Kind::StructValue(Struct { fields: [("istio".to_string(), text("ingressgateway"))].into() })),
    };
    let fields = [("NAMESPACE", text(ns)), ("SERVICE_ACCOUNT", text("gw")), ("LABELS", labels)]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect();
    Node {
        id: format!("router~10.1.0.9~gw-1.{ns}~{ns}.svc.cluster.local"),
        metadata: Some(Struct { fields }),
        ..Default::default()
    }
}

/// Every response of `responses` until the server is quiet for [`QUIET`] or ends the stream.
async fn until_quiet<T>(mut responses: tonic::Streaming<T>) -> Result<Vec<T>, tonic::Status> {
    let mut got = Vec::new();
    while let Ok(next) = tokio::time::timeout(QUIET, responses.message()).await {
        match next? {
            Some(r) => got.push(r),
            None => break,
        }
    }
    Ok(got)
}

/// A state-of-the-world stream as `node`: sends `requests` (the node on the first), then
/// collects every response until the server is quiet or ends the stream.
async fn sotw(
    channel: Channel,
    node: Node,
    requests: &[(&str, &[&str])],
) -> Result<Vec<DiscoveryResponse>, tonic::Status> {
    let (tx, rx) = mpsc::channel(8);
    for (i, (type_url, names)) in requests.iter().enumerate() {
        tx.send(DiscoveryRequest {
            node: (i == 0).then(|| node.clone()),
            type_url: type_url.to_string(),
            resource_names: names.iter().map(|n| n.to_string()).collect(),
            ..Default::default()
        })
        .await
        .expect("queued");
    }
    let mut client = AggregatedDiscoveryServiceClient::new(channel);
    let responses = client.stream_aggregated_resources(ReceiverStream::new(rx)).await?.into_inner();
    let got = until_quiet(responses).await;
    drop(tx);
    got
}

/// As [`sotw`], over delta xDS: each request subscribes to `names` of its type.
async fn delta(
    channel: Channel,
    node: Node,
    requests: &[(&str, &[&str])],
) -> Result<Vec<DeltaDiscoveryResponse>, tonic::Status> {
    let (tx, rx) = mpsc::channel(8);
    for (i, (type_url, names)) in requests.iter().enumerate() {
        tx.send(DeltaDiscoveryRequest {
            node: (i == 0).then(|| node.clone()),
            type_url: type_url.to_string(),
            resource_names_subscribe: names.iter().map(|n| n.to_string()).collect(),
            ..Default::default()
        })
        .await
        .expect("queued");
    }
    let mut client = AggregatedDiscoveryServiceClient::new(channel);
    let responses = client.delta_aggregated_resources(ReceiverStream::new(rx)).await?.into_inner();
    let got = until_quiet(responses).await;
    drop(tx);
    got
}

/// Whether any of `bytes` holds either namespace's private key.
fn leaks(bytes: &[Vec<u8>]) -> Vec<&'static str> {
    let holds = |key: &str| bytes.iter().any(|b| b.windows(key.len()).any(|w| w == key.as_bytes()));
    [("ns-a", KEY_A), ("ns-b", KEY_B)].into_iter().filter(|(_, k)| holds(k)).map(|(ns, _)| ns).collect()
}

fn listener_names(responses: &[DiscoveryResponse]) -> Vec<String> {
    let lds = responses.iter().filter(|r| r.type_url == LDS).flat_map(|r| &r.resources);
    lds.map(|any| Listener::decode(any.value.as_slice()).expect("a listener").name).collect()
}

#[tokio::test]
async fn a_forged_gateway_on_the_plaintext_port_gets_no_private_key() {
    let ads = server().await;
    let by_name: &[&str] = &["kubernetes://web-cert"];
    let wildcard: &[&str] = &[];

    // State of the world: listeners first (the stream is served), then the secret by name.
    let got = sotw(ads.plaintext_channel().await, gateway_node("ns-a"), &[(LDS, &[]), (SDS, by_name)])
        .await
        .expect("the stream is served");
    let bytes: Vec<Vec<u8>> = got.iter().map(Message::encode_to_vec).collect();
    assert_eq!(leaks(&bytes), Vec::<&str>::new(), "private keys over plaintext SotW");
    assert!(!got.iter().any(|r| r.type_url == SDS), "no SDS answer: {got:?}");
    assert_eq!(listener_names(&got), ["0.0.0.0_8080"], "HTTP is served; HTTPS needing the secret is left out");

    // A wildcard SDS request, and one naming the other namespace's copy.
    for names in [wildcard, by_name] {
        let got = sotw(ads.plaintext_channel().await, gateway_node("ns-b"), &[(SDS, names)]).await.expect("served");
        let bytes: Vec<Vec<u8>> = got.iter().map(Message::encode_to_vec).collect();
        assert_eq!(leaks(&bytes), Vec::<&str>::new(), "private keys over plaintext SotW for {names:?}");
    }

    // Delta: by name, and by wildcard.
    for names in [by_name, &["*"][..], wildcard] {
        let got = delta(ads.plaintext_channel().await, gateway_node("ns-a"), &[(SDS, names)]).await.expect("served");
        let bytes: Vec<Vec<u8>> = got.iter().map(Message::encode_to_vec).collect();
        assert_eq!(leaks(&bytes), Vec::<&str>::new(), "private keys over plaintext delta for {names:?}");
        let secrets: Vec<&str> = got.iter().flat_map(|r| &r.resources).map(|r| r.name.as_str()).collect();
        assert!(secrets.is_empty(), "delta sent secrets {secrets:?}");
    }
    assert!(ads.metric("meshpilot_xds_secrets_withheld").is_some_and(|n| n >= 6.0), "each refusal is counted");
}

#[tokio::test]
async fn on_the_secure_port_a_gateway_gets_its_own_namespaces_secret_only() {
    let ads = server().await;
    let as_a = "spiffe://cluster.local/ns/ns-a/sa/gw";

    let got =
        sotw(ads.secure_channel(as_a).await, gateway_node("ns-a"), &[(LDS, &[]), (SDS, &["kubernetes://web-cert"])])
            .await
            .expect("served");
    assert_eq!(listener_names(&got), ["0.0.0.0_8080", "0.0.0.0_8443"], "the HTTPS server too");
    let bytes: Vec<Vec<u8>> = got.iter().filter(|r| r.type_url == SDS).map(Message::encode_to_vec).collect();
    assert_eq!(leaks(&bytes), ["ns-a"], "its own key, and only its own");

    // Delta, wildcard: still only ns-a's.
    let got = delta(ads.secure_channel(as_a).await, gateway_node("ns-a"), &[(SDS, &["*"])]).await.expect("served");
    let bytes: Vec<Vec<u8>> = got.iter().map(Message::encode_to_vec).collect();
    assert_eq!(leaks(&bytes), ["ns-a"]);

    // ns-a's identity claiming ns-b's gateway: refused before anything is generated.
    let refused = sotw(ads.secure_channel(as_a).await, gateway_node("ns-b"), &[(SDS, &["kubernetes://web-cert"])])
        .await
        .expect_err("refused");
    assert_eq!(refused.code(), tonic::Code::PermissionDenied, "{refused:?}");
    assert_eq!(ads.metric("meshpilot_xds_secrets_withheld"), Some(0.0));
}

/// GET / over TLS to 127.0.0.1:`port` with SNI `host`, trusting only the test's mesh root: the
/// status line, or why the handshake or request failed.
async fn https_get(port: u16, host: &str) -> Result<String, String> {
    use rustls::pki_types::{pem::PemObject, CertificateDer, ServerName};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut roots = rustls::RootCertStore::empty();
    let root = CertificateDer::from_pem_slice(MeshRoot::get().pem().as_bytes()).map_err(|e| format!("{e:?}"))?;
    roots.add(root).map_err(|e| e.to_string())?;
    let config =
        rustls::ClientConfig::builder_with_provider(std::sync::Arc::new(rustls::crypto::ring::default_provider()))
            .with_safe_default_protocol_versions()
            .map_err(|e| e.to_string())?
            .with_root_certificates(roots)
            .with_no_client_auth();
    let tcp = tokio::net::TcpStream::connect(("127.0.0.1", port)).await.map_err(|e| e.to_string())?;
    let name = ServerName::try_from(host.to_string()).map_err(|e| e.to_string())?;
    let connector = tokio_rustls::TlsConnector::from(std::sync::Arc::new(config));
    let mut tls = tokio::time::timeout(Duration::from_secs(5), connector.connect(name, tcp))
        .await
        .map_err(|_| "handshake timed out".to_string())?
        .map_err(|e| format!("handshake: {e}"))?;
    let request = format!("GET / HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n");
    tls.write_all(request.as_bytes()).await.map_err(|e| e.to_string())?;
    let mut answer = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(5), tls.read_to_end(&mut answer)).await;
    Ok(String::from_utf8_lossy(&answer).lines().next().unwrap_or_default().to_string())
}

/// A real Envoy gateway: on the plaintext port it gets its HTTP server and no secret (no HTTPS
/// listener, nothing in its secrets dump); on the secure port, with a client certificate of its
/// namespace, it serves HTTPS with the Secret's certificate.
#[tokio::test]
async fn a_real_envoy_gateway_serves_https_only_from_the_secure_port() {
    const HOST: &str = "secure.example.com";
    let backend = Backend::builder("web-v1").start();
    let (http, https) = (free_port(), free_port());
    let gateway = format!(
        "apiVersion: networking.istio.io/v1\nkind: Gateway\nmetadata: {{name: gw, namespace: {NS}}}\nspec:\n  \
         selector: {{istio: ingressgateway}}\n  servers:\n  - port: {{number: {http}, name: http, protocol: HTTP}}\n    \
         hosts: [\"*\"]\n  - port: {{number: {https}, name: https, protocol: HTTPS}}\n    hosts: [{HOST}]\n    \
         tls: {{mode: SIMPLE, credentialName: shop-cert}}\n---\n\
         apiVersion: networking.istio.io/v1\nkind: VirtualService\nmetadata: {{name: web, namespace: {NS}}}\nspec:\n  \
         hosts: [\"*\"]\n  gateways: [gw]\n  http:\n  - route:\n    - destination: {{host: web.{NS}.svc.cluster.local}}\n---\n{}",
        service_entry("web", 80, &[(&backend, "v1")])
    );
    let leaf = MeshRoot::get().server(&[HOST]);
    let credential = KubeObject::Secret(KubeSecret {
        name: "shop-cert".into(),
        namespace: "istio-system".into(),
        cert_chain: leaf.cert.clone(),
        private_key: PrivateKey(leaf.key.clone()),
        ca: String::new(),
    });
    let ads = InProcessAds::start(&state(&gateway, vec![credential])).await;

    // Plaintext: HTTP served, the HTTPS server left out, no secret in Envoy.
    let envoy = Envoy::builder(GATEWAY_NODE_ID, ads.plaintext).metadata(gateway_metadata()).start();
    envoy.wait_ready(STARTUP_TIMEOUT).await;
    Ingress::new(http, "anything.example.com").wait_backend("/", &[], "web-v1").await;
    let dump = envoy.config_dump().await;
    assert!(
        !dynamic_listener_names(&dump).contains(&format!("0.0.0.0_{https}")),
        "{:?}",
        dynamic_listener_names(&dump)
    );
    let secrets = dump_section(&dump, "SecretsConfigDump").cloned().unwrap_or_default();
    assert!(secrets["dynamic_active_secrets"].as_array().is_none_or(Vec::is_empty), "{secrets:#}");
    assert!(https_get(https, HOST).await.is_err(), "no HTTPS without the secure port");
    assert_no_rejections(&envoy).await;
    drop(envoy);

    // Secure port, a client certificate of the gateway's namespace: HTTPS with the Secret's certificate.
    let (cert, key) = client_cert(&ads.ca, "spiffe://cluster.local/ns/istio-system/sa/gateway");
    let envoy = Envoy::builder(GATEWAY_NODE_ID, ads.secure)
        .metadata(gateway_metadata())
        .xds_tls(ISTIOD_NAME, &ads.root, Some((&cert, &key)))
        .start();
    envoy.wait_ready(STARTUP_TIMEOUT).await;
    let mut last = Err(String::new());
    let served = poll(CONVERGE_TIMEOUT, async || {
        last = https_get(https, HOST).await;
        matches!(&last, Ok(status) if status.contains(" 200 "))
    })
    .await;
    assert!(served, "HTTPS with the Secret's certificate: {last:?}");
    assert_no_rejections(&envoy).await;
}
