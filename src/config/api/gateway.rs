//! `Gateway` (networking.istio.io): ports and hosts a gateway proxy listens for.

use serde::{Deserialize, Serialize};

use super::common::{Labels, Port};

/// The `spec` of a Gateway.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Gateway {
    /// Labels of the gateway workloads this applies to.
    #[serde(default)]
    pub selector: Labels,
    /// Servers (port + hosts + TLS).
    #[serde(default)]
    pub servers: Vec<Server>,
}

/// One server of a Gateway.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Server {
    /// Port to listen on.
    #[serde(default)]
    pub port: Option<Port>,
    /// Address to bind to.
    #[serde(default)]
    pub bind: String,
    /// Hosts exposed (`ns/host` or `host`).
    #[serde(default)]
    pub hosts: Vec<String>,
    /// TLS settings.
    #[serde(default)]
    pub tls: Option<ServerTlsSettings>,
    /// Default endpoint (accepted).
    #[serde(default)]
    pub default_endpoint: String,
    /// Server name.
    #[serde(default)]
    pub name: String,
}

/// Server TLS settings.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ServerTlsSettings {
    /// Redirect HTTP to HTTPS.
    #[serde(default)]
    pub https_redirect: bool,
    /// PASSTHROUGH, SIMPLE, MUTUAL, AUTO_PASSTHROUGH, ISTIO_MUTUAL, OPTIONAL_MUTUAL.
    #[serde(default)]
    pub mode: Option<String>,
    /// Certificate file.
    #[serde(default)]
    pub server_certificate: String,
    /// Key file.
    #[serde(default)]
    pub private_key: String,
    /// CA file.
    #[serde(default)]
    pub ca_certificates: String,
    /// CRL file.
    #[serde(default)]
    pub ca_crl: String,
    /// Secret name.
    #[serde(default)]
    pub credential_name: String,
    /// Several secret names.
    #[serde(default)]
    pub credential_names: Vec<String>,
    /// SANs.
    #[serde(default)]
    pub subject_alt_names: Vec<String>,
    /// SPKI pins.
    #[serde(default)]
    pub verify_certificate_spki: Vec<String>,
    /// Cert hash pins.
    #[serde(default)]
    pub verify_certificate_hash: Vec<String>,
    /// Min TLS version.
    #[serde(default)]
    pub min_protocol_version: Option<String>,
    /// Max TLS version.
    #[serde(default)]
    pub max_protocol_version: Option<String>,
    /// Cipher suites.
    #[serde(default)]
    pub cipher_suites: Vec<String>,
    /// Several certificates (accepted).
    #[serde(default)]
    pub tls_certificates: Vec<serde_json::Value>,
}
