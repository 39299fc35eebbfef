//! ServiceEntry and WorkloadEntry objects → services and endpoints.
//!
//! A ServiceEntry's `workloadSelector` selects the WorkloadEntries and, as Istio does by default
//! (`PILOT_ENABLE_SERVICEENTRY_SELECT_PODS`), the ready Pods of its namespace.

use std::sync::Arc;

use super::kube_index::KubeLookup;
use super::service::{Endpoint, EndpointPorts, Resolution, Service, ServiceKey, ServiceOrigin, ServicePort};
use super::workload::{pod_endpoint, workload_entry_endpoint, WorkloadEntries};
use super::{Hostname, Registry, Visibility};
use crate::config::api::service_entry::{Location, Resolution as SeResolution};
use crate::config::api::{Protocol, ServiceEntry};
use crate::config::{Spec, ValidConfig};
use crate::mesh::MeshConfig;

/// Adds the services of every ServiceEntry in `configs`. A host already in the registry for the
/// same namespace keeps its first declaration: Kubernetes Services are added first, and win over
/// ServiceEntries as in Istio (no "domain squatting" on a Service's name).
pub(super) fn add_service_entries<'a>(
    registry: &mut Registry,
    configs: impl Iterator<Item = &'a ValidConfig>,
    index: &impl KubeLookup,
    workload_entries: &WorkloadEntries<'_>,
    mesh: &MeshConfig,
) {
    for config in configs {
        let Spec::ServiceEntry(se) = &config.spec else { continue };
        let endpoints = Arc::new(endpoints_of(se, &config.key.namespace, index, workload_entries));
        for host in &se.hosts {
            let service = service_for(config, se, host, mesh);
            let key = ServiceKey { hostname: service.hostname.clone(), namespace: service.namespace.clone() };
            // The first declaration of a host in a namespace wins, as in Istio (objects are ordered by key).
            if let Some(existing) = registry.services.get(&key) {
                tracing::warn!(host = %key.hostname, namespace = %key.namespace, by = %config.key, kept = %existing.origin, "host already declared in this namespace; ignored");
                continue;
            }
            registry.endpoints.insert(key.clone(), endpoints.clone());
            registry.services.insert(key, Arc::new(service));
        }
    }
}

pub(super) fn service_for(config: &ValidConfig, se: &ServiceEntry, host: &str, mesh: &MeshConfig) -> Service {
    let resolution = match se.resolution.unwrap_or(SeResolution::None) {
        SeResolution::None => Resolution::Passthrough,
        SeResolution::Static => Resolution::Static,
        SeResolution::Dns => Resolution::Dns,
        SeResolution::DnsRoundRobin => Resolution::DnsRoundRobin,
    };
    Service {
        hostname: Hostname::new(host),
        namespace: config.key.namespace.clone(),
        ports: se
            .ports
            .iter()
            .map(|p| ServicePort {
                name: p.name.clone(),
                number: u16::try_from(p.number).unwrap_or(0),
                protocol: port_protocol(&p.protocol, &p.name),
                target_port: p.target_port.and_then(|t| u16::try_from(t).ok()),
            })
            .collect(),
        addresses: se.addresses.clone(),
        resolution,
        mesh_external: se.location != Some(Location::MeshInternal),
        visibility: Visibility::from_export_to(&se.export_to, &config.key.namespace, &mesh.default_service_export_to),
        origin: ServiceOrigin::Config(config.key.clone()),
        subject_alt_names: se.subject_alt_names.clone(),
        alias_of: None,
    }
}

/// Istio's protocol selection: the explicit protocol, else the port name's prefix (`http-web`).
fn port_protocol(protocol: &str, name: &str) -> Protocol {
    if !protocol.is_empty() {
        return Protocol::parse(protocol);
    }
    Protocol::parse(name.split('-').next().unwrap_or_default())
}

pub(super) fn endpoints_of(
    se: &ServiceEntry,
    namespace: &str,
    index: &impl KubeLookup,
    workload_entries: &WorkloadEntries<'_>,
) -> Vec<Endpoint> {
    let Some(selector) = &se.workload_selector else {
        return inline_endpoints(se);
    };
    let selects = |labels: &crate::config::api::Labels| selector.labels.iter().all(|(k, v)| labels.get(k) == Some(v));
    let entries = workload_entries.get(namespace).map(Vec::as_slice).unwrap_or_default();
    let mut out: Vec<Endpoint> =
        entries.iter().filter(|we| selects(&we.labels)).map(|we| workload_entry_endpoint(we)).collect();
    // Pods join as Istio's pod controller hands them over: with an IP, ready, not being deleted.
    for pod in index.pods_in(namespace) {
        if pod.ips.is_empty() || !pod.ready || pod.terminating || !selects(&pod.labels) {
            continue;
        }
        let mut ep = pod_endpoint(pod, None, index);
        // A ServiceEntry port is served on the Pod's container port of the same name, if any.
        ep.ports =
            se.ports.iter().filter_map(|p| Some((p.name.clone(), pod.named_port(&p.name)?))).collect::<EndpointPorts>();
        out.push(ep);
    }
    out
}

/// The endpoints a ServiceEntry lists itself (those of one without a `workloadSelector`).
pub(super) fn inline_endpoints(se: &ServiceEntry) -> Vec<Endpoint> {
    se.endpoints.iter().map(workload_entry_endpoint).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::registry::build_registry;
    use crate::registry::kubernetes::KubeObjects;

    use crate::registry::kube_tests::configs;

    #[test]
    fn service_entry_with_selected_workload_entries() {
        let cfg = configs(
            r#"
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: ratings, namespace: shop}
spec:
  hosts: [ratings.shop.svc.cluster.local]
  location: MESH_INTERNAL
  resolution: STATIC
  ports: [{number: 80, name: http-api, targetPort: 8080}]
  workloadSelector: {labels: {app: ratings}}
---
apiVersion: networking.istio.io/v1
kind: WorkloadEntry
metadata: {name: r1, namespace: shop}
spec: {address: 10.0.0.1, labels: {app: ratings, version: v1}, ports: {http-api: 9000}}
---
apiVersion: networking.istio.io/v1
kind: WorkloadEntry
metadata: {name: other, namespace: shop}
spec: {address: 10.0.0.2, labels: {app: other}}
"#,
        );
        let reg = build_registry(cfg.iter(), &KubeObjects::new(), &MeshConfig::default());
        let key = ServiceKey { hostname: Hostname::new("ratings.shop.svc.cluster.local"), namespace: "shop".into() };
        let svc = &reg.services[&key];
        assert_eq!(svc.ports[0].protocol, Protocol::Http);
        assert!(!svc.mesh_external);
        let eps = &reg.endpoints[&key];
        assert_eq!(eps.len(), 1);
        assert_eq!(eps[0].address, "10.0.0.1");
        assert_eq!(eps[0].port_for(&svc.ports[0]), Some(9000));
    }
}
