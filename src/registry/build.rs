//! One registry build: Kubernetes Services and ServiceEntries, with their endpoints, from the
//! config objects and Kubernetes objects in discovery scope.

use std::collections::HashMap;
use std::sync::Arc;

use super::discovery::NamespaceScope;
use super::kube_endpoints::service_endpoints;
use super::kube_index::KubeIndex;
use super::kube_service::service_from_kube;
use super::kubernetes::KubeObjects;
use super::service::ServiceKey;
use super::service_entry::add_service_entries;
use super::workload::WorkloadEntries;
use super::Registry;
use crate::config::{Spec, ValidConfig};
use crate::mesh::MeshConfig;

/// Builds the registry from the Kubernetes objects and every ServiceEntry and WorkloadEntry, keeping
/// only namespaces that `mesh.discovery_selectors` select.
pub fn build_registry<'a>(
    configs: impl Iterator<Item = &'a ValidConfig> + Clone,
    kube: &KubeObjects,
    mesh: &MeshConfig,
) -> Registry {
    let scope = NamespaceScope::new(mesh, kube);
    let configs = configs.filter(|c| scope.contains(&c.key.namespace));
    let index = KubeIndex::new(kube, &scope);
    let mut workload_entries: WorkloadEntries<'_> = HashMap::new();
    for config in configs.clone() {
        if let Spec::WorkloadEntry(we) = &config.spec {
            workload_entries.entry(config.key.namespace.as_str()).or_default().push(we);
        }
    }
    let mut registry = Registry::default();
    for svc in &index.services {
        let service = service_from_kube(svc, mesh);
        let endpoints = service_endpoints(svc, &service, &index, &workload_entries);
        let key = ServiceKey { hostname: service.hostname.clone(), namespace: service.namespace.clone() };
        registry.endpoints.insert(key.clone(), Arc::new(endpoints));
        registry.services.insert(key, Arc::new(service));
    }
    add_service_entries(&mut registry, configs, &index, &workload_entries, mesh);
    registry
}
