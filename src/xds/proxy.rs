//! Connected proxies: an Istio node id and metadata read into the proxy a stream serves, and its
//! identity in the registry.

use envoy_types::pb::envoy::config::core::v3::Node;
use serde::Serialize;

use crate::cluster::ownership::ProxyIdentity;
use crate::config::api::Labels;
use crate::envoy::{Interception, NodeMetadata, ProxyConfigMeta, ProxyKind, ProxyView, TraceIdentity};
use crate::registry::kubernetes::{KubeKey, KubeKind, KubeObject, KubeObjects, KubePod};

/// A connected proxy, as identified by its xDS node.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Proxy {
    /// Full node id (`sidecar~10.1.2.3~pod.ns~ns.svc.cluster.local`).
    pub id: String,
    /// Role.
    pub kind: ProxyKind,
    /// IP addresses: metadata INSTANCE_IPS, else the node id's; the Pod's when the registry holds
    /// the proxy's Pod.
    pub ips: Vec<String>,
    /// Namespace (metadata NAMESPACE, else from the node id).
    pub namespace: String,
    /// Workload labels (metadata LABELS, or the Pod's).
    pub labels: Labels,
    /// Cluster id (metadata CLUSTER_ID).
    pub cluster_id: String,
    /// Service account (metadata SERVICE_ACCOUNT, or the Pod's).
    pub service_account: String,
    /// Interception mode (metadata INTERCEPTION_MODE).
    pub interception: Interception,
    /// Istio version of the proxy (metadata ISTIO_VERSION; empty if absent), the `pilot_xds` label.
    pub istio_version: String,
    /// Workload name (metadata WORKLOAD_NAME; empty if absent).
    pub workload_name: String,
    /// Mesh id (metadata MESH_ID; empty if absent).
    pub mesh_id: String,
    /// The node's locality (`region/zone/subzone`; empty if absent). The registry's locality of
    /// the proxy's workload comes first (see `ProxyView::resolve`).
    pub locality: String,
    /// What the agent's PROXY_CONFIG says, if it sent one.
    pub proxy_config: Option<ProxyConfigMeta>,
    /// Whether the caller proved an identity of the proxy's namespace (the secure port): only
    /// then may a gateway be sent its namespace's `credentialName` secrets. A node can never say
    /// so itself; the stream sets it once the caller is authorized.
    pub verified: bool,
}

/// Why a node cannot be served.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProxyError {
    /// The first request carried no node.
    #[error("the first request of a stream must carry a node")]
    MissingNode,
    /// The node id is not Istio's `type~ip~id~domain`.
    #[error("node id {0:?} is not of the form TYPE~IP~POD.NAMESPACE~NAMESPACE.svc.DOMAIN (TYPE sidecar or router)")]
    BadId(String),
}

impl Proxy {
    /// What its consistent-hash key is made of.
    pub fn identity(&self) -> ProxyIdentity<'_> {
        let app = self.labels.get("app").or_else(|| self.labels.get("app.kubernetes.io/name"));
        ProxyIdentity {
            node_id: &self.id,
            namespace: &self.namespace,
            service_account: &self.service_account,
            app: app.map(String::as_str),
        }
    }

    /// Reads a proxy from its xDS node.
    pub fn from_node(node: Option<&Node>) -> Result<Proxy, ProxyError> {
        let node = node.ok_or(ProxyError::MissingNode)?;
        // Control characters in an id would forge log lines and break debug output.
        if node.id.chars().any(char::is_control) {
            return Err(ProxyError::BadId(node.id.clone()));
        }
        let parts: Vec<&str> = node.id.split('~').collect();
        let [kind, ip, pod, domain] = parts.as_slice() else {
            return Err(ProxyError::BadId(node.id.clone()));
        };
        let kind = match *kind {
            "sidecar" => ProxyKind::Sidecar,
            "router" => ProxyKind::Router,
            _ => return Err(ProxyError::BadId(node.id.clone())),
        };
        let meta = NodeMetadata::parse(node.metadata.as_ref());
        let namespace = meta
            .namespace
            .or_else(|| pod.split_once('.').map(|(_, ns)| ns.to_string()))
            .or_else(|| domain.split('.').next().map(str::to_string))
            .filter(|ns| !ns.is_empty())
            .ok_or_else(|| ProxyError::BadId(node.id.clone()))?;
        // pilot-agent lists every address of the pod; the node id carries only the first.
        let ips = if meta.instance_ips.is_empty() { vec![ip.to_string()] } else { meta.instance_ips };
        Ok(Proxy {
            id: node.id.clone(),
            kind,
            ips,
            namespace,
            labels: meta.labels.unwrap_or_default(),
            cluster_id: meta.cluster_id.unwrap_or_else(|| "Kubernetes".into()),
            service_account: meta.service_account.unwrap_or_default(),
            interception: meta.interception.unwrap_or(Interception::Redirect),
            istio_version: meta.istio_version.unwrap_or_default(),
            workload_name: meta.workload_name.unwrap_or_default(),
            mesh_id: meta.mesh_id.unwrap_or_default(),
            locality: node
                .locality
                .as_ref()
                .map(|l| locality_text(&l.region, &l.zone, &l.sub_zone))
                .unwrap_or_default(),
            proxy_config: meta.proxy_config,
            verified: false,
        })
    }

    /// The proxy as the registry knows it: when `kube` holds its Pod (`POD.NS` of the node id, in
    /// the proxy's namespace, as Istio looks it up), labels, service account and IPs come from
    /// the Pod, which the proxy cannot forge; otherwise the proxy stays as its node described it.
    pub fn with_registry(&self, kube: &KubeObjects) -> Proxy {
        self.with_pod(self.registry_pod(kube))
    }

    /// The Pod `kube` holds for this proxy's node id, if any.
    pub fn registry_pod<'a>(&self, kube: &'a KubeObjects) -> Option<&'a KubePod> {
        let pod_id = self.id.split('~').nth(2).unwrap_or_default();
        let (name, namespace) = pod_id.split_once('.')?;
        if namespace != self.namespace || name.is_empty() {
            return None;
        }
        let key = KubeKey { kind: KubeKind::Pod, namespace: namespace.to_string(), name: name.to_string() };
        match kube.get(&key).map(|o| o.as_ref()) {
            Some(KubeObject::Pod(pod)) => Some(pod),
            _ => None,
        }
    }

    /// This proxy with the identity of `pod` (itself without one).
    pub fn with_pod(&self, pod: Option<&KubePod>) -> Proxy {
        let mut proxy = self.clone();
        if let Some(pod) = pod {
            proxy.labels = (*pod.labels).clone();
            proxy.service_account = pod.service_account.to_string();
            if !pod.ips.is_empty() {
                proxy.ips = pod.ips.clone();
            }
        }
        proxy
    }

    /// The view of the mesh this proxy's config depends on.
    pub fn view(&self) -> ProxyView {
        ProxyView {
            kind: self.kind,
            namespace: self.namespace.clone(),
            labels: self.labels.clone(),
            interception: self.interception,
            // Gateways have no inbound side: their views stay shared whatever their addresses.
            ips: if self.kind == ProxyKind::Sidecar { self.ips.clone() } else { Vec::new() },
            inbound: Vec::new(),
            agent_sds: !self.istio_version.is_empty(),
            // Sidecars never get credentials: their views stay shared across both ports.
            credentials: self.kind == ProxyKind::Router && self.verified,
            locality: self.locality.clone(),
            trace: Some(TraceIdentity::new(
                &self.labels,
                &self.namespace,
                &self.mesh_id,
                Some(&self.cluster_id),
                self.proxy_config.as_ref().map(|p| p.tracing.clone().unwrap_or_default()),
            )),
        }
    }
}

/// `region/zone/subzone` without trailing empty parts, as Istio writes a locality.
fn locality_text(region: &str, zone: &str, sub_zone: &str) -> String {
    let text = format!("{region}/{zone}/{sub_zone}");
    text.trim_end_matches('/').to_string()
}

#[cfg(test)]
mod tests {
    use envoy_types::pb::google::protobuf::{value::Kind as ValueKind, Struct, Value};

    use super::*;

    fn node(id: &str, meta: &[(&str, Value)]) -> Node {
        Node {
            id: id.into(),
            metadata: Some(Struct { fields: meta.iter().map(|(k, v)| (k.to_string(), v.clone())).collect() }),
            ..Default::default()
        }
    }

    fn s(v: &str) -> Value {
        Value { kind: Some(ValueKind::StringValue(v.into())) }
    }

    #[test]
    fn parses_istio_node_ids() {
        let p = Proxy::from_node(Some(&node("sidecar~10.1.2.3~reviews-1.shop~shop.svc.cluster.local", &[]))).unwrap();
        assert_eq!(p.kind, ProxyKind::Sidecar);
        assert_eq!(p.ips, ["10.1.2.3"]);
        assert_eq!(p.namespace, "shop");
        let labels = Value {
            kind: Some(ValueKind::StructValue(Struct { fields: [("app".to_string(), s("gw"))].into_iter().collect() })),
        };
        let g = Proxy::from_node(Some(&node(
            "router~10.0.0.1~gw.istio-system~istio-system.svc.cluster.local",
            &[("NAMESPACE", s("edge")), ("LABELS", labels), ("INTERCEPTION_MODE", s("NONE"))],
        )))
        .unwrap();
        assert_eq!(g.kind, ProxyKind::Router);
        assert_eq!(g.namespace, "edge");
        assert_eq!(g.labels.get("app").map(String::as_str), Some("gw"));
        assert_eq!(g.interception, Interception::None);
    }

    #[test]
    fn the_registry_pod_overrides_labels_service_account_and_ips() {
        use crate::registry::kubernetes::KubePod;
        use std::sync::Arc;

        let labels = Value {
            kind: Some(ValueKind::StructValue(Struct {
                fields: [("app".to_string(), s("forged"))].into_iter().collect(),
            })),
        };
        let id = "sidecar~10.1.2.3~reviews-1.shop~shop.svc.cluster.local";
        let p = Proxy::from_node(Some(&node(id, &[("LABELS", labels), ("SERVICE_ACCOUNT", s("admin"))]))).unwrap();
        let pod = |ns: &str| KubePod {
            name: "reviews-1".into(),
            namespace: ns.into(),
            labels: std::sync::Arc::new([("app".to_string(), "reviews".to_string())].into()),
            service_account: "bookinfo-reviews".into(),
            ips: vec!["10.1.2.3".into(), "fd00::3".into()],
            node_name: "n1".into(),
            ready: true,
            terminating: false,
            named_ports: Default::default(),
        };
        let mut kube = KubeObjects::new();
        let object = KubeObject::Pod(pod("shop"));
        kube.insert(object.key(), Arc::new(object));
        let known = p.with_registry(&kube);
        assert_eq!(known.labels.get("app").map(String::as_str), Some("reviews"));
        assert_eq!(known.service_account, "bookinfo-reviews");
        assert_eq!(known.ips, ["10.1.2.3", "fd00::3"]);
        assert_ne!(known.view(), p.view(), "the view follows the Pod's labels");

        // A Pod of the same name in another namespace is not this proxy's.
        let mut other = KubeObjects::new();
        let object = KubeObject::Pod(pod("elsewhere"));
        other.insert(object.key(), Arc::new(object));
        assert_eq!(p.with_registry(&other), p);
        assert_eq!(p.with_registry(&KubeObjects::new()), p);
    }

    #[test]
    fn pilot_agent_nodes_give_all_instance_ips_and_unknown_keys_are_ignored() {
        let labels = Value {
            kind: Some(ValueKind::StructValue(Struct {
                fields: [("app".to_string(), s("reviews"))].into_iter().collect(),
            })),
        };
        let id = "sidecar~10.1.2.3~reviews-1.shop~shop.svc.cluster.local";
        let p = Proxy::from_node(Some(&node(
            id,
            &[
                ("INSTANCE_IPS", s("10.1.2.3,fd00::3")),
                ("LABELS", labels),
                ("WORKLOAD_NAME", s("reviews-v1")),
                ("MESH_ID", s("mesh1")),
                ("INTERCEPTION_MODE", s("TPROXY")),
                ("SOME_FUTURE_KEY", Value { kind: Some(ValueKind::ListValue(Default::default())) }),
            ],
        )))
        .unwrap();
        assert_eq!(p.ips, ["10.1.2.3", "fd00::3"]);
        assert_eq!((p.workload_name.as_str(), p.mesh_id.as_str()), ("reviews-v1", "mesh1"));
        assert_eq!(p.interception, Interception::Tproxy);
        assert_eq!(p.view().ips, p.ips, "the view carries the IPs until resolved against a snapshot");
        // Nothing valid in INSTANCE_IPS: the node id's address.
        let q = Proxy::from_node(Some(&node(id, &[("INSTANCE_IPS", s("x,,y"))]))).unwrap();
        assert_eq!(q.ips, ["10.1.2.3"]);
        // Malformed known values never fail the node.
        let r = Proxy::from_node(Some(&node(
            id,
            &[("LABELS", s("app=x")), ("NAMESPACE", Value { kind: None }), ("PROXY_CONFIG", s("nope"))],
        )))
        .unwrap();
        assert!(r.labels.is_empty());
        assert_eq!(r.namespace, "shop", "from the node id");
        assert_eq!(r.proxy_config, None);
        let gateway = Proxy::from_node(Some(&node("router~10.0.0.1~gw.edge~edge.svc.cluster.local", &[]))).unwrap();
        assert!(gateway.view().ips.is_empty(), "gateways have no inbound side");
    }

    #[test]
    fn rejects_bad_ids() {
        assert!(matches!(Proxy::from_node(None), Err(ProxyError::MissingNode)));
        assert!(matches!(Proxy::from_node(Some(&node("envoy-1", &[]))), Err(ProxyError::BadId(_))));
        assert!(matches!(Proxy::from_node(Some(&node("ztunnel~1~a.b~b.svc", &[]))), Err(ProxyError::BadId(_))));
    }

    #[test]
    fn hash_identity_from_service_account_and_labels() {
        let labels = |pairs: &[(&str, &str)]| Value {
            kind: Some(ValueKind::StructValue(Struct {
                fields: pairs.iter().map(|(k, v)| (k.to_string(), s(v))).collect(),
            })),
        };
        let id = "sidecar~10.0.0.1~reviews-1.bookinfo~bookinfo.svc.cluster.local";
        let p = Proxy::from_node(Some(&node(
            id,
            &[("SERVICE_ACCOUNT", s("bookinfo-reviews")), ("LABELS", labels(&[("app", "reviews")]))],
        )))
        .unwrap();
        let who = p.identity();
        assert_eq!(
            (who.node_id, who.namespace, who.service_account, who.app),
            (id, "bookinfo", "bookinfo-reviews", Some("reviews"))
        );
        let p =
            Proxy::from_node(Some(&node(id, &[("LABELS", labels(&[("app.kubernetes.io/name", "ratings")]))]))).unwrap();
        assert_eq!(p.identity().app, Some("ratings"));
        assert_eq!(p.identity().service_account, "");
    }
}
