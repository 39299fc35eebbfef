//! `Gateway` (networking.istio.io): ports and hosts a gateway proxy listens for.

use serde::{Deserialize, Serialize};

use super::common::{Labels, Port};

/// The `spec` of a Gateway.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct Gateway {
    /// Labels of the gateway workloads this applies to.
    pub selector: Labels,
    /// Servers (port + hosts + TLS).
    pub servers: Vec<Server>,
}

/// One server of a Gateway.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct Server {
    /// Port to listen on.
    pub port: Option<Port>,
    /// Address to bind to.
    pub bind: String,
    /// Hosts exposed (`ns/host` or `host`).
    pub hosts: Vec<String>,
    /// TLS settings.
    pub tls: Option<ServerTlsSettings>,
    /// Default endpoint (accepted).
    pub default_endpoint: String,
    /// Server name.
    pub name: String,
}

/// Server TLS settings.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct ServerTlsSettings {
    /// Redirect HTTP to HTTPS.
    pub https_redirect: bool,
    /// PASSTHROUGH, SIMPLE, MUTUAL, AUTO_PASSTHROUGH, ISTIO_MUTUAL, OPTIONAL_MUTUAL.
    pub mode: Option<String>,
    /// Certificate file.
    pub server_certificate: String,
    /// Key file.
    pub private_key: String,
    /// CA file.
    pub ca_certificates: String,
    /// CRL file.
    pub ca_crl: String,
    /// Secret name.
    pub credential_name: String,
    /// Several secret names.
    pub credential_names: Vec<String>,
    /// SANs.
    pub subject_alt_names: Vec<String>,
    /// SPKI pins.
    pub verify_certificate_spki: Vec<String>,
    /// Cert hash pins.
    pub verify_certificate_hash: Vec<String>,
    /// Min TLS version.
    pub min_protocol_version: Option<String>,
    /// Max TLS version.
    pub max_protocol_version: Option<String>,
    /// Cipher suites.
    pub cipher_suites: Vec<String>,
    /// Several certificates (accepted).
    pub tls_certificates: Vec<serde_json::Value>,
}
