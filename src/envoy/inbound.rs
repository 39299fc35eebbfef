//! A sidecar's inbound side (LDS): Istio's `virtualInbound` listener on 15006, where iptables
//! sends connections into the pod, with a filter chain (set) per port of the proxy's service
//! instances — or per Sidecar `ingress` listener, which replace them — and passthrough chains for
//! ports nobody declares. Ingress listeners that capture nothing get listeners of their own.

use std::net::IpAddr;

use envoy_types::pb::envoy::config::core::v3::TrafficDirection;
use envoy_types::pb::envoy::config::listener::v3::{Filter, FilterChain, FilterChainMatch, Listener};

use super::authz;
use super::inbound_http::{inbound_http_connection_manager, InboundRoute};
use super::inbound_mtls::{inbound_chains, ChainProtocol};
use super::names::{
    inbound_cluster_name, listener_name, BLACKHOLE_CLUSTER, INBOUND_PASSTHROUGH_CLUSTER, VIRTUAL_INBOUND_BLACKHOLE,
    VIRTUAL_INBOUND_CATCHALL_HTTP, VIRTUAL_INBOUND_LISTENER, VIRTUAL_INBOUND_PORT, WILDCARD_ADDRESS,
};
use super::network_filter::{accept_one_connection_per_event, chain, tcp_proxy_filter, to_cluster};
use super::proto::{bool_value, resource, socket_address, u32_value, zero_duration};
use super::resource::Resource;
use super::scope::Scope;
use super::sniffing::{inspectors, original_dst, original_src, Sniffed};
use super::tls::downstream_transport_socket;
use crate::config::api::gateway::ServerTlsSettings;
use crate::config::api::sidecar::{CaptureMode, IstioIngressListener};
use crate::config::api::Protocol;
use crate::envoy::{Interception, ProxyKind};
use crate::registry::ServiceKey;
use crate::snapshot::PeerMtls;

/// Where an inbound cluster sends connections.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum InboundEndpoint {
    /// The connection's original destination (the workload's IP and port).
    OriginalDst,
    /// A fixed address and port (`127.0.0.1:PORT`, or the workload's IP).
    Address(String, u16),
    /// A unix socket (`unix://PATH`).
    Unix(String),
}

/// One inbound port: filter chains of `virtualInbound`, or a listener of its own when `bound`.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct InboundChain {
    /// The port connections arrive on (chains match it; the cluster is named after it).
    pub target_port: u16,
    /// The service (or ingress) port, which names the virtual host.
    pub port: u16,
    /// The port's protocol.
    pub protocol: Protocol,
    /// Address the chain is named after (and a bound listener binds).
    pub bind: String,
    /// Whether the chain is a listener of its own (nothing redirects to it).
    pub bound: bool,
    /// Where the inbound cluster goes.
    pub endpoint: InboundEndpoint,
    /// The service the port belongs to (none for Sidecar ingress listeners).
    pub service: Option<ServiceKey>,
    /// For a Sidecar ingress listener, the host its telemetry names (istiod's synthetic
    /// `SIDECAR.NAMESPACE`): its route's trace operation.
    pub sidecar_host: Option<String>,
    /// A Sidecar ingress listener's own TLS, replacing mesh mutual TLS on the port.
    pub tls: Option<ServerTlsSettings>,
}

/// The inbound ports of a sidecar: its Sidecar's ingress listeners if it declares any, else its
/// service instances' ports when its traffic is redirected (without redirection, the workload
/// owns those ports and the proxy cannot listen there).
pub(super) fn inbound_plan(scope: &Scope<'_>) -> Vec<InboundChain> {
    if scope.view.kind != ProxyKind::Sidecar {
        return Vec::new();
    }
    let ingress = scope.sidecar.map(|s| s.ingress_listeners()).unwrap_or_default();
    let sidecar_host = scope.sidecar_key.map(|k| format!("{}.{}", k.name, k.namespace));
    let intercepted = scope.view.interception.intercepts();
    let mut out: Vec<InboundChain> = Vec::new();
    if ingress.is_empty() {
        if intercepted {
            out = scope
                .view
                .inbound
                .iter()
                .map(|p| InboundChain {
                    target_port: p.target_port,
                    port: p.port,
                    protocol: p.protocol,
                    bind: WILDCARD_ADDRESS.to_string(),
                    bound: false,
                    endpoint: InboundEndpoint::OriginalDst,
                    service: Some(p.service.clone()),
                    sidecar_host: None,
                    tls: None,
                })
                .collect();
        }
    } else {
        for l in &ingress {
            let Some(mut c) = ingress_chain(l, intercepted, &scope.view.ips) else { continue };
            c.sidecar_host = sidecar_host.clone();
            // The first listener of a port wins, as the oldest does in Istio.
            if !out.iter().any(|o| o.target_port == c.target_port) {
                out.push(c);
            }
        }
    }
    // A chain for the virtual listener's own port would shadow its loop guard.
    out.retain(|c| c.bound || c.target_port != VIRTUAL_INBOUND_PORT);
    out.sort_by_key(|c| c.target_port);
    out
}

fn ingress_chain(l: &IstioIngressListener, intercepted: bool, ips: &[String]) -> Option<InboundChain> {
    let port = l.port.as_ref()?;
    let number = u16::try_from(port.number).ok().filter(|n| *n != 0)?;
    let bound = match l.capture_mode {
        Some(CaptureMode::None) => true,
        Some(CaptureMode::Iptables) => false,
        Some(CaptureMode::Default) | None => !intercepted,
    };
    // Without a bind, istiod names (and binds) the port after the workload's first global
    // unicast address.
    let bind = match l.bind.as_str() {
        "" => ips
            .iter()
            .filter_map(|ip| ip.parse::<IpAddr>().ok())
            .find(is_global_unicast)
            .map_or_else(|| WILDCARD_ADDRESS.to_string(), |ip| ip.to_string()),
        bind => bind.to_string(),
    };
    Some(InboundChain {
        target_port: number,
        port: number,
        protocol: Protocol::parse(&port.protocol),
        bind,
        bound,
        endpoint: default_endpoint(&l.default_endpoint, ips)?,
        service: None,
        sidecar_host: None,
        tls: l.tls.clone(),
    })
}

/// Go's `IsGlobalUnicast`: not unspecified, loopback, multicast, link-local or broadcast.
fn is_global_unicast(ip: &IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => {
            !(v4.is_unspecified() || v4.is_loopback() || v4.is_multicast() || v4.is_link_local() || v4.is_broadcast())
        }
        IpAddr::V6(v6) => {
            !(v6.is_unspecified() || v6.is_loopback() || v6.is_multicast() || (v6.segments()[0] & 0xffc0) == 0xfe80)
        }
    }
}

/// Istio's reading of `defaultEndpoint`: `0.0.0.0`/`[::]` stand for the workload's own IPv4/IPv6
/// address (loopback without one), `127.0.0.1`/`[::1]` for loopback.
fn default_endpoint(endpoint: &str, ips: &[String]) -> Option<InboundEndpoint> {
    if endpoint.is_empty() {
        return Some(InboundEndpoint::OriginalDst);
    }
    if let Some(path) = endpoint.strip_prefix("unix://") {
        return Some(InboundEndpoint::Unix(path.to_string()));
    }
    let (host, port) = match endpoint.strip_prefix('[') {
        Some(rest) => rest.split_once("]:")?,
        None => endpoint.rsplit_once(':')?,
    };
    let port = port.parse::<u16>().ok()?;
    let own = |v4: bool| {
        ips.iter().filter_map(|ip| ip.parse::<IpAddr>().ok()).find(|ip| ip.is_ipv4() == v4).map(|ip| ip.to_string())
    };
    let address = match host {
        "0.0.0.0" => own(true).unwrap_or_else(|| "127.0.0.1".into()),
        "::" => own(false).unwrap_or_else(|| "::1".into()),
        "127.0.0.1" | "::1" => host.to_string(),
        _ => return None,
    };
    Some(InboundEndpoint::Address(address, port))
}

/// The inbound listeners of a sidecar.
pub(super) fn listeners(scope: &Scope<'_>) -> Vec<Resource> {
    if scope.view.kind != ProxyKind::Sidecar {
        return Vec::new();
    }
    let plan = inbound_plan(scope);
    let mut peer = scope.snapshot.peer_mtls_for(scope.namespace(), &scope.view.labels);
    if !scope.view.agent_sds {
        // No workload certificate to terminate with: PERMISSIVE serves its plaintext half. STRICT
        // stays TLS-only (its listener waits for a certificate: closed, never plaintext).
        peer.downgrade_permissive();
    }
    let mut out = Vec::new();
    for c in plan.iter().filter(|c| c.bound) {
        let name = listener_name(&c.bind, c.target_port);
        let l = inbound_listener(scope, name.clone(), &c.bind, c.target_port, true, chains_for(scope, c, &peer));
        out.push(resource(name, l));
    }
    if scope.view.interception.intercepts() {
        let mut chains = vec![blackhole_chain(scope)];
        chains.extend(passthrough_chains(scope, &peer));
        for c in plan.iter().filter(|c| !c.bound) {
            chains.extend(chains_for(scope, c, &peer));
        }
        let l = inbound_listener(
            scope,
            VIRTUAL_INBOUND_LISTENER.into(),
            WILDCARD_ADDRESS,
            VIRTUAL_INBOUND_PORT,
            false,
            chains,
        );
        out.push(resource(VIRTUAL_INBOUND_LISTENER, l));
    }
    out
}

fn inbound_listener(
    scope: &Scope<'_>,
    name: String,
    address: &str,
    port: u16,
    bound: bool,
    filter_chains: Vec<FilterChain>,
) -> Listener {
    let tproxy = !bound && scope.view.interception == Interception::Tproxy;
    let mut listener_filters = Vec::new();
    if !bound {
        listener_filters.push(original_dst());
    }
    if tproxy {
        listener_filters.push(original_src());
    }
    listener_filters.extend(inspectors(&filter_chains));
    Listener {
        name,
        address: Some(socket_address(address, u32::from(port))),
        traffic_direction: TrafficDirection::Inbound as i32,
        filter_chains,
        listener_filters,
        // Istio's protocolDetectionTimeout default: inspect for as long as the client takes to speak.
        listener_filters_timeout: Some(zero_duration()),
        continue_on_listener_filters_timeout: true,
        max_connections_to_accept_per_socket_event: Some(accept_one_connection_per_event()),
        transparent: tproxy.then(|| bool_value(true)),
        ..Default::default()
    }
}

/// The chains of one inbound port: HTTP, TCP, or both behind the HTTP inspector, each over mutual
/// TLS, plaintext or both as the workload's peer authentication for the target port says.
fn chains_for(scope: &Scope<'_>, c: &InboundChain, peer: &PeerMtls) -> Vec<FilterChain> {
    let mesh = &scope.snapshot.mesh;
    let name = listener_name(&c.bind, c.target_port);
    let cluster = inbound_cluster_name(c.target_port);
    let stat_prefix = format!("inbound_{name}");
    let security = authz::http_filters(scope);
    let service = c.service.as_ref().and_then(|key| scope.snapshot.registry.services.get(key));
    let host = service.map_or(c.sidecar_host.as_deref().unwrap_or_default(), |s| s.hostname.as_str());
    let route = InboundRoute { name: &cluster, cluster: &cluster, port: c.port, protocol: c.protocol, host };
    let http = || inbound_http_connection_manager(&stat_prefix, &route, scope.http_common(), security.clone());
    let tcp = || authz::secured_tcp(scope, tcp_proxy_filter(&cluster, to_cluster(&cluster), mesh));
    let sniffed = Sniffed::of(c.protocol);
    let terminated =
        c.tls.as_ref().filter(|t| matches!(t.mode.as_deref(), Some("SIMPLE" | "MUTUAL" | "OPTIONAL_MUTUAL")));
    if let Some(tls) = terminated {
        // HTTPS terminated here is HTTP to the workload, as in Istio.
        let as_http = sniffed == Sniffed::Http || c.protocol == Protocol::Https;
        return vec![ingress_tls_chain(scope, c, tls, name, as_http, http, tcp)];
    }
    let mode = peer.mode_for_port(c.target_port);
    inbound_chains(Some(c.target_port), sniffed, mode, &mesh.trust_domain, |_| name.clone(), http, tcp)
}

/// A Sidecar ingress listener terminating its own TLS (certificate files as SDS names): one TLS
/// chain for the port. Settings that cannot be served leave the port refusing connections,
/// never in plaintext.
fn ingress_tls_chain(
    scope: &Scope<'_>,
    c: &InboundChain,
    tls: &ServerTlsSettings,
    name: String,
    http: bool,
    hcm: impl Fn() -> Filter,
    tcp: impl Fn() -> Vec<Filter>,
) -> FilterChain {
    let alpn: &[&str] = if http { &["h2", "http/1.1"] } else { &[] };
    let port = Some(u32_value(u32::from(c.target_port)));
    match downstream_transport_socket(tls, alpn) {
        Ok(socket) => {
            let m = FilterChainMatch { destination_port: port, transport_protocol: "tls".into(), ..Default::default() };
            chain(name, Some(m), if http { vec![hcm()] } else { tcp() }, Some(socket))
        }
        Err(e) => {
            tracing::debug!(port = c.target_port, error = %e, "sidecar ingress TLS cannot be served: port refused");
            let m = FilterChainMatch { destination_port: port, ..Default::default() };
            let refuse = tcp_proxy_filter(BLACKHOLE_CLUSTER, to_cluster(BLACKHOLE_CLUSTER), &scope.snapshot.mesh);
            chain(name, Some(m), vec![refuse], None)
        }
    }
}

/// Traffic to ports no service declares goes to its original destination, HTTP sniffed as such,
/// under the workload's own mode (so STRICT leaves no plaintext way in).
fn passthrough_chains(scope: &Scope<'_>, peer: &PeerMtls) -> Vec<FilterChain> {
    let mesh = &scope.snapshot.mesh;
    let cluster = INBOUND_PASSTHROUGH_CLUSTER;
    let security = authz::http_filters(scope);
    let route = InboundRoute { name: cluster, cluster, port: 0, protocol: Protocol::Unsupported, host: "" };
    let hcm = || inbound_http_connection_manager(cluster, &route, scope.http_common(), security.clone());
    let tcp = || authz::secured_tcp(scope, tcp_proxy_filter(cluster, to_cluster(cluster), mesh));
    let name = |p: ChainProtocol| match p {
        ChainProtocol::Http => VIRTUAL_INBOUND_CATCHALL_HTTP.to_string(),
        ChainProtocol::Tcp => VIRTUAL_INBOUND_LISTENER.to_string(),
    };
    inbound_chains(None, Sniffed::Auto, peer.mode, &mesh.trust_domain, name, hcm, tcp)
}

/// Connections addressed to 15006 itself would loop through the listener forever.
fn blackhole_chain(scope: &Scope<'_>) -> FilterChain {
    let m =
        FilterChainMatch { destination_port: Some(u32_value(u32::from(VIRTUAL_INBOUND_PORT))), ..Default::default() };
    let tcp = tcp_proxy_filter(BLACKHOLE_CLUSTER, to_cluster(BLACKHOLE_CLUSTER), &scope.snapshot.mesh);
    chain(VIRTUAL_INBOUND_BLACKHOLE.into(), Some(m), vec![tcp], None)
}

#[cfg(test)]
mod tests {
    use envoy_types::pb::envoy::config::cluster::v3::{cluster::DiscoveryType, Cluster};
    use envoy_types::pb::envoy::config::listener::v3::filter;

    use super::*;
    use crate::envoy::names::ext;
    use crate::envoy::testing::{find, names, sidecar_at, testdata_snapshot};
    use crate::envoy::TypeUrl;

    /// Each chain: name, destination port, transport protocol, ALPN count, terminates TLS.
    fn chain_names(l: &Listener) -> Vec<(String, Option<u32>, String, usize, bool)> {
        l.filter_chains
            .iter()
            .map(|c| {
                let m = c.filter_chain_match.clone().unwrap_or_default();
                let tls = c.transport_socket.is_some();
                (
                    c.name.clone(),
                    m.destination_port.map(|p| p.value),
                    m.transport_protocol,
                    m.application_protocols.len(),
                    tls,
                )
            })
            .collect()
    }

    fn c(
        name: &str,
        port: Option<u32>,
        transport: &str,
        alpns: usize,
        tls: bool,
    ) -> (String, Option<u32>, String, usize, bool) {
        (name.to_string(), port, transport.to_string(), alpns, tls)
    }

    #[test]
    fn virtual_inbound_has_a_chain_per_target_port_and_passthrough() {
        let s = testdata_snapshot("inbound.yaml");
        let v = sidecar_at("shop", &[("app", "orders")], &["10.2.0.5"]);
        let l: Listener = find(&s, &v, TypeUrl::Listener, VIRTUAL_INBOUND_LISTENER);
        assert_eq!(l.address, Some(socket_address("0.0.0.0", 15006)));
        assert_eq!(l.listener_filters[0].name, ext::ORIGINAL_DST);
        let (http, tcp) = (VIRTUAL_INBOUND_CATCHALL_HTTP, VIRTUAL_INBOUND_LISTENER);
        assert_eq!(
            chain_names(&l),
            [
                c(VIRTUAL_INBOUND_BLACKHOLE, Some(15006), "", 0, false),
                // Undeclared ports: the workload's mode (PERMISSIVE), sniffed.
                c(http, None, "tls", 3, true),
                c(http, None, "raw_buffer", 2, false),
                c(tcp, None, "tls", 2, true),
                c(tcp, None, "raw_buffer", 0, false),
                c(tcp, None, "tls", 0, false),
                // Port-level STRICT: mutual TLS only.
                c("0.0.0.0_5432", Some(5432), "tls", 0, true),
                // The HTTP port matches its target port 8080: mesh clients over mutual TLS, others plaintext.
                c("0.0.0.0_8080", Some(8080), "tls", 5, true),
                c("0.0.0.0_8080", Some(8080), "raw_buffer", 0, false),
                // Port-level DISABLE on the sniffed port: plaintext HTTP or TCP.
                c("0.0.0.0_9000", Some(9000), "raw_buffer", 2, false),
                c("0.0.0.0_9000", Some(9000), "raw_buffer", 0, false),
                c("0.0.0.0_9090", Some(9090), "tls", 5, true),
                c("0.0.0.0_9090", Some(9090), "raw_buffer", 0, false),
            ],
        );
        let db = l.filter_chains.iter().find(|c| c.name == "0.0.0.0_5432").expect("db chain");
        assert_eq!(db.filters[0].name, ext::TCP_PROXY);
        let tls = format!("{:?}", db.transport_socket.as_ref().expect("mutual TLS"));
        assert!(tls.contains("DownstreamTlsContext"), "{tls}");
        let context: envoy_types::pb::envoy::extensions::transport_sockets::tls::v3::DownstreamTlsContext =
            match &db.transport_socket.as_ref().and_then(|t| t.config_type.clone()) {
                Some(envoy_types::pb::envoy::config::core::v3::transport_socket::ConfigType::TypedConfig(a)) => {
                    crate::envoy::testing::unpack(a)
                }
                other => panic!("{other:?}"),
            };
        assert_eq!(context.require_client_certificate.map(|b| b.value), Some(true));
        let common = context.common_tls_context.expect("common");
        assert_eq!(common.alpn_protocols, ["istio-peer-exchange", "h2", "http/1.1"], "a TCP chain's ALPN");
        assert_eq!(common.tls_certificate_sds_secret_configs[0].name, "default");
        let text = format!("{:?}", common.validation_context_type);
        assert!(text.contains("ROOTCA") && text.contains("sds-grpc") && !text.contains("filename"), "{text}");
        let web = l.filter_chains.iter().find(|c| c.name == "0.0.0.0_8080").expect("web chain");
        let Some(filter::ConfigType::TypedConfig(hcm)) = &web.filters[0].config_type else { panic!() };
        assert!(hcm.type_url.ends_with("HttpConnectionManager"));
        let inspectors: Vec<&str> = l.listener_filters.iter().map(|f| f.name.as_str()).collect();
        assert_eq!(inspectors, [ext::ORIGINAL_DST, ext::TLS_INSPECTOR, ext::HTTP_INSPECTOR]);
        let c: Cluster = find(&s, &v, TypeUrl::Cluster, "inbound|8080||");
        assert_eq!(
            c.cluster_discovery_type,
            Some(envoy_types::pb::envoy::config::cluster::v3::cluster::ClusterDiscoveryType::Type(
                DiscoveryType::OriginalDst as i32
            ))
        );
        let bind = c.upstream_bind_config.clone().and_then(|b| b.source_address).map(|a| a.address);
        assert_eq!(bind.as_deref(), Some("127.0.0.6"));
        // The service's DestinationRule pool applies to the receiving side; outlier detection does not.
        let max_connections = |c: &Cluster| c.circuit_breakers.as_ref().and_then(|b| b.thresholds[0].max_connections);
        assert_eq!(max_connections(&c).map(|v| v.value), Some(11));
        assert_eq!(c.outlier_detection, None);
        let db: Cluster = find(&s, &v, TypeUrl::Cluster, "inbound|5432||");
        assert_eq!(max_connections(&db).map(|v| v.value), Some(22), "the port's own settings");
    }

    #[test]
    fn without_pilot_agent_permissive_serves_plaintext_and_strict_stays_tls() {
        let s = testdata_snapshot("inbound.yaml");
        let v = without_agent(sidecar_at("shop", &[("app", "orders")], &["10.2.0.5"]));
        let l: Listener = find(&s, &v, TypeUrl::Listener, VIRTUAL_INBOUND_LISTENER);
        let tls: Vec<String> =
            l.filter_chains.iter().filter(|c| c.transport_socket.is_some()).map(|c| c.name.clone()).collect();
        assert_eq!(tls, ["0.0.0.0_5432"], "only the port-level STRICT port terminates TLS");
    }

    fn without_agent(v: crate::envoy::ProxyView) -> crate::envoy::ProxyView {
        crate::envoy::ProxyView { agent_sds: false, ..v }
    }

    #[test]
    fn no_virtual_inbound_without_interception_but_bound_ingress_listeners() {
        let s = testdata_snapshot("inbound.yaml");
        let mut v = sidecar_at("shop", &[("app", "orders")], &["10.2.0.5"]);
        v.interception = Interception::None;
        let all = names(&s, &v, TypeUrl::Listener);
        assert!(!all.iter().any(|n| n == VIRTUAL_INBOUND_LISTENER), "{all:?}");
        assert!(!names(&s, &v, TypeUrl::Cluster).iter().any(|n| n.starts_with("inbound|")));
        let mut legacy = sidecar_at("shop", &[("app", "legacy")], &["10.2.0.7"]);
        legacy.interception = Interception::None;
        let all = names(&s, &legacy, TypeUrl::Listener);
        // Without a bind, istiod binds (and names) them on the workload's address.
        for bound in ["10.2.0.7_5000", "10.2.0.7_6000", "10.2.0.7_7070", "10.2.0.7_9443"] {
            assert!(all.iter().any(|n| n == bound), "{bound} missing from {all:?}");
        }
        let l: Listener = find(&s, &legacy, TypeUrl::Listener, "10.2.0.7_5000");
        assert!(l.listener_filters.is_empty(), "a bound HTTP port needs no inspection");
    }

    #[test]
    fn an_ingress_listener_with_tls_terminates_it_with_its_files_as_sds_secrets() {
        let s = testdata_snapshot("inbound.yaml");
        let v = sidecar_at("shop", &[("app", "legacy")], &["10.2.0.7"]);
        let l: Listener = find(&s, &v, TypeUrl::Listener, VIRTUAL_INBOUND_LISTENER);
        let chains: Vec<&FilterChain> = l.filter_chains.iter().filter(|c| c.name == "10.2.0.7_8443").collect();
        assert_eq!(chains.len(), 1, "TLS only: no plaintext way in");
        let m = chains[0].filter_chain_match.clone().unwrap_or_default();
        assert_eq!(m.transport_protocol, "tls");
        assert_eq!(chains[0].filters[0].name, ext::HTTP_CONNECTION_MANAGER, "HTTPS terminated here is HTTP");
        let text = format!("{:?}", chains[0].transport_socket);
        assert!(text.contains("DownstreamTlsContext"), "{text}");
    }

    #[test]
    fn ingress_default_endpoints_become_static_clusters() {
        let s = testdata_snapshot("inbound.yaml");
        let v = sidecar_at("shop", &[("app", "legacy")], &["10.2.0.7"]);
        let endpoint = |name: &str| {
            let c: Cluster = find(&s, &v, TypeUrl::Cluster, name);
            let bind = c.upstream_bind_config.clone().and_then(|b| b.source_address).map(|a| a.address);
            let lb = c.load_assignment.and_then(|a| a.endpoints.into_iter().next()).map(|l| l.lb_endpoints[0].clone());
            (format!("{:?}", lb.and_then(|e| e.host_identifier)), bind)
        };
        let (loopback, bind) = endpoint("inbound|8080||");
        assert!(loopback.contains("127.0.0.1") && loopback.contains("18080"), "{loopback}");
        assert_eq!(bind, None, "loopback needs no magic source");
        let (own, bind) = endpoint("inbound|9443||");
        assert!(own.contains("10.2.0.7"), "0.0.0.0 is the workload's IP: {own}");
        assert_eq!(bind.as_deref(), Some("127.0.0.6"));
        let (unix, _) = endpoint("inbound|7070||");
        assert!(unix.contains("/var/run/legacy.sock"), "{unix}");
        let limits = |name: &str| {
            let c: Cluster = find(&s, &v, TypeUrl::Cluster, name);
            let t = c.circuit_breakers.expect("limits").thresholds[0];
            (t.max_connections.map(|v| v.value), t.max_pending_requests.map(|v| v.value))
        };
        assert_eq!(
            limits("inbound|8080||"),
            (Some(u32::MAX), Some(7)),
            "the listener's own pool replaces the Sidecar's"
        );
        assert_eq!(limits("inbound|9443||"), (Some(50), Some(u32::MAX)), "the Sidecar's inboundConnectionPool");
        let (original, bind) = endpoint("inbound|6000||");
        assert_eq!((original.as_str(), bind.as_deref()), ("None", Some("127.0.0.6")), "no defaultEndpoint");
        // The service's own port 8080 instance is replaced by the ingress listener of that port.
        let l: Listener = find(&s, &v, TypeUrl::Listener, VIRTUAL_INBOUND_LISTENER);
        assert_eq!(l.filter_chains.iter().filter(|c| c.name == "10.2.0.7_8080").count(), 1);
        assert!(!l.filter_chains.iter().any(|c| c.name.ends_with("_5000")), "captureMode NONE: its own listener");
    }
}
