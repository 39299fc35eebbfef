//! VirtualService destinations → cluster names, and DestinationRule consistent hashing → route
//! hash policies.

use std::sync::Arc;

use envoy_types::pb::envoy::config::route::v3::route_action::{hash_policy, HashPolicy};

use super::names::cluster_name;
use super::proto::duration;
use super::scope::Scope;
use super::traffic_policy::Policy;
use crate::config::api::destination_rule::ConsistentHashLb;
use crate::config::api::virtual_service::Destination;
use crate::registry::{Hostname, Service};

/// A destination resolved from a proxy's point of view.
pub(super) struct Target<'a> {
    /// Cluster name (`outbound|PORT|SUBSET|HOST`), computed even for unknown hosts, as Istio does.
    pub cluster: String,
    /// The service the host names, when the proxy sees one.
    pub service: Option<&'a Arc<Service>>,
    /// The port the cluster is for.
    pub port: u16,
}

/// Resolves a destination: short hosts are qualified with the VirtualService's namespace; the port
/// is the destination's, else the service's only port, else the listener's.
pub(super) fn resolve<'a>(scope: &Scope<'a>, dest: &Destination, vs_ns: &str, listen_port: u16) -> Target<'a> {
    let host = Hostname::qualify(&dest.host, vs_ns, scope.domain());
    let service = scope.service_for_host(&host);
    let explicit = dest.port.and_then(|p| u16::try_from(p.number).ok()).filter(|p| *p != 0);
    let only_port = service.and_then(|s| match s.ports.as_slice() {
        [only] => Some(only.number),
        _ => None,
    });
    let port = explicit.or(only_port).unwrap_or(listen_port);
    Target { cluster: cluster_name(port, &dest.subset, host.as_str()), service, port }
}

/// The route hash policy for a destination whose DestinationRule asks for consistent hashing.
pub(super) fn hash_policy(scope: &Scope<'_>, service: &Service, subset: &str, port: u16) -> Option<HashPolicy> {
    let rule = scope.destination_rule(service);
    let subset = rule.and_then(|r| r.subsets.iter().find(|s| !subset.is_empty() && s.name == subset));
    let policy = Policy::effective(rule, subset, port);
    policy.load_balancer.and_then(|lb| lb.consistent_hash.as_ref()).and_then(to_hash_policy)
}

fn to_hash_policy(hash: &ConsistentHashLb) -> Option<HashPolicy> {
    let specifier = if let Some(header) = &hash.http_header_name {
        hash_policy::PolicySpecifier::Header(hash_policy::Header { header_name: header.clone(), ..Default::default() })
    } else if let Some(cookie) = &hash.http_cookie {
        hash_policy::PolicySpecifier::Cookie(hash_policy::Cookie {
            name: cookie.name.clone(),
            ttl: cookie.ttl.map(|t| duration(t.0)),
            path: cookie.path.clone(),
            ..Default::default()
        })
    } else if hash.use_source_ip == Some(true) {
        hash_policy::PolicySpecifier::ConnectionProperties(hash_policy::ConnectionProperties { source_ip: true })
    } else if let Some(param) = &hash.http_query_parameter_name {
        hash_policy::PolicySpecifier::QueryParameter(hash_policy::QueryParameter { name: param.clone() })
    } else {
        return None;
    };
    Some(HashPolicy { policy_specifier: Some(specifier), ..Default::default() })
}
