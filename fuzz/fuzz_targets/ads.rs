//! ADS request handling: sequences of `DiscoveryRequest`s, decoded from arbitrary bytes, fed to
//! one stream handler (`xds::serve` with the state-of-the-world protocol) serving a small snapshot. The harness can point
//! a request at a real type URL, a nonce the server actually sent, or a NACK, so the fuzzer gets
//! past the first request into ACK/NACK bookkeeping and resource-name changes.
//! Every input must end with the handler returning once the request stream ends.

#![no_main]

use std::sync::Arc;
use std::time::Duration;

use envoy_types::pb::envoy::config::core::v3::Node;
use envoy_types::pb::envoy::service::discovery::v3::{DiscoveryRequest, DiscoveryResponse};
use envoy_types::pb::google::rpc::Status as RpcStatus;
use libfuzzer_sys::arbitrary::{self, Arbitrary};
use libfuzzer_sys::fuzz_target;
use meshpilot::config::parse::{parse_file, Document};
use meshpilot::snapshot::{ChangeSet, Snapshot, SnapshotWriter, SourceState, Version};
use meshpilot::xds::{
    serve, Admission, AdmissionSettings, ConnectionContext, ConnectionRegistry, Framed, GenerationCache, SotwResponse,
    StateOfTheWorld, TypeUrl, XdsMetrics, DEFAULT_BUDGET_BYTES,
};
use prost::Message;
use tokio::sync::mpsc;

/// A small mesh: a service with endpoints, routing and a policy, so every type has resources.
const CONFIG: &str = r#"
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: ratings, namespace: shop}
spec:
  hosts: [ratings.shop.svc.cluster.local]
  location: MESH_INTERNAL
  resolution: STATIC
  ports: [{number: 9080, name: http, protocol: HTTP}]
  endpoints: [{address: 10.0.0.7}, {address: 10.0.0.8}]
---
apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {name: ratings, namespace: shop}
spec:
  hosts: [ratings.shop.svc.cluster.local]
  http:
  - match: [{uri: {regex: "/v[0-9]+/.*"}}]
    route: [{destination: {host: ratings.shop.svc.cluster.local}}]
    retries: {attempts: 2, perTryTimeout: 1s}
---
apiVersion: networking.istio.io/v1
kind: DestinationRule
metadata: {name: ratings, namespace: shop}
spec:
  host: ratings.shop.svc.cluster.local
  trafficPolicy: {connectionPool: {tcp: {connectTimeout: 2s}}, outlierDetection: {interval: 5s}}
"#;

const NODE_ID: &str = "sidecar~10.0.0.1~app-1.shop~shop.svc.cluster.local";

/// One request: protobuf bytes, and what the harness may overwrite in them.
#[derive(Debug, Arbitrary)]
struct Request {
    bytes: Vec<u8>,
    /// Index into the served type URLs (an out-of-range index keeps the decoded URL).
    type_url: Option<u8>,
    /// Answer the n-th response received so far (its nonce and version).
    answer: Option<u8>,
    /// Turn the answer into a NACK.
    nack: bool,
}

#[derive(Debug, Arbitrary)]
struct Input {
    /// Give the first request a valid sidecar node (most inputs should get past it).
    valid_node: bool,
    requests: Vec<Request>,
}

/// What every input shares: the runtime and a context serving one snapshot.
struct Harness {
    runtime: tokio::runtime::Runtime,
    ctx: ConnectionContext,
    // Held so the snapshot channel stays open and the drain never starts.
    _writer: SnapshotWriter,
    _drain: meshpilot::drain::DrainTrigger,
}

impl Harness {
    fn new() -> Harness {
        let mut state = SourceState::default();
        for doc in parse_file("fuzz.yaml", CONFIG) {
            let Document::Valid(obj) = doc else { panic!("fuzz config must be valid: {doc:?}") };
            state.configs.insert(obj.key.clone(), Arc::new(obj));
        }
        let (writer, reader) = meshpilot::snapshot::channel();
        let snapshot = Snapshot::build(Version::new(1, 1), ChangeSet::full(), &state);
        writer.publish(Arc::new(snapshot)).expect("first snapshot");
        let (trigger, drain) = meshpilot::drain::new();
        let metrics = XdsMetrics::default();
        let ctx = ConnectionContext {
            snapshots: reader,
            cache: Arc::new(GenerationCache::new(metrics.clone(), DEFAULT_BUDGET_BYTES)),
            registry: Arc::new(ConnectionRegistry::new(metrics.clone())),
            metrics,
            drain,
            // Every input opens a stream: admission must never make one wait.
            admission: Arc::new(Admission::new(AdmissionSettings {
                new_streams_per_second: 1e12,
                max_stream_age: None,
                ..Default::default()
            })),
            control_plane: meshpilot::xds::control_plane_identifier("fuzz").into(),
        };
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
        Harness { runtime, ctx, _writer: writer, _drain: trigger }
    }
}

thread_local! {
    static HARNESS: Harness = Harness::new();
}

/// Lets the connection task run until it has nothing more to do right now, collecting responses.
async fn settle(rx: &mut mpsc::Receiver<Result<SotwResponse, tonic::Status>>, seen: &mut Vec<DiscoveryResponse>) {
    for _ in 0..16 {
        tokio::task::yield_now().await;
        while let Ok(response) = rx.try_recv() {
            // A response the server built must decode: that is part of what is fuzzed.
            if let Ok(r) = response {
                seen.push(r.decode().expect("a response meshpilot encoded decodes"));
            }
        }
    }
}

async fn run(ctx: ConnectionContext, input: Input) {
    let (req_tx, req_rx) = mpsc::channel::<Result<DiscoveryRequest, tonic::Status>>(64);
    let (tx, mut rx) = mpsc::channel(64);
    let handler = tokio::spawn(serve(ctx, StateOfTheWorld::default(), tokio_stream_of(req_rx), tx));
    let mut seen: Vec<DiscoveryResponse> = Vec::new();
    let mut answers = 0;
    for (i, r) in input.requests.into_iter().take(32).enumerate() {
        let mut req = DiscoveryRequest::decode(r.bytes.as_slice()).unwrap_or_default();
        if i == 0 && input.valid_node {
            req.node = Some(Node { id: NODE_ID.into(), ..Default::default() });
        }
        if let Some(t) = r.type_url.and_then(|t| TypeUrl::PUSH_ORDER.get(usize::from(t))) {
            req.type_url = t.as_str().into();
        }
        if let Some(sent) = r.answer.and_then(|n| seen.get(usize::from(n))) {
            req.type_url = sent.type_url.clone();
            req.response_nonce = sent.nonce.clone();
            req.version_info = sent.version_info.clone();
            if r.nack {
                req.error_detail = Some(RpcStatus { code: 3, message: "fuzz NACK".into(), details: vec![] });
            }
            answers += 1;
        }
        if req_tx.send(Ok(req)).await.is_err() {
            break; // The handler ended the stream (e.g. a bad first node).
        }
        settle(&mut rx, &mut seen).await;
    }
    drop(req_tx);
    // Drain responses so the handler never waits on a full channel, until it returns.
    let drain_responses = async { while rx.recv().await.is_some() {} };
    let ended = tokio::time::timeout(Duration::from_secs(5), async {
        let (end, ()) = tokio::join!(handler, drain_responses);
        end
    })
    .await;
    // How deep inputs get (replay a corpus with `-runs=0` to see it).
    if std::env::var_os("MESHPILOT_FUZZ_STATS").is_some() {
        eprintln!("ads-stats responses={} answers={answers}", seen.len());
    }
    match ended {
        Ok(Ok(_)) => {}
        Ok(Err(join)) => std::panic::resume_unwind(join.into_panic()),
        Err(_) => panic!("serve did not return within 5s of its request stream ending"),
    }
}

/// The receiver as the `Stream` `serve` takes.
fn tokio_stream_of(
    mut rx: mpsc::Receiver<Result<DiscoveryRequest, tonic::Status>>,
) -> impl futures::Stream<Item = Result<DiscoveryRequest, tonic::Status>> + Unpin {
    Box::pin(futures::stream::poll_fn(move |cx| rx.poll_recv(cx)))
}

fuzz_target!(|input: Input| {
    HARNESS.with(|h| h.runtime.block_on(run(h.ctx.clone(), input)));
});
