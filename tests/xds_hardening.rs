//! What one xDS client can do to a real standalone meshpilot: nothing it sends freezes, drops or
//! exhausts the server. Oversized or malformed streams end with a status naming the problem
//! (never OK), client-chosen labels make a bounded number of metric series and no lasting cache
//! entries, and debug rendering never delays `/ready`.

mod common;

use std::time::{Duration, Instant};

use common::files::temp_dir_with;
use common::meshpilot::Meshpilot;
use envoy_types::pb::envoy::service::discovery::v3::DiscoveryResponse;
use meshpilot::sim::{SimProxy, SimProxySpec};
use tokio_stream::StreamExt;

const TIMEOUT: Duration = Duration::from_secs(60);

/// A mesh of `count` services in 10 namespaces.
fn mesh(count: usize) -> String {
    (0..count)
        .map(|i| {
            let ns = format!("ns{}", i % 10);
            format!(
                "apiVersion: networking.istio.io/v1\nkind: ServiceEntry\nmetadata: {{name: s{i}, namespace: {ns}}}\nspec: {{hosts: [s{i}.{ns}.svc.cluster.local], location: MESH_INTERNAL, resolution: STATIC, ports: [{{number: 80, name: http}}], endpoints: [{{address: 10.{}.{}.1}}]}}\n",
                i / 250,
                i % 250
            )
        })
        .collect::<Vec<_>>()
        .join("---\n")
}

async fn start(services: usize) -> (Meshpilot, tempfile::TempDir) {
    let dir = temp_dir_with(&[("mesh.yaml", &mesh(services))]);
    let mp = Meshpilot::standalone(dir.path()).start();
    mp.wait_ready(TIMEOUT).await;
    (mp, dir)
}

async fn refused_with(mp: &Meshpilot, spec: SimProxySpec) -> String {
    let proxy = SimProxy::connect(spec).await.expect("connect");
    assert!(proxy.wait_for(TIMEOUT, |s| !s.connected).await, "the stream was not ended");
    proxy.state().error.clone().unwrap_or_else(|| panic!("the stream ended without an error status; {mp:?}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oversized_and_forged_nodes_are_refused_with_a_status() {
    let (mp, _dir) = start(3).await;
    let url = mp.xds_url();
    let mut spec = SimProxySpec::sidecar(&url, "ns0", "app", "10.9.0.1");
    spec.node_id = format!("sidecar~10.9.0.1~{}.ns0~ns0.svc.cluster.local", "x".repeat(20_000));
    let error = refused_with(&mp, spec).await;
    assert!(error.contains("node id is") && error.contains("at most 1024"), "{error}");

    let mut spec = SimProxySpec::sidecar(&url, "ns0", "app", "10.9.0.2");
    spec.node_id = "sidecar~10.9.0.2~a.ns0~ns0.svc.cluster.local\nFORGED log line".into();
    let error = refused_with(&mp, spec).await;
    assert!(error.contains("node id"), "{error}");
    // The forged line never reaches the log as a line of its own.
    assert!(!mp.logs().lines().any(|l| l.starts_with("FORGED")), "a client forged a log line");

    let mut spec = SimProxySpec::sidecar(&url, "ns0", "app", "10.9.0.3");
    spec.labels = (0..5000).map(|i| (format!("label-{i}"), "v".repeat(20))).collect();
    let error = refused_with(&mp, spec).await;
    assert!(error.contains("node is") && error.contains("bytes encoded"), "{error}");

    // Everyone else is still served.
    let ok = SimProxy::connect(SimProxySpec::sidecar(&url, "ns0", "app", "10.9.0.9")).await.expect("connect");
    assert!(ok.wait_for(TIMEOUT, |s| s.types.len() == 4).await);
}

/// A request whose bytes are not a `DiscoveryRequest` (a string field holding invalid UTF-8).
#[derive(Clone, PartialEq, prost::Message)]
struct Garbage {
    #[prost(bytes = "vec", repeated, tag = "3")]
    resource_names: Vec<Vec<u8>>,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_that_does_not_decode_ends_the_stream_with_an_error() {
    let (mp, _dir) = start(3).await;
    let channel = tonic::transport::Endpoint::from_shared(mp.xds_url()).unwrap().connect().await.unwrap();
    let mut grpc = tonic::client::Grpc::new(channel);
    grpc.ready().await.unwrap();
    let path = tonic::codegen::http::uri::PathAndQuery::from_static(
        "/envoy.service.discovery.v3.AggregatedDiscoveryService/StreamAggregatedResources",
    );
    let requests = tokio_stream::iter(vec![Garbage { resource_names: vec![vec![0xff, 0xfe, 0xfd]] }]);
    let codec = tonic_prost::ProstCodec::<Garbage, DiscoveryResponse>::default();
    let result = grpc.streaming(tonic::Request::new(requests), path, codec).await;
    let status = match result {
        Err(status) => status,
        Ok(response) => {
            let mut stream = response.into_inner();
            loop {
                match tokio::time::timeout(TIMEOUT, stream.next()).await.expect("the stream hangs") {
                    Some(Ok(_)) => continue,
                    Some(Err(status)) => break status,
                    None => panic!("the stream ended with OK after an undecodable request"),
                }
            }
        }
    };
    assert_ne!(status.code(), tonic::Code::Ok);
    assert!(mp.try_admin_get("/ready").await.is_ok_and(|(code, _)| code == 200));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_chosen_labels_leave_no_cache_entries_and_few_series() {
    let (mp, _dir) = start(200).await;
    let url = mp.xds_url();
    for round in 0..3 {
        let mut proxies = Vec::new();
        for i in 0..40 {
            // A fresh label set and version on every stream.
            let mut spec = SimProxySpec::sidecar(&url, "ns0", &format!("app-{round}-{i}"), "10.9.0.1");
            spec.node_id = format!("sidecar~10.9.{round}.{i}~p{i}.ns0~ns0.svc.cluster.local");
            proxies.push(SimProxy::connect(spec).await.expect("connect"));
        }
        for p in &proxies {
            assert!(p.wait_for(TIMEOUT, |s| s.types.len() == 4).await);
        }
        let entries = mp.metric("meshpilot_xds_cache_entries").await.unwrap_or_default();
        // Labels no selector reads do not split views: the 40 streams share one (4 types).
        assert!(entries > 0.0 && entries <= 4.0, "one view cached for 40 label sets: {entries}");
        drop(proxies);
        // Once no connection holds a view, its entries go.
        let freed = mp
            .wait_for(TIMEOUT, async |m: &Meshpilot| m.metric("meshpilot_xds_cache_entries").await == Some(0.0))
            .await;
        assert!(freed, "cache entries of closed streams stay: {:?}", mp.metric("meshpilot_xds_cache_entries").await);
        assert_eq!(mp.metric("meshpilot_xds_cache_bytes").await, Some(0.0));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn debug_rendering_never_delays_readiness() {
    let (mp, _dir) = start(1000).await;
    let proxy = SimProxy::connect(SimProxySpec::sidecar(&mp.xds_url(), "ns0", "app", "10.9.0.1")).await.unwrap();
    assert!(proxy.wait_for(TIMEOUT, |s| s.types.len() == 4).await);
    let pod = "app.ns0";
    let client = reqwest::Client::builder().no_proxy().build().unwrap();
    let mut renders = Vec::new();
    for _ in 0..80 {
        let url = format!("{}/debug/config_dump?proxyID={pod}", mp.admin_url());
        let client = client.clone();
        renders.push(tokio::spawn(async move { client.get(url).send().await.map(|r| r.status().as_u16()) }));
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    let mut slowest = Duration::ZERO;
    for _ in 0..10 {
        let started = Instant::now();
        let (code, _) = mp.admin_get("/ready").await;
        assert_eq!(code, 200);
        slowest = slowest.max(started.elapsed());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(slowest < Duration::from_millis(500), "/ready took {slowest:?} while config dumps render");
    for r in renders {
        r.abort();
    }
}
