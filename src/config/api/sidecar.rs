//! `Sidecar` (networking.istio.io): what a sidecar proxy sees and how it listens.

use serde::{Deserialize, Serialize};

use super::common::{Port, WorkloadSelector};
use super::destination_rule::ConnectionPoolSettings;

/// The `spec` of a Sidecar.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct Sidecar {
    /// Workloads this applies to; none means the whole namespace.
    pub workload_selector: Option<WorkloadSelector>,
    /// Inbound listeners (accepted).
    pub ingress: Vec<serde_json::Value>,
    /// Outbound listeners and the hosts visible through them.
    pub egress: Vec<IstioEgressListener>,
    /// Outbound policy for unknown destinations.
    pub outbound_traffic_policy: Option<OutboundTrafficPolicy>,
    /// Inbound connection pool (accepted).
    pub inbound_connection_pool: Option<serde_json::Value>,
    /// Inbound TLS (accepted).
    pub inbound_tls: Option<serde_json::Value>,
}

/// An egress listener of a Sidecar.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct IstioEgressListener {
    /// Port to listen on; none means the catch-all.
    pub port: Option<Port>,
    /// Address to bind to (or `unix://`).
    pub bind: String,
    /// DEFAULT, IPTABLES or NONE.
    pub capture_mode: Option<CaptureMode>,
    /// Visible hosts as `namespace/dnsName`.
    pub hosts: Vec<String>,
}

/// How traffic reaches a listener.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum CaptureMode {
    /// Environment default.
    Default,
    /// Redirected by iptables.
    Iptables,
    /// Applications connect to the listener directly.
    None,
}

/// Outbound traffic policy.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct OutboundTrafficPolicy {
    /// REGISTRY_ONLY or ALLOW_ANY.
    pub mode: Option<OutboundMode>,
    /// Egress proxy (accepted).
    pub egress_proxy: Option<serde_json::Value>,
}

/// Outbound mode.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum OutboundMode {
    /// Only registered services are reachable.
    RegistryOnly,
    /// Unknown destinations pass through.
    AllowAny,
}

/// An ingress listener of a Sidecar, as generation reads it. The spec keeps ingress listeners
/// loosely typed so validation can report each field; this reads the fields generation uses.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct IstioIngressListener {
    /// Port the workload is reached on (number, protocol, name).
    pub port: Option<Port>,
    /// Address a bound listener binds to (default: the wildcard).
    pub bind: String,
    /// DEFAULT, IPTABLES or NONE.
    pub capture_mode: Option<CaptureMode>,
    /// Where traffic goes: `127.0.0.1:PORT`, `0.0.0.0:PORT` (the workload's IP), `unix://PATH`, or
    /// empty for the original destination.
    pub default_endpoint: String,
    /// Connection pool of this port's inbound cluster.
    pub connection_pool: Option<ConnectionPoolSettings>,
    /// TLS the port terminates instead of mesh mutual TLS.
    pub tls: Option<super::gateway::ServerTlsSettings>,
}

impl Sidecar {
    /// The ingress listeners that read as Istio's type (validation rejected the others).
    pub fn ingress_listeners(&self) -> Vec<IstioIngressListener> {
        self.ingress.iter().filter_map(|v| serde_json::from_value(v.clone()).ok()).collect()
    }

    /// The connection pool of the inbound cluster of `port`: its ingress listener's, else the
    /// Sidecar's `inboundConnectionPool` (Istio's precedence).
    pub fn inbound_connection_pool(&self, port: u16) -> Option<ConnectionPoolSettings> {
        let own = self
            .ingress_listeners()
            .into_iter()
            .find(|l| l.port.as_ref().is_some_and(|p| p.number == u32::from(port)))
            .and_then(|l| l.connection_pool);
        own.or_else(|| self.inbound_connection_pool.clone().and_then(|v| serde_json::from_value(v).ok()))
    }
}
