//! The outbound clusters of a view: one per visible service port and DestinationRule subset.
//! CDS builds a cluster of each, and EDS an assignment.

use std::collections::BTreeSet;
use std::sync::Arc;

use super::gateway::has_auto_passthrough;
use super::names::{cluster_name, istio_sni};
use super::scope::{ImportedService, Scope};
use crate::config::api::destination_rule::Subset;
use crate::config::api::DestinationRule;
use crate::envoy::ProxyKind;
use crate::registry::{Resolution, Service, ServicePort};

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
    /// A gateway's SNI-DNAT cluster (`outbound_.PORT_.SUBSET_.HOST`), which its AUTO_PASSTHROUGH
    /// servers forward the client's TLS to: no TLS of its own.
    pub sni_dnat: bool,
    /// Whether the cluster takes its endpoints over EDS: a STATIC service's, and on a gateway
    /// (which has no original destination) a passthrough service's too, as istiod.
    pub eds: bool,
}

/// Every outbound cluster of the view, in service then port then subset order.
pub(super) fn outbound_clusters<'a>(scope: &Scope<'a>) -> Vec<OutboundCluster<'a>> {
    outbound_clusters_of(scope, scope.imported_services())
}

/// The outbound clusters of `services` (some of the view's), in their order, then port and subset;
/// only the ports the proxy imports of each.
pub(super) fn outbound_clusters_of<'a>(
    scope: &Scope<'a>,
    services: Vec<ImportedService<'a>>,
) -> Vec<OutboundCluster<'a>> {
    // A gateway with an AUTO_PASSTHROUGH server also gets every mesh-internal service's clusters
    // under the SNI Istio's mutual TLS sends (istiod's SNI-DNAT clusters).
    let sni_dnat = scope.view.kind == ProxyKind::Router && has_auto_passthrough(scope);
    let mut out = Vec::new();
    // An alias has no clusters of its own (istiod's ExternalName alias).
    for ImportedService { service, ports } in services.into_iter().filter(|i| i.service.resolution != Resolution::Alias)
    {
        let rule = scope.destination_rule(service);
        let host = service.hostname.as_str();
        let eds = match service.resolution {
            Resolution::Static => true,
            Resolution::Passthrough => scope.view.kind == ProxyKind::Router,
            Resolution::Dns | Resolution::DnsRoundRobin | Resolution::Alias => false,
        };
        let kinds: &[bool] = if sni_dnat && !service.mesh_external { &[false, true] } else { &[false] };
        for &dnat in kinds {
            let name = |port: u16, subset: &str| {
                if dnat {
                    istio_sni(port, subset, host)
                } else {
                    cluster_name(port, subset, host)
                }
            };
            for port in service.ports.iter().filter(|p| p.number != 0 && ports.contains(p.number)) {
                let name0 = name(port.number, "");
                out.push(OutboundCluster { name: name0, service, port, subset: None, rule, sni_dnat: dnat, eds });
                let mut seen = BTreeSet::new();
                for subset in rule.map(|r| r.subsets.as_slice()).unwrap_or_default() {
                    if subset.name.is_empty() || !seen.insert(subset.name.as_str()) {
                        continue;
                    }
                    let name = name(port.number, &subset.name);
                    let subset = Some(subset);
                    out.push(OutboundCluster { name, service, port, subset, rule, sni_dnat: dnat, eds });
                }
            }
        }
    }
    out
}
