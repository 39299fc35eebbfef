//! Kubernetes API objects → the registry's compact objects: only the fields the service model
//! reads are kept, so a large cluster's pods stay cheap to hold.

use std::collections::BTreeMap;
use std::sync::Arc;

use k8s_openapi::api::core::v1::{Namespace, Node, Secret, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use super::slim::SlimPod;
use crate::config::api::Labels;
use crate::registry::kubernetes::{
    KubeEndpointSlice, KubeNamespace, KubeNode, KubeObject, KubePod, KubeSecret, KubeService, KubeServicePort,
    PrivateKey, ServiceType, SliceEndpoint, SlicePort, TargetPort,
};

/// The Service annotation that limits where Istio exports it.
const EXPORT_TO: &str = "networking.istio.io/exportTo";
/// The EndpointSlice label naming its Service.
const SERVICE_NAME: &str = "kubernetes.io/service-name";

fn labels(map: Option<BTreeMap<String, String>>) -> Labels {
    map.unwrap_or_default()
}

/// `v` without spare capacity. Mapping an API object's `Vec` into a smaller element type with
/// `into_iter().map().collect()` reuses its buffer in place, so a held slice would keep the
/// buffer sized for the API's (larger) endpoints.
fn tight<T>(mut v: Vec<T>) -> Vec<T> {
    v.shrink_to_fit();
    v
}

fn port(n: i32) -> Option<u16> {
    u16::try_from(n).ok().filter(|p| *p > 0)
}

/// A Service.
pub fn service(s: Service) -> KubeObject {
    let meta = s.metadata;
    let spec = s.spec.unwrap_or_default();
    let headless = spec.cluster_ip.as_deref() == Some("None");
    let cluster_ips = spec
        .cluster_ips
        .or_else(|| spec.cluster_ip.map(|ip| vec![ip]))
        .unwrap_or_default()
        .into_iter()
        .filter(|ip| !ip.is_empty() && ip != "None")
        .collect();
    let service_type = match spec.type_.as_deref() {
        Some("NodePort") => ServiceType::NodePort,
        Some("LoadBalancer") => ServiceType::LoadBalancer,
        Some("ExternalName") => ServiceType::ExternalName,
        _ => ServiceType::ClusterIp,
    };
    let export_to = meta
        .annotations
        .as_ref()
        .and_then(|a| a.get(EXPORT_TO))
        .map(|v| v.split(',').map(str::trim).filter(|s| !s.is_empty()).map(String::from).collect())
        .unwrap_or_default();
    KubeObject::Service(KubeService {
        name: meta.name.unwrap_or_default(),
        namespace: meta.namespace.unwrap_or_default(),
        labels: labels(meta.labels),
        selector: spec.selector.filter(|s| !s.is_empty()),
        service_type,
        cluster_ips,
        headless,
        external_name: spec.external_name,
        ports: tight(
            spec.ports
                .unwrap_or_default()
                .into_iter()
                .filter_map(|p| {
                    Some(KubeServicePort {
                        name: p.name.unwrap_or_default(),
                        port: port(p.port)?,
                        protocol: p.protocol.unwrap_or_else(|| "TCP".into()),
                        app_protocol: p.app_protocol,
                        target_port: p.target_port.and_then(|t| match t {
                            IntOrString::Int(n) => port(n).map(TargetPort::Number),
                            IntOrString::String(name) => Some(TargetPort::Name(name)),
                        }),
                    })
                })
                .collect(),
        ),
        export_to,
    })
}

/// An EndpointSlice.
pub fn endpoint_slice(s: EndpointSlice) -> KubeObject {
    let meta = s.metadata;
    let service_name = meta.labels.as_ref().and_then(|l| l.get(SERVICE_NAME)).cloned().unwrap_or_default();
    KubeObject::EndpointSlice(KubeEndpointSlice {
        name: meta.name.unwrap_or_default(),
        namespace: meta.namespace.unwrap_or_default(),
        service_name,
        address_type: s.address_type,
        ports: tight(
            s.ports
                .unwrap_or_default()
                .into_iter()
                .map(|p| SlicePort {
                    name: p.name.unwrap_or_default(),
                    port: p.port.and_then(port),
                    protocol: p.protocol.unwrap_or_else(|| "TCP".into()),
                })
                .collect(),
        ),
        endpoints: tight(
            s.endpoints
                .into_iter()
                .map(|e| {
                    let conditions = e.conditions.unwrap_or_default();
                    SliceEndpoint {
                        addresses: e.addresses,
                        ready: conditions.ready,
                        serving: conditions.serving,
                        terminating: conditions.terminating,
                        pod: e.target_ref.filter(|r| r.kind.as_deref() == Some("Pod")).and_then(|r| r.name),
                        node_name: e.node_name.map(Arc::from),
                    }
                })
                .collect(),
        ),
    })
}

/// A Pod.
pub fn pod(p: SlimPod) -> KubeObject {
    let meta = p.metadata;
    let spec = p.spec.unwrap_or_default();
    let status = p.status.unwrap_or_default();
    let ips = match status.pod_ips {
        Some(ips) if !ips.is_empty() => ips.into_iter().map(|ip| ip.ip).collect(),
        _ => status.pod_ip.into_iter().collect(),
    };
    let ready = status.conditions.unwrap_or_default().iter().any(|c| c.type_ == "Ready" && c.status == "True");
    let mut named_ports: Vec<(String, u16)> = spec
        .containers
        .iter()
        .flat_map(|c| c.ports.iter().flatten())
        .filter_map(|p| Some((p.name.clone()?, port(p.container_port)?)))
        .collect();
    // Sorted by name, the first container's port winning a repeated name (as a map's entry would).
    named_ports.sort_by(|a, b| a.0.cmp(&b.0));
    named_ports.dedup_by(|later, earlier| later.0 == earlier.0);
    let service_account = spec.service_account_name.filter(|s| !s.is_empty());
    KubeObject::Pod(KubePod {
        name: meta.name.unwrap_or_default(),
        namespace: meta.namespace.unwrap_or_default().into(),
        labels: Arc::new(labels(meta.labels)),
        service_account: service_account.as_deref().unwrap_or("default").into(),
        ips: tight(ips),
        node_name: spec.node_name.unwrap_or_default().into(),
        ready,
        terminating: meta.deletion_timestamp.is_some(),
        named_ports: named_ports.into(),
    })
}

/// A Node: its locality labels.
pub fn node(n: Node) -> KubeObject {
    let meta = n.metadata;
    let label = |key: &str| meta.labels.as_ref().and_then(|l| l.get(key)).cloned().unwrap_or_default();
    KubeObject::Node(KubeNode {
        region: label("topology.kubernetes.io/region"),
        zone: label("topology.kubernetes.io/zone"),
        subzone: label("topology.istio.io/subzone"),
        name: meta.name.unwrap_or_default(),
    })
}

/// A Namespace.
pub fn namespace(n: Namespace) -> KubeObject {
    KubeObject::Namespace(KubeNamespace {
        name: n.metadata.name.unwrap_or_default(),
        labels: labels(n.metadata.labels),
    })
}

/// A Secret, reduced to the certificate material a gateway `credentialName` reads (Istio's key
/// names); a Secret without any keeps only its name. The data is never logged.
pub fn secret(s: Secret) -> KubeObject {
    let meta = s.metadata;
    let mut data = s.data.unwrap_or_default();
    let mut text = |keys: &[&str]| {
        keys.iter().find_map(|k| data.remove(*k)).and_then(|v| String::from_utf8(v.0).ok()).unwrap_or_default()
    };
    let cert_chain = text(&["tls.crt", "cert"]);
    let private_key = PrivateKey(text(&["tls.key", "key"]));
    let ca = text(&["ca.crt", "cacert"]);
    KubeObject::Secret(KubeSecret {
        name: meta.name.unwrap_or_default(),
        namespace: meta.namespace.unwrap_or_default(),
        cert_chain,
        private_key,
        ca,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn from<T: serde::de::DeserializeOwned>(v: serde_json::Value) -> T {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn service_keeps_ports_selector_and_export_to() {
        let svc: Service = from(json!({
            "metadata": {"name": "reviews", "namespace": "shop", "annotations": {"networking.istio.io/exportTo": "., istio-system"}},
            "spec": {"clusterIP": "10.0.0.9", "selector": {"app": "reviews"}, "ports": [
                {"name": "http-api", "port": 80, "targetPort": "web", "appProtocol": "http"},
                {"port": 9000, "targetPort": 9001, "protocol": "UDP"}]}
        }));
        let KubeObject::Service(s) = service(svc) else { panic!() };
        assert_eq!(s.cluster_ips, ["10.0.0.9"]);
        assert!(!s.headless);
        assert_eq!(s.export_to, [".", "istio-system"]);
        assert_eq!(s.ports[0].target_port, Some(TargetPort::Name("web".into())));
        assert_eq!(s.ports[1].target_port, Some(TargetPort::Number(9001)));
        assert_eq!(s.ports[1].protocol, "UDP");
        assert_eq!(s.selector.unwrap()["app"], "reviews");
    }

    #[test]
    fn headless_service_has_no_cluster_ip() {
        let svc: Service = from(json!({"metadata": {"name": "db", "namespace": "ns"}, "spec": {"clusterIP": "None"}}));
        let KubeObject::Service(s) = service(svc) else { panic!() };
        assert!(s.headless);
        assert!(s.cluster_ips.is_empty());
        assert_eq!(s.selector, None);
    }

    #[test]
    fn slice_endpoints_keep_conditions_and_pod_refs() {
        let slice: EndpointSlice = from(json!({
            "metadata": {"name": "reviews-abc", "namespace": "shop", "labels": {"kubernetes.io/service-name": "reviews"}},
            "addressType": "IPv4",
            "ports": [{"name": "http-api", "port": 8080}],
            "endpoints": [{"addresses": ["10.1.0.1"], "conditions": {"ready": false, "serving": true, "terminating": true},
                           "targetRef": {"kind": "Pod", "name": "reviews-1", "namespace": "shop"}, "nodeName": "n1"}]
        }));
        let KubeObject::EndpointSlice(s) = endpoint_slice(slice) else { panic!() };
        assert_eq!(s.service_name, "reviews");
        assert_eq!(s.ports[0].port, Some(8080));
        let e = &s.endpoints[0];
        assert_eq!((e.ready, e.serving, e.terminating), (Some(false), Some(true), Some(true)));
        assert_eq!(e.pod.as_deref(), Some("reviews-1"));
    }

    #[test]
    fn pod_readiness_ips_and_default_service_account() {
        let p: SlimPod = from(json!({
            "metadata": {"name": "r-1", "namespace": "shop", "labels": {"app": "r"}},
            "spec": {"nodeName": "n1", "containers": [{"name": "c", "ports": [{"name": "web", "containerPort": 9080}]}]},
            "status": {"podIP": "10.1.0.1", "conditions": [{"type": "Ready", "status": "True"}]}
        }));
        let KubeObject::Pod(p) = pod(p) else { panic!() };
        assert_eq!(p.ips, ["10.1.0.1"]);
        assert_eq!(&*p.service_account, "default");
        assert!(p.ready && !p.terminating);
        assert_eq!(p.named_port("web"), Some(9080));
    }

    #[test]
    fn node_locality_labels() {
        let n: Node = from(json!({"metadata": {"name": "n1", "labels": {
            "topology.kubernetes.io/region": "eu", "topology.kubernetes.io/zone": "eu-1a", "topology.istio.io/subzone": "rack7"}}}));
        let KubeObject::Node(n) = node(n) else { panic!() };
        assert_eq!((n.region.as_str(), n.zone.as_str(), n.subzone.as_str()), ("eu", "eu-1a", "rack7"));
    }

    #[test]
    fn secrets_keep_certificate_keys_only_and_never_show_the_key() {
        let tls: Secret = from(json!({"metadata": {"name": "web", "namespace": "gw"}, "type": "kubernetes.io/tls",
            "data": {"tls.crt": "Q0VSVA==", "tls.key": "S0VZLVNFQ1JFVA==", "other": "eA=="}}));
        let KubeObject::Secret(s) = secret(tls) else { panic!() };
        assert_eq!((s.cert_chain.as_str(), s.private_key.0.as_str(), s.ca.as_str()), ("CERT", "KEY-SECRET", ""));
        assert!(!format!("{s:?}").contains("KEY-SECRET"), "Debug redacts the key");
        let generic: Secret = from(json!({"metadata": {"name": "web-cacert", "namespace": "gw"},
            "data": {"cacert": "Q0E="}}));
        let KubeObject::Secret(s) = secret(generic) else { panic!() };
        assert_eq!((s.cert_chain.as_str(), s.ca.as_str()), ("", "CA"));
    }
}
