//! Test helpers: snapshots from YAML, proxy views, decoding generated resources.

use std::path::PathBuf;
use std::sync::Arc;

use envoy_types::pb::envoy::config::route::v3::{route, Route, RouteAction, RouteConfiguration, VirtualHost};
use envoy_types::pb::google::protobuf::Any;
use prost::Message;

use super::{generate, Resource};
use crate::config::api::Labels;
use crate::config::parse::{parse_file, Document};
use crate::envoy::TypeUrl;
use crate::envoy::{Interception, ProxyKind, ProxyView};
use crate::snapshot::{ChangeSet, Snapshot, SourceState, Version};

/// A MESH_INTERNAL, STATIC ServiceEntry `name.ns.svc.cluster.local` with port 80 (http), as a
/// YAML document ending in `---`.
pub(crate) fn service_entry(name: &str, ns: &str) -> String {
    format!(
        "apiVersion: networking.istio.io/v1\nkind: ServiceEntry\nmetadata: {{name: {name}, namespace: {ns}}}\nspec:\n  \
         hosts: [{name}.{ns}.svc.cluster.local]\n  location: MESH_INTERNAL\n  resolution: STATIC\n  \
         ports: [{{number: 80, name: http}}]\n---\n"
    )
}

/// A snapshot of the objects in `yaml` (which must all be valid).
pub(crate) fn snapshot(yaml: &str) -> Snapshot {
    let mut state = SourceState::default();
    for doc in parse_file("test.yaml", yaml) {
        match doc {
            Document::Valid(obj) => {
                state.configs.insert(obj.key.clone(), Arc::new(obj));
            }
            other => panic!("invalid test config: {other:?}"),
        }
    }
    Snapshot::build(Version::new(1, 1), ChangeSet::full(), &state)
}

/// A snapshot of Kubernetes Service `shop/web` (ports `http` 80 and `admin` 81) with two
/// EndpointSlices (10.0.0.1 ready, .2 not ready, .3 terminating on 8080/8081; .4 on 8080 only),
/// plus the Istio objects in `yaml`.
pub(crate) fn kube_snapshot(yaml: &str) -> Snapshot {
    use crate::registry::kubernetes::*;

    let endpoint = |ip: &str, ready: bool, terminating: bool| SliceEndpoint {
        addresses: vec![ip.into()],
        ready: Some(ready),
        serving: Some(ready),
        terminating: Some(terminating),
        pod: None,
        node_name: None,
    };
    let port = |name: &str, n: u16| KubeServicePort {
        name: name.into(),
        port: n,
        protocol: "TCP".into(),
        app_protocol: None,
        target_port: None,
    };
    let slice = |name: &str, ports: &[(&str, u16)], endpoints| KubeEndpointSlice {
        name: name.into(),
        namespace: "shop".into(),
        service_name: "web".into(),
        address_type: "IPv4".into(),
        ports: ports
            .iter()
            .map(|(n, p)| SlicePort { name: n.to_string(), port: Some(*p), protocol: "TCP".into() })
            .collect(),
        endpoints,
    };
    let objects = vec![
        KubeObject::Service(KubeService {
            name: "web".into(),
            namespace: "shop".into(),
            labels: Default::default(),
            selector: None,
            service_type: ServiceType::ClusterIp,
            cluster_ips: vec!["10.96.0.1".into()],
            headless: false,
            external_name: None,
            ports: vec![port("http", 80), port("admin", 81)],
            export_to: vec![],
        }),
        KubeObject::EndpointSlice(slice(
            "web-a",
            &[("http", 8080), ("admin", 8081)],
            vec![
                endpoint("10.0.0.1", true, false),
                endpoint("10.0.0.2", false, false),
                endpoint("10.0.0.3", false, true),
            ],
        )),
        KubeObject::EndpointSlice(slice("web-b", &[("http", 8080)], vec![endpoint("10.0.0.4", true, false)])),
    ];
    let mut state =
        SourceState { kube: objects.into_iter().map(|o| (o.key(), Arc::new(o))).collect(), ..Default::default() };
    for doc in crate::config::parse::parse_file("t.yaml", yaml) {
        if let crate::config::parse::Document::Valid(obj) = doc {
            state.configs.insert(obj.key.clone(), Arc::new(obj));
        }
    }
    Snapshot::build(Version::new(1, 1), ChangeSet::full(), &state)
}

/// The testdata directory.
pub(crate) fn testdata() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("src/envoy/testdata")
}

/// A snapshot of a testdata file, certificate paths pointed at the test certificate.
pub(super) fn testdata_snapshot(file: &str) -> Snapshot {
    let yaml = std::fs::read_to_string(testdata().join(file)).expect("read testdata");
    snapshot(&yaml.replace("/etc/certs", &testdata().display().to_string()))
}

/// A sidecar in `namespace` with `labels`, traffic redirected by iptables.
pub(crate) fn sidecar(namespace: &str, labels: &[(&str, &str)]) -> ProxyView {
    ProxyView {
        kind: ProxyKind::Sidecar,
        namespace: namespace.into(),
        labels: labels_of(labels),
        interception: Interception::Redirect,
        ips: Vec::new(),
        inbound: Vec::new(),
        agent_sds: true,
        credentials: false,
        locality: String::new(),
        trace: None,
    }
}

/// A sidecar at `ips`, whose inbound side the snapshot's endpoints at those IPs determine.
pub(crate) fn sidecar_at(namespace: &str, labels: &[(&str, &str)], ips: &[&str]) -> ProxyView {
    ProxyView { ips: ips.iter().map(|ip| ip.to_string()).collect(), ..sidecar(namespace, labels) }
}

/// A gateway proxy in `namespace` with `labels`, connected with a verified identity of its
/// namespace (the secure port).
pub(crate) fn router(namespace: &str, labels: &[(&str, &str)]) -> ProxyView {
    ProxyView {
        kind: ProxyKind::Router,
        namespace: namespace.into(),
        labels: labels_of(labels),
        interception: Interception::None,
        ips: Vec::new(),
        inbound: Vec::new(),
        agent_sds: true,
        credentials: true,
        locality: String::new(),
        trace: None,
    }
}

/// The same gateway on the plaintext port: no identity proved.
pub(crate) fn plaintext_router(namespace: &str, labels: &[(&str, &str)]) -> ProxyView {
    ProxyView { credentials: false, ..router(namespace, labels) }
}

fn labels_of(labels: &[(&str, &str)]) -> Labels {
    labels.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
}

/// Decodes a packed resource.
pub(super) fn decode<T: Message + Default>(r: &Resource) -> T {
    T::decode(r.body.value.as_slice()).expect("resource decodes")
}

/// The generated resource of `type_url` named `name`, decoded.
pub(super) fn find<T: Message + Default>(s: &Snapshot, v: &ProxyView, type_url: TypeUrl, name: &str) -> T {
    let all = generate(type_url, s, v);
    let names: Vec<&str> = all.iter().map(|r| r.name.as_str()).collect();
    let r = all.iter().find(|r| r.name == name).unwrap_or_else(|| panic!("no {type_url} {name:?} in {names:?}"));
    decode(r)
}

/// Names of the generated resources of `type_url`.
pub(super) fn names(s: &Snapshot, v: &ProxyView, type_url: TypeUrl) -> Vec<String> {
    generate(type_url, s, v).into_iter().map(|r| r.name).collect()
}

/// The route action of a route.
pub(super) fn route_action(r: &Route) -> &RouteAction {
    match &r.action {
        Some(route::Action::Route(a)) => a,
        other => panic!("route {:?} does not forward: {other:?}", r.name),
    }
}

/// The virtual host `name` of a route configuration.
pub(super) fn vhost<'a>(rc: &'a RouteConfiguration, name: &str) -> &'a VirtualHost {
    let names: Vec<&str> = rc.virtual_hosts.iter().map(|v| v.name.as_str()).collect();
    rc.virtual_hosts.iter().find(|v| v.name == name).unwrap_or_else(|| panic!("no vhost {name:?} in {names:?}"))
}

/// The route `name` of a virtual host.
pub(super) fn route_named<'a>(vh: &'a VirtualHost, name: &str) -> &'a Route {
    let names: Vec<&str> = vh.routes.iter().map(|r| r.name.as_str()).collect();
    vh.routes.iter().find(|r| r.name == name).unwrap_or_else(|| panic!("no route {name:?} in {names:?}"))
}

/// Decodes a typed config.
pub(super) fn unpack<T: Message + Default>(any: &Any) -> T {
    T::decode(any.value.as_slice()).expect("typed config decodes")
}
