//! Mesh-wide settings (Istio's MeshConfig): the fields that shape xDS.

mod extension_provider;
mod label_selector;
mod networks;
mod proxy_tracing;

use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::config::api::destination_rule::LocalityLbSetting;
use crate::config::api::sidecar::OutboundMode;
use crate::config::api::Duration;
use crate::config::validation::{check_duration, check_duration_above, check_locality_lb_setting};

/// pilot's default `--domain`: the DNS suffix of Kubernetes service names.
pub const DEFAULT_DOMAIN: &str = "cluster.local";
pub use extension_provider::{
    check_status, ExtAuthz, ExtAuthzGrpcProvider, ExtAuthzHttpProvider, ExtensionProvider, RequestBody,
};
pub use label_selector::{LabelSelector, LabelSelectorRequirement};
pub use networks::{MeshNetworks, Network, NetworkEndpoints, NetworkGateway};
pub use proxy_tracing::{CustomTag, ProxyDefaults, ProxyTracing, Sampling, MAX_NODE_CUSTOM_TAGS};

/// The MeshConfig fields meshpilot uses; other fields of Istio's MeshConfig are accepted and ignored.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct MeshConfig {
    /// SPIFFE trust domain.
    pub trust_domain: String,
    /// Namespace whose config applies mesh-wide.
    pub root_namespace: String,
    /// Default upstream connect timeout.
    pub connect_timeout: Duration,
    /// What happens to traffic for unknown destinations.
    pub outbound_traffic_policy: OutboundTrafficPolicy,
    /// Default `exportTo` of services.
    pub default_service_export_to: Vec<String>,
    /// Default `exportTo` of VirtualServices.
    pub default_virtual_service_export_to: Vec<String>,
    /// Default `exportTo` of DestinationRules.
    pub default_destination_rule_export_to: Vec<String>,
    /// DNS refresh rate of DNS clusters.
    pub dns_refresh_rate: Duration,
    /// Access log file for proxies (empty: none).
    pub access_log_file: String,
    /// Namespaces in scope: those whose labels match any selector (empty: every namespace).
    pub discovery_selectors: Vec<LabelSelector>,
    /// Auto mTLS: clusters without DestinationRule TLS use ISTIO_MUTUAL to workloads with a sidecar.
    pub enable_auto_mtls: bool,
    /// Mesh-wide locality load balancing, for DestinationRules that set none (Istio's default:
    /// enabled, which turns on failover wherever outlier detection is set).
    pub locality_lb_setting: Option<LocalityLbSetting>,
    /// Extension providers: the external authorizers CUSTOM AuthorizationPolicies name (and
    /// providers of other kinds, read for their name only).
    pub extension_providers: Vec<ExtensionProvider>,
    /// Whether HTTP connection managers trace (Istio's default: yes), as the proxy's ProxyConfig
    /// `tracing` says.
    pub enable_tracing: bool,
    /// The ProxyConfig of proxies that send none (`defaultConfig`).
    pub default_config: ProxyDefaults,
    /// DNS suffix of Kubernetes service names (`name.namespace.svc.<domain>`): pilot's `--domain`
    /// flag, not a MeshConfig field, set by the sources.
    #[serde(skip)]
    pub domain: String,
    /// Hash of the mesh config document, set by the loader (part of the snapshot's identity).
    #[serde(skip)]
    pub source_hash: u64,
}

/// MeshConfig's outbound traffic policy.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct OutboundTrafficPolicy {
    /// REGISTRY_ONLY or ALLOW_ANY.
    pub mode: OutboundMode,
}

impl Default for MeshConfig {
    fn default() -> Self {
        let all = || vec!["*".to_string()];
        MeshConfig {
            trust_domain: "cluster.local".into(),
            root_namespace: "istio-system".into(),
            connect_timeout: Duration(std::time::Duration::from_secs(10)),
            outbound_traffic_policy: OutboundTrafficPolicy { mode: OutboundMode::AllowAny },
            default_service_export_to: all(),
            default_virtual_service_export_to: all(),
            default_destination_rule_export_to: all(),
            dns_refresh_rate: Duration(std::time::Duration::from_secs(60)),
            access_log_file: String::new(),
            discovery_selectors: Vec::new(),
            enable_auto_mtls: true,
            locality_lb_setting: Some(LocalityLbSetting { enabled: Some(true), ..Default::default() }),
            extension_providers: Vec::new(),
            enable_tracing: true,
            default_config: ProxyDefaults::default(),
            domain: DEFAULT_DOMAIN.into(),
            source_hash: 0,
        }
    }
}

/// Why a mesh config file could not be used.
#[derive(Debug, thiserror::Error)]
pub enum MeshConfigError {
    /// The file could not be read.
    #[error("reading mesh config {path}: {source}")]
    Read {
        /// File.
        path: String,
        /// Cause.
        source: std::io::Error,
    },
    /// The file is not a valid MeshConfig.
    #[error("mesh config {path}: {reason}")]
    Invalid {
        /// File.
        path: String,
        /// Cause, with the field path.
        reason: String,
    },
    /// A field parsed but holds a value Envoy would refuse (so every cluster update would be NACKed).
    #[error("mesh config {path}: {field}: {reason}")]
    Field {
        /// File.
        path: String,
        /// Field path, e.g. `connectTimeout` (`data.mesh.connectTimeout` in the ConfigMap shape).
        field: String,
        /// Why the value is refused.
        reason: String,
    },
}

impl MeshConfig {
    /// Parses MeshConfig YAML (the `mesh` key of Istio's ConfigMap, or the MeshConfig itself).
    pub fn parse(path: &str, text: &str) -> Result<MeshConfig, MeshConfigError> {
        let invalid = |reason: String| MeshConfigError::Invalid { path: path.to_string(), reason };
        let mut value: serde_json::Value = if text.trim().is_empty() {
            serde_json::Value::Object(Default::default())
        } else {
            serde_saphyr::from_str(text).map_err(|e| invalid(e.to_string()))?
        };
        // Accept Istio's `istio` ConfigMap shape: `data.mesh` holds the MeshConfig as a string.
        let mut prefix = "";
        if let Some(embedded) = value.pointer("/data/mesh").and_then(|v| v.as_str()) {
            value = serde_saphyr::from_str(embedded).map_err(|e| invalid(format!("data.mesh: {e}")))?;
            prefix = "data.mesh.";
        }
        if value.is_null() {
            value = serde_json::Value::Object(Default::default());
        }
        let mut mesh: MeshConfig =
            serde_path_to_error::deserialize(value).map_err(|e| invalid(format!("{}: {}", e.path(), e.inner())))?;
        if let Err((field, reason)) = mesh.validate() {
            return Err(MeshConfigError::Field { path: path.to_string(), field: format!("{prefix}{field}"), reason });
        }
        mesh.source_hash = fnv(text.as_bytes());
        Ok(mesh)
    }

    /// Checks the fields Envoy constrains, against the `(validate.rules)` of the Envoy field each
    /// becomes (see `config::validation`'s duration table), and the discovery selectors as the
    /// Kubernetes API server would: the first offending field and why.
    fn validate(&self) -> Result<(), (String, String)> {
        check_duration(self.connect_timeout).map_err(|reason| ("connectTimeout".to_string(), reason))?;
        // `Cluster.dns_refresh_rate` is `gt {nanos: 1000000}`: 1ms itself is refused.
        check_duration_above(self.dns_refresh_rate, std::time::Duration::from_millis(1))
            .map_err(|reason| ("dnsRefreshRate".to_string(), reason))?;
        if let Some(setting) = &self.locality_lb_setting {
            check_locality_lb_setting("localityLbSetting", setting)?;
        }
        for (i, selector) in self.discovery_selectors.iter().enumerate() {
            selector.validate().map_err(|(field, reason)| (format!("discoverySelectors[{i}].{field}"), reason))?;
        }
        if let Some(tracing) = &self.default_config.tracing {
            tracing.validate().map_err(|(field, reason)| (format!("defaultConfig.tracing.{field}"), reason))?;
        }
        extension_provider::validate(&self.extension_providers)
    }

    /// Reads and parses a mesh config file.
    pub fn load(path: &Path) -> Result<MeshConfig, MeshConfigError> {
        let shown = path.display().to_string();
        let text =
            std::fs::read_to_string(path).map_err(|source| MeshConfigError::Read { path: shown.clone(), source })?;
        MeshConfig::parse(&shown, &text)
    }
}

fn fnv(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, b| (h ^ u64::from(*b)).wrapping_mul(0x100_0000_01b3))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_match_istio() {
        let m = MeshConfig::parse("m", "").unwrap();
        assert_eq!(m.trust_domain, "cluster.local");
        assert_eq!(m.root_namespace, "istio-system");
        assert_eq!(m.connect_timeout.as_std().as_secs(), 10);
        assert_eq!(m.outbound_traffic_policy.mode, OutboundMode::AllowAny);
    }

    #[test]
    fn reads_fields_and_ignores_unknown_ones() {
        let m = MeshConfig::parse(
            "m",
            "trustDomain: example.org\nconnectTimeout: 2s\noutboundTrafficPolicy: {mode: REGISTRY_ONLY}\nenableTracing: true\n",
        )
        .unwrap();
        assert_eq!(m.trust_domain, "example.org");
        assert_eq!(m.connect_timeout.as_std().as_secs(), 2);
        assert_eq!(m.outbound_traffic_policy.mode, OutboundMode::RegistryOnly);
    }

    #[test]
    fn reports_the_bad_field() {
        let err = MeshConfig::parse("m.yaml", "connectTimeout: soon\n").unwrap_err().to_string();
        assert!(err.contains("m.yaml") && err.contains("connectTimeout"), "{err}");
    }

    #[test]
    fn durations_envoy_refuses_are_rejected_with_their_field() {
        for (text, field, reason) in [
            ("connectTimeout: 0s\n", "connectTimeout", "greater than 1ms"),
            ("connectTimeout: 0.5ms\n", "connectTimeout", "greater than 1ms"),
            ("dnsRefreshRate: 0.5ms\n", "dnsRefreshRate", "greater than 1ms"),
            ("dnsRefreshRate: 1ms\n", "dnsRefreshRate", "must be greater than 1ms"),
            ("data:\n  mesh: |\n    connectTimeout: 0s\n", "data.mesh.connectTimeout", "greater than 1ms"),
            ("defaultConfig:\n  tracing:\n    sampling: -1\n", "defaultConfig.tracing.sampling", "not a percentage"),
        ] {
            match MeshConfig::parse("m.yaml", text) {
                Err(MeshConfigError::Field { path, field: f, reason: r }) => {
                    assert_eq!((path.as_str(), f.as_str()), ("m.yaml", field), "{text}");
                    assert!(r.contains(reason), "{text}: {r}");
                }
                other => panic!("{text}: expected a field error, got {other:?}"),
            }
        }
        let m = MeshConfig::parse("m", "connectTimeout: 1ms\ndnsRefreshRate: 2ms\n").unwrap();
        assert_eq!(m.dns_refresh_rate.as_std().as_millis(), 2);
    }

    #[test]
    fn discovery_selectors_are_read_and_validated_with_their_path() {
        let m = MeshConfig::parse(
            "m",
            "discoverySelectors:\n- matchLabels: {istio-discovery: enabled}\n- matchExpressions: [{key: env, operator: In, values: [prod]}]\n",
        )
        .unwrap();
        assert_eq!(m.discovery_selectors.len(), 2);
        assert_eq!(m.discovery_selectors[1].match_expressions[0].operator, "In");
        let text = "discoverySelectors:\n- matchLabels: {a: b}\n- matchExpressions: [{key: env, operator: Has}]\n";
        match MeshConfig::parse("m.yaml", text) {
            Err(MeshConfigError::Field { field, reason, .. }) => {
                assert_eq!(field, "discoverySelectors[1].matchExpressions[0].operator");
                assert!(reason.contains("Unsupported value"), "{reason}");
            }
            other => panic!("expected a field error, got {other:?}"),
        }
    }

    #[test]
    fn extension_providers_are_read_and_bad_ones_reported_with_their_path() {
        let text = "extensionProviders:\n- name: opa\n  envoyExtAuthzGrpc: {service: opa.authz.svc.cluster.local, port: 9191}\n- name: otel\n  opentelemetry: {service: otel.svc, port: 4317}\n";
        let m = MeshConfig::parse("m", text).unwrap();
        assert_eq!(m.extension_providers.len(), 2);
        assert!(matches!(m.extension_providers[0].ext_authz(), Some(ExtAuthz::Grpc(g)) if g.port == 9191));
        assert!(m.extension_providers[1].ext_authz().is_none());
        let bad = "data:\n  mesh: |\n    extensionProviders:\n    - name: opa\n      envoyExtAuthzHttp: {service: opa, port: 70000}\n";
        match MeshConfig::parse("m.yaml", bad) {
            Err(MeshConfigError::Field { field, reason, .. }) => {
                assert_eq!(field, "data.mesh.extensionProviders[0].envoyExtAuthzHttp.port");
                assert!(reason.contains("1..65535"), "{reason}");
            }
            other => panic!("expected a field error, got {other:?}"),
        }
        let wrong_type =
            MeshConfig::parse("m.yaml", "extensionProviders:\n- name: a\n  envoyExtAuthzGrpc: {port: many}\n");
        let err = wrong_type.unwrap_err().to_string();
        assert!(err.contains("extensionProviders[0].envoyExtAuthzGrpc.port"), "{err}");
    }

    #[test]
    fn extension_providers_survive_the_serde_form_replication_sends() {
        let text = "extensionProviders:\n- name: a\n  envoyExtAuthzHttp: {service: a.ns.svc, port: 80, timeout: 1.5s, failOpen: true, includeAdditionalHeadersInCheck: {x-a: b}, includeRequestBodyInCheck: {maxRequestBytes: 9}}\n- name: b\n  envoyExtAuthzGrpc: {service: ns/b.ns.svc, port: 90, statusOnError: '503'}\n- name: c\n  zipkin: {}\n";
        let m = MeshConfig::parse("m", text).unwrap();
        let back: MeshConfig = serde_json::from_value(serde_json::to_value(&m).unwrap()).unwrap();
        assert_eq!(back.extension_providers, m.extension_providers);
        assert!(
            matches!(back.extension_providers[0].ext_authz(), Some(ExtAuthz::Http(h)) if h.timeout.map(|t| t.as_std().as_millis()) == Some(1500))
        );
    }

    #[test]
    fn accepts_the_istio_configmap_shape() {
        let m =
            MeshConfig::parse("m", "apiVersion: v1\nkind: ConfigMap\ndata:\n  mesh: |\n    rootNamespace: mesh-root\n")
                .unwrap();
        assert_eq!(m.root_namespace, "mesh-root");
    }

    /// The `config` fuzz target's seeds through the mesh config parser (see
    /// `config::fuzz_seeds`): none panics, and the mesh config seed is one.
    #[test]
    fn config_fuzz_seeds_replay_through_the_mesh_config_parser() {
        for (name, data) in crate::config::fuzz_seeds::seeds("config") {
            let mesh = MeshConfig::parse("mesh.yaml", &String::from_utf8_lossy(&data));
            if name == "seed-mesh.yaml" {
                assert!(mesh.is_ok(), "{name}: {mesh:?}");
            }
        }
    }
}
