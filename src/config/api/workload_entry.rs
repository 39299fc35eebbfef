//! `WorkloadEntry` (networking.istio.io): a non-Kubernetes workload.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::common::Labels;

/// The `spec` of a WorkloadEntry (also a ServiceEntry's inline endpoint).
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct WorkloadEntry {
    /// IP, hostname or `unix://` socket.
    pub address: String,
    /// Port overrides by service port name.
    pub ports: BTreeMap<String, u32>,
    /// Labels.
    pub labels: Labels,
    /// Network name.
    pub network: String,
    /// Locality `region/zone/subzone`.
    pub locality: String,
    /// Load-balancing weight.
    pub weight: Option<u32>,
    /// Service account.
    pub service_account: String,
}
