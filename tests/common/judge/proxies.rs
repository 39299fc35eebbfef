//! The simulated proxies of a case, and the node pilot-agent would send for each: the same node
//! goes to both servers.

use std::collections::{BTreeMap, BTreeSet};

use envoy_types::pb::envoy::config::core::v3::Locality;
use meshpilot::sim::SimProxySpec;
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// What pilot-agent sends as ISTIO_VERSION: the module's VERSION with `-dev`, as
/// `scripts/istio-tool.sh` stamps Istio's binaries.
const ISTIO_VERSION: &str = "1.31-dev";

/// The role of a proxy: Istio's node types.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// A workload's sidecar (`sidecar~…`).
    Sidecar,
    /// A gateway (`router~…`).
    Router,
}

/// One proxy of a case (`proxies.yaml` lists these).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ProxyDef {
    /// The pod's name; also the proxy's name in reports.
    pub name: String,
    /// Sidecar or router.
    #[serde(rename = "type", default = "sidecar")]
    pub role: Role,
    /// The pod's namespace.
    pub namespace: String,
    /// The pod's IP.
    pub ip: String,
    /// The pod's labels.
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    /// `region/zone/subzone`, as the pod's node's topology labels give it.
    #[serde(default)]
    pub locality: Option<String>,
}

fn sidecar() -> Role {
    Role::Sidecar
}

impl ProxyDef {
    /// The key of the proxy in reports and the baseline.
    pub fn key(&self) -> String {
        format!("{}.{}", self.name, self.namespace)
    }

    /// The proxy's spec against `xds_url`, with the node metadata pilot-agent sends (see Istio's
    /// `NodeMetadata`): version, cluster, namespace, labels, interception mode, workload name,
    /// mesh id, service account, instance IPs, pod name and owner.
    pub fn spec(&self, xds_url: &str) -> SimProxySpec {
        let prefix = match self.role {
            Role::Sidecar => "sidecar",
            Role::Router => "router",
        };
        let mut spec = SimProxySpec::sidecar(xds_url, &self.namespace, &self.name, &self.ip);
        spec.node_id =
            format!("{prefix}~{}~{}.{}~{}.svc.cluster.local", self.ip, self.name, self.namespace, self.namespace);
        spec.labels = self.labels.clone();
        let workload = self.labels.get("app").cloned().unwrap_or_else(|| self.name.clone());
        spec.metadata = [
            ("ISTIO_VERSION", ISTIO_VERSION.to_string()),
            ("INTERCEPTION_MODE", "REDIRECT".to_string()),
            ("WORKLOAD_NAME", workload.clone()),
            ("MESH_ID", "cluster.local".to_string()),
            ("SERVICE_ACCOUNT", "default".to_string()),
            ("INSTANCE_IPS", self.ip.clone()),
            ("NAME", self.name.clone()),
            ("NODE_NAME", "judge-node".to_string()),
            ("OWNER", format!("kubernetes://apis/apps/v1/namespaces/{}/deployments/{workload}", self.namespace)),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect();
        spec.locality = self.locality.as_deref().map(|l| {
            let mut parts = l.split('/').map(String::from);
            Locality {
                region: parts.next().unwrap_or_default(),
                zone: parts.next().unwrap_or_default(),
                sub_zone: parts.next().unwrap_or_default(),
            }
        });
        spec.keep_resources = true;
        spec
    }
}

/// The most proxies a derived set holds (each costs a stream on both servers and a comparison).
const MAX_SIDECARS: usize = 4;

/// The proxy set of a case without `proxies.yaml`: a sidecar per Pod of `kube` (its labels and
/// IP); without Pods, one sidecar per namespace `config` names (at most [`MAX_SIDECARS`], the
/// first with a locality); and a router in `istio-system` per distinct Gateway selector (at
/// least `istio: ingressgateway`).
pub fn default_set(config: &[Value], kube: &[Value]) -> Vec<ProxyDef> {
    let mut proxies = Vec::new();
    for pod in kube.iter().filter(|d| d["kind"] == "Pod") {
        let Some(ip) = pod["status"]["podIP"].as_str() else { continue };
        proxies.push(ProxyDef {
            name: pod["metadata"]["name"].as_str().unwrap_or("pod").to_string(),
            role: Role::Sidecar,
            namespace: pod["metadata"]["namespace"].as_str().unwrap_or("default").to_string(),
            ip: ip.to_string(),
            labels: string_map(&pod["metadata"]["labels"]),
            locality: Some("region1/zone1/subzone1".into()),
        });
    }
    if proxies.is_empty() {
        let mut namespaces: BTreeSet<String> = config
            .iter()
            .filter_map(|d| d["metadata"]["namespace"].as_str())
            .filter(|ns| *ns != "istio-system")
            .map(String::from)
            .collect();
        namespaces.insert("default".into());
        for (i, ns) in namespaces.iter().take(MAX_SIDECARS).enumerate() {
            proxies.push(ProxyDef {
                name: "judge-app".into(),
                role: Role::Sidecar,
                namespace: ns.clone(),
                ip: format!("10.250.{i}.10"),
                labels: [("app".to_string(), "judge-app".to_string())].into_iter().collect(),
                locality: (i == 0).then(|| "region1/zone1/subzone1".into()),
            });
        }
    }
    let mut selectors: Vec<BTreeMap<String, String>> = Vec::new();
    for gw in config.iter().filter(|d| d["kind"] == "Gateway") {
        let selector = string_map(&gw["spec"]["selector"]);
        if !selector.is_empty() && !selectors.contains(&selector) {
            selectors.push(selector);
        }
    }
    if selectors.is_empty() {
        selectors.push([("istio".to_string(), "ingressgateway".to_string())].into_iter().collect());
    }
    for (i, labels) in selectors.into_iter().take(3).enumerate() {
        let name = labels.values().next().cloned().unwrap_or_else(|| "gateway".into());
        proxies.push(ProxyDef {
            name: format!("{name}-judge"),
            role: Role::Router,
            namespace: "istio-system".into(),
            ip: format!("10.249.0.{}", i + 10),
            labels,
            locality: None,
        });
    }
    proxies
}

fn string_map(v: &Value) -> BTreeMap<String, String> {
    v.as_object()
        .map(|m| m.iter().filter_map(|(k, v)| v.as_str().map(|s| (k.clone(), s.to_string()))).collect())
        .unwrap_or_default()
}
