//! The service registry: services and endpoints, from ServiceEntry/WorkloadEntry and Kubernetes.

mod hostname;
pub mod kubernetes;
mod service;
mod service_entry;
mod visibility;

use std::collections::BTreeMap;
use std::sync::Arc;

pub use hostname::{host_matches, hosts_overlap, Hostname};
pub use service::{Endpoint, Endpoints, Resolution, Service, ServiceKey, ServicePort};
pub use service_entry::build_registry;
pub use visibility::Visibility;

/// All services and their endpoints at one point in time.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Registry {
    /// Services by key.
    pub services: BTreeMap<ServiceKey, Arc<Service>>,
    /// Endpoints by service.
    pub endpoints: BTreeMap<ServiceKey, Endpoints>,
}
