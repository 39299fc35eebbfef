//! `ServiceEntry` (networking.istio.io): services added to the mesh's registry.

use serde::{Deserialize, Deserializer, Serialize};

use super::common::{Port, WorkloadSelector};
use super::workload_entry::WorkloadEntry;

/// The `spec` of a ServiceEntry.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct ServiceEntry {
    /// Hostnames.
    pub hosts: Vec<String>,
    /// Virtual IPs / CIDRs.
    #[serde(deserialize_with = "flow_strings")]
    pub addresses: Vec<String>,
    /// Ports.
    pub ports: Vec<Port>,
    /// Inside or outside the mesh.
    pub location: Option<Location>,
    /// How endpoints are found.
    pub resolution: Option<Resolution>,
    /// Inline endpoints.
    pub endpoints: Vec<WorkloadEntry>,
    /// WorkloadEntries (and pods) selected as endpoints.
    pub workload_selector: Option<WorkloadSelectorLabels>,
    /// Namespaces the service is visible to.
    pub export_to: Vec<String>,
    /// SANs.
    pub subject_alt_names: Vec<String>,
}

/// ServiceEntry's selector (`labels`, unlike Sidecar's `matchLabels`... both spellings are Istio's).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct WorkloadSelectorLabels {
    /// Labels.
    #[serde(default)]
    pub labels: super::common::Labels,
}

impl From<WorkloadSelectorLabels> for WorkloadSelector {
    fn from(s: WorkloadSelectorLabels) -> Self {
        WorkloadSelector { match_labels: s.labels }
    }
}

/// ServiceEntry location.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum Location {
    /// Outside the mesh (no mTLS).
    MeshExternal,
    /// Part of the mesh.
    MeshInternal,
}

/// ServiceEntry resolution.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum Resolution {
    /// Forward to the original destination.
    None,
    /// Use the given endpoint IPs.
    Static,
    /// Resolve endpoint hostnames (or the hosts) with DNS, all answers used.
    Dns,
    /// Resolve with DNS, one address used.
    DnsRoundRobin,
}

/// Reads a list of strings, keeping an unquoted `2001:db8::` in a flow sequence a string.
///
/// YAML 1.2 ends a plain scalar at a `:` that precedes `]` or `,` and reads `[2001:db8::]` as the map
/// `{"2001:db8:": null}`; Kubernetes' YAML reader (and so Istio) keeps the string, so we do too.
fn flow_strings<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Vec<String>, D::Error> {
    let items = Vec::<serde_json::Value>::deserialize(deserializer)?;
    items
        .into_iter()
        .enumerate()
        .map(|(i, item)| match item {
            serde_json::Value::String(text) => Ok(text),
            serde_json::Value::Object(map) if map.len() == 1 && map.values().all(serde_json::Value::is_null) => {
                Ok(map.keys().map(|key| format!("{key}:")).collect())
            }
            other => Err(serde::de::Error::custom(format!("[{i}]: invalid type: {other}, expected a string"))),
        })
        .collect()
}
