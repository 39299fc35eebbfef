//! Gateway TLS certificates as SDS secrets, with a real Envoy gateway and meshpilot watching a
//! real kube-apiserver: a server's `credentialName` Secret (in the gateway proxy's namespace) is
//! served by meshpilot over ADS on the secure port (the gateway authenticates with its service
//! account's token, as pilot-agent does) and presented to a TLS client with the server's SNI; a
//! server
//! whose certificate is a file the proxy lacks waits for that secret alone, while the proxy's
//! other listeners keep serving and nothing is rejected.

use crate::common;

use std::sync::Arc;
use std::time::Duration;

use common::backend::Backend;
use common::certs::MeshRoot;
use common::config_dump::{dump_section, dynamic_listener_names};
use common::envoy::Envoy;
use common::ingress::Ingress;
use common::istio::{service_entry, NS};
use common::kube::{apply, istio_token, KubeApi, ADMIN_TOKEN};
use common::mesh::{assert_no_rejections, gateway_metadata, GATEWAY_NODE_ID};
use common::meshpilot::Meshpilot;
use common::poll::{poll, CONVERGE_TIMEOUT, STARTUP_TIMEOUT};
use common::ports::{free_addr, free_port};
use common::secure::ISTIOD_NAME;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::Api;
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// The host the TLS server serves.
const SECURE_HOST: &str = "secure.example.com";
/// The gateway proxy's namespace, where Istio reads `credentialName` Secrets.
const GATEWAY_NS: &str = "istio-system";

/// The gateway: plain HTTP on `http`, HTTPS with `credentialName` on `https`.
fn gateway(http: u16, https: u16) -> String {
    format!(
        "apiVersion: networking.istio.io/v1\nkind: Gateway\nmetadata: {{name: gw, namespace: {NS}}}\nspec:\n  \
         selector: {{istio: ingressgateway}}\n  servers:\n  - port: {{number: {http}, name: http, protocol: HTTP}}\n    \
         hosts: [\"*\"]\n  - port: {{number: {https}, name: https, protocol: HTTPS}}\n    hosts: [{SECURE_HOST}]\n    \
         tls: {{mode: SIMPLE, credentialName: shop-cert}}\n"
    )
}

/// A second Gateway whose HTTPS server names certificate files the proxy does not have.
fn file_gateway(port: u16) -> String {
    format!(
        "apiVersion: networking.istio.io/v1\nkind: Gateway\nmetadata: {{name: files, namespace: {NS}}}\nspec:\n  \
         selector: {{istio: ingressgateway}}\n  servers:\n  - port: {{number: {port}, name: https-files, protocol: HTTPS}}\n    \
         hosts: [files.example.com]\n    tls: {{mode: SIMPLE, serverCertificate: /nonexistent/tls.crt, privateKey: \
         /nonexistent/tls.key}}\n"
    )
}

fn route() -> String {
    format!(
        "apiVersion: networking.istio.io/v1\nkind: VirtualService\nmetadata: {{name: web, namespace: {NS}}}\nspec:\n  \
         hosts: [\"*\"]\n  gateways: [gw, files]\n  http:\n  - route:\n    - destination: {{host: web.{NS}.svc.cluster.local}}\n"
    )
}

fn tls_secret(cert: &str, key: &str) -> String {
    let indent = |pem: &str| pem.lines().map(|l| format!("    {l}\n")).collect::<String>();
    format!(
        "apiVersion: v1\nkind: Secret\nmetadata: {{name: shop-cert, namespace: {GATEWAY_NS}}}\ntype: kubernetes.io/tls\n\
         stringData:\n  tls.crt: |\n{}  tls.key: |\n{}",
        indent(cert),
        indent(key)
    )
}

/// GET / over TLS to 127.0.0.1:`port` with SNI `host`, trusting only the test's mesh root:
/// the status line, or why the handshake or request failed.
async fn https_get(port: u16, host: &str) -> Result<String, String> {
    use rustls::pki_types::{CertificateDer, ServerName};
    let mut roots = rustls::RootCertStore::empty();
    let root = rustls::pki_types::pem::PemObject::from_pem_slice(MeshRoot::get().pem().as_bytes())
        .map_err(|e| format!("root PEM: {e:?}"))?;
    roots.add(CertificateDer::into_owned(root)).map_err(|e| e.to_string())?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_root_certificates(roots)
        .with_no_client_auth();
    let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
    let tcp = tokio::net::TcpStream::connect(("127.0.0.1", port)).await.map_err(|e| e.to_string())?;
    let name = ServerName::try_from(host.to_string()).map_err(|e| e.to_string())?;
    let mut tls = tokio::time::timeout(Duration::from_secs(5), connector.connect(name, tcp))
        .await
        .map_err(|_| "handshake timed out".to_string())?
        .map_err(|e| format!("handshake: {e}"))?;
    let request = format!("GET / HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n");
    tls.write_all(request.as_bytes()).await.map_err(|e| e.to_string())?;
    let mut answer = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(5), tls.read_to_end(&mut answer)).await;
    let text = String::from_utf8_lossy(&answer).to_string();
    Ok(text.lines().next().unwrap_or_default().to_string())
}

/// The root meshpilot publishes in the gateway namespace's `istio-ca-root-cert` ConfigMap.
async fn published_root(kube: &kube::Client) -> String {
    let configmaps: Api<ConfigMap> = Api::namespaced(kube.clone(), GATEWAY_NS);
    let mut root = None;
    let published = poll(STARTUP_TIMEOUT, async || {
        let map = configmaps.get_opt("istio-ca-root-cert").await.ok().flatten();
        root = map.and_then(|cm| cm.data).and_then(|d| d.get("root-cert.pem").cloned());
        root.is_some()
    })
    .await;
    assert!(published, "no istio-ca-root-cert ConfigMap in {GATEWAY_NS}");
    root.unwrap_or_default()
}

fn warming_listener_names(dump: &Value) -> Vec<String> {
    dump_section(dump, "ListenersConfigDump")
        .and_then(|s| s["dynamic_listeners"].as_array())
        .map(|ls| {
            ls.iter()
                .filter(|l| l.get("warming_state").is_some() && l.get("active_state").is_none())
                .filter_map(|l| l["name"].as_str().map(String::from))
                .collect()
        })
        .unwrap_or_default()
}

#[tokio::test]
async fn credential_name_is_served_over_sds_and_a_missing_file_holds_back_only_its_listener() {
    credentials_and_missing_files(false).await;
}

#[tokio::test]
async fn the_same_over_delta_xds() {
    credentials_and_missing_files(true).await;
}

/// The scenario, over state-of-the-world or delta ADS.
async fn credentials_and_missing_files(delta: bool) {
    let Some(api) = KubeApi::start().await else { return };
    let kube = api.admin().await;
    let backend = Backend::builder("web-v1").start();
    let (http, https, files) = (free_port(), free_port(), free_port());
    let leaf = MeshRoot::get().server(&[SECURE_HOST]);
    for object in [
        format!("apiVersion: v1\nkind: Namespace\nmetadata: {{name: {NS}}}\n"),
        format!("apiVersion: v1\nkind: Namespace\nmetadata: {{name: {GATEWAY_NS}}}\n"),
        format!("apiVersion: v1\nkind: ServiceAccount\nmetadata: {{name: gateway, namespace: {GATEWAY_NS}}}\n"),
        tls_secret(&leaf.cert, &leaf.key),
        service_entry("web", 80, &[(&backend, "v1")]),
        gateway(http, https),
        route(),
    ] {
        apply(&kube, &object).await;
    }
    let dir = api.dir().to_path_buf();
    let kubeconfig = api.write_kubeconfig(&dir, "meshpilot.kubeconfig", &api.url(), ADMIN_TOKEN);
    let cp =
        Meshpilot::standalone_on_kubernetes(kubeconfig).debounce_after("50ms").secure_xds(free_addr(), &[]).start();
    cp.wait_ready(STARTUP_TIMEOUT).await;
    // The gateway proves its namespace as pilot-agent does: its service account's token, over
    // TLS checked against the root meshpilot publishes. The plaintext port serves no secrets.
    let token = istio_token(&kube, GATEWAY_NS, "gateway").await;
    let root = published_root(&kube).await;
    // Istio's bootstrap defines pilot-agent's SDS cluster; nothing answers on it here.
    let sds = json!({"name": "sds-grpc", "type": "STATIC", "connect_timeout": "1s",
        "typed_extension_protocol_options": {"envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
            "@type": "type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions",
            "explicit_http_config": {"http2_protocol_options": {}}}},
        "load_assignment": {"cluster_name": "sds-grpc", "endpoints": [{"lb_endpoints": [{"endpoint": {"address":
            {"socket_address": {"address": "127.0.0.1", "port_value": free_port()}}}}]}]}});
    let builder = Envoy::builder(GATEWAY_NODE_ID, cp.secure_xds_addr())
        .metadata(gateway_metadata())
        .static_cluster(sds)
        .xds_tls(ISTIOD_NAME, &root, None)
        .xds_token(&token);
    let envoy = if delta { builder.delta() } else { builder }.start();
    envoy.wait_ready(STARTUP_TIMEOUT).await;
    let api_type = &envoy.bootstrap()["dynamic_resources"]["ads_config"]["api_type"];
    assert_eq!(api_type, if delta { "DELTA_GRPC" } else { "GRPC" });

    // The Secret's certificate, by SNI, verified against the root that signed it.
    let mut last = Err(String::new());
    let served = poll(CONVERGE_TIMEOUT, async || {
        last = https_get(https, SECURE_HOST).await;
        matches!(&last, Ok(status) if status.contains(" 200 "))
    })
    .await;
    assert!(served, "HTTPS with the Secret's certificate: {last:?}");
    let dump = envoy.config_dump().await;
    let secrets = dump_section(&dump, "SecretsConfigDump").cloned().unwrap_or_default();
    let active: Vec<&str> = secrets["dynamic_active_secrets"]
        .as_array()
        .map(|s| s.iter().filter_map(|s| s["name"].as_str()).collect())
        .unwrap_or_default();
    assert_eq!(active, ["kubernetes://shop-cert"], "secrets: {secrets:#}");
    assert!(!secrets.to_string().contains("PRIVATE KEY"), "Envoy's dump redacts the key");

    // A server whose certificate file the proxy lacks: its listener waits for the secret; the
    // rest of the proxy's config applies and serves.
    apply(&kube, &file_gateway(files)).await;
    let name = format!("0.0.0.0_{files}");
    let warming =
        poll(CONVERGE_TIMEOUT, async || warming_listener_names(&envoy.config_dump().await).contains(&name)).await;
    assert!(warming, "{name} is not warming: {:?}", dynamic_listener_names(&envoy.config_dump().await));
    Ingress::new(http, "anything.example.com").wait_backend("/", &[], "web-v1").await;
    assert!(matches!(https_get(https, SECURE_HOST).await, Ok(s) if s.contains(" 200 ")));
    assert!(https_get(files, "files.example.com").await.is_err(), "the file server has no certificate to serve");
    assert_no_rejections(&envoy).await;
}
