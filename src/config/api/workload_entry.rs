//! `WorkloadEntry` (networking.istio.io): a non-Kubernetes workload.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::common::Labels;

/// The `spec` of a WorkloadEntry (also a ServiceEntry's inline endpoint).
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct WorkloadEntry {
    /// IP, hostname or `unix://` socket.
    #[serde(default)]
    pub address: String,
    /// Port overrides by service port name.
    #[serde(default)]
    pub ports: BTreeMap<String, u32>,
    /// Labels.
    #[serde(default)]
    pub labels: Labels,
    /// Network name.
    #[serde(default)]
    pub network: String,
    /// Locality `region/zone/subzone`.
    #[serde(default)]
    pub locality: String,
    /// Load-balancing weight.
    #[serde(default)]
    pub weight: Option<u32>,
    /// Service account.
    #[serde(default)]
    pub service_account: String,
}
