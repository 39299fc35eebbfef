//! The outbound clusters of a view: one per visible service port and DestinationRule subset.
//! CDS builds a cluster of each, and EDS an assignment.

use std::collections::BTreeSet;
use std::sync::Arc;

use super::names::cluster_name;
use super::scope::Scope;
use crate::config::api::destination_rule::Subset;
use crate::config::api::DestinationRule;
use crate::registry::{Service, ServicePort};

/// One outbound cluster to build: a service port, optionally narrowed to a subset.
pub(super) struct OutboundCluster<'a> {
    /// `outbound|PORT|SUBSET|HOST`.
    pub name: String,
    /// The service.
    pub service: &'a Arc<Service>,
    /// The port.
    pub port: &'a ServicePort,
    /// The DestinationRule subset, if any.
    pub subset: Option<&'a Subset>,
    /// The DestinationRule that applies to the service, if any.
    pub rule: Option<&'a DestinationRule>,
}

/// Every outbound cluster of the view, in service then port then subset order.
pub(super) fn outbound_clusters<'a>(scope: &Scope<'a>) -> Vec<OutboundCluster<'a>> {
    outbound_clusters_of(scope, scope.cluster_services())
}

/// The outbound clusters of `services` (some of the view's), in their order, then port and subset.
pub(super) fn outbound_clusters_of<'a>(scope: &Scope<'a>, services: Vec<&'a Arc<Service>>) -> Vec<OutboundCluster<'a>> {
    let mut out = Vec::new();
    for service in services {
        let rule = scope.destination_rule(service);
        let host = service.hostname.as_str();
        for port in service.ports.iter().filter(|p| p.number != 0) {
            out.push(OutboundCluster { name: cluster_name(port.number, "", host), service, port, subset: None, rule });
            let mut seen = BTreeSet::new();
            for subset in rule.map(|r| r.subsets.as_slice()).unwrap_or_default() {
                if subset.name.is_empty() || !seen.insert(subset.name.as_str()) {
                    continue;
                }
                let name = cluster_name(port.number, &subset.name, host);
                out.push(OutboundCluster { name, service, port, subset: Some(subset), rule });
            }
        }
    }
    out
}
