//! Test helpers: one ADS stream of either protocol, served in-process from snapshots the test
//! publishes.

use std::sync::Arc;
use std::time::Duration;

use envoy_types::pb::envoy::config::core::v3::Node;
use envoy_types::pb::google::rpc::Status as RpcStatus;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::Status;

use super::admission::{Admission, AdmissionSettings};
use super::cache::GenerationCache;
use super::metrics::XdsMetrics;
use super::response::Framed;
use super::status::ConnectionRegistry;
use super::stream::{serve_as, Caller, ConnectionContext, Protocol};
use crate::config::parse::{parse_file, Document};
use crate::envoy::testing::snapshot;
use crate::registry::kubernetes::{KubeObject, KubeSecret, PrivateKey};
use crate::security::Identity;
use crate::snapshot::{ChangeSet, Snapshot, SnapshotWriter, SourceState, Version};

/// A sidecar in `default`.
pub(crate) fn node() -> Node {
    Node { id: "sidecar~10.0.0.5~app.default~default.svc.cluster.local".into(), ..Default::default() }
}

/// A gateway in `apps`, the namespace of [`credentials`].
pub(crate) fn gateway_node() -> Node {
    Node { id: "router~10.0.0.9~gw.apps~apps.svc.cluster.local".into(), ..Default::default() }
}

/// A caller that proved an identity of `apps`: a [`gateway_node`] it serves may be sent credentials.
pub(crate) fn gateway_caller() -> Caller {
    Caller::Authenticated(vec![Identity::parse("spiffe://cluster.local/ns/apps/sa/gw").expect("an identity")])
}

/// A snapshot holding a TLS Secret `apps/NAME` (served as `kubernetes://NAME`) per name, each
/// named by a server of a Gateway in `apps` (only Secrets a Gateway names enter a snapshot).
pub(crate) fn credentials(names: &[&str]) -> Snapshot {
    let kube = names.iter().map(|name| {
        let secret = KubeObject::Secret(KubeSecret {
            name: name.to_string(),
            namespace: "apps".into(),
            cert_chain: format!("CERT of {name}"),
            private_key: PrivateKey(format!("KEY of {name}")),
            ca: String::new(),
        });
        (secret.key(), Arc::new(secret))
    });
    let servers: Vec<String> = names
        .iter()
        .enumerate()
        .map(|(i, name)| {
            format!(
                "  - {{port: {{number: {}, name: https-{i}, protocol: HTTPS}}, hosts: [{name}.example.com], tls: {{mode: SIMPLE, credentialName: {name}}}}}\n",
                8443 + i
            )
        })
        .collect();
    let gateway = format!(
        "apiVersion: networking.istio.io/v1\nkind: Gateway\nmetadata: {{name: gw, namespace: apps}}\nspec:\n  selector: {{istio: ingress}}\n  servers:\n{}",
        servers.concat()
    );
    let mut state = SourceState { kube: kube.collect(), ..Default::default() };
    for doc in parse_file("gateway.yaml", &gateway) {
        let Document::Valid(o) = doc else { panic!("invalid test Gateway: {doc:?}") };
        state.configs.insert(o.key.clone(), Arc::new(o));
    }
    Snapshot::build(Version::new(1, 1), ChangeSet::full(), &state)
}

/// A ServiceEntry `NAME.example.com` (port 80, HTTP) in `default` with one endpoint.
pub(crate) fn service(name: &str, address: &str) -> String {
    format!(
        "apiVersion: networking.istio.io/v1\nkind: ServiceEntry\nmetadata: {{name: {name}, namespace: default}}\nspec: {{hosts: [{name}.example.com], location: MESH_INTERNAL, resolution: STATIC, ports: [{{number: 80, name: http}}], endpoints: [{{address: {address}}}]}}\n"
    )
}

/// The outbound cluster (and load assignment) name of [`service`] `name`.
pub(crate) fn cluster(name: &str) -> String {
    format!("outbound|80||{name}.example.com")
}

/// A NACK's error detail.
pub(crate) fn rejection(message: &str) -> RpcStatus {
    RpcStatus { code: 3, message: message.into(), details: vec![] }
}

/// One stream of protocol `P` served from snapshots published with [`Harness::publish`].
pub(crate) struct Harness<P: Protocol> {
    writer: SnapshotWriter,
    /// The server's connections, for what `/debug/syncz` would show.
    pub registry: Arc<ConnectionRegistry>,
    requests: mpsc::Sender<Result<P::Request, Status>>,
    responses: mpsc::Receiver<Result<P::Response, Status>>,
    version: u64,
    drain: Option<crate::drain::DrainTrigger>,
}

impl<P> Harness<P>
where
    P: Protocol + 'static,
    P::Request: 'static,
    P::Response: 'static,
{
    /// Serves `protocol` on a stream, the first snapshot made of `yaml`.
    pub fn start(protocol: P, yaml: &str) -> Self {
        let mut h = Self::before_first_snapshot(protocol);
        h.publish(yaml);
        h
    }

    /// Serves `protocol` on a stream; no snapshot exists yet.
    pub fn before_first_snapshot(protocol: P) -> Self {
        Self::admitted_by(protocol, AdmissionSettings::default())
    }

    /// Serves `protocol` on a stream within `admission`'s limits, the first snapshot made of `yaml`.
    pub fn start_admitted_by(protocol: P, yaml: &str, admission: AdmissionSettings) -> Self {
        let mut h = Self::admitted_by(protocol, admission);
        h.publish(yaml);
        h
    }

    /// Serves `protocol` on a stream from `caller`, the first snapshot `first`.
    pub fn start_as(protocol: P, caller: Caller, first: Snapshot) -> Self {
        let mut h = Self::serving(protocol, caller, AdmissionSettings::default());
        h.publish_snapshot(first);
        h
    }

    fn admitted_by(protocol: P, admission: AdmissionSettings) -> Self {
        Self::serving(protocol, Caller::Unauthenticated, admission)
    }

    fn serving(protocol: P, caller: Caller, admission: AdmissionSettings) -> Self {
        let (writer, reader) = crate::snapshot::channel();
        let (trigger, drain) = crate::drain::new();
        let metrics = XdsMetrics::default();
        let registry = Arc::new(ConnectionRegistry::new(metrics.clone()));
        let ctx = ConnectionContext {
            snapshots: reader,
            cache: Arc::new(GenerationCache::default()),
            registry: registry.clone(),
            metrics,
            drain,
            admission: Arc::new(Admission::new(admission)),
            control_plane: crate::xds::debug::control_plane_identifier("test").into(),
        };
        let (requests, rx) = mpsc::channel(16);
        let (tx, responses) = mpsc::channel(16);
        tokio::spawn(serve_as(ctx, caller, protocol, ReceiverStream::new(rx), tx));
        Harness { writer, registry, requests, responses, version: 0, drain: Some(trigger) }
    }

    /// Starts the frontend's drain.
    pub fn drain(&mut self) {
        self.drain = None;
    }

    /// The status the stream ended with, `None` if it did not end with one within half a second.
    pub async fn end_status(&mut self) -> Option<Status> {
        loop {
            match tokio::time::timeout(Duration::from_millis(500), self.responses.recv()).await.ok()?? {
                Ok(_) => continue,
                Err(status) => return Some(status),
            }
        }
    }

    /// Publishes a new snapshot made of `yaml`.
    pub fn publish(&mut self, yaml: &str) {
        self.publish_snapshot(snapshot(yaml));
    }

    /// Publishes `snap` as the next snapshot.
    pub fn publish_snapshot(&mut self, mut snap: Snapshot) {
        self.version += 1;
        snap.version = Version::new(1, self.version);
        self.writer.publish(Arc::new(snap)).expect("versions grow");
    }

    /// Lets the stream handle the requests sent so far (before a publish races them).
    pub async fn settle(&self) {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    /// Sends a request.
    pub async fn send(&self, request: P::Request) {
        self.requests.send(Ok(request)).await.expect("stream open");
    }

    /// The next response, decoded; `None` if none comes within half a second.
    pub async fn next(&mut self) -> Option<<P::Response as Framed>::Message> {
        let r = tokio::time::timeout(Duration::from_millis(500), self.responses.recv()).await.ok()??;
        Some(r.expect("no error status").decode().expect("a response that decodes"))
    }
}
