//! Delta ADS (`DELTA_GRPC`, what Istio's sidecars and gateways use since 1.22) against the
//! meshpilot binary: real Envoys route and take live edits; an endpoint change reaches only the
//! changed service's clusters (over state of the world too); a rejected resource is recorded for
//! its proxy; and a reconnecting client that states the versions it holds gets only what changed.

use crate::common;

use std::collections::{BTreeMap, HashMap};

use common::backend::Backend;
use common::config_dump::dynamic_listener;
use common::envoy::{port_holder, Envoy};
use common::files::{temp_dir_with, write_atomic};
use common::ingress::Ingress;
use common::istio::*;
use common::mesh::*;
use common::meshpilot::Meshpilot;
use common::poll::{poll, CONVERGE_TIMEOUT, STARTUP_TIMEOUT};
use common::ports::free_port;
use envoy_types::pb::envoy::config::core::v3::Node;
use envoy_types::pb::envoy::service::discovery::v3::aggregated_discovery_service_client::AggregatedDiscoveryServiceClient;
use envoy_types::pb::envoy::service::discovery::v3::{DeltaDiscoveryRequest, DeltaDiscoveryResponse};
use envoy_types::pb::google::protobuf::{value::Kind, Struct, Value as PbValue};
use serde_json::Value;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tokio_stream::StreamExt;

const HOST: &str = "shop.example.com";
const CDS: &str = "type.googleapis.com/envoy.config.cluster.v3.Cluster";
const EDS: &str = "type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment";

/// Starts a proxy Envoy speaking delta ADS; waits until ready.
async fn start_delta(cp: &Meshpilot, node_id: &str, metadata: Value) -> Envoy {
    start_envoy(cp, node_id, metadata, true).await
}

/// Starts a proxy Envoy speaking delta (`delta`) or state-of-the-world ADS; waits until ready.
async fn start_envoy(cp: &Meshpilot, node_id: &str, metadata: Value, delta: bool) -> Envoy {
    let builder = Envoy::builder(node_id, cp.xds_addr()).metadata(metadata);
    let envoy = if delta { builder.delta() } else { builder }.start();
    envoy.wait_ready(STARTUP_TIMEOUT).await;
    envoy
}

/// The connection of `node_id` in `/debug/syncz`.
fn connection<'a>(syncz: &'a Value, node_id: &str) -> &'a Value {
    syncz
        .as_array()
        .and_then(|a| a.iter().find(|c| c["proxy"]["id"] == node_id))
        .unwrap_or_else(|| panic!("{node_id} not in /debug/syncz: {syncz:#}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gateway_and_sidecar_route_over_delta_and_take_live_edits() {
    let (v1, v2, ratings) = (Backend::new("reviews-v1"), Backend::new("reviews-v2"), Backend::new("ratings-v1"));
    let (gw_port, sidecar_port) = (free_port(), free_port());
    let services = documents(&[
        service_entry("reviews", sidecar_port, &[(&v1, "v1"), (&v2, "v2")]),
        service_entry("ratings", sidecar_port, &[(&ratings, "v1")]),
        destination_rule("reviews", &["v1", "v2"], None),
    ]);
    let reviews = fqdn("reviews");
    let config = temp_dir_with(&[
        ("services.yaml", &services),
        ("sidecar.yaml", &sidecar_resource(sidecar_port)),
        ("gateway.yaml", &gateway(gw_port)),
        ("gateway-vs.yaml", &route_all("shop", HOST, "gw", "ratings", None)),
        ("reviews-vs.yaml", &route_all("reviews", &reviews, "mesh", "reviews", Some("v1"))),
    ]);
    let cp = start_meshpilot(config.path()).await;
    let gateway = start_delta(&cp, GATEWAY_NODE_ID, gateway_metadata()).await;
    let sidecar = start_delta(&cp, SIDECAR_NODE_ID, sidecar_metadata()).await;

    let (at_gateway, at_sidecar) = (Ingress::new(gw_port, HOST), Ingress::new(sidecar_port, &reviews));
    at_gateway.wait_backend("/", &[], "ratings-v1").await;
    at_sidecar.wait_backend("/", &[], "reviews-v1").await;
    let syncz = wait_synced(&cp, &[GATEWAY_NODE_ID, SIDECAR_NODE_ID]).await;
    for id in [GATEWAY_NODE_ID, SIDECAR_NODE_ID] {
        assert_eq!(connection(&syncz, id)["transport"], "Delta", "{syncz:#}");
    }

    // Live edits: the gateway now routes to reviews v2, the sidecar's reviews route to v2.
    write_atomic(config.path(), "gateway-vs.yaml", &route_all("shop", HOST, "gw", "reviews", Some("v2")));
    at_gateway.wait_all_from("/", &[], "reviews-v2", 5).await;
    write_atomic(config.path(), "reviews-vs.yaml", &route_all("reviews", &reviews, "mesh", "reviews", Some("v2")));
    at_sidecar.wait_all_from("/", &[], "reviews-v2", 5).await;
    wait_synced(&cp, &[GATEWAY_NODE_ID, SIDECAR_NODE_ID]).await;
    assert_no_rejections(&gateway).await;
    assert_no_rejections(&sidecar).await;
}

/// Envoy's update counters: CDS, LDS, and EDS of each cluster.
fn update_counters(stats: &HashMap<String, u64>) -> BTreeMap<String, u64> {
    stats
        .iter()
        .filter(|(k, _)| k.ends_with(".update_attempt") || k.ends_with(".update_success"))
        .filter(|(k, _)| {
            k.starts_with("cluster.") || k.starts_with("cluster_manager.cds.") || k.starts_with("listener_manager.lds.")
        })
        .map(|(k, v)| (k.clone(), *v))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_endpoint_change_updates_only_that_services_endpoints() {
    endpoint_change_updates_only_its_clusters(true).await;
}

/// State of the world as well: the EDS push carries only the changed assignment.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_endpoint_change_updates_only_that_services_endpoints_over_state_of_the_world() {
    endpoint_change_updates_only_its_clusters(false).await;
}

/// An Envoy (delta or not) with reviews (three clusters) and ratings: a new ratings endpoint
/// moves the EDS counters of the ratings cluster only, by one update.
async fn endpoint_change_updates_only_its_clusters(delta: bool) {
    let (v1, v2) = (Backend::new("reviews-v1"), Backend::new("reviews-v2"));
    let (ratings1, ratings2) = (Backend::new("ratings-1"), Backend::new("ratings-2"));
    let port = free_port();
    let services = |ratings: &[(&Backend, &str)]| {
        documents(&[
            service_entry("reviews", port, &[(&v1, "v1"), (&v2, "v2")]),
            destination_rule("reviews", &["v1", "v2"], None),
            service_entry("ratings", port, ratings),
        ])
    };
    let config =
        temp_dir_with(&[("services.yaml", &services(&[(&ratings1, "v1")])), ("sidecar.yaml", &sidecar_resource(port))]);
    let cp = start_meshpilot(config.path()).await;
    let envoy = start_envoy(&cp, SIDECAR_NODE_ID, sidecar_metadata(), delta).await;
    let at_ratings = Ingress::new(port, &fqdn("ratings"));
    at_ratings.wait_backend("/", &[], "ratings-1").await;
    wait_synced(&cp, &[SIDECAR_NODE_ID]).await;
    let before = update_counters(&envoy.stats().await);
    let ratings_eds = format!("cluster.{};.update_success", cluster_name(port, "", "ratings"));
    for c in
        [cluster_name(port, "", "reviews"), cluster_name(port, "v1", "reviews"), cluster_name(port, "v2", "reviews")]
    {
        let stat = format!("cluster.{c};.update_success");
        assert!(before.get(&stat).is_some_and(|n| *n >= 1), "no EDS update counted for {c}: {before:#?}");
    }
    assert!(before.contains_key(&ratings_eds), "{before:#?}");

    // A second ratings endpoint: one EDS update of the ratings cluster, nothing else.
    write_atomic(config.path(), "services.yaml", &services(&[(&ratings1, "v1"), (&ratings2, "v1")]));
    at_ratings.wait_backend("/", &[], "ratings-2").await;
    wait_synced(&cp, &[SIDECAR_NODE_ID]).await;
    let after = update_counters(&envoy.stats().await);
    let moved: BTreeMap<&String, (u64, u64)> = after
        .iter()
        .filter(|(k, v)| before.get(*k) != Some(v))
        .map(|(k, v)| (k, (before.get(k).copied().unwrap_or(0), *v)))
        .collect();
    let expected_moves: Vec<&String> = moved.keys().copied().collect();
    let ratings_attempt = ratings_eds.replace("update_success", "update_attempt");
    assert_eq!(expected_moves, [&ratings_attempt, &ratings_eds], "only the ratings cluster's EDS may move: {moved:#?}");
    assert_eq!(moved[&ratings_eds], (before[&ratings_eds], before[&ratings_eds] + 1), "exactly one update");
    assert_no_rejections(&envoy).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rejected_listener_is_recorded_for_its_proxy_and_the_rest_served() {
    let ratings = Backend::new("ratings-v1");
    let (good, bad) = (free_port(), free_port());
    let gateway_yaml = format!(
        "apiVersion: networking.istio.io/v1\nkind: Gateway\nmetadata: {{name: gw, namespace: {NS}}}\nspec:\n  \
         selector: {{istio: ingressgateway}}\n  servers:\n  - port: {{number: {good}, name: http, protocol: HTTP}}\n    \
         hosts: [\"*\"]\n  - port: {{number: {bad}, name: http-2, protocol: HTTP}}\n    hosts: [\"*\"]\n"
    );
    let config = temp_dir_with(&[
        ("services.yaml", &service_entry("ratings", 80, &[(&ratings, "v1")])),
        ("gateway.yaml", &gateway_yaml),
        ("vs.yaml", &route_all("shop", HOST, "gw", "ratings", None)),
    ]);
    let cp = start_meshpilot(config.path()).await;
    // A static listener already holds the second server's address: Envoy rejects that listener.
    let blocker = port_holder(bad);
    let envoy = Envoy::builder(GATEWAY_NODE_ID, cp.xds_addr())
        .metadata(gateway_metadata())
        .static_listener(blocker)
        .delta()
        .start();
    envoy.wait_ready(STARTUP_TIMEOUT).await;
    let rejected_name = format!("0.0.0.0_{bad}");

    let reported = poll(CONVERGE_TIMEOUT, async || {
        let syncz = cp.syncz().await;
        let lds = &connection(&syncz, GATEWAY_NODE_ID)["types"]["Listener"];
        lds["rejected"].get(&rejected_name).is_some() && lds["acked_nonce"] != ""
    })
    .await;
    let syncz = cp.syncz().await;
    assert!(reported, "{rejected_name} never reported rejected: {syncz:#}");
    let conn = connection(&syncz, GATEWAY_NODE_ID);
    assert_eq!(conn["transport"], "Delta");
    let lds = &conn["types"]["Listener"];
    let message = lds["rejected"][&rejected_name]["message"].as_str().unwrap_or_default();
    assert!(message.contains(&rejected_name), "Envoy's reason is kept: {lds:#}");
    let nack = &lds["last_nack"];
    assert!(nack["message"].as_str().is_some_and(|m| m.contains(&rejected_name)), "{lds:#}");
    assert_ne!(lds["acked_nonce"], nack["nonce"], "the rejected response must not count as acked: {lds:#}");
    assert_eq!(lds["rejected"].as_object().map(|o| o.len()), Some(1), "only that listener is held back: {lds:#}");
    // Envoy does not hold the rejected listener; the good one it holds at its delta version.
    let dump = envoy.config_dump().await;
    assert!(dynamic_listener(&dump, &rejected_name).is_none(), "{rejected_name} was accepted after all");
    let version = lds["rejected"][&rejected_name]["version"].as_str().unwrap_or_default();
    assert_eq!(version.len(), 16, "the rejected content's version: {lds:#}");
    let held = dynamic_listener(&dump, &format!("0.0.0.0_{good}")).map(|l| l["active_state"]["version_info"].clone());
    assert!(held.as_ref().and_then(Value::as_str).is_some_and(|v| v.len() == 16 && v != version), "{held:?}");
    // The rest reached Envoy: the good server routes.
    Ingress::new(good, HOST).wait_backend("/", &[], "ratings-v1").await;
    let rejects = cp.metrics().await;
    let lds_rejects = rejects
        .samples
        .iter()
        .find(|s| s.name == "pilot_total_xds_rejects" && s.labels.get("type").map(String::as_str) == Some("lds"))
        .map(|s| s.value);
    assert!(lds_rejects.is_some_and(|n| n >= 1.0), "pilot_total_xds_rejects{{type=lds}}: {lds_rejects:?}");
    assert!(envoy.stat("listener_manager.lds.update_rejected").await >= Some(1));
}

/// A hand-driven delta ADS stream, as a reconnecting Envoy speaks it.
struct DeltaClient {
    tx: mpsc::Sender<DeltaDiscoveryRequest>,
    responses: tonic::Streaming<DeltaDiscoveryResponse>,
}

/// Resource name → version, as a proxy tracks them.
type Versions = HashMap<String, String>;

impl DeltaClient {
    async fn connect(cp: &Meshpilot) -> DeltaClient {
        let mut client = AggregatedDiscoveryServiceClient::connect(cp.xds_url()).await.expect("connect");
        let (tx, rx) = mpsc::channel(16);
        let responses =
            client.delta_aggregated_resources(ReceiverStream::new(rx)).await.expect("delta stream").into_inner();
        DeltaClient { tx, responses }
    }

    /// Subscribes to `type_url` (`names` empty: the wildcard), stating the versions held; returns the answer.
    async fn subscribe(&mut self, type_url: &str, names: &[String], held: &Versions) -> DeltaDiscoveryResponse {
        let node = Node {
            id: SIDECAR_NODE_ID.into(),
            metadata: Some(Struct {
                fields: [("NAMESPACE".to_string(), PbValue { kind: Some(Kind::StringValue(NS.into())) })]
                    .into_iter()
                    .collect(),
            }),
            ..Default::default()
        };
        let req = DeltaDiscoveryRequest {
            node: Some(node),
            type_url: type_url.into(),
            resource_names_subscribe: names.to_vec(),
            initial_resource_versions: held.clone(),
            ..Default::default()
        };
        self.tx.send(req).await.expect("send");
        let response = tokio::time::timeout(CONVERGE_TIMEOUT, self.responses.next())
            .await
            .expect("no answer")
            .expect("stream ended")
            .expect("error status");
        assert_eq!(response.type_url, type_url);
        let ack = DeltaDiscoveryRequest {
            type_url: type_url.into(),
            response_nonce: response.nonce.clone(),
            ..Default::default()
        };
        self.tx.send(ack).await.expect("ack");
        response
    }
}

/// What a response leaves the proxy holding, from what it held.
fn apply(held: &Versions, response: &DeltaDiscoveryResponse) -> Versions {
    let mut next = held.clone();
    for r in &response.resources {
        next.insert(r.name.clone(), r.version.clone());
    }
    for name in &response.removed_resources {
        next.remove(name);
    }
    next
}

fn sent_names(response: &DeltaDiscoveryResponse) -> Vec<String> {
    let mut names: Vec<String> = response.resources.iter().map(|r| r.name.clone()).collect();
    names.sort();
    names
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reconnect_with_initial_versions_gets_only_what_changed() {
    let config = temp_dir_with(&[
        ("a.yaml", &service_entry_in(NS, "a", &["10.0.0.1"])),
        ("b.yaml", &service_entry_in(NS, "b", &["10.0.0.2"])),
    ]);
    let cp = start_meshpilot(config.path()).await;
    let cluster = |name: &str| format!("outbound|80||{name}.{NS}.svc.cluster.local");
    let eds_names = vec![cluster("a"), cluster("b")];

    // First connection: everything arrives.
    let mut first = DeltaClient::connect(&cp).await;
    let cds = first.subscribe(CDS, &[], &Versions::new()).await;
    let clusters = apply(&Versions::new(), &cds);
    assert!(clusters.contains_key(&cluster("a")) && clusters.contains_key(&cluster("b")), "{clusters:?}");
    let eds = first.subscribe(EDS, &eds_names, &Versions::new()).await;
    let endpoints = apply(&Versions::new(), &eds);
    assert_eq!(sent_names(&eds), eds_names);
    drop(first);

    // Reconnecting unchanged: nothing is resent.
    let mut second = DeltaClient::connect(&cp).await;
    let cds = second.subscribe(CDS, &[], &clusters).await;
    assert!(cds.resources.is_empty() && cds.removed_resources.is_empty(), "unchanged clusters resent: {cds:?}");
    let eds = second.subscribe(EDS, &eds_names, &endpoints).await;
    assert!(eds.resources.is_empty() && eds.removed_resources.is_empty(), "unchanged endpoints resent: {eds:?}");
    drop(second);

    // While disconnected: a's endpoints change, b goes, c comes.
    let before = cp.admin_json("/debug/push_status").await["version"].clone();
    write_atomic(config.path(), "a.yaml", &service_entry_in(NS, "a", &["10.0.0.9"]));
    std::fs::remove_file(config.path().join("b.yaml")).expect("remove b.yaml");
    write_atomic(config.path(), "c.yaml", &service_entry_in(NS, "c", &["10.0.0.3"]));
    let changed = poll(CONVERGE_TIMEOUT, async || {
        let v = cp.admin_json("/debug/push_status").await["version"].clone();
        let cds = DeltaClient::connect(&cp).await.subscribe(CDS, &[], &clusters).await;
        (v != before && cds.resources.len() == 1 && cds.removed_resources.len() == 1).then_some(())
    })
    .await;
    assert!(changed.is_some(), "the config change never showed");

    let mut third = DeltaClient::connect(&cp).await;
    let cds = third.subscribe(CDS, &[], &clusters).await;
    assert_eq!(sent_names(&cds), [cluster("c")], "only the new cluster is sent: {cds:?}");
    assert_eq!(cds.removed_resources, [cluster("b")]);
    let eds = third.subscribe(EDS, &eds_names, &endpoints).await;
    assert_eq!(sent_names(&eds), [cluster("a")], "only the changed endpoints are sent: {eds:?}");
    assert_ne!(eds.resources[0].version, endpoints[&cluster("a")], "a new version for new content");
    assert_eq!(eds.removed_resources, [cluster("b")]);
    // The same content has the same version on every stream.
    let mut fourth = DeltaClient::connect(&cp).await;
    let again = fourth.subscribe(CDS, &[], &Versions::new()).await;
    let versions = apply(&Versions::new(), &again);
    assert_eq!(versions[&cluster("a")], clusters[&cluster("a")]);
}
