//! Network and listener filters: the HTTP connection manager (RDS), TCP proxy, TLS inspector, and
//! filter chains keyed by destination address or SNI.

use std::collections::HashSet;

use envoy_types::pb::envoy::config::accesslog::v3::{access_log, AccessLog};
use envoy_types::pb::envoy::config::core::v3::{CidrRange, Http1ProtocolOptions, TransportSocket};
use envoy_types::pb::envoy::config::listener::v3::{
    filter, listener_filter, Filter, FilterChain, FilterChainMatch, ListenerFilter,
};
use envoy_types::pb::envoy::extensions::access_loggers::file::v3::FileAccessLog;
use envoy_types::pb::envoy::extensions::filters::http::cors::v3::Cors;
use envoy_types::pb::envoy::extensions::filters::http::fault::v3::HttpFault;
use envoy_types::pb::envoy::extensions::filters::http::grpc_stats::v3::{filter_config, FilterConfig as GrpcStats};
use envoy_types::pb::envoy::extensions::filters::http::router::v3::Router;
use envoy_types::pb::envoy::extensions::filters::listener::tls_inspector::v3::TlsInspector;
use envoy_types::pb::envoy::extensions::filters::network::http_connection_manager::v3::{
    http_connection_manager::{
        ForwardClientCertDetails, PathWithEscapedSlashesAction, RouteSpecifier, SetCurrentClientCertDetails, Tracing,
        UpgradeConfig,
    },
    http_filter, HttpConnectionManager, HttpFilter, Rds, RequestIdExtension,
};
use envoy_types::pb::envoy::extensions::filters::network::mongo_proxy::v3::MongoProxy;
use envoy_types::pb::envoy::extensions::filters::network::tcp_proxy::v3::{tcp_proxy, TcpProxy};
use envoy_types::pb::envoy::extensions::request_id::uuid::v3::UuidRequestIdConfig;
use prost::{Message, Name};

use super::names::{ext, BLACKHOLE_CLUSTER};
use super::proto::{ads_config_source, any, bool_value, u32_value, zero_duration};
use crate::mesh::MeshConfig;

/// The server name inbound and gateway connection managers put in the `server` header (a sidecar's
/// outbound side keeps Envoy's own, as istiod leaves it).
pub(super) const ISTIO_SERVER_NAME: &str = "istio-envoy";

/// Who an HTTP connection manager serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum HttpClass {
    /// A sidecar's outbound side.
    SidecarOutbound,
    /// A gateway: the client's address is the remote one.
    Gateway,
}

/// What every HTTP connection manager of one proxy shares: the mesh's access log and the
/// proxy's tracing.
#[derive(Clone, Copy)]
pub(super) struct HttpCommon<'a> {
    /// The mesh config (its access log).
    pub mesh: &'a MeshConfig,
    /// The tracing block, if the proxy traces.
    pub tracing: Option<&'a Tracing>,
}

/// An HTTP connection manager fetching route configuration `route_name` over RDS, with Istio's
/// outbound filter order.
pub(super) fn http_connection_manager(
    stat_prefix: &str,
    route_name: &str,
    class: HttpClass,
    common: HttpCommon<'_>,
) -> Filter {
    secured_http_connection_manager(stat_prefix, route_name, class, common, Vec::new())
}

/// [`http_connection_manager`] with security filters (JWT authentication, RBAC) first.
pub(super) fn secured_http_connection_manager(
    stat_prefix: &str,
    route_name: &str,
    class: HttpClass,
    common: HttpCommon<'_>,
    security: Vec<HttpFilter>,
) -> Filter {
    let mesh = common.mesh;
    let mut hcm = HttpConnectionManager {
        route_specifier: Some(RouteSpecifier::Rds(Rds {
            config_source: Some(ads_config_source()),
            route_config_name: route_name.to_string(),
        })),
        use_remote_address: Some(bool_value(class == HttpClass::Gateway)),
        access_log: access_logs(mesh),
        ..Default::default()
    };
    if class == HttpClass::Gateway {
        // istiod's gateway defaults: the client certificate's details replace any XFCC header
        // the client sent (SANITIZE_SET), and HTTP/1.1 options are explicit.
        hcm.server_name = ISTIO_SERVER_NAME.to_string();
        hcm.forward_client_cert_details = ForwardClientCertDetails::SanitizeSet as i32;
        hcm.set_current_client_cert_details = Some(SetCurrentClientCertDetails {
            subject: Some(bool_value(true)),
            cert: true,
            dns: true,
            uri: true,
            ..Default::default()
        });
        hcm.http_protocol_options = Some(Http1ProtocolOptions::default());
    }
    with_istio_defaults(&mut hcm, stat_prefix, common, security);
    network_filter(ext::HTTP_CONNECTION_MANAGER, hcm)
}

/// What istiod sets on every HTTP connection manager: the stat prefix with Istio's delimiter,
/// path normalisation that keeps escaped slashes, no stream idle timeout, UUID request ids that
/// decide trace sampling, `100-continue` proxied, websocket upgrades, the proxy's tracing, and
/// the filters after `security`: gRPC statistics, fault injection, CORS, then the router.
pub(super) fn with_istio_defaults(
    hcm: &mut HttpConnectionManager,
    stat_prefix: &str,
    common: HttpCommon<'_>,
    security: Vec<HttpFilter>,
) {
    hcm.stat_prefix = format!("{stat_prefix};");
    hcm.tracing = common.tracing.cloned();
    hcm.normalize_path = Some(bool_value(true));
    hcm.path_with_escaped_slashes_action = PathWithEscapedSlashesAction::KeepUnchanged as i32;
    hcm.stream_idle_timeout = Some(zero_duration());
    hcm.proxy_100_continue = true;
    hcm.upgrade_configs = vec![UpgradeConfig { upgrade_type: "websocket".into(), ..Default::default() }];
    let uuid = UuidRequestIdConfig { use_request_id_for_trace_sampling: Some(bool_value(true)), ..Default::default() };
    hcm.request_id_extension = Some(RequestIdExtension { typed_config: Some(any(uuid)) });
    let grpc_stats = GrpcStats {
        emit_filter_state: true,
        per_method_stat_specifier: Some(filter_config::PerMethodStatSpecifier::StatsForAllMethods(bool_value(false))),
        ..Default::default()
    };
    let mut http_filters = security;
    http_filters.extend([
        http_filter(ext::GRPC_STATS, grpc_stats),
        http_filter(ext::FAULT, HttpFault::default()),
        http_filter(ext::CORS, Cors {}),
        http_filter(ext::ROUTER, Router::default()),
    ]);
    hcm.http_filters = http_filters;
}

/// A TCP proxy to one cluster or weighted clusters.
pub(super) fn tcp_proxy_filter(stat_prefix: &str, target: tcp_proxy::ClusterSpecifier, mesh: &MeshConfig) -> Filter {
    let proxy = TcpProxy {
        stat_prefix: stat_prefix.to_string(),
        cluster_specifier: Some(target),
        access_log: access_logs(mesh),
        ..Default::default()
    };
    network_filter(ext::TCP_PROXY, proxy)
}

/// Envoy's Mongo proxy ahead of a TCP proxy, which istiod adds on MongoDB ports: statistics
/// under `mongo.<stat_prefix>`.
pub(super) fn mongo_proxy(stat_prefix: &str) -> Filter {
    network_filter(ext::MONGO_PROXY, MongoProxy { stat_prefix: stat_prefix.to_string(), ..Default::default() })
}

/// A TCP proxy into the black hole, not logged (istiod's loop guard of the virtual outbound
/// listener).
pub(super) fn unlogged_blackhole() -> Filter {
    let proxy = TcpProxy {
        stat_prefix: BLACKHOLE_CLUSTER.to_string(),
        cluster_specifier: Some(to_cluster(BLACKHOLE_CLUSTER)),
        ..Default::default()
    };
    network_filter(ext::TCP_PROXY, proxy)
}

/// A TCP proxy target: one cluster.
pub(super) fn to_cluster(cluster: &str) -> tcp_proxy::ClusterSpecifier {
    tcp_proxy::ClusterSpecifier::Cluster(cluster.to_string())
}

/// The stat prefix Istio gives a TCP proxy: its (first) cluster.
pub(super) fn stat_prefix_of(target: &tcp_proxy::ClusterSpecifier) -> &str {
    match target {
        tcp_proxy::ClusterSpecifier::Cluster(c) => c,
        tcp_proxy::ClusterSpecifier::WeightedClusters(w) => w.clusters.first().map(|c| c.name.as_str()).unwrap_or(""),
    }
}

/// The TLS inspector, needed before filter chains can match on SNI; it reads at most 512 bytes at
/// first (Envoy's default is 64 KiB), as istiod configures it.
pub(super) fn tls_inspector() -> ListenerFilter {
    let inspector = TlsInspector { initial_read_buffer_size: Some(u32_value(512)), ..Default::default() };
    ListenerFilter {
        name: ext::TLS_INSPECTOR.to_string(),
        config_type: Some(listener_filter::ConfigType::TypedConfig(any(inspector))),
        ..Default::default()
    }
}

/// How long an outbound or gateway chain waits for the TLS handshake (istiod's default).
pub(super) const TRANSPORT_SOCKET_CONNECT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(15);

/// A listener that binds accepts one connection per socket event, as istiod sets it, so that
/// Envoy's workers share a burst of connections.
pub(super) fn accept_one_connection_per_event() -> envoy_types::pb::google::protobuf::UInt32Value {
    u32_value(1)
}

/// A filter chain with one filter and an optional match and transport socket.
pub(super) fn chain(
    name: String,
    chain_match: Option<FilterChainMatch>,
    filters: Vec<Filter>,
    transport_socket: Option<TransportSocket>,
) -> FilterChain {
    FilterChain { name, filter_chain_match: chain_match, filters, transport_socket, ..Default::default() }
}

/// Matches connections by SNI.
pub(super) fn sni_match(server_names: Vec<String>) -> Option<FilterChainMatch> {
    (!server_names.is_empty()).then(|| FilterChainMatch { server_names, ..Default::default() })
}

/// Matches connections by original destination address (IPs or CIDRs); `None` if none parse.
pub(super) fn destination_match(addresses: &[String]) -> Option<FilterChainMatch> {
    let prefix_ranges: Vec<CidrRange> = addresses.iter().filter_map(|a| cidr(a)).collect();
    (!prefix_ranges.is_empty()).then(|| FilterChainMatch { prefix_ranges, ..Default::default() })
}

fn cidr(address: &str) -> Option<CidrRange> {
    let (ip, len) = match address.split_once('/') {
        Some((ip, len)) => (ip, Some(len.parse::<u32>().ok()?)),
        None => (address, None),
    };
    let parsed: std::net::IpAddr = ip.parse().ok()?;
    let max = if parsed.is_ipv4() { 32 } else { 128 };
    let len = len.unwrap_or(max).min(max);
    Some(CidrRange { address_prefix: ip.to_string(), prefix_len: Some(u32_value(len)) })
}

/// Removes server names already claimed by earlier chains (Envoy rejects listeners whose chains
/// match identically), and `*`, which Envoy's SNI matching does not take.
pub(super) fn claim_server_names(names: &[String], claimed: &mut HashSet<String>) -> Vec<String> {
    let mut out = Vec::new();
    for name in names.iter().map(|n| n.to_ascii_lowercase()) {
        if name != "*" && claimed.insert(name.clone()) {
            out.push(name);
        }
    }
    out
}

/// The mesh's access log, if it configures one.
pub(super) fn access_logs(mesh: &MeshConfig) -> Vec<AccessLog> {
    if mesh.access_log_file.is_empty() {
        return Vec::new();
    }
    let file = FileAccessLog { path: mesh.access_log_file.clone(), ..Default::default() };
    vec![AccessLog {
        name: ext::FILE_ACCESS_LOG.to_string(),
        config_type: Some(access_log::ConfigType::TypedConfig(any(file))),
        ..Default::default()
    }]
}

/// An HTTP filter with a typed config.
pub(super) fn http_filter<T: Name + Message>(name: &str, config: T) -> HttpFilter {
    HttpFilter {
        name: name.to_string(),
        config_type: Some(http_filter::ConfigType::TypedConfig(any(config))),
        ..Default::default()
    }
}

/// A network filter with a typed config.
pub(super) fn network_filter<T: Name + Message>(name: &str, config: T) -> Filter {
    Filter { name: name.to_string(), config_type: Some(filter::ConfigType::TypedConfig(any(config))) }
}
