//! Delta ADS (`DeltaAggregatedResources`): a response carries only the resources the proxy does
//! not hold at their current version, and the names it should drop. Versions are content
//! hashes, so a reconnecting proxy's `initial_resource_versions` spare it everything unchanged.
//!
//! Removals of clusters and endpoints wait for the end of a push, after the listeners and routes
//! that stopped referring to them, as istiod orders them.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::time::Instant;

use envoy_types::pb::envoy::config::core::v3::{ControlPlane, Node};
use envoy_types::pb::envoy::service::discovery::v3::{DeltaDiscoveryRequest, DeltaDiscoveryResponse, Resource};
use tracing::debug;

use super::changes::{self, Held};
use super::isolation::{Holding, Isolation, Piece};
use super::limits;
use super::protocol::DebugResource;
use super::resource_version;
use super::response::{DeltaResource, Encoded};
use super::session::{nonce_version, Outgoing, Session};
use super::status::Transport;
use super::stream::{over_limit, Protocol, StreamEnd};
use super::subscription::Subscription;
use super::TypeUrl;
use crate::telemetry::log_text::Untrusted;

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
    updated: Vec<Piece>,
    removed: Vec<String>,
    /// What the proxy holds once it accepts this and every response before it, when that is
    /// exactly `holding`; dropped when an earlier one is rejected.
    after: Option<Held>,
}

impl InFlight {
    /// `acked` once the proxy accepted this response.
    fn accepted(&self, acked: &mut Held) {
        match &self.after {
            Some(after) => *acked = after.clone(),
            None => acked.apply(&self.updated, &self.removed),
        }
    }
}

/// One response's content.
struct Change {
    /// Resources the proxy lacks at their current version.
    updated: Vec<Piece>,
    /// Names it should drop.
    removed: Vec<String>,
    /// What it holds of the type once it accepts the response.
    holding: Holding,
    /// Whether it then holds exactly `holding` (no removal is deferred).
    complete: bool,
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

/// A delta response, encoded.
pub type DeltaResponse = Encoded<DeltaDiscoveryResponse>;

/// The delta protocol of one stream.
#[derive(Debug, Default)]
pub struct Delta {
    watches: BTreeMap<TypeUrl, Watch>,
    /// Clusters the current push changed: Envoy rebuilds them, and they need their endpoints again.
    clusters_changed: BTreeSet<String>,
}

impl Protocol for Delta {
    type Request = DeltaDiscoveryRequest;
    type Response = DeltaResponse;
    const TRANSPORT: Transport = Transport::Delta;

    fn node(request: &DeltaDiscoveryRequest) -> Option<&Node> {
        request.node.as_ref()
    }

    fn type_url(request: &DeltaDiscoveryRequest) -> &str {
        &request.type_url
    }

    fn debug_names(request: &DeltaDiscoveryRequest) -> &[String] {
        &request.resource_names_subscribe
    }

    fn debug_response(
        type_url: &str,
        nonce: &str,
        control_plane: &str,
        resources: Vec<DebugResource>,
    ) -> DeltaResponse {
        Encoded::whole(&DeltaDiscoveryResponse {
            type_url: type_url.to_string(),
            nonce: nonce.to_string(),
            resources: resources
                .into_iter()
                .map(|(name, any)| Resource { name, resource: Some(any), ..Default::default() })
                .collect(),
            control_plane: Some(ControlPlane { identifier: control_plane.to_string() }),
            ..Default::default()
        })
    }

    async fn on_request(
        &mut self,
        session: &mut Session<DeltaResponse>,
        req: DeltaDiscoveryRequest,
    ) -> Result<(), StreamEnd> {
        let names = req.resource_names_subscribe.len()
            + req.resource_names_unsubscribe.len()
            + req.initial_resource_versions.len();
        limits::check_names(names).map_err(over_limit)?;
        let Some(type_url) = TypeUrl::parse(&req.type_url) else {
            debug!(proxy = %Untrusted(&session.proxy.id), type_url = %Untrusted(&req.type_url), "request for an unserved type ignored");
            return Ok(());
        };
        let first = !self.watches.contains_key(&type_url);
        let watch = self.watches.entry(type_url).or_default();
        let due = !req.response_nonce.is_empty() && watch.answer(session, type_url, &req);
        if first {
            // A reconnecting proxy says what it holds: only what differs is sent.
            watch.held = Held::Listed(
                req.initial_resource_versions
                    .iter()
                    .map(|(n, v)| (n.clone(), resource_version::parse_version(v)))
                    .collect(),
            );
            watch.acked = watch.held.clone();
        }
        let change =
            watch.subscription.apply(type_url, first, &req.resource_names_subscribe, &req.resource_names_unsubscribe);
        for name in &change.dropped {
            // The proxy dropped it: a later subscription gets it afresh.
            watch.held.forget(name);
            watch.acked.forget(name);
        }
        let sent = if first || change.wants_more() {
            self.respond(session, type_url, Reason::Request { absent: change.subscribed }).await?
        } else if due {
            self.respond(session, type_url, Reason::Retry).await?
        } else {
            false
        };
        // A cluster Envoy (re)builds warms until its endpoints arrive, and over delta Envoy need not
        // ask for them again (a reconnect may subscribe to endpoints before clusters): send them.
        if sent && type_url == TypeUrl::Cluster && !self.clusters_changed.is_empty() && self.watches(TypeUrl::Endpoint)
        {
            self.respond(session, TypeUrl::Endpoint, Reason::Retry).await?;
            self.clusters_changed.clear();
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

    fn settled(&self) -> bool {
        self.watches
            .values()
            .all(|w| w.isolation.is_clean() && w.deferred.is_none() && w.held.is_whole_under(w.subscription.names()))
    }

    async fn push(&mut self, session: &mut Session<DeltaResponse>, type_url: TypeUrl) -> Result<bool, StreamEnd> {
        self.respond(session, type_url, Reason::Push).await
    }

    async fn finish_push(&mut self, session: &mut Session<DeltaResponse>) -> Result<bool, StreamEnd> {
        self.clusters_changed.clear();
        let mut sent = false;
        for type_url in [TypeUrl::Endpoint, TypeUrl::Cluster] {
            let Some((holding, removed)) = self.watches.get_mut(&type_url).and_then(|w| w.deferred.take()) else {
                continue;
            };
            let change = Change { updated: Vec::new(), removed, holding, complete: true };
            sent |= self.send(session, type_url, change, Instant::now(), true).await?;
        }
        Ok(sent)
    }
}

impl Watch {
    /// Handles the ACK or NACK a request carries; returns whether a response is due.
    fn answer(&mut self, session: &mut Session<DeltaResponse>, type_url: TypeUrl, req: &DeltaDiscoveryRequest) -> bool {
        let Some(at) = self.in_flight.iter().position(|f| f.nonce == req.response_nonce) else {
            session.expired_nonce(type_url, &req.response_nonce);
            return false;
        };
        // Envoy answers responses in order: any older one still listed was accepted.
        for older in self.in_flight.drain(..at) {
            older.accepted(&mut self.acked);
        }
        let Some(flight) = self.in_flight.pop_front() else { return false };
        if let Some(err) = &req.error_detail {
            // The responses after it were computed as if the proxy had applied it.
            for later in &mut self.in_flight {
                later.after = None;
            }
            let due = session.nack(type_url, &flight.nonce, &err.message, &mut self.isolation, &flight.holding);
            if due {
                // The proxy keeps its last good config; the next response starts from there.
                self.held = self.acked.clone();
            }
            return due;
        }
        flight.accepted(&mut self.acked);
        session.ack(type_url, nonce_version(&flight.nonce), &flight.nonce, &mut self.isolation, &flight.holding)
    }
}

impl Delta {
    /// Sends what the proxy lacks of `type_url`; returns whether it sent.
    async fn respond(
        &mut self,
        session: &mut Session<DeltaResponse>,
        type_url: TypeUrl,
        reason: Reason,
    ) -> Result<bool, StreamEnd> {
        let started = Instant::now();
        let Some((_, generated)) = session.generated(type_url).await else {
            return Ok(false);
        };
        let Some(watch) = self.watches.get_mut(&type_url) else {
            return Ok(false);
        };
        let holding = watch.isolation.compose(&generated, watch.subscription.names());
        let none = BTreeSet::new();
        let resend = if type_url == TypeUrl::Endpoint { &self.clusters_changed } else { &none };
        let (updated, mut removed) = changes::diff(&watch.held, &holding, resend);
        if type_url == TypeUrl::Cluster {
            self.clusters_changed = updated.iter().map(|p| p.name().to_string()).collect();
        }
        watch.deferred = None;
        if reason == Reason::Push && matches!(type_url, TypeUrl::Cluster | TypeUrl::Endpoint) && !removed.is_empty() {
            watch.deferred = Some((holding.clone(), std::mem::take(&mut removed)));
        }
        // Envoy refuses an SDS response that lacks the secret it asked for: a secret this proxy
        // may not have is left unanswered (its listener or cluster stays closed).
        let secret = type_url == TypeUrl::Secret;
        if let Reason::Request { absent } = &reason {
            let unknown = absent.iter().filter(|n| !secret && holding.get(n).is_none() && !removed.contains(n));
            let unknown: Vec<String> = unknown.cloned().collect();
            removed.extend(unknown);
        }
        let complete = watch.deferred.is_none();
        if updated.is_empty() && removed.is_empty() && (secret || !matches!(reason, Reason::Request { .. })) {
            if complete {
                // It holds all of this already: keep the generation itself rather than a copy.
                watch.held = Held::Exactly(holding);
            }
            return Ok(false);
        }
        let change = Change { updated, removed, holding, complete };
        self.send(session, type_url, change, started, reason == Reason::Push).await
    }

    /// Sends one response and notes what the proxy will hold once it applies it.
    async fn send(
        &mut self,
        session: &mut Session<DeltaResponse>,
        type_url: TypeUrl,
        change: Change,
        started: Instant,
        push: bool,
    ) -> Result<bool, StreamEnd> {
        let (Some(snapshot), Some(watch)) = (session.snapshot.clone(), self.watches.get_mut(&type_url)) else {
            return Ok(false);
        };
        let Change { updated, removed, holding, complete } = change;
        let nonce = session.next_nonce(&snapshot);
        let version = nonce_version(&nonce);
        let versions: Vec<String> = updated.iter().map(|p| resource_version::resource_version(p.hash())).collect();
        let resources: Vec<DeltaResource<'_>> = updated
            .iter()
            .zip(&versions)
            .map(|(p, version)| DeltaResource { name: p.name(), version, body: p.encoded() })
            .collect();
        let bytes = resources.iter().map(|r| r.body.len()).sum();
        let count = resources.len();
        let response = Encoded::delta(&version, type_url.as_str(), &nonce, &resources, removed.clone());
        if complete {
            watch.held = Held::Exactly(holding.clone());
        } else {
            watch.held.apply(&updated, &removed);
        }
        let after = complete.then(|| watch.held.clone());
        let flight = InFlight { nonce: nonce.clone(), holding, updated, removed, after };
        if watch.in_flight.len() == MAX_IN_FLIGHT {
            watch.in_flight.pop_front();
        }
        watch.in_flight.push_back(flight);
        session.send(response, Outgoing { type_url, version, nonce, count, bytes, started, push }).await?;
        Ok(true)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::xds::admission::AdmissionSettings;
    use crate::xds::stream_testing::{
        cluster, credentials, gateway_caller, gateway_node, node, rejection, service, Harness,
    };
    use std::time::Duration;

    fn request(type_url: TypeUrl, subscribe: &[String], nonce: &str, nack: Option<&str>) -> DeltaDiscoveryRequest {
        DeltaDiscoveryRequest {
            node: Some(node()),
            type_url: type_url.as_str().into(),
            resource_names_subscribe: subscribe.to_vec(),
            response_nonce: nonce.into(),
            error_detail: nack.map(rejection),
            ..Default::default()
        }
    }

    /// Subscribes and ACKs the answer.
    async fn subscribe(h: &mut Harness<Delta>, type_url: TypeUrl, names: &[String]) -> DeltaDiscoveryResponse {
        h.send(request(type_url, names, "", None)).await;
        let response = h.next().await.expect("an answer");
        h.send(request(type_url, &[], &response.nonce, None)).await;
        response
    }

    fn names(r: &DeltaDiscoveryResponse) -> Vec<String> {
        r.resources.iter().map(|r| r.name.clone()).collect()
    }

    #[tokio::test]
    async fn a_secret_the_proxy_may_not_have_is_left_unanswered() {
        // The node is a sidecar: no secret is ever its to have.
        let mut h = Harness::start(Delta::default(), &service("a", "10.0.0.1"));
        h.send(request(TypeUrl::Secret, &["kubernetes://web".to_string()], "", None)).await;
        assert!(h.next().await.is_none(), "a removal of what Envoy asked for would be refused");
        let cds = subscribe(&mut h, TypeUrl::Cluster, &[]).await;
        assert!(names(&cds).contains(&cluster("a")), "the stream still serves: {:?}", names(&cds));
    }

    #[tokio::test]
    async fn removals_of_clusters_and_endpoints_come_after_listeners_and_routes() {
        let mut h =
            Harness::start(Delta::default(), &[service("a", "10.0.0.1"), service("b", "10.0.0.2")].join("---\n"));
        let cds = subscribe(&mut h, TypeUrl::Cluster, &[]).await;
        assert!(names(&cds).contains(&cluster("b")), "{:?}", names(&cds));
        let eds = subscribe(&mut h, TypeUrl::Endpoint, &[cluster("a"), cluster("b")]).await;
        assert_eq!(names(&eds), [cluster("a"), cluster("b")]);
        subscribe(&mut h, TypeUrl::Listener, &[]).await;
        let rds = subscribe(&mut h, TypeUrl::Route, &["80".to_string()]).await;
        assert_eq!(names(&rds), ["80"]);

        // b goes: the route stops naming it first, then its endpoints and cluster are removed.
        h.settle().await;
        h.publish(&service("a", "10.0.0.1"));
        let mut pushed = Vec::new();
        while let Some(r) = h.next().await {
            pushed.push((TypeUrl::parse(&r.type_url), names(&r), r.removed_resources.clone()));
        }
        let gone = vec![cluster("b")];
        assert_eq!(
            pushed,
            [
                (Some(TypeUrl::Route), vec!["80".to_string()], vec![]),
                (Some(TypeUrl::Endpoint), vec![], gone.clone()),
                (Some(TypeUrl::Cluster), vec![], gone),
            ],
            "route update, then endpoint and cluster removals; a is unchanged and not resent"
        );
    }

    #[tokio::test]
    async fn a_nack_is_recorded_and_the_last_good_version_kept() {
        let mut h = Harness::start(Delta::default(), &service("a", "10.0.0.1"));
        let eds = subscribe(&mut h, TypeUrl::Endpoint, &[cluster("a")]).await;
        let (first_version, first_nonce) = (eds.resources[0].version.clone(), eds.nonce.clone());
        h.settle().await;

        h.publish(&service("a", "10.0.0.9"));
        let update = h.next().await.expect("the new endpoints");
        assert_eq!(names(&update), [cluster("a")]);
        assert_ne!(update.resources[0].version, first_version);
        h.send(request(TypeUrl::Endpoint, &[], &update.nonce, Some(&format!("{} is bad", cluster("a"))))).await;
        // The rejected version is held back: nothing is resent until it changes.
        assert!(h.next().await.is_none(), "the rejected version was sent again");

        let status = h.registry.snapshot();
        let eds = &status[0].types[&TypeUrl::Endpoint];
        assert_eq!(eds.acked_nonce, first_nonce);
        assert_ne!(eds.acked_nonce, update.nonce, "a rejected response never counts as acked");
        assert_eq!(eds.last_nack.as_ref().map(|n| n.nonce.as_str()), Some(update.nonce.as_str()));
        assert!(eds.rejected.contains_key(&cluster("a")), "{:?}", eds.rejected);

        // A newer version of it is tried again.
        h.settle().await;
        h.publish(&service("a", "10.0.0.7"));
        let retry = h.next().await.expect("the newer endpoints");
        assert_eq!(names(&retry), [cluster("a")]);
    }

    #[tokio::test]
    async fn a_name_unsubscribed_is_not_pushed_and_comes_back_whole_when_subscribed_again() {
        let mesh = |a: &str, b: &str| [service("a", a), service("b", b)].join("---\n");
        let mut h = Harness::start(Delta::default(), &mesh("10.0.0.1", "10.0.0.2"));
        let eds = subscribe(&mut h, TypeUrl::Endpoint, &[cluster("a"), cluster("b")]).await;
        assert_eq!(names(&eds), [cluster("a"), cluster("b")]);
        let mut drop_b = request(TypeUrl::Endpoint, &[], "", None);
        drop_b.resource_names_unsubscribe = vec![cluster("b")];
        h.send(drop_b).await;
        assert!(h.next().await.is_none(), "an unsubscribe alone is not answered");

        // Both change: only a, still subscribed, is pushed.
        h.settle().await;
        h.publish(&mesh("10.0.0.9", "10.0.0.8"));
        let update = h.next().await.expect("a's endpoints");
        assert_eq!((names(&update), update.removed_resources.clone()), (vec![cluster("a")], vec![]));
        h.send(request(TypeUrl::Endpoint, &[], &update.nonce, None)).await;
        assert!(h.next().await.is_none());

        // b again: the proxy dropped it, so it gets it whatever version it once had.
        h.send(request(TypeUrl::Endpoint, &[cluster("b")], "", None)).await;
        let again = h.next().await.expect("b's endpoints");
        assert_eq!(names(&again), [cluster("b")]);
        h.send(request(TypeUrl::Endpoint, &[], &again.nonce, None)).await;
        h.settle().await;
        h.publish(&mesh("10.0.0.9", "10.0.0.7"));
        assert_eq!(names(&h.next().await.expect("b's new endpoints")), [cluster("b")]);
    }

    #[tokio::test]
    async fn a_secret_unsubscribed_and_subscribed_again_is_sent_again() {
        const WEB: &str = "kubernetes://web";
        const API: &str = "kubernetes://api";
        let unsubscribe = |name: &str| DeltaDiscoveryRequest {
            resource_names_unsubscribe: vec![name.to_string()],
            ..request(TypeUrl::Secret, &[], "", None)
        };
        let mut h = Harness::start_as(Delta::default(), gateway_caller(), credentials(&["web", "api"]));
        let mut first = request(TypeUrl::Secret, &[WEB.to_string()], "", None);
        first.node = Some(gateway_node());
        h.send(first).await;
        let sds = h.next().await.expect("SDS");
        assert_eq!(names(&sds), [WEB]);
        h.send(request(TypeUrl::Secret, &[], &sds.nonce, None)).await;
        assert!(h.next().await.is_none(), "an ACK is not answered");

        // Every secret unsubscribed (the gateway's TLS servers removed), then web again.
        h.send(unsubscribe(WEB)).await;
        assert!(h.next().await.is_none(), "an unsubscribe alone is not answered");
        h.send(request(TypeUrl::Secret, &[WEB.to_string()], "", None)).await;
        let again = h.next().await.expect("web subscribed again");
        assert_eq!(names(&again), [WEB]);
        h.send(request(TypeUrl::Secret, &[], &again.nonce, None)).await;

        // The same beside another secret, subscribed again with a nonce already answered.
        let sds = subscribe(&mut h, TypeUrl::Secret, &[API.to_string()]).await;
        assert_eq!(names(&sds), [API]);
        h.send(unsubscribe(API)).await;
        assert!(h.next().await.is_none(), "an unsubscribe alone is not answered");
        h.send(request(TypeUrl::Secret, &[API.to_string()], &sds.nonce, None)).await;
        let again = h.next().await.expect("api subscribed again");
        assert_eq!((names(&again), again.removed_resources.clone()), (vec![API.to_string()], vec![]));
    }

    #[tokio::test]
    async fn nothing_is_served_before_the_first_snapshot_and_a_drain_ends_the_stream() {
        let mut h = Harness::before_first_snapshot(Delta::default());
        h.send(request(TypeUrl::Cluster, &[], "", None)).await;
        assert!(h.next().await.is_none(), "served before any snapshot");
        h.publish(&service("a", "10.0.0.1"));
        let cds = h.next().await.expect("clusters once the snapshot exists");
        assert!(names(&cds).contains(&cluster("a")));
        h.drain();
        let status = h.end_status().await.expect("the stream ends with a status");
        assert_eq!(status.code(), tonic::Code::Unavailable);
    }

    #[tokio::test(start_paused = true)]
    async fn a_stream_ends_at_its_maximum_age_so_the_proxy_reconnects() {
        let admission = AdmissionSettings { max_stream_age: Some(Duration::from_secs(60)), ..Default::default() };
        let mut h = Harness::start_admitted_by(Delta::default(), &service("a", "10.0.0.1"), admission);
        h.send(request(TypeUrl::Cluster, &[], "", None)).await;
        assert!(h.next().await.is_some(), "served while young");
        tokio::time::sleep(Duration::from_secs(59)).await;
        assert!(h.end_status().await.is_none(), "still open before its age");
        // The age plus at most 10% jitter.
        tokio::time::sleep(Duration::from_secs(7)).await;
        let status = h.end_status().await.expect("ended by its age");
        assert_eq!(status.code(), tonic::Code::Unavailable, "{status:?}: Envoy reconnects at once");
        assert!(status.message().contains("maximum stream age"));
    }

    #[tokio::test]
    async fn a_changed_cluster_gets_its_endpoints_again() {
        let policy = "apiVersion: networking.istio.io/v1\nkind: DestinationRule\nmetadata: {name: a, namespace: default}\nspec: {host: a.example.com, trafficPolicy: {loadBalancer: {simple: RANDOM}}}\n";
        let mut h = Harness::start(Delta::default(), &service("a", "10.0.0.1"));
        // As a reconnecting Envoy may: endpoints first, then clusters with a version it no longer has.
        subscribe(&mut h, TypeUrl::Endpoint, &[cluster("a")]).await;
        let mut cds = request(TypeUrl::Cluster, &[], "", None);
        cds.initial_resource_versions = [(cluster("a"), "0000000000000001".to_string())].into_iter().collect();
        h.send(cds).await;
        let clusters = h.next().await.expect("CDS");
        assert!(names(&clusters).contains(&cluster("a")), "{:?}", names(&clusters));
        let endpoints = h.next().await.expect("the endpoints of the rebuilt cluster");
        assert_eq!(
            (TypeUrl::parse(&endpoints.type_url), names(&endpoints)),
            (Some(TypeUrl::Endpoint), vec![cluster("a")])
        );
        h.send(request(TypeUrl::Cluster, &[], &clusters.nonce, None)).await;
        h.send(request(TypeUrl::Endpoint, &[], &endpoints.nonce, None)).await;
        assert!(h.next().await.is_none());

        // A push changing the cluster (not its endpoints) sends both, clusters first.
        h.settle().await;
        h.publish(&[service("a", "10.0.0.1"), policy.to_string()].join("---\n"));
        let pushed: Vec<_> = [h.next().await, h.next().await]
            .into_iter()
            .flatten()
            .map(|r| (TypeUrl::parse(&r.type_url), names(&r)))
            .collect();
        assert_eq!(
            pushed,
            [(Some(TypeUrl::Cluster), vec![cluster("a")]), (Some(TypeUrl::Endpoint), vec![cluster("a")])]
        );
    }

    #[tokio::test]
    async fn the_limits_and_node_checks_of_state_of_the_world_apply() {
        let mut h = Harness::start(Delta::default(), &service("a", "10.0.0.1"));
        let mut bad_node = request(TypeUrl::Cluster, &[], "", None);
        bad_node.node = Some(Node { id: "envoy-1".into(), ..Default::default() });
        h.send(bad_node).await;
        let status = h.end_status().await.expect("refused");
        assert_eq!(status.code(), tonic::Code::InvalidArgument, "{status:?}");

        let mut h = Harness::start(Delta::default(), &service("a", "10.0.0.1"));
        let too_many: Vec<String> = (0..=limits::MAX_RESOURCE_NAMES).map(|i| format!("n{i}")).collect();
        h.send(request(TypeUrl::Endpoint, &too_many, "", None)).await;
        let status = h.end_status().await.expect("refused");
        assert_eq!(status.code(), tonic::Code::ResourceExhausted, "{status:?}");
    }
}
