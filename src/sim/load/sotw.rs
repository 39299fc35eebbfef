//! One simulated sidecar on a state-of-the-world ADS stream, subscribing in Envoy's order: CDS
//! and LDS wildcard, then EDS for the EDS clusters and RDS for the route configs they name.
//! Every response is ACKed at once; nothing of it is kept beyond the names it leads to.

use std::sync::Arc;

use bytes::Bytes;
use envoy_types::pb::envoy::config::core::v3::Node;
use envoy_types::pb::envoy::service::discovery::v3::DiscoveryRequest;
use tokio::sync::mpsc;

use super::identity::ProxyIdentity;
use super::names::{Coverage, Names};
use super::stream::{Flavour, ProxyContext};
use super::wire::{self, string_field, SotwResponse};
use crate::xds::TypeUrl;

/// The SotW ADS method.
pub const PATH: &str = "/envoy.service.discovery.v3.AggregatedDiscoveryService/StreamAggregatedResources";

/// What the proxy holds: whether CDS and LDS arrived, and which EDS/RDS names it has received.
#[derive(Default)]
struct State {
    cds: bool,
    lds: bool,
    eds: Coverage,
    rds: Coverage,
    /// Version and nonce of the last EDS and RDS responses (a subscription change carries them).
    eds_acked: (String, String),
    rds_acked: (String, String),
    converged: bool,
}

/// Runs proxy `id` on a state-of-the-world stream until it ends (or the task is aborted).
pub async fn run(ctx: Arc<ProxyContext>, id: ProxyIdentity) {
    super::stream::run::<State>(ctx, id).await
}

impl Flavour for State {
    type Request = DiscoveryRequest;
    const PATH: &'static str = PATH;

    fn subscribe(type_url: TypeUrl, node: Option<Node>) -> DiscoveryRequest {
        DiscoveryRequest { node, type_url: type_url.as_str().into(), ..Default::default() }
    }

    async fn on_response(
        &mut self,
        ctx: &ProxyContext,
        id: &ProxyIdentity,
        capture: Option<&str>,
        bytes: Bytes,
        tx: &mpsc::Sender<Box<DiscoveryRequest>>,
    ) -> Result<(), String> {
        let len = bytes.len();
        let resp = wire::sotw(&bytes).map_err(|e| format!("bad DiscoveryResponse: {e}"))?;
        let now = ctx.board.response(id.index, len, capture.map(|k| (k, resp.type_url, &bytes)));
        let Some(type_url) = TypeUrl::parse(resp.type_url) else {
            // A type it never asked for: ACK it as Envoy would, and otherwise ignore it.
            return send(tx, ack(&resp, Vec::new())).await;
        };
        let values = resp.resources.iter().copied();
        let mut follow: Option<(TypeUrl, Names)> = None;
        match type_url {
            TypeUrl::Cluster => {
                self.cds = true;
                let names = ctx.cache().sotw(type_url, values);
                if *names != **self.eds.names() {
                    follow = Some((TypeUrl::Endpoint, names));
                }
            }
            TypeUrl::Listener => {
                self.lds = true;
                let names = ctx.cache().sotw(type_url, values);
                if *names != **self.rds.names() {
                    follow = Some((TypeUrl::Route, names));
                }
            }
            TypeUrl::Endpoint | TypeUrl::Route => {
                let (held, acked) = match type_url {
                    TypeUrl::Endpoint => (&mut self.eds, &mut self.eds_acked),
                    _ => (&mut self.rds, &mut self.rds_acked),
                };
                for v in values {
                    // A resource without a readable name covers nothing; the proxy then never converges.
                    if let Ok(name) = string_field(v, 1) {
                        held.cover(name);
                    }
                }
                *acked = (resp.version_info.to_string(), resp.nonce.to_string());
            }
            // Simulated sidecars never ask for gateway credentials.
            TypeUrl::Secret => {}
        }
        let subscribed = match type_url {
            TypeUrl::Endpoint => names_of(&self.eds),
            TypeUrl::Route => names_of(&self.rds),
            _ => Vec::new(),
        };
        send(tx, ack(&resp, subscribed)).await?;
        if let Some((dep, names)) = follow {
            let (held, (version, nonce)) = match dep {
                TypeUrl::Endpoint => (&mut self.eds, &self.eds_acked),
                _ => (&mut self.rds, &self.rds_acked),
            };
            held.set(names);
            let request = DiscoveryRequest {
                version_info: version.clone(),
                response_nonce: nonce.clone(),
                type_url: dep.as_str().into(),
                resource_names: names_of(held),
                ..Default::default()
            };
            send(tx, request).await?;
        }
        if !self.converged && self.cds && self.lds && self.eds.complete() && self.rds.complete() {
            self.converged = true;
            ctx.board.converged(id.index, now);
        }
        Ok(())
    }
}

fn names_of(c: &Coverage) -> Vec<String> {
    c.names().iter().map(|n| n.to_string()).collect()
}

fn ack(resp: &SotwResponse<'_>, resource_names: Vec<String>) -> DiscoveryRequest {
    DiscoveryRequest {
        version_info: resp.version_info.to_string(),
        response_nonce: resp.nonce.to_string(),
        type_url: resp.type_url.to_string(),
        resource_names,
        ..Default::default()
    }
}

async fn send(tx: &mpsc::Sender<Box<DiscoveryRequest>>, request: DiscoveryRequest) -> Result<(), String> {
    tx.send(Box::new(request)).await.map_err(|_| "request stream closed".to_string())
}
