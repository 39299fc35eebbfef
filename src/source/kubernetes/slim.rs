//! API objects decoded with only the fields the registry reads. serde skips the rest of the
//! JSON without allocating it: a served Pod is kilobytes (its spec, status and managedFields),
//! the fields kept a few hundred bytes, so a watch of ten thousand pods allocates a tenth as
//! much, and leaves the allocator far less to hold on to.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use k8s_openapi::{Metadata, NamespaceResourceScope, Resource};
use serde::{Deserialize, Deserializer};

/// A Pod: identity, labels, node, service account, named container ports, IPs and readiness.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct SlimPod {
    /// Metadata: name, namespace, labels, resourceVersion, uid and deletionTimestamp only.
    #[serde(deserialize_with = "slim_meta", default)]
    pub metadata: ObjectMeta,
    /// `spec`.
    #[serde(default)]
    pub spec: Option<SlimPodSpec>,
    /// `status`.
    #[serde(default)]
    pub status: Option<SlimPodStatus>,
}

/// The parts of a Pod's `spec` the registry reads.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SlimPodSpec {
    /// `containers` (their ports only).
    #[serde(default)]
    pub containers: Vec<SlimContainer>,
    /// `serviceAccountName`.
    pub service_account_name: Option<String>,
    /// `nodeName`.
    pub node_name: Option<String>,
}

/// A container, reduced to its ports.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct SlimContainer {
    /// `ports`.
    pub ports: Option<Vec<SlimContainerPort>>,
}

/// A container port.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SlimContainerPort {
    /// `name`.
    pub name: Option<String>,
    /// `containerPort`.
    #[serde(default)]
    pub container_port: i32,
}

/// The parts of a Pod's `status` the registry reads.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SlimPodStatus {
    /// `podIP`.
    #[serde(rename = "podIP")]
    pub pod_ip: Option<String>,
    /// `podIPs`.
    #[serde(rename = "podIPs")]
    pub pod_ips: Option<Vec<SlimPodIp>>,
    /// `conditions`.
    pub conditions: Option<Vec<SlimCondition>>,
}

/// One of `status.podIPs`.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct SlimPodIp {
    /// `ip`.
    #[serde(default)]
    pub ip: String,
}

/// One of `status.conditions`: its type and status.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct SlimCondition {
    /// `type`.
    #[serde(rename = "type", default)]
    pub type_: String,
    /// `status`.
    #[serde(default)]
    pub status: String,
}

impl Resource for SlimPod {
    const API_VERSION: &'static str = "v1";
    const GROUP: &'static str = "";
    const KIND: &'static str = "Pod";
    const VERSION: &'static str = "v1";
    const URL_PATH_SEGMENT: &'static str = "pods";
    type Scope = NamespaceResourceScope;
}

impl Metadata for SlimPod {
    type Ty = ObjectMeta;

    fn metadata(&self) -> &ObjectMeta {
        &self.metadata
    }

    fn metadata_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

/// The metadata fields the source and the watcher read; annotations and managedFields are skipped.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct SlimMeta {
    name: Option<String>,
    namespace: Option<String>,
    labels: Option<BTreeMap<String, String>>,
    resource_version: Option<String>,
    uid: Option<String>,
    deletion_timestamp: Option<Time>,
}

fn slim_meta<'de, D: Deserializer<'de>>(deserializer: D) -> Result<ObjectMeta, D::Error> {
    let m = SlimMeta::deserialize(deserializer)?;
    Ok(ObjectMeta {
        name: m.name,
        namespace: m.namespace,
        labels: m.labels,
        resource_version: m.resource_version,
        uid: m.uid,
        deletion_timestamp: m.deletion_timestamp,
        ..ObjectMeta::default()
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_served_pod_keeps_what_the_registry_reads_and_drops_the_rest() {
        let pod: SlimPod = serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {
                "name": "reviews-1", "namespace": "shop", "uid": "u-1", "resourceVersion": "42",
                "labels": {"app": "reviews"}, "annotations": {"big": "x"},
                "managedFields": [{"manager": "kubelet", "fieldsV1": {"f:status": {}}}],
                "deletionTimestamp": "2026-01-01T00:00:00Z"
            },
            "spec": {"nodeName": "n1", "serviceAccountName": "sa",
                     "containers": [{"name": "app", "image": "i", "env": [{"name": "A", "value": "b"}],
                                     "ports": [{"name": "http", "containerPort": 8080}]}]},
            "status": {"podIP": "10.0.0.1", "podIPs": [{"ip": "10.0.0.1"}],
                       "conditions": [{"type": "Ready", "status": "True", "lastTransitionTime": null}]}
        }))
        .expect("a pod decodes");
        assert_eq!(pod.metadata.name.as_deref(), Some("reviews-1"));
        assert_eq!(pod.metadata.resource_version.as_deref(), Some("42"));
        assert!(pod.metadata.deletion_timestamp.is_some());
        assert!(pod.metadata.annotations.is_none() && pod.metadata.managed_fields.is_none());
        let spec = pod.spec.expect("spec");
        assert_eq!(spec.containers[0].ports.as_ref().map(|p| p[0].container_port), Some(8080));
        let status = pod.status.expect("status");
        assert_eq!(status.conditions.map(|c| c[0].type_.clone()), Some("Ready".into()));
    }
}
