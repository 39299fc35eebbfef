//! Sidecar LDS: the outbound listeners of the plan (`outbound_plan`), each with the chains its
//! services need (`outbound_chains`), and Istio's `virtualOutbound` listener when traffic is
//! redirected.

use std::collections::HashSet;

use envoy_types::pb::envoy::config::core::v3::TrafficDirection;
use envoy_types::pb::envoy::config::listener::v3::{FilterChain, FilterChainMatch, Listener};

use super::names::{
    BLACKHOLE_CLUSTER, PASSTHROUGH_CLUSTER, PASSTHROUGH_FILTER_CHAIN, VIRTUAL_OUTBOUND_LISTENER, VIRTUAL_OUTBOUND_PORT,
    WILDCARD_ADDRESS,
};
use super::network_filter::{
    accept_one_connection_per_event, chain, tcp_proxy_filter, tls_inspector, to_cluster, unlogged_blackhole,
    TRANSPORT_SOCKET_CONNECT_TIMEOUT,
};
use super::outbound_chains::{chain_opts, ChainOpt};
use super::outbound_plan::{outbound_plan, OutboundListener};
use super::proto::{bool_value, duration, resource, socket_address, u32_value, zero_duration};
use super::resource::Resource;
use super::scope::Scope;
use super::sniffing::http_inspector;
use crate::config::api::sidecar::OutboundMode;

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
    assemble(&mut listener, chain_opts(scope, l), scope);
    listener
}

/// The listener from its chains as istiod assembles it: a chain that matches everything becomes
/// the default chain, unless it is the only chain; without one the outbound policy is the
/// default. The TLS inspector comes first where a chain matches SNI, the HTTP inspector where
/// one matches HTTP ALPN values; every service chain bounds its TLS handshake (slow-handshake
/// attacks), the fallthrough chain does not.
fn assemble(listener: &mut Listener, opts: Vec<ChainOpt>, scope: &Scope<'_>) {
    let (mut tls, mut http) = (false, false);
    for opt in opts {
        let mut c = chain(String::new(), None, opt.filters, None);
        c.transport_socket_connect_timeout = Some(duration(TRANSPORT_SOCKET_CONNECT_TIMEOUT));
        if opt.chain_match == FilterChainMatch::default() {
            listener.default_filter_chain = Some(c);
            continue;
        }
        tls |= !opt.chain_match.server_names.is_empty();
        http |= !opt.chain_match.application_protocols.is_empty();
        c.filter_chain_match = Some(opt.chain_match);
        listener.filter_chains.push(c);
    }
    match listener.default_filter_chain.take() {
        Some(only) if listener.filter_chains.is_empty() => listener.filter_chains = vec![only],
        Some(default) => listener.default_filter_chain = Some(default),
        None => listener.default_filter_chain = Some(fallthrough_chain(scope)),
    }
    listener.listener_filters = [tls.then(tls_inspector), http.then(http_inspector)].into_iter().flatten().collect();
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
    fn tcp_services_get_a_listener_on_their_vip_with_weighted_routes() {
        let l = web_listener("240.0.0.10_5432");
        assert_eq!(l.filter_chains.len(), 1, "the address chose the service: one chain, no match");
        assert_eq!(l.filter_chains[0].filter_chain_match, None);
        assert_eq!(l.default_filter_chain, None);
        assert!(l.listener_filters.is_empty(), "no inspector needed");
        let tcp: TcpProxy = typed(&l.filter_chains[0]);
        let Some(ClusterSpecifier::WeightedClusters(w)) = tcp.cluster_specifier else { panic!("weighted expected") };
        let got: Vec<(&str, u32)> = w.clusters.iter().map(|c| (c.name.as_str(), c.weight)).collect();
        assert_eq!(
            got,
            [("outbound|5432||db.shop.svc.cluster.local", 80), ("outbound|5432||cache.shop.svc.cluster.local", 20)]
        );
        // The other service of the port has a listener of its own; nothing shares 0.0.0.0:5432.
        let cache = web_listener("240.0.0.11_5432");
        let tcp: TcpProxy = typed(&cache.filter_chains[0]);
        assert_eq!(
            tcp.cluster_specifier,
            Some(ClusterSpecifier::Cluster("outbound|5432||cache.shop.svc.cluster.local".into()))
        );
        let s = testdata_snapshot("features.yaml");
        assert!(
            !names(&s, &sidecar("shop", &[("app", "web")]), TypeUrl::Listener).contains(&"0.0.0.0_5432".to_string())
        );
    }

    #[test]
    fn an_egress_port_without_services_of_that_port_gets_no_listener() {
        // Its hosts name db, on 5432 only: istiod imports no service there, so builds nothing.
        let s = testdata_snapshot("features.yaml");
        let all = names(&s, &sidecar("shop", &[("app", "web")]), TypeUrl::Listener);
        assert!(!all.iter().any(|n| n.ends_with("_15432")), "{all:?}");
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
    fn unknown_protocol_ports_are_sniffed_on_the_services_vip_with_a_route_configuration_of_its_own() {
        let s = testdata_snapshot("inbound.yaml");
        let l: Listener = find(&s, &sidecar("shop", &[]), TypeUrl::Listener, "240.2.0.1_9000");
        let filters: Vec<&str> = l.listener_filters.iter().map(|f| f.name.as_str()).collect();
        assert_eq!(filters, [super::super::names::ext::HTTP_INSPECTOR], "no SNI to inspect");
        let alpn = |c: &FilterChain| c.filter_chain_match.clone().unwrap_or_default().application_protocols;
        assert_eq!(l.filter_chains.len(), 1, "HTTP, recognised by the inspector");
        assert!(!alpn(&l.filter_chains[0]).is_empty());
        let hcm: HttpConnectionManager = typed(&l.filter_chains[0]);
        let route = "orders.shop.svc.cluster.local:9000";
        assert!(matches!(hcm.route_specifier, Some(RouteSpecifier::Rds(r)) if r.route_config_name == route));
        let tcp: TcpProxy = typed(l.default_filter_chain.as_ref().expect("the rest: TCP to the service"));
        assert_eq!(
            tcp.cluster_specifier,
            Some(ClusterSpecifier::Cluster("outbound|9000||orders.shop.svc.cluster.local".into()))
        );
        let rc: envoy_types::pb::envoy::config::route::v3::RouteConfiguration =
            find(&s, &sidecar("shop", &[]), TypeUrl::Route, route);
        assert_eq!(rc.virtual_hosts.len(), 1, "the service's virtual host alone, no catch-all");
        assert_eq!(rc.virtual_hosts[0].domains, ["*"]);
        assert!(!names(&s, &sidecar("shop", &[]), TypeUrl::Route).contains(&"9000".to_string()));
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
        let redirected = sidecar_at("shop", &[("app", "legacy")], &["10.2.0.7"]);
        // Without a bind the ingress listener is the workload's address's: apart from outbound.
        let s = snapshot(&yaml);
        let own: Listener = find(&s, &redirected, TypeUrl::Listener, "10.2.0.7_5000");
        assert_eq!(own.traffic_direction, TrafficDirection::Inbound as i32);
        let out: Listener = find(&s, &redirected, TypeUrl::Listener, "0.0.0.0_5000");
        assert_eq!(out.traffic_direction, TrafficDirection::Outbound as i32);
        // Bound on 0.0.0.0, outbound 0.0.0.0_5000 and the ingress listener share a name.
        let s = snapshot(&yaml.replacen("    captureMode: NONE\n", "    captureMode: NONE\n    bind: 0.0.0.0\n", 1));
        let l: Listener = find(&s, &redirected, TypeUrl::Listener, "0.0.0.0_5000");
        assert_eq!(l.traffic_direction, TrafficDirection::Inbound as i32, "the workload's own port");
    }
}
