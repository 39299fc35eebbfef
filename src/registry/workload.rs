//! Workloads as endpoints: a Pod or a WorkloadEntry turned into an [`Endpoint`], and the
//! WorkloadEntries by namespace that Services and ServiceEntries select from.

use std::collections::HashMap;
use std::sync::Arc;

use super::kube_index::KubeLookup;
use super::kubernetes::KubePod;
use super::service::{Endpoint, EndpointHealth, EndpointPorts, NETWORK_LABEL, TLS_MODE_LABEL};
use crate::config::api::WorkloadEntry;

/// WorkloadEntries by namespace, in key order.
pub(super) type WorkloadEntries<'a> = HashMap<&'a str, Vec<&'a WorkloadEntry>>;

/// Pod label that overrides the Node's locality (`region.zone.subzone`).
const LOCALITY_LABEL: &str = "istio-locality";

/// A Pod as an endpoint (address: its first IP, no ports yet): its labels (shared with the
/// Pod), node, service account, locality and network.
pub(super) fn pod_endpoint(pod: &KubePod, slice_node: Option<&Arc<str>>, index: &impl KubeLookup) -> Endpoint {
    let node: Arc<str> = match slice_node {
        Some(n) if pod.node_name.is_empty() => n.clone(),
        _ => pod.node_name.clone(),
    };
    let network = match pod.labels.get(NETWORK_LABEL) {
        Some(n) if !n.is_empty() => Arc::from(n.as_str()),
        _ => namespace_network(&pod.namespace, index),
    };
    Endpoint {
        address: pod.ips.first().cloned().unwrap_or_default(),
        labels: pod.labels.clone(),
        locality: pod_locality(pod, &node, index),
        node,
        network,
        service_account: pod.service_account.clone(),
        istio_mtls: pod.labels.get(TLS_MODE_LABEL).map(String::as_str) == Some("istio"),
        ..workload_default()
    }
}

/// Istio's Pod locality: the `istio-locality` label (dots for slashes), else the Node's
/// `region/zone/subzone`, else none.
pub(super) fn pod_locality(pod: &KubePod, node_name: &str, index: &impl KubeLookup) -> Arc<str> {
    match pod.labels.get(LOCALITY_LABEL).filter(|l| !l.is_empty()) {
        Some(label) => Arc::from(label.replace('.', "/")),
        None => index.topology().locality(node_name),
    }
}

pub(super) fn namespace_network(namespace: &str, index: &impl KubeLookup) -> Arc<str> {
    index.topology().network(namespace)
}

/// An endpoint with no identity yet.
pub(super) fn workload_default() -> Endpoint {
    Endpoint::at(String::new())
}

/// A WorkloadEntry (or a ServiceEntry's inline endpoint) as an endpoint.
pub(super) fn workload_entry_endpoint(we: &WorkloadEntry) -> Endpoint {
    Endpoint {
        address: we.address.clone(),
        ports: we
            .ports
            .iter()
            .filter_map(|(name, port)| Some((name.clone(), u16::try_from(*port).ok()?)))
            .collect::<EndpointPorts>(),
        listed_ports_only: false,
        labels: Arc::new(we.labels.clone()),
        node: Arc::from(""),
        locality: Arc::from(we.locality.as_str()),
        network: Arc::from(we.network.as_str()),
        weight: we.weight.filter(|w| *w > 0).unwrap_or(1),
        service_account: Arc::from(we.service_account.as_str()),
        health: EndpointHealth::Healthy,
        istio_mtls: match we.labels.get(TLS_MODE_LABEL) {
            Some(mode) => mode == "istio",
            None => !we.service_account.is_empty(),
        },
    }
}
