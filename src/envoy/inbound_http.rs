//! The HTTP side of inbound chains: an HTTP connection manager with its route configuration
//! inline (Istio sends no RDS for inbound), one virtual host for every domain, routing to the
//! chain's inbound cluster without timeout.

use envoy_types::pb::envoy::config::core::v3::Http2ProtocolOptions;
use envoy_types::pb::envoy::config::listener::v3::Filter;
use envoy_types::pb::envoy::config::route::v3::{
    route, route_action, route_match, Route, RouteAction, RouteConfiguration, RouteMatch, VirtualHost,
};
use envoy_types::pb::envoy::extensions::filters::http::router::v3::Router;
use envoy_types::pb::envoy::extensions::filters::network::http_connection_manager::v3::{
    http_connection_manager::{ForwardClientCertDetails, RouteSpecifier, SetCurrentClientCertDetails, UpgradeConfig},
    HttpConnectionManager, HttpFilter,
};

use super::names::{ext, DEFAULT_ROUTE};
use super::network_filter::{access_logs, http_filter, network_filter};
use super::proto::{bool_value, zero_duration};
use crate::config::api::Protocol;
use crate::mesh::MeshConfig;

/// An inbound HTTP connection manager for `port` (the service port, which names the virtual
/// host) routing everything to `cluster`, under route configuration name `route_name`, with the
/// `security` filters (JWT authentication, RBAC) before the router.
pub(super) fn inbound_http_connection_manager(
    stat_prefix: &str,
    route_name: &str,
    cluster: &str,
    port: u16,
    protocol: Protocol,
    mesh: &MeshConfig,
    security: Vec<HttpFilter>,
) -> Filter {
    let mut http_filters = security;
    http_filters.push(http_filter(ext::ROUTER, Router::default()));
    let hcm = HttpConnectionManager {
        stat_prefix: stat_prefix.to_string(),
        route_specifier: Some(RouteSpecifier::RouteConfig(route_config(route_name, cluster, port))),
        http_filters,
        use_remote_address: Some(bool_value(false)),
        // gRPC and HTTP/2 ports take prior-knowledge HTTP/2, as in Istio.
        http2_protocol_options: protocol.is_http2().then(Http2ProtocolOptions::default),
        upgrade_configs: vec![UpgradeConfig { upgrade_type: "websocket".into(), ..Default::default() }],
        access_log: access_logs(mesh),
        // As Istio: the workload learns its mutual TLS peer (SPIFFE URI) from x-forwarded-client-cert.
        forward_client_cert_details: ForwardClientCertDetails::AppendForward as i32,
        set_current_client_cert_details: Some(SetCurrentClientCertDetails {
            subject: Some(bool_value(true)),
            dns: true,
            uri: true,
            ..Default::default()
        }),
        ..Default::default()
    };
    network_filter(ext::HTTP_CONNECTION_MANAGER, hcm)
}

fn route_config(name: &str, cluster: &str, port: u16) -> RouteConfiguration {
    let action = RouteAction {
        cluster_specifier: Some(route_action::ClusterSpecifier::Cluster(cluster.to_string())),
        // The caller's sidecar enforces timeouts; the workload's side waits as long as it does.
        timeout: Some(zero_duration()),
        max_stream_duration: Some(route_action::MaxStreamDuration {
            max_stream_duration: Some(zero_duration()),
            grpc_timeout_header_max: Some(zero_duration()),
            ..Default::default()
        }),
        ..Default::default()
    };
    let route = Route {
        name: DEFAULT_ROUTE.to_string(),
        r#match: Some(RouteMatch {
            path_specifier: Some(route_match::PathSpecifier::Prefix("/".into())),
            ..Default::default()
        }),
        action: Some(route::Action::Route(action)),
        ..Default::default()
    };
    RouteConfiguration {
        name: name.to_string(),
        virtual_hosts: vec![VirtualHost {
            name: format!("inbound|http|{port}"),
            domains: vec!["*".into()],
            routes: vec![route],
            ..Default::default()
        }],
        validate_clusters: Some(bool_value(false)),
        ..Default::default()
    }
}
