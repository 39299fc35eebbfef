//! What a proxy's spans say about it: the literal tags istiod puts on every HTTP connection
//! manager (canonical service and revision, namespace, mesh, cluster) and the tracing section of
//! the ProxyConfig the node sent, if it sent one.

use serde::Serialize;

use crate::config::api::Labels;
use crate::mesh::ProxyTracing;

/// The label naming a workload's canonical service.
const CANONICAL_NAME_LABEL: &str = "service.istio.io/canonical-name";
/// The label naming a workload's canonical revision.
const CANONICAL_REVISION_LABEL: &str = "service.istio.io/canonical-revision";

/// A proxy's tracing identity, part of its view (proxies of different workloads tag their spans
/// differently, so they no longer share a connection manager once tracing is on).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub struct TraceIdentity {
    /// Canonical service (`unknown` without the label).
    pub canonical_service: String,
    /// Canonical revision (`latest` without the label).
    pub canonical_revision: String,
    /// Namespace (`default` without one).
    pub namespace: String,
    /// Mesh id (`unknown` without metadata MESH_ID).
    pub mesh_id: String,
    /// Cluster id (`unknown` without metadata CLUSTER_ID).
    pub cluster_id: String,
    /// The tracing section of the node's PROXY_CONFIG: `Some` whenever the node sent a
    /// PROXY_CONFIG (an empty section when it had none), which then replaces the mesh's
    /// `defaultConfig`, as in istiod.
    pub node_tracing: Option<ProxyTracing>,
}

impl TraceIdentity {
    /// The identity of a proxy with these labels and metadata, with istiod's defaults for what
    /// is missing.
    pub fn new(
        labels: &Labels,
        namespace: &str,
        mesh_id: &str,
        cluster_id: Option<&str>,
        node_tracing: Option<ProxyTracing>,
    ) -> TraceIdentity {
        let or = |value: Option<&str>, default: &str| value.filter(|v| !v.is_empty()).unwrap_or(default).to_string();
        TraceIdentity {
            canonical_service: or(labels.get(CANONICAL_NAME_LABEL).map(String::as_str), "unknown"),
            canonical_revision: or(labels.get(CANONICAL_REVISION_LABEL).map(String::as_str), "latest"),
            namespace: or(Some(namespace), "default"),
            mesh_id: or(Some(mesh_id), "unknown"),
            cluster_id: or(cluster_id, "unknown"),
            node_tracing,
        }
    }
}
