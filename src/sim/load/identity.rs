//! Who simulated proxy `i` is. Deterministic, because the benchmark's orchestrator and the replay
//! server derive the same workload, namespace and key from the index.

use envoy_types::pb::envoy::config::core::v3::Node;
use envoy_types::pb::google::protobuf::{value::Kind, Struct, Value};

/// The Istio version the simulated pilot-agent claims (istiod gates features on it).
pub const ISTIO_VERSION: &str = "1.28.0";

/// gRPC metadata header meshpilot's hashing load balancer routes on.
pub const PROXY_KEY_HEADER: &str = "x-meshpilot-proxy-key";

/// Identity of one simulated sidecar.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProxyIdentity {
    /// 0-based index among the run's proxies.
    pub index: usize,
    /// Workload number (`index % workloads`).
    pub workload: usize,
    /// Namespace (`namespaces[workload % len]`).
    pub namespace: String,
    /// Pod IP, `10.{128 + (i>>16)%64}.{(i>>8)%256}.{i%256}`.
    pub ip: String,
}

impl ProxyIdentity {
    /// Proxy `index` of a run with `workloads` workloads spread over `namespaces`.
    pub fn new(index: usize, workloads: usize, namespaces: &[String]) -> ProxyIdentity {
        let workload = index % workloads.max(1);
        let namespace = match namespaces.len() {
            0 => "default".to_string(),
            n => namespaces[workload % n].clone(),
        };
        let ip = format!("10.{}.{}.{}", 128 + (index >> 16) % 64, (index >> 8) % 256, index % 256);
        ProxyIdentity { index, workload, namespace, ip }
    }

    /// The `app` label, also the workload name: `wl-{w}`.
    pub fn app(&self) -> String {
        format!("wl-{}", self.workload)
    }

    /// Pod name `wl-{w}-{i}`.
    pub fn pod(&self) -> String {
        format!("wl-{}-{}", self.workload, self.index)
    }

    /// `{ns}/wl-{w}`: the load balancer's key and the capture's workload key.
    pub fn key(&self) -> String {
        format!("{}/{}", self.namespace, self.app())
    }

    /// Node id as pilot-agent builds it.
    pub fn node_id(&self) -> String {
        let ns = &self.namespace;
        format!("sidecar~{}~{}.{ns}~{ns}.svc.cluster.local", self.ip, self.pod())
    }

    /// The node with the metadata pilot-agent sends, enough for istiod to treat it as a sidecar.
    pub fn node(&self) -> Node {
        let app = self.app();
        let ns = self.namespace.as_str();
        let labels = Struct { fields: [("app".to_string(), text(&app))].into_iter().collect() };
        let proxy_config = Struct {
            fields: [
                ("discoveryAddress", text("istiod.istio-system.svc:15012")),
                ("concurrency", number(2.0)),
                ("statusPort", number(15020.0)),
                ("proxyAdminPort", number(15000.0)),
            ]
            .into_iter()
            .map(|(k, v)| (k.to_string(), v))
            .collect(),
        };
        let fields = [
            ("ISTIO_VERSION", text(ISTIO_VERSION)),
            ("NAMESPACE", text(ns)),
            ("LABELS", Value { kind: Some(Kind::StructValue(labels)) }),
            ("INSTANCE_IPS", text(&self.ip)),
            ("INTERCEPTION_MODE", text("REDIRECT")),
            ("CLUSTER_ID", text("Kubernetes")),
            ("WORKLOAD_NAME", text(&app)),
            ("SERVICE_ACCOUNT", text("default")),
            ("MESH_ID", text("cluster.local")),
            ("NAME", text(&self.pod())),
            ("POD_PORTS", text("[]")),
            ("APP_CONTAINERS", text("app")),
            ("OWNER", text(&format!("kubernetes://apis/apps/v1/namespaces/{ns}/deployments/{app}"))),
            ("ENVOY_STATUS_PORT", number(15021.0)),
            ("ENVOY_PROMETHEUS_PORT", number(15090.0)),
            ("PROXY_CONFIG", Value { kind: Some(Kind::StructValue(proxy_config)) }),
        ];
        Node {
            id: self.node_id(),
            cluster: format!("{app}.{ns}"),
            user_agent_name: "envoy".to_string(),
            metadata: Some(Struct { fields: fields.into_iter().map(|(k, v)| (k.to_string(), v)).collect() }),
            ..Default::default()
        }
    }
}

fn text(v: &str) -> Value {
    Value { kind: Some(Kind::StringValue(v.to_string())) }
}

fn number(v: f64) -> Value {
    Value { kind: Some(Kind::NumberValue(v)) }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::envoy::NodeMetadata;

    #[test]
    fn identity_follows_the_index() {
        let ns = vec!["ns-0".to_string(), "ns-1".to_string()];
        let p = ProxyIdentity::new(70_001, 3, &ns);
        assert_eq!(p.workload, 70_001 % 3);
        assert_eq!(p.namespace, "ns-0");
        assert_eq!(p.ip, "10.129.17.113");
        assert_eq!(p.node_id(), "sidecar~10.129.17.113~wl-2-70001.ns-0~ns-0.svc.cluster.local");
        assert_eq!(p.key(), "ns-0/wl-2");
        assert_eq!(ProxyIdentity::new(1, 3, &ns).namespace, "ns-1");
    }

    #[test]
    fn metadata_reads_as_a_sidecar() {
        let p = ProxyIdentity::new(4, 2, &["a".to_string()]);
        let meta = NodeMetadata::parse(p.node().metadata.as_ref());
        assert_eq!(meta.namespace.as_deref(), Some("a"));
        assert_eq!(meta.labels.and_then(|l| l.get("app").cloned()).as_deref(), Some("wl-0"));
        assert_eq!(meta.instance_ips, vec![p.ip.clone()]);
        assert_eq!(meta.pod_name.as_deref(), Some("wl-0-4"));
    }
}
