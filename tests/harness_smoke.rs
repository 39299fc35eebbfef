//! Exercises the integration-test harness (tests/common) itself: the HTTP backends, a real
//! Envoy, the HTTP helpers, and network namespaces (linked, dialed from the host).

use crate::common;

use std::path::Path;
use std::time::Duration;

use common::backend::Backend;
use common::config_dump::dump_section;
use common::envoy::{envoy_path, Envoy};
use common::http::{http_client, http_get, http_get_no_redirect, http_request};
use common::ingress::Ingress;
use common::meshpilot::Meshpilot;
use common::netns::NetNs;
use common::poll::{poll, CONVERGE_TIMEOUT, STARTUP_TIMEOUT};
use common::ports::{free_addr, free_port};
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Reads one HTTP/1.1 response (Content-Length framed) from `stream`,
/// keeping extra bytes in `buf`. Returns (status, lower-cased headers, body).
async fn read_response(stream: &mut TcpStream, buf: &mut Vec<u8>) -> (u16, Vec<(String, String)>, Vec<u8>) {
    let head_end = loop {
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break i + 4;
        }
        let mut tmp = [0u8; 4096];
        let n = stream.read(&mut tmp).await.unwrap();
        assert!(n > 0, "EOF before response head");
        buf.extend_from_slice(&tmp[..n]);
    };
    let head = String::from_utf8(buf.drain(..head_end).collect()).unwrap();
    let mut lines = head.split("\r\n");
    let status: u16 = lines.next().unwrap().split_whitespace().nth(1).unwrap().parse().unwrap();
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_string()))
        .collect();
    let len: usize =
        headers.iter().find(|(k, _)| k == "content-length").map(|(_, v)| v.parse().unwrap()).expect("content-length");
    while buf.len() < len {
        let mut tmp = [0u8; 4096];
        let n = stream.read(&mut tmp).await.unwrap();
        assert!(n > 0, "EOF in response body");
        buf.extend_from_slice(&tmp[..n]);
    }
    let body = buf.drain(..len).collect();
    (status, headers, body)
}

#[tokio::test]
async fn backend_echoes_over_keep_alive_and_closes_on_request() {
    let backend = Backend::new("reviews-v1");
    let mut stream = TcpStream::connect(backend.addr()).await.unwrap();
    let mut buf = Vec::new();

    // Two requests on one connection: GET with a query, POST with Content-Length.
    stream
        .write_all(b"GET /reviews/1?x=1&y=2 HTTP/1.1\r\nHost: reviews.default:9080\r\nX-Test: A\r\nX-Test: b\r\n\r\n")
        .await
        .unwrap();
    let (status, headers, body) = read_response(&mut stream, &mut buf).await;
    assert_eq!(status, 200);
    assert!(headers.contains(&("x-backend".into(), "reviews-v1".into())));
    assert!(!headers.iter().any(|(k, _)| k == "connection"));
    let v: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(v["backend"], "reviews-v1");
    assert_eq!(v["path"], "/reviews/1?x=1&y=2");
    assert_eq!(v["method"], "GET");
    assert_eq!(v["host"], "reviews.default:9080");
    assert_eq!(v["headers"]["x-test"], "A, b");
    assert_eq!(v["headers"]["host"], "reviews.default:9080");

    stream.write_all(b"POST /submit HTTP/1.1\r\nHost: h\r\nContent-Length: 11\r\n\r\nhello world").await.unwrap();
    let (status, _, body) = read_response(&mut stream, &mut buf).await;
    assert_eq!(status, 200);
    let v: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(v["method"], "POST");
    assert_eq!(v["body"], "hello world");

    // Chunked body plus Connection: close: answered, then the server closes.
    stream
        .write_all(b"PUT /c HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n5\r\nhello\r\n6;ext=1\r\n world\r\n0\r\n\r\n")
        .await
        .unwrap();
    let (status, headers, body) = read_response(&mut stream, &mut buf).await;
    assert_eq!(status, 200);
    assert!(headers.contains(&("connection".into(), "close".into())));
    let v: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(v["method"], "PUT");
    assert_eq!(v["body"], "hello world");
    let mut rest = Vec::new();
    let n = tokio::time::timeout(Duration::from_secs(30), stream.read_to_end(&mut rest))
        .await
        .expect("server closes after Connection: close")
        .unwrap();
    assert_eq!(n, 0);
    assert_eq!(backend.requests(), 3);
}

#[tokio::test]
async fn backend_status_flaky_and_stop_on_drop() {
    let not_found = Backend::with_status("ratings-v1", 404);
    for _ in 0..2 {
        let (status, body) = http_get(&format!("{}/x", not_found.url()), "", &[]).await;
        assert_eq!(status, 404);
        let v: Value = serde_json::from_str(&body).unwrap();
        assert_eq!(v["backend"], "ratings-v1");
        assert_eq!(v["host"], not_found.addr().to_string());
    }
    assert_eq!(not_found.requests(), 2);

    let flaky = Backend::flaky("details-v1");
    let mut statuses = Vec::new();
    for _ in 0..4 {
        statuses.push(http_get(&flaky.url(), "details", &[("x-a", "1")]).await.0);
    }
    assert_eq!(statuses, vec![503, 200, 503, 200]);
    assert_eq!(flaky.requests(), 4);

    // A loopback address other than 127.0.0.1, and Host override via reqwest.
    let other = Backend::builder("productpage-v1").ip([127, 0, 0, 2].into()).start();
    let r = http_request(&http_client(), "GET", &format!("{}/p", other.url()), "productpage:9080", &[], None)
        .await
        .unwrap();
    assert_eq!(r.status, 200);
    assert_eq!(r.header("x-backend"), Some("productpage-v1"));
    assert_eq!(r.json()["host"], "productpage:9080");

    let addr = flaky.addr();
    drop(flaky);
    assert!(TcpStream::connect(addr).await.is_err(), "backend still listening after drop");
}

#[tokio::test]
async fn envoy_without_xds_starts_admin_but_is_not_ready() {
    // The xDS cluster points at a port nobody listens on.
    let node_id = "sidecar~127.0.0.1~app.default~default.svc.cluster.local";
    let envoy = Envoy::start(node_id, free_addr(), json!({"NAMESPACE": "default", "LABELS": {"app": "app"}}));
    assert!(envoy.is_running());

    let (status, body) = envoy.admin_get("/server_info").await;
    assert_eq!(status, 200, "{body}");
    let info: Value = serde_json::from_str(&body).unwrap();
    assert!(info["version"].as_str().is_some_and(|v| !v.is_empty()), "{info}");
    assert_eq!(info["command_line_options"]["disable_hot_restart"], true);

    let (status, body) = envoy.admin_get("/ready").await;
    assert_eq!(status, 503, "/ready without xDS: {body}");

    // Bootstrap as Envoy holds it.
    let dump = envoy.config_dump().await;
    let bootstrap = &dump_section(&dump, "BootstrapConfigDump").expect("bootstrap dump")["bootstrap"];
    assert_eq!(bootstrap["node"]["id"], node_id);
    assert_eq!(bootstrap["node"]["cluster"], "app.default");
    assert_eq!(bootstrap["node"]["metadata"]["LABELS"]["app"], "app");
    assert_eq!(bootstrap["dynamic_resources"]["ads_config"]["set_node_on_first_message_only"], true);
    assert!(envoy.cluster_names().await.contains(&"xds".to_string()));

    // Stats parse; the ADS stream is not connected.
    let stats = envoy.stats().await;
    assert!(stats.len() > 50, "few stats: {}", stats.len());
    assert_eq!(envoy.stat("control_plane.connected_state").await, Some(0));
    assert_eq!(envoy.stat("no.such.stat").await, None);
    // Envoy keeps retrying the ADS stream.
    assert!(
        envoy
            .wait_for(CONVERGE_TIMEOUT, async |e| {
                e.stat("cluster.xds.upstream_cx_connect_fail").await.unwrap_or(0) >= 2
            })
            .await,
        "no ADS reconnect attempts; log:\n{}",
        envoy.logs()
    );

    let pid = envoy.pid().expect("Envoy runs");
    let admin = envoy.admin_addr();
    drop(envoy);
    assert!(!Path::new(&format!("/proc/{pid}")).exists(), "Envoy pid {pid} still exists after drop");
    assert!(TcpStream::connect(admin).await.is_err(), "Envoy admin still listening after drop");
}

#[tokio::test]
async fn envoy_with_static_config_proxies_to_backend() {
    let backend = Backend::new("reviews-v1");
    let listener_port = free_port();
    let envoy = Envoy::builder("router~127.0.0.1~gw.istio-system~istio-system.svc.cluster.local", free_addr())
        .bootstrap_patch(json!({"dynamic_resources": null}))
        .static_cluster(json!({
            "name": "backend",
            "type": "STATIC",
            "connect_timeout": "1s",
            "load_assignment": {"cluster_name": "backend", "endpoints": [{"lb_endpoints": [{"endpoint": {
                "address": {"socket_address": {"address": "127.0.0.1", "port_value": backend.port()}}
            }}]}]}
        }))
        .static_listener(json!({
            "name": "http",
            "address": {"socket_address": {"address": "127.0.0.1", "port_value": listener_port}},
            "filter_chains": [{"filters": [{
                "name": "envoy.filters.network.http_connection_manager",
                "typed_config": {
                    "@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
                    "stat_prefix": "ingress",
                    "route_config": {"name": "local", "virtual_hosts": [{
                        "name": "all",
                        "domains": ["*"],
                        "routes": [
                            {"match": {"prefix": "/redirect"}, "redirect": {"path_redirect": "/elsewhere"}},
                            {"match": {"prefix": "/"}, "route": {"cluster": "backend"}}
                        ]
                    }]},
                    "http_filters": [{
                        "name": "envoy.filters.http.router",
                        "typed_config": {"@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"}
                    }]
                }
            }]}]
        }))
        .start();
    envoy.wait_ready(STARTUP_TIMEOUT).await;
    assert!(envoy.listener_names().await.contains(&"http".to_string()));
    assert!(envoy.route_config_names().await.contains(&"local".to_string()));

    let url = format!("http://127.0.0.1:{listener_port}");
    for i in 0..3 {
        let (status, body) =
            http_get(&format!("{url}/reviews/{i}?q=1"), "reviews.default.svc.cluster.local", &[("x-test", "yes")])
                .await;
        assert_eq!(status, 200, "{body}");
        let v: Value = serde_json::from_str(&body).unwrap();
        assert_eq!(v["backend"], "reviews-v1");
        assert_eq!(v["path"], format!("/reviews/{i}?q=1"));
        assert_eq!(v["host"], "reviews.default.svc.cluster.local");
        assert_eq!(v["headers"]["x-test"], "yes");
        assert!(v["headers"]["x-request-id"].is_string(), "Envoy adds x-request-id: {v}");
    }
    assert_eq!(backend.requests(), 3);
    assert!(
        envoy.wait_for(CONVERGE_TIMEOUT, async |e| e.stat("cluster.backend.upstream_rq_200").await == Some(3)).await,
        "stats: {:?}",
        envoy.stat("cluster.backend.upstream_rq_200").await
    );
    // Envoy reused its upstream connection (keep-alive on the backend).
    assert_eq!(envoy.stat("cluster.backend.upstream_cx_total").await, Some(1));

    let r = http_get_no_redirect(&format!("{url}/redirect"), "gw", &[]).await;
    assert_eq!(r.status, 301);
    assert_eq!(r.header("location"), Some("http://gw/elsewhere"));
    assert_eq!(backend.requests(), 3);
}

#[test]
fn meshpilot_binary_is_built() {
    assert!(Meshpilot::binary().is_file(), "{}", Meshpilot::binary().display());
    assert!(envoy_path().is_file());
}

#[tokio::test]
async fn linked_namespaces_reach_each_other_and_forwards_dial_from_inside() {
    let Some(a) = NetNs::create(1) else { return };
    let Some(b) = NetNs::create(1) else { return };
    a.link(&b);
    let port = free_port();
    let in_b = Backend::builder("in-b").listener(b.listen(std::net::SocketAddr::from((b.addr(0), port)))).start();
    // Only a connection made inside `a` uses the link (the host does not forward between them).
    let from_a = a.forward(in_b.addr()).await;
    let answer = Ingress::new(from_a.port(), "b").echo("/x", &[]).await;
    assert_eq!(answer["backend"], "in-b");
    assert_eq!(in_b.requests(), 1);
    // A process left in a namespace (as Envoy is when pilot-agent is killed) dies with it.
    let mut sleeper = std::process::Command::new("ip")
        .args(["netns", "exec", a.name(), "sleep", "60"])
        .spawn()
        .expect("starting sleep in the namespace");
    let pid = sleeper.id();
    assert!(poll(STARTUP_TIMEOUT, async || a.pids().contains(&pid)).await, "sleep {pid} not in {}", a.name());
    drop(from_a);
    drop(a);
    let status = sleeper.wait().expect("waiting for sleep");
    assert!(!status.success(), "sleep was not killed with its namespace: {status}");
}
