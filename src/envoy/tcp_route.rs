//! VirtualService TCP and TLS rules → TCP proxy targets (shared by sidecars and gateways). A
//! rule applies by port and source; its `destinationSubnets` become the destination match of a
//! sidecar's chain (gateways, whose listeners are not reached by original destination, do not
//! evaluate them).

use envoy_types::pb::envoy::extensions::filters::network::tcp_proxy::v3::tcp_proxy::{
    weighted_cluster::ClusterWeight, ClusterSpecifier, WeightedCluster,
};

use super::destination::resolve;
use super::http_match::{source_applies, RouteContext};
use super::network_filter::to_cluster;
use super::scope::{Scope, VsRef};
use crate::config::api::virtual_service::{L4MatchAttributes, RouteDestination, TlsMatchAttributes};
use crate::registry::{hosts_overlap, Hostname};

/// One SNI-matched TLS rule: the server names it claims and where it sends connections.
pub(super) struct TlsTarget {
    /// SNI values (as written in the rule).
    pub server_names: Vec<String>,
    /// The destination subnets the match names (empty: any destination).
    pub subnets: Vec<String>,
    /// Where matching connections go.
    pub target: ClusterSpecifier,
}

/// One TCP rule as a sidecar's chain: the destination subnets it matches and where it sends
/// connections.
pub(super) struct TcpTarget {
    /// The destination subnets of the rule's matches (empty: any destination).
    pub subnets: Vec<String>,
    /// Where matching connections go.
    pub target: ClusterSpecifier,
}

/// The TCP rules, among VirtualServices for `host`, that apply here, in order, as istiod turns
/// them into chains: a rule whose match names no subnet (or that has no match) applies to any
/// destination and ends the list (what follows is unreachable); a rule naming subnets gets a
/// chain for them. The flag says whether the list ended so.
pub(super) fn tcp_targets(
    scope: &Scope<'_>,
    virtual_services: &[VsRef<'_>],
    host: &Hostname,
    ctx: &RouteContext<'_>,
) -> (Vec<TcpTarget>, bool) {
    let mut out = Vec::new();
    for (ix, vs) in virtual_services {
        if !ix.hosts.iter().any(|vh| hosts_overlap(vh.as_str(), host.as_str())) {
            continue;
        }
        let vs_ns = ix.config.key.namespace.as_str();
        for rule in &vs.tcp {
            let Some(target) = l4_target(scope, &rule.route, vs_ns, ctx.listen_port) else { continue };
            let applying: Vec<&L4MatchAttributes> = rule.matches.iter().filter(|m| l4_applies(m, ctx, vs_ns)).collect();
            if rule.matches.is_empty() || applying.iter().any(|m| m.destination_subnets.is_empty()) {
                out.push(TcpTarget { subnets: Vec::new(), target });
                return (out, true);
            }
            let subnets: Vec<String> = applying.iter().flat_map(|m| m.destination_subnets.iter().cloned()).collect();
            if !subnets.is_empty() {
                out.push(TcpTarget { subnets, target });
            }
        }
    }
    (out, false)
}

/// The target of the first TCP rule, among VirtualServices for `host`, that applies here.
pub(super) fn tcp_target(
    scope: &Scope<'_>,
    virtual_services: &[VsRef<'_>],
    host: Option<&Hostname>,
    ctx: &RouteContext<'_>,
) -> Option<ClusterSpecifier> {
    for (ix, vs) in virtual_services {
        if host.is_some_and(|h| !ix.hosts.iter().any(|vh| hosts_overlap(vh.as_str(), h.as_str()))) {
            continue;
        }
        let vs_ns = ix.config.key.namespace.as_str();
        for rule in &vs.tcp {
            if rule.matches.is_empty() || rule.matches.iter().any(|m| l4_applies(m, ctx, vs_ns)) {
                if let Some(target) = l4_target(scope, &rule.route, vs_ns, ctx.listen_port) {
                    return Some(target);
                }
            }
        }
    }
    None
}

/// The TLS rules of `virtual_services` that apply here, in VirtualService then rule order.
pub(super) fn tls_targets(
    scope: &Scope<'_>,
    virtual_services: &[VsRef<'_>],
    ctx: &RouteContext<'_>,
    sni_allowed: impl Fn(&str) -> bool,
) -> Vec<TlsTarget> {
    let mut out = Vec::new();
    for (ix, vs) in virtual_services {
        let vs_ns = ix.config.key.namespace.as_str();
        for rule in &vs.tls {
            for m in rule.matches.iter().filter(|m| tls_applies(m, ctx, vs_ns)) {
                let server_names: Vec<String> = m.sni_hosts.iter().filter(|s| sni_allowed(s)).cloned().collect();
                if server_names.is_empty() {
                    continue;
                }
                if let Some(target) = l4_target(scope, &rule.route, vs_ns, ctx.listen_port) {
                    out.push(TlsTarget { server_names, subnets: m.destination_subnets.clone(), target });
                }
            }
        }
    }
    out
}

/// Weighted L4 destinations → one cluster, or weighted clusters (zero weights dropped).
pub(super) fn l4_target(
    scope: &Scope<'_>,
    routes: &[RouteDestination],
    vs_ns: &str,
    listen_port: u16,
) -> Option<ClusterSpecifier> {
    let dests: Vec<(&RouteDestination, String)> = routes
        .iter()
        .filter_map(|r| Some((r, resolve(scope, r.destination.as_ref()?, vs_ns, listen_port).cluster)))
        .collect();
    if dests.len() == 1 {
        return dests.into_iter().next().map(|(_, cluster)| to_cluster(&cluster));
    }
    let weight = |r: &RouteDestination| r.weight.and_then(|w| u32::try_from(w).ok()).unwrap_or(0);
    let positive = dests.iter().any(|(r, _)| weight(r) > 0);
    let clusters: Vec<ClusterWeight> = dests
        .into_iter()
        .filter(|(r, _)| !positive || weight(r) > 0)
        .map(|(r, name)| ClusterWeight { name, weight: if positive { weight(r) } else { 1 }, ..Default::default() })
        .collect();
    (!clusters.is_empty()).then_some(ClusterSpecifier::WeightedClusters(WeightedCluster { clusters }))
}

fn l4_applies(m: &L4MatchAttributes, ctx: &RouteContext<'_>, vs_ns: &str) -> bool {
    port_applies(m.port, ctx) && source_applies(&m.gateways, &m.source_labels, &m.source_namespace, ctx, vs_ns)
}

fn tls_applies(m: &TlsMatchAttributes, ctx: &RouteContext<'_>, vs_ns: &str) -> bool {
    port_applies(m.port, ctx) && source_applies(&m.gateways, &m.source_labels, &m.source_namespace, ctx, vs_ns)
}

fn port_applies(port: Option<u32>, ctx: &RouteContext<'_>) -> bool {
    port.is_none_or(|p| p == 0 || p == u32::from(ctx.listen_port))
}
