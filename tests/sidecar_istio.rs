//! Istio's real sidecar served by meshpilot: pilot-agent (built from istio.io/istio at
//! `scripts/istio-version`) and the Envoy it bootstraps run as uid 1337 in a pod's network
//! namespace behind the iptables rules of `pilot-agent istio-iptables`, and proxy Envoy's xDS
//! stream (delta, pilot-agent's default) to meshpilot, which watches a real Kubernetes API server
//! holding the pod, its Service and the services it calls (see `common::sidecar`).
//!
//! The other pods (reviews v1/v2, ratings) and the client live in a second namespace linked to
//! the pod's. `MESHPILOT_SIDECAR_XDS=sotw` runs the same tests over state-of-the-world xDS.

use crate::common;

use std::net::{Ipv4Addr, SocketAddr};

use common::backend::Backend;
use common::config_dump::dynamic_cluster_names;
use common::ingress::Ingress;
use common::istio::{destination_rule, NS};
use common::kube::{apply, KubeApi, ADMIN_TOKEN};
use common::mesh::wait_synced;
use common::meshpilot::Meshpilot;
use common::netns::NetNs;
use common::poll::STARTUP_TIMEOUT;
use common::ports::free_port;
use common::sidecar::{SidecarPod, XdsMode, NODE_NAME};
use kube::Client;

/// The sidecar's pod (the Bookinfo product page calling reviews and ratings).
const POD: &str = "productpage-v1-7d4b9c-x2x7k";
/// Port of the product page's Service (`http`, to the app's container port).
const PRODUCTPAGE_PORT: u16 = 9080;
/// Cluster IP and port (`http`) of `reviews`.
const REVIEWS: (Ipv4Addr, u16) = (Ipv4Addr::new(10, 96, 77, 20), 9080);
/// Cluster IP and port of `ratings`, named `web`: no protocol prefix, no appProtocol.
const RATINGS: (Ipv4Addr, u16) = (Ipv4Addr::new(10, 96, 77, 30), 9090);

/// A Service with one port, an explicit cluster IP, selecting `app: NAME`.
fn service(name: &str, ip: Ipv4Addr, port_name: &str, port: u16, target: u16) -> String {
    format!(
        "apiVersion: v1\nkind: Service\nmetadata: {{name: {name}, namespace: {NS}}}\nspec:\n  clusterIP: {ip}\n  \
         selector: {{app: {name}}}\n  ports: [{{name: {port_name}, port: {port}, targetPort: {target}}}]\n"
    )
}

/// The EndpointSlice of Service `name` (port `port_name` → `target`) holding `pods` (name, IP),
/// as the EndpointSlice controller writes it.
fn slice(name: &str, port_name: &str, target: u16, pods: &[(&str, String)]) -> String {
    let endpoints: String = pods
        .iter()
        .map(|(pod, ip)| {
            format!(
                "- addresses: [\"{ip}\"]\n  conditions: {{ready: true, serving: true, terminating: false}}\n  \
                 nodeName: {NODE_NAME}\n  targetRef: {{kind: Pod, name: {pod}, namespace: {NS}}}\n"
            )
        })
        .collect();
    format!(
        "apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata:\n  name: {name}-abcde\n  namespace: {NS}\n  \
         labels: {{kubernetes.io/service-name: {name}}}\naddressType: IPv4\nports: [{{name: {port_name}, port: \
         {target}, protocol: TCP}}]\nendpoints:\n{endpoints}"
    )
}

/// A running Pod of `app` at a backend's address (no sidecar: it is only called).
fn backend_pod(app: &str, version: &str, backend: &Backend) -> String {
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {app}-{version}\n  namespace: {NS}\n  labels: {{app: {app}, \
         version: {version}}}\nspec:\n  nodeName: {NODE_NAME}\n  containers: [{{name: app, image: {app}, ports: \
         [{{containerPort: {port}}}]}}]\nstatus:\n  phase: Running\n  podIP: \"{ip}\"\n  podIPs: [{{ip: \"{ip}\"}}]\n  \
         conditions: [{{type: Ready, status: \"True\"}}]\n",
        port = backend.port(),
        ip = backend.ip()
    )
}

/// VirtualService `reviews`: everything to subset `subset`.
fn reviews_route(subset: &str) -> String {
    format!(
        "apiVersion: networking.istio.io/v1\nkind: VirtualService\nmetadata: {{name: reviews, namespace: {NS}}}\n\
         spec:\n  hosts: [reviews]\n  http:\n  - route:\n    - destination: {{host: reviews, subset: {subset}}}\n"
    )
}

/// VirtualService `ratings`: requests with `x-route: reviews` to reviews v2, the rest to ratings.
/// Only an HTTP listener can apply it: over TCP everything would reach ratings.
fn ratings_route() -> String {
    format!(
        "apiVersion: networking.istio.io/v1\nkind: VirtualService\nmetadata: {{name: ratings, namespace: {NS}}}\n\
         spec:\n  hosts: [ratings]\n  http:\n  - match: [{{headers: {{x-route: {{exact: reviews}}}}}}]\n    route:\n    \
         - destination: {{host: reviews, subset: v2, port: {{number: {}}}}}\n  - route:\n    - destination: {{host: \
         ratings}}\n",
        REVIEWS.1
    )
}

/// Everything one test runs: the sidecar's pod, meshpilot on the API server, and the other pods.
/// Fields drop in order: the pod (pilot-agent, Envoy, its namespace) first.
struct Mesh {
    pod: SidecarPod,
    cp: Meshpilot,
    client: Client,
    _api: KubeApi,
    _backends: Vec<Backend>,
    others: NetNs,
}

impl Mesh {
    /// Starts it all; None (skipped, said why) where pilot-agent, kube-apiserver or network
    /// namespaces are not available outside CI.
    async fn start() -> Option<Mesh> {
        let builder = SidecarPod::builder(POD, NS)?
            .label("app", "productpage")
            .label("version", "v1")
            .service_account("bookinfo-productpage");
        // 0: the client, then reviews v1, v2 and ratings, all on one port.
        let others = NetNs::create(4)?;
        builder.netns().link(&others);
        let port = free_port();
        let backend = |name: &str, i: u8| {
            Backend::builder(name).listener(others.listen(SocketAddr::from((others.addr(i), port)))).start()
        };
        let backends = vec![backend("reviews-v1", 1), backend("reviews-v2", 2), backend("ratings-v1", 3)];
        let api = KubeApi::start().await?;
        let client = api.admin().await;
        let ip = |i: usize| backends[i].ip().to_string();
        let app_port = builder.app_port();
        let objects = [
            format!("apiVersion: v1\nkind: Namespace\nmetadata: {{name: {NS}}}\n"),
            format!("apiVersion: v1\nkind: Node\nmetadata: {{name: {NODE_NAME}}}\n"),
            builder.pod_yaml(),
            service("productpage", Ipv4Addr::new(10, 96, 77, 10), "http", PRODUCTPAGE_PORT, app_port),
            slice("productpage", "http", app_port, &[(POD, builder.ip().to_string())]),
            backend_pod("reviews", "v1", &backends[0]),
            backend_pod("reviews", "v2", &backends[1]),
            backend_pod("ratings", "v1", &backends[2]),
            service("reviews", REVIEWS.0, "http", REVIEWS.1, port),
            slice("reviews", "http", port, &[("reviews-v1", ip(0)), ("reviews-v2", ip(1))]),
            service("ratings", RATINGS.0, "web", RATINGS.1, port),
            slice("ratings", "web", port, &[("ratings-v1", ip(2))]),
            destination_rule("reviews", &["v1", "v2"], None),
            reviews_route("v1"),
            ratings_route(),
        ];
        for object in &objects {
            apply(&client, object).await;
        }
        let dir = api.dir().to_path_buf();
        let kubeconfig = api.write_kubeconfig(&dir, "meshpilot.kubeconfig", &api.url(), ADMIN_TOKEN);
        let cp =
            Meshpilot::standalone_on_kubernetes(kubeconfig).xds_addr(builder.xds_addr()).debounce_after("50ms").start();
        cp.wait_ready(STARTUP_TIMEOUT).await;
        let pod = builder.start(cp.xds_addr()).await;
        Some(Mesh { pod, cp, client, _api: api, _backends: backends, others })
    }

    /// A client of `host` whose connections the app makes to `target` (through the sidecar's
    /// outbound side).
    async fn app_client(&self, target: (Ipv4Addr, u16), host: &str) -> (common::netns::Forward, Ingress) {
        let forward = self.pod.outbound(SocketAddr::from(target)).await;
        let ingress = Ingress::new(forward.port(), host);
        (forward, ingress)
    }
}

#[tokio::test]
async fn pilot_agent_bootstraps_envoy_from_istio_template_and_proxies_xds_from_meshpilot() {
    let Some(mesh) = Mesh::start().await else { return };
    let pod = &mesh.pod;

    // Istio's rules are in the pod: inbound TCP to 15006, outbound to 15001, uid 1337 exempt.
    let nat = pod.iptables_nat();
    for rule in ["-A PREROUTING -p tcp -j ISTIO_INBOUND", "--to-ports 15006", "--to-ports 15001", "--uid-owner 1337"] {
        assert!(nat.contains(rule), "the pod's nat table lacks {rule:?}:\n{nat}");
    }

    // The bootstrap comes from Istio's template, with the node pilot-agent made from the env.
    let bootstrap = pod.bootstrap().await;
    let node = &bootstrap["node"];
    assert_eq!(node["id"], pod.node_id(), "node: {node:#}");
    let meta = &node["metadata"];
    assert_eq!(meta["NAMESPACE"], NS, "metadata: {meta:#}");
    assert_eq!(meta["LABELS"]["app"], "productpage", "labels from the downward API file: {meta:#}");
    assert_eq!(meta["SERVICE_ACCOUNT"], "bookinfo-productpage", "metadata: {meta:#}");
    assert_eq!(meta["INTERCEPTION_MODE"], "REDIRECT", "metadata: {meta:#}");
    assert_eq!(meta["INSTANCE_IPS"], pod.ip().to_string(), "metadata: {meta:#}");
    let ads = &bootstrap["dynamic_resources"]["ads_config"];
    let api_type = match pod.xds_mode() {
        XdsMode::Delta => "DELTA_GRPC",
        XdsMode::Sotw => "GRPC",
    };
    assert_eq!(ads["api_type"], api_type, "ads_config: {ads:#}");
    assert_eq!(ads["grpc_services"][0]["envoy_grpc"]["cluster_name"], "xds-grpc", "ads_config: {ads:#}");

    // Through pilot-agent's proxy, meshpilot serves the proxy every type, and Envoy takes it all.
    wait_synced(&mesh.cp, &[pod.node_id()]).await;
    let clusters = dynamic_cluster_names(&pod.config_dump().await);
    for want in ["outbound|9080||reviews.shop.svc.cluster.local", "outbound|9090||ratings.shop.svc.cluster.local"] {
        assert!(clusters.iter().any(|c| c == want), "Envoy lacks {want}: {clusters:?}");
    }
    assert!(pod.admin_get("/listeners").await.contains("virtualOutbound::0.0.0.0:15001"), "no virtualOutbound");
    pod.assert_no_rejections().await;
}

#[tokio::test]
async fn a_client_in_another_namespace_reaches_the_app_through_the_inbound_side() {
    let Some(mesh) = Mesh::start().await else { return };
    let pod = &mesh.pod;
    let client = mesh.others.forward(SocketAddr::from((pod.ip(), pod.app_port()))).await;
    let ingress = Ingress::new(client.port(), &format!("productpage.{NS}.svc.cluster.local:{PRODUCTPAGE_PORT}"));
    let stat = format!("cluster.inbound|{}||;.upstream_rq_total", pod.app_port());
    let before = pod.stat(&stat).await;

    // iptables sends the connection to 15006: only Envoy's inbound side can answer it.
    ingress.wait_all_from("/", &[], POD, 5).await;
    let after = pod.stat(&stat).await;
    assert!(after >= before + 5, "{stat} went from {before} to {after}: the requests did not pass Envoy's inbound");
    pod.assert_no_rejections().await;
}

#[tokio::test]
async fn the_app_reaches_services_through_the_outbound_side_and_a_virtual_service_edit_reroutes_it_live() {
    let Some(mesh) = Mesh::start().await else { return };
    let (_forward, reviews) = mesh.app_client(REVIEWS, &format!("reviews:{}", REVIEWS.1)).await;

    // Nothing listens on the cluster IP: iptables sends the connection to 15001, Envoy routes it.
    reviews.wait_all_from("/", &[], "reviews-v1", 10).await;
    let stat = format!("cluster.outbound|{}|v1|reviews.{NS}.svc.cluster.local;.upstream_rq_total", REVIEWS.1);
    assert!(mesh.pod.stat(&stat).await >= 10, "{stat}: the requests did not pass Envoy's outbound");

    apply(&mesh.client, &reviews_route("v2")).await;
    reviews.wait_all_from("/", &[], "reviews-v2", 10).await;
    mesh.pod.assert_no_rejections().await;
    assert!(mesh.cp.is_running(), "meshpilot exited");
}

#[tokio::test]
async fn an_http_port_declared_without_protocol_is_sniffed_and_routed_as_http() {
    let Some(mesh) = Mesh::start().await else { return };
    let (_forward, ratings) = mesh.app_client(RATINGS, &format!("ratings:{}", RATINGS.1)).await;

    // A header match can only apply if Envoy speaks HTTP on the port: over TCP every request
    // would reach ratings.
    ratings.wait_all_from("/", &[("x-route", "reviews")], "reviews-v2", 5).await;
    ratings.wait_all_from("/", &[], "ratings-v1", 5).await;
    let answer = ratings.echo("/", &[]).await;
    assert!(answer["headers"]["x-request-id"].is_string(), "Envoy's HTTP filter adds x-request-id: {answer:#}");
    mesh.pod.assert_no_rejections().await;
}
