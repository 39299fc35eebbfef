//! `DestinationRule` (networking.istio.io): policies for traffic to a host, and its subsets.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::common::{Duration, Labels, PortSelector, WorkloadSelector};

/// The `spec` of a DestinationRule.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct DestinationRule {
    /// Service hostname the rule applies to.
    pub host: String,
    /// Policy for all of the host's traffic.
    pub traffic_policy: Option<TrafficPolicy>,
    /// Named subsets of the host's endpoints.
    pub subsets: Vec<Subset>,
    /// Namespaces this rule is visible to.
    pub export_to: Vec<String>,
    /// Workloads this rule applies to (accepted).
    pub workload_selector: Option<WorkloadSelector>,
}

/// A named subset of endpoints, selected by labels.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct Subset {
    /// Subset name, used in cluster names.
    pub name: String,
    /// Labels endpoints must carry.
    pub labels: Labels,
    /// Policy overriding the rule's.
    pub traffic_policy: Option<TrafficPolicy>,
}

/// Traffic policy.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct TrafficPolicy {
    /// Load balancing.
    pub load_balancer: Option<LoadBalancerSettings>,
    /// Connection limits.
    pub connection_pool: Option<ConnectionPoolSettings>,
    /// Outlier detection.
    pub outlier_detection: Option<OutlierDetection>,
    /// Client TLS.
    pub tls: Option<ClientTlsSettings>,
    /// Per-port overrides.
    pub port_level_settings: Vec<PortTrafficPolicy>,
    /// Tunnel settings (accepted).
    pub tunnel: Option<serde_json::Value>,
    /// PROXY protocol (accepted).
    pub proxy_protocol: Option<serde_json::Value>,
    /// Retry budget (accepted).
    pub retry_budget: Option<serde_json::Value>,
}

/// Per-port traffic policy.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct PortTrafficPolicy {
    /// Port this policy applies to.
    pub port: Option<PortSelector>,
    /// Load balancing.
    pub load_balancer: Option<LoadBalancerSettings>,
    /// Connection limits.
    pub connection_pool: Option<ConnectionPoolSettings>,
    /// Outlier detection.
    pub outlier_detection: Option<OutlierDetection>,
    /// Client TLS.
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
#[serde(default, rename_all = "camelCase")]
pub struct LoadBalancerSettings {
    /// Simple algorithm.
    pub simple: Option<SimpleLb>,
    /// Consistent hashing.
    pub consistent_hash: Option<ConsistentHashLb>,
    /// Locality load balancing: weights by locality, or failover order.
    pub locality_lb_setting: Option<LocalityLbSetting>,
    /// Slow start window.
    pub warmup_duration_secs: Option<Duration>,
    /// Slow start.
    pub warmup: Option<WarmupConfiguration>,
}

/// Istio's `LocalityLoadBalancerSetting` (in a DestinationRule or mesh-wide).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct LocalityLbSetting {
    /// Traffic shares by destination locality, per source locality.
    pub distribute: Vec<LocalityDistribute>,
    /// Where a region's traffic goes when its own endpoints are unhealthy.
    pub failover: Vec<LocalityFailover>,
    /// Labels, most significant first, whose match with the client's orders endpoints
    /// (`label` or `label=value`).
    pub failover_priority: Vec<String>,
    /// Whether locality load balancing is on (unset: on).
    pub enabled: Option<bool>,
}

/// One `distribute` rule: from a source locality, weights by destination locality.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct LocalityDistribute {
    /// Source locality (`region/zone/subzone`, `*` wildcards).
    pub from: String,
    /// Weight per destination locality (`*` wildcards), adding up to 100.
    pub to: BTreeMap<String, u32>,
}

/// One `failover` rule: a region and the region it fails over to.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct LocalityFailover {
    /// The client's region.
    pub from: String,
    /// The region its traffic fails over to.
    pub to: String,
}

impl DestinationRule {
    /// Every load balancer setting of the rule: top level, per port, per subset (and theirs).
    pub fn load_balancers(&self) -> impl Iterator<Item = &LoadBalancerSettings> {
        let policies = self.traffic_policy.iter().chain(self.subsets.iter().filter_map(|s| s.traffic_policy.as_ref()));
        policies.flat_map(|p| {
            p.load_balancer.iter().chain(p.port_level_settings.iter().filter_map(|l| l.load_balancer.as_ref()))
        })
    }
}

impl LocalityLbSetting {
    /// The label keys `failoverPriority` compares (`label=value` overrides the client's value).
    pub fn failover_priority_keys(&self) -> impl Iterator<Item = &str> {
        self.failover_priority.iter().map(|l| l.split_once('=').map_or(l.as_str(), |(k, _)| k))
    }

    /// Whether it is switched on (unset counts as on).
    pub fn is_enabled(&self) -> bool {
        self.enabled != Some(false)
    }
}

/// Slow start settings.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct WarmupConfiguration {
    /// Window (required).
    pub duration: Option<Duration>,
    /// Starting percentage (0–100).
    pub minimum_percent: Option<f64>,
    /// Aggression (≥ 1 is Istio's bound; must be positive).
    pub aggression: Option<f64>,
}

/// Consistent hash load balancing.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct ConsistentHashLb {
    /// Hash on a header.
    pub http_header_name: Option<String>,
    /// Hash on a cookie.
    pub http_cookie: Option<HttpCookie>,
    /// Hash on the source IP.
    pub use_source_ip: Option<bool>,
    /// Hash on a query parameter.
    pub http_query_parameter_name: Option<String>,
    /// Ring hash.
    pub ring_hash: Option<RingHash>,
    /// Maglev.
    pub maglev: Option<Maglev>,
    /// Deprecated ring size.
    pub minimum_ring_size: Option<u64>,
}

/// Cookie to hash on.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct HttpCookie {
    /// Name.
    pub name: String,
    /// Path.
    pub path: String,
    /// Lifetime.
    pub ttl: Option<Duration>,
}

/// Ring hash settings.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RingHash {
    /// Minimum ring size.
    #[serde(default)]
    pub minimum_ring_size: Option<u64>,
}

/// Maglev settings.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Maglev {
    /// Table size (prime).
    #[serde(default)]
    pub table_size: Option<u64>,
}

/// Connection pool settings.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct ConnectionPoolSettings {
    /// TCP limits.
    pub tcp: Option<TcpSettings>,
    /// HTTP limits.
    pub http: Option<HttpSettings>,
}

/// TCP connection pool.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct TcpSettings {
    /// Max connections.
    pub max_connections: Option<i32>,
    /// Connect timeout.
    pub connect_timeout: Option<Duration>,
    /// Keepalive (accepted).
    pub tcp_keepalive: Option<serde_json::Value>,
    /// Max connection lifetime.
    pub max_connection_duration: Option<Duration>,
    /// Idle timeout.
    pub idle_timeout: Option<Duration>,
}

/// HTTP connection pool.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct HttpSettings {
    /// Max pending requests.
    pub http1_max_pending_requests: Option<i32>,
    /// Max requests.
    pub http2_max_requests: Option<i32>,
    /// Requests per connection.
    pub max_requests_per_connection: Option<i32>,
    /// Max concurrent retries.
    pub max_retries: Option<i32>,
    /// Idle timeout.
    pub idle_timeout: Option<Duration>,
    /// DEFAULT, DO_NOT_UPGRADE or UPGRADE.
    pub h2_upgrade_policy: Option<String>,
    /// Use the client's protocol.
    pub use_client_protocol: Option<bool>,
    /// Max concurrent streams.
    pub max_concurrent_streams: Option<i32>,
    /// HTTP/2 keepalive pings (`interval`, `timeout`).
    pub http2_keep_alive: Option<serde_json::Value>,
}

/// Outlier detection.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct OutlierDetection {
    /// Deprecated: consecutive gateway errors.
    pub consecutive_errors: Option<i32>,
    /// Consecutive gateway errors.
    pub consecutive_gateway_errors: Option<u32>,
    /// Consecutive 5xx.
    #[serde(rename = "consecutive5xxErrors")]
    pub consecutive_5xx_errors: Option<u32>,
    /// Sweep interval.
    pub interval: Option<Duration>,
    /// Base ejection time.
    pub base_ejection_time: Option<Duration>,
    /// Max ejection percent.
    pub max_ejection_percent: Option<i32>,
    /// Min health percent.
    pub min_health_percent: Option<i32>,
    /// Split local-origin errors.
    pub split_external_local_origin_errors: Option<bool>,
    /// Consecutive local-origin failures.
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
#[serde(default, rename_all = "camelCase")]
pub struct ClientTlsSettings {
    /// Mode.
    pub mode: Option<ClientTlsMode>,
    /// Client certificate file.
    pub client_certificate: String,
    /// Private key file.
    pub private_key: String,
    /// CA file.
    pub ca_certificates: String,
    /// Kubernetes secret name.
    pub credential_name: String,
    /// SANs to verify.
    pub subject_alt_names: Vec<String>,
    /// SNI.
    pub sni: String,
    /// Skip verification.
    pub insecure_skip_verify: Option<bool>,
    /// CRL file.
    pub ca_crl: String,
}
