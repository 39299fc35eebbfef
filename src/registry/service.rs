//! Services and their endpoints, as xDS generation sees them.

use std::collections::BTreeMap;
use std::sync::Arc;

use serde::Serialize;

use super::kubernetes::KubeKey;
use super::{Hostname, Visibility};
use crate::config::api::{Labels, Protocol};
use crate::config::ConfigKey;

/// A port of a service.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize)]
pub struct ServicePort {
    /// Port name (endpoints map their ports by it).
    pub name: String,
    /// Service port number.
    pub number: u16,
    /// Application protocol.
    pub protocol: Protocol,
    /// Endpoint port when endpoints do not say otherwise.
    pub target_port: Option<u16>,
}

/// How a service's endpoints are found.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
pub enum Resolution {
    /// Endpoints are known IPs, delivered over EDS.
    Static,
    /// Endpoint hostnames (or the service host) resolved by the proxy, all addresses used.
    Dns,
    /// Resolved by the proxy, one address at a time.
    DnsRoundRobin,
    /// No endpoints: forward to the original destination address.
    Passthrough,
}

/// A service in the mesh registry.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize)]
pub struct Service {
    /// Hostname.
    pub hostname: Hostname,
    /// Namespace of the object that declared it.
    pub namespace: String,
    /// Ports, in declaration order.
    pub ports: Vec<ServicePort>,
    /// Virtual IPs or CIDRs.
    pub addresses: Vec<String>,
    /// Endpoint discovery.
    pub resolution: Resolution,
    /// Outside the mesh (MESH_EXTERNAL).
    pub mesh_external: bool,
    /// Namespaces it is exported to.
    pub visibility: Visibility,
    /// Object that declared it.
    pub origin: ServiceOrigin,
    /// Subject alternative names for TLS.
    pub subject_alt_names: Vec<String>,
}

/// The object a service comes from: an Istio config object or a Kubernetes Service.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize)]
pub enum ServiceOrigin {
    /// A ServiceEntry.
    Config(ConfigKey),
    /// A Kubernetes Service.
    Kube(KubeKey),
}

impl std::fmt::Display for ServiceOrigin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ServiceOrigin::Config(key) => key.fmt(f),
            ServiceOrigin::Kube(key) => key.fmt(f),
        }
    }
}

impl Service {
    /// The port with this number.
    pub fn port(&self, number: u16) -> Option<&ServicePort> {
        self.ports.iter().find(|p| p.number == number)
    }
}

/// Identifies a service: hostname within a namespace (the same host may be declared in several).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub struct ServiceKey {
    /// Hostname.
    pub hostname: Hostname,
    /// Namespace.
    pub namespace: String,
}

/// Health of an endpoint, as Istio derives it from EndpointSlice conditions.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize)]
pub enum EndpointHealth {
    /// Ready: receives traffic.
    #[default]
    Healthy,
    /// Not ready: sent to Envoy as UNHEALTHY (it counts in the healthy-host percentage), or left
    /// out where outlier detection's `minHealthPercent` would route to it in panic mode.
    Unhealthy,
    /// Shutting down but still serving, on a persistent-session service: sent as DRAINING so
    /// existing sessions finish.
    Draining,
    /// Shutting down: never sent (it would lower the healthy percentage during every rollout).
    Terminating,
}

/// A workload instance serving a service.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize)]
pub struct Endpoint {
    /// IP address, hostname (DNS resolution) or `unix://` path.
    pub address: String,
    /// Port overrides by service port name.
    pub ports: BTreeMap<String, u16>,
    /// Whether the endpoint serves only the ports in `ports` (Kubernetes endpoints: a pod without
    /// a named target port is not an endpoint of that port); otherwise other ports fall back to
    /// the service's target port or number (WorkloadEntries).
    pub listed_ports_only: bool,
    /// Labels (subsets select on these).
    pub labels: Labels,
    /// `region/zone/subzone`.
    pub locality: String,
    /// Network.
    pub network: String,
    /// Load-balancing weight (≥ 1).
    pub weight: u32,
    /// Service account.
    pub service_account: String,
    /// Health.
    pub health: EndpointHealth,
}

impl Endpoint {
    /// The port this endpoint serves `port` on, or `None` if it does not serve that port.
    pub fn port_for(&self, port: &ServicePort) -> Option<u16> {
        match self.ports.get(&port.name) {
            Some(p) => Some(*p),
            None if self.listed_ports_only => None,
            None => Some(port.target_port.unwrap_or(port.number)),
        }
    }

    /// Whether the endpoint carries every label of `selector`.
    pub fn matches(&self, selector: &Labels) -> bool {
        selector.iter().all(|(k, v)| self.labels.get(k) == Some(v))
    }
}

/// Endpoints of one service, shared between snapshots while unchanged.
pub type Endpoints = Arc<Vec<Endpoint>>;
