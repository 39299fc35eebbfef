//! Gateway and sidecar routing through a real Envoy (1.40) configured by the meshpilot binary.
//!
//! Each test writes its own config directory (namespace `shop`: ServiceEntries with STATIC
//! endpoints at [`Backend`]s on 127.0.0.1, a Gateway selecting `istio: ingressgateway` on a free
//! port, VirtualServices, DestinationRules), starts `meshpilot standalone` on it and one Envoy,
//! then checks what Envoy holds (`/config_dump`, rejection stats) and where requests land.

use crate::common;

use std::collections::BTreeMap;

use common::backend::Backend;
use common::config_dump::*;
use common::envoy::Envoy;
use common::files::{temp_dir_with, write_files};
use common::ingress::{backend_of, Ingress};
use common::istio::*;
use common::mesh::*;
use common::meshpilot::Meshpilot;
use common::ports::free_port;

/// The host the gateway VirtualServices serve.
const HOST: &str = "shop.example.com";

/// One meshpilot, one gateway Envoy, and a client for the gateway listener.
struct GatewaySetup {
    port: u16,
    config: tempfile::TempDir,
    _cp: Meshpilot,
    envoy: Envoy,
    ingress: Ingress,
}

/// Writes `files` plus `gateway.yaml` (Gateway `shop/gw` on a free port) into a fresh config
/// dir, starts meshpilot and the gateway Envoy (ready, nothing rejected).
async fn start_gateway_setup(files: &[(&str, String)]) -> GatewaySetup {
    let port = free_port();
    let config = temp_dir_with(&[("gateway.yaml", gateway(port).as_str())]);
    for (name, text) in files {
        write_files(config.path(), &[(name, text.as_str())]);
    }
    let cp = start_meshpilot(config.path()).await;
    let envoy = start_gateway(&cp).await;
    GatewaySetup { port, config, _cp: cp, envoy, ingress: Ingress::new(port, HOST) }
}

/// A VirtualService `NAME` for [`HOST`] bound to `shop/gw`, with `http` (YAML list items, indented
/// as under `spec.http`, i.e. starting with `  - `).
fn gateway_vs(name: &str, http: &str) -> String {
    format!(
        "apiVersion: networking.istio.io/v1\nkind: VirtualService\nmetadata:\n  name: {name}\n  namespace: shop\nspec:\n  \
         hosts: [{HOST}]\n  gateways: [shop/gw]\n  http:\n{}",
        dedent(http)
            .lines()
            .map(|l| if l.is_empty() { String::new() } else { format!("  {l}") })
            .collect::<Vec<_>>()
            .join("\n")
    )
}

#[tokio::test]
async fn gateway_routes_by_uri_and_header() {
    let reviews_v1 = Backend::new("reviews-v1");
    let reviews_v2 = Backend::new("reviews-v2");
    let ratings = Backend::new("ratings-v1");
    let details = Backend::new("details-v1");
    let services = documents(&[
        service_entry("reviews", 80, &[(&reviews_v1, "v1"), (&reviews_v2, "v2")]),
        service_entry("ratings", 80, &[(&ratings, "v1")]),
        service_entry("details", 80, &[(&details, "v1")]),
        destination_rule("reviews", &["v1", "v2"], None),
    ]);
    let vs = gateway_vs(
        "shop",
        r#"
        - name: alice
          match:
          - headers:
              x-user: {exact: alice}
          route:
          - destination: {host: reviews, subset: v2}
        - name: details-exact
          match:
          - uri: {exact: /details}
          route:
          - destination: {host: details.shop.svc.cluster.local, port: {number: 80}}
        - name: ratings-regex
          match:
          - uri: {regex: "/ratings/[0-9]+"}
          route:
          - destination: {host: ratings}
        - name: reviews-prefix
          match:
          - uri: {prefix: /reviews}
          route:
          - destination: {host: reviews, subset: v1}
        "#,
    );
    let s = start_gateway_setup(&[("services.yaml", services), ("routes.yaml", vs)]).await;
    let port = s.port;

    // What Envoy holds.
    let dump = s.envoy.config_dump().await;
    let listener = dynamic_listener(&dump, &format!("0.0.0.0_{port}"))
        .unwrap_or_else(|| panic!("no listener 0.0.0.0_{port}; listeners: {:?}", dynamic_listener_names(&dump)));
    assert_eq!(listener["active_state"]["listener"]["address"]["socket_address"]["port_value"], port, "{listener:#}");
    let rc = dynamic_route_config(&dump, &format!("http.{port}"))
        .unwrap_or_else(|| panic!("no route config http.{port}; has {:?}", dynamic_route_config_names(&dump)));
    let vhosts = rc["route_config"]["virtual_hosts"].as_array().cloned().unwrap_or_default();
    assert!(
        vhosts.iter().any(|vh| vh["domains"].as_array().is_some_and(|d| d.iter().any(|d| d == HOST))),
        "no virtual host for {HOST} in http.{port}: {:#}",
        rc["route_config"]
    );
    let clusters = dynamic_cluster_names(&dump);
    for c in [
        cluster_name(80, "", "reviews"),
        cluster_name(80, "v1", "reviews"),
        cluster_name(80, "v2", "reviews"),
        cluster_name(80, "", "ratings"),
        cluster_name(80, "", "details"),
    ] {
        assert!(clusters.contains(&c), "cluster {c} missing; Envoy has {clusters:?}");
    }
    // Subset clusters hold only their version's endpoint.
    assert_eq!(endpoint_ports(&dump, &cluster_name(80, "v1", "reviews")), Some(vec![u64::from(reviews_v1.port())]));
    assert_eq!(endpoint_ports(&dump, &cluster_name(80, "v2", "reviews")), Some(vec![u64::from(reviews_v2.port())]));
    let mut both = vec![u64::from(reviews_v1.port()), u64::from(reviews_v2.port())];
    both.sort();
    assert_eq!(endpoint_ports(&dump, &cluster_name(80, "", "reviews")), Some(both));

    // Where requests land.
    let gw = &s.ingress;
    gw.wait_backend("/reviews/1", &[], "reviews-v1").await;
    for _ in 0..10 {
        assert_eq!(gw.backend("/reviews/1", &[]).await, "reviews-v1", "prefix /reviews → subset v1 only");
    }
    let echo = gw.echo("/reviews/1?x=1", &[]).await;
    assert_eq!(echo["backend"], "reviews-v1");
    assert_eq!(echo["path"], "/reviews/1?x=1", "path and query are passed through");
    assert_eq!(echo["host"], HOST, "Host is passed through");

    // exact
    assert_eq!(gw.backend("/details", &[]).await, "details-v1");
    assert_eq!(gw.get("/details/1", &[]).await.status, 404, "exact /details must not match /details/1");
    // regex (whole path)
    assert_eq!(gw.backend("/ratings/42", &[]).await, "ratings-v1");
    assert_eq!(gw.get("/ratings/abc", &[]).await.status, 404, "regex /ratings/[0-9]+ must not match /ratings/abc");
    assert_eq!(gw.get("/ratings/42/x", &[]).await.status, 404, "regex must match the whole path");
    // header: the first rule wins for any path
    for _ in 0..10 {
        assert_eq!(gw.backend("/reviews/1", &[("x-user", "alice")]).await, "reviews-v2");
    }
    assert_eq!(gw.backend("/details", &[("x-user", "alice")]).await, "reviews-v2");
    assert_eq!(gw.backend("/reviews/1", &[("x-user", "bob")]).await, "reviews-v1");
    // No route, unknown host.
    assert_eq!(gw.get("/nowhere", &[]).await.status, 404);
    assert_eq!(gw.with_host("other.example.com").get("/reviews/1", &[]).await.status, 404);

    assert_eq!(ratings.requests(), 1, "only /ratings/42 reached ratings");
    assert_eq!(details.requests(), 1, "only /details reached details (the alice request went to reviews-v2)");
    assert_no_rejections(&s.envoy).await;
    drop(s.config);
}

/// A root gateway VirtualService hands `/api` to a delegate in another namespace: the delegate's
/// rules route within the root's match and inherit its header rule; an edit of the delegate alone
/// reaches the gateway.
#[tokio::test]
async fn gateway_delegate_chain_routes_and_follows_delegate_edits() {
    let reviews = Backend::new("reviews-v1");
    let ratings = Backend::new("ratings-v1");
    let details = Backend::new("details-v1");
    let services = documents(&[
        service_entry("reviews", 80, &[(&reviews, "v1")]),
        service_entry("ratings", 80, &[(&ratings, "v1")]),
        service_entry("details", 80, &[(&details, "v1")]),
    ]);
    let root = gateway_vs(
        "shop",
        r#"
        - name: api
          match:
          - uri: {prefix: /api}
          headers:
            response: {set: {x-root: shop}}
          delegate: {name: api, namespace: team}
        - name: rest
          route:
          - destination: {host: details}
        "#,
    );
    let delegate = |v2_host: &str| {
        let rules = [
            format!("- name: v2\n  match: [{{uri: {{prefix: /api/v2}}}}]\n  route: [{{destination: {{host: {v2_host}}}}}]"),
            "- name: outside\n  match: [{uri: {prefix: /other}}]\n  route: [{destination: {host: ratings.shop.svc.cluster.local}}]".into(),
            "- name: rest\n  route: [{destination: {host: reviews.shop.svc.cluster.local}}]".into(),
        ];
        let http: String = rules.iter().flat_map(|r| r.lines()).map(|l| format!("  {l}\n")).collect();
        format!("apiVersion: networking.istio.io/v1\nkind: VirtualService\nmetadata: {{name: api, namespace: team}}\nspec:\n  http:\n{http}")
    };
    let s = start_gateway_setup(&[
        ("services.yaml", services),
        ("routes.yaml", root),
        ("delegate.yaml", delegate("ratings.shop.svc.cluster.local")),
    ])
    .await;
    let gw = &s.ingress;
    gw.wait_backend("/api/v2/x", &[], "ratings-v1").await;
    assert_eq!(gw.backend("/api/v1/x", &[]).await, "reviews-v1", "the delegate's catch-all, within /api");
    assert_eq!(gw.backend("/other", &[]).await, "details-v1", "a delegate rule outside /api is dropped");
    assert_eq!(gw.backend("/", &[]).await, "details-v1", "the root's own rule");
    let r = gw.get("/api/v2/x", &[]).await;
    assert_eq!(r.header("x-root"), Some("shop"), "the root's headers are inherited: {r:?}");
    let dump = s.envoy.config_dump().await;
    let rc = dynamic_route_config(&dump, &format!("http.{}", s.port)).expect("the gateway's routes");
    let names: Vec<_> = rc["route_config"]["virtual_hosts"][0]["routes"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|r| r["name"].as_str())
        .collect();
    assert_eq!(names, ["api-v2", "api-rest", "rest"], "istiod's merged route names");

    // The delegate alone changes: the root's routes follow.
    write_files(s.config.path(), &[("delegate.yaml", delegate("details.shop.svc.cluster.local").as_str())]);
    gw.wait_backend("/api/v2/x", &[], "details-v1").await;
    assert_eq!(gw.backend("/api/v1/x", &[]).await, "reviews-v1");
    assert_no_rejections(&s.envoy).await;
    drop(s.config);
}

/// Locality failover through a real gateway Envoy in `us-east/zone-a`: with outlier detection (and
/// the mesh's default locality load balancing) its own zone's endpoint takes every request, the
/// other zone's is priority 1 in the assignment; when the local endpoint dies, traffic moves
/// there.
#[tokio::test]
async fn gateway_locality_failover_moves_traffic_when_the_local_endpoint_dies() {
    let local = Backend::new("reviews-zone-a");
    let remote = Backend::new("reviews-zone-b");
    let endpoint = |b: &Backend, zone: &str| {
        format!("  - {{address: {}, ports: {{http: {}}}, locality: us-east/{zone}}}\n", b.ip(), b.port())
    };
    let services = format!(
        "apiVersion: networking.istio.io/v1\nkind: ServiceEntry\nmetadata: {{name: reviews, namespace: shop}}\nspec:\n  \
         hosts: [{host}]\n  location: MESH_INTERNAL\n  resolution: STATIC\n  \
         ports: [{{number: 80, name: http, protocol: HTTP}}]\n  endpoints:\n{a}{b}---\n\
         apiVersion: networking.istio.io/v1\nkind: DestinationRule\nmetadata: {{name: reviews, namespace: shop}}\nspec:\n  \
         host: {host}\n  trafficPolicy:\n    outlierDetection: {{consecutive5xxErrors: 1, interval: 1s, \
         baseEjectionTime: 60s, maxEjectionPercent: 100}}\n",
        host = fqdn("reviews"),
        a = endpoint(&local, "zone-a"),
        b = endpoint(&remote, "zone-b"),
    );
    let vs = gateway_vs("shop", "        - route:\n          - destination: {host: reviews}\n");
    let port = free_port();
    let config = temp_dir_with(&[("gateway.yaml", gateway(port).as_str())]);
    write_files(config.path(), &[("services.yaml", services.as_str()), ("routes.yaml", vs.as_str())]);
    let cp = start_meshpilot(config.path()).await;
    let envoy = Envoy::builder(GATEWAY_NODE_ID, cp.xds_addr())
        .metadata(gateway_metadata())
        .locality("us-east", "zone-a", "")
        .start();
    envoy.wait_ready(common::poll::STARTUP_TIMEOUT).await;
    let gw = Ingress::new(port, HOST);
    gw.wait_backend("/", &[], "reviews-zone-a").await;

    // What Envoy holds: the client's zone first, the other zone as the next priority.
    let dump = envoy.config_dump().await;
    let cla = load_assignment(&dump, &cluster_name(80, "", "reviews")).expect("the reviews assignment");
    let mut priorities: Vec<(String, u64)> = cla["endpoints"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|l| (l["locality"]["zone"].as_str().unwrap_or_default().to_string(), l["priority"].as_u64().unwrap_or(0)))
        .collect();
    priorities.sort();
    assert_eq!(priorities, [("zone-a".to_string(), 0), ("zone-b".to_string(), 1)], "{cla:#}");
    for i in 0..20 {
        assert_eq!(gw.backend(&format!("/r/{i}"), &[]).await, "reviews-zone-a", "priority 0 takes everything");
    }
    assert_eq!(remote.requests(), 0);

    // The local endpoint dies: outlier detection ejects it and Envoy fails over to zone-b.
    drop(local);
    gw.wait_backend("/", &[], "reviews-zone-b").await;
    for i in 0..10 {
        assert_eq!(gw.backend(&format!("/after/{i}"), &[]).await, "reviews-zone-b");
    }
    assert_no_rejections(&envoy).await;
    drop(config);
}

/// AUTO_PASSTHROUGH through a real gateway Envoy: a TLS client offering Istio's mutual TLS ALPN
/// with Istio's SNI for a service is forwarded, unterminated, to that service's endpoint (one
/// that takes Istio's mutual TLS); an SNI for no service, or a connection without an Istio ALPN,
/// reaches nothing.
#[tokio::test]
async fn gateway_auto_passthrough_routes_by_istio_sni() {
    use std::sync::{Arc, Mutex};
    use tokio::io::AsyncReadExt;

    // The endpoint: records the first bytes of every connection (the client's ClientHello).
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let backend = listener.local_addr().expect("addr");
    let seen: Arc<Mutex<Vec<Vec<u8>>>> = Arc::default();
    let record = seen.clone();
    let accept = tokio::spawn(async move {
        while let Ok((mut conn, _)) = listener.accept().await {
            let mut buf = vec![0u8; 4096];
            let n = tokio::time::timeout(std::time::Duration::from_secs(5), conn.read(&mut buf)).await;
            let n = n.ok().and_then(Result::ok).unwrap_or(0);
            record.lock().expect("lock").push(buf[..n].to_vec());
        }
    });
    let port = free_port();
    let host = fqdn("reviews");
    let files = format!(
        "apiVersion: networking.istio.io/v1\nkind: ServiceEntry\nmetadata: {{name: reviews, namespace: shop}}\nspec:\n  \
         hosts: [{host}]\n  location: MESH_INTERNAL\n  resolution: STATIC\n  ports: [{{number: 80, name: tls, protocol: TLS}}]\n  \
         endpoints: [{{address: 127.0.0.1, ports: {{tls: {bp}}}, labels: {{security.istio.io/tlsMode: istio}}}}]\n---\n\
         apiVersion: networking.istio.io/v1\nkind: Gateway\nmetadata: {{name: eastwest, namespace: shop}}\nspec:\n  \
         selector: {{istio: ingressgateway}}\n  servers:\n  - port: {{number: {port}, name: tls, protocol: TLS}}\n    \
         hosts: [\"*.shop.svc.cluster.local\"]\n    tls: {{mode: AUTO_PASSTHROUGH}}\n",
        bp = backend.port(),
    );
    let config = temp_dir_with(&[("mesh.yaml", files.as_str())]);
    let cp = start_meshpilot(config.path()).await;
    let envoy = start_gateway(&cp).await;

    // A TLS handshake towards the gateway, offering `alpn` for `sni`; the handshake itself fails
    // (the endpoint is no TLS server): what matters is where the ClientHello goes.
    let hello = |sni: String, alpn: &'static str| async move {
        let roots = rustls::RootCertStore::empty();
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut tls = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .expect("versions")
            .with_root_certificates(roots)
            .with_no_client_auth();
        tls.alpn_protocols = vec![alpn.as_bytes().to_vec()];
        let connector = tokio_rustls::TlsConnector::from(Arc::new(tls));
        let name = rustls::pki_types::ServerName::try_from(sni).expect("an SNI rustls accepts");
        let Ok(tcp) = tokio::net::TcpStream::connect(("127.0.0.1", port)).await else { return };
        let _ = tokio::time::timeout(std::time::Duration::from_secs(3), connector.connect(name, tcp)).await;
    };
    let sni = format!("outbound_.80_._.{host}");
    let reached = common::poll::poll(common::poll::CONVERGE_TIMEOUT, async || {
        hello(sni.clone(), "istio").await;
        seen.lock().expect("lock").iter().any(|b| contains(b, sni.as_bytes()))
    })
    .await;
    assert!(reached, "the ClientHello for {sni} never reached the endpoint");
    let before = seen.lock().expect("lock").len();
    hello(format!("outbound_.80_._.{}", fqdn("nothing")), "istio").await;
    hello(sni.clone(), "h2").await;
    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    assert_eq!(seen.lock().expect("lock").len(), before, "an unknown SNI or a non-Istio ALPN was forwarded");
    let dump = envoy.config_dump().await;
    assert!(dynamic_cluster(&dump, &sni).is_some(), "no SNI-DNAT cluster {sni}");
    assert_no_rejections(&envoy).await;
    accept.abort();
    drop(config);
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

#[tokio::test]
async fn gateway_weighted_split_80_20() {
    let v1 = Backend::new("reviews-v1");
    let v2 = Backend::new("reviews-v2");
    let services = documents(&[
        service_entry("reviews", 80, &[(&v1, "v1"), (&v2, "v2")]),
        destination_rule("reviews", &["v1", "v2"], None),
    ]);
    let vs = gateway_vs(
        "shop",
        r#"
        - name: split
          route:
          - destination: {host: reviews, subset: v1}
            weight: 80
          - destination: {host: reviews, subset: v2}
            weight: 20
        "#,
    );
    let s = start_gateway_setup(&[("services.yaml", services), ("routes.yaml", vs)]).await;
    s.ingress.wait_answer("/", &[], "a backend's 200", |r| backend_of(r).is_some()).await;

    const N: usize = 600;
    let mut counts: BTreeMap<String, usize> = BTreeMap::new();
    for i in 0..N {
        let b = s.ingress.backend(&format!("/item/{i}"), &[]).await;
        *counts.entry(b).or_default() += 1;
    }
    let n1 = counts.get("reviews-v1").copied().unwrap_or(0);
    let n2 = counts.get("reviews-v2").copied().unwrap_or(0);
    assert_eq!(n1 + n2, N, "only reviews-v1 and -v2 may answer: {counts:?}");
    let share = n1 as f64 * 100.0 / N as f64;
    assert!((74.0..=86.0).contains(&share), "v1 got {share:.1}% of {N} (expected 80 ± 6): {counts:?}");
    assert_no_rejections(&s.envoy).await;
    drop(s.config);
}

#[tokio::test]
async fn gateway_rewrites_uri_and_authority() {
    let reviews = Backend::new("reviews-v1");
    let services = service_entry("reviews", 80, &[(&reviews, "v1")]);
    let vs = gateway_vs(
        "shop",
        r#"
        - name: old-api
          match:
          - uri: {prefix: /old/}
          rewrite: {uri: /v2/}
          route:
          - destination: {host: reviews}
        - name: authority
          match:
          - uri: {prefix: /auth/}
          rewrite: {authority: reviews.internal.example}
          route:
          - destination: {host: reviews}
        - name: rest
          route:
          - destination: {host: reviews}
        "#,
    );
    let s = start_gateway_setup(&[("services.yaml", services), ("routes.yaml", vs)]).await;
    let gw = &s.ingress;
    gw.wait_backend("/", &[], "reviews-v1").await;

    let echo = gw.echo("/old/items/7?q=1", &[]).await;
    assert_eq!(echo["path"], "/v2/items/7?q=1", "prefix /old/ rewritten to /v2/: {echo}");
    assert_eq!(echo["host"], HOST, "no authority rewrite on this rule: {echo}");

    let echo = gw.echo("/auth/me", &[]).await;
    assert_eq!(echo["host"], "reviews.internal.example", "authority rewritten: {echo}");
    assert_eq!(echo["path"], "/auth/me", "path untouched by an authority rewrite: {echo}");

    let echo = gw.echo("/plain", &[]).await;
    assert_eq!((echo["path"].as_str(), echo["host"].as_str()), (Some("/plain"), Some(HOST)), "{echo}");
    // A client-forged XFCC header never reaches a backend (istiod's SANITIZE_SET; a FORWARD mode would pass it).
    let forged = gw.echo("/plain", &[("x-forwarded-client-cert", "By=spiffe://cluster.local/ns/admin/sa/root")]).await;
    assert!(forged["headers"].get("x-forwarded-client-cert").is_none(), "forged XFCC passed the gateway: {forged}");
    assert_no_rejections(&s.envoy).await;
    drop(s.config);
}

#[tokio::test]
async fn gateway_fault_abort() {
    let reviews = Backend::new("reviews-v1");
    let services = service_entry("reviews", 80, &[(&reviews, "v1")]);
    let vs = gateway_vs(
        "shop",
        r#"
        - name: teapot
          match:
          - uri: {prefix: /teapot}
          fault:
            abort:
              httpStatus: 418
              percentage: {value: 100}
          route:
          - destination: {host: reviews}
        - name: rest
          route:
          - destination: {host: reviews}
        "#,
    );
    let s = start_gateway_setup(&[("services.yaml", services), ("routes.yaml", vs)]).await;
    let gw = &s.ingress;
    gw.wait_answer("/teapot", &[], "418 from the fault filter", |r| r.status == 418).await;
    let before = reviews.requests();
    for i in 0..20 {
        let r = gw.get(&format!("/teapot/{i}"), &[]).await;
        assert_eq!(r.status, 418, "abort at 100%: {r:?}");
    }
    assert_eq!(reviews.requests(), before, "aborted requests must not reach the backend");
    assert_eq!(gw.backend("/coffee", &[]).await, "reviews-v1", "the fault applies to its rule only");
    assert_no_rejections(&s.envoy).await;
    drop(s.config);
}

#[tokio::test]
async fn gateway_retries_on_5xx() {
    let bad = Backend::with_status("inventory-bad", 503);
    let good = Backend::new("inventory-good");
    let services = documents(&[
        service_entry("inventory", 80, &[(&bad, "v1"), (&good, "v1")]),
        destination_rule("inventory", &[], Some("{loadBalancer: {simple: ROUND_ROBIN}}")),
    ]);
    let vs = gateway_vs(
        "shop",
        r#"
        - name: inventory
          route:
          - destination: {host: inventory}
          retries:
            attempts: 3
            retryOn: 5xx
        "#,
    );
    let s = start_gateway_setup(&[("services.yaml", services), ("routes.yaml", vs)]).await;
    let gw = &s.ingress;
    gw.wait_backend("/", &[], "inventory-good").await;
    // Both endpoints are in the EDS assignment, so round robin does pick the failing one.
    let dump = s.envoy.config_dump().await;
    let mut both = vec![u64::from(bad.port()), u64::from(good.port())];
    both.sort();
    assert_eq!(endpoint_ports(&dump, &cluster_name(80, "", "inventory")), Some(both));

    bad.reset_requests();
    good.reset_requests();
    for i in 0..100 {
        let r = gw.get(&format!("/stock/{i}"), &[]).await;
        assert_eq!(backend_of(&r).as_deref(), Some("inventory-good"), "request {i} not retried to success: {r:?}");
    }
    assert!(bad.requests() > 0, "the failing endpoint got no request: retries were never exercised");
    assert_eq!(good.requests(), 100, "each request succeeds exactly once on the healthy endpoint");
    assert_no_rejections(&s.envoy).await;
    drop(s.config);
}

#[tokio::test]
async fn gateway_redirect() {
    let reviews = Backend::new("reviews-v1");
    let services = service_entry("reviews", 80, &[(&reviews, "v1")]);
    let vs = gateway_vs(
        "shop",
        r#"
        - name: moved
          match:
          - uri: {prefix: /old-page}
          redirect:
            uri: /new
            redirectCode: 302
        - name: rest
          route:
          - destination: {host: reviews}
        "#,
    );
    let s = start_gateway_setup(&[("services.yaml", services), ("routes.yaml", vs)]).await;
    let gw = &s.ingress;
    let r = gw.wait_answer("/old-page", &[], "a 302", |r| r.status == 302).await;
    let location = r.header("location").unwrap_or_else(|| panic!("302 without location: {r:?}"));
    assert!(location.ends_with("/new"), "location {location:?} should end in /new");
    assert!(location.contains(HOST), "location {location:?} keeps the host");
    let before = reviews.requests();
    let r = gw.get("/old-page/sub", &[]).await;
    assert_eq!(r.status, 302, "{r:?}");
    assert_eq!(reviews.requests(), before, "redirects are answered by Envoy");
    assert_eq!(gw.backend("/other", &[]).await, "reviews-v1");
    assert_no_rejections(&s.envoy).await;
    drop(s.config);
}

/// Config for a `client` sidecar: reviews (v1, v2) and ratings on port `port`, a Sidecar with an
/// egress listener bound to 127.0.0.1:`port`, and a mesh VirtualService for reviews (x-user alice
/// → v2, else v1).
fn sidecar_config(port: u16, v1: &Backend, v2: &Backend, ratings: &Backend) -> Vec<(&'static str, String)> {
    let services = documents(&[
        service_entry("reviews", port, &[(v1, "v1"), (v2, "v2")]),
        service_entry("ratings", port, &[(ratings, "v1")]),
        destination_rule("reviews", &["v1", "v2"], None),
    ]);
    let vs = reviews_alice_to_v2();
    vec![("services.yaml", services), ("reviews-vs.yaml", vs), ("sidecar.yaml", sidecar_resource(port))]
}

/// REGISTRY_ONLY through a real sidecar Envoy: a host the registry does not know is refused
/// with 502 (`block_all`), a known one still answers; switched back to ALLOW_ANY, the unknown
/// host goes to the passthrough cluster again.
#[tokio::test]
async fn sidecar_registry_only_refuses_an_unknown_host() {
    let v1 = Backend::new("reviews-v1");
    let v2 = Backend::new("reviews-v2");
    let ratings = Backend::new("ratings-v1");
    let port = free_port();
    let config = temp_dir_with(&[]);
    for (name, text) in sidecar_config(port, &v1, &v2, &ratings) {
        write_files(config.path(), &[(name, text.as_str())]);
    }
    let policy = |mode: &str| format!("{}  outboundTrafficPolicy: {{mode: {mode}}}\n", sidecar_resource(port));
    write_files(config.path(), &[("sidecar.yaml", policy("REGISTRY_ONLY").as_str())]);
    let cp = start_meshpilot(config.path()).await;
    let envoy = start_sidecar(&cp).await;
    let known = Ingress::new(port, &fqdn("reviews"));
    known.wait_backend("/", &[], "reviews-v1").await;
    let unknown = known.with_host("unknown.example.com");
    let r = unknown.wait_answer("/", &[], "a 502", |r| r.status == 502).await;
    assert!(backend_of(&r).is_none(), "an unknown host reached a backend: {r:?}");
    assert_eq!(known.backend("/", &[]).await, "reviews-v1", "a known host still answers");
    let last_vhost = |dump: &serde_json::Value| {
        let rc = dynamic_route_config(dump, &port.to_string()).expect("the listener's routes");
        let vhosts = rc["route_config"]["virtual_hosts"].as_array().cloned().unwrap_or_default();
        vhosts.last().map(|v| v["name"].as_str().unwrap_or_default().to_string())
    };
    assert_eq!(last_vhost(&envoy.config_dump().await).as_deref(), Some("block_all"));

    write_files(config.path(), &[("sidecar.yaml", policy("ALLOW_ANY").as_str())]);
    let allowed = common::poll::poll(common::poll::CONVERGE_TIMEOUT, async || {
        last_vhost(&envoy.config_dump().await).as_deref() == Some("allow_any")
    })
    .await;
    assert!(allowed, "ALLOW_ANY did not replace block_all");
    assert_no_rejections(&envoy).await;
    drop(config);
}

/// DestinationRules as istiod picks them, through two real sidecars: two rules of one host in one
/// namespace merge (each brings a subset the VirtualService routes to), and a rule with a workload
/// selector (TLS origination towards a plaintext backend) reaches only the workload it selects.
#[tokio::test]
async fn sidecars_get_merged_rules_and_a_per_workload_rule_only_where_it_selects() {
    let v1 = Backend::new("reviews-v1");
    let v2 = Backend::new("reviews-v2");
    let ratings = Backend::new("ratings-v1");
    let (client_port, canary_port) = (free_port(), free_port());
    let rule = |name: &str, body: &str| {
        format!("apiVersion: networking.istio.io/v1\nkind: DestinationRule\nmetadata: {{name: {name}, namespace: shop}}\nspec: {body}\n")
    };
    let sidecar = |name: &str, app: &str, port: u16| {
        format!(
            "apiVersion: networking.istio.io/v1\nkind: Sidecar\nmetadata: {{name: {name}, namespace: shop}}\nspec:\n  \
             workloadSelector: {{labels: {{app: {app}}}}}\n  egress:\n  - port: {{number: {port}, name: http, protocol: HTTP}}\n    \
             bind: 127.0.0.1\n    captureMode: NONE\n    hosts: [\"./*\"]\n"
        )
    };
    let host = |name: &str| fqdn(name);
    let files = [
        ("services.yaml", documents(&[
            service_entry("reviews", client_port, &[(&v1, "v1"), (&v2, "v2")]),
            // Ratings on both sidecars' ports (each listens on its own).
            format!(
                "apiVersion: networking.istio.io/v1\nkind: ServiceEntry\nmetadata: {{name: ratings, namespace: shop}}\nspec:\n  \
                 hosts: [{h}]\n  location: MESH_INTERNAL\n  resolution: STATIC\n  ports:\n  \
                 - {{number: {client_port}, name: http, protocol: HTTP}}\n  - {{number: {canary_port}, name: http-canary, protocol: HTTP}}\n  \
                 endpoints:\n  - {{address: {ip}, ports: {{http: {bp}, http-canary: {bp}}}, labels: {{app: ratings, version: v1}}}}\n",
                h = host("ratings"),
                ip = ratings.ip(),
                bp = ratings.port(),
            ),
        ])),
        ("rules.yaml", documents(&[
            rule("reviews-v1", &format!("{{host: {}, subsets: [{{name: v1, labels: {{version: v1}}}}]}}", host("reviews"))),
            rule("reviews-v2", &format!("{{host: {}, subsets: [{{name: v2, labels: {{version: v2}}}}]}}", host("reviews"))),
            rule("ratings-canary", &format!(
                "{{host: {}, workloadSelector: {{matchLabels: {{app: canary}}}}, trafficPolicy: {{tls: {{mode: SIMPLE}}}}}}",
                host("ratings")
            )),
        ])),
        ("reviews-vs.yaml", reviews_alice_to_v2()),
        ("sidecars.yaml", documents(&[sidecar("client", "client", client_port), sidecar("canary", "canary", canary_port)])),
    ];
    let config = temp_dir_with(&[]);
    for (name, text) in &files {
        write_files(config.path(), &[(name, text.as_str())]);
    }
    let cp = start_meshpilot(config.path()).await;
    let client = start_sidecar(&cp).await;
    let canary_id = "sidecar~127.0.0.1~canary-1.shop~shop.svc.cluster.local";
    let canary = Envoy::builder(canary_id, cp.xds_addr())
        .metadata(serde_json::json!({"NAMESPACE": "shop", "LABELS": {"app": "canary"}, "INTERCEPTION_MODE": "NONE"}))
        .start();
    canary.wait_ready(common::poll::STARTUP_TIMEOUT).await;

    // Merged: both rules' subsets exist and the VirtualService reaches each.
    let reviews = Ingress::new(client_port, &fqdn("reviews"));
    reviews.wait_backend("/", &[], "reviews-v1").await;
    for _ in 0..5 {
        assert_eq!(reviews.backend("/", &[]).await, "reviews-v1", "subset v1 of the first rule");
        assert_eq!(reviews.backend("/", &[("x-user", "alice")]).await, "reviews-v2", "subset v2 of the second rule");
    }
    // Per workload: only the canary originates TLS to the plaintext ratings backend, and fails.
    let from_client = Ingress::new(client_port, &fqdn("ratings"));
    from_client.wait_backend("/", &[], "ratings-v1").await;
    let from_canary = Ingress::new(canary_port, &fqdn("ratings"));
    let r = from_canary.wait_answer("/", &[], "a 503 (TLS to a plaintext backend)", |r| r.status == 503).await;
    assert!(backend_of(&r).is_none(), "the canary's rule was not applied: {r:?}");
    let dump = canary.config_dump().await;
    let cluster = dynamic_cluster(&dump, &cluster_name(canary_port, "", "ratings")).expect("ratings on the canary");
    assert!(cluster.to_string().contains("UpstreamTlsContext"), "canary's ratings cluster has no TLS: {cluster:#}");
    let dump = client.config_dump().await;
    let cluster = dynamic_cluster(&dump, &cluster_name(client_port, "", "ratings")).expect("ratings on the client");
    assert!(
        !cluster.to_string().contains("UpstreamTlsContext"),
        "the rule reached an unselected workload: {cluster:#}"
    );
    assert_no_rejections(&client).await;
    assert_no_rejections(&canary).await;
    drop(config);
}

#[tokio::test]
async fn sidecar_egress_listener_routes() {
    let v1 = Backend::new("reviews-v1");
    let v2 = Backend::new("reviews-v2");
    let ratings = Backend::new("ratings-v1");
    let port = free_port();
    let config = temp_dir_with(&[]);
    for (name, text) in sidecar_config(port, &v1, &v2, &ratings) {
        write_files(config.path(), &[(name, text.as_str())]);
    }
    let cp = start_meshpilot(config.path()).await;
    let envoy = start_sidecar(&cp).await;

    let dump = envoy.config_dump().await;
    let name = format!("127.0.0.1_{port}");
    let listener = dynamic_listener(&dump, &name)
        .unwrap_or_else(|| panic!("no listener {name}; listeners: {:?}", dynamic_listener_names(&dump)));
    let addr = &listener["active_state"]["listener"]["address"]["socket_address"];
    assert_eq!((addr["address"].as_str(), addr["port_value"].as_u64()), (Some("127.0.0.1"), Some(u64::from(port))));
    assert!(
        dynamic_route_config(&dump, &port.to_string()).is_some(),
        "no route config {port}; has {:?}",
        dynamic_route_config_names(&dump)
    );
    let clusters = dynamic_cluster_names(&dump);
    for c in [cluster_name(port, "", "reviews"), cluster_name(port, "v2", "reviews"), cluster_name(port, "", "ratings")]
    {
        assert!(clusters.contains(&c), "cluster {c} missing; Envoy has {clusters:?}");
    }

    let reviews = Ingress::new(port, &fqdn("reviews"));
    reviews.wait_backend("/", &[], "reviews-v1").await;
    for _ in 0..10 {
        assert_eq!(reviews.backend("/", &[]).await, "reviews-v1");
        assert_eq!(reviews.backend("/", &[("x-user", "alice")]).await, "reviews-v2");
    }
    let echo = reviews.echo("/r/1?x=2", &[]).await;
    assert_eq!(echo["path"], "/r/1?x=2");
    // Short names of a service in the proxy's own namespace are domains too.
    assert_eq!(reviews.with_host("reviews").backend("/", &[]).await, "reviews-v1");
    assert_eq!(reviews.with_host(&format!("reviews:{port}")).backend("/", &[]).await, "reviews-v1");
    // A service without VirtualService gets the default route.
    assert_eq!(reviews.with_host(&fqdn("ratings")).backend("/", &[]).await, "ratings-v1");
    assert_no_rejections(&envoy).await;
}

#[tokio::test]
async fn syncz_shows_gateway_and_sidecar_acked() {
    let v1 = Backend::new("reviews-v1");
    let v2 = Backend::new("reviews-v2");
    let ratings = Backend::new("ratings-v1");
    let sidecar_port = free_port();
    let gw_port = free_port();
    let config = temp_dir_with(&[]);
    for (name, text) in sidecar_config(sidecar_port, &v1, &v2, &ratings) {
        write_files(config.path(), &[(name, text.as_str())]);
    }
    let gw_vs = dedent(
        r#"
        apiVersion: networking.istio.io/v1
        kind: VirtualService
        metadata:
          name: shop
          namespace: shop
        spec:
          hosts: [shop.example.com]
          gateways: [gw]
          http:
          - route:
            - destination: {host: ratings}
        "#,
    );
    write_files(config.path(), &[("gateway.yaml", gateway(gw_port).as_str()), ("gateway-vs.yaml", gw_vs.as_str())]);
    let cp = start_meshpilot(config.path()).await;
    let gateway = start_gateway(&cp).await;
    let sidecar = start_sidecar(&cp).await;

    // Both proxies route (so each has all four types).
    Ingress::new(gw_port, HOST).wait_backend("/", &[], "ratings-v1").await;
    Ingress::new(sidecar_port, &fqdn("reviews")).wait_backend("/", &[], "reviews-v1").await;

    let syncz = wait_synced(&cp, &[GATEWAY_NODE_ID, SIDECAR_NODE_ID]).await;
    let conns = syncz.as_array().expect("syncz is a list");
    for id in [GATEWAY_NODE_ID, SIDECAR_NODE_ID] {
        let listed: Vec<_> = conns.iter().filter(|c| c["proxy"]["id"] == id).collect();
        assert_eq!(listed.len(), 1, "{id} should have exactly one connection: {syncz:#}");
        let conn = listed[0];
        for t in XDS_TYPES {
            let s = &conn["types"][t];
            assert_eq!(s["acked_version"], s["sent_version"], "{id} {t}: {s}");
            assert!(s["last_nack"].is_null(), "{id} {t} NACKed: {s}");
            assert!(s["sent_resources"].as_u64().unwrap_or(0) > 0, "{id} {t}: nothing sent: {s}");
        }
    }
    let gw_conn = conns.iter().find(|c| c["proxy"]["id"] == GATEWAY_NODE_ID).unwrap();
    assert_eq!(gw_conn["proxy"]["namespace"], "istio-system");
    let sc_conn = conns.iter().find(|c| c["proxy"]["id"] == SIDECAR_NODE_ID).unwrap();
    assert_eq!(sc_conn["proxy"]["namespace"], "shop");

    // Envoy's side agrees: what it holds carries the versions meshpilot saw acknowledged.
    for (envoy, conn) in [(&gateway, gw_conn), (&sidecar, sc_conn)] {
        assert_no_rejections(envoy).await;
        let dump = envoy.config_dump().await;
        let (cds, lds, _) = xds_versions(&dump, "");
        assert_eq!(conn["types"]["Cluster"]["acked_version"], cds.as_str(), "{}", envoy.node_id());
        assert_eq!(conn["types"]["Listener"]["acked_version"], lds.as_str(), "{}", envoy.node_id());
    }
}

/// A Sidecar egress listener with a port imports only the services with that port, as istiod
/// trims them: reviews, on port 80, gets neither a cluster nor a virtual host on the listener;
/// ratings, on the listener's port, is routed through it.
#[tokio::test]
async fn a_sidecar_egress_port_imports_only_the_services_of_that_port() {
    let v1 = Backend::new("reviews-v1");
    let v2 = Backend::new("reviews-v2");
    let ratings = Backend::new("ratings-v1");
    let port = free_port();
    let config = temp_dir_with(&[]);
    for (name, text) in sidecar_config(port, &v1, &v2, &ratings) {
        let text = if name == "services.yaml" {
            documents(&[
                service_entry("reviews", 80, &[(&v1, "v1"), (&v2, "v2")]),
                service_entry("ratings", port, &[(&ratings, "v1")]),
                destination_rule("reviews", &["v1", "v2"], None),
            ])
        } else {
            text
        };
        write_files(config.path(), &[(name, text.as_str())]);
    }
    let cp = start_meshpilot(config.path()).await;
    let envoy = start_sidecar(&cp).await;
    let rated = Ingress::new(port, &fqdn("ratings"));
    rated.wait_backend("/", &[], "ratings-v1").await;
    let dump = envoy.config_dump().await;
    let clusters = dynamic_cluster_names(&dump);
    assert!(clusters.contains(&cluster_name(port, "", "ratings")), "{clusters:?}");
    assert!(!clusters.iter().any(|c| c.contains("reviews")), "reviews is not imported: {clusters:?}");
    let rc = dynamic_route_config(&dump, &port.to_string()).expect("the listener's routes");
    let vhosts: Vec<&str> = rc["route_config"]["virtual_hosts"]
        .as_array()
        .map(|v| v.iter().filter_map(|h| h["name"].as_str()).collect())
        .unwrap_or_default();
    assert!(!vhosts.iter().any(|v| v.contains("reviews")), "{vhosts:?}");
    assert_eq!(v1.requests() + v2.requests(), 0);
    assert_no_rejections(&envoy).await;
}
