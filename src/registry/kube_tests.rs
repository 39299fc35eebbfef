//! Registry builds from Kubernetes objects: endpoints, health, locality, selectors across kinds,
//! discovery scope, and a 1,000-Service / 10,000-Pod build.

use std::sync::Arc;

use super::kubernetes::*;
use super::*;
use crate::config::api::Labels;
use crate::config::parse::{parse_file, Document};
use crate::config::ValidConfig;
use crate::mesh::{LabelSelector, MeshConfig};

fn labels(pairs: &[(&str, &str)]) -> Labels {
    pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
}

fn service(name: &str, ns: &str, ports: &[(&str, u16, Option<TargetPort>)]) -> KubeService {
    KubeService {
        name: name.into(),
        namespace: ns.into(),
        labels: Labels::new(),
        selector: Some(labels(&[("app", name)])),
        service_type: ServiceType::ClusterIp,
        cluster_ips: vec!["10.96.0.1".into()],
        headless: false,
        external_name: None,
        ports: ports
            .iter()
            .map(|(n, p, t)| KubeServicePort {
                name: n.to_string(),
                port: *p,
                protocol: "TCP".into(),
                app_protocol: None,
                target_port: t.clone(),
            })
            .collect(),
        export_to: Vec::new(),
    }
}

fn pod(name: &str, ns: &str, ip: &str, node: &str, pod_labels: &[(&str, &str)]) -> KubePod {
    KubePod {
        name: name.into(),
        namespace: ns.into(),
        labels: Arc::new(labels(pod_labels)),
        service_account: format!("{name}-sa").into(),
        ips: vec![ip.into()],
        node_name: node.into(),
        ready: true,
        terminating: false,
        named_ports: Arc::from(vec![]),
    }
}

fn endpoint(ip: &str, pod: Option<&str>) -> SliceEndpoint {
    SliceEndpoint {
        addresses: vec![ip.into()],
        ready: Some(true),
        serving: Some(true),
        terminating: Some(false),
        pod: pod.map(str::to_string),
        node_name: None,
    }
}

fn slice(
    name: &str,
    ns: &str,
    svc: &str,
    ports: &[(&str, Option<u16>)],
    endpoints: Vec<SliceEndpoint>,
) -> KubeEndpointSlice {
    KubeEndpointSlice {
        name: name.into(),
        namespace: ns.into(),
        service_name: svc.into(),
        address_type: "IPv4".into(),
        ports: ports.iter().map(|(n, p)| SlicePort { name: n.to_string(), port: *p, protocol: "TCP".into() }).collect(),
        endpoints,
    }
}

fn objects(list: Vec<KubeObject>) -> KubeObjects {
    list.into_iter().map(|o| (o.key(), Arc::new(o))).collect()
}

/// The valid config objects of `yaml` (a test fixture: anything invalid panics).
pub(super) fn configs(yaml: &str) -> Vec<ValidConfig> {
    parse_file("t.yaml", yaml)
        .into_iter()
        .map(|d| match d {
            Document::Valid(o) => Arc::new(o),
            other => panic!("invalid test config: {other:?}"),
        })
        .collect()
}

fn key(host: &str, ns: &str) -> ServiceKey {
    ServiceKey { hostname: Hostname::new(host), namespace: ns.into() }
}

fn port<'a>(reg: &'a Registry, k: &ServiceKey, name: &str) -> &'a ServicePort {
    reg.services[k].ports.iter().find(|p| p.name == name).expect("port")
}

#[test]
fn slice_endpoints_join_pods_nodes_and_namespaces() {
    let mut p1 = pod("reviews-1", "shop", "10.0.0.1", "node-a", &[("app", "reviews"), ("version", "v1")]);
    p1.named_ports = Arc::from(vec![("web".to_string(), 9080)]);
    let p2 =
        pod("reviews-2", "shop", "10.0.0.2", "node-b", &[("app", "reviews"), ("topology.istio.io/network", "net-2")]);
    let kube = objects(vec![
        KubeObject::Service(service("reviews", "shop", &[("http", 80, Some(TargetPort::Name("web".into())))])),
        KubeObject::EndpointSlice(slice(
            "reviews-abc",
            "shop",
            "reviews",
            &[("http", Some(9080))],
            vec![
                endpoint("10.0.0.1", Some("reviews-1")),
                endpoint("10.0.0.2", None),
                endpoint("10.0.0.9", Some("gone")),
            ],
        )),
        KubeObject::Pod(p1),
        KubeObject::Pod(p2),
        KubeObject::Node(KubeNode {
            name: "node-a".into(),
            region: "us-east".into(),
            zone: "us-east-1a".into(),
            subzone: "rack-4".into(),
        }),
        KubeObject::Node(KubeNode {
            name: "node-b".into(),
            region: String::new(),
            zone: String::new(),
            subzone: String::new(),
        }),
        KubeObject::Namespace(KubeNamespace {
            name: "shop".into(),
            labels: labels(&[("topology.istio.io/network", "net-1")]),
        }),
    ]);
    let reg = build_registry([].iter(), &kube, &MeshConfig::default());
    let k = key("reviews.shop.svc.cluster.local", "shop");
    let eps = &reg.endpoints[&k];
    assert_eq!(eps.len(), 2, "the endpoint whose Pod is unknown is left out: {eps:?}");
    let (e1, e2) = (&eps[0], &eps[1]);
    assert_eq!((e1.address.as_str(), &*e1.service_account), ("10.0.0.1", "reviews-1-sa"));
    assert_eq!(&*e1.locality, "us-east/us-east-1a/rack-4");
    assert_eq!(e1.label("topology.kubernetes.io/zone"), Some("us-east-1a"));
    assert_eq!(e1.label("kubernetes.io/hostname"), Some("node-a"));
    assert_eq!(e1.label("topology.istio.io/network"), Some("net-1"), "the namespace's network as a label");
    assert_eq!(e1.label("version"), Some("v1"));
    assert!(e1.matches(&labels(&[("version", "v1"), ("topology.istio.io/subzone", "rack-4")])));
    assert!(!e1.matches(&labels(&[("topology.kubernetes.io/region", "eu")])));
    assert_eq!(&*e1.network, "net-1", "the namespace's network");
    assert_eq!(e1.port_for(port(&reg, &k, "http")), Some(9080));
    assert_eq!((&*e2.service_account, &*e2.network), ("reviews-2-sa", "net-2"), "joined by IP");
    assert_eq!(&*e2.locality, "", "a node without topology labels gives no locality");
    assert!(matches!(reg.services[&k].origin, ServiceOrigin::Kube(_)));
}

#[test]
fn locality_label_on_the_pod_overrides_the_node() {
    let p = pod("a-1", "ns", "10.0.0.1", "node-a", &[("app", "a"), ("istio-locality", "eu.west-1.z1")]);
    let kube = objects(vec![
        KubeObject::Service(service("a", "ns", &[("http", 80, None)])),
        KubeObject::EndpointSlice(slice(
            "a-1",
            "ns",
            "a",
            &[("http", Some(80))],
            vec![endpoint("10.0.0.1", Some("a-1"))],
        )),
        KubeObject::Pod(p),
        KubeObject::Node(KubeNode {
            name: "node-a".into(),
            region: "us".into(),
            zone: "z".into(),
            subzone: String::new(),
        }),
    ]);
    let reg = build_registry([].iter(), &kube, &MeshConfig::default());
    assert_eq!(&*reg.endpoints[&key("a.ns.svc.cluster.local", "ns")][0].locality, "eu/west-1/z1");
}

#[test]
fn named_target_ports_resolve_per_endpoint_and_missing_ports_are_not_served() {
    let mut old = pod("api-old", "ns", "10.0.0.1", "", &[("app", "api")]);
    old.named_ports = Arc::from(vec![("web".to_string(), 8080)]);
    let mut new = pod("api-new", "ns", "10.0.0.2", "", &[("app", "api")]);
    new.named_ports = Arc::from(vec![("web".to_string(), 9090)]);
    let svc = service("api", "ns", &[("http", 80, Some(TargetPort::Name("web".into()))), ("admin", 81, None)]);
    let kube = objects(vec![
        KubeObject::Service(svc),
        // Kubernetes splits endpoints by port set: the old pod serves `http` only.
        KubeObject::EndpointSlice(slice(
            "api-a",
            "ns",
            "api",
            &[("http", Some(8080))],
            vec![endpoint("10.0.0.1", Some("api-old"))],
        )),
        // A slice port without a number resolves through the Service's named targetPort.
        KubeObject::EndpointSlice(slice(
            "api-b",
            "ns",
            "api",
            &[("http", None), ("admin", Some(81))],
            vec![endpoint("10.0.0.2", Some("api-new"))],
        )),
        KubeObject::Pod(old),
        KubeObject::Pod(new),
    ]);
    let reg = build_registry([].iter(), &kube, &MeshConfig::default());
    let k = key("api.ns.svc.cluster.local", "ns");
    let (http, admin) = (port(&reg, &k, "http"), port(&reg, &k, "admin"));
    let eps = &reg.endpoints[&k];
    assert_eq!((eps[0].port_for(http), eps[0].port_for(admin)), (Some(8080), None));
    assert_eq!((eps[1].port_for(http), eps[1].port_for(admin)), (Some(9090), Some(81)));
}

#[test]
fn not_ready_and_terminating_endpoints_follow_istio() {
    let ep = |ready, serving, terminating| SliceEndpoint { ready, serving, terminating, ..endpoint("10.0.0.1", None) };
    use EndpointHealth::*;
    let health = |e: &SliceEndpoint, draining| super::kube_endpoints::slice_health(e, draining);
    assert_eq!(health(&ep(None, None, None), false), Healthy, "unset ready is ready");
    assert_eq!(health(&ep(Some(false), Some(false), Some(false)), false), Unhealthy);
    assert_eq!(health(&ep(Some(false), Some(true), Some(true)), false), Terminating);
    assert_eq!(health(&ep(Some(false), Some(true), Some(true)), true), Draining, "persistent sessions drain");
    assert_eq!(health(&ep(Some(false), Some(false), Some(true)), true), Terminating);
    assert_eq!(
        health(&ep(Some(false), None, None), false),
        Terminating,
        "Istio reads unset terminating as terminating"
    );

    let mut svc = service("web", "ns", &[("http", 80, None)]);
    svc.labels.insert("istio.io/persistent-session".into(), "cookie".into());
    let kube = objects(vec![
        KubeObject::Service(svc),
        KubeObject::EndpointSlice(slice(
            "web-1",
            "ns",
            "web",
            &[("http", Some(80))],
            vec![
                ep(Some(true), None, None),
                SliceEndpoint { addresses: vec!["10.0.0.2".into()], ..ep(Some(false), Some(true), Some(true)) },
            ],
        )),
    ]);
    let reg = build_registry([].iter(), &kube, &MeshConfig::default());
    let healths: Vec<_> = reg.endpoints[&key("web.ns.svc.cluster.local", "ns")].iter().map(|e| e.health).collect();
    assert_eq!(healths, [Healthy, Draining]);
}

#[test]
fn headless_and_external_name_services_keep_istio_semantics() {
    let mut db = service("db", "ns", &[("tcp", 5432, None)]);
    db.headless = true;
    db.cluster_ips.clear();
    let mut ext = service("search", "ns", &[("https", 443, None)]);
    ext.service_type = ServiceType::ExternalName;
    ext.external_name = Some("search.example.com".into());
    ext.selector = None;
    ext.cluster_ips.clear();
    let kube = objects(vec![
        KubeObject::Service(db),
        KubeObject::Service(ext),
        KubeObject::EndpointSlice(slice("db-1", "ns", "db", &[("tcp", Some(5432))], vec![endpoint("10.0.0.5", None)])),
    ]);
    let reg = build_registry([].iter(), &kube, &MeshConfig::default());
    let db = key("db.ns.svc.cluster.local", "ns");
    assert_eq!(reg.services[&db].resolution, Resolution::Passthrough);
    assert_eq!(reg.endpoints[&db].len(), 1, "headless endpoints are still listed");
    let ext = key("search.ns.svc.cluster.local", "ns");
    let alias = &reg.services[&ext];
    assert_eq!(
        (alias.resolution, alias.alias_of.as_ref().map(|h| h.as_str())),
        (Resolution::Alias, Some("search.example.com"))
    );
    assert!(reg.endpoints.get(&ext).is_none_or(|e| e.is_empty()), "an alias has no endpoints of its own");
}

const SELECTORS: &str = r#"
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: legacy, namespace: shop}
spec:
  hosts: [legacy.example.com]
  location: MESH_INTERNAL
  resolution: STATIC
  ports: [{number: 80, name: http}]
  workloadSelector: {labels: {app: legacy}}
---
apiVersion: networking.istio.io/v1
kind: WorkloadEntry
metadata: {name: vm-1, namespace: shop}
spec: {address: 192.168.0.1, labels: {app: reviews, version: vm}, ports: {web: 7070}}
---
apiVersion: networking.istio.io/v1
kind: WorkloadEntry
metadata: {name: vm-other-ns, namespace: other}
spec: {address: 192.168.0.2, labels: {app: reviews}}
"#;

#[test]
fn selectors_cross_kinds() {
    let mut legacy = pod("legacy-1", "shop", "10.0.1.1", "", &[("app", "legacy")]);
    legacy.named_ports = Arc::from(vec![("http".to_string(), 8000)]);
    let mut not_ready = pod("legacy-2", "shop", "10.0.1.2", "", &[("app", "legacy")]);
    not_ready.ready = false;
    let elsewhere = pod("legacy-3", "other", "10.0.1.3", "", &[("app", "legacy")]);
    let kube = objects(vec![
        KubeObject::Service(service("reviews", "shop", &[("http", 80, Some(TargetPort::Name("web".into())))])),
        KubeObject::Pod(legacy),
        KubeObject::Pod(not_ready),
        KubeObject::Pod(elsewhere),
    ]);
    let cfg = configs(SELECTORS);
    let reg = build_registry(cfg.iter(), &kube, &MeshConfig::default());

    // A ServiceEntry's workloadSelector picks ready Pods of its namespace.
    let se = key("legacy.example.com", "shop");
    let eps = &reg.endpoints[&se];
    assert_eq!(eps.iter().map(|e| e.address.as_str()).collect::<Vec<_>>(), ["10.0.1.1"]);
    assert_eq!(eps[0].port_for(port(&reg, &se, "http")), Some(8000), "the Pod's port of that name");
    assert_eq!(&*eps[0].service_account, "legacy-1-sa");

    // A Service's selector picks WorkloadEntries of its namespace; the named targetPort maps to the entry's port.
    let svc = key("reviews.shop.svc.cluster.local", "shop");
    let eps = &reg.endpoints[&svc];
    assert_eq!(eps.iter().map(|e| e.address.as_str()).collect::<Vec<_>>(), ["192.168.0.1"]);
    assert_eq!(eps[0].port_for(port(&reg, &svc, "http")), Some(7070));
}

#[test]
fn kubernetes_services_win_over_service_entries_for_their_host() {
    let cfg = configs(
        "apiVersion: networking.istio.io/v1\nkind: ServiceEntry\nmetadata: {name: squat, namespace: shop}\nspec:\n  \
         hosts: [reviews.shop.svc.cluster.local]\n  resolution: STATIC\n  ports: [{number: 80, name: http}]\n",
    );
    let kube = objects(vec![KubeObject::Service(service("reviews", "shop", &[("http", 80, None)]))]);
    let reg = build_registry(cfg.iter(), &kube, &MeshConfig::default());
    assert!(matches!(reg.services[&key("reviews.shop.svc.cluster.local", "shop")].origin, ServiceOrigin::Kube(_)));
}

#[test]
fn discovery_selectors_scope_kubernetes_objects_and_config() {
    let mesh = MeshConfig {
        discovery_selectors: vec![LabelSelector {
            match_labels: labels(&[("istio-discovery", "enabled")]),
            ..Default::default()
        }],
        ..MeshConfig::default()
    };
    let kube = objects(vec![
        KubeObject::Namespace(KubeNamespace { name: "shop".into(), labels: labels(&[("istio-discovery", "enabled")]) }),
        KubeObject::Namespace(KubeNamespace { name: "other".into(), labels: Labels::new() }),
        KubeObject::Service(service("reviews", "shop", &[("http", 80, None)])),
        KubeObject::Service(service("reviews", "other", &[("http", 80, None)])),
        KubeObject::Service(service("unknown-ns", "nowhere", &[("http", 80, None)])),
    ]);
    let cfg = configs(SELECTORS);
    let reg = build_registry(cfg.iter(), &kube, &mesh);
    let hosts: Vec<&str> = reg.services.keys().map(|k| k.hostname.as_str()).collect();
    assert_eq!(hosts, ["legacy.example.com", "reviews.shop.svc.cluster.local"]);
    // The WorkloadEntry in `other` is out of scope too.
    assert!(reg.endpoints.values().flat_map(|e| e.iter()).all(|e| e.address != "192.168.0.2"));

    let scope = NamespaceScope::new(&mesh, &kube);
    assert!(scope.contains("shop") && !scope.contains("other") && !scope.contains("nowhere") && scope.contains(""));
    // No selectors, or no Namespaces known (no Kubernetes source): everything is in scope.
    assert!(NamespaceScope::new(&MeshConfig::default(), &kube).selects_all());
    assert!(NamespaceScope::new(&mesh, &KubeObjects::new()).selects_all());
}

/// 1,000 Services of 10 Pods each (10,000 Pods), one slice per Service, over 100 namespaces and
/// 50 nodes. Prints the build time (`cargo test --release --lib registry:: -- --nocapture`).
#[test]
fn thousand_services_ten_thousand_pods() {
    let mut list = Vec::new();
    for n in 0..50 {
        list.push(KubeObject::Node(KubeNode {
            name: format!("node-{n}"),
            region: "us-east".into(),
            zone: format!("us-east-{}", n % 3),
            subzone: String::new(),
        }));
    }
    for ns in 0..100 {
        list.push(KubeObject::Namespace(KubeNamespace { name: format!("ns-{ns}"), labels: Labels::new() }));
    }
    for s in 0..1000 {
        let (ns, name) = (format!("ns-{}", s % 100), format!("svc-{s}"));
        let mut endpoints = Vec::new();
        for i in 0..10 {
            let ip = format!("10.{}.{}.{}", s / 250, s % 250, i + 1);
            let pod_name = format!("{name}-{i}");
            let mut p =
                pod(&pod_name, &ns, &ip, &format!("node-{}", (s + i) % 50), &[("app", &name), ("version", "v1")]);
            p.named_ports = Arc::from(vec![("http".to_string(), 8080)]);
            list.push(KubeObject::Pod(p));
            endpoints.push(endpoint(&ip, Some(&pod_name)));
        }
        list.push(KubeObject::EndpointSlice(slice(
            &format!("{name}-x"),
            &ns,
            &name,
            &[("http", Some(8080)), ("grpc", Some(9090))],
            endpoints,
        )));
        list.push(KubeObject::Service(service(&name, &ns, &[("http", 80, None), ("grpc", 90, None)])));
    }
    let kube = objects(list);
    let mesh = MeshConfig::default();
    let started = std::time::Instant::now();
    let reg = build_registry([].iter(), &kube, &mesh);
    let took = started.elapsed();
    println!("build_registry: 1,000 Services, 10,000 Pods, 1,000 EndpointSlices in {took:?}");
    assert_eq!(reg.services.len(), 1000);
    assert_eq!(reg.endpoints.values().map(|e| e.len()).sum::<usize>(), 10_000);
    let eps = &reg.endpoints[&key("svc-7.ns-7.svc.cluster.local", "ns-7")];
    assert!(eps
        .iter()
        .all(|e| e.ports.len() == 2 && e.service_account.starts_with("svc-7-") && !e.locality.is_empty()));
}
