//! `PeerAuthentication` (security.istio.io v1, v1beta1): which mutual TLS a workload accepts.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::common::WorkloadSelector;

/// The `spec` of a PeerAuthentication.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct PeerAuthentication {
    /// Workloads this applies to; none means the whole namespace (or mesh, in the root namespace).
    pub selector: Option<WorkloadSelector>,
    /// The mode for every port not listed in `portLevelMtls`.
    pub mtls: Option<MutualTls>,
    /// Modes by workload (target) port; `None` when the field is absent (Istio tells an empty map
    /// from an absent one).
    pub port_level_mtls: Option<BTreeMap<u32, MutualTls>>,
}

/// A `mtls` setting.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct MutualTls {
    /// The mode.
    pub mode: MtlsMode,
}

/// Istio's peer authentication modes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "UPPERCASE")]
pub enum MtlsMode {
    /// Inherit from the parent (namespace, then mesh); PERMISSIVE at the top.
    #[default]
    Unset,
    /// Plaintext only.
    Disable,
    /// Both mutual TLS and plaintext.
    Permissive,
    /// Mutual TLS only.
    Strict,
}

impl MutualTls {
    /// The mode, `None` when it inherits.
    pub fn set_mode(setting: Option<&MutualTls>) -> Option<MtlsMode> {
        setting.map(|m| m.mode).filter(|m| *m != MtlsMode::Unset)
    }
}

impl PeerAuthentication {
    /// The selector's labels; empty for a namespace- or mesh-wide policy.
    pub fn selector_labels(&self) -> Option<&super::Labels> {
        self.selector.as_ref().map(|s| &s.match_labels).filter(|l| !l.is_empty())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn port_keys_and_modes_parse_as_istio_writes_them() {
        let pa: PeerAuthentication = serde_json::from_value(serde_json::json!({
            "selector": {"matchLabels": {"app": "a"}},
            "mtls": {"mode": "STRICT"},
            "portLevelMtls": {"8080": {"mode": "DISABLE"}, "9090": {}}
        }))
        .unwrap();
        assert_eq!(MutualTls::set_mode(pa.mtls.as_ref()), Some(MtlsMode::Strict));
        let ports = pa.port_level_mtls.unwrap();
        assert_eq!(ports[&8080].mode, MtlsMode::Disable);
        assert_eq!(ports[&9090].mode, MtlsMode::Unset);
        assert!(serde_json::from_value::<PeerAuthentication>(serde_json::json!({"mtls": {"mode": "ON"}})).is_err());
    }
}
