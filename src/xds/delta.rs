//! Delta ADS (`DeltaAggregatedResources`): a response carries only the resources the proxy does
//! not hold at their current version, and the names it should drop. Versions are content
//! hashes, so a reconnecting proxy's `initial_resource_versions` spare it everything unchanged.
//!
//! Removals of clusters and endpoints wait for the end of a push, after the listeners and routes
//! that stopped referring to them, as istiod orders them.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::time::Instant;

use envoy_types::pb::envoy::config::core::v3::Node;
use envoy_types::pb::envoy::service::discovery::v3::{DeltaDiscoveryRequest, DeltaDiscoveryResponse, Resource};
use tracing::debug;

use super::changes::{self, Held};
use super::isolation::{Holding, Isolation, Piece};
use super::limits;
use super::session::{nonce_version, Outgoing, Session};
use super::status::Transport;
use super::stream::{over_limit, Protocol, StreamEnd};
use super::subscription::Subscription;
use super::TypeUrl;

/// Responses of one type awaiting an answer; older ones are forgotten (their answers then
/// count as expired nonces).
const MAX_IN_FLIGHT: usize = 16;

/// Why a response is computed.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Reason {
    /// A request that waits for an answer: one is sent even if empty; `absent` names it
    /// subscribed to that do not exist are reported removed, so the proxy stops waiting.
    Request { absent: Vec<String> },
    /// A new snapshot.
    Push,
    /// The proxy answered and something is due (the rest after a NACK, the next bisection test).
    Retry,
}

/// One response sent and not yet answered.
#[derive(Debug)]
struct InFlight {
    nonce: String,
    /// What the proxy holds of the type once it accepts it (for isolation).
    holding: Holding,
    updated: Vec<(String, u64)>,
    removed: Vec<String>,
}

/// One type's state on a delta stream.
#[derive(Debug, Default)]
struct Watch {
    subscription: Subscription,
    /// What the proxy holds once it applied every response sent.
    held: Held,
    /// What it held as of its last ACK: its last good config, restored on a NACK.
    acked: Held,
    in_flight: VecDeque<InFlight>,
    isolation: Isolation,
    /// Removals held back until the end of the current push, with the holding they complete.
    deferred: Option<(Holding, Vec<String>)>,
}

/// The delta protocol of one stream.
#[derive(Debug, Default)]
pub struct Delta {
    watches: BTreeMap<TypeUrl, Watch>,
    /// Clusters the current push changed: Envoy rebuilds them, and they need their endpoints again.
    clusters_changed: BTreeSet<String>,
}

impl Protocol for Delta {
    type Request = DeltaDiscoveryRequest;
    type Response = DeltaDiscoveryResponse;
    const TRANSPORT: Transport = Transport::Delta;

    fn node(request: &DeltaDiscoveryRequest) -> Option<&Node> {
        request.node.as_ref()
    }

    async fn on_request(
        &mut self,
        session: &mut Session<DeltaDiscoveryResponse>,
        req: DeltaDiscoveryRequest,
    ) -> Result<(), StreamEnd> {
        let names = req.resource_names_subscribe.len()
            + req.resource_names_unsubscribe.len()
            + req.initial_resource_versions.len();
        limits::check_names(names).map_err(over_limit)?;
        let Some(type_url) = TypeUrl::parse(&req.type_url) else {
            debug!(proxy = %session.proxy.id, type_url = %limits::loggable(&req.type_url), "request for an unserved type ignored");
            return Ok(());
        };
        let first = !self.watches.contains_key(&type_url);
        let watch = self.watches.entry(type_url).or_default();
        let due = !req.response_nonce.is_empty() && watch.answer(session, type_url, &req);
        if first {
            // A reconnecting proxy says what it holds: only what differs is sent.
            watch.held =
                req.initial_resource_versions.iter().map(|(n, v)| (n.clone(), changes::parse_version(v))).collect();
            watch.acked = watch.held.clone();
        }
        let change =
            watch.subscription.apply(type_url, first, &req.resource_names_subscribe, &req.resource_names_unsubscribe);
        for name in &change.dropped {
            // The proxy dropped it: a later subscription gets it afresh.
            watch.held.remove(name);
            watch.acked.remove(name);
        }
        if first || change.wants_more() {
            self.respond(session, type_url, Reason::Request { absent: change.subscribed }).await?;
        } else if due {
            self.respond(session, type_url, Reason::Retry).await?;
        }
        Ok(())
    }

    fn watches(&self, type_url: TypeUrl) -> bool {
        self.watches.contains_key(&type_url)
    }

    fn on_new_snapshot(&mut self) {
        for watch in self.watches.values_mut() {
            watch.isolation.on_new_snapshot();
        }
        self.clusters_changed.clear();
    }

    async fn push(
        &mut self,
        session: &mut Session<DeltaDiscoveryResponse>,
        type_url: TypeUrl,
    ) -> Result<bool, StreamEnd> {
        self.respond(session, type_url, Reason::Push).await
    }

    async fn finish_push(&mut self, session: &mut Session<DeltaDiscoveryResponse>) -> Result<bool, StreamEnd> {
        let mut sent = false;
        for type_url in [TypeUrl::Endpoint, TypeUrl::Cluster] {
            let Some((holding, removed)) = self.watches.get_mut(&type_url).and_then(|w| w.deferred.take()) else {
                continue;
            };
            let Some(snapshot) = session.snapshot.clone() else { continue };
            let nonce = session.next_nonce(&snapshot);
            sent |= self.send(session, type_url, Vec::new(), removed, holding, nonce, Instant::now(), true).await?;
        }
        Ok(sent)
    }
}

impl Watch {
    /// Handles the ACK or NACK a request carries; returns whether a response is due.
    fn answer(
        &mut self,
        session: &mut Session<DeltaDiscoveryResponse>,
        type_url: TypeUrl,
        req: &DeltaDiscoveryRequest,
    ) -> bool {
        let Some(at) = self.in_flight.iter().position(|f| f.nonce == req.response_nonce) else {
            session.expired_nonce(type_url, &req.response_nonce);
            return false;
        };
        // Envoy answers responses in order: any older one still listed was accepted.
        for older in self.in_flight.drain(..at) {
            changes::apply(&mut self.acked, &older.updated, &older.removed);
        }
        let Some(flight) = self.in_flight.pop_front() else { return false };
        if let Some(err) = &req.error_detail {
            let due = session.nack(type_url, &flight.nonce, &err.message, &mut self.isolation, &flight.holding);
            if due {
                // The proxy keeps its last good config; the next response starts from there.
                self.held = self.acked.clone();
            }
            return due;
        }
        changes::apply(&mut self.acked, &flight.updated, &flight.removed);
        session.ack(type_url, nonce_version(&flight.nonce), &flight.nonce, &mut self.isolation, &flight.holding)
    }
}

impl Delta {
    /// Sends what the proxy lacks of `type_url`; returns whether it sent.
    async fn respond(
        &mut self,
        session: &mut Session<DeltaDiscoveryResponse>,
        type_url: TypeUrl,
        reason: Reason,
    ) -> Result<bool, StreamEnd> {
        let started = Instant::now();
        let Some((snapshot, generated)) = session.generated(type_url).await else {
            return Ok(false);
        };
        let Some(watch) = self.watches.get_mut(&type_url) else {
            return Ok(false);
        };
        let holding = watch.isolation.compose(&generated, watch.subscription.names());
        let rebuilt = &self.clusters_changed;
        let updated = changes::updated(&holding, |name| {
            let held = watch.held.get(name).copied();
            held.filter(|_| type_url != TypeUrl::Endpoint || !rebuilt.contains(name))
        });
        if type_url == TypeUrl::Cluster && reason == Reason::Push {
            self.clusters_changed = updated.iter().map(|p| p.name().to_string()).collect();
        }
        let mut removed = changes::removed(&watch.held, &holding);
        watch.deferred = None;
        if reason == Reason::Push && matches!(type_url, TypeUrl::Cluster | TypeUrl::Endpoint) && !removed.is_empty() {
            watch.deferred = Some((holding.clone(), std::mem::take(&mut removed)));
        }
        if let Reason::Request { absent } = &reason {
            let unknown: Vec<String> =
                absent.iter().filter(|n| holding.get(n).is_none() && !removed.contains(n)).cloned().collect();
            removed.extend(unknown);
        }
        if updated.is_empty() && removed.is_empty() && !matches!(reason, Reason::Request { .. }) {
            return Ok(false);
        }
        let nonce = session.next_nonce(&snapshot);
        self.send(session, type_url, updated, removed, holding, nonce, started, reason == Reason::Push).await
    }

    /// Sends one response and notes what the proxy will hold once it applies it.
    #[allow(clippy::too_many_arguments)]
    async fn send(
        &mut self,
        session: &mut Session<DeltaDiscoveryResponse>,
        type_url: TypeUrl,
        updated: Vec<Piece>,
        removed: Vec<String>,
        holding: Holding,
        nonce: String,
        started: Instant,
        push: bool,
    ) -> Result<bool, StreamEnd> {
        let Some(watch) = self.watches.get_mut(&type_url) else {
            return Ok(false);
        };
        let version = nonce_version(&nonce);
        let resources: Vec<Resource> = updated
            .iter()
            .map(|p| Resource {
                name: p.name().to_string(),
                version: changes::resource_version(p.hash()),
                resource: Some(p.body().clone()),
                ..Default::default()
            })
            .collect();
        let flight = InFlight {
            nonce: nonce.clone(),
            holding,
            updated: updated.iter().map(|p| (p.name().to_string(), p.hash())).collect(),
            removed: removed.clone(),
        };
        changes::apply(&mut watch.held, &flight.updated, &flight.removed);
        if watch.in_flight.len() == MAX_IN_FLIGHT {
            watch.in_flight.pop_front();
        }
        watch.in_flight.push_back(flight);
        let bytes = resources.iter().filter_map(|r| r.resource.as_ref()).map(|a| a.value.len()).sum();
        let count = resources.len();
        let response = DeltaDiscoveryResponse {
            system_version_info: version.clone(),
            resources,
            type_url: type_url.as_str().to_string(),
            removed_resources: removed,
            nonce: nonce.clone(),
            ..Default::default()
        };
        session.send(response, Outgoing { type_url, version, nonce, count, bytes, started, push }).await?;
        Ok(true)
    }
}
