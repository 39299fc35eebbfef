//! Services and their endpoints, as xDS generation sees them.

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
    /// Another name of the service `alias_of` names (a Kubernetes ExternalName Service, as
    /// istiod's ExternalName alias takes it): no config of its own; its name joins the concrete
    /// service's virtual hosts, and DNS takes clients to the target otherwise.
    Alias,
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
    /// The host an [`Resolution::Alias`] service names.
    pub alias_of: Option<Hostname>,
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

    /// Whether it passes connections to their original destination with no address of its own
    /// (a headless Kubernetes Service, a ServiceEntry of resolution NONE without addresses): its
    /// endpoints' addresses are what clients connect to.
    pub fn is_headless(&self) -> bool {
        self.resolution == Resolution::Passthrough && self.addresses.is_empty()
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

/// Labels Istio adds to an endpoint's workload labels, so subsets can select on them.
const REGION_LABEL: &str = "topology.kubernetes.io/region";
const ZONE_LABEL: &str = "topology.kubernetes.io/zone";
const SUBZONE_LABEL: &str = "topology.istio.io/subzone";
const HOSTNAME_LABEL: &str = "kubernetes.io/hostname";
/// Also a workload label of its own, which wins over the endpoint's network.
pub(super) const NETWORK_LABEL: &str = "topology.istio.io/network";

/// A workload instance serving a service.
///
/// Held once per pod and service port set, so it is kept small: the workload's labels are
/// shared with its Pod (or WorkloadEntry), and the topology labels Istio adds to them are read
/// off `locality`, `node` and `network` rather than stored per endpoint.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize)]
pub struct Endpoint {
    /// IP address, hostname (DNS resolution) or `unix://` path.
    pub address: String,
    /// Port overrides by service port name.
    pub ports: EndpointPorts,
    /// Whether the endpoint serves only the ports in `ports` (Kubernetes endpoints: a pod without
    /// a named target port is not an endpoint of that port); otherwise other ports fall back to
    /// the service's target port or number (WorkloadEntries).
    pub listed_ports_only: bool,
    /// The workload's own labels (a Pod's or WorkloadEntry's); see [`Endpoint::label`].
    pub labels: Arc<Labels>,
    /// Node the workload runs on (empty when unknown).
    pub node: Arc<str>,
    /// `region/zone/subzone`.
    pub locality: Arc<str>,
    /// Network.
    pub network: Arc<str>,
    /// Load-balancing weight (≥ 1).
    pub weight: u32,
    /// Service account.
    pub service_account: Arc<str>,
    /// Health.
    pub health: EndpointHealth,
    /// Whether the workload accepts Istio mutual TLS (Istio's endpoint `tlsMode: istio`): the
    /// `security.istio.io/tlsMode` label says so; a WorkloadEntry without it, when it names a
    /// service account.
    pub istio_mtls: bool,
}

/// The label saying whether a workload accepts Istio mutual TLS (`istio`) or not (`disabled`).
pub const TLS_MODE_LABEL: &str = "security.istio.io/tlsMode";

impl Endpoint {
    /// An endpoint at `address` with no identity yet: no labels, weight 1, healthy, ports
    /// falling back to the service's.
    pub fn at(address: String) -> Endpoint {
        let none: Arc<str> = Arc::from("");
        Endpoint {
            address,
            ports: EndpointPorts::default(),
            listed_ports_only: false,
            labels: Arc::default(),
            node: none.clone(),
            locality: none.clone(),
            network: none.clone(),
            weight: 1,
            service_account: none,
            health: EndpointHealth::Healthy,
            istio_mtls: false,
        }
    }

    /// The port this endpoint serves `port` on, or `None` if it does not serve that port.
    pub fn port_for(&self, port: &ServicePort) -> Option<u16> {
        match self.ports.get(&port.name) {
            Some(p) => Some(p),
            None if self.listed_ports_only => None,
            None => Some(port.target_port.unwrap_or(port.number)),
        }
    }

    /// The label `key` as subsets see it: Istio's topology labels (region, zone and subzone of
    /// the locality, the node's hostname) over the workload's, which keep their own network.
    pub fn label(&self, key: &str) -> Option<&str> {
        let topology = match key {
            REGION_LABEL => self.locality.split('/').next(),
            ZONE_LABEL => self.locality.split('/').nth(1),
            SUBZONE_LABEL => self.locality.split('/').nth(2),
            HOSTNAME_LABEL => Some(&*self.node),
            _ => None,
        };
        if let Some(value) = topology.filter(|v| !v.is_empty()) {
            return Some(value);
        }
        match self.labels.get(key) {
            Some(v) => Some(v.as_str()),
            None if key == NETWORK_LABEL && !self.network.is_empty() => Some(&self.network),
            None => None,
        }
    }

    /// Whether the endpoint carries every label of `selector`.
    pub fn matches(&self, selector: &Labels) -> bool {
        selector.iter().all(|(k, v)| self.label(k) == Some(v.as_str()))
    }
}

/// An endpoint's port overrides by service port name, in name order: one or two per endpoint,
/// so a sorted list costs far less than a map.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, Serialize)]
pub struct EndpointPorts(Vec<(String, u16)>);

impl EndpointPorts {
    /// The port for the service port `name`.
    pub fn get(&self, name: &str) -> Option<u16> {
        self.0.binary_search_by(|(n, _)| n.as_str().cmp(name)).ok().map(|i| self.0[i].1)
    }

    /// Adds `name` → `port` unless `name` already has a port.
    pub fn insert_if_absent(&mut self, name: String, port: u16) {
        if let Err(i) = self.0.binary_search_by(|(n, _)| n.cmp(&name)) {
            self.0.insert(i, (name, port));
        }
    }

    /// How many ports are listed.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether none is.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The ports, in name order.
    pub fn iter(&self) -> impl Iterator<Item = (&str, u16)> {
        self.0.iter().map(|(n, p)| (n.as_str(), *p))
    }
}

impl FromIterator<(String, u16)> for EndpointPorts {
    /// The first port of each name wins, as in a map built with `entry().or_insert()`.
    fn from_iter<I: IntoIterator<Item = (String, u16)>>(iter: I) -> Self {
        let mut ports = EndpointPorts::default();
        for (name, port) in iter {
            ports.insert_if_absent(name, port);
        }
        ports.0.shrink_to_fit();
        ports
    }
}

/// Endpoints of one service, shared between snapshots while unchanged.
pub type Endpoints = Arc<Vec<Endpoint>>;
