//! Gateway LDS: one bound listener per server address and port. HTTP servers share a connection
//! manager with route configuration `http.PORT`; otherwise each server adds filter chains (TLS
//! termination per SNI, SNI passthrough per VirtualService TLS rule, or TCP proxying).
//!
//! A port with an HTTP server serves only its HTTP servers, as Istio forbids mixing. A server
//! whose `credentialName` Secret is missing or incomplete in the proxy's namespace is left out
//! (never served in plaintext); the snapshot reports a name no namespace holds.

use std::collections::HashSet;

use envoy_types::pb::envoy::config::core::v3::{transport_socket, TrafficDirection};
use envoy_types::pb::envoy::config::listener::v3::{FilterChain, Listener};
use envoy_types::pb::envoy::extensions::transport_sockets::tls::v3::DownstreamTlsContext;
use prost::Message;

use super::authz;
use super::gateway::{gateway_ports, GatewayPort, GatewayServer, ServerKind};
use super::http_match::RouteContext;
use super::names::{gateway_http_route_name, listener_name};
use super::network_filter::{
    accept_one_connection_per_event, chain, claim_server_names, secured_http_connection_manager, sni_match,
    stat_prefix_of, tcp_proxy_filter, tls_inspector, to_cluster, HttpClass, TRANSPORT_SOCKET_CONNECT_TIMEOUT,
};
use super::outbound_clusters::outbound_clusters_of;
use super::proto::{duration, resource, socket_address};
use super::resource::Resource;
use super::scope::{Scope, VsRef};
use super::tcp_route::{tcp_target, tls_targets};
use super::tls::downstream_transport_socket;
use crate::registry::host_matches;

/// ALPN offered by HTTPS servers.
const HTTPS_ALPN: [&str; 2] = ["h2", "http/1.1"];

/// All listeners of a gateway proxy.
pub(super) fn listeners(scope: &Scope<'_>) -> Vec<Resource> {
    gateway_ports(scope)
        .iter()
        .filter_map(|gp| {
            let listener = gateway_listener(scope, gp)?;
            Some(resource(listener.name.clone(), listener))
        })
        .collect()
}

fn gateway_listener(scope: &Scope<'_>, gp: &GatewayPort<'_>) -> Option<Listener> {
    let name = listener_name(&gp.address, gp.port);
    let stat_prefix = format!("outbound_{name}");
    let chains = if gp.servers.iter().any(|s| s.kind == ServerKind::Http) {
        let security = authz::http_filters(scope);
        let hcm = secured_http_connection_manager(
            &stat_prefix,
            &gateway_http_route_name(gp.port),
            HttpClass::Gateway,
            scope.http_common(),
            security,
        );
        vec![chain(String::new(), None, vec![hcm], None)]
    } else {
        let mut chains = Chains::default();
        for server in &gp.servers {
            server_chains(scope, server, &stat_prefix, &mut chains);
        }
        chains.list
    };
    if chains.is_empty() {
        return None;
    }
    // istiod leaves a gateway's chains unnamed and bounds their TLS handshake (slow-handshake
    // attacks).
    let mut chains = chains;
    for c in &mut chains {
        c.transport_socket_connect_timeout = Some(duration(TRANSPORT_SOCKET_CONNECT_TIMEOUT));
    }
    // As istiod: the TLS inspector where a chain matches SNI or terminates TLS offering ALPN.
    let sni = chains
        .iter()
        .any(|c| c.filter_chain_match.as_ref().is_some_and(|m| !m.server_names.is_empty()) || offers_alpn(c));
    Some(Listener {
        name: name.clone(),
        address: Some(socket_address(&gp.address, u32::from(gp.port))),
        traffic_direction: TrafficDirection::Outbound as i32,
        filter_chains: chains,
        listener_filters: if sni { vec![tls_inspector()] } else { Vec::new() },
        max_connections_to_accept_per_socket_event: Some(accept_one_connection_per_event()),
        ..Default::default()
    })
}

/// Whether `chain` terminates TLS offering ALPN protocols.
fn offers_alpn(chain: &FilterChain) -> bool {
    let Some(transport_socket::ConfigType::TypedConfig(any)) =
        chain.transport_socket.as_ref().and_then(|t| t.config_type.as_ref())
    else {
        return false;
    };
    let tls = DownstreamTlsContext::decode(any.value.as_slice()).ok();
    tls.and_then(|t| t.common_tls_context).is_some_and(|c| !c.alpn_protocols.is_empty())
}

/// Filter chains of a listener, keeping their matches distinct.
#[derive(Default)]
struct Chains {
    list: Vec<FilterChain>,
    claimed: HashSet<String>,
    catch_all: bool,
}

impl Chains {
    /// Adds a chain for `hosts`: SNI-matched on the hosts not claimed yet, or match-less for `*`
    /// when no match-less chain exists. Returns false when nothing was left to match.
    fn add(&mut self, hosts: &[String], build: impl FnOnce() -> Option<FilterChain>) -> bool {
        let mut claimed = self.claimed.clone();
        let names = claim_server_names(hosts, &mut claimed);
        let wildcard = hosts.iter().any(|h| h == "*");
        if names.is_empty() && (!wildcard || self.catch_all) {
            return false;
        }
        let Some(mut c) = build() else { return false };
        c.filter_chain_match = sni_match(names.clone());
        self.catch_all |= names.is_empty();
        self.claimed = claimed;
        self.list.push(c);
        true
    }
}

fn server_chains(scope: &Scope<'_>, server: &GatewayServer<'_>, stat_prefix: &str, chains: &mut Chains) {
    let mesh = &scope.snapshot.mesh;
    let terminated = matches!(server.kind, ServerKind::HttpsTerminated { .. } | ServerKind::TlsTerminated);
    let ctx = RouteContext {
        listen_port: server.port,
        gateway: &server.gateway,
        tls: terminated,
        labels: &scope.view.labels,
        namespace: scope.namespace(),
    };
    let vss: Vec<VsRef<'_>> = scope
        .snapshot
        .virtual_services_for(scope.namespace(), &server.gateway)
        .into_iter()
        .filter(|vs| !server.exposed_hosts(*vs).is_empty())
        .collect();
    let hosts = server.plain_hosts();
    // A credential must be servable where this proxy runs (Istio reads it from there), and to
    // this proxy: an unverified gateway (plaintext port) is sent no secret, so a server needing
    // one is left out rather than waiting for a secret that never comes.
    let tls = server.server.tls.as_ref().filter(|t| {
        t.credential_name.is_empty()
            || (super::secret::may_have_credentials(scope) && scope.snapshot.credential_ready(scope.namespace(), t))
    });
    match &server.kind {
        ServerKind::Http => {}
        ServerKind::HttpsTerminated { route_name } => {
            chains.add(&hosts, || {
                let socket = downstream_transport_socket(tls?, &HTTPS_ALPN).ok()?;
                let prefix = if server.server.name.is_empty() { stat_prefix } else { &server.server.name };
                let hcm = secured_http_connection_manager(
                    prefix,
                    route_name,
                    HttpClass::Gateway,
                    scope.http_common(),
                    authz::http_filters(scope),
                );
                Some(chain(String::new(), None, vec![hcm], Some(socket)))
            });
        }
        ServerKind::TlsTerminated => {
            chains.add(&hosts, || {
                let socket = downstream_transport_socket(tls?, &[]).ok()?;
                let target = tcp_target(scope, &vss, None, &ctx)?;
                let filter = tcp_proxy_filter(stat_prefix_of(&target), target.clone(), mesh);
                Some(chain(String::new(), None, authz::secured_tcp(scope, filter), Some(socket)))
            });
        }
        ServerKind::TlsPassthrough => {
            let allowed = |sni: &str| hosts.iter().any(|h| host_matches(h, &sni.to_ascii_lowercase()));
            for t in tls_targets(scope, &vss, &ctx, allowed) {
                let filter = tcp_proxy_filter(stat_prefix_of(&t.target), t.target.clone(), mesh);
                chains
                    .add(&t.server_names, || Some(chain(String::new(), None, authz::secured_tcp(scope, filter), None)));
            }
        }
        ServerKind::AutoPassthrough => auto_passthrough_chains(scope, &hosts, chains),
        ServerKind::Tcp => {
            let Some(target) = tcp_target(scope, &vss, None, &ctx) else { return };
            let filter = tcp_proxy_filter(stat_prefix_of(&target), target.clone(), mesh);
            chains
                .add(&["*".to_string()], || Some(chain(String::new(), None, authz::secured_tcp(scope, filter), None)));
        }
    }
}

/// ALPNs of Istio's mutual TLS: an AUTO_PASSTHROUGH chain takes only connections offering one,
/// so what it forwards always meets an Istio mutual TLS chain on the other side.
const ISTIO_MTLS_ALPNS: [&str; 5] = ["istio", "istio-peer-exchange", "istio-http/1.0", "istio-http/1.1", "istio-h2"];

/// An AUTO_PASSTHROUGH server's chains, as istiod builds them: per port (and DestinationRule
/// subset) of every mesh-internal service the server's hosts cover, the SNI Istio's mutual TLS
/// sends (`outbound_.PORT_.SUBSET_.HOST`) forwarded to the SNI-DNAT cluster of that name, with
/// no authorization (the destination's sidecar enforces it).
fn auto_passthrough_chains(scope: &Scope<'_>, hosts: &[String], chains: &mut Chains) {
    let mesh = &scope.snapshot.mesh;
    let covered = scope
        .imported_services()
        .into_iter()
        .filter(|i| hosts.iter().any(|h| host_matches(h, i.service.hostname.as_str())));
    // Exactly the SNI-DNAT clusters CDS builds for those services.
    for cluster in outbound_clusters_of(scope, covered.collect()).into_iter().filter(|c| c.sni_dnat) {
        let filter = tcp_proxy_filter(&cluster.name, to_cluster(&cluster.name), mesh);
        let added =
            chains.add(std::slice::from_ref(&cluster.name), || Some(chain(String::new(), None, vec![filter], None)));
        if let Some(m) = chains.list.last_mut().and_then(|c| c.filter_chain_match.as_mut()).filter(|_| added) {
            m.application_protocols = ISTIO_MTLS_ALPNS.iter().map(|a| a.to_string()).collect();
        }
    }
}

#[cfg(test)]
mod tests {
    use envoy_types::pb::envoy::config::core::v3::transport_socket;
    use envoy_types::pb::envoy::config::listener::v3::filter;
    use envoy_types::pb::envoy::extensions::filters::network::http_connection_manager::v3::{
        http_connection_manager::RouteSpecifier, HttpConnectionManager,
    };
    use envoy_types::pb::envoy::extensions::filters::network::tcp_proxy::v3::{tcp_proxy::ClusterSpecifier, TcpProxy};
    use envoy_types::pb::envoy::extensions::transport_sockets::tls::v3::DownstreamTlsContext;

    use super::*;
    use crate::envoy::testing::{find, names, router, testdata_snapshot, unpack};
    use crate::envoy::TypeUrl;

    fn typed<T: prost::Message + Default>(chain: &FilterChain) -> T {
        match &chain.filters[0].config_type {
            Some(filter::ConfigType::TypedConfig(any)) => unpack(any),
            other => panic!("no typed config: {other:?}"),
        }
    }

    fn rds_name(chain: &FilterChain) -> String {
        let hcm: HttpConnectionManager = typed(chain);
        assert_eq!(hcm.use_remote_address.map(|b| b.value), Some(true));
        match hcm.route_specifier {
            Some(RouteSpecifier::Rds(rds)) => rds.route_config_name,
            other => panic!("not RDS: {other:?}"),
        }
    }

    fn bookinfo(name: &str) -> Listener {
        let s = testdata_snapshot("bookinfo.yaml");
        find(&s, &router("bookinfo", &[("istio", "ingressgateway")]), TypeUrl::Listener, name)
    }

    #[test]
    fn http_server_listens_on_its_port_with_rds_http_port() {
        let l = bookinfo("0.0.0.0_8080");
        assert_eq!(l.address, Some(socket_address("0.0.0.0", 8080)));
        assert_eq!(l.bind_to_port, None, "gateways bind");
        assert_eq!(rds_name(&l.filter_chains[0]), "http.8080");
    }

    #[test]
    fn https_server_terminates_tls_per_sni() {
        let l = bookinfo("0.0.0.0_8443");
        let chain = &l.filter_chains[0];
        assert_eq!(
            chain.filter_chain_match.as_ref().map(|m| m.server_names.clone()),
            Some(vec!["bookinfo.example.com".into()])
        );
        assert_eq!(rds_name(chain), "https.8443.https.bookinfo-gateway.bookinfo");
        let Some(transport_socket::ConfigType::TypedConfig(any)) =
            chain.transport_socket.as_ref().and_then(|t| t.config_type.clone())
        else {
            panic!("no TLS")
        };
        let tls: DownstreamTlsContext = unpack(&any);
        let cert = &tls.common_tls_context.expect("common").tls_certificate_sds_secret_configs[0];
        assert!(cert.name.starts_with("file-cert:") && cert.name.contains("tls.crt~"), "{}", cert.name);
        assert_eq!(l.listener_filters[0].name, crate::envoy::names::ext::TLS_INSPECTOR);
    }

    #[test]
    fn passthrough_server_forwards_by_sni_per_tls_route() {
        let l = bookinfo("0.0.0.0_8444");
        let chain = &l.filter_chains[0];
        assert_eq!(
            chain.filter_chain_match.as_ref().map(|m| m.server_names.clone()),
            Some(vec!["secure.example.com".into()])
        );
        let tcp: TcpProxy = typed(chain);
        assert_eq!(tcp.cluster_specifier, Some(ClusterSpecifier::Cluster("outbound|443||httpbin.org".into())));
    }

    #[test]
    fn tcp_server_binds_its_address_and_proxies_per_tcp_route() {
        let s = testdata_snapshot("features.yaml");
        let view = router("edge", &[("istio", "edge")]);
        assert_eq!(
            names(&s, &view, TypeUrl::Listener),
            ["0.0.0.0_443", "0.0.0.0_80", "0.0.0.0_9443", "127.0.0.1_5432"]
        );
        let l: Listener = find(&s, &view, TypeUrl::Listener, "127.0.0.1_5432");
        let tcp: TcpProxy = typed(&l.filter_chains[0]);
        assert_eq!(
            tcp.cluster_specifier,
            Some(ClusterSpecifier::Cluster("outbound|5432||db.shop.svc.cluster.local".into()))
        );
        let https: Listener = find(&s, &view, TypeUrl::Listener, "0.0.0.0_443");
        let routes: Vec<String> = https.filter_chains.iter().map(rds_name).collect();
        assert_eq!(routes, ["https.443.https-web.edge.edge", "https.443.https-legacy.edge.edge"]);
    }

    #[test]
    fn auto_passthrough_forwards_istio_sni_to_sni_dnat_clusters_without_tls() {
        use envoy_types::pb::envoy::config::cluster::v3::Cluster;

        use crate::envoy::testing::{service_entry, snapshot};
        let yaml = [
            service_entry("api", "ns"),
            service_entry("web", "other"),
            "apiVersion: networking.istio.io/v1\nkind: Gateway\nmetadata: {name: eastwest, namespace: istio-system}\n\
             spec: {selector: {istio: eastwest}, servers: [{port: {number: 15443, name: tls, protocol: TLS}, \
             hosts: ['*.ns.svc.cluster.local'], tls: {mode: AUTO_PASSTHROUGH}}]}\n---\n\
             apiVersion: networking.istio.io/v1\nkind: DestinationRule\nmetadata: {name: api, namespace: ns}\n\
             spec: {host: api.ns.svc.cluster.local, subsets: [{name: v1, labels: {version: v1}}]}\n"
                .to_string(),
        ]
        .concat();
        let s = snapshot(&yaml);
        let view = router("istio-system", &[("istio", "eastwest")]);
        let l: Listener = find(&s, &view, TypeUrl::Listener, "0.0.0.0_15443");
        let sni: Vec<Vec<String>> = l
            .filter_chains
            .iter()
            .filter_map(|c| c.filter_chain_match.as_ref().map(|m| m.server_names.clone()))
            .collect();
        let api = "api.ns.svc.cluster.local";
        assert_eq!(
            sni,
            [vec![format!("outbound_.80_._.{api}")], vec![format!("outbound_.80_.v1_.{api}")]],
            "web is not covered"
        );
        let m = l.filter_chains[0].filter_chain_match.clone().unwrap_or_default();
        assert_eq!(m.application_protocols, ISTIO_MTLS_ALPNS.map(String::from));
        let tcp: TcpProxy = typed(&l.filter_chains[1]);
        assert_eq!(tcp.cluster_specifier, Some(ClusterSpecifier::Cluster(format!("outbound_.80_.v1_.{api}"))));
        // The SNI-DNAT clusters (every mesh-internal service's) carry no TLS; EDS serves them.
        let dnat: Cluster = find(&s, &view, TypeUrl::Cluster, &format!("outbound_.80_.v1_.{api}"));
        assert!(dnat.transport_socket.is_none() && dnat.transport_socket_matches.is_empty(), "{dnat:?}");
        let clusters = names(&s, &view, TypeUrl::Cluster);
        assert!(clusters.contains(&"outbound_.80_._.web.other.svc.cluster.local".to_string()), "{clusters:?}");
        assert!(names(&s, &view, TypeUrl::Endpoint).contains(&format!("outbound_.80_._.{api}")));
        // Without an AUTO_PASSTHROUGH server there are none.
        let plain = names(&s, &router("istio-system", &[("istio", "other")]), TypeUrl::Cluster);
        assert!(plain.iter().all(|c| !c.starts_with("outbound_.")), "{plain:?}");
    }

    #[test]
    fn no_gateway_means_no_listeners() {
        let s = testdata_snapshot("bookinfo.yaml");
        assert!(names(&s, &router("bookinfo", &[("istio", "other")]), TypeUrl::Listener).is_empty());
    }
}
