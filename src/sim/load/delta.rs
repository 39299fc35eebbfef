//! One simulated sidecar on a delta (incremental) ADS stream: wildcard CDS and LDS, explicit EDS
//! and RDS subscriptions that follow the names clusters and listeners come and go with, every
//! response nonce ACKed at once. What it holds of CDS/LDS is a shared [`DeltaHeld`] state.

use std::sync::Arc;

use bytes::Bytes;
use envoy_types::pb::envoy::service::discovery::v3::DeltaDiscoveryRequest;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tokio_stream::StreamExt;

use super::identity::ProxyIdentity;
use super::names::{diff, Coverage, DeltaHeld};
use super::stream::{open, ProxyContext};
use super::wire;
use crate::xds::TypeUrl;

/// The delta ADS method.
pub const PATH: &str = "/envoy.service.discovery.v3.AggregatedDiscoveryService/DeltaAggregatedResources";

/// What the proxy holds.
#[derive(Default)]
struct State {
    clusters: Option<Arc<DeltaHeld>>,
    listeners: Option<Arc<DeltaHeld>>,
    eds: Coverage,
    rds: Coverage,
    converged: bool,
}

/// Runs proxy `id` until its stream ends (or the task is aborted).
pub async fn run(ctx: Arc<ProxyContext>, id: ProxyIdentity) {
    // Boxed: a request with its node is large, and the channel allocates slots for 32 at once.
    let (tx, rx) = mpsc::channel::<Box<DeltaDiscoveryRequest>>(16);
    let node = id.node();
    for (i, t) in [TypeUrl::Cluster, TypeUrl::Listener].into_iter().enumerate() {
        let first = DeltaDiscoveryRequest {
            node: (i == 0).then(|| node.clone()),
            type_url: t.as_str().into(),
            ..Default::default()
        };
        // The channel is new and has room: this cannot fail.
        let _ = tx.try_send(Box::new(first));
    }
    let mut responses = match open(&ctx, &id, PATH, ReceiverStream::new(rx).map(|r| *r)).await {
        Ok(s) => s,
        Err(e) => return ctx.board.error(id.index, e),
    };
    ctx.board.connected(id.index);
    let capture = ctx.capture_key(&id);
    let mut state = State::default();
    loop {
        match responses.message(&ctx.assembly).await {
            Ok(Some(bytes)) => {
                if let Err(e) = state.on_response(&ctx, &id, capture.as_deref(), bytes, &tx).await {
                    return ctx.board.error(id.index, e);
                }
            }
            Ok(None) => return ctx.board.error(id.index, "stream closed by the server"),
            Err(e) => return ctx.board.error(id.index, e),
        }
    }
}

impl State {
    async fn on_response(
        &mut self,
        ctx: &ProxyContext,
        id: &ProxyIdentity,
        capture: Option<&str>,
        bytes: Bytes,
        tx: &mpsc::Sender<Box<DeltaDiscoveryRequest>>,
    ) -> Result<(), String> {
        let len = bytes.len();
        let resp = wire::delta(&bytes).map_err(|e| format!("bad DeltaDiscoveryResponse: {e}"))?;
        let now = ctx.board.response(id.index, len, capture.map(|k| (k, resp.type_url, &bytes)));
        let ack = DeltaDiscoveryRequest {
            type_url: resp.type_url.to_string(),
            response_nonce: resp.nonce.to_string(),
            ..Default::default()
        };
        send(tx, ack).await?;
        let Some(type_url) = TypeUrl::parse(resp.type_url) else { return Ok(()) };
        match type_url {
            TypeUrl::Cluster | TypeUrl::Listener => {
                let (held, coverage, dep) = match type_url {
                    TypeUrl::Cluster => (&mut self.clusters, &mut self.eds, TypeUrl::Endpoint),
                    _ => (&mut self.listeners, &mut self.rds, TypeUrl::Route),
                };
                let before = held.clone().unwrap_or_default();
                let after = ctx.cache().delta(type_url, &before, &resp.resources, &resp.removed);
                *held = Some(after.clone());
                if *after.names != **coverage.names() {
                    let (subscribe, unsubscribe) = diff(coverage.names(), &after.names);
                    coverage.set(after.names.clone());
                    let request = DeltaDiscoveryRequest {
                        type_url: dep.as_str().into(),
                        resource_names_subscribe: subscribe,
                        resource_names_unsubscribe: unsubscribe,
                        ..Default::default()
                    };
                    send(tx, request).await?;
                }
            }
            TypeUrl::Endpoint | TypeUrl::Route => {
                let coverage = if type_url == TypeUrl::Endpoint { &mut self.eds } else { &mut self.rds };
                for (name, _) in &resp.resources {
                    coverage.cover(name);
                }
            }
        }
        let holds = self.clusters.is_some() && self.listeners.is_some();
        if !self.converged && holds && self.eds.complete() && self.rds.complete() {
            self.converged = true;
            ctx.board.converged(id.index, now);
        }
        Ok(())
    }
}

async fn send(tx: &mpsc::Sender<Box<DeltaDiscoveryRequest>>, request: DeltaDiscoveryRequest) -> Result<(), String> {
    tx.send(Box::new(request)).await.map_err(|_| "request stream closed".to_string())
}
