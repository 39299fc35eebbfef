//! State-of-the-world ADS: a response carries every resource of its type (CDS, LDS) or, for the
//! named types (EDS, RDS), the resources that changed; Envoy keeps the named resources a
//! response does not mention.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Instant;

use bytes::Bytes;
use envoy_types::pb::envoy::config::core::v3::{ControlPlane, Node};
use envoy_types::pb::envoy::service::discovery::v3::{DiscoveryRequest, DiscoveryResponse};
use tracing::debug;

use super::changes;
use super::isolation::{Holding, Isolation};
use super::limits;
use super::names::NameSet;
use super::protocol::DebugResource;
use super::response::{resources_field_of, Encoded};
use super::session::{Outgoing, Session};
use super::status::Transport;
use super::stream::{over_limit, Protocol, StreamEnd};
use super::TypeUrl;
use crate::telemetry::log_text::Untrusted;

/// Per-type subscription state.
#[derive(Debug, Default)]
struct Watch {
    /// Names the proxy asked for (`None`: wildcard); shared by what was sent under them.
    names: Option<NameSet>,
    /// Last response sent.
    sent: Option<Sent>,
    /// What the proxy holds of a named type once it applied the responses sent; `None` when
    /// unknown (the next response then carries everything).
    base: Option<Holding>,
    /// Resources this proxy rejected, kept out of its responses.
    isolation: Isolation,
}

#[derive(Debug)]
struct Sent {
    nonce: String,
    hash: u64,
    names: Option<NameSet>,
    /// What the proxy holds once it accepts the response.
    holding: Holding,
}

/// A state-of-the-world response, encoded.
pub type SotwResponse = Encoded<DiscoveryResponse>;

/// The state-of-the-world protocol of one stream.
#[derive(Debug, Default)]
pub struct StateOfTheWorld {
    watches: BTreeMap<TypeUrl, Watch>,
    /// Clusters the current push changed: Envoy rebuilds them, and they need their endpoints again.
    clusters_changed: BTreeSet<String>,
}

impl Protocol for StateOfTheWorld {
    type Request = DiscoveryRequest;
    type Response = SotwResponse;
    const TRANSPORT: Transport = Transport::StateOfTheWorld;

    fn node(request: &DiscoveryRequest) -> Option<&Node> {
        request.node.as_ref()
    }

    fn type_url(request: &DiscoveryRequest) -> &str {
        &request.type_url
    }

    fn debug_names(request: &DiscoveryRequest) -> &[String] {
        &request.resource_names
    }

    fn debug_response(type_url: &str, nonce: &str, control_plane: &str, resources: Vec<DebugResource>) -> SotwResponse {
        Encoded::whole(&DiscoveryResponse {
            type_url: type_url.to_string(),
            nonce: nonce.to_string(),
            resources: resources.into_iter().map(|(_, any)| any).collect(),
            control_plane: Some(ControlPlane { identifier: control_plane.to_string() }),
            ..Default::default()
        })
    }

    async fn on_request(
        &mut self,
        session: &mut Session<SotwResponse>,
        req: DiscoveryRequest,
    ) -> Result<(), StreamEnd> {
        limits::check_names(req.resource_names.len()).map_err(over_limit)?;
        let Some(type_url) = TypeUrl::parse(&req.type_url) else {
            debug!(proxy = %Untrusted(&session.proxy.id), type_url = %Untrusted(&req.type_url), "request for an unserved type ignored");
            return Ok(());
        };
        let watch = self.watches.entry(type_url).or_default();
        let requested_names =
            type_url.is_named().then(|| NameSet::same_or_new(watch.names.as_ref(), &req.resource_names));
        if req.response_nonce.is_empty() {
            // First request for this type on this stream (or Envoy re-requesting after a restart of the watch).
            watch.names = requested_names;
            return self.respond(session, type_url, true).await.map(|_| ());
        }
        let Some(sent) = &watch.sent else {
            // A nonce from a previous stream (reconnect): treat as a fresh subscription.
            watch.names = requested_names;
            return self.respond(session, type_url, true).await.map(|_| ());
        };
        if sent.nonce != req.response_nonce {
            if req.error_detail.is_some() {
                // Which of the responses since applied is unknown: the next one carries everything.
                watch.base = None;
            }
            session.expired_nonce(type_url, &req.response_nonce);
            return Ok(());
        }
        let due = if let Some(err) = &req.error_detail {
            // The proxy keeps what it last accepted.
            watch.base = watch.isolation.acked().cloned();
            session.nack(type_url, &req.response_nonce, &err.message, &mut watch.isolation, &sent.holding)
        } else {
            // Compared with the names of the proxy's last request, not of the last response: a
            // change of names may have gone unanswered (an SDS response left empty is not sent),
            // and a return to the names last sent is then a new subscription, not an ACK.
            let names_changed = type_url.is_named() && watch.names != requested_names;
            let due = session.ack(
                type_url,
                req.version_info.clone(),
                &req.response_nonce,
                &mut watch.isolation,
                &sent.holding,
            );
            if names_changed {
                watch.names = requested_names;
                return self.respond(session, type_url, true).await.map(|_| ());
            }
            due
        };
        watch.names = requested_names;
        if due {
            self.respond(session, type_url, false).await?;
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
        self.watches.values().all(|w| {
            w.isolation.is_clean()
                && w.sent.as_ref().is_some_and(|s| s.names == w.names && matches!(s.holding, Holding::Whole { .. }))
        })
    }

    async fn push(&mut self, session: &mut Session<SotwResponse>, type_url: TypeUrl) -> Result<bool, StreamEnd> {
        self.respond(session, type_url, false).await
    }
}

impl StateOfTheWorld {
    /// Sends the current resources of `type_url` unless the proxy already has exactly them
    /// (`force` answers a request even when nothing changed, and with every resource). Returns
    /// whether it sent.
    async fn respond(
        &mut self,
        session: &mut Session<SotwResponse>,
        type_url: TypeUrl,
        force: bool,
    ) -> Result<bool, StreamEnd> {
        let started = Instant::now();
        let Some((snapshot, generated)) = session.generated(type_url).await else {
            return Ok(false);
        };
        let Some(watch) = self.watches.get_mut(&type_url) else {
            return Ok(false);
        };
        // The very generation last sent, under the same names: nothing changed, and no need to
        // compose and hash it to see that (most proxies, on most pushes).
        let unchanged = |s: &Sent| s.names == watch.names && s.holding.is_whole_of(&generated);
        if !force && watch.isolation.is_clean() && watch.sent.as_ref().is_some_and(unchanged) {
            return Ok(false);
        }
        let holding = watch.isolation.compose(&generated, watch.names.as_ref());
        let hash = holding.hash();
        if !force && watch.sent.as_ref().is_some_and(|s| s.hash == hash && s.names == watch.names) {
            return Ok(false);
        }
        if type_url == TypeUrl::Cluster {
            let before = watch.sent.as_ref().map(|s| &s.holding);
            let changed = changes::updated(&holding, |name| before.and_then(|b| b.get(name)).map(|p| p.hash()));
            self.clusters_changed = changed.iter().map(|p| p.name().to_string()).collect();
        }
        let rebuilt = &self.clusters_changed;
        let (resources, field) = match (&watch.base, force || !type_url.is_named()) {
            (Some(base), false) => {
                let changed = changes::updated(&holding, |name| {
                    let held = base.get(name).map(|p| p.hash());
                    held.filter(|_| type_url != TypeUrl::Endpoint || !rebuilt.contains(name))
                });
                if changed.is_empty() {
                    // Only removals: Envoy keeps named resources a response leaves out anyway.
                    return Ok(false);
                }
                if changed.len() == holding.len() {
                    // All of it changed (a route edit of a view with one route configuration): the
                    // generation's own buffer, shared by every stream of the view, not a copy each.
                    holding.encoded_with_field()
                } else {
                    let resources: Vec<Bytes> = changed.iter().map(|p| p.encoded().clone()).collect();
                    let field = resources_field_of(&resources);
                    (resources, field)
                }
            }
            _ => holding.encoded_with_field(),
        };
        if type_url == TypeUrl::Secret && resources.is_empty() {
            // Envoy refuses an SDS response without the secret it asked for; a secret this proxy
            // may not have (another namespace's, or a sidecar's) is better left unanswered: the
            // listener or cluster naming it stays closed.
            return Ok(false);
        }
        let nonce = session.next_nonce(&snapshot);
        let version = snapshot.version.to_string();
        let response = Encoded::sotw(&version, type_url.as_str(), &nonce, field);
        let bytes = resources.iter().map(|r| r.len()).sum();
        let count = resources.len();
        watch.base = type_url.is_named().then(|| holding.clone());
        watch.sent = Some(Sent { nonce: nonce.clone(), hash, names: watch.names.clone(), holding });
        let out = Outgoing { type_url, version, nonce, count, bytes, started, push: !force };
        session.send(response, out).await?;
        Ok(true)
    }
}

#[cfg(test)]
mod tests {
    use envoy_types::pb::envoy::config::endpoint::v3::ClusterLoadAssignment;
    use prost::Message;

    use super::*;
    use crate::xds::stream_testing::{
        cluster, credentials, gateway_caller, gateway_node, node, rejection, service, Harness,
    };

    fn request(type_url: TypeUrl, names: &[String], answering: Option<&DiscoveryResponse>) -> DiscoveryRequest {
        DiscoveryRequest {
            node: Some(node()),
            type_url: type_url.as_str().into(),
            resource_names: names.to_vec(),
            version_info: answering.map(|r| r.version_info.clone()).unwrap_or_default(),
            response_nonce: answering.map(|r| r.nonce.clone()).unwrap_or_default(),
            ..Default::default()
        }
    }

    fn load_assignments(r: &DiscoveryResponse) -> Vec<String> {
        r.resources.iter().map(|a| ClusterLoadAssignment::decode(a.value.as_slice()).unwrap().cluster_name).collect()
    }

    fn cluster_names(r: &DiscoveryResponse) -> Vec<String> {
        use envoy_types::pb::envoy::config::cluster::v3::Cluster;
        r.resources.iter().map(|a| Cluster::decode(a.value.as_slice()).unwrap().name).collect()
    }

    fn owned(names: &[&str]) -> Vec<String> {
        names.iter().map(|n| n.to_string()).collect()
    }

    fn secret_names(r: &DiscoveryResponse) -> Vec<String> {
        use envoy_types::pb::envoy::extensions::transport_sockets::tls::v3::Secret;
        r.resources.iter().map(|a| Secret::decode(a.value.as_slice()).unwrap().name).collect()
    }

    #[tokio::test]
    async fn a_secret_dropped_and_asked_for_again_is_sent_again() {
        const WEB: &str = "kubernetes://web";
        const API: &str = "kubernetes://api";
        let sds = |names: &[&str], answering| request(TypeUrl::Secret, &owned(names), answering);
        let mut h = Harness::start_as(StateOfTheWorld::default(), gateway_caller(), credentials(&["web", "api"]));
        let mut first = sds(&[WEB, API], None);
        first.node = Some(gateway_node());
        h.send(first).await;
        let both = h.next().await.expect("SDS");
        assert_eq!(secret_names(&both), [API, WEB]);
        h.send(sds(&[WEB, API], Some(&both))).await;
        assert!(h.next().await.is_none(), "an ACK is not answered");

        // api dropped, then asked for again: each new set of names is answered.
        h.send(sds(&[WEB], Some(&both))).await;
        let web_only = h.next().await.expect("the secrets still asked for");
        assert_eq!(secret_names(&web_only), [WEB]);
        h.send(sds(&[WEB, API], Some(&web_only))).await;
        let again = h.next().await.expect("api asked for again");
        assert_eq!(secret_names(&again), [API, WEB]);

        // Every secret dropped (the gateway's TLS servers removed): an empty SDS response is never
        // sent. Asked for again under the nonce of the response that carried them, they are sent
        // again: the proxy dropped them and waits for them.
        h.send(sds(&[], Some(&again))).await;
        assert!(h.next().await.is_none(), "an empty SDS response was sent");
        h.send(sds(&[WEB, API], Some(&again))).await;
        let both = h.next().await.expect("the secrets asked for again after every one was dropped");
        assert_eq!(secret_names(&both), [API, WEB]);

        // The same through a secret that does not exist (yet): nothing to answer it with.
        h.send(sds(&[WEB], Some(&both))).await;
        let back = h.next().await.expect("web alone");
        h.send(sds(&["kubernetes://missing"], Some(&back))).await;
        assert!(h.next().await.is_none(), "an SDS response without the secret asked for was sent");
        h.send(sds(&[WEB], Some(&back))).await;
        let back = h.next().await.expect("web asked for again after a missing secret");
        assert_eq!(secret_names(&back), [WEB]);
    }

    #[tokio::test]
    async fn an_endpoint_dropped_in_a_nack_and_asked_for_again_is_sent_again() {
        let mesh = |a: &str| [service("a", a), service("b", "10.0.0.2")].join("---\n");
        let mut h = Harness::start(StateOfTheWorld::default(), &mesh("10.0.0.1"));
        let both = [cluster("a"), cluster("b")];
        h.send(request(TypeUrl::Endpoint, &both, None)).await;
        let eds = h.next().await.expect("EDS");
        h.send(request(TypeUrl::Endpoint, &both, Some(&eds))).await;
        h.settle().await;
        h.publish(&mesh("10.0.0.9"));
        let update = h.next().await.expect("a's new endpoints");
        assert_eq!(load_assignments(&update), [cluster("a")]);

        // The proxy rejects it and, in the same request, drops b (nothing needs sending: it
        // keeps a's last good assignment). Then it asks for b again, under the same nonce.
        let mut nack = request(TypeUrl::Endpoint, &[cluster("a")], Some(&update));
        nack.version_info = eds.version_info.clone();
        nack.error_detail = Some(rejection(&format!("{} is bad", cluster("a"))));
        h.send(nack).await;
        assert!(h.next().await.is_none(), "only a removal: nothing to send");
        h.send(request(TypeUrl::Endpoint, &both, Some(&update))).await;
        let again = h.next().await.expect("b asked for again");
        assert!(load_assignments(&again).contains(&cluster("b")), "{:?}", load_assignments(&again));
    }

    #[tokio::test]
    async fn a_secret_the_proxy_may_not_have_is_left_unanswered() {
        // The node is a sidecar: no secret is ever its to have.
        let mut h = Harness::start(StateOfTheWorld::default(), &service("a", "10.0.0.1"));
        h.send(request(TypeUrl::Secret, &["kubernetes://web".to_string()], None)).await;
        assert!(h.next().await.is_none(), "an empty SDS response would be refused by Envoy");
        // The stream still serves the other types.
        h.send(request(TypeUrl::Cluster, &[], None)).await;
        assert!(!cluster_names(&h.next().await.expect("CDS")).is_empty());
    }

    #[tokio::test]
    async fn endpoint_pushes_carry_only_changed_assignments_and_clusters_stay_complete() {
        let mesh = |a: &str, b: &str, more: &str| [service("a", a), service("b", b), more.to_string()].join("---\n");
        let mut h = Harness::start(StateOfTheWorld::default(), &mesh("10.0.0.1", "10.0.0.2", ""));
        let eds_names = [cluster("a"), cluster("b")];
        h.send(request(TypeUrl::Cluster, &[], None)).await;
        let cds = h.next().await.expect("CDS");
        h.send(request(TypeUrl::Cluster, &[], Some(&cds))).await;
        h.send(request(TypeUrl::Endpoint, &eds_names, None)).await;
        let eds = h.next().await.expect("EDS");
        assert_eq!(load_assignments(&eds), eds_names, "a request is answered in full");
        h.send(request(TypeUrl::Endpoint, &eds_names, Some(&eds))).await;

        // a's endpoints change: only a's assignment is pushed, CDS not at all.
        h.settle().await;
        h.publish(&mesh("10.0.0.9", "10.0.0.2", ""));
        let update = h.next().await.expect("EDS push");
        assert_eq!(
            (update.type_url.as_str(), load_assignments(&update)),
            (TypeUrl::Endpoint.as_str(), vec![cluster("a")])
        );
        assert!(h.next().await.is_none());

        // A NACK of it: a is held back at the version the proxy holds; nothing is resent.
        let mut nack = request(TypeUrl::Endpoint, &eds_names, Some(&update));
        nack.version_info = eds.version_info.clone();
        nack.error_detail = Some(rejection(&format!("{} is bad", cluster("a"))));
        h.send(nack).await;
        let again = h.next().await;
        assert!(
            again.is_none(),
            "the rejected assignment was sent again: {:?}",
            again.map(|r| (r.type_url.clone(), load_assignments(&r), r.nonce))
        );
        let status = h.registry.snapshot();
        let t = &status[0].types[&TypeUrl::Endpoint];
        assert_eq!((t.acked_nonce.as_str(), t.acked_version.as_str()), (eds.nonce.as_str(), eds.version_info.as_str()));
        assert!(t.rejected.contains_key(&cluster("a")));
        assert_eq!(t.last_nack.as_ref().map(|n| n.nonce.as_str()), Some(update.nonce.as_str()));

        // b changes: b alone is pushed (a still held back), and accepted.
        h.settle().await;
        h.publish(&mesh("10.0.0.9", "10.0.0.8", ""));
        let update = h.next().await.expect("EDS push");
        assert_eq!(load_assignments(&update), [cluster("b")]);
        h.send(request(TypeUrl::Endpoint, &eds_names, Some(&update))).await;

        // A new service: CDS is pushed complete.
        h.settle().await;
        h.publish(&mesh("10.0.0.9", "10.0.0.8", &service("c", "10.0.0.3")));
        let cds = h.next().await.expect("CDS push");
        let names = cluster_names(&cds);
        assert!(["a", "b", "c"].iter().all(|s| names.contains(&cluster(s))), "{names:?}");
    }
}
