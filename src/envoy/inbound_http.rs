//! The HTTP side of inbound chains: an HTTP connection manager with its route configuration
//! inline (Istio sends no RDS for inbound), one virtual host for every domain, routing to the
//! chain's inbound cluster without timeout.

use envoy_types::pb::envoy::config::core::v3::Http2ProtocolOptions;
use envoy_types::pb::envoy::config::listener::v3::Filter;
use envoy_types::pb::envoy::config::route::v3::{
    route, route_action, route_match, Decorator, RetryPolicy, Route, RouteAction, RouteConfiguration, RouteMatch,
    VirtualHost,
};
use envoy_types::pb::envoy::extensions::filters::network::http_connection_manager::v3::{
    http_connection_manager::{ForwardClientCertDetails, RouteSpecifier, SetCurrentClientCertDetails},
    HttpConnectionManager, HttpFilter,
};

use super::names::trace_operation;
use super::names::{ext, DEFAULT_ROUTE};
use super::network_filter::{access_logs, network_filter, with_istio_defaults, HttpCommon, ISTIO_SERVER_NAME};
use super::proto::{bool_value, u32_value, zero_duration};
use crate::config::api::Protocol;

/// What an inbound chain's route configuration routes: everything to `cluster`, under route
/// configuration `name`, in a virtual host named after the service `port`; `host` is the service
/// the chain serves (empty for none), which names the route's trace operation.
pub(super) struct InboundRoute<'a> {
    /// The route configuration's name.
    pub name: &'a str,
    /// The inbound cluster.
    pub cluster: &'a str,
    /// The service (or ingress) port.
    pub port: u16,
    /// The port's protocol.
    pub protocol: Protocol,
    /// The service's host, or empty.
    pub host: &'a str,
}

/// An inbound HTTP connection manager for `route`, with the `security` filters (JWT
/// authentication, RBAC) before Istio's others.
pub(super) fn inbound_http_connection_manager(
    stat_prefix: &str,
    route: &InboundRoute<'_>,
    common: HttpCommon<'_>,
    security: Vec<HttpFilter>,
) -> Filter {
    let protocol = route.protocol;
    let mut hcm = HttpConnectionManager {
        route_specifier: Some(RouteSpecifier::RouteConfig(route_config(route))),
        use_remote_address: Some(bool_value(false)),
        server_name: ISTIO_SERVER_NAME.to_string(),
        // gRPC and HTTP/2 ports take prior-knowledge HTTP/2, as in Istio.
        http2_protocol_options: protocol.is_http2().then(Http2ProtocolOptions::default),
        access_log: access_logs(common.mesh),
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
    with_istio_defaults(&mut hcm, stat_prefix, common, security);
    network_filter(ext::HTTP_CONNECTION_MANAGER, hcm)
}

fn route_config(r: &InboundRoute<'_>) -> RouteConfiguration {
    let action = RouteAction {
        cluster_specifier: Some(route_action::ClusterSpecifier::Cluster(r.cluster.to_string())),
        // The caller's sidecar enforces timeouts; the workload's side waits as long as it does.
        timeout: Some(zero_duration()),
        max_stream_duration: Some(route_action::MaxStreamDuration {
            max_stream_duration: Some(zero_duration()),
            grpc_timeout_header_max: Some(zero_duration()),
            ..Default::default()
        }),
        // A reset before the request reached the workload is retried, as istiod does; gRPC
        // streams are not (the reset may come mid-stream).
        retry_policy: (r.protocol != Protocol::Grpc).then(|| RetryPolicy {
            retry_on: "reset-before-request".into(),
            num_retries: Some(u32_value(2)),
            ..Default::default()
        }),
        ..Default::default()
    };
    let route = Route {
        name: DEFAULT_ROUTE.to_string(),
        decorator: Some(Decorator { operation: trace_operation(r.host, r.port), ..Default::default() }),
        r#match: Some(RouteMatch {
            path_specifier: Some(route_match::PathSpecifier::Prefix("/".into())),
            ..Default::default()
        }),
        action: Some(route::Action::Route(action)),
        ..Default::default()
    };
    RouteConfiguration {
        name: r.name.to_string(),
        virtual_hosts: vec![VirtualHost {
            name: format!("inbound|http|{}", r.port),
            domains: vec!["*".into()],
            routes: vec![route],
            ..Default::default()
        }],
        validate_clusters: Some(bool_value(false)),
        ..Default::default()
    }
}
