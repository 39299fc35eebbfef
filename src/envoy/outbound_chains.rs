//! The filter chains of one outbound listener, built per service as istiod builds them: HTTP to
//! the connection manager, TCP through the VirtualService's TCP rules (each rule's destination
//! subnets its match) or to the service, TLS by SNI through the TLS rules or to the service. A
//! chain's destination match is what tells services on a shared listener apart: a CIDR service's
//! CIDR, a service without an address nothing (the first such service takes the rest), and on a
//! service's own VIP listener nothing at all. Of chains with the same match the first wins (Envoy
//! refuses identical matches), as istiod merges them.

use std::collections::HashSet;

use envoy_types::pb::envoy::config::listener::v3::{Filter, FilterChainMatch};
use envoy_types::pb::envoy::extensions::filters::network::tcp_proxy::v3::tcp_proxy::ClusterSpecifier;

use super::http_match::RouteContext;
use super::names::{cluster_name, WILDCARD_ADDRESS};
use super::network_filter::{
    claim_server_names, destination_match, http_connection_manager, mongo_proxy, stat_prefix_of, tcp_proxy_filter,
    to_cluster, HttpClass,
};
use super::outbound_plan::{chain_services, ListenerProtocol, OutboundListener};
use super::scope::{Scope, VsRef};
use super::sniffing::require_http;
use super::tcp_route::{tcp_targets, tls_targets};
use crate::config::api::Protocol;
use crate::registry::{hosts_overlap, Service};

/// A chain before assembly: what it matches (the empty match: everything) and its filters.
pub(super) struct ChainOpt {
    /// The match.
    pub chain_match: FilterChainMatch,
    /// The filters.
    pub filters: Vec<Filter>,
    /// Whether it is the listener's connection manager.
    is_http: bool,
}

/// The chains of `l`, in order, identical matches dropped.
pub(super) fn chain_opts(scope: &Scope<'_>, l: &OutboundListener<'_>) -> Vec<ChainOpt> {
    let builder = Builder::new(scope, l);
    let mut opts = Vec::new();
    // Every HTTP chain of a listener is the same one connection manager (its route configuration
    // tells services apart): built once, where the first service needing it stands.
    let http = |opts: &mut Vec<ChainOpt>| {
        if !opts.iter().any(|o| o.is_http) {
            opts.push(builder.http());
        }
    };
    if l.protocol == ListenerProtocol::Http {
        http(&mut opts);
    } else {
        for (svc, port, protocol, destinations) in chain_services(scope, l) {
            let protocol = if l.members.is_some() { protocol } else { declared(l.protocol) };
            match protocol {
                p if p.is_http() => http(&mut opts),
                Protocol::Tls | Protocol::Https => opts.extend(builder.tls(svc, port, &destinations)),
                Protocol::Unsupported => {
                    opts.extend(builder.tcp(svc, port, Protocol::Unsupported, &destinations));
                    http(&mut opts);
                }
                p => opts.extend(builder.tcp(svc, port, p, &destinations)),
            }
        }
        if l.protocol == ListenerProtocol::Auto {
            // HTTP to an address no service claims still reaches the route configuration.
            http(&mut opts);
        }
    }
    let mut seen = Vec::new();
    opts.retain(|o| {
        let new = !seen.contains(&o.chain_match);
        if new {
            seen.push(o.chain_match.clone());
        }
        new
    });
    opts
}

/// The protocol an explicit egress listener declares, as the protocol of every service on it
/// (istiod builds its chains from the listener's port, not the services').
fn declared(protocol: ListenerProtocol) -> Protocol {
    match protocol {
        ListenerProtocol::Http => Protocol::Http,
        ListenerProtocol::Tls => Protocol::Tls,
        ListenerProtocol::Tcp => Protocol::Tcp,
        ListenerProtocol::Auto => Protocol::Unsupported,
    }
}

struct Builder<'s, 'a> {
    scope: &'s Scope<'a>,
    l: &'s OutboundListener<'a>,
    ctx: RouteContext<'a>,
    virtual_services: Vec<VsRef<'a>>,
    claimed_names: std::cell::RefCell<HashSet<String>>,
}

impl<'s, 'a> Builder<'s, 'a> {
    fn new(scope: &'s Scope<'a>, l: &'s OutboundListener<'a>) -> Self {
        let ctx = RouteContext {
            listen_port: l.port,
            gateway: "mesh",
            tls: false,
            labels: &scope.view.labels,
            namespace: scope.namespace(),
        };
        let virtual_services = scope.mesh_virtual_services(l.imports);
        Builder { scope, l, ctx, virtual_services, claimed_names: Default::default() }
    }

    /// The connection manager's chain: on the wildcard address or a sniffed listener only for
    /// what the HTTP inspector recognises as HTTP (other bytes follow the listener's TCP chains
    /// or the outbound policy), else everything.
    fn http(&self) -> ChainOpt {
        let sniffs = self.l.address == WILDCARD_ADDRESS || self.l.protocol == ListenerProtocol::Auto;
        let stat_prefix = format!("outbound_{}", self.l.name);
        let common = self.scope.http_common();
        let hcm = http_connection_manager(&stat_prefix, &self.l.route_name(), HttpClass::SidecarOutbound, common);
        ChainOpt {
            chain_match: if sniffs { require_http(None) } else { FilterChainMatch::default() },
            filters: vec![hcm],
            is_http: true,
        }
    }

    /// What tells a service's connections apart on this listener (see the module's doc): nothing
    /// on its own VIP listener, else its `destinations`.
    fn own(&self, destinations: &[String]) -> Vec<String> {
        if self.l.at_vip {
            Vec::new()
        } else {
            destinations.to_vec()
        }
    }

    fn virtual_services_for(&self, svc: &Service) -> Vec<VsRef<'a>> {
        let host = svc.hostname.as_str();
        self.virtual_services
            .iter()
            .filter(|(ix, _)| ix.hosts.iter().any(|h| hosts_overlap(h.as_str(), host)))
            .copied()
            .collect()
    }

    /// The TCP rules for `svc`, then, unless a rule took every destination, the service itself;
    /// on a MongoDB port behind the Mongo proxy, as istiod.
    fn tcp(&self, svc: &Service, port: u16, protocol: Protocol, destinations: &[String]) -> Vec<ChainOpt> {
        let stack = |target: &ClusterSpecifier| {
            let tcp = tcp_proxy_filter(stat_prefix_of(target), target.clone(), &self.scope.snapshot.mesh);
            match protocol {
                Protocol::Mongo => vec![mongo_proxy(stat_prefix_of(target)), tcp],
                _ => vec![tcp],
            }
        };
        let own = self.own(destinations);
        // `tcp_targets` keeps the VirtualServices for the host itself.
        let (targets, terminal) = tcp_targets(self.scope, &self.virtual_services, &svc.hostname, &self.ctx);
        let mut out = Vec::new();
        let mut covered = terminal;
        for t in targets {
            let subnets = if t.subnets.is_empty() { own.clone() } else { t.subnets };
            covered |= same_set(&subnets, &own);
            out.push(ChainOpt {
                chain_match: matching(&subnets, Vec::new()),
                filters: stack(&t.target),
                is_http: false,
            });
        }
        if !covered {
            let target = to_cluster(&cluster_name(port, "", svc.hostname.as_str()));
            out.push(ChainOpt { chain_match: matching(&own, Vec::new()), filters: stack(&target), is_http: false });
        }
        out
    }

    /// The TLS rules for `svc` by SNI, else the service itself: by its host name where its
    /// address does not tell it apart (no VIP listener of its own).
    fn tls(&self, svc: &Service, port: u16, destinations: &[String]) -> Vec<ChainOpt> {
        let mesh = &self.scope.snapshot.mesh;
        // An explicit listener tells TLS services apart by SNI alone.
        let own = if self.l.members.is_some() { self.own(destinations) } else { Vec::new() };
        let vss = self.virtual_services_for(svc);
        let targets = tls_targets(self.scope, &vss, &self.ctx, |_| true);
        let mut claimed = self.claimed_names.borrow_mut();
        let mut out = Vec::new();
        for t in &targets {
            let names = claim_server_names(&t.server_names, &mut claimed);
            if names.is_empty() {
                continue;
            }
            let subnets = if t.subnets.is_empty() { own.clone() } else { t.subnets.clone() };
            let filter = tcp_proxy_filter(stat_prefix_of(&t.target), t.target.clone(), mesh);
            out.push(ChainOpt { chain_match: matching(&subnets, names), filters: vec![filter], is_http: false });
        }
        if targets.is_empty() {
            let names = if self.l.at_vip && own.is_empty() {
                Vec::new()
            } else {
                let names = claim_server_names(&[svc.hostname.to_string()], &mut claimed);
                if names.is_empty() {
                    return out;
                }
                names
            };
            let target = to_cluster(&cluster_name(port, "", svc.hostname.as_str()));
            let filter = tcp_proxy_filter(stat_prefix_of(&target), target.clone(), mesh);
            out.push(ChainOpt { chain_match: matching(&own, names), filters: vec![filter], is_http: false });
        }
        out
    }
}

/// A match on destination `subnets` (IPs or CIDRs) and SNI `server_names` (empty: any).
fn matching(subnets: &[String], server_names: Vec<String>) -> FilterChainMatch {
    let mut m = destination_match(subnets).unwrap_or_default();
    m.server_names = server_names;
    m
}

fn same_set(a: &[String], b: &[String]) -> bool {
    let (mut a, mut b) = (a.to_vec(), b.to_vec());
    a.sort();
    b.sort();
    a == b
}
