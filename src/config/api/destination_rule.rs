//! `DestinationRule` (networking.istio.io): policies for traffic to a host, and its subsets.

use serde::{Deserialize, Serialize};

use super::common::{Duration, Labels, PortSelector, WorkloadSelector};

/// The `spec` of a DestinationRule.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct DestinationRule {
    /// Service hostname the rule applies to.
    #[serde(default)]
    pub host: String,
    /// Policy for all of the host's traffic.
    #[serde(default)]
    pub traffic_policy: Option<TrafficPolicy>,
    /// Named subsets of the host's endpoints.
    #[serde(default)]
    pub subsets: Vec<Subset>,
    /// Namespaces this rule is visible to.
    #[serde(default)]
    pub export_to: Vec<String>,
    /// Workloads this rule applies to (accepted).
    #[serde(default)]
    pub workload_selector: Option<WorkloadSelector>,
}

/// A named subset of endpoints, selected by labels.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Subset {
    /// Subset name, used in cluster names.
    #[serde(default)]
    pub name: String,
    /// Labels endpoints must carry.
    #[serde(default)]
    pub labels: Labels,
    /// Policy overriding the rule's.
    #[serde(default)]
    pub traffic_policy: Option<TrafficPolicy>,
}

/// Traffic policy.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct TrafficPolicy {
    /// Load balancing.
    #[serde(default)]
    pub load_balancer: Option<LoadBalancerSettings>,
    /// Connection limits.
    #[serde(default)]
    pub connection_pool: Option<ConnectionPoolSettings>,
    /// Outlier detection.
    #[serde(default)]
    pub outlier_detection: Option<OutlierDetection>,
    /// Client TLS.
    #[serde(default)]
    pub tls: Option<ClientTlsSettings>,
    /// Per-port overrides.
    #[serde(default)]
    pub port_level_settings: Vec<PortTrafficPolicy>,
    /// Tunnel settings (accepted).
    #[serde(default)]
    pub tunnel: Option<serde_json::Value>,
    /// PROXY protocol (accepted).
    #[serde(default)]
    pub proxy_protocol: Option<serde_json::Value>,
    /// Retry budget (accepted).
    #[serde(default)]
    pub retry_budget: Option<serde_json::Value>,
}

/// Per-port traffic policy.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PortTrafficPolicy {
    /// Port this policy applies to.
    #[serde(default)]
    pub port: Option<PortSelector>,
    /// Load balancing.
    #[serde(default)]
    pub load_balancer: Option<LoadBalancerSettings>,
    /// Connection limits.
    #[serde(default)]
    pub connection_pool: Option<ConnectionPoolSettings>,
    /// Outlier detection.
    #[serde(default)]
    pub outlier_detection: Option<OutlierDetection>,
    /// Client TLS.
    #[serde(default)]
    pub tls: Option<ClientTlsSettings>,
}

/// Simple load-balancing algorithms.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum SimpleLb {
    /// Envoy's default (least request in Istio).
    Unspecified,
    /// Least request.
    LeastConn,
    /// Random.
    Random,
    /// Pass-through to the original destination.
    Passthrough,
    /// Round robin.
    RoundRobin,
    /// Least request.
    LeastRequest,
}

/// Load balancer settings.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct LoadBalancerSettings {
    /// Simple algorithm.
    #[serde(default)]
    pub simple: Option<SimpleLb>,
    /// Consistent hashing.
    #[serde(default)]
    pub consistent_hash: Option<ConsistentHashLb>,
    /// Locality settings (accepted).
    #[serde(default)]
    pub locality_lb_setting: Option<serde_json::Value>,
    /// Slow start window.
    #[serde(default)]
    pub warmup_duration_secs: Option<Duration>,
    /// Slow start.
    #[serde(default)]
    pub warmup: Option<WarmupConfiguration>,
}

/// Slow start settings.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct WarmupConfiguration {
    /// Window (required).
    #[serde(default)]
    pub duration: Option<Duration>,
    /// Starting percentage (0–100).
    #[serde(default)]
    pub minimum_percent: Option<f64>,
    /// Aggression (≥ 1 is Istio's bound; must be positive).
    #[serde(default)]
    pub aggression: Option<f64>,
}

/// Consistent hash load balancing.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ConsistentHashLb {
    /// Hash on a header.
    #[serde(default)]
    pub http_header_name: Option<String>,
    /// Hash on a cookie.
    #[serde(default)]
    pub http_cookie: Option<HttpCookie>,
    /// Hash on the source IP.
    #[serde(default)]
    pub use_source_ip: Option<bool>,
    /// Hash on a query parameter.
    #[serde(default)]
    pub http_query_parameter_name: Option<String>,
    /// Ring hash.
    #[serde(default)]
    pub ring_hash: Option<RingHash>,
    /// Maglev.
    #[serde(default)]
    pub maglev: Option<Maglev>,
    /// Deprecated ring size.
    #[serde(default)]
    pub minimum_ring_size: Option<u64>,
}

/// Cookie to hash on.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct HttpCookie {
    /// Name.
    #[serde(default)]
    pub name: String,
    /// Path.
    #[serde(default)]
    pub path: String,
    /// Lifetime.
    #[serde(default)]
    pub ttl: Option<Duration>,
}

/// Ring hash settings.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RingHash {
    /// Minimum ring size.
    #[serde(default)]
    pub minimum_ring_size: Option<u64>,
}

/// Maglev settings.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Maglev {
    /// Table size (prime).
    #[serde(default)]
    pub table_size: Option<u64>,
}

/// Connection pool settings.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ConnectionPoolSettings {
    /// TCP limits.
    #[serde(default)]
    pub tcp: Option<TcpSettings>,
    /// HTTP limits.
    #[serde(default)]
    pub http: Option<HttpSettings>,
}

/// TCP connection pool.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct TcpSettings {
    /// Max connections.
    #[serde(default)]
    pub max_connections: Option<i32>,
    /// Connect timeout.
    #[serde(default)]
    pub connect_timeout: Option<Duration>,
    /// Keepalive (accepted).
    #[serde(default)]
    pub tcp_keepalive: Option<serde_json::Value>,
    /// Max connection lifetime.
    #[serde(default)]
    pub max_connection_duration: Option<Duration>,
    /// Idle timeout.
    #[serde(default)]
    pub idle_timeout: Option<Duration>,
}

/// HTTP connection pool.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct HttpSettings {
    /// Max pending requests.
    #[serde(default)]
    pub http1_max_pending_requests: Option<i32>,
    /// Max requests.
    #[serde(default)]
    pub http2_max_requests: Option<i32>,
    /// Requests per connection.
    #[serde(default)]
    pub max_requests_per_connection: Option<i32>,
    /// Max concurrent retries.
    #[serde(default)]
    pub max_retries: Option<i32>,
    /// Idle timeout.
    #[serde(default)]
    pub idle_timeout: Option<Duration>,
    /// DEFAULT, DO_NOT_UPGRADE or UPGRADE.
    #[serde(default)]
    pub h2_upgrade_policy: Option<String>,
    /// Use the client's protocol.
    #[serde(default)]
    pub use_client_protocol: Option<bool>,
    /// Max concurrent streams.
    #[serde(default)]
    pub max_concurrent_streams: Option<i32>,
    /// HTTP/2 keepalive pings (`interval`, `timeout`).
    #[serde(default)]
    pub http2_keep_alive: Option<serde_json::Value>,
}

/// Outlier detection.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct OutlierDetection {
    /// Deprecated: consecutive gateway errors.
    #[serde(default)]
    pub consecutive_errors: Option<i32>,
    /// Consecutive gateway errors.
    #[serde(default)]
    pub consecutive_gateway_errors: Option<u32>,
    /// Consecutive 5xx.
    #[serde(default, rename = "consecutive5xxErrors")]
    pub consecutive_5xx_errors: Option<u32>,
    /// Sweep interval.
    #[serde(default)]
    pub interval: Option<Duration>,
    /// Base ejection time.
    #[serde(default)]
    pub base_ejection_time: Option<Duration>,
    /// Max ejection percent.
    #[serde(default)]
    pub max_ejection_percent: Option<i32>,
    /// Min health percent.
    #[serde(default)]
    pub min_health_percent: Option<i32>,
    /// Split local-origin errors.
    #[serde(default)]
    pub split_external_local_origin_errors: Option<bool>,
    /// Consecutive local-origin failures.
    #[serde(default)]
    pub consecutive_local_origin_failures: Option<u32>,
}

/// Client TLS modes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum ClientTlsMode {
    /// Plain text.
    Disable,
    /// TLS.
    Simple,
    /// Mutual TLS with given certificates.
    Mutual,
    /// Istio mutual TLS.
    IstioMutual,
}

/// Client TLS settings.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ClientTlsSettings {
    /// Mode.
    #[serde(default)]
    pub mode: Option<ClientTlsMode>,
    /// Client certificate file.
    #[serde(default)]
    pub client_certificate: String,
    /// Private key file.
    #[serde(default)]
    pub private_key: String,
    /// CA file.
    #[serde(default)]
    pub ca_certificates: String,
    /// Kubernetes secret name.
    #[serde(default)]
    pub credential_name: String,
    /// SANs to verify.
    #[serde(default)]
    pub subject_alt_names: Vec<String>,
    /// SNI.
    #[serde(default)]
    pub sni: String,
    /// Skip verification.
    #[serde(default)]
    pub insecure_skip_verify: Option<bool>,
    /// CRL file.
    #[serde(default)]
    pub ca_crl: String,
}
