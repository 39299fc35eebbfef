//! Endpoints of Kubernetes Services, as Istio's EndpointSlice controller and endpoint builder
//! make them: each slice address joined to its Pod (by `targetRef`, else by IP) for labels,
//! service account, locality (the Pod's Node) and network, with a health from the slice's
//! conditions; plus the WorkloadEntries the Service's selector picks.

use std::collections::HashMap;

use super::kube_index::KubeLookup;
use super::kubernetes::{KubeEndpointSlice, KubePod, KubeService, SliceEndpoint, TargetPort};
use super::service::{Endpoint, EndpointHealth, EndpointPorts, Resolution, Service};
use super::workload::{namespace_network, pod_endpoint, workload_default, workload_entry_endpoint, WorkloadEntries};
use crate::config::api::Labels;

/// Service labels that turn on persistent sessions, for which terminating endpoints drain.
const PERSISTENT_SESSION_LABELS: [&str; 2] = ["istio.io/persistent-session", "istio.io/persistent-session-header"];

/// Endpoints of a Kubernetes Service: its EndpointSlices' addresses, the WorkloadEntries its
/// selector picks; none for an ExternalName Service (an alias).
pub(super) fn service_endpoints(
    svc: &KubeService,
    service: &Service,
    index: &impl KubeLookup,
    workload_entries: &WorkloadEntries<'_>,
) -> Vec<Endpoint> {
    if service.resolution == Resolution::Alias {
        return Vec::new();
    }
    let supports_draining = PERSISTENT_SESSION_LABELS.iter().any(|l| svc.labels.get(*l).is_some_and(|v| !v.is_empty()));
    let mut out: Vec<Endpoint> = Vec::new();
    // Slices of one Service may repeat an address (e.g. during a slice split): the first wins per port.
    let mut by_address: HashMap<String, usize> = HashMap::new();
    for slice in index.slices_of(&svc.namespace, &svc.name) {
        if slice.address_type.eq_ignore_ascii_case("FQDN") {
            continue;
        }
        for endpoint in &slice.endpoints {
            let health = slice_health(endpoint, supports_draining);
            for address in &endpoint.addresses {
                let pod = match &endpoint.pod {
                    // A Pod the slice names but the registry does not hold yet: Istio waits for it
                    // rather than serve an endpoint with the wrong identity.
                    Some(name) => match index.pod(&slice.namespace, name) {
                        Some(pod) => Some(pod),
                        None => continue,
                    },
                    None => index.pod_by_ip(&slice.namespace, address),
                };
                let ports = slice_ports(svc, slice, pod);
                if ports.is_empty() {
                    continue;
                }
                match by_address.get(address) {
                    Some(&i) => {
                        for (name, port) in ports.iter() {
                            out[i].ports.insert_if_absent(name.to_string(), port);
                        }
                    }
                    None => {
                        let mut ep = match pod {
                            Some(pod) => pod_endpoint(pod, endpoint.node_name.as_ref(), index),
                            None => {
                                Endpoint { network: namespace_network(&slice.namespace, index), ..workload_default() }
                            }
                        };
                        ep.address = address.clone();
                        ep.ports = ports;
                        ep.listed_ports_only = true;
                        ep.health = health;
                        by_address.insert(address.clone(), out.len());
                        out.push(ep);
                    }
                }
            }
        }
    }
    if service.resolution == Resolution::Static {
        out.extend(selected_workload_entries(svc, service, workload_entries));
    }
    out.shrink_to_fit();
    out
}

/// Istio's health of a slice endpoint: ready (or unset) is healthy; otherwise draining where the
/// service keeps persistent sessions and the endpoint still serves while terminating; otherwise
/// terminating, else unhealthy. As in Istio, an unset `terminating` counts as terminating here.
pub(super) fn slice_health(e: &SliceEndpoint, supports_draining: bool) -> EndpointHealth {
    if e.ready.unwrap_or(true) {
        return EndpointHealth::Healthy;
    }
    let terminating = e.terminating.unwrap_or(true);
    if supports_draining && e.serving.unwrap_or(true) && terminating {
        EndpointHealth::Draining
    } else if terminating {
        EndpointHealth::Terminating
    } else {
        EndpointHealth::Unhealthy
    }
}

/// The ports an address of `slice` serves, by Service port name. A slice port without a number
/// is resolved through the Service's `targetPort` (by name against the Pod's container ports).
fn slice_ports(svc: &KubeService, slice: &KubeEndpointSlice, pod: Option<&KubePod>) -> EndpointPorts {
    slice
        .ports
        .iter()
        .filter_map(|sp| {
            let service_port =
                svc.ports.iter().find(|p| p.name == sp.name && !p.protocol.eq_ignore_ascii_case("UDP"))?;
            let number = match (sp.port, &service_port.target_port) {
                (Some(n), _) => n,
                (None, Some(TargetPort::Number(n))) => *n,
                (None, Some(TargetPort::Name(name))) => pod?.named_port(name)?,
                (None, None) => service_port.port,
            };
            (number != 0).then(|| (sp.name.clone(), number))
        })
        .collect()
}

/// WorkloadEntries of the Service's namespace its selector picks (Istio's default
/// `PILOT_ENABLE_K8S_SELECT_WORKLOAD_ENTRIES`). A port whose `targetPort` names a port the entry
/// does not declare is not served by that entry.
fn selected_workload_entries<'a>(
    svc: &'a KubeService,
    service: &'a Service,
    workload_entries: &'a WorkloadEntries<'_>,
) -> impl Iterator<Item = Endpoint> + 'a {
    // An empty selector selects nothing (a Service without selector has hand-made endpoints).
    let selector: Option<&Labels> = svc.selector.as_ref().filter(|s| !s.is_empty());
    let candidates = selector.and_then(|_| workload_entries.get(svc.namespace.as_str()));
    candidates.into_iter().flatten().filter_map(move |we| {
        let selector = selector?;
        if we.labels.is_empty() || !selector.iter().all(|(k, v)| we.labels.get(k) == Some(v)) {
            return None;
        }
        let ports: EndpointPorts = svc
            .ports
            .iter()
            .filter(|p| service.ports.iter().any(|sp| sp.name == p.name))
            .filter_map(|p| {
                let number = match &p.target_port {
                    Some(TargetPort::Number(n)) => *n,
                    None => p.port,
                    Some(TargetPort::Name(name)) => u16::try_from(*we.ports.get(name)?).ok()?,
                };
                Some((p.name.clone(), number))
            })
            .collect();
        if ports.is_empty() {
            return None;
        }
        Some(Endpoint { ports, listed_ports_only: true, ..workload_entry_endpoint(we) })
    })
}
