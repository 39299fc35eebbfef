//! The service registry: services and endpoints, from ServiceEntry/WorkloadEntry and Kubernetes.

mod build;
mod discovery;
mod hostname;
mod incremental;
mod instances;
pub mod intern;
mod kube_endpoints;
mod kube_index;
mod kube_service;
mod kube_store;
#[cfg(test)]
mod kube_tests;
pub mod kubernetes;
mod service;
mod service_entry;
mod visibility;
mod workload;

use std::sync::Arc;

pub use build::build_registry;
pub use discovery::NamespaceScope;
pub use hostname::{host_matches, hosts_overlap, Hostname};
pub use incremental::IncrementalRegistry;
pub use instances::InstanceIndex;
pub use kube_service::{kube_hostname, kube_port_protocol};
pub use service::{
    Endpoint, EndpointHealth, EndpointPorts, Endpoints, Resolution, Service, ServiceKey, ServiceOrigin, ServicePort,
};
pub use visibility::Visibility;

/// All services and their endpoints at one point in time. Both maps are persistent: the next
/// registry shares every node a change does not reach, and comparing the two stops at shared ones.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Registry {
    /// Services by key.
    pub services: imbl::OrdMap<ServiceKey, Arc<Service>>,
    /// Endpoints by service.
    pub endpoints: imbl::OrdMap<ServiceKey, Endpoints>,
}

impl Registry {
    /// The services declaring `host`, one per namespace: a range of the key order (hostname
    /// first), not a walk of every service.
    pub fn services_of<'a>(&'a self, host: &'a Hostname) -> impl Iterator<Item = (&'a ServiceKey, &'a Arc<Service>)> {
        let first = ServiceKey { hostname: host.clone(), namespace: String::new() };
        self.services.range(first..).take_while(move |(key, _)| key.hostname == *host)
    }
}
