//! Kubernetes registry objects as the service model needs them: Services, EndpointSlices, Pods,
//! Nodes and Namespaces, cut down to the fields Istio's Kubernetes registry reads.
//!
//! The Kubernetes source converts API objects into these; ingest keeps them in its source state,
//! replication carries them, and the registry builds services and endpoints from them. Storing
//! only these fields (not the API objects) keeps a large cluster's pods cheap to hold.

use std::fmt;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::config::api::Labels;

/// The Kubernetes kinds the registry reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum KubeKind {
    /// `v1` Service.
    Service,
    /// `discovery.k8s.io/v1` EndpointSlice.
    EndpointSlice,
    /// `v1` Pod.
    Pod,
    /// `v1` Node (cluster-scoped: its key has an empty namespace).
    Node,
    /// `v1` Namespace (cluster-scoped: its key has an empty namespace).
    Namespace,
    /// `v1` Secret holding a certificate (a gateway's `credentialName`).
    Secret,
}

impl KubeKind {
    /// The `kind:` value.
    pub fn name(self) -> &'static str {
        match self {
            KubeKind::Service => "Service",
            KubeKind::EndpointSlice => "EndpointSlice",
            KubeKind::Pod => "Pod",
            KubeKind::Node => "Node",
            KubeKind::Namespace => "Namespace",
            KubeKind::Secret => "Secret",
        }
    }
}

impl fmt::Display for KubeKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Identity of a Kubernetes object: kind, namespace (empty for cluster-scoped kinds) and name.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct KubeKey {
    /// Kind.
    pub kind: KubeKind,
    /// Namespace; empty for Nodes and Namespaces.
    pub namespace: String,
    /// Name.
    pub name: String,
}

impl fmt::Display for KubeKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.namespace.is_empty() {
            write!(f, "{} {}", self.kind, self.name)
        } else {
            write!(f, "{} {}/{}", self.kind, self.namespace, self.name)
        }
    }
}

/// A Service's `type`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
pub enum ServiceType {
    /// ClusterIP (also the default when unset).
    #[default]
    ClusterIp,
    /// NodePort.
    NodePort,
    /// LoadBalancer.
    LoadBalancer,
    /// ExternalName: a DNS alias for `external_name`.
    ExternalName,
}

/// A Service port's `targetPort`: a number, or the name of a container port.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum TargetPort {
    /// A port number.
    Number(u16),
    /// A container port name, resolved per endpoint through the EndpointSlice.
    Name(String),
}

/// A Service port.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct KubeServicePort {
    /// Port name (may be empty on a single-port Service).
    pub name: String,
    /// Service port.
    pub port: u16,
    /// `TCP`, `UDP` or `SCTP`.
    pub protocol: String,
    /// `appProtocol`, if set.
    pub app_protocol: Option<String>,
    /// `targetPort`, if set (defaults to `port`).
    pub target_port: Option<TargetPort>,
}

/// A Service.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct KubeService {
    /// Name.
    pub name: String,
    /// Namespace.
    pub namespace: String,
    /// Labels.
    pub labels: Labels,
    /// Pod selector; `None` when the Service has none (endpoints are managed by hand).
    pub selector: Option<Labels>,
    /// Type.
    pub service_type: ServiceType,
    /// Cluster IPs; empty for headless Services (`clusterIP: None`) and ExternalName.
    pub cluster_ips: Vec<String>,
    /// Whether `clusterIP` is `None` (headless).
    pub headless: bool,
    /// `externalName` of an ExternalName Service.
    pub external_name: Option<String>,
    /// Ports.
    pub ports: Vec<KubeServicePort>,
    /// The `networking.istio.io/exportTo` annotation, split at commas.
    pub export_to: Vec<String>,
}

/// An EndpointSlice port.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct SlicePort {
    /// Name: the Service port's name (empty for an unnamed port).
    pub name: String,
    /// Port on the endpoints.
    pub port: Option<u16>,
    /// `TCP`, `UDP` or `SCTP`.
    pub protocol: String,
}

/// One endpoint of a slice.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct SliceEndpoint {
    /// Addresses (Kubernetes uses the first; all are kept for dual-stack).
    pub addresses: Vec<String>,
    /// `conditions.ready` (unset means ready).
    pub ready: Option<bool>,
    /// `conditions.serving` (unset: same as `ready`).
    pub serving: Option<bool>,
    /// `conditions.terminating` (unset means not terminating).
    pub terminating: Option<bool>,
    /// Name of the Pod in `targetRef`, when it refers to one.
    pub pod: Option<String>,
    /// `nodeName` (shared: a node's name is repeated by every endpoint on it).
    pub node_name: Option<Arc<str>>,
}

/// An EndpointSlice.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct KubeEndpointSlice {
    /// Name.
    pub name: String,
    /// Namespace.
    pub namespace: String,
    /// The Service it belongs to (`kubernetes.io/service-name`).
    pub service_name: String,
    /// `IPv4`, `IPv6` or `FQDN`.
    pub address_type: String,
    /// Ports.
    pub ports: Vec<SlicePort>,
    /// Endpoints.
    pub endpoints: Vec<SliceEndpoint>,
}

/// A Pod. The parts its ReplicaSet's pods have in common (labels, named ports, namespace,
/// service account, node) are shared values: the Kubernetes source interns them, so ten
/// thousand pods of a few hundred workloads hold each label set once.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct KubePod {
    /// Name.
    pub name: String,
    /// Namespace.
    pub namespace: Arc<str>,
    /// Labels.
    pub labels: Arc<Labels>,
    /// Service account (`spec.serviceAccountName`, `default` when unset).
    pub service_account: Arc<str>,
    /// Pod IPs (`status.podIPs`, else `status.podIP`).
    pub ips: Vec<String>,
    /// `spec.nodeName`.
    pub node_name: Arc<str>,
    /// Whether the `Ready` condition is true.
    pub ready: bool,
    /// Whether it is being deleted (`metadata.deletionTimestamp` set).
    pub terminating: bool,
    /// Named container ports (`targetPort` by name resolves against these), in name order.
    pub named_ports: NamedPorts,
}

/// A Pod's named container ports, in name order (a handful; shared by a workload's pods).
pub type NamedPorts = Arc<[(String, u16)]>;

impl KubePod {
    /// The container port named `name`.
    pub fn named_port(&self, name: &str) -> Option<u16> {
        self.named_ports.iter().find(|(n, _)| n == name).map(|(_, p)| *p)
    }
}

/// A Node, reduced to its locality and network labels.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct KubeNode {
    /// Name.
    pub name: String,
    /// `topology.kubernetes.io/region`.
    pub region: String,
    /// `topology.kubernetes.io/zone`.
    pub zone: String,
    /// `topology.istio.io/subzone`.
    pub subzone: String,
}

/// A Namespace.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct KubeNamespace {
    /// Name.
    pub name: String,
    /// Labels (discovery selectors and `topology.istio.io/network` read them).
    pub labels: Labels,
}

/// A Secret's certificate material, as Istio reads a `credentialName`: `tls.crt`/`tls.key`
/// (kubernetes.io/tls) or `cert`/`key` (generic), and a CA from `ca.crt` or `cacert`. Other keys
/// are not kept.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct KubeSecret {
    /// Name.
    pub name: String,
    /// Namespace.
    pub namespace: String,
    /// PEM certificate chain (empty when the Secret has none).
    pub cert_chain: String,
    /// PEM private key (empty when the Secret has none).
    pub private_key: PrivateKey,
    /// PEM CA bundle for client validation (empty when the Secret has none).
    pub ca: String,
}

/// Private key bytes: serialised for replication, never shown by `Debug`.
#[derive(Clone, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct PrivateKey(pub String);

impl fmt::Debug for PrivateKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "PrivateKey(<{} bytes redacted>)", self.0.len())
    }
}

impl PrivateKey {
    /// Whether there is no key.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// One Kubernetes registry object.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum KubeObject {
    /// Service.
    Service(KubeService),
    /// EndpointSlice.
    EndpointSlice(KubeEndpointSlice),
    /// Pod.
    Pod(KubePod),
    /// Node.
    Node(KubeNode),
    /// Namespace.
    Namespace(KubeNamespace),
    /// Secret (certificate material only).
    Secret(KubeSecret),
}

impl KubeObject {
    /// The object's key.
    pub fn key(&self) -> KubeKey {
        let (kind, namespace, name) = match self {
            KubeObject::Service(s) => (KubeKind::Service, s.namespace.as_str(), s.name.as_str()),
            KubeObject::EndpointSlice(s) => (KubeKind::EndpointSlice, s.namespace.as_str(), s.name.as_str()),
            KubeObject::Pod(p) => (KubeKind::Pod, &*p.namespace, p.name.as_str()),
            KubeObject::Node(n) => (KubeKind::Node, "", n.name.as_str()),
            KubeObject::Namespace(n) => (KubeKind::Namespace, "", n.name.as_str()),
            KubeObject::Secret(s) => (KubeKind::Secret, s.namespace.as_str(), s.name.as_str()),
        };
        KubeKey { kind, namespace: namespace.to_string(), name: name.to_string() }
    }
}

/// Every Kubernetes registry object by key, in key order. A persistent map: a snapshot's copy is
/// O(1) and shares structure with the state it came from (tens of thousands of Pods are not
/// copied per snapshot), and a diff skips the shared parts. Values are shared too.
pub type KubeObjects = imbl::OrdMap<KubeKey, Arc<KubeObject>>;
