//! meshpilot on a real Kubernetes API server (kube-apiserver on etcd, see `common::kube`):
//! Services, EndpointSlices, Pods, Nodes, Namespaces and Istio CRDs are served to a real Envoy
//! gateway as istiod would serve them, watch events change what Envoy does without a restart, an
//! API server restart loses nothing, and invalid or unreadable objects are reported while the
//! rest is served.

use crate::common;

use std::net::SocketAddr;
use std::time::Duration;

use common::backend::Backend;
use common::config_dump::*;
use common::envoy::Envoy;
use common::ingress::Ingress;
use common::istio::{destination_rule, gateway, NS};
use common::kube::{apply, delete, KubeApi, PlainHttpFront, MESHPILOT_TOKEN};
use common::mesh::{assert_no_rejections, start_gateway};
use common::meshpilot::{wait_leader, Meshpilot};
use common::netns::NetNs;
use common::poll::{poll, CONVERGE_TIMEOUT, STARTUP_TIMEOUT};
use common::ports::free_port;
use kube::Client;
use serde_json::Value;

/// The host the gateway's VirtualService serves.
const HOST: &str = "shop.example.com";

/// Namespaces, a node with locality labels, and the `reviews` Service (port `http-web` 9080 to
/// container port `web`).
fn cluster_basics() -> String {
    format!(
        r#"
apiVersion: v1
kind: Namespace
metadata: {{name: {NS}}}
---
apiVersion: v1
kind: Namespace
metadata: {{name: istio-system}}
---
apiVersion: v1
kind: Node
metadata:
  name: node-a
  labels: {{topology.kubernetes.io/region: eu-west, topology.kubernetes.io/zone: eu-west-1a}}
---
apiVersion: v1
kind: Service
metadata: {{name: reviews, namespace: {NS}}}
spec:
  selector: {{app: reviews}}
  ports: [{{name: http-web, port: 9080, targetPort: web}}]
"#
    )
}

/// A running Pod `name` (labels `app: reviews`, `version`) at the backend's address, with its
/// container port `web` at the backend's port (status written as the kubelet would).
fn pod(name: &str, version: &str, backend: &Backend) -> String {
    format!(
        r#"
apiVersion: v1
kind: Pod
metadata:
  name: {name}
  namespace: {NS}
  labels: {{app: reviews, version: {version}}}
spec:
  nodeName: node-a
  serviceAccountName: reviews
  containers: [{{name: app, image: reviews, ports: [{{name: web, containerPort: {port}}}]}}]
status:
  phase: Running
  podIP: "{ip}"
  podIPs: [{{ip: "{ip}"}}]
  conditions: [{{type: Ready, status: "True"}}]
"#,
        port = backend.port(),
        ip = backend.ip()
    )
}

/// The `reviews` EndpointSlice holding `pods` (name, backend), as the EndpointSlice controller
/// writes it.
fn slice(pods: &[(&str, &Backend)]) -> String {
    let port = pods.first().map(|(_, b)| b.port()).unwrap_or(9080);
    let endpoints: Vec<String> = pods
        .iter()
        .map(|(name, b)| {
            format!(
                "- addresses: [\"{}\"]\n  conditions: {{ready: true, serving: true, terminating: false}}\n  nodeName: node-a\n  targetRef: {{kind: Pod, name: {name}, namespace: {NS}}}\n",
                b.ip()
            )
        })
        .collect();
    format!(
        "apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata:\n  name: reviews-abcde\n  namespace: {NS}\n  labels: {{kubernetes.io/service-name: reviews}}\naddressType: IPv4\nports: [{{name: http-web, port: {port}, protocol: TCP}}]\nendpoints:\n{}",
        if endpoints.is_empty() { "[]\n".to_string() } else { endpoints.concat() }
    )
}

/// The gateway's VirtualService: everything to `reviews` (short name, qualified in `shop`) subset
/// `subset`.
fn route_to(subset: &str) -> String {
    format!(
        "apiVersion: networking.istio.io/v1\nkind: VirtualService\nmetadata: {{name: shop, namespace: {NS}}}\nspec:\n  hosts: [{HOST}]\n  gateways: [{NS}/gw]\n  http:\n  - route:\n    - destination: {{host: reviews, subset: {subset}, port: {{number: 9080}}}}\n"
    )
}

/// Two reviews backends at two pod addresses with one port (a Service's pods share their
/// container port). The API server refuses loopback addresses in EndpointSlices, so the pods
/// live in a network namespace the test makes, routed from the host.
fn backends() -> Option<(NetNs, Backend, Backend)> {
    let ns = NetNs::create(2)?;
    let port = free_port();
    let start =
        |name: &str, i: u8| Backend::builder(name).listener(ns.listen(SocketAddr::from((ns.addr(i), port)))).start();
    let (v1, v2) = (start("reviews-v1", 0), start("reviews-v2", 1));
    Some((ns, v1, v2))
}

/// The shop mesh: namespaces, node, the reviews Service with its two pods and slice, the gateway
/// on `port`, subsets v1/v2 and a route to v1.
async fn apply_shop(client: &Client, v1: &Backend, v2: &Backend, port: u16) {
    apply(client, &cluster_basics()).await;
    apply(client, &pod("reviews-v1", "v1", v1)).await;
    apply(client, &pod("reviews-v2", "v2", v2)).await;
    apply(client, &slice(&[("reviews-v1", v1), ("reviews-v2", v2)])).await;
    apply(client, &gateway(port)).await;
    apply(client, &destination_rule("reviews", &["v1", "v2"], None)).await;
    apply(client, &route_to("v1")).await;
}

/// The API server with the shop mesh applied, meshpilot on it, and the gateway Envoy.
struct Live {
    api: KubeApi,
    client: Client,
    cp: Meshpilot,
    envoy: Envoy,
    ingress: Ingress,
    port: u16,
    v1: Backend,
    v2: Backend,
    _pods: NetNs,
}

impl Live {
    async fn start() -> Option<Live> {
        let (pods, v1, v2) = backends()?;
        let api = KubeApi::start().await?;
        let client = api.admin().await;
        let port = free_port();
        apply_shop(&client, &v1, &v2, port).await;
        let dir = api.dir().to_path_buf();
        let kubeconfig = api.write_kubeconfig(&dir, "meshpilot.kubeconfig", &api.url(), common::kube::ADMIN_TOKEN);
        let cp = Meshpilot::standalone_on_kubernetes(kubeconfig).debounce_after("50ms").start();
        cp.wait_ready(STARTUP_TIMEOUT).await;
        let envoy = start_gateway(&cp).await;
        Some(Live { api, client, cp, envoy, ingress: Ingress::new(port, HOST), port, v1, v2, _pods: pods })
    }

    async fn configz(&self) -> Value {
        self.cp.admin_json("/debug/configz").await
    }

    /// CDS, LDS and RDS versions Envoy accepted.
    async fn versions(&self) -> (String, String, String) {
        xds_versions(&self.envoy.config_dump().await, &format!("http.{}", self.port))
    }
}

#[tokio::test]
async fn kubernetes_objects_route_and_watch_events_change_envoy() {
    let Some(live) = Live::start().await else { return };
    // Service + slice + pods + DestinationRule subsets by pod label + VirtualService/Gateway CRDs.
    live.ingress.wait_all_from("/", &[], "reviews-v1", 10).await;

    // The EDS of the reviews subset holds the pod's address and port and the node's locality.
    let dump = live.envoy.config_dump().await;
    let cluster = "outbound|9080|v1|reviews.shop.svc.cluster.local";
    let endpoints = endpoint_addresses(&dump, cluster);
    assert_eq!(endpoints, vec![format!("{}:{}", live.v1.ip(), live.v1.port())], "{cluster}");
    let locality = endpoint_localities(&dump, cluster);
    assert_eq!(locality, vec!["eu-west/eu-west-1a/".to_string()], "locality of {cluster}");

    // A VirtualService edit moves the traffic.
    apply(&live.client, &route_to("v2")).await;
    live.ingress.wait_all_from("/", &[], "reviews-v2", 10).await;

    // A pod removed from the slice, then added back: EDS-only pushes (CDS, LDS, RDS untouched).
    let before = live.versions().await;
    let clusters_before = dynamic_resources(&live.envoy.config_dump().await)["clusters"].clone();
    apply(&live.client, &slice(&[("reviews-v1", &live.v1)])).await;
    live.ingress.wait_answer("/", &[], "503 from the v2 subset without endpoints", |r| r.status == 503).await;
    apply(&live.client, &slice(&[("reviews-v1", &live.v1), ("reviews-v2", &live.v2)])).await;
    live.ingress.wait_all_from("/", &[], "reviews-v2", 10).await;
    let clusters_after = dynamic_resources(&live.envoy.config_dump().await)["clusters"].clone();
    let mut diff = Vec::new();
    json_diff(&clusters_before, &clusters_after, "clusters", &mut diff, 10);
    assert_eq!(live.versions().await, before, "endpoint changes must not push clusters, listeners or routes: {diff:?}");

    // Deleting the Service removes its clusters: the route has nowhere to go.
    delete(&live.client, "v1", "Service", Some(NS), "reviews").await;
    let removed = poll(CONVERGE_TIMEOUT, async || {
        let names = dynamic_cluster_names(&live.envoy.config_dump().await);
        !names.iter().any(|n| n.contains("reviews.shop.svc.cluster.local"))
    })
    .await;
    assert!(removed, "the deleted Service's clusters are still in Envoy");
    assert_no_rejections(&live.envoy).await;
    assert!(live.cp.is_running(), "meshpilot exited");
}

#[tokio::test]
async fn api_server_restart_loses_nothing_and_traffic_keeps_flowing() {
    let Some(mut live) = Live::start().await else { return };
    live.ingress.wait_all_from("/", &[], "reviews-v1", 5).await;

    live.api.kill();
    // While the API server is down the last snapshot keeps being served.
    for _ in 0..10 {
        assert_eq!(live.ingress.backend("/", &[]).await, "reviews-v1");
    }
    assert_eq!(live.cp.admin_get("/ready").await.0, 200, "readiness must not drop while the API server is away");
    live.api.restart().await;

    // The watches resume (or relist after a 410): a change made after the restart is served, and
    // nothing listed before was lost.
    apply(&live.client, &route_to("v2")).await;
    live.ingress.wait_all_from("/", &[], "reviews-v2", 10).await;
    let dump = live.envoy.config_dump().await;
    assert_eq!(endpoint_addresses(&dump, "outbound|9080|v1|reviews.shop.svc.cluster.local").len(), 1);
    assert_no_rejections(&live.envoy).await;
    // Every watch recovers (those backing off while the server was away do within their backoff).
    let mut errors = Value::Null;
    let recovered = poll(Duration::from_secs(90), async || {
        errors = live.configz().await["errors"].clone();
        errors.as_array().is_some_and(|e| e.is_empty())
    })
    .await;
    assert!(recovered, "errors after recovery: {errors}");
    // The restart made watches resume from resource versions the new server no longer has: they
    // got 410 Gone and relisted (more complete lists than the 15 kinds' initial ones).
    let lists = live.cp.metrics().await.sum("meshpilot_kubernetes_lists_total", &[]);
    assert!(lists > 15.0, "no watch relisted after the API server restart ({lists} lists)");
}

#[tokio::test]
async fn invalid_crd_object_is_skipped_and_reported_while_the_rest_is_served() {
    let Some(live) = Live::start().await else { return };
    live.ingress.wait_all_from("/", &[], "reviews-v1", 5).await;
    let (_, _, rds_before) = live.versions().await;

    // Valid for the API server (the CRD schema preserves unknown fields) but not for Istio: a
    // negative weight. The last valid version stays in force.
    let invalid = route_to("v2").replace("port: {number: 9080}}", "port: {number: 9080}}\n      weight: -5");
    apply(&live.client, &invalid).await;
    let error = poll(CONVERGE_TIMEOUT, async || {
        let errors = live.configz().await["errors"].as_array().cloned().unwrap_or_default();
        errors.into_iter().find(|e| e.to_string().contains("VirtualService") && e.to_string().contains("weight"))
    })
    .await
    .unwrap_or_else(|| panic!("the invalid VirtualService is not reported: {}", ""));
    let text = error.to_string();
    assert!(text.contains("kubernetes") && text.contains(NS) && text.contains("\"shop\""), "{text}");
    assert!(text.contains("spec.http[0].route[0].weight"), "field path missing: {text}");
    for _ in 0..10 {
        assert_eq!(live.ingress.backend("/", &[]).await, "reviews-v1", "the last valid route must stay");
    }
    assert_eq!(live.versions().await.2, rds_before, "nothing was pushed for the invalid object");

    // A valid edit after it clears the error and is served.
    apply(&live.client, &route_to("v2")).await;
    live.ingress.wait_all_from("/", &[], "reviews-v2", 10).await;
    let errors = live.configz().await["errors"].clone();
    assert!(!errors.to_string().contains("weight"), "the error stays listed after a valid edit: {errors}");
}

#[tokio::test]
async fn an_authorization_policy_from_the_api_server_is_enforced_and_its_deletion_lifts_it() {
    let Some(live) = Live::start().await else { return };
    live.ingress.wait_all_from("/admin", &[], "reviews-v1", 3).await;
    let deny = "apiVersion: security.istio.io/v1\nkind: AuthorizationPolicy\nmetadata: {name: deny-admin, namespace: istio-system}\n\
                spec:\n  selector: {matchLabels: {istio: ingressgateway}}\n  action: DENY\n  rules: [{to: [{operation: {paths: [/admin]}}]}]\n";
    apply(&live.client, deny).await;
    live.ingress.wait_answer("/admin", &[], "a 403 from the gateway's RBAC", |r| r.status == 403).await;
    assert_eq!(live.ingress.backend("/other", &[]).await, "reviews-v1", "only /admin is denied");
    let served = live.configz().await["configs"].to_string();
    assert!(served.contains("AuthorizationPolicy") && served.contains("deny-admin"), "{served}");
    delete(&live.client, "security.istio.io/v1", "AuthorizationPolicy", Some("istio-system"), "deny-admin").await;
    live.ingress.wait_all_from("/admin", &[], "reviews-v1", 3).await;
    assert_no_rejections(&live.envoy).await;
}

#[tokio::test]
async fn a_kind_the_service_account_may_not_list_is_reported_and_the_rest_served() {
    let Some((_pods, v1, _)) = backends() else { return };
    let Some(api) = KubeApi::start().await else { return };
    let client = api.admin().await;
    apply(&client, &cluster_basics()).await;
    apply(&client, &pod("reviews-v1", "v1", &v1)).await;
    apply(&client, &slice(&[("reviews-v1", &v1)])).await;
    // User `meshpilot` may read everything meshpilot watches except WorkloadGroups.
    apply(
        &client,
        r#"
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: meshpilot-partial}
rules:
- apiGroups: [""]
  resources: [services, pods, nodes, namespaces, configmaps, secrets]
  verbs: [get, list, watch]
- apiGroups: [discovery.k8s.io]
  resources: [endpointslices]
  verbs: [get, list, watch]
- apiGroups: [networking.istio.io]
  resources: [virtualservices, destinationrules, gateways, serviceentries, workloadentries, sidecars]
  verbs: [get, list, watch]
- apiGroups: [security.istio.io]
  resources: [authorizationpolicies, peerauthentications, requestauthentications]
  verbs: [get, list, watch]
# API discovery, which clusters grant every authenticated user (system:discovery).
- nonResourceURLs: [/api, /api/*, /apis, /apis/*]
  verbs: [get]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: meshpilot-partial}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: meshpilot-partial}
subjects: [{apiGroup: rbac.authorization.k8s.io, kind: User, name: meshpilot}]
"#,
    )
    .await;
    let dir = api.dir().to_path_buf();
    let kubeconfig = api.write_kubeconfig(&dir, "reader.kubeconfig", &api.url(), MESHPILOT_TOKEN);
    let cp = Meshpilot::standalone_on_kubernetes(kubeconfig).start();
    cp.wait_ready(STARTUP_TIMEOUT).await;
    let configz = cp.admin_json("/debug/configz").await;
    let errors = configz["errors"].to_string();
    assert!(errors.contains("WorkloadGroup") && errors.contains("forbidden"), "errors: {errors}");
    assert!(!errors.contains("VirtualService"), "only WorkloadGroups are forbidden: {errors}");
    let registry = cp.admin_json("/debug/registryz").await.to_string();
    assert!(registry.contains("reviews.shop.svc.cluster.local"), "the other kinds are served: {registry}");
    let metrics = cp.metrics().await;
    assert_eq!(
        metrics.value("meshpilot_config_source_errors", &[("source", "kubernetes"), ("reason", "forbidden")]),
        1.0
    );
}

#[tokio::test]
async fn readiness_waits_for_the_initial_list() {
    let Some(mut api) = KubeApi::start().await else { return };
    let client = api.admin().await;
    apply(&client, &cluster_basics()).await;
    api.kill();
    let dir = api.dir().to_path_buf();
    let kubeconfig = api.write_kubeconfig(&dir, "meshpilot.kubeconfig", &api.url(), common::kube::ADMIN_TOKEN);
    let cp = Meshpilot::standalone_on_kubernetes(kubeconfig).start();
    tokio::time::sleep(Duration::from_secs(3)).await;
    let (status, body) = cp.admin_get("/ready").await;
    assert_eq!(status, 503, "ready before any list: {body}");
    api.restart().await;
    cp.wait_ready(STARTUP_TIMEOUT).await;
    let registry = cp.admin_json("/debug/registryz").await.to_string();
    assert!(registry.contains("reviews.shop.svc.cluster.local"), "{registry}");
}

/// The ingress gateway's Pod in `istio-system` with `labels` (a flow-style YAML map).
fn gateway_pod(labels: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: ingress-1\n  namespace: istio-system\n  labels: {labels}\nspec:\n  nodeName: node-a\n  serviceAccountName: istio-ingressgateway\n  containers: [{{name: istio-proxy, image: proxyv2}}]\nstatus:\n  podIP: \"10.1.0.9\"\n  podIPs: [{{ip: \"10.1.0.9\"}}]\n  conditions: [{{type: Ready, status: \"True\"}}]\n"
    )
}

#[tokio::test]
async fn a_proxy_naming_its_pod_gets_the_pods_labels_not_only_its_metadata() {
    let Some((_pods, v1, v2)) = backends() else { return };
    let Some(api) = KubeApi::start().await else { return };
    let client = api.admin().await;
    let port = free_port();
    apply_shop(&client, &v1, &v2, port).await;
    // The Gateway selects `istio: ingressgateway`; the proxy's metadata carries no labels, its
    // Pod does.
    apply(&client, &gateway_pod("{istio: ingressgateway}")).await;
    let dir = api.dir().to_path_buf();
    let kubeconfig = api.write_kubeconfig(&dir, "meshpilot.kubeconfig", &api.url(), common::kube::ADMIN_TOKEN);
    let cp = Meshpilot::standalone_on_kubernetes(kubeconfig).debounce_after("50ms").start();
    cp.wait_ready(STARTUP_TIMEOUT).await;
    let node_id = "router~10.1.0.9~ingress-1.istio-system~istio-system.svc.cluster.local";
    let envoy =
        Envoy::builder(node_id, cp.xds_addr()).metadata(serde_json::json!({"NAMESPACE": "istio-system"})).start();
    envoy.wait_ready(STARTUP_TIMEOUT).await;
    let ingress = Ingress::new(port, HOST);
    ingress.wait_all_from("/", &[], "reviews-v1", 5).await;

    // Relabelled Pod: the Gateway no longer selects this proxy, and its listener goes (Envoy keeps
    // a removed listener draining, without an active state).
    let listener = format!("0.0.0.0_{port}");
    let active = |dump: &Value| dynamic_listener(dump, &listener).is_some_and(|l| l.get("active_state").is_some());
    assert!(active(&envoy.config_dump().await), "no active gateway listener {listener}");
    apply(&client, &gateway_pod("{istio: something-else}")).await;
    let gone = poll(CONVERGE_TIMEOUT, async || !active(&envoy.config_dump().await)).await;
    assert!(gone, "the gateway listener stayed after the Pod lost the selected label");
    assert_no_rejections(&envoy).await;
}

#[tokio::test]
async fn a_plain_http_kubeconfig_with_a_bearer_token_works() {
    let Some(api) = KubeApi::start().await else { return };
    let client = api.admin().await;
    apply(&client, &cluster_basics()).await;
    let front = PlainHttpFront::start(&api).await;
    let dir = api.dir().to_path_buf();
    // The API server checks the token that crosses the front: a wrong one gets nothing.
    let wrong = api.write_kubeconfig(&dir, "wrong.kubeconfig", &front.url(), "not-a-token");
    let refused = Meshpilot::standalone_on_kubernetes(wrong).start();
    let kubeconfig = api.write_kubeconfig(&dir, "http.kubeconfig", &front.url(), common::kube::ADMIN_TOKEN);
    let cp = Meshpilot::standalone_on_kubernetes(kubeconfig).start();
    cp.wait_ready(STARTUP_TIMEOUT).await;
    let registry = cp.admin_json("/debug/registryz").await.to_string();
    assert!(registry.contains("reviews.shop.svc.cluster.local"), "{registry}");
    // Refused credentials hold readiness back (serving an empty mesh would drop every route).
    let unauthorized = poll(CONVERGE_TIMEOUT, async || {
        let m = refused.metrics().await;
        m.value("meshpilot_config_source_errors", &[("source", "kubernetes"), ("reason", "unauthorized")]) > 0.0
    })
    .await;
    assert!(unauthorized, "the refused token is not reported");
    assert_eq!(refused.admin_get("/ready").await.0, 503, "ready without being able to read the cluster");
}

#[tokio::test]
async fn standby_ingest_nodes_watch_too_so_a_failover_starts_warm() {
    let Some(api) = KubeApi::start().await else { return };
    let client = api.admin().await;
    apply(&client, &cluster_basics()).await;
    let dir = api.dir().to_path_buf();
    let kubeconfig = api.write_kubeconfig(&dir, "meshpilot.kubeconfig", &api.url(), common::kube::ADMIN_TOKEN);
    let etcd = api.etcd_endpoint();
    let ingests: Vec<Meshpilot> =
        ["a", "b"].iter().map(|id| Meshpilot::ingest_on_kubernetes(&etcd, &kubeconfig).id(id).start()).collect();
    for node in &ingests {
        node.wait_ready(STARTUP_TIMEOUT).await;
    }
    let (leader, _) = wait_leader(&ingests, STARTUP_TIMEOUT, |_| true).await;
    let standby = &ingests[1 - leader];
    // The standby has listed and built from the cluster too, and follows a change.
    apply(&client, &cluster_basics().replace("port: 9080", "port: 9081")).await;
    let followed =
        poll(CONVERGE_TIMEOUT, async || standby.admin_json("/debug/registryz").await.to_string().contains("9081"))
            .await;
    assert!(followed, "the standby does not follow the cluster");
}

#[tokio::test]
async fn an_unreadable_kubeconfig_stops_the_process_at_start_naming_the_file() {
    // The process's one Kubernetes client is made before anything uses it: a kubeconfig that
    // cannot be read ends the start with the file named, instead of a process that never lists.
    let dir = tempfile::tempdir().expect("temp dir");
    let missing = dir.path().join("missing.kubeconfig");
    let cp = Meshpilot::standalone_on_kubernetes(&missing).start();
    let status = poll(STARTUP_TIMEOUT, async || cp.exit_status()).await;
    let status = status.unwrap_or_else(|| panic!("meshpilot still runs:\n{}", cp.logs()));
    assert!(!status.success(), "exited with {status}");
    let logs = cp.logs();
    assert!(logs.contains(&format!("kubeconfig {}", missing.display())), "the file is not named:\n{logs}");
}
