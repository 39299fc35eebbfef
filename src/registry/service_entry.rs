//! ServiceEntry and WorkloadEntry objects → services and endpoints.

use std::collections::BTreeMap;
use std::sync::Arc;

use super::kubernetes::KubeObjects;
use super::service::{Endpoint, Resolution, Service, ServiceKey, ServicePort};
use super::{Hostname, Registry, Visibility};
use crate::config::api::service_entry::{Location, Resolution as SeResolution};
use crate::config::api::{Protocol, ServiceEntry, WorkloadEntry};
use crate::config::{Spec, ValidConfig};
use crate::mesh::MeshConfig;

/// Builds the registry from every ServiceEntry and WorkloadEntry.
pub fn build_registry<'a>(
    configs: impl Iterator<Item = &'a ValidConfig> + Clone,
    _kube: &KubeObjects,
    mesh: &MeshConfig,
) -> Registry {
    let workload_entries: Vec<(&str, &WorkloadEntry)> = configs
        .clone()
        .filter_map(|c| match &c.spec {
            Spec::WorkloadEntry(we) => Some((c.key.namespace.as_str(), we)),
            _ => None,
        })
        .collect();
    let mut registry = Registry::default();
    for config in configs {
        let Spec::ServiceEntry(se) = &config.spec else { continue };
        let endpoints = endpoints_of(se, &config.key.namespace, &workload_entries);
        for host in &se.hosts {
            let service = service_for(config, se, host, mesh);
            let key = ServiceKey { hostname: service.hostname.clone(), namespace: service.namespace.clone() };
            // The first declaration of a host in a namespace wins, as in Istio (objects are ordered by key).
            if registry.services.contains_key(&key) {
                tracing::warn!(host = %key.hostname, namespace = %key.namespace, by = %config.key, "host already declared in this namespace; ignored");
                continue;
            }
            registry.endpoints.insert(key.clone(), Arc::new(endpoints.clone()));
            registry.services.insert(key, Arc::new(service));
        }
    }
    registry
}

fn service_for(config: &ValidConfig, se: &ServiceEntry, host: &str, mesh: &MeshConfig) -> Service {
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
        origin: config.key.clone(),
        subject_alt_names: se.subject_alt_names.clone(),
    }
}

/// Istio's protocol selection: the explicit protocol, else the port name's prefix (`http-web`).
fn port_protocol(protocol: &str, name: &str) -> Protocol {
    if !protocol.is_empty() {
        return Protocol::parse(protocol);
    }
    Protocol::parse(name.split('-').next().unwrap_or_default())
}

fn endpoints_of(se: &ServiceEntry, namespace: &str, workload_entries: &[(&str, &WorkloadEntry)]) -> Vec<Endpoint> {
    if let Some(selector) = &se.workload_selector {
        workload_entries
            .iter()
            .filter(|(ns, we)| *ns == namespace && selector.labels.iter().all(|(k, v)| we.labels.get(k) == Some(v)))
            .map(|(_, we)| endpoint(we))
            .collect()
    } else {
        se.endpoints.iter().map(endpoint).collect()
    }
}

fn endpoint(we: &WorkloadEntry) -> Endpoint {
    Endpoint {
        address: we.address.clone(),
        ports: we
            .ports
            .iter()
            .filter_map(|(name, port)| Some((name.clone(), u16::try_from(*port).ok()?)))
            .collect::<BTreeMap<_, _>>(),
        labels: we.labels.clone(),
        locality: we.locality.clone(),
        network: we.network.clone(),
        weight: we.weight.filter(|w| *w > 0).unwrap_or(1),
        service_account: we.service_account.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::parse::{parse_file, Document};

    fn configs(yaml: &str) -> Vec<ValidConfig> {
        parse_file("t.yaml", yaml)
            .into_iter()
            .map(|d| match d {
                Document::Valid(o) => Arc::new(o),
                other => panic!("invalid test config: {other:?}"),
            })
            .collect()
    }

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
        assert_eq!(eps[0].port_for(&svc.ports[0]), 9000);
    }
}
