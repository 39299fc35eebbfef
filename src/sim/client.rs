//! One simulated proxy: an ADS stream (state of the world or delta) that ACKs what it receives
//! and keeps a content hash of every resource it holds.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;
use envoy_types::pb::envoy::config::cluster::v3::{cluster::ClusterDiscoveryType, cluster::DiscoveryType, Cluster};
use envoy_types::pb::envoy::config::core::v3::{Locality, Node};
use envoy_types::pb::envoy::config::listener::v3::Listener;
use envoy_types::pb::envoy::service::discovery::v3::aggregated_discovery_service_client::AggregatedDiscoveryServiceClient;
use envoy_types::pb::envoy::service::discovery::v3::{
    DeltaDiscoveryRequest, DeltaDiscoveryResponse, DiscoveryRequest, DiscoveryResponse,
};
use envoy_types::pb::google::protobuf::{value::Kind, Struct, Value};
use envoy_types::pb::google::rpc::Status as RpcStatus;
use prost::Message;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tokio_stream::StreamExt;

use crate::config::api::Labels;
use crate::xds::TypeUrl;

/// Who the simulated proxy is.
#[derive(Debug, Clone)]
pub struct SimProxySpec {
    /// Node id (`sidecar~IP~POD.NS~NS.svc.cluster.local`).
    pub node_id: String,
    /// NAMESPACE metadata.
    pub namespace: String,
    /// LABELS metadata.
    pub labels: Labels,
    /// Further string fields of the node metadata (e.g. `ISTIO_VERSION`, which says a
    /// pilot-agent serves the proxy's certificates).
    pub metadata: BTreeMap<String, String>,
    /// Where the proxy runs (`node.locality`, as pilot-agent sends the pod's node's topology labels).
    pub locality: Option<Locality>,
    /// ADS endpoint, e.g. `http://127.0.0.1:15010`.
    pub xds_url: String,
    /// NACK every response of this type (to test rejection handling).
    pub reject: Option<TypeUrl>,
    /// NACK any response carrying a resource of one of these names, as Envoy does with a bad one.
    pub reject_resources: BTreeSet<String>,
    /// Whether those NACKs name the resource (Envoy's usually do) or say only that something failed.
    pub name_rejected: bool,
    /// Speak delta ADS (`DeltaAggregatedResources`) instead of state of the world.
    pub delta: bool,
    /// Keep the encoded bytes of each held resource beside its hash (for tests that compare and
    /// decode them; off for load, where thousands of proxies would each keep a copy).
    pub keep_resources: bool,
}

impl SimProxySpec {
    /// A sidecar in `namespace` with `app=<app>` labels.
    pub fn sidecar(xds_url: &str, namespace: &str, name: &str, ip: &str) -> SimProxySpec {
        SimProxySpec {
            node_id: format!("sidecar~{ip}~{name}.{namespace}~{namespace}.svc.cluster.local"),
            namespace: namespace.to_string(),
            labels: [("app".to_string(), name.to_string())].into_iter().collect(),
            metadata: BTreeMap::new(),
            locality: None,
            xds_url: xds_url.to_string(),
            reject: None,
            reject_resources: BTreeSet::new(),
            name_rejected: true,
            delta: false,
            keep_resources: false,
        }
    }
}

/// What one type's stream has seen.
#[derive(Debug, Clone, Default)]
pub struct TypeState {
    /// Responses received.
    pub responses: u64,
    /// Version of the last response.
    pub version: String,
    /// Names of the resources it holds as of the last response (for EDS and RDS, those it asks
    /// for that any response carried).
    pub names: BTreeSet<String>,
    /// Names of the resources it holds as of the last response it accepted (what an Envoy would hold).
    pub acked_names: BTreeSet<String>,
    /// Last version ACKed.
    pub acked_version: String,
    /// What it holds as of the last response it accepted, by name, as Envoy would: for EDS and
    /// RDS only the names it still asks for (a cluster or listener gone takes its endpoints or
    /// routes with it).
    pub acked_resources: BTreeMap<String, HeldResource>,
}

/// One resource a proxy holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeldResource {
    /// xxh64 of its encoded bytes.
    pub hash: u64,
    /// Its encoded bytes, with [`SimProxySpec::keep_resources`].
    pub bytes: Option<Arc<[u8]>>,
}

impl HeldResource {
    fn new(bytes: &[u8], keep: bool) -> HeldResource {
        HeldResource { hash: xxhash_rust::xxh64::xxh64(bytes, 0), bytes: keep.then(|| Arc::from(bytes)) }
    }
}

/// Everything the proxy has seen so far.
#[derive(Debug, Clone, Default)]
pub struct SimState {
    /// By type.
    pub types: BTreeMap<TypeUrl, TypeState>,
    /// Whether the stream is up.
    pub connected: bool,
    /// Last stream error.
    pub error: Option<String>,
}

impl SimState {
    /// Total responses received of all types.
    pub fn responses(&self) -> u64 {
        self.types.values().map(|t| t.responses).sum()
    }

    /// Whether every subscribed type has acked `version`.
    pub fn acked(&self, version: &str) -> bool {
        !self.types.is_empty() && self.types.values().all(|t| t.acked_version == version)
    }
}

/// Why a simulated proxy could not run.
#[derive(Debug, thiserror::Error)]
pub enum SimError {
    /// Bad URL or connection failure.
    #[error("connecting to {url}: {source}")]
    Connect {
        /// URL.
        url: String,
        /// Cause.
        source: tonic::transport::Error,
    },
    /// The stream failed to open.
    #[error("opening the ADS stream: {0}")]
    Stream(#[from] tonic::Status),
}

/// A running simulated proxy; the stream closes when this is dropped.
pub struct SimProxy {
    state: Arc<ArcSwap<SimState>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for SimProxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl SimProxy {
    /// Connects to `spec.xds_url` and subscribes to CDS and LDS; EDS, RDS and SDS follow from
    /// what arrives.
    pub async fn connect(spec: SimProxySpec) -> Result<SimProxy, SimError> {
        let channel = tonic::transport::Endpoint::from_shared(spec.xds_url.clone())
            .map_err(|source| SimError::Connect { url: spec.xds_url.clone(), source })?
            .connect()
            .await
            .map_err(|source| SimError::Connect { url: spec.xds_url.clone(), source })?;
        Self::connect_over(spec, channel).await
    }

    /// As [`SimProxy::connect`], over a channel the caller made (e.g. TLS with a client
    /// certificate, to the secure port); `spec.xds_url` is not used.
    pub async fn connect_over(spec: SimProxySpec, channel: tonic::transport::Channel) -> Result<SimProxy, SimError> {
        let mut client = AggregatedDiscoveryServiceClient::new(channel).max_decoding_message_size(64 << 20);
        if spec.delta {
            return Self::connect_delta(spec, client).await;
        }
        let (tx, rx) = mpsc::channel::<DiscoveryRequest>(16);
        let node = node(&spec);
        for (i, t) in [TypeUrl::Cluster, TypeUrl::Listener].into_iter().enumerate() {
            let _ = tx
                .send(DiscoveryRequest {
                    node: (i == 0).then(|| node.clone()),
                    type_url: t.as_str().into(),
                    ..Default::default()
                })
                .await;
        }
        let responses = client.stream_aggregated_resources(ReceiverStream::new(rx)).await?.into_inner();
        let state = Arc::new(ArcSwap::from_pointee(SimState { connected: true, ..Default::default() }));
        let task = tokio::spawn(run(spec, responses, tx, state.clone()));
        Ok(SimProxy { state, task })
    }

    async fn connect_delta(
        spec: SimProxySpec,
        mut client: AggregatedDiscoveryServiceClient<tonic::transport::Channel>,
    ) -> Result<SimProxy, SimError> {
        let (tx, rx) = mpsc::channel::<DeltaDiscoveryRequest>(16);
        let node = node(&spec);
        for (i, t) in [TypeUrl::Cluster, TypeUrl::Listener].into_iter().enumerate() {
            // Naming nothing on the first request of CDS and LDS is Envoy's wildcard subscription.
            let _ = tx
                .send(DeltaDiscoveryRequest {
                    node: (i == 0).then(|| node.clone()),
                    type_url: t.as_str().into(),
                    ..Default::default()
                })
                .await;
        }
        let responses = client.delta_aggregated_resources(ReceiverStream::new(rx)).await?.into_inner();
        let state = Arc::new(ArcSwap::from_pointee(SimState { connected: true, ..Default::default() }));
        let task = tokio::spawn(run_delta(spec, responses, tx, state.clone()));
        Ok(SimProxy { state, task })
    }

    /// What the proxy has seen.
    pub fn state(&self) -> Arc<SimState> {
        self.state.load_full()
    }

    /// Polls until `done` holds (true) or `timeout` passes (false).
    pub async fn wait_for(&self, timeout: Duration, done: impl Fn(&SimState) -> bool) -> bool {
        let deadline = Instant::now() + timeout;
        loop {
            if done(&self.state()) {
                return true;
            }
            if Instant::now() > deadline {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

fn node(spec: &SimProxySpec) -> Node {
    let s = |v: &str| Value { kind: Some(Kind::StringValue(v.to_string())) };
    let labels = Struct { fields: spec.labels.iter().map(|(k, v)| (k.clone(), s(v))).collect() };
    Node {
        id: spec.node_id.clone(),
        cluster: spec.labels.get("app").cloned().unwrap_or_default(),
        metadata: Some(Struct {
            fields: [
                ("NAMESPACE".to_string(), s(&spec.namespace)),
                ("LABELS".to_string(), Value { kind: Some(Kind::StructValue(labels)) }),
                ("CLUSTER_ID".to_string(), s("Kubernetes")),
            ]
            .into_iter()
            .chain(spec.metadata.iter().map(|(k, v)| (k.clone(), s(v))))
            .collect(),
        }),
        locality: spec.locality.clone(),
        ..Default::default()
    }
}

async fn run(
    spec: SimProxySpec,
    mut responses: tonic::Streaming<DiscoveryResponse>,
    tx: mpsc::Sender<DiscoveryRequest>,
    state: Arc<ArcSwap<SimState>>,
) {
    // Names subscribed per named type, and the last nonce per type (for follow-up requests).
    let mut wanted: BTreeMap<TypeUrl, BTreeSet<String>> = BTreeMap::new();
    let mut nonces: BTreeMap<TypeUrl, (String, String)> = BTreeMap::new();
    while let Some(item) = responses.next().await {
        let resp = match item {
            Ok(r) => r,
            Err(e) => {
                update(&state, |s| {
                    s.connected = false;
                    s.error = Some(e.to_string());
                });
                return;
            }
        };
        let Some(type_url) = TypeUrl::parse(&resp.type_url) else { continue };
        let names: BTreeSet<String> = resp.resources.iter().filter_map(|r| resource_name(type_url, &r.value)).collect();
        let bad: Vec<&String> = names.intersection(&spec.reject_resources).collect();
        let reject = spec.reject == Some(type_url) || !bad.is_empty();
        let message = match bad.first() {
            Some(name) if spec.name_rejected => format!("Error adding/updating {type_url} {name}: simulated rejection"),
            _ => "simulated rejection".to_string(),
        };
        let names_for_ack = wanted.get(&type_url).cloned().unwrap_or_default();
        let ack = DiscoveryRequest {
            version_info: if reject { String::new() } else { resp.version_info.clone() },
            type_url: resp.type_url.clone(),
            response_nonce: resp.nonce.clone(),
            resource_names: names_for_ack.into_iter().collect(),
            error_detail: reject.then(|| RpcStatus { code: 3, message, details: vec![] }),
            ..Default::default()
        };
        if tx.send(ack).await.is_err() {
            return;
        }
        if !reject {
            nonces.insert(type_url, (resp.version_info.clone(), resp.nonce.clone()));
        }
        // Like Envoy, a proxy keeps the endpoints and routes it asks for that a response leaves out.
        let asked = type_url.is_named().then(|| wanted.get(&type_url).cloned().unwrap_or_default());
        let holds = |before: &BTreeSet<String>| match &asked {
            Some(asked) => before.intersection(asked).chain(&names).cloned().collect(),
            None => names.clone(),
        };
        let held = |before: &BTreeMap<String, HeldResource>| {
            let mut after: BTreeMap<String, HeldResource> = match &asked {
                Some(asked) => {
                    before.iter().filter(|(n, _)| asked.contains(*n)).map(|(n, r)| (n.clone(), r.clone())).collect()
                }
                None => BTreeMap::new(),
            };
            for r in &resp.resources {
                // Like Envoy, a resource of a named type nobody asked for is ignored.
                let name = resource_name(type_url, &r.value).filter(|n| asked.as_ref().is_none_or(|a| a.contains(n)));
                if let Some(name) = name {
                    after.insert(name, HeldResource::new(&r.value, spec.keep_resources));
                }
            }
            after
        };
        update(&state, |s| {
            let t = s.types.entry(type_url).or_default();
            t.responses += 1;
            t.version = resp.version_info.clone();
            t.names = holds(&t.names);
            if !reject {
                t.acked_version = resp.version_info.clone();
                t.acked_names = holds(&t.acked_names);
                t.acked_resources = held(&t.acked_resources);
            }
        });
        // Like Envoy: clusters and listeners tell which endpoints, routes and secrets to ask for.
        let bodies = || resp.resources.iter().map(|r| r.value.as_slice());
        let follow = match type_url {
            TypeUrl::Cluster => vec![(TypeUrl::Endpoint, eds_names(bodies()))],
            TypeUrl::Listener => vec![(TypeUrl::Route, rds_names(bodies())), (TypeUrl::Secret, sds_names(bodies()))],
            _ => Vec::new(),
        };
        for (dep, names) in follow {
            // Envoy asks for no secret until some listener names one; later, an empty list
            // unsubscribes (as for endpoints and routes).
            if dep == TypeUrl::Secret && names.is_empty() && !wanted.contains_key(&dep) {
                continue;
            }
            if wanted.get(&dep) != Some(&names) {
                wanted.insert(dep, names.clone());
                forget_unasked(&state, dep, &names);
                let (version, nonce) = nonces.get(&dep).cloned().unwrap_or_default();
                let req = DiscoveryRequest {
                    version_info: version,
                    response_nonce: nonce,
                    type_url: dep.as_str().into(),
                    resource_names: names.into_iter().collect(),
                    ..Default::default()
                };
                if tx.send(req).await.is_err() {
                    return;
                }
            }
        }
    }
    update(&state, |s| s.connected = false);
}

/// The delta stream: resources arrive and leave by name; the proxy subscribes to the endpoints
/// and routes of every cluster and listener it holds.
async fn run_delta(
    spec: SimProxySpec,
    mut responses: tonic::Streaming<DeltaDiscoveryResponse>,
    tx: mpsc::Sender<DeltaDiscoveryRequest>,
    state: Arc<ArcSwap<SimState>>,
) {
    // The bytes of every cluster and listener held (what EDS and RDS names follow from), and the
    // names subscribed per named type.
    let mut bodies: BTreeMap<TypeUrl, BTreeMap<String, Vec<u8>>> = BTreeMap::new();
    let mut wanted: BTreeMap<TypeUrl, BTreeSet<String>> = BTreeMap::new();
    while let Some(item) = responses.next().await {
        let resp = match item {
            Ok(r) => r,
            Err(e) => {
                update(&state, |s| {
                    s.connected = false;
                    s.error = Some(e.to_string());
                });
                return;
            }
        };
        let Some(type_url) = TypeUrl::parse(&resp.type_url) else { continue };
        let added: Vec<(String, &[u8])> = resp
            .resources
            .iter()
            .filter_map(|r| r.resource.as_ref().map(|a| (r.name.clone(), a.value.as_slice())))
            .collect();
        let bad = added.iter().find(|(n, _)| spec.reject_resources.contains(n)).map(|(n, _)| n.clone());
        let reject = spec.reject == Some(type_url) || bad.is_some();
        let message = match &bad {
            Some(name) if spec.name_rejected => format!("Error adding/updating {type_url} {name}: simulated rejection"),
            _ => "simulated rejection".to_string(),
        };
        let ack = DeltaDiscoveryRequest {
            type_url: resp.type_url.clone(),
            response_nonce: resp.nonce.clone(),
            error_detail: reject.then(|| RpcStatus { code: 3, message, details: vec![] }),
            ..Default::default()
        };
        if tx.send(ack).await.is_err() {
            return;
        }
        let version =
            if resp.system_version_info.is_empty() { resp.nonce.clone() } else { resp.system_version_info.clone() };
        let apply = |held: &mut BTreeMap<String, HeldResource>| {
            for name in &resp.removed_resources {
                held.remove(name);
            }
            for (name, bytes) in &added {
                held.insert(name.clone(), HeldResource::new(bytes, spec.keep_resources));
            }
        };
        update(&state, |s| {
            let t = s.types.entry(type_url).or_default();
            t.responses += 1;
            t.version = version.clone();
            for name in &resp.removed_resources {
                t.names.remove(name);
            }
            t.names.extend(added.iter().map(|(n, _)| n.clone()));
            if !reject {
                apply(&mut t.acked_resources);
                t.acked_version = version.clone();
                t.acked_names = t.acked_resources.keys().cloned().collect();
            }
        });
        if reject {
            continue;
        }
        if !matches!(type_url, TypeUrl::Cluster | TypeUrl::Listener) {
            continue;
        }
        let held = bodies.entry(type_url).or_default();
        for name in &resp.removed_resources {
            held.remove(name);
        }
        for (name, bytes) in &added {
            held.insert(name.clone(), bytes.to_vec());
        }
        let held = || held.values().map(Vec::as_slice);
        let follow = match type_url {
            TypeUrl::Cluster => vec![(TypeUrl::Endpoint, eds_names(held()))],
            _ => vec![(TypeUrl::Route, rds_names(held())), (TypeUrl::Secret, sds_names(held()))],
        };
        for (dep, names) in follow {
            let before = wanted.get(&dep).cloned().unwrap_or_default();
            if before == names {
                continue;
            }
            let req = DeltaDiscoveryRequest {
                type_url: dep.as_str().into(),
                resource_names_subscribe: names.difference(&before).cloned().collect(),
                resource_names_unsubscribe: before.difference(&names).cloned().collect(),
                ..Default::default()
            };
            wanted.insert(dep, names.clone());
            forget_unasked(&state, dep, &names);
            if tx.send(req).await.is_err() {
                return;
            }
        }
    }
    update(&state, |s| s.connected = false);
}

/// Drops the held resources of `type_url` no longer asked for, as Envoy drops the endpoints of
/// a cluster and the routes of a listener it removed.
fn forget_unasked(state: &ArcSwap<SimState>, type_url: TypeUrl, asked: &BTreeSet<String>) {
    update(state, |s| {
        if let Some(t) = s.types.get_mut(&type_url) {
            t.acked_resources.retain(|name, _| asked.contains(name));
        }
    });
}

fn update(state: &ArcSwap<SimState>, f: impl FnOnce(&mut SimState)) {
    let mut next = SimState::clone(&state.load());
    f(&mut next);
    state.store(Arc::new(next));
}

fn resource_name(type_url: TypeUrl, bytes: &[u8]) -> Option<String> {
    use envoy_types::pb::envoy::config::endpoint::v3::ClusterLoadAssignment;
    use envoy_types::pb::envoy::config::route::v3::RouteConfiguration;
    match type_url {
        TypeUrl::Cluster => Cluster::decode(bytes).ok().map(|c| c.name),
        TypeUrl::Endpoint => ClusterLoadAssignment::decode(bytes).ok().map(|c| c.cluster_name),
        TypeUrl::Listener => Listener::decode(bytes).ok().map(|l| l.name),
        TypeUrl::Route => RouteConfiguration::decode(bytes).ok().map(|r| r.name),
        TypeUrl::Secret => {
            envoy_types::pb::envoy::extensions::transport_sockets::tls::v3::Secret::decode(bytes).ok().map(|s| s.name)
        }
    }
}

/// The EDS names of the clusters encoded in `clusters`.
fn eds_names<'a>(clusters: impl Iterator<Item = &'a [u8]>) -> BTreeSet<String> {
    clusters
        .filter_map(|bytes| Cluster::decode(bytes).ok())
        .filter(|c| matches!(c.cluster_discovery_type, Some(ClusterDiscoveryType::Type(t)) if t == DiscoveryType::Eds as i32))
        .map(|c| c.eds_cluster_config.map(|e| e.service_name).filter(|n| !n.is_empty()).unwrap_or(c.name))
        .collect()
}

/// The secrets the listeners encoded in `listeners` ask for over ADS.
fn sds_names<'a>(listeners: impl Iterator<Item = &'a [u8]>) -> BTreeSet<String> {
    listeners.flat_map(super::load::names::secret_names).collect()
}

/// The RDS route config names the listeners encoded in `listeners` name.
fn rds_names<'a>(listeners: impl Iterator<Item = &'a [u8]>) -> BTreeSet<String> {
    listeners.flat_map(super::load::names::route_names).collect()
}
