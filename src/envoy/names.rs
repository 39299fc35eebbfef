//! Istio's names for Envoy resources and well-known extensions.

/// Catch-all cluster forwarding to the original destination (ALLOW_ANY).
pub(super) const PASSTHROUGH_CLUSTER: &str = "PassthroughCluster";
/// The default chain of an outbound port listener (istiod's name).
pub(super) const PASSTHROUGH_FILTER_CHAIN: &str = "PassthroughFilterChain";
/// Cluster with no endpoints: connections to it fail (REGISTRY_ONLY).
pub(super) const BLACKHOLE_CLUSTER: &str = "BlackHoleCluster";
/// The listener iptables redirects outbound traffic to.
pub(super) const VIRTUAL_OUTBOUND_LISTENER: &str = "virtualOutbound";
/// Port of the virtual outbound listener.
pub(super) const VIRTUAL_OUTBOUND_PORT: u16 = 15001;
/// The listener iptables redirects inbound traffic to.
pub(super) const VIRTUAL_INBOUND_LISTENER: &str = "virtualInbound";
/// Port of the virtual inbound listener.
pub(super) const VIRTUAL_INBOUND_PORT: u16 = 15006;
/// The virtual inbound chain taking HTTP to ports no service declares.
pub(super) const VIRTUAL_INBOUND_CATCHALL_HTTP: &str = "virtualInbound-catchall-http";
/// The virtual inbound chain dropping traffic addressed to the listener's own port (a loop).
pub(super) const VIRTUAL_INBOUND_BLACKHOLE: &str = "virtualInbound-blackhole";
/// Cluster forwarding inbound traffic to the original destination.
pub(super) const INBOUND_PASSTHROUGH_CLUSTER: &str = "InboundPassthroughCluster";
/// Source address of connections to the workload's own IP, which iptables lets through.
pub(super) const INBOUND_PASSTHROUGH_BIND: &str = "127.0.0.6";
/// ALPN values the HTTP inspector sets for plaintext HTTP (Istio's, without HTTP/1.0).
pub(super) const PLAINTEXT_HTTP_ALPNS: [&str; 2] = ["http/1.1", "h2c"];
/// Transport protocol of connections the TLS inspector did not find to be TLS.
pub(super) const RAW_BUFFER: &str = "raw_buffer";
/// Catch-all virtual host name under ALLOW_ANY.
pub(super) const ALLOW_ANY_VHOST: &str = "allow_any";
/// Catch-all virtual host name under REGISTRY_ONLY.
pub(super) const BLOCK_ALL_VHOST: &str = "block_all";
/// Name of the route a service gets without VirtualService.
pub(super) const DEFAULT_ROUTE: &str = "default";
/// Address outbound listeners use when they do not bind (iptables delivers to them).
pub(super) const WILDCARD_ADDRESS: &str = "0.0.0.0";
/// Address listeners bind to without interception.
pub(super) const LOCALHOST: &str = "127.0.0.1";

/// Envoy extension names.
pub(super) mod ext {
    /// HTTP connection manager network filter.
    pub const HTTP_CONNECTION_MANAGER: &str = "envoy.filters.network.http_connection_manager";
    /// TCP proxy network filter.
    pub const TCP_PROXY: &str = "envoy.filters.network.tcp_proxy";
    /// Mongo proxy network filter (statistics of MongoDB traffic).
    pub const MONGO_PROXY: &str = "envoy.filters.network.mongo_proxy";
    /// RBAC HTTP filter (also the namespace of the dynamic metadata it sets).
    pub const HTTP_RBAC: &str = "envoy.filters.http.rbac";
    /// RBAC network filter.
    pub const NETWORK_RBAC: &str = "envoy.filters.network.rbac";
    /// JWT authentication HTTP filter (its name is also its dynamic metadata namespace).
    pub const JWT_AUTHN: &str = "envoy.filters.http.jwt_authn";
    /// CORS HTTP filter.
    pub const CORS: &str = "envoy.filters.http.cors";
    /// gRPC statistics HTTP filter.
    pub const GRPC_STATS: &str = "envoy.filters.http.grpc_stats";
    /// Fault injection HTTP filter.
    pub const FAULT: &str = "envoy.filters.http.fault";
    /// Router HTTP filter.
    pub const ROUTER: &str = "envoy.filters.http.router";
    /// TLS inspector listener filter (reads SNI).
    pub const TLS_INSPECTOR: &str = "envoy.filters.listener.tls_inspector";
    /// HTTP inspector listener filter (sets HTTP ALPN values on plaintext HTTP).
    pub const HTTP_INSPECTOR: &str = "envoy.filters.listener.http_inspector";
    /// Original destination listener filter.
    pub const ORIGINAL_DST: &str = "envoy.filters.listener.original_dst";
    /// Original source listener filter (TPROXY).
    pub const ORIGINAL_SRC: &str = "envoy.filters.listener.original_src";
    /// TLS transport socket.
    pub const TLS_TRANSPORT_SOCKET: &str = "envoy.transport_sockets.tls";
    /// Upstream HTTP protocol options key of `typed_extension_protocol_options`.
    pub const HTTP_PROTOCOL_OPTIONS: &str = "envoy.extensions.upstreams.http.v3.HttpProtocolOptions";
    /// Retry host predicate avoiding previously tried hosts.
    pub const PREVIOUS_HOSTS: &str = "envoy.retry_host_predicates.previous_hosts";
    /// Retry priority preferring priorities (localities) not tried yet.
    pub const PREVIOUS_PRIORITIES: &str = "envoy.retry_priorities.previous_priorities";
    /// File access logger.
    pub const FILE_ACCESS_LOG: &str = "envoy.access_loggers.file";
}

/// `outbound|PORT|SUBSET|HOST`, Istio's outbound cluster name.
pub(super) fn cluster_name(port: u16, subset: &str, host: &str) -> String {
    format!("outbound|{port}|{subset}|{host}")
}

/// `outbound_.PORT_.SUBSET_.HOST`: the SNI Istio's mutual TLS sends, which AUTO_PASSTHROUGH
/// gateways route by, and the name of the clusters they route it to.
pub(super) fn istio_sni(port: u16, subset: &str, host: &str) -> String {
    format!("outbound_.{port}_.{subset}_.{host}")
}

/// `inbound|PORT||`, Istio's inbound cluster name (and inbound route configuration name).
pub(super) fn inbound_cluster_name(port: u16) -> String {
    format!("inbound|{port}||")
}

/// `ADDRESS_PORT`, Istio's listener name.
pub(super) fn listener_name(address: &str, port: u16) -> String {
    format!("{address}_{port}")
}

/// `HOST:PORT`, Istio's virtual host name.
pub(super) fn domain_name(host: &str, port: u16) -> String {
    format!("{host}:{port}")
}

/// Route configuration of a gateway's plain HTTP servers on a port.
pub(super) fn gateway_http_route_name(port: u16) -> String {
    format!("http.{port}")
}

/// Route configuration of one TLS-terminating HTTPS server of a gateway.
pub(super) fn gateway_https_route_name(port: u16, port_name: &str, gateway: &str, namespace: &str) -> String {
    format!("https.{port}.{port_name}.{gateway}.{namespace}")
}

/// The operation a default route's trace spans are named after, as istiod names it: `HOST:PORT/*`.
pub(super) fn trace_operation(host: &str, port: u16) -> String {
    format!("{}/*", domain_name(host, port))
}
