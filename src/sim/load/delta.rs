//! One simulated sidecar on a delta (incremental) ADS stream: wildcard CDS and LDS, explicit EDS
//! and RDS subscriptions that follow the names clusters and listeners come and go with, every
//! response nonce ACKed at once. What it holds of CDS/LDS is a shared [`DeltaHeld`] state.

use std::sync::Arc;

use bytes::Bytes;
use envoy_types::pb::envoy::config::core::v3::Node;
use envoy_types::pb::envoy::service::discovery::v3::DeltaDiscoveryRequest;
use tokio::sync::mpsc;

use super::identity::ProxyIdentity;
use super::names::{diff, Coverage, DeltaHeld};
use super::stream::{Flavour, ProxyContext};
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

/// Runs proxy `id` on a delta stream until it ends (or the task is aborted).
pub async fn run(ctx: Arc<ProxyContext>, id: ProxyIdentity) {
    super::stream::run::<State>(ctx, id).await
}

impl Flavour for State {
    type Request = DeltaDiscoveryRequest;
    const PATH: &'static str = PATH;

    fn subscribe(type_url: TypeUrl, node: Option<Node>) -> DeltaDiscoveryRequest {
        DeltaDiscoveryRequest { node, type_url: type_url.as_str().into(), ..Default::default() }
    }

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
            // Simulated sidecars never ask for gateway credentials.
            TypeUrl::Secret => {}
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
