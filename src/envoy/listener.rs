//! Sidecar LDS: outbound listeners per port (from the Sidecar's egress listeners, or from the
//! visible services' ports), and Istio's `virtualOutbound` listener when traffic is redirected.
//!
//! With several TCP services on one port, each service with addresses gets a filter chain matched
//! on them; the first service without addresses takes the remaining traffic, else the outbound
//! policy (PassthroughCluster or BlackHoleCluster) does.

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::sync::Arc;

use envoy_types::pb::envoy::config::core::v3::TrafficDirection;
use envoy_types::pb::envoy::config::listener::v3::{FilterChain, FilterChainMatch, Listener};

use super::http_match::RouteContext;
use super::names::{
    cluster_name, listener_name, BLACKHOLE_CLUSTER, LOCALHOST, PASSTHROUGH_CLUSTER, PASSTHROUGH_FILTER_CHAIN,
    VIRTUAL_OUTBOUND_LISTENER, VIRTUAL_OUTBOUND_PORT, WILDCARD_ADDRESS,
};
use super::network_filter::{
    accept_one_connection_per_event, chain, claim_server_names, destination_match, http_connection_manager, sni_match,
    stat_prefix_of, tcp_proxy_filter, tls_inspector, to_cluster, unlogged_blackhole, HttpClass,
    TRANSPORT_SOCKET_CONNECT_TIMEOUT,
};
use super::proto::{bool_value, duration, resource, socket_address, u32_value, zero_duration};
use super::resource::Resource;
use super::scope::{Imports, Scope};
use super::sniffing::{http_inspector, require_http};
use super::tcp_route::{tcp_target, tls_targets};
use crate::config::api::sidecar::{CaptureMode, OutboundMode};
use crate::config::api::Protocol;
use crate::registry::{hosts_overlap, Service};

/// How an outbound listener treats connections.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum ListenerProtocol {
    /// HTTP connection manager with RDS route config `PORT`.
    Http,
    /// TCP proxy per service.
    Tcp,
    /// TCP proxy per SNI.
    Tls,
    /// Sniffed (a service of unknown protocol on the port): HTTP, recognised by the HTTP
    /// inspector, to the connection manager; the rest as on a TCP listener.
    Auto,
}

/// One outbound listener of a sidecar.
pub(super) struct OutboundListener<'a> {
    /// `ADDRESS_PORT`.
    pub name: String,
    /// Address.
    pub address: String,
    /// Port.
    pub port: u16,
    /// Whether Envoy binds the address (else only `virtualOutbound` hands connections to it).
    pub bound: bool,
    /// Protocol.
    pub protocol: ListenerProtocol,
    /// What the listener's hosts are.
    pub imports: Imports<'a>,
    /// Declared by a Sidecar egress listener (not derived from service ports).
    pub explicit: bool,
}

/// The sidecar's outbound listeners, first claim of a name winning.
pub(super) fn outbound_plan<'a>(scope: &Scope<'a>) -> Vec<OutboundListener<'a>> {
    let intercepted = scope.view.interception.intercepts();
    let mut out: Vec<OutboundListener<'a>> = Vec::new();
    let mut claimed = BTreeSet::new();
    for egress in scope.egress_listeners() {
        let Some(port) = &egress.port else { continue };
        let Some(number) = u16::try_from(port.number).ok().filter(|n| *n != 0) else { continue };
        let declared =
            if port.protocol.is_empty() { port.name.split('-').next().unwrap_or_default() } else { &port.protocol };
        let binds = egress.capture_mode == Some(CaptureMode::None) || !intercepted;
        let address = match (egress.bind.as_str(), binds) {
            ("", true) => LOCALHOST.to_string(),
            ("", false) => WILDCARD_ADDRESS.to_string(),
            (bind, _) => bind.to_string(),
        };
        claimed.insert(number);
        out.push(OutboundListener {
            name: listener_name(&address, number),
            address,
            port: number,
            bound: binds,
            protocol: listener_protocol([Protocol::parse(declared)].into_iter()),
            imports: Imports::of(egress, scope.namespace()),
            explicit: true,
        });
    }
    if let Some(imports) = scope.catch_all_imports() {
        let mut by_port: BTreeMap<u16, Vec<Protocol>> = BTreeMap::new();
        for svc in scope.services_in(imports) {
            for p in svc.ports.iter().filter(|p| p.number != 0 && !claimed.contains(&p.number)) {
                by_port.entry(p.number).or_default().push(p.protocol);
            }
        }
        let address = if intercepted { WILDCARD_ADDRESS } else { LOCALHOST };
        for (port, protocols) in by_port {
            out.push(OutboundListener {
                name: listener_name(address, port),
                address: address.to_string(),
                port,
                bound: !intercepted,
                protocol: listener_protocol(protocols.into_iter()),
                imports,
                explicit: false,
            });
        }
    }
    let mut names = HashSet::new();
    out.retain(|l| names.insert(l.name.clone()));
    out
}

/// A port with a service of unknown protocol is sniffed, as in Istio; else HTTP wins a port
/// shared with other protocols; TLS needs every service to be TLS.
fn listener_protocol(mut protocols: impl Iterator<Item = Protocol> + Clone) -> ListenerProtocol {
    if protocols.clone().any(|p| p == Protocol::Unsupported) {
        ListenerProtocol::Auto
    } else if protocols.clone().any(Protocol::is_http) {
        ListenerProtocol::Http
    } else if protocols.all(|p| matches!(p, Protocol::Tls | Protocol::Https)) {
        ListenerProtocol::Tls
    } else {
        ListenerProtocol::Tcp
    }
}

/// All listeners of a sidecar.
pub(super) fn listeners(scope: &Scope<'_>) -> Vec<Resource> {
    let plan = outbound_plan(scope);
    // As in Istio, a redirected sidecar always has the listener iptables sends traffic to.
    let redirect = scope.view.interception.intercepts();
    // The workload's own ports come first: an outbound listener of the same address and port
    // (a service port equal to a bound ingress port) gives way, as in Istio.
    let mut out = super::inbound::listeners(scope);
    let inbound: HashSet<String> = out.iter().map(|r| r.name.clone()).collect();
    out.extend(
        plan.iter()
            // The virtual listener owns its port when traffic is redirected.
            .filter(|l| !(redirect && l.port == VIRTUAL_OUTBOUND_PORT))
            .filter(|l| !inbound.contains(&l.name))
            .map(|l| resource(l.name.clone(), outbound_listener(scope, l))),
    );
    if redirect {
        out.push(resource(VIRTUAL_OUTBOUND_LISTENER, virtual_outbound(scope)));
    }
    out
}

fn outbound_listener(scope: &Scope<'_>, l: &OutboundListener<'_>) -> Listener {
    let mut listener = Listener {
        name: l.name.clone(),
        address: Some(socket_address(&l.address, u32::from(l.port))),
        traffic_direction: TrafficDirection::Outbound as i32,
        bind_to_port: (!l.bound).then(|| bool_value(false)),
        max_connections_to_accept_per_socket_event: l.bound.then(accept_one_connection_per_event),
        // Istio's protocolDetectionTimeout (0s: no limit): a connection whose client stays silent
        // is not dropped by the inspectors.
        listener_filters_timeout: Some(zero_duration()),
        continue_on_listener_filters_timeout: true,
        ..Default::default()
    };
    match l.protocol {
        ListenerProtocol::Http => {
            // As istiod: HTTP (by the HTTP inspector) to the connection manager, anything else
            // (TLS, another protocol) through the outbound policy.
            let stat_prefix = format!("outbound_{}", l.name);
            let common = scope.http_common();
            let hcm = http_connection_manager(&stat_prefix, &l.port.to_string(), HttpClass::SidecarOutbound, common);
            listener.filter_chains = vec![chain(String::new(), Some(require_http(None)), vec![hcm], None)];
            listener.default_filter_chain = Some(fallthrough_chain(scope));
            listener.listener_filters = vec![http_inspector()];
        }
        ListenerProtocol::Tcp => {
            let (chains, default) = tcp_chains(scope, l);
            set_chains(&mut listener, chains, default, scope);
        }
        ListenerProtocol::Auto => {
            let (chains, default) = tcp_chains(scope, l);
            set_chains(&mut listener, chains, default, scope);
            // The TLS inspector first: TLS is never taken for HTTP.
            listener.listener_filters = vec![tls_inspector(), http_inspector()];
        }
        ListenerProtocol::Tls => {
            set_chains(&mut listener, tls_chains(scope, l), None, scope);
            listener.listener_filters = vec![tls_inspector()];
        }
    }
    // istiod bounds the TLS handshake of every chain it builds for a service (slow-handshake
    // attacks); not of the fallthrough chain.
    let default = listener.default_filter_chain.iter_mut().filter(|c| c.name != PASSTHROUGH_FILTER_CHAIN);
    for chain in listener.filter_chains.iter_mut().chain(default) {
        chain.transport_socket_connect_timeout = Some(duration(TRANSPORT_SOCKET_CONNECT_TIMEOUT));
    }
    listener
}

fn context<'a>(scope: &Scope<'a>, port: u16) -> RouteContext<'a> {
    RouteContext {
        listen_port: port,
        gateway: "mesh",
        tls: false,
        labels: &scope.view.labels,
        namespace: scope.namespace(),
    }
}

/// The services a listener serves, each with the service port its cluster is for: the listener's
/// port, or, on a Sidecar egress listener with another port, a single-port service's only port
/// of a compatible protocol (Istio picks that port for TCP too; multi-port services need a
/// VirtualService there).
pub(super) fn services_on_port<'a>(scope: &Scope<'a>, l: &OutboundListener<'a>) -> Vec<(&'a Arc<Service>, u16)> {
    scope
        .services_in(l.imports)
        .into_iter()
        .filter_map(|s| {
            let port = match (s.port(l.port), s.ports.as_slice()) {
                (Some(p), _) => p.number,
                (None, [only]) if l.explicit && compatible(l.protocol, only.protocol) => only.number,
                _ => return None,
            };
            Some((s, port))
        })
        .collect()
}

/// HTTP listeners route only HTTP services; TCP, TLS and sniffed listeners forward any bytes.
fn compatible(listener: ListenerProtocol, service: Protocol) -> bool {
    listener != ListenerProtocol::Http || service.is_http()
}

/// Chains per service address, and the default chain for everything else. On a sniffed port,
/// HTTP (by ALPN) to a sniffed service's address or to an address no chain claims goes to the
/// connection manager, and all traffic to a declared HTTP service's address does.
fn tcp_chains(scope: &Scope<'_>, l: &OutboundListener<'_>) -> (Vec<FilterChain>, Option<FilterChain>) {
    let mesh = &scope.snapshot.mesh;
    let ctx = context(scope, l.port);
    let vss = scope.mesh_virtual_services(l.imports);
    let sniffed = l.protocol == ListenerProtocol::Auto;
    let stat_prefix = format!("outbound_{}", l.name);
    let common = scope.http_common();
    let hcm = || http_connection_manager(&stat_prefix, &l.port.to_string(), HttpClass::SidecarOutbound, common);
    let mut chains = Vec::new();
    let mut seen_matches = HashSet::new();
    let mut default = None;
    for (svc, port) in services_on_port(scope, l) {
        let protocol = svc.port(port).map(|p| p.protocol).unwrap_or(Protocol::Tcp);
        let target = tcp_target(scope, &vss, Some(&svc.hostname), &ctx)
            .unwrap_or_else(|| to_cluster(&cluster_name(port, "", svc.hostname.as_str())));
        let filter = tcp_proxy_filter(stat_prefix_of(&target), target.clone(), mesh);
        let name = svc.hostname.to_string();
        match destination_match(&svc.addresses) {
            Some(m) if seen_matches.insert(format!("{:?}", m.prefix_ranges)) => {
                if sniffed && protocol.is_http() {
                    chains.push(chain(name, Some(m), vec![hcm()], None));
                    continue;
                }
                if sniffed && protocol == Protocol::Unsupported {
                    chains.push(chain(name.clone(), Some(require_http(Some(m.clone()))), vec![hcm()], None));
                }
                chains.push(chain(name, Some(m), vec![filter], None));
            }
            Some(_) => {}
            None if default.is_none() && !(sniffed && protocol.is_http()) => {
                default = Some(chain(name, None, vec![filter], None));
            }
            None => {}
        }
    }
    if sniffed {
        chains.push(chain(format!("{}-http", l.name), Some(require_http(None)), vec![hcm()], None));
    }
    (chains, default)
}

/// Chains per SNI: VirtualService TLS rules first, then each service's own host.
fn tls_chains(scope: &Scope<'_>, l: &OutboundListener<'_>) -> Vec<FilterChain> {
    let mesh = &scope.snapshot.mesh;
    let ctx = context(scope, l.port);
    let services = services_on_port(scope, l);
    let vss: Vec<_> = scope
        .mesh_virtual_services(l.imports)
        .into_iter()
        .filter(|(ix, _)| {
            ix.hosts.iter().any(|h| services.iter().any(|(s, _)| hosts_overlap(h.as_str(), s.hostname.as_str())))
        })
        .collect();
    let mut claimed = HashSet::new();
    let mut chains = Vec::new();
    for t in tls_targets(scope, &vss, &ctx, |_| true) {
        let names = claim_server_names(&t.server_names, &mut claimed);
        if names.is_empty() {
            continue;
        }
        let filter = tcp_proxy_filter(stat_prefix_of(&t.target), t.target.clone(), mesh);
        chains.push(chain(names.join(","), sni_match(names), vec![filter], None));
    }
    for (svc, port) in &services {
        let names = claim_server_names(&[svc.hostname.to_string()], &mut claimed);
        if names.is_empty() {
            continue;
        }
        let target = to_cluster(&cluster_name(*port, "", svc.hostname.as_str()));
        let filter = tcp_proxy_filter(stat_prefix_of(&target), target.clone(), mesh);
        chains.push(chain(svc.hostname.to_string(), sni_match(names), vec![filter], None));
    }
    chains
}

/// Where unknown destinations go: PassthroughCluster (ALLOW_ANY) or BlackHoleCluster.
/// A listener's chains, and the chain for connections none matches: a service's chain that
/// matches everything (`catch_all`), else the outbound policy. As istiod lays it out, a service's
/// catch-all chain with no other chain beside it is the listener's only chain.
fn set_chains(listener: &mut Listener, chains: Vec<FilterChain>, catch_all: Option<FilterChain>, scope: &Scope<'_>) {
    match (chains.is_empty(), catch_all) {
        (true, Some(only)) => listener.filter_chains = vec![only],
        (_, catch_all) => {
            listener.filter_chains = chains;
            listener.default_filter_chain = Some(catch_all.unwrap_or_else(|| fallthrough_chain(scope)));
        }
    }
}

/// The default chain of an outbound port listener: the outbound policy, under istiod's name and
/// with an empty match.
fn fallthrough_chain(scope: &Scope<'_>) -> FilterChain {
    let mut fallthrough = policy_chain(scope);
    fallthrough.name = PASSTHROUGH_FILTER_CHAIN.to_string();
    fallthrough.filter_chain_match = Some(FilterChainMatch::default());
    fallthrough
}

/// Connections iptables sent to the virtual outbound port itself: refused (black hole), so that
/// nothing passes through back to the listener's own port in a loop.
fn loop_guard_chain() -> FilterChain {
    let guard =
        FilterChainMatch { destination_port: Some(u32_value(u32::from(VIRTUAL_OUTBOUND_PORT))), ..Default::default() };
    chain(format!("{VIRTUAL_OUTBOUND_LISTENER}-blackhole"), Some(guard), vec![unlogged_blackhole()], None)
}

fn policy_chain(scope: &Scope<'_>) -> FilterChain {
    let cluster = match scope.outbound_mode {
        OutboundMode::AllowAny => PASSTHROUGH_CLUSTER,
        OutboundMode::RegistryOnly => BLACKHOLE_CLUSTER,
    };
    let filter = tcp_proxy_filter(cluster, to_cluster(cluster), &scope.snapshot.mesh);
    chain(cluster.to_string(), None, vec![filter], None)
}

/// Istio's `virtualOutbound`: binds 0.0.0.0:15001, where iptables sends outbound connections, and
/// hands each to the listener of its original destination; unmatched ones follow the policy.
fn virtual_outbound(scope: &Scope<'_>) -> Listener {
    let mut catch_all = policy_chain(scope);
    catch_all.name = format!("{VIRTUAL_OUTBOUND_LISTENER}-catchall-tcp");
    Listener {
        name: VIRTUAL_OUTBOUND_LISTENER.to_string(),
        address: Some(socket_address(WILDCARD_ADDRESS, u32::from(VIRTUAL_OUTBOUND_PORT))),
        use_original_dst: Some(bool_value(true)),
        traffic_direction: TrafficDirection::Outbound as i32,
        filter_chains: vec![loop_guard_chain(), catch_all],
        max_connections_to_accept_per_socket_event: Some(accept_one_connection_per_event()),
        // TPROXY keeps the original addresses on the socket: Envoy must accept them as its own.
        transparent: (scope.view.interception == crate::envoy::Interception::Tproxy).then(|| bool_value(true)),
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use envoy_types::pb::envoy::config::listener::v3::filter;
    use envoy_types::pb::envoy::extensions::filters::network::http_connection_manager::v3::{
        http_connection_manager::RouteSpecifier, HttpConnectionManager,
    };
    use envoy_types::pb::envoy::extensions::filters::network::tcp_proxy::v3::{tcp_proxy::ClusterSpecifier, TcpProxy};

    use super::*;
    use crate::envoy::testing::{find, names, sidecar, testdata_snapshot, unpack};
    use crate::envoy::Interception;
    use crate::envoy::TypeUrl;

    fn web_listener(name: &str) -> Listener {
        let s = testdata_snapshot("features.yaml");
        find(&s, &sidecar("shop", &[("app", "web")]), TypeUrl::Listener, name)
    }

    fn typed<T: prost::Message + Default>(chain: &FilterChain) -> T {
        match &chain.filters[0].config_type {
            Some(filter::ConfigType::TypedConfig(any)) => unpack(any),
            other => panic!("no typed config: {other:?}"),
        }
    }

    fn rds_name(l: &Listener) -> String {
        let hcm: HttpConnectionManager = typed(&l.filter_chains[0]);
        match hcm.route_specifier {
            Some(RouteSpecifier::Rds(rds)) => rds.route_config_name,
            other => panic!("not RDS: {other:?}"),
        }
    }

    #[test]
    fn egress_listener_with_bind_is_bound_and_named_by_address() {
        let l = web_listener("127.0.0.1_18080");
        assert_eq!(l.bind_to_port, None, "bound (Envoy's default)");
        assert_eq!(l.address, Some(socket_address("127.0.0.1", 18080)));
        assert_eq!(rds_name(&l), "18080");
    }

    #[test]
    fn redirected_listeners_do_not_bind_and_virtual_outbound_does() {
        let l = web_listener("0.0.0.0_8080");
        assert_eq!(l.bind_to_port.map(|b| b.value), Some(false));
        assert_eq!(rds_name(&l), "8080");
        let vo = web_listener(VIRTUAL_OUTBOUND_LISTENER);
        assert_eq!(vo.use_original_dst.map(|b| b.value), Some(true));
        assert_eq!(vo.address, Some(socket_address("0.0.0.0", 15001)));
        let tcp: TcpProxy = typed(&vo.filter_chains[0]);
        assert_eq!(tcp.cluster_specifier, Some(ClusterSpecifier::Cluster(BLACKHOLE_CLUSTER.into())), "REGISTRY_ONLY");
    }

    #[test]
    fn without_interception_listeners_bind_localhost() {
        let s = testdata_snapshot("bookinfo.yaml");
        let mut view = sidecar("bookinfo", &[]);
        view.interception = Interception::None;
        let all = names(&s, &view, TypeUrl::Listener);
        assert_eq!(all, ["127.0.0.1_27017", "127.0.0.1_443", "127.0.0.1_80", "127.0.0.1_9080"]);
    }

    #[test]
    fn tcp_services_get_chains_by_address_and_weighted_routes() {
        let l = web_listener("0.0.0.0_5432");
        let db = l.filter_chains.iter().find(|c| c.name == "db.shop.svc.cluster.local").expect("db chain");
        let ranges = &db.filter_chain_match.as_ref().expect("match").prefix_ranges;
        assert_eq!(ranges[0].address_prefix, "240.0.0.10");
        let tcp: TcpProxy = typed(db);
        let Some(ClusterSpecifier::WeightedClusters(w)) = tcp.cluster_specifier else { panic!("weighted expected") };
        let got: Vec<(&str, u32)> = w.clusters.iter().map(|c| (c.name.as_str(), c.weight)).collect();
        assert_eq!(
            got,
            [("outbound|5432||db.shop.svc.cluster.local", 80), ("outbound|5432||cache.shop.svc.cluster.local", 20)]
        );
        let default = l.default_filter_chain.expect("default chain");
        let tcp: TcpProxy = typed(&default);
        assert_eq!(tcp.cluster_specifier, Some(ClusterSpecifier::Cluster(BLACKHOLE_CLUSTER.into())));
    }

    #[test]
    fn explicit_tcp_egress_port_forwards_to_the_single_port_service() {
        let l = web_listener("0.0.0.0_15432");
        assert_eq!(l.filter_chains.len(), 1);
        let tcp: TcpProxy = typed(&l.filter_chains[0]);
        // The VirtualService's TCP rule matches port 5432 only, so the service's own cluster is used.
        assert_eq!(
            tcp.cluster_specifier,
            Some(ClusterSpecifier::Cluster("outbound|5432||db.shop.svc.cluster.local".into()))
        );
    }

    #[test]
    fn tls_ports_match_sni_after_the_tls_inspector() {
        let l = web_listener("0.0.0.0_443");
        assert_eq!(l.listener_filters[0].name, crate::envoy::names::ext::TLS_INSPECTOR);
        let chain = &l.filter_chains[0];
        assert_eq!(
            chain.filter_chain_match.as_ref().map(|m| m.server_names.clone()),
            Some(vec!["api.partner.example".into()])
        );
        let tcp: TcpProxy = typed(chain);
        assert_eq!(
            tcp.cluster_specifier,
            Some(ClusterSpecifier::Cluster("outbound|443|pool-a|api.partner.example".into()))
        );
    }

    #[test]
    fn unknown_protocol_ports_are_sniffed() {
        let s = testdata_snapshot("inbound.yaml");
        let l: Listener = find(&s, &sidecar("shop", &[]), TypeUrl::Listener, "0.0.0.0_9000");
        let filters: Vec<&str> = l.listener_filters.iter().map(|f| f.name.as_str()).collect();
        assert_eq!(filters, [super::super::names::ext::TLS_INSPECTOR, super::super::names::ext::HTTP_INSPECTOR]);
        let alpn = |c: &FilterChain| c.filter_chain_match.clone().unwrap_or_default().application_protocols;
        let http: Vec<&FilterChain> = l.filter_chains.iter().filter(|c| !alpn(c).is_empty()).collect();
        assert_eq!(http.len(), 2, "HTTP to the service's address and HTTP to any other address");
        assert!(http.iter().all(|c| alpn(c) == ["http/1.1", "h2c"]));
        let hcm: HttpConnectionManager = typed(http[0]);
        assert!(matches!(hcm.route_specifier, Some(RouteSpecifier::Rds(r)) if r.route_config_name == "9000"));
        let tcp: TcpProxy = typed(l.default_filter_chain.as_ref().expect("default"));
        assert_eq!(tcp.cluster_specifier, Some(ClusterSpecifier::Cluster(PASSTHROUGH_CLUSTER.into())));
        assert!(names(&s, &sidecar("shop", &[]), TypeUrl::Route).contains(&"9000".to_string()));
    }

    #[test]
    fn a_bound_ingress_port_wins_over_an_outbound_listener_of_the_same_name() {
        use crate::envoy::testing::{sidecar_at, snapshot, testdata};
        let mut yaml = std::fs::read_to_string(testdata().join("inbound.yaml")).expect("inbound.yaml");
        yaml.push_str(
            "---\napiVersion: networking.istio.io/v1\nkind: ServiceEntry\nmetadata: {name: admin, namespace: shop}\n\
             spec: {hosts: [admin.shop.svc.cluster.local], location: MESH_INTERNAL, resolution: STATIC, \
             ports: [{number: 5000, name: http, protocol: HTTP}], endpoints: [{address: 10.2.0.9}]}\n",
        );
        let s = snapshot(&yaml);
        let redirected = sidecar_at("shop", &[("app", "legacy")], &["10.2.0.7"]);
        // Redirected: outbound 0.0.0.0_5000 and the bound ingress listener 0.0.0.0_5000 share a name.
        let l: Listener = find(&s, &redirected, TypeUrl::Listener, "0.0.0.0_5000");
        assert_eq!(l.traffic_direction, TrafficDirection::Inbound as i32, "the workload's own port");
    }
}
