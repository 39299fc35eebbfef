//! The replay server's ADS streams: each is tied to its workload's capture, answers the first
//! request of each type with the initial responses of that type, ignores ACKs, and takes phase
//! pushes through a bounded channel.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use axum::extract::{Request, State};
use axum::response::Response;
use axum::routing::post;
use axum::Router;
use bytes::Bytes;
use envoy_types::pb::envoy::config::core::v3::Node;
use envoy_types::pb::envoy::service::discovery::v3::{DeltaDiscoveryRequest, DiscoveryRequest};
use tokio::sync::mpsc;
use tokio::task::JoinSet;
use tonic::{Status, Streaming};
use tracing::{debug, warn};

use super::grpc::{self, Outbound, ProstDecode};
use crate::drain::DrainWatcher;
use crate::envoy::NodeMetadata;
use crate::sim::capture::{Capture, Mode, INITIAL_PHASE};
use crate::telemetry::log_text::Untrusted;

/// Responses queued per stream before a push waits for the proxy to read.
const STREAM_BUFFER: usize = 64;

/// Requests larger than this end the stream.
const MAX_REQUEST_BYTES: usize = 16 << 20;

const SOTW_PATH: &str = "/envoy.service.discovery.v3.AggregatedDiscoveryService/StreamAggregatedResources";
const DELTA_PATH: &str = "/envoy.service.discovery.v3.AggregatedDiscoveryService/DeltaAggregatedResources";

/// One workload's captured responses, by phase and (for the initial phase) by type.
#[derive(Debug, Default)]
struct WorkloadCapture {
    initial: HashMap<String, Vec<Bytes>>,
    phases: HashMap<String, Vec<Bytes>>,
}

/// A connected stream: its workload's capture and where its responses go.
type Target = (Arc<WorkloadCapture>, mpsc::Sender<Outbound>);

/// The loaded capture and the open streams.
#[derive(Debug)]
pub struct Replay {
    mode: Mode,
    workloads: HashMap<String, Arc<WorkloadCapture>>,
    phases: HashSet<String>,
    streams: Mutex<BTreeMap<u64, Target>>,
    tasks: Mutex<JoinSet<()>>,
    next_id: AtomicU64,
}

impl Replay {
    /// Indexes a capture for serving.
    pub fn new(capture: Capture) -> Replay {
        let mut phases = HashSet::new();
        let mut workloads = HashMap::new();
        for (key, list) in capture.workloads {
            let mut w = WorkloadCapture::default();
            for c in list {
                if c.phase == INITIAL_PHASE {
                    w.initial.entry(c.type_url).or_default().push(c.bytes);
                } else {
                    phases.insert(c.phase.clone());
                    w.phases.entry(c.phase).or_default().push(c.bytes);
                }
            }
            workloads.insert(key, Arc::new(w));
        }
        Replay {
            mode: capture.mode,
            workloads,
            phases,
            streams: Mutex::new(BTreeMap::new()),
            tasks: Mutex::new(JoinSet::new()),
            next_id: AtomicU64::new(0),
        }
    }

    fn streams(&self) -> std::sync::MutexGuard<'_, BTreeMap<u64, Target>> {
        self.streams.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn tasks(&self) -> std::sync::MutexGuard<'_, JoinSet<()>> {
        self.tasks.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Pushes phase `name` to every connected stream; the number of streams pushed, `None` if the
    /// capture has no such phase.
    pub async fn push_phase(&self, name: &str) -> Option<usize> {
        if !self.phases.contains(name) {
            return None;
        }
        // Copied out so no lock is held while sending.
        let targets: Vec<Target> = self.streams().values().cloned().collect();
        let sends = targets.into_iter().filter_map(|(w, tx)| {
            let responses = w.phases.get(name)?.clone();
            Some(async move {
                for bytes in responses {
                    if tx.send(Ok(bytes)).await.is_err() {
                        return false;
                    }
                }
                true
            })
        });
        Some(futures::future::join_all(sends).await.into_iter().filter(|ok| *ok).count())
    }

    /// Waits for every stream task (they end when the drain starts).
    pub async fn join_streams(&self) {
        let mut tasks = std::mem::take(&mut *self.tasks());
        while tasks.join_next().await.is_some() {}
    }

    /// Starts serving one stream; its responses come out of the returned stream.
    fn open<R: ReplayRequest>(
        self: &Arc<Self>,
        requests: Streaming<R>,
        drain: DrainWatcher,
    ) -> mpsc::Receiver<Outbound> {
        let (tx, rx) = mpsc::channel(STREAM_BUFFER);
        let replay = self.clone();
        let mut tasks = self.tasks();
        // Reap finished streams so the set holds only live ones.
        while tasks.try_join_next().is_some() {}
        tasks.spawn(async move {
            tokio::select! {
                () = replay.serve(requests, tx) => {}
                () = drain.draining() => {}
            }
        });
        rx
    }

    async fn serve<R: ReplayRequest>(self: Arc<Self>, mut requests: Streaming<R>, tx: mpsc::Sender<Outbound>) {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let mut first_types: HashSet<String> = HashSet::new();
        let mut workload: Option<Arc<WorkloadCapture>> = None;
        // Unregisters however the stream ends, the drain dropping this future included: the
        // registry's sender would otherwise keep the response stream (and the server) open.
        let mut registered: Option<Registered<'_>> = None;
        loop {
            let request = match requests.message().await {
                Ok(Some(r)) => r,
                Ok(None) => break,
                Err(status) => {
                    debug!(%status, "replay stream ended");
                    break;
                }
            };
            let w = match &workload {
                Some(w) => w.clone(),
                None => {
                    let key = workload_key(request.node());
                    let Some(w) = self.workloads.get(&key).cloned() else {
                        warn!(workload = %Untrusted(&key), "no capture for this workload; ending the stream");
                        let _ = tx.send(Err(Status::not_found(format!("the capture holds no workload {key:?}")))).await;
                        break;
                    };
                    self.streams().insert(id, (w.clone(), tx.clone()));
                    registered = Some(Registered { replay: &self, id });
                    workload = Some(w.clone());
                    w
                }
            };
            let type_url = request.type_url();
            if !request.is_initial() || first_types.contains(type_url) {
                continue;
            }
            first_types.insert(type_url.to_string());
            for bytes in w.initial.get(type_url).into_iter().flatten() {
                if tx.send(Ok(bytes.clone())).await.is_err() {
                    break;
                }
            }
        }
        drop(registered);
    }
}

/// A stream's entry in the registry, removed on drop.
struct Registered<'a> {
    replay: &'a Replay,
    id: u64,
}

impl Drop for Registered<'_> {
    fn drop(&mut self) {
        self.replay.streams().remove(&self.id);
    }
}

/// `<NAMESPACE>/<LABELS.app>` of a node.
fn workload_key(node: Option<&Node>) -> String {
    let meta = NodeMetadata::parse(node.and_then(|n| n.metadata.as_ref()));
    let app = meta.labels.and_then(|l| l.get("app").cloned()).unwrap_or_default();
    format!("{}/{app}", meta.namespace.unwrap_or_default())
}

/// What the replay server reads of a SotW or delta request.
trait ReplayRequest: prost::Message + Default + Send + Sync + 'static {
    fn node(&self) -> Option<&Node>;
    fn type_url(&self) -> &str;
    /// Whether this may be the first request of its type (SotW: no nonce; delta: any).
    fn is_initial(&self) -> bool;
}

impl ReplayRequest for DiscoveryRequest {
    fn node(&self) -> Option<&Node> {
        self.node.as_ref()
    }
    fn type_url(&self) -> &str {
        &self.type_url
    }
    fn is_initial(&self) -> bool {
        self.response_nonce.is_empty()
    }
}

impl ReplayRequest for DeltaDiscoveryRequest {
    fn node(&self) -> Option<&Node> {
        self.node.as_ref()
    }
    fn type_url(&self) -> &str {
        &self.type_url
    }
    fn is_initial(&self) -> bool {
        true
    }
}

#[derive(Clone)]
struct RouteState {
    replay: Arc<Replay>,
    drain: DrainWatcher,
}

async fn handle<R: ReplayRequest>(State(state): State<RouteState>, request: Request) -> Response {
    let decoder = ProstDecode::<R>::default();
    let requests = Streaming::new_request(decoder, request.into_body(), None, Some(MAX_REQUEST_BYTES));
    grpc::response(state.replay.open(requests, state.drain))
}

/// The ADS method of the capture's mode; anything else answers UNIMPLEMENTED saying why.
pub fn router(replay: Arc<Replay>, drain: DrainWatcher) -> Router {
    let mode = replay.mode;
    let router = Router::new();
    let router = match mode {
        Mode::Sotw => router.route(SOTW_PATH, post(handle::<DiscoveryRequest>)),
        Mode::Delta => router.route(DELTA_PATH, post(handle::<DeltaDiscoveryRequest>)),
    };
    let why = format!("this replay server serves a {} capture only", mode.as_str());
    router
        .fallback(move || async move { Status::unimplemented(why).into_http::<axum::body::Body>() })
        .with_state(RouteState { replay, drain })
}
