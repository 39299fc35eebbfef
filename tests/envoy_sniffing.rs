//! Protocol sniffing and the inbound side through a real Envoy configured by the meshpilot binary.
//!
//! The `client` sidecar runs without interception (no iptables here), so its outbound listeners
//! and its Sidecar's ingress listeners (captureMode NONE) bind 127.0.0.1 on ports chosen at run
//! time; the virtual inbound listener (a fixed port behind iptables) is covered with pilot-agent
//! in network namespaces elsewhere.

use crate::common;

use common::backend::Backend;
use common::config_dump::*;
use common::envoy::Envoy;
use common::files::temp_dir_with;
use common::ingress::Ingress;
use common::istio::*;
use common::mesh::*;
use common::poll::CONVERGE_TIMEOUT;
use common::ports::free_port;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// A ServiceEntry `reviews` on `port` with a port named `foo` and no protocol (unknown: sniffed),
/// endpoints v1 and v2.
fn unknown_protocol_reviews(port: u16, v1: &Backend, v2: &Backend) -> String {
    let ep = |b: &Backend, version: &str| {
        format!(
            "  - address: {}\n    ports: {{foo: {}}}\n    labels: {{app: reviews, version: {version}}}\n",
            b.ip(),
            b.port()
        )
    };
    format!(
        "apiVersion: networking.istio.io/v1\nkind: ServiceEntry\nmetadata:\n  name: reviews\n  namespace: {NS}\nspec:\n  \
         hosts: [{host}]\n  location: MESH_INTERNAL\n  resolution: STATIC\n  ports:\n  - {{number: {port}, name: foo}}\n  \
         endpoints:\n{}{}",
        ep(v1, "v1"),
        ep(v2, "v2"),
        host = fqdn("reviews"),
    )
}

/// Waits until Envoy's stat `name` is at least `min`.
async fn wait_stat(envoy: &Envoy, name: &str, min: u64) {
    let reached = envoy.wait_for(CONVERGE_TIMEOUT, async |e: &Envoy| e.stat(name).await.unwrap_or(0) >= min).await;
    assert!(reached, "stat {name} never reached {min}: {:?}", envoy.stat(name).await);
}

#[tokio::test]
async fn unknown_protocol_port_is_routed_as_http() {
    let v1 = Backend::new("reviews-v1");
    let v2 = Backend::new("reviews-v2");
    let port = free_port();
    let vs = reviews_alice_to_v2();
    let services =
        documents(&[unknown_protocol_reviews(port, &v1, &v2), destination_rule("reviews", &["v1", "v2"], None)]);
    let config = temp_dir_with(&[("services.yaml", services.as_str()), ("reviews-vs.yaml", vs.as_str())]);
    let cp = start_meshpilot(config.path()).await;
    let envoy = start_sidecar(&cp).await;

    let dump = envoy.config_dump().await;
    let name = format!("127.0.0.1_{port}");
    let listener = dynamic_listener(&dump, &name)
        .unwrap_or_else(|| panic!("no listener {name}; listeners: {:?}", dynamic_listener_names(&dump)));
    let filters: Vec<&str> = listener["active_state"]["listener"]["listener_filters"]
        .as_array()
        .map(|fs| fs.iter().filter_map(|f| f["name"].as_str()).collect())
        .unwrap_or_default();
    // As istiod: the HTTP inspector alone (no chain matches SNI); without the TLS inspector the
    // transport is raw_buffer, which the HTTP chain requires.
    assert_eq!(filters, ["envoy.filters.listener.http_inspector"]);
    assert!(dynamic_route_config(&dump, &port.to_string()).is_some(), "the sniffed port has route config {port}");

    // The header match applies: only an HTTP connection manager can do that, a TCP proxy would
    // spread the requests over both versions.
    let reviews = Ingress::new(port, &fqdn("reviews"));
    reviews.wait_backend("/", &[("x-user", "alice")], "reviews-v2").await;
    for _ in 0..10 {
        assert_eq!(reviews.backend("/", &[]).await, "reviews-v1");
        assert_eq!(reviews.backend("/", &[("x-user", "alice")]).await, "reviews-v2");
    }
    wait_stat(&envoy, &format!("http.outbound_{name};.downstream_rq_total"), 20).await;

    // Bytes that are not HTTP take the TCP chain to the service's cluster.
    let cluster = format!("outbound|{port}||{}", fqdn("reviews"));
    let mut raw = tokio::net::TcpStream::connect(("127.0.0.1", port)).await.expect("connect to the sniffed port");
    raw.write_all(b"PING\r\n").await.expect("write");
    let mut answer = [0u8; 64];
    let _ = tokio::time::timeout(CONVERGE_TIMEOUT, raw.read(&mut answer)).await;
    wait_stat(&envoy, &format!("tcp.{cluster}.downstream_cx_total"), 1).await;
    assert_no_rejections(&envoy).await;
}

#[tokio::test]
async fn sidecar_ingress_listeners_forward_to_the_default_endpoint() {
    let app = Backend::new("client-app");
    let (http_port, sniffed_port) = (free_port(), free_port());
    let sidecar = format!(
        "apiVersion: networking.istio.io/v1\nkind: Sidecar\nmetadata: {{name: client, namespace: {NS}}}\nspec:\n  \
         workloadSelector: {{labels: {{app: client}}}}\n  ingress:\n  \
         - port: {{number: {http_port}, protocol: HTTP, name: http}}\n    bind: 127.0.0.1\n    captureMode: NONE\n    \
         defaultEndpoint: 127.0.0.1:{app_port}\n  \
         - port: {{number: {sniffed_port}, name: custom}}\n    bind: 127.0.0.1\n    captureMode: NONE\n    \
         defaultEndpoint: 127.0.0.1:{app_port}\n",
        app_port = app.port()
    );
    let config = temp_dir_with(&[("sidecar.yaml", sidecar.as_str())]);
    let cp = start_meshpilot(config.path()).await;
    let envoy = start_sidecar(&cp).await;

    let dump = envoy.config_dump().await;
    for port in [http_port, sniffed_port] {
        let name = format!("127.0.0.1_{port}");
        assert!(dynamic_listener(&dump, &name).is_some(), "no listener {name}: {:?}", dynamic_listener_names(&dump));
        let cluster = format!("inbound|{port}||");
        let c = dynamic_cluster(&dump, &cluster)
            .unwrap_or_else(|| panic!("no cluster {cluster}: {:?}", dynamic_cluster_names(&dump)));
        let endpoint = &c["cluster"]["load_assignment"]["endpoints"][0]["lb_endpoints"][0]["endpoint"];
        let address = &endpoint["address"]["socket_address"];
        assert_eq!(
            (address["address"].as_str(), address["port_value"].as_u64()),
            (Some("127.0.0.1"), Some(u64::from(app.port()))),
            "{cluster} goes to the defaultEndpoint"
        );
    }
    assert!(!dynamic_listener_names(&dump).iter().any(|n| n == "virtualInbound"), "no interception: no virtualInbound");

    for port in [http_port, sniffed_port] {
        let inbound = Ingress::new(port, "client.shop.svc.cluster.local");
        inbound.wait_backend("/", &[], "client-app").await;
        // Both go through the inbound HTTP connection manager (the sniffed one after the HTTP inspector).
        wait_stat(&envoy, &format!("http.inbound_127.0.0.1_{port};.downstream_rq_total"), 1).await;
    }
    assert_no_rejections(&envoy).await;
}
